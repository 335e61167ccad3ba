-- Durable waiting: tasks that wait on the server holding no worker (sleep, signal, approval,
-- a callback), the callback credential of each attempt, and the signals sent to jobs.
ALTER TABLE tasks ADD COLUMN wait TEXT;             -- JSON: what a running task waits for, since when
ALTER TABLE tasks ADD COLUMN wait_kind TEXT;        -- sleep | signal | approval | callback
ALTER TABLE tasks ADD COLUMN wake_at BIGINT;       -- when the wait ends by itself (a sleep, a callback's timeout)
ALTER TABLE tasks ADD COLUMN pending_outcome TEXT;  -- JSON: what ended the wait while the job was paused
ALTER TABLE tasks ADD COLUMN callback TEXT;         -- JSON: the attempt's callback token hash and first answer
-- Tasks waiting on the server hold no lease, and sleep, signal and approval tasks no queue:
-- they stay out of the lease timers' and the per-queue running counts' indexes, which a million
-- sleeping jobs would otherwise fill.
DROP INDEX tasks_lease;
CREATE INDEX tasks_lease ON tasks (lease_expires_at) WHERE status = 'running' AND lease_expires_at IS NOT NULL;
DROP INDEX tasks_running;
CREATE INDEX tasks_running ON tasks (namespace, queue) WHERE status = 'running' AND queue <> '';
-- The timer loop's waits: only those a pause does not hold.
CREATE INDEX tasks_wake ON tasks (wake_at) WHERE status = 'running' AND held = 0 AND wake_at IS NOT NULL;
-- Pending approvals (and other waits) per namespace.
CREATE INDEX tasks_waiting ON tasks (namespace, wait_kind, id) WHERE status = 'running' AND wait_kind IS NOT NULL;

ALTER TABLE jobs ADD COLUMN signals_received BIGINT NOT NULL DEFAULT 0;

-- Signals sent to a job, kept until a step takes them (and afterwards, for their dedupe id).
CREATE TABLE signals (
    job_id      TEXT NOT NULL REFERENCES jobs (id),
    seq         BIGINT NOT NULL,   -- arrival order within the job
    namespace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    dedupe_id   TEXT,               -- the sender's id: a repeat with it changes nothing
    sender      TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    consumed_by TEXT,               -- the task that took it
    PRIMARY KEY (job_id, seq)
);
CREATE UNIQUE INDEX signals_dedupe ON signals (job_id, dedupe_id) WHERE dedupe_id IS NOT NULL;
CREATE INDEX signals_pending ON signals (job_id, seq) WHERE consumed_by IS NULL;
