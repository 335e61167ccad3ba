//! Queues: their settings (made on first use, changed by an operator) and the token bucket of
//! a rate-limited queue, stored on its row after each claim; pages of them in name order, each
//! with what it holds now.

use starbridge_core::dispatch::{Bucket, OnError, QueueConfig, QueueMode, RateLimit};
use starbridge_core::time::{Duration, Timestamp};

use super::enum_column;
use crate::db::{Conn, Queries, Row, Value as SqlValue, args, bind};
use crate::stats::QueueStats;
use crate::{Result, StoredQueue};

const QUEUE_COLUMNS: &str = "name, mode, priority, concurrency, paused, max_wait_ms, created_at, \
     updated_at, rate_tokens, rate_per_ms, bucket_tokens, bucket_at, configured, on_error, \
     paused_reason";

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
    configured: bool,
    on_error: String,
    paused_reason: Option<String>,
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
        configured: row.get(12)?,
        on_error: row.get(13)?,
        paused_reason: row.get(14)?,
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
            on_error: enum_column(raw.on_error, OnError::parse)?,
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
        configured: raw.configured,
        paused_reason: raw.paused_reason,
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

/// Which queues of a namespace to list, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSearch {
    pub namespace: String,
    /// Only queues whose name starts with this text.
    pub prefix: Option<String>,
    /// Only queues whose name holds this text, in any case.
    pub text: Option<String>,
    /// Only queues after this name (the last of the previous page).
    pub after: Option<String>,
    pub limit: u32,
}

/// What a queue holds now, counted from the partial indexes of ready and running tasks, so a
/// page costs its queues' backlog, not the history: the count and the oldest claimable ready
/// task each read the queue's ready tasks once. Placeholder `?1` is the time now.
const STATS_COLUMNS: &str = "\
    (SELECT COUNT(*) FROM tasks INDEXED BY tasks_dispatch WHERE status = 'ready' AND held = 0 \
        AND namespace = queues.namespace AND queue = queues.name), \
    (SELECT MIN(available_at) FROM tasks INDEXED BY tasks_dispatch WHERE status = 'ready' AND held = 0 \
        AND namespace = queues.namespace AND queue = queues.name AND available_at <= ?1), \
    (SELECT COUNT(*) FROM tasks INDEXED BY tasks_running WHERE status = 'running' AND queue <> '' \
        AND namespace = queues.namespace AND queue = queues.name)";

/// Queues with what they hold at `now`: those `condition` selects (its placeholders start at
/// `?2`; `values` bind them), in name order, at most `limit`.
fn lines(
    conn: &mut dyn Conn,
    namespace: &str,
    condition: &str,
    mut values: Vec<SqlValue>,
    limit: u32,
    now: Timestamp,
) -> Result<Vec<(StoredQueue, QueueStats)>> {
    values.insert(0, now.0.into());
    values.push(i64::from(limit).into());
    let sql = format!(
        "SELECT {QUEUE_COLUMNS}, {STATS_COLUMNS} FROM queues WHERE {condition} \
         ORDER BY name LIMIT ?{}",
        values.len()
    );
    let width = QUEUE_COLUMNS.split(',').count();
    conn.query_map(&sql, &bind(&values), |row| {
        let queue = queue_from_row(row)?;
        let ready: i64 = row.get(width)?;
        let oldest: Option<i64> = row.get(width + 1)?;
        let running: i64 = row.get(width + 2)?;
        let stats = QueueStats {
            ready: u64::try_from(ready).unwrap_or(0),
            running: u64::try_from(running).unwrap_or(0),
            oldest_ready_age: oldest.map_or(Duration(0), |at| now.since(Timestamp(at))),
        };
        Ok((queue, stats))
    })?
    .into_iter()
    .map(|(raw, stats)| Ok((into_queue(namespace, raw)?, stats)))
    .collect()
}

/// A page of a namespace's queues in name order, each with what it holds at `now`.
pub fn queue_page(
    conn: &mut dyn Conn,
    search: &QueueSearch,
    now: Timestamp,
) -> Result<Vec<(StoredQueue, QueueStats)>> {
    let mut values: Vec<SqlValue> = vec![search.namespace.clone().into()];
    let mut condition = String::from("namespace = ?2");
    if let Some(after) = &search.after {
        values.push(after.clone().into());
        condition.push_str(&format!(" AND name > ?{}", values.len() + 1));
    }
    if let Some(prefix) = search.prefix.as_deref().filter(|p| !p.is_empty()) {
        // A comparison of the leading characters: right whatever the database's collation.
        let length = i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX);
        values.push(length.into());
        values.push(prefix.to_owned().into());
        let at = values.len();
        condition.push_str(&format!(" AND substr(name, 1, ?{at}) = ?{}", at + 1));
    }
    if let Some(text) = search.text.as_deref().filter(|t| !t.is_empty()) {
        values.push(format!("%{}%", like_escaped(&text.to_lowercase())).into());
        condition.push_str(&format!(
            " AND lower(name) LIKE ?{} ESCAPE '\\'",
            values.len() + 1
        ));
    }
    lines(
        conn,
        &search.namespace,
        &condition,
        values,
        search.limit,
        now,
    )
}

/// One queue with what it holds at `now`; `None` when the namespace has no such queue.
pub fn queue_line(
    conn: &mut dyn Conn,
    namespace: &str,
    name: &str,
    now: Timestamp,
) -> Result<Option<(StoredQueue, QueueStats)>> {
    let values = vec![namespace.to_owned().into(), name.to_owned().into()];
    let condition = "namespace = ?2 AND name = ?3";
    Ok(lines(conn, namespace, condition, values, 1, now)?.pop())
}

/// `text` with the characters `LIKE` gives a meaning (`%`, `_` and the escape `\`) escaped.
fn like_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

pub fn save_queue(conn: &mut dyn Conn, queue: &StoredQueue, now: Timestamp) -> Result<()> {
    let config = &queue.config;
    conn.execute(
        "INSERT INTO queues (namespace, name, created_at, mode, priority, concurrency, paused, max_wait_ms, \
         updated_at, rate_tokens, rate_per_ms, configured, on_error, paused_reason) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
         ON CONFLICT (namespace, name) DO UPDATE SET \
         mode = excluded.mode, priority = excluded.priority, concurrency = excluded.concurrency, \
         paused = excluded.paused, max_wait_ms = excluded.max_wait_ms, updated_at = excluded.updated_at, \
         rate_tokens = excluded.rate_tokens, rate_per_ms = excluded.rate_per_ms, \
         configured = excluded.configured, on_error = excluded.on_error, \
         paused_reason = excluded.paused_reason",
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
            queue.configured,
            config.on_error.as_str(),
            queue.paused_reason,
        ],
    )?;
    Ok(())
}

/// Pauses a queue that is not paused yet because a task on it failed for good (`on_error:
/// pause`), saying why; false when it was paused already (the first reason stays).
pub fn stop_on_error(
    conn: &mut dyn Conn,
    namespace: &str,
    queue: &str,
    reason: &str,
    now: Timestamp,
) -> Result<bool> {
    let stopped = conn.execute(
        "UPDATE queues SET paused = 1, paused_reason = ?3, updated_at = ?4 \
         WHERE namespace = ?1 AND name = ?2 AND paused = 0",
        args![namespace, queue, reason, now.0],
    )?;
    Ok(stopped > 0)
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
