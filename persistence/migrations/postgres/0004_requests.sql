-- PostgreSQL 0004: requests to a session's holder (LS-10; docs/deploying.md, "Stop and resolve
-- from any process"). A stop or a resolution asked by any engine process for a session another
-- process holds: the row and a pg_notify in one transaction; the holder marks it begun, carries
-- it out, writes its answer with a pg_notify, and the asker reads the answer and deletes the
-- row. An asker that gives up deletes its unanswered row; it learns whether the holder had
-- begun it, so a request is carried out at most once, and one withdrawn before it was begun
-- is never carried out.

CREATE TABLE requests (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session text NOT NULL REFERENCES sessions (id),
    kind text NOT NULL CHECK (kind IN ('stop', 'resolve')),
    body bytea NOT NULL,  -- the request's arguments, JSON
    posted timestamptz NOT NULL DEFAULT now(),
    begun timestamptz,  -- when the holder began it (NULL: not yet; a withdrawal stops it)
    answer bytea  -- the holder's answer, JSON (NULL: not carried out yet)
);

CREATE INDEX requests_open ON requests (session, id) WHERE begun IS NULL;
