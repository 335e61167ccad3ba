//! Lock slots: one `lock_holders` row per job holding a slot of its workflow's lock, one
//! `task_lock_holders` row per task holding a slot of its step's lock (both count against one
//! key), and the waiters next in line for a key: the queued job, the parked task.

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

/// How many jobs and tasks hold a slot of this lock.
pub fn lock_holders(conn: &mut dyn Conn, namespace: &str, key: &str) -> Result<u32> {
    conn.query_value(
        "SELECT (SELECT COUNT(*) FROM lock_holders WHERE namespace = ?1 AND key = ?2) \
         + (SELECT COUNT(*) FROM task_lock_holders WHERE namespace = ?1 AND key = ?2)",
        args![namespace, key],
    )
}

/// A task takes a slot of its step's lock.
pub fn hold_task_lock(
    conn: &mut dyn Conn,
    namespace: &str,
    key: &str,
    job: &JobId,
    task: &TaskId,
    now: Timestamp,
) -> Result<()> {
    conn.execute(
        "INSERT INTO task_lock_holders (task_id, job_id, namespace, key, acquired_at) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
        args![task.as_str(), job.as_str(), namespace, key, now.0],
    )?;
    Ok(())
}

/// A task's attempt ended: its slot frees.
pub fn release_task_lock(conn: &mut dyn Conn, task: &TaskId) -> Result<()> {
    conn.execute(
        "DELETE FROM task_lock_holders WHERE task_id = ?1",
        args![task.as_str()],
    )?;
    Ok(())
}

pub fn hold_lock(
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

pub fn release_lock(conn: &mut dyn Conn, job: &JobId) -> Result<()> {
    conn.execute(
        "DELETE FROM lock_holders WHERE job_id = ?1",
        args![job.as_str()],
    )?;
    Ok(())
}

/// The job waiting longest for this lock, with since when it waits (its creation).
pub fn first_queued(
    conn: &mut dyn Conn,
    namespace: &str,
    key: &str,
) -> Result<Option<(JobId, Timestamp)>> {
    let first: Option<(String, i64)> = conn.query_opt(
        "SELECT id, created_at FROM jobs INDEXED BY jobs_queued WHERE status = 'queued' \
         AND namespace = ?1 AND lock_key = ?2 ORDER BY id LIMIT 1",
        args![namespace, key],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok(first.and_then(|(id, at)| Some((JobId::parse(&id)?, Timestamp(at)))))
}

/// The tasks parked longest in a line of waiters (see `Parked::lock_line`, `rate_line`), up
/// to `limit`, oldest first, with since when each waits.
pub fn first_parked(
    conn: &mut dyn Conn,
    namespace: &str,
    line: &str,
    limit: u32,
) -> Result<Vec<(JobId, TaskId, Timestamp)>> {
    let rows: Vec<(String, String, i64)> = conn.query_map(
        "SELECT job_id, id, parked_at FROM tasks INDEXED BY tasks_parked WHERE parked IS NOT NULL \
         AND namespace = ?1 AND parked = ?2 ORDER BY parked_at, id LIMIT ?3",
        args![namespace, line, limit],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|(job, task, at)| {
            Some((JobId::parse(&job)?, TaskId::parse(&task)?, Timestamp(at)))
        })
        .collect())
}
