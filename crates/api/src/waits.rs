//! Wire types of durable waiting: what a waiting task waits for, signals, approval decisions,
//! and the calls that finish a task through its callback token.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ReportedError, Timestamp};

/// What a running task waits for on the server (`TaskView.waiting_for`): exactly one field is
/// set. A newer server may add fields (for other kinds of wait); a client that does not know
/// them sees an object with none of its fields set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitingFor {
    /// A sleep step: it succeeds at this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalWait {
    /// The step's rendered prompt, shown to the person deciding.
    pub prompt: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallbackWait {
    /// When the attempt fails (retryably) unless a callback or callback heartbeat comes first.
    pub until: Timestamp,
}

/// `POST /api/v1/jobs/{id}/signals/{name}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// What the signal carries: the output of the step that takes it (default `null`).
    #[serde(default)]
    pub payload: Value,
    /// A dedupe id: a later signal to the job with the same id changes nothing.
    pub id: Option<String>,
}

/// The answer to a signal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignalAccepted {
    pub job_id: String,
    pub name: String,
    pub id: Option<String>,
    /// The signal repeated an earlier one's `id`: nothing changed.
    pub duplicate: bool,
    /// A waiting step took it at once; otherwise the job keeps it until one waits for it.
    pub taken: bool,
}

/// `POST /api/v1/jobs/{id}/tasks/{task}/approve` and `…/reject`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    /// Why, for the history (and the step's output on approval).
    pub comment: Option<String>,
}

/// One task waiting for approval (`GET /api/v1/approvals`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApprovalView {
    pub job_id: String,
    pub workflow: String,
    pub task_id: String,
    pub step: String,
    pub item: Option<u32>,
    pub prompt: String,
    /// When the step began waiting.
    pub since: Timestamp,
    /// A decision was made while the job is paused: it takes effect at resume.
    pub decided: bool,
}

/// `GET /api/v1/approvals?namespace=&limit=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ApprovalListQuery {
    pub namespace: Option<String>,
    /// At most this many, oldest first (default 100).
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApprovalList {
    pub items: Vec<ApprovalView>,
}

/// `POST /api/v1/tasks/{id}/await-callback`: the worker hands the attempt to another system.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwaitCallbackRequest {
    pub lease_token: String,
    /// How long to wait for the callback (and after each callback heartbeat); default: the
    /// step's per-attempt `timeout`; at most 7 days.
    pub timeout_ms: Option<u64>,
}

/// `POST /api/v1/callbacks/{token}/complete`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackCompleteRequest {
    #[serde(default)]
    pub output: Value,
}

/// `POST /api/v1/callbacks/{token}/fail`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackFailRequest {
    pub error: ReportedError,
}

/// The answer to a call through a callback token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallbackAnswer {
    pub job_id: String,
    pub task_id: String,
    /// What the call did: `completed`, `failed` or `extended` (a heartbeat).
    pub result: String,
}
