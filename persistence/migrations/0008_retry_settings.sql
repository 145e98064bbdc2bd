-- 0008: the session's auto-retry preference (AS-32; docs/persistence.md, "The auto-retry
-- preference"). On by default, and nothing is stored for it: a row holds "off" (0) only.
-- Stored by Boundary.auto_retry=False (upserted), deleted by Boundary.auto_retry=True, in the
-- boundary's transaction; read by load and by the startup scan's tails. A value that is not
-- 0 or 1 is damage, read as off.

CREATE TABLE retry_settings (
    session TEXT NOT NULL PRIMARY KEY REFERENCES sessions (id),
    auto_retry INTEGER NOT NULL
);
