//! Batch forms of the busiest calls: many jobs submitted, many tasks completed, in one request.
//! Each item is handled exactly as its single-item call would handle it, as its own request
//! of the store's group commit, so a refused item changes nothing and leaves the others alone;
//! the answer lists each item's result or problem in the order of the request. All items are
//! queued to the writer together, so they share fsyncs, and the HTTP cost is paid once.

use crate::answer::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Extension, Router};
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::ids::TaskId;
use starbridge_core::model::Input;

use crate::auth::{Caller, actor, audit_added_version};
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, namespace, task_id};
use crate::jobs::{check_submit, submission};
use crate::limits::{Limit, Limits};
use crate::openapi::{
    ActorHeader, Body, Failures, Guarded, OtherNamespace, PROBLEM, TraceparentHeader, Unprocessable,
};
use crate::state::AppState;
use crate::tasks::report_view;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::JOBS_BATCH, post(submit_jobs))
        .route(paths::TASKS_COMPLETE, post(complete_tasks))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(submit_jobs, complete_tasks))]
pub(crate) struct Api;

fn check_size(field: &str, len: usize) -> ApiResult<()> {
    if len == 0 || len > api::MAX_BATCH_ITEMS {
        return Err(ApiError::invalid(
            field,
            format!("give 1 to {} items", api::MAX_BATCH_ITEMS),
        ));
    }
    Ok(())
}

fn item<T, U>(result: Result<T, ApiError>, done: impl FnOnce(T) -> U) -> api::BatchItem<U> {
    match result {
        Ok(value) => api::BatchItem::Done(done(value)),
        Err(error) => api::BatchItem::Refused {
            error: error.into_problem(),
        },
    }
}

/// Submit many jobs in one request
///
/// Submits each job of `jobs` exactly as `POST /api/v1/jobs` would (a `key` already used returns
/// that job with `created: false`), each in its own transaction savepoint: a refused job changes
/// nothing and does not affect the others. All the jobs are committed together (one fsync for
/// many), and the answer is sent once every one is durable. The answer is lean: each job's id and
/// status, not the whole job view.
#[utoipa::path(
    post,
    path = paths::JOBS_BATCH,
    operation_id = "submitJobs",
    tag = "jobs",
    params(api::NamespaceQuery, ActorHeader, TraceparentHeader),
    request_body(content = api::SubmitJobs),
    responses(
        (
            status = 200,
            description = "Each item's result or problem, in the order of the request.",
            body = api::SubmitJobsResponse,
        ),
        (
            status = 400,
            description = "The body is not a SubmitJobs object (malformed JSON, an unknown field, a \
                           wrong type; the field is `body`), `jobs` holds no item or more than 1000 \
                           (the field is `jobs`), or the namespace is malformed. Nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Body, Failures,
    ),
)]
async fn submit_jobs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::SubmitJobsResponse>> {
    let namespace = namespace(&query)?;
    let request: api::SubmitJobs = body(&bytes)?;
    check_size("jobs", request.jobs.len())?;
    let actor = actor(&headers)?;
    let traceparent = crate::traces::traceparent(&state.engine, &headers);
    // Items over a limit are refused here, the rest go to the store.
    let mut checked = Vec::with_capacity(request.jobs.len());
    let mut requests = Vec::with_capacity(request.jobs.len());
    for job in request.jobs {
        let verdict = check_submit(&state.limits, &job);
        if verdict.is_ok() {
            requests.push(submission(job, actor.clone(), &caller, traceparent.clone()));
        }
        checked.push(verdict);
    }
    let answers = state.engine.submit_many(&namespace, requests).await;
    for submitted in answers.iter().flatten() {
        if submitted.added_version.is_some() {
            let workflow = &submitted.state.job.workflow;
            audit_added_version(&state, &namespace, &actor, workflow).await;
        }
    }
    let items = merge(checked, answers, |submitted| api::SubmittedJob {
        id: submitted.state.job.id.to_string(),
        status: submitted.state.job.status.into(),
        created: submitted.created,
    });
    Ok(Json(api::SubmitJobsResponse { items }))
}

/// Report many successes in one request
///
/// Reports each task of `tasks` as `POST /api/v1/tasks/{id}/complete` would, each in its own
/// transaction savepoint: an item with a stale lease token (its problem has status 409) or an
/// unknown task (404) changes nothing and does not affect the others. All the reports are committed
/// together and the answer is sent once every one is durable. Task ids are global: the `namespace`
/// query parameter is ignored.
#[utoipa::path(
    post,
    path = paths::TASKS_COMPLETE,
    operation_id = "completeTasks",
    tag = "tasks",
    request_body(content = api::CompleteTasks),
    responses(
        (
            status = 200,
            description = "Each item's result or problem, in the order of the request.",
            body = api::CompleteTasksResponse,
        ),
        (
            status = 400,
            description = "The body is not a CompleteTasks object (malformed JSON, an unknown \
                           field, a wrong type; the field is `body`), or `tasks` holds no item or \
                           more than 1000 (the field is `tasks`). Nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        Guarded, Body, Failures,
    ),
)]
async fn complete_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> ApiResult<Json<api::CompleteTasksResponse>> {
    let request: api::CompleteTasks = body(&bytes)?;
    check_size("tasks", request.tasks.len())?;
    let (checked, reports) = completions(&state.limits, request.tasks);
    let answers = state.engine.report_many(reports, caller.task_scope()).await;
    let items = merge(checked, answers, |reported| report_view(&reported));
    Ok(Json(api::CompleteTasksResponse { items }))
}

/// The verdict on each completion, in order, and the reports of those accepted for the store:
/// an item whose id cannot name a task, or whose output is over the limit, is refused here.
/// (`POST /tasks/complete` and a poll's `complete` take completions alike.)
pub(crate) fn completions(
    limits: &Limits,
    tasks: Vec<api::CompleteTask>,
) -> (Vec<ApiResult<()>>, Vec<(TaskId, Input)>) {
    let mut checked = Vec::with_capacity(tasks.len());
    let mut reports = Vec::with_capacity(tasks.len());
    for task in tasks {
        let verdict = check_completion(limits, &task);
        if let Ok(id) = &verdict {
            reports.push((
                id.clone(),
                Input::Complete {
                    task: id.clone(),
                    lease_token: task.lease_token,
                    output: task.output,
                    logs: task.logs,
                },
            ));
        }
        checked.push(verdict.map(drop));
    }
    (checked, reports)
}

/// The task a completion names, once its output and logs are within the task limit.
fn check_completion(limits: &Limits, task: &api::CompleteTask) -> ApiResult<TaskId> {
    let id = task_id(&task.id)?;
    limits.json(Limit::Task, "output", &task.output)?;
    if let Some(logs) = &task.logs {
        limits.json(Limit::Task, "logs", logs)?;
    }
    Ok(id)
}

/// The answer of each item, in request order: the refusal of an item `checked` refused, else
/// the store's answer for it (`answers` holds one per accepted item, in order).
pub(crate) fn merge<T, U>(
    checked: Vec<ApiResult<()>>,
    answers: Vec<starbridge_engine::Result<T>>,
    done: impl Fn(T) -> U,
) -> Vec<api::BatchItem<U>> {
    let mut answers = answers.into_iter();
    checked
        .into_iter()
        .map(|verdict| {
            let answer = verdict.and_then(|()| {
                answers
                    .next()
                    .unwrap_or(Err(starbridge_engine::Error::Closed))
                    .map_err(ApiError::from)
            });
            item(answer, &done)
        })
        .collect()
}
