//! Operator actions on a job: pause, resume, cancel, retry, skip a task, rerun from a step. Each
//! is recorded in the job's history with who asked (the token's name with `--auth`; without it,
//! the `Starbridge-Actor` header, else `anonymous`) and why (`reason`); one that does not apply to
//! the job's current state answers 409 with the reason.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::post;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::model::{BulkAction, OperatorAction, OperatorCommand};
use std::future::Future;
use std::pin::Pin;

use crate::auth::actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{
    body, job_id, known, namespace, optional_body, parse_status, parse_time, task_id,
};
use crate::jobs::job_view;
use crate::limits::Limit;
use crate::state::AppState;
use starbridge_engine::{Error as StoreError, JobFilter};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::JOB_PAUSE, post(reasoned(OperatorAction::Pause)))
        .route(paths::JOB_RESUME, post(reasoned(OperatorAction::Resume)))
        .route(paths::JOB_CANCEL, post(cancel))
        .route(paths::JOB_RETRY, post(reasoned(OperatorAction::Retry)))
        .route(paths::JOB_RERUN, post(rerun))
        .route(paths::JOB_TASK_SKIP, post(skip))
        .route(paths::JOBS_BULK, post(bulk))
}

/// Most jobs one bulk action may touch.
const MAX_BULK: u32 = 10_000;
/// Refusals listed in a bulk answer.
const MAX_REFUSALS_LISTED: usize = 100;

/// Applies pause, resume, cancel or retry to every job the filter selects, one transaction per
/// job; jobs the action does not apply to are counted and listed with the reason.
async fn bulk(
    State(state): State<AppState>,
    Path(action): Path<api::Open<BulkAction>>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::BulkResult>> {
    let namespace = namespace(&query)?;
    let request: api::BulkRequest = body(&bytes)?;
    check_reason(&request.reason)?;
    let action = match known("action", &action, |text| {
        format!("'{text}' is not a bulk action: use pause, resume, cancel or retry")
    })? {
        BulkAction::Pause => OperatorAction::Pause,
        BulkAction::Resume => OperatorAction::Resume,
        BulkAction::Retry => OperatorAction::Retry,
        BulkAction::Cancel => OperatorAction::Cancel {
            compensate: request.compensate,
        },
    };
    let limit = request.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_BULK {
        return Err(ApiError::invalid(
            "limit",
            format!("must be between 1 and {MAX_BULK}"),
        ));
    }
    let filter = JobFilter {
        namespace: namespace.clone(),
        status: request
            .status
            .as_ref()
            .map(|status| parse_status("status", status))
            .transpose()?,
        workflow: request.workflow.clone(),
        created_after: request
            .created_after
            .as_deref()
            .map(|text| parse_time("created_after", text))
            .transpose()?,
        created_before: request
            .created_before
            .as_deref()
            .map(|text| parse_time("created_before", text))
            .transpose()?,
        before: None,
        limit,
    };
    let actor = actor(&headers)?;
    let jobs = state.engine.jobs(filter).await?;
    let mut result = api::BulkResult {
        matched: jobs.len() as u64,
        affected: 0,
        refused: Vec::new(),
    };
    for job in jobs {
        let command = OperatorCommand {
            actor: actor.clone(),
            reason: request.reason.clone(),
            action: action.clone(),
        };
        match state.engine.operate(&namespace, &job.id, command).await {
            Ok(_) => result.affected += 1,
            Err(StoreError::Conflict(reason) | StoreError::NotFound(reason)) => {
                if result.refused.len() < MAX_REFUSALS_LISTED {
                    result.refused.push(api::BulkRefusal {
                        id: job.id.to_string(),
                        reason,
                    });
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(Json(result))
}

/// An empty body means every field takes its default.
fn check_reason(reason: &Option<String>) -> ApiResult<()> {
    match reason {
        Some(text) if text.len() > 1024 => Err(ApiError::invalid("reason", "at most 1024 bytes")),
        _ => Ok(()),
    }
}

async fn act(
    state: &AppState,
    query: &api::NamespaceQuery,
    headers: &HeaderMap,
    id: &str,
    reason: Option<String>,
    action: OperatorAction,
) -> ApiResult<Json<api::JobView>> {
    check_reason(&reason)?;
    let namespace = namespace(query)?;
    let id = job_id(id)?;
    let command = OperatorCommand {
        actor: actor(headers)?,
        reason,
        action,
    };
    let job = state.engine.operate(&namespace, &id, command).await?;
    Ok(Json(job_view(state, &job).await?))
}

type ActionFuture = Pin<Box<dyn Future<Output = ApiResult<Json<api::JobView>>> + Send>>;

/// The handler of an action whose body is only an optional `reason` (pause, resume, retry).
fn reasoned(
    action: OperatorAction,
) -> impl Fn(State<AppState>, Path<String>, Query<api::NamespaceQuery>, HeaderMap, Bytes) -> ActionFuture
+ Clone
+ Send
+ Sync
+ 'static {
    move |State(state), Path(id), Query(query), headers, bytes| {
        let action = action.clone();
        Box::pin(async move {
            let request: api::ActionRequest = optional_body(&bytes)?;
            act(&state, &query, &headers, &id, request.reason, action).await
        })
    }
}

async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::CancelRequest = optional_body(&bytes)?;
    let action = OperatorAction::Cancel {
        compensate: request.compensate,
    };
    act(&state, &query, &headers, &id, request.reason, action).await
}

async fn rerun(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::RerunRequest = body(&bytes)?;
    if request.step.is_empty() {
        return Err(ApiError::invalid("step", "name the step to run again"));
    }
    let action = OperatorAction::Rerun { step: request.step };
    act(&state, &query, &headers, &id, request.reason, action).await
}

async fn skip(
    State(state): State<AppState>,
    Path((id, task)): Path<(String, String)>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::SkipRequest = optional_body(&bytes)?;
    state.limits.json(Limit::Task, "output", &request.output)?;
    let action = OperatorAction::Skip {
        task: task_id(&task)?,
        output: request.output,
    };
    act(&state, &query, &headers, &id, request.reason, action).await
}
