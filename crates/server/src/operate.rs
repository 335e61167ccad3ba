//! Operator actions on a job: pause, resume, cancel, retry, skip, requeue or fail a task, rerun
//! from a step; and the bulk form of pause, resume, cancel, retry, skip (a step's task), rerun
//! and delete (`jobs::delete_job` on one job). Each action is recorded in the job's history with who asked (the token's name
//! with `--auth`; without it, the `Starbridge-Actor` header, else `anonymous`) and why
//! (`reason`); one that does not apply to the job's current state answers 409 with the reason.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::post;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::ids::JobId;
use starbridge_core::model::{BulkAction, OperatorAction, OperatorCommand};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::auth::actor;
use crate::error::{ApiError, ApiResult};
use crate::extract::{
    body, job_id, known, label_pairs, namespace, optional_body, parse_status, parse_time, task_id,
};
use crate::jobs::job_view;
use crate::limits::Limit;
use crate::openapi::{
    ActorHeader, Body, Failures, Guarded, JobPath, OtherNamespace, PROBLEM, Unprocessable,
    problem_answers,
};
use crate::state::AppState;
use starbridge_engine::{Error as StoreError, JobFilter};
use utoipa::IntoResponses;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::{ContentBuilder, Ref, RefOr};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::JOB_PAUSE, post(pause()))
        .route(paths::JOB_RESUME, post(resume()))
        .route(paths::JOB_CANCEL, post(cancel))
        .route(paths::JOB_RETRY, post(retry()))
        .route(paths::JOB_RERUN, post(rerun))
        .route(paths::JOB_TASK_SKIP, post(skip))
        .route(paths::JOB_TASK_REQUEUE, post(requeue))
        .route(paths::JOB_TASK_FAIL, post(fail))
        .route(paths::JOBS_BULK, post(bulk))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(pause, resume, cancel, retry, rerun, skip, requeue, fail, bulk))]
pub(crate) struct Api;

/// The body of pause, resume and retry.
const OPTIONAL_BODY: &str = "Optional: an empty (or blank) body means `{}`.";

/// Why each action on one job may not apply (its 409).
const PAUSE_CONFLICT: &str = "The action does not apply to the job's current state; `detail` says why. Only a running job \
    can be paused.";
const RESUME_CONFLICT: &str = "The action does not apply to the job's current state; `detail` says why. Only a paused job \
    can be resumed.";
const RETRY_CONFLICT: &str = "The action does not apply to the job's current state; `detail` says why. For example the job \
    did not end unsuccessfully, or a task is still running.";
const CANCEL_CONFLICT: &str = "The action does not apply to the job's current state; `detail` says why. Only a queued, \
    running or paused job can be cancelled.";
const RERUN_CONFLICT: &str = "The action does not apply to the job's current state; `detail` says why. Also when the \
    workflow has no such `step`.";

/// What an action on one job answers but its 409, which says what the action needs: the job
/// after it, and the refusals the actions share.
struct ActionAnswers;

impl IntoResponses for ActionAnswers {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let after = ResponseBuilder::new()
            .description("The job after the action.")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("JobView")))
                    .build(),
            );
        let mut answers = BTreeMap::from([
            ("200".to_owned(), after.build().into()),
            (
                "422".to_owned(),
                Ref::from_response_name("Unprocessable").into(),
            ),
        ]);
        for mut shared in [
            JobActionRefused::responses(),
            NoSuchJob::responses(),
            Guarded::responses(),
            Body::responses(),
            Failures::responses(),
        ] {
            answers.append(&mut shared);
        }
        answers
    }
}

problem_answers! {
    /// How an action on a job is refused before it is tried.
    JobActionRefused {
        "400": "A malformed body, `reason` over 1024 bytes, a malformed namespace or \
               `Starbridge-Actor` header.",
    }
    /// The job an action names is not there.
    NoSuchJob {
        "404": "No such job in this namespace. With `--auth`, anything of a namespace other than the \
               one the token is bound to is not found either.",
    }
}

/// Most jobs one bulk action may touch.
pub(crate) const MAX_BULK: u32 = 10_000;
/// Refusals listed in a bulk answer.
const MAX_REFUSALS_LISTED: usize = 100;

// Applies an action to every job the filter selects, one transaction per job; jobs the action
// does not apply to are counted and listed with the reason.
/// Pause, resume, cancel, retry, skip, rerun or delete the jobs a filter selects
///
/// Selects the jobs of the namespace that match every field given (newest first, at most `limit`),
/// then applies the action to each as if it were asked for that job alone: one transaction per job,
/// recorded in its history with the actor and `reason` (`skip` skips the task of `step` with
/// `output`, as `POST /api/v1/jobs/{id}/tasks/{task}/skip` does; `rerun` runs `step` again with
/// everything downstream of it, as `POST /api/v1/jobs/{id}/rerun` does; `delete` removes finished
/// jobs with their history, as `DELETE /api/v1/jobs/{id}` does; the audit log keeps the `reason`).
/// A job the action does not apply to (pausing a paused job, retrying a running one, skipping a
/// running task, rerunning a step its workflow does not have, deleting an unfinished job, …) is not
/// an error: it is counted in `matched` but not in `affected`, and listed in `refused` with the
/// reason. `{}` selects every job of the namespace, whatever its status, up to `limit`. `matched`
/// never exceeds `limit`: when it equals it, more jobs may match. With `dry_run` the jobs are only
/// counted, without the fields the action needs (`step`), and the audit log records nothing.
#[utoipa::path(
    post,
    path = paths::JOBS_BULK,
    operation_id = "bulkJobAction",
    tag = "jobs",
    params(
        ("action" = BulkAction, Path, description = "The action: `pause`, `resume`, `cancel`, `retry`, `skip`, `rerun` or \
             `delete`. Any other is a 400 (the field is `action`)."),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(
        content = api::BulkRequest,
        description = "Required: an empty body is a 400; `{}` selects every job.",
    ),
    responses(
        (status = 200, description = "What the action did.", body = api::BulkResult),
        (
            status = 400,
            description = "An unknown action (`action`); the body is not a BulkRequest object \
                           (empty, malformed JSON, an unknown field, a wrong type; the field is \
                           `body`); an unknown `status`, a malformed `created_after` or \
                           `created_before`, a label of `labels` that breaks the rules of labels \
                           (`labels.<key>`), an empty `ids` or over 10000 of them, one that is \
                           not a job id (`ids[<index>]`), a `limit` of 0 or over 10000, a \
                           `reason` over 1024 bytes, `skip` or `rerun` without `step`; or a \
                           malformed namespace or `Starbridge-Actor` header. Nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        (
            status = 500,
            description = "An internal error; the details are logged, not sent. The jobs acted on \
                           before it stay changed (one transaction per job).",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 503,
            description = "The database is unavailable. The jobs acted on before it became so stay \
                           changed (one transaction per job); try again, and those are refused as \
                           already done.",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body,
    ),
)]
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
    let action = known("action", &action, |text| {
        format!(
            "'{text}' is not a bulk action: use pause, resume, cancel, retry, skip, rerun or delete"
        )
    })?;
    // A dry run only selects: it does not need the fields of the action (`step`, `output`).
    let action = if request.dry_run {
        None
    } else {
        Some(operator_action(&state, action, &request)?)
    };
    let ids = request.ids.as_deref().map(bulk_ids).transpose()?;
    let limit = request.limit.unwrap_or_else(|| {
        ids.as_ref()
            .map_or(1000, |ids| u32::try_from(ids.len()).unwrap_or(MAX_BULK))
    });
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
        parent: None,
        labels: label_pairs(&request.labels)?,
        ids,
        limit,
    };
    let actor = actor(&headers)?;
    let jobs = state.engine.jobs(filter).await?;
    let mut result = api::BulkResult {
        matched: jobs.len() as u64,
        affected: 0,
        refused: Vec::new(),
    };
    let Some(action) = action else {
        return Ok(Json(result));
    };
    for job in jobs {
        let done = match &action {
            Some(action) => {
                let command = OperatorCommand {
                    actor: actor.clone(),
                    reason: request.reason.clone(),
                    action: action.clone(),
                };
                let operated = state.engine.operate(&namespace, &job.id, command).await;
                operated.map(drop)
            }
            None => state.engine.delete_job(&namespace, &job.id).await,
        };
        match done {
            Ok(()) => result.affected += 1,
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

/// What a bulk action does to each job: an operator action, or `None` to delete the job. The
/// fields an action needs are checked here, before any job is selected.
fn operator_action(
    state: &AppState,
    action: BulkAction,
    request: &api::BulkRequest,
) -> ApiResult<Option<OperatorAction>> {
    let step = || match request.step.as_deref() {
        Some(step) if !step.is_empty() => Ok(step.to_owned()),
        _ => Err(ApiError::invalid(
            "step",
            format!("required with {action}: name the step"),
        )),
    };
    Ok(match action {
        BulkAction::Pause => Some(OperatorAction::Pause),
        BulkAction::Resume => Some(OperatorAction::Resume),
        BulkAction::Retry => Some(OperatorAction::Retry),
        BulkAction::Cancel => Some(OperatorAction::Cancel {
            compensate: request.compensate,
        }),
        BulkAction::Skip => {
            let step = step()?;
            state.limits.json(Limit::Task, "output", &request.output)?;
            Some(OperatorAction::SkipStep {
                step,
                output: request.output.clone(),
            })
        }
        BulkAction::Rerun => Some(OperatorAction::Rerun { step: step()? }),
        BulkAction::Delete => None,
    })
}

/// The job ids of a bulk request's `ids`: 1 to `MAX_BULK` of them, each a job id.
fn bulk_ids(ids: &[String]) -> ApiResult<Vec<JobId>> {
    if ids.is_empty() || ids.len() > MAX_BULK as usize {
        return Err(ApiError::invalid(
            "ids",
            format!(
                "list 1 to {MAX_BULK} job ids, or leave the field out to select by the other fields"
            ),
        ));
    }
    ids.iter()
        .enumerate()
        .map(|(index, text)| {
            JobId::parse(text).ok_or_else(|| {
                ApiError::invalid(
                    &format!("ids[{index}]"),
                    format!("'{text}' is not a job id: pass a job's `id` (`job_…`)"),
                )
            })
        })
        .collect()
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
trait Reasoned:
    Fn(State<AppState>, Path<String>, Query<api::NamespaceQuery>, HeaderMap, Bytes) -> ActionFuture
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<F> Reasoned for F where
    F: Fn(
            State<AppState>,
            Path<String>,
            Query<api::NamespaceQuery>,
            HeaderMap,
            Bytes,
        ) -> ActionFuture
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Pause a job
///
/// A running job dispatches nothing new; running tasks finish.
#[utoipa::path(
    post,
    path = paths::JOB_PAUSE,
    operation_id = "pauseJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, ActorHeader),
    request_body(content = Option<api::ActionRequest>, description = OPTIONAL_BODY),
    responses(
        (status = 409, description = PAUSE_CONFLICT, body = api::Problem, content_type = PROBLEM),
        ActionAnswers,
    ),
)]
fn pause() -> impl Reasoned {
    reasoned(OperatorAction::Pause)
}

/// Resume a paused job
#[utoipa::path(
    post,
    path = paths::JOB_RESUME,
    operation_id = "resumeJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, ActorHeader),
    request_body(content = Option<api::ActionRequest>, description = OPTIONAL_BODY),
    responses(
        (status = 409, description = RESUME_CONFLICT, body = api::Problem, content_type = PROBLEM),
        ActionAnswers,
    ),
)]
fn resume() -> impl Reasoned {
    reasoned(OperatorAction::Resume)
}

/// Retry a finished job
///
/// Continues a failed, compensation_failed, timed_out or cancelled job from its failed tasks with
/// fresh attempts, in a new round.
#[utoipa::path(
    post,
    path = paths::JOB_RETRY,
    operation_id = "retryJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, ActorHeader),
    request_body(content = Option<api::ActionRequest>, description = OPTIONAL_BODY),
    responses(
        (status = 409, description = RETRY_CONFLICT, body = api::Problem, content_type = PROBLEM),
        ActionAnswers,
    ),
)]
fn retry() -> impl Reasoned {
    reasoned(OperatorAction::Retry)
}

fn reasoned(action: OperatorAction) -> impl Reasoned {
    move |State(state), Path(id), Query(query), headers, bytes| {
        let action = action.clone();
        Box::pin(async move {
            let request: api::ActionRequest = optional_body(&bytes)?;
            act(&state, &query, &headers, &id, request.reason, action).await
        })
    }
}

/// Cancel a job
///
/// Stops a queued, running or paused job; with `compensate`, undoes its finished steps first.
#[utoipa::path(
    post,
    path = paths::JOB_CANCEL,
    operation_id = "cancelJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, ActorHeader),
    request_body(
        content = Option<api::CancelRequest>,
        description = "Optional: an empty (or blank) body means `{}`.",
    ),
    responses(
        (status = 409, description = CANCEL_CONFLICT, body = api::Problem, content_type = PROBLEM),
        ActionAnswers,
    ),
)]
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

/// Rerun from a step
///
/// Resets a step of a finished job and everything downstream of it, in a new round.
#[utoipa::path(
    post,
    path = paths::JOB_RERUN,
    operation_id = "rerunJob",
    tag = "jobs",
    params(JobPath, api::NamespaceQuery, ActorHeader),
    request_body(content = api::RerunRequest),
    responses(
        (status = 409, description = RERUN_CONFLICT, body = api::Problem, content_type = PROBLEM),
        ActionAnswers,
    ),
)]
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

/// Skip a task
///
/// Marks a waiting or ready task (of a running or paused job), or a failed or cancelled task (of a
/// finished job, which then continues in a new round), succeeded with `output`.
#[utoipa::path(
    post,
    path = paths::JOB_TASK_SKIP,
    operation_id = "skipTask",
    tag = "jobs",
    params(
        JobPath,
        ("task" = String, Path, description = "A task id (`tsk_…`) of the job."),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(
        content = Option<api::SkipRequest>,
        description = "Optional: an empty (or blank) body means `{}`.",
    ),
    responses(
        (status = 200, description = "The job after the action.", body = api::JobView),
        (
            status = 404,
            description = "No such job in this namespace. Or no such task in the job. With \
                           `--auth`, anything of a namespace other than the one the token is bound \
                           to is not found either.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (
            status = 409,
            description = "The action does not apply to the job's current state; `detail` says why. \
                           For example the task is running or is a compensation.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 422, response = Unprocessable),
        JobActionRefused, Guarded, Body, Failures,
    ),
)]
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

/// The answers of an action on one task of a job but its 409: the job after it, and the refusals
/// the task actions share.
struct TaskActionAnswers;

impl IntoResponses for TaskActionAnswers {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut answers = ActionAnswers::responses();
        answers.insert(
            "404".to_owned(),
            ResponseBuilder::new()
                .description(
                    "No such job in this namespace, or no such task in the job. With `--auth`, \
                     anything of a namespace other than the one the token is bound to is not found \
                     either.",
                )
                .content(
                    PROBLEM,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build()
                .into(),
        );
        answers
    }
}

/// Checks a required text field of a task action: present and at most 1024 bytes.
fn required_text(field: &str, text: &str) -> ApiResult<()> {
    if text.trim().is_empty() {
        return Err(ApiError::invalid(field, "required: say why, in words"));
    }
    if text.len() > 1024 {
        return Err(ApiError::invalid(field, "at most 1024 bytes"));
    }
    Ok(())
}

/// Requeue a running task
///
/// Revokes the lease of a task a worker runs and puts it back to `ready` for a new attempt that
/// does not count against `max_attempts`. The worker is told by the answer to its next heartbeat
/// or report: 409 with `reason`, so it stops. So that two copies never run at once, the task is
/// claimable only once that answer was given or the revoked lease would have lapsed, whichever
/// comes first. A task awaiting its callback holds no lease: it is claimable at once, and its
/// callback token answers 410. A task waiting on the server otherwise (a sleep, signal, approval
/// or child job) holds no worker and is refused: fail or skip it.
#[utoipa::path(
    post,
    path = paths::JOB_TASK_REQUEUE,
    operation_id = "requeueTask",
    tag = "jobs",
    params(
        JobPath,
        ("task" = String, Path, description = "A task id (`tsk_…`) of the job."),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(content = api::RequeueRequest, description = "Required: `reason` names why."),
    responses(
        (
            status = 409,
            description = "The action does not apply to the task's current state; `detail` says \
                           why. For example the task is not running, waits on the server, or the \
                           job winds down.",
            body = api::Problem, content_type = PROBLEM,
        ),
        TaskActionAnswers,
    ),
)]
async fn requeue(
    State(state): State<AppState>,
    Path(ids): Path<(String, String)>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::RequeueRequest = body(&bytes)?;
    required_text("reason", &request.reason)?;
    let reason = Some(request.reason);
    act_on_task(&state, &query, &headers, ids, reason, |task| {
        OperatorAction::Requeue { task }
    })
    .await
}

/// Acts on task `task` of job `id` (the route's two ids) with the action `action` makes of it.
async fn act_on_task(
    state: &AppState,
    query: &api::NamespaceQuery,
    headers: &HeaderMap,
    (id, task): (String, String),
    reason: Option<String>,
    action: impl FnOnce(starbridge_core::ids::TaskId) -> OperatorAction,
) -> ApiResult<Json<api::JobView>> {
    let action = action(task_id(&task)?);
    act(state, query, headers, &id, reason, action).await
}

/// Fail a task by hand
///
/// Fails a waiting, ready or running task for good with `error` (error kind `operator`), with no
/// retry whatever attempts are left; the job goes on as after any failure of the step (it
/// compensates, unless the step has `continue_on_failure`). A running worker's next heartbeat or
/// report is answered 409; a sub-workflow step's child is cancelled and compensates; a task's
/// callback token is answered 410 from then on.
#[utoipa::path(
    post,
    path = paths::JOB_TASK_FAIL,
    operation_id = "failJobTask",
    tag = "jobs",
    params(
        JobPath,
        ("task" = String, Path, description = "A task id (`tsk_…`) of the job."),
        api::NamespaceQuery,
        ActorHeader,
    ),
    request_body(content = api::FailTaskRequest, description = "Required: `error` is the task's error message."),
    responses(
        (
            status = 409,
            description = "The action does not apply to the task's current state; `detail` says \
                           why. For example the task already ended, is a fan-out's parent, or the \
                           job ended.",
            body = api::Problem, content_type = PROBLEM,
        ),
        TaskActionAnswers,
    ),
)]
async fn fail(
    State(state): State<AppState>,
    Path(ids): Path<(String, String)>,
    Query(query): Query<api::NamespaceQuery>,
    headers: HeaderMap,
    bytes: Bytes,
) -> ApiResult<Json<api::JobView>> {
    let request: api::FailTaskRequest = body(&bytes)?;
    required_text("error", &request.error)?;
    let message = request.error;
    act_on_task(&state, &query, &headers, ids, request.reason, |task| {
        OperatorAction::FailTask { task, message }
    })
    .await
}
