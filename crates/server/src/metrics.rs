//! `GET /metrics`: Prometheus text exposition (format 0.0.4), written by hand.
//!
//! Two kinds of metrics. Gauges of jobs and tasks are read from the store at scrape time with one
//! query (`Engine::stats`); when that read fails, `starbridge_store_up` is 0 and those gauges are
//! left out, so the process counters can still be scraped. HTTP request counters and latency
//! histograms are kept in memory by a middleware (`layer`) around every route, labelled with the
//! route template (`MatchedPath`) so that ids do not multiply the series.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Extension;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{FromFnLayer, Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use starbridge_engine::{QueueStats, Stats, WriterStats};

use starbridge_api::paths;

use crate::openapi::{Guarded, Unprocessable};
use crate::state::AppState;

/// Upper bounds (seconds) of the request duration histogram. Long polls wait up to 60 s.
const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `content-type` of the exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The route label of a request that matched no route.
const UNMATCHED: &str = "unmatched";

#[derive(Default)]
struct Histogram {
    /// Non-cumulative counts per bucket of `BUCKETS`; the `+Inf` bucket is `count`.
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(index) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[index] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

#[derive(Default)]
struct Http {
    /// By (method, route, status).
    requests: BTreeMap<(&'static str, String, u16), u64>,
    /// By (method, route).
    durations: BTreeMap<(&'static str, String), Histogram>,
}

/// The HTTP counters of one router, shared by its middleware and its `/metrics` handler.
#[derive(Default)]
pub(crate) struct HttpMetrics {
    inner: Mutex<Http>,
}

impl HttpMetrics {
    fn lock(&self) -> MutexGuard<'_, Http> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, method: &'static str, route: String, status: u16, seconds: f64) {
        let mut http = self.lock();
        *http
            .requests
            .entry((method, route.clone(), status))
            .or_default() += 1;
        http.durations
            .entry((method, route))
            .or_default()
            .observe(seconds);
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
/// `starbridge_store_write_restarts_total`, `starbridge_store_write_seconds_total` and
/// `starbridge_store_commit_seconds_total`; and, where `/proc` is readable, the process's
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

/// Escapes a label value: backslash, double quote and line feed.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Writes the HELP and TYPE lines of a metric.
fn describe(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample; `labels` are (name, unescaped value) pairs.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (index, (label, value)) in labels.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            let _ = write!(out, "{label}=\"{}\"", escape_label(value));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

fn render(stats: Option<&Stats>, writer: &WriterStats, http: &HttpMetrics) -> String {
    let mut out = String::new();
    describe(
        &mut out,
        "starbridge_build_info",
        "gauge",
        "The running server's version; always 1.",
    );
    sample(
        &mut out,
        "starbridge_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    describe(
        &mut out,
        "starbridge_store_up",
        "gauge",
        "Whether this scrape could read the store (1) or not (0, and the job and task gauges are left out).",
    );
    sample(
        &mut out,
        "starbridge_store_up",
        &[],
        u8::from(stats.is_some()),
    );
    if let Some(stats) = stats {
        render_store(&mut out, stats);
    }
    render_writer(&mut out, writer);
    if let Some(process) = crate::process::read() {
        render_process(&mut out, &process);
    }
    render_http(&mut out, &http.lock());
    out
}

fn render_store(out: &mut String, stats: &Stats) {
    describe(
        out,
        "starbridge_jobs",
        "gauge",
        "Jobs by namespace and status.",
    );
    for ((namespace, status), count) in &stats.jobs {
        let labels = [
            ("namespace", namespace.as_str()),
            ("status", status.as_str()),
        ];
        sample(out, "starbridge_jobs", &labels, count);
    }
    queue_gauge(
        out,
        stats,
        "starbridge_tasks_ready",
        "Ready tasks by namespace and queue, including those waiting out a retry backoff or a check-later delay; tasks of paused jobs are not counted.",
        |q| q.ready.to_string(),
    );
    queue_gauge(
        out,
        stats,
        "starbridge_tasks_running",
        "Tasks held by a worker (leased) by namespace and queue.",
        |q| q.running.to_string(),
    );
    queue_gauge(
        out,
        stats,
        "starbridge_oldest_ready_task_age_seconds",
        "How long the oldest claimable ready task of a queue has been claimable; 0 when none is.",
        |q| seconds(q.oldest_ready_age.as_millis()),
    );
}

/// The group-commit writer's counters: how many requests share a commit, and how busy it is.
fn render_writer(out: &mut String, writer: &WriterStats) {
    let counters: [(&str, &str, String); 7] = [
        (
            "starbridge_store_commits_total",
            "Group transactions committed by this node's writer.",
            writer.commits.to_string(),
        ),
        (
            "starbridge_store_failed_commits_total",
            "Group transactions that failed; every request in them was refused.",
            writer.failed_commits.to_string(),
        ),
        (
            "starbridge_store_write_requests_total",
            "Write requests run by the writer (divide by commits for the group size).",
            writer.requests.to_string(),
        ),
        (
            "starbridge_store_write_retries_total",
            "Write requests run again because another node held their rows.",
            writer.retried.to_string(),
        ),
        (
            "starbridge_store_write_restarts_total",
            "Group transactions run again with a savepoint per request because a request was refused or failed after writing.",
            writer.restarts.to_string(),
        ),
        (
            "starbridge_store_write_seconds_total",
            "Time the writer spent in transactions, from BEGIN to the end of COMMIT.",
            writer.busy.as_secs_f64().to_string(),
        ),
        (
            "starbridge_store_commit_seconds_total",
            "Time the writer spent in COMMIT (on SQLite mostly the fsync of the write-ahead log).",
            writer.committing.as_secs_f64().to_string(),
        ),
    ];
    for (name, help, value) in counters {
        describe(out, name, "counter", help);
        sample(out, name, &[], value);
    }
}

/// This process's CPU time and memory (the names of Prometheus's process collector, and the
/// peak, which it has not).
fn render_process(out: &mut String, process: &crate::process::ProcessStats) {
    let series = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            process.cpu.as_secs_f64().to_string(),
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            process.resident_bytes.to_string(),
        ),
        (
            "starbridge_process_peak_resident_memory_bytes",
            "gauge",
            "The most resident memory the process has had, in bytes.",
            process.peak_resident_bytes.to_string(),
        ),
    ];
    for (name, kind, help, value) in series {
        describe(out, name, kind, help);
        sample(out, name, &[], value);
    }
}

/// A gauge with one sample per known queue.
fn queue_gauge(
    out: &mut String,
    stats: &Stats,
    name: &str,
    help: &str,
    value: fn(&QueueStats) -> String,
) {
    describe(out, name, "gauge", help);
    for ((namespace, queue), counts) in &stats.queues {
        let labels = [("namespace", namespace.as_str()), ("queue", queue.as_str())];
        sample(out, name, &labels, value(counts));
    }
}

fn seconds(millis: u64) -> String {
    // Exact for any realistic age; a float keeps the millisecond fraction.
    format!("{}", millis as f64 / 1000.0)
}

fn render_http(out: &mut String, http: &Http) {
    describe(
        out,
        "starbridge_http_requests_total",
        "counter",
        "HTTP requests answered, by method, route template and status.",
    );
    for ((method, route, status), count) in &http.requests {
        let status = status.to_string();
        let labels = [
            ("method", *method),
            ("route", route.as_str()),
            ("status", status.as_str()),
        ];
        sample(out, "starbridge_http_requests_total", &labels, count);
    }
    let name = "starbridge_http_request_duration_seconds";
    describe(
        out,
        name,
        "histogram",
        "Time to answer an HTTP request, until its response head is ready, by method and route template.",
    );
    for ((method, route), histogram) in &http.durations {
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(histogram.buckets) {
            cumulative += count;
            let le = bound.to_string();
            let labels = [
                ("method", *method),
                ("route", route.as_str()),
                ("le", le.as_str()),
            ];
            sample(out, &format!("{name}_bucket"), &labels, cumulative);
        }
        let labels = [
            ("method", *method),
            ("route", route.as_str()),
            ("le", "+Inf"),
        ];
        sample(out, &format!("{name}_bucket"), &labels, histogram.count);
        let labels = [("method", *method), ("route", route.as_str())];
        sample(out, &format!("{name}_sum"), &labels, histogram.sum);
        sample(out, &format!("{name}_count"), &labels, histogram.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("line\nnext"), "line\\nnext");
        let mut out = String::new();
        sample(&mut out, "m", &[("q", "x\"y")], 2);
        assert_eq!(out, "m{q=\"x\\\"y\"} 2\n");
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
}
