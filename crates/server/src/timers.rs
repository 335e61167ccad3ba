//! The timer loop: sleeps until the next lease expiry or deadline, then lets the store handle
//! everything due. A commit may set an earlier timer (a claim starts a lease), so the store's
//! notifier wakes the loop to re-read the next due time; only due timers cost a write. On a
//! shared (PostgreSQL) store other nodes set timers too, which this node learns about within
//! `SHARED_MAX_SLEEP`; the store's row locks make sure each due item is handled by one node.
//!
//! Also here: the pruner, which deletes finished jobs past their retention now and then.

use std::time::Duration as StdDuration;

use starbridge_store::{PRUNE_BATCH, Store, TICK_BATCH};
use tokio::sync::watch;

/// Longest sleep between checks: a guard against a missed wake-up, not the main path.
const MAX_SLEEP: StdDuration = StdDuration::from_secs(5);
/// Longest sleep between checks when other nodes may set earlier timers.
const SHARED_MAX_SLEEP: StdDuration = StdDuration::from_secs(1);
/// How often the pruner looks for finished jobs past their retention.
const PRUNE_EVERY: StdDuration = StdDuration::from_secs(60);
/// Pause after a database error, or when a timer stays due after handling.
const PAUSE: StdDuration = StdDuration::from_secs(1);

pub async fn run_timers(store: Store, mut stop: watch::Receiver<bool>) {
    let timers_changed = store.notifier().timers();
    loop {
        if *stop.borrow() {
            return;
        }
        let changed = timers_changed.notified();
        let sleep = match step(&store).await {
            Ok(sleep) => sleep,
            Err(error) => {
                tracing::warn!(%error, "timer loop: database error, retrying");
                PAUSE
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(sleep) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Handles due timers if any, and returns how long to sleep until the next one.
async fn step(store: &Store) -> starbridge_store::Result<StdDuration> {
    let max_sleep = if store.is_shared() {
        SHARED_MAX_SLEEP
    } else {
        MAX_SLEEP
    };
    let Some(next) = store.next_timer().await? else {
        return Ok(max_sleep);
    };
    let now = store.now();
    if next > now {
        return Ok(StdDuration::from_millis(next.since(now).as_millis()).min(max_sleep));
    }
    while store.tick().await? >= TICK_BATCH {}
    match store.next_timer().await? {
        Some(next) if next <= store.now() => {
            // Everything due was just handled; a timer still due is one the state machine
            // cannot act on. Do not spin on it.
            tracing::warn!(due_at = next.0, "a timer stays due after handling; pausing");
            Ok(PAUSE)
        }
        _ => Ok(StdDuration::ZERO),
    }
}

/// Deletes finished jobs past the store's retention every `PRUNE_EVERY`, until `stop`.
pub async fn run_pruner(store: Store, mut stop: watch::Receiver<bool>) {
    loop {
        loop {
            match store.prune().await {
                Ok(pruned) if pruned >= PRUNE_BATCH as usize => continue,
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, "finished jobs past their retention deleted"),
                Err(error) => tracing::warn!(%error, "pruner: database error"),
            }
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(PRUNE_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}
