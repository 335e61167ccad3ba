//! The webhook outbox: one row per message to a subscription, with its delivery history. When
//! a message is written, sent again, leased to a node or given up is the engine's (`webhooks`).

use serde_json::Value;
use starbridge_core::model::{Job, JobStatus};
use starbridge_core::time::Timestamp;

use super::enum_column;
use crate::Result;
use crate::db::{Conn, Queries, Row, args};

/// One message of the outbox, with its delivery history so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub id: i64,
    pub webhook_id: String,
    pub job_id: String,
    pub status: JobStatus,
    pub payload: Value,
    pub created_at: Timestamp,
    pub attempts: u32,
    pub next_attempt_at: Option<Timestamp>,
    pub delivered_at: Option<Timestamp>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
}

/// A delivery due now, with where and how to send it.
#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub delivery: Delivery,
    pub url: String,
    pub secret: String,
}

const COLUMNS: &str = "d.id, d.webhook_id, d.job_id, d.status, d.payload, d.created_at, \
     d.attempts, d.next_attempt_at, d.delivered_at, d.last_status, d.last_error";

fn from_row(row: &mut Row) -> Result<Delivery> {
    let payload: String = row.get(4)?;
    Ok(Delivery {
        id: row.get(0)?,
        webhook_id: row.get(1)?,
        job_id: row.get(2)?,
        status: enum_column(row.get(3)?, JobStatus::parse)?,
        payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
        created_at: Timestamp(row.get(5)?),
        attempts: row.get(6)?,
        next_attempt_at: row.get::<Option<i64>>(7)?.map(Timestamp),
        delivered_at: row.get::<Option<i64>>(8)?.map(Timestamp),
        last_status: row.get(9)?,
        last_error: row.get(10)?,
    })
}

/// Writes a message about `job` (its namespace, id and status) to a subscription, due at once.
pub fn insert(
    conn: &mut dyn Conn,
    webhook: &str,
    job: &Job,
    payload: &Value,
    now: Timestamp,
) -> Result<()> {
    conn.execute(
        "INSERT INTO webhook_deliveries (webhook_id, namespace, job_id, status, payload, \
         created_at, attempts, next_attempt_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?6)",
        args![
            webhook,
            job.namespace,
            job.id.as_str(),
            job.status.as_str(),
            payload.to_string(),
            now.0,
        ],
    )?;
    Ok(())
}

/// A subscription's deliveries, newest first.
pub fn of_webhook(conn: &mut dyn Conn, webhook: &str, limit: u32) -> Result<Vec<Delivery>> {
    conn.query_map(
        &format!(
            "SELECT {COLUMNS} FROM webhook_deliveries d WHERE d.webhook_id = ?1 \
             ORDER BY d.id DESC LIMIT ?2"
        ),
        args![webhook, limit],
        from_row,
    )
}

/// Deletes a subscription's messages still to send (those sent or given up stay).
pub fn delete_pending(conn: &mut dyn Conn, webhook: &str) -> Result<()> {
    conn.execute(
        "DELETE FROM webhook_deliveries WHERE webhook_id = ?1 AND next_attempt_at IS NOT NULL",
        args![webhook],
    )?;
    Ok(())
}

/// Up to `limit` deliveries whose next attempt is due at `now`, oldest first, locked; those
/// another node holds are skipped.
pub fn due(conn: &mut dyn Conn, now: Timestamp, limit: u32) -> Result<Vec<Delivery>> {
    conn.query_map(
        &format!(
            "SELECT {COLUMNS} FROM webhook_deliveries d \
             WHERE d.next_attempt_at IS NOT NULL AND d.next_attempt_at <= ?1 \
             ORDER BY d.next_attempt_at, d.id LIMIT ?2 FOR UPDATE SKIP LOCKED"
        ),
        args![now.0, limit],
        from_row,
    )
}

/// Moves a delivery's next attempt to `at`.
pub fn postpone(conn: &mut dyn Conn, id: i64, at: Timestamp) -> Result<()> {
    conn.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = ?2 WHERE id = ?1",
        args![id, at.0],
    )?;
    Ok(())
}

/// A delivery with its subscription's URL and secret; `None` when the subscription is gone.
pub fn addressed(conn: &mut dyn Conn, delivery: Delivery) -> Result<Option<DueDelivery>> {
    let target = conn.query_opt(
        "SELECT url, secret FROM webhooks WHERE id = ?1",
        args![delivery.webhook_id],
        |row| Ok((row.get::<String>(0)?, row.get::<String>(1)?)),
    )?;
    Ok(target.map(|(url, secret)| DueDelivery {
        delivery,
        url,
        secret,
    }))
}

/// When the next attempt of any delivery is due.
pub fn next_attempt(conn: &mut dyn Conn) -> Result<Option<Timestamp>> {
    let at: Option<i64> = conn.query_value(
        "SELECT MIN(next_attempt_at) FROM webhook_deliveries WHERE next_attempt_at IS NOT NULL",
        &[],
    )?;
    Ok(at.map(Timestamp))
}

/// How many attempts a delivery has had; `None` when it is gone.
pub fn attempts(conn: &mut dyn Conn, id: i64) -> Result<Option<u32>> {
    conn.query_opt(
        "SELECT attempts FROM webhook_deliveries WHERE id = ?1",
        args![id],
        |row| row.get(0),
    )
}

/// Records the attempt that delivered it (the receiver answered `status`) at `at`: it is done.
pub fn record_delivered(
    conn: &mut dyn Conn,
    id: i64,
    attempts: u32,
    at: Timestamp,
    status: u16,
) -> Result<()> {
    conn.execute(
        "UPDATE webhook_deliveries SET attempts = ?2, next_attempt_at = NULL, \
         delivered_at = ?3, last_status = ?4, last_error = NULL WHERE id = ?1",
        args![id, attempts, at.0, status],
    )?;
    Ok(())
}

/// Records an attempt that was not sent, and gives the delivery up.
pub fn record_refused(conn: &mut dyn Conn, id: i64, attempts: u32, error: &str) -> Result<()> {
    conn.execute(
        "UPDATE webhook_deliveries SET attempts = ?2, next_attempt_at = NULL, \
         last_status = NULL, last_error = ?3 WHERE id = ?1",
        args![id, attempts, error],
    )?;
    Ok(())
}

/// Records a failed attempt: the next is due at `next` (`None`: given up).
pub fn record_failed(
    conn: &mut dyn Conn,
    id: i64,
    attempts: u32,
    next: Option<Timestamp>,
    status: Option<u16>,
    error: &str,
) -> Result<()> {
    conn.execute(
        "UPDATE webhook_deliveries SET attempts = ?2, next_attempt_at = ?3, \
         last_status = ?4, last_error = ?5 WHERE id = ?1",
        args![id, attempts, next.map(|t| t.0), status, error],
    )?;
    Ok(())
}
