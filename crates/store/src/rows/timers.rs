//! Lease, deadline and wait timers: which jobs have a lapsed lease, a passed deadline or a wait
//! that ended (a sleep, a callback's timeout), and when the next one lapses, passes or ends.

use starbridge_core::ids::JobId;
use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

fn job_ids(ids: Vec<String>) -> Vec<JobId> {
    ids.iter().filter_map(|id| JobId::parse(id)).collect()
}

/// Jobs with a lapsed lease, a passed deadline or an ended wait at `now`.
pub fn due_jobs(conn: &mut dyn Conn, now: Timestamp, limit: u32) -> Result<Vec<JobId>> {
    let ids = conn.query_map(
        "SELECT job_id FROM tasks WHERE status = 'running' AND lease_expires_at <= ?1 \
         UNION SELECT job_id FROM tasks WHERE status IN ('ready', 'running') AND deadline_at <= ?1 \
         UNION SELECT id FROM jobs WHERE status = 'running' AND deadline_at <= ?1 \
         UNION SELECT job_id FROM tasks WHERE status = 'running' AND held = 0 AND wake_at <= ?1 \
         LIMIT ?2",
        args![now.0, limit],
        |row| row.get::<String>(0),
    )?;
    Ok(job_ids(ids))
}

/// The next time a lease lapses, a deadline passes or a wait ends.
pub fn next_timer(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let min: Option<i64> = conn.query_value(
        "SELECT MIN(t) FROM ( \
         SELECT MIN(lease_expires_at) AS t FROM tasks WHERE status = 'running' \
         UNION ALL SELECT MIN(deadline_at) FROM tasks WHERE deadline_at IS NOT NULL AND status IN ('ready', 'running') \
         UNION ALL SELECT MIN(deadline_at) FROM jobs WHERE deadline_at IS NOT NULL AND status = 'running' \
         UNION ALL SELECT MIN(wake_at) FROM tasks WHERE status = 'running' AND held = 0 AND wake_at IS NOT NULL) AS timers",
        &[],
    )?;
    Ok(min.map(Timestamp))
}
