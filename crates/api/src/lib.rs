//! The Starbridge HTTP API (`/api/v1`): its wire types, shared by the server, the CLI and the
//! worker SDK so they cannot drift apart, its paths ([`paths`]), and the typed client the CLI,
//! the SDK and the bench use (`client`, behind the default feature `client`). Times are RFC 3339
//! strings; ids are prefixed strings (`job_…`, `tsk_…`).
//!
//! Statuses, kinds, policies and scopes are the core's enums, re-exported here, each held as an
//! [`Open`] value: what this build knows is `Known`, a value only a newer server knows is read
//! as `Unknown(text)` instead of failing the whole answer (see [`starbridge_core::wire`]). The
//! JSON is the enum's text either way. A server refuses an `Unknown` in a request.

#[cfg(feature = "client")]
pub mod client;
pub mod paths;
mod waits;

pub use waits::{
    ApprovalList, ApprovalListQuery, ApprovalView, ApprovalWait, AwaitCallbackRequest,
    CallbackAnswer, CallbackCompleteRequest, CallbackFailRequest, CallbackWait, DecisionRequest,
    SignalAccepted, SignalRequest, WaitingFor,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use jiff::Timestamp;
pub use starbridge_core::dispatch::QueueMode;
pub use starbridge_core::model::{
    AttemptOutcome, BulkAction, ErrorKind, EventKind, JobStatus, TaskKind, TaskStatus,
};
pub use starbridge_core::schedule::{CatchUpKind, Overlap};
pub use starbridge_core::scope::Scope;
pub use starbridge_core::wire::{DatabaseHealth, DeliveryState, HealthStatus, Open, WireEnum};

/// The namespace used when a request names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Converts milliseconds since the epoch to an API time.
pub fn timestamp_from_millis(millis: i64) -> Timestamp {
    Timestamp::from_millisecond(millis).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `?namespace=` on every endpoint; `default` when absent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NamespaceQuery {
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppliedWorkflow {
    pub namespace: String,
    pub name: String,
    pub version: u32,
    /// False when the body matched the latest version, which is returned unchanged.
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkflowSummary {
    pub namespace: String,
    pub name: String,
    pub version: u32,
    pub description: Option<String>,
    pub steps: usize,
    pub created_at: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkflowDetail {
    #[serde(flatten)]
    pub summary: WorkflowSummary,
    pub definition: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkflowList {
    pub items: Vec<WorkflowSummary>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    /// Name of an applied workflow (or give `definition` inline).
    pub workflow: Option<String>,
    /// A version of `workflow`; the latest when absent.
    pub version: Option<u32>,
    /// An inline definition, applied (as a new version when changed) and run.
    pub definition: Option<Value>,
    #[serde(default)]
    pub params: Option<Value>,
    /// Client key: a second submit with the same key returns the first job.
    pub key: Option<String>,
    pub priority: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskError {
    pub message: String,
    pub retryable: bool,
    pub kind: Open<ErrorKind>,
}

/// One run of a task by a worker: from its claim to its outcome. A "check later" ends a run but
/// not the attempt, so one attempt may have several runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: u32,
    pub worker_id: Option<String>,
    pub started_at: Timestamp,
    pub ended_at: Option<Timestamp>,
    pub outcome: Open<AttemptOutcome>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskView {
    pub id: String,
    pub step: String,
    pub kind: Open<TaskKind>,
    pub item: Option<u32>,
    pub compensates: Option<String>,
    pub queue: String,
    pub command: String,
    pub status: Open<TaskStatus>,
    pub attempt: u32,
    pub max_attempts: u32,
    pub priority: i32,
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<TaskError>,
    pub progress: Option<Value>,
    pub logs: Option<Value>,
    pub worker_id: Option<String>,
    pub created_at: Timestamp,
    pub ready_at: Option<Timestamp>,
    pub available_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub lease_expires_at: Option<Timestamp>,
    pub deadline_at: Option<Timestamp>,
    /// Every run of this task, oldest first (from the job's history).
    pub attempts: Vec<AttemptView>,
    /// Why the task is not running yet (`waiting for a, b`, `queue q paused`, `retry in 4s`,
    /// `no worker polling queue q for 5m`, …), or what a running task waits for (`sleeping
    /// until …`, `waiting for signal s`, `waiting for approval`, `waiting for a callback`);
    /// `null` when nothing holds it back.
    pub waiting_reason: Option<String>,
    /// What a running task waits for on the server, holding no worker; `null` otherwise.
    #[serde(default)]
    pub waiting_for: Option<WaitingFor>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: String,
    pub namespace: String,
    pub workflow: String,
    pub version: u32,
    pub status: Open<JobStatus>,
    pub key: Option<String>,
    pub priority: i32,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub deadline_at: Option<Timestamp>,
    /// Why the job failed or is compensating.
    pub error: Option<String>,
    /// The lock the job needs, if its workflow has one.
    pub lock: Option<String>,
    /// Why a queued or paused job is not moving (`waiting for lock k (5/5 held)`).
    pub waiting_reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub params: Value,
    pub tasks: Vec<TaskView>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobListQuery {
    pub namespace: Option<String>,
    pub status: Option<Open<JobStatus>>,
    pub workflow: Option<String>,
    /// Only jobs created at or after this time (RFC 3339).
    pub created_after: Option<String>,
    /// Only jobs created before this time (RFC 3339).
    pub created_before: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// Which jobs a bulk action applies to (`POST /jobs/bulk/{action}`), and why.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    pub workflow: Option<String>,
    pub status: Option<Open<JobStatus>>,
    /// RFC 3339.
    pub created_after: Option<String>,
    /// RFC 3339.
    pub created_before: Option<String>,
    pub reason: Option<String>,
    /// For `cancel`: undo finished steps first.
    #[serde(default)]
    pub compensate: bool,
    /// Most jobs to act on (default 1000, at most 10000).
    pub limit: Option<u32>,
}

/// A job a bulk action did not apply to, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkRefusal {
    pub id: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkResult {
    /// Jobs the filter selected.
    pub matched: u64,
    /// Jobs the action was applied to.
    pub affected: u64,
    /// The first 100 jobs it did not apply to, with the reason.
    pub refused: Vec<BulkRefusal>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobList {
    pub items: Vec<JobSummary>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventView {
    pub seq: i64,
    pub at: Timestamp,
    pub kind: Open<EventKind>,
    pub task_id: Option<String>,
    pub step: Option<String>,
    pub attempt: Option<u32>,
    pub worker_id: Option<String>,
    pub detail: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventList {
    pub items: Vec<EventView>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollRequest {
    pub worker_id: String,
    pub queues: Vec<String>,
    pub max_tasks: Option<u32>,
    pub wait_ms: Option<u64>,
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeasedTask {
    pub id: String,
    pub lease_token: String,
    pub job_id: String,
    pub step: String,
    pub kind: Open<TaskKind>,
    pub item: Option<u32>,
    pub queue: String,
    pub command: String,
    pub input: Value,
    pub attempt: u32,
    pub idempotency_key: String,
    pub lease_expires_at: Timestamp,
    /// How long a lease lasts; heartbeat well within it.
    pub lease_ms: u64,
    /// Progress recorded by an earlier "check later" of this attempt.
    pub progress: Option<Value>,
    /// The attempt's callback token: another system may finish the attempt with it
    /// (`/api/v1/callbacks/{token}/…`) after the worker's `await-callback`. Shown only here.
    #[serde(default)]
    pub callback_token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PollResponse {
    pub tasks: Vec<LeasedTask>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub lease_token: String,
    pub progress: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    pub lease_expires_at: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    pub lease_token: String,
    #[serde(default)]
    pub output: Value,
    pub logs: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedError {
    pub message: String,
    #[serde(default = "default_true")]
    pub retryable: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    pub lease_token: String,
    pub error: ReportedError,
    pub logs: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckLaterRequest {
    pub lease_token: String,
    pub after_ms: u64,
    pub progress: Option<Value>,
}

/// Body of `pause`, `resume` and `retry` (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// Why, recorded in the job's history.
    pub reason: Option<String>,
}

/// Body of `cancel` (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    pub reason: Option<String>,
    /// Undo the finished steps (run their compensations) before ending `cancelled`.
    #[serde(default)]
    pub compensate: bool,
}

/// Body of `skip`: the output downstream steps will see.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipRequest {
    #[serde(default)]
    pub output: Value,
    pub reason: Option<String>,
}

/// Body of `rerun`: the step to run again with everything downstream of it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    pub step: String,
    pub reason: Option<String>,
}

/// A queue's settings and what it holds now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueView {
    pub namespace: String,
    pub name: String,
    /// `parallel` or `serial` (at most one running task, in dispatch order).
    pub mode: Open<QueueMode>,
    /// Higher is served first among the queues a worker polls.
    pub priority: i32,
    /// Most running tasks at once; `null`: no limit.
    pub concurrency: Option<u32>,
    /// A paused queue keeps its tasks but hands none out.
    pub paused: bool,
    /// A ready task older than this goes ahead of priority order, oldest first.
    pub max_wait_ms: u64,
    /// At most `tokens` task starts per `per_ms`; `null`: no rate limit.
    pub rate: Option<RateView>,
    /// Ready tasks (including those waiting for a retry or check-later time).
    pub ready: u64,
    pub running: u64,
    /// How long the oldest claimable ready task has waited, in milliseconds.
    pub oldest_ready_age_ms: u64,
    pub created_at: Timestamp,
    pub updated_at: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateView {
    pub tokens: u32,
    pub per_ms: u64,
}

/// A queue's rate limit as set: `tokens` starts per `per` (a duration like `"1m"` or seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSettings {
    pub tokens: u32,
    pub per: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueList {
    pub items: Vec<QueueView>,
}

/// Changes to a queue's settings (`PUT /queues/{name}`); an absent field stays as it is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    pub mode: Option<Open<QueueMode>>,
    pub priority: Option<i32>,
    /// A number sets the limit; `null` removes it.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub concurrency: Option<Option<u32>>,
    /// A duration (`"5m"`) or a number of seconds.
    pub max_wait: Option<Value>,
    /// An object sets the rate limit; `null` removes it.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub rate: Option<Option<RateSettings>>,
}

/// Tells an absent field (`None`) from an explicit `null` (`Some(None)`).
fn present_or_null<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// What to do with fires missed while the server was down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatchUpPolicy {
    /// `skip` (drop missed fires; a fire less than a minute late still runs), `once` (run the
    /// latest missed fire once) or `all` (run every missed fire, at most `limit`).
    pub policy: Open<CatchUpKind>,
    pub limit: Option<u32>,
}

/// A schedule to create or replace (`PUT /schedules/{name}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    pub workflow: String,
    #[serde(default)]
    pub params: Option<Value>,
    /// 5 fields (`0 3 * * *`), 6 with seconds first, or a nickname such as `@hourly`.
    pub cron: String,
    /// An IANA time zone; `UTC` when absent.
    pub timezone: Option<String>,
    /// `skip` (default), `allow` or `queue_one`: what a fire does while the previous job runs.
    pub overlap: Option<Open<Overlap>>,
    pub catch_up: Option<CatchUpPolicy>,
    #[serde(default)]
    pub paused: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleView {
    pub namespace: String,
    pub name: String,
    pub workflow: String,
    pub params: Value,
    pub cron: String,
    pub timezone: String,
    pub overlap: Open<Overlap>,
    pub catch_up: CatchUpPolicy,
    pub paused: bool,
    /// The next fire times (up to 5; none while paused).
    pub next_fires: Vec<Timestamp>,
    pub pending_fire_at: Option<Timestamp>,
    pub last_fire_at: Option<Timestamp>,
    pub last_job_id: Option<String>,
    /// Why the last fire could not start its job, if it could not.
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleList {
    pub items: Vec<ScheduleView>,
}

/// A webhook subscription to create (`POST /webhooks`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    /// Where to POST each job status change (http or https).
    pub url: String,
    /// Only jobs of this workflow (all when absent).
    pub workflow: Option<String>,
    /// Only these job statuses (all when absent or empty).
    #[serde(default)]
    pub states: Vec<Open<JobStatus>>,
    /// The signing secret (16 to 256 bytes); one is generated when absent.
    pub secret: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookView {
    pub id: String,
    pub namespace: String,
    pub url: String,
    pub workflow: Option<String>,
    pub states: Vec<Open<JobStatus>>,
    pub created_at: Timestamp,
    /// The signing secret: returned only when the subscription is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookList {
    pub items: Vec<WebhookView>,
}

/// One message to a subscription and how its delivery went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryView {
    pub id: i64,
    pub job_id: String,
    /// The job status the message reports.
    pub status: Open<JobStatus>,
    pub payload: Value,
    pub created_at: Timestamp,
    pub attempts: u32,
    pub state: Open<DeliveryState>,
    pub next_attempt_at: Option<Timestamp>,
    pub delivered_at: Option<Timestamp>,
    /// HTTP status of the last attempt.
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryList {
    pub items: Vec<DeliveryView>,
}

/// Most items in one batch request (`POST /jobs/batch`, `POST /tasks/complete`).
pub const MAX_BATCH_ITEMS: usize = 1000;

/// Several jobs in one request (`POST /jobs/batch`), each submitted as by `POST /jobs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitJobs {
    pub jobs: Vec<SubmitJob>,
}

/// One job of a batch submit: created, or found by its `key`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmittedJob {
    pub id: String,
    pub status: Open<JobStatus>,
    /// False when the `key` named an existing job, which is returned instead.
    pub created: bool,
}

/// One item's answer in a batch request, in the order of the request: its result, or the
/// problem that refused it (nothing of that item changed; the other items are not affected).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BatchItem<T> {
    Done(T),
    Refused { error: Problem },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitJobsResponse {
    pub items: Vec<BatchItem<SubmittedJob>>,
}

/// One task of a batch completion: its id and what `POST /tasks/{id}/complete` takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteTask {
    pub id: String,
    pub lease_token: String,
    #[serde(default)]
    pub output: Value,
    pub logs: Option<Value>,
}

/// Several successful attempts reported in one request (`POST /tasks/complete`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteTasks {
    pub tasks: Vec<CompleteTask>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompleteTasksResponse {
    pub items: Vec<BatchItem<ReportResponse>>,
}

/// What a report (complete, fail, check-later) changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportResponse {
    pub task_status: Open<TaskStatus>,
    pub job_status: Open<JobStatus>,
}

/// One field-level problem inside a problem document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldProblem {
    pub field: String,
    pub message: String,
}

/// An RFC 9457 problem document (`application/problem+json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldProblem>,
    /// The limit a request went over (`/problems/limit-exceeded`), and how to change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Box<ProblemLimit>>,
}

/// A server limit named by a problem: its setting, its value, and where it is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemLimit {
    /// The setting, e.g. `max_params_bytes`.
    pub name: String,
    /// Its value in force (bytes, items or characters, as the name says).
    pub value: u64,
    /// The `starbridge server` flag that sets it, e.g. `--max-params-bytes`.
    pub flag: String,
    /// The environment variable that sets it, e.g. `STARBRIDGE_MAX_PARAMS_BYTES`.
    pub env: String,
}

/// `GET /healthz`: whether the server reads and writes its database (`503` unless `ok`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    pub status: Open<HealthStatus>,
    pub database: Open<DatabaseHealth>,
    /// What the answer rests on: the last write's age and outcome, a probe write's, or a failed
    /// read.
    pub detail: String,
}

/// An API token as listed (its secret is never shown again after creation).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    /// The only namespace it acts in; absent: every namespace.
    pub namespace: Option<String>,
    pub scopes: Vec<Open<Scope>>,
    /// The queues a `work` token may serve; absent: every queue.
    pub queues: Option<Vec<String>>,
    pub created_at: Timestamp,
    pub created_by: String,
    pub last_used_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

/// `POST /api/v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    pub name: String,
    pub scopes: Vec<Open<Scope>>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub queues: Option<Vec<String>>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// A new token with its secret, shown only in this answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreatedToken {
    pub token: TokenView,
    /// Send as `Authorization: Bearer <secret>`; store it now, it cannot be shown again.
    pub secret: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenList {
    pub items: Vec<TokenView>,
}

/// One accepted change, as the audit log keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEntryView {
    pub seq: i64,
    pub at: Timestamp,
    pub namespace: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub status: u16,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditList {
    pub items: Vec<AuditEntryView>,
    /// Pass as `before` for the next (older) page.
    pub next_cursor: Option<i64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A task view as a newer server might send it, with `kind` and `status` given.
    fn task_json(kind: &str, status: &str) -> Value {
        json!({
            "id": "tsk_1", "step": "a", "kind": kind, "item": null, "compensates": null,
            "queue": "q", "command": "c", "status": status, "attempt": 1, "max_attempts": 3,
            "priority": 0, "input": null, "output": null,
            "error": {"message": "m", "retryable": true, "kind": "quota"},
            "progress": null, "logs": null, "worker_id": "w",
            "created_at": "2026-01-01T00:00:00Z", "ready_at": null, "available_at": null,
            "started_at": null, "ended_at": null, "lease_expires_at": null, "deadline_at": null,
            "attempts": [{
                "attempt": 1, "worker_id": "w", "started_at": "2026-01-01T00:00:00Z",
                "ended_at": null, "outcome": "preempted", "error": null,
            }],
            "waiting_reason": null, "waiting_for": null,
        })
    }

    fn leased_json(kind: &str) -> Value {
        json!({
            "id": "tsk_1", "lease_token": "l", "job_id": "job_1", "step": "a", "kind": kind,
            "item": null, "queue": "q", "command": "c", "input": {}, "attempt": 1,
            "idempotency_key": "tsk_1:1", "lease_expires_at": "2026-01-01T00:00:00Z",
            "lease_ms": 30000, "progress": null, "callback_token": "sbc_t",
        })
    }

    fn unknown<T>(text: &str) -> Open<T> {
        Open::Unknown(text.to_owned())
    }

    #[test]
    fn a_job_view_with_values_this_build_does_not_know_still_reads() {
        let body = json!({
            "id": "job_1", "namespace": "default", "workflow": "wf", "version": 1,
            "status": "hibernating", "key": null, "priority": 0,
            "created_at": "2026-01-01T00:00:00Z", "params": {},
            "tasks": [task_json("sidecar", "parked"), task_json("step", "running")],
        });
        let job: JobView = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(job.summary.status, unknown("hibernating"));
        let task = &job.tasks[0];
        assert_eq!(task.kind, unknown("sidecar"));
        assert_eq!(task.status, unknown("parked"));
        assert_eq!(task.error.as_ref().unwrap().kind, unknown("quota"));
        assert_eq!(task.attempts[0].outcome, unknown("preempted"));
        assert_eq!(job.tasks[1].kind, Open::Known(TaskKind::Step));
        assert_eq!(job.tasks[1].status, TaskStatus::Running);
        // Written back, the unknown values are the text that came in.
        let written = serde_json::to_value(&job).unwrap();
        assert_eq!(written["status"], body["status"]);
        assert_eq!(written["tasks"], body["tasks"]);
    }

    #[test]
    fn a_leased_task_of_an_unknown_kind_still_reads() {
        let task: LeasedTask = serde_json::from_value(leased_json("probe")).unwrap();
        assert_eq!(task.kind, unknown("probe"));
        let poll: PollResponse = serde_json::from_value(json!({
            "tasks": [leased_json("probe"), leased_json("item")],
        }))
        .unwrap();
        assert_eq!(poll.tasks[0].kind, unknown("probe"));
        assert_eq!(poll.tasks[1].kind, TaskKind::Item);
    }

    #[test]
    fn answers_with_other_unknown_values_still_read() {
        let report: ReportResponse =
            serde_json::from_value(json!({"task_status": "parked", "job_status": "running"}))
                .unwrap();
        assert_eq!(report.task_status, unknown("parked"));
        assert_eq!(report.job_status, JobStatus::Running);
        let event: EventView = serde_json::from_value(json!({
            "seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "job_hibernated",
            "task_id": null, "step": null, "attempt": null, "worker_id": null, "detail": {},
        }))
        .unwrap();
        assert_eq!(event.kind, unknown("job_hibernated"));
        let health: Health = serde_json::from_value(
            json!({"status": "degraded", "database": "slow", "detail": "d"}),
        )
        .unwrap();
        assert_eq!(health.status, unknown("degraded"));
        assert_eq!(health.database, unknown("slow"));
    }

    /// Every value of `T` is written as the string listed (today's JSON) and read back as
    /// itself; the list is `T::ALL`, in order.
    fn pinned<T: WireEnum>(texts: &[&str]) {
        let written: Vec<Value> = T::ALL
            .iter()
            .map(|&value| serde_json::to_value(Open::Known(value)).unwrap())
            .collect();
        assert_eq!(written, texts.iter().map(|t| json!(t)).collect::<Vec<_>>());
        for (&value, text) in T::ALL.iter().zip(texts) {
            let read: Open<T> = serde_json::from_value(json!(text)).unwrap();
            assert_eq!(read, Open::Known(value));
        }
    }

    #[test]
    fn every_value_keeps_its_json() {
        pinned::<JobStatus>(&[
            "queued",
            "running",
            "paused",
            "compensating",
            "succeeded",
            "failed",
            "compensation_failed",
            "cancelled",
            "timed_out",
        ]);
        pinned::<TaskStatus>(&[
            "waiting",
            "ready",
            "running",
            "succeeded",
            "failed",
            "skipped",
            "cancelled",
        ]);
        pinned::<TaskKind>(&["step", "fan_out", "item", "compensation"]);
        pinned::<ErrorKind>(&[
            "handler",
            "lease_expired",
            "step_timeout",
            "expression",
            "callback_timeout",
            "rejected",
        ]);
        pinned::<EventKind>(&[
            "job_created",
            "job_compensating",
            "job_succeeded",
            "job_failed",
            "job_timed_out",
            "job_compensation_failed",
            "task_ready",
            "task_skipped",
            "task_claimed",
            "task_succeeded",
            "task_failed",
            "task_retry_scheduled",
            "task_check_later",
            "task_lease_expired",
            "task_timed_out",
            "task_cancelled",
            "fan_out_expanded",
            "compensation_planned",
            "job_paused",
            "job_resumed",
            "job_cancelled",
            "job_retried",
            "job_rerun",
            "task_resolved_by_operator",
            "job_queued",
            "job_started",
            "task_waiting",
            "signal_received",
            "task_approved",
            "task_rejected",
            "task_awaiting_callback",
            "callback_received",
        ]);
        pinned::<AttemptOutcome>(&[
            "running",
            "succeeded",
            "failed",
            "check_later",
            "lease_expired",
            "timed_out",
            "cancelled",
        ]);
        pinned::<BulkAction>(&["pause", "resume", "cancel", "retry"]);
        pinned::<QueueMode>(&["parallel", "serial"]);
        pinned::<Overlap>(&["skip", "allow", "queue_one"]);
        pinned::<CatchUpKind>(&["skip", "once", "all"]);
        pinned::<Scope>(&["admin", "operate", "submit", "work", "read"]);
        pinned::<HealthStatus>(&["ok", "unhealthy"]);
        pinned::<DatabaseHealth>(&["ok", "full", "read_only", "unavailable"]);
        pinned::<DeliveryState>(&["pending", "delivered", "failed"]);
    }

    #[test]
    fn requests_carry_unknown_text_to_the_server_unchanged() {
        let query = JobListQuery {
            status: Some("hibernating".parse().unwrap()),
            ..JobListQuery::default()
        };
        assert_eq!(
            serde_json::to_value(&query).unwrap()["status"],
            "hibernating"
        );
        let request: WebhookRequest =
            serde_json::from_value(json!({"url": "u", "states": ["failed", "gone"]})).unwrap();
        assert_eq!(
            request.states,
            [Open::Known(JobStatus::Failed), unknown("gone")]
        );
    }
}
