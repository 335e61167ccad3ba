//! Dispatch rules for queues: which queues may hand out work now, how many tasks each may start,
//! and in what order ready tasks go out. Pure: the store supplies the rows and the time.
//!
//! Order: higher queue priority first, then higher task priority (job priority plus
//! step priority), then earliest `available_at`, then id. Against starvation, a ready task that
//! has waited longer than its queue's `max_wait` goes ahead of priority order, oldest first: under
//! sustained high-priority load every low-priority task still starts within about `max_wait` of
//! becoming ready (plus the time to drain the tasks that aged before it).

use serde::{Deserialize, Serialize};

use crate::ids::{JobId, TaskId};
use crate::time::{Duration, Timestamp};
use crate::wire::string_enum;

/// A queue that names no `max_wait`: tasks older than this are served oldest first.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(300);

string_enum!(
    /// How a queue hands out its tasks.
    #[derive(Default)]
    QueueMode {
        /// Any number of running tasks (up to `concurrency`).
        #[default]
        Parallel => "parallel",
        /// At most one running task at a time, in dispatch order.
        Serial => "serial",
    }
);

string_enum!(
    /// What a queue does when a forward task on it fails for good (seed 001's stop on error).
    #[derive(Default)]
    OnError {
        /// Nothing: the queue goes on handing out tasks.
        #[default]
        Continue => "continue",
        /// The queue pauses, saying why in its `paused_reason`; compensation tasks still
        /// dispatch on it, so the failing job can roll back. Resuming it clears the reason.
        Pause => "pause",
    }
);

/// At most `tokens` task starts per `per` (a token bucket that refills continuously and holds at
/// most `tokens`). Tasks over the limit wait ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub tokens: u32,
    pub per: Duration,
}

/// Tokens left in a queue's bucket at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub tokens: f64,
    pub at: Timestamp,
}

impl RateLimit {
    /// Reads a limit written `10/1m` (tokens per duration) or as `{tokens: 10, per: "1m"}` (a
    /// queue's form; `per` may be a number of seconds).
    pub fn from_json(value: &serde_json::Value) -> Result<RateLimit, String> {
        const FORMS: &str = "write it as `10/1m` (starts per duration) or `{tokens: 10, per: 1m}`";
        let (tokens, per) = match value {
            serde_json::Value::String(text) => {
                let Some((tokens, per)) = text.split_once('/') else {
                    return Err(format!("'{text}' is not a rate: {FORMS}"));
                };
                let tokens = tokens
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("'{tokens}' is not a number of starts: {FORMS}"))?;
                (tokens, serde_json::Value::String(per.trim().to_owned()))
            }
            serde_json::Value::Object(map) => {
                let tokens = map
                    .get("tokens")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|tokens| u32::try_from(tokens).ok())
                    .ok_or_else(|| format!("`tokens` must be a whole number: {FORMS}"))?;
                let per = map
                    .get("per")
                    .cloned()
                    .ok_or_else(|| format!("`per` is missing: {FORMS}"))?;
                (tokens, per)
            }
            _ => return Err(format!("not a rate: {FORMS}")),
        };
        if tokens == 0 {
            return Err("must allow at least 1 start".to_owned());
        }
        let per = Duration::from_json(&per).map_err(|error| error.to_string())?;
        if per.as_millis() == 0 {
            return Err("the duration must be longer than zero".to_owned());
        }
        Ok(RateLimit { tokens, per })
    }

    /// Tokens available at `now`; a queue never limited before starts full.
    pub fn available(&self, bucket: Option<Bucket>, now: Timestamp) -> f64 {
        let capacity = f64::from(self.tokens);
        let Some(bucket) = bucket else {
            return capacity;
        };
        let per = self.per.as_millis().max(1) as f64;
        let refilled = now.since(bucket.at).as_millis() as f64 * capacity / per;
        (bucket.tokens + refilled).min(capacity)
    }

    /// When the bucket, holding `available` tokens at `now`, next holds a whole token.
    pub fn next_token_at(&self, available: f64, now: Timestamp) -> Timestamp {
        if available >= 1.0 {
            return now;
        }
        let per = self.per.as_millis().max(1) as f64;
        let wait = ((1.0 - available) * per / f64::from(self.tokens.max(1))).ceil();
        now.saturating_add(Duration::from_millis(wait as u64))
    }
}

/// How a queue dispatches. A queue nobody configured has the defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueConfig {
    pub mode: QueueMode,
    /// Higher runs first across the queues a worker polls.
    pub priority: i32,
    /// Most running tasks at once (`None`: no limit).
    pub concurrency: Option<u32>,
    /// A paused queue keeps its tasks but hands none out.
    pub paused: bool,
    pub max_wait: Duration,
    pub rate: Option<RateLimit>,
    pub on_error: OnError,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            mode: QueueMode::Parallel,
            priority: 0,
            concurrency: None,
            paused: false,
            max_wait: DEFAULT_MAX_WAIT,
            rate: None,
            on_error: OnError::Continue,
        }
    }
}

impl QueueConfig {
    /// How many more tasks may start now, given how many run: `None` means no limit.
    pub fn free_slots(&self, running: u32) -> Option<u32> {
        if self.paused {
            return Some(0);
        }
        let limit = match (self.mode, self.concurrency) {
            (QueueMode::Serial, _) => Some(1),
            (QueueMode::Parallel, limit) => limit,
        };
        limit.map(|limit| limit.saturating_sub(running))
    }

    /// Whether `running` matters for this queue (so the store needs to count it).
    pub fn is_limited(&self) -> bool {
        self.mode == QueueMode::Serial || self.concurrency.is_some()
    }
}

/// A ready task offered for dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub job: JobId,
    pub task: TaskId,
    pub queue: String,
    pub queue_priority: i32,
    pub priority: i32,
    pub available_at: Timestamp,
    /// Waited longer than its queue's `max_wait`.
    pub starving: bool,
}

/// Sorts candidates into dispatch order, drops duplicates (a task offered both as starving and in
/// priority order), and keeps at most `max`.
pub fn order(mut candidates: Vec<Candidate>, max: usize) -> Vec<Candidate> {
    candidates.sort_by(|a, b| {
        b.starving
            .cmp(&a.starving)
            .then_with(|| {
                if a.starving && b.starving {
                    a.available_at.cmp(&b.available_at)
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .then_with(|| b.queue_priority.cmp(&a.queue_priority))
            .then_with(|| b.priority.cmp(&a.priority))
            .then_with(|| a.available_at.cmp(&b.available_at))
            .then_with(|| a.task.cmp(&b.task))
    });
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|c| seen.insert(c.task.clone()));
    candidates.truncate(max);
    candidates
}

/// A worker that has not polled a queue for this long is reported as absent.
pub const NO_WORKER_AFTER: Duration = Duration::from_secs(300);

/// What the dispatcher knows about a queue when explaining why a task waits.
#[derive(Debug, Clone)]
pub struct QueueState {
    pub config: QueueConfig,
    /// Running tasks, counted for a queue with a limit (serial, or a concurrency); 0 otherwise.
    pub running: u32,
    /// Tokens in the rate-limit bucket now (for a rate-limited queue).
    pub tokens: Option<f64>,
    /// Time since a worker last polled the queue on this server; `None`: never since start.
    pub last_poll: Option<Duration>,
    /// Why the queue paused itself (`on_error: pause`); `None` for an operator's pause.
    pub paused_reason: Option<String>,
}

/// Why a task is not running yet, in words for operators; `None` when it is not waiting.
/// `pending` names the dependencies that are not done.
pub fn task_waiting_reason(
    task: &crate::model::Task,
    pending: &[&str],
    queue: Option<&QueueState>,
    now: Timestamp,
) -> Option<String> {
    use crate::model::TaskStatus;
    match task.status {
        TaskStatus::Waiting if !pending.is_empty() => {
            Some(format!("waiting for {}", pending.join(", ")))
        }
        TaskStatus::Ready => {
            if task.held {
                return Some("job paused".to_owned());
            }
            if let Some(parked) = task.limits.as_ref().and_then(|l| l.parked.as_ref()) {
                return Some(parked.reason.clone());
            }
            if let Some(at) = task.available_at
                && at > now
            {
                let what = if task.checking {
                    "check again"
                } else {
                    "retry"
                };
                return Some(format!("{what} in {}", at.since(now)));
            }
            let Some(queue) = queue else {
                return Some(format!("no worker has polled queue {} yet", task.queue));
            };
            // A queue that stopped on an error still hands out compensations.
            let rolls_back =
                task.kind == crate::model::TaskKind::Compensation && queue.paused_reason.is_some();
            let unpaused;
            let config = if rolls_back {
                unpaused = QueueConfig {
                    paused: false,
                    ..queue.config.clone()
                };
                &unpaused
            } else {
                &queue.config
            };
            if config.paused {
                return Some(match &queue.paused_reason {
                    Some(reason) => format!("queue {} stopped on error: {reason}", task.queue),
                    None => format!("queue {} paused", task.queue),
                });
            }
            if let (Some(rate), Some(tokens)) = (config.rate, queue.tokens)
                && tokens < 1.0
            {
                return Some(format!(
                    "queue {} rate limited ({} per {})",
                    task.queue, rate.tokens, rate.per
                ));
            }
            if config.free_slots(queue.running) == Some(0) {
                let limit = if config.mode == QueueMode::Serial {
                    1
                } else {
                    config.concurrency.unwrap_or(0)
                };
                return Some(format!(
                    "queue {} at its limit ({}/{limit} running)",
                    task.queue, queue.running
                ));
            }
            match queue.last_poll {
                None => Some(format!(
                    "no worker has polled queue {} since the server started",
                    task.queue
                )),
                Some(age) if age >= NO_WORKER_AFTER => {
                    Some(format!("no worker polling queue {} for {age}", task.queue))
                }
                Some(_) => None,
            }
        }
        TaskStatus::Running => task.wait.as_ref().map(|wait| {
            use crate::model::WaitFor;
            let reason = match &wait.on {
                WaitFor::Sleep { until } => format!("sleeping until {}", until.to_rfc3339()),
                WaitFor::Signal { name } => format!("waiting for signal {name}"),
                WaitFor::Approval { .. } => "waiting for approval".to_owned(),
                WaitFor::Callback { until, .. } => {
                    format!("waiting for a callback until {}", until.to_rfc3339())
                }
                WaitFor::Child { job } if task.kind == crate::model::TaskKind::Compensation => {
                    format!("waiting for child job {job} to roll back")
                }
                WaitFor::Child { job } => format!("waiting for child job {job}"),
                WaitFor::ChildRetry { at } => {
                    format!("starting a new child job at {}", at.to_rfc3339())
                }
            };
            match (&task.pending_outcome, task.held) {
                (Some(_), _) => format!("{reason}: answered, taking effect when the job resumes"),
                (None, true) => format!("{reason} (job paused)"),
                (None, false) => reason,
            }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(
        id: &str,
        queue_priority: i32,
        priority: i32,
        at: i64,
        starving: bool,
    ) -> Candidate {
        Candidate {
            job: JobId::from_unique(id),
            task: TaskId::from_unique(id),
            queue: "q".into(),
            queue_priority,
            priority,
            available_at: Timestamp(at),
            starving,
        }
    }

    fn ids(order: Vec<Candidate>) -> Vec<String> {
        order
            .into_iter()
            .map(|c| c.task.as_str()[4..].to_owned())
            .collect()
    }

    #[test]
    fn queue_priority_then_task_priority_then_age_then_id() {
        let ordered = order(
            vec![
                candidate("a", 0, 0, 10, false),
                candidate("b", 0, 5, 20, false),
                candidate("c", 1, 0, 30, false),
                candidate("d", 0, 0, 5, false),
                candidate("e", 0, 0, 5, false),
            ],
            10,
        );
        assert_eq!(ids(ordered), vec!["c", "b", "d", "e", "a"]);
    }

    #[test]
    fn starving_tasks_go_first_oldest_first_and_duplicates_are_dropped() {
        let ordered = order(
            vec![
                candidate("high", 0, 9, 100, false),
                candidate("old", 0, 0, 1, true),
                candidate("older", 0, 0, 0, true),
                candidate("old", 0, 0, 1, false),
            ],
            3,
        );
        assert_eq!(ids(ordered), vec!["older", "old", "high"]);
    }

    fn ready_task(queue: &str) -> crate::model::Task {
        use crate::model::{Task, TaskKind, TaskStatus};
        Task {
            child: None,
            limits: None,
            claimed_at: None,
            id: TaskId::from_unique("t"),
            job_id: JobId::from_unique("j"),
            seq: 0,
            kind: TaskKind::Step,
            step: "s".into(),
            item: None,
            compensates: None,
            queue: queue.into(),
            command: "c".into(),
            status: TaskStatus::Ready,
            priority: 0,
            attempt: 0,
            checking: false,
            available_at: Some(Timestamp(0)),
            deadline_at: None,
            lease_token: None,
            lease_expires_at: None,
            worker_id: None,
            input: None,
            output: None,
            error: None,
            progress: None,
            logs: None,
            created_at: Timestamp(0),
            ready_at: None,
            started_at: None,
            ended_at: None,
            completed_seq: None,
            held: false,
            round: 0,
            attempt_base: 0,
            wait: None,
            pending_outcome: None,
            callback: None,
        }
    }

    #[test]
    fn waiting_reasons_name_the_cause() {
        use crate::model::{Wait, WaitFor};
        let now = Timestamp(10_000);
        let mut task = ready_task("q");
        let polled = QueueState {
            config: QueueConfig::default(),
            running: 0,
            tokens: None,
            last_poll: Some(Duration::from_secs(1)),
            paused_reason: None,
        };
        assert_eq!(task_waiting_reason(&task, &[], Some(&polled), now), None);
        let stopped = QueueState {
            config: QueueConfig {
                paused: true,
                ..QueueConfig::default()
            },
            paused_reason: Some("task t of job j failed".into()),
            ..polled.clone()
        };
        assert_eq!(
            task_waiting_reason(&task, &[], Some(&stopped), now).unwrap(),
            "queue q stopped on error: task t of job j failed"
        );
        let mut compensation = ready_task("q");
        compensation.kind = crate::model::TaskKind::Compensation;
        assert_eq!(
            task_waiting_reason(&compensation, &[], Some(&stopped), now),
            None,
            "a compensation still dispatches on a queue stopped on error"
        );
        let absent = QueueState {
            last_poll: Some(Duration::from_secs(600)),
            ..polled.clone()
        };
        assert_eq!(
            task_waiting_reason(&task, &[], Some(&absent), now).unwrap(),
            "no worker polling queue q for 10m"
        );
        let full = QueueState {
            config: QueueConfig {
                mode: QueueMode::Serial,
                ..QueueConfig::default()
            },
            running: 1,
            ..polled.clone()
        };
        assert_eq!(
            task_waiting_reason(&task, &[], Some(&full), now).unwrap(),
            "queue q at its limit (1/1 running)"
        );
        task.available_at = Some(Timestamp(40_000));
        assert_eq!(
            task_waiting_reason(&task, &[], Some(&polled), now).unwrap(),
            "retry in 30s"
        );
        task.held = true;
        assert_eq!(
            task_waiting_reason(&task, &[], Some(&polled), now).unwrap(),
            "job paused"
        );
        task.status = crate::model::TaskStatus::Waiting;
        assert_eq!(
            task_waiting_reason(&task, &["a", "b"], None, now).unwrap(),
            "waiting for a, b"
        );
        task.status = crate::model::TaskStatus::Running;
        task.held = false;
        assert_eq!(task_waiting_reason(&task, &[], None, now), None);
        let waits = [
            (
                WaitFor::Sleep {
                    until: Timestamp(0),
                },
                "sleeping until 1970-01-01T00:00:00Z",
            ),
            (
                WaitFor::Signal {
                    name: "paid".into(),
                },
                "waiting for signal paid",
            ),
            (
                WaitFor::Approval {
                    prompt: "ok?".into(),
                },
                "waiting for approval",
            ),
        ];
        for (on, reason) in waits {
            task.wait = Some(Box::new(Wait { since: now, on }));
            assert_eq!(task_waiting_reason(&task, &[], None, now).unwrap(), reason);
        }
        task.held = true;
        assert_eq!(
            task_waiting_reason(&task, &[], None, now).unwrap(),
            "waiting for approval (job paused)"
        );
    }

    #[test]
    fn a_rate_limit_refills_continuously_up_to_its_capacity() {
        let rate = RateLimit {
            tokens: 10,
            per: Duration::from_secs(60),
        };
        assert_eq!(rate.available(None, Timestamp(0)), 10.0, "starts full");
        let empty = Bucket {
            tokens: 0.0,
            at: Timestamp(0),
        };
        assert_eq!(rate.available(Some(empty), Timestamp(6_000)), 1.0);
        assert_eq!(
            rate.available(Some(empty), Timestamp(600_000)),
            10.0,
            "capped"
        );
        assert_eq!(rate.next_token_at(0.0, Timestamp(0)), Timestamp(6_000));
        assert_eq!(rate.next_token_at(0.5, Timestamp(0)), Timestamp(3_000));
    }

    #[test]
    fn free_slots_follow_mode_limit_and_pause() {
        let parallel = QueueConfig::default();
        assert_eq!(parallel.free_slots(100), None);
        let limited = QueueConfig {
            concurrency: Some(3),
            ..QueueConfig::default()
        };
        assert_eq!(limited.free_slots(1), Some(2));
        assert_eq!(limited.free_slots(5), Some(0));
        let serial = QueueConfig {
            mode: QueueMode::Serial,
            concurrency: Some(10),
            ..QueueConfig::default()
        };
        assert_eq!(serial.free_slots(0), Some(1));
        assert_eq!(serial.free_slots(1), Some(0));
        let paused = QueueConfig {
            paused: true,
            ..QueueConfig::default()
        };
        assert_eq!(paused.free_slots(0), Some(0));
    }
}
