//! Signals sent to jobs: kept until a step takes them (`consumed_by`), and afterwards for their
//! dedupe id, until the job is pruned.

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Job, Signal};
use starbridge_core::time::Timestamp;

use super::{json_text, parse_json};
use crate::Result;
use crate::db::{Conn, Queries, args};

/// The job's signals no step has taken yet, oldest first (no query for a job that never
/// received one).
pub fn pending_signals(conn: &mut dyn Conn, job: &Job) -> Result<Vec<Signal>> {
    if job.signals_received == 0 {
        return Ok(Vec::new());
    }
    let rows = conn.query_map(
        "SELECT seq, name, payload, dedupe_id, sender, received_at FROM signals \
         WHERE job_id = ?1 AND consumed_by IS NULL ORDER BY seq",
        args![job.id.as_str()],
        |row| {
            Ok((
                row.get::<u32>(0)?,
                row.get::<String>(1)?,
                row.get::<String>(2)?,
                row.get::<Option<String>>(3)?,
                row.get::<String>(4)?,
                row.get::<i64>(5)?,
            ))
        },
    )?;
    rows.into_iter()
        .map(|(seq, name, payload, id, sender, received_at)| {
            Ok(Signal {
                seq,
                name,
                payload: parse_json(Some(payload))?.unwrap_or_default(),
                id,
                sender,
                received_at: Timestamp(received_at),
            })
        })
        .collect()
}

/// Keeps a signal the job received.
pub fn insert_signal(conn: &mut dyn Conn, job: &Job, signal: &Signal) -> Result<()> {
    conn.execute(
        "INSERT INTO signals (job_id, seq, namespace, name, payload, dedupe_id, sender, received_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        args![
            job.id.as_str(),
            signal.seq,
            job.namespace,
            signal.name,
            json_text(&signal.payload),
            signal.id,
            signal.sender,
            signal.received_at.0,
        ],
    )?;
    Ok(())
}

/// Records that `task` took the signal `seq`.
pub fn consume_signal(conn: &mut dyn Conn, job: &JobId, seq: u32, task: &TaskId) -> Result<()> {
    conn.execute(
        "UPDATE signals SET consumed_by = ?1 WHERE job_id = ?2 AND seq = ?3",
        args![task.as_str(), job.as_str(), seq],
    )?;
    Ok(())
}

/// Whether the job already received a signal with this dedupe id.
pub fn signal_seen(conn: &mut dyn Conn, job: &JobId, dedupe_id: &str) -> Result<bool> {
    let found: Option<u32> = conn.query_opt(
        "SELECT seq FROM signals WHERE job_id = ?1 AND dedupe_id = ?2",
        args![job.as_str(), dedupe_id],
        |row| row.get(0),
    )?;
    Ok(found.is_some())
}
