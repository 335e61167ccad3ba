//! Approval steps: the pending ones of a namespace (`GET /api/v1/approvals`, scope `read`), and
//! deciding one (`POST /api/v1/jobs/{id}/tasks/{task}/approve` or `/reject`, scope `operate`).
//! The decider is the token's name (or the `Starbridge-Actor` header without `--auth`); the
//! decision is in the job's history, and approval's output is `{approved, by, comment, at}`.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::model::WaitFor;
use starbridge_engine::Decision;

use crate::auth::actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{job_id, namespace, namespace_name, optional_body, task_id};
use crate::jobs::job_view;
use crate::limits::Limit;
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, JobPath, OtherNamespace, Unprocessable,
};
use crate::state::AppState;

/// The approval operations, for the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, approve, reject))]
pub(crate) struct Api;

crate::openapi::problem_answers! {
    /// How a decision is refused.
    DecisionRefused {
        "400": "A malformed body or namespace, or a comment over 4096 bytes.",
        "404": "No such job in this namespace, or no such task in the job (with `--auth`, \
               neither is anything of a namespace other than the token's).",
        "409": "The task is not waiting for approval, or it was already decided; nothing \
               changed.",
    }
}

/// Longest decision comment.
const MAX_COMMENT_BYTES: usize = 4096;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::APPROVALS, get(list))
        .route(paths::JOB_TASK_APPROVE, post(approve))
        .route(paths::JOB_TASK_REJECT, post(reject))
}

/// List pending approvals
///
/// The steps of the namespace waiting for a person to approve or reject them, oldest first.
#[utoipa::path(
    get,
    path = paths::APPROVALS,
    operation_id = "listApprovals",
    tag = "jobs",
    params(api::ApprovalListQuery),
    responses(
        (status = 200, description = "The pending approvals.", body = api::ApprovalList),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn list(
    State(state): State<AppState>,
    Query(query): Query<api::ApprovalListQuery>,
) -> ApiResult<Json<api::ApprovalList>> {
    let namespace = namespace_name(query.namespace.as_deref())?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 {
        return Err(ApiError::invalid("limit", "must be at least 1"));
    }
    state
        .limits
        .count(Limit::Page, "limit", u64::from(limit), "items")?;
    Ok(Json(list_of(&state, &namespace, limit).await?))
}

/// The approvals of `namespace` waiting for a decision, oldest first (at most `limit`).
pub(crate) async fn list_of(
    state: &AppState,
    namespace: &str,
    limit: u32,
) -> ApiResult<api::ApprovalList> {
    let pending = state.engine.pending_approvals(namespace, limit).await?;
    let items = pending
        .into_iter()
        .filter_map(|(task, workflow)| {
            let wait = task.wait.as_ref()?;
            let WaitFor::Approval { prompt } = &wait.on else {
                return None;
            };
            Some(api::ApprovalView {
                job_id: task.job_id.to_string(),
                workflow,
                task_id: task.id.to_string(),
                step: task.step.clone(),
                item: task.item,
                prompt: prompt.clone(),
                since: api::timestamp_from_millis(wait.since.0),
                decided: task.pending_outcome.is_some(),
            })
        })
        .collect();
    Ok(api::ApprovalList { items })
}

/// Approve a step
///
/// The approval step succeeds with `{"approved": true, "by", "comment", "at"}`; `by` is the
/// token's name (the `Starbridge-Actor` header without `--auth`). While the job is paused, the
/// decision is recorded and takes effect at resume.
#[utoipa::path(
    post,
    path = paths::JOB_TASK_APPROVE,
    operation_id = "approveTask",
    tag = "jobs",
    params(
        JobPath,
        ("task" = String, Path, description = "A task id (`tsk_…`) of the job."),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(
        content = Option<api::DecisionRequest>,
        description = "Optional: an empty (or blank) body means `{}`.",
    ),
    responses(
        (status = 200, description = "The job after the decision.", body = api::JobView),
        (status = 422, response = Unprocessable),
        DecisionRefused, Guarded, Body, Failures,
    ),
)]
async fn approve(
    state: State<AppState>,
    path: Path<(String, String)>,
    query: Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    decide(state, path, query, headers, bytes, true).await
}

/// Reject a step
///
/// The approval step fails for good (kind `rejected`) and the job winds down and compensates as
/// after any failure. While the job is paused, the decision is recorded and takes effect at
/// resume.
#[utoipa::path(
    post,
    path = paths::JOB_TASK_REJECT,
    operation_id = "rejectTask",
    tag = "jobs",
    params(
        JobPath,
        ("task" = String, Path, description = "A task id (`tsk_…`) of the job."),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(
        content = Option<api::DecisionRequest>,
        description = "Optional: an empty (or blank) body means `{}`.",
    ),
    responses(
        (status = 200, description = "The job after the decision.", body = api::JobView),
        (status = 422, response = Unprocessable),
        DecisionRefused, Guarded, Body, Failures,
    ),
)]
async fn reject(
    state: State<AppState>,
    path: Path<(String, String)>,
    query: Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    decide(state, path, query, headers, bytes, false).await
}

/// Approves or rejects; a task that is not waiting for approval, or one already decided,
/// answers 409.
async fn decide(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
    approve: bool,
) -> ApiResult<Json<api::JobView>> {
    let request: api::DecisionRequest = optional_body(&bytes)?;
    if request
        .comment
        .as_ref()
        .is_some_and(|comment| comment.len() > MAX_COMMENT_BYTES)
    {
        return Err(ApiError::invalid(
            "comment",
            format!("at most {MAX_COMMENT_BYTES} bytes"),
        ));
    }
    let namespace = namespace(&query)?;
    let (job, task) = (job_id(&id)?, task_id(&task)?);
    let decision = Decision {
        approve,
        by: actor(&headers)?,
        comment: request.comment,
    };
    let state_after = state
        .engine
        .decide(&namespace, &job, &task, decision)
        .await?;
    Ok(Json(job_view(&state, &state_after).await?))
}
