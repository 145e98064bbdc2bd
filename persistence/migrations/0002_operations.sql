-- 0002: operation receipts (SPEC section 4). One row per operation, upserted as it moves;
-- the indexed columns serve "outstanding + recent" and the overlap guard's lookups.

CREATE TABLE operations (
    op_id TEXT NOT NULL PRIMARY KEY,
    session TEXT NOT NULL,
    state TEXT NOT NULL,
    capability TEXT NOT NULL,
    target TEXT NOT NULL,
    record BLOB NOT NULL  -- OperationRecord
);

CREATE INDEX operations_open ON operations (state, session)
    WHERE state IN ('requested', 'running', 'indeterminate');
