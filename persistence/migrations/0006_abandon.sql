-- 0006: startup-abandon markers (PS-8; docs/persistence.md, "Abandon markers"). At most one per
-- session: why its last turn must not be retried at startup, and the user row that turn
-- answered. Written, replaced and removed whole by a boundary (Boundary.abandon,
-- clear_abandon); read by load and by the startup scan's tails.

CREATE TABLE abandon_markers (
    session TEXT NOT NULL PRIMARY KEY REFERENCES sessions (id),
    reason TEXT NOT NULL,
    user_row TEXT
);
