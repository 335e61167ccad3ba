-- Every resource belongs to a namespace from the first schema on.
CREATE TABLE namespaces (
    name       TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);

CREATE TABLE workflows (
    namespace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    definition  TEXT NOT NULL,      -- normalized JSON
    description TEXT,
    steps       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (namespace, name, version)
);

CREATE TABLE queues (
    namespace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    mode        TEXT NOT NULL DEFAULT 'parallel',  -- parallel | serial
    priority    INTEGER NOT NULL DEFAULT 0,
    concurrency INTEGER,                          -- most running tasks; NULL: no limit
    paused      INTEGER NOT NULL DEFAULT 0,
    max_wait_ms INTEGER NOT NULL DEFAULT 300000,  -- older ready tasks go first, oldest first
    rate_tokens INTEGER,                          -- rate limit: starts per rate_per_ms; NULL: none
    rate_per_ms INTEGER,
    bucket_tokens REAL,                           -- the token bucket at bucket_at
    bucket_at   INTEGER,
    updated_at  INTEGER,
    PRIMARY KEY (namespace, name)
);

CREATE TABLE jobs (
    id                   TEXT PRIMARY KEY,
    namespace            TEXT NOT NULL,
    workflow             TEXT NOT NULL,
    version              INTEGER NOT NULL,
    status               TEXT NOT NULL,
    params               TEXT NOT NULL,
    key                  TEXT,
    priority             INTEGER NOT NULL,
    created_at           INTEGER NOT NULL,
    started_at           INTEGER,
    ended_at             INTEGER,
    deadline_at          INTEGER,
    wind_down            TEXT,
    compensation_planned INTEGER NOT NULL,
    completions          INTEGER NOT NULL,
    round                INTEGER NOT NULL,
    lock_key             TEXT,                -- the rendered lock key, if the workflow has a lock
    lock_slots           INTEGER
);
CREATE UNIQUE INDEX jobs_key ON jobs (namespace, key) WHERE key IS NOT NULL;
CREATE INDEX jobs_list ON jobs (namespace, id);
CREATE INDEX jobs_status ON jobs (namespace, status, id);
CREATE INDEX jobs_deadline ON jobs (deadline_at) WHERE deadline_at IS NOT NULL AND status = 'running';
-- Jobs waiting for a lock slot, first come first served.
CREATE INDEX jobs_queued ON jobs (namespace, lock_key, id) WHERE status = 'queued';

-- Who holds a slot of which lock. A row lives exactly as long as its job is not finished.
CREATE TABLE lock_holders (
    job_id      TEXT PRIMARY KEY REFERENCES jobs (id),
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    acquired_at INTEGER NOT NULL
);
CREATE INDEX lock_holders_key ON lock_holders (namespace, key);

CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs (id),
    namespace        TEXT NOT NULL,
    seq              INTEGER NOT NULL,
    kind             TEXT NOT NULL,
    step             TEXT NOT NULL,
    item             INTEGER,
    compensates      TEXT,
    queue            TEXT NOT NULL,
    command          TEXT NOT NULL,
    status           TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    checking         INTEGER NOT NULL,
    available_at     INTEGER,
    deadline_at      INTEGER,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    worker_id        TEXT,
    input            TEXT,
    output           TEXT,
    error            TEXT,
    progress         TEXT,
    logs             TEXT,
    created_at       INTEGER NOT NULL,
    ready_at         INTEGER,
    started_at       INTEGER,
    ended_at         INTEGER,
    completed_seq    INTEGER,
    held             INTEGER NOT NULL,   -- its job is paused: ready but not handed out
    round            INTEGER NOT NULL,
    attempt_base     INTEGER NOT NULL
);
CREATE INDEX tasks_job ON tasks (job_id, seq);
-- Dispatch order: priority, then age, then id; only ready tasks are in the index.
CREATE INDEX tasks_dispatch ON tasks (namespace, queue, priority DESC, available_at, id) WHERE status = 'ready' AND held = 0;
CREATE INDEX tasks_lease ON tasks (lease_expires_at) WHERE status = 'running';
-- Running tasks per queue (serial queues and concurrency limits).
CREATE INDEX tasks_running ON tasks (namespace, queue) WHERE status = 'running';
-- Oldest ready tasks per queue (starvation guard).
CREATE INDEX tasks_age ON tasks (namespace, queue, available_at, id) WHERE status = 'ready' AND held = 0;
CREATE INDEX tasks_deadline ON tasks (deadline_at) WHERE deadline_at IS NOT NULL AND status IN ('ready', 'running');

CREATE TABLE events (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id    TEXT NOT NULL REFERENCES jobs (id),
    task_id   TEXT,
    step      TEXT,
    at        INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    attempt   INTEGER,
    worker_id TEXT,
    detail    TEXT NOT NULL
);
CREATE INDEX events_job ON events (job_id, seq);

-- Cron triggers. A fire creates a job whose key is `schedule:<name>:<fire time ms>`, so the
-- same fire never creates two jobs.
CREATE TABLE schedules (
    namespace       TEXT NOT NULL,
    name            TEXT NOT NULL,
    workflow        TEXT NOT NULL,
    params          TEXT NOT NULL,
    cron            TEXT NOT NULL,
    timezone        TEXT NOT NULL,
    overlap         TEXT NOT NULL,      -- skip | allow | queue_one
    catch_up        TEXT NOT NULL,      -- JSON: {"policy": "skip" | "once" | "all", "limit": n}
    paused          INTEGER NOT NULL,
    next_fire_at    INTEGER,
    pending_fire_at INTEGER,            -- a fire held until the previous job ends (queue_one)
    last_fire_at    INTEGER,
    last_job_id     TEXT,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE paused = 0;

-- Webhook subscriptions on job state changes.
CREATE TABLE webhooks (
    id         TEXT PRIMARY KEY,
    namespace  TEXT NOT NULL,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    workflow   TEXT,                  -- only jobs of this workflow; NULL: all
    states     TEXT NOT NULL,         -- JSON list of job statuses; empty: all
    created_at INTEGER NOT NULL
);
CREATE INDEX webhooks_namespace ON webhooks (namespace);

-- The outbox: a delivery is written in the same transaction as the change it reports, and
-- sent (at least once) by the server's deliverer, retried with backoff.
CREATE TABLE webhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id      TEXT NOT NULL,
    namespace       TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    status          TEXT NOT NULL,    -- the job status it reports
    payload         TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL,
    next_attempt_at INTEGER,          -- NULL once delivered or given up
    delivered_at    INTEGER,
    last_status     INTEGER,          -- HTTP status of the last attempt
    last_error      TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, id);
