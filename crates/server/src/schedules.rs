//! Cron schedules: create or replace, list with their next fire times, pause, resume, delete.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::schedule::{CatchUp, CatchUpKind, CronSpec, Overlap};
use starbridge_engine::{ScheduleSpec, StoredSchedule};

use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known, namespace};
use crate::limits::Limit;
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
    }
}

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

async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::ScheduleView>> {
    set_paused(&state, &query, &name, true).await
}

async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::ScheduleView>> {
    set_paused(&state, &query, &name, false).await
}

async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.engine.delete_schedule(&namespace, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
