-- One row the health check writes when no other write succeeded lately (`/healthz`, see
-- `health.rs`): a tiny real write that tells whether the database takes writes (a full disk, a
-- read-only filesystem) and notices by itself when it does again.
CREATE TABLE health_probe (id INTEGER PRIMARY KEY CHECK (id = 1), probed_at INTEGER NOT NULL);
