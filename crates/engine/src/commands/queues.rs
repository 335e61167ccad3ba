//! Changing a queue's settings.

use crate::ctx::WriteCtx;
use crate::{QueueChange, Result, StoredQueue};
use starbridge_core::definition::check_queue_name;
use starbridge_core::dispatch::QueueConfig;
use starbridge_store::db::Conn;
use starbridge_store::rows;

use super::invalid;

pub(crate) fn configure_queue(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    change: QueueChange,
) -> Result<StoredQueue> {
    check_queue_name(name).map_err(|message| invalid("name", message))?;
    ctx.conn.lock_key(&format!("queue\t{namespace}\t{name}"))?;
    let mut queue = rows::queue(ctx.conn, namespace, name)?.unwrap_or_else(|| StoredQueue {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        config: QueueConfig::default(),
        bucket: None,
        created_at: ctx.now,
        updated_at: None,
    });
    let config = &mut queue.config;
    if let Some(mode) = change.mode {
        config.mode = mode;
    }
    if let Some(priority) = change.priority {
        config.priority = priority;
    }
    if let Some(concurrency) = change.concurrency {
        if concurrency == Some(0) {
            return Err(invalid(
                "concurrency",
                "must be at least 1 (pause the queue to stop it)",
            ));
        }
        config.concurrency = concurrency;
    }
    if let Some(paused) = change.paused {
        config.paused = paused;
    }
    if let Some(rate) = change.rate {
        if let Some(limit) = rate
            && (limit.tokens == 0 || limit.per.as_millis() == 0)
        {
            return Err(invalid(
                "rate",
                "needs at least 1 token per a duration longer than zero",
            ));
        }
        config.rate = rate;
    }
    if let Some(max_wait) = change.max_wait {
        if max_wait.as_millis() == 0 {
            return Err(invalid("max_wait", "must be longer than zero"));
        }
        config.max_wait = max_wait;
    }
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    rows::save_queue(ctx.conn, &queue, ctx.now)?;
    queue.updated_at = Some(ctx.now);
    ctx.wakes.push((namespace.to_owned(), name.to_owned()));
    Ok(queue)
}
