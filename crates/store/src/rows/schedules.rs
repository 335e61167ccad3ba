//! Cron schedules: their rows, the due ones (locked, so that one node fires each), and when
//! the next one is due. When and what a schedule fires is the engine's (`schedules`), with the
//! rules of `starbridge_core::schedule`.

use serde_json::Value;
use starbridge_core::ids::JobId;
use starbridge_core::labels::Labels;
use starbridge_core::schedule::{CatchUp, Overlap};
use starbridge_core::time::Timestamp;

use super::{RowLock, labels_text, parse_json};
use crate::db::{Conn, Queries, Row, args};
use crate::{Error, Result};

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSchedule {
    pub namespace: String,
    pub name: String,
    pub workflow: String,
    pub params: Value,
    pub cron: String,
    pub timezone: String,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub paused: bool,
    pub next_fire_at: Option<Timestamp>,
    pub pending_fire_at: Option<Timestamp>,
    pub last_fire_at: Option<Timestamp>,
    pub last_job_id: Option<JobId>,
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The labels of the jobs it starts (merged over their workflow's).
    pub labels: Labels,
}

const COLUMNS: &str = "namespace, name, workflow, params, cron, timezone, overlap, catch_up, paused, \
     next_fire_at, pending_fire_at, last_fire_at, last_job_id, last_error, created_at, updated_at, labels";

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("stored schedule has a bad {what}"))
}

fn from_row(row: &mut Row) -> Result<StoredSchedule> {
    let params: String = row.get(3)?;
    let overlap: String = row.get(6)?;
    let catch_up: String = row.get(7)?;
    let last_job: Option<String> = row.get(12)?;
    Ok(StoredSchedule {
        namespace: row.get(0)?,
        name: row.get(1)?,
        workflow: row.get(2)?,
        params: serde_json::from_str(&params).map_err(|_| corrupt("params"))?,
        cron: row.get(4)?,
        timezone: row.get(5)?,
        overlap: Overlap::parse(&overlap).ok_or_else(|| corrupt("overlap"))?,
        catch_up: serde_json::from_str(&catch_up).map_err(|_| corrupt("catch_up"))?,
        paused: row.get(8)?,
        next_fire_at: row.get::<Option<i64>>(9)?.map(Timestamp),
        pending_fire_at: row.get::<Option<i64>>(10)?.map(Timestamp),
        last_fire_at: row.get::<Option<i64>>(11)?.map(Timestamp),
        last_job_id: last_job.and_then(|id| JobId::parse(&id)),
        last_error: row.get(13)?,
        created_at: Timestamp(row.get(14)?),
        updated_at: Timestamp(row.get(15)?),
        labels: parse_json(row.get(16)?)?.unwrap_or_default(),
    })
}

/// A schedule, its row locked as `lock` says (`RowLock::Wait`: until the transaction ends, to
/// change it).
pub fn get(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    lock: RowLock,
) -> Result<Option<StoredSchedule>> {
    conn.query_opt(
        &format!(
            "SELECT {COLUMNS} FROM schedules WHERE namespace = ?1 AND name = ?2{}",
            lock.clause()
        ),
        args![namespace, name],
        from_row,
    )
}

/// The schedules of a namespace, by name.
pub fn list(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredSchedule>> {
    conn.query_map(
        &format!("SELECT {COLUMNS} FROM schedules WHERE namespace = ?1 ORDER BY name"),
        args![namespace],
        from_row,
    )
}

/// Up to 500 schedules not paused with a fire due at `now` or a held fire, locked; those
/// another node is firing right now (it holds their rows) are skipped.
pub fn due(conn: &mut dyn Conn, now: Timestamp) -> Result<Vec<StoredSchedule>> {
    conn.query_map(
        &format!(
            "SELECT {COLUMNS} FROM schedules WHERE paused = 0 AND \
             (next_fire_at <= ?1 OR pending_fire_at IS NOT NULL) LIMIT 500 FOR UPDATE SKIP LOCKED"
        ),
        args![now.0],
        from_row,
    )
}

/// Inserts a schedule, or replaces every column of the stored one but `created_at`.
pub fn save(conn: &mut dyn Conn, schedule: &StoredSchedule) -> Result<()> {
    conn.execute(
        "INSERT INTO schedules (namespace, name, workflow, params, cron, timezone, overlap, catch_up, \
         paused, next_fire_at, pending_fire_at, last_fire_at, last_job_id, last_error, created_at, \
         updated_at, labels) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17) \
         ON CONFLICT (namespace, name) DO UPDATE SET workflow = excluded.workflow, \
         params = excluded.params, cron = excluded.cron, timezone = excluded.timezone, \
         overlap = excluded.overlap, catch_up = excluded.catch_up, paused = excluded.paused, \
         next_fire_at = excluded.next_fire_at, pending_fire_at = excluded.pending_fire_at, \
         last_fire_at = excluded.last_fire_at, last_job_id = excluded.last_job_id, \
         last_error = excluded.last_error, updated_at = excluded.updated_at, \
         labels = excluded.labels",
        args![
            schedule.namespace,
            schedule.name,
            schedule.workflow,
            schedule.params.to_string(),
            schedule.cron,
            schedule.timezone,
            schedule.overlap.as_str(),
            serde_json::to_string(&schedule.catch_up).unwrap_or_default(),
            schedule.paused,
            schedule.next_fire_at.map(|t| t.0),
            schedule.pending_fire_at.map(|t| t.0),
            schedule.last_fire_at.map(|t| t.0),
            schedule.last_job_id.as_ref().map(JobId::as_str),
            schedule.last_error,
            schedule.created_at.0,
            schedule.updated_at.0,
            labels_text(&schedule.labels),
        ],
    )?;
    Ok(())
}

/// Deletes a schedule; false when there was none.
pub fn delete(conn: &mut dyn Conn, namespace: &str, name: &str) -> Result<bool> {
    let deleted = conn.execute(
        "DELETE FROM schedules WHERE namespace = ?1 AND name = ?2",
        args![namespace, name],
    )?;
    Ok(deleted > 0)
}

/// The next time a schedule needs the timer: the earliest fire of a schedule not paused, or
/// the held fire of one whose last job has finished.
pub fn next_due(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let at: Option<i64> = conn.query_value(
        "SELECT MIN(t) FROM ( \
             SELECT MIN(next_fire_at) AS t FROM schedules WHERE paused = 0 \
             UNION ALL SELECT MIN(s.pending_fire_at) FROM schedules s JOIN jobs j ON j.id = s.last_job_id \
             WHERE s.paused = 0 AND s.pending_fire_at IS NOT NULL \
             AND j.status IN ('succeeded', 'failed', 'compensation_failed', 'cancelled', 'timed_out')) AS due",
        &[],
    )?;
    Ok(at.map(Timestamp))
}
