-- 0001: the first schema: sessions, history rows carrying durable cut records, turn envelopes.
-- Rows hold indexed columns plus msgspec-JSON records (persistence/records.py); a record's new
-- fields always have defaults, so adding one needs no migration.

CREATE TABLE schema_version (
    version INTEGER NOT NULL
);

CREATE TABLE sessions (
    id TEXT NOT NULL PRIMARY KEY,
    record BLOB NOT NULL  -- SessionRecord
);

CREATE TABLE history_rows (
    session TEXT NOT NULL REFERENCES sessions (id),
    seq INTEGER NOT NULL,
    row_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    stream TEXT,
    cut_state TEXT,  -- CutRecord.state, NULL when the row carries no cut record
    cut BLOB,  -- CutRecord
    body BLOB NOT NULL,  -- opaque to the store, kept byte-exact
    PRIMARY KEY (session, seq),
    UNIQUE (session, row_id),
    CHECK ((cut IS NULL) = (cut_state IS NULL))
);

-- owed_cuts() reads this index, never the bodies.
CREATE INDEX history_rows_cut_state ON history_rows (cut_state, session, seq)
    WHERE cut_state IS NOT NULL;

CREATE TABLE turn_envelopes (
    session TEXT NOT NULL REFERENCES sessions (id),
    stream TEXT NOT NULL,
    record BLOB NOT NULL,  -- TurnEnvelope
    PRIMARY KEY (session, stream)
);
