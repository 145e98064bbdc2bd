-- 0002: operation receipts (OP-1 to OP-12; docs/operations.md). One row per operation,
-- upserted as it moves; the indexed columns serve "outstanding + recent" and the overlap
-- guard's lookups.

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
