-- Job labels (key=value tags). A job's labels live on its row, read with it (NULL: none), and
-- once more, one row each, in `job_labels` for the label filter: a job without labels writes
-- no row there.
ALTER TABLE jobs ADD COLUMN labels TEXT;            -- JSON object of the job's labels
CREATE TABLE job_labels (
    job_id    TEXT NOT NULL REFERENCES jobs (id),
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
);
-- The filter: the jobs of a namespace with a label, newest first (job ids are time-ordered).
CREATE INDEX job_labels_find ON job_labels (namespace, key, value, job_id);

ALTER TABLE schedules ADD COLUMN labels TEXT;       -- JSON object: labels of the jobs it starts
