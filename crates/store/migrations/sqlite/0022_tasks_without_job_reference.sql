-- The tasks without a foreign key to `jobs`, as the history (`0021`): every task row's insert
-- looked its job up in `jobs`'s primary key, for a reference the writer keeps by construction
-- (a job's tasks are written in the transaction that writes the job, or after it), and that
-- deleting a job never relied on (`rows::delete_job` deletes its tasks first). The columns,
-- in their order, and the indexes are those the earlier migrations left.
CREATE TABLE tasks_rebuilt (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL,
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
    attempt_base     INTEGER NOT NULL,
    wait             TEXT,
    wait_kind        TEXT,
    wake_at          INTEGER,
    pending_outcome  TEXT,
    callback         TEXT,
    child_job_id     TEXT,
    limits           TEXT,
    parked           TEXT,
    parked_at        INTEGER,
    claimed_at       INTEGER
);
INSERT INTO tasks_rebuilt SELECT * FROM tasks;
DROP TABLE tasks;
ALTER TABLE tasks_rebuilt RENAME TO tasks;
CREATE INDEX tasks_job ON tasks (job_id, seq);
-- Dispatch order: priority, then age, then id; only ready tasks are in the index.
CREATE INDEX tasks_dispatch ON tasks (namespace, queue, priority DESC, available_at, id) WHERE status = 'ready' AND held = 0;
CREATE INDEX tasks_rollback ON tasks (namespace, queue, priority DESC, available_at, id)
    WHERE status = 'ready' AND held = 0 AND kind = 'compensation';
CREATE INDEX tasks_lease ON tasks (lease_expires_at) WHERE status = 'running' AND lease_expires_at IS NOT NULL;
-- Running tasks per queue (serial queues and concurrency limits).
CREATE INDEX tasks_running ON tasks (namespace, queue) WHERE status = 'running' AND queue <> '';
CREATE INDEX tasks_deadline ON tasks (deadline_at) WHERE deadline_at IS NOT NULL AND status IN ('ready', 'running');
CREATE INDEX tasks_waiting ON tasks (namespace, wait_kind, id) WHERE status = 'running' AND wait_kind IS NOT NULL;
CREATE INDEX tasks_wake ON tasks (wake_at) WHERE status = 'running' AND held = 0 AND wake_at IS NOT NULL;
CREATE INDEX tasks_parked ON tasks (namespace, parked, parked_at, id) WHERE parked IS NOT NULL;
