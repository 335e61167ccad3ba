//! Composition and control flow end to end, with the real binary as server and worker: `set`
//! and `fail` steps, `continue_on_failure` and the workflow's `output`, seen through the API
//! and the CLI.

mod common;

use serde_json::{Value, json};

use common::Harness;

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn task<'a>(job: &'a Value, step: &str) -> &'a Value {
    job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"] == step && t["kind"] != "compensation")
        .unwrap_or_else(|| panic!("no task of step {step}: {job:#}"))
}

const NOTIFY: &str = r#"
output:
  count: "${{ steps.summary.output.count }}"
  via: "${{ steps.fallback.output.via }}"
steps:
  - id: shards
    queue: shell
    command: 'echo "{\"done\": $INPUT_N}"'
    input: { n: "${{ params.n }}" }
  - id: summary
    set: { count: "${{ steps.shards.output.done }}" }
  - id: guard
    when: "${{ steps.summary.output.count == 0 }}"
    fail: { message: "no shard migrated for ${{ params.cluster }}" }
  - id: notify
    depends_on: [summary, guard]
    queue: shell
    command: 'echo "{\"retryable\": false}"; echo "pager down" >&2; exit 3'
    continue_on_failure: true
  - id: fallback
    depends_on: [notify]
    when: "${{ steps.notify.status == 'failed' }}"
    queue: shell
    command: 'echo "{\"via\": \"email\", \"why\": \"$INPUT_WHY\"}"'
    input: { why: "${{ steps.notify.error.message }}" }
"#;

#[tokio::test]
async fn set_fail_continue_on_failure_and_output_work_with_real_workers() {
    let mut h = Harness::start().await;
    h.apply("notify", NOTIFY).await;
    h.start_worker("w1", "shell");

    // The optional step fails; the fallback reads why, and the job succeeds naming it.
    let went_on = h.submit("notify", json!({"n": 3, "cluster": "eu-1"})).await;
    let job = h.wait_for_end(&went_on).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    assert_eq!(job["failed_steps"], json!(["notify"]));
    assert_eq!(job["output"], json!({"count": 3, "via": "email"}));
    assert_eq!(task(&job, "summary")["output"], json!({"count": 3}));
    assert_eq!(task(&job, "summary")["attempt"], 0, "no worker ran it");
    assert_eq!(task(&job, "guard")["status"], "skipped");
    assert_eq!(task(&job, "notify")["status"], "failed");
    let why = task(&job, "fallback")["input"]["why"].as_str().unwrap();
    assert!(why.contains("pager down"), "{why}");
    let history = h.events(&went_on).await;
    let succeeded = history
        .iter()
        .find(|e| e["kind"] == "job_succeeded")
        .unwrap();
    assert_eq!(succeeded["detail"]["failed_steps"], json!(["notify"]));
    let shown = h.cli(&["job", &went_on]);
    let shown = text(&shown);
    assert!(
        shown.contains("went on past failed steps: notify"),
        "{shown}"
    );
    assert!(
        shown.contains(r#"output    {"count":3,"via":"email"}"#),
        "{shown}"
    );

    // The guard fails the job with its message; nothing after it runs.
    let stopped = h.submit("notify", json!({"n": 0, "cluster": "eu-2"})).await;
    let job = h.wait_for_end(&stopped).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert_eq!(
        job["error"], "step guard failed: no shard migrated for eu-2",
        "{job:#}"
    );
    assert_eq!(task(&job, "guard")["error"]["kind"], "fail_step");
    assert_eq!(task(&job, "notify")["status"], "cancelled");
    assert_eq!(job["output"], Value::Null);
    assert_eq!(job["failed_steps"], json!([]));
}

#[tokio::test]
async fn each_kind_refuses_the_fields_it_does_not_take_naming_them() {
    let h = Harness::start().await;
    let response = h
        .http
        .put(format!("{}/api/v1/workflows/bad", h.url))
        .header("content-type", "application/yaml")
        .body("steps:\n- {id: stop, fail: {message: x}, continue_on_failure: true}\n- {id: s, set: {a: 1}, retry: {max_attempts: 2}}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let problem: Value = response.json().await.unwrap();
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["steps[0] (stop).continue_on_failure", "steps[1] (s).retry"],
        "{problem:#}"
    );
    let listed = h
        .http
        .get(format!("{}/api/v1/jobs?parent=nope", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 400);
    let problem: Value = listed.json().await.unwrap();
    assert_eq!(problem["errors"][0]["field"], "parent", "{problem:#}");
}

/// The shard child: its step fails (after its retries) for shard 3 and records what it does
/// and undoes in the test's folder.
const MIGRATE_SHARD: &str = r#"
params: { type: object, required: [shard] }
output: "${{ steps.work.output }}"
steps:
  - id: work
    queue: shell
    command: 'echo "do $INPUT_SHARD" >> "$E2E_DIR/log"; [ "$INPUT_SHARD" != 3 ] || exit 1; echo "{\"shard\": $INPUT_SHARD}"'
    input: { shard: "${{ params.shard }}" }
    retry: { max_attempts: 2, initial: 1s }
    compensate:
      queue: shell
      command: 'echo "undo $INPUT_SHARD" >> "$E2E_DIR/log"'
      input: { shard: "${{ params.shard }}" }
"#;

const CLUSTER: &str = r#"
steps:
  - id: prepare
    queue: shell
    command: 'echo prepare >> "$E2E_DIR/log"'
    compensate: { queue: shell, command: 'echo unprepare >> "$E2E_DIR/log"' }
  - id: per_shard
    workflow: migrate_shard
    for_each: "${{ params.shards }}"
    concurrency: 1
    input: { shard: "${{ item }}" }
"#;

fn log_lines(h: &Harness) -> Vec<String> {
    std::fs::read_to_string(h.dir.path().join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn children_of(h: &Harness, parent: &str) -> Vec<Value> {
    let page = common::get_json(
        &h.http,
        &format!("{}/api/v1/jobs?parent={parent}&limit=1000", h.url),
    )
    .await;
    page["items"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_failing_child_rolls_back_its_succeeded_siblings_in_reverse_then_the_parent() {
    let mut h = Harness::start().await;
    h.apply("migrate_shard", MIGRATE_SHARD).await;
    h.apply("provision_cluster", CLUSTER).await;
    h.start_worker("w1", "shell");
    let parent = h
        .submit("provision_cluster", json!({"shards": [1, 2, 3, 4, 5]}))
        .await;
    let job = h.wait_for_end(&parent).await;
    assert_eq!(job["status"], "failed", "{job:#}");
    assert!(
        job["error"].as_str().unwrap().contains("ended failed"),
        "{job:#}"
    );
    // Shards 1 and 2 succeeded, 3 failed after its two attempts (and undid its own partial
    // work), 4 and 5 never started; then the succeeded children were rolled back, last first,
    // and the parent's own step was undone last.
    assert_eq!(
        log_lines(&h),
        [
            "prepare",
            "do 1",
            "do 2",
            "do 3",
            "do 3",
            "undo 3",
            "undo 2",
            "undo 1",
            "unprepare"
        ]
    );
    let children = children_of(&h, &parent).await;
    assert_eq!(children.len(), 3, "{children:#?}");
    let mut statuses: Vec<(i64, String, String)> = Vec::new();
    for child in &children {
        let id = child["id"].as_str().unwrap();
        let view = common::get_json(&h.http, &format!("{}/api/v1/jobs/{id}", h.url)).await;
        assert_eq!(view["parent"]["job"], parent.as_str());
        statuses.push((
            view["params"]["shard"].as_i64().unwrap(),
            view["status"].as_str().unwrap().to_owned(),
            view["error"].as_str().unwrap_or("").to_owned(),
        ));
    }
    statuses.sort();
    assert_eq!(statuses[0].1, "cancelled");
    assert_eq!(statuses[0].2, format!("rolled back by {parent}"));
    assert_eq!(statuses[1].1, "cancelled");
    assert_eq!(statuses[2].1, "failed");
    // A child is its parent's to retry while the parent is kept.
    let retry = h
        .http
        .post(format!(
            "{}/api/v1/jobs/{}/retry",
            h.url,
            children[0]["id"].as_str().unwrap()
        ))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 409);
    let shown = text(&h.cli(&["job", &parent]));
    assert!(shown.contains("children  job_"), "{shown}");
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_children() {
    let mut h = Harness::start().await;
    h.apply(
        "slow",
        "steps:\n- {id: wait, queue: shell, command: 'sleep 30', timeout: 1m}\n",
    )
    .await;
    h.apply(
        "outer",
        "steps:\n- {id: run, workflow: slow, for_each: '${{ params.n }}'}\n",
    )
    .await;
    h.start_worker("w1", "shell");
    let parent = h.submit("outer", json!({"n": [1, 2]})).await;
    let children = children_of(&h, &parent).await;
    assert_eq!(children.len(), 2);
    let cancel = h.cli(&["cancel", &parent]);
    assert!(cancel.status.success(), "{}", text(&cancel));
    let job = h.wait_for_end(&parent).await;
    assert_eq!(job["status"], "cancelled", "{job:#}");
    for child in children {
        let child = h.wait_for_end(child["id"].as_str().unwrap()).await;
        assert_eq!(child["status"], "cancelled", "{child:#}");
        assert!(
            child["error"].is_null()
                || child["error"]
                    .as_str()
                    .unwrap()
                    .contains("cancelled by job"),
            "{child:#}"
        );
    }
}

#[tokio::test]
async fn children_survive_a_kill_9_of_the_server_none_started_twice() {
    let mut h = Harness::start().await;
    h.apply(
        "piece",
        // A poll whose claim committed but whose answer died with the server leaves a task
        // leased to a worker that never got it: it runs again once that lease lapses (10 s).
        "steps:\n- {id: work, queue: shell, command: 'echo \"$INPUT_N\" >> \"$E2E_DIR/log\"; sleep 0.2', input: {n: '${{ params.n }}'}, timeout: 10s, retry: {max_attempts: 3}}\n",
    )
    .await;
    let items: Vec<i64> = (0..20).collect();
    h.apply(
        "whole",
        "steps:\n- {id: each, workflow: piece, for_each: '${{ params.items }}', concurrency: 4, input: {n: '${{ item }}'}}\n",
    )
    .await;
    h.start_worker("w1", "shell");
    let parent = h.submit("whole", json!({"items": items})).await;
    let deadline = std::time::Instant::now() + common::STUCK;
    while log_lines(&h).len() < 6 {
        assert!(std::time::Instant::now() < deadline, "no child ran");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    h.kill_server();
    h.start_server().await;
    let job = h.wait_for_end(&parent).await;
    assert_eq!(job["status"], "succeeded", "{job:#}");
    let children = children_of(&h, &parent).await;
    assert_eq!(children.len(), 20, "one child per item, none twice");
    assert!(children.iter().all(|c| c["status"] == "succeeded"));
    let mut ran: Vec<i64> = log_lines(&h).iter().map(|l| l.parse().unwrap()).collect();
    ran.sort_unstable();
    ran.dedup();
    assert_eq!(ran, items, "every child's work ran");
}

#[tokio::test]
async fn a_child_takes_no_slot_of_a_lock_its_parent_holds() {
    let mut h = Harness::start().await;
    let locked = "lock: {key: 'db-${{ params.db }}'}\n";
    h.apply(
        "inner",
        &format!("{locked}steps:\n- {{id: work, queue: shell, command: 'echo ok'}}\n"),
    )
    .await;
    h.apply(
        "outer",
        &format!("{locked}steps:\n- {{id: run, workflow: inner}}\n"),
    )
    .await;
    h.start_worker("w1", "shell");
    let parent = h.submit("outer", json!({"db": "orders"})).await;
    let job = h.wait_for_end(&parent).await;
    assert_eq!(
        job["status"], "succeeded",
        "the parent does not wait for itself: {job:#}"
    );
    let child = &children_of(&h, &parent).await[0];
    assert_eq!(child["lock"], Value::Null, "it holds no slot of its own");
    let history = h.events(child["id"].as_str().unwrap()).await;
    assert_eq!(history[0]["detail"]["lock_held_by_ancestor"], "db-orders");
}
