//! `POST /api/v1/jobs/{id}/signals/{name}` (scope `submit`): a signal to a job, taken by a step
//! waiting for that name, or kept with the job until one does. The sender (the token's name, or
//! the `Starbridge-Actor` header) is recorded in the job's history.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::definition::check_name;
use starbridge_engine::SendSignal;

use crate::auth::actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{job_id, namespace, optional_body};
use crate::limits::{Limit, Limits};
use crate::openapi::{ActorHeader, Body, Failures, Guarded, JobPath, PROBLEM};
use crate::state::AppState;

/// The signal operation, for the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(send))]
pub(crate) struct Api;

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route(paths::JOB_SIGNAL, post(send))
}

fn check(limits: &Limits, name: &str, request: &api::SignalRequest) -> ApiResult<()> {
    check_name(name).map_err(|message| ApiError::invalid("name", message))?;
    limits.json(Limit::Task, "payload", &request.payload)?;
    if let Some(id) = &request.id {
        if id.is_empty() {
            return Err(ApiError::invalid(
                "id",
                "must not be empty: leave it out instead",
            ));
        }
        limits.text(Limit::Key, "id", id)?;
    }
    Ok(())
}

/// Send a signal to a job
///
/// A step of the job waiting for a signal of this name takes it and succeeds with the payload
/// as its output; when none waits yet, the job keeps the signal until one does (the oldest kept
/// signal goes to the step that began waiting first). A signal with the `id` of an earlier one
/// to the same job changes nothing. Recorded in the job's history with its sender.
#[utoipa::path(
    post,
    path = paths::JOB_SIGNAL,
    operation_id = "sendSignal",
    tag = "jobs",
    params(
        JobPath,
        ("name" = String, Path, description = "The signal's name: 1 to 128 characters of a-z, 0-9, `_`, `.` and `-`.", pattern = "^[a-z0-9_.-]{1,128}$"),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(
        content = Option<api::SignalRequest>,
        description = "Optional: an empty (or blank) body means `{}` (a `null` payload).",
    ),
    responses(
        (status = 202, description = "The signal was kept, and taken by a waiting step if one waits (`taken`).", body = api::SignalAccepted),
        (status = 200, description = "The `id` repeats an earlier signal's: nothing changed.", body = api::SignalAccepted),
        (status = 400, description = "A malformed body, name or namespace.", body = api::Problem, content_type = PROBLEM),
        (status = 404, description = "No such job in this namespace (with `--auth`, neither is a job of a namespace other than the token's).", body = api::Problem, content_type = PROBLEM),
        (status = 409, description = "The job has finished, or it already keeps `--max-pending-signals` signals no step has taken.", body = api::Problem, content_type = PROBLEM),
        (status = 422, description = "No step of the job's workflow waits for a signal of this name (the field is `name`), or the payload or id is over its limit.", body = api::Problem, content_type = PROBLEM),
        Guarded, Body, Failures,
    ),
)]
async fn send(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<(StatusCode, Json<api::SignalAccepted>)> {
    let request: api::SignalRequest = optional_body(&bytes)?;
    check(&state.limits, &name, &request)?;
    let namespace = namespace(&query)?;
    let job = job_id(&id)?;
    let signal = SendSignal {
        name: name.clone(),
        payload: request.payload,
        id: request.id.clone(),
        sender: actor(&headers)?,
    };
    let accepted = state.engine.signal(&namespace, &job, signal).await?;
    let status = if accepted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(api::SignalAccepted {
            job_id: job.to_string(),
            name,
            id: request.id,
            duplicate: accepted.duplicate,
            taken: accepted.taken,
        }),
    ))
}
