//! Queue prefix settings: what an operator gave every queue whose name starts with a prefix
//! (the pattern `agent-*`), one row per namespace and prefix.

use starbridge_core::dispatch::{OnError, QueueConfig, QueueMode, RateLimit};
use starbridge_core::time::{Duration, Timestamp};

use super::enum_column;
use crate::db::{Conn, Queries, Row, args};
use crate::{Result, StoredQueuePrefix};

const COLUMNS: &str = "prefix, mode, priority, concurrency, max_wait_ms, rate_tokens, rate_per_ms, \
     created_at, updated_at, on_error";

fn from_row(namespace: &str, row: &mut Row) -> Result<StoredQueuePrefix> {
    let mode: String = row.get(1)?;
    let max_wait_ms: i64 = row.get(4)?;
    let rate_tokens: Option<u32> = row.get(5)?;
    let rate_per_ms: Option<i64> = row.get(6)?;
    let on_error: String = row.get(9)?;
    Ok(StoredQueuePrefix {
        namespace: namespace.to_owned(),
        prefix: row.get(0)?,
        config: QueueConfig {
            mode: enum_column(mode, QueueMode::parse)?,
            priority: row.get(2)?,
            concurrency: row.get(3)?,
            paused: false,
            max_wait: Duration::from_millis(u64::try_from(max_wait_ms).unwrap_or(0)),
            rate: rate_tokens.zip(rate_per_ms).map(|(tokens, per)| RateLimit {
                tokens,
                per: Duration::from_millis(u64::try_from(per).unwrap_or(0)),
            }),
            on_error: enum_column(on_error, OnError::parse)?,
        },
        created_at: Timestamp(row.get(7)?),
        updated_at: Timestamp(row.get(8)?),
    })
}

/// Every prefix setting of a namespace, by prefix.
pub fn list(conn: &mut dyn Conn, namespace: &str) -> Result<Vec<StoredQueuePrefix>> {
    conn.query_map(
        &format!("SELECT {COLUMNS} FROM queue_prefixes WHERE namespace = ?1 ORDER BY prefix"),
        args![namespace],
        |row| from_row(namespace, row),
    )
}

/// The settings of one prefix, if an operator gave it some.
pub fn get(
    conn: &mut dyn Conn,
    namespace: &str,
    prefix: &str,
) -> Result<Option<StoredQueuePrefix>> {
    conn.query_opt(
        &format!("SELECT {COLUMNS} FROM queue_prefixes WHERE namespace = ?1 AND prefix = ?2"),
        args![namespace, prefix],
        |row| from_row(namespace, row),
    )
}

/// Creates or replaces a prefix's settings.
pub fn save(conn: &mut dyn Conn, settings: &StoredQueuePrefix) -> Result<()> {
    let config = &settings.config;
    conn.execute(
        "INSERT INTO queue_prefixes (namespace, prefix, mode, priority, concurrency, max_wait_ms, \
         rate_tokens, rate_per_ms, created_at, updated_at, on_error) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT (namespace, prefix) DO UPDATE SET \
         mode = excluded.mode, priority = excluded.priority, concurrency = excluded.concurrency, \
         max_wait_ms = excluded.max_wait_ms, rate_tokens = excluded.rate_tokens, \
         rate_per_ms = excluded.rate_per_ms, updated_at = excluded.updated_at, \
         on_error = excluded.on_error",
        args![
            settings.namespace,
            settings.prefix,
            config.mode.as_str(),
            config.priority,
            config.concurrency,
            config.max_wait.as_millis(),
            config.rate.map(|rate| rate.tokens),
            config.rate.map(|rate| rate.per.as_millis()),
            settings.created_at.0,
            settings.updated_at.0,
            config.on_error.as_str(),
        ],
    )?;
    Ok(())
}

/// Deletes a prefix's settings; whether it had any.
pub fn delete(conn: &mut dyn Conn, namespace: &str, prefix: &str) -> Result<bool> {
    let deleted = conn.execute(
        "DELETE FROM queue_prefixes WHERE namespace = ?1 AND prefix = ?2",
        args![namespace, prefix],
    )?;
    Ok(deleted > 0)
}
