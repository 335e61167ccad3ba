//! Lease, deadline and wait timers: which jobs have a lapsed lease, a passed deadline or a wait
//! that ended (a sleep, a callback's timeout), and when the next one lapses, passes or ends.

use starbridge_core::ids::JobId;
use starbridge_core::time::Timestamp;

use crate::Result;
use crate::db::{Conn, Queries, args};

fn job_ids(ids: Vec<String>) -> Vec<JobId> {
    ids.iter().filter_map(|id| JobId::parse(id)).collect()
}

/// What makes a job due, each read through its own partial index (one query with `UNION`
/// lets SQLite merge the parts in job order, scanning whole tables).
const DUE: [&str; 4] = [
    "SELECT job_id FROM tasks INDEXED BY tasks_lease \
     WHERE status = 'running' AND lease_expires_at <= ?1 LIMIT ?2",
    "SELECT job_id FROM tasks INDEXED BY tasks_deadline \
     WHERE status IN ('ready', 'running') AND deadline_at <= ?1 LIMIT ?2",
    "SELECT id FROM jobs INDEXED BY jobs_deadline \
     WHERE status = 'running' AND deadline_at <= ?1 LIMIT ?2",
    "SELECT job_id FROM tasks INDEXED BY tasks_wake \
     WHERE status = 'running' AND held = 0 AND wake_at <= ?1 LIMIT ?2",
];

/// At most `limit` jobs with a lapsed lease, a passed deadline or an ended wait at `now`, each
/// once.
pub fn due_jobs(conn: &mut dyn Conn, now: Timestamp, limit: u32) -> Result<Vec<JobId>> {
    let mut ids: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for sql in DUE {
        let left = limit.saturating_sub(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        if left == 0 {
            break;
        }
        let found = conn.query_map(sql, args![now.0, left], |row| row.get::<String>(0))?;
        for id in found {
            if seen.insert(id.clone()) {
                ids.push(id);
            }
        }
    }
    Ok(job_ids(ids))
}

/// The next time a lease lapses, a deadline passes, a wait ends or a rate's parked tasks are
/// due a token, or since when a child's ending waits for its parent.
pub fn next_timer(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let min: Option<i64> = conn.query_value(
        "SELECT MIN(t) FROM ( \
         SELECT MIN(lease_expires_at) AS t FROM tasks WHERE status = 'running' AND lease_expires_at IS NOT NULL \
         UNION ALL SELECT MIN(deadline_at) FROM tasks WHERE deadline_at IS NOT NULL AND status IN ('ready', 'running') \
         UNION ALL SELECT MIN(deadline_at) FROM jobs WHERE deadline_at IS NOT NULL AND status = 'running' \
         UNION ALL SELECT MIN(wake_at) FROM tasks WHERE status = 'running' AND held = 0 AND wake_at IS NOT NULL \
         UNION ALL SELECT MIN(ended_at) FROM child_endings \
         UNION ALL SELECT MIN(wake_at) FROM rate_buckets WHERE wake_at IS NOT NULL) AS timers",
        &[],
    )?;
    Ok(min.map(Timestamp))
}
