//! Sub-workflows' rows: the endings of child jobs waiting for their parent's next transaction
//! (`child_endings`), and a child found by the parent task and attempt that started it. A
//! child's own row is a job's (`jobs`), with its parent link.

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

/// Notes that `child` ended, for its parent's next transaction; a second note of the same
/// child changes nothing.
pub fn note_ending(
    conn: &mut dyn Conn,
    child: &JobId,
    parent: &JobId,
    at: Timestamp,
) -> Result<()> {
    conn.execute(
        "INSERT INTO child_endings (child_job_id, parent_job_id, ended_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (child_job_id) DO NOTHING",
        args![child.as_str(), parent.as_str(), at.0],
    )?;
    Ok(())
}

/// At most `limit` noted endings, oldest first, as (child, parent); on PostgreSQL locked,
/// skipping those another node handles.
pub fn due_endings(conn: &mut dyn Conn, limit: u32) -> Result<Vec<(JobId, JobId)>> {
    let rows = conn.query_map(
        "SELECT child_job_id, parent_job_id FROM child_endings ORDER BY ended_at LIMIT ?1 \
         FOR UPDATE SKIP LOCKED",
        args![limit],
        |row| Ok((row.get::<String>(0)?, row.get::<String>(1)?)),
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|(child, parent)| Some((JobId::parse(&child)?, JobId::parse(&parent)?)))
        .collect())
}

/// Forgets a noted ending once its parent has taken it.
pub fn forget_ending(conn: &mut dyn Conn, child: &JobId) -> Result<()> {
    conn.execute(
        "DELETE FROM child_endings WHERE child_job_id = ?1",
        args![child.as_str()],
    )?;
    Ok(())
}

/// The child job a parent task's attempt started, if it exists.
pub fn child_of(conn: &mut dyn Conn, task: &TaskId, attempt: u32) -> Result<Option<JobId>> {
    let id = conn.query_opt(
        "SELECT id FROM jobs WHERE parent_task_id = ?1 AND parent_attempt = ?2",
        args![task.as_str(), attempt],
        |row| row.get::<String>(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}
