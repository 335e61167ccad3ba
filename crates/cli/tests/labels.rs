//! Job labels end to end, with the real binary as server: labels given at submit (single, batch
//! and from the CLI) merged over the workflow's, the `label` filter of the job list (several
//! labels: all of them), bulk actions on a label, and refusals as problem documents.

mod common;

use serde_json::{Value, json};

use common::{Harness, get_json};

const WORKFLOW: &str =
    "labels: {team: storage, tier: '1'}\nsteps:\n- {id: a, queue: nobody, command: c}\n";

async fn post(h: &Harness, path: &str, body: Value) -> (u16, Value) {
    let response = h
        .http
        .post(format!("{}{path}", h.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// The ids of the jobs `GET /api/v1/jobs?{query}` lists, sorted.
async fn listed(h: &Harness, query: &str) -> Vec<String> {
    let list = get_json(&h.http, &format!("{}/api/v1/jobs?{query}", h.url)).await;
    let mut ids: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn labels_are_merged_at_submit_filter_the_list_and_select_bulk_actions() {
    let h = Harness::start().await;
    h.apply("wf", WORKFLOW).await;

    let (status, prod) = post(
        &h,
        "/api/v1/jobs",
        json!({"workflow": "wf", "labels": {"env": "prod", "tier": "2"}}),
    )
    .await;
    assert_eq!(status, 201, "{prod}");
    assert_eq!(
        prod["labels"],
        json!({"env": "prod", "team": "storage", "tier": "2"}),
        "the submission's labels are merged over the workflow's, and win"
    );
    let prod = prod["id"].as_str().unwrap().to_owned();
    let (_, infra) = post(
        &h,
        "/api/v1/jobs",
        json!({"workflow": "wf", "labels": {"team": "infra", "env": "prod"}}),
    )
    .await;
    let infra = infra["id"].as_str().unwrap().to_owned();
    let (_, plain) = post(&h, "/api/v1/jobs", json!({"workflow": "wf"})).await;
    assert_eq!(plain["labels"], json!({"team": "storage", "tier": "1"}));
    let plain = plain["id"].as_str().unwrap().to_owned();
    let (status, batch) = post(
        &h,
        "/api/v1/jobs/batch",
        json!({"jobs": [{"workflow": "wf", "labels": {"env": "dev"}}]}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    let dev = batch["items"][0]["id"].as_str().unwrap().to_owned();
    let submitted = h.cli(&["submit", "wf", "--label", "env=prod", "-l", "owner=ops"]);
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let by_cli = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();

    let job = get_json(&h.http, &format!("{}/api/v1/jobs/{dev}", h.url)).await;
    assert_eq!(
        job["labels"],
        json!({"env": "dev", "team": "storage", "tier": "1"})
    );
    let job = get_json(&h.http, &format!("{}/api/v1/jobs/{by_cli}", h.url)).await;
    assert_eq!(
        job["labels"],
        json!({"env": "prod", "owner": "ops", "team": "storage", "tier": "1"})
    );

    // One label, then two: a job must carry both.
    assert_eq!(
        listed(&h, "label=env=prod").await,
        sorted(&[&prod, &infra, &by_cli])
    );
    assert_eq!(
        listed(&h, "label=team=storage&label=env=prod").await,
        sorted(&[&prod, &by_cli])
    );
    assert_eq!(
        listed(&h, "label=team=storage&label=env=dev").await,
        sorted(&[&dev])
    );
    assert_eq!(listed(&h, "label=team=nobody").await, Vec::<String>::new());
    assert_eq!(listed(&h, "").await.len(), 5);
    let shown = h.cli(&[
        "jobs",
        "--label",
        "team=storage",
        "--label",
        "tier=1",
        "-o",
        "json",
    ]);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let list: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let mut ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, sorted(&[&plain, &dev, &by_cli]));
    for job in list["items"].as_array().unwrap() {
        assert_eq!(job["labels"]["tier"], "1", "summaries carry labels: {job}");
    }

    // Bulk actions select by labels the same way.
    let (status, paused) = post(
        &h,
        "/api/v1/jobs/bulk/pause",
        json!({"labels": {"team": "storage", "env": "prod"}, "reason": "maintenance"}),
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(
        (paused["matched"].as_u64(), paused["affected"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(listed(&h, "status=paused").await, sorted(&[&prod, &by_cli]));
    let cancelled = h.cli(&["bulk", "cancel", "--label", "team=infra"]);
    assert!(
        cancelled.status.success(),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    assert!(String::from_utf8_lossy(&cancelled.stdout).contains("1 of 1"));
    assert_eq!(listed(&h, "status=cancelled").await, sorted(&[&infra]));
    // A bulk rerun names the step, here of jobs named by id; a dry run only counts them.
    let counted = h.cli(&["bulk", "rerun", "--id", &infra, "--id", &plain, "--dry-run"]);
    assert!(
        String::from_utf8_lossy(&counted.stdout).contains("2 matching jobs (dry run"),
        "{}",
        String::from_utf8_lossy(&counted.stderr)
    );
    assert_eq!(listed(&h, "status=cancelled").await, sorted(&[&infra]));
    let rerun = h.cli(&[
        "bulk", "rerun", "--id", &infra, "--id", &plain, "--step", "a",
    ]);
    let printed = String::from_utf8_lossy(&rerun.stdout);
    assert!(printed.contains("1 of 2 matching jobs: rerun"), "{printed}");
    assert!(
        printed.contains(&format!(
            "refused {plain}  job is running: rerun applies to a finished job"
        )),
        "{printed}"
    );
    assert!(listed(&h, "status=cancelled").await.is_empty());

    // Refusals name the label and say what to change.
    let (status, problem) = post(
        &h,
        "/api/v1/jobs",
        json!({"workflow": "wf", "labels": {"Team": "x"}}),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "labels.Team");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("labels.Team: 'Team' is not a valid label key"),
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("(such as 'team')"),
        "{problem}"
    );
    let response = h
        .http
        .get(format!("{}/api/v1/jobs?label=team", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["errors"][0]["field"], "label");
    let (status, problem) = post(
        &h,
        "/api/v1/jobs/bulk/pause",
        json!({"labels": {"team": "v".repeat(256)}}),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "labels.team");
    let response = h
        .http
        .put(format!("{}/api/v1/workflows/bad", h.url))
        .header("content-type", "application/yaml")
        .body("labels: {Bad: x}\nsteps:\n- {id: a, queue: q, command: c}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 422);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["errors"][0]["field"], "labels.Bad");
}
