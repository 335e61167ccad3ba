//! History events: their rows, appended in sets (see `deferred`) and never changed, and a job's
//! history read back in order.

use serde_json::Value;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Event, EventKind, Job};
use starbridge_core::time::Timestamp;

use super::{RowWrite, enum_column, json_text, parse_json};
use crate::db::{Conn, Queries, Value as SqlValue, args};
use crate::{Result, StoredEvent};

/// History events: appended, never changed.
pub const EVENT_WRITE: RowWrite = RowWrite {
    table: "events",
    columns: &[
        "job_id",
        "task_id",
        "step",
        "at",
        "kind",
        "attempt",
        "worker_id",
        "detail",
    ],
    upsert: None,
};

/// What a stored `job_created` event leaves out of its detail: the job's workflow and version,
/// which the job's row keeps (and never changes). Reading the history puts them back (`events`).
const KEPT_BY_THE_JOB: [&str; 2] = ["workflow", "version"];

/// An event's row, in the columns of `EVENT_WRITE`.
pub fn event_values(job: &JobId, step: Option<&str>, event: &Event) -> Vec<SqlValue> {
    let detail = match &event.detail {
        Value::Object(fields) if event.kind == EventKind::JobCreated => json_text(&Value::Object(
            fields
                .iter()
                .filter(|(name, _)| !KEPT_BY_THE_JOB.contains(&name.as_str()))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        )),
        detail => json_text(detail),
    };
    args![
        job.as_str(),
        event.task.as_ref().map(TaskId::as_str),
        step,
        event.at.0,
        event.kind.as_str(),
        event.attempt,
        event.worker,
        detail,
    ]
    .iter()
    .map(SqlValue::of)
    .collect()
}

/// `job`'s history after event `after`, in order, at most `limit` events.
pub fn events(conn: &mut dyn Conn, job: &Job, after: i64, limit: u32) -> Result<Vec<StoredEvent>> {
    conn.query_map(
        "SELECT seq, task_id, step, at, kind, attempt, worker_id, detail FROM events \
         WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        args![job.id.as_str(), after, limit],
        |row| {
            let task: Option<String> = row.get(1)?;
            let kind = enum_column(row.get(4)?, EventKind::parse)?;
            let mut detail = parse_json(Some(row.get(7)?))?.unwrap_or(Value::Null);
            if kind == EventKind::JobCreated
                && let Value::Object(fields) = &mut detail
            {
                // Events stored before their detail left these out keep them as they were.
                fields
                    .entry("workflow")
                    .or_insert_with(|| Value::from(job.workflow.as_str()));
                fields
                    .entry("version")
                    .or_insert_with(|| Value::from(job.version));
            }
            Ok(StoredEvent {
                seq: row.get(0)?,
                step: row.get(2)?,
                event: Event {
                    at: Timestamp(row.get(3)?),
                    kind,
                    task: task.and_then(|t| TaskId::parse(&t)),
                    attempt: row.get(5)?,
                    worker: row.get(6)?,
                    detail,
                },
            })
        },
    )
}

/// How far a job has changed, for a page that follows it live: its last history event, and the
/// runs of its tasks under way (a claim writes no history, so a run's start shows only here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeMark {
    /// The sequence number of its last event (0 for none).
    pub last_event: i64,
    /// Its tasks whose run has started and not ended.
    pub runs: i64,
    /// The latest start of those runs.
    pub last_claim: Option<i64>,
}

/// The job's change mark, or `None` when it is not in `namespace`.
pub fn change_mark(
    conn: &mut dyn Conn,
    namespace: &str,
    job: &JobId,
) -> Result<Option<ChangeMark>> {
    conn.query_opt(
        "SELECT (SELECT MAX(seq) FROM events WHERE job_id = ?1), \
         (SELECT COUNT(claimed_at) FROM tasks WHERE job_id = ?1), \
         (SELECT MAX(claimed_at) FROM tasks WHERE job_id = ?1) \
         FROM jobs WHERE id = ?1 AND namespace = ?2",
        args![job.as_str(), namespace],
        |row| {
            Ok(ChangeMark {
                last_event: row.get::<Option<i64>>(0)?.unwrap_or(0),
                runs: row.get(1)?,
                last_claim: row.get(2)?,
            })
        },
    )
}

/// When a task's attempt was first claimed, as far as its history tells: an attempt that asked
/// to be checked later was claimed again, and the `task_check_later` ending its first run
/// carries that run's start (`claimed_at`); histories written before claims left the history
/// have a `task_claimed` event per claim instead. `None` when the attempt had one run only
/// (the event ending it carries its start). `within` bounds the claims' times (from the
/// task's first start to the attempt's end), which keeps the read to the history of those
/// days.
pub fn attempt_first_claimed_at(
    conn: &mut dyn Conn,
    job: &JobId,
    task: &TaskId,
    attempt: u32,
    within: (Timestamp, Timestamp),
) -> Result<Option<Timestamp>> {
    let runs = conn.query_map(
        "SELECT at, kind, detail FROM events \
         WHERE job_id = ?1 AND task_id = ?2 AND attempt = ?3 \
         AND kind IN ('task_claimed', 'task_check_later') AND at >= ?4 AND at <= ?5",
        args![job.as_str(), task.as_str(), attempt, within.0.0, within.1.0],
        |row| {
            Ok((
                row.get::<i64>(0)?,
                row.get::<String>(1)?,
                row.get::<String>(2)?,
            ))
        },
    )?;
    let mut first: Option<i64> = None;
    for (at, kind, detail) in runs {
        let claimed = if kind == EventKind::TaskClaimed.as_str() {
            Some(at)
        } else {
            parse_json::<Value>(Some(detail))?.and_then(|detail| detail["claimed_at"].as_i64())
        };
        first = match (first, claimed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(first.map(Timestamp))
}
