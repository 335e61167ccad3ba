//! History events: their rows, appended in sets (see `deferred`) and never changed, and a job's
//! history read back in order.

use serde_json::Value;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Event, EventKind, Job};
use starbridge_core::time::Timestamp;

use super::{RowWrite, json_text, parse_json};
use crate::db::{Arg, Conn, Queries, args};
use crate::{Error, Result, StoredEvent};

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

/// The fields of a `job_created` event's detail that its row stores: those but `KEPT_BY_THE_JOB`,
/// serialized from the detail itself (no copy of it).
struct LeftByTheJob<'a>(&'a serde_json::Map<String, Value>);

impl serde::Serialize for LeftByTheJob<'_> {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.0
                .iter()
                .filter(|(name, _)| !KEPT_BY_THE_JOB.contains(&name.as_str())),
        )
    }
}

/// An event's row, in the columns of `EVENT_WRITE`.
pub fn event_values(job: &JobId, step: Option<&str>, event: &Event, take: impl FnOnce(&[Arg<'_>])) {
    let detail = match &event.detail {
        Value::Object(fields) if event.kind == EventKind::JobCreated => {
            serde_json::to_string(&LeftByTheJob(fields)).unwrap_or_default()
        }
        detail => json_text(detail),
    };
    take(args![
        job.as_str(),
        event.task.as_ref().map(TaskId::as_str),
        step,
        event.at.0,
        kind_column(event.kind),
        event.attempt,
        event.worker,
        detail,
    ])
}

/// How an event's kind is stored: a number of one or two digits, not its name (a one-step job's
/// three events hold 3 bytes of kind instead of 38). Histories written before hold names; both
/// read back (`kind_from_column`), and a query that picks kinds names both (`kinds_in`). A
/// kind's number never changes: a new kind takes the next one.
pub(crate) fn kind_column(kind: EventKind) -> &'static str {
    match kind {
        EventKind::JobCreated => "1",
        EventKind::TaskSucceeded => "2",
        EventKind::JobSucceeded => "3",
        EventKind::TaskFailed => "4",
        EventKind::TaskRetryScheduled => "5",
        EventKind::JobFailed => "6",
        EventKind::TaskReady => "7",
        EventKind::TaskSkipped => "8",
        EventKind::TaskCheckLater => "9",
        EventKind::TaskLeaseExpired => "10",
        EventKind::TaskTimedOut => "11",
        EventKind::TaskCancelled => "12",
        EventKind::TaskRequeued => "13",
        EventKind::JobTimedOut => "14",
        EventKind::JobCompensating => "15",
        EventKind::JobCompensationFailed => "16",
        EventKind::CompensationPlanned => "17",
        EventKind::FanOutExpanded => "18",
        EventKind::JobQueued => "19",
        EventKind::JobStarted => "20",
        EventKind::JobPaused => "21",
        EventKind::JobResumed => "22",
        EventKind::JobCancelled => "23",
        EventKind::JobRetried => "24",
        EventKind::JobRerun => "25",
        EventKind::TaskResolvedByOperator => "26",
        EventKind::TaskWaiting => "27",
        EventKind::SignalReceived => "28",
        EventKind::TaskApproved => "29",
        EventKind::TaskRejected => "30",
        EventKind::TaskAwaitingCallback => "31",
        EventKind::CallbackReceived => "32",
        EventKind::ChildEnded => "33",
        EventKind::TaskClaimed => "34",
    }
}

/// An event's kind from its stored column: a number (`kind_column`) or, as written before, a
/// name.
pub(crate) fn kind_from_column(text: &str) -> Result<EventKind> {
    let kind = if text.starts_with(|c: char| c.is_ascii_digit()) {
        EventKind::ALL
            .iter()
            .copied()
            .find(|&kind| kind_column(kind) == text)
    } else {
        EventKind::parse(text)
    };
    kind.ok_or_else(|| Error::Corrupt(format!("event kind '{text}'")))
}

/// SQL naming `kinds` as stored, numbers and names, for a `kind IN (…)`.
pub(crate) fn kinds_in(kinds: impl IntoIterator<Item = EventKind>) -> String {
    kinds
        .into_iter()
        .map(|kind| format!("'{}', '{}'", kind_column(kind), kind.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `job`'s history after event `after`, in order, at most `limit` events.
pub fn events(conn: &mut dyn Conn, job: &Job, after: i64, limit: u32) -> Result<Vec<StoredEvent>> {
    conn.query_map(
        "SELECT seq, task_id, step, at, kind, attempt, worker_id, detail FROM events \
         WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        args![job.id.as_str(), after, limit],
        |row| {
            let task: Option<String> = row.get(1)?;
            let kind = kind_from_column(&row.get::<String>(4)?)?;
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
        &format!(
            "SELECT at, kind, detail FROM events \
             WHERE job_id = ?1 AND task_id = ?2 AND attempt = ?3 \
             AND kind IN ({}) AND at >= ?4 AND at <= ?5",
            kinds_in([EventKind::TaskClaimed, EventKind::TaskCheckLater])
        ),
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
        let claimed = if kind_from_column(&kind)? == EventKind::TaskClaimed {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_number_and_reads_back_from_it_or_its_name() {
        let mut numbers: Vec<&str> = EventKind::ALL.iter().map(|&k| kind_column(k)).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), EventKind::ALL.len());
        for &kind in EventKind::ALL {
            assert_eq!(kind_from_column(kind_column(kind)).unwrap(), kind);
            assert_eq!(kind_from_column(kind.as_str()).unwrap(), kind);
        }
        assert!(kind_from_column("99").is_err());
        assert!(kind_from_column("job_exploded").is_err());
    }
}
