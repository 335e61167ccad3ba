//! The dashboard's rollup: every few seconds, adds the history written since the last rollup to
//! the per-minute rows and samples the queues once a minute (see store `minutes`). It reads on
//! a reading connection and writes a few rows in a transaction of its own, so the job
//! transactions of the writer carry nothing for it.

use std::time::Duration as StdDuration;

use tokio::sync::watch;

use crate::{Engine, ROLLUP_BATCH};

/// How often the rollup looks for new history.
const ROLLUP_EVERY: StdDuration = StdDuration::from_secs(5);

/// Rolls the history up every `ROLLUP_EVERY`, until `stop`.
pub async fn run_rollup(store: Engine, mut stop: watch::Receiver<bool>) {
    loop {
        loop {
            match store.roll_up().await {
                Ok(events) if events >= ROLLUP_BATCH as usize => continue,
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "rollup: database error"),
            }
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(ROLLUP_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}
