//! API surface tests: the router driven in-process (no socket) over a real SQLite file.

mod common;

use axum::http::StatusCode;
use serde_json::{Value, json};

use common::Api;

fn api() -> Api {
    Api::start()
}

/// The status, content type and JSON body of a request with a JSON body.
trait Calls {
    async fn call(&self, method: &str, uri: &str, body: &str) -> (StatusCode, String, Value);
}

impl Calls for Api {
    async fn call(&self, method: &str, uri: &str, body: &str) -> (StatusCode, String, Value) {
        let answer = self.send_json(method, uri, body).await;
        (answer.status, answer.content_type.clone(), answer.json())
    }
}

const WORKFLOW: &str = "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c}\n";

#[tokio::test]
async fn malformed_json_body_is_a_problem_naming_line_and_column() {
    let api = api();
    let (status, content_type, problem) = api.call("POST", "/api/v1/jobs", "{\"workflow\": ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(problem["errors"][0]["field"], "body");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("line 1 column"),
        "{problem}"
    );
}

#[tokio::test]
async fn unknown_request_field_is_named() {
    let api = api();
    let (status, _, problem) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "x", "parms": {}}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        problem["detail"].as_str().unwrap().contains("parms"),
        "{problem}"
    );
}

#[tokio::test]
async fn malformed_yaml_definition_reports_line_and_column() {
    let api = api();
    let (status, _, problem) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "steps:\n  - id: a\n   queue: [\n",
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        problem["errors"][0]["field"]
            .as_str()
            .unwrap()
            .starts_with("line "),
        "{problem}"
    );
}

#[tokio::test]
async fn invalid_definition_names_step_and_field() {
    let api = api();
    let (status, _, problem) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "steps:\n- {id: a, queue: q, command: c, timeout: soon}\n",
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["field"], "steps[0] (a).timeout");
}

/// The first problem of a 422 problem document, as (field, message).
#[track_caller]
fn first_problem(status: StatusCode, content_type: &str, problem: &Value) -> (String, String) {
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(content_type, "application/problem+json");
    let first = &problem["errors"][0];
    (
        first["field"].as_str().unwrap_or_default().to_owned(),
        first["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn definition_type_errors_name_the_field_in_yaml_and_inline_json() {
    let api = api();
    let (status, content_type, problem) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "steps:\n- {id: a, queue: q, command: [c]}\n",
        )
        .await;
    let (field, message) = first_problem(status, &content_type, &problem);
    assert_eq!(field, "steps[0] (a).command");
    assert_eq!(message, "invalid type: sequence, expected a string");
    let inline = json!({"definition": {"name": "wf", "steps": [{"id": "a", "queue": "q", "command": false}]}});
    let (status, content_type, problem) =
        api.call("POST", "/api/v1/jobs", &inline.to_string()).await;
    let (field, message) = first_problem(status, &content_type, &problem);
    assert_eq!(field, "steps[0] (a).command");
    assert_eq!(message, "invalid type: boolean `false`, expected a string");
}

#[tokio::test]
async fn a_step_lock_or_rate_that_does_not_fit_is_refused_naming_the_field() {
    let api = api();
    for (yaml, expected_field, expected) in [
        (
            "steps:\n- {id: a, sleep: 1m, lock: {key: k}}\n",
            "steps[0] (a).lock",
            "only a step a worker runs",
        ),
        (
            "steps:\n- {id: a, queue: q, command: c, rate: {key: k, limit: 10/soon}}\n",
            "steps[0] (a).rate.limit",
            "soon",
        ),
        (
            "steps:\n- {id: a, queue: q, command: c, lock: {key: '${{ item }}'}}\n",
            "steps[0] (a).lock.key",
            "item",
        ),
    ] {
        let (status, content_type, problem) = api.call("PUT", "/api/v1/workflows/wf", yaml).await;
        let (field, message) = first_problem(status, &content_type, &problem);
        assert_eq!(field, expected_field, "{problem}");
        assert!(message.contains(expected), "{message}");
    }
    let (status, _, body) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "steps:\n- {id: a, queue: q, command: c, lock: {key: k, slots: 2}, rate: {key: k, limit: 10/1m}}\n",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn yaml_no_and_y_are_commands_not_booleans() {
    let api = api();
    let (status, _, body) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "steps:\n- {id: a, queue: q, command: no}\n- {id: b, queue: q, command: y}\n",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, _, body) = api.call("GET", "/api/v1/workflows/wf", "").await;
    assert_eq!(body["definition"]["steps"][0]["command"], "no");
    assert_eq!(body["definition"]["steps"][1]["command"], "y");
}

#[tokio::test]
async fn a_params_schema_of_false_is_refused_at_apply_and_inline() {
    let api = api();
    let (status, content_type, problem) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "params: false\nsteps:\n- {id: a, queue: q, command: c}\n",
        )
        .await;
    let (field, message) = first_problem(status, &content_type, &problem);
    assert_eq!(field, "params");
    assert!(message.contains("accepts no params"), "{message}");
    let inline = json!({"definition": {"name": "wf", "params": false, "steps": [{"id": "a", "queue": "q", "command": "c"}]}});
    let (status, content_type, problem) =
        api.call("POST", "/api/v1/jobs", &inline.to_string()).await;
    let (field, _) = first_problem(status, &content_type, &problem);
    assert_eq!(field, "params");
    let (status, _, _) = api.call("GET", "/api/v1/workflows/wf", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_constant_expression_that_cannot_be_evaluated_is_refused_at_apply() {
    let api = api();
    let (status, content_type, problem) = api
        .call(
            "PUT",
            "/api/v1/workflows/wf",
            "steps:\n- {id: a, queue: q, command: c, when: '${{ params.n + 1 / 0 }}'}\n",
        )
        .await;
    let (field, message) = first_problem(status, &content_type, &problem);
    assert_eq!(field, "steps[0] (a).when");
    assert_eq!(message, "division by zero at column 18");
}

#[tokio::test]
async fn apply_twice_returns_created_then_unchanged() {
    let api = api();
    let (status, _, body) = api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["version"], 1);
    let (status, _, body) = api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["created"], false);
    let (status, _, body) = api.call("GET", "/api/v1/workflows/wf", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["definition"]["steps"][0]["id"], "a");
}

#[tokio::test]
async fn submit_with_a_key_is_idempotent_200_then() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let request = r#"{"workflow": "wf", "params": {"n": 1}, "key": "k-1"}"#;
    let (first, _, job) = api.call("POST", "/api/v1/jobs", request).await;
    let (second, _, again) = api.call("POST", "/api/v1/jobs", request).await;
    assert_eq!(first, StatusCode::CREATED);
    assert_eq!(second, StatusCode::OK);
    assert_eq!(job["id"], again["id"]);
    assert_eq!(job["tasks"][0]["status"], "ready");
    assert_eq!(job["tasks"][0]["max_attempts"], 1);
}

#[tokio::test]
async fn unknown_job_and_malformed_id_are_404_problems() {
    let api = api();
    let (status, content_type, _) = api.call("GET", "/api/v1/jobs/job_0000", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(content_type, "application/problem+json");
    let (status, _, _) = api.call("GET", "/api/v1/jobs/nonsense", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn only_a_finished_job_is_deleted_and_its_key_is_free_again() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let (status, _, _) = api.call("DELETE", "/api/v1/jobs/job_0000", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let request = r#"{"workflow": "wf", "key": "k-1"}"#;
    let (_, _, job) = api.call("POST", "/api/v1/jobs", request).await;
    let uri = format!("/api/v1/jobs/{}", job["id"].as_str().unwrap());

    let (status, content_type, problem) = api.call("DELETE", &uri, "").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(content_type, "application/problem+json");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("is running") && detail.contains("cancel it first"),
        "{problem}"
    );
    api.call("POST", &format!("{uri}/cancel"), "").await;
    let (status, _, _) = api.call("DELETE", &uri, "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = api.call("GET", &uri, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, again) = api.call("POST", "/api/v1/jobs", request).await;
    assert_eq!(status, StatusCode::CREATED, "the key makes a new job");
    assert_ne!(again["id"], job["id"]);
}

#[tokio::test]
async fn a_workflow_is_deleted_once_no_job_could_run_it_and_is_applied_again_as_a_new_version() {
    let api = api();
    let (status, _, _) = api.call("DELETE", "/api/v1/workflows/wf", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let (_, _, job) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let job = format!("/api/v1/jobs/{}", job["id"].as_str().unwrap());

    let (status, content_type, problem) = api.call("DELETE", "/api/v1/workflows/wf", "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(content_type, "application/problem+json");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("still in use") && detail.contains("1 job(s) not succeeded"),
        "{problem}"
    );
    api.call("POST", &format!("{job}/cancel"), "").await;
    api.call("DELETE", &job, "").await;
    let (status, _, _) = api.call("DELETE", "/api/v1/workflows/wf", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let (_, _, list) = api.call("GET", "/api/v1/workflows", "").await;
    assert_eq!(list["items"], serde_json::json!([]));
    let (status, _, _) = api.call("GET", "/api/v1/workflows/wf", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, kept) = api.call("GET", "/api/v1/workflows/wf?version=1", "").await;
    assert_eq!(
        (status, &kept["version"]),
        (StatusCode::OK, &serde_json::json!(1))
    );
    let (status, _, _) = api
        .call(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "wf", "version": 1}"#,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a deleted workflow runs no job"
    );
    let (status, _, applied) = api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(applied["version"], 2);
}

/// Applies `WORKFLOW` as `wf` and submits three jobs of it; their ids, oldest first.
async fn three_jobs_of_wf(api: &Api) -> Vec<String> {
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (_, _, job) = api
            .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
            .await;
        ids.push(job["id"].as_str().unwrap().to_owned());
    }
    ids
}

#[tokio::test]
async fn a_bulk_delete_deletes_the_finished_jobs_it_selects_and_lists_the_others() {
    let api = api();
    let ids = three_jobs_of_wf(&api).await;
    for id in &ids[..2] {
        api.call("POST", &format!("/api/v1/jobs/{id}/cancel"), "")
            .await;
    }
    let (status, _, result) = api
        .call("POST", "/api/v1/jobs/bulk/delete", r#"{"workflow": "wf"}"#)
        .await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(
        (result["matched"].as_u64(), result["affected"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(result["refused"][0]["id"], ids[2].as_str());
    assert!(
        result["refused"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("cancel it first"),
        "{result}"
    );
    for (id, status) in
        ids.iter()
            .zip([StatusCode::NOT_FOUND, StatusCode::NOT_FOUND, StatusCode::OK])
    {
        let (answer, _, _) = api.call("GET", &format!("/api/v1/jobs/{id}"), "").await;
        assert_eq!(answer, status, "{id}");
    }
}

#[tokio::test]
async fn list_filters_are_validated() {
    let api = api();
    let (status, _, problem) = api.call("GET", "/api/v1/jobs?status=done", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "status");
    assert!(problem["detail"].as_str().unwrap().contains("succeeded"));
    let (status, _, problem) = api.call("GET", "/api/v1/jobs?limit=0", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "limit");
}

#[tokio::test]
async fn jobs_list_pages_with_a_cursor() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    for _ in 0..5 {
        api.call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
            .await;
    }
    let (_, _, page) = api.call("GET", "/api/v1/jobs?limit=3", "").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 3);
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, _, rest) = api
        .call("GET", &format!("/api/v1/jobs?limit=3&cursor={cursor}"), "")
        .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2);
    assert!(rest["next_cursor"].is_null());
    let (_, _, exact) = api.call("GET", "/api/v1/jobs?limit=5", "").await;
    assert_eq!(exact["items"].as_array().unwrap().len(), 5);
    assert!(
        exact["next_cursor"].is_null(),
        "a full last page has no next page"
    );
}

#[tokio::test]
async fn poll_input_is_validated_naming_the_field() {
    let api = api();
    let (status, _, problem) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": []}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "queues");
    let (_, _, problem) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"], "wait_ms": 999999}"#,
        )
        .await;
    assert_eq!(problem["errors"][0]["field"], "wait_ms");
}

#[tokio::test]
async fn a_long_poll_answers_when_a_task_becomes_ready() {
    let api = std::sync::Arc::new(api());
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let poller = api.clone();
    let started = std::time::Instant::now();
    let poll = tokio::spawn(async move {
        let poll = r#"{"worker_id": "w", "queues": ["q"], "wait_ms": 60000}"#;
        poller.call("POST", "/api/v1/tasks/poll", poll).await.2
    });
    // The poll is waiting (nothing is ready yet); submitting makes a task ready.
    tokio::task::yield_now().await;
    api.call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let response = poll.await.unwrap();
    assert_eq!(response["tasks"].as_array().unwrap().len(), 1, "{response}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the poll answered before its deadline"
    );
}

#[tokio::test]
async fn a_report_with_a_stale_lease_token_is_409_and_changes_nothing() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let (_, _, job) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let (_, _, polled) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"]}"#,
        )
        .await;
    let task = &polled["tasks"][0];
    let id = task["id"].as_str().unwrap();
    let (status, _, problem) = api
        .call(
            "POST",
            &format!("/api/v1/tasks/{id}/complete"),
            &json!({"lease_token": "not-the-token", "output": {}}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(problem["detail"].as_str().unwrap().contains("lease token"));
    let (status, _, done) = api
        .call(
            "POST",
            &format!("/api/v1/tasks/{id}/complete"),
            &json!({"lease_token": task["lease_token"], "output": {"ok": true}}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["task_status"], "succeeded");
    let (_, _, events) = api
        .call(
            "GET",
            &format!("/api/v1/jobs/{}/events", job["id"].as_str().unwrap()),
            "",
        )
        .await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "task_succeeded").count(), 1);
    drop(api.engine);
}

#[tokio::test]
async fn health_reports_the_database() {
    let api = api();
    let (status, _, body) = api.call("GET", "/healthz", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["database"], "ok");
}

async fn poll_one(api: &Api) -> Value {
    let (_, _, polled) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"]}"#,
        )
        .await;
    polled["tasks"][0].clone()
}

async fn report(api: &Api, task: &Value, outcome: &str, body: Value) -> StatusCode {
    let mut body = body;
    body["lease_token"] = task["lease_token"].clone();
    let id = task["id"].as_str().unwrap();
    api.call(
        "POST",
        &format!("/api/v1/tasks/{id}/{outcome}"),
        &body.to_string(),
    )
    .await
    .0
}

#[tokio::test]
async fn pause_holds_dispatch_and_resume_releases_it_recording_who_and_why() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let (_, _, job) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let id = job["id"].as_str().unwrap();
    let response = api
        .send(
            "POST",
            &format!("/api/v1/jobs/{id}/pause"),
            &[
                ("starbridge-actor", "alice"),
                ("content-type", "application/json"),
            ],
            r#"{"reason": "maintenance window"}"#,
        )
        .await;
    assert_eq!(response.status, StatusCode::OK);
    let (_, _, polled) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"]}"#,
        )
        .await;
    assert_eq!(
        polled["tasks"].as_array().unwrap().len(),
        0,
        "a paused job dispatches nothing"
    );
    let (status, _, problem) = api
        .call("POST", &format!("/api/v1/jobs/{id}/pause"), "")
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("only a running job")
    );
    let (status, _, resumed) = api
        .call("POST", &format!("/api/v1/jobs/{id}/resume"), "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(resumed["status"], "running");
    assert_eq!(poll_one(&api).await["step"], "a");
    let (_, _, events) = api
        .call("GET", &format!("/api/v1/jobs/{id}/events"), "")
        .await;
    let paused = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "job_paused")
        .unwrap()
        .clone();
    assert_eq!(paused["detail"]["actor"], "alice");
    assert_eq!(paused["detail"]["reason"], "maintenance window");
}

#[tokio::test]
async fn retry_skip_and_rerun_move_a_finished_job_again() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let (_, _, job) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let id = job["id"].as_str().unwrap().to_owned();
    let a = poll_one(&api).await;
    let failed = json!({"error": {"message": "disk full", "retryable": false}});
    assert_eq!(report(&api, &a, "fail", failed).await, StatusCode::OK);
    let (_, _, job) = api.call("GET", &format!("/api/v1/jobs/{id}"), "").await;
    assert_eq!(job["status"], "failed");

    let (status, _, job) = api
        .call("POST", &format!("/api/v1/jobs/{id}/retry"), "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["status"], "running");
    let a = poll_one(&api).await;
    assert_eq!(a["attempt"], 2);
    let failed = json!({"error": {"message": "disk full", "retryable": false}});
    report(&api, &a, "fail", failed).await;

    let a_id = a["id"].as_str().unwrap();
    let (status, _, job) = api
        .call(
            "POST",
            &format!("/api/v1/jobs/{id}/tasks/{a_id}/skip"),
            r#"{"output": {"fixed": "by hand"}, "reason": "cleaned the disk"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["tasks"][0]["status"], "succeeded");
    assert_eq!(job["tasks"][0]["output"], json!({"fixed": "by hand"}));
    let b = poll_one(&api).await;
    assert_eq!(b["step"], "b");
    report(&api, &b, "complete", json!({"output": {}})).await;
    let (_, _, job) = api.call("GET", &format!("/api/v1/jobs/{id}"), "").await;
    assert_eq!(job["status"], "succeeded");

    let (status, _, problem) = api
        .call(
            "POST",
            &format!("/api/v1/jobs/{id}/rerun"),
            r#"{"step": "nope"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("no step 'nope'")
    );
    let (status, _, job) = api
        .call(
            "POST",
            &format!("/api/v1/jobs/{id}/rerun"),
            r#"{"step": "b"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        job["tasks"][0]["status"], "succeeded",
        "upstream work is kept"
    );
    assert_eq!(job["tasks"][1]["status"], "ready");
}

#[tokio::test]
async fn operator_actions_validate_their_input() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let (_, _, job) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let id = job["id"].as_str().unwrap();
    let (status, _, problem) = api
        .call(
            "POST",
            &format!("/api/v1/jobs/{id}/cancel"),
            r#"{"compensate": "yes"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "body");
    let (status, _, _) = api
        .call(
            "POST",
            &format!("/api/v1/jobs/{id}/pause?namespace=other"),
            "",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another namespace's job is not found"
    );
    let (status, _, problem) = api
        .call("POST", &format!("/api/v1/jobs/{id}/rerun"), "{}")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(problem["detail"].as_str().unwrap().contains("step"));
    let (status, _, job) = api
        .call(
            "POST",
            &format!("/api/v1/jobs/{id}/cancel"),
            r#"{"reason": "not needed"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["status"], "cancelled");
}

#[tokio::test]
async fn queues_are_listed_configured_paused_and_resumed() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    api.call("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
        .await;
    let (status, _, queue) = api
        .call(
            "PUT",
            "/api/v1/queues/q",
            r#"{"mode": "serial", "priority": 3, "max_wait": "1m"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(queue["mode"], "serial");
    assert_eq!(queue["max_wait_ms"], 60_000);
    assert_eq!(queue["ready"], 1);
    let (_, _, limited) = api
        .call("PUT", "/api/v1/queues/q", r#"{"concurrency": 4}"#)
        .await;
    assert_eq!(limited["concurrency"], 4);
    assert_eq!(limited["mode"], "serial", "unnamed settings stay");
    let (_, _, unlimited) = api
        .call("PUT", "/api/v1/queues/q", r#"{"concurrency": null}"#)
        .await;
    assert!(unlimited["concurrency"].is_null());

    let (status, _, paused) = api.call("POST", "/api/v1/queues/q/pause", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(paused["paused"], true);
    let (_, _, polled) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"]}"#,
        )
        .await;
    assert!(polled["tasks"].as_array().unwrap().is_empty());
    api.call("POST", "/api/v1/queues/q/resume", "").await;
    assert_eq!(poll_one(&api).await["step"], "a");

    let (_, _, list) = api.call("GET", "/api/v1/queues", "").await;
    assert_eq!(list["items"][0]["name"], "q");
    assert_eq!(list["items"][0]["running"], 1);
    let (status, _, problem) = api
        .call("PUT", "/api/v1/queues/q", r#"{"mode": "fifo"}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "mode");
    let (status, _, _) = api.call("GET", "/api/v1/queues/nope", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn schedules_are_created_listed_paused_resumed_and_deleted() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let request = r#"{"workflow": "wf", "cron": "0 3 * * *", "timezone": "Europe/Paris",
        "params": {"n": 1}, "overlap": "queue_one", "catch_up": {"policy": "all", "limit": 2}}"#;
    let (status, _, created) = api.call("PUT", "/api/v1/schedules/nightly", request).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["next_fires"].as_array().unwrap().len(), 5);
    assert_eq!(created["catch_up"], json!({"policy": "all", "limit": 2}));
    let (status, _, _) = api.call("PUT", "/api/v1/schedules/nightly", request).await;
    assert_eq!(status, StatusCode::OK, "replacing is 200");

    let (status, _, problem) = api
        .call(
            "PUT",
            "/api/v1/schedules/bad",
            r#"{"workflow": "wf", "cron": "0 25 * * *"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["field"], "cron");
    let (status, _, problem) = api
        .call(
            "PUT",
            "/api/v1/schedules/bad",
            r#"{"workflow": "wf", "cron": "@daily", "overlap": "never"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "overlap");

    let (_, _, paused) = api
        .call("POST", "/api/v1/schedules/nightly/pause", "")
        .await;
    assert_eq!(paused["paused"], true);
    assert!(paused["next_fires"].as_array().unwrap().is_empty());
    let (_, _, resumed) = api
        .call("POST", "/api/v1/schedules/nightly/resume", "")
        .await;
    assert_eq!(resumed["next_fires"].as_array().unwrap().len(), 5);
    let (_, _, list) = api.call("GET", "/api/v1/schedules", "").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (status, _, _) = api.call("DELETE", "/api/v1/schedules/nightly", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = api.call("GET", "/api/v1/schedules/nightly", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_waiting_job_and_task_say_why() {
    let api = api();
    api.call(
        "PUT",
        "/api/v1/workflows/locked",
        "lock: {key: 'db-${{ params.db }}', slots: 1}\nsteps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c}\n",
    )
    .await;
    let (_, _, first) = api
        .call(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "locked", "params": {"db": "main"}}"#,
        )
        .await;
    assert_eq!(
        first["tasks"][0]["waiting_reason"],
        "no worker has polled queue q since the server started"
    );
    assert_eq!(first["tasks"][1]["waiting_reason"], "waiting for a");
    let (_, _, second) = api
        .call(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "locked", "params": {"db": "main"}}"#,
        )
        .await;
    assert_eq!(second["status"], "queued");
    assert_eq!(second["lock"], "db-main");
    assert_eq!(
        second["waiting_reason"],
        "waiting for lock db-main (1/1 held)"
    );

    api.call("POST", "/api/v1/queues/q/pause", "").await;
    let id = first["id"].as_str().unwrap();
    let (_, _, paused) = api.call("GET", &format!("/api/v1/jobs/{id}"), "").await;
    assert_eq!(paused["tasks"][0]["waiting_reason"], "queue q paused");
    api.call("POST", "/api/v1/queues/q/resume", "").await;
    api.call(
        "POST",
        "/api/v1/tasks/poll",
        r#"{"worker_id": "w", "queues": ["other"]}"#,
    )
    .await;
    let (_, _, polled) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"], "max_tasks": 1}"#,
        )
        .await;
    assert_eq!(polled["tasks"].as_array().unwrap().len(), 1);
    let (_, _, running) = api.call("GET", &format!("/api/v1/jobs/{id}"), "").await;
    assert!(running["tasks"][0]["waiting_reason"].is_null());

    // The answer to a submit explains its ready tasks with the queues as its own transaction
    // saw them: the pause, and the running task that fills a limit of one.
    api.call(
        "PUT",
        "/api/v1/workflows/plain",
        "steps:\n- {id: a, queue: q, command: c}\n",
    )
    .await;
    api.call("POST", "/api/v1/queues/q/pause", "").await;
    let (_, _, submitted) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "plain"}"#)
        .await;
    assert_eq!(submitted["tasks"][0]["waiting_reason"], "queue q paused");
    api.call("POST", "/api/v1/queues/q/resume", "").await;
    api.call("PUT", "/api/v1/queues/q", r#"{"concurrency": 1}"#)
        .await;
    let (_, _, submitted) = api
        .call("POST", "/api/v1/jobs", r#"{"workflow": "plain"}"#)
        .await;
    assert_eq!(
        submitted["tasks"][0]["waiting_reason"],
        "queue q at its limit (1/1 running)"
    );
}

#[tokio::test]
async fn a_bulk_retry_applies_to_every_failed_job_of_a_workflow_and_lists_refusals() {
    let api = api();
    three_jobs_of_wf(&api).await;
    for _ in 0..2 {
        let task = poll_one(&api).await;
        let failed = json!({"error": {"message": "disk full", "retryable": false}});
        report(&api, &task, "fail", failed).await;
    }
    let (status, _, result) = api
        .call(
            "POST",
            "/api/v1/jobs/bulk/retry",
            r#"{"workflow": "wf", "status": "failed", "created_after": "2000-01-01T00:00:00Z", "reason": "disk cleaned"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(result["matched"], 2);
    assert_eq!(result["affected"], 2);
    let (_, _, all) = api
        .call("POST", "/api/v1/jobs/bulk/pause", r#"{"workflow": "wf"}"#)
        .await;
    assert_eq!(all["matched"], 3);
    assert_eq!(all["affected"], 3);
    let (_, _, again) = api
        .call("POST", "/api/v1/jobs/bulk/pause", r#"{"workflow": "wf"}"#)
        .await;
    assert_eq!(again["affected"], 0);
    assert_eq!(again["refused"].as_array().unwrap().len(), 3);
    assert!(
        again["refused"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("only a running job")
    );
    let (status, _, problem) = api.call("POST", "/api/v1/jobs/bulk/explode", "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "action");
    let (status, _, problem) = api
        .call("GET", "/api/v1/jobs?created_before=yesterday", "")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "created_before");
}

#[tokio::test]
async fn a_value_the_server_does_not_know_is_refused_naming_the_field() {
    let api = api();
    api.call("PUT", "/api/v1/workflows/wf", WORKFLOW).await;
    let statuses = "queued, running, paused, compensating, succeeded, failed, \
                    compensation_failed, cancelled, timed_out";
    let schedule = |extra: &str| format!(r#"{{"workflow": "wf", "cron": "0 3 * * *", {extra}}}"#);
    let cases = [
        (
            "GET",
            "/api/v1/jobs?status=done",
            String::new(),
            format!("status: unknown status 'done': use one of {statuses}"),
        ),
        (
            "POST",
            "/api/v1/jobs/bulk/pause",
            r#"{"status": "done"}"#.to_owned(),
            format!("status: unknown status 'done': use one of {statuses}"),
        ),
        (
            "POST",
            "/api/v1/jobs/bulk/explode",
            "{}".to_owned(),
            "action: 'explode' is not a bulk action: use pause, resume, cancel, retry, skip, rerun or delete"
                .to_owned(),
        ),
        (
            "PUT",
            "/api/v1/queues/q",
            r#"{"mode": "fifo"}"#.to_owned(),
            "mode: unknown mode 'fifo': use parallel or serial".to_owned(),
        ),
        (
            "PUT",
            "/api/v1/schedules/s",
            schedule(r#""overlap": "never""#),
            "overlap: unknown policy 'never': use skip, allow or queue_one".to_owned(),
        ),
        (
            "PUT",
            "/api/v1/schedules/s",
            schedule(r#""catch_up": {"policy": "some", "limit": 3}"#),
            "catch_up.policy: unknown policy 'some': use skip, once or all".to_owned(),
        ),
        (
            "PUT",
            "/api/v1/schedules/s",
            schedule(r#""catch_up": {"policy": "once", "limit": 3}"#),
            "catch_up.limit: only the `all` policy takes a limit".to_owned(),
        ),
        (
            "POST",
            "/api/v1/webhooks",
            r#"{"url": "http://hooks.example/x", "states": ["failed", "done"]}"#.to_owned(),
            format!("states: unknown job status 'done': use {statuses}"),
        ),
        (
            "POST",
            "/api/v1/webhooks",
            r#"{"url": "http://hooks.example/x", "events": ["task.failed", "task.exploded"]}"#
                .to_owned(),
            "events[1]: unknown event 'task.exploded': use job.status_changed, task.started, \
             task.succeeded, task.failed, task.retrying"
                .to_owned(),
        ),
        (
            "POST",
            "/api/v1/tokens",
            r#"{"name": "t", "scopes": ["read", "root"]}"#.to_owned(),
            "scopes: unknown scope 'root': use admin, operate, submit, work or read".to_owned(),
        ),
    ];
    for (method, uri, body, detail) in cases {
        let (status, _, problem) = api.call(method, uri, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}: {problem}");
        assert_eq!(problem["detail"], detail, "{uri} {body}");
        let field = detail.split(':').next().unwrap();
        assert_eq!(problem["errors"][0]["field"], field, "{uri} {body}");
    }
    // A value of another JSON type is a malformed body, as when the field was a plain string.
    let (status, _, problem) = api
        .call("POST", "/api/v1/jobs/bulk/pause", r#"{"status": 5}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "body");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("invalid type: integer `5`, expected a string"),
        "{detail}"
    );
}

#[tokio::test]
async fn whole_numbers_sent_as_floats_are_accepted_and_fractions_are_not() {
    let api = api();
    let (status, _, body) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"], "max_tasks": 2.0, "wait_ms": 0.0}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, problem) = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "w", "queues": ["q"], "max_tasks": 2.5}"#,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["errors"][0]["field"], "body");
}
