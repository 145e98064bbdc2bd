-- PostgreSQL 0002: the inbox (LS-9; docs/deploying.md, "A message to any session"). A message
-- for a session, posted by any engine process, whether it holds the session or not, with a
-- pg_notify in the same transaction. The holder takes it into the session's durable queue as
-- the entry `inbox-<id>`; the queue write that holds that entry deletes the row in its own
-- transaction, so a message is queued exactly once, whoever crashes when.

CREATE TABLE inbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session text NOT NULL REFERENCES sessions (id),
    body bytea NOT NULL,  -- the message's text, UTF-8
    posted timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX inbox_session ON inbox (session, id);
