//! The timer loop: sleeps until the next lease expiry or deadline, then lets the store handle
//! everything due. Every commit may have set an earlier timer, so the store's notifier wakes the
//! loop to re-read the next due time.

use std::time::Duration as StdDuration;

use starbridge_store::Store;
use tokio::sync::watch;

/// Longest sleep between checks, a guard against a missed wake-up; not the main path.
const MAX_SLEEP: StdDuration = StdDuration::from_secs(5);
/// Back-off after a database error.
const ERROR_PAUSE: StdDuration = StdDuration::from_secs(1);

pub async fn run_timers(store: Store, mut stop: watch::Receiver<bool>) {
    let timers_changed = store.notifier().timers();
    loop {
        if *stop.borrow() {
            return;
        }
        let changed = timers_changed.notified();
        let sleep = match next_sleep(&store).await {
            Ok(sleep) => sleep,
            Err(error) => {
                tracing::warn!(%error, "timer loop: database error, retrying");
                ERROR_PAUSE
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(sleep) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Handles what is due and returns how long to sleep until the next timer.
async fn next_sleep(store: &Store) -> starbridge_store::Result<StdDuration> {
    loop {
        let moved = store.tick().await?;
        if moved < starbridge_store::TICK_BATCH {
            break;
        }
    }
    let now = store.now();
    Ok(match store.next_timer().await? {
        Some(next) if next <= now => {
            // Everything due was just handled; a timer still due is one the state machine
            // cannot act on. Do not spin on it.
            tracing::warn!(due_at = next.0, "a timer stays due after handling; pausing");
            ERROR_PAUSE
        }
        Some(next) => StdDuration::from_millis(next.since(now).as_millis()).min(MAX_SLEEP),
        None => MAX_SLEEP,
    })
}
