//! Read queries for people browsing the store (the web UI): a filtered, searchable page of jobs
//! newest first, job counts per status under the same filter, and the workers holding running
//! tasks.
//!
//! Every query is written to stay fast with millions of jobs: the list walks an index in its
//! order (`created_at DESC, id DESC`) and stops after one page; the counts are one index-only
//! range count per status. The indexes are in migration `0004_browse.sql` (PostgreSQL:
//! `0003_browse.sql`). The SQL is portable: row values, plain comparisons, numbered placeholders.

use crate::db::{Conn, Value as SqlValue, bind};
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

/// How many running tasks a worker holds on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLoad {
    pub worker: String,
    pub queue: String,
    pub running: u64,
}

/// The `WHERE` clause and its values for everything in `search` but status and cursor.
fn conditions(search: &JobSearch) -> (String, Vec<SqlValue>) {
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
    if let Some(text) = search.text.as_deref().filter(|t| !t.is_empty()) {
        // A prefix is a range, so both halves read an index (the primary key, `jobs_key`).
        let end = prefix_end(text);
        push(&mut sql, " AND ((id >= #", text.to_owned().into());
        push(&mut sql, " AND id < #)", end.clone().into());
        push(
            &mut sql,
            " OR (key IS NOT NULL AND key >= #",
            text.to_owned().into(),
        );
        push(&mut sql, " AND key < #))", end.into());
    }
    (sql, values)
}

/// The smallest string greater than every string that starts with `prefix` (byte order).
fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}

fn timestamp(value: Option<i64>) -> Option<Timestamp> {
    value.map(Timestamp)
}

/// One page of jobs, newest first.
pub(crate) fn jobs(conn: &mut dyn Conn, search: &JobSearch) -> Result<Vec<JobLine>> {
    let (mut sql, mut values) = conditions(search);
    if let Some(status) = search.status {
        values.push(status.as_str().to_owned().into());
        sql.push_str(&format!(" AND status = ?{}", values.len()));
    }
    if let Some(cursor) = &search.after {
        values.push(cursor.created_at.0.into());
        values.push(cursor.id.as_str().to_owned().into());
        sql.push_str(&format!(
            " AND (created_at, id) < (?{}, ?{})",
            values.len() - 1,
            values.len()
        ));
    }
    values.push(i64::from(search.limit).into());
    let query = format!(
        "SELECT id, workflow, version, status, key, priority, created_at, started_at, ended_at \
         FROM jobs WHERE {sql} ORDER BY created_at DESC, id DESC LIMIT ?{}",
        values.len()
    );
    let rows = conn.query_map(&query, &bind(&values), |row| {
        Ok((
            row.get::<String>(0)?,
            row.get::<String>(1)?,
            row.get::<u32>(2)?,
            row.get::<String>(3)?,
            row.get::<Option<String>>(4)?,
            row.get::<i32>(5)?,
            row.get::<i64>(6)?,
            row.get::<Option<i64>>(7)?,
            row.get::<Option<i64>>(8)?,
        ))
    })?;
    rows.into_iter()
        .map(
            |(id, workflow, version, status, key, priority, created, started, ended)| {
                Ok(JobLine {
                    id: JobId::parse(&id).ok_or_else(|| Error::Corrupt(format!("job id {id}")))?,
                    status: JobStatus::parse(&status)
                        .ok_or_else(|| Error::Corrupt(format!("job status {status}")))?,
                    workflow,
                    version,
                    key,
                    priority,
                    created_at: Timestamp(created),
                    started_at: timestamp(started),
                    ended_at: timestamp(ended),
                })
            },
        )
        .collect()
}

/// How many jobs of each status match `search` (its status and cursor aside), every status
/// listed. Each count reads one range of an index that starts with the status.
pub(crate) fn status_counts(
    conn: &mut dyn Conn,
    search: &JobSearch,
) -> Result<Vec<(JobStatus, u64)>> {
    let (sql, mut values) = conditions(search);
    values.push(SqlValue::Text(String::new()));
    let query = format!(
        "SELECT COUNT(*) FROM jobs WHERE {sql} AND status = ?{}",
        values.len()
    );
    let slot = values.len() - 1;
    let mut counts = Vec::with_capacity(JobStatus::ALL.len());
    for &status in JobStatus::ALL {
        values[slot] = SqlValue::Text(status.as_str().to_owned());
        let count: u64 = conn.query_value(&query, &bind(&values))?;
        counts.push((status, count));
    }
    Ok(counts)
}

/// The workers holding running tasks in a namespace, per queue (reads only running tasks).
pub(crate) fn worker_loads(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<WorkerLoad>> {
    conn.query_map(
        "SELECT worker_id, queue, COUNT(*) FROM tasks \
         WHERE status = 'running' AND namespace = ?1 AND worker_id IS NOT NULL \
         GROUP BY worker_id, queue ORDER BY worker_id, queue",
        crate::db::args![namespace],
        |row| {
            Ok(WorkerLoad {
                worker: row.get(0)?,
                queue: row.get(1)?,
                running: row.get(2)?,
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use starbridge_core::time::Duration;

    use crate::{ManualClock, Store, Submit};

    const START: i64 = 1_700_000_000_000;

    async fn store_with_jobs() -> (Store, Arc<ManualClock>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp(START)));
        let url = format!("sqlite://{}", dir.path().join("browse.db").display());
        let store = Store::open_with_clock(&url, clock.clone()).unwrap();
        for (name, body) in [
            (
                "one",
                json!({"steps": [{"id": "a", "queue": "q", "command": "c"}]}),
            ),
            (
                "two",
                json!({"steps": [{"id": "b", "queue": "r", "command": "c"}]}),
            ),
        ] {
            store.apply_workflow("default", name, body).await.unwrap();
        }
        for (i, workflow) in ["one", "two", "one", "two", "one"].iter().enumerate() {
            if i > 0 {
                clock.advance(Duration::from_millis(1000));
            }
            store
                .submit(
                    "default",
                    Submit {
                        workflow: Some((*workflow).to_owned()),
                        key: Some(format!("order-{i}")),
                        ..Submit::default()
                    },
                )
                .await
                .unwrap();
        }
        (store, clock, dir)
    }

    fn search() -> JobSearch {
        JobSearch {
            namespace: "default".to_owned(),
            limit: 10,
            ..JobSearch::default()
        }
    }

    fn keys(lines: &[JobLine]) -> Vec<&str> {
        lines.iter().filter_map(|l| l.key.as_deref()).collect()
    }

    #[tokio::test]
    async fn jobs_are_listed_newest_first_and_pages_follow_the_cursor() {
        let (store, _clock, _dir) = store_with_jobs().await;
        let first = store
            .browse_jobs(JobSearch {
                limit: 2,
                ..search()
            })
            .await
            .unwrap();
        assert_eq!(keys(&first), ["order-4", "order-3"]);
        let last = first.last().unwrap();
        let cursor = JobCursor {
            created_at: last.created_at,
            id: last.id.clone(),
        };
        assert_eq!(JobCursor::decode(&cursor.encode()), Some(cursor.clone()));
        let second = store
            .browse_jobs(JobSearch {
                limit: 2,
                after: Some(cursor),
                ..search()
            })
            .await
            .unwrap();
        assert_eq!(keys(&second), ["order-2", "order-1"]);
    }

    #[tokio::test]
    async fn filters_by_workflow_time_range_and_key_or_id_prefix() {
        let (store, _clock, _dir) = store_with_jobs().await;
        let two = store
            .browse_jobs(JobSearch {
                workflow: Some("two".to_owned()),
                ..search()
            })
            .await
            .unwrap();
        assert_eq!(keys(&two), ["order-3", "order-1"]);
        let window = store
            .browse_jobs(JobSearch {
                created_after: Some(Timestamp(START + 1000)),
                created_before: Some(Timestamp(START + 3000)),
                ..search()
            })
            .await
            .unwrap();
        assert_eq!(keys(&window), ["order-2", "order-1"]);
        let by_key = store
            .browse_jobs(JobSearch {
                text: Some("order-3".to_owned()),
                ..search()
            })
            .await
            .unwrap();
        assert_eq!(keys(&by_key), ["order-3"]);
        let id = by_key[0].id.to_string();
        let by_id = store
            .browse_jobs(JobSearch {
                text: Some(id[..id.len() - 2].to_owned()),
                ..search()
            })
            .await
            .unwrap();
        assert!(by_id.iter().any(|line| line.id == by_key[0].id));
        let none = store
            .browse_jobs(JobSearch {
                text: Some("nothing".to_owned()),
                ..search()
            })
            .await
            .unwrap();
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn counts_every_status_under_the_filter() {
        let (store, _clock, _dir) = store_with_jobs().await;
        let counts = store
            .job_counts(JobSearch {
                workflow: Some("one".to_owned()),
                status: Some(JobStatus::Failed),
                ..search()
            })
            .await
            .unwrap();
        assert_eq!(counts.len(), JobStatus::ALL.len());
        for (status, count) in counts {
            let expected = if status == JobStatus::Running { 3 } else { 0 };
            assert_eq!(count, expected, "{status}");
        }
    }

    #[tokio::test]
    async fn worker_loads_name_the_workers_holding_running_tasks() {
        let (store, _clock, _dir) = store_with_jobs().await;
        store
            .claim("default", vec!["q".to_owned()], "w1", 2)
            .await
            .unwrap();
        let loads = store.worker_loads("default").await.unwrap();
        assert_eq!(
            loads,
            [WorkerLoad {
                worker: "w1".to_owned(),
                queue: "q".to_owned(),
                running: 2,
            }]
        );
    }
}
