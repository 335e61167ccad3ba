//! Jobs: submit one, list them, read one with its tasks and runs, read its history, delete a
//! finished one.

use crate::answer::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::ids::JobId;
use starbridge_engine::{JobCursor, JobFilter, Submit};
use utoipa::IntoParams;

use crate::auth::{Caller, actor, audit_added_version};
use crate::error::{ApiError, ApiResult};
use crate::extract::{
    body, job_id, label_filter, namespace, namespace_name, parse_status, parse_time,
};
use crate::limits::{Limit, Limits};
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, JobPath, NotFound, OtherNamespace, PROBLEM,
    TraceparentHeader, Unprocessable,
};
use crate::state::AppState;
use crate::views;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::JOBS, post(submit_job).get(list_jobs))
        .route(paths::JOB, get(get_job).delete(delete_job))
        .route(paths::JOB_EVENTS, get(job_events))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(submit_job, list_jobs, get_job, delete_job, job_events))]
pub(crate) struct Api;

/// Most history events read to rebuild a job's attempts.
const MAX_VIEW_EVENTS: u32 = 100_000;
pub(crate) async fn job_view(
    state: &AppState,
    job: &starbridge_core::model::JobState,
) -> ApiResult<api::JobView> {
    let (events, queues) = state.engine.view_reads(job, MAX_VIEW_EVENTS).await?;
    job_view_with(state, job, &events, &queues).await
}

/// The view of `job` with its task runs rebuilt from `events` and its ready tasks' waits
/// explained by `queues`. A job just created has no runs (none of its tasks was claimed in the
/// transaction that made it), so its view needs no history.
async fn job_view_with(
    state: &AppState,
    job: &starbridge_core::model::JobState,
    events: &[starbridge_engine::StoredEvent],
    queues: &starbridge_engine::QueueStates,
) -> ApiResult<api::JobView> {
    let namespace = &job.job.namespace;
    let compiled = state
        .engine
        .compiled(namespace, &job.job.workflow, job.job.version)
        .await
        .ok();
    let lock_held = match (&job.job.lock, job.job.status) {
        (Some(lock), starbridge_core::model::JobStatus::Queued) => {
            Some(state.engine.lock_usage(namespace, &lock.key).await?)
        }
        _ => None,
    };
    let context = views::JobContext {
        workflow: compiled.as_ref().map(|c| &c.workflow),
        events,
        queues,
        lock_held,
        now: state.engine.now(),
    };
    Ok(views::job(job, &context))
}

/// Submit a job
///
/// Starts a job of an applied workflow, or of an inline definition. With a `key` already used in
/// the namespace, returns that job instead (200) without starting another.
#[utoipa::path(
    post,
    path = paths::JOBS,
    operation_id = "submitJob",
    tag = "jobs",
    params(api::NamespaceQuery, ActorHeader, TraceparentHeader),
    request_body(content = api::SubmitJob),
    responses(
        (
            status = 200,
            description = "The key matched an existing job, which is returned.",
            body = api::JobView,
        ),
        (status = 201, description = "The job was created.", body = api::JobView),
        (
            status = 400,
            description = "The body is not a SubmitJob object (malformed JSON, an unknown field, a \
                           wrong type), a malformed namespace or a malformed `Starbridge-Actor` \
                           header.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 404,
            description = "The workflow, or its `version`, is not applied in this namespace. With \
                           `--auth`, anything of a namespace other than the one the token is bound \
                           to is not found either.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 409,
            description = "The `key` names a job of another workflow.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 422,
            description = "Neither `workflow` nor `definition`, a malformed `workflow` name or \
                           `key`, `params` not an object or not matching the workflow's schema, an \
                           invalid inline definition, a workflow `lock.key` that does not render \
                           to a string (the field is `lock.key`), a label that breaks the rules of \
                           labels (`labels.<key>`), or more labels than `--max-labels`, the \
                           submission's own (a limit-exceeded problem) or merged with the \
                           workflow's (`labels`).",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
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
    let (submitted, queues) = state
        .engine
        .submit_for_view(
            &namespace,
            submission(
                request,
                actor.clone(),
                &caller,
                crate::traces::traceparent(&state.engine, &headers),
            ),
        )
        .await?;
    if submitted.added_version.is_some() {
        audit_added_version(&state, &namespace, &actor, &submitted.state.job.workflow).await;
    }
    let (status, view) = if submitted.created {
        let view = job_view_with(&state, &submitted.state, &[], &queues).await?;
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
/// A traced job continues the caller's `traceparent`.
pub(crate) fn submission(
    request: api::SubmitJob,
    actor: String,
    caller: &Caller,
    traceparent: Option<String>,
) -> Submit {
    Submit {
        workflow: request.workflow,
        version: request.version,
        definition: request.definition,
        params: request.params,
        key: request.key,
        priority: request.priority,
        actor: Some(actor),
        labels: request.labels,
        may_add_version: caller.may_operate(),
        traceparent,
    }
}

/// Holds a job submission to the limits on names, keys, params, labels and inline definitions.
pub(crate) fn check_submit(limits: &Limits, request: &api::SubmitJob) -> ApiResult<()> {
    limits.labels("labels", request.labels.len())?;
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

/// List jobs
///
/// Jobs of the namespace, newest first, a page at a time.
#[utoipa::path(
    get,
    path = paths::JOBS,
    operation_id = "listJobs",
    tag = "jobs",
    params(
        api::NamespaceQuery,
        api::JobListQuery,
        (
            "label" = Option<Vec<String>>, Query, style = Form, explode,
            description = "Only jobs with this label, `key=value` (split at the first `=`, so a \
                           value may hold `=`); repeat it for the jobs with every one of several \
                           labels. A selector without `=`, a key other than 1 to 63 characters of \
                           `a-z0-9_./-` or a value over 255 bytes is a 400.",
        ),
    ),
    responses(
        (status = 200, description = "A page of jobs.", body = api::JobList),
        (
            status = 400,
            description = "An unknown `status`, a `limit` out of range, a malformed \
                           `created_after`, `created_before`, `cursor`, `label` or `parent`, or a malformed namespace: \
                           the problem names the parameter. A query string that cannot be parsed at \
                           all (e.g. `limit=abc`) is refused before the handler, with a problem naming \
                           `query`.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn list_jobs(
    State(state): State<AppState>,
    Query(query): Query<api::JobListQuery>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> ApiResult<Json<api::JobList>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    // `label` repeats, which the query's struct cannot hold: read from every pair.
    let labels = label_filter(
        pairs
            .iter()
            .filter(|(name, _)| name == "label")
            .map(|(_, selector)| selector.as_str()),
    )?;
    let status = query
        .status
        .as_ref()
        .map(|status| parse_status("status", status))
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
            JobCursor::decode(cursor).ok_or_else(|| {
                ApiError::invalid(
                    "cursor",
                    "not a cursor: pass next_cursor from the previous page",
                )
            })
        })
        .transpose()?;
    let parent = query
        .parent
        .as_deref()
        .map(|parent| {
            JobId::parse(parent).ok_or_else(|| {
                ApiError::invalid("parent", "not a job id: pass a job's `id` (`job_…`)")
            })
        })
        .transpose()?;
    // One more than the page tells whether another page follows.
    let mut jobs = state
        .engine
        .jobs(JobFilter {
            namespace,
            status,
            workflow: query.workflow,
            before,
            created_after,
            created_before,
            parent,
            labels,
            ids: None,
            limit: limit + 1,
        })
        .await?;
    let more = jobs.len() > limit as usize;
    jobs.truncate(limit as usize);
    let next_cursor = more
        .then(|| {
            jobs.last()
                .map(|job| JobCursor::of(job.created_at, &job.id).encode())
        })
        .flatten();
    Ok(Json(api::JobList {
        items: jobs.iter().map(views::job_summary).collect(),
        next_cursor,
    }))
}

/// Delete a finished job
///
/// Deletes a succeeded, failed, compensation_failed, cancelled or timed_out job with its tasks,
/// history, signals and labels, as retention pruning does; its idempotency key is free again (a
/// submit with it makes a new job). A child job (of a sub-workflow step) is deleted only once its
/// parent is gone; the children of a deleted parent stay until deleted or pruned. Takes no body
/// (one sent is ignored).
#[utoipa::path(
    delete,
    path = paths::JOB,
    operation_id = "deleteJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 204, description = "The job was deleted; the answer has no body."),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (
            status = 409,
            description = "The job may not be deleted; `detail` says why and what to do: it has \
                           not finished (cancel it first), or it is a child job whose parent is \
                           kept (delete the parent first).",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        Guarded, Body, Failures,
    ),
)]
async fn delete_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.engine.delete_job(&namespace, &job_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Get a job
///
/// The job with its tasks and each task's runs.
#[utoipa::path(
    get,
    path = paths::JOB,
    operation_id = "getJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery),
    responses(
        (status = 200, description = "The job.", body = api::JobView),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn get_job(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::JobView>> {
    let namespace = namespace(&query)?;
    let id = job_id(&id)?;
    let job = state
        .engine
        .job(&namespace, &id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
    Ok(Json(job_view(&state, &job).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Documented by [`api::NamespaceQuery`].
    #[param(ignore)]
    namespace: Option<String>,
    /// Only events with a greater `seq`.
    #[param(default = 0)]
    after: Option<i64>,
    /// Most events to return; values outside 1 to 10000 are clamped to that range, not refused.
    #[param(minimum = 0, maximum = 4294967295u64, default = 1000)]
    limit: Option<u32>,
}

/// A job's history
///
/// Events oldest first; read on with `after` = the last `seq`.
#[utoipa::path(
    get,
    path = paths::JOB_EVENTS,
    operation_id = "listJobEvents",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, EventsQuery),
    responses(
        (status = 200, description = "The events.", body = api::EventList),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn job_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
) -> ApiResult<Json<api::EventList>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    let id = job_id(&id)?;
    let limit = query.limit.unwrap_or(1000).clamp(1, 10_000);
    let events = state
        .engine
        .events(&namespace, &id, query.after.unwrap_or(0), limit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {id} not found")))?;
    Ok(Json(api::EventList {
        items: events.iter().map(views::event).collect(),
    }))
}
