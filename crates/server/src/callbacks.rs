//! Calls through a callback token: another system finishes a task its worker handed over
//! (`complete`, `fail`) or extends the wait (`heartbeat`). These routes take no API token: the
//! callback token in the path is the credential, so they are public like `/healthz` (but still
//! behind the host and cross-origin guards). The token is never logged, recorded or labelled:
//! the audit log skips these routes and metrics name the route template.
//!
//! `complete` and `fail` work once; an identical repeat answers 200 with the first answer (an
//! external system may retry), anything else after that, or once the task has moved on, 410; a
//! token never issued 404.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::model::{CallbackCall, ReportedError};

use crate::error::{ApiError, ApiResult};
use crate::extract::{body, optional_body};
use crate::limits::Limit;
use crate::openapi::{Body, Failures, Unprocessable};
use crate::state::AppState;

/// The callback operations, for the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(complete, fail, heartbeat))]
pub(crate) struct Api;

/// The token in the path.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct TokenInPath {
    /// The attempt's callback token (`sbc_…`), from the poll answer's `callback_token`: the
    /// credential of these routes.
    #[allow(dead_code)]
    token: String,
}

crate::openapi::problem_answers! {
    /// How a call through a callback token is refused.
    CallbackRefused {
        "400": "A malformed body.",
        "403": "Refused before it is read: a request from a browser of another origin, or, \
               without `--auth`, addressed to a host name other than `localhost` and the \
               `--allowed-host` names.",
        "404": "No such callback token: it was never issued.",
        "410": "The attempt this token was issued for has ended (retried, cancelled, the job \
               ended or was reset), or a different call already finished it; nothing changed.",
        "431": "The request's header section is too large.",
    }
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::CALLBACK_COMPLETE, post(complete))
        .route(paths::CALLBACK_FAIL, post(fail))
        .route(paths::CALLBACK_HEARTBEAT, post(heartbeat))
}

async fn call(
    state: &AppState,
    token: &str,
    call: CallbackCall,
    result: &str,
) -> ApiResult<Json<api::CallbackAnswer>> {
    let accepted = state.engine.callback(token, call).await?;
    Ok(Json(api::CallbackAnswer {
        job_id: accepted.job.to_string(),
        task_id: accepted.task.to_string(),
        result: result.to_owned(),
    }))
}

/// Complete a task through its callback
///
/// The other system the task's worker handed the work to finishes the attempt: the task
/// succeeds with `output`. Works once; repeating the identical call answers 200 with the first
/// answer. No API token: the callback token is the credential.
#[utoipa::path(
    post,
    path = paths::CALLBACK_COMPLETE,
    operation_id = "completeCallback",
    tag = "tasks",
    params(TokenInPath),
    request_body(content = api::CallbackCompleteRequest),
    responses(
        (status = 200, description = "The attempt was finished (or this call repeats the one that did).", body = api::CallbackAnswer),
        (status = 422, response = Unprocessable),
        CallbackRefused, Body, Failures,
    ),
)]
async fn complete(
    State(state): State<AppState>,
    Path(token): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::CallbackAnswer>> {
    let request: api::CallbackCompleteRequest = body(&bytes)?;
    state.limits.json(Limit::Task, "output", &request.output)?;
    let output = request.output;
    call(
        &state,
        &token,
        CallbackCall::Complete { output },
        "completed",
    )
    .await
}

/// Fail a task through its callback
///
/// The other system reports that the work failed: the attempt fails, and is retried while the
/// step has attempts left unless `error.retryable` is false. Works once, as `complete`.
#[utoipa::path(
    post,
    path = paths::CALLBACK_FAIL,
    operation_id = "failCallback",
    tag = "tasks",
    params(TokenInPath),
    request_body(content = api::CallbackFailRequest),
    responses(
        (status = 200, description = "The attempt was failed (or this call repeats the one that did).", body = api::CallbackAnswer),
        (status = 422, response = Unprocessable),
        CallbackRefused, Body, Failures,
    ),
)]
async fn fail(
    State(state): State<AppState>,
    Path(token): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::CallbackAnswer>> {
    let request: api::CallbackFailRequest = body(&bytes)?;
    state
        .limits
        .text(Limit::Task, "error.message", &request.error.message)?;
    if request.error.message.trim().is_empty() {
        return Err(ApiError::invalid(
            "error.message",
            "say what went wrong: the message is shown to operators",
        ));
    }
    if request.error.retry_after_ms.is_some() {
        return Err(ApiError::invalid(
            "error.retry_after_ms",
            "a failure reported through a callback is retried after the step's backoff: drop retry_after_ms",
        ));
    }
    let error = ReportedError {
        message: request.error.message,
        retryable: request.error.retryable,
        retry_after: None,
    };
    call(&state, &token, CallbackCall::Fail { error }, "failed").await
}

/// Extend a callback's wait
///
/// The work goes on: the wait's end moves to now + its `timeout_ms` (never past the step's
/// `step_timeout`).
#[utoipa::path(
    post,
    path = paths::CALLBACK_HEARTBEAT,
    operation_id = "heartbeatCallback",
    tag = "tasks",
    params(TokenInPath),
    request_body(
        content = Option<CallbackHeartbeat>,
        description = "Optional: empty, or `{}`.",
    ),
    responses(
        (status = 200, description = "The wait was extended.", body = api::CallbackAnswer),
        (status = 422, response = Unprocessable),
        CallbackRefused, Body, Failures,
    ),
)]
async fn heartbeat(
    State(state): State<AppState>,
    Path(token): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::CallbackAnswer>> {
    let _: CallbackHeartbeat = optional_body(&bytes)?;
    call(&state, &token, CallbackCall::Heartbeat, "extended").await
}

/// A callback heartbeat carries nothing: an empty body or `{}`.
#[derive(Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CallbackHeartbeat {}
