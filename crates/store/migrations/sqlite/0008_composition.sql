-- Composition and control flow: what a succeeded job produced, and sub-workflows.
ALTER TABLE jobs ADD COLUMN output TEXT;          -- JSON: the workflow's `output`, rendered when the job succeeded
ALTER TABLE jobs ADD COLUMN failed_steps TEXT;    -- JSON list: the steps it went on past (`continue_on_failure`); NULL when none
-- A child job's parent: the task and attempt that started it (one child per attempt, so a
-- crash never starts two), and how deep it nests.
ALTER TABLE jobs ADD COLUMN parent_job_id TEXT;
ALTER TABLE jobs ADD COLUMN parent_task_id TEXT;
ALTER TABLE jobs ADD COLUMN parent_attempt INTEGER;
ALTER TABLE jobs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN child_versions TEXT;  -- JSON: workflow -> version its steps start; NULL when none
CREATE UNIQUE INDEX jobs_parent_attempt ON jobs (parent_task_id, parent_attempt) WHERE parent_task_id IS NOT NULL;
CREATE INDEX jobs_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;
-- A sub-workflow step's child job of its latest attempt (or the child a compensation rolls back).
ALTER TABLE tasks ADD COLUMN child_job_id TEXT;
-- Children that ended, for their parent's next transaction (parent before child: the child's
-- transaction does not lock its parent, it leaves this row).
CREATE TABLE child_endings (
    child_job_id  TEXT PRIMARY KEY,
    parent_job_id TEXT NOT NULL,
    ended_at      INTEGER NOT NULL
);
CREATE INDEX child_endings_due ON child_endings (ended_at);
