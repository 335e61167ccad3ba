//! Jobs: their rows (written in sets, see `deferred`), loading a job with its tasks (locked
//! against other nodes as a write asks), finding a job by its key, listing a namespace's jobs,
//! and deleting finished jobs with everything they own once retention has passed.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Job, JobLock, JobState, JobStatus, ParentLink, Task, WindDown};
use starbridge_core::time::Timestamp;
use starbridge_core::trace::JobTrace;

use super::labels::capped_count;
use super::signals::pending_signals;
use super::tasks::{RawTask, TASK_COLUMN_COUNT, TASK_COLUMNS, task_from_row};
use super::{
    RowLock, RowWrite, column_count, enum_column, json_text, labels_text, opt_json_text,
    parse_json, ts,
};
use crate::db::{Arg, Backend, Conn, Queries, Row, TransactionId, args, bind, key_sets};
use crate::{Error, JobFilter, Result};

const JOB_COLUMNS: &str = "id, namespace, workflow, version, status, params, key, priority, created_at, \
     started_at, ended_at, deadline_at, wind_down, compensation_planned, completions, round, lock_key, \
     lock_slots, signals_received, output, failed_steps, parent_job_id, parent_task_id, parent_attempt, \
     depth, child_versions, labels";
/// How many columns `JOB_COLUMNS` names.
const JOB_COLUMN_COUNT: usize = column_count(JOB_COLUMNS);

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
        signals_received: row.get(18)?,
        output: row.get(19)?,
        failed_steps: row.get(20)?,
        parent_job_id: row.get(21)?,
        parent_task_id: row.get(22)?,
        parent_attempt: row.get(23)?,
        depth: row.get(24)?,
        child_versions: row.get(25)?,
        labels: row.get(26)?,
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
    signals_received: u32,
    output: Option<String>,
    failed_steps: Option<String>,
    parent_job_id: Option<String>,
    parent_task_id: Option<String>,
    parent_attempt: Option<u32>,
    depth: u32,
    child_versions: Option<String>,
    labels: Option<String>,
}

impl RawJob {
    fn into_job(self) -> Result<Job> {
        let wind_down: Option<WindDown> = parse_json(self.wind_down)?;
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
            signals_received: self.signals_received,
            output: parse_json(self.output)?,
            failed_steps: parse_json(self.failed_steps)?.unwrap_or_default(),
            parent: match (self.parent_job_id, self.parent_task_id) {
                (Some(job), Some(task)) => Some(ParentLink {
                    job: JobId::parse(&job).ok_or_else(|| Error::Corrupt(job.clone()))?,
                    task: TaskId::parse(&task).ok_or_else(|| Error::Corrupt(task.clone()))?,
                    attempt: self.parent_attempt.unwrap_or(0),
                }),
                _ => None,
            },
            depth: self.depth,
            child_versions: parse_json(self.child_versions)?.unwrap_or_default(),
            labels: parse_json(self.labels)?.unwrap_or_default(),
        })
    }
}

pub fn load_job(conn: &mut dyn Conn, id: &JobId) -> Result<Option<Job>> {
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

pub fn load_job_state(conn: &mut dyn Conn, id: &JobId) -> Result<Option<JobState>> {
    lock_job_state(conn, id, RowLock::None)
}

/// A job with its tasks, the job row locked as `lock` says (`None` when it does not exist or,
/// with `RowLock::Skip`, another node holds it).
pub fn lock_job_state(conn: &mut dyn Conn, id: &JobId, lock: RowLock) -> Result<Option<JobState>> {
    let Some(job) = locked_job(conn, id, lock)? else {
        return Ok(None);
    };
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE job_id = ?1 ORDER BY seq");
    let tasks = conn
        .query_map(&sql, args![id.as_str()], task_from_row)?
        .into_iter()
        .map(RawTask::into_task)
        .collect::<Result<Vec<_>>>()?;
    let signals = pending_signals(conn, &job)?;
    Ok(Some(JobState {
        job,
        tasks,
        signals,
    }))
}

/// A job with its tasks as a set-based load read them, and on PostgreSQL the version of each
/// row read.
pub struct LoadedJob {
    pub state: JobState,
    /// `None` on SQLite, whose rows carry no version.
    pub versions: Option<JobRowVersions>,
}

/// The version of a job's row and of its task rows on PostgreSQL: each row's `xmin`, the id of
/// the transaction that wrote the version read. A row no transaction changed since keeps it;
/// any change (of this node or another) gives the row another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRowVersions {
    pub job: JobId,
    pub row: TransactionId,
    /// Every task of the job, in `seq` order.
    pub tasks: Vec<(TaskId, TransactionId)>,
}

/// A row's `xmin` as text (PostgreSQL has no cast of `xid` to a number type).
fn transaction_id(text: &str) -> Result<TransactionId> {
    text.parse()
        .map_err(|_| Error::Corrupt(format!("a row's transaction id {text:?} is not a number")))
}

/// A row as `read` reads it, with its version (`xmin` as text) from column `version_at`, if any.
fn with_version<T>(
    row: &mut Row,
    read: impl FnOnce(&mut Row) -> Result<T>,
    version_at: Option<usize>,
) -> Result<(T, Option<String>)> {
    let value = read(row)?;
    let version = version_at
        .map(|index| row.get::<String>(index))
        .transpose()?;
    Ok((value, version))
}

/// Jobs with their tasks (those that exist, and with `RowLock::Skip` that no other node holds),
/// their rows locked as `lock` says, in a few set-based statements; on PostgreSQL with the
/// version of each row. Rows are locked in id order, so that two transactions locking
/// overlapping sets cannot wait on each other.
pub fn lock_job_states(
    conn: &mut dyn Conn,
    ids: &[JobId],
    lock: RowLock,
) -> Result<Vec<LoadedJob>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // A row's version is read with the row, by the same statement.
    let versioned = conn.backend() == Backend::Postgres;
    let version = if versioned { ", xmin::text" } else { "" };
    let mut loaded = Vec::with_capacity(ids.len());
    let keys: Vec<&str> = ids.iter().map(JobId::as_str).collect();
    for (condition, values) in key_sets(conn.backend(), &keys) {
        let sql = format!(
            "SELECT {JOB_COLUMNS}{version} FROM jobs WHERE id {condition} ORDER BY id{}",
            lock.clause()
        );
        let jobs = conn.query_map(&sql, &bind(&values), |row| {
            with_version(row, job_from_row, versioned.then_some(JOB_COLUMN_COUNT))
        })?;
        if jobs.is_empty() {
            continue;
        }
        let found: Vec<&str> = jobs.iter().map(|(job, _)| job.id.as_str()).collect();
        let mut tasks: HashMap<String, Vec<(Task, Option<String>)>> =
            HashMap::with_capacity(jobs.len());
        for (condition, values) in key_sets(conn.backend(), &found) {
            let sql = format!(
                "SELECT {TASK_COLUMNS}{version} FROM tasks WHERE job_id {condition} \
                 ORDER BY job_id, seq"
            );
            let rows = conn.query_map(&sql, &bind(&values), |row| {
                with_version(row, task_from_row, versioned.then_some(TASK_COLUMN_COUNT))
            })?;
            for (raw, row_version) in rows {
                let task = raw.into_task()?;
                tasks
                    .entry(task.job_id.as_str().to_owned())
                    .or_default()
                    .push((task, row_version));
            }
        }
        for (raw, row_version) in jobs {
            let job = raw.into_job()?;
            let (tasks, task_versions): (Vec<Task>, Vec<Option<String>>) = tasks
                .remove(job.id.as_str())
                .unwrap_or_default()
                .into_iter()
                .unzip();
            let versions = match row_version {
                Some(row) => Some(JobRowVersions {
                    job: job.id.clone(),
                    row: transaction_id(&row)?,
                    tasks: tasks
                        .iter()
                        .zip(task_versions)
                        .map(|(task, version)| {
                            let version = version.unwrap_or_default();
                            Ok((task.id.clone(), transaction_id(&version)?))
                        })
                        .collect::<Result<_>>()?,
                }),
                None => None,
            };
            loaded.push(LoadedJob {
                state: JobState {
                    tasks,
                    signals: pending_signals(conn, &job)?,
                    job,
                },
                versions,
            });
        }
    }
    Ok(loaded)
}

/// The versions of the rows of jobs `ids` and of their tasks, as they are now (on SQLite,
/// whose rows carry none, no job's): the job rows locked as `lock` says, in id order, and their tasks read by a statement
/// of their own after the locks were taken, so that a job a transaction of another node held
/// is read as that transaction left it. Jobs that do not exist (or that another node holds,
/// with `RowLock::Skip`) are left out.
pub fn job_row_versions(
    conn: &mut dyn Conn,
    ids: &[JobId],
    lock: RowLock,
) -> Result<Vec<JobRowVersions>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    if conn.backend() != Backend::Postgres {
        // SQLite's rows carry no version: none is known.
        return Ok(Vec::new());
    }
    let keys: Vec<&str> = ids.iter().map(JobId::as_str).collect();
    let mut versions = Vec::with_capacity(ids.len());
    for (condition, values) in key_sets(conn.backend(), &keys) {
        let sql = format!(
            "SELECT id, xmin::text FROM jobs WHERE id {condition} ORDER BY id{}",
            lock.clause()
        );
        let jobs: Vec<(String, String)> =
            conn.query_map(&sql, &bind(&values), |row| Ok((row.get(0)?, row.get(1)?)))?;
        if jobs.is_empty() {
            continue;
        }
        let found: Vec<&str> = jobs.iter().map(|(id, _)| id.as_str()).collect();
        let mut tasks: HashMap<String, Vec<(TaskId, TransactionId)>> =
            HashMap::with_capacity(jobs.len());
        for (condition, values) in key_sets(conn.backend(), &found) {
            let sql = format!(
                "SELECT job_id, id, xmin::text FROM tasks WHERE job_id {condition} \
                 ORDER BY job_id, seq"
            );
            let rows: Vec<(String, String, String)> =
                conn.query_map(&sql, &bind(&values), |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })?;
            for (job, task, version) in rows {
                let task = TaskId::parse(&task)
                    .ok_or_else(|| Error::Corrupt(format!("task id {task:?} is malformed")))?;
                tasks
                    .entry(job)
                    .or_default()
                    .push((task, transaction_id(&version)?));
            }
        }
        for (id, row) in jobs {
            let job = JobId::parse(&id)
                .ok_or_else(|| Error::Corrupt(format!("job id {id:?} is malformed")))?;
            versions.push(JobRowVersions {
                tasks: tasks.remove(&id).unwrap_or_default(),
                job,
                row: transaction_id(&row)?,
            });
        }
    }
    Ok(versions)
}

pub fn job_by_key(conn: &mut dyn Conn, namespace: &str, key: &str) -> Result<Option<JobId>> {
    let id: Option<String> = conn.query_opt(
        "SELECT id FROM jobs WHERE namespace = ?1 AND key = ?2",
        args![namespace, key],
        |row| row.get(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}

/// Jobs: a new row at submit, its changing columns afterwards.
pub const JOB_WRITE: RowWrite = RowWrite {
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
        "signals_received",
        "output",
        "failed_steps",
        "parent_job_id",
        "parent_task_id",
        "parent_attempt",
        "depth",
        "child_versions",
        "labels",
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
            "signals_received",
            "output",
            "failed_steps",
        ],
    )),
};

/// The columns `JOB_WRITE` updates that SQLite's indexes on `jobs` use, in their key or their
/// condition: an update that leaves them as they are need not set them, and SQLite then leaves
/// those indexes alone (see `deferred`).
pub const JOB_INDEXED_UPDATES: &[&str] = &["status", "deadline_at"];

/// A job's row, in the columns of `JOB_WRITE`.
pub fn job_values(job: &Job, take: impl FnOnce(&[Arg<'_>])) {
    let wind_down = opt_json_text(job.wind_down.as_ref());
    take(args![
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
        job.signals_received,
        opt_json_text(job.output.as_ref()),
        opt_json_text((!job.failed_steps.is_empty()).then_some(&job.failed_steps)),
        job.parent.as_ref().map(|parent| parent.job.as_str()),
        job.parent.as_ref().map(|parent| parent.task.as_str()),
        job.parent.as_ref().map(|parent| parent.attempt),
        job.depth,
        opt_json_text((!job.child_versions.is_empty()).then_some(&job.child_versions)),
        labels_text(&job.labels),
    ])
}

/// Reads jobs named by id through the primary key (SQLite's name for its index). SQLite has no
/// statistics, and given a namespace too it would rather walk the namespace's jobs in list
/// order (`jobs_status_created`, a status at a time) than sort a few rows.
pub(crate) const JOBS_BY_ID: &str = "INDEXED BY sqlite_autoindex_jobs_1";

/// The SQL of the newest first page (`?{limit}` rows) of the jobs `select_where` (a `SELECT` of
/// `jobs` whose `WHERE` names no status, its result holding `created_at` and `id`) picks,
/// whatever their status: one range per status of a list index that leads with the status
/// (`jobs_status_created`, or `jobs_workflow_status_created` for one workflow), each read in
/// list order (the index's order of creation time, the jobs of one millisecond sorted by id as
/// the walk reaches them), merged, and stopped after the page. SQLite merges the ordered arms of a
/// `UNION ALL … ORDER BY` as it reads them; PostgreSQL plans a Merge Append only over arms that
/// hold their own order and limit (it would rather sort every matching job otherwise). `jobs`
/// keeps no list index without the status: every job would pay for it in each write of its
/// row and in its bytes.
pub(crate) fn any_status_newest_first(
    backend: Backend,
    select_where: &str,
    limit: usize,
) -> String {
    const ORDER: &str = "ORDER BY created_at DESC, id DESC";
    let arms: Vec<String> = JobStatus::ALL
        .iter()
        .enumerate()
        .map(|(arm, status)| {
            let status = status.as_str();
            match backend {
                Backend::Sqlite => format!("{select_where} AND status = '{status}'"),
                Backend::Postgres => format!(
                    "SELECT * FROM ({select_where} AND status = '{status}' {ORDER} \
                     LIMIT ?{limit}) AS arm{arm}"
                ),
            }
        })
        .collect();
    format!("{} {ORDER} LIMIT ?{limit}", arms.join(" UNION ALL "))
}

/// The condition that a job comes after a cursor in list order (`created_at DESC, id DESC`),
/// given the placeholders of the cursor's creation time and id. The list indexes end with the
/// creation time, so the plain bound on it is what an index range can use; the row value
/// orders the jobs of the cursor's own millisecond.
pub(crate) fn before_cursor(created_at: usize, id: usize) -> String {
    format!(" AND created_at <= ?{created_at} AND (created_at, id) < (?{created_at}, ?{id})")
}

/// A filter's labels, the rarest first (each counted up to `RARE_LABEL` in the label index).
fn rarest_first<'a>(
    conn: &mut dyn Conn,
    namespace: &str,
    labels: &'a [(String, String)],
) -> Result<Vec<&'a (String, String)>> {
    let mut counted = Vec::with_capacity(labels.len());
    for label in labels {
        let count = if labels.len() == 1 {
            0
        } else {
            capped_count(conn, namespace, label)?
        };
        counted.push((count, label));
    }
    counted.sort_by_key(|(count, _)| *count);
    Ok(counted.into_iter().map(|(_, label)| label).collect())
}

/// Jobs of a namespace, newest first, after the cursor (the previous page's last job). With
/// labels, the rows of the rarest label (`job_labels_find`, in job id order) lead, so that a rare
/// label reads only its jobs however many others the namespace holds; each further label is
/// probed per job.
pub fn list_jobs<'a>(conn: &mut dyn Conn, filter: &'a JobFilter) -> Result<Vec<Job>> {
    let labels = rarest_first(conn, &filter.namespace, &filter.labels)?;
    let mut values: Vec<Arg<'a>> = vec![Arg::Text(&filter.namespace)];
    let mut sql = match labels.split_first() {
        None => {
            // A parent's children, or jobs named by id, are few: read them through their own
            // index and sort them, rather than walk the namespace's jobs in list order (which
            // SQLite, with no statistics, would otherwise prefer to avoid the sort).
            let hint = if filter.ids.is_some() {
                JOBS_BY_ID
            } else if filter.parent.is_some() {
                "INDEXED BY jobs_parent"
            } else {
                ""
            };
            format!("SELECT {JOB_COLUMNS} FROM jobs {hint} WHERE namespace = ?1")
        }
        Some(((key, value), others)) => {
            let columns: Vec<String> = JOB_COLUMNS.split(", ").map(|c| format!("j.{c}")).collect();
            values.extend([Arg::Text(key), Arg::Text(value)]);
            let mut sql = format!(
                "SELECT {} FROM job_labels l JOIN jobs j ON j.id = l.job_id \
                 WHERE l.namespace = ?1 AND l.key = ?2 AND l.value = ?3",
                columns.join(", ")
            );
            for (key, value) in others {
                values.extend([Arg::Text(key), Arg::Text(value)]);
                sql.push_str(&format!(
                    " AND EXISTS (SELECT 1 FROM job_labels m WHERE m.job_id = l.job_id \
                     AND m.key = ?{} AND m.value = ?{})",
                    values.len() - 1,
                    values.len()
                ));
            }
            sql
        }
    };
    // Columns of `jobs`, qualified when `job_labels` is joined (both have `namespace`, `key`).
    let jobs = if filter.labels.is_empty() { "" } else { "j." };
    let mut condition = |sql: &mut String, clause: &str, value: Arg<'a>| {
        values.push(value);
        sql.push_str(&format!(" AND {jobs}{clause} ?{}", values.len()));
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
    if let Some(parent) = &filter.parent {
        condition(&mut sql, "parent_job_id =", Arg::Text(parent.as_str()));
    }
    if let Some(ids) = &filter.ids {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let first = values.len() + 1;
        values.extend(ids.iter().map(|id| Arg::Text(id.as_str())));
        let places: Vec<String> = (first..=values.len()).map(|n| format!("?{n}")).collect();
        sql.push_str(&format!(" AND {jobs}id IN ({})", places.join(", ")));
    }
    // The order (and the cursor) follows the leading index: newest first by creation time
    // (`jobs_status_created` and its workflow variant, which the web UI's list reads too), or,
    // led by a label, by job id (`l.job_id`; ids are time-ordered, so this is newest first too).
    let order = if filter.labels.is_empty() {
        if let Some(cursor) = &filter.before {
            values.extend([Arg::Int(cursor.created_at.0), Arg::Text(cursor.id.as_str())]);
            sql.push_str(&before_cursor(values.len() - 1, values.len()));
        }
        "created_at DESC, id DESC"
    } else {
        if let Some(cursor) = &filter.before {
            values.push(Arg::Text(cursor.id.as_str()));
            sql.push_str(&format!(" AND l.job_id < ?{}", values.len()));
        }
        "l.job_id DESC"
    };
    values.push(Arg::Int(i64::from(filter.limit)));
    let plain = filter.labels.is_empty()
        && filter.ids.is_none()
        && filter.parent.is_none()
        && filter.status.is_none();
    if plain {
        sql = any_status_newest_first(conn.backend(), &sql, values.len());
    } else {
        sql.push_str(&format!(" ORDER BY {order} LIMIT ?{}", values.len()));
    }
    conn.query_map(&sql, &values, job_from_row)?
        .into_iter()
        .map(RawJob::into_job)
        .collect()
}

/// Deletes up to `limit` jobs that finished before `ended_before`, with their tasks, history,
/// labels, lock rows and webhook deliveries; returns how many jobs went. A child job stays
/// while its parent is kept (the parent may still roll it back). On PostgreSQL the history in
/// day partitions stays behind, unreachable, until its whole day is dropped (see `partitions`);
/// only what the default partition caught is deleted here.
///
/// The jobs are found through the list index by status (`jobs_status_created`), a namespace at a
/// time: a job that ended before `ended_before` was created before it, so each namespace's
/// finished jobs are one range per finished status.
pub fn prune_finished(conn: &mut dyn Conn, ended_before: Timestamp, limit: u32) -> Result<usize> {
    static FINISHED: LazyLock<String> = LazyLock::new(|| {
        let finished = JobStatus::ALL.iter().copied().filter(|s| s.is_terminal());
        format!(
            "SELECT id FROM jobs WHERE namespace = ?1 AND status IN ({}) AND created_at < ?2 \
             AND ended_at < ?2 AND (parent_job_id IS NULL OR NOT EXISTS \
             (SELECT 1 FROM jobs AS parent WHERE parent.id = jobs.parent_job_id)) \
             LIMIT ?3 FOR UPDATE SKIP LOCKED",
            status_list(finished)
        )
    });
    let mut ids: Vec<String> = Vec::new();
    for namespace in namespaces_with_jobs(conn)? {
        // Each namespace's read takes at most what is left of `limit`.
        let left = limit as usize - ids.len();
        if left == 0 {
            break;
        }
        ids.extend(conn.query_map(
            &FINISHED,
            args![namespace, ended_before.0, left as i64],
            |row| row.get::<String>(0),
        )?);
    }
    let history = match conn.backend() {
        Backend::Sqlite => ALL_HISTORY,
        Backend::Postgres => "DELETE FROM events_default WHERE job_id = ?1",
    };
    for id in &ids {
        delete_job_rows(conn, id, history)?;
    }
    if !ids.is_empty() {
        keep_rollup_within_history(conn)?;
    }
    Ok(ids.len())
}

/// `statuses` as SQL string literals, for a `status IN (…)`.
pub(crate) fn status_list(statuses: impl IntoIterator<Item = JobStatus>) -> String {
    statuses
        .into_iter()
        .map(|status| format!("'{}'", status.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The start of a query whose table `spaces (name)` holds the namespaces that hold jobs, each
/// found by one seek of the list index leading with the namespace (`jobs_status_created`), so
/// however many jobs each holds (a skip scan); the last row's name is NULL.
pub(crate) const NAMESPACES_WITH_JOBS: &str = "WITH RECURSIVE spaces (name) AS ( \
     SELECT MIN(namespace) FROM jobs \
     UNION ALL \
     SELECT (SELECT MIN(namespace) FROM jobs WHERE namespace > spaces.name) \
     FROM spaces WHERE spaces.name IS NOT NULL)";

fn namespaces_with_jobs(conn: &mut dyn Conn) -> Result<Vec<String>> {
    conn.query_map(
        &format!("{NAMESPACES_WITH_JOBS} SELECT name FROM spaces WHERE name IS NOT NULL"),
        &[],
        |row| row.get(0),
    )
}

/// Deletes all of a job's history.
const ALL_HISTORY: &str = "DELETE FROM events WHERE job_id = ?1";

/// Deletes a job with its tasks, history, signals, labels, lock rows and delivered (or given
/// up) webhook deliveries; its key is free again. The caller checks that the job is finished
/// and that no kept parent needs it (as `prune_finished` does).
pub fn delete_job(conn: &mut dyn Conn, id: &str) -> Result<()> {
    delete_job_rows(conn, id, ALL_HISTORY)?;
    keep_rollup_within_history(conn)
}

/// After history was deleted on SQLite, lowers the dashboard rollup's watermark to the largest
/// event id left if it was above it: SQLite gives a new event the largest id plus one
/// (`0020_history_ids_reused.sql`), which after the largest were deleted can be an id the
/// watermark has passed, and the rollup would skip it. Every event left at or below the
/// lowered watermark was below the old one, so none is counted twice. PostgreSQL's ids come
/// from a sequence that never goes back.
fn keep_rollup_within_history(conn: &mut dyn Conn) -> Result<()> {
    if conn.backend() == Backend::Sqlite {
        conn.execute(
            "UPDATE stats_rollup SET seq = (SELECT COALESCE(MAX(seq), 0) FROM events) \
             WHERE seq > (SELECT COALESCE(MAX(seq), 0) FROM events)",
            &[],
        )?;
    }
    Ok(())
}

/// `delete_job`, with `history` the statement deleting the job's history.
fn delete_job_rows(conn: &mut dyn Conn, id: &str, history: &str) -> Result<()> {
    for sql in [
        history,
        "DELETE FROM signals WHERE job_id = ?1",
        "DELETE FROM job_labels WHERE job_id = ?1",
        "DELETE FROM tasks WHERE job_id = ?1",
        "DELETE FROM lock_holders WHERE job_id = ?1",
        "DELETE FROM webhook_deliveries WHERE job_id = ?1 AND next_attempt_at IS NULL",
        "DELETE FROM child_endings WHERE child_job_id = ?1",
        "DELETE FROM jobs WHERE id = ?1",
    ] {
        conn.execute(sql, args![id])?;
    }
    Ok(())
}

/// Stores the trace of a job just created (only while tracing is on).
pub fn set_trace(conn: &mut dyn Conn, id: &JobId, trace: &JobTrace) -> Result<()> {
    let (trace_id, span_id) = (
        format!("{:032x}", trace.trace_id),
        format!("{:016x}", trace.span_id),
    );
    let parent = trace.parent_span_id.map(|span| format!("{span:016x}"));
    conn.execute(
        "UPDATE jobs SET trace_id = ?1, span_id = ?2, parent_span_id = ?3 WHERE id = ?4",
        args![trace_id, span_id, parent, id.as_str()],
    )?;
    Ok(())
}

/// The trace stored with a job, if it was submitted while tracing was on.
pub fn trace_of(conn: &mut dyn Conn, id: &JobId) -> Result<Option<JobTrace>> {
    let found: Option<(Option<String>, Option<String>, Option<String>)> = conn.query_opt(
        "SELECT trace_id, span_id, parent_span_id FROM jobs WHERE id = ?1",
        args![id.as_str()],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    let Some((Some(trace_id), Some(span_id), parent)) = found else {
        return Ok(None);
    };
    let corrupt = || Error::Corrupt(format!("job {id} has a malformed trace id"));
    Ok(Some(JobTrace {
        trace_id: u128::from_str_radix(&trace_id, 16).map_err(|_| corrupt())?,
        span_id: u64::from_str_radix(&span_id, 16).map_err(|_| corrupt())?,
        parent_span_id: match parent {
            Some(parent) => Some(u64::from_str_radix(&parent, 16).map_err(|_| corrupt())?),
            None => None,
        },
    }))
}
