//! The web UI: server-rendered HTML pages at `/` and under `/ui/`, a stylesheet and one small
//! script built into the binary, and a server-sent event stream that tells an open job page when
//! the job changed. Operator actions and job submission go from the script to the JSON API
//! (`/api/v1`), so the UI can do nothing the API does not allow and shows the API's refusals.
//!
//! None of these routes is part of the JSON API (they live outside `/api/`, which is why the
//! OpenAPI route scan of `src/*.rs` does not look into this folder). The handlers here read the
//! store; what they show is built by the pure modules: `pages` (HTML), `dashboard` (the
//! per-minute figures and their SVG charts), `graph` and `layout`
//! (DAG drawing and DOT), `diff` (version changes) and `form` (params form).

mod approvals;
mod dashboard;
mod diff;
mod form;
mod graph;
mod html;
mod layout;
mod pages;

use std::convert::Infallible;
use std::time::Duration as StdDuration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::Stream;
use serde::Deserialize;
use starbridge_api as api;
use starbridge_core::definition::check_name;
use starbridge_core::ids::JobId;
use starbridge_core::model::JobStatus;
use starbridge_core::time::{Duration, Timestamp};
use starbridge_engine::{JobCursor, JobSearch, QueueSearch};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::state::AppState;
use pages::{Live, Ns, Section};

/// Jobs per page of the list.
const PAGE_SIZE: u32 = 50;
/// Queues per page of the queues page (at most the server's page limit).
const QUEUE_PAGE_SIZE: u32 = 100;
/// Jobs counted per status at most: larger counts show as "more than" (see `browse.rs`).
const COUNT_CAP: u64 = 100_000;
/// History events read for the job page; the page shows the latest `SHOWN_EVENTS`.
const READ_EVENTS: u32 = 100_000;
const SHOWN_EVENTS: usize = 500;
/// How often an open job page's stream looks for new history events.
const STREAM_CHECK: StdDuration = StdDuration::from_millis(400);
/// How often list pages re-read themselves.
const REFRESH_MS: u32 = 3000;

const CSS: &str = include_str!("assets/app.css");
const JS: &str = include_str!("assets/app.js");
/// Scripts only from this server; inline styles are needed by the SVG drawings.
const CSP: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                   object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

#[derive(Clone)]
struct UiState {
    app: AppState,
    /// Becomes true when the server shuts down: open event streams end.
    closing: watch::Receiver<bool>,
}

/// The UI's routes. `closing` turns true when the server begins to shut down.
pub(crate) fn router(app: AppState, closing: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/", get(jobs_page))
        .route("/ui/jobs/{id}", get(job_page))
        .route("/ui/jobs/{id}/live", get(job_stream))
        .route("/ui/jobs/{id}/graph.dot", get(job_dot))
        .route("/ui/jobs/{id}/graph.svg", get(job_svg))
        .route("/ui/workflows", get(workflows_page))
        .route("/ui/workflows/{name}", get(workflow_page))
        .route("/ui/workflows/{name}/graph.dot", get(workflow_dot))
        .route("/ui/workflows/{name}/graph.svg", get(workflow_svg))
        .route("/ui/dashboard", get(dashboard_page))
        .route("/ui/queues", get(queues_page))
        .route("/ui/schedules", get(schedules_page))
        .route("/ui/approvals", get(approvals_page))
        .route("/ui/assets/app.css", get(css))
        .route("/ui/assets/app.js", get(js))
        .with_state(UiState { app, closing })
}

/// Why a page cannot be shown.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Store(#[from] starbridge_engine::Error),
    #[error("{}", .0.detail())]
    Api(ApiError),
}

impl From<ApiError> for Error {
    fn from(error: ApiError) -> Error {
        Error::Api(error)
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, title) = match &self {
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "Not found"),
            Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "Bad request"),
            Error::Api(error) => (error.status(), "Cannot show this page"),
            Error::Store(starbridge_engine::Error::NotFound(_)) => {
                (StatusCode::NOT_FOUND, "Not found")
            }
            Error::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "Store unavailable"),
        };
        let detail = if status.is_server_error() {
            tracing::error!(error = %self, "ui page failed");
            "the store did not answer: see the server log".to_owned()
        } else {
            self.to_string()
        };
        let ns = Ns(api::DEFAULT_NAMESPACE.to_owned());
        let body = pages::page(
            title,
            Section::Jobs,
            &ns,
            Live::Static,
            &pages::problem(title, &detail),
        );
        (status, html_headers(), body).into_response()
    }
}

fn html_headers() -> [(header::HeaderName, &'static str); 3] {
    [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::CACHE_CONTROL, "no-store"),
    ]
}

fn html(body: String) -> Response {
    (html_headers(), body).into_response()
}

#[derive(Deserialize, Default)]
struct NsQuery {
    namespace: Option<String>,
}

fn ns(value: Option<&str>) -> Result<Ns> {
    let name = value
        .filter(|v| !v.is_empty())
        .unwrap_or(api::DEFAULT_NAMESPACE);
    check_name(name).map_err(|message| Error::BadRequest(format!("namespace: {message}")))?;
    Ok(Ns(name.to_owned()))
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        format!("{CSS}\n{}\n", graph::state_styles()),
    )
        .into_response()
}

async fn js() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        JS,
    )
        .into_response()
}

#[derive(Deserialize, Default)]
struct JobsParams {
    namespace: Option<String>,
    #[serde(default)]
    status: String,
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    range: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    label: String,
    #[serde(default)]
    cursor: String,
}

/// A `datetime-local` value (`2026-11-23T01:14`, read as UTC).
fn local_time(field: &str, text: &str) -> Result<Option<Timestamp>> {
    if text.is_empty() {
        return Ok(None);
    }
    let civil: jiff::civil::DateTime = text.parse().map_err(|_| {
        Error::BadRequest(format!(
            "{field}: '{text}' is not a date and time such as 2026-11-23T01:14"
        ))
    })?;
    let zoned = civil
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|error| Error::BadRequest(format!("{field}: {error}")))?;
    Ok(Some(Timestamp(zoned.timestamp().as_millisecond())))
}

/// The label filter of the jobs page: `key=value` selectors separated by commas (so a value
/// with a comma cannot be looked for here; the API's repeated `label` parameter can).
fn label_selectors(text: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|selector| !selector.is_empty())
        .map(|selector| {
            starbridge_core::labels::parse_selector(selector)
                .map_err(|message| Error::BadRequest(format!("label: {message}")))
        })
        .collect()
}

/// The store search a jobs page query asks for.
fn search(params: &JobsParams, namespace: &Ns, now: Timestamp) -> Result<JobSearch> {
    let status = match params.status.as_str() {
        "" => None,
        text => Some(
            JobStatus::parse(text)
                .ok_or_else(|| Error::BadRequest(format!("status: unknown status '{text}'")))?,
        ),
    };
    let range = match params.range.as_str() {
        "" => None,
        "1h" => Some(Duration::from_millis(3_600_000)),
        "24h" => Some(Duration::from_millis(86_400_000)),
        "7d" => Some(Duration::from_millis(7 * 86_400_000)),
        "30d" => Some(Duration::from_millis(30 * 86_400_000)),
        other => return Err(Error::BadRequest(format!("range: unknown range '{other}'"))),
    };
    let from = local_time("from", &params.from)?;
    let since = range.map(|r| Timestamp(now.0 - r.as_millis() as i64));
    let created_after = match (from, since) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let after = match params.cursor.as_str() {
        "" => None,
        text => Some(JobCursor::decode(text).ok_or_else(|| {
            Error::BadRequest("cursor: not a cursor of this list: start from the first page".into())
        })?),
    };
    let text = params.q.trim();
    Ok(JobSearch {
        namespace: namespace.0.clone(),
        status,
        workflow: Some(params.workflow.clone()).filter(|w| !w.is_empty()),
        created_after,
        created_before: local_time("to", &params.to)?,
        text: Some(text.to_owned()).filter(|t| !t.is_empty()),
        labels: label_selectors(&params.label)?,
        after,
        limit: PAGE_SIZE + 1,
    })
}

/// The bulk API's selection of the jobs a list search shows, as many as one action takes (the
/// filter fields of a `BulkRequest`), or `None` when the API cannot select the same jobs: a
/// search by id or key prefix, or two selectors of one label key.
fn bulk_filter(search: &JobSearch) -> Option<api::BulkRequest> {
    if search.text.is_some() {
        return None;
    }
    let labels: api::Labels = search.labels.iter().cloned().collect();
    if labels.len() != search.labels.len() {
        return None;
    }
    let rfc3339 = |time: Option<Timestamp>| {
        time.and_then(|time| jiff::Timestamp::from_millisecond(time.0).ok())
            .map(|time| time.to_string())
    };
    Some(api::BulkRequest {
        workflow: search.workflow.clone(),
        status: search.status.map(Into::into),
        created_after: rfc3339(search.created_after),
        created_before: rfc3339(search.created_before),
        labels,
        limit: Some(crate::operate::MAX_BULK),
        ..api::BulkRequest::default()
    })
}

async fn jobs_page(
    State(ui): State<UiState>,
    Query(params): Query<JobsParams>,
) -> Result<Response> {
    let namespace = ns(params.namespace.as_deref())?;
    let store = &ui.app.engine;
    let query = pages::JobsQuery {
        status: params.status.clone(),
        workflow: params.workflow.clone(),
        range: params.range.clone(),
        from: params.from.clone(),
        to: params.to.clone(),
        q: params.q.clone(),
        label: params.label.clone(),
        cursor: params.cursor.clone(),
    };
    let workflows: Vec<String> = store
        .workflows(&namespace.0)
        .await?
        .into_iter()
        .map(|w| w.name)
        .collect();
    let now = store.now();
    let (problem, counts, mut jobs, bulk) = match search(&params, &namespace, now) {
        Ok(search) => {
            let bulk = bulk_filter(&search);
            let counts = store.job_counts(search.clone(), COUNT_CAP);
            let jobs = store.browse_jobs(search);
            let (counts, jobs) = tokio::try_join!(counts, jobs)?;
            (None, counts, jobs, bulk)
        }
        Err(error) => (Some(error.to_string()), Vec::new(), Vec::new(), None),
    };
    let more = jobs.len() > PAGE_SIZE as usize;
    jobs.truncate(PAGE_SIZE as usize);
    let next_cursor = more
        .then(|| {
            jobs.last()
                .map(|job| JobCursor::of(job.created_at, &job.id).encode())
        })
        .flatten();
    let body = pages::jobs(
        &namespace,
        &pages::JobsPage {
            query: &query,
            problem,
            workflows: &workflows,
            counts: &counts,
            jobs: &jobs,
            next_cursor,
            bulk_filter: bulk.map(|filter| serde_json::to_string(&filter).unwrap_or_default()),
            now,
        },
    );
    // Only the first page follows new jobs as they come.
    let live = if query.cursor.is_empty() {
        Live::Every(REFRESH_MS)
    } else {
        Live::Static
    };
    Ok(html(pages::page(
        "Jobs",
        Section::Jobs,
        &namespace,
        live,
        &body,
    )))
}

fn job_id(text: &str) -> Result<JobId> {
    JobId::parse(text).ok_or_else(|| Error::NotFound(format!("job {text} not found")))
}

/// A job with what its page shows: its view, its workflow, its history.
struct LoadedJob {
    view: api::JobView,
    workflow: Option<std::sync::Arc<starbridge_engine::Compiled>>,
    events: Vec<api::EventView>,
}

async fn load_job(ui: &UiState, namespace: &Ns, id: &str) -> Result<LoadedJob> {
    let store = &ui.app.engine;
    let id = job_id(id)?;
    let state = store
        .job(&namespace.0, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("job {id} not found")))?;
    let view = crate::jobs::job_view(&ui.app, &state).await?;
    let workflow = store
        .compiled(&namespace.0, &state.job.workflow, state.job.version)
        .await
        .ok();
    let events = store
        .events(&namespace.0, &id, 0, READ_EVENTS)
        .await?
        .unwrap_or_default();
    let skip = events.len().saturating_sub(SHOWN_EVENTS);
    Ok(LoadedJob {
        view,
        workflow,
        events: events[skip..].iter().map(crate::views::event).collect(),
    })
}

async fn job_page(
    State(ui): State<UiState>,
    Path(id): Path<String>,
    Query(query): Query<NsQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    let loaded = load_job(&ui, &namespace, &id).await?;
    let data = pages::JobPage {
        view: &loaded.view,
        workflow: loaded.workflow.as_ref().map(|c| &c.workflow),
        events: &loaded.events,
        now: ui.app.engine.now(),
    };
    let last_seq = loaded.events.last().map_or(0, |e| e.seq).to_string();
    let stream = namespace.href(
        &format!("/ui/jobs/{}/live", html::url(&loaded.view.summary.id)),
        &[("after", &last_seq)],
    );
    let body = pages::job(&namespace, &data);
    let title = format!(
        "Job {} ({})",
        loaded.view.summary.id, loaded.view.summary.status
    );
    Ok(html(pages::page(
        &title,
        Section::Jobs,
        &namespace,
        Live::Stream(stream),
        &body,
    )))
}

#[derive(Deserialize)]
struct StreamQuery {
    namespace: Option<String>,
    #[serde(default)]
    after: i64,
}

/// Sends a `change` event (data: the latest history sequence number) whenever the job's history
/// grows past `after` or a run of one of its tasks starts (a claim writes no history); ends when
/// the server shuts down.
async fn job_stream(
    State(ui): State<UiState>,
    Path(id): Path<String>,
    Query(query): Query<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let namespace = ns(query.namespace.as_deref())?;
    let id = job_id(&id)?;
    if ui
        .app
        .engine
        .change_mark(&namespace.0, &id)
        .await?
        .is_none()
    {
        return Err(Error::NotFound(format!("job {id} not found")));
    }
    let start = (ui, namespace.0, id, query.after, None);
    let stream = futures_util::stream::unfold(
        start,
        |(mut ui, namespace, id, after, mut seen)| async move {
            loop {
                if *ui.closing.borrow() {
                    return None;
                }
                match ui.app.engine.change_mark(&namespace, &id).await {
                    Ok(Some(mark)) => {
                        // The first mark is what the page shows, unless its history is past
                        // `after`; every later one that differs is a change.
                        let changed = match seen {
                            None => mark.last_event > after,
                            Some(before) => mark != before,
                        };
                        seen = Some(mark);
                        if changed {
                            let event = Event::default()
                                .event("change")
                                .data(mark.last_event.to_string());
                            return Some((Ok(event), (ui, namespace, id, after, seen)));
                        }
                    }
                    Ok(None) => {}
                    Err(error) => tracing::warn!(%error, "job stream cannot read the job"),
                }
                tokio::select! {
                    () = tokio::time::sleep(STREAM_CHECK) => {}
                    changed = ui.closing.changed() => if changed.is_err() { return None },
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

fn dot_response(text: String) -> Response {
    (
        [(header::CONTENT_TYPE, "text/vnd.graphviz; charset=utf-8")],
        text,
    )
        .into_response()
}

fn svg_response(drawing: String) -> Response {
    (
        [(header::CONTENT_TYPE, "image/svg+xml; charset=utf-8")],
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{drawing}\n"),
    )
        .into_response()
}

async fn job_graph(ui: &UiState, id: &str, query: &NsQuery) -> Result<graph::Graph> {
    let namespace = ns(query.namespace.as_deref())?;
    let loaded = load_job(ui, &namespace, id).await?;
    Ok(graph::job_graph(
        loaded.workflow.as_ref().map(|c| &c.workflow),
        &loaded.view.tasks,
        &format!(
            "{} {}",
            loaded.view.summary.workflow, loaded.view.summary.id
        ),
    ))
}

async fn job_dot(
    State(ui): State<UiState>,
    Path(id): Path<String>,
    Query(query): Query<NsQuery>,
) -> Result<Response> {
    Ok(dot_response(graph::dot(
        &job_graph(&ui, &id, &query).await?,
    )))
}

async fn job_svg(
    State(ui): State<UiState>,
    Path(id): Path<String>,
    Query(query): Query<NsQuery>,
) -> Result<Response> {
    Ok(svg_response(graph::svg(
        &job_graph(&ui, &id, &query).await?,
        None,
    )))
}

async fn workflows_page(
    State(ui): State<UiState>,
    Query(query): Query<NsQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    let items = ui.app.engine.workflows(&namespace.0).await?;
    let body = pages::workflows(&namespace, &items);
    Ok(html(pages::page(
        "Workflows",
        Section::Workflows,
        &namespace,
        Live::Static,
        &body,
    )))
}

#[derive(Deserialize)]
struct WorkflowQuery {
    namespace: Option<String>,
    version: Option<u32>,
    diff: Option<u32>,
}

async fn stored_workflow(
    ui: &UiState,
    namespace: &Ns,
    name: &str,
    version: Option<u32>,
) -> Result<starbridge_engine::StoredWorkflow> {
    ui.app
        .engine
        .workflow(&namespace.0, name, version)
        .await?
        .ok_or_else(|| match version {
            Some(v) => Error::NotFound(format!("workflow {name} has no version {v}")),
            None => Error::NotFound(format!("workflow {name} not found")),
        })
}

async fn workflow_page(
    State(ui): State<UiState>,
    Path(name): Path<String>,
    Query(query): Query<WorkflowQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    // A deleted workflow has no latest version; its versions still show by number (job pages
    // link them), up to the one asked for.
    let (stored, latest, deleted) = match (
        stored_workflow(&ui, &namespace, &name, None).await,
        query.version,
    ) {
        (Ok(latest), Some(v)) if v != latest.version => (
            stored_workflow(&ui, &namespace, &name, Some(v)).await?,
            latest.version,
            false,
        ),
        (Ok(latest), _) => (latest.clone(), latest.version, false),
        (Err(Error::NotFound(_)), Some(v)) => {
            let stored = stored_workflow(&ui, &namespace, &name, Some(v)).await?;
            let version = stored.version;
            (stored, version, true)
        }
        (Err(error), _) => return Err(error),
    };
    let compiled = ui
        .app
        .engine
        .compiled(&namespace.0, &name, stored.version)
        .await?;
    let compared = match query.diff.filter(|&d| d != stored.version) {
        Some(v) => Some(stored_workflow(&ui, &namespace, &name, Some(v)).await?),
        None => None,
    };
    let body = pages::workflow(
        &namespace,
        &pages::WorkflowPage {
            stored: &stored,
            workflow: &compiled.workflow,
            latest,
            compared: compared.as_ref().map(|c| (c.version, &c.definition)),
            deleted,
        },
    );
    Ok(html(pages::page(
        &format!("Workflow {name}"),
        Section::Workflows,
        &namespace,
        Live::Static,
        &body,
    )))
}

async fn workflow_graph(ui: &UiState, name: &str, query: &WorkflowQuery) -> Result<graph::Graph> {
    let namespace = ns(query.namespace.as_deref())?;
    let stored = stored_workflow(ui, &namespace, name, query.version).await?;
    let compiled = ui
        .app
        .engine
        .compiled(&namespace.0, name, stored.version)
        .await?;
    let mut drawn = graph::workflow_graph(&compiled.workflow);
    drawn.name = format!("{name} v{}", stored.version);
    Ok(drawn)
}

async fn workflow_dot(
    State(ui): State<UiState>,
    Path(name): Path<String>,
    Query(query): Query<WorkflowQuery>,
) -> Result<Response> {
    Ok(dot_response(graph::dot(
        &workflow_graph(&ui, &name, &query).await?,
    )))
}

async fn workflow_svg(
    State(ui): State<UiState>,
    Path(name): Path<String>,
    Query(query): Query<WorkflowQuery>,
) -> Result<Response> {
    Ok(svg_response(graph::svg(
        &workflow_graph(&ui, &name, &query).await?,
        None,
    )))
}

/// The queues page's query: the namespace, and what to list (see `pages::QueuesFilter`).
#[derive(Deserialize)]
struct QueuesQuery {
    namespace: Option<String>,
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    cursor: String,
}

async fn queues_page(
    State(ui): State<UiState>,
    Query(query): Query<QueuesQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    let store = &ui.app.engine;
    // Every queue, for the groups; the page shown is filtered by the store, as the API's list.
    let everything = store
        .queue_page(QueueSearch {
            namespace: namespace.0.clone(),
            limit: u32::MAX,
            ..QueueSearch::default()
        })
        .await?;
    let all: Vec<api::QueueView> = everything.queues.iter().map(crate::queues::view).collect();
    let groups = pages::queue_groups(&all);
    let prefixes: Vec<api::QueuePrefixView> = everything
        .prefixes
        .iter()
        .map(crate::queues::prefix_view)
        .collect();
    let filter = pages::QueuesFilter {
        prefix: query.prefix,
        q: query.q,
        cursor: query.cursor,
    };
    let given = |text: &str| (!text.is_empty()).then(|| text.to_owned());
    let list = api::QueueListQuery {
        namespace: None,
        prefix: given(&filter.prefix),
        q: given(&filter.q),
        limit: Some(QUEUE_PAGE_SIZE.min(ui.app.limits.page_size)),
        cursor: given(&filter.cursor),
    };
    let (queues, next_cursor, problem) =
        match crate::queues::search(&ui.app, namespace.0.clone(), &list) {
            Ok(mut search) => {
                let limit = search.limit as usize;
                search.limit += 1;
                let page = store.queue_page(search).await?;
                let more = page.queues.len() > limit;
                let queues: Vec<api::QueueView> = page
                    .queues
                    .iter()
                    .take(limit)
                    .map(crate::queues::view)
                    .collect();
                let next = more
                    .then(|| queues.last().map(|q| q.name.clone()))
                    .flatten();
                (queues, next, None)
            }
            Err(refused) => (Vec::new(), None, Some(refused.detail().to_owned())),
        };
    let activity: Vec<(String, Option<u64>, u64)> = queues
        .iter()
        .map(|queue| {
            let name = queue.name.clone();
            let ago = store
                .notifier()
                .last_poll(&namespace.0, &name)
                .map(|at| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
            let started = store.notifier().claims_last_minute(&namespace.0, &name);
            (name, ago, started)
        })
        .collect();
    let loads = store.worker_loads(&namespace.0).await?;
    let seen: Vec<(String, Vec<String>, u64)> = store
        .notifier()
        .workers(&namespace.0)
        .into_iter()
        .map(|w| {
            let ago = u64::try_from(w.last_poll.elapsed().as_millis()).unwrap_or(u64::MAX);
            (w.worker, w.queues, ago)
        })
        .collect();
    let workers = pages::worker_rows(&seen, &loads);
    let body = pages::queues(
        &namespace,
        &pages::QueuesPage {
            filter: &filter,
            groups: &groups,
            prefixes: &prefixes,
            queues: &queues,
            next_cursor,
            problem,
            activity: &activity,
            workers: &workers,
        },
    );
    Ok(html(pages::page(
        "Queues and workers",
        Section::Queues,
        &namespace,
        Live::Every(REFRESH_MS),
        &body,
    )))
}

#[derive(Deserialize, Default)]
struct DashboardQuery {
    namespace: Option<String>,
    window: Option<String>,
}

async fn dashboard_page(
    State(ui): State<UiState>,
    Query(query): Query<DashboardQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    let window = crate::minutes::Window::parse(query.window.as_deref())?;
    let stats = crate::minutes::figures(
        &ui.app,
        &namespace.0,
        window,
        &crate::minutes::SeriesFilter::default(),
    )
    .await?;
    let minutes = usize::try_from(window.minutes()).unwrap_or(60);
    let body = dashboard::dashboard(&namespace, &stats, minutes);
    Ok(html(pages::page(
        "Dashboard",
        Section::Dashboard,
        &namespace,
        Live::Every(REFRESH_MS),
        &body,
    )))
}

async fn schedules_page(
    State(ui): State<UiState>,
    Query(query): Query<NsQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    let schedules = ui.app.engine.schedules(&namespace.0).await?;
    let views: Vec<api::ScheduleView> = schedules.iter().map(crate::schedules::view).collect();
    let body = pages::schedules(&namespace, &views);
    Ok(html(pages::page(
        "Schedules",
        Section::Schedules,
        &namespace,
        Live::Every(REFRESH_MS),
        &body,
    )))
}

async fn approvals_page(
    State(ui): State<UiState>,
    Query(query): Query<NsQuery>,
) -> Result<Response> {
    let namespace = ns(query.namespace.as_deref())?;
    let api::ApprovalList { items } =
        crate::approvals::list_of(&ui.app, &namespace.0, ui.app.limits.page_size).await?;
    Ok(html(pages::page(
        "Approvals",
        Section::Approvals,
        &namespace,
        Live::Every(REFRESH_MS),
        &approvals::page(&namespace, &items),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(range: &str, from: &str, to: &str) -> JobsParams {
        JobsParams {
            range: range.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            ..JobsParams::default()
        }
    }

    #[test]
    fn the_time_filter_reads_utc_times_and_recent_ranges() {
        let ns = Ns("default".to_owned());
        let now = Timestamp(1_700_000_000_000);
        let window = search(
            &params("", "2023-11-14T22:00", "2023-11-14T22:13:20"),
            &ns,
            now,
        )
        .unwrap();
        assert_eq!(window.created_after, Some(Timestamp(1_699_999_200_000)));
        assert_eq!(window.created_before, Some(Timestamp(1_700_000_000_000)));
        let recent = search(&params("1h", "", ""), &ns, now).unwrap();
        assert_eq!(recent.created_after, Some(Timestamp(now.0 - 3_600_000)));
        // With both, the later start wins.
        let both = search(&params("24h", "2023-11-14T22:00", ""), &ns, now).unwrap();
        assert_eq!(both.created_after, Some(Timestamp(1_699_999_200_000)));
    }

    #[test]
    fn bad_filters_name_the_field() {
        let ns = Ns("default".to_owned());
        let now = Timestamp(0);
        for (query, field) in [
            (params("2w", "", ""), "range:"),
            (params("", "yesterday", ""), "from:"),
            (
                JobsParams {
                    cursor: "x".to_owned(),
                    ..JobsParams::default()
                },
                "cursor:",
            ),
        ] {
            let error = search(&query, &ns, now).unwrap_err().to_string();
            assert!(error.starts_with(field), "{error}");
        }
    }

    #[test]
    fn the_bulk_filter_selects_what_the_list_search_shows_or_nothing_it_cannot() {
        let ns = Ns("default".to_owned());
        let now = Timestamp(1_700_000_000_000);
        let query = JobsParams {
            status: "failed".to_owned(),
            workflow: "provision".to_owned(),
            label: "team=storage, env=prod".to_owned(),
            ..params("", "2023-11-14T22:00", "")
        };
        let filter = bulk_filter(&search(&query, &ns, now).unwrap()).unwrap();
        assert_eq!(
            serde_json::to_value(&filter).unwrap(),
            serde_json::json!({
                "workflow": "provision", "status": "failed",
                "created_after": "2023-11-14T22:00:00Z", "created_before": null,
                "labels": {"env": "prod", "team": "storage"},
                "reason": null, "compensate": false, "dry_run": false, "limit": 10000,
            })
        );
        let by_text = JobsParams {
            q: "job_01".to_owned(),
            ..JobsParams::default()
        };
        assert!(bulk_filter(&search(&by_text, &ns, now).unwrap()).is_none());
        let one_key_twice = JobsParams {
            label: "team=storage, team=infra".to_owned(),
            ..JobsParams::default()
        };
        assert!(bulk_filter(&search(&one_key_twice, &ns, now).unwrap()).is_none());
    }
}
