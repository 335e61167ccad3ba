//! `GET /healthz`: whether the database is read and written.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use starbridge_api::{self as api, DatabaseHealth, HealthStatus};
use starbridge_engine::WriteFault;

use crate::state::AppState;

/// Whether the database is read and written (see `Engine::health`): `503` unless it is.
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
