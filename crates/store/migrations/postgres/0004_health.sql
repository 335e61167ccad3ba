-- One row the health check writes when no other write succeeded lately (`/healthz`, see
-- `health.rs`): a tiny real write that tells whether the database takes writes (a full disk, a
-- read-only server) and notices by itself when it does again. Every node probes the same row.
CREATE TABLE health_probe (id BIGINT PRIMARY KEY CHECK (id = 1), probed_at BIGINT NOT NULL);
