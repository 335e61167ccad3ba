//! An operator's requeue and fail of one task end to end, with the real binary as server, shell
//! worker and CLI: a requeue stops the running command (its heartbeat is refused, which kills
//! its process group) and the next attempt runs once; a task failed by hand makes the job
//! compensate. Each runs on SQLite and on PostgreSQL.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Harness, STUCK, get_json, succeeded};

/// Waits until `file` exists (a liveness bound, not a benchmark).
async fn wait_for_file(file: &Path) {
    let deadline = Instant::now() + STUCK;
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` has ended (gone, or a zombie waiting to be reaped).
fn ended(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn wait_until_ended(pid: &str) {
    let deadline = Instant::now() + STUCK;
    while !ended(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Once the job's `work` step runs its `sleep 60`: the sleep's pid and the task's id.
async fn running_sleep(h: &Harness, job: &str) -> (String, String) {
    let pid_file = h.dir.path().join("sleep-pid");
    wait_for_file(&pid_file).await;
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_owned();
    let view = get_json(&h.http, &format!("{}/api/v1/jobs/{job}", h.url)).await;
    let tasks = view["tasks"].as_array().unwrap();
    let task = tasks.iter().find(|t| t["step"] == "work").unwrap();
    (pid, task["id"].as_str().unwrap().to_owned())
}

/// The first attempt's command runs `sleep 60` (its pid kept in a file); later attempts finish.
const SLOW_FIRST: &str = r#"
steps:
  - id: work
    queue: shell
    command: |
      touch "$E2E_DIR/started-$STARBRIDGE_ATTEMPT"
      if [ "$STARBRIDGE_ATTEMPT" = 1 ]; then sleep 60 & echo $! > "$E2E_DIR/sleep-pid"; wait; fi
      echo '{"attempt": '$STARBRIDGE_ATTEMPT'}'
    timeout: 3s
    retry: { max_attempts: 1 }
"#;

async fn a_requeue_kills_the_running_command_and_the_next_attempt_runs_once(mut h: Harness) {
    h.apply("slow", SLOW_FIRST).await;
    h.start_worker("w1", "shell");
    let id = h.submit("slow", json!({})).await;
    let (pid, task) = running_sleep(&h, &id).await;
    // The running attempt shows its worker and start, though a claim writes no history event.
    let view = get_json(&h.http, &format!("{}/api/v1/jobs/{id}", h.url)).await;
    let runs = view["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{view:#}");
    assert_eq!(runs[0]["outcome"], "running");
    assert_eq!(runs[0]["worker_id"], "w1");
    assert!(runs[0]["started_at"].is_string(), "{view:#}");
    let history = h.events(&id).await;
    assert!(history.iter().all(|e| e["kind"] != "task_claimed"));

    succeeded(&h.cli(&["task", "requeue", &id, &task, "--reason", "host drains"]));
    wait_until_ended(&pid).await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(job["tasks"][0]["output"], json!({"attempt": 2}));
    assert!(h.dir.path().join("started-2").exists());
    assert!(
        !h.dir.path().join("started-3").exists(),
        "the next attempt ran once"
    );
    let runs: Vec<Value> = job["tasks"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["outcome"].clone())
        .collect();
    assert_eq!(runs, [json!("cancelled"), json!("succeeded")]);
    let requeued = h
        .events(&id)
        .await
        .into_iter()
        .find(|e| e["kind"] == "task_requeued")
        .expect("a task_requeued event");
    assert_eq!(requeued["detail"]["reason"], "host drains");
    assert!(requeued["detail"]["claimed_at"].is_i64(), "{requeued:#}");

    let again = h.cli(&["task", "requeue", &id, &task, "--reason", "again"]);
    assert!(!again.status.success(), "a finished task is not requeued");
}

async fn a_task_failed_by_hand_stops_its_command_and_the_job_compensates(mut h: Harness) {
    h.apply(
        "undo",
        r#"
steps:
  - id: prepare
    queue: shell
    command: echo '{}'
    compensate: { queue: shell, command: 'touch "$E2E_DIR/undone"; echo "{}"' }
  - id: work
    queue: shell
    command: |
      sleep 60 & echo $! > "$E2E_DIR/sleep-pid"; wait
    timeout: 3s
    retry: { max_attempts: 5 }
"#,
    )
    .await;
    h.start_worker("w1", "shell");
    let id = h.submit("undo", json!({})).await;
    let (pid, task) = running_sleep(&h, &id).await;

    succeeded(&h.cli(&[
        "task",
        "fail",
        &id,
        &task,
        "--message",
        "the disk is gone",
        "--reason",
        "by hand",
    ]));
    wait_until_ended(&pid).await;
    let job = h.wait_for_end(&id).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert!(h.dir.path().join("undone").exists(), "prepare was undone");
    let work = job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == "work" && t["kind"] == "step")
        .unwrap();
    assert_eq!(work["error"]["kind"], "operator");
    assert_eq!(work["error"]["message"], "the disk is gone");
    assert_eq!(work["attempt"], 1, "no retry though attempts were left");
}

on_both_backends!(
    a_requeue_kills_the_running_command_and_the_next_attempt_runs_once,
    a_task_failed_by_hand_stops_its_command_and_the_job_compensates,
);
