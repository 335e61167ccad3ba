//! The route table: assembles every resource's routes under the layers they share
//! (authorization, problem documents for the framework's own refusals, the body limit, metrics).

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use starbridge_api::paths;

use crate::error::ApiError;
use crate::state::AppState;

pub fn router(state: AppState) -> Router {
    let limits = state.limits.clone();
    Router::new()
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
        .layer(crate::metrics::layer())
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint: see /api/v1/openapi.json")
}
