-- 0004: delegated-turn handles (B10; docs/persistence.md, "Handles"). One row per handle,
-- upserted whole as it moves (delegated, deferred on, settled, delivered); the indexed columns
-- serve the owner's and the target's lookups and the settlements still to deliver.

CREATE TABLE handles (
    handle_id TEXT NOT NULL PRIMARY KEY,
    owner TEXT NOT NULL,
    target TEXT NOT NULL,
    status TEXT NOT NULL,
    record BLOB NOT NULL  -- HandleRecord
);

CREATE INDEX handles_owner ON handles (owner);

CREATE INDEX handles_target ON handles (target);

CREATE INDEX handles_status ON handles (status);
