//! Read queries for people browsing the store (the web UI): a filtered, searchable page of jobs
//! newest first, job counts per status under the same filter, and the workers holding running
//! tasks.
//!
//! Every query is written to stay fast with millions of jobs: the list walks an index in its
//! order (`created_at DESC, id DESC`), one range per status merged when no status is given, and
//! stops after one page; the counts are one index-only range count per status, stopped at a cap
//! (an exact count of a million rows costs more than a page should). A text search reads at most `SEARCH_SCAN` jobs whose id and as many whose key
//! start with the text, each from its own index, then filters, orders and counts those in
//! memory: query planners would otherwise walk the list order and test every job. The indexes
//! are in migration `0004_browse.sql` (PostgreSQL: `0003_browse.sql`), less the two without the
//! status (`0018_lists_by_status.sql`), and end with the creation time, not the id
//! (`0019_lists_end_with_creation.sql`): the jobs of one millisecond are sorted as the walk
//! reaches them. The SQL is portable: row values, plain comparisons,
//! numbered placeholders.

use crate::db::{Conn, Queries, Row, Value as SqlValue, args, bind};
use crate::rows::labels::{RARE_LABEL, capped_count};
use starbridge_core::ids::JobId;
use starbridge_core::model::JobStatus;
use starbridge_core::time::Timestamp;

use crate::{Error, Result};

/// Which jobs to show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSearch {
    pub namespace: String,
    pub status: Option<JobStatus>,
    pub workflow: Option<String>,
    /// Only jobs created at or after this time.
    pub created_after: Option<Timestamp>,
    /// Only jobs created before this time.
    pub created_before: Option<Timestamp>,
    /// Jobs whose id or key starts with this text.
    pub text: Option<String>,
    /// Only jobs with every one of these labels (`key`, `value`).
    pub labels: Vec<(String, String)>,
    /// Only jobs after this one in the list order (the last row of the previous page).
    pub after: Option<JobCursor>,
    pub limit: u32,
}

/// A position in the list: newest first, ties broken by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCursor {
    pub created_at: Timestamp,
    pub id: JobId,
}

impl JobCursor {
    /// The position of a job created at `created_at`: the next page starts after it.
    pub fn of(created_at: Timestamp, id: &JobId) -> JobCursor {
        JobCursor {
            created_at,
            id: id.clone(),
        }
    }

    /// The cursor as one URL-safe word: `<created_at ms>.<job id>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.created_at.0, self.id)
    }

    pub fn decode(text: &str) -> Option<JobCursor> {
        let (millis, id) = text.split_once('.')?;
        Some(JobCursor {
            created_at: Timestamp(millis.parse().ok()?),
            id: JobId::parse(id)?,
        })
    }
}

/// One line of the jobs list.
#[derive(Debug, Clone, PartialEq)]
pub struct JobLine {
    pub id: JobId,
    pub workflow: String,
    pub version: u32,
    pub status: JobStatus,
    pub key: Option<String>,
    pub priority: i32,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
}

/// How many jobs of a status match, counted up to a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusCount {
    pub status: JobStatus,
    /// The count, or the cap when `more` is set.
    pub count: u64,
    /// More jobs than the cap match.
    pub more: bool,
}

/// How many running tasks a worker holds on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLoad {
    pub worker: String,
    pub queue: String,
    pub running: u64,
}

/// What `search` selects, but for status and cursor.
struct Conditions {
    /// The `WHERE` clause, `?1` being the namespace.
    sql: String,
    values: Vec<SqlValue>,
    /// How to read `jobs`: by primary key when a rare label names the few jobs there are (SQLite,
    /// without statistics, would rather walk a list index and test each job against them);
    /// else as the planner likes.
    read: &'static str,
}

/// The `WHERE` clause and its values for everything in `search` but status and cursor.
fn conditions(conn: &mut dyn Conn, search: &JobSearch) -> Result<Conditions> {
    let mut sql = String::from("namespace = ?1");
    let mut values: Vec<SqlValue> = vec![search.namespace.clone().into()];
    let mut push = |sql: &mut String, clause: &str, value: SqlValue| {
        values.push(value);
        sql.push_str(&clause.replace('#', &format!("?{}", values.len())));
    };
    if let Some(workflow) = &search.workflow {
        push(&mut sql, " AND workflow = #", workflow.clone().into());
    }
    if let Some(after) = search.created_after {
        push(&mut sql, " AND created_at >= #", after.0.into());
    }
    if let Some(before) = search.created_before {
        push(&mut sql, " AND created_at < #", before.0.into());
    }
    let mut read = "";
    for label in &search.labels {
        let rare = capped_count(conn, &search.namespace, label)? < RARE_LABEL;
        push_label(&mut sql, &mut values, label, rare);
        if rare {
            read = crate::rows::JOBS_BY_ID;
        }
    }
    Ok(Conditions { sql, values, read })
}

/// Adds to `sql` (whose `?1` is the namespace) the condition that a job has the label: among
/// the few jobs of a rare label, read from the label index (`job_labels_find`); else checked
/// job by job (the primary key of `job_labels`), so that a list that stops after a page, or a
/// count at its cap, reads no more labels than jobs.
fn push_label(
    sql: &mut String,
    values: &mut Vec<SqlValue>,
    (key, value): &(String, String),
    rare: bool,
) {
    values.push(key.clone().into());
    values.push(value.clone().into());
    let (key, value) = (values.len() - 1, values.len());
    sql.push_str(&if rare {
        format!(
            " AND id IN (SELECT job_id FROM job_labels WHERE namespace = ?1 AND key = ?{key} \
             AND value = ?{value})"
        )
    } else {
        format!(
            " AND EXISTS (SELECT 1 FROM job_labels l WHERE l.job_id = jobs.id AND l.key = ?{key} \
             AND l.value = ?{value})"
        )
    });
}

/// Jobs whose id or key starts with the text, most `SEARCH_SCAN` of each.
const SEARCH_SCAN: u32 = 2000;

/// The jobs a text search can show: those with an id or key starting with `text` (at most
/// `SEARCH_SCAN` of each, read from the primary key and `jobs_key`) that pass the other
/// filters but status and cursor; and whether more jobs start with the text.
fn candidates(conn: &mut dyn Conn, search: &JobSearch, text: &str) -> Result<(Vec<JobLine>, bool)> {
    let end = prefix_end(text);
    let limit = i64::from(SEARCH_SCAN) + 1;
    let mut ids: Vec<String> = Vec::new();
    let mut more = false;
    let by_id = "SELECT id FROM jobs WHERE id >= ?1 AND id < ?2 LIMIT ?3";
    let by_key = "SELECT id FROM jobs WHERE namespace = ?4 AND key >= ?1 AND key < ?2 LIMIT ?3";
    for (sql, used) in [(by_id, 3), (by_key, 4)] {
        let values = args![text, end, limit, search.namespace];
        let found: Vec<String> = conn.query_map(sql, &values[..used], |row| row.get(0))?;
        more |= found.len() > SEARCH_SCAN as usize;
        ids.extend(found.into_iter().take(SEARCH_SCAN as usize));
    }
    ids.sort();
    ids.dedup();
    let mut lines = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        let mut values: Vec<SqlValue> = vec![search.namespace.clone().into()];
        values.extend(chunk.iter().map(|id| SqlValue::from(id.clone())));
        let marks: Vec<String> = (2..=values.len()).map(|i| format!("?{i}")).collect();
        let mut query = format!(
            "SELECT {LINE_COLUMNS} FROM jobs {} WHERE namespace = ?1 AND id IN ({})",
            crate::rows::JOBS_BY_ID,
            marks.join(", ")
        );
        for label in &search.labels {
            push_label(&mut query, &mut values, label, false);
        }
        for raw in conn.query_map(&query, &bind(&values), raw_line)? {
            let line = raw.into_line()?;
            let wanted = search.workflow.as_ref().is_none_or(|w| *w == line.workflow)
                && search.created_after.is_none_or(|t| line.created_at >= t)
                && search.created_before.is_none_or(|t| line.created_at < t);
            if wanted {
                lines.push(line);
            }
        }
    }
    // Newest first, as the list is.
    lines.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    Ok((lines, more))
}

const LINE_COLUMNS: &str =
    "id, workflow, version, status, key, priority, created_at, started_at, ended_at";

/// A row of `LINE_COLUMNS` as read.
struct RawLine {
    id: String,
    workflow: String,
    version: u32,
    status: String,
    key: Option<String>,
    priority: i32,
    created_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
}

fn raw_line(row: &mut Row) -> Result<RawLine> {
    Ok(RawLine {
        id: row.get(0)?,
        workflow: row.get(1)?,
        version: row.get(2)?,
        status: row.get(3)?,
        key: row.get(4)?,
        priority: row.get(5)?,
        created_at: row.get(6)?,
        started_at: row.get(7)?,
        ended_at: row.get(8)?,
    })
}

impl RawLine {
    fn into_line(self) -> Result<JobLine> {
        Ok(JobLine {
            id: JobId::parse(&self.id)
                .ok_or_else(|| Error::Corrupt(format!("job id {}", self.id)))?,
            status: JobStatus::parse(&self.status)
                .ok_or_else(|| Error::Corrupt(format!("job status {}", self.status)))?,
            workflow: self.workflow,
            version: self.version,
            key: self.key,
            priority: self.priority,
            created_at: Timestamp(self.created_at),
            started_at: timestamp(self.started_at),
            ended_at: timestamp(self.ended_at),
        })
    }
}

fn text(search: &JobSearch) -> Option<&str> {
    search.text.as_deref().filter(|t| !t.is_empty())
}

/// The smallest string greater than every string that starts with `prefix` (byte order).
fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}

fn timestamp(value: Option<i64>) -> Option<Timestamp> {
    value.map(Timestamp)
}

/// One page of jobs, newest first.
pub fn jobs(conn: &mut dyn Conn, search: &JobSearch) -> Result<Vec<JobLine>> {
    if let Some(text) = text(search) {
        let (lines, _) = candidates(conn, search, text)?;
        return Ok(lines
            .into_iter()
            .filter(|line| search.status.is_none_or(|s| s == line.status))
            .filter(|line| {
                search.after.as_ref().is_none_or(|cursor| {
                    (line.created_at, &line.id) < (cursor.created_at, &cursor.id)
                })
            })
            .take(search.limit as usize)
            .collect());
    }
    let Conditions {
        mut sql,
        mut values,
        read,
    } = conditions(conn, search)?;
    if let Some(status) = search.status {
        values.push(status.as_str().to_owned().into());
        sql.push_str(&format!(" AND status = ?{}", values.len()));
    }
    if let Some(cursor) = &search.after {
        values.push(cursor.created_at.0.into());
        values.push(cursor.id.as_str().to_owned().into());
        sql.push_str(&crate::rows::before_cursor(values.len() - 1, values.len()));
    }
    values.push(i64::from(search.limit).into());
    let select = format!("SELECT {LINE_COLUMNS} FROM jobs {read} WHERE {sql}");
    // A rare label's few jobs are read by id and sorted; else, with no status given, each
    // status's jobs in list order, merged.
    let query = if search.status.is_none() && read.is_empty() {
        crate::rows::any_status_newest_first(conn.backend(), &select, values.len())
    } else {
        format!(
            "{select} ORDER BY created_at DESC, id DESC LIMIT ?{}",
            values.len()
        )
    };
    conn.query_map(&query, &bind(&values), raw_line)?
        .into_iter()
        .map(RawLine::into_line)
        .collect()
}

/// How many jobs of each status match `search` (its status and cursor aside), every status
/// listed, each counted up to `cap`. Each count reads one range of an index that starts with
/// the status, and stops after `cap + 1` entries; with a rare label, it reads that label's jobs
/// by primary key instead.
pub fn status_counts(
    conn: &mut dyn Conn,
    search: &JobSearch,
    cap: u64,
) -> Result<Vec<StatusCount>> {
    if let Some(text) = text(search) {
        let (lines, more) = candidates(conn, search, text)?;
        return Ok(JobStatus::ALL
            .iter()
            .map(|&status| {
                let count = lines.iter().filter(|l| l.status == status).count() as u64;
                StatusCount {
                    status,
                    count: count.min(cap),
                    more: more || count > cap,
                }
            })
            .collect());
    }
    let Conditions {
        sql,
        mut values,
        read,
    } = conditions(conn, search)?;
    values.push(SqlValue::Text(String::new()));
    let status_slot = values.len();
    values.push(
        i64::try_from(cap.saturating_add(1))
            .unwrap_or(i64::MAX)
            .into(),
    );
    let query = format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM jobs {read} WHERE {sql} AND status = ?{status_slot} \
         LIMIT ?{}) AS capped",
        values.len()
    );
    let mut counts = Vec::with_capacity(JobStatus::ALL.len());
    for &status in JobStatus::ALL {
        values[status_slot - 1] = SqlValue::Text(status.as_str().to_owned());
        let count: u64 = conn.query_value(&query, &bind(&values))?;
        counts.push(StatusCount {
            status,
            count: count.min(cap),
            more: count > cap,
        });
    }
    Ok(counts)
}

/// The workers holding running tasks in a namespace, per queue (reads only running tasks).
pub fn worker_loads(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<WorkerLoad>> {
    conn.query_map(
        "SELECT worker_id, queue, COUNT(*) FROM tasks \
         WHERE status = 'running' AND namespace = ?1 AND worker_id IS NOT NULL \
         GROUP BY worker_id, queue ORDER BY worker_id, queue",
        args![namespace],
        |row| {
            Ok(WorkerLoad {
                worker: row.get(0)?,
                queue: row.get(1)?,
                running: row.get(2)?,
            })
        },
    )
}
