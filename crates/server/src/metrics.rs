//! `GET /metrics`: Prometheus text exposition (format 0.0.4), encoded by the Prometheus client
//! library (`prometheus-client`) from its metric types.
//!
//! Two kinds of metrics. Gauges of jobs and tasks are read from the store at scrape time with one
//! query (`Engine::stats`) and put, with the writer's counters and the process's figures, in a
//! registry made for that scrape; when the store read fails, `starbridge_store_up` is 0 and those
//! gauges are left out, so the process counters can still be scraped. HTTP request counters and
//! latency histograms live as long as the router, kept by a middleware (`layer`) around every
//! route, labelled with the route template (`MatchedPath`) so that ids do not multiply the series.
//!
//! The library adds a counter's `_total` and ends every HELP text with a full stop, so counters
//! are registered without the one and HELP texts are written without the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Instant;

use axum::Extension;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{FromFnLayer, Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text::{CONTENT_TYPE, encode};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use starbridge_engine::{QueueStats, Stats, WriterStats};

use starbridge_api::paths;

use crate::openapi::{Guarded, Unprocessable};
use crate::state::AppState;

/// Upper bounds (seconds) of the request duration histogram. Long polls wait up to 60 s.
const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The route label of a request that matched no route.
const UNMATCHED: &str = "unmatched";

/// The labels of a request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    route: String,
    status: u16,
}

/// The labels of a request duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    namespace: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    namespace: String,
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The HTTP counters of one router, shared by its middleware and its `/metrics` handler.
pub(crate) struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> HttpMetrics {
        HttpMetrics {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl HttpMetrics {
    fn record(&self, method: &'static str, route: String, status: u16, seconds: f64) {
        self.durations
            .get_or_create(&RouteLabels {
                method,
                route: route.clone(),
            })
            .observe(seconds);
        self.requests
            .get_or_create(&RequestLabels {
                method,
                route,
                status,
            })
            .inc();
    }

    /// Adds the request counter and the duration histogram (sharing their series) to `registry`.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "starbridge_http_requests",
            "HTTP requests answered, by method, route template and status",
            self.requests.clone(),
        );
        registry.register(
            "starbridge_http_request_duration_seconds",
            "Time to answer an HTTP request, until its response head is ready, by method and route template",
            self.durations.clone(),
        );
    }
}

/// A method label from a fixed set, so a client cannot make new series with made-up methods.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

type Tracked = Pin<Box<dyn Future<Output = Response> + Send>>;
type Track = fn(State<Arc<HttpMetrics>>, Request, Next) -> Tracked;

/// The middleware that counts and times every request (until its response head is ready) and
/// makes the counters available to the `/metrics` handler. Apply it with `Router::layer` after
/// the routes, so the matched route is known. A request dropped before its answer (a client that
/// gave up on a long poll) is not counted.
pub(crate) fn layer() -> FromFnLayer<Track, Arc<HttpMetrics>, (State<Arc<HttpMetrics>>, Request)> {
    from_fn_with_state(Arc::new(HttpMetrics::default()), track as Track)
}

fn track(State(http): State<Arc<HttpMetrics>>, mut request: Request, next: Next) -> Tracked {
    Box::pin(async move {
        let started = Instant::now();
        let method = method_label(request.method());
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(|| UNMATCHED.to_owned(), |path| path.as_str().to_owned());
        request.extensions_mut().insert(http.clone());
        let response = next.run(request).await;
        let seconds = started.elapsed().as_secs_f64();
        http.record(method, route, response.status().as_u16(), seconds);
        response
    })
}

// `GET /metrics`.
/// Prometheus metrics
///
/// Text exposition format 0.0.4 (`text/plain; version=0.0.4`): `starbridge_jobs{namespace,status}`,
/// `starbridge_tasks_ready{namespace,queue}`, `starbridge_tasks_running{namespace,queue}`,
/// `starbridge_oldest_ready_task_age_seconds{namespace,queue}`, `starbridge_build_info{version}`,
/// `starbridge_store_up`, `starbridge_http_requests_total{method,route,status}` and the histogram
/// `starbridge_http_request_duration_seconds{method,route}`; the writer's
/// `starbridge_store_commits_total`, `starbridge_store_failed_commits_total`,
/// `starbridge_store_write_requests_total`, `starbridge_store_write_retries_total`,
/// `starbridge_store_write_restarts_total`, `starbridge_store_write_seconds_total`,
/// `starbridge_store_commit_seconds_total`, `starbridge_store_log_syncs_total`,
/// `starbridge_store_log_sync_seconds_total` and `starbridge_store_jobs_read_ahead_total`; and, where `/proc` is readable, the process's
/// `process_cpu_seconds_total`, `process_resident_memory_bytes` and
/// `starbridge_process_peak_resident_memory_bytes`. Always 200: when the store cannot be read,
/// `starbridge_store_up` is 0 and the job and task gauges are left out.
#[utoipa::path(
    get,
    path = paths::METRICS,
    operation_id = "metrics",
    tag = "system",
    responses(
        (status = 200, description = "The metrics.", body = String, content_type = "text/plain"),
        (status = 422, response = Unprocessable),
        Guarded,
    ),
)]
pub(crate) async fn serve(
    State(state): State<AppState>,
    Extension(http): Extension<Arc<HttpMetrics>>,
) -> Response {
    let stats = match state.engine.stats().await {
        Ok(stats) => Some(stats),
        Err(error) => {
            tracing::warn!(%error, "metrics: cannot read the store");
            None
        }
    };
    let text = render(stats.as_ref(), &state.engine.writer_stats(), &http);
    let mut response = (StatusCode::OK, text).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

fn render(stats: Option<&Stats>, writer: &WriterStats, http: &HttpMetrics) -> String {
    let mut registry = Registry::default();
    let build = Family::<VersionLabel, Gauge>::default();
    build
        .get_or_create(&VersionLabel {
            version: env!("CARGO_PKG_VERSION"),
        })
        .set(1);
    registry.register(
        "starbridge_build_info",
        "The running server's version; always 1",
        build,
    );
    registry.register(
        "starbridge_store_up",
        "Whether this scrape could read the store (1) or not (0, and the job and task gauges are left out)",
        ConstGauge::new(i64::from(stats.is_some())),
    );
    if let Some(stats) = stats {
        register_store(&mut registry, stats);
    }
    register_writer(&mut registry, writer);
    if let Some(process) = crate::process::read() {
        register_process(&mut registry, &process);
    }
    http.register(&mut registry);
    let mut out = String::new();
    // Writing to a `String` cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

fn register_store(registry: &mut Registry, stats: &Stats) {
    let jobs = Family::<JobLabels, Gauge>::default();
    for ((namespace, status), count) in &stats.jobs {
        let labels = JobLabels {
            namespace: namespace.clone(),
            status: status.clone(),
        };
        jobs.get_or_create(&labels).set(gauge_value(*count));
    }
    registry.register("starbridge_jobs", "Jobs by namespace and status", jobs);
    registry.register(
        "starbridge_tasks_ready",
        "Ready tasks by namespace and queue, including those waiting out a retry backoff or a check-later delay; tasks of paused jobs are not counted",
        queue_gauge::<i64, AtomicI64>(stats, |q| gauge_value(q.ready)),
    );
    registry.register(
        "starbridge_tasks_running",
        "Tasks held by a worker (leased) by namespace and queue",
        queue_gauge::<i64, AtomicI64>(stats, |q| gauge_value(q.running)),
    );
    registry.register(
        "starbridge_oldest_ready_task_age_seconds",
        "How long the oldest claimable ready task of a queue has been claimable; 0 when none is",
        queue_gauge::<f64, AtomicU64>(stats, |q| q.oldest_ready_age.as_millis() as f64 / 1000.0),
    );
}

/// A count as a gauge value.
fn gauge_value(count: impl TryInto<i64>) -> i64 {
    count.try_into().unwrap_or(i64::MAX)
}

/// A gauge with one series per known queue.
fn queue_gauge<N, A>(stats: &Stats, value: fn(&QueueStats) -> N) -> Family<QueueLabels, Gauge<N, A>>
where
    Gauge<N, A>: Default,
    A: prometheus_client::metrics::gauge::Atomic<N>,
{
    let family = Family::<QueueLabels, Gauge<N, A>>::default();
    for ((namespace, queue), counts) in &stats.queues {
        let labels = QueueLabels {
            namespace: namespace.clone(),
            queue: queue.clone(),
        };
        family.get_or_create(&labels).set(value(counts));
    }
    family
}

/// The group-commit writer's counters: how many requests share a commit, and how busy it is.
fn register_writer(registry: &mut Registry, writer: &WriterStats) {
    let counts = [
        (
            "starbridge_store_commits",
            "Group transactions committed by this node's writer",
            writer.commits,
        ),
        (
            "starbridge_store_failed_commits",
            "Group transactions that failed; every request in them was refused",
            writer.failed_commits,
        ),
        (
            "starbridge_store_write_requests",
            "Write requests run by the writer (divide by commits for the group size)",
            writer.requests,
        ),
        (
            "starbridge_store_write_retries",
            "Write requests run again because another node held their rows",
            writer.retried,
        ),
        (
            "starbridge_store_write_restarts",
            "Group transactions run again with a savepoint per request because a request was refused or failed after writing",
            writer.restarts,
        ),
        (
            "starbridge_store_log_syncs",
            "Syncs of SQLite's write-ahead log (full durability), each covering every commit written before it",
            writer.log_syncs,
        ),
        (
            "starbridge_store_jobs_read_ahead",
            "SQLite: jobs the writer found read ahead beside it instead of reading them (claims of a queue deeper than the writer's job cache)",
            writer.jobs_read_ahead,
        ),
    ];
    for (name, help, value) in counts {
        registry.register(name, help, ConstCounter::new(value));
    }
    let times = [
        (
            "starbridge_store_write_seconds",
            "Time the writer spent in transactions, from BEGIN to the end of COMMIT",
            writer.busy,
        ),
        (
            "starbridge_store_commit_seconds",
            "Time the writer spent in COMMIT (on SQLite writing the write-ahead log; its sync comes after, beside the writer)",
            writer.committing,
        ),
        (
            "starbridge_store_log_sync_seconds",
            "Time spent syncing SQLite's write-ahead log before answering the commits it covers (full durability)",
            writer.log_syncing,
        ),
    ];
    for (name, help, value) in times {
        registry.register(name, help, ConstCounter::new(value.as_secs_f64()));
    }
}

/// This process's CPU time and memory (the names of Prometheus's process collector, and the
/// peak, which it has not).
fn register_process(registry: &mut Registry, process: &crate::process::ProcessStats) {
    registry.register(
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        ConstCounter::new(process.cpu.as_secs_f64()),
    );
    registry.register(
        "process_resident_memory_bytes",
        "Resident memory size in bytes",
        ConstGauge::new(process.resident_bytes),
    );
    registry.register(
        "starbridge_process_peak_resident_memory_bytes",
        "The most resident memory the process has had, in bytes",
        ConstGauge::new(process.peak_resident_bytes),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let http = HttpMetrics::default();
        http.record("GET", "x\"y\\z\nw".to_owned(), 200, 0.1);
        let text = render(None, &WriterStats::default(), &http);
        assert!(
            text.contains(
                "starbridge_http_requests_total{method=\"GET\",route=\"x\\\"y\\\\z\\nw\",status=\"200\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let http = HttpMetrics::default();
        http.record("GET", "/x".to_owned(), 200, 0.003);
        http.record("GET", "/x".to_owned(), 200, 0.2);
        http.record("GET", "/x".to_owned(), 500, 100.0);
        let text = render(None, &WriterStats::default(), &http);
        let bucket = |le: &str| {
            let prefix = format!(
                "starbridge_http_request_duration_seconds_bucket{{method=\"GET\",route=\"/x\",le=\"{le}\"}} "
            );
            text.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
                .to_owned()
        };
        assert_eq!(bucket("0.005"), "1");
        assert_eq!(bucket("0.25"), "2");
        assert_eq!(bucket("60"), "2");
        assert_eq!(bucket("+Inf"), "3");
        assert!(text.contains("starbridge_store_up 0\n"), "{text}");
        assert!(
            text.contains(
                "starbridge_http_requests_total{method=\"GET\",route=\"/x\",status=\"500\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn help_texts_end_with_one_full_stop_and_counters_with_total() {
        let text = render(None, &WriterStats::default(), &HttpMetrics::default());
        assert!(
            text.contains("# HELP starbridge_build_info The running server's version; always 1.\n"),
            "{text}"
        );
        assert!(!text.contains(".."), "{text}");
        assert!(
            text.contains(
                "# TYPE starbridge_store_commits_total counter\nstarbridge_store_commits_total 0\n"
            ),
            "{text}"
        );
    }
}
