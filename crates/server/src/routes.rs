//! The HTTP API under `/api/v1`, plus `/healthz`. Request bodies are parsed by hand so that a
//! malformed body gets a problem document naming the field (or line and column) at fault.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use starbridge_api as api;
use starbridge_core::definition::{check_name, parse_document};
use starbridge_core::destination::DestinationPolicy;
use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{Input, JobStatus, ReportedError};
use starbridge_core::time::Duration;
use starbridge_store::{JobFilter, Store, Submit, WriteFault};
use tokio::time::Instant;

use crate::auth::{Auth, Caller, actor, audit_added_version};
use crate::error::{ApiError, ApiResult};
use crate::limits::{Limit, Limits};
use crate::views;

/// Longest long-poll a worker may ask for.
pub(crate) const MAX_WAIT_MS: u64 = 60_000;
/// Most tasks one poll may claim.
pub(crate) const MAX_TASKS_PER_POLL: u32 = 256;
/// Longest "check later" delay.
pub(crate) const MAX_CHECK_LATER_MS: u64 = 7 * 24 * 3600 * 1000;

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub auth: Arc<Auth>,
    pub limits: Arc<Limits>,
    /// Where webhooks may be delivered (`--webhook-allow` opens more than the default).
    pub webhook_policy: Arc<DestinationPolicy>,
    /// Host names requests may be addressed to without authentication (see `guard`).
    pub allowed_hosts: Arc<[String]>,
}

impl AppState {
    /// A server without authentication (for loopback use and tests), with the default limits.
    pub fn new(store: Store) -> AppState {
        AppState::with_limits(store, Limits::default())
    }

    /// A server without authentication, with these limits.
    pub fn with_limits(store: Store, limits: Limits) -> AppState {
        AppState {
            store,
            auth: Arc::new(Auth::default()),
            limits: Arc::new(limits),
            webhook_policy: Arc::default(),
            allowed_hosts: Arc::new([]),
        }
    }

    /// A server that requires an API token on every request but health and the API document.
    pub fn with_auth(store: Store) -> AppState {
        AppState {
            auth: Arc::new(Auth::required()),
            ..AppState::new(store)
        }
    }
}

pub fn router(state: AppState) -> Router {
    let limits = state.limits.clone();
    Router::new()
        .route("/healthz", get(health))
        .route("/metrics", get(crate::metrics::serve))
        .route("/api/v1/openapi.json", get(crate::openapi::serve))
        .route("/api/v1/workflows", get(list_workflows))
        .route(
            "/api/v1/workflows/{name}",
            put(apply_workflow).get(get_workflow),
        )
        .route("/api/v1/jobs", post(submit_job).get(list_jobs))
        .route("/api/v1/jobs/{id}", get(get_job))
        .route("/api/v1/jobs/{id}/events", get(job_events))
        .route("/api/v1/tasks/poll", post(poll))
        .route("/api/v1/tasks/{id}/heartbeat", post(heartbeat))
        .route("/api/v1/tasks/{id}/complete", post(complete))
        .route("/api/v1/tasks/{id}/fail", post(fail))
        .route("/api/v1/tasks/{id}/check-later", post(check_later))
        .merge(crate::batch::routes())
        .merge(crate::operate::routes())
        .merge(crate::queues::routes())
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
            crate::error::problems_for_rejections,
        ))
        .layer(DefaultBodyLimit::max(limits.body_bytes))
        .layer(crate::metrics::layer())
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint: see /api/v1/openapi.json")
}

pub(crate) fn body<T: DeserializeOwned>(bytes: &Bytes) -> ApiResult<T> {
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "body",
            "expected a JSON object, got an empty body",
        ));
    }
    let parsed = serde_json::from_slice(bytes).or_else(|error| {
        // JSON does not tell 2 from 2.0; some clients send whole numbers as floats.
        if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(bytes)
            && integral_floats_to_integers(&mut value)
            && let Ok(parsed) = serde_json::from_value(value)
        {
            return Ok(parsed);
        }
        Err(ApiError::invalid(
            "body",
            format!("{error} (line {} column {})", error.line(), error.column()),
        ))
    })?;
    match crate::json_checks::first_fault(bytes) {
        None => Ok(parsed),
        Some(fault) => Err(ApiError::validation(&fault.field, fault.message)),
    }
}

/// Rewrites every float with no fractional part (in the 64-bit integer range) as an integer;
/// says whether it changed anything.
fn integral_floats_to_integers(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Number(number) if number.is_f64() => {
            let float = number.as_f64().unwrap_or(f64::NAN);
            let whole = float.fract() == 0.0 && float.abs() < 9.0e15;
            if whole {
                // Exact: the float is whole and well inside the range where i64 is exact.
                *value = Value::from(float as i64);
            }
            whole
        }
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| {
            integral_floats_to_integers(item) | changed
        }),
        Value::Object(fields) => fields.values_mut().fold(false, |changed, field| {
            integral_floats_to_integers(field) | changed
        }),
        _ => false,
    }
}

/// An RFC 3339 time from a request field.
pub(crate) fn parse_time(field: &str, text: &str) -> ApiResult<starbridge_core::time::Timestamp> {
    text.parse::<api::Timestamp>()
        .map(|ts| starbridge_core::time::Timestamp(ts.as_millisecond()))
        .map_err(|_| {
            ApiError::invalid(
                field,
                format!("'{text}' is not an RFC 3339 time such as 2026-11-22T10:00:00Z"),
            )
        })
}

/// A job status from a request field.
pub(crate) fn parse_status(field: &str, text: &str) -> ApiResult<JobStatus> {
    JobStatus::parse(text).ok_or_else(|| {
        let valid: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
        ApiError::invalid(
            field,
            format!("unknown status '{text}': use one of {}", valid.join(", ")),
        )
    })
}

pub(crate) fn namespace(query: &api::NamespaceQuery) -> ApiResult<String> {
    namespace_name(query.namespace.as_deref())
}

pub(crate) fn namespace_name(value: Option<&str>) -> ApiResult<String> {
    let name = value.unwrap_or(api::DEFAULT_NAMESPACE);
    check_name(name).map_err(|message| ApiError::invalid("namespace", message))?;
    Ok(name.to_owned())
}

pub(crate) fn job_id(text: &str) -> ApiResult<JobId> {
    JobId::parse(text).ok_or_else(|| ApiError::not_found(format!("job {text} not found")))
}

pub(crate) fn task_id(text: &str) -> ApiResult<TaskId> {
    TaskId::parse(text).ok_or_else(|| ApiError::not_found(format!("task {text} not found")))
}

/// Whether the database is read and written (see `Store::health`): `503` unless it is.
async fn health(State(state): State<AppState>) -> Response {
    let health = state.store.health().await;
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

async fn list_workflows(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::WorkflowList>> {
    let namespace = namespace(&query)?;
    let stored = state.store.workflows(&namespace).await?;
    Ok(Json(api::WorkflowList {
        items: stored.iter().map(views::workflow_summary).collect(),
    }))
}

#[derive(Deserialize)]
struct WorkflowQuery {
    namespace: Option<String>,
    version: Option<u32>,
}

async fn get_workflow(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<WorkflowQuery>,
) -> ApiResult<Json<api::WorkflowDetail>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    let stored = state
        .store
        .workflow(&namespace, &name, query.version)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("workflow {name} not found")))?;
    Ok(Json(api::WorkflowDetail {
        summary: views::workflow_summary(&stored),
        definition: stored.definition,
    }))
}

async fn apply_workflow(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    bytes: Bytes,
) -> ApiResult<Response> {
    let namespace = namespace(&query)?;
    state.limits.text(Limit::Name, "name", &name)?;
    check_name(&name).map_err(|message| ApiError::invalid("name", message))?;
    if bytes.len() > state.limits.definition_bytes {
        return Err(state.limits.body_too_large(Limit::Definition, "body"));
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::invalid("body", "the definition must be UTF-8 text"))?;
    let document =
        parse_document(text).map_err(|error| starbridge_store::Error::Invalid(error.problems))?;
    state.limits.definition("body", &document)?;
    let applied = state
        .store
        .apply_workflow(&namespace, &name, document)
        .await?;
    let status = if applied.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(api::AppliedWorkflow {
            namespace,
            name,
            version: applied.version,
            created: applied.created,
        }),
    )
        .into_response())
}

/// Most history events read to rebuild a job's attempts.
const MAX_VIEW_EVENTS: u32 = 100_000;

pub(crate) async fn job_view(
    state: &AppState,
    job: &starbridge_core::model::JobState,
) -> ApiResult<api::JobView> {
    let events = state
        .store
        .events(&job.job.namespace, &job.job.id, 0, MAX_VIEW_EVENTS)
        .await?
        .unwrap_or_default();
    job_view_with(state, job, &events).await
}

/// The view of `job` with its task runs rebuilt from `events`. A job just created has no runs
/// (none of its tasks was claimed in the transaction that made it), so its view needs no history.
async fn job_view_with(
    state: &AppState,
    job: &starbridge_core::model::JobState,
    events: &[starbridge_store::StoredEvent],
) -> ApiResult<api::JobView> {
    let namespace = &job.job.namespace;
    let compiled = state
        .store
        .compiled(namespace, &job.job.workflow, job.job.version)
        .await
        .ok();
    let mut waiting_queues: Vec<String> = job
        .tasks
        .iter()
        .filter(|t| t.status == starbridge_core::model::TaskStatus::Ready)
        .map(|t| t.queue.clone())
        .collect();
    waiting_queues.sort();
    waiting_queues.dedup();
    let queues = state.store.queue_states(namespace, waiting_queues).await?;
    let lock_held = match (&job.job.lock, job.job.status) {
        (Some(lock), starbridge_core::model::JobStatus::Queued) => {
            Some(state.store.lock_usage(namespace, &lock.key).await?)
        }
        _ => None,
    };
    let context = views::JobContext {
        workflow: compiled.as_ref().map(|c| &c.workflow),
        events,
        queues: &queues,
        lock_held,
        now: state.store.now(),
    };
    Ok(views::job(job, &context))
}

async fn submit_job(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Response> {
    let namespace = namespace(&query)?;
    let request: api::SubmitJob = body(&bytes)?;
    check_submit(&state.limits, &request)?;
    let actor = actor(&headers)?;
    let submitted = state
        .store
        .submit(&namespace, submission(request, actor.clone(), &caller))
        .await?;
    if submitted.added_version.is_some() {
        audit_added_version(&state, &namespace, &actor, &submitted.state.job.workflow).await;
    }
    let (status, view) = if submitted.created {
        let view = job_view_with(&state, &submitted.state, &[]).await?;
        (StatusCode::CREATED, view)
    } else {
        (StatusCode::OK, job_view(&state, &submitted.state).await?)
    };
    Ok((status, Json(view)).into_response())
}

/// What the store is asked to create for a submitted job; `actor` is recorded in the job's
/// `job_created` event (submissions are not in the audit log: the job's history names them,
/// and a workflow version an inline definition makes is audited as an apply). Only a caller
/// that may operate may make a version that way.
pub(crate) fn submission(request: api::SubmitJob, actor: String, caller: &Caller) -> Submit {
    Submit {
        workflow: request.workflow,
        version: request.version,
        definition: request.definition,
        params: request.params,
        key: request.key,
        priority: request.priority,
        actor: Some(actor),
        may_add_version: caller.may_operate(),
    }
}

/// Holds a job submission to the limits on names, keys, params and inline definitions.
pub(crate) fn check_submit(limits: &Limits, request: &api::SubmitJob) -> ApiResult<()> {
    if let Some(workflow) = &request.workflow {
        limits.text(Limit::Name, "workflow", workflow)?;
    }
    if let Some(key) = &request.key {
        limits.text(Limit::Key, "key", key)?;
    }
    if let Some(params) = &request.params {
        limits.json(Limit::Params, "params", params)?;
    }
    if let Some(definition) = &request.definition {
        limits.definition("definition", definition)?;
    }
    Ok(())
}

async fn list_jobs(
    State(state): State<AppState>,
    Query(query): Query<api::JobListQuery>,
) -> ApiResult<Json<api::JobList>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    let status = query
        .status
        .as_deref()
        .map(|text| parse_status("status", text))
        .transpose()?;
    let limit = query.limit.unwrap_or(50);
    if limit == 0 {
        return Err(ApiError::invalid("limit", "must be at least 1"));
    }
    state
        .limits
        .count(Limit::Page, "limit", u64::from(limit), "items")?;
    let created_after = query
        .created_after
        .as_deref()
        .map(|text| parse_time("created_after", text))
        .transpose()?;
    let created_before = query
        .created_before
        .as_deref()
        .map(|text| parse_time("created_before", text))
        .transpose()?;
    let before = query
        .cursor
        .as_deref()
        .map(|cursor| {
            JobId::parse(cursor).ok_or_else(|| {
                ApiError::invalid(
                    "cursor",
                    "not a cursor: pass next_cursor from the previous page",
                )
            })
        })
        .transpose()?;
    // One more than the page tells whether another page follows.
    let mut jobs = state
        .store
        .jobs(JobFilter {
            namespace,
            status,
            workflow: query.workflow,
            before,
            created_after,
            created_before,
            limit: limit + 1,
        })
        .await?;
    let more = jobs.len() > limit as usize;
    jobs.truncate(limit as usize);
    let next_cursor = more
        .then(|| jobs.last().map(|job| job.id.to_string()))
        .flatten();
    Ok(Json(api::JobList {
        items: jobs.iter().map(views::job_summary).collect(),
        next_cursor,
    }))
}

async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::JobView>> {
    let namespace = namespace(&query)?;
    let id = job_id(&id)?;
    let job = state
        .store
        .job(&namespace, &id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
    Ok(Json(job_view(&state, &job).await?))
}

#[derive(Deserialize)]
struct EventsQuery {
    namespace: Option<String>,
    after: Option<i64>,
    limit: Option<u32>,
}

async fn job_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
) -> ApiResult<Json<api::EventList>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    let id = job_id(&id)?;
    let limit = query.limit.unwrap_or(1000).clamp(1, 10_000);
    let events = state
        .store
        .events(&namespace, &id, query.after.unwrap_or(0), limit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
    Ok(Json(api::EventList {
        items: events.iter().map(views::event).collect(),
    }))
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
    Ok(())
}

/// Claims ready tasks; when none is ready, waits until one is (a wake-up after its commit, or its
/// retry time arriving) or `wait_ms` passes.
async fn poll(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> ApiResult<Json<api::PollResponse>> {
    let request: api::PollRequest = body(&bytes)?;
    check_poll(&state.limits, &request)?;
    let namespace = caller.namespace(request.namespace.as_deref())?;
    caller.check_queues(&request.queues)?;
    state
        .store
        .notifier()
        .polled(&namespace, &request.worker_id, &request.queues);
    let max = request.max_tasks.unwrap_or(1);
    let deadline = Instant::now() + StdDuration::from_millis(request.wait_ms.unwrap_or(0));
    let store = &state.store;
    loop {
        let woken = store.notifier().register(&namespace, &request.queues);
        let claimed = store
            .claim(&namespace, request.queues.clone(), &request.worker_id, max)
            .await?;
        for task in &claimed {
            store.notifier().claimed(&namespace, &task.task.queue, 1);
        }
        if !claimed.is_empty() || Instant::now() >= deadline {
            return Ok(Json(api::PollResponse {
                tasks: claimed
                    .iter()
                    .map(|c| views::leased(&c.task, c.lease.as_millis()))
                    .collect(),
            }));
        }
        let mut wake_at = deadline;
        if let Some(next) = store
            .next_available(&namespace, request.queues.clone())
            .await?
        {
            let wait = next.since(store.now());
            wake_at = wake_at.min(Instant::now() + StdDuration::from_millis(wait.as_millis()));
        }
        tokio::select! {
            () = woken.notified() => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

fn report_response(reported: &starbridge_store::Reported) -> Json<api::ReportResponse> {
    Json(api::ReportResponse {
        task_status: reported.task.status.to_string(),
        job_status: reported.job_status.to_string(),
    })
}

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
        .store
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
        .unwrap_or_else(|| state.store.now().saturating_add(reported.lease));
    Ok(Json(api::HeartbeatResponse {
        lease_expires_at: api::timestamp_from_millis(expires.0),
    }))
}

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
        .store
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
    let reported = state
        .store
        .report(
            id.clone(),
            Input::Fail {
                task: id,
                lease_token: request.lease_token,
                error: ReportedError {
                    message: request.error.message,
                    retryable: request.error.retryable,
                },
                logs: request.logs,
            },
            caller.task_scope(),
        )
        .await?;
    Ok(report_response(&reported))
}

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
        .store
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
