//! Durable waiting end to end, with the real binary as server and workers: a callback finished
//! by a separate process that holds no API token, a signal sent before its step waits, approval
//! and rejection from the CLI, and sleeping jobs that survive a kill -9 of the server.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{BIN, Harness, KillOnDrop, STUCK, Served, get_json, get_text};

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `POST url` with a JSON body from a separate process (curl), with no credentials; returns
/// the status and body.
fn curl_post(url: &str, body: &str) -> (u16, Value) {
    let output = Command::new("curl")
        .args(["-sS", "-X", "POST", "-H", "content-type: application/json"])
        .args(["-d", body, "-w", "\n%{http_code}", url])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let (body, status) = text.rsplit_once('\n').expect("a status line");
    (
        status.trim().parse().expect("a status"),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + STUCK;
    while !done().await {
        assert!(Instant::now() < deadline, "stuck waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_separate_process_without_a_token_finishes_a_task_through_its_callback() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("callbacks.db").display());
    let bootstrap = Command::new(BIN)
        .args(["token", "bootstrap", "--database", &database])
        .output()
        .unwrap();
    assert!(bootstrap.status.success(), "{}", text(&bootstrap));
    let admin = String::from_utf8(bootstrap.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let mut server = Command::new(BIN);
    server
        .args(["server", "--auth", "--database", &database])
        .env("STARBRIDGE_LOG", "warn");
    let served = Served::start(server);
    let url = served.url();
    let http = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {admin}").parse().unwrap(),
            )]
            .into_iter()
            .collect(),
        )
        .build()
        .unwrap();
    common::apply_yaml(
        &http,
        &url,
        "handoff",
        r#"
steps:
  - id: external
    queue: shell
    command: |
      printf '%s' "$STARBRIDGE_CALLBACK_TOKEN" > "$E2E_DIR/token"
      echo '{"timeout_ms": 600000}'
      exit 76
"#,
    )
    .await;
    let made = Command::new(BIN)
        .args([
            "token", "create", "worker", "--scope", "work", "--server", &url,
        ])
        .env("STARBRIDGE_TOKEN", &admin)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made));
    let worker_token = text(&made)
        .split_whitespace()
        .find(|word| word.starts_with("sbt_"))
        .expect("the new token")
        .to_owned();
    let _worker = KillOnDrop(
        Command::new(BIN)
            .args(["worker", "--queue", "shell", "--server", &url])
            .env("STARBRIDGE_TOKEN", &worker_token)
            .env("STARBRIDGE_LOG", "warn")
            .env("E2E_DIR", dir.path())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let id = common::submit_job(&http, &url, "handoff", json!({})).await;
    let token_file = dir.path().join("token");
    let job_url = format!("{url}/api/v1/jobs/{id}");
    wait_until("the task to await its callback", async || {
        let job = get_json(&http, &job_url).await;
        job["tasks"][0]["waiting_for"]["callback"].is_object()
    })
    .await;
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(token.starts_with("sbc_"), "{token}");
    let shown = get_text(&http, &job_url).await;
    assert!(
        !shown.contains(&token),
        "the token is shown only to the worker"
    );

    let complete = format!("{url}/api/v1/callbacks/{token}/complete");
    let (status, answer) = curl_post(&complete, r#"{"output": {"done": true}}"#);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"], "completed");
    assert_eq!(answer["job_id"], id.as_str());
    let job = get_json(&http, &job_url).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(job["tasks"][0]["output"], json!({"done": true}));

    let (status, again) = curl_post(&complete, r#"{"output": {"done": true}}"#);
    assert_eq!((status, &again), (200, &answer), "an identical repeat");
    let (status, gone) = curl_post(&complete, r#"{"output": {"done": false}}"#);
    assert_eq!(status, 410, "{gone}");
    assert_eq!(gone["type"], "/problems/gone");
    let never = format!(
        "sbc_{}_1_{}",
        job["tasks"][0]["id"].as_str().unwrap(),
        "0".repeat(64)
    );
    let (status, unknown) = curl_post(
        &format!("{url}/api/v1/callbacks/{never}/fail"),
        r#"{"error": {"message": "x"}}"#,
    );
    assert_eq!(status, 404, "{unknown}");

    let audit = Command::new(BIN)
        .args(["audit", "-o", "json", "--server", &url])
        .env("STARBRIDGE_TOKEN", &admin)
        .output()
        .unwrap();
    assert!(
        !text(&audit).contains(&token),
        "the token is not in the audit log"
    );
}

const SIGNAL_THEN_APPROVAL: &str = r#"
steps:
  - id: prepare
    queue: shell
    command: echo ready
  - id: paid
    signal: payment
  - id: ship
    approval:
      prompt: "Ship order ${{ steps.paid.output.order }}?"
"#;

#[tokio::test]
async fn a_signal_sent_early_is_kept_and_people_approve_and_reject_from_the_cli() {
    let mut h = Harness::start().await;
    h.apply("order", SIGNAL_THEN_APPROVAL).await;
    let approved = h.submit("order", json!({})).await;
    let rejected = h.submit("order", json!({})).await;

    // No worker yet: `prepare` has not run, so nothing waits for the signal.
    for (job, order) in [(&approved, 7), (&rejected, 8)] {
        let payload = json!({"order": order}).to_string();
        let sent = h.cli(&[
            "signal",
            job,
            "payment",
            "--payload",
            &payload,
            "--id",
            "pay-1",
        ]);
        assert!(sent.status.success(), "{}", text(&sent));
        assert!(
            text(&sent).contains("kept until a step waits"),
            "{}",
            text(&sent)
        );
    }
    let again = h.cli(&["signal", &approved, "payment", "--id", "pay-1"]);
    assert!(
        text(&again).contains("already received"),
        "{}",
        text(&again)
    );
    let unknown = h.cli(&["signal", &approved, "refund"]);
    assert!(!unknown.status.success());
    assert!(text(&unknown).contains("refund"), "{}", text(&unknown));

    h.start_worker("w1", "shell");
    wait_until("both approvals to be pending", async || {
        let listed = h.cli(&["approvals", "-o", "json"]);
        let list: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
        list["items"]
            .as_array()
            .is_some_and(|items| items.len() == 2)
    })
    .await;
    let listed = text(&h.cli(&["approvals"]));
    assert!(
        listed.contains("Ship order 7?") && listed.contains("Ship order 8?"),
        "{listed}"
    );

    let approve = h.cli(&["approve", &approved, "ship", "--comment", "checked"]);
    assert!(approve.status.success(), "{}", text(&approve));
    let job = h.wait_for_end(&approved).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let ship = job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == "ship")
        .unwrap();
    assert_eq!(ship["output"]["approved"], true);
    assert_eq!(ship["output"]["comment"], "checked");
    let paid = job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == "paid")
        .unwrap();
    assert_eq!(paid["output"], json!({"order": 7}));

    let reject = h.cli(&["reject", &rejected, "ship", "--comment", "no stock"]);
    assert!(reject.status.success(), "{}", text(&reject));
    let job = h.wait_for_end(&rejected).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert!(
        job["error"].as_str().unwrap().contains("no stock"),
        "{job:#}"
    );

    let twice = h.cli(&["approve", &approved, "ship"]);
    assert!(!twice.status.success());
    assert!(
        text(&twice).contains("not waiting for approval"),
        "{}",
        text(&twice)
    );
    let history = h.events(&approved).await;
    let signal = history
        .iter()
        .find(|e| e["kind"] == "signal_received")
        .unwrap();
    assert!(signal["detail"]["sender"].is_string(), "{signal:#}");
}

#[tokio::test]
async fn sleeping_jobs_all_wake_once_after_a_kill_9_of_the_server() {
    let mut h = Harness::start().await;
    h.apply("nap", "steps:\n- {id: nap, sleep: 3s}\n").await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        let jobs: Vec<Value> = (0..100).map(|_| json!({"workflow": "nap"})).collect();
        let answer: Value = h
            .http
            .post(format!("{}/api/v1/jobs/batch", h.url))
            .json(&json!({"jobs": jobs}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for item in answer["items"].as_array().unwrap() {
            ids.push(item["id"].as_str().expect("created").to_owned());
        }
    }
    assert_eq!(ids.len(), 1000);
    h.kill_server();
    h.start_server().await;
    wait_until("every job to wake", async || {
        let page = get_json(
            &h.http,
            &format!("{}/api/v1/jobs?status=succeeded&limit=1000", h.url),
        )
        .await;
        page["items"]
            .as_array()
            .is_some_and(|items| items.len() == 1000)
    })
    .await;
    let mut woken: HashMap<usize, usize> = HashMap::new();
    for id in &ids {
        let events = h.events(id).await;
        let succeeded = events
            .iter()
            .filter(|e| e["kind"] == "task_succeeded")
            .count();
        *woken.entry(succeeded).or_default() += 1;
    }
    assert_eq!(
        woken,
        HashMap::from([(1, 1000)]),
        "each sleep ends exactly once"
    );
}
