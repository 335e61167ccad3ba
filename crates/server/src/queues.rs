//! Queue settings and state: list queues a page at a time (filtered by name prefix or text) with
//! their depth, running tasks and oldest wait; change a queue's mode (parallel or serial),
//! priority, concurrency limit, rate and starvation bound, or those of a name prefix
//! (`agent-*`) that its queues follow; drop settings; pause and resume a queue.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::definition::check_queue_name;
use starbridge_core::dispatch::{QueueConfig, RateLimit};
use starbridge_core::routing::QueueTarget;
use starbridge_core::time::Duration;
use starbridge_engine::{QueueChange, QueueInfo, QueueSearch, StoredQueuePrefix};

use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known, namespace};
use crate::limits::Limit;
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, OtherNamespace, PROBLEM, QueueOrPatternPath,
    QueuePath, Unprocessable, problem_answers,
};
use crate::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::QUEUES, get(list))
        .route(paths::QUEUE, get(show).put(configure).delete(drop_settings))
        .route(paths::QUEUE_PAUSE, post(pause))
        .route(paths::QUEUE_RESUME, post(resume))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, show, configure, drop_settings, pause, resume))]
pub(crate) struct Api;

problem_answers! {
    /// How pausing or resuming a queue is refused.
    BadQueueName {
        "422": "A malformed queue name, or a pattern (pause and resume name one queue; the \
                field is `name`).",
    }
}

/// Longest `prefix`, `q` or `cursor` of a queue list: a queue name's length.
const MAX_FILTER_BYTES: usize = 128;

pub(crate) fn view(info: &QueueInfo) -> api::QueueView {
    let (queue, stats) = (&info.queue, &info.stats);
    let config = &queue.config;
    api::QueueView {
        namespace: queue.namespace.clone(),
        name: queue.name.clone(),
        mode: config.mode.into(),
        priority: config.priority,
        concurrency: config.concurrency,
        paused: config.paused,
        paused_reason: queue.paused_reason.clone(),
        on_error: config.on_error.into(),
        max_wait_ms: config.max_wait.as_millis(),
        rate: rate_view(config),
        ready: stats.ready,
        running: stats.running,
        oldest_ready_age_ms: stats.oldest_ready_age.as_millis(),
        created_at: api::timestamp_from_millis(queue.created_at.0),
        updated_at: queue.updated_at.map(|t| api::timestamp_from_millis(t.0)),
        own_settings: queue.configured,
        settings_from: info.settings_from.as_deref().map(pattern),
    }
}

pub(crate) fn prefix_view(settings: &StoredQueuePrefix) -> api::QueuePrefixView {
    let config = &settings.config;
    api::QueuePrefixView {
        namespace: settings.namespace.clone(),
        pattern: pattern(&settings.prefix),
        mode: config.mode.into(),
        priority: config.priority,
        concurrency: config.concurrency,
        max_wait_ms: config.max_wait.as_millis(),
        rate: rate_view(config),
        on_error: config.on_error.into(),
        created_at: api::timestamp_from_millis(settings.created_at.0),
        updated_at: api::timestamp_from_millis(settings.updated_at.0),
    }
}

fn rate_view(config: &QueueConfig) -> Option<api::RateView> {
    config.rate.map(|rate| api::RateView {
        tokens: rate.tokens,
        per_ms: rate.per.as_millis(),
    })
}

/// The pattern of a prefix: `agent-` is `agent-*`.
fn pattern(prefix: &str) -> String {
    format!("{prefix}*")
}

/// Reads a list's query: its filters (each at most a queue name long), the page size (the
/// server's page limit when absent) and the cursor (a queue name).
pub(crate) fn search(
    state: &AppState,
    namespace: String,
    query: &api::QueueListQuery,
) -> ApiResult<QueueSearch> {
    for (field, text) in [
        ("prefix", &query.prefix),
        ("q", &query.q),
        ("cursor", &query.cursor),
    ] {
        if text
            .as_ref()
            .is_some_and(|text| text.len() > MAX_FILTER_BYTES)
        {
            return Err(ApiError::invalid(
                field,
                format!("at most {MAX_FILTER_BYTES} bytes, as long as a queue name"),
            ));
        }
    }
    if let Some(cursor) = &query.cursor
        && check_queue_name(cursor).is_err()
    {
        return Err(ApiError::invalid(
            "cursor",
            "not a cursor: pass next_cursor from the previous page",
        ));
    }
    let limit = query.limit.unwrap_or(state.limits.page_size);
    if limit == 0 {
        return Err(ApiError::invalid("limit", "must be at least 1"));
    }
    state
        .limits
        .count(Limit::Page, "limit", u64::from(limit), "items")?;
    Ok(QueueSearch {
        namespace,
        prefix: query.prefix.clone(),
        text: query.q.clone(),
        after: query.cursor.clone(),
        limit,
    })
}

/// List queues
///
/// A page of the namespace's queues, by name, with their settings and what they hold now: the
/// queues named by the steps of applied workflows, those a queue template rendered for a task,
/// and those configured with PUT, pause or resume. `prefix` and `q` filter them on the server, so
/// a namespace with thousands of per-host queues is read a page at a time. Every prefix setting
/// of the namespace comes with each page.
#[utoipa::path(
    get,
    path = paths::QUEUES,
    operation_id = "listQueues",
    tag = "queues",
    params(api::NamespaceQuery, api::QueueListQuery),
    responses(
        (status = 200, description = "A page of queues, and the prefix settings.", body = api::QueueList),
        (
            status = 400,
            description = "A `prefix`, `q` or `cursor` over 128 bytes, a `cursor` that is not a \
                           queue name, a `limit` of 0, or a malformed namespace: the problem names \
                           the parameter. A query string that cannot be parsed at all (e.g. \
                           `limit=abc`) is refused before the handler, with a problem naming \
                           `query`.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn list(
    State(state): State<AppState>,
    Query(query): Query<api::QueueListQuery>,
) -> ApiResult<Json<api::QueueList>> {
    let namespace = crate::extract::namespace_name(query.namespace.as_deref())?;
    let mut search = search(&state, namespace, &query)?;
    let limit = search.limit as usize;
    // One more than the page tells whether another page follows.
    search.limit = search.limit.saturating_add(1);
    let page = state.engine.queue_page(search).await?;
    let more = page.queues.len() > limit;
    let items: Vec<api::QueueView> = page.queues.iter().take(limit).map(view).collect();
    let next_cursor = more
        .then(|| items.last().map(|queue| queue.name.clone()))
        .flatten();
    Ok(Json(api::QueueList {
        items,
        prefixes: page.prefixes.iter().map(prefix_view).collect(),
        next_cursor,
    }))
}

/// Get a queue or a pattern's settings
///
/// For a queue's name, the queue's settings and what it holds now; for a pattern (`agent-*`),
/// the settings given to it. The name is not validated: a malformed name is not found.
#[utoipa::path(
    get,
    path = paths::QUEUE,
    operation_id = "getQueue",
    tag = "queues",
    params(QueueOrPatternPath, api::NamespaceQuery),
    responses(
        (status = 200, description = "The queue, or the pattern's settings.", body = api::openapi::QueueAnswer),
        (status = 400, response = BadRequest),
        (
            status = 404,
            description = "No such queue in this namespace, or no settings for the pattern (a \
                           malformed name is not found either). With `--auth`, anything of a \
                           namespace other than the one the token is bound to is not found \
                           either.",
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
) -> ApiResult<Response> {
    let namespace = namespace(&query)?;
    if let Ok(QueueTarget::Prefix(prefix)) = QueueTarget::parse(&name) {
        let settings = state.engine.queue_prefix(&namespace, prefix).await?;
        let settings = settings.ok_or_else(|| {
            ApiError::not_found(format!(
                "no settings for the pattern {name} in this namespace"
            ))
        })?;
        return Ok(Json(prefix_view(&settings)).into_response());
    }
    Ok(Json(one(&state, &namespace, &name).await?).into_response())
}

async fn one(state: &AppState, namespace: &str, name: &str) -> ApiResult<api::QueueView> {
    let info = state.engine.queue(namespace, name).await?;
    info.as_ref()
        .map(view)
        .ok_or_else(|| ApiError::not_found(format!("queue {name} not found")))
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

/// Change a queue's settings, or a pattern's
///
/// Changes the settings the body names and leaves the others as they are. For a queue's name,
/// the settings become the queue's own: it starts from those it followed (a pattern's, or the
/// defaults) and no pattern applies to it any more; a queue the namespace does not have yet is
/// created first, so it can be set up before any workflow names it. For a pattern (`agent-*`),
/// the settings apply to every queue of the namespace whose name starts with its prefix and has
/// no settings of its own, those that exist and those made later, each queue on its own; among
/// several patterns a queue matches, the longest prefix wins. A new pattern starts from the
/// defaults (`parallel`, priority 0, no concurrency limit, `max_wait` 5m); a namespace holds at
/// most 100. Pollers of the queues are woken. Changing `paused` is done with pause and resume.
#[utoipa::path(
    put,
    path = paths::QUEUE,
    operation_id = "configureQueue",
    tag = "queues",
    params(QueueOrPatternPath, api::NamespaceQuery, ActorHeader),
    request_body(content = api::QueueSettings),
    responses(
        (status = 200, description = "The queue, or the pattern's settings, after the change.", body = api::openapi::QueueAnswer),
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
            status = 409,
            description = "A new pattern when the namespace already has 100; nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 422,
            description = "A malformed queue name or pattern (`name`), `concurrency` 0 (pause the \
                           queue instead) or a `max_wait` of zero; nothing changed.",
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
) -> ApiResult<Response> {
    state.limits.text(Limit::Name, "name", &name)?;
    let settings: api::QueueSettings = body(&bytes)?;
    let queue_change = settings_change(&settings)?;
    if let Ok(QueueTarget::Prefix(_)) = QueueTarget::parse(&name) {
        let namespace = namespace(&query)?;
        let settings = state
            .engine
            .configure_queue_prefix(&namespace, &name, queue_change)
            .await?;
        return Ok(Json(prefix_view(&settings)).into_response());
    }
    Ok(change(&state, &query, &name, queue_change)
        .await?
        .into_response())
}

/// The change a PUT body asks for.
fn settings_change(settings: &api::QueueSettings) -> ApiResult<QueueChange> {
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
    let on_error = settings
        .on_error
        .as_ref()
        .map(|on_error| {
            known("on_error", on_error, |text| {
                format!("unknown on_error '{text}': use pause or continue")
            })
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
    Ok(QueueChange {
        rate,
        mode,
        priority: settings.priority,
        concurrency: settings.concurrency,
        paused: None,
        max_wait,
        on_error,
    })
}

/// Drop a pattern's settings, or a queue's own
///
/// For a pattern (`agent-*`): its settings go, and its queues follow the next longest matching
/// pattern, or the defaults. For a queue's name: the queue's own settings go, and it follows the
/// longest pattern its name matches again, or the defaults; its pause and its tasks stay. Takes
/// no body (one sent is ignored).
#[utoipa::path(
    delete,
    path = paths::QUEUE,
    operation_id = "dropQueueSettings",
    tag = "queues",
    params(QueueOrPatternPath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 204, description = "The settings were dropped; the answer has no body."),
        (status = 400, response = BadRequest),
        (
            status = 404,
            description = "No such queue, or no settings for the pattern, in this namespace. With \
                           `--auth`, anything of a namespace other than the one the token is bound \
                           to is not found either.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 422,
            description = "A malformed queue name or pattern (the field is `name`).",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
async fn drop_settings(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    state.limits.text(Limit::Name, "name", &name)?;
    let namespace = namespace(&query)?;
    state.engine.drop_queue_settings(&namespace, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pause a queue
///
/// The queue hands out no task until resumed: its ready tasks stay ready and its running tasks
/// finish. Pausing a paused queue is not an error. A queue the namespace does not have yet is
/// created, paused. A pattern is refused: a queue's pause is its own. Takes no body (one sent is
/// ignored).
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
/// is not an error. A queue the namespace does not have yet is created. A pattern is refused.
/// Takes no body (one sent is ignored).
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
