//! `GET /healthz`: whether the database is read and written.

use crate::answer::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use starbridge_api::paths;
use starbridge_api::{self as api, DatabaseHealth, HealthStatus};
use starbridge_engine::WriteFault;

use crate::openapi::{Forbidden, HeadersTooLarge, Unprocessable};
use crate::state::AppState;

// Whether the database is read and written (see `Engine::health`): `503` unless it is.
/// Health check
///
/// Whether the server reads and writes its database. Takes no namespace. It reads the database,
/// then judges writes by the last one: a write that succeeded in the last 10 s means `ok`, one that
/// failed in the last second gives its fault; otherwise it makes a probe write (one row changed in
/// place) and answers from it, so it turns `ok` by itself once the fault is gone. At most one probe
/// is in flight, and none while writes flow.
#[utoipa::path(
    get,
    path = paths::HEALTH,
    operation_id = "health",
    tag = "system",
    responses(
        (
            status = 200,
            description = "Healthy: the database is read and written (`database` is `ok`).",
            body = api::Health,
        ),
        (status = 403, response = Forbidden),
        (status = 422, response = Unprocessable),
        (status = 431, response = HeadersTooLarge),
        (
            status = 503,
            description = "Unhealthy: the database's disk is full (`full`), it or its filesystem is \
                           read-only (`read_only`), or it cannot be reached or fails writes \
                           (`unavailable`); `detail` says what the answer rests on.",
            body = api::Health,
        ),
    ),
)]
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    let health = state.engine.health().await;
    let database = match health.fault {
        None => DatabaseHealth::Ok,
        Some(WriteFault::Full) => DatabaseHealth::Full,
        Some(WriteFault::ReadOnly) => DatabaseHealth::ReadOnly,
        Some(WriteFault::Unavailable) => DatabaseHealth::Unavailable,
    };
    let (status, healthy) = match database {
        DatabaseHealth::Ok => (StatusCode::OK, HealthStatus::Ok),
        DatabaseHealth::Full | DatabaseHealth::ReadOnly | DatabaseHealth::Unavailable => {
            (StatusCode::SERVICE_UNAVAILABLE, HealthStatus::Unhealthy)
        }
    };
    let body = api::Health {
        status: healthy.into(),
        database: database.into(),
        detail: health.detail,
    };
    (status, Json(body)).into_response()
}
