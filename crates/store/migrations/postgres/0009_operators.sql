-- A deleted workflow is hidden, not dropped: its versions stay for the jobs that show them, and
-- a later apply continues at the next version number. `deleted_at` is set on every version of
-- the name when it is deleted; a version applied afterwards has none.
ALTER TABLE workflows ADD COLUMN deleted_at BIGINT;
-- Stop on error: `on_error = 'pause'` pauses the queue when a forward task on it fails for good,
-- and `paused_reason` says why (NULL for a pause an operator asked for).
ALTER TABLE queues ADD COLUMN on_error TEXT NOT NULL DEFAULT 'continue';
ALTER TABLE queues ADD COLUMN paused_reason TEXT;
ALTER TABLE queue_prefixes ADD COLUMN on_error TEXT NOT NULL DEFAULT 'continue';
-- The compensation tasks a queue stopped on error still hands out; only compensation rows have
-- an entry, so forward tasks pay nothing for it.
CREATE INDEX tasks_rollback ON tasks (namespace, queue, priority DESC, available_at, id)
    WHERE status = 'ready' AND held = 0 AND kind = 'compensation';
