//! The state of a job and its tasks, the inputs that change it, and the actions the engine must
//! carry out. These are plain data: the store persists them, the API shows them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{JobId, TaskId};
use crate::labels::Labels;
use crate::time::{Duration, Timestamp};
use crate::wire::string_enum;

string_enum!(
    /// Where a job is in its life (see ARCHITECTURE.md for the diagram).
    JobStatus {
        Queued => "queued",
        Running => "running",
        Paused => "paused",
        Compensating => "compensating",
        Succeeded => "succeeded",
        Failed => "failed",
        CompensationFailed => "compensation_failed",
        Cancelled => "cancelled",
        TimedOut => "timed_out",
    }
);

impl JobStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded
                | JobStatus::Failed
                | JobStatus::CompensationFailed
                | JobStatus::Cancelled
                | JobStatus::TimedOut
        )
    }

    // Which operator actions apply to a job in this status: the one rule the state machine
    // enforces and the web UI's buttons follow. (Retry and rerun also need no task running.)

    /// `pause`: a running job.
    pub fn can_pause(self) -> bool {
        self == JobStatus::Running
    }

    /// `resume`: a paused job.
    pub fn can_resume(self) -> bool {
        self == JobStatus::Paused
    }

    /// `cancel`: a job not finished yet.
    pub fn can_cancel(self) -> bool {
        matches!(
            self,
            JobStatus::Running | JobStatus::Paused | JobStatus::Queued
        )
    }

    /// `retry`: a job that finished unsuccessfully.
    pub fn can_retry(self) -> bool {
        matches!(
            self,
            JobStatus::Failed
                | JobStatus::CompensationFailed
                | JobStatus::TimedOut
                | JobStatus::Cancelled
        )
    }

    /// `rerun`: a finished job.
    pub fn can_rerun(self) -> bool {
        self.is_terminal()
    }
}

string_enum!(
    /// Where a task is in its life.
    TaskStatus {
        Waiting => "waiting",
        Ready => "ready",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Skipped => "skipped",
        Cancelled => "cancelled",
    }
);

impl TaskStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded
                | TaskStatus::Failed
                | TaskStatus::Skipped
                | TaskStatus::Cancelled
        )
    }

    /// Finished in a way that lets dependants go on.
    pub fn is_done(self) -> bool {
        matches!(self, TaskStatus::Succeeded | TaskStatus::Skipped)
    }
}

string_enum!(
    /// `step`: a plain step; `fan_out`: a `for_each` step's parent, never dispatched; `item`: one
    /// fan-out item; `compensation`: the rollback of a finished or failed task.
    TaskKind {
        /// A plain step, dispatched to its queue.
        Step => "step",
        /// A `for_each` step: not dispatched itself, it gathers its items' outputs.
        FanOut => "fan_out",
        /// One item of a fan-out step.
        Item => "item",
        /// The rollback of a finished (or failed) task.
        Compensation => "compensation",
    }
);

string_enum!(
    /// What kind of failure a task error records.
    ErrorKind {
        /// The handler reported the failure.
        Handler => "handler",
        /// The worker stopped heartbeating and its lease lapsed.
        LeaseExpired => "lease_expired",
        /// The step's overall timeout passed.
        StepTimeout => "step_timeout",
        /// An expression (`when`, `for_each`, `input`) could not be evaluated.
        Expression => "expression",
        /// A task awaiting a callback got none before its callback timeout.
        CallbackTimeout => "callback_timeout",
        /// A person rejected an approval step.
        Rejected => "rejected",
        /// A `fail` step failed the job.
        FailStep => "fail_step",
        /// A sub-workflow's child job did not succeed (or could not start).
        Child => "child",
        /// An operator failed the task by hand (`POST /jobs/{id}/tasks/{task}/fail`); also the
        /// error of an attempt an operator requeued.
        Operator => "operator",
    }
);

string_enum!(
    // A run is one claim of a task by a worker; a "check later" ends a run but not the attempt.
    /// How a run ended; `running` while it has not.
    AttemptOutcome {
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        CheckLater => "check_later",
        LeaseExpired => "lease_expired",
        TimedOut => "timed_out",
        Cancelled => "cancelled",
    }
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskError {
    pub message: String,
    pub retryable: bool,
    pub kind: ErrorKind,
}

impl WindDown {
    /// Why the job wound down, in words: the job's `error`.
    pub fn describe(&self) -> String {
        match self {
            WindDown::StepFailed { step, message, .. } => format!("step {step} failed: {message}"),
            WindDown::TimedOut => "the job timeout passed".to_owned(),
            WindDown::Cancelled { actor } => format!("cancelled by {actor}"),
            WindDown::Output { message } => format!("output: {message}"),
            WindDown::RolledBack { by } => format!("rolled back by {by}"),
        }
    }
}

/// Why a job stopped going forward and is winding down to compensation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WindDown {
    StepFailed {
        task: TaskId,
        step: String,
        message: String,
    },
    TimedOut,
    Cancelled {
        actor: String,
    },
    /// Every step ended, but the workflow's `output` could not be rendered (or was too large).
    Output {
        message: String,
    },
    /// The job had succeeded as a sub-workflow's child, and its parent rolled it back.
    RolledBack {
        by: JobId,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub namespace: String,
    pub workflow: String,
    pub version: u32,
    pub status: JobStatus,
    pub params: Value,
    pub key: Option<String>,
    pub priority: i32,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub deadline_at: Option<Timestamp>,
    pub wind_down: Option<WindDown>,
    /// Whether the compensation tasks have been created.
    pub compensation_planned: bool,
    /// How many tasks have succeeded so far; gives each success its completion order.
    pub completions: u64,
    /// Incremented by every operator retry, skip or rerun; tasks reset by it carry the new round.
    pub round: u32,
    /// The lock this job must hold to run (rendered from the workflow's `lock`).
    pub lock: Option<JobLock>,
    /// How many signals the job has received; numbers each signal in arrival order.
    pub signals_received: u32,
    /// Its labels: its workflow's merged with its submission's, fixed at creation.
    #[serde(default)]
    pub labels: Labels,
    /// The workflow's `output`, rendered when the job succeeded.
    pub output: Option<Value>,
    /// The steps whose terminal failure the job went on past (`continue_on_failure`), in the
    /// order they were created; set when the job succeeded.
    pub failed_steps: Vec<String>,
    /// The parent's task (and its attempt) that started this job as a sub-workflow's child.
    pub parent: Option<ParentLink>,
    /// How deep the job nests: 0 for a job nobody started as a child.
    pub depth: u32,
    /// The version of each sub-workflow its steps start without naming one: the latest when
    /// the job was created, so that retries and reruns start the same one.
    pub child_versions: std::collections::BTreeMap<String, u32>,
}

/// Where a child job comes from: the parent job's task, and the attempt that started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    pub job: JobId,
    pub task: TaskId,
    pub attempt: u32,
}

/// A lock a job holds while it runs: at most `slots` jobs with the same key at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLock {
    pub key: String,
    pub slots: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub job_id: JobId,
    /// Creation order within the job.
    pub seq: u32,
    pub kind: TaskKind,
    pub step: String,
    /// The fan-out item index, for `TaskKind::Item`.
    pub item: Option<u32>,
    /// The task this compensation undoes.
    pub compensates: Option<TaskId>,
    pub queue: String,
    pub command: String,
    pub status: TaskStatus,
    pub priority: i32,
    /// The current attempt, 1-based; 0 before the first claim.
    pub attempt: u32,
    /// Set by "check later": the next claim continues the same attempt.
    pub checking: bool,
    /// A ready task is claimable from this time on.
    pub available_at: Option<Timestamp>,
    /// The step's overall timeout.
    pub deadline_at: Option<Timestamp>,
    /// The running attempt's fencing token. On a ready task an operator requeued, the revoked
    /// lease: its worker's reports are refused with the reason until another claim replaces it.
    /// On a succeeded task, the token of the attempt that succeeded: the same success sent again
    /// is answered as the first was (`machine::repeats_success`).
    pub lease_token: Option<String>,
    pub lease_expires_at: Option<Timestamp>,
    pub worker_id: Option<String>,
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<TaskError>,
    pub progress: Option<Value>,
    /// Size-bounded output of the last attempt (e.g. a shell command's stdout and stderr).
    pub logs: Option<Value>,
    pub created_at: Timestamp,
    pub ready_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    /// Order of success within the job (compensations run in reverse of it).
    pub completed_seq: Option<u64>,
    /// The job is paused: the task stays ready but is not handed out.
    pub held: bool,
    /// The job round in which the task was created or last reset by an operator.
    pub round: u32,
    /// Attempts used before the last operator reset; retries count from here.
    pub attempt_base: u32,
    // The three below are boxed: most tasks never wait, and every task is copied often.
    /// What a running task waits for on the server, holding no worker and no lease.
    pub wait: Option<Box<Wait>>,
    /// What ends the wait, accepted while the job was paused: it takes effect at resume.
    pub pending_outcome: Option<Box<Outcome>>,
    /// The callback credential of the current attempt (a hash; the token itself is shown once,
    /// in the poll answer).
    pub callback: Option<Box<CallbackGrant>>,
    /// A sub-workflow step's child job of the latest attempt (kept after it ended, so that a
    /// rollback finds it); for a compensation, the child it rolls back.
    pub child: Option<Box<JobId>>,
    /// The rendered keys of its step's `lock` and `rate`, and where it stands with them.
    pub limits: Option<Box<TaskLimits>>,
    /// When the claim a worker holds now (or that handed the task to a callback) began; none
    /// once that run ended. A claim writes no history: the event that ends the run carries
    /// this (`claimed_at` in its detail), and until then the task row shows it.
    pub claimed_at: Option<Timestamp>,
}

/// A task of a step with a `lock` or a `rate`: the keys rendered when it was made ready (kept
/// for all its attempts), the lock slot it holds and what it waits for, parked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    /// Ready but out of the claim order until a slot or a token is handed to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<Parked>,
}

/// How a task holds a slot of its step's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    /// Handed to it, parked, when a slot freed: its next claim starts in it.
    Granted,
    /// Taken by its claim: held until the attempt ends (check-later gaps and waits included).
    Claimed,
}

/// What a parked task waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parked {
    /// Which waiters it is in line with: see [`Parked::lock_line`] and [`Parked::rate_line`].
    pub line: String,
    pub since: Timestamp,
    /// Why, in words for operators.
    pub reason: String,
}

impl Parked {
    /// The line of tasks waiting for a slot of lock `key`.
    pub fn lock_line(key: &str) -> String {
        format!("lock\t{key}")
    }

    /// The line of tasks waiting for a token of the bucket of `key` under `limit`.
    pub fn rate_line(key: &str, limit: crate::dispatch::RateLimit) -> String {
        format!("rate\t{}/{}\t{key}", limit.tokens, limit.per.as_millis())
    }
}

/// A running task's wait on the server: since when, and for what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    pub since: Timestamp,
    #[serde(flatten)]
    pub on: WaitFor,
}

/// What a waiting task waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "for", rename_all = "snake_case")]
pub enum WaitFor {
    /// A sleep step: succeeds at `until`.
    Sleep { until: Timestamp },
    /// A signal step: succeeds with the payload of a signal of this name.
    Signal { name: String },
    /// An approval step: a person approves (success) or rejects (failure).
    Approval { prompt: String },
    /// A worker handed the attempt to another system, which finishes it through its callback
    /// token; the attempt fails (retryably) at `until`, which a callback heartbeat moves to
    /// now + `timeout`.
    Callback { until: Timestamp, timeout: Duration },
    /// A sub-workflow step's child job runs (or, for a compensation, rolls back).
    Child { job: JobId },
    /// A sub-workflow step's attempt failed; the next child starts at `at`.
    ChildRetry { at: Timestamp },
}

impl Wait {
    /// When the wait ends by itself, if it does (a sleep's end, a callback's timeout).
    pub fn wake_at(&self) -> Option<Timestamp> {
        match &self.on {
            WaitFor::Sleep { until }
            | WaitFor::Callback { until, .. }
            | WaitFor::ChildRetry { at: until } => Some(*until),
            WaitFor::Signal { .. } | WaitFor::Approval { .. } | WaitFor::Child { .. } => None,
        }
    }
}

/// How a wait ends, when something from outside (a signal, a decision, a callback) ends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded(Value),
    Failed(TaskError),
}

/// The callback credential of one attempt: the hash of its token, and the first call that
/// finished the attempt through it (so that a repeat of that call gets the same answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackGrant {
    pub attempt: u32,
    /// The job round of the claim: an operator reset since then moved the task on. Left out of
    /// the stored row in the first round, as for most attempts.
    #[serde(default, skip_serializing_if = "is_first_round")]
    pub round: u32,
    /// The digest of the token's secret, or its beginning: a presented token is the attempt's
    /// when its digest starts with this (see `matches`). Every task row keeps one, so the
    /// engine keeps the first 128 bits of a SHA-256 (grants stored before kept all 256).
    pub hash: String,
    /// Left out of the stored row while the attempt is unanswered, as for most attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered: Option<CallbackAnswer>,
}

impl CallbackGrant {
    /// Whether a presented token, whose secret has this digest, is this attempt's.
    pub fn matches(&self, token_hash: &str) -> bool {
        !self.hash.is_empty() && token_hash.starts_with(&self.hash)
    }
}

fn is_first_round(round: &u32) -> bool {
    *round == 0
}

/// The call that finished an attempt through its callback token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackAnswer {
    pub call: CallbackCallKind,
    /// A digest of the call's body: an identical repeat is answered as the first call was.
    pub digest: String,
}

string_enum!(
    /// The calls that finish an attempt through its callback token.
    CallbackCallKind {
        Complete => "complete",
        Fail => "fail",
    }
);

/// A call through a callback token.
#[derive(Debug, Clone, PartialEq)]
pub enum CallbackCall {
    Complete {
        output: Value,
    },
    Fail {
        error: ReportedError,
    },
    /// Moves the callback's timeout to now + its `timeout_ms`.
    Heartbeat,
}

/// A signal sent to a job and not yet consumed by a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    /// Arrival order within the job, from 0.
    pub seq: u32,
    pub name: String,
    pub payload: Value,
    /// The sender's dedupe id: a repeat with the same id changes nothing.
    pub id: Option<String>,
    pub sender: String,
    pub received_at: Timestamp,
}

impl Task {
    /// The key a handler uses to make its side effect idempotent: stable across "check later"
    /// claims of the same attempt, new for each retry.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.id, self.attempt)
    }
}

/// A job with all its tasks: what the state machine works on.
#[derive(Debug, Clone, PartialEq)]
pub struct JobState {
    pub job: Job,
    pub tasks: Vec<Task>,
    /// Signals received and not consumed yet, oldest first (kept only for workflows with
    /// signal steps).
    pub signals: Vec<Signal>,
}

impl JobState {
    pub fn task(&self, id: &TaskId) -> Option<&Task> {
        self.tasks.iter().find(|task| &task.id == id)
    }

    pub(crate) fn position(&self, id: &TaskId) -> Option<usize> {
        self.tasks.iter().position(|task| &task.id == id)
    }
}

/// What a worker reports about a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportedError {
    pub message: String,
    pub retryable: bool,
    /// The least delay before a retry (a service's `Retry-After`); the backoff applies when it
    /// is longer.
    pub retry_after: Option<crate::time::Duration>,
}

/// Something that happened to a job, given to the state machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A worker takes a ready task; the engine made the fencing token and the callback token
    /// (of which the machine keeps the hash).
    Claim {
        task: TaskId,
        worker: String,
        lease_token: String,
        callback_hash: String,
    },
    Heartbeat {
        task: TaskId,
        lease_token: String,
        progress: Option<Value>,
    },
    Complete {
        task: TaskId,
        lease_token: String,
        output: Value,
        logs: Option<Value>,
    },
    Fail {
        task: TaskId,
        lease_token: String,
        error: ReportedError,
        logs: Option<Value>,
    },
    CheckLater {
        task: TaskId,
        lease_token: String,
        after: Duration,
        progress: Option<Value>,
    },
    /// The worker handed the attempt to another system: release the lease and wait for a
    /// call through the attempt's callback token (at most `timeout`, by default the step's
    /// per-attempt timeout).
    AwaitCallback {
        task: TaskId,
        lease_token: String,
        timeout: Option<Duration>,
    },
    /// A call through a callback token; the engine found the task from the token and passes
    /// the hash of the token's secret, which the machine checks against the attempt's.
    Callback {
        task: TaskId,
        attempt: u32,
        token_hash: String,
        call: CallbackCall,
        /// A digest of the call's body (see [`CallbackAnswer::digest`]).
        digest: String,
    },
    /// A signal sent to the job.
    Signal {
        name: String,
        payload: Value,
        id: Option<String>,
        sender: String,
    },
    /// A person approves or rejects an approval step.
    Decide {
        task: TaskId,
        approve: bool,
        by: String,
        comment: Option<String>,
    },
    /// Time passed: handle lapsed leases, passed deadlines and ended waits.
    Tick,
    /// An operator acts on the job.
    Operator(OperatorCommand),
    /// A child job this job's task waits for ended (its parent link names the task); a job no
    /// longer waiting for it refuses this, changing nothing.
    ChildEnded {
        child: JobId,
        status: JobStatus,
        output: Option<Value>,
        /// Why it did not succeed, in words.
        error: Option<String>,
    },
    /// The child job of `StartChild` could not be made (its workflow is gone, its params do
    /// not fit, a limit): the step fails for good with this message.
    ChildNotStarted { child: JobId, message: String },
    /// This job succeeded as a child, and its parent rolls it back: its compensations run,
    /// then it ends `cancelled`.
    RollBack { by: JobId },
    /// A queued job got its lock slot (the engine keeps the slots): it starts now.
    Start,
    /// The worker whose lease an operator revoked (`Requeue`) was told so: its report under
    /// `lease_token` is being refused with the reason. The task need not wait for the revoked
    /// lease to lapse: it is claimable at once. Changes nothing otherwise.
    RevocationTold { task: TaskId, lease_token: String },
}

impl Input {
    /// The lease a worker's report is made under, if the input is such a report.
    pub fn reported_lease(&self) -> Option<(&TaskId, &str)> {
        match self {
            Input::Heartbeat {
                task, lease_token, ..
            }
            | Input::Complete {
                task, lease_token, ..
            }
            | Input::Fail {
                task, lease_token, ..
            }
            | Input::CheckLater {
                task, lease_token, ..
            }
            | Input::AwaitCallback {
                task, lease_token, ..
            } => Some((task, lease_token)),
            _ => None,
        }
    }
}

/// An operator's action, with who asked and why (both recorded in the history).
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorCommand {
    pub actor: String,
    pub reason: Option<String>,
    pub action: OperatorAction,
}

#[derive(Debug, Clone, PartialEq)]
pub enum OperatorAction {
    /// Dispatch nothing new; running tasks finish.
    Pause,
    Resume,
    /// Stop the job; with `compensate`, undo its finished steps first.
    Cancel {
        compensate: bool,
    },
    /// Continue a failed job from its failed tasks with fresh attempts, keeping finished work
    /// that was not undone.
    Retry,
    /// Mark a failed, waiting or ready task succeeded with this output (a manual fix).
    Skip {
        task: TaskId,
        output: Value,
    },
    /// Skip the task of this step (its one task; a `for_each` step's is refused as `Skip` of
    /// it is): the form of `Skip` that applies to many jobs at once, whose task ids differ.
    SkipStep {
        step: String,
        output: Value,
    },
    /// Reset a step and everything downstream of it, keeping the rest.
    Rerun {
        step: String,
    },
    /// Revoke a running task's lease and put it back to ready for a new attempt that does not
    /// count against `max_attempts`; claimable once the revoked lease would have lapsed.
    Requeue {
        task: TaskId,
    },
    /// Fail a waiting, ready or running task for good (no retry), with this message.
    FailTask {
        task: TaskId,
        message: String,
    },
}

impl OperatorAction {
    pub fn name(&self) -> &'static str {
        match self {
            OperatorAction::Pause => "pause",
            OperatorAction::Resume => "resume",
            OperatorAction::Cancel { .. } => "cancel",
            OperatorAction::Retry => "retry",
            OperatorAction::Skip { .. } | OperatorAction::SkipStep { .. } => "skip",
            OperatorAction::Rerun { .. } => "rerun",
            OperatorAction::Requeue { .. } => "requeue",
            OperatorAction::FailTask { .. } => "fail",
        }
    }
}

string_enum!(
    /// The operator actions that apply to every job a filter selects at once
    /// (`POST /jobs/bulk/{action}`): an action on a job, or deleting a finished job.
    BulkAction {
        Pause => "pause",
        Resume => "resume",
        Cancel => "cancel",
        Retry => "retry",
        Delete => "delete",
        Skip => "skip",
        Rerun => "rerun",
    }
);

/// Why an input was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("task {0} is not part of this job")]
    UnknownTask(TaskId),
    #[error(
        "the lease token does not match the task's current lease: another attempt owns the task now, or it has already finished ({status})"
    )]
    StaleLease { status: TaskStatus },
    /// A report under a lease an operator revoked (requeue): the worker must stop.
    #[error("{0}")]
    LeaseRevoked(String),
    #[error("task {task} is {status}, not ready")]
    NotReady { task: TaskId, status: TaskStatus },
    #[error("job is {0}: it dispatches nothing now")]
    JobNotDispatching(JobStatus),
    /// An operator action that does not apply to the job's current state.
    #[error("{0}")]
    NotApplicable(String),
    /// No step of the job's workflow waits for a signal of this name.
    #[error("no step of workflow {workflow} waits for a signal named '{name}'")]
    UnknownSignal { workflow: String, name: String },
    /// The job holds as many unconsumed signals as it may.
    #[error(
        "the job already holds {0} signals no step has taken (server setting --max-pending-signals)"
    )]
    TooManySignals(usize),
    /// A callback token that was never issued (or does not match the attempt it names).
    #[error("no such callback token")]
    UnknownCallback,
    /// A callback token whose attempt has ended or moved on.
    #[error("{0}")]
    CallbackGone(String),
}

string_enum!(
    /// What a history event records.
    EventKind {
        JobCreated => "job_created",
        JobCompensating => "job_compensating",
        JobSucceeded => "job_succeeded",
        JobFailed => "job_failed",
        JobTimedOut => "job_timed_out",
        JobCompensationFailed => "job_compensation_failed",
        TaskReady => "task_ready",
        TaskSkipped => "task_skipped",
        TaskClaimed => "task_claimed",
        TaskSucceeded => "task_succeeded",
        TaskFailed => "task_failed",
        TaskRetryScheduled => "task_retry_scheduled",
        TaskCheckLater => "task_check_later",
        TaskLeaseExpired => "task_lease_expired",
        TaskTimedOut => "task_timed_out",
        TaskCancelled => "task_cancelled",
        FanOutExpanded => "fan_out_expanded",
        CompensationPlanned => "compensation_planned",
        JobPaused => "job_paused",
        JobResumed => "job_resumed",
        JobCancelled => "job_cancelled",
        JobRetried => "job_retried",
        JobRerun => "job_rerun",
        TaskResolvedByOperator => "task_resolved_by_operator",
        JobQueued => "job_queued",
        JobStarted => "job_started",
        TaskWaiting => "task_waiting",
        SignalReceived => "signal_received",
        TaskApproved => "task_approved",
        TaskRejected => "task_rejected",
        TaskAwaitingCallback => "task_awaiting_callback",
        CallbackReceived => "callback_received",
        ChildEnded => "child_ended",
        TaskRequeued => "task_requeued",
    }
);

impl EventKind {
    /// Whether the event ends a worker's run of its task (a claim, up to its outcome): such an
    /// event of a claimed task carries the run's start in `claimed_at`.
    pub fn ends_a_run(self) -> bool {
        matches!(
            self,
            EventKind::TaskSucceeded
                | EventKind::TaskFailed
                | EventKind::TaskCheckLater
                | EventKind::TaskLeaseExpired
                | EventKind::TaskTimedOut
                | EventKind::TaskCancelled
                | EventKind::TaskRequeued
        )
    }
}

/// One entry of a job's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at: Timestamp,
    pub kind: EventKind,
    pub task: Option<TaskId>,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    /// Kind-specific facts (error message, retry time, reason), an object.
    pub detail: Value,
}

/// What the engine must do after an input, in the same transaction as the new state.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write the job row.
    SaveJob,
    /// Insert or update this task's row.
    SaveTask(TaskId),
    /// Append a history event.
    Record(Event),
    /// Tell the listeners of task events (webhooks) of an event that is not kept in the job's
    /// history: a worker's claim (`task_claimed`), whose time the task row keeps
    /// (`Task::claimed_at`) and the event that ends the run then records.
    Announce(Event),
    /// A task became ready on this queue: wake the workers polling it (after commit).
    /// `claimable`: it may be claimed now; otherwise from its `available_at` on (a retry
    /// after a delay, a check later), when the polls woken now wait for it.
    Wake { queue: String, claimable: bool },
    /// A queue template rendered this name for a task: create the queue if it is new.
    EnsureQueue { queue: String },
    /// A forward task on this queue failed for good (not a compensation, not a step that
    /// continues on failure, not an operator's `fail`): a queue set to `on_error: pause`
    /// pauses, giving `reason`.
    TaskFailedOnQueue { queue: String, reason: String },
    /// The job ended: free its lock slot and start the next job waiting for it.
    ReleaseLock { key: String },
    /// Keep a signal the job received.
    InsertSignal(Signal),
    /// A task took the signal with this `seq`.
    ConsumeSignal { seq: u32, task: TaskId },
    /// Create a child job for a sub-workflow step's attempt, in this transaction.
    StartChild(ChildStart),
    /// Act on a child job, in this transaction (parent first, then child).
    ToChild { child: JobId, command: ChildCommand },
}

/// A child job to create: who it is, whose it is, and what it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildStart {
    pub child: JobId,
    pub parent: ParentLink,
    pub workflow: String,
    pub version: u32,
    pub params: Value,
    pub priority: i32,
    /// The step's rendered `lock`, which the child holds as its own.
    pub lock: Option<JobLock>,
}

/// What a parent does to a child job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildCommand {
    Pause,
    Resume,
    Cancel {
        compensate: bool,
    },
    /// Undo a child that succeeded (the parent compensates).
    RollBack,
}
