//! The built-in HTTP executor end to end: `http` steps run by a real `starbridge worker` against
//! a real HTTP server this test starts on loopback (which the worker is told it may reach with
//! `--http-allow 127.0.0.1`): success, a 503 retried after its `Retry-After`, a 404 failing for
//! good, a 202 + `Location` polled to completion, secrets kept out of the store and sent only to
//! their hosts, refused destinations, and the server's output size limit.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};

use common::Harness;

/// What the service saw: requests per route, and the last `Authorization` header.
#[derive(Default)]
struct Seen {
    calls: HashMap<String, usize>,
    authorization: Option<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn count(seen: &Shared, route: &str) -> usize {
    let mut seen = seen.lock().unwrap();
    let calls = seen.calls.entry(route.to_owned()).or_default();
    *calls += 1;
    *calls
}

fn calls(seen: &Shared, route: &str) -> usize {
    seen.lock().unwrap().calls.get(route).copied().unwrap_or(0)
}

/// A small service with the answers the steps need; returns its base URL.
async fn service(seen: Shared) -> String {
    let app = axum::Router::new()
        .route(
            "/hosts/{host}",
            post(
                |State(seen): State<Shared>,
                 Path(host): Path<String>,
                 headers: HeaderMap,
                 body: String| async move {
                    count(&seen, "hosts");
                    seen.lock().unwrap().authorization = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let body: Value = serde_json::from_str(&body).unwrap();
                    let echoed = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned());
                    (
                        StatusCode::CREATED,
                        axum::Json(json!({"host": host, "got": body, "echo": echoed})),
                    )
                },
            ),
        )
        .route(
            "/flaky",
            get(|State(seen): State<Shared>| async move {
                if count(&seen, "flaky") == 1 {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "1")],
                        "busy",
                    )
                        .into_response()
                } else {
                    "fine now".into_response()
                }
            }),
        )
        .route(
            "/missing",
            get(|State(seen): State<Shared>| async move {
                count(&seen, "missing");
                (StatusCode::NOT_FOUND, "no such host in the inventory")
            }),
        )
        .route(
            "/operations",
            post(|State(seen): State<Shared>| async move {
                count(&seen, "operations");
                (StatusCode::ACCEPTED, [("location", "/operations/42")], "")
            }),
        )
        .route(
            "/operations/42",
            get(|State(seen): State<Shared>| async move {
                if count(&seen, "operation") < 3 {
                    StatusCode::ACCEPTED.into_response()
                } else {
                    axum::Json(json!({"done": true})).into_response()
                }
            }),
        )
        .route(
            "/handoff",
            post(
                |State(seen): State<Shared>, Query(to): Query<HashMap<String, String>>| async move {
                    count(&seen, "handoff");
                    (StatusCode::ACCEPTED, [("location", to["to"].clone())], "")
                },
            ),
        )
        .route(
            "/status",
            get(
                |State(seen): State<Shared>, headers: HeaderMap| async move {
                    count(&seen, "status");
                    seen.lock().unwrap().authorization = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned());
                    axum::Json(json!({"ok": true}))
                },
            ),
        )
        .route("/big", get(|| async { "x".repeat(20_000) }))
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn task<'a>(job: &'a Value, step: &str) -> &'a Value {
    job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == step)
        .unwrap_or_else(|| panic!("no task of step {step}: {job:#}"))
}

async fn run(h: &Harness, name: &str, yaml: &str) -> Value {
    h.apply(name, yaml).await;
    let id = h.submit(name, json!({"host": "db-7"})).await;
    h.wait_for_end(&id).await
}

/// Runs a workflow whose job must end `failed`; the job.
async fn run_to_failure(h: &Harness, name: &str, yaml: &str) -> Value {
    let job = run(h, name, yaml).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    job
}

#[tokio::test]
async fn http_steps_succeed_retry_after_retry_after_fail_for_good_and_poll_a_202() {
    let mut h = Harness::start().await;
    let seen = Shared::default();
    let base = service(seen.clone()).await;
    h.start_worker_with("http-1", "http", &["--http-allow", "127.0.0.1"], &[]);

    let job = run(
        &h,
        "register",
        &format!(
            r#"
steps:
  - id: register_host
    queue: http
    http:
      method: POST
      url: "{base}/hosts/${{{{ params.host }}}}"
      body: {{ host: "${{{{ params.host }}}}", size: 5 }}
      success: [201]
"#
        ),
    )
    .await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let output = &task(&job, "register_host")["output"];
    assert_eq!(output["status"], 201);
    assert_eq!(output["body"]["got"], json!({"host": "db-7", "size": 5}));
    assert_eq!(output["headers"]["content-type"], "application/json");

    let job = run(
        &h,
        "flaky",
        &format!(
            "steps:\n  - id: ping\n    queue: http\n    http: {{ url: \"{base}/flaky\" }}\n    retry: {{ max_attempts: 3, initial: 10ms }}\n"
        ),
    )
    .await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let ping = task(&job, "ping");
    assert_eq!(ping["attempt"], 2, "the 503 was retried once");
    assert_eq!(ping["output"]["body"], "fine now");
    let history = h.events(job["id"].as_str().unwrap()).await;
    let scheduled = history
        .iter()
        .find(|e| e["kind"] == "task_retry_scheduled")
        .expect("a retry was scheduled");
    assert!(
        scheduled["detail"]["delay_ms"].as_u64().unwrap() >= 1000,
        "Retry-After: 1 is longer than the 10ms backoff, so it sets the delay: {scheduled:#}"
    );

    let job = run_to_failure(
        &h,
        "missing",
        &format!(
            "steps:\n  - id: look\n    queue: http\n    http: {{ url: \"{base}/missing\" }}\n    retry: {{ max_attempts: 3, initial: 10ms }}\n"
        ),
    )
    .await;
    let look = task(&job, "look");
    assert_eq!(look["attempt"], 1, "a 404 is not retried");
    let message = look["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("404") && message.contains("no such host in the inventory"),
        "{message}"
    );
    assert_eq!(calls(&seen, "missing"), 1);

    let job = run(
        &h,
        "provision",
        &format!(
            "steps:\n  - id: provision\n    queue: http\n    http: {{ method: POST, url: \"{base}/operations\" }}\n    poll_interval: 50ms\n"
        ),
    )
    .await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let provision = task(&job, "provision");
    assert_eq!(provision["output"]["status"], 200);
    assert_eq!(provision["output"]["body"], json!({"done": true}));
    assert_eq!(provision["attempt"], 1, "polling used no attempt");
    assert_eq!(calls(&seen, "operations"), 1, "the request was sent once");
    assert_eq!(
        calls(&seen, "operation"),
        3,
        "the Location was polled to completion"
    );
}

#[tokio::test]
async fn secrets_reach_only_their_hosts_and_never_the_jobs_views() {
    let mut h = Harness::start().await;
    let seen = Shared::default();
    let base = service(seen.clone()).await;
    let secrets = h.dir.path().join("secrets.yaml");
    std::fs::write(
        &secrets,
        "CMDB_TOKEN: {env: E2E_CMDB_TOKEN, hosts: [127.0.0.1]}\nOTHER_TOKEN: {env: E2E_OTHER_TOKEN, hosts: [cmdb.internal]}\n",
    )
    .unwrap();
    let value = "tok-7f3a9c-s3cr3t";
    h.start_worker_with(
        "http-1",
        "http",
        &[
            "--http-allow",
            "127.0.0.1",
            "--secrets",
            secrets.to_str().unwrap(),
        ],
        &[
            ("E2E_CMDB_TOKEN", value),
            ("E2E_OTHER_TOKEN", "other-s3cr3t"),
        ],
    );

    let job = run(
        &h,
        "with-secret",
        &format!(
            r#"
steps:
  - id: register_host
    queue: http
    http:
      method: POST
      url: "{base}/hosts/${{{{ params.host }}}}"
      headers: {{ Authorization: "Bearer ${{{{ secrets.CMDB_TOKEN }}}}" }}
      body: {{ host: "${{{{ params.host }}}}" }}
"#
        ),
    )
    .await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(
        seen.lock().unwrap().authorization.as_deref(),
        Some(format!("Bearer {value}").as_str()),
        "the service got the secret"
    );
    let step = task(&job, "register_host");
    assert_eq!(
        step["input"]["headers"]["Authorization"], "Bearer ${{ secrets.CMDB_TOKEN }}",
        "the job shows only the reference"
    );
    assert_eq!(
        step["output"]["body"]["echo"], "Bearer [secret CMDB_TOKEN]",
        "a value echoed back is replaced before it is reported"
    );
    let id = job["id"].as_str().unwrap();
    let history = h.events(id).await;
    for shown in [job.to_string(), json!(history).to_string()] {
        assert!(!shown.contains(value), "the value leaked: {shown}");
    }

    let before = calls(&seen, "hosts");
    let job = run_to_failure(
        &h,
        "wrong-host",
        &format!(
            "steps:\n  - id: leak\n    queue: http\n    http: {{ method: POST, url: \"{base}/hosts/x\", headers: {{ X-Key: \"${{{{ secrets.OTHER_TOKEN }}}}\" }} }}\n"
        ),
    )
    .await;
    let message = task(&job, "leak")["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("secret OTHER_TOKEN may not be sent to 127.0.0.1"),
        "{message}"
    );
    assert!(!job.to_string().contains("other-s3cr3t"));
    assert_eq!(calls(&seen, "hosts"), before, "nothing was sent");

    // A Location on another origin (another port of the same host) is polled without the
    // headers that hold a secret.
    let elsewhere = Shared::default();
    let other = service(elsewhere.clone()).await;
    let job = run(
        &h,
        "handoff",
        &format!(
            "steps:\n  - id: handoff\n    queue: http\n    http: {{ method: POST, url: \"{base}/handoff?to={other}/status\", headers: {{ Authorization: \"Bearer ${{{{ secrets.CMDB_TOKEN }}}}\", X-Trace: t-1 }} }}\n    poll_interval: 50ms\n"
        ),
    )
    .await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(task(&job, "handoff")["output"]["body"], json!({"ok": true}));
    assert_eq!(calls(&elsewhere, "status"), 1);
    assert_eq!(
        elsewhere.lock().unwrap().authorization,
        None,
        "the secret header stayed on its origin"
    );
}

#[tokio::test]
async fn refused_destinations_and_oversized_answers_fail_for_good_without_retries() {
    let mut h = Harness::start_with(&["--max-task-bytes", "4096"]).await;
    let seen = Shared::default();
    let base = service(seen.clone()).await;
    h.start_worker_with("open", "http", &["--http-allow", "127.0.0.1"], &[]);
    h.start_worker("strict", "strict");

    let job = run_to_failure(
        &h,
        "metadata",
        "steps:\n  - id: steal\n    queue: http\n    http: { url: \"http://169.254.169.254/latest/meta-data/\" }\n    retry: { max_attempts: 3 }\n",
    )
    .await;
    let steal = task(&job, "steal");
    assert_eq!(steal["attempt"], 1);
    let message = steal["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("169.254.169.254 is a cloud metadata service's address"),
        "{message}"
    );

    let job = run_to_failure(
        &h,
        "loopback",
        &format!(
            "steps:\n  - id: local\n    queue: strict\n    http: {{ url: \"{base}/missing\" }}\n"
        ),
    )
    .await;
    let message = task(&job, "local")["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("loopback") && message.contains("--http-allow"),
        "{message}"
    );
    assert_eq!(calls(&seen, "missing"), 0, "a refused request is not sent");

    let job = run_to_failure(
        &h,
        "big",
        &format!("steps:\n  - id: big\n    queue: http\n    http: {{ url: \"{base}/big\" }}\n"),
    )
    .await;
    let big = task(&job, "big");
    assert_eq!(big["attempt"], 1);
    let message = big["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_task_bytes"), "{message}");
}
