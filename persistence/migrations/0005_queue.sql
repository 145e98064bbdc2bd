-- 0005: the durable message queue (docs/persistence.md, "The queue"). One row per queued entry,
-- its body msgspec JSON owned by message_queue (encode_entry), kept byte-exact; the kind is a
-- column so a reader tells user-authored entries from agent-initiated ones without the body.
-- A session's queue version guards its snapshots: only a newer one replaces the queue.

CREATE TABLE queued_entries (
    session TEXT NOT NULL REFERENCES sessions (id),
    entry_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body BLOB NOT NULL,  -- message_queue.EntryState, opaque to the store
    PRIMARY KEY (session, entry_id)
);

-- load() and queued() read a session's entries by position through this index.
CREATE INDEX queued_entries_position ON queued_entries (session, position, entry_id);

CREATE TABLE queue_versions (
    session TEXT NOT NULL PRIMARY KEY REFERENCES sessions (id),
    version INTEGER NOT NULL
);
