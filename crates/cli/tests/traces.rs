//! OpenTelemetry traces end to end: a real server with `--otlp-endpoint` pointing at an OTLP/HTTP
//! receiver this test starts (it decodes the protobuf requests), a real worker process running a
//! shell step that fails once and then succeeds. The job's span continues the submitter's
//! `traceparent`, each attempt's span sits under the job's (the server restarted in between),
//! the worker's command sees its attempt's `traceparent` (as does the service an `http` step
//! calls), and API requests are named by route template (a callback token in the path never
//! shows). Without the flag nothing is stored, handed to workers or exported.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};

use common::{Harness, STUCK};

/// The submitter's trace context: the job continues this trace under this span.
const SUBMITTER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const SUBMITTER_SPAN: &str = "b7ad6b7169203331";

/// A shell step that fails its first attempt and prints its `traceparent` on the second.
const WORKFLOW: &str = r#"
name: traced
steps:
  - id: work
    queue: shell
    command: >-
      if [ ! -f "$E2E_DIR/failed-once" ]; then touch "$E2E_DIR/failed-once"; exit 1; fi;
      printf '{"traceparent": "%s"}' "${TRACEPARENT-unset}"
    retry: { max_attempts: 2, initial: 100ms }
"#;

type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP traces receiver on loopback: every span it was sent, decoded. Returns its base
/// URL (the exporter posts to `/v1/traces` under it).
async fn otlp_receiver() -> (String, Received) {
    let received = Received::default();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            post(|State(received): State<Received>, body: Bytes| async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                let mut received = received.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        received.extend(scope.spans);
                    }
                }
            }),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        AnyValue::StringValue(text) => Some(json!(text)),
        AnyValue::IntValue(number) => Some(json!(number)),
        other => panic!("unexpected attribute value {other:?}"),
    }
}

/// Waits until the receiver holds a span `found` picks out.
async fn span_where(received: &Received, found: impl Fn(&Span) -> bool) -> Span {
    let deadline = Instant::now() + STUCK;
    loop {
        if let Some(span) = received.lock().unwrap().iter().find(|span| found(span)) {
            return span.clone();
        }
        assert!(Instant::now() < deadline, "no such span was exported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn submit_with_traceparent(harness: &Harness) -> String {
    let response = harness
        .http
        .post(format!("{}/api/v1/jobs", harness.url))
        .header(
            "traceparent",
            format!("00-{SUBMITTER_TRACE}-{SUBMITTER_SPAN}-01"),
        )
        .json(&json!({"workflow": "traced"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn worker_output(harness: &Harness, job: &str) -> Value {
    let job = common::get_json(&harness.http, &format!("{}/api/v1/jobs/{job}", harness.url)).await;
    job["tasks"][0]["output"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_traced_job_exports_its_span_tree_and_hands_each_attempt_its_traceparent() {
    let (endpoint, received) = otlp_receiver().await;
    let harness = Harness::start_with(&["--otlp-endpoint", &endpoint]).await;
    exports_the_span_tree(harness, &received).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_traced_job_exports_its_span_tree_on_postgres() {
    let (endpoint, received) = otlp_receiver().await;
    let Some(harness) =
        Harness::start_on_postgres_with("traces", &["--otlp-endpoint", &endpoint]).await
    else {
        return;
    };
    exports_the_span_tree(harness, &received).await;
}

/// Runs the traced workflow on `harness` (a server exporting to the receiver that fills
/// `received`) and checks what was exported and what the worker saw.
async fn exports_the_span_tree(mut harness: Harness, received: &Received) {
    harness.apply("traced", WORKFLOW).await;
    let job_id = submit_with_traceparent(&harness).await;
    // The submit request's span continues the submitter's trace, named by its route (waited
    // for before the server is killed, which would lose it).
    let submit = span_where(received, |span| span.name == "POST /api/v1/jobs").await;
    assert_eq!(hex(&submit.trace_id), SUBMITTER_TRACE);
    assert_eq!(hex(&submit.parent_span_id), SUBMITTER_SPAN);
    assert_eq!(
        attribute(&submit, "http.response.status_code"),
        Some(json!(201))
    );

    // The trace is stored with the job: a server started anew continues it.
    harness.kill_server();
    harness.start_server().await;
    harness.start_worker("tracer", "shell");
    let job = harness.wait_for_end(&job_id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");

    let job_span = span_where(received, |span| span.name == "job traced").await;
    assert_eq!(hex(&job_span.trace_id), SUBMITTER_TRACE);
    assert_eq!(hex(&job_span.parent_span_id), SUBMITTER_SPAN);
    assert_eq!(
        attribute(&job_span, "starbridge.job.id"),
        Some(json!(job_id))
    );
    assert_eq!(
        attribute(&job_span, "starbridge.job.status"),
        Some(json!("succeeded"))
    );

    let mut attempts = Vec::new();
    for attempt in [1, 2] {
        let span = span_where(received, |span| {
            span.name == format!("task work attempt {attempt}")
        })
        .await;
        assert_eq!(hex(&span.trace_id), SUBMITTER_TRACE);
        assert_eq!(
            span.parent_span_id, job_span.span_id,
            "under the job's span"
        );
        assert_eq!(attribute(&span, "starbridge.queue"), Some(json!("shell")));
        assert_eq!(attribute(&span, "starbridge.worker"), Some(json!("tracer")));
        assert_eq!(attribute(&span, "starbridge.attempt"), Some(json!(attempt)));
        assert!(span.start_time_unix_nano <= span.end_time_unix_nano);
        assert!(job_span.start_time_unix_nano <= span.start_time_unix_nano);
        attempts.push(span);
    }
    assert_eq!(
        attribute(&attempts[0], "starbridge.outcome"),
        Some(json!("failed"))
    );
    assert_eq!(
        attribute(&attempts[1], "starbridge.outcome"),
        Some(json!("succeeded"))
    );
    assert_ne!(attempts[0].span_id, attempts[1].span_id);

    // The worker's command ran under the second attempt's span: its own spans join the tree.
    let output = worker_output(&harness, &job_id).await;
    assert_eq!(
        output["traceparent"],
        format!("00-{SUBMITTER_TRACE}-{}-01", hex(&attempts[1].span_id)),
        "{output:#}"
    );

    // A token in the path: the span is named by the template, and the token shows nowhere.
    let response = harness
        .http
        .post(format!(
            "{}/api/v1/callbacks/sbc_secretvalue/complete",
            harness.url
        ))
        .json(&json!({"output": {}}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_client_error());
    let callback = span_where(received, |span| {
        span.name == "POST /api/v1/callbacks/{token}/complete"
    })
    .await;
    assert_eq!(
        attribute(&callback, "http.route"),
        Some(json!("/api/v1/callbacks/{token}/complete"))
    );
    // Spans go out in order: by now every span of the job has, each once.
    let names: Vec<String> = received
        .lock()
        .unwrap()
        .iter()
        .map(|span| span.name.clone())
        .collect();
    for name in ["job traced", "task work attempt 1", "task work attempt 2"] {
        assert_eq!(
            names.iter().filter(|seen| *seen == name).count(),
            1,
            "{name}"
        );
    }
    let everything = format!("{:?}", received.lock().unwrap());
    assert!(!everything.contains("sbc_secretvalue"));
    harness.kill_server();
}

/// A service that answers with the `traceparent` header it was sent; returns its base URL.
async fn traceparent_echo() -> String {
    let app = axum::Router::new().route(
        "/echo",
        post(|headers: axum::http::HeaderMap| async move {
            let traceparent = headers
                .get("traceparent")
                .map(|value| value.to_str().unwrap().to_owned());
            axum::Json(json!({"traceparent": traceparent}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread")]
async fn the_http_executor_sends_the_attempts_traceparent_to_the_service() {
    let (endpoint, received) = otlp_receiver().await;
    let service = traceparent_echo().await;
    let mut harness = Harness::start_with(&["--otlp-endpoint", &endpoint]).await;
    harness
        .apply(
            "called",
            &format!(
                "name: called\nsteps:\n  - id: call\n    queue: http\n    http: {{ method: POST, url: \"{service}/echo\" }}\n"
            ),
        )
        .await;
    harness.start_worker_with("caller", "http", &["--http-allow", "127.0.0.1"], &[]);
    let job_id = harness.submit("called", json!({})).await;
    let job = harness.wait_for_end(&job_id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let attempt = span_where(&received, |span| span.name == "task call attempt 1").await;
    let output = worker_output(&harness, &job_id).await;
    assert_eq!(
        output["body"]["traceparent"],
        format!("00-{}-{}-01", hex(&attempt.trace_id), hex(&attempt.span_id)),
        "{output:#}"
    );
    harness.kill_server();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported_stored_or_handed_to_workers() {
    let (endpoint, received) = otlp_receiver().await;
    // The receiver is up, but the server is not told of it.
    let mut harness = Harness::start().await;
    harness.apply("traced", WORKFLOW).await;
    harness.start_worker("untraced", "shell");
    let job_id = submit_with_traceparent(&harness).await;
    let job = harness.wait_for_end(&job_id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(
        worker_output(&harness, &job_id).await,
        json!({"traceparent": "unset"})
    );
    harness.kill_server();
    let database = rusqlite::Connection::open(harness.database()).unwrap();
    let stored: (Option<String>, Option<String>) = database
        .query_row("SELECT trace_id, span_id FROM jobs", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap();
    assert_eq!(stored, (None, None));
    assert!(received.lock().unwrap().is_empty(), "{endpoint} got spans");
}
