//! `POST /api/v1/jobs/{id}/signals/{name}` (scope `submit`): a signal to a job, taken by a step
//! waiting for that name, or kept with the job until one does. The sender (the token's name, or
//! the `Starbridge-Actor` header) is recorded in the job's history.

use axum::Json;
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
use crate::state::AppState;

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

/// A new signal answers 202; one repeating an earlier signal's `id` answers 200, changing
/// nothing.
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
