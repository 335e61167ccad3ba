-- The history without a foreign key to `jobs`, as on PostgreSQL (whose partitioned history has
-- none): every event row's insert looked its job up in `jobs`'s primary key, a B-tree descent
-- through text keys for each of a one-step job's three events, for a reference the writer keeps
-- by construction (a job's events are written in the transaction that writes the job, or after
-- it), and that deleting a job never relied on (`rows::delete_job` deletes its history first).
CREATE TABLE events_rebuilt (
    seq       INTEGER PRIMARY KEY,
    job_id    TEXT NOT NULL,
    task_id   TEXT,
    step      TEXT,
    at        INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    attempt   INTEGER,
    worker_id TEXT,
    detail    TEXT NOT NULL
);
INSERT INTO events_rebuilt (seq, job_id, task_id, step, at, kind, attempt, worker_id, detail)
    SELECT seq, job_id, task_id, step, at, kind, attempt, worker_id, detail FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_rebuilt RENAME TO events;
CREATE INDEX events_job ON events (job_id, seq);
