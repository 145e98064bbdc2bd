-- PostgreSQL 0001: every table of the SQLite store's schema 8 (docs/persistence.md), in one
-- migration, plus what many engine processes need: each session's lease (owner, epoch, expiry;
-- docs/deploying.md) and the epoch each history row and receipt was written under. Values are
-- typed columns plus msgspec-JSON records kept as bytea, byte-exact, as in SQLite. An identity
-- column `written` orders what SQLite orders by rowid (an upsert keeps it).

CREATE TABLE schema_version (
    version integer NOT NULL,
    -- Names the application: a database whose schema_version says otherwise is another's.
    application text NOT NULL DEFAULT 'turnkeeper'
);

CREATE TABLE sessions (
    id text NOT NULL PRIMARY KEY,
    record bytea NOT NULL,  -- SessionRecord
    -- The lease: the owning engine incarnation (NULL: unowned), the fence's epoch (bumped by
    -- every take) and when the lease runs out, on the database's clock.
    owner text,
    epoch bigint NOT NULL DEFAULT 0,
    lease_expires timestamptz
);

-- Renewal (every session of one owner) and the claim of expired leases read these.
CREATE INDEX sessions_owner ON sessions (owner) WHERE owner IS NOT NULL;
CREATE INDEX sessions_lease ON sessions (lease_expires);

CREATE TABLE history_rows (
    session text NOT NULL REFERENCES sessions (id),
    seq bigint NOT NULL,
    row_id text NOT NULL,
    kind text NOT NULL,
    stream text,
    cut_state text,  -- CutRecord.state, NULL when the row carries no cut record
    cut bytea,  -- CutRecord
    body bytea NOT NULL,  -- opaque to the store, kept byte-exact
    epoch bigint NOT NULL,  -- the lease epoch of the write
    PRIMARY KEY (session, seq),
    UNIQUE (session, row_id),
    CHECK ((cut IS NULL) = (cut_state IS NULL))
);

-- The startup scan reads the rows whose cut is owed (or whose state is unknown: damage is
-- reported, never an owed cut made invisible) through this index, never the bodies.
CREATE INDEX history_rows_live ON history_rows (session, seq)
    WHERE cut_state IS NOT NULL
    AND cut_state NOT IN ('consumed', 'withdrawn', 'forfeited', 'voided');

CREATE TABLE turn_envelopes (
    session text NOT NULL REFERENCES sessions (id),
    stream text NOT NULL,
    record bytea NOT NULL,  -- TurnEnvelope
    written bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (session, stream)
);

CREATE TABLE operations (
    op_id text NOT NULL PRIMARY KEY,
    session text NOT NULL,
    state text NOT NULL,
    capability text NOT NULL,
    target text NOT NULL,
    resolved_by text,
    resolved_at double precision,
    record bytea NOT NULL,  -- OperationRecord
    epoch bigint NOT NULL,  -- the lease epoch of the last write (0: no session lease)
    written bigint GENERATED ALWAYS AS IDENTITY
);

CREATE INDEX operations_session ON operations (session, written);
CREATE INDEX operations_open ON operations (state, session)
    WHERE state IN ('requested', 'running', 'indeterminate');

CREATE TABLE handles (
    handle_id text NOT NULL PRIMARY KEY,
    owner text NOT NULL,
    target text NOT NULL,
    status text NOT NULL,
    record bytea NOT NULL  -- HandleRecord
);

CREATE INDEX handles_owner ON handles (owner);
CREATE INDEX handles_target ON handles (target);
CREATE INDEX handles_status ON handles (status);

CREATE TABLE queued_entries (
    session text NOT NULL REFERENCES sessions (id),
    entry_id text NOT NULL,
    position bigint NOT NULL,
    kind text NOT NULL,
    body bytea NOT NULL,  -- message_queue.EntryState, opaque to the store
    PRIMARY KEY (session, entry_id)
);

CREATE INDEX queued_entries_position ON queued_entries (session, position, entry_id);

CREATE TABLE queue_versions (
    session text NOT NULL PRIMARY KEY REFERENCES sessions (id),
    version bigint NOT NULL
);

CREATE TABLE abandon_markers (
    session text NOT NULL PRIMARY KEY REFERENCES sessions (id),
    reason text NOT NULL,
    user_row text
);

CREATE TABLE partial_parts (
    session text NOT NULL,
    stream text NOT NULL,
    position bigint NOT NULL,
    body bytea NOT NULL,
    written bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (session, stream, position)
);

CREATE INDEX partial_parts_session ON partial_parts (session, written);

CREATE TABLE retry_settings (
    session text NOT NULL PRIMARY KEY REFERENCES sessions (id),
    auto_retry integer NOT NULL
);
