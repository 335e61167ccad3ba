//! Lock slots: one `lock_holders` row per job holding a slot of its workflow's lock, and the
//! queued job next in line for a key.

use starbridge_core::ids::JobId;
use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

/// How many jobs hold a slot of this lock.
pub fn lock_holders(conn: &mut dyn Conn, namespace: &str, key: &str) -> Result<u32> {
    conn.query_value(
        "SELECT COUNT(*) FROM lock_holders WHERE namespace = ?1 AND key = ?2",
        args![namespace, key],
    )
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

/// The job waiting longest for this lock.
pub fn first_queued(conn: &mut dyn Conn, namespace: &str, key: &str) -> Result<Option<JobId>> {
    let id: Option<String> = conn.query_opt(
        "SELECT id FROM jobs INDEXED BY jobs_queued WHERE status = 'queued' AND namespace = ?1 \
         AND lock_key = ?2 ORDER BY id LIMIT 1",
        args![namespace, key],
        |row| row.get(0),
    )?;
    Ok(id.and_then(|id| JobId::parse(&id)))
}
