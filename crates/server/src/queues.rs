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
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, OtherNamespace, PROBLEM, QueuePath,
    Unprocessable, problem_answers,
};
use crate::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::QUEUES, get(list))
        .route(paths::QUEUE, get(show).put(configure))
        .route(paths::QUEUE_PAUSE, post(pause))
        .route(paths::QUEUE_RESUME, post(resume))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, show, configure, pause, resume))]
pub(crate) struct Api;

problem_answers! {
    /// How pausing or resuming a queue is refused.
    BadQueueName {
        "422": "A malformed queue name (the field is `name`).",
    }
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

/// List queues
///
/// Every queue of the namespace, by name, with its settings and what it holds now: the queues named
/// by the steps of applied workflows, and those configured with PUT, pause or resume.
#[utoipa::path(
    get,
    path = paths::QUEUES,
    operation_id = "listQueues",
    tag = "queues",
    params(api::NamespaceQuery),
    responses(
        (status = 200, description = "The queues.", body = api::QueueList),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
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

/// Get a queue
///
/// The queue's settings and what it holds now. The name is not validated: a malformed name is not
/// found.
#[utoipa::path(
    get,
    path = paths::QUEUE,
    operation_id = "getQueue",
    tag = "queues",
    params(QueuePath, api::NamespaceQuery),
    responses(
        (status = 200, description = "The queue.", body = api::QueueView),
        (status = 400, response = BadRequest),
        (
            status = 404,
            description = "No such queue in this namespace (a malformed name is not found either). \
                           With `--auth`, anything of a namespace other than the one the token is \
                           bound to is not found either.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
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

/// Change a queue's settings
///
/// Changes the settings the body names and leaves the others as they are. A queue the namespace
/// does not have yet is created with the defaults (`parallel`, priority 0, no concurrency limit,
/// `max_wait` 5m) before the change, so a queue can be set up before any workflow names it. Pollers
/// of the queue are woken. Changing `paused` is done with pause and resume.
#[utoipa::path(
    put,
    path = paths::QUEUE,
    operation_id = "configureQueue",
    tag = "queues",
    params(QueuePath, api::NamespaceQuery, ActorHeader),
    request_body(content = api::QueueSettings),
    responses(
        (status = 200, description = "The queue after the change.", body = api::QueueView),
        (
            status = 400,
            description = "The body is not a QueueSettings object (empty, malformed JSON, an \
                           unknown field, a wrong type, a `concurrency` or `priority` out of range; \
                           the field is `body`), an unknown `mode`, a `max_wait` that is not a \
                           duration or a non-negative number of seconds, or a malformed namespace \
                           or `Starbridge-Actor` header.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (
            status = 422,
            description = "A malformed queue name (`name`), `concurrency` 0 (pause the queue \
                           instead) or a `max_wait` of zero; nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
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

/// Pause a queue
///
/// The queue hands out no task until resumed: its ready tasks stay ready and its running tasks
/// finish. Pausing a paused queue is not an error. A queue the namespace does not have yet is
/// created, paused. Takes no body (one sent is ignored).
#[utoipa::path(
    post,
    path = paths::QUEUE_PAUSE,
    operation_id = "pauseQueue",
    tag = "queues",
    params(QueuePath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 200, description = "The queue, paused.", body = api::QueueView),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        BadQueueName, Guarded, Body, Failures,
    ),
)]
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

/// Resume a queue
///
/// The queue hands out work again, and its pollers are woken. Resuming a queue that is not paused
/// is not an error. A queue the namespace does not have yet is created. Takes no body (one sent is
/// ignored).
#[utoipa::path(
    post,
    path = paths::QUEUE_RESUME,
    operation_id = "resumeQueue",
    tag = "queues",
    params(QueuePath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 200, description = "The queue, not paused.", body = api::QueueView),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        BadQueueName, Guarded, Body, Failures,
    ),
)]
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
