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
#[cfg(feature = "openapi")]
pub mod openapi;
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
#[cfg(feature = "openapi")]
pub use starbridge_core::definition::WorkflowDefinition;
pub use starbridge_core::dispatch::{OnError, QueueMode};
pub use starbridge_core::labels::Labels;
pub use starbridge_core::model::{
    AttemptOutcome, BulkAction, ErrorKind, EventKind, JobStatus, TaskKind, TaskStatus,
};
pub use starbridge_core::schedule::{CatchUpKind, Overlap};
pub use starbridge_core::scope::Scope;
pub use starbridge_core::webhook::{MAX_WEBHOOK_STEPS, WebhookEvent};
pub use starbridge_core::wire::{DatabaseHealth, DeliveryState, HealthStatus, Open, WireEnum};

/// The namespace used when a request names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Converts milliseconds since the epoch to an API time.
pub fn timestamp_from_millis(millis: i64) -> Timestamp {
    Timestamp::from_millisecond(millis).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `?namespace=` on every endpoint; `default` when absent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct NamespaceQuery {
    /// The namespace; `default` when absent (with `--auth`, the token's namespace when it is
    /// bound to one). A malformed name is a 400; with `--auth`, a namespace other than the one a
    /// token is bound to is a 404.
    #[cfg_attr(
        feature = "openapi",
        param(pattern = "^[a-z0-9_.-]{1,128}$", default = "default")
    )]
    pub namespace: Option<String>,
}

/// The result of applying a definition.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AppliedWorkflow {
    pub namespace: String,
    pub name: String,
    /// The new version, or the latest one when the body was unchanged.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub version: u32,
    /// False when the body matched the latest version, which is returned unchanged.
    pub created: bool,
}

/// The latest (or a given) version of a workflow.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowSummary {
    pub namespace: String,
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub version: u32,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub description: Option<String>,
    /// How many steps the definition has.
    pub steps: usize,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
}

/// A workflow version with its definition: the fields of WorkflowSummary plus `definition`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowDetail {
    #[serde(flatten)]
    pub summary: WorkflowSummary,
    /// The definition as stored (normalized JSON).
    #[cfg_attr(feature = "openapi", schema(value_type = WorkflowDefinition))]
    pub definition: Value,
}

/// The latest version of every workflow of the namespace, by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowList {
    pub items: Vec<WorkflowSummary>,
}

/// A job to start: name an applied `workflow` (and optionally a `version`), or give an inline
/// `definition` (applied as a new version when changed).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    /// Name of an applied workflow; with `definition`, the name to apply it as (else the
    /// definition's `name`).
    pub workflow: Option<String>,
    /// A version of `workflow`; the latest when absent.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 4294967295u64))]
    pub version: Option<u32>,
    /// An inline definition, applied and run.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<WorkflowDefinition>))]
    pub definition: Option<Value>,
    /// Job params (default `{}`), checked against the workflow's `params` schema. Any JSON is
    /// accepted by the parser; a non-object is refused with 422.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Value>,
    /// Client key, 1 to 256 characters (else 422): a second submit with the same key returns the
    /// first job (200). A key of another workflow's job is a 409.
    pub key: Option<String>,
    /// Job priority (higher runs first); the workflow's when absent.
    pub priority: Option<i32>,
    /// The job's labels, merged over its workflow's `labels` (a key in both takes this value):
    /// keys of 1 to 63 characters of `a-z0-9_./-`, values of at most 255 bytes without NUL, at
    /// most the server's `--max-labels` (default 32) once merged; else 422 naming the label.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// Why a task failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskError {
    pub message: String,
    pub retryable: bool,
    #[cfg_attr(feature = "openapi", schema(value_type = ErrorKind))]
    pub kind: Open<ErrorKind>,
}

/// One run of a task by a worker, from its claim to its outcome. A check-later ends a run but not
/// the attempt, so one attempt may have several runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 4294967295u64))]
    pub attempt: u32,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub worker_id: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub started_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub ended_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = AttemptOutcome))]
    pub outcome: Open<AttemptOutcome>,
    /// The error message of a failed run.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub error: Option<String>,
}

/// One task of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskView {
    /// `tsk_…`
    pub id: String,
    pub step: String,
    #[cfg_attr(feature = "openapi", schema(value_type = TaskKind))]
    pub kind: Open<TaskKind>,
    /// The fan-out item index, for `item` tasks.
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 0, maximum = 4294967295u64)
    )]
    pub item: Option<u32>,
    /// The task this compensation undoes.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub compensates: Option<String>,
    pub queue: String,
    pub command: String,
    #[cfg_attr(feature = "openapi", schema(value_type = TaskStatus))]
    pub status: Open<TaskStatus>,
    /// The current attempt, 1-based; 0 before the first claim.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 4294967295u64))]
    pub attempt: u32,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub max_attempts: u32,
    pub priority: i32,
    /// The task's input once evaluated, else null.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub input: Option<Value>,
    /// The task's output once it succeeded, else null.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub output: Option<Value>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub error: Option<TaskError>,
    /// Progress recorded by a heartbeat or check-later, else null.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub progress: Option<Value>,
    /// Size-bounded output of the last attempt, else null.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub logs: Option<Value>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub worker_id: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub ready_at: Option<Timestamp>,
    /// A ready task is claimable from this time on.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub available_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub started_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub ended_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub lease_expires_at: Option<Timestamp>,
    /// The step's overall timeout.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub deadline_at: Option<Timestamp>,
    /// Every run of this task, oldest first (from the job's history).
    pub attempts: Vec<AttemptView>,
    /// Why the task is not running yet, for people (the wording may change): `waiting for a, b` (a
    /// waiting task's unfinished dependencies), `job paused`, `retry in 4s` or `check again in 4s`,
    /// `waiting for lock db-x (2/2 held)` or `rate limited on key t1 (10 per 1m)` (a task parked
    /// by its step's `lock` or `rate`), `queue q paused`, `queue q rate limited (10 per 1m)`, `queue q at its limit (2/2 running)`,
    /// `no worker has polled queue q yet`, `no worker has polled queue q since the server started`,
    /// `no worker polling queue q for 5m` (after 5 minutes without a poll); for a running task
    /// that waits on the server (see `waiting_for`), what it waits for: `sleeping until <time>`,
    /// `waiting for signal <name>`, `waiting for approval`, `waiting for a callback until <time>`
    /// (with `(job paused)`, or `: answered, taking effect when the job resumes`); null when
    /// nothing holds it back.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub waiting_reason: Option<String>,
    /// What a running task waits for on the server, holding no worker; `null` otherwise.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub waiting_for: Option<WaitingFor>,
    /// A sub-workflow step's child job (`job_…`) of its latest attempt; for a compensation, the
    /// child it rolls back; `null` otherwise.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub child: Option<String>,
}

/// A job without its tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobSummary {
    /// `job_…`
    pub id: String,
    pub namespace: String,
    pub workflow: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub version: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = JobStatus))]
    pub status: Open<JobStatus>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub key: Option<String>,
    pub priority: i32,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub started_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub ended_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub deadline_at: Option<Timestamp>,
    /// Why the job failed, is compensating or was cancelled with compensation.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub error: Option<String>,
    /// The key of the lock the job must hold to run, rendered from its workflow's `lock.key`; null
    /// when its workflow has no lock.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub lock: Option<String>,
    /// Why the job is not moving, for people (the wording may change): `waiting for lock <key>
    /// (<held>/<slots> held)` for a queued job waiting for its lock (`waiting for lock <key>` in a
    /// list of jobs, which does not count the holders), `paused by an operator` for a paused job;
    /// null otherwise (see each task's `waiting_reason`).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub waiting_reason: Option<String>,
    /// The job's labels: its workflow's merged with its submission's; `{}` when none.
    #[serde(default)]
    pub labels: Labels,
    /// The steps whose terminal failure the job went on past (`continue_on_failure`), in the
    /// order they were created: set when the job succeeded, empty otherwise.
    #[serde(default)]
    pub failed_steps: Vec<String>,
    /// For a sub-workflow's child job: the parent's task (and attempt) that started it; null
    /// otherwise.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub parent: Option<JobParent>,
}

/// Where a child job comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobParent {
    /// The parent job (`job_…`).
    pub job: String,
    /// The parent's task (`tsk_…`) of the sub-workflow step.
    pub task: String,
    /// The task's attempt that started this child.
    pub attempt: u32,
}

/// A job with its params and tasks: the fields of JobSummary plus `params` and `tasks`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    #[serde(flatten)]
    pub summary: JobSummary,
    /// The job's params.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: Value,
    /// The workflow's `output`, rendered when the job succeeded; null before, when the job did
    /// not succeed, or when its workflow has no `output`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>, required = true))]
    pub output: Option<Value>,
    /// The current child job (`job_…`) of each sub-workflow task, in task order (`GET
    /// /api/v1/jobs?parent=` lists every attempt's).
    #[serde(default)]
    pub children: Vec<String>,
    /// In creation order.
    pub tasks: Vec<TaskView>,
}

/// The query of `GET /api/v1/jobs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct JobListQuery {
    /// As [`NamespaceQuery`], which documents it.
    #[cfg_attr(feature = "openapi", param(ignore))]
    pub namespace: Option<String>,
    /// Only jobs with this status.
    #[cfg_attr(feature = "openapi", param(value_type = Option<JobStatus>))]
    pub status: Option<Open<JobStatus>>,
    /// Only jobs of this workflow.
    pub workflow: Option<String>,
    /// Only jobs created at or after this time: RFC 3339, such as `2026-11-22T10:00:00Z`
    /// (percent-encode a `+` offset as `%2B`); a malformed time is a 400.
    #[cfg_attr(feature = "openapi", param(format = DateTime))]
    pub created_after: Option<String>,
    /// Only jobs created strictly before this time: RFC 3339, as `created_after`; a malformed
    /// time is a 400.
    #[cfg_attr(feature = "openapi", param(format = DateTime))]
    pub created_before: Option<String>,
    /// Page size, at least 1 (else 400) and at most the server's page limit (`--max-page-size`;
    /// the 1000 shown is its default; over it is a 422).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000, default = 50))]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page; anything else is a 400.
    #[cfg_attr(feature = "openapi", param(pattern = "^job_[A-Za-z0-9-]{1,64}$"))]
    pub cursor: Option<String>,
    /// Only the child jobs this job's sub-workflow steps started (every attempt's); a value
    /// that is not a job id is a 400.
    pub parent: Option<String>,
    /// Only jobs with every one of these labels, each `key=value`: sent as repeated `label`
    /// parameters, which the query string's form cannot carry in this struct (the client adds
    /// them; the server reads them from the raw query).
    #[serde(skip)]
    pub labels: Vec<String>,
}

/// Which jobs a bulk action applies to, and why. The fields given combine; a field left out (or
/// `null`) does not filter.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// Only jobs of this workflow (not checked: a name no job has matches nothing).
    pub workflow: Option<String>,
    /// Only jobs with this status; any other value is a 400 (the field is `status`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<JobStatus>))]
    pub status: Option<Open<JobStatus>>,
    /// Only jobs created at or after this time (RFC 3339; else 400).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_after: Option<String>,
    /// Only jobs created strictly before this time (RFC 3339; else 400).
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_before: Option<String>,
    /// Only jobs with every one of these labels (a key of 1 to 63 characters of `a-z0-9_./-`, a
    /// value of at most 255 bytes without NUL; else 400 naming the label).
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Only these jobs (`job_…`), 1 to 10000 of them: an id that is not a job id is a 400 naming
    /// it (`ids[2]`), an empty list a 400 (`ids`); an id no job of the namespace has matches
    /// nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10000))]
    pub ids: Option<Vec<String>>,
    /// Why, recorded in each job's history; at most 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
    /// With `cancel`: undo each job's finished steps (run their compensations) before it ends
    /// `cancelled`. Ignored by the other actions.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = false))]
    pub compensate: bool,
    /// Required with `skip` (the step whose task is skipped) and `rerun` (the step run again,
    /// with everything downstream of it); absent, a 400 (`step`). Ignored by the other actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub step: Option<String>,
    /// With `skip`: the output downstream steps will see (default null). Ignored by the other
    /// actions.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub output: Value,
    /// Only count: select the jobs and answer how many (`matched`) without acting on any
    /// (`affected` 0, `refused` empty; `step` is not needed). What a confirmation shows before
    /// the action.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = false))]
    pub dry_run: bool,
    /// Most jobs to select, newest first: 1 to 10000 (else 400); when absent, 1000, or the
    /// number of `ids` when they are given.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 10000, default = 1000)
    )]
    pub limit: Option<u32>,
}

/// A selected job the action did not apply to.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BulkRefusal {
    /// `job_…`
    pub id: String,
    /// Why, as a single action's 409 would say.
    pub reason: String,
}

/// What a bulk action did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BulkResult {
    /// Jobs the filter selected (at most `limit`).
    pub matched: u64,
    /// Jobs the action was applied to.
    pub affected: u64,
    /// The selected jobs the action did not apply to, with the reason: the first 100 (`matched -
    /// affected` counts them all).
    #[cfg_attr(feature = "openapi", schema(max_items = 100))]
    pub refused: Vec<BulkRefusal>,
}

/// A page of jobs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobList {
    pub items: Vec<JobSummary>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub next_cursor: Option<String>,
}

/// One entry of a job's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventView {
    /// Increasing across all jobs: above the `seq` of every event stored before it (on SQLite
    /// the `seq` of deleted history may be given again). Pass the last one as `after` to read
    /// on.
    pub seq: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub at: Timestamp,
    #[cfg_attr(feature = "openapi", schema(value_type = EventKind))]
    pub kind: Open<EventKind>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub task_id: Option<String>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub step: Option<String>,
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 0, maximum = 4294967295u64)
    )]
    pub attempt: Option<u32>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub worker_id: Option<String>,
    /// Kind-specific facts: error message, retry time, actor and reason of an operator action, …
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub detail: Value,
}

/// History events, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList {
    pub items: Vec<EventView>,
}

/// A worker's request for tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PollRequest {
    /// 1 to 128 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 128))]
    pub worker_id: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = openapi::queue_names))]
    pub queues: Vec<String>,
    /// Most tasks to claim; 1 when absent.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 256))]
    pub max_tasks: Option<u32>,
    /// How long to wait when nothing is ready; 0 when absent.
    #[cfg_attr(feature = "openapi", schema(maximum = 60000))]
    pub wait_ms: Option<u64>,
    /// The namespace to poll; `default` when absent. (This endpoint takes it in the body, not the
    /// query.)
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9_.-]{1,128}$"))]
    pub namespace: Option<String>,
    /// Successes to report before claiming, as the items of `POST /api/v1/tasks/complete`
    /// (at most 1000): each is committed, durably, before the poll claims or waits, and
    /// answered in `reports`. Empty when absent (and then not sent, so that servers without
    /// it take the request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 1000))]
    pub complete: Vec<CompleteTask>,
}

/// A task handed to a worker, with the lease token its reports must carry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeasedTask {
    /// `tsk_…`
    pub id: String,
    pub lease_token: String,
    pub job_id: String,
    pub step: String,
    #[cfg_attr(feature = "openapi", schema(value_type = TaskKind))]
    pub kind: Open<TaskKind>,
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 0, maximum = 4294967295u64)
    )]
    pub item: Option<u32>,
    pub queue: String,
    pub command: String,
    /// The task's input (null when none).
    pub input: Value,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub attempt: u32,
    /// `task id:attempt`: the same across check-laters of one attempt.
    pub idempotency_key: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub lease_expires_at: Timestamp,
    /// How long a lease lasts; heartbeat well within it.
    pub lease_ms: u64,
    /// Progress recorded by an earlier check-later of this attempt, else null.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub progress: Option<Value>,
    /// The attempt's callback token: another system may finish the attempt with it
    /// (`/api/v1/callbacks/{token}/…`) after the worker's `await-callback`. Shown only here.
    #[serde(default)]
    pub callback_token: String,
    /// The attempt's W3C trace context (`00-<trace id>-<span id>-01`), present only while the
    /// server exports traces (`--otlp-endpoint`): a worker's own spans belong under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// The claimed tasks; empty when none became ready within `wait_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PollResponse {
    pub tasks: Vec<LeasedTask>,
    /// The largest task output the server takes, as compact JSON bytes (its `--max-task-bytes`):
    /// a worker fails a larger output for good rather than report it.
    #[serde(default)]
    pub max_output_bytes: u64,
    /// The answer of each item of the request's `complete`, in its order: what `POST
    /// /api/v1/tasks/complete` answers for it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub reports: Vec<BatchItem<ReportResponse>>,
}

/// Extends the lease of a running task.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub lease_token: String,
    /// Progress to record (optional).
    pub progress: Option<Value>,
}

/// The extended lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub lease_expires_at: Timestamp,
}

/// The task succeeded.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    pub lease_token: String,
    /// The task's output (default null).
    #[serde(default)]
    pub output: Value,
    /// Size-bounded logs to keep with the task (optional).
    pub logs: Option<Value>,
}

/// A failure reported by a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReportedError {
    /// What went wrong; must not be blank (else 400).
    #[cfg_attr(feature = "openapi", schema(pattern = "\\S"))]
    pub message: String,
    /// False fails the step at once, without further attempts.
    #[serde(default = "default_true")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub retryable: bool,
    /// The least delay before the retry (a called service's `Retry-After`): the step's backoff
    /// applies when it is longer. At most 7 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 604800000))]
    pub retry_after_ms: Option<u64>,
}

fn default_true() -> bool {
    true
}

/// The attempt failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    pub lease_token: String,
    pub error: ReportedError,
    /// Size-bounded logs to keep with the task (optional).
    pub logs: Option<Value>,
}

/// Not done yet: the task returns to ready after `after_ms` without using an attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CheckLaterRequest {
    pub lease_token: String,
    /// At most 7 days.
    #[cfg_attr(feature = "openapi", schema(maximum = 604800000))]
    pub after_ms: u64,
    /// Progress to record (optional), given back with the next lease.
    pub progress: Option<Value>,
}

/// Body of pause, resume and retry; optional (an empty body is `{}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// Why, recorded in the job's history; at most 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
}

/// Body of cancel; optional (an empty body is `{}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Why, recorded in the job's history; at most 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
    /// Undo the finished steps (run their compensations) before ending `cancelled`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = false))]
    pub compensate: bool,
}

/// Body of skip; optional (an empty body is `{}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SkipRequest {
    /// The output downstream steps will see (default null).
    #[serde(default)]
    pub output: Value,
    /// Why, recorded in the job's history; at most 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
}

/// Body of a task's requeue (required).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RequeueRequest {
    /// Why, recorded in the job's history and told to the worker whose lease is revoked (its
    /// next heartbeat or report is answered 409 with it); 1 to 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 1024))]
    pub reason: String,
}

/// Body of a task's fail (required).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FailTaskRequest {
    /// The task's error message (its error kind is `operator`); 1 to 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 1024))]
    pub error: String,
    /// Why, recorded in the job's history; at most 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
}

/// Body of rerun (required).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    /// The step to run again, with everything downstream of it.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub step: String,
    /// Why, recorded in the job's history; at most 1024 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
}

/// A queue's settings and what it holds now.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueView {
    pub namespace: String,
    pub name: String,
    /// `parallel`: any number of running tasks, up to `concurrency`; `serial`: at most one running
    /// task at a time, in dispatch order (`concurrency` is then ignored).
    #[cfg_attr(feature = "openapi", schema(value_type = QueueMode))]
    pub mode: Open<QueueMode>,
    /// Higher is served first among the queues a worker polls.
    pub priority: i32,
    /// Most running tasks at once; null: no limit.
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 1, maximum = 4294967295u64)
    )]
    pub concurrency: Option<u32>,
    /// A paused queue keeps its tasks but hands none out (but see `paused_reason`).
    pub paused: bool,
    /// Why the queue paused itself: a forward task on it failed for good and its `on_error` is
    /// `pause`. It still hands out compensation tasks, so the failing job can roll back;
    /// resuming clears it. Null when it is not paused or an operator paused it (which stops
    /// compensations too).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub paused_reason: Option<String>,
    /// `pause`: the queue pauses when a forward task on it fails for good (not a compensation,
    /// not a step with `continue_on_failure`, not an operator's `fail`); `continue` (the
    /// default): it goes on.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = OnError))]
    pub on_error: Open<OnError>,
    /// A ready task that has waited longer than this goes ahead of priority order, oldest first
    /// (300000, 5 minutes, unless changed).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_wait_ms: u64,
    /// At most `tokens` task starts per `per_ms` (a token bucket); null: no rate limit. Tasks over
    /// the limit wait ready.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub rate: Option<RateView>,
    /// Ready tasks not held by a paused job nor parked by their step's `lock` or `rate`,
    /// including those whose retry backoff or check-later delay has not passed yet.
    pub ready: u64,
    /// Tasks leased to a worker.
    pub running: u64,
    /// How long the oldest ready task that is claimable now has been claimable; 0 when none is.
    pub oldest_ready_age_ms: u64,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// When the settings were last changed (PUT, pause or resume); null when never.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub updated_at: Option<Timestamp>,
    /// Whether the queue has settings of its own, given with `PUT` on its name: then no prefix
    /// settings apply to it (`DELETE` on its name drops them).
    #[serde(default)]
    pub own_settings: bool,
    /// The pattern (`agent-*`) whose settings the queue follows: the longest prefix of its name
    /// that has settings; null when it has settings of its own or follows the defaults.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub settings_from: Option<String>,
}

/// Settings given to a name prefix: every queue of the namespace whose name starts with it and
/// has no settings of its own follows them, each queue on its own (its own serial lane,
/// concurrency limit and rate bucket); among several matching prefixes, the longest wins.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueuePrefixView {
    pub namespace: String,
    /// The prefix followed by `*` (`agent-*`; `*` alone names every queue).
    pub pattern: String,
    /// As [`QueueView::mode`], for each queue.
    #[cfg_attr(feature = "openapi", schema(value_type = QueueMode))]
    pub mode: Open<QueueMode>,
    /// Higher is served first among the queues a worker polls.
    pub priority: i32,
    /// Most running tasks at once on each queue; null: no limit.
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 1, maximum = 4294967295u64)
    )]
    pub concurrency: Option<u32>,
    /// A ready task that has waited longer than this goes ahead of priority order.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_wait_ms: u64,
    /// At most `tokens` task starts per `per_ms` on each queue; null: no rate limit.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub rate: Option<RateView>,
    /// As [`QueueView::on_error`], for each queue.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = OnError))]
    pub on_error: Open<OnError>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// When the settings were last changed.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RateView {
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub tokens: u32,
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub per_ms: u64,
}

/// A queue's rate limit as set: `tokens` starts per `per` (a duration like `"1m"` or seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RateSettings {
    /// Task starts per `per`; 0 is a 422.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub tokens: u32,
    /// A duration (`"1m"`) or a number of seconds (the schema: [`openapi::rate_per`]).
    #[cfg_attr(feature = "openapi", schema(schema_with = openapi::rate_per))]
    pub per: Value,
}

/// A page of the namespace's queues, by name, and every prefix setting of the namespace.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueList {
    pub items: Vec<QueueView>,
    /// Every prefix setting of the namespace, by pattern (at most 100).
    #[serde(default)]
    pub prefixes: Vec<QueuePrefixView>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub next_cursor: Option<String>,
}

/// The query of `GET /api/v1/queues`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct QueueListQuery {
    /// As [`NamespaceQuery`], which documents it.
    #[cfg_attr(feature = "openapi", param(ignore))]
    pub namespace: Option<String>,
    /// Only queues whose name starts with this text (as it is written: `agent-`); at most 128
    /// bytes, else a 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(max_length = 128))]
    pub prefix: Option<String>,
    /// Only queues whose name holds this text, in any case; at most 128 bytes, else a 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(max_length = 128))]
    pub q: Option<String>,
    /// Page size, at least 1 (else 400) and at most the server's page limit (`--max-page-size`;
    /// the 1000 shown is its default, and the default page size; over it is a 422).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        param(minimum = 1, maximum = 1000, default = 1000)
    )]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page (the last queue name it holds); anything else is a
    /// 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(max_length = 128))]
    pub cursor: Option<String>,
}

/// Changes to a queue's settings. An absent field stays as it is, and so does one sent as `null`,
/// except `concurrency`, where `null` removes the limit. `{}` changes nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    /// `parallel`: any number of running tasks, up to `concurrency`; `serial`: at most one running
    /// task at a time, in dispatch order (`concurrency` is then ignored). Any other value is a 400.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<QueueMode>))]
    pub mode: Option<Open<QueueMode>>,
    /// Higher is served first among the queues a worker polls.
    pub priority: Option<i32>,
    /// Most running tasks at once, at least 1 (0 is a 422: pause the queue instead); `null` removes
    /// the limit, while an absent field leaves it as it is.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>, minimum = 1, maximum = 4294967295u64))]
    pub concurrency: Option<Option<u32>>,
    /// A duration (`"5m"`) or a number of seconds (the schema: [`openapi::max_wait`]).
    #[cfg_attr(feature = "openapi", schema(schema_with = openapi::max_wait))]
    pub max_wait: Option<Value>,
    /// An object sets the rate limit; null removes it; absent leaves it as it is.
    #[serde(
        default,
        deserialize_with = "present_or_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<RateSettings>))]
    pub rate: Option<Option<RateSettings>>,
    /// `pause`: stop the queue when a forward task on it fails for good (see
    /// [`QueueView::on_error`]); `continue`: go on. Any other value is a 400.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<OnError>))]
    pub on_error: Option<Open<OnError>>,
}

/// Tells an absent field (`None`) from an explicit `null` (`Some(None)`).
fn present_or_null<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// What a schedule does with the fires it missed while the server was down: `skip` drops them,
/// though a fire less than a minute late still runs; `once` runs the latest missed fire once; `all`
/// runs the missed fires, oldest first, at most the latest `limit`. Fires missed while the schedule
/// was paused are never caught up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CatchUpPolicy {
    /// Any other value is a 400 (the field is `catch_up.policy`).
    #[cfg_attr(feature = "openapi", schema(value_type = CatchUpKind))]
    pub policy: Open<CatchUpKind>,
    /// With `all` only: the most missed fires run at once, 10 when absent or null; 0 is a 422. A
    /// limit with `skip` or `once` is a 400. Null in a view of a `skip` or `once` policy.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub limit: Option<u32>,
}

/// A schedule to create or replace. A field left out, or sent as `null`, takes its default.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// The workflow whose latest version each fire runs; it must be applied in the schedule's
    /// namespace, else 422.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9_.-]{1,128}$"))]
    pub workflow: String,
    /// The params of each fire's job (default `{}`). Any JSON is accepted by the parser; a
    /// non-object is refused with 422. They are checked against the workflow's `params` schema only
    /// when a fire submits its job.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<Value>,
    /// 5 fields (`0 3 * * *`), 6 with seconds first (`*/10 * * * * *`), 7 with a year last, or a
    /// nickname such as `@hourly`; `L`, `W` and `#` are supported. Anything else is a 422. An
    /// expression that never fires again (`0 0 30 2 *`) is accepted: its schedule never fires, and
    /// `next_fires` is empty.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub cron: String,
    /// The IANA time zone (`Europe/Paris`) the expression is read in, following daylight saving
    /// time; `UTC` when absent. An unknown zone is a 422.
    pub timezone: Option<String>,
    /// What a fire does while the schedule's previous job is unfinished: `skip` starts nothing,
    /// `allow` starts another job, `queue_one` holds the fire (replacing an older held one) and
    /// starts it when the previous job ends. `skip` when absent; any other value is a 400.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Overlap>))]
    pub overlap: Option<Open<Overlap>>,
    /// What to do with fires missed while the server was down; `{"policy": "skip"}` when absent.
    pub catch_up: Option<CatchUpPolicy>,
    /// Create (or replace) the schedule paused. False when absent, so replacing a paused schedule
    /// without it resumes it; `null` is a 400.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = false))]
    pub paused: bool,
    /// The labels of each fire's job, merged over its workflow's as a submission's are (the same
    /// rules; else 422 naming the label).
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// A schedule with its next fire times and what its last fire did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleView {
    pub namespace: String,
    pub name: String,
    pub workflow: String,
    /// The params of each fire's job.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: Value,
    pub cron: String,
    pub timezone: String,
    /// What a fire does while the schedule's previous job is unfinished: `skip` starts nothing,
    /// `allow` starts another job, `queue_one` holds the fire (replacing an older held one) and
    /// starts it when the previous job ends.
    #[cfg_attr(feature = "openapi", schema(value_type = Overlap))]
    pub overlap: Open<Overlap>,
    pub catch_up: CatchUpPolicy,
    /// A paused schedule does not fire.
    pub paused: bool,
    /// The next fire times, soonest first: up to 5, none while paused or when the expression never
    /// fires again. The first one is in the past when a fire is due and not handled yet.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>, format = DateTime, max_items = 5))]
    pub next_fires: Vec<Timestamp>,
    /// A fire held by `queue_one` until the previous job ends; null when none.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub pending_fire_at: Option<Timestamp>,
    /// The last fire that started its job or tried to (fires skipped or held because of `overlap`
    /// are not counted); null when none. Kept when the schedule is replaced.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub last_fire_at: Option<Timestamp>,
    /// `job_…`: the job the last fire that could start one started; null when none. Kept when the
    /// schedule is replaced.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub last_job_id: Option<String>,
    /// Why the last fire could not start its job (a `params` refused by the workflow's schema, a
    /// workflow no longer applied, …); null when it could, or when no fire has run since the
    /// schedule was put.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub last_error: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// When the schedule was last put, paused or resumed.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub updated_at: Timestamp,
    /// The labels of each fire's job (merged over its workflow's); `{}` when none.
    #[serde(default)]
    pub labels: Labels,
}

/// The schedules of the namespace, by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleList {
    pub items: Vec<ScheduleView>,
}

/// A subscription to create.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    /// Where to POST each message: an `http://` or `https://` URL (the scheme in any case) of at
    /// most 2048 bytes, else 422. Unless the server's `--webhook-allow` opens it, a destination on
    /// this host or a local network is refused with a 422: loopback, unspecified (`0.0.0.0/8`,
    /// `::`), private (`10/8`, `172.16/12`, `192.168/16`), shared (`100.64/10`), link-local
    /// (`169.254/16`, cloud metadata; `fe80::/10`), unique and site-local IPv6, multicast,
    /// broadcast and reserved addresses, those IPv4 addresses inside IPv6 ones (IPv4-mapped,
    /// -compatible, -translated, 6to4, NAT64; and local-use NAT64 `64:ff9b:1::/48`), numeric
    /// spellings of them (`2130706433`, `0x7f.1`), and `localhost` and `*.localhost`. A host name
    /// is resolved and refused if any of its addresses is; one that does not resolve yet is
    /// accepted. Every delivery checks again, after resolution and without connecting to a refused
    /// address.
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 2048, pattern = "^[Hh][Tt][Tt][Pp][Ss]?://")
    )]
    pub url: String,
    /// Only jobs of this workflow; every workflow when absent or null. Not checked: a name no
    /// workflow has matches nothing.
    pub workflow: Option<String>,
    /// Only changes to these job statuses (the status the job changed to); every change when absent
    /// or empty. An unknown status is a 400 (the field is `states`); `null` is a 400 (the field is
    /// `body`). Applies to `job.status_changed` messages only.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<JobStatus>, default = json!([])))]
    pub states: Vec<Open<JobStatus>>,
    /// What to hear of: `job.status_changed` (a job's status changed), `task.started` (a worker
    /// claimed a task: an attempt started), `task.succeeded`, `task.retrying` (an attempt failed
    /// and the task will be tried again) and `task.failed` (the task failed for good). When absent
    /// or null, `["job.status_changed"]`. An unknown event is a 400 naming `events[i]`; an empty
    /// list (`events`) or an event named twice (`events[i]`) is a 422.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<Vec<WebhookEvent>>, default = json!(["job.status_changed"]), min_items = 1)
    )]
    pub events: Option<Vec<Open<WebhookEvent>>>,
    /// Only task events of these steps (step ids; a compensation counts as its step's); every step
    /// when absent or empty. At most 100 (else 422 naming `steps`); a name that is not a valid step
    /// id or is named twice is a 422 naming `steps[i]`; steps given while `events` holds no task
    /// event is a 422 naming `steps`. Not checked against any workflow: a step no workflow has
    /// matches nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 100, default = json!([])))]
    pub steps: Vec<String>,
    /// The signing secret, 16 to 256 bytes (else 422); when absent or null, a random one of 64
    /// hexadecimal characters is made. Either way it is returned only in the answer to the create.
    #[cfg_attr(feature = "openapi", schema(min_length = 16, max_length = 256))]
    pub secret: Option<String>,
}

/// A subscription, without its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookView {
    /// `whk_…`
    pub id: String,
    pub namespace: String,
    /// The URL in full to callers with the `operate` scope (and to anyone when the server runs
    /// without `--auth`). Others get it redacted to `scheme://host[:port]/…`, without the user
    /// information, path, query and fragment, which often carry secrets.
    pub url: String,
    /// Only jobs of this workflow; null: every workflow.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub workflow: Option<String>,
    /// Only changes to these job statuses; empty: every change.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<JobStatus>))]
    pub states: Vec<Open<JobStatus>>,
    /// What it hears of (see WebhookRequest); never empty.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<WebhookEvent>))]
    pub events: Vec<Open<WebhookEvent>>,
    /// Only task events of these steps; empty: every step.
    #[serde(default)]
    pub steps: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// The signing secret: returned only when the subscription is created (documented as
    /// [`openapi::CreatedWebhook`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub secret: Option<String>,
}

/// The subscriptions of the namespace, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookList {
    pub items: Vec<WebhookView>,
}

/// The body of a message: a job's status changed (`job.status_changed`), or a task started,
/// succeeded, failed or is to be retried (`task.*`, with `task`). Its times are Unix milliseconds
/// (integers), not RFC 3339 strings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookPayload {
    /// What the message reports; also its `Starbridge-Event` header.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(value_type = WebhookEvent))]
    pub kind: Open<WebhookEvent>,
    pub namespace: String,
    /// The job after the change.
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub job: WebhookJob,
    /// The task, in a `task.*` message; absent in a `job.status_changed` one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub task: Option<WebhookTask>,
    /// When the change happened, in Unix milliseconds.
    pub at: i64,
}

/// The task of a `task.*` [`WebhookPayload`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookTask {
    /// `task_…`
    pub id: String,
    /// The step it runs (or, for a compensation, undoes).
    pub step: String,
    #[cfg_attr(feature = "openapi", schema(value_type = TaskKind))]
    pub kind: Open<TaskKind>,
    /// Its position in a fan-out step's list (from 0); null for other tasks.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub item: Option<u32>,
    /// The attempt it is about (from 1); null for a task that never started one (a waiting step
    /// that ended, a fan-out step).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub attempt: Option<u32>,
    /// Why it failed, in `task.failed` and `task.retrying`; null otherwise.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub error: Option<TaskError>,
    /// When it is tried again, in Unix milliseconds, in `task.retrying`; null otherwise.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub retry_at: Option<i64>,
}

/// The job of a [`WebhookPayload`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookJob {
    /// `job_…`
    pub id: String,
    pub workflow: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 4294967295u64))]
    pub version: u32,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub key: Option<String>,
    /// The status it changed to.
    #[cfg_attr(feature = "openapi", schema(value_type = JobStatus))]
    pub status: Open<JobStatus>,
    /// The status it changed from, in a `job.status_changed` message: null when the job was just
    /// created. Absent in a `task.*` message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<JobStatus>))]
    pub previous_status: Option<Open<JobStatus>>,
    /// When the job was created, in Unix milliseconds.
    pub created_at: i64,
    /// When the job ended, in Unix milliseconds; null while it has not.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub ended_at: Option<i64>,
    /// The workflow's `output`, rendered when the job succeeded; null otherwise.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>, required = true))]
    pub output: Option<Value>,
    /// The steps the job went on past (`continue_on_failure`) when it succeeded; empty
    /// otherwise.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub failed_steps: Vec<String>,
}

/// One message to a subscription and how its delivery went so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// Increasing; sent as `Starbridge-Delivery`.
    pub id: i64,
    /// `job_…`
    pub job_id: String,
    /// The job status the message reports.
    #[cfg_attr(feature = "openapi", schema(value_type = JobStatus))]
    pub status: Open<JobStatus>,
    /// The body sent.
    #[cfg_attr(feature = "openapi", schema(value_type = WebhookPayload))]
    pub payload: Value,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// Attempts so far; 0 before the first.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 20))]
    pub attempts: u32,
    /// `pending`: to be tried (again) at `next_attempt_at`; `delivered`: the receiver answered 2xx;
    /// `failed`: given up after 20 attempts, or at once when the server's destination policy
    /// refuses the URL (`last_error` starts with `destination refused by policy`; nothing was
    /// sent).
    #[cfg_attr(feature = "openapi", schema(value_type = DeliveryState))]
    pub state: Open<DeliveryState>,
    /// When it is tried next; null once delivered or given up.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub next_attempt_at: Option<Timestamp>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub delivered_at: Option<Timestamp>,
    /// The HTTP status of the last answer; null before the first attempt or when the last one got
    /// no answer.
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 100, maximum = 599)
    )]
    pub last_status: Option<u16>,
    /// Why the last attempt failed (`destination refused by policy: …` when the server's policy
    /// refused the destination without connecting); null before the first attempt and once
    /// delivered.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub last_error: Option<String>,
}

/// A subscription's deliveries, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryList {
    pub items: Vec<DeliveryView>,
}

/// Most items in one batch request (`POST /jobs/batch`, `POST /tasks/complete`), and most
/// completions one poll carries.
pub const MAX_BATCH_ITEMS: usize = 1000;

/// Several jobs to submit in one request, each as `POST /api/v1/jobs` takes it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubmitJobs {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub jobs: Vec<SubmitJob>,
}

/// A job of a batch submit: created, or found by its `key`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmittedJob {
    /// The job id (`job_…`).
    pub id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = JobStatus))]
    pub status: Open<JobStatus>,
    /// False when the `key` named an existing job, which is returned instead (the 200 of `POST
    /// /api/v1/jobs`).
    pub created: bool,
}

/// One item's answer in a batch request, in the order of the request: its result, or the
/// problem that refused it (nothing of that item changed; the other items are not affected).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum BatchItem<T> {
    Done(T),
    /// The job was refused: the problem it would have got alone (its `status` is the HTTP status
    /// the single-item call would answer). Nothing of this item changed.
    Refused {
        error: Problem,
    },
}

/// One item per job of the request, in its order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubmitJobsResponse {
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub items: Vec<BatchItem<SubmittedJob>>,
}

/// One successful attempt: the task id and what `POST /api/v1/tasks/{id}/complete` takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteTask {
    /// The task id (`tsk_…`).
    pub id: String,
    pub lease_token: String,
    /// The task's output (any JSON; `null` when absent).
    #[serde(default)]
    pub output: Value,
    /// Optional logs to keep with the attempt (any JSON).
    pub logs: Option<Value>,
}

/// Several successful attempts reported in one request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteTasks {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub tasks: Vec<CompleteTask>,
}

/// One item per task of the request, in its order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompleteTasksResponse {
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub items: Vec<BatchItem<ReportResponse>>,
}

/// What a report changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReportResponse {
    #[cfg_attr(feature = "openapi", schema(value_type = TaskStatus))]
    pub task_status: Open<TaskStatus>,
    #[cfg_attr(feature = "openapi", schema(value_type = JobStatus))]
    pub job_status: Open<JobStatus>,
}

/// One field at fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldProblem {
    /// The field: a body field (`queues`, `error.message`, `params.size`), a query parameter, a
    /// header, `body`, or a definition location (`steps[0] (a).timeout`, `line 3 column 4`).
    pub field: String,
    pub message: String,
}

/// An RFC 9457 problem document, sent as `application/problem+json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// `/problems/invalid-request` (400), `/problems/unauthorized` (401: no token, or an unknown or
    /// revoked one), `/problems/forbidden` (403: the token's scopes do not allow the request),
    /// `/problems/not-found` (404), `/problems/conflict` (409), `/problems/validation` (422),
    /// `/problems/internal` (500), `/problems/unavailable` (503), `/problems/disk-full` (503: the
    /// disk holding the database is full; nothing was changed), `/problems/read-only` (503: the
    /// database or its filesystem is read-only; nothing was changed), `/problems/contended` (503:
    /// other server nodes kept the rows busy; try again), `/problems/method-not-allowed` (405),
    /// `/problems/limit-exceeded` (413, 422).
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(format = "uri-reference"))]
    pub kind: String,
    pub title: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 400, maximum = 599))]
    pub status: u16,
    pub detail: String,
    /// Each field at fault; left out when none is named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldProblem>,
    // The limit a request went over (`/problems/limit-exceeded`), and how to change it; described
    // by `ProblemLimit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = ProblemLimit, required = false))]
    pub limit: Option<Box<ProblemLimit>>,
}

/// The server limit a request went over, and how an operator changes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// Whether the server reads and writes its database.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    #[cfg_attr(feature = "openapi", schema(value_type = HealthStatus))]
    pub status: Open<HealthStatus>,
    /// `ok`: writes succeed (one did in the last 10 s, or a probe write just did). `full`: the disk
    /// holding the database is full. `read_only`: the database or its filesystem is read-only (a
    /// filesystem remounted read-only, a read-only PostgreSQL). `unavailable`: the database cannot
    /// be read, or writes fail for another reason. Anything but `ok` comes with status 503, and
    /// writes are refused meanwhile (nothing is changed).
    #[cfg_attr(feature = "openapi", schema(value_type = DatabaseHealth))]
    pub database: Open<DatabaseHealth>,
    /// What the answer rests on, for an operator: the last write's age and outcome, a probe write's
    /// outcome, or a failed read.
    pub detail: String,
}

/// An API token as listed; its secret is never shown again after the create.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    /// 16 hexadecimal characters: the part after `sbt_` of the token.
    pub id: String,
    /// Unique among all tokens, revoked ones included; history and the audit log name the token by
    /// it.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9_.-]{1,128}$"))]
    pub name: String,
    /// The only namespace it acts in; null: every namespace.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub namespace: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Scope>, min_items = 1))]
    pub scopes: Vec<Open<Scope>>,
    /// The queues a `work` token may poll and report on (names, or patterns such as `agent-*`);
    /// null: every queue.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub queues: Option<Vec<String>>,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub created_at: Timestamp,
    /// Who made it: the name of the admin token, or, without `--auth`, the `Starbridge-Actor`
    /// header (`anonymous` when absent).
    pub created_by: String,
    /// When a request last carried it (recorded at most once a minute); null: never.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub last_used_at: Option<Timestamp>,
    /// When it was revoked; null: it is live. A revoked token stays listed.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime, required = true))]
    pub revoked_at: Option<Timestamp>,
}

/// A token to create.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// 1 to 128 characters of a-z, 0-9, `_`, `.` and `-` (else 422), not used by another token,
    /// revoked ones included (else 409).
    pub name: String,
    /// At least one (else 422); an unknown scope is a 400 (the field is `scopes`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Scope>))]
    pub scopes: Vec<Open<Scope>>,
    /// Bind the token to this namespace; every namespace when absent or null. A malformed name is a
    /// 400; an `admin` token cannot be bound (422).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The only queues it may poll and report on, each a queue name or a pattern (`agent-*`: every
    /// queue whose name starts with `agent-`); every queue when absent or null. Only for a token
    /// with the `work` scope (else 422); a malformed name or pattern is a 422.
    #[serde(default)]
    pub queues: Option<Vec<String>>,
    /// Why, recorded in the audit log.
    #[serde(default)]
    pub reason: Option<String>,
}

/// A new token, with its secret shown only in this answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedToken {
    pub token: TokenView,
    /// The whole token, `sbt_<id>_<secret>`: send it as `Authorization: Bearer <secret>`. Only its
    /// hash is stored: keep it now, it cannot be shown again.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^sbt_[0-9a-f]{16}_[0-9a-f]{64}$")
    )]
    pub secret: String,
}

/// Every token, revoked ones included, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenList {
    pub items: Vec<TokenView>,
}

/// One accepted change.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntryView {
    /// Increases with each entry; pass as `before` to page.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub seq: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub at: Timestamp,
    /// The request's namespace (`?namespace=`, the token's, else `default`).
    pub namespace: String,
    /// The token's name; without `--auth`, the `Starbridge-Actor` header (`anonymous` when absent).
    pub actor: String,
    /// The method and the documented path template, e.g. `POST /api/v1/jobs/{id}/cancel`.
    pub action: String,
    /// The request's path, e.g. `/api/v1/jobs/job_…/cancel`.
    pub target: String,
    /// The HTTP status of the answer.
    #[cfg_attr(feature = "openapi", schema(minimum = 200, maximum = 299))]
    pub status: u16,
    /// The `reason` field of the request body, if it had one.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub reason: Option<String>,
}

/// Audit entries, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditList {
    pub items: Vec<AuditEntryView>,
    /// When the page is full: pass as `before` for the next (older) page, which may be empty. Null:
    /// this is the last page.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub next_cursor: Option<i64>,
}

/// `GET /api/v1/stats/minutes`: which figures of the dashboard.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct MinuteStatsQuery {
    /// As [`NamespaceQuery`], which documents it.
    #[cfg_attr(feature = "openapi", param(ignore))]
    pub namespace: Option<String>,
    /// How far back: `1h` (the default) or `1d`; anything else is a 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(default = "1h", pattern = "^(1h|1d)$"))]
    pub window: Option<String>,
    /// Only this workflow's series (and no queue's unless `queue` is given too); at most 128
    /// bytes, else a 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(max_length = 128))]
    pub workflow: Option<String>,
    /// Only this queue's series (and no workflow's unless `workflow` is given too); at most 128
    /// bytes, else a 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(max_length = 128))]
    pub queue: Option<String>,
}

/// The dashboard's figures over a window, per workflow (jobs) and per queue (tasks), a minute
/// at a time. Counted by a background rollup from the history a few seconds after it is
/// written, so the last seconds are not in yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MinuteStats {
    /// `1h` or `1d`.
    pub window: String,
    /// The start of the window's first minute.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub from: Timestamp,
    /// The start of the window's last minute (the current one).
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub to: Timestamp,
    /// Jobs, per workflow, by name.
    pub workflows: Vec<SeriesView>,
    /// Tasks, per queue, by name.
    pub queues: Vec<SeriesView>,
}

/// One workflow's jobs or one queue's tasks over the window: totals and the minutes that have
/// figures (a minute absent had none).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeriesView {
    pub name: String,
    pub totals: MinuteView,
    pub minutes: Vec<MinuteView>,
}

/// Figures of one minute, or of a whole window (`totals`, whose `minute` is the window's start).
/// Jobs: `started` counts starts, `succeeded` and `failed` ends (failed includes failed
/// compensations). Tasks: `started` counts claims (attempts), `succeeded` and `failed` the
/// attempts that ended so. Percentiles come from fixed log-spaced buckets (about 1.6 times
/// apart): each is the upper bound of its bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MinuteView {
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub minute: Timestamp,
    pub started: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// The median duration of those that ended (from start to end), in ms; null when none did.
    pub p50_ms: Option<u64>,
    /// The 95th percentile duration, in ms; null when none ended.
    pub p95_ms: Option<u64>,
    /// Queues: ready tasks when the minute was sampled; null when none was ready (an empty
    /// queue writes no sample); in `totals`, the largest sample.
    pub depth: Option<u64>,
    /// Queues: how long the oldest claimable task had waited when sampled, in ms; in `totals`,
    /// the largest sample.
    pub oldest_wait_ms: Option<u64>,
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
            "waiting_reason": null, "waiting_for": null, "child": null,
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
            "fail_step",
            "child",
            "operator",
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
            "child_ended",
            "task_requeued",
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
        pinned::<BulkAction>(&[
            "pause", "resume", "cancel", "retry", "delete", "skip", "rerun",
        ]);
        pinned::<QueueMode>(&["parallel", "serial"]);
        pinned::<OnError>(&["continue", "pause"]);
        pinned::<Overlap>(&["skip", "allow", "queue_one"]);
        pinned::<CatchUpKind>(&["skip", "once", "all"]);
        pinned::<Scope>(&["admin", "operate", "submit", "work", "read"]);
        pinned::<HealthStatus>(&["ok", "unhealthy"]);
        pinned::<DatabaseHealth>(&["ok", "full", "read_only", "unavailable"]);
        pinned::<DeliveryState>(&["pending", "delivered", "failed"]);
        pinned::<WebhookEvent>(&[
            "job.status_changed",
            "task.started",
            "task.succeeded",
            "task.failed",
            "task.retrying",
        ]);
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
