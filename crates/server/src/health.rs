//! `GET /healthz`: whether the database is read and written.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use starbridge_api as api;
use starbridge_engine::WriteFault;

use crate::state::AppState;

/// Whether the database is read and written (see `Engine::health`): `503` unless it is.
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    let health = state.engine.health().await;
    let (status, database) = match health.fault {
        None => (StatusCode::OK, api::DatabaseHealth::Ok),
        Some(WriteFault::Full) => (StatusCode::SERVICE_UNAVAILABLE, api::DatabaseHealth::Full),
        Some(WriteFault::ReadOnly) => (
            StatusCode::SERVICE_UNAVAILABLE,
            api::DatabaseHealth::ReadOnly,
        ),
        Some(WriteFault::Unavailable) => (
            StatusCode::SERVICE_UNAVAILABLE,
            api::DatabaseHealth::Unavailable,
        ),
    };
    let healthy = status == StatusCode::OK;
    let body = api::Health {
        status: (if healthy { "ok" } else { "unhealthy" }).into(),
        database,
        detail: health.detail,
    };
    (status, Json(body)).into_response()
}
