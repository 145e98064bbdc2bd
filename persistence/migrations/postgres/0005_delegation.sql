-- PostgreSQL 0005: a delegated turn whose owner runs in another process (LS-11;
-- docs/deploying.md, "A delegated turn across processes"). The owner's engine writes the
-- handle and posts the turn's prompt to the target's inbox in one transaction, fenced by the
-- owner's lease; the inbox row names the handle, so the engine that takes the prompt knows
-- which turn it starts. The owner may ask the target's holder to interrupt the turn: a
-- request of the kind `interrupt`.

ALTER TABLE inbox ADD COLUMN handle text;  -- the delegated turn a prompt starts (NULL: a message)

ALTER TABLE requests DROP CONSTRAINT requests_kind_check;
ALTER TABLE requests ADD CONSTRAINT requests_kind_check
    CHECK (kind IN ('stop', 'resolve', 'interrupt'));
