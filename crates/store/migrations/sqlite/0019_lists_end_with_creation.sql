-- The two list indexes end with the creation time, without the job's id: a page sorts the
-- jobs of one millisecond by id as it walks the index (an incremental sort of the order's
-- right part), and no entry holds the 26 bytes of an id. Retention finds finished jobs through
-- them too (a job that ended before a time was created before it), so `jobs_ended` goes.
DROP INDEX jobs_status_created;
DROP INDEX jobs_workflow_status_created;
DROP INDEX jobs_ended;
CREATE INDEX jobs_status_created ON jobs (namespace, status, created_at);
CREATE INDEX jobs_workflow_status_created ON jobs (namespace, workflow, status, created_at);
