//! Wire types of durable waiting: what a waiting task waits for, signals, approval decisions,
//! and the calls that finish a task through its callback token.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ReportedError, Timestamp};

/// What a running task waits for on the server (`TaskView.waiting_for`): exactly one field is
/// set. A newer server may add fields (for other kinds of wait); a client that does not know
/// them sees an object with none of its fields set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaitingFor {
    /// A sleep step: it succeeds at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub sleep_until: Option<Timestamp>,
    /// A signal step: it succeeds with the payload of a signal of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// An approval step: a person approves or rejects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalWait>,
    /// A task whose worker handed the work to another system, which finishes it through the
    /// attempt's callback token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackWait>,
    /// A sub-workflow step: the child job (`job_…`) it waits for; for a compensation, the
    /// child it rolls back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// A sub-workflow step whose child did not succeed: the next child starts at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = DateTime))]
    pub child_retry_at: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalWait {
    /// The step's rendered prompt, shown to the person deciding.
    pub prompt: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CallbackWait {
    /// When the attempt fails (retryably) unless a callback or callback heartbeat comes first.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub until: Timestamp,
}

/// `POST /api/v1/jobs/{id}/signals/{name}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// What the signal carries: the output of the step that takes it (default `null`); at
    /// most `--max-task-bytes`.
    #[serde(default)]
    pub payload: Value,
    /// A dedupe id: a later signal to the job with the same id changes nothing (200). At most
    /// `--max-key-bytes`.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub id: Option<String>,
}

/// The answer to a signal.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignalAccepted {
    pub job_id: String,
    pub name: String,
    /// The dedupe id sent, if any.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub id: Option<String>,
    /// The signal repeated an earlier one's `id`: nothing changed.
    pub duplicate: bool,
    /// A waiting step took it at once; otherwise the job keeps it until one waits for it.
    pub taken: bool,
}

/// `POST /api/v1/jobs/{id}/tasks/{task}/approve` and `…/reject`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    /// Why, for the history (and the step's output on approval); at most 4096 bytes.
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub comment: Option<String>,
}

/// One task waiting for approval (`GET /api/v1/approvals`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalView {
    pub job_id: String,
    pub workflow: String,
    pub task_id: String,
    pub step: String,
    /// The item index of a `for_each` approval step, else null.
    #[cfg_attr(
        feature = "openapi",
        schema(required = true, minimum = 0, maximum = 4294967295u64)
    )]
    pub item: Option<u32>,
    pub prompt: String,
    /// When the step began waiting.
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = DateTime))]
    pub since: Timestamp,
    /// A decision was made while the job is paused: it takes effect at resume.
    pub decided: bool,
}

/// `GET /api/v1/approvals?namespace=&limit=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct ApprovalListQuery {
    /// The namespace; `default` when absent (with `--auth`, the token's namespace when it is
    /// bound to one). A malformed name is a 400; with `--auth`, a namespace other than the one a
    /// token is bound to is a 404.
    #[cfg_attr(
        feature = "openapi",
        param(pattern = "^[a-z0-9_.-]{1,128}$", default = "default")
    )]
    pub namespace: Option<String>,
    /// At most this many, oldest first: at least 1 (else 400) and at most the server's page
    /// limit (`--max-page-size`; the 1000 shown is its default; over it is a 422).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000, default = 100))]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalList {
    pub items: Vec<ApprovalView>,
}

/// `POST /api/v1/tasks/{id}/await-callback`: the worker hands the attempt to another system.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AwaitCallbackRequest {
    pub lease_token: String,
    /// How long to wait for the callback (and after each callback heartbeat); default: the
    /// step's per-attempt `timeout`; at most 7 days.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 604800000u64))]
    pub timeout_ms: Option<u64>,
}

/// `POST /api/v1/callbacks/{token}/complete`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CallbackCompleteRequest {
    /// The task's output (default null); at most `--max-task-bytes`.
    #[serde(default)]
    pub output: Value,
}

/// `POST /api/v1/callbacks/{token}/fail`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CallbackFailRequest {
    pub error: ReportedError,
}

/// The answer to a call through a callback token.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CallbackAnswer {
    pub job_id: String,
    pub task_id: String,
    /// What the call did: `completed`, `failed` or `extended` (a heartbeat).
    #[cfg_attr(feature = "openapi", schema(examples("completed")))]
    pub result: String,
}
