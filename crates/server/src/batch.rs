//! Batch forms of the busiest calls: many jobs submitted, many tasks completed, in one request.
//! Each item is handled exactly as its single-item call would handle it, in its own savepoint
//! of the store's group commit, so a refused item changes nothing and leaves the others alone;
//! the answer lists each item's result or problem in the order of the request. All items are
//! queued to the writer together, so they share fsyncs, and the HTTP cost is paid once.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::routing::post;
use axum::{Extension, Json, Router};
use starbridge_api as api;
use starbridge_core::model::Input;
use starbridge_store::Submit;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::routes::{AppState, body, namespace, task_id};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/jobs/batch", post(submit_jobs))
        .route("/api/v1/tasks/complete", post(complete_tasks))
}

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

async fn submit_jobs(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
    bytes: Bytes,
) -> ApiResult<Json<api::SubmitJobsResponse>> {
    let namespace = namespace(&query)?;
    let request: api::SubmitJobs = body(&bytes)?;
    check_size("jobs", request.jobs.len())?;
    let requests = request
        .jobs
        .into_iter()
        .map(|job| Submit {
            workflow: job.workflow,
            version: job.version,
            definition: job.definition,
            params: job.params,
            key: job.key,
            priority: job.priority,
        })
        .collect();
    let answers = state.store.submit_many(&namespace, requests).await;
    let items = answers
        .into_iter()
        .map(|answer| {
            item(answer.map_err(ApiError::from), |submitted| {
                api::SubmittedJob {
                    id: submitted.state.job.id.to_string(),
                    status: submitted.state.job.status.to_string(),
                    created: submitted.created,
                }
            })
        })
        .collect();
    Ok(Json(api::SubmitJobsResponse { items }))
}

async fn complete_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    bytes: Bytes,
) -> ApiResult<Json<api::CompleteTasksResponse>> {
    let request: api::CompleteTasks = body(&bytes)?;
    check_size("tasks", request.tasks.len())?;
    // Items whose id cannot name a task are refused here, the rest go to the store.
    let mut parsed = Vec::with_capacity(request.tasks.len());
    let mut reports = Vec::new();
    for task in request.tasks {
        match task_id(&task.id) {
            Ok(id) => {
                parsed.push(Ok(()));
                reports.push((
                    id.clone(),
                    Input::Complete {
                        task: id,
                        lease_token: task.lease_token,
                        output: task.output,
                        logs: task.logs,
                    },
                ));
            }
            Err(error) => parsed.push(Err(error)),
        }
    }
    let mut answers = state
        .store
        .report_many(reports, caller.task_scope())
        .await
        .into_iter();
    let items = parsed
        .into_iter()
        .map(|parsed| {
            let answer = parsed.and_then(|()| {
                answers
                    .next()
                    .unwrap_or(Err(starbridge_store::Error::Closed))
                    .map_err(ApiError::from)
            });
            item(answer, |reported| api::ReportResponse {
                task_status: reported.task.status.to_string(),
                job_status: reported.job_status.to_string(),
            })
        })
        .collect();
    Ok(Json(api::CompleteTasksResponse { items }))
}
