//! Cron schedules: create or replace, list with their next fire times, pause, resume, delete.

use crate::answer::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::schedule::{CatchUp, CatchUpKind, CronSpec, Overlap};
use starbridge_engine::{ScheduleSpec, StoredSchedule};

use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known, namespace};
use crate::limits::Limit;
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, OtherNamespace, PROBLEM, SchedulePath,
    Unprocessable, problem_answers,
};
use crate::state::AppState;

/// How many upcoming fire times a schedule view lists.
const UPCOMING: usize = 5;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::SCHEDULES, get(list))
        .route(paths::SCHEDULE, get(show).put(put).delete(delete))
        .route(paths::SCHEDULE_PAUSE, post(pause))
        .route(paths::SCHEDULE_RESUME, post(resume))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, show, put, delete, pause, resume))]
pub(crate) struct Api;

problem_answers! {
    /// The schedule an operation names is not there.
    NoSuchSchedule {
        "404": "No such schedule in this namespace (a malformed name is not found either). With \
               `--auth`, anything of a namespace other than the one the token is bound to is not \
               found either.",
    }
}

fn time(ts: starbridge_core::time::Timestamp) -> api::Timestamp {
    api::timestamp_from_millis(ts.0)
}

pub(crate) fn view(schedule: &StoredSchedule) -> api::ScheduleView {
    let next_fires = match (
        schedule.paused,
        schedule.next_fire_at,
        CronSpec::parse(&schedule.cron),
        starbridge_engine::time_zone(&schedule.timezone),
    ) {
        (false, Some(first), Ok(cron), Ok(tz)) => {
            let mut fires = vec![first];
            fires.extend(cron.upcoming(&tz, first, UPCOMING - 1));
            fires.into_iter().map(time).collect()
        }
        _ => Vec::new(),
    };
    api::ScheduleView {
        namespace: schedule.namespace.clone(),
        name: schedule.name.clone(),
        workflow: schedule.workflow.clone(),
        params: schedule.params.clone(),
        cron: schedule.cron.clone(),
        timezone: schedule.timezone.clone(),
        overlap: schedule.overlap.into(),
        catch_up: api::CatchUpPolicy {
            policy: schedule.catch_up.kind().into(),
            limit: schedule.catch_up.limit(),
        },
        paused: schedule.paused,
        next_fires,
        pending_fire_at: schedule.pending_fire_at.map(time),
        last_fire_at: schedule.last_fire_at.map(time),
        last_job_id: schedule.last_job_id.as_ref().map(ToString::to_string),
        last_error: schedule.last_error.clone(),
        created_at: time(schedule.created_at),
        updated_at: time(schedule.updated_at),
        labels: schedule.labels.clone(),
    }
}

/// List schedules
///
/// Every schedule of the namespace, by name, with its next fire times and what its last fire did.
#[utoipa::path(
    get,
    path = paths::SCHEDULES,
    operation_id = "listSchedules",
    tag = "schedules",
    params(api::NamespaceQuery),
    responses(
        (status = 200, description = "The schedules.", body = api::ScheduleList),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn list(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::ScheduleList>> {
    let namespace = namespace(&query)?;
    let schedules = state.engine.schedules(&namespace).await?;
    Ok(Json(api::ScheduleList {
        items: schedules.iter().map(view).collect(),
    }))
}

/// Get a schedule
///
/// The schedule with its next fire times and what its last fire did. The name is not validated: a
/// malformed name is not found.
#[utoipa::path(
    get,
    path = paths::SCHEDULE,
    operation_id = "getSchedule",
    tag = "schedules",
    params(SchedulePath, api::NamespaceQuery),
    responses(
        (status = 200, description = "The schedule.", body = api::ScheduleView),
        (status = 400, response = BadRequest),
        (status = 422, response = Unprocessable),
        NoSuchSchedule, Guarded, Failures,
    ),
)]
async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::ScheduleView>> {
    let namespace = namespace(&query)?;
    let schedule = state
        .engine
        .schedule(&namespace, &name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("schedule {name} not found")))?;
    Ok(Json(view(&schedule)))
}

fn catch_up(policy: Option<&api::CatchUpPolicy>) -> ApiResult<CatchUp> {
    let Some(policy) = policy else {
        return Ok(CatchUp::Skip);
    };
    let kind = known("catch_up.policy", &policy.policy, |text| {
        format!("unknown policy '{text}': use skip, once or all")
    })?;
    match (kind, policy.limit) {
        (CatchUpKind::Skip, None) => Ok(CatchUp::Skip),
        (CatchUpKind::Once, None) => Ok(CatchUp::Once),
        (CatchUpKind::All, limit) => Ok(CatchUp::All {
            limit: limit.unwrap_or(10),
        }),
        (CatchUpKind::Skip | CatchUpKind::Once, Some(_)) => Err(ApiError::invalid(
            "catch_up.limit",
            "only the `all` policy takes a limit",
        )),
    }
}

/// Create or replace a schedule
///
/// Creates the schedule, or replaces every setting of the schedule of that name: a field left out
/// takes its default, so replacing a paused schedule without `paused: true` resumes it. The next
/// fire is computed from now; a held fire and the last error are dropped, while `last_fire_at`,
/// `last_job_id` and `created_at` are kept. Each fire submits a job of the latest version of
/// `workflow` with `params` and the key `schedule:{name}:{fire time in Unix milliseconds}`, so a
/// fire never starts two jobs. The params are checked against the workflow's `params` schema only
/// then: a fire that cannot start its job records why in `last_error`.
#[utoipa::path(
    put,
    path = paths::SCHEDULE,
    operation_id = "putSchedule",
    tag = "schedules",
    params(SchedulePath, api::NamespaceQuery, ActorHeader),
    request_body(content = api::ScheduleRequest),
    responses(
        (
            status = 200,
            description = "A schedule of that name existed and was replaced.",
            body = api::ScheduleView,
        ),
        (status = 201, description = "The schedule was created.", body = api::ScheduleView),
        (
            status = 400,
            description = "The body is not a ScheduleRequest object (empty, malformed JSON, an \
                           unknown field, a missing `workflow` or `cron`, a wrong type, a \
                           `catch_up.limit` out of range; the field is `body`), an unknown \
                           `overlap` or `catch_up.policy`, a `catch_up.limit` with a policy other \
                           than `all` (the field is `catch_up.limit`), or a malformed namespace or \
                           `Starbridge-Actor` header.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (
            status = 422,
            description = "A malformed schedule name (`name`), a `cron` that is not a cron \
                           expression, an unknown `timezone`, a `workflow` not applied in this \
                           namespace, `params` that are not an object, a `catch_up.limit` of 0 \
                           (`catch_up.limit`), a label that breaks the rules of labels \
                           (`labels.<key>`) or more labels than `--max-labels` (`labels`). The \
                           first field at fault is named; nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
async fn put(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
    bytes: Bytes,
) -> ApiResult<(StatusCode, Json<api::ScheduleView>)> {
    let namespace = namespace(&query)?;
    state.limits.text(Limit::Name, "name", &name)?;
    let request: api::ScheduleRequest = body(&bytes)?;
    state
        .limits
        .text(Limit::Name, "workflow", &request.workflow)?;
    if let Some(params) = &request.params {
        state.limits.json(Limit::Params, "params", params)?;
    }
    state.limits.labels("labels", request.labels.len())?;
    let overlap = match &request.overlap {
        None => Overlap::Skip,
        Some(overlap) => known("overlap", overlap, |text| {
            format!("unknown policy '{text}': use skip, allow or queue_one")
        })?,
    };
    let existed = state.engine.schedule(&namespace, &name).await?.is_some();
    let spec = ScheduleSpec {
        workflow: request.workflow,
        params: request
            .params
            .unwrap_or_else(|| serde_json::Value::Object(Default::default())),
        cron: request.cron,
        timezone: request.timezone.unwrap_or_else(|| "UTC".to_owned()),
        overlap,
        catch_up: catch_up(request.catch_up.as_ref())?,
        paused: request.paused,
        labels: request.labels,
    };
    let schedule = state.engine.put_schedule(&namespace, &name, spec).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(view(&schedule))))
}

async fn set_paused(
    state: &AppState,
    query: &api::NamespaceQuery,
    name: &str,
    paused: bool,
) -> ApiResult<Json<api::ScheduleView>> {
    let namespace = namespace(query)?;
    let schedule = state
        .engine
        .pause_schedule(&namespace, name, paused)
        .await?;
    Ok(Json(view(&schedule)))
}

/// Pause a schedule
///
/// The schedule fires no more until resumed; the jobs it started are not affected, and a held fire
/// (`pending_fire_at`) is kept for the resume. Pausing a paused schedule is not an error (only
/// `updated_at` changes). Takes no body (one sent is ignored).
#[utoipa::path(
    post,
    path = paths::SCHEDULE_PAUSE,
    operation_id = "pauseSchedule",
    tag = "schedules",
    params(SchedulePath, api::NamespaceQuery, ActorHeader),
    responses(
        (
            status = 200,
            description = "The schedule, paused (`next_fires` is empty).",
            body = api::ScheduleView,
        ),
        (status = 400, response = BadRequest),
        (status = 422, response = Unprocessable),
        NoSuchSchedule, Guarded, Body, Failures,
    ),
)]
async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::ScheduleView>> {
    set_paused(&state, &query, &name, true).await
}

/// Resume a schedule
///
/// A paused schedule fires next at its next occurrence from now: fires missed while it was paused
/// are not caught up, whatever its `catch_up` policy; a fire held before the pause starts when the
/// previous job has ended. Resuming a schedule that is not paused is not an error (only
/// `updated_at` changes). Takes no body (one sent is ignored).
#[utoipa::path(
    post,
    path = paths::SCHEDULE_RESUME,
    operation_id = "resumeSchedule",
    tag = "schedules",
    params(SchedulePath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 200, description = "The schedule, resumed.", body = api::ScheduleView),
        (status = 400, response = BadRequest),
        (
            status = 422,
            description = "The schedule's `timezone` is no longer known to the server's time zone \
                           database (the field is `timezone`); nothing changed. Put the schedule \
                           again with another zone.",
            body = api::Problem, content_type = PROBLEM,
        ),
        NoSuchSchedule, Guarded, Body, Failures,
    ),
)]
async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::ScheduleView>> {
    set_paused(&state, &query, &name, false).await
}

/// Delete a schedule
///
/// The schedule fires no more, and a held fire is dropped; the jobs it started are not affected.
/// Takes no body (one sent is ignored).
#[utoipa::path(
    delete,
    path = paths::SCHEDULE,
    operation_id = "deleteSchedule",
    tag = "schedules",
    params(SchedulePath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 204, description = "The schedule was deleted; the answer has no body."),
        (status = 400, response = BadRequest),
        (status = 422, response = Unprocessable),
        NoSuchSchedule, Guarded, Body, Failures,
    ),
)]
async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.engine.delete_schedule(&namespace, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
