//! Queue settings: those of one queue, and those of a name prefix (`agent-*`), which every
//! queue starting with it follows until it is given settings of its own; which settings a queue
//! dispatches with (`settings_of`), and what the dispatcher knows of a queue to explain why a
//! task waits in it (`read_queue_states`).

use std::collections::HashMap;

use crate::ctx::WriteCtx;
use crate::notify::Notifier;
use crate::{Error, QueueChange, Result, StoredQueue, StoredQueuePrefix};
use starbridge_core::dispatch::{OnError, QueueConfig, QueueState};
use starbridge_core::limits::MAX_QUEUE_PREFIXES;
use starbridge_core::model::{JobState, TaskStatus};
use starbridge_core::routing::{QueueTarget, effective_config};
use starbridge_core::time::{Duration, Timestamp};
use starbridge_store::db::Conn;
use starbridge_store::rows::{self, QueueSearch};

use super::invalid;

/// What a queue setting or a pattern names, or why it names nothing.
fn target(name: &str) -> Result<QueueTarget<'_>> {
    QueueTarget::parse(name).map_err(|message| invalid("name", message))
}

/// The settings queue `name` dispatches with, and the prefix they come from: its own when an
/// operator gave it some, else the longest of `prefixes` it starts with, else the defaults; its
/// pause is its own (see `routing::effective_config`).
pub(crate) fn settings_of<'a>(
    name: &str,
    stored: Option<&StoredQueue>,
    prefixes: &'a [StoredQueuePrefix],
) -> (QueueConfig, Option<&'a str>) {
    let own = stored
        .filter(|queue| queue.configured)
        .map(|queue| &queue.config);
    let paused = stored.is_some_and(|queue| queue.config.paused);
    let prefixes = prefixes
        .iter()
        .map(|settings| (settings.prefix.as_str(), &settings.config));
    effective_config(name, own, paused, prefixes)
}

/// The states of queues by name, to explain why a job's ready tasks wait.
pub type QueueStates = HashMap<String, QueueState>;

/// The queues a job's ready tasks wait in, each once.
pub(crate) fn ready_queues(job: &JobState) -> Vec<String> {
    let mut queues: Vec<String> = job
        .tasks
        .iter()
        .filter(|task| task.status == TaskStatus::Ready)
        .map(|task| task.queue.clone())
        .collect();
    queues.sort_unstable();
    queues.dedup();
    queues
}

/// What the dispatcher knows about `queues` of `namespace` (whose rows are `stored`, in the
/// same order, and whose prefix settings are `prefixes`), read through `conn`: a reading
/// connection, or the writer's transaction.
pub(crate) fn read_queue_states(
    conn: &mut dyn Conn,
    namespace: &str,
    queues: Vec<String>,
    stored: Vec<Option<StoredQueue>>,
    prefixes: &[StoredQueuePrefix],
    notifier: &Notifier,
    now: Timestamp,
) -> Result<QueueStates> {
    let mut states = QueueStates::with_capacity(queues.len());
    for (queue, stored) in queues.into_iter().zip(stored) {
        let bucket = stored.as_ref().and_then(|q| q.bucket);
        let (config, _) = settings_of(&queue, stored.as_ref(), prefixes);
        let tokens = config.rate.map(|rate| rate.available(bucket, now));
        let running = if config.is_limited() {
            rows::running_count(conn, namespace, &queue)?
        } else {
            0
        };
        let last_poll = notifier.last_poll(namespace, &queue).map(|at| {
            Duration::from_millis(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX))
        });
        let paused_reason = stored.and_then(|q| q.paused_reason);
        states.insert(
            queue,
            QueueState {
                config,
                running,
                tokens,
                last_poll,
                paused_reason,
            },
        );
    }
    Ok(states)
}

/// Whether the change touches the settings (rather than the pause alone).
fn changes_settings(change: &QueueChange) -> bool {
    change.mode.is_some()
        || change.priority.is_some()
        || change.concurrency.is_some()
        || change.max_wait.is_some()
        || change.rate.is_some()
        || change.on_error.is_some()
}

/// Applies the settings of `change` to `config`, refusing values that make no sense.
fn apply_settings(config: &mut QueueConfig, change: &QueueChange) -> Result<()> {
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
    if let Some(on_error) = change.on_error {
        config.on_error = on_error;
    }
    if let Some(max_wait) = change.max_wait {
        if max_wait.as_millis() == 0 {
            return Err(invalid("max_wait", "must be longer than zero"));
        }
        config.max_wait = max_wait;
    }
    Ok(())
}

/// Changes one queue's settings or pause (creating the queue if it is new). Settings given to a
/// queue make them its own: it starts from those it followed and no prefix applies to it any
/// more. A pattern is refused: see `configure_prefix`.
pub(crate) fn configure_queue(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    change: QueueChange,
) -> Result<StoredQueue> {
    if let QueueTarget::Prefix(_) = target(name)? {
        return Err(invalid(
            "name",
            format!(
                "'{name}' is a pattern: pause and resume name one queue (settings, given with \
                 PUT, may name a pattern)"
            ),
        ));
    }
    ctx.conn.lock_key(&format!("queue\t{namespace}\t{name}"))?;
    let stored = rows::queue(ctx.conn, namespace, name)?;
    let mut queue = match stored {
        Some(queue) => queue,
        None => StoredQueue {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            config: QueueConfig::default(),
            bucket: None,
            created_at: ctx.now,
            updated_at: None,
            configured: false,
            paused_reason: None,
        },
    };
    if changes_settings(&change) && !queue.configured {
        let prefixes = ctx.queue_prefixes(namespace)?;
        queue.config = settings_of(name, Some(&queue), &prefixes).0;
        queue.configured = true;
    }
    apply_settings(&mut queue.config, &change)?;
    if let Some(paused) = change.paused {
        queue.config.paused = paused;
        // An operator's pause stops everything, compensations included; resuming clears why
        // the queue stopped itself.
        queue.paused_reason = None;
    }
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    rows::save_queue(ctx.conn, &queue, ctx.now)?;
    ctx.reads.forget_queue(namespace, name);
    queue.updated_at = Some(ctx.now);
    ctx.wakes.push((namespace.to_owned(), name.to_owned()));
    Ok(queue)
}

/// Creates or changes the settings of a name prefix (`name` is a pattern such as `agent-*`),
/// which the namespace's queues starting with it follow unless they have settings of their own.
/// Their pollers are woken.
pub(crate) fn configure_prefix(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    name: &str,
    change: QueueChange,
) -> Result<StoredQueuePrefix> {
    let QueueTarget::Prefix(prefix) = target(name)? else {
        return Err(invalid(
            "name",
            format!("'{name}' is a queue, not a pattern such as 'agent-*'"),
        ));
    };
    ctx.conn.lock_key(&format!("queue-prefixes\t{namespace}"))?;
    let mut settings = match rows::queue_prefixes::get(ctx.conn, namespace, prefix)? {
        Some(settings) => settings,
        None => {
            if rows::queue_prefixes::list(ctx.conn, namespace)?.len() >= MAX_QUEUE_PREFIXES {
                return Err(Error::Conflict(format!(
                    "namespace {namespace} has {MAX_QUEUE_PREFIXES} prefix settings, the most it \
                     may have: delete one first (DELETE /api/v1/queues/<pattern>)"
                )));
            }
            StoredQueuePrefix {
                namespace: namespace.to_owned(),
                prefix: prefix.to_owned(),
                config: QueueConfig::default(),
                created_at: ctx.now,
                updated_at: ctx.now,
            }
        }
    };
    apply_settings(&mut settings.config, &change)?;
    settings.updated_at = ctx.now;
    rows::ensure_namespace(ctx.conn, namespace, ctx.now)?;
    rows::queue_prefixes::save(ctx.conn, &settings)?;
    ctx.reads.forget_queue_prefixes(namespace);
    wake_matching(ctx, namespace, prefix)?;
    Ok(settings)
}

/// Drops settings: a pattern's (the queues that followed them follow the next longest prefix,
/// or the defaults), or a queue's own (it follows its prefix settings again, or the defaults;
/// its pause stays). Not found when there were none to drop.
pub(crate) fn drop_settings(ctx: &mut WriteCtx<'_>, namespace: &str, name: &str) -> Result<()> {
    match target(name)? {
        QueueTarget::Prefix(prefix) => {
            ctx.conn.lock_key(&format!("queue-prefixes\t{namespace}"))?;
            if !rows::queue_prefixes::delete(ctx.conn, namespace, prefix)? {
                return Err(Error::NotFound(format!(
                    "no settings for the pattern {name} in this namespace"
                )));
            }
            ctx.reads.forget_queue_prefixes(namespace);
            wake_matching(ctx, namespace, prefix)
        }
        QueueTarget::Queue(_) => {
            ctx.conn.lock_key(&format!("queue\t{namespace}\t{name}"))?;
            let mut queue = rows::queue(ctx.conn, namespace, name)?
                .ok_or_else(|| Error::NotFound(format!("queue {name} not found")))?;
            queue.config = QueueConfig {
                paused: queue.config.paused,
                ..QueueConfig::default()
            };
            queue.configured = false;
            rows::save_queue(ctx.conn, &queue, ctx.now)?;
            ctx.reads.forget_queue(namespace, name);
            ctx.wakes.push((namespace.to_owned(), name.to_owned()));
            Ok(())
        }
    }
}

/// Wakes the pollers of every queue of the namespace whose name starts with `prefix`: their
/// settings may have changed.
fn wake_matching(ctx: &mut WriteCtx<'_>, namespace: &str, prefix: &str) -> Result<()> {
    let search = QueueSearch {
        namespace: namespace.to_owned(),
        prefix: Some(prefix.to_owned()),
        limit: u32::MAX,
        ..QueueSearch::default()
    };
    for (queue, _) in rows::queue_page(ctx.conn, &search, ctx.now)? {
        ctx.wakes.push((namespace.to_owned(), queue.name));
    }
    Ok(())
}

/// A forward task on `queue` failed for good: a queue whose settings say `on_error: pause`
/// pauses (unless paused already), keeping `reason`; compensation tasks still dispatch on it.
pub(crate) fn stop_on_error(
    ctx: &mut WriteCtx<'_>,
    namespace: &str,
    queue: &str,
    reason: &str,
) -> Result<()> {
    let stored = rows::queue(ctx.conn, namespace, queue)?;
    let prefixes = ctx.queue_prefixes(namespace)?;
    let (config, _) = settings_of(queue, stored.as_ref(), &prefixes);
    if config.on_error == OnError::Pause
        && rows::stop_on_error(ctx.conn, namespace, queue, reason, ctx.now)?
    {
        ctx.reads.forget_queue(namespace, queue);
        tracing::warn!(
            namespace,
            queue,
            reason,
            "queue paused by its on_error setting"
        );
    }
    Ok(())
}
