-- Step locks and per-key rates (a step's `lock` and `rate`).
-- A task of such a step keeps its rendered keys, the slot it holds and what it is parked for
-- (JSON; NULL for the tasks of every other step).
ALTER TABLE tasks ADD COLUMN limits TEXT;
-- A ready task waiting for a slot or a token is parked: its `held` is 2, which keeps it out of
-- the claim indexes (`held = 0`), and `parked` names its line of waiters (a lock's key, or a
-- rate's bucket), first come first served by `parked_at`. NULL when not parked.
ALTER TABLE tasks ADD COLUMN parked TEXT;
ALTER TABLE tasks ADD COLUMN parked_at INTEGER;
CREATE INDEX tasks_parked ON tasks (namespace, parked, parked_at, id) WHERE parked IS NOT NULL;
-- Slots of locks held by tasks, from claim (or the grant of a parked task) to the end of the
-- attempt. Jobs hold theirs in `lock_holders`; both count against one key.
CREATE TABLE task_lock_holders (
    task_id     TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    acquired_at INTEGER NOT NULL
);
CREATE INDEX task_lock_holders_key ON task_lock_holders (namespace, key);
-- Token buckets of per-key rates: one per namespace, rendered key and limit. A bucket that
-- refilled and has no parked tasks is the same as none, and is pruned.
CREATE TABLE rate_buckets (
    namespace     TEXT NOT NULL,
    key           TEXT NOT NULL,
    tokens        INTEGER NOT NULL,   -- the limit: starts per `per_ms`
    per_ms        INTEGER NOT NULL,
    bucket_tokens REAL NOT NULL,      -- tokens left at `bucket_at`
    bucket_at     INTEGER NOT NULL,
    wake_at       INTEGER,            -- tasks are parked: when the next token arrives
    PRIMARY KEY (namespace, key, tokens, per_ms)
);
CREATE INDEX rate_buckets_wake ON rate_buckets (wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX rate_buckets_idle ON rate_buckets (bucket_at) WHERE wake_at IS NULL;
