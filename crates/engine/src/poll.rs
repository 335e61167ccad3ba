//! The long poll of a worker: commits the reports it carries, claims ready tasks, or waits until
//! some may be claimed (a commit that made tasks ready wakes it through the notifier, a retry
//! time arrives) or the poll's wait is over. The reports and the first claim are queued to the
//! writer together, reports first: they run in one group transaction, so the claim sees what
//! they changed (tasks they made ready), and the poll waits for work only once every report is
//! answered (on PostgreSQL a report contended by another node runs again in the next group,
//! after the claim). Waiting costs no database work: the poll parks its next claim (see
//! `parking`), which the group transaction that makes work ready on its queues runs, so the
//! task comes with that group's commit; a wake-up (work made ready by another node) or the next
//! availability time makes the poll take its claim back and send it.

use std::time::Duration as StdDuration;

use starbridge_core::ids::TaskId;
use starbridge_core::model::Input;
use tokio::time::Instant;

use crate::{Claimed, Engine, Poll, Polled, Result, TaskScope, writer};

impl Engine {
    /// Commits `reports` (each as `Engine::report` would, a task outside `scope` not found), then
    /// claims up to `poll.max` ready tasks; when none is ready, waits up to `poll.wait` for some.
    pub async fn poll(
        &self,
        poll: &Poll,
        reports: Vec<(TaskId, Input)>,
        scope: &TaskScope,
    ) -> Result<Polled> {
        let Poll {
            namespace,
            queues,
            worker,
            max,
            wait,
        } = poll;
        self.notifier().polled(namespace, worker, queues);
        let deadline = Instant::now() + *wait;
        let mut woken = self.notifier().register(namespace, queues);
        let mut together = writer::Together::default();
        let reported = Engine::reports_in(&mut together, reports, scope);
        let claim = Engine::claim_in(&mut together, namespace, queues.clone(), worker, *max);
        self.inner.writer.send(together);
        let reports = Engine::report_answers(reported).await;
        let mut claimed = self.claimed(claim).await?;
        loop {
            for task in &claimed {
                self.notifier().claimed(namespace, &task.task.queue, 1);
            }
            if !claimed.is_empty() || Instant::now() >= deadline {
                self.add_traceparents(&mut claimed).await?;
                return Ok(Polled { reports, claimed });
            }
            let mut wake_at = deadline;
            if let Some(next) = self.next_available(namespace, queues.clone()).await? {
                let wait = next.since(self.now());
                wake_at = wake_at.min(Instant::now() + StdDuration::from_millis(wait.as_millis()));
            }
            // The next claim waits parked: a group that makes work ready on these queues may
            // run it (see `parking`).
            let mut together = writer::Together::default();
            let claim = self.claimed(Engine::claim_in(
                &mut together,
                namespace,
                queues.clone(),
                worker,
                *max,
            ));
            tokio::pin!(claim);
            let parked = self.inner.writer.park(namespace, queues, *max, together);
            let answered = tokio::select! {
                answer = &mut claim => Some(answer),
                () = woken.notified() => None,
                () = tokio::time::sleep_until(wake_at) => None,
            };
            woken = self.notifier().register(namespace, queues);
            let handed_over = match parked.take_back() {
                Some(together) => {
                    self.inner.writer.send(together);
                    false
                }
                None => true,
            };
            claimed = match answered {
                Some(answer) => answer?,
                None => claim.await?,
            };
            if handed_over && claimed.is_empty() {
                // Its claim may have read before this poll registered again: claim once more,
                // so that no wake-up in between is lost.
                claimed = self.claim(namespace, queues.clone(), worker, *max).await?;
            }
        }
    }

    /// While tracing is on, gives each claimed task its attempt's `traceparent` (the job's
    /// stored trace, the attempt's span), read after the claim committed.
    async fn add_traceparents(&self, claimed: &mut [Claimed]) -> Result<()> {
        if self.spans().is_none() || claimed.is_empty() {
            return Ok(());
        }
        let jobs: Vec<_> = claimed
            .iter()
            .map(|claim| claim.task.job_id.clone())
            .collect();
        let traces = self
            .inner
            .reader
            .read(move |conn| {
                jobs.iter()
                    .map(|job| starbridge_store::rows::trace_of(conn, job))
                    .collect::<starbridge_store::Result<Vec<_>>>()
            })
            .await?;
        for (claim, trace) in claimed.iter_mut().zip(traces) {
            claim.traceparent = trace.map(|trace| {
                starbridge_core::trace::traceparent(
                    trace.trace_id,
                    starbridge_core::trace::attempt_span_id(
                        claim.task.id.as_str(),
                        claim.task.attempt,
                    ),
                )
            });
        }
        Ok(())
    }
}
