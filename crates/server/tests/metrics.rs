//! `GET /metrics` through the in-process router: the exposition parses line by line and carries
//! the store gauges and the request counters.

mod common;

use axum::http::StatusCode;

use common::Api;

fn api() -> Api {
    Api::start()
}

/// The status, content type and text of a request with a JSON body.
trait Calls {
    async fn call(&self, method: &str, uri: &str, body: &str) -> (StatusCode, String, String);
}

impl Calls for Api {
    async fn call(&self, method: &str, uri: &str, body: &str) -> (StatusCode, String, String) {
        let answer = self.send_json(method, uri, body).await;
        (answer.status, answer.content_type, answer.text)
    }
}

/// One sample line: name, labels in order, value.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

fn is_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses `name{label="value",…} value` (format 0.0.4), unescaping label values.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| format!("no value: {line}"))?;
    let name = &line[..name_end];
    if !is_name(name) {
        return Err(format!("bad metric name: {line}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').ok_or_else(|| format!("bad label: {line}"))?;
            let label = &rest[..eq];
            if !is_name(label) {
                return Err(format!("bad label name {label:?}: {line}"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or_else(|| format!("unquoted label value: {line}"))?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c @ ('\\' | '"'))) => value.push(c),
                        _ => return Err(format!("bad escape: {line}")),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("unterminated label value: {line}")),
                }
            };
            labels.push((label.to_owned(), value));
            rest = &rest[end + 1..];
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            }
        }
    }
    let value = rest
        .strip_prefix(' ')
        .ok_or_else(|| format!("no space before the value: {line}"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        text => text
            .parse()
            .map_err(|_| format!("bad value {text:?}: {line}"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Checks the whole exposition: every line is a HELP, a TYPE or a sample, every sample belongs
/// to a metric declared before it with HELP and TYPE.
fn parse(text: &str) -> Vec<Sample> {
    assert!(text.ends_with('\n'), "the exposition ends with a line feed");
    let mut types: Vec<(String, String)> = Vec::new();
    let mut helped: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(help) = line.strip_prefix("# HELP ") {
            let (name, doc) = help.split_once(' ').expect("HELP has a text");
            assert!(!doc.is_empty(), "{line}");
            helped.push(name.to_owned());
        } else if let Some(kind) = line.strip_prefix("# TYPE ") {
            let (name, kind) = kind.split_once(' ').expect("TYPE has a type");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                helped.last().is_some_and(|h| h == name),
                "HELP before TYPE: {line}"
            );
            types.push((name.to_owned(), kind.to_owned()));
        } else {
            let sample = parse_sample(line).unwrap_or_else(|e| panic!("{e}"));
            let (family, kind) = types.last().expect("a sample after a TYPE line");
            let belongs = match kind.as_str() {
                "histogram" => [
                    format!("{family}_bucket"),
                    format!("{family}_sum"),
                    format!("{family}_count"),
                ]
                .contains(&sample.name),
                _ => sample.name == *family,
            };
            assert!(belongs, "{} is not of {family}: {line}", sample.name);
            samples.push(sample);
        }
    }
    samples
}

const WORKFLOW: &str = "steps:\n- {id: a, queue: \"ops/q:1\", command: c}\n";

#[tokio::test]
async fn scrape_shows_store_gauges_and_request_counters() {
    let api = api();
    let (status, _, _) = api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    api.call("GET", "/api/v1/jobs/job_nope", "").await;
    api.call("GET", "/no/such/path", "").await;

    let (status, content_type, text) = api.call("GET", "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let samples = parse(&text);

    assert!(
        text.contains("starbridge_jobs{namespace=\"default\",status=\"running\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("starbridge_jobs{namespace=\"default\",status=\"failed\"} 0\n"),
        "{text}"
    );
    assert!(text.contains("starbridge_store_up 1\n"), "{text}");
    assert!(
        text.contains(&format!(
            "starbridge_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    assert!(
        text.contains("starbridge_tasks_ready{namespace=\"default\",queue=\"ops/q:1\"} 1\n"),
        "{text}"
    );
    let find = |name: &str, labels: &[(&str, &str)]| {
        samples.iter().find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
    };
    let ready = find("starbridge_tasks_ready", &[("queue", "ops/q:1")]).unwrap();
    assert_eq!(ready.value, 1.0);
    let running = find("starbridge_tasks_running", &[("queue", "ops/q:1")]).unwrap();
    assert_eq!(running.value, 0.0);
    let age = find(
        "starbridge_oldest_ready_task_age_seconds",
        &[("queue", "ops/q:1")],
    )
    .unwrap();
    assert!(age.value >= 0.0);

    // The writer committed the apply, its audit entry and the submit (three requests, one
    // after the other) and spent time doing it.
    let writer = |name: &str| find(name, &[]).unwrap_or_else(|| panic!("no {name}")).value;
    assert_eq!(
        writer("starbridge_store_write_requests_total"),
        3.0,
        "{text}"
    );
    assert_eq!(writer("starbridge_store_commits_total"), 3.0, "{text}");
    assert_eq!(writer("starbridge_store_failed_commits_total"), 0.0);
    assert_eq!(writer("starbridge_store_write_retries_total"), 0.0);
    assert_eq!(writer("starbridge_store_write_restarts_total"), 0.0);
    // The process's own figures, under the names Prometheus's process collector uses.
    assert!(writer("process_cpu_seconds_total") >= 0.0);
    let resident = writer("process_resident_memory_bytes");
    assert!(resident > 0.0, "{text}");
    assert!(writer("starbridge_process_peak_resident_memory_bytes") >= resident);
    let busy = writer("starbridge_store_write_seconds_total");
    let committing = writer("starbridge_store_commit_seconds_total");
    assert!(
        busy > 0.0 && committing > 0.0 && committing <= busy,
        "{text}"
    );
    // On SQLite, fully durable: each answer waited for a sync of the log after its commit (one
    // sync may cover several commits).
    let syncs = writer("starbridge_store_log_syncs_total");
    assert!((1.0..=3.0).contains(&syncs), "{text}");
    assert!(
        writer("starbridge_store_log_sync_seconds_total") > 0.0,
        "{text}"
    );

    let submit = [
        ("method", "POST"),
        ("route", "/api/v1/jobs"),
        ("status", "201"),
    ];
    assert_eq!(
        find("starbridge_http_requests_total", &submit)
            .unwrap()
            .value,
        1.0
    );
    assert!(
        text.contains(
            "starbridge_http_requests_total{method=\"POST\",route=\"/api/v1/jobs\",status=\"201\"} 1\n"
        ),
        "{text}"
    );
    // Ids do not become labels: the route template does.
    let get_job = [("route", "/api/v1/jobs/{id}"), ("status", "404")];
    assert!(
        find("starbridge_http_requests_total", &get_job).is_some(),
        "{text}"
    );
    let unmatched = [("route", "unmatched"), ("status", "404")];
    assert!(
        find("starbridge_http_requests_total", &unmatched).is_some(),
        "{text}"
    );
    assert!(!text.contains("job_nope") && !text.contains("/no/such/path"));

    let count = find(
        "starbridge_http_request_duration_seconds_count",
        &[("method", "POST"), ("route", "/api/v1/jobs")],
    )
    .unwrap();
    assert_eq!(count.value, 1.0);
    let inf = find(
        "starbridge_http_request_duration_seconds_bucket",
        &[
            ("method", "POST"),
            ("route", "/api/v1/jobs"),
            ("le", "+Inf"),
        ],
    )
    .unwrap();
    assert_eq!(inf.value, 1.0);
}

#[tokio::test]
async fn a_scrape_is_itself_counted_by_the_next() {
    let api = api();
    api.call("GET", "/metrics", "").await;
    let (_, _, text) = api.call("GET", "/metrics", "").await;
    parse(&text);
    assert!(
        text.contains(
            "starbridge_http_requests_total{method=\"GET\",route=\"/metrics\",status=\"200\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        !text.contains("starbridge_jobs{"),
        "no namespace is known yet, so no job gauge: {text}"
    );
}
