//! Hard limits and framework rejections: each limit refuses a request just over it with a
//! problem naming the limit and its setting, and lets one at it through; what the framework
//! refuses on its own (bad query strings, oversized bodies, wrong methods, unknown paths) is a
//! problem document too.

mod common;

use axum::http::{StatusCode, header};
use serde_json::{Value, json};
use starbridge_server::{Limit, Limits};

use common::Api;

fn api(limits: Limits) -> Api {
    Api::with_limits(limits)
}

/// What a request was answered: status, content type, the `Allow` header and the JSON body.
struct Answer {
    status: StatusCode,
    content_type: String,
    allow: Option<String>,
    body: Value,
}

/// Requests with a JSON body, and the fixtures the limits need.
trait Calls {
    async fn call(&self, method: &str, uri: &str, body: &str) -> Answer;
    async fn ok(&self, method: &str, uri: &str, body: &str) -> Value;
    async fn leased_task(&self) -> Value;
}

impl Calls for Api {
    async fn call(&self, method: &str, uri: &str, body: &str) -> Answer {
        let answer = self.send_json(method, uri, body).await;
        Answer {
            status: answer.status,
            content_type: answer.content_type.clone(),
            allow: answer.header(header::ALLOW),
            body: answer.json(),
        }
    }

    async fn ok(&self, method: &str, uri: &str, body: &str) -> Value {
        let answer = self.call(method, uri, body).await;
        assert!(
            answer.status.is_success(),
            "{method} {uri}: {} {}",
            answer.status,
            answer.body
        );
        answer.body
    }

    /// Applies a one-step workflow `wf` and leases its first task.
    async fn leased_task(&self) -> Value {
        self.ok(
            "PUT",
            "/api/v1/workflows/wf",
            "steps: [{id: a, queue: q, command: c}]",
        )
        .await;
        self.ok("POST", "/api/v1/jobs", r#"{"workflow": "wf"}"#)
            .await;
        let polled = self
            .ok(
                "POST",
                "/api/v1/tasks/poll",
                r#"{"worker_id": "w", "queues": ["q"]}"#,
            )
            .await;
        polled["tasks"][0].clone()
    }
}

/// Checks that `answer` refuses a request for going over `limit`, naming `field`.
#[track_caller]
fn assert_limit(answer: &Answer, status: StatusCode, limit: Limit, value: u64, field: &str) {
    let problem = &answer.body;
    assert_eq!(answer.status, status, "{problem}");
    assert_eq!(answer.content_type, "application/problem+json");
    assert_eq!(problem["type"], "/problems/limit-exceeded", "{problem}");
    assert_eq!(problem["status"], status.as_u16());
    assert_eq!(
        problem["limit"],
        json!({"name": limit.name(), "value": value, "flag": limit.flag(), "env": limit.env()})
    );
    assert_eq!(problem["errors"][0]["field"], field, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    for named in [limit.name().to_owned(), limit.flag(), limit.env()] {
        assert!(detail.contains(&named), "{detail} does not name {named}");
    }
}

/// A JSON string literal whose encoding (quotes included) is exactly `bytes` long.
fn string_of(bytes: usize) -> String {
    format!("\"{}\"", "x".repeat(bytes - 2))
}

#[tokio::test]
async fn a_body_over_the_body_limit_is_a_413_problem() {
    let api = api(Limits {
        body_bytes: 1000,
        ..Limits::default()
    });
    let big = format!(r#"{{"workflow": "{}"}}"#, "x".repeat(1000));
    let answer = api.call("POST", "/api/v1/jobs", &big).await;
    assert_limit(
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        Limit::Body,
        1000,
        "body",
    );
    let answer = api.call("POST", "/api/v1/tasks/poll", &big).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_definition_over_the_definition_limit_is_refused_as_sent_and_once_parsed() {
    let api = api(Limits {
        definition_bytes: 200,
        ..Limits::default()
    });
    let padded = format!(
        "description: {}\nsteps: [{{id: a, queue: q, command: c}}]\n",
        "d".repeat(200)
    );
    let answer = api.call("PUT", "/api/v1/workflows/wf", &padded).await;
    assert_limit(
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        Limit::Definition,
        200,
        "body",
    );
    // Small as sent, large once its aliases are expanded.
    let aliased = "x: &a [abcdefghijklmnopqrstuvwxyz, abcdefghijklmnopqrstuvwxyz]\ny: [*a, *a, *a, *a]\nsteps: [{id: a, queue: q, command: c}]\n";
    assert!(aliased.len() < 200);
    let answer = api.call("PUT", "/api/v1/workflows/wf", aliased).await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Definition,
        200,
        "body",
    );
    let inline = json!({"definition": {"description": "d".repeat(200), "steps": [{"id": "a", "queue": "q", "command": "c"}]}});
    let answer = api.call("POST", "/api/v1/jobs", &inline.to_string()).await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Definition,
        200,
        "definition",
    );
}

#[tokio::test]
async fn a_workflow_with_more_steps_than_the_limit_is_refused() {
    let api = api(Limits {
        steps: 2,
        ..Limits::default()
    });
    let steps = |n: usize| {
        let list: Vec<Value> = (0..n)
            .map(|i| json!({"id": format!("s{i}"), "queue": "q", "command": "c"}))
            .collect();
        json!({ "steps": list }).to_string()
    };
    api.ok("PUT", "/api/v1/workflows/two", &steps(2)).await;
    let answer = api.call("PUT", "/api/v1/workflows/three", &steps(3)).await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Steps,
        2,
        "body.steps",
    );
    assert!(
        answer.body["detail"]
            .as_str()
            .unwrap()
            .contains("3 steps is more than the limit of 2")
    );
}

#[tokio::test]
async fn a_fan_out_wider_than_the_limit_fails_its_step_naming_the_setting() {
    let api = api(Limits {
        run: starbridge_core::limits::Limits {
            fan_out: 2,
            ..Default::default()
        },
        ..Limits::default()
    });
    api.ok(
        "PUT",
        "/api/v1/workflows/fan",
        "steps: [{id: each, queue: q, command: c, for_each: '${{ params.items }}'}]",
    )
    .await;
    let job = api
        .ok(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "fan", "params": {"items": [1, 2, 3]}}"#,
        )
        .await;
    assert_eq!(job["status"], "failed", "{job}");
    let error = job["tasks"][0]["error"]["message"].as_str().unwrap();
    assert!(
        error.contains("3 items is more than the fan-out limit of 2")
            && error.contains("--max-fan-out"),
        "{error}"
    );
}

#[tokio::test]
async fn task_outputs_progress_and_errors_over_the_task_limit_are_refused() {
    let api = api(Limits {
        run: starbridge_core::limits::Limits {
            task_bytes: 100,
            ..Default::default()
        },
        ..Limits::default()
    });
    let task = api.leased_task().await;
    let id = task["id"].as_str().unwrap();
    let token = task["lease_token"].as_str().unwrap();
    let report = |outcome: &str, body: Value| {
        let uri = format!("/api/v1/tasks/{id}/{outcome}");
        let body = body.to_string();
        let api = &api;
        async move { api.call("POST", &uri, &body).await }
    };
    let answer = report(
        "heartbeat",
        json!({"lease_token": token, "progress": {"p": "x".repeat(100)}}),
    )
    .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Task,
        100,
        "progress",
    );
    let answer = report(
        "fail",
        json!({"lease_token": token, "error": {"message": "x".repeat(101)}}),
    )
    .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Task,
        100,
        "error.message",
    );
    let output: Value = serde_json::from_str(&string_of(101)).unwrap();
    let answer = report("complete", json!({"lease_token": token, "output": output})).await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Task,
        100,
        "output",
    );
    // The batch form holds each item to the same limit, refusing only the item over it.
    let batch = json!({"tasks": [{"id": id, "lease_token": token, "output": output}]});
    let answer = api
        .call("POST", "/api/v1/tasks/complete", &batch.to_string())
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let refused = &answer.body["items"][0]["error"];
    assert_eq!(refused["type"], "/problems/limit-exceeded", "{refused}");
    assert_eq!(refused["limit"]["name"], Limit::Task.name());
    assert_eq!(refused["errors"][0]["field"], "output");
    // A poll's completions are held to it alike: the poll is answered, the item refused in
    // `reports` exactly as the batch form refused it.
    let refused = refused.clone();
    let poll = json!({"worker_id": "w", "queues": ["q"], "complete": batch["tasks"]});
    let answer = api
        .call("POST", "/api/v1/tasks/poll", &poll.to_string())
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["reports"], json!([{"error": refused}]));
    // A value no item may hold refuses the whole poll, naming the item's field.
    let poll = json!({"worker_id": "w", "queues": ["q"], "complete": [
        {"id": id, "lease_token": token},
        {"id": id, "lease_token": "a\u{0}b"},
    ]});
    let answer = api
        .call("POST", "/api/v1/tasks/poll", &poll.to_string())
        .await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        answer.body["errors"][0]["field"], "complete[1].lease_token",
        "{}",
        answer.body
    );
    // The refused reports changed nothing: an output at the limit completes the task.
    let output: Value = serde_json::from_str(&string_of(100)).unwrap();
    let answer = report("complete", json!({"lease_token": token, "output": output})).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["task_status"], "succeeded");
}

#[tokio::test]
async fn params_over_the_params_limit_are_refused_at_submit_and_in_schedules() {
    let api = api(Limits {
        params_bytes: 50,
        ..Limits::default()
    });
    api.ok(
        "PUT",
        "/api/v1/workflows/wf",
        "steps: [{id: a, queue: q, command: c}]",
    )
    .await;
    let params = |bytes: usize| {
        // {"p":"…"} is 8 bytes around the text.
        json!({"p": "x".repeat(bytes - 8)})
    };
    assert_eq!(params(50).to_string().len(), 50);
    let body = json!({"workflow": "wf", "params": params(50)});
    api.ok("POST", "/api/v1/jobs", &body.to_string()).await;
    let body = json!({"workflow": "wf", "params": params(51)});
    let answer = api.call("POST", "/api/v1/jobs", &body.to_string()).await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Params,
        50,
        "params",
    );
    // In a batch only the item over the limit is refused; the others are created.
    let body = json!({"jobs": [
        {"workflow": "wf", "params": params(50)},
        {"workflow": "wf", "params": params(51)},
    ]});
    let answer = api
        .ok("POST", "/api/v1/jobs/batch", &body.to_string())
        .await;
    assert_eq!(answer["items"][0]["created"], true, "{answer}");
    let refused = &answer["items"][1]["error"];
    assert_eq!(refused["type"], "/problems/limit-exceeded", "{refused}");
    assert_eq!(refused["limit"]["name"], Limit::Params.name());
    assert_eq!(refused["errors"][0]["field"], "params");
    let body = json!({"workflow": "wf", "cron": "@daily", "params": params(51)});
    let answer = api
        .call("PUT", "/api/v1/schedules/nightly", &body.to_string())
        .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Params,
        50,
        "params",
    );
}

#[tokio::test]
async fn labels_over_the_label_limit_are_refused_in_definitions_submits_and_schedules() {
    let api = api(Limits {
        run: starbridge_core::limits::Limits {
            labels: 2,
            ..starbridge_core::limits::Limits::default()
        },
        ..Limits::default()
    });
    let answer = api
        .call(
            "PUT",
            "/api/v1/workflows/wide",
            "labels: {a: '1', b: '2', c: '3'}\nsteps: [{id: a, queue: q, command: c}]",
        )
        .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Labels,
        2,
        "body.labels",
    );
    api.ok(
        "PUT",
        "/api/v1/workflows/wf",
        "labels: {team: storage}\nsteps: [{id: a, queue: q, command: c}]",
    )
    .await;
    let body = json!({"workflow": "wf", "labels": {"a": "1", "b": "2", "c": "3"}});
    let answer = api.call("POST", "/api/v1/jobs", &body.to_string()).await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Labels,
        2,
        "labels",
    );
    // Two of its own are within the limit, but not with the workflow's: the engine refuses
    // the merged labels, naming the setting.
    let body = json!({"workflow": "wf", "labels": {"a": "1", "b": "2"}});
    let answer = api.call("POST", "/api/v1/jobs", &body.to_string()).await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        answer.body
    );
    assert_eq!(answer.body["errors"][0]["field"], "labels");
    let detail = answer.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("3 labels") && detail.contains("--max-labels"),
        "{detail}"
    );
    let body = json!({"workflow": "wf", "labels": {"team": "infra", "b": "2"}});
    let job = api.ok("POST", "/api/v1/jobs", &body.to_string()).await;
    assert_eq!(job["labels"], json!({"b": "2", "team": "infra"}));
    let body =
        json!({"workflow": "wf", "cron": "@daily", "labels": {"a": "1", "b": "2", "c": "3"}});
    let answer = api
        .call("PUT", "/api/v1/schedules/nightly", &body.to_string())
        .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Labels,
        2,
        "labels",
    );
}

#[tokio::test]
async fn keys_and_names_over_their_limits_are_refused() {
    let api = api(Limits {
        key_bytes: 10,
        name_bytes: 8,
        ..Limits::default()
    });
    let answer = api
        .call(
            "POST",
            "/api/v1/jobs",
            r#"{"workflow": "wf", "key": "eleven-char"}"#,
        )
        .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Key,
        10,
        "key",
    );
    let answer = api
        .call(
            "PUT",
            "/api/v1/workflows/ninechars",
            "steps: [{id: a, queue: q, command: c}]",
        )
        .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Name,
        8,
        "name",
    );
    api.ok(
        "PUT",
        "/api/v1/workflows/eightchr",
        "steps: [{id: a, queue: q, command: c}]",
    )
    .await;
    let answer = api.call("PUT", "/api/v1/queues/ninechars", "{}").await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Name,
        8,
        "name",
    );
    let answer = api
        .call(
            "POST",
            "/api/v1/tasks/poll",
            r#"{"worker_id": "worker-nine", "queues": ["q"]}"#,
        )
        .await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Name,
        8,
        "worker_id",
    );
}

#[tokio::test]
async fn a_page_larger_than_the_page_limit_is_refused() {
    let api = api(Limits {
        page_size: 20,
        ..Limits::default()
    });
    api.ok("GET", "/api/v1/jobs?limit=20", "").await;
    let answer = api.call("GET", "/api/v1/jobs?limit=21", "").await;
    assert_limit(
        &answer,
        StatusCode::UNPROCESSABLE_ENTITY,
        Limit::Page,
        20,
        "limit",
    );
}

#[tokio::test]
async fn framework_rejections_are_problem_documents() {
    let api = api(Limits::default());
    // A query string that does not parse.
    let answer = api.call("GET", "/api/v1/jobs?limit=abc", "").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.content_type, "application/problem+json");
    assert_eq!(
        answer.body["errors"][0]["field"], "query",
        "{}",
        answer.body
    );
    assert!(
        answer.body["detail"].as_str().unwrap().contains("limit"),
        "{}",
        answer.body
    );
    // A method the path does not serve: 405, saying which it does.
    let answer = api.call("DELETE", "/api/v1/jobs", "").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.content_type, "application/problem+json");
    assert_eq!(answer.body["type"], "/problems/method-not-allowed");
    let allow = answer.allow.expect("an Allow header");
    assert!(allow.contains("POST") && allow.contains("GET"), "{allow}");
    assert_eq!(
        answer.body["detail"],
        "this endpoint does not answer DELETE: the Allow header lists the methods it does"
    );
    // An unknown path.
    let answer = api.call("GET", "/api/v2/nothing", "").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.content_type, "application/problem+json");
    // A malformed JSON body.
    let answer = api.call("POST", "/api/v1/tasks/poll", "{").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.content_type, "application/problem+json");
}
