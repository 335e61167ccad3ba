//! Mapping between core types and table rows. Most of the store's SQL lives here (the rest is in
//! `stats.rs`, `schedules.rs`, `webhooks.rs` and the migrations); it is written once for both
//! backends (see `db`).

use std::collections::HashMap;

use crate::db::{Arg, Conn, Queries, Row, Value as SqlValue, args, chunks, placeholders};
use serde_json::Value;
use starbridge_core::dispatch::{Bucket, Candidate, QueueConfig, QueueMode, RateLimit};
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{
    Event, EventKind, Job, JobLock, JobState, JobStatus, Task, TaskKind, TaskStatus, WindDown,
};
use starbridge_core::time::{Duration, Timestamp};

use crate::{Error, Result, StoredEvent, StoredQueue, StoredWorkflow};

fn json_text(value: &Value) -> String {
    value.to_string()
}

fn opt_json_text(value: Option<&Value>) -> Option<String> {
    value.map(json_text)
}

fn parse_json(text: Option<String>) -> Result<Option<Value>> {
    text.map(|text| serde_json::from_str(&text).map_err(|e| Error::Corrupt(e.to_string())))
        .transpose()
}

fn ts(value: Option<i64>) -> Option<Timestamp> {
    value.map(Timestamp)
}

fn enum_column<T>(text: String, parse: fn(&str) -> Option<T>) -> Result<T> {
    parse(&text).ok_or_else(|| Error::Corrupt(format!("unknown value '{text}'")))
}

const JOB_COLUMNS: &str = "id, namespace, workflow, version, status, params, key, priority, created_at, \
     started_at, ended_at, deadline_at, wind_down, compensation_planned, completions, round, lock_key, \
     lock_slots";

fn job_from_row(row: &mut Row) -> Result<RawJob> {
    Ok(RawJob {
        id: row.get(0)?,
        namespace: row.get(1)?,
        workflow: row.get(2)?,
        version: row.get(3)?,
        status: row.get(4)?,
        params: row.get(5)?,
        key: row.get(6)?,
        priority: row.get(7)?,
        created_at: row.get(8)?,
        started_at: row.get(9)?,
        ended_at: row.get(10)?,
        deadline_at: row.get(11)?,
        wind_down: row.get(12)?,
        compensation_planned: row.get(13)?,
        completions: row.get(14)?,
        round: row.get(15)?,
        lock_key: row.get(16)?,
        lock_slots: row.get(17)?,
    })
}

struct RawJob {
    id: String,
    namespace: String,
    workflow: String,
    version: u32,
    status: String,
    params: String,
    key: Option<String>,
    priority: i32,
    created_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    deadline_at: Option<i64>,
    wind_down: Option<String>,
    compensation_planned: bool,
    completions: i64,
    round: u32,
    lock_key: Option<String>,
    lock_slots: Option<u32>,
}

impl RawJob {
    fn into_job(self) -> Result<Job> {
        let wind_down: Option<WindDown> = self
            .wind_down
            .map(|text| serde_json::from_str(&text).map_err(|e| Error::Corrupt(e.to_string())))
            .transpose()?;
        Ok(Job {
            id: JobId::parse(&self.id).ok_or_else(|| Error::Corrupt(self.id.clone()))?,
            namespace: self.namespace,
            workflow: self.workflow,
            version: self.version,
            status: enum_column(self.status, JobStatus::parse)?,
            params: parse_json(Some(self.params))?.unwrap_or(Value::Null),
            key: self.key,
            priority: self.priority,
            created_at: Timestamp(self.created_at),
            started_at: ts(self.started_at),
            ended_at: ts(self.ended_at),
            deadline_at: ts(self.deadline_at),
            wind_down,
            compensation_planned: self.compensation_planned,
            completions: u64::try_from(self.completions).unwrap_or(0),
            round: self.round,
            lock: self.lock_key.map(|key| JobLock {
                key,
                slots: self.lock_slots.unwrap_or(1),
            }),
        })
    }
}

const TASK_COLUMNS: &str = "id, job_id, seq, kind, step, item, compensates, queue, command, status, \
     priority, attempt, checking, available_at, deadline_at, lease_token, lease_expires_at, worker_id, \
     input, output, error, progress, logs, created_at, ready_at, started_at, ended_at, completed_seq, \
     held, round, attempt_base";

fn task_from_row(row: &mut Row) -> Result<RawTask> {
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
    })
}

struct RawTask {
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
    held: bool,
    round: u32,
    attempt_base: u32,
}

impl RawTask {
    fn into_task(self) -> Result<Task> {
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
            error: self
                .error
                .map(|text| serde_json::from_str(&text).map_err(|e| Error::Corrupt(e.to_string())))
                .transpose()?,
            progress: parse_json(self.progress)?,
            logs: parse_json(self.logs)?,
            created_at: Timestamp(self.created_at),
            ready_at: ts(self.ready_at),
            started_at: ts(self.started_at),
            ended_at: ts(self.ended_at),
            completed_seq: self.completed_seq.and_then(|n| u64::try_from(n).ok()),
            held: self.held,
            round: self.round,
            attempt_base: self.attempt_base,
        })
    }
}

/// How a write holds the job it loads against other server nodes (on SQLite, with its single
/// writer, every variant reads the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowLock {
    /// A read: no lock.
    None,
    /// Lock the job row, waiting for a node that holds it.
    Wait,
    /// Lock the job row, or skip the job when another node holds it (it is being handled).
    Skip,
}

impl RowLock {
    fn clause(self) -> &'static str {
        match self {
            RowLock::None => "",
            RowLock::Wait => " FOR UPDATE",
            RowLock::Skip => " FOR UPDATE SKIP LOCKED",
        }
    }
}

pub(crate) fn load_job(conn: &mut dyn Conn, id: &JobId) -> Result<Option<Job>> {
    locked_job(conn, id, RowLock::None)
}

fn locked_job(conn: &mut dyn Conn, id: &JobId, lock: RowLock) -> Result<Option<Job>> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1{}",
        lock.clause()
    );
    conn.query_opt(&sql, args![id.as_str()], job_from_row)?
        .map(RawJob::into_job)
        .transpose()
}

pub(crate) fn load_job_state(conn: &mut dyn Conn, id: &JobId) -> Result<Option<JobState>> {
    lock_job_state(conn, id, RowLock::None)
}

/// A job with its tasks, the job row locked as `lock` says (`None` when it does not exist or,
/// with `RowLock::Skip`, another node holds it).
pub(crate) fn lock_job_state(
    conn: &mut dyn Conn,
    id: &JobId,
    lock: RowLock,
) -> Result<Option<JobState>> {
    let Some(job) = locked_job(conn, id, lock)? else {
        return Ok(None);
    };
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE job_id = ?1 ORDER BY seq");
    let tasks = conn
        .query_map(&sql, args![id.as_str()], task_from_row)?
        .into_iter()
        .map(RawTask::into_task)
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(JobState { job, tasks }))
}

/// Jobs with their tasks (those that exist, and with `RowLock::Skip` that no other node holds),
/// their rows locked as `lock` says, in a few set-based statements. Rows are locked in id
/// order, so that two transactions locking overlapping sets cannot wait on each other.
pub(crate) fn lock_job_states(
    conn: &mut dyn Conn,
    ids: &[JobId],
    lock: RowLock,
) -> Result<Vec<JobState>> {
    let mut states = Vec::with_capacity(ids.len());
    for chunk in chunks(ids) {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({}) ORDER BY id{}",
            placeholders(chunk.len()),
            lock.clause()
        );
        let values: Vec<Arg<'_>> = chunk.iter().map(|id| Arg::Text(id.as_str())).collect();
        let jobs = conn
            .query_map(&sql, &values, job_from_row)?
            .into_iter()
            .map(RawJob::into_job)
            .collect::<Result<Vec<_>>>()?;
        if jobs.is_empty() {
            continue;
        }
        let found: Vec<Arg<'_>> = jobs.iter().map(|job| Arg::Text(job.id.as_str())).collect();
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE job_id IN ({}) ORDER BY job_id, seq",
            placeholders(found.len())
        );
        let mut tasks: HashMap<JobId, Vec<Task>> = HashMap::with_capacity(jobs.len());
        for raw in conn.query_map(&sql, &found, task_from_row)? {
            let task = raw.into_task()?;
            tasks.entry(task.job_id.clone()).or_default().push(task);
        }
        states.extend(jobs.into_iter().map(|job| JobState {
            tasks: tasks.remove(&job.id).unwrap_or_default(),
            job,
        }));
    }
    Ok(states)
}

/// The job of each of these tasks that exists.
pub(crate) fn jobs_of_tasks(conn: &mut dyn Conn, tasks: &[TaskId]) -> Result<Vec<(TaskId, JobId)>> {
    let mut found = Vec::with_capacity(tasks.len());
    for chunk in chunks(tasks) {
        let sql = format!(
            "SELECT id, job_id FROM tasks WHERE id IN ({})",
            placeholders(chunk.len())
        );
        let values: Vec<Arg<'_>> = chunk.iter().map(|id| Arg::Text(id.as_str())).collect();
        for (task, job) in conn.query_map(&sql, &values, |row| {
            Ok((row.get::<String>(0)?, row.get::<String>(1)?))
        })? {
            if let (Some(task), Some(job)) = (TaskId::parse(&task), JobId::parse(&job)) {
                found.push((task, job));
            }
        }
    }
    Ok(found)
}

pub(crate) fn job_of_task(conn: &mut dyn Conn, task: &TaskId) -> Result<Option<JobId>> {
    let id: Option<String> = conn.query_opt(
        "SELECT job_id FROM tasks WHERE id = ?1",
        args![task.as_str()],
        |row| row.get(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}

pub(crate) fn job_by_key(conn: &mut dyn Conn, namespace: &str, key: &str) -> Result<Option<JobId>> {
    let id: Option<String> = conn.query_opt(
        "SELECT id FROM jobs WHERE namespace = ?1 AND key = ?2",
        args![namespace, key],
        |row| row.get(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}

/// How the rows of a table are written in sets (see `deferred`): its columns, and for rows
/// that may exist already, the key and the columns an existing row takes from the new one.
pub(crate) struct RowWrite {
    pub(crate) table: &'static str,
    pub(crate) columns: &'static [&'static str],
    pub(crate) upsert: Option<(&'static str, &'static [&'static str])>,
}

impl RowWrite {
    /// The `INSERT` of `rows` rows, their values bound as `?1, ?2, …` row after row.
    pub(crate) fn sql(&self, rows: usize) -> String {
        let width = self.columns.len();
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.table,
            self.columns.join(", ")
        );
        for row in 0..rows {
            if row > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for column in 0..width {
                if column > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("?{}", row * width + column + 1));
            }
            sql.push(')');
        }
        if let Some((key, updated)) = self.upsert {
            let set: Vec<String> = updated
                .iter()
                .map(|column| format!("{column} = excluded.{column}"))
                .collect();
            sql.push_str(&format!(
                " ON CONFLICT ({key}) DO UPDATE SET {}",
                set.join(", ")
            ));
        }
        sql
    }
}

/// Jobs: a new row at submit, its changing columns afterwards.
pub(crate) const JOB_WRITE: RowWrite = RowWrite {
    table: "jobs",
    columns: &[
        "id",
        "namespace",
        "workflow",
        "version",
        "status",
        "params",
        "key",
        "priority",
        "created_at",
        "started_at",
        "ended_at",
        "deadline_at",
        "wind_down",
        "compensation_planned",
        "completions",
        "round",
        "lock_key",
        "lock_slots",
    ],
    upsert: Some((
        "id",
        &[
            "status",
            "started_at",
            "ended_at",
            "deadline_at",
            "wind_down",
            "compensation_planned",
            "completions",
            "round",
        ],
    )),
};

/// A job's row, in the columns of `JOB_WRITE`.
pub(crate) fn job_values(job: &Job) -> Vec<SqlValue> {
    let wind_down = job
        .wind_down
        .as_ref()
        .map(|w| serde_json::to_string(w).unwrap_or_default());
    args![
        job.id.as_str(),
        job.namespace,
        job.workflow,
        job.version,
        job.status.as_str(),
        json_text(&job.params),
        job.key,
        job.priority,
        job.created_at.0,
        job.started_at.map(|t| t.0),
        job.ended_at.map(|t| t.0),
        job.deadline_at.map(|t| t.0),
        wind_down,
        job.compensation_planned,
        job.completions,
        job.round,
        job.lock.as_ref().map(|lock| lock.key.as_str()),
        job.lock.as_ref().map(|lock| lock.slots),
    ]
    .iter()
    .map(SqlValue::of)
    .collect()
}

/// Tasks: a new row when the job (or a fan-out, a compensation) makes one, its changing
/// columns afterwards.
pub(crate) const TASK_WRITE: RowWrite = RowWrite {
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
    ],
    upsert: Some((
        "id",
        &[
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
        ],
    )),
};

/// A task's row, in the columns of `TASK_WRITE`.
pub(crate) fn task_values(namespace: &str, task: &Task) -> Vec<SqlValue> {
    let error = task
        .error
        .as_ref()
        .map(|e| serde_json::to_string(e).unwrap_or_default());
    args![
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
        task.held,
        task.round,
        task.attempt_base,
    ]
    .iter()
    .map(SqlValue::of)
    .collect()
}

/// History events: appended, never changed.
pub(crate) const EVENT_WRITE: RowWrite = RowWrite {
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

/// An event's row, in the columns of `EVENT_WRITE`.
pub(crate) fn event_values(job: &JobId, step: Option<&str>, event: &Event) -> Vec<SqlValue> {
    args![
        job.as_str(),
        event.task.as_ref().map(TaskId::as_str),
        step,
        event.at.0,
        event.kind.as_str(),
        event.attempt,
        event.worker,
        json_text(&event.detail),
    ]
    .iter()
    .map(SqlValue::of)
    .collect()
}

pub(crate) fn events(
    conn: &mut dyn Conn,
    job: &JobId,
    after: i64,
    limit: u32,
) -> Result<Vec<StoredEvent>> {
    conn.query_map(
        "SELECT seq, task_id, step, at, kind, attempt, worker_id, detail FROM events \
         WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        args![job.as_str(), after, limit],
        |row| {
            let task: Option<String> = row.get(1)?;
            Ok(StoredEvent {
                seq: row.get(0)?,
                step: row.get(2)?,
                event: Event {
                    at: Timestamp(row.get(3)?),
                    kind: enum_column(row.get(4)?, EventKind::parse)?,
                    task: task.and_then(|t| TaskId::parse(&t)),
                    attempt: row.get(5)?,
                    worker: row.get(6)?,
                    detail: parse_json(Some(row.get(7)?))?.unwrap_or(Value::Null),
                },
            })
        },
    )
}

/// Ready tasks of one queue in priority order (priority, then age, then id), or, with
/// `starving_before`, those that became claimable before that time, oldest first. On
/// PostgreSQL the rows are locked, skipping those another node's claim holds.
pub(crate) fn claim_candidates(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    config: &QueueConfig,
    now: Timestamp,
    limit: u32,
    starving: bool,
) -> Result<Vec<Candidate>> {
    let sql = if starving {
        "SELECT job_id, id, priority, available_at FROM tasks INDEXED BY tasks_age \
         WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2 AND available_at <= ?3 \
         ORDER BY available_at, id LIMIT ?4 FOR UPDATE SKIP LOCKED"
    } else {
        "SELECT job_id, id, priority, available_at FROM tasks INDEXED BY tasks_dispatch \
         WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2 AND available_at <= ?3 \
         ORDER BY priority DESC, available_at, id LIMIT ?4 FOR UPDATE SKIP LOCKED"
    };
    let bound = if starving {
        Timestamp(
            now.0
                .saturating_sub(i64::try_from(config.max_wait.as_millis()).unwrap_or(i64::MAX)),
        )
    } else {
        now
    };
    let rows = conn.query_map(sql, args![namespace, queue, bound.0, limit], |row| {
        Ok((
            row.get::<String>(0)?,
            row.get::<String>(1)?,
            row.get::<i32>(2)?,
            row.get::<i64>(3)?,
        ))
    })?;
    Ok(rows
        .into_iter()
        .filter_map(|(job, task, priority, available_at)| {
            Some(Candidate {
                job: JobId::parse(&job)?,
                task: TaskId::parse(&task)?,
                queue: queue.to_owned(),
                queue_priority: config.priority,
                priority,
                available_at: Timestamp(available_at),
                starving,
            })
        })
        .collect())
}

/// How many tasks of a queue are running.
pub(crate) fn running_count(conn: &mut dyn Conn, namespace: &str, queue: &str) -> Result<u32> {
    conn.query_value(
        "SELECT COUNT(*) FROM tasks INDEXED BY tasks_running WHERE status = 'running' \
         AND namespace = ?1 AND queue = ?2",
        args![namespace, queue],
    )
}

/// The earliest time a ready task of this queue becomes claimable, if any is waiting.
pub(crate) fn next_available(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
) -> Result<Option<Timestamp>> {
    let min: Option<i64> = conn.query_value(
        "SELECT MIN(available_at) FROM tasks INDEXED BY tasks_age \
         WHERE status = 'ready' AND held = 0 AND namespace = ?1 AND queue = ?2",
        args![namespace, queue],
    )?;
    Ok(min.map(Timestamp))
}

const QUEUE_COLUMNS: &str = "name, mode, priority, concurrency, paused, max_wait_ms, created_at, \
     updated_at, rate_tokens, rate_per_ms, bucket_tokens, bucket_at";

struct RawQueue {
    name: String,
    mode: String,
    priority: i32,
    concurrency: Option<u32>,
    paused: bool,
    max_wait_ms: i64,
    created_at: i64,
    updated_at: Option<i64>,
    rate_tokens: Option<u32>,
    rate_per_ms: Option<i64>,
    bucket_tokens: Option<f64>,
    bucket_at: Option<i64>,
}

fn queue_from_row(row: &mut Row) -> Result<RawQueue> {
    Ok(RawQueue {
        name: row.get(0)?,
        mode: row.get(1)?,
        priority: row.get(2)?,
        concurrency: row.get(3)?,
        paused: row.get(4)?,
        max_wait_ms: row.get(5)?,
        created_at: row.get(6)?,
        updated_at: row.get(7)?,
        rate_tokens: row.get(8)?,
        rate_per_ms: row.get(9)?,
        bucket_tokens: row.get(10)?,
        bucket_at: row.get(11)?,
    })
}
fn into_queue(namespace: &str, raw: RawQueue) -> Result<StoredQueue> {
    Ok(StoredQueue {
        namespace: namespace.to_owned(),
        name: raw.name,
        config: QueueConfig {
            mode: enum_column(raw.mode, QueueMode::parse)?,
            priority: raw.priority,
            concurrency: raw.concurrency,
            paused: raw.paused,
            max_wait: Duration::from_millis(u64::try_from(raw.max_wait_ms).unwrap_or(0)),
            rate: match (raw.rate_tokens, raw.rate_per_ms) {
                (Some(tokens), Some(per)) => Some(RateLimit {
                    tokens,
                    per: Duration::from_millis(u64::try_from(per).unwrap_or(0)),
                }),
                _ => None,
            },
        },
        bucket: match (raw.bucket_tokens, raw.bucket_at) {
            (Some(tokens), Some(at)) => Some(Bucket {
                tokens,
                at: Timestamp(at),
            }),
            _ => None,
        },
        created_at: Timestamp(raw.created_at),
        updated_at: raw.updated_at.map(Timestamp),
    })
}

/// A queue's settings; `None` when nobody created or configured it.
pub(crate) fn queue(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
) -> Result<Option<StoredQueue>> {
    conn.query_opt(
        &format!("SELECT {QUEUE_COLUMNS} FROM queues WHERE namespace = ?1 AND name = ?2"),
        args![namespace, name],
        queue_from_row,
    )?
    .map(|raw| into_queue(namespace, raw))
    .transpose()
}

pub(crate) fn list_queues(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredQueue>> {
    conn.query_map(
        &format!("SELECT {QUEUE_COLUMNS} FROM queues WHERE namespace = ?1 ORDER BY name"),
        args![namespace],
        queue_from_row,
    )?
    .into_iter()
    .map(|raw| into_queue(namespace, raw))
    .collect()
}

pub(crate) fn save_queue(conn: &mut dyn Conn, queue: &StoredQueue, now: Timestamp) -> Result<()> {
    let config = &queue.config;
    conn.execute(
        "INSERT INTO queues (namespace, name, created_at, mode, priority, concurrency, paused, max_wait_ms, \
         updated_at, rate_tokens, rate_per_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT (namespace, name) DO UPDATE SET \
         mode = excluded.mode, priority = excluded.priority, concurrency = excluded.concurrency, \
         paused = excluded.paused, max_wait_ms = excluded.max_wait_ms, updated_at = excluded.updated_at, \
         rate_tokens = excluded.rate_tokens, rate_per_ms = excluded.rate_per_ms",
        args![
            queue.namespace,
            queue.name,
            queue.created_at.0,
            config.mode.as_str(),
            config.priority,
            config.concurrency,
            config.paused,
            config.max_wait.as_millis(),
            now.0,
            config.rate.map(|rate| rate.tokens),
            config.rate.map(|rate| rate.per.as_millis()),
        ],
    )?;
    Ok(())
}

/// Stores a rate-limited queue's token bucket after a claim took tokens from it.
pub(crate) fn save_bucket(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    bucket: Bucket,
) -> Result<()> {
    conn.execute(
        "UPDATE queues SET bucket_tokens = ?3, bucket_at = ?4 WHERE namespace = ?1 AND name = ?2",
        args![namespace, queue, bucket.tokens, bucket.at.0],
    )?;
    Ok(())
}

fn job_ids(ids: Vec<String>) -> Vec<JobId> {
    ids.iter().filter_map(|id| JobId::parse(id)).collect()
}

/// Jobs with a lapsed lease or a passed deadline at `now`.
pub(crate) fn due_jobs(conn: &mut dyn Conn, now: Timestamp, limit: u32) -> Result<Vec<JobId>> {
    let ids = conn.query_map(
        "SELECT job_id FROM tasks WHERE status = 'running' AND lease_expires_at <= ?1 \
         UNION SELECT job_id FROM tasks WHERE status IN ('ready', 'running') AND deadline_at <= ?1 \
         UNION SELECT id FROM jobs WHERE status = 'running' AND deadline_at <= ?1 \
         LIMIT ?2",
        args![now.0, limit],
        |row| row.get::<String>(0),
    )?;
    Ok(job_ids(ids))
}

/// The next time a lease lapses or a deadline passes.
pub(crate) fn next_timer(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let min: Option<i64> = conn.query_value(
        "SELECT MIN(t) FROM ( \
         SELECT MIN(lease_expires_at) AS t FROM tasks WHERE status = 'running' \
         UNION ALL SELECT MIN(deadline_at) FROM tasks WHERE deadline_at IS NOT NULL AND status IN ('ready', 'running') \
         UNION ALL SELECT MIN(deadline_at) FROM jobs WHERE deadline_at IS NOT NULL AND status = 'running') AS timers",
        &[],
    )?;
    Ok(min.map(Timestamp))
}

pub(crate) fn ensure_queue(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    now: Timestamp,
) -> Result<()> {
    conn.execute(
        "INSERT INTO queues (namespace, name, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
        args![namespace, queue, now.0],
    )?;
    Ok(())
}

pub(crate) fn ensure_namespace(conn: &mut dyn Conn, namespace: &str, now: Timestamp) -> Result<()> {
    conn.execute(
        "INSERT INTO namespaces (name, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        args![namespace, now.0],
    )?;
    Ok(())
}

/// The health check's probe write (see `health`): its one row, changed in place.
pub(crate) fn write_health_probe(conn: &mut dyn Conn, now: Timestamp) -> Result<()> {
    conn.execute(
        "INSERT INTO health_probe (id, probed_at) VALUES (1, ?1) \
         ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
        args![now.0],
    )?;
    Ok(())
}

const WORKFLOW_COLUMNS: &str =
    "namespace, name, version, definition, description, steps, created_at";

struct RawWorkflow {
    namespace: String,
    name: String,
    version: u32,
    definition: String,
    description: Option<String>,
    steps: u32,
    created_at: i64,
}

fn workflow_from_row(row: &mut Row) -> Result<RawWorkflow> {
    Ok(RawWorkflow {
        namespace: row.get(0)?,
        name: row.get(1)?,
        version: row.get(2)?,
        definition: row.get(3)?,
        description: row.get(4)?,
        steps: row.get(5)?,
        created_at: row.get(6)?,
    })
}

fn into_stored(raw: RawWorkflow) -> Result<StoredWorkflow> {
    Ok(StoredWorkflow {
        namespace: raw.namespace,
        name: raw.name,
        version: raw.version,
        definition: parse_json(Some(raw.definition))?.unwrap_or(Value::Null),
        description: raw.description,
        steps: raw.steps,
        created_at: Timestamp(raw.created_at),
    })
}

/// A workflow version, or the latest when `version` is `None`.
/// The latest version of a workflow, if it has one.
pub(crate) fn latest_version(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
) -> Result<Option<u32>> {
    conn.query_value(
        "SELECT MAX(version) FROM workflows WHERE namespace = ?1 AND name = ?2",
        args![namespace, name],
    )
}

/// The newest version of a workflow whose normalized definition is `definition`, if any.
pub(crate) fn workflow_version_of(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    definition: &Value,
) -> Result<Option<u32>> {
    conn.query_opt(
        "SELECT version FROM workflows WHERE namespace = ?1 AND name = ?2 AND definition = ?3 \
         ORDER BY version DESC LIMIT 1",
        args![namespace, name, json_text(definition)],
        |row| row.get(0),
    )
}

pub(crate) fn workflow(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    version: Option<u32>,
) -> Result<Option<StoredWorkflow>> {
    let raw = match version {
        Some(version) => conn.query_opt(
            &format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE namespace = ?1 AND name = ?2 AND version = ?3"
            ),
            args![namespace, name, version],
            workflow_from_row,
        )?,
        None => conn.query_opt(
            &format!(
                "SELECT {WORKFLOW_COLUMNS} FROM workflows WHERE namespace = ?1 AND name = ?2 \
                 ORDER BY version DESC LIMIT 1"
            ),
            args![namespace, name],
            workflow_from_row,
        )?,
    };
    raw.map(into_stored).transpose()
}

/// The latest version of every workflow of a namespace.
pub(crate) fn list_workflows(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredWorkflow>> {
    conn.query_map(
        &format!(
            "SELECT {WORKFLOW_COLUMNS} FROM workflows w WHERE namespace = ?1 AND version = \
             (SELECT MAX(version) FROM workflows v WHERE v.namespace = w.namespace AND v.name = w.name) \
             ORDER BY name"
        ),
        args![namespace],
        workflow_from_row,
    )?
    .into_iter()
    .map(into_stored)
    .collect()
}

pub(crate) fn insert_workflow(conn: &mut dyn Conn, stored: &StoredWorkflow) -> Result<()> {
    conn.execute(
        "INSERT INTO workflows (namespace, name, version, definition, description, steps, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![
            stored.namespace,
            stored.name,
            stored.version,
            json_text(&stored.definition),
            stored.description,
            stored.steps,
            stored.created_at.0,
        ],
    )?;
    Ok(())
}

/// Jobs of a namespace, newest first, after the cursor (a job id).
pub(crate) fn list_jobs<'a>(conn: &mut dyn Conn, filter: &'a crate::JobFilter) -> Result<Vec<Job>> {
    let mut sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ?1");
    let mut values: Vec<Arg<'a>> = vec![Arg::Text(&filter.namespace)];
    let mut condition = |sql: &mut String, clause: &str, value: Arg<'a>| {
        values.push(value);
        sql.push_str(&format!(" AND {clause} ?{}", values.len()));
    };
    if let Some(status) = filter.status {
        condition(&mut sql, "status =", Arg::Text(status.as_str()));
    }
    if let Some(workflow) = &filter.workflow {
        condition(&mut sql, "workflow =", Arg::Text(workflow));
    }
    if let Some(after) = filter.created_after {
        condition(&mut sql, "created_at >=", Arg::Int(after.0));
    }
    if let Some(before) = filter.created_before {
        condition(&mut sql, "created_at <", Arg::Int(before.0));
    }
    if let Some(cursor) = &filter.before {
        condition(&mut sql, "id <", Arg::Text(cursor.as_str()));
    }
    values.push(Arg::Int(i64::from(filter.limit)));
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", values.len()));
    conn.query_map(&sql, &values, job_from_row)?
        .into_iter()
        .map(RawJob::into_job)
        .collect()
}

/// How many jobs hold a slot of this lock.
pub(crate) fn lock_holders(conn: &mut dyn Conn, namespace: &str, key: &str) -> Result<u32> {
    conn.query_value(
        "SELECT COUNT(*) FROM lock_holders WHERE namespace = ?1 AND key = ?2",
        args![namespace, key],
    )
}

pub(crate) fn hold_lock(
    conn: &mut dyn Conn,
    namespace: &str,
    key: &str,
    job: &JobId,
    now: Timestamp,
) -> Result<()> {
    conn.execute(
        "INSERT INTO lock_holders (job_id, namespace, key, acquired_at) VALUES (?1, ?2, ?3, ?4)",
        args![job.as_str(), namespace, key, now.0],
    )?;
    Ok(())
}

pub(crate) fn release_lock(conn: &mut dyn Conn, job: &JobId) -> Result<()> {
    conn.execute(
        "DELETE FROM lock_holders WHERE job_id = ?1",
        args![job.as_str()],
    )?;
    Ok(())
}

/// The job waiting longest for this lock.
pub(crate) fn first_queued(
    conn: &mut dyn Conn,
    namespace: &str,
    key: &str,
) -> Result<Option<JobId>> {
    let id: Option<String> = conn.query_opt(
        "SELECT id FROM jobs INDEXED BY jobs_queued WHERE status = 'queued' AND namespace = ?1 \
         AND lock_key = ?2 ORDER BY id LIMIT 1",
        args![namespace, key],
        |row| row.get(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}

/// Deletes up to `limit` jobs that finished before `ended_before`, with their tasks, history,
/// lock rows and webhook deliveries; returns how many jobs went.
pub(crate) fn prune_finished(
    conn: &mut dyn Conn,
    ended_before: Timestamp,
    limit: u32,
) -> Result<usize> {
    let ids = conn.query_map(
        "SELECT id FROM jobs INDEXED BY jobs_ended WHERE ended_at IS NOT NULL AND ended_at < ?1 \
         ORDER BY ended_at LIMIT ?2 FOR UPDATE SKIP LOCKED",
        args![ended_before.0, limit],
        |row| row.get::<String>(0),
    )?;
    for id in &ids {
        for sql in [
            "DELETE FROM events WHERE job_id = ?1",
            "DELETE FROM tasks WHERE job_id = ?1",
            "DELETE FROM lock_holders WHERE job_id = ?1",
            "DELETE FROM webhook_deliveries WHERE job_id = ?1 AND next_attempt_at IS NULL",
            "DELETE FROM jobs WHERE id = ?1",
        ] {
            conn.execute(sql, args![id])?;
        }
    }
    Ok(ids.len())
}
