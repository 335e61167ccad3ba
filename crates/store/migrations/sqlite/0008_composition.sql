-- Composition and control flow: what a succeeded job produced.
ALTER TABLE jobs ADD COLUMN output TEXT;        -- JSON: the workflow's `output`, rendered when the job succeeded
ALTER TABLE jobs ADD COLUMN failed_steps TEXT;  -- JSON list: the steps it went on past (`continue_on_failure`); NULL when none
