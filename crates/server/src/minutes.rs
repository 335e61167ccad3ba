//! The dashboard's figures (`GET /api/v1/stats/minutes`): per workflow and per queue, started,
//! succeeded and failed a minute at a time over the last hour or day, with percentiles of the
//! durations and the queues' sampled depth and oldest wait. Read from the per-minute rows the
//! rollup loop keeps (store `minutes`), so a request reads at most a day of minutes, whatever
//! the number of jobs. The UI's dashboard page renders the same answer.

use std::collections::BTreeMap;

use crate::answer::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use starbridge_api as api;
use starbridge_api::paths;
use starbridge_core::histogram::Histogram;
use starbridge_core::time::{Duration, Timestamp};
use starbridge_engine::{MinuteFigures, MinuteRow, SeriesKind, minute_of};

use crate::error::{ApiError, ApiResult};
use crate::openapi::{BadRequest, Failures, Guarded, OtherNamespace, Unprocessable};
use crate::state::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route(paths::STATS_MINUTES, get(show))
}

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(show))]
pub(crate) struct Api;

/// Longest `workflow` or `queue` filter: a name's length.
const MAX_NAME_BYTES: usize = 128;

/// How far back the figures go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Window {
    Hour,
    Day,
}

impl Window {
    pub(crate) fn parse(text: Option<&str>) -> ApiResult<Window> {
        match text.unwrap_or("1h") {
            "1h" => Ok(Window::Hour),
            "1d" => Ok(Window::Day),
            _ => Err(ApiError::invalid("window", "must be 1h or 1d")),
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "1d",
        }
    }

    /// How many minutes it spans, the current one included.
    pub(crate) fn minutes(self) -> u64 {
        match self {
            Window::Hour => 60,
            Window::Day => 24 * 60,
        }
    }
}

/// Which series to answer: all when neither is given.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeriesFilter {
    pub(crate) workflow: Option<String>,
    pub(crate) queue: Option<String>,
}

impl SeriesFilter {
    fn keeps(&self, kind: SeriesKind, name: &str) -> bool {
        if self.workflow.is_none() && self.queue.is_none() {
            return true;
        }
        let wanted = match kind {
            SeriesKind::Workflow => &self.workflow,
            SeriesKind::Queue => &self.queue,
        };
        wanted.as_deref() == Some(name)
    }
}

/// Reads a namespace's figures over `window`, ending with the current minute.
pub(crate) async fn figures(
    state: &AppState,
    namespace: &str,
    window: Window,
    filter: &SeriesFilter,
) -> ApiResult<api::MinuteStats> {
    let to = minute_of(state.engine.now());
    let span = Duration::from_secs((window.minutes() - 1) * 60);
    let from = Timestamp(to.0 - i64::try_from(span.as_millis()).unwrap_or(0));
    let rows = state.engine.minutes(namespace, from).await?;
    let mut series: BTreeMap<(SeriesKind, String), Vec<MinuteRow>> = BTreeMap::new();
    for row in rows
        .into_iter()
        .filter(|row| filter.keeps(row.kind, &row.name))
    {
        series
            .entry((row.kind, row.name.clone()))
            .or_default()
            .push(row);
    }
    let mut answer = api::MinuteStats {
        window: window.as_str().to_owned(),
        from: api::timestamp_from_millis(from.0),
        to: api::timestamp_from_millis(to.0),
        workflows: Vec::new(),
        queues: Vec::new(),
    };
    for ((kind, name), rows) in series {
        let view = series_view(name, from, &rows);
        match kind {
            SeriesKind::Workflow => answer.workflows.push(view),
            SeriesKind::Queue => answer.queues.push(view),
        }
    }
    Ok(answer)
}

fn series_view(name: String, from: Timestamp, rows: &[MinuteRow]) -> api::SeriesView {
    let mut totals = MinuteFigures::default();
    for row in rows {
        let figures = &row.figures;
        totals.started += figures.started;
        totals.succeeded += figures.succeeded;
        totals.failed += figures.failed;
        totals.depth = totals.depth.max(figures.depth);
        totals.oldest_wait = totals.oldest_wait.max(figures.oldest_wait);
        totals.durations.merge(&figures.durations);
    }
    api::SeriesView {
        name,
        totals: minute_view(from, &totals),
        minutes: rows
            .iter()
            .map(|row| minute_view(row.minute, &row.figures))
            .collect(),
    }
}

fn minute_view(minute: Timestamp, figures: &MinuteFigures) -> api::MinuteView {
    let durations: &Histogram = &figures.durations;
    api::MinuteView {
        minute: api::timestamp_from_millis(minute.0),
        started: figures.started,
        succeeded: figures.succeeded,
        failed: figures.failed,
        p50_ms: durations.percentile(0.5),
        p95_ms: durations.percentile(0.95),
        depth: figures.depth,
        oldest_wait_ms: figures.oldest_wait.map(Duration::as_millis),
    }
}

/// Checks a query's window and filters.
pub(crate) fn parse_query(query: &api::MinuteStatsQuery) -> ApiResult<(Window, SeriesFilter)> {
    let window = Window::parse(query.window.as_deref())?;
    for (field, text) in [("workflow", &query.workflow), ("queue", &query.queue)] {
        if text
            .as_ref()
            .is_some_and(|text| text.len() > MAX_NAME_BYTES)
        {
            return Err(ApiError::invalid(
                field,
                format!("at most {MAX_NAME_BYTES} bytes, as long as a name"),
            ));
        }
    }
    Ok((
        window,
        SeriesFilter {
            workflow: query.workflow.clone(),
            queue: query.queue.clone(),
        },
    ))
}

/// Dashboard figures
///
/// Per workflow (its jobs) and per queue (its tasks), a minute at a time over the last hour or
/// day: how many started, succeeded and failed, the p50 and p95 of the durations of those that
/// ended, and for queues the ready tasks and the oldest claimable wait sampled each minute;
/// with each series' totals over the window. The figures come from per-minute rows that a
/// background rollup fills from the history every few seconds, so the last few seconds are not
/// counted yet, and reading them costs the same at a thousand jobs as at a million.
#[utoipa::path(
    get,
    path = paths::STATS_MINUTES,
    operation_id = "getMinuteStats",
    tag = "system",
    params(api::NamespaceQuery, api::MinuteStatsQuery),
    responses(
        (status = 200, description = "The figures of the window.", body = api::MinuteStats),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
async fn show(
    State(state): State<AppState>,
    Query(query): Query<api::MinuteStatsQuery>,
) -> ApiResult<Json<api::MinuteStats>> {
    let namespace = crate::extract::namespace_name(query.namespace.as_deref())?;
    let (window, filter) = parse_query(&query)?;
    Ok(Json(figures(&state, &namespace, window, &filter).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_keeps_the_series_it_names_and_all_without_names() {
        let all = SeriesFilter::default();
        assert!(all.keeps(SeriesKind::Workflow, "a") && all.keeps(SeriesKind::Queue, "q"));
        let workflow = SeriesFilter {
            workflow: Some("a".into()),
            queue: None,
        };
        assert!(workflow.keeps(SeriesKind::Workflow, "a"));
        assert!(!workflow.keeps(SeriesKind::Workflow, "b"));
        assert!(!workflow.keeps(SeriesKind::Queue, "a"));
    }

    #[test]
    fn a_window_is_an_hour_or_a_day() {
        assert_eq!(Window::parse(None).unwrap(), Window::Hour);
        assert_eq!(Window::parse(Some("1d")).unwrap().minutes(), 1440);
        let refused = format!("{:?}", Window::parse(Some("2h")).unwrap_err());
        assert!(refused.contains("window: must be 1h or 1d"), "{refused}");
    }
}
