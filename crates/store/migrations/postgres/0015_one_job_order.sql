-- The API's job list is ordered as the web UI's is, newest first by creation time, through
-- `jobs_created` and `jobs_status_created`: the id-ordered twins of those two are no longer
-- read, and every job paid for them in each write of its row.
DROP INDEX jobs_list;
DROP INDEX jobs_status;
-- Retiring a day of history reads the jobs created before its end per namespace through
-- `jobs_created`, so the index on `created_at` alone goes too.
DROP INDEX jobs_created_at;
