//! The timer loop: sleeps until the next lease expiry, deadline or schedule fire, then lets the
//! engine handle everything due. A commit may set an earlier timer (a claim starts a lease), so the engine's
//! notifier wakes the loop to re-read the next due time, once for the commits of the next few
//! milliseconds (`GATHER_COMMITS`); only due timers cost a write. On a
//! shared (PostgreSQL) database other nodes set timers too, which this node learns about within
//! `SHARED_MAX_SLEEP`; the store's row locks make sure each due item is handled by one node.

use std::time::Duration as StdDuration;

use crate::{Engine, TICK_BATCH};
use tokio::sync::watch;

/// Longest sleep between checks: a guard against a missed wake-up, not the main path.
const MAX_SLEEP: StdDuration = StdDuration::from_secs(5);
/// Longest sleep between checks when other nodes may set earlier timers.
const SHARED_MAX_SLEEP: StdDuration = StdDuration::from_secs(1);
/// Pause after a database error, or when a timer stays due after handling.
const PAUSE: StdDuration = StdDuration::from_secs(1);
/// How long the loop lets commits gather after one woke it before it reads the next due time
/// again: a busy node commits hundreds of times a second, and one read serves them all. A timer
/// a commit set to fall due sooner is handled this much late at most.
const GATHER_COMMITS: StdDuration = StdDuration::from_millis(5);

/// Handles due timers until `stop`.
pub async fn run_timers(store: Engine, mut stop: watch::Receiver<bool>) {
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
        let next_due = tokio::time::Instant::now() + sleep;
        tokio::select! {
            () = changed => {
                let gathered = tokio::time::Instant::now() + GATHER_COMMITS;
                tokio::select! {
                    () = tokio::time::sleep_until(gathered.min(next_due)) => {}
                    _ = stop.changed() => return,
                }
            }
            () = tokio::time::sleep_until(next_due) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Handles due timers if any, and returns how long to sleep until the next one.
async fn step(store: &Engine) -> crate::Result<StdDuration> {
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
