//! Queues: their settings (made on first use, changed by an operator) and the token bucket of
//! a rate-limited queue, stored on its row after each claim.

use starbridge_core::dispatch::{Bucket, QueueConfig, QueueMode, RateLimit};
use starbridge_core::time::{Duration, Timestamp};

use super::enum_column;
use crate::db::{Conn, Queries, Row, args};
use crate::{Result, StoredQueue};

const QUEUE_COLUMNS: &str = "name, mode, priority, concurrency, paused, max_wait_ms, created_at, \
     updated_at, rate_tokens, rate_per_ms, bucket_tokens, bucket_at";

struct RawQueue {
    name: String,
    mode: String,
    priority: i32,
    concurrency: Option<u32>,
    paused: bool,
    max_wait_ms: i64,
    created_at: i64,
    updated_at: Option<i64>,
    rate_tokens: Option<u32>,
    rate_per_ms: Option<i64>,
    bucket_tokens: Option<f64>,
    bucket_at: Option<i64>,
}

fn queue_from_row(row: &mut Row) -> Result<RawQueue> {
    Ok(RawQueue {
        name: row.get(0)?,
        mode: row.get(1)?,
        priority: row.get(2)?,
        concurrency: row.get(3)?,
        paused: row.get(4)?,
        max_wait_ms: row.get(5)?,
        created_at: row.get(6)?,
        updated_at: row.get(7)?,
        rate_tokens: row.get(8)?,
        rate_per_ms: row.get(9)?,
        bucket_tokens: row.get(10)?,
        bucket_at: row.get(11)?,
    })
}

fn into_queue(namespace: &str, raw: RawQueue) -> Result<StoredQueue> {
    Ok(StoredQueue {
        namespace: namespace.to_owned(),
        name: raw.name,
        config: QueueConfig {
            mode: enum_column(raw.mode, QueueMode::parse)?,
            priority: raw.priority,
            concurrency: raw.concurrency,
            paused: raw.paused,
            max_wait: Duration::from_millis(u64::try_from(raw.max_wait_ms).unwrap_or(0)),
            rate: match (raw.rate_tokens, raw.rate_per_ms) {
                (Some(tokens), Some(per)) => Some(RateLimit {
                    tokens,
                    per: Duration::from_millis(u64::try_from(per).unwrap_or(0)),
                }),
                _ => None,
            },
        },
        bucket: match (raw.bucket_tokens, raw.bucket_at) {
            (Some(tokens), Some(at)) => Some(Bucket {
                tokens,
                at: Timestamp(at),
            }),
            _ => None,
        },
        created_at: Timestamp(raw.created_at),
        updated_at: raw.updated_at.map(Timestamp),
    })
}

/// A queue's settings; `None` when nobody created or configured it.
pub fn queue(conn: &mut dyn Conn, namespace: &str, name: &str) -> Result<Option<StoredQueue>> {
    conn.query_opt(
        &format!("SELECT {QUEUE_COLUMNS} FROM queues WHERE namespace = ?1 AND name = ?2"),
        args![namespace, name],
        queue_from_row,
    )?
    .map(|raw| into_queue(namespace, raw))
    .transpose()
}

pub fn list_queues(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredQueue>> {
    conn.query_map(
        &format!("SELECT {QUEUE_COLUMNS} FROM queues WHERE namespace = ?1 ORDER BY name"),
        args![namespace],
        queue_from_row,
    )?
    .into_iter()
    .map(|raw| into_queue(namespace, raw))
    .collect()
}

pub fn save_queue(conn: &mut dyn Conn, queue: &StoredQueue, now: Timestamp) -> Result<()> {
    let config = &queue.config;
    conn.execute(
        "INSERT INTO queues (namespace, name, created_at, mode, priority, concurrency, paused, max_wait_ms, \
         updated_at, rate_tokens, rate_per_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT (namespace, name) DO UPDATE SET \
         mode = excluded.mode, priority = excluded.priority, concurrency = excluded.concurrency, \
         paused = excluded.paused, max_wait_ms = excluded.max_wait_ms, updated_at = excluded.updated_at, \
         rate_tokens = excluded.rate_tokens, rate_per_ms = excluded.rate_per_ms",
        args![
            queue.namespace,
            queue.name,
            queue.created_at.0,
            config.mode.as_str(),
            config.priority,
            config.concurrency,
            config.paused,
            config.max_wait.as_millis(),
            now.0,
            config.rate.map(|rate| rate.tokens),
            config.rate.map(|rate| rate.per.as_millis()),
        ],
    )?;
    Ok(())
}

/// Stores a rate-limited queue's token bucket after a claim took tokens from it.
pub fn save_bucket(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    bucket: Bucket,
) -> Result<()> {
    conn.execute(
        "UPDATE queues SET bucket_tokens = ?3, bucket_at = ?4 WHERE namespace = ?1 AND name = ?2",
        args![namespace, queue, bucket.tokens, bucket.at.0],
    )?;
    Ok(())
}

pub fn ensure_queue(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    now: Timestamp,
) -> Result<()> {
    conn.execute(
        "INSERT INTO queues (namespace, name, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
        args![namespace, queue, now.0],
    )?;
    Ok(())
}
