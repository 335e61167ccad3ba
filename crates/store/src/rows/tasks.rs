//! Tasks: their rows (written in sets, see `deferred`), the job a task belongs to, and what a
//! claim reads of a queue: its candidates in dispatch order, how many of its tasks run, and
//! when its next ready task becomes claimable.

use starbridge_core::dispatch::{Candidate, QueueConfig};
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{CallbackGrant, Task, TaskKind, TaskStatus, Wait, WaitFor};
use starbridge_core::time::Timestamp;

use super::{RowWrite, enum_column, opt_json_text, parse_json, ts};
use crate::db::{Arg, Conn, Queries, Row, args, bind, key_sets};
use crate::{Error, Result};

pub(super) const TASK_COLUMNS: &str = "id, job_id, seq, kind, step, item, compensates, queue, command, status, \
     priority, attempt, checking, available_at, deadline_at, lease_token, lease_expires_at, worker_id, \
     input, output, error, progress, logs, created_at, ready_at, started_at, ended_at, completed_seq, \
     held, round, attempt_base, wait, pending_outcome, callback, child_job_id, limits, claimed_at";
/// How many columns `TASK_COLUMNS` names.
pub(super) const TASK_COLUMN_COUNT: usize = super::column_count(TASK_COLUMNS);

pub(super) fn task_from_row(row: &mut Row) -> Result<RawTask> {
    Ok(RawTask {
        id: row.get(0)?,
        job_id: row.get(1)?,
        seq: row.get(2)?,
        kind: row.get(3)?,
        step: row.get(4)?,
        item: row.get(5)?,
        compensates: row.get(6)?,
        queue: row.get(7)?,
        command: row.get(8)?,
        status: row.get(9)?,
        priority: row.get(10)?,
        attempt: row.get(11)?,
        checking: row.get(12)?,
        available_at: row.get(13)?,
        deadline_at: row.get(14)?,
        lease_token: row.get(15)?,
        lease_expires_at: row.get(16)?,
        worker_id: row.get(17)?,
        input: row.get(18)?,
        output: row.get(19)?,
        error: row.get(20)?,
        progress: row.get(21)?,
        logs: row.get(22)?,
        created_at: row.get(23)?,
        ready_at: row.get(24)?,
        started_at: row.get(25)?,
        ended_at: row.get(26)?,
        completed_seq: row.get(27)?,
        held: row.get(28)?,
        round: row.get(29)?,
        attempt_base: row.get(30)?,
        wait: row.get(31)?,
        pending_outcome: row.get(32)?,
        callback: row.get(33)?,
        child_job_id: row.get(34)?,
        limits: row.get(35)?,
        claimed_at: row.get(36)?,
    })
}

pub(super) struct RawTask {
    id: String,
    job_id: String,
    seq: u32,
    kind: String,
    step: String,
    item: Option<u32>,
    compensates: Option<String>,
    queue: String,
    command: String,
    status: String,
    priority: i32,
    attempt: u32,
    checking: bool,
    available_at: Option<i64>,
    deadline_at: Option<i64>,
    lease_token: Option<String>,
    lease_expires_at: Option<i64>,
    worker_id: Option<String>,
    input: Option<String>,
    output: Option<String>,
    error: Option<String>,
    progress: Option<String>,
    logs: Option<String>,
    created_at: i64,
    ready_at: Option<i64>,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    completed_seq: Option<i64>,
    /// 0: claimable; 1: its job is paused; 2: parked for a step's lock or rate.
    held: i64,
    round: u32,
    attempt_base: u32,
    wait: Option<String>,
    pending_outcome: Option<String>,
    callback: Option<String>,
    child_job_id: Option<String>,
    limits: Option<String>,
    claimed_at: Option<i64>,
}

impl RawTask {
    pub(super) fn into_task(self) -> Result<Task> {
        let corrupt = |what: &str| Error::Corrupt(format!("bad id '{what}'"));
        Ok(Task {
            id: TaskId::parse(&self.id).ok_or_else(|| corrupt(&self.id))?,
            job_id: JobId::parse(&self.job_id).ok_or_else(|| corrupt(&self.job_id))?,
            seq: self.seq,
            kind: enum_column(self.kind, TaskKind::parse)?,
            step: self.step,
            item: self.item,
            compensates: self
                .compensates
                .map(|id| TaskId::parse(&id).ok_or_else(|| corrupt(&id)))
                .transpose()?,
            queue: self.queue,
            command: self.command,
            status: enum_column(self.status, TaskStatus::parse)?,
            priority: self.priority,
            attempt: self.attempt,
            checking: self.checking,
            available_at: ts(self.available_at),
            deadline_at: ts(self.deadline_at),
            lease_token: self.lease_token,
            lease_expires_at: ts(self.lease_expires_at),
            worker_id: self.worker_id,
            input: parse_json(self.input)?,
            output: parse_json(self.output)?,
            error: parse_json(self.error)?,
            progress: parse_json(self.progress)?,
            logs: parse_json(self.logs)?,
            created_at: Timestamp(self.created_at),
            ready_at: ts(self.ready_at),
            started_at: ts(self.started_at),
            ended_at: ts(self.ended_at),
            completed_seq: self.completed_seq.and_then(|n| u64::try_from(n).ok()),
            held: self.held == HELD_PAUSED,
            round: self.round,
            attempt_base: self.attempt_base,
            wait: parse_json(self.wait)?,
            pending_outcome: parse_json(self.pending_outcome)?,
            callback: self
                .callback
                .map(|text| callback_from_column(text, self.attempt))
                .transpose()?,
            child: self
                .child_job_id
                .map(|id| JobId::parse(&id).map(Box::new).ok_or_else(|| corrupt(&id)))
                .transpose()?,
            limits: parse_json(self.limits)?,
            claimed_at: ts(self.claimed_at),
        })
    }
}

/// The `callback` column of a task at `attempt`: the digest alone for a grant of that attempt,
/// in the first round, unanswered (as almost every grant is, and every task row keeps one);
/// else the grant's JSON, an object. Grants stored before the short form are JSON too.
fn callback_column(grant: &CallbackGrant, attempt: u32) -> String {
    let plain = grant.attempt == attempt && grant.round == 0 && grant.answered.is_none();
    if plain && !grant.hash.starts_with('{') {
        grant.hash.clone()
    } else {
        serde_json::to_string(grant).unwrap_or_default()
    }
}

/// A grant read back from its `callback` column (`callback_column`) of a task at `attempt`.
fn callback_from_column(text: String, attempt: u32) -> Result<Box<CallbackGrant>> {
    if text.starts_with('{') {
        return serde_json::from_str(&text).map_err(|e| Error::Corrupt(e.to_string()));
    }
    Ok(Box::new(CallbackGrant {
        attempt,
        round: 0,
        hash: text,
        answered: None,
    }))
}

/// The `held` column of a ready task its paused job holds back (0: claimable).
const HELD_PAUSED: i64 = 1;
/// The `held` column of a ready task parked for a step's lock or rate.
const HELD_PARKED: i64 = 2;

/// Tasks of a namespace waiting for approval, oldest first, with their job's workflow.
pub fn pending_approvals(
    conn: &mut dyn Conn,
    namespace: &str,
    limit: u32,
) -> Result<Vec<(Task, String)>> {
    let sql = format!(
        "SELECT {TASK_COLUMNS}, (SELECT workflow FROM jobs WHERE jobs.id = tasks.job_id) \
         FROM tasks INDEXED BY tasks_waiting \
         WHERE status = 'running' AND namespace = ?1 AND wait_kind = 'approval' ORDER BY id LIMIT ?2"
    );
    conn.query_map(&sql, args![namespace, limit], |row| {
        let task = task_from_row(row)?;
        // The workflow comes right after the task's columns.
        Ok((task, row.get::<String>(TASK_COLUMNS.split(',').count())?))
    })?
    .into_iter()
    .map(|(task, workflow)| Ok((task.into_task()?, workflow)))
    .collect()
}

/// The job of each of these tasks that exists.
pub fn jobs_of_tasks(conn: &mut dyn Conn, tasks: &[TaskId]) -> Result<Vec<(TaskId, JobId)>> {
    let mut found = Vec::with_capacity(tasks.len());
    let keys: Vec<&str> = tasks.iter().map(TaskId::as_str).collect();
    for (condition, values) in key_sets(conn.backend(), &keys) {
        let sql = format!("SELECT id, job_id FROM tasks WHERE id {condition}");
        for (task, job) in conn.query_map(&sql, &bind(&values), |row| {
            Ok((row.get::<String>(0)?, row.get::<String>(1)?))
        })? {
            if let (Some(task), Some(job)) = (TaskId::parse(&task), JobId::parse(&job)) {
                found.push((task, job));
            }
        }
    }
    Ok(found)
}

pub fn job_of_task(conn: &mut dyn Conn, task: &TaskId) -> Result<Option<JobId>> {
    let id: Option<String> = conn.query_opt(
        "SELECT job_id FROM tasks WHERE id = ?1",
        args![task.as_str()],
        |row| row.get(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}

/// Tasks: a new row when the job (or a fan-out, a compensation) makes one, its changing
/// columns afterwards.
pub const TASK_WRITE: RowWrite = RowWrite {
    table: "tasks",
    columns: &[
        "id",
        "job_id",
        "namespace",
        "seq",
        "kind",
        "step",
        "item",
        "compensates",
        "queue",
        "command",
        "status",
        "priority",
        "attempt",
        "checking",
        "available_at",
        "deadline_at",
        "lease_token",
        "lease_expires_at",
        "worker_id",
        "input",
        "output",
        "error",
        "progress",
        "logs",
        "created_at",
        "ready_at",
        "started_at",
        "ended_at",
        "completed_seq",
        "held",
        "round",
        "attempt_base",
        "wait",
        "wait_kind",
        "wake_at",
        "pending_outcome",
        "callback",
        "child_job_id",
        "limits",
        "parked",
        "parked_at",
        "claimed_at",
    ],
    upsert: Some((
        "id",
        &[
            // A queue template is rendered once the task is ready, after its row was made.
            "queue",
            "status",
            "attempt",
            "checking",
            "available_at",
            "deadline_at",
            "lease_token",
            "lease_expires_at",
            "worker_id",
            "input",
            "output",
            "error",
            "progress",
            "logs",
            "ready_at",
            "started_at",
            "ended_at",
            "completed_seq",
            "held",
            "round",
            "attempt_base",
            "wait",
            "wait_kind",
            "wake_at",
            "pending_outcome",
            "callback",
            "child_job_id",
            "limits",
            "parked",
            "parked_at",
            "claimed_at",
        ],
    )),
};

/// A task's row, in the columns of `TASK_WRITE`.
pub fn task_values(namespace: &str, task: &Task, take: impl FnOnce(&[Arg<'_>])) {
    let error = opt_json_text(task.error.as_ref());
    let wait_kind = task.wait.as_ref().map(|wait| match wait.on {
        WaitFor::Sleep { .. } => "sleep",
        WaitFor::Signal { .. } => "signal",
        WaitFor::Approval { .. } => "approval",
        WaitFor::Callback { .. } => "callback",
        WaitFor::Child { .. } => "child",
        WaitFor::ChildRetry { .. } => "child_retry",
    });
    // Out of the claim order while paused, or parked (which only a ready task is).
    let parked = task
        .limits
        .as_ref()
        .and_then(|limits| limits.parked.as_ref())
        .filter(|_| task.status == TaskStatus::Ready);
    let held = if task.held {
        HELD_PAUSED
    } else if parked.is_some() {
        HELD_PARKED
    } else {
        0
    };
    take(args![
        task.id.as_str(),
        task.job_id.as_str(),
        namespace,
        task.seq,
        task.kind.as_str(),
        task.step,
        task.item,
        task.compensates.as_ref().map(TaskId::as_str),
        task.queue,
        task.command,
        task.status.as_str(),
        task.priority,
        task.attempt,
        task.checking,
        task.available_at.map(|t| t.0),
        task.deadline_at.map(|t| t.0),
        task.lease_token,
        task.lease_expires_at.map(|t| t.0),
        task.worker_id,
        opt_json_text(task.input.as_ref()),
        opt_json_text(task.output.as_ref()),
        error,
        opt_json_text(task.progress.as_ref()),
        opt_json_text(task.logs.as_ref()),
        task.created_at.0,
        task.ready_at.map(|t| t.0),
        task.started_at.map(|t| t.0),
        task.ended_at.map(|t| t.0),
        task.completed_seq,
        held,
        task.round,
        task.attempt_base,
        opt_json_text(task.wait.as_ref()),
        wait_kind,
        task.wait.as_deref().and_then(Wait::wake_at).map(|t| t.0),
        opt_json_text(task.pending_outcome.as_ref()),
        task.callback
            .as_deref()
            .map(|grant| callback_column(grant, task.attempt)),
        task.child.as_deref().map(JobId::as_str),
        opt_json_text(task.limits.as_ref()),
        parked.map(|parked| parked.line.as_str()),
        parked.map(|parked| parked.since.0),
        task.claimed_at.map(|t| t.0),
    ])
}

/// Which ready tasks of a queue a claim reads, and in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Every claimable one, by priority, then age, then id; and those claimable since before the
    /// queue's `max_wait` (starving), oldest first: the first `limit` of each order.
    Ready,
    /// Claimable compensations only, by priority: a queue stopped on error (`on_error:
    /// pause`) hands out no other.
    Compensations,
}

/// Ready tasks of one queue that a claim may take, as `pass` selects and orders them, at most
/// `limit` of each order, and whether the queue holds claimable tasks past the first `limit` of
/// its `pass` order (read as one row more than `limit`, so that a claim that took every task
/// found knows it left none behind). On PostgreSQL the rows are locked, skipping those another
/// node's claim holds.
///
/// `Pass::Ready` reads the queue in priority order first, and every task it finds that waited
/// past `max_wait` is starving. The oldest starving tasks of the queue are among those, unless
/// they lie at priorities the first `limit` tasks did not reach: at the last task's priority
/// (when the tasks found span several), and below it. Those levels are then read in age order,
/// each only if its earliest task is starving. An index in age order across levels would cost
/// every task two more index writes (when it becomes ready and when it is claimed) for a pass
/// that finds nothing while the queue keeps up; reading the levels before the priority order
/// cost three seeks of the dispatch index per claim, each past the entries of tasks claimed
/// since PostgreSQL last cleaned the index. On PostgreSQL a level's rows past the `limit` oldest
/// stay locked until the transaction ends; other nodes' claims skip them.
pub fn claim_candidates(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    config: &QueueConfig,
    now: Timestamp,
    limit: u32,
    pass: Pass,
) -> Result<(Vec<Candidate>, bool)> {
    let waited = i64::try_from(config.max_wait.as_millis()).unwrap_or(i64::MAX);
    let bound = now.0.saturating_sub(waited);
    let candidate = |(job, task, priority, available_at): (String, String, i32, i64)| {
        Some(Candidate {
            job: JobId::parse(&job)?,
            task: TaskId::parse(&task)?,
            queue: queue.to_owned(),
            queue_priority: config.priority,
            priority,
            available_at: Timestamp(available_at),
            starving: pass == Pass::Ready && available_at <= bound,
        })
    };
    let sql = match pass {
        Pass::Compensations => {
            "SELECT job_id, id, priority, available_at FROM tasks INDEXED BY tasks_rollback \
             WHERE status = 'ready' AND held = 0 AND kind = 'compensation' AND namespace = ?1 \
             AND queue = ?2 AND available_at <= ?3 \
             ORDER BY priority DESC, available_at, id LIMIT ?4 FOR UPDATE SKIP LOCKED"
        }
        Pass::Ready => {
            "SELECT job_id, id, priority, available_at FROM tasks INDEXED BY tasks_dispatch \
             WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2 \
             AND available_at <= ?3 ORDER BY priority DESC, available_at, id LIMIT ?4 \
             FOR UPDATE SKIP LOCKED"
        }
    };
    let read = limit.saturating_add(1);
    let mut rows = conn.query_map(sql, args![namespace, queue, now.0, read], candidate_row)?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    if pass == Pass::Ready && more {
        let starving = starving_below(conn, namespace, queue, &rows, bound, limit)?;
        rows.extend(starving);
    }
    Ok((rows.into_iter().filter_map(candidate).collect(), more))
}

/// The oldest starving tasks (claimable since `bound` or before) of the levels that `first`,
/// the first `limit` tasks of the queue in priority order, do not cover, at most `limit`,
/// oldest first. Read only when the queue holds claimable tasks past `first` (otherwise `first`
/// holds every one).
fn starving_below(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    first: &[(String, String, i32, i64)],
    bound: i64,
    limit: u32,
) -> Result<Vec<(String, String, i32, i64)>> {
    let (Some(top), Some(last)) = (first.first(), first.last()) else {
        return Ok(Vec::new());
    };
    let mut levels = priority_levels(conn, namespace, queue, i64::from(last.2))?;
    if top.2 != last.2 {
        // The last level's oldest tasks in `first` follow higher levels' tasks: more of its
        // starving ones may be older than some tasks `first` holds. Its earliest is the first
        // of its tasks there.
        let earliest = first
            .iter()
            .find(|row| row.2 == last.2)
            .map_or(last.3, |row| row.3);
        levels.insert(0, (last.2, earliest));
    }
    let mut starving = Vec::new();
    for (level, _) in levels
        .into_iter()
        .filter(|(_, earliest)| *earliest <= bound)
    {
        starving.extend(conn.query_map(
            "SELECT job_id, id, priority, available_at FROM tasks \
             INDEXED BY tasks_dispatch WHERE status = 'ready' AND held = 0 \
             AND namespace = ?1 AND queue = ?2 AND priority = ?3 AND available_at <= ?4 \
             ORDER BY available_at, id LIMIT ?5 FOR UPDATE SKIP LOCKED",
            args![namespace, queue, level, bound, limit],
            candidate_row,
        )?);
    }
    starving.sort_by(|a, b| (a.3, &a.1).cmp(&(b.3, &b.1)));
    starving.truncate(limit as usize);
    Ok(starving)
}

/// A candidate's columns: job, task, priority, available since.
fn candidate_row(row: &mut Row) -> Result<(String, String, i32, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

/// The priorities below `below` that the ready, not held tasks of a queue have, highest first,
/// each with the earliest time one of its tasks is claimable: two seeks of the dispatch index
/// per level. (Filtering the levels in the statement instead, PostgreSQL planned the filter as
/// one scan of every ready task of the queue.)
fn priority_levels(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    below: i64,
) -> Result<Vec<(i32, i64)>> {
    let levels: Vec<(Option<i32>, Option<i64>)> = conn.query_map(
        "WITH RECURSIVE levels (priority) AS ( \
           SELECT MAX(priority) FROM tasks INDEXED BY tasks_dispatch \
           WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2 \
           AND priority < ?3 \
           UNION ALL \
           SELECT (SELECT MAX(priority) FROM tasks INDEXED BY tasks_dispatch \
                   WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2 \
                   AND priority < levels.priority) \
           FROM levels WHERE levels.priority IS NOT NULL) \
         SELECT priority, (SELECT MIN(available_at) FROM tasks INDEXED BY tasks_dispatch \
           WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2 \
           AND priority = levels.priority) \
         FROM levels WHERE priority IS NOT NULL",
        args![namespace, queue, below],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok(levels
        .into_iter()
        .filter_map(|(priority, earliest)| Some((priority?, earliest?)))
        .collect())
}

/// How many tasks of a queue are running.
pub fn running_count(conn: &mut dyn Conn, namespace: &str, queue: &str) -> Result<u32> {
    conn.query_value(
        "SELECT COUNT(*) FROM tasks INDEXED BY tasks_running WHERE status = 'running' \
         AND queue <> '' AND namespace = ?1 AND queue = ?2",
        args![namespace, queue],
    )
}

/// The earliest time a ready task of this queue becomes claimable, if any is waiting.
///
/// `rollback_only`: count only compensation tasks (a queue stopped on error hands out no other).
pub fn next_available(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    rollback_only: bool,
) -> Result<Option<Timestamp>> {
    if rollback_only {
        let min: Option<i64> = conn.query_value(
            "SELECT MIN(available_at) FROM tasks INDEXED BY tasks_rollback \
             WHERE status = 'ready' AND held = 0 AND kind = 'compensation' AND namespace = ?1 \
             AND queue = ?2",
            args![namespace, queue],
        )?;
        return Ok(min.map(Timestamp));
    }
    let levels = priority_levels(conn, namespace, queue, i64::MAX)?;
    Ok(levels
        .into_iter()
        .map(|(_, earliest)| Timestamp(earliest))
        .min())
}

#[cfg(test)]
mod tests {
    use starbridge_core::model::{CallbackAnswer, CallbackCallKind};

    use super::*;

    fn grant(attempt: u32, round: u32, answered: bool) -> CallbackGrant {
        CallbackGrant {
            attempt,
            round,
            hash: "c6de36191ddf0fa5b1424cf89b3bd3db".to_owned(),
            answered: answered.then(|| CallbackAnswer {
                call: CallbackCallKind::Complete,
                digest: "d".to_owned(),
            }),
        }
    }

    #[test]
    fn a_plain_grant_of_the_tasks_attempt_is_stored_as_its_digest_alone() {
        let plain = grant(2, 0, false);
        let column = callback_column(&plain, 2);
        assert_eq!(column, plain.hash);
        assert_eq!(*callback_from_column(column, 2).unwrap(), plain);
    }

    #[test]
    fn any_other_grant_is_stored_as_json_and_reads_back_whole() {
        for (other, attempt) in [
            (grant(1, 0, false), 2),
            (grant(2, 1, false), 2),
            (grant(2, 0, true), 2),
        ] {
            let column = callback_column(&other, attempt);
            assert!(column.starts_with('{'), "{column}");
            assert_eq!(*callback_from_column(column, attempt).unwrap(), other);
        }
    }

    #[test]
    fn a_grant_stored_as_json_before_the_short_form_reads_back() {
        let stored = r#"{"attempt":1,"hash":"c6de36191ddf0fa5b1424cf89b3bd3db"}"#;
        assert_eq!(
            *callback_from_column(stored.to_owned(), 1).unwrap(),
            grant(1, 0, false)
        );
    }
}
