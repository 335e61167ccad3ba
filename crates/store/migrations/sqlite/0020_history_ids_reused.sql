-- The history's ids without AUTOINCREMENT: a new event takes the largest id plus one, so a
-- commit no longer writes the `sqlite_sequence` page besides the event's own (one page of the
-- eight a step's commit wrote). An id is reused only once the largest was deleted; the one
-- reader of the whole history by id, the dashboard's rollup, has its watermark lowered to the
-- largest id left whenever history is deleted (`rows::jobs::delete_job`), so that it reads the
-- new events, and here once for the ids AUTOINCREMENT had already spent.
CREATE TABLE events_rebuilt (
    seq       INTEGER PRIMARY KEY,
    job_id    TEXT NOT NULL REFERENCES jobs (id),
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
DELETE FROM sqlite_sequence WHERE name = 'events';
UPDATE stats_rollup SET seq = (SELECT COALESCE(MAX(seq), 0) FROM events)
    WHERE seq > (SELECT COALESCE(MAX(seq), 0) FROM events);
