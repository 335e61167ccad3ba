//! Counts of jobs and tasks for the server's `/metrics`, read with one query at scrape time.
//!
//! The task parts read only the partial indexes of ready (`tasks_dispatch`) and running
//! (`tasks_lease`) tasks, so their cost follows the backlog, not the history. The jobs part
//! groups the whole `jobs` table (a scan of the covering index `jobs_status_created`): cheap
//! while the store is small, it should be replaced by counters maintained in the writer's
//! transactions when the store grows large.

use std::collections::BTreeMap;

use starbridge_core::model::JobStatus;
use starbridge_core::time::{Duration, Timestamp};

use crate::Result;
use crate::db::{Conn, Queries, args};

/// Jobs per namespace and status, tasks per namespace and queue, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// When the counts were read (the store's clock).
    pub at: Timestamp,
    /// Jobs by `(namespace, status)`. Every status of every known namespace is present, with 0
    /// when no job has it, so that gauges do not vanish.
    pub jobs: BTreeMap<(String, String), u64>,
    /// Tasks by `(namespace, queue)`, for every known queue.
    pub queues: BTreeMap<(String, String), QueueStats>,
}

/// The tasks of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueStats {
    /// Ready tasks that polls may be handed (not held by a paused job nor parked by their step's
    /// `lock` or `rate`), including those whose
    /// retry backoff or "check later" delay has not passed yet.
    pub ready: u64,
    /// Tasks a worker holds (leased).
    pub running: u64,
    /// How long the oldest ready task that is claimable now has been claimable; zero when none is.
    pub oldest_ready_age: Duration,
}

/// The columns `namespace, queue, ready tasks, earliest available_at that has passed (?1 is now)`
/// of the claimable ready tasks per queue, read through the dispatch index; shared by `/metrics`
/// and the dashboard's queue samples (`minutes`).
macro_rules! ready_by_queue {
    () => {
        "namespace, queue, COUNT(*), MIN(CASE WHEN available_at <= ?1 THEN available_at END) \
        FROM tasks WHERE status = 'ready' AND held = 0 GROUP BY namespace, queue"
    };
}
pub(crate) use ready_by_queue;

/// One statement, so a scrape is one read. `part` says which count a row carries:
/// 0 jobs per status, 1 ready tasks per queue (with the earliest `available_at` that has passed),
/// 2 running tasks per queue (those waiting on the server with no queue are not on one), 3 known queues, 4 known namespaces (for the zeros).
const STATS_SQL: &str = concat!(
    "SELECT 0, namespace, status, COUNT(*), NULL FROM jobs GROUP BY namespace, status \
    UNION ALL SELECT 1, ",
    ready_by_queue!(),
    " UNION ALL \
    SELECT 2, namespace, queue, COUNT(*), NULL FROM tasks WHERE status = 'running' AND queue <> '' \
        GROUP BY namespace, queue \
    UNION ALL \
    SELECT 3, namespace, name, 0, NULL FROM queues \
    UNION ALL \
    SELECT 4, name, '', 0, NULL FROM namespaces"
);

pub fn read(conn: &mut dyn Conn, now: Timestamp) -> Result<Stats> {
    let rows = conn.query_map(STATS_SQL, args![now.0], |row| {
        Ok((
            row.get::<i64>(0)?,
            row.get::<String>(1)?,
            row.get::<String>(2)?,
            row.get::<i64>(3)?,
            row.get::<Option<i64>>(4)?,
        ))
    })?;
    let mut stats = Stats {
        at: now,
        jobs: BTreeMap::new(),
        queues: BTreeMap::new(),
    };
    let mut namespaces = Vec::new();
    for (part, namespace, name, count, oldest) in rows {
        let count = u64::try_from(count).unwrap_or(0);
        match part {
            0 => {
                namespaces.push(namespace.clone());
                stats.jobs.insert((namespace, name), count);
            }
            1 => {
                let queue = stats.queues.entry((namespace, name)).or_default();
                queue.ready = count;
                queue.oldest_ready_age = oldest.map_or(Duration(0), |at| now.since(Timestamp(at)));
            }
            2 => stats.queues.entry((namespace, name)).or_default().running = count,
            3 => {
                stats.queues.entry((namespace, name)).or_default();
            }
            _ => namespaces.push(namespace),
        }
    }
    for namespace in namespaces {
        for status in JobStatus::ALL {
            stats
                .jobs
                .entry((namespace.clone(), status.as_str().to_owned()))
                .or_insert(0);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tasks_only_through_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.db");
        crate::sqlite::SqliteConn::open(&path)
            .unwrap()
            .migrate(0)
            .unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut statement = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {STATS_SQL}"))
            .unwrap();
        let plan: Vec<String> = statement
            .query_map([0], |row| row.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let tasks: Vec<&String> = plan.iter().filter(|line| line.contains("tasks")).collect();
        assert_eq!(tasks.len(), 2, "{plan:?}");
        assert!(
            tasks.iter().all(|line| line.contains("USING")),
            "a task count scans the table: {plan:?}"
        );
    }
}
