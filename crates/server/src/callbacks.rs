//! Calls through a callback token: another system finishes a task its worker handed over
//! (`complete`, `fail`) or extends the wait (`heartbeat`). These routes take no API token: the
//! callback token in the path is the credential, so they are public like `/healthz` (but still
//! behind the host and cross-origin guards). The token is never logged, recorded or labelled:
//! the audit log skips these routes and metrics name the route template.
//!
//! `complete` and `fail` work once; an identical repeat answers 200 with the first answer (an
//! external system may retry), anything else after that, or once the task has moved on, 410; a
//! token never issued 404.

use axum::Json;
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
use crate::state::AppState;

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
    let error = ReportedError {
        message: request.error.message,
        retryable: request.error.retryable,
    };
    call(&state, &token, CallbackCall::Fail { error }, "failed").await
}

async fn heartbeat(
    State(state): State<AppState>,
    Path(token): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::CallbackAnswer>> {
    let _: EmptyBody = optional_body(&bytes)?;
    call(&state, &token, CallbackCall::Heartbeat, "extended").await
}

/// A heartbeat carries nothing: an empty body or `{}`.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyBody {}
