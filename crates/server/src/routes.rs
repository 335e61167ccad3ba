//! The route table: assembles every resource's routes under the layers they share
//! (authorization, problem documents for the framework's own refusals, the body limit, metrics,
//! trace spans).

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use starbridge_api::paths;

use crate::error::ApiError;
use crate::state::AppState;

/// The route table; with the request span layer when the engine exports traces
/// (`Engine::export_traces` called before).
pub fn router(state: AppState) -> Router {
    let limits = state.limits.clone();
    let engine = state.engine.clone();
    let router = Router::new()
        .route(paths::HEALTH, get(crate::health::health))
        .route(paths::METRICS, get(crate::metrics::serve))
        .route(paths::OPENAPI, get(crate::openapi::serve))
        .merge(crate::workflows::routes())
        .merge(crate::jobs::routes())
        .merge(crate::tasks::routes())
        .merge(crate::batch::routes())
        .merge(crate::operate::routes())
        .merge(crate::signals::routes())
        .merge(crate::approvals::routes())
        .merge(crate::callbacks::routes())
        .merge(crate::queues::routes())
        .merge(crate::minutes::routes())
        .merge(crate::schedules::routes())
        .merge(crate::webhooks::routes())
        .merge(crate::tokens::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authorize,
        ))
        .fallback(not_found)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            limits.clone(),
            crate::rejections::problems_for_rejections,
        ))
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(crate::metrics::layer());
    // Request spans only while tracing is on (turned on before the router is built): off, a
    // request passes no layer for them.
    if engine.spans().is_some() {
        router.layer(axum::middleware::from_fn_with_state(
            engine,
            crate::traces::record,
        ))
    } else {
        router
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint: see /api/v1/openapi.json")
}
