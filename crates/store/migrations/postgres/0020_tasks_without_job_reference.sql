-- The tasks without a foreign key to `jobs`, as the partitioned history has none: every task
-- row's insert ran the key's check, a lookup of its job that also locks the job's row, for a
-- reference the writer keeps by construction (a job's tasks are written in the transaction
-- that writes the job, or after it) and that deleting a job never relied on
-- (`rows::delete_job` deletes its tasks first).
ALTER TABLE tasks DROP CONSTRAINT tasks_job_id_fkey;
