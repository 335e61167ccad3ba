//! The pruner: deletes finished jobs (with their tasks and history) past the retention, the
//! idle token buckets of steps' per-key rates, and on PostgreSQL makes the coming days' history
//! partitions and drops the retired ones, now and then.

use std::time::Duration as StdDuration;

use tokio::sync::watch;

use crate::{Engine, PRUNE_BATCH};

/// How often the pruner looks for finished jobs past their retention.
const PRUNE_EVERY: StdDuration = StdDuration::from_secs(60);

/// Deletes finished jobs past the store's retention every `PRUNE_EVERY`, until `stop`.
pub async fn run_pruner(store: Engine, mut stop: watch::Receiver<bool>) {
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
        if let Err(error) = store.prune_rate_buckets().await {
            tracing::warn!(%error, "pruner: database error");
        }
        match store.retire_history().await {
            Ok(partitions) if partitions.made.is_empty() && partitions.dropped.is_empty() => {}
            Ok(partitions) => tracing::info!(
                made = ?partitions.made,
                dropped = ?partitions.dropped,
                "history partitions made and retired"
            ),
            Err(error) => tracing::warn!(%error, "pruner: database error"),
        }
        tokio::select! {
            () = tokio::time::sleep(PRUNE_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}
