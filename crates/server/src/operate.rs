//! Operator actions on a job: pause, resume, cancel, retry, skip a task, rerun from a step. Each
//! is recorded in the job's history with who asked (the `Starbridge-Actor` header until API
//! tokens exist, else `anonymous`) and why (`reason`); one that does not apply to the job's
//! current state answers 409 with the reason.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::post;
use serde::de::DeserializeOwned;
use starbridge_api as api;
use starbridge_core::model::{OperatorAction, OperatorCommand};

use crate::error::{ApiError, ApiResult};
use crate::routes::{AppState, body, job_id, job_view, namespace, task_id};

/// The header naming who acts, until authentication names the token.
pub(crate) const ACTOR_HEADER: &str = "starbridge-actor";

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/jobs/{id}/pause", post(pause))
        .route("/api/v1/jobs/{id}/resume", post(resume))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .route("/api/v1/jobs/{id}/retry", post(retry))
        .route("/api/v1/jobs/{id}/rerun", post(rerun))
        .route("/api/v1/jobs/{id}/tasks/{task}/skip", post(skip))
}

/// An empty body means every field takes its default.
fn optional_body<T: DeserializeOwned + Default>(bytes: &Bytes) -> ApiResult<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        body(bytes)
    }
}

fn actor(headers: &HeaderMap) -> ApiResult<String> {
    match headers.get(ACTOR_HEADER) {
        None => Ok("anonymous".to_owned()),
        Some(value) => {
            let text = value
                .to_str()
                .ok()
                .filter(|t| !t.is_empty() && t.len() <= 128)
                .ok_or_else(|| {
                    ApiError::invalid(ACTOR_HEADER, "must be 1 to 128 visible ASCII characters")
                })?;
            Ok(text.to_owned())
        }
    }
}

fn check_reason(reason: &Option<String>) -> ApiResult<()> {
    match reason {
        Some(text) if text.len() > 1024 => Err(ApiError::invalid("reason", "at most 1024 bytes")),
        _ => Ok(()),
    }
}

async fn act(
    state: &AppState,
    query: &api::NamespaceQuery,
    headers: &HeaderMap,
    id: &str,
    reason: Option<String>,
    action: OperatorAction,
) -> ApiResult<Json<api::JobView>> {
    check_reason(&reason)?;
    let namespace = namespace(query)?;
    let id = job_id(id)?;
    let command = OperatorCommand {
        actor: actor(headers)?,
        reason,
        action,
    };
    let job = state.store.operate(&namespace, &id, command).await?;
    Ok(Json(job_view(state, &job).await?))
}

async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::ActionRequest = optional_body(&bytes)?;
    act(
        &state,
        &query,
        &headers,
        &id,
        request.reason,
        OperatorAction::Pause,
    )
    .await
}

async fn resume(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::ActionRequest = optional_body(&bytes)?;
    act(
        &state,
        &query,
        &headers,
        &id,
        request.reason,
        OperatorAction::Resume,
    )
    .await
}

async fn retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::ActionRequest = optional_body(&bytes)?;
    act(
        &state,
        &query,
        &headers,
        &id,
        request.reason,
        OperatorAction::Retry,
    )
    .await
}

async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::CancelRequest = optional_body(&bytes)?;
    let action = OperatorAction::Cancel {
        compensate: request.compensate,
    };
    act(&state, &query, &headers, &id, request.reason, action).await
}

async fn rerun(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::RerunRequest = body(&bytes)?;
    if request.step.is_empty() {
        return Err(ApiError::invalid("step", "name the step to run again"));
    }
    let action = OperatorAction::Rerun { step: request.step };
    act(&state, &query, &headers, &id, request.reason, action).await
}

async fn skip(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::SkipRequest = optional_body(&bytes)?;
    let action = OperatorAction::Skip {
        task: task_id(&task)?,
        output: request.output,
    };
    act(&state, &query, &headers, &id, request.reason, action).await
}
