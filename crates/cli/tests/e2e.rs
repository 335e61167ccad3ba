//! End to end: the real `starbridge` binary as server and as worker processes, talking HTTP on
//! loopback, with real SQLite files and real shell commands.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{BIN, Harness, STUCK, get_json, get_text};

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

fn time(value: &Value) -> starbridge_api::Timestamp {
    value
        .as_str()
        .expect("a time")
        .parse()
        .expect("an RFC 3339 time")
}

fn tasks(job: &Value) -> Vec<Value> {
    job["tasks"].as_array().unwrap().clone()
}

fn task<'a>(tasks: &'a [Value], step: &str, kind: &str) -> &'a Value {
    tasks
        .iter()
        .find(|t| t["step"] == step && t["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} task for {step}"))
}

#[tokio::test]
async fn the_example_retries_a_step_then_rolls_back_finished_steps_in_reverse() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.start_worker("w2", "shell");
    h.apply("provision_database", &example("provision.yaml"))
        .await;
    let id = h
        .submit(
            "provision_database",
            json!({"name": "orders", "fail_at_load": true}),
        )
        .await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert!(job["error"].as_str().unwrap().contains("load_data"));
    let tasks = tasks(&job);
    let create = task(&tasks, "create_db", "step");
    assert_eq!(create["status"], "succeeded");
    assert_eq!(create["attempt"], 2, "failed once, then retried");
    let runs: Vec<(u64, &str)> = create["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            (
                run["attempt"].as_u64().unwrap(),
                run["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(runs, vec![(1, "failed"), (2, "succeeded")]);
    assert!(
        create["attempts"][0]["error"]
            .as_str()
            .unwrap()
            .contains("control plane busy")
    );
    let load = task(&tasks, "load_data", "step");
    assert_eq!(load["status"], "failed");
    assert_eq!(load["attempt"], 1, "non-retryable failure is not retried");
    assert!(
        load["error"]["message"]
            .as_str()
            .unwrap()
            .contains("source snapshot is corrupt")
    );
    assert!(load["logs"]["stderr"].as_str().unwrap().contains("corrupt"));
    assert_eq!(task(&tasks, "announce", "step")["status"], "cancelled");

    // Compensations ran one at a time, newest completion first.
    let mut undo: Vec<&Value> = tasks
        .iter()
        .filter(|t| t["kind"] == "compensation")
        .collect();
    assert!(undo.iter().all(|t| t["status"] == "succeeded"));
    undo.sort_by_key(|t| time(&t["started_at"]));
    let order: Vec<&str> = undo.iter().map(|t| t["step"].as_str().unwrap()).collect();
    assert_eq!(
        order,
        vec!["configure", "configure", "create_db", "reserve"]
    );
    let undo_reserve = undo.last().unwrap();
    assert_eq!(
        undo_reserve["input"]["reservation"], "r-orders",
        "sees the undone output"
    );
    for pair in undo.windows(2) {
        assert!(time(&pair[0]["ended_at"]) <= time(&pair[1]["started_at"]));
    }
    let kinds: Vec<String> = h
        .events(&id)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("job_created"));
    assert!(kinds.contains(&"task_retry_scheduled".to_owned()));
    assert!(kinds.contains(&"job_compensating".to_owned()));
    assert_eq!(kinds.last().map(String::as_str), Some("job_failed"));
}

#[tokio::test]
async fn the_example_succeeds_passing_data_through_the_fan_out() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply("provision_database", &example("provision.yaml"))
        .await;
    let id = h
        .submit(
            "provision_database",
            json!({"name": "billing", "size_gb": 5}),
        )
        .await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let tasks = tasks(&job);
    assert_eq!(
        task(&tasks, "reserve", "step")["input"],
        json!({"name": "billing", "size_gb": 5})
    );
    assert_eq!(
        task(&tasks, "configure", "fan_out")["output"],
        json!([{"schema": "users"}, {"schema": "orders"}])
    );
    assert_eq!(task(&tasks, "load_data", "step")["input"]["schemas"], 2);
    let announce = task(&tasks, "announce", "step");
    assert_eq!(
        announce["input"],
        json!({"host": "db-billing.internal", "rows": 1000})
    );
    assert!(
        announce["logs"]["stdout"]
            .as_str()
            .unwrap()
            .contains("database ready at db-billing.internal")
    );
    assert!(tasks.iter().all(|t| t["kind"] != "compensation"));
}

#[tokio::test]
async fn parallel_branches_run_at_the_same_time() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    // Each branch waits for the other's marker: the job can only finish if both run at once.
    h.apply(
        "barrier",
        r#"
steps:
  - id: left
    queue: shell
    command: touch "$E2E_DIR/left"; while [ ! -f "$E2E_DIR/right" ]; do sleep 0.02; done
    depends_on: []
    step_timeout: 60s
  - id: right
    queue: shell
    command: touch "$E2E_DIR/right"; while [ ! -f "$E2E_DIR/left" ]; do sleep 0.02; done
    depends_on: []
    step_timeout: 60s
  - id: join
    queue: shell
    command: echo joined
    depends_on: [left, right]
"#,
    )
    .await;
    let id = h.submit("barrier", json!({})).await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
}

#[tokio::test]
async fn a_shell_step_can_ask_to_be_checked_later_without_using_attempts() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "poll_until_done",
        r#"
steps:
  - id: wait_for_copy
    queue: shell
    command: |
      n=$(cat "$E2E_DIR/checks" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$E2E_DIR/checks"
      if [ $n -lt 3 ]; then echo '{"after_ms": 50, "checked": '$n'}'; exit 75; fi
      echo '{"checks": '$n', "key": "'$STARBRIDGE_IDEMPOTENCY_KEY'"}'
"#,
    )
    .await;
    let id = h.submit("poll_until_done", json!({})).await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let step = &tasks(&job)[0];
    assert_eq!(step["attempt"], 1);
    assert_eq!(step["output"]["checks"], 3);
    let outcomes: Vec<&str> = step["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["check_later", "check_later", "succeeded"]);
    assert_eq!(
        step["output"]["key"],
        format!("{}:1", step["id"].as_str().unwrap())
    );
}

#[tokio::test]
async fn the_job_timeout_ends_the_job_timed_out_after_compensation() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "slow",
        r#"
timeout: 1s
steps:
  - id: quick
    queue: shell
    command: |
      echo '{"done": true}'
    compensate: { queue: shell, command: 'touch "$E2E_DIR/undone"' }
  - id: slow
    queue: shell
    command: sleep 3
"#,
    )
    .await;
    let id = h.submit("slow", json!({})).await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "timed_out", "{job:#}");
    assert!(
        h.dir.path().join("undone").exists(),
        "the finished step was compensated"
    );
    assert_eq!(
        task(&tasks(&job), "slow", "step")["status"],
        "succeeded",
        "a late finish is still recorded"
    );
}

const SIDE_EFFECTS: &str = r#"
steps:
  - id: one
    queue: shell
    command: echo "$STARBRIDGE_IDEMPOTENCY_KEY" >> "$E2E_DIR/effects"; sleep 0.1
    timeout: 2s
    retry: { max_attempts: 5, initial: 100ms }
  - id: two
    queue: shell
    command: echo "$STARBRIDGE_IDEMPOTENCY_KEY" >> "$E2E_DIR/effects"; sleep 0.1
    timeout: 2s
    retry: { max_attempts: 5, initial: 100ms }
"#;

fn effect_keys(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("effects"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn kill_9_of_the_server_loses_no_job_and_repeats_no_attempt() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.start_worker("w2", "shell");
    h.apply("effects", SIDE_EFFECTS).await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(h.submit("effects", json!({})).await);
    }
    // Let some work happen, then kill the server mid-run and start it again on the same file.
    while effect_keys(h.dir.path()).len() < 6 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.kill_server();
    h.start_server().await;
    for id in &ids {
        let job = h.wait_for_end(id).await;
        assert_eq!(job["status"], "succeeded", "{job:#}");
    }
    let keys = effect_keys(h.dir.path());
    let unique: HashSet<&String> = keys.iter().collect();
    assert_eq!(
        unique.len(),
        keys.len(),
        "an attempt's side effect ran twice: {keys:?}"
    );
    assert!(keys.len() >= 40);
}

#[tokio::test]
async fn kill_9_of_a_worker_is_retried_by_another_after_its_lease_lapses() {
    let mut h = Harness::start().await;
    h.apply(
        "long",
        r#"
steps:
  - id: work
    queue: shell
    command: |
      touch "$E2E_DIR/started-$STARBRIDGE_ATTEMPT"; sleep 2; echo '{"attempt": '$STARBRIDGE_ATTEMPT'}'
    timeout: 1s
    retry: { max_attempts: 3, initial: 100ms }
"#,
    )
    .await;
    let doomed = h.start_worker("doomed", "shell");
    let id = h.submit("long", json!({})).await;
    while !h.dir.path().join("started-1").exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.kill_worker(doomed);
    h.start_worker("rescuer", "shell");
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let task = &tasks(&job)[0];
    assert_eq!(task["attempt"], 2);
    assert_eq!(task["worker_id"], "rescuer");
    let runs: Vec<(&str, &str)> = task["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            (
                run["worker_id"].as_str().unwrap(),
                run["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        vec![("doomed", "lease_expired"), ("rescuer", "succeeded")]
    );
    let kinds: Vec<String> = h
        .events(&id)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        kinds.contains(&"task_lease_expired".to_owned()),
        "{kinds:?}"
    );
}

#[tokio::test]
async fn the_cli_applies_submits_watches_and_prints_json() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    let file = h.dir.path().join("hello.yaml");
    std::fs::write(
        &file,
        "steps:\n- {id: greet, queue: shell, command: 'echo \"{\\\"greeting\\\": \\\"hi $INPUT_WHO\\\"}\"'}\n",
    )
    .unwrap();
    let applied = h.cli(&["apply", file.to_str().unwrap()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&applied.stdout).trim(),
        "hello version 1 applied"
    );

    let submitted = h.cli(&["submit", "hello", "-p", "who=ops", "--watch"]);
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let stdout = String::from_utf8_lossy(&submitted.stdout);
    let id = stdout.lines().next().unwrap().trim().to_owned();
    assert!(id.starts_with("job_"), "{stdout}");
    assert!(stdout.contains("succeeded"), "{stdout}");

    let shown = h.cli(&["job", &id, "-o", "json"]);
    let job: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(job["tasks"][0]["output"], json!({"greeting": "hi ops"}));

    let listed = h.cli(&["jobs", "-o", "json"]);
    let list: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(list["items"][0]["id"], id);

    let table = h.cli(&["jobs"]);
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("ID"));

    let missing = h.cli(&["job", "job_doesnotexist"]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "one-line reason: {stderr}"
    );
    assert!(stderr.contains("not found"), "{stderr}");

    let bad = h.dir.path().join("bad.yaml");
    std::fs::write(&bad, "steps:\n- {id: a, queue: shell}\n").unwrap();
    let refused = h.cli(&["apply", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("steps[0] (a).command"));
}

#[test]
fn the_demo_runs_the_example_end_to_end_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("demo.db").display());
    let output = Command::new(BIN)
        .args(["demo", "--database", &database])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("undo reserve"), "{stdout}");
    assert!(stdout.contains("2/3"), "create_db was retried: {stdout}");
    assert!(stderr.contains("job ended failed"), "{stderr}");

    let happy = Command::new(BIN)
        .args(["demo", "--succeed"])
        .output()
        .unwrap();
    assert!(
        happy.status.success(),
        "{}",
        String::from_utf8_lossy(&happy.stderr)
    );
    assert!(String::from_utf8_lossy(&happy.stderr).contains("job ended succeeded"));
}

#[tokio::test]
async fn an_operator_fixes_the_cause_and_retries_a_failed_job_from_the_cli() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "needs_fix",
        r#"
steps:
  - id: prepare
    queue: shell
    command: echo prepared
  - id: apply
    queue: shell
    command: |
      test -f "$E2E_DIR/fixed" || { echo "config missing" >&2; exit 1; }
"#,
    )
    .await;
    let id = h.submit("needs_fix", json!({})).await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "failed");
    std::fs::write(h.dir.path().join("fixed"), "").unwrap();

    let retried = Command::new(BIN)
        .args([
            "retry",
            &id,
            "--reason",
            "restored the config",
            "--server",
            &h.url,
        ])
        .env("USER", "oncall")
        .output()
        .unwrap();
    assert!(
        retried.status.success(),
        "{}",
        String::from_utf8_lossy(&retried.stderr)
    );
    assert!(String::from_utf8_lossy(&retried.stdout).contains("running"));
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let prepare = task(&tasks(&job), "prepare", "step").clone();
    assert_eq!(prepare["attempt"], 1, "finished work is kept");
    let events = h.events(&id).await;
    let retry = events.iter().find(|e| e["kind"] == "job_retried").unwrap();
    assert_eq!(retry["detail"]["actor"], "oncall");
    assert_eq!(retry["detail"]["reason"], "restored the config");

    let again = h.cli(&["retry", &id]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("job is succeeded"));
}

#[tokio::test]
async fn an_operator_deletes_a_finished_job_from_the_cli_and_an_unfinished_one_is_refused() {
    let h = Harness::start().await;
    h.apply(
        "idle",
        "steps:\n  - {id: only, queue: nobody, command: 'true'}\n",
    )
    .await;
    let id = h.submit("idle", json!({})).await;
    let stderr =
        |output: &std::process::Output| String::from_utf8_lossy(&output.stderr).into_owned();

    let refused = h.cli(&["job", "delete", &id]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("cancel it first"),
        "{}",
        stderr(&refused)
    );
    let cancelled = h.cli(&["cancel", &id]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    let deleted = h.cli(&["job", "delete", &id]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert!(stderr(&deleted).contains(&format!("job {id} deleted")));
    let shown = h.cli(&["job", &id]);
    assert!(!shown.status.success(), "the job is gone");
    assert!(stderr(&shown).contains("not found"), "{}", stderr(&shown));
}

#[tokio::test]
async fn a_schedule_set_from_the_cli_starts_jobs_on_time() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "tick",
        "steps:\n- {id: a, queue: shell, command: echo tick}\n",
    )
    .await;
    let set = h.cli(&[
        "schedule",
        "set",
        "every-second",
        "--workflow",
        "tick",
        "--cron",
        "* * * * * *",
        "-p",
        "n=1",
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert!(String::from_utf8_lossy(&set.stdout).contains("every-second"));
    let deadline = Instant::now() + STUCK;
    let job = loop {
        let list = get_json(&h.http, &format!("{}/api/v1/jobs?workflow=tick", h.url)).await;
        if let Some(job) = list["items"].as_array().unwrap().first() {
            break job.clone();
        }
        assert!(Instant::now() < deadline, "the schedule never fired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        job["key"]
            .as_str()
            .unwrap()
            .starts_with("schedule:every-second:")
    );
    let finished = h.wait_for_end(job["id"].as_str().unwrap()).await;
    assert_eq!(finished["status"], "succeeded");
    let paused = h.cli(&["schedule", "pause", "every-second", "-o", "json"]);
    let view: Value = serde_json::from_slice(&paused.stdout).unwrap();
    assert_eq!(view["paused"], true);
    let deleted = h.cli(&["schedule", "delete", "every-second"]);
    assert!(deleted.status.success());
}

/// One request a webhook receiver got: its `Starbridge-Signature`, `Starbridge-Delivery` and
/// `Starbridge-Event` headers and its body.
type Received = (String, String, String, Vec<u8>);

/// A local HTTP receiver that answers 500 to its first request and 200 after, keeping every
/// request's headers and body.
async fn webhook_receiver() -> (String, tokio::sync::mpsc::UnboundedReceiver<Received>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let sender = sender.clone();
                let calls = calls.clone();
                async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned()
                    };
                    let _ = sender.send((
                        header("starbridge-signature"),
                        header("starbridge-delivery"),
                        header("starbridge-event"),
                        body.to_vec(),
                    ));
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, receiver)
}

#[tokio::test]
async fn a_webhook_reaches_a_local_listener_signed_and_is_retried_after_an_error() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "hello",
        "output: {greeting: '${{ steps.a.output.said }}'}\nsteps:\n- {id: a, queue: shell, command: 'echo \"{\\\"said\\\": \\\"hi\\\"}\"'}\n- {id: optional, queue: shell, command: 'exit 1', continue_on_failure: true}\n",
    )
    .await;
    let (url, mut received) = webhook_receiver().await;
    let created: Value = h
        .http
        .post(format!("{}/api/v1/webhooks", h.url))
        .json(&json!({"url": url, "workflow": "hello", "states": ["succeeded"], "secret": "0123456789abcdef-secret"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let webhook = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["secret"], "0123456789abcdef-secret");
    let id = h.submit("hello", json!({})).await;
    h.wait_for_end(&id).await;

    let mut attempts = Vec::new();
    while attempts.len() < 2 {
        let message = tokio::time::timeout(STUCK, received.recv())
            .await
            .unwrap()
            .unwrap();
        attempts.push(message);
    }
    let (signature, delivery, event, body) = &attempts[1];
    assert_eq!(delivery, &attempts[0].1, "a retry keeps its delivery id");
    assert_eq!(event, "job.status_changed");
    assert_signed(signature, "0123456789abcdef-secret", body);
    let payload: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(payload["job"]["id"], id);
    assert_eq!(payload["job"]["status"], "succeeded");
    assert_eq!(payload["job"]["previous_status"], "running");
    assert_eq!(payload["job"]["output"], json!({"greeting": "hi"}));
    assert_eq!(payload["job"]["failed_steps"], json!(["optional"]));

    let deadline = Instant::now() + STUCK;
    loop {
        let history = common::webhook_deliveries(&h.http, &h.url, &webhook).await;
        let first = &history["items"][0];
        if first["state"] == "delivered" {
            assert_eq!(first["attempts"], 2);
            assert_eq!(first["last_status"], 200);
            assert_eq!(
                history["items"].as_array().unwrap().len(),
                1,
                "only the succeeded state was asked for"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "delivery never recorded: {history}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks a `Starbridge-Signature` header as a receiver would: the HMAC of its time and the body.
fn assert_signed(signature: &str, secret: &str, body: &[u8]) {
    let t: i64 = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        signature,
        starbridge_server::signature(secret, t, body),
        "the receiver can verify the signature"
    );
}

#[tokio::test]
async fn task_events_reach_a_local_listener_with_a_valid_signature() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "flaky",
        "steps:\n- {id: prepare, queue: shell, command: 'true'}\n- {id: a, queue: shell, command: 'exit 3', depends_on: [prepare], retry: {max_attempts: 2, initial: 1s}}\n",
    )
    .await;
    let (url, mut received) = webhook_receiver().await;
    let secret = "task-events-secret-0123";
    let added = h.cli(&[
        "webhook",
        "add",
        &url,
        "--workflow",
        "flaky",
        "--event",
        "task.started",
        "--event",
        "task.retrying",
        "--event",
        "task.failed",
        "--step",
        "a",
        "--secret",
        secret,
        "-o",
        "json",
    ]);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let created: Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(
        created["events"],
        json!(["task.started", "task.retrying", "task.failed"])
    );
    assert_eq!(created["steps"], json!(["a"]));
    let id = h.submit("flaky", json!({})).await;
    assert_eq!(h.wait_for_end(&id).await["status"], "failed");

    // The first request is answered 500 and sent again: keep one of each delivery.
    let mut messages: Vec<(String, Value)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while messages.len() < 4 {
        let (signature, delivery, event, body) = tokio::time::timeout(STUCK, received.recv())
            .await
            .unwrap()
            .unwrap();
        assert_signed(&signature, secret, &body);
        if seen.insert(delivery) {
            let payload: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                payload["type"],
                event.as_str(),
                "the header names the body's type"
            );
            messages.push((event, payload));
        }
    }
    messages.sort_by_key(|(_, payload)| {
        (
            payload["at"].as_i64(),
            payload["task"]["attempt"].as_u64(),
            payload["type"] != "task.started",
        )
    });
    let seen: Vec<(&str, &Value)> = messages
        .iter()
        .map(|(event, payload)| (event.as_str(), &payload["task"]["attempt"]))
        .collect();
    assert_eq!(
        seen,
        [
            ("task.started", &json!(1)),
            ("task.retrying", &json!(1)),
            ("task.started", &json!(2)),
            ("task.failed", &json!(2)),
        ]
    );
    for (_, payload) in &messages {
        assert_eq!(payload["job"]["id"], id);
        assert_eq!(payload["task"]["step"], "a", "only the step asked for");
    }
    assert_eq!(
        messages[3].1["task"]["error"]["message"],
        messages[1].1["task"]["error"]["message"]
    );
    assert!(
        messages[3].1["task"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains('3'),
        "{}",
        messages[3].1
    );
}

/// Intervals `[start, end]` in milliseconds that shell steps appended to `$E2E_DIR/<file>`.
fn intervals(dir: &Path, file: &str) -> Vec<(u128, u128)> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (start, end) = line.split_once(' ')?;
            Some((start.parse().ok()?, end.parse().ok()?))
        })
        .collect()
}

/// The most intervals that overlap at one moment.
fn peak_overlap(intervals: &[(u128, u128)]) -> usize {
    let mut edges: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    edges.sort_by_key(|&(at, change)| (at, change)); // an end before a start at the same instant
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, change) in edges {
        now += change;
        peak = peak.max(now);
    }
    peak as usize
}

/// A step that records when it ran, in milliseconds, to `$E2E_DIR/<file>`.
fn timed_step(file: &str) -> String {
    format!(
        "      s=$(date +%s%3N); sleep 0.3; e=$(date +%s%3N); echo \"$s $e\" >> \"$E2E_DIR/{file}\"\n"
    )
}

#[tokio::test]
async fn a_serial_queue_is_observed_to_run_one_task_at_a_time() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "serialq");
    h.start_worker("w2", "serialq");
    let set = h.cli(&["queue", "set", "serialq", "--mode", "serial"]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    h.apply(
        "one_at_a_time",
        &format!(
            "steps:\n  - id: a\n    queue: serialq\n    command: |\n{}",
            timed_step("serial")
        ),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(h.submit("one_at_a_time", json!({})).await);
    }
    for id in &ids {
        assert_eq!(h.wait_for_end(id).await["status"], "succeeded");
    }
    let ran = intervals(h.dir.path(), "serial");
    assert_eq!(ran.len(), 5);
    assert_eq!(
        peak_overlap(&ran),
        1,
        "two tasks of a serial queue overlapped: {ran:?}"
    );
}

fn str_of(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// A fan-out whose queue is `agent-${{ item }}`: each host's worker (a real process serving only
/// its own queue) runs exactly its items; settings given to `agent-*` reach both queues, and the
/// CLI lists, filters and drops them.
#[tokio::test]
async fn a_fan_out_routed_to_hosts_runs_each_item_on_its_hosts_worker() {
    let mut h = Harness::start().await;
    h.start_worker("host-a", "agent-a");
    h.start_worker("host-b", "agent-b");
    let set = h.cli(&["queue", "set", "agent-*", "--mode", "serial"]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    h.apply(
        "per_host",
        "steps:\n  - id: each\n    for_each: \"${{ params.hosts }}\"\n    queue: \"agent-${{ item }}\"\n    command: echo done\n",
    )
    .await;
    let id = h
        .submit("per_host", json!({"hosts": ["a", "b", "a"]}))
        .await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let items: Vec<(String, String)> = job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|task| task["kind"] == "item")
        .map(|task| (str_of(&task["queue"]), str_of(&task["worker_id"])))
        .collect();
    assert_eq!(
        items,
        [
            ("agent-a".to_owned(), "host-a".to_owned()),
            ("agent-b".to_owned(), "host-b".to_owned()),
            ("agent-a".to_owned(), "host-a".to_owned()),
        ]
    );
    let listed = h.cli(&["queues", "--prefix", "agent-", "-o", "json"]);
    assert!(listed.status.success());
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let queues: Vec<(String, String, String)> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                str_of(&q["name"]),
                str_of(&q["mode"]),
                str_of(&q["settings_from"]),
            )
        })
        .collect();
    assert_eq!(
        queues,
        [
            ("agent-a".into(), "serial".into(), "agent-*".into()),
            ("agent-b".into(), "serial".into(), "agent-*".into()),
        ]
    );
    let unset = h.cli(&["queue", "unset", "agent-*"]);
    assert!(
        unset.status.success(),
        "{}",
        String::from_utf8_lossy(&unset.stderr)
    );
    let table = h.cli(&["queues", "--search", "AGENT-B"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|line| line.starts_with("agent-b")
                && line.contains("parallel")
                && line.contains("defaults")),
        "{table}"
    );
    assert_eq!(table.lines().count(), 2, "the header and agent-b: {table}");
}

#[tokio::test]
async fn a_lock_with_two_slots_is_observed_to_run_at_most_two_jobs() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.start_worker("w2", "shell");
    h.apply(
        "locked",
        &format!(
            "lock: {{key: 'cluster-${{{{ params.cluster }}}}', slots: 2}}\nsteps:\n  - id: a\n    queue: shell\n    command: |\n{}",
            timed_step("locked")
        ),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(h.submit("locked", json!({"cluster": "a"})).await);
    }
    for id in &ids {
        assert_eq!(h.wait_for_end(id).await["status"], "succeeded");
    }
    let ran = intervals(h.dir.path(), "locked");
    assert_eq!(ran.len(), 6);
    assert!(
        peak_overlap(&ran) <= 2,
        "more than 2 jobs held the lock: {ran:?}"
    );
    assert_eq!(
        peak_overlap(&ran),
        2,
        "the two slots were used together: {ran:?}"
    );
}

#[tokio::test]
async fn a_cron_schedule_keeps_firing_on_time_across_a_server_restart() {
    let mut h = Harness::start().await;
    h.start_worker("w1", "shell");
    h.apply(
        "beat",
        "steps:\n- {id: a, queue: shell, command: echo beat}\n",
    )
    .await;
    let set = h.cli(&[
        "schedule",
        "set",
        "heartbeat",
        "--workflow",
        "beat",
        "--cron",
        "* * * * * *",
        "--overlap",
        "allow",
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let count = |list: &Value| list["items"].as_array().map_or(0, Vec::len);
    let jobs = |h: &Harness| {
        let http = h.http.clone();
        let url = format!("{}/api/v1/jobs?workflow=beat&limit=500", h.url);
        async move { http.get(url).send().await.ok()?.json::<Value>().await.ok() }
    };
    let deadline = Instant::now() + STUCK;
    while jobs(&h).await.map_or(0, |l| count(&l)) < 2 {
        assert!(Instant::now() < deadline, "the schedule did not fire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.kill_server();
    h.start_server().await;
    let restarted = jobs(&h).await.map_or(0, |l| count(&l));
    while jobs(&h).await.map_or(0, |l| count(&l)) < restarted + 2 {
        assert!(
            Instant::now() < deadline,
            "the schedule stopped after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each job is one fire: keys are distinct and fire times one second apart.
    let list = jobs(&h).await.unwrap();
    let mut fires: Vec<i64> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| {
            let key = job["key"].as_str().unwrap();
            key.rsplit(':').next().unwrap().parse().unwrap()
        })
        .collect();
    fires.sort();
    let before = fires.len();
    fires.dedup();
    assert_eq!(fires.len(), before, "a fire created two jobs");
    assert!(
        fires.windows(2).all(|w| (w[1] - w[0]) % 1000 == 0),
        "fires on whole seconds: {fires:?}"
    );
}

/// The count of `starbridge_http_requests_total` in a `/metrics` text, over every status, of
/// the series whose labels hold `labels` (such as `route="/api/v1/tasks/poll"`).
fn requests_answered(metrics: &str, labels: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("starbridge_http_requests_total{") && line.contains(labels))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A worker with work always ready (and one slot, so no success finishes while a poll is out)
/// reports each success with the poll that takes its next task: one request per task, no
/// report request of its own, and every success committed (the jobs end).
#[tokio::test]
async fn a_busy_worker_makes_one_request_per_task_each_success_riding_on_the_next_poll() {
    let mut h = Harness::start().await;
    let steps: String = ["a", "b", "c"]
        .iter()
        .map(|step| format!("- {{id: {step}, queue: busy, command: 'true'}}\n"))
        .collect();
    h.apply("busy", &format!("steps:\n{steps}")).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(h.submit("busy", json!({})).await);
    }
    h.start_worker_with("w1", "busy", &["--concurrency", "1"], &[]);
    for id in &ids {
        assert_eq!(h.wait_for_end(id).await["status"], "succeeded");
    }
    let metrics = get_text(&h.http, &format!("{}/metrics", h.url)).await;
    let tasks = 4 * 3;
    // The last poll carried the last success and now waits for work: it is not answered yet.
    let polls = requests_answered(&metrics, "method=\"POST\",route=\"/api/v1/tasks/poll\"");
    assert_eq!(polls, tasks, "{metrics}");
    assert_eq!(
        requests_answered(&metrics, "route=\"/api/v1/tasks/"),
        polls,
        "no request but polls: {metrics}"
    );
}
