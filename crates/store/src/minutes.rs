//! The dashboard's per-minute rows (`stats_minutes`): per workflow, jobs started, succeeded and
//! failed and a histogram of their durations; per queue, the same of tasks plus the ready tasks
//! and the oldest claimable wait sampled once a minute.
//!
//! A rollup reads the history (`events`) past its watermark in `seq` order through the primary
//! key, so its cost follows what happened since the last one, never the size of the store, and
//! the writer's job transactions do nothing for it. It has two halves: `read_rollup` on a
//! reading connection (the joins, the aggregation, the queue sample) and `apply_rollup` on the
//! writer, which moves the watermark only if it is still where the read found it (a
//! compare-and-set, so two server nodes never count an event twice) and adds the counts.
//!
//! Safety lag: on PostgreSQL `seq` is drawn at insert and a transaction may commit after one
//! that drew a later number. The rollup stops at the first event younger than `lag`, so an
//! event is counted only once every transaction older than the lag has committed; a write
//! transaction that stays open longer than the lag may have its events skipped.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use starbridge_core::histogram::Histogram;
use starbridge_core::model::EventKind;
use starbridge_core::time::{Duration, Timestamp};

use crate::db::{Conn, Queries, args, bind, key_sets};
use crate::rows::{kind_from_column, kinds_in};
use crate::stats::ready_by_queue;
use crate::{Error, Result};

/// What a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SeriesKind {
    /// Jobs of a workflow.
    Workflow,
    /// Tasks of a queue.
    Queue,
}

impl SeriesKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SeriesKind::Workflow => "workflow",
            SeriesKind::Queue => "queue",
        }
    }

    fn parse(text: &str) -> Result<SeriesKind> {
        match text {
            "workflow" => Ok(SeriesKind::Workflow),
            "queue" => Ok(SeriesKind::Queue),
            other => Err(Error::Corrupt(format!("stats_minutes kind {other:?}"))),
        }
    }
}

/// One series' figures in one minute.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MinuteFigures {
    pub started: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Queues: the ready tasks when sampled in this minute, if it was.
    pub depth: Option<u64>,
    /// Queues: how long the oldest claimable task had waited when sampled.
    pub oldest_wait: Option<Duration>,
    /// The durations of the jobs or tasks that ended in this minute.
    pub durations: Histogram,
}

/// Which series and minute a row is: `(namespace, kind, name, minute start)`.
pub type MinuteKey = (String, SeriesKind, String, Timestamp);

/// A stored row.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteRow {
    pub kind: SeriesKind,
    pub name: String,
    pub minute: Timestamp,
    pub figures: MinuteFigures,
}

/// What a rollup read, to be added by `apply_rollup`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollup {
    /// The watermark the read started from, and where it got to.
    pub from: Watermark,
    pub to: Watermark,
    /// Events read past the watermark, of any kind (those of kinds not counted included).
    pub events: usize,
    pub figures: BTreeMap<MinuteKey, MinuteFigures>,
}

/// How far the rollups got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    /// The last event read.
    pub seq: i64,
    /// The start of the last minute queues were sampled in.
    pub sampled_minute: Timestamp,
}

/// How long the rows are kept: the dashboard's longest window and a margin.
pub const KEEP_MINUTES: Duration = Duration::from_secs(2 * 24 * 3600);

/// The history past the watermark, in `seq` order, read alone: a range of the primary key on
/// either backend, whatever a planner estimates for joins (PostgreSQL, misjudging them, hashed
/// the whole of `jobs` and `tasks` for every batch). The events' jobs and tasks are then read
/// by key, each once however many of its events the batch holds (`JOBS_SQL`, `TASKS_SQL`).
/// The detail is read only of the events that can end a worker's run of a task
/// (`EventKind::ends_a_run`), for the run's start (`claimed_at`): a task's queue counts it as
/// started in that minute.
fn events_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let ending = EventKind::ALL
            .iter()
            .copied()
            .filter(|kind| kind.ends_a_run());
        format!(
            "SELECT seq, at, kind, job_id, task_id, CASE WHEN kind IN ({}) THEN detail END \
             FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            kinds_in(ending)
        )
    });
    &SQL
}

/// The kinds of event a rollup counts (besides the start of a run that an event ending it
/// carries); `task_claimed` is in histories written before claims left the history.
const COUNTED: [EventKind; 8] = [
    EventKind::JobCreated,
    EventKind::JobStarted,
    EventKind::JobSucceeded,
    EventKind::JobFailed,
    EventKind::JobCompensationFailed,
    EventKind::TaskClaimed,
    EventKind::TaskSucceeded,
    EventKind::TaskFailed,
];

/// Of each job: its namespace and workflow, its start, and whether it has no lock (a job
/// without a lock starts when it is created; one with a lock is queued first and starts with
/// `job_started`).
const JOBS_SQL: &str = "SELECT id, namespace, workflow, started_at, lock_key IS NULL FROM jobs";

/// Of each task: its queue and start.
const TASKS_SQL: &str = "SELECT id, queue, started_at FROM tasks";

/// What a rollup needs of an event's job.
struct JobFacts {
    namespace: String,
    workflow: String,
    started_at: Option<i64>,
    unlocked: bool,
}

/// What a rollup needs of an event's task.
struct TaskFacts {
    queue: String,
    started_at: Option<i64>,
}

/// Rows of `select` (whose first column is the key) for the given keys, by key.
fn by_key<T>(
    conn: &mut dyn Conn,
    select: &str,
    keys: &[String],
    mut read: impl FnMut(&mut crate::db::Row) -> Result<T>,
) -> Result<std::collections::HashMap<String, T>> {
    let mut found = std::collections::HashMap::with_capacity(keys.len());
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (condition, values) in key_sets(conn.backend(), &keys) {
        let sql = format!("{select} WHERE id {condition}");
        for (key, value) in conn.query_map(&sql, &bind(&values), |row| {
            Ok((row.get::<String>(0)?, read(row)?))
        })? {
            found.insert(key, value);
        }
    }
    Ok(found)
}

/// The start of the run an event's detail says it ended (`claimed_at`), if it says so.
fn run_start(detail: Option<String>) -> Option<Timestamp> {
    let detail: serde_json::Value = serde_json::from_str(&detail?).ok()?;
    detail["claimed_at"].as_i64().map(Timestamp)
}

/// The start of the minute `at` falls in.
pub fn minute_of(at: Timestamp) -> Timestamp {
    Timestamp(at.0 - at.0.rem_euclid(60_000))
}

fn watermark(conn: &mut dyn Conn) -> Result<Watermark> {
    conn.query_opt(
        "SELECT seq, sampled_minute FROM stats_rollup WHERE id = 1",
        &[],
        |row| {
            Ok(Watermark {
                seq: row.get(0)?,
                sampled_minute: Timestamp(row.get(1)?),
            })
        },
    )?
    .ok_or_else(|| Error::Corrupt("stats_rollup has no row".to_owned()))
}

/// Reads up to `limit` counted events past the watermark that are older than `lag`, and, once
/// a minute, samples every queue's ready tasks. Writes nothing.
pub fn read_rollup(
    conn: &mut dyn Conn,
    now: Timestamp,
    lag: Duration,
    limit: u32,
) -> Result<Rollup> {
    let from = watermark(conn)?;
    let cutoff = Timestamp(
        now.0
            .saturating_sub(i64::try_from(lag.0).unwrap_or(i64::MAX)),
    );
    let events = conn.query_map(events_sql(), args![from.seq, i64::from(limit)], |row| {
        Ok((
            row.get::<i64>(0)?,
            Timestamp(row.get(1)?),
            kind_from_column(&row.get::<String>(2)?)?,
            row.get::<String>(3)?,
            row.get::<Option<String>>(4)?,
            run_start(row.get::<Option<String>>(5)?),
        ))
    })?;
    // The events older than the lag, up to the first younger one: what this rollup reads.
    let read = events.iter().take_while(|(_, at, ..)| *at < cutoff).count();
    let counted: Vec<_> = events[..read]
        .iter()
        .filter(|(_, _, kind, _, _, run_started)| COUNTED.contains(kind) || run_started.is_some())
        .collect();
    let mut job_ids: Vec<String> = counted.iter().map(|event| event.3.clone()).collect();
    job_ids.sort_unstable();
    job_ids.dedup();
    let mut task_ids: Vec<String> = counted.iter().filter_map(|event| event.4.clone()).collect();
    task_ids.sort_unstable();
    task_ids.dedup();
    let jobs = by_key(conn, JOBS_SQL, &job_ids, |row| {
        Ok(JobFacts {
            namespace: row.get(1)?,
            workflow: row.get(2)?,
            started_at: row.get(3)?,
            unlocked: row.get(4)?,
        })
    })?;
    let tasks = by_key(conn, TASKS_SQL, &task_ids, |row| {
        Ok(TaskFacts {
            queue: row.get(1)?,
            started_at: row.get(2)?,
        })
    })?;
    let mut rollup = Rollup {
        from,
        to: Watermark {
            seq: events[..read].last().map_or(from.seq, |event| event.0),
            ..from
        },
        events: read,
        figures: BTreeMap::new(),
    };
    for (_, at, kind, job, task, run_started) in counted {
        // An event of a job deleted since is not counted.
        let Some(job) = jobs.get(job) else {
            continue;
        };
        let queue = task
            .as_ref()
            .and_then(|task| tasks.get(task))
            .filter(|task| !task.queue.is_empty());
        if let (Some(started), Some(task)) = (run_started, queue) {
            let key = (
                job.namespace.clone(),
                SeriesKind::Queue,
                task.queue.clone(),
                minute_of(*started),
            );
            rollup.figures.entry(key).or_default().started += 1;
        }
        if !COUNTED.contains(kind) {
            continue;
        }
        if *kind == EventKind::JobCreated && !job.unlocked {
            continue;
        }
        let at = *at;
        let minute = minute_of(at);
        let (series, name, started_at) = if kind.as_str().starts_with("job_") {
            (SeriesKind::Workflow, job.workflow.clone(), job.started_at)
        } else {
            match queue {
                Some(task) => (SeriesKind::Queue, task.queue.clone(), task.started_at),
                None => continue,
            }
        };
        let figures = rollup
            .figures
            .entry((job.namespace.clone(), series, name, minute))
            .or_default();
        let ended = match kind {
            EventKind::JobCreated | EventKind::JobStarted | EventKind::TaskClaimed => {
                figures.started += 1;
                false
            }
            EventKind::JobSucceeded | EventKind::TaskSucceeded => {
                figures.succeeded += 1;
                true
            }
            _ => {
                figures.failed += 1;
                true
            }
        };
        if ended {
            let took = started_at.map_or(0, |started| at.since(Timestamp(started)).0);
            figures.durations.record(took);
        }
    }
    let minute = minute_of(now);
    if minute > from.sampled_minute {
        rollup.to.sampled_minute = minute;
        let samples =
            conn.query_map(concat!("SELECT ", ready_by_queue!()), args![now.0], |row| {
                Ok((
                    row.get::<String>(0)?,
                    row.get::<String>(1)?,
                    row.get::<i64>(2)?,
                    row.get::<Option<i64>>(3)?,
                ))
            })?;
        for (namespace, queue, ready, oldest) in samples {
            let figures = rollup
                .figures
                .entry((namespace, SeriesKind::Queue, queue, minute))
                .or_default();
            figures.depth = Some(u64::try_from(ready).unwrap_or(0));
            figures.oldest_wait = Some(oldest.map_or(Duration(0), |at| now.since(Timestamp(at))));
        }
    }
    Ok(rollup)
}

/// Adds what `read_rollup` read and moves the watermark, if no other rollup moved it since;
/// returns whether it did. Also deletes rows older than `KEEP_MINUTES`.
pub fn apply_rollup(conn: &mut dyn Conn, rollup: &Rollup, now: Timestamp) -> Result<bool> {
    let moved = conn.execute(
        "UPDATE stats_rollup SET seq = ?1, sampled_minute = ?2 \
         WHERE id = 1 AND seq = ?3 AND sampled_minute = ?4",
        args![
            rollup.to.seq,
            rollup.to.sampled_minute.0,
            rollup.from.seq,
            rollup.from.sampled_minute.0
        ],
    )?;
    if moved == 0 {
        return Ok(false);
    }
    for ((namespace, kind, name, minute), figures) in &rollup.figures {
        let stored = conn.query_opt(
            "SELECT durations FROM stats_minutes \
             WHERE namespace = ?1 AND minute = ?2 AND kind = ?3 AND name = ?4",
            args![namespace, minute.0, kind.as_str(), name],
            |row| row.get::<String>(0),
        )?;
        let mut durations = figures.durations.clone();
        if let Some(stored) = stored {
            durations.merge(&parse_durations(&stored)?);
        }
        let durations =
            serde_json::to_string(&durations).map_err(|error| Error::Corrupt(error.to_string()))?;
        conn.execute(
            "INSERT INTO stats_minutes (namespace, minute, kind, name, started, succeeded, \
                 failed, depth, oldest_wait, durations) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT (namespace, minute, kind, name) DO UPDATE SET \
                 started = stats_minutes.started + excluded.started, \
                 succeeded = stats_minutes.succeeded + excluded.succeeded, \
                 failed = stats_minutes.failed + excluded.failed, \
                 depth = COALESCE(excluded.depth, stats_minutes.depth), \
                 oldest_wait = COALESCE(excluded.oldest_wait, stats_minutes.oldest_wait), \
                 durations = excluded.durations",
            args![
                namespace,
                minute.0,
                kind.as_str(),
                name,
                figures.started,
                figures.succeeded,
                figures.failed,
                figures.depth,
                figures.oldest_wait.map(Duration::as_millis),
                durations
            ],
        )?;
    }
    let keep = i64::try_from(KEEP_MINUTES.as_millis()).unwrap_or(i64::MAX);
    conn.execute(
        "DELETE FROM stats_minutes WHERE minute < ?1",
        args![now.0.saturating_sub(keep)],
    )?;
    Ok(true)
}

fn parse_durations(text: &str) -> Result<Histogram> {
    serde_json::from_str(text)
        .map_err(|error| Error::Corrupt(format!("stats_minutes durations: {error}")))
}

/// A namespace's rows from `since` on, by kind, name and minute.
pub fn list(conn: &mut dyn Conn, namespace: &str, since: Timestamp) -> Result<Vec<MinuteRow>> {
    let rows = conn.query_map(
        "SELECT kind, name, minute, started, succeeded, failed, depth, oldest_wait, durations \
         FROM stats_minutes WHERE namespace = ?1 AND minute >= ?2 ORDER BY kind, name, minute",
        args![namespace, since.0],
        |row| {
            Ok((
                row.get::<String>(0)?,
                row.get::<String>(1)?,
                row.get::<i64>(2)?,
                row.get::<u64>(3)?,
                row.get::<u64>(4)?,
                row.get::<u64>(5)?,
                row.get::<Option<u64>>(6)?,
                row.get::<Option<u64>>(7)?,
                row.get::<String>(8)?,
            ))
        },
    )?;
    rows.into_iter()
        .map(
            |(kind, name, minute, started, succeeded, failed, depth, oldest, durations)| {
                Ok(MinuteRow {
                    kind: SeriesKind::parse(&kind)?,
                    name,
                    minute: Timestamp(minute),
                    figures: MinuteFigures {
                        started,
                        succeeded,
                        failed,
                        depth,
                        oldest_wait: oldest.map(Duration),
                        durations: parse_durations(&durations)?,
                    },
                })
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(path: &std::path::Path, sql: &str, params: usize) -> Vec<String> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let params: Vec<i64> = vec![0; params];
        statement
            .query_map(rusqlite::params_from_iter(params), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn a_rollup_read_from_a_watermark_another_moved_adds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::sqlite::SqliteConn::open(&dir.path().join("cas.db")).unwrap();
        conn.migrate(0).unwrap();
        let minute = Timestamp(1_800_000_000_000);
        let figures = MinuteFigures {
            started: 2,
            ..MinuteFigures::default()
        };
        let key = (
            "default".to_owned(),
            SeriesKind::Workflow,
            "wf".to_owned(),
            minute,
        );
        let start = Watermark {
            seq: 0,
            sampled_minute: Timestamp(0),
        };
        let rollup = Rollup {
            from: start,
            to: Watermark { seq: 7, ..start },
            events: 2,
            figures: BTreeMap::from([(key, figures)]),
        };
        assert!(apply_rollup(&mut conn, &rollup, minute).unwrap());
        // A second node that read the same events from the same watermark.
        assert!(!apply_rollup(&mut conn, &rollup, minute).unwrap());
        let rows = list(&mut conn, "default", Timestamp(0)).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].figures.started, 2, "counted once");
        assert_eq!(watermark(&mut conn).unwrap().seq, 7);
    }

    #[test]
    fn the_rollup_and_the_window_read_go_through_keys_not_scans() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("minutes.db");
        crate::sqlite::SqliteConn::open(&path)
            .unwrap()
            .migrate(0)
            .unwrap();
        let by_key = |select: &str| plan(&path, &format!("{select} WHERE id IN (?1, ?2)"), 2);
        for lines in [
            plan(&path, events_sql(), 2),
            by_key(JOBS_SQL),
            by_key(TASKS_SQL),
        ] {
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].starts_with("SEARCH"),
                "the history past the watermark, and the events' jobs and tasks, by key: {lines:?}"
            );
        }
        let window = plan(
            &path,
            "SELECT kind FROM stats_minutes WHERE namespace = ?1 AND minute >= ?2",
            2,
        );
        assert!(
            window.iter().all(|line| line.starts_with("SEARCH")),
            "{window:?}"
        );
    }
}
