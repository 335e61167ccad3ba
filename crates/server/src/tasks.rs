//! The worker protocol: long-poll for tasks, then heartbeat, complete, fail or "check later",
//! each report addressed by task id and lease token. A poll may carry the worker's successes,
//! reported as `POST /api/v1/tasks/complete` reports its items (`batch`) before it claims.

use starbridge_api::paths;
use std::time::Duration as StdDuration;

use crate::answer::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Extension, Router};
use starbridge_api as api;
use starbridge_core::limits::MAX_CALLBACK_TIMEOUT;
use starbridge_core::model::{Input, ReportedError};
use starbridge_core::time::Duration;
use starbridge_engine::Poll;

use crate::auth::Caller;
use crate::batch;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, task_id};
use crate::limits::{Limit, Limits};
use crate::openapi::{
    Body, Failures, Guarded, OtherNamespace, PROBLEM, TaskPath, Unprocessable, problem_answers,
};
use crate::state::AppState;
use crate::views;

/// Longest long-poll a worker may ask for.
pub(crate) const MAX_WAIT_MS: u64 = 60_000;
/// Most tasks one poll may claim.
pub(crate) const MAX_TASKS_PER_POLL: u32 = 256;
/// Longest "check later" delay.
pub(crate) const MAX_CHECK_LATER_MS: u64 = 7 * 24 * 3600 * 1000;
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::TASKS_POLL, post(poll))
        .route(paths::TASK_HEARTBEAT, post(heartbeat))
        .route(paths::TASK_COMPLETE, post(complete))
        .route(paths::TASK_FAIL, post(fail))
        .route(paths::TASK_CHECK_LATER, post(check_later))
        .route(paths::TASK_AWAIT_CALLBACK, post(await_callback))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(poll, heartbeat, complete, fail, check_later, await_callback))]
pub(crate) struct Api;

problem_answers! {
    /// How a report on a leased task is refused.
    LeaseRefused {
        "404": "No such task (with `--auth`, neither is a task of a namespace or queue the token may \
               not act in).",
        "409": "The lease token is stale (the lease lapsed or was given to another worker) or the \
               task is not running; nothing changed.",
    }
}

fn check_poll(limits: &Limits, request: &api::PollRequest) -> ApiResult<()> {
    if request.worker_id.is_empty() {
        return Err(ApiError::invalid("worker_id", "must not be empty"));
    }
    limits.text(Limit::Name, "worker_id", &request.worker_id)?;
    if request.queues.is_empty() || request.queues.len() > 64 {
        return Err(ApiError::invalid("queues", "name 1 to 64 queues to poll"));
    }
    if request.queues.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "queues",
            "a queue name must not be empty",
        ));
    }
    for queue in &request.queues {
        limits.text(Limit::Name, "queues", queue)?;
    }
    if let Some(max) = request.max_tasks
        && (max == 0 || max > MAX_TASKS_PER_POLL)
    {
        return Err(ApiError::invalid(
            "max_tasks",
            format!("must be between 1 and {MAX_TASKS_PER_POLL}"),
        ));
    }
    if request.wait_ms.is_some_and(|wait| wait > MAX_WAIT_MS) {
        return Err(ApiError::invalid(
            "wait_ms",
            format!("at most {MAX_WAIT_MS}: poll again after that"),
        ));
    }
    if request.complete.len() > api::MAX_BATCH_ITEMS {
        return Err(ApiError::invalid(
            "complete",
            format!(
                "give at most {} items: report the rest with the next poll",
                api::MAX_BATCH_ITEMS
            ),
        ));
    }
    Ok(())
}

// Commits the completions it carries, then claims ready tasks; when none is ready, waits until
// one is or `wait_ms` passes (see `Engine::poll`).
/// Claim ready tasks (long-poll)
///
/// First reports the successes in `complete`, each as `POST /api/v1/tasks/complete` would (a
/// refused item changes nothing and leaves the others alone), and commits them durably, with
/// the first claim (which runs after them), before it waits; `reports` answers each, in order.
/// A worker thus reports its last results and asks for more work in one request. Then claims
/// up to `max_tasks` ready tasks of the given queues in dispatch order (priority, then age),
/// tasks the completions made ready included. When none is ready, waits up to `wait_ms` for
/// one. The namespace is a body field here; the `namespace` query parameter is ignored
/// (completions are addressed by task id).
#[utoipa::path(
    post,
    path = paths::TASKS_POLL,
    operation_id = "pollTasks",
    tag = "tasks",
    request_body(content = api::PollRequest),
    responses(
        (
            status = 200,
            description = "The claimed tasks, possibly none, and the answer of each completion.",
            body = api::PollResponse,
        ),
        (
            status = 400,
            description = "The request is malformed: the problem names the field (`body` for \
                           a body that is not a PollRequest, `complete` for more than 1000 \
                           completions) and says how to fix it. Nothing changed, and no \
                           completion was reported.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Body, Failures,
    ),
)]
async fn poll(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> ApiResult<Json<api::PollResponse>> {
    let request: api::PollRequest = body(&bytes)?;
    check_poll(&state.limits, &request)?;
    let namespace = caller.namespace(request.namespace.as_deref())?;
    caller.check_queues(&request.queues)?;
    let poll = Poll {
        namespace,
        queues: request.queues,
        worker: request.worker_id,
        max: request.max_tasks.unwrap_or(1),
        wait: StdDuration::from_millis(request.wait_ms.unwrap_or(0)),
    };
    let (checked, reports) = batch::completions(&state.limits, request.complete);
    let polled = state
        .engine
        .poll(&poll, reports, &caller.task_scope())
        .await?;
    Ok(Json(api::PollResponse {
        tasks: polled.claimed.iter().map(views::leased).collect(),
        max_output_bytes: state.limits.value(Limit::Task),
        reports: batch::merge(checked, polled.reports, |reported| report_view(&reported)),
    }))
}

fn report_response(reported: &starbridge_engine::Reported) -> Json<api::ReportResponse> {
    Json(report_view(reported))
}

/// What a report changed, as the worker protocol answers it.
pub(crate) fn report_view(reported: &starbridge_engine::Reported) -> api::ReportResponse {
    api::ReportResponse {
        task_status: reported.task.status.into(),
        job_status: reported.job_status.into(),
    }
}

/// Extend a lease
///
/// Extends the lease of a running task by its attempt timeout, and records `progress`. Task ids are
/// global: the `namespace` query parameter is ignored.
#[utoipa::path(
    post,
    path = paths::TASK_HEARTBEAT,
    operation_id = "heartbeatTask",
    tag = "tasks",
    params(TaskPath),
    request_body(content = api::HeartbeatRequest),
    responses(
        (status = 200, description = "The new lease expiry.", body = api::HeartbeatResponse),
        (
            status = 400,
            description = "A malformed body.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        LeaseRefused, Guarded, Body, Failures,
    ),
)]
async fn heartbeat(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::HeartbeatResponse>> {
    let id = task_id(&id)?;
    let request: api::HeartbeatRequest = body(&bytes)?;
    if let Some(progress) = &request.progress {
        state.limits.json(Limit::Task, "progress", progress)?;
    }
    let reported = state
        .engine
        .report(
            id.clone(),
            Input::Heartbeat {
                task: id,
                lease_token: request.lease_token,
                progress: request.progress,
            },
            caller.task_scope(),
        )
        .await?;
    let expires = reported
        .task
        .lease_expires_at
        .unwrap_or_else(|| state.engine.now().saturating_add(reported.lease));
    Ok(Json(api::HeartbeatResponse {
        lease_expires_at: api::timestamp_from_millis(expires.0),
    }))
}

/// Report success
///
/// The attempt succeeded with `output`. Task ids are global: the `namespace` query parameter is
/// ignored.
#[utoipa::path(
    post,
    path = paths::TASK_COMPLETE,
    operation_id = "completeTask",
    tag = "tasks",
    params(TaskPath),
    request_body(content = api::CompleteRequest),
    responses(
        (
            status = 200,
            description = "The task's and the job's status afterwards.",
            body = api::ReportResponse,
        ),
        (
            status = 400,
            description = "A malformed body.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        LeaseRefused, Guarded, Body, Failures,
    ),
)]
async fn complete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::ReportResponse>> {
    let id = task_id(&id)?;
    let request: api::CompleteRequest = body(&bytes)?;
    state.limits.json(Limit::Task, "output", &request.output)?;
    if let Some(logs) = &request.logs {
        state.limits.json(Limit::Task, "logs", logs)?;
    }
    let reported = state
        .engine
        .report(
            id.clone(),
            Input::Complete {
                task: id,
                lease_token: request.lease_token,
                output: request.output,
                logs: request.logs,
            },
            caller.task_scope(),
        )
        .await?;
    Ok(report_response(&reported))
}

/// Report failure
///
/// The attempt failed: retried after backoff while attempts are left and the error is retryable,
/// else the step fails and the job winds down. Task ids are global: the `namespace` query parameter
/// is ignored.
#[utoipa::path(
    post,
    path = paths::TASK_FAIL,
    operation_id = "failTask",
    tag = "tasks",
    params(TaskPath),
    request_body(content = api::FailRequest),
    responses(
        (
            status = 200,
            description = "The task's and the job's status afterwards.",
            body = api::ReportResponse,
        ),
        (
            status = 400,
            description = "A malformed body, a blank `error.message` or `error.retry_after_ms` over 7 days.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        LeaseRefused, Guarded, Body, Failures,
    ),
)]
async fn fail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::ReportResponse>> {
    let id = task_id(&id)?;
    let request: api::FailRequest = body(&bytes)?;
    state
        .limits
        .text(Limit::Task, "error.message", &request.error.message)?;
    if let Some(logs) = &request.logs {
        state.limits.json(Limit::Task, "logs", logs)?;
    }
    if request.error.message.trim().is_empty() {
        return Err(ApiError::invalid(
            "error.message",
            "say what went wrong: the message is shown to operators",
        ));
    }
    let retry_after = request.error.retry_after_ms.map(Duration::from_millis);
    if request
        .error
        .retry_after_ms
        .is_some_and(|ms| ms > MAX_CHECK_LATER_MS)
    {
        return Err(ApiError::invalid(
            "error.retry_after_ms",
            format!("at most {MAX_CHECK_LATER_MS} (7 days)"),
        ));
    }
    let reported = state
        .engine
        .report(
            id.clone(),
            Input::Fail {
                task: id,
                lease_token: request.lease_token,
                error: ReportedError {
                    message: request.error.message,
                    retryable: request.error.retryable,
                    retry_after,
                },
                logs: request.logs,
            },
            caller.task_scope(),
        )
        .await?;
    Ok(report_response(&reported))
}

/// Not done yet: check again later
///
/// The task returns to ready after `after_ms` without using an attempt, keeping its idempotency
/// key; bounded by the step timeout. Task ids are global: the `namespace` query parameter is
/// ignored.
#[utoipa::path(
    post,
    path = paths::TASK_CHECK_LATER,
    operation_id = "checkLaterTask",
    tag = "tasks",
    params(TaskPath),
    request_body(content = api::CheckLaterRequest),
    responses(
        (
            status = 200,
            description = "The task's and the job's status afterwards.",
            body = api::ReportResponse,
        ),
        (
            status = 400,
            description = "A malformed body or `after_ms` over 7 days.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        LeaseRefused, Guarded, Body, Failures,
    ),
)]
async fn check_later(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::ReportResponse>> {
    let id = task_id(&id)?;
    let request: api::CheckLaterRequest = body(&bytes)?;
    if let Some(progress) = &request.progress {
        state.limits.json(Limit::Task, "progress", progress)?;
    }
    if request.after_ms > MAX_CHECK_LATER_MS {
        return Err(ApiError::invalid(
            "after_ms",
            format!("at most {MAX_CHECK_LATER_MS} (7 days)"),
        ));
    }
    let reported = state
        .engine
        .report(
            id.clone(),
            Input::CheckLater {
                task: id,
                lease_token: request.lease_token,
                after: Duration::from_millis(request.after_ms),
                progress: request.progress,
            },
            caller.task_scope(),
        )
        .await?;
    Ok(report_response(&reported))
}

/// Await a callback
///
/// The worker handed the attempt to another system, which finishes it through the attempt's
/// `callback_token` (`/api/v1/callbacks/{token}/…`): the lease is released and the task waits,
/// holding no worker but keeping its place on its queue, for at most `timeout_ms` (default: the
/// step's per-attempt `timeout`) after the last callback heartbeat; then the attempt fails
/// (retryable, kind `callback_timeout`).
#[utoipa::path(
    post,
    path = paths::TASK_AWAIT_CALLBACK,
    operation_id = "awaitCallback",
    tag = "tasks",
    params(TaskPath),
    request_body(content = api::AwaitCallbackRequest),
    responses(
        (
            status = 200,
            description = "The task's and the job's status afterwards.",
            body = api::ReportResponse,
        ),
        (
            status = 400,
            description = "A malformed body or a `timeout_ms` of 0 or over 7 days.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        LeaseRefused, Guarded, Body, Failures,
    ),
)]
async fn await_callback(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult<Json<api::ReportResponse>> {
    let id = task_id(&id)?;
    let request: api::AwaitCallbackRequest = body(&bytes)?;
    let most = MAX_CALLBACK_TIMEOUT.as_millis();
    if request
        .timeout_ms
        .is_some_and(|timeout| timeout == 0 || timeout > most)
    {
        return Err(ApiError::invalid(
            "timeout_ms",
            format!("must be between 1 and {most} (7 days)"),
        ));
    }
    let reported = state
        .engine
        .report(
            id.clone(),
            Input::AwaitCallback {
                task: id,
                lease_token: request.lease_token,
                timeout: request.timeout_ms.map(Duration::from_millis),
            },
            caller.task_scope(),
        )
        .await?;
    Ok(report_response(&reported))
}
