//! Bulk skip and rerun over the HTTP API (`POST /api/v1/jobs/bulk/{skip|rerun}`), each test on a
//! real SQLite file and on a real PostgreSQL schema: each job is acted on as the single-job route
//! would, refusals are counted and listed, a dry run only counts, and the inputs are checked.

mod common;

use axum::http::StatusCode;
use serde_json::{Value, json};

use common::Api;

const WORKFLOW: &str = "steps:\n- {id: a, queue: q, command: c}\n- {id: b, queue: q, command: c, input: {from_a: '${{ steps.a.output.v }}'}}\n";

/// The status and JSON body of a request.
async fn call(api: &Api, method: &str, uri: &str, body: Value) -> (StatusCode, Value) {
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let answer = api.send_json(method, uri, &text).await;
    (answer.status, answer.json())
}

/// Applies `WORKFLOW` as `wf` and submits `count` jobs of it; their ids, oldest first.
async fn jobs_of_wf(api: &Api, count: usize) -> Vec<String> {
    let answer = api.send("PUT", "/api/v1/workflows/wf", &[], WORKFLOW).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text);
    let mut ids = Vec::new();
    for _ in 0..count {
        let (status, job) = call(api, "POST", "/api/v1/jobs", json!({"workflow": "wf"})).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        ids.push(job["id"].as_str().unwrap().to_owned());
    }
    ids
}

/// Claims the next ready task of queue `q`.
async fn claim(api: &Api) -> Value {
    let (_, polled) = call(
        api,
        "POST",
        "/api/v1/tasks/poll",
        json!({"worker_id": "w", "queues": ["q"], "max_tasks": 1}),
    )
    .await;
    let task = polled["tasks"][0].clone();
    assert!(task.is_object(), "no task ready: {polled}");
    task
}

/// Reports `outcome` (`complete` or `fail`) of a claimed task.
async fn report(api: &Api, task: &Value, outcome: &str, mut body: Value) {
    body["lease_token"] = task["lease_token"].clone();
    let uri = format!("/api/v1/tasks/{}/{outcome}", task["id"].as_str().unwrap());
    let (status, answer) = call(api, "POST", &uri, body).await;
    assert!(status.is_success(), "{outcome}: {answer}");
}

async fn job(api: &Api, id: &str) -> Value {
    call(api, "GET", &format!("/api/v1/jobs/{id}"), Value::Null)
        .await
        .1
}

/// The reasons of the audit log's entries of bulk actions, newest first.
async fn bulk_audits(api: &Api) -> Vec<Value> {
    let (_, audit) = call(api, "GET", "/api/v1/audit", Value::Null).await;
    audit["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no audit log: {audit}"))
        .iter()
        .filter(|entry| entry["action"] == "POST /api/v1/jobs/bulk/{action}")
        .map(|entry| entry["reason"].clone())
        .collect()
}

/// The first event of `kind` in job `id`'s history.
async fn event(api: &Api, id: &str, kind: &str) -> Value {
    let uri = format!("/api/v1/jobs/{id}/events");
    let (_, events) = call(api, "GET", &uri, Value::Null).await;
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|event| event["kind"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind}: {events}"))
}

fn task<'a>(job: &'a Value, step: &str) -> &'a Value {
    job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|task| task["step"] == step)
        .unwrap()
}

async fn bulk_skip_skips_the_step_of_the_jobs_it_applies_to_and_lists_the_others(api: Api) {
    let ids = jobs_of_wf(&api, 3).await;
    // Two jobs fail at `a`; the third one's `a` is running.
    for _ in 0..2 {
        let claimed = claim(&api).await;
        let error = json!({"error": {"message": "disk full", "retryable": false}});
        report(&api, &claimed, "fail", error).await;
    }
    let running = claim(&api).await;
    let running_job = running["job_id"].as_str().unwrap().to_owned();
    let failed: Vec<&String> = ids.iter().filter(|id| **id != running_job).collect();
    let request = json!({"workflow": "wf", "step": "a", "output": {"v": "by hand"}, "reason": "fixed the disk"});

    let mut dry_run = request.clone();
    dry_run["dry_run"] = json!(true);
    let (status, counted) = call(&api, "POST", "/api/v1/jobs/bulk/skip", dry_run).await;
    assert_eq!(status, StatusCode::OK, "{counted}");
    assert_eq!(counted, json!({"matched": 3, "affected": 0, "refused": []}));
    assert_eq!(job(&api, failed[0]).await["status"], "failed");
    assert_eq!(
        bulk_audits(&api).await,
        Vec::<Value>::new(),
        "a dry run changes nothing"
    );

    let (status, result) = call(&api, "POST", "/api/v1/jobs/bulk/skip", request).await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(
        (&result["matched"], &result["affected"]),
        (&json!(3), &json!(2))
    );
    let refused = result["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{result}");
    assert_eq!(refused[0]["id"], running_job.as_str());
    assert!(
        refused[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("task is running: in a running job only a waiting or ready task"),
        "{result}"
    );
    for id in failed {
        let skipped = job(&api, id).await;
        assert_eq!(skipped["status"], "running", "{skipped}");
        assert_eq!(task(&skipped, "a")["status"], "succeeded");
        assert_eq!(task(&skipped, "a")["output"], json!({"v": "by hand"}));
        assert_eq!(task(&skipped, "b")["status"], "ready");
        let resolved = event(&api, id, "task_resolved_by_operator").await;
        assert_eq!(resolved["step"], "a");
        assert_eq!(resolved["detail"]["reason"], "fixed the disk");
    }
    assert_eq!(
        task(&job(&api, &running_job).await, "a")["status"],
        "running"
    );
    assert_eq!(bulk_audits(&api).await, vec![json!("fixed the disk")]);
}

async fn bulk_rerun_runs_the_step_again_in_the_finished_jobs_named_by_id(api: Api) {
    let ids = jobs_of_wf(&api, 3).await;
    // The oldest job succeeds; the others stay running (their tasks claimed on the way stay so).
    loop {
        let claimed = claim(&api).await;
        if claimed["job_id"] == ids[0].as_str() {
            report(&api, &claimed, "complete", json!({"output": {"v": 1}})).await;
            if job(&api, &ids[0]).await["status"] == "succeeded" {
                break;
            }
        }
    }
    assert_eq!(job(&api, &ids[0]).await["status"], "succeeded");
    let selected = json!([ids[0], ids[1]]);

    let (status, unknown) = call(
        &api,
        "POST",
        "/api/v1/jobs/bulk/rerun",
        json!({"ids": selected, "step": "zzz"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{unknown}");
    assert_eq!(
        (&unknown["matched"], &unknown["affected"]),
        (&json!(2), &json!(0))
    );
    let reasons: Vec<&str> = unknown["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|refusal| refusal["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons.contains(&"workflow wf has no step 'zzz'"),
        "{unknown}"
    );

    let (status, result) = call(
        &api,
        "POST",
        "/api/v1/jobs/bulk/rerun",
        json!({"ids": selected, "step": "b", "reason": "the target changed"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(
        (&result["matched"], &result["affected"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(result["refused"][0]["id"], ids[1].as_str());
    assert!(
        result["refused"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("job is running: rerun applies to a finished job"),
        "{result}"
    );
    let rerun = job(&api, &ids[0]).await;
    assert_eq!(rerun["status"], "running");
    assert_eq!(task(&rerun, "a")["status"], "succeeded");
    assert_eq!(task(&rerun, "b")["status"], "ready");
    let rerun_event = event(&api, &ids[0], "job_rerun").await;
    assert_eq!(rerun_event["detail"]["reason"], "the target changed");
    assert_eq!(rerun_event["detail"]["step"], "b");
    // The job not named is untouched by either call.
    assert_eq!(job(&api, &ids[2]).await["status"], "running");
}

async fn bulk_skip_and_rerun_need_a_step_and_ids_must_be_job_ids(api: Api) {
    jobs_of_wf(&api, 1).await;
    let too_many: Vec<String> = (0..10_001).map(|n| format!("job_{n}")).collect();
    let cases = [
        (
            "skip",
            json!({}),
            "step",
            "step: required with skip: name the step",
        ),
        (
            "rerun",
            json!({"step": ""}),
            "step",
            "step: required with rerun: name the step",
        ),
        (
            "pause",
            json!({"ids": []}),
            "ids",
            "ids: list 1 to 10000 job ids, or leave the field out to select by the other fields",
        ),
        (
            "pause",
            json!({"ids": too_many}),
            "ids",
            "ids: list 1 to 10000 job ids, or leave the field out to select by the other fields",
        ),
        (
            "rerun",
            json!({"step": "a", "ids": ["job_ok", "nope"]}),
            "ids[1]",
            "ids[1]: 'nope' is not a job id: pass a job's `id` (`job_…`)",
        ),
    ];
    for (action, body, field, detail) in cases {
        let uri = format!("/api/v1/jobs/bulk/{action}");
        let (status, problem) = call(&api, "POST", &uri, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{action} {body}: {problem}"
        );
        assert_eq!(problem["errors"][0]["field"], field, "{action} {body}");
        assert_eq!(problem["detail"], detail, "{action} {body}");
    }
    // An id no job of the namespace has matches nothing.
    let (status, result) = call(
        &api,
        "POST",
        "/api/v1/jobs/bulk/pause",
        json!({"ids": ["job_0000"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(result["matched"], 0);
    // A dry run only counts: it does not need the step.
    let (status, counted) = call(
        &api,
        "POST",
        "/api/v1/jobs/bulk/rerun",
        json!({"dry_run": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{counted}");
    assert_eq!(counted, json!({"matched": 1, "affected": 0, "refused": []}));
}

/// Runs each listed test on both backends: `sqlite::name` and `postgres::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Api::start()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(api) = super::Api::on_postgres(stringify!($name)) {
                        super::$name(api).await;
                    }
                }
            )*
        }
    };
}

on_both_backends!(
    bulk_skip_skips_the_step_of_the_jobs_it_applies_to_and_lists_the_others,
    bulk_rerun_runs_the_step_again_in_the_finished_jobs_named_by_id,
    bulk_skip_and_rerun_need_a_step_and_ids_must_be_job_ids,
);
