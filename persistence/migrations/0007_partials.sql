-- 0007: the session's partial (B4, PS-2; docs/persistence.md, "Partial parts"). While a stream
-- runs, the parts of its in-progress assistant message, by position from 0, byte-exact (the
-- stream manager's encoding, never decoded here). Upserted by Boundary.partial, deleted by
-- Boundary.drop_partials in the transaction that commits the stream's row (B5, B6) or starts
-- the next stream (PS-2); read by load. Like receipts, no foreign key to sessions: a chunk
-- needs no session record.

CREATE TABLE partial_parts (
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    position INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session, stream, position)
);
