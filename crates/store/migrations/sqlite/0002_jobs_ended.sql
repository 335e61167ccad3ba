-- Finished jobs are pruned after their retention; this finds them without a scan.
CREATE INDEX jobs_ended ON jobs (ended_at) WHERE ended_at IS NOT NULL;
