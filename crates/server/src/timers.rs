//! The timer loop: sleeps until the next lease expiry or deadline, then lets the store handle
//! everything due. A commit may set an earlier timer (a claim starts a lease), so the store's
//! notifier wakes the loop to re-read the next due time; only due timers cost a write.

use std::time::Duration as StdDuration;

use starbridge_store::{Store, TICK_BATCH};
use tokio::sync::watch;

/// Longest sleep between checks: a guard against a missed wake-up, not the main path.
const MAX_SLEEP: StdDuration = StdDuration::from_secs(5);
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
    let Some(next) = store.next_timer().await? else {
        return Ok(MAX_SLEEP);
    };
    let now = store.now();
    if next > now {
        return Ok(StdDuration::from_millis(next.since(now).as_millis()).min(MAX_SLEEP));
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
