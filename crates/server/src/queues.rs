//! Queue settings and state: list queues with their depth, running tasks and oldest wait; change
//! mode (parallel or serial), priority, concurrency limit and starvation bound; pause and resume.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::dispatch::RateLimit;
use starbridge_core::time::Duration;
use starbridge_engine::{QueueChange, StoredQueue};

use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known, namespace};
use crate::limits::Limit;
use crate::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::QUEUES, get(list))
        .route(paths::QUEUE, get(show).put(configure))
        .route(paths::QUEUE_PAUSE, post(pause))
        .route(paths::QUEUE_RESUME, post(resume))
}

pub(crate) async fn views(state: &AppState, namespace: &str) -> ApiResult<Vec<api::QueueView>> {
    let queues = state.engine.queues(namespace).await?;
    let stats = state.engine.stats().await?;
    Ok(queues
        .iter()
        .map(|queue| {
            let counts = stats
                .queues
                .get(&(queue.namespace.clone(), queue.name.clone()))
                .copied()
                .unwrap_or_default();
            view(queue, counts)
        })
        .collect())
}

fn view(queue: &StoredQueue, counts: starbridge_engine::QueueStats) -> api::QueueView {
    let config = &queue.config;
    api::QueueView {
        namespace: queue.namespace.clone(),
        name: queue.name.clone(),
        mode: config.mode.into(),
        priority: config.priority,
        concurrency: config.concurrency,
        paused: config.paused,
        max_wait_ms: config.max_wait.as_millis(),
        rate: config.rate.map(|rate| api::RateView {
            tokens: rate.tokens,
            per_ms: rate.per.as_millis(),
        }),
        ready: counts.ready,
        running: counts.running,
        oldest_ready_age_ms: counts.oldest_ready_age.as_millis(),
        created_at: api::timestamp_from_millis(queue.created_at.0),
        updated_at: queue.updated_at.map(|t| api::timestamp_from_millis(t.0)),
    }
}

async fn list(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::QueueList>> {
    let namespace = namespace(&query)?;
    Ok(Json(api::QueueList {
        items: views(&state, &namespace).await?,
    }))
}

async fn one(state: &AppState, namespace: &str, name: &str) -> ApiResult<api::QueueView> {
    views(state, namespace)
        .await?
        .into_iter()
        .find(|queue| queue.name == name)
        .ok_or_else(|| ApiError::not_found(format!("queue {name} not found")))
}

async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::QueueView>> {
    let namespace = namespace(&query)?;
    Ok(Json(one(&state, &namespace, &name).await?))
}

async fn change(
    state: &AppState,
    query: &api::NamespaceQuery,
    name: &str,
    change: QueueChange,
) -> ApiResult<Json<api::QueueView>> {
    let namespace = namespace(query)?;
    state
        .engine
        .configure_queue(&namespace, name, change)
        .await?;
    Ok(Json(one(state, &namespace, name).await?))
}

async fn configure(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    bytes: Bytes,
) -> ApiResult<Json<api::QueueView>> {
    state.limits.text(Limit::Name, "name", &name)?;
    let settings: api::QueueSettings = body(&bytes)?;
    let mode = settings
        .mode
        .as_ref()
        .map(|mode| {
            known("mode", mode, |text| {
                format!("unknown mode '{text}': use parallel or serial")
            })
        })
        .transpose()?;
    let max_wait = settings
        .max_wait
        .as_ref()
        .map(|value| {
            Duration::from_json(value)
                .map_err(|error| ApiError::invalid("max_wait", error.to_string()))
        })
        .transpose()?;
    let rate = match &settings.rate {
        None => None,
        Some(None) => Some(None),
        Some(Some(rate)) => {
            let per = Duration::from_json(&rate.per)
                .map_err(|error| ApiError::invalid("rate.per", error.to_string()))?;
            Some(Some(RateLimit {
                tokens: rate.tokens,
                per,
            }))
        }
    };
    let queue_change = QueueChange {
        rate,
        mode,
        priority: settings.priority,
        concurrency: settings.concurrency,
        paused: None,
        max_wait,
    };
    change(&state, &query, &name, queue_change).await
}

async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::QueueView>> {
    let paused = QueueChange {
        paused: Some(true),
        ..QueueChange::default()
    };
    change(&state, &query, &name, paused).await
}

async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::QueueView>> {
    let resumed = QueueChange {
        paused: Some(false),
        ..QueueChange::default()
    };
    change(&state, &query, &name, resumed).await
}
