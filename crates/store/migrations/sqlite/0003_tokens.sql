-- API tokens: only a hash of the secret is kept. `namespace` NULL: every namespace (admins).
CREATE TABLE tokens (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    namespace    TEXT,
    scopes       TEXT NOT NULL,       -- JSON list: admin, operate, submit, work, read
    queues       TEXT,                -- JSON list of queues a `work` token may serve; NULL: all
    secret_hash  TEXT NOT NULL,       -- SHA-256 of the secret, hex
    created_at   INTEGER NOT NULL,
    created_by   TEXT NOT NULL,
    last_used_at INTEGER,
    revoked_at   INTEGER
);

-- Who changed what, and why: every accepted change made through the API.
CREATE TABLE audit (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    at        INTEGER NOT NULL,
    namespace TEXT NOT NULL,
    actor     TEXT NOT NULL,          -- the token's name, or the actor header without auth
    action    TEXT NOT NULL,          -- method and path, e.g. "POST /api/v1/jobs/{id}/retry"
    target    TEXT NOT NULL,          -- the path as requested
    status    INTEGER NOT NULL,
    reason    TEXT
);
CREATE INDEX audit_namespace ON audit (namespace, seq);
