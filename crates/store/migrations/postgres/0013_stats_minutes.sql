-- The dashboard's per-minute figures, per workflow (kind 'workflow') and per queue (kind
-- 'queue'): jobs or tasks started, succeeded and failed in the minute, a fixed-bucket histogram
-- of the durations of those that ended (a JSON array of counts, see core `histogram`), and for
-- queues the ready tasks and the oldest claimable wait sampled in the minute. Filled by the
-- rollup loop from the history, never by the writer's job transactions.
CREATE TABLE stats_minutes (
    namespace   TEXT NOT NULL,
    minute      BIGINT NOT NULL,   -- the minute's start, ms since the epoch
    kind        TEXT NOT NULL,
    name        TEXT NOT NULL,
    started     BIGINT NOT NULL,
    succeeded   BIGINT NOT NULL,
    failed      BIGINT NOT NULL,
    depth       BIGINT,             -- queues: ready tasks when sampled
    oldest_wait BIGINT,             -- queues: ms the oldest claimable task had waited
    durations   TEXT NOT NULL,
    PRIMARY KEY (namespace, minute, kind, name)
);
-- Minutes past the dashboard's longest window go.
CREATE INDEX stats_minutes_age ON stats_minutes (minute);

-- How far the rollup read the history (`events.seq`) and the last minute it sampled queues.
CREATE TABLE stats_rollup (
    id             BIGINT PRIMARY KEY,
    seq            BIGINT NOT NULL,
    sampled_minute BIGINT NOT NULL
);
INSERT INTO stats_rollup (id, seq, sampled_minute) VALUES (1, 0, 0);
