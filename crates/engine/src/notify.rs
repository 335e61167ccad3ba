//! Wakes long-polling workers when a task becomes ready on a queue they poll. Wakes are sent only
//! after the change is committed; a poll registers before it looks for work, so no wake is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::Notify;

type QueueKey = (String, String);
/// By (namespace, worker id): the queues of the worker's last poll and when it was.
type WorkerPolls = HashMap<(String, String), (Vec<String>, Instant)>;

/// Workers are remembered this long after their last poll.
const FORGET_WORKER_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);
/// The worker table is pruned of forgotten workers when it grows past this.
const PRUNE_WORKERS_ABOVE: usize = 1024;

/// Tasks handed out on one queue in the last minute, in one-second buckets.
#[derive(Debug, Clone)]
struct ClaimWindow {
    epoch: Instant,
    /// (second since `epoch`, tasks handed out in that second), indexed by second modulo 60.
    buckets: [(u64, u64); 60],
}

impl ClaimWindow {
    fn new(epoch: Instant) -> ClaimWindow {
        ClaimWindow {
            epoch,
            buckets: [(u64::MAX, 0); 60],
        }
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_secs()
    }

    fn record(&mut self, at: Instant, count: u64) {
        let second = self.second(at);
        let bucket = &mut self.buckets[(second % 60) as usize];
        if bucket.0 != second {
            *bucket = (second, 0);
        }
        bucket.1 += count;
    }

    /// Tasks handed out in the 60 seconds up to `at`.
    fn last_minute(&self, at: Instant) -> u64 {
        let now = self.second(at);
        self.buckets
            .iter()
            .filter(|(second, _)| *second <= now && now - *second < 60)
            .map(|(_, count)| count)
            .sum()
    }
}

/// A worker that polled this server: which queues it asked for last, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSeen {
    pub worker: String,
    pub queues: Vec<String>,
    pub last_poll: Instant,
}

#[derive(Default)]
pub struct Notifier {
    waiters: Mutex<HashMap<QueueKey, Vec<Weak<Notify>>>>,
    timers: Arc<Notify>,
    deliveries: Arc<Notify>,
    last_polls: Mutex<HashMap<QueueKey, Instant>>,
    workers: Mutex<WorkerPolls>,
    claims: Mutex<HashMap<QueueKey, ClaimWindow>>,
}

impl Notifier {
    /// Signalled after every commit, which may have set an earlier lease expiry or deadline.
    pub fn timers(&self) -> Arc<Notify> {
        self.timers.clone()
    }

    pub(crate) fn timers_changed(&self) {
        self.timers.notify_one();
    }

    /// Signalled after a commit that wrote webhook deliveries.
    pub fn deliveries(&self) -> Arc<Notify> {
        self.deliveries.clone()
    }

    pub(crate) fn deliveries_changed(&self) {
        self.deliveries.notify_one();
    }

    /// Registers interest in the given queues of a namespace. The returned `Notify` holds a permit
    /// as soon as any of them is woken, even before the caller starts waiting.
    pub fn register(&self, namespace: &str, queues: &[String]) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        for queue in queues {
            let list = waiters
                .entry((namespace.to_owned(), queue.clone()))
                .or_default();
            list.retain(|weak| weak.strong_count() > 0);
            list.push(Arc::downgrade(&notify));
        }
        notify
    }

    /// Notes that a worker polled these queues now (on this server).
    pub fn polled(&self, namespace: &str, worker: &str, queues: &[String]) {
        let now = Instant::now();
        {
            let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
            if workers.len() > PRUNE_WORKERS_ABOVE {
                workers.retain(|_, (_, at)| now.duration_since(*at) < FORGET_WORKER_AFTER);
            }
            workers.insert(
                (namespace.to_owned(), worker.to_owned()),
                (queues.to_vec(), now),
            );
        }
        let mut polls = self.last_polls.lock().unwrap_or_else(|e| e.into_inner());
        for queue in queues {
            polls.insert((namespace.to_owned(), queue.clone()), now);
        }
    }

    /// When a worker last polled the queue on this server, if one has since it started.
    pub fn last_poll(&self, namespace: &str, queue: &str) -> Option<Instant> {
        let polls = self.last_polls.lock().unwrap_or_else(|e| e.into_inner());
        polls
            .get(&(namespace.to_owned(), queue.to_owned()))
            .copied()
    }

    /// Notes that `count` tasks of a queue were handed out now (on this server).
    pub fn claimed(&self, namespace: &str, queue: &str, count: u64) {
        let now = Instant::now();
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims
            .entry((namespace.to_owned(), queue.to_owned()))
            .or_insert_with(|| ClaimWindow::new(now))
            .record(now, count);
    }

    /// How many tasks of the queue this server handed out in the last minute.
    pub fn claims_last_minute(&self, namespace: &str, queue: &str) -> u64 {
        let claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims
            .get(&(namespace.to_owned(), queue.to_owned()))
            .map_or(0, |window| window.last_minute(Instant::now()))
    }

    /// The workers that polled this server in the last hour, by worker id.
    pub fn workers(&self, namespace: &str) -> Vec<WorkerSeen> {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen: Vec<WorkerSeen> = workers
            .iter()
            .filter(|((ns, _), (_, at))| ns == namespace && at.elapsed() < FORGET_WORKER_AFTER)
            .map(|((_, worker), (queues, at))| WorkerSeen {
                worker: worker.clone(),
                queues: queues.clone(),
                last_poll: *at,
            })
            .collect();
        seen.sort_by(|a, b| a.worker.cmp(&b.worker));
        seen
    }

    /// Wakes every poll registered on this queue.
    pub fn wake(&self, namespace: &str, queue: &str) {
        let list = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            waiters.remove(&(namespace.to_owned(), queue.to_owned()))
        };
        for notify in list.into_iter().flatten().filter_map(|weak| weak.upgrade()) {
            notify.notify_one();
        }
    }

    /// Wakes every poll (used when time passes, e.g. retries fall due).
    pub fn wake_all(&self) {
        let lists: Vec<_> = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            waiters.drain().map(|(_, list)| list).collect()
        };
        for notify in lists
            .into_iter()
            .flatten()
            .filter_map(|weak| weak.upgrade())
        {
            notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_before_waiting_is_not_lost() {
        let notifier = Notifier::default();
        let notify = notifier.register("default", &["q".to_owned()]);
        notifier.wake("default", "q");
        // The permit is stored: this returns at once.
        notify.notified().await;
    }

    #[test]
    fn the_claim_window_counts_only_the_last_minute() {
        let start = Instant::now();
        let at = |seconds: u64| start + std::time::Duration::from_secs(seconds);
        let mut window = ClaimWindow::new(start);
        window.record(at(0), 2);
        window.record(at(0), 1);
        window.record(at(30), 4);
        assert_eq!(window.last_minute(at(30)), 7);
        assert_eq!(window.last_minute(at(59)), 7);
        assert_eq!(window.last_minute(at(60)), 4);
        window.record(at(61), 5);
        assert_eq!(window.last_minute(at(61)), 9);
        // Second 90 reuses the bucket of second 30, which starts again from zero.
        window.record(at(90), 1);
        assert_eq!(window.last_minute(at(90)), 6);
        assert_eq!(window.last_minute(at(200)), 0);
    }

    #[test]
    fn claims_are_counted_per_queue() {
        let notifier = Notifier::default();
        notifier.claimed("default", "q", 3);
        notifier.claimed("default", "q", 2);
        assert_eq!(notifier.claims_last_minute("default", "q"), 5);
        assert_eq!(notifier.claims_last_minute("default", "r"), 0);
        assert_eq!(notifier.claims_last_minute("other", "q"), 0);
    }

    #[test]
    fn polls_are_remembered_per_worker_and_namespace() {
        let notifier = Notifier::default();
        notifier.polled("default", "w2", &["b".to_owned()]);
        notifier.polled("default", "w1", &["a".to_owned()]);
        notifier.polled("default", "w1", &["a".to_owned(), "c".to_owned()]);
        notifier.polled("other", "w3", &["a".to_owned()]);
        let seen: Vec<(String, Vec<String>)> = notifier
            .workers("default")
            .into_iter()
            .map(|w| (w.worker, w.queues))
            .collect();
        assert_eq!(
            seen,
            [
                ("w1".to_owned(), vec!["a".to_owned(), "c".to_owned()]),
                ("w2".to_owned(), vec!["b".to_owned()]),
            ]
        );
        assert!(notifier.last_poll("default", "c").is_some());
    }

    #[tokio::test]
    async fn a_wake_on_another_queue_does_not_reach_the_poll() {
        let notifier = Notifier::default();
        let notify = notifier.register("default", &["q".to_owned()]);
        notifier.wake("default", "other");
        notifier.wake("other-namespace", "q");
        let woken =
            tokio::time::timeout(std::time::Duration::from_millis(20), notify.notified()).await;
        assert!(woken.is_err());
    }
}
