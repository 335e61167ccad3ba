-- Indexes for browsing jobs newest first (the web UI's jobs list), with or without a status and
-- workflow filter and a creation-time range: each list walks one index in its order and stops
-- after a page, and each count per status is one index-only range.
CREATE INDEX jobs_created ON jobs (namespace, created_at, id);
CREATE INDEX jobs_status_created ON jobs (namespace, status, created_at, id);
CREATE INDEX jobs_workflow_created ON jobs (namespace, workflow, created_at, id);
CREATE INDEX jobs_workflow_status_created ON jobs (namespace, workflow, status, created_at, id);
