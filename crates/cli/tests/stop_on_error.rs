//! A queue that stops on error (`on_error: pause`), end to end on both backends with the real
//! binary as server, shell worker and CLI: a forward task failing for good pauses its queue and
//! says why, the failing job's compensation still runs on it, other jobs' tasks wait, and a
//! resume clears the reason and lets them run.

mod common;

use serde_json::{Value, json};

use common::{Harness, get_json, succeeded};

const BREAKS: &str = r#"
steps:
  - id: prepare
    queue: deploys
    command: echo '{}'
    compensate: { queue: deploys, command: 'touch "$E2E_DIR/undone"; echo "{}"' }
  - id: work
    queue: deploys
    command: |
      echo 'the disk is full' >&2; exit 1
    retry: { max_attempts: 1 }
"#;

const FINE: &str = r#"
steps:
  - id: deploy
    queue: deploys
    command: |
      echo '{"deployed": true}'
"#;

async fn queue(h: &Harness) -> Value {
    get_json(&h.http, &format!("{}/api/v1/queues/deploys", h.url)).await
}

async fn a_failure_stops_the_queue_while_the_job_rolls_back(mut h: Harness) {
    h.apply("breaks", BREAKS).await;
    h.apply("fine", FINE).await;
    succeeded(&h.cli(&["queue", "set", "deploys", "--on-error", "pause"]));
    h.start_worker("w1", "deploys");

    let broken = h.submit("breaks", json!({})).await;
    let job = h.wait_for_end(&broken).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert!(
        h.dir.path().join("undone").exists(),
        "the compensation ran on the stopped queue"
    );
    let stopped = queue(&h).await;
    assert_eq!(stopped["paused"], true, "{stopped:#}");
    assert_eq!(stopped["on_error"], "pause");
    let reason = stopped["paused_reason"].as_str().unwrap();
    assert!(
        reason.contains(&broken) && reason.contains("(step work)"),
        "{reason}"
    );
    let listed = h.cli(&["queues"]);
    succeeded(&listed);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("stopped on error"));

    // Another job's task waits on the stopped queue, saying why.
    let waiting = h.submit("fine", json!({})).await;
    let view = get_json(&h.http, &format!("{}/api/v1/jobs/{waiting}", h.url)).await;
    assert_eq!(view["tasks"][0]["status"], "ready", "{view:#}");
    let why = view["tasks"][0]["waiting_reason"].as_str().unwrap();
    assert!(why.starts_with("queue deploys stopped on error: "), "{why}");

    succeeded(&h.cli(&["queue", "resume", "deploys"]));
    let job = h.wait_for_end(&waiting).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let resumed = queue(&h).await;
    assert_eq!(
        (&resumed["paused"], &resumed["paused_reason"]),
        (&json!(false), &Value::Null)
    );
}

on_both_backends!(a_failure_stops_the_queue_while_the_job_rolls_back);
