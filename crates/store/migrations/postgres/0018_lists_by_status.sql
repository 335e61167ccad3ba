-- A list of jobs of any status reads each status's range of `jobs_status_created` (or
-- `jobs_workflow_status_created`) in list order and merges them, so the two list indexes
-- without the status go: every job paid for them in its bytes and in its first write.
DROP INDEX jobs_created;
DROP INDEX jobs_workflow_created;
