//! The long poll of a worker: claims ready tasks, or waits until some may be claimed (a commit
//! that made tasks ready wakes it through the notifier, a retry time arrives) or the poll's wait
//! is over. Waiting costs no database work: only a wake-up or the next availability time leads
//! to another claim.

use std::time::Duration as StdDuration;

use tokio::time::Instant;

use crate::{Claimed, Engine, Result};

impl Engine {
    /// Claims up to `max` ready tasks of `queues` for `worker`; when none is ready, waits up to
    /// `wait` for some.
    pub async fn poll(
        &self,
        namespace: &str,
        queues: &[String],
        worker: &str,
        max: u32,
        wait: StdDuration,
    ) -> Result<Vec<Claimed>> {
        self.notifier().polled(namespace, worker, queues);
        let deadline = Instant::now() + wait;
        loop {
            let woken = self.notifier().register(namespace, queues);
            let claimed = self.claim(namespace, queues.to_vec(), worker, max).await?;
            for task in &claimed {
                self.notifier().claimed(namespace, &task.task.queue, 1);
            }
            if !claimed.is_empty() || Instant::now() >= deadline {
                return Ok(claimed);
            }
            let mut wake_at = deadline;
            if let Some(next) = self.next_available(namespace, queues.to_vec()).await? {
                let wait = next.since(self.now());
                wake_at = wake_at.min(Instant::now() + StdDuration::from_millis(wait.as_millis()));
            }
            tokio::select! {
                () = woken.notified() => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }
}
