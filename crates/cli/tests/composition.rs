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
}
