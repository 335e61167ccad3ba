//! The dashboard's figures over HTTP: a known load of jobs run through the API, rolled up by
//! the engine's rollup step on a clock that moves only when told to, read back from
//! `GET /api/v1/stats/minutes` and the UI's `/ui/dashboard`; and the query's refusals.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};
use starbridge_core::time::{Duration, Timestamp};
use starbridge_engine::{ManualClock, ROLLUP_LAG};

use common::Api;

/// 10:00:10 UTC: the load stays inside the minute 10:00.
const START: &str = "2026-11-22T10:00:10Z";

async fn poll(api: &Api, queue: &str, max: u32) -> Vec<(String, String)> {
    let answer = api
        .send_json(
            "POST",
            "/api/v1/tasks/poll",
            &json!({"worker_id": "w", "queues": [queue], "max_tasks": max}).to_string(),
        )
        .await
        .json();
    answer["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| {
            (
                task["id"].as_str().unwrap().to_owned(),
                task["lease_token"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn end(api: &Api, (task, lease): &(String, String), succeed: bool) {
    let (path, body) = if succeed {
        ("complete", json!({"lease_token": lease, "output": {}}))
    } else {
        (
            "fail",
            json!({"lease_token": lease, "error": {"message": "no", "retryable": false}}),
        )
    };
    let answer = api
        .send_json(
            "POST",
            &format!("/api/v1/tasks/{task}/{path}"),
            &body.to_string(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
}

/// 8 jobs of `load` (one step on queue `work`) and 2 of `other` (queue `rest`): 6 `load` jobs
/// succeed after 30 ms, 1 fails after 30 ms and 1 succeeds after 4 s; the `other` jobs stay
/// ready. Returns the API with the history rolled up.
async fn known_load() -> (Api, Arc<ManualClock>) {
    let start: starbridge_api::Timestamp = START.parse().unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp(start.as_millisecond())));
    let api = Api::with_clock(clock.clone());
    for (name, queue) in [("load", "work"), ("other", "rest")] {
        let definition = json!({"steps": [{"id": "only", "queue": queue, "command": "c"}]});
        let applied = api
            .send_json(
                "PUT",
                &format!("/api/v1/workflows/{name}"),
                &definition.to_string(),
            )
            .await;
        assert_eq!(applied.status, StatusCode::CREATED, "{}", applied.text);
    }
    for (workflow, count) in [("load", 8), ("other", 2)] {
        for _ in 0..count {
            let submitted = api
                .send_json(
                    "POST",
                    "/api/v1/jobs",
                    &json!({"workflow": workflow, "params": {}}).to_string(),
                )
                .await;
            assert_eq!(submitted.status, StatusCode::CREATED, "{}", submitted.text);
        }
    }
    let tasks = poll(&api, "work", 8).await;
    assert_eq!(tasks.len(), 8);
    clock.advance(Duration::from_millis(30));
    for task in &tasks[..6] {
        end(&api, task, true).await;
    }
    end(&api, &tasks[6], false).await;
    clock.advance(Duration::from_millis(3_970));
    end(&api, &tasks[7], true).await;
    clock.advance(Duration::from_millis(ROLLUP_LAG.as_millis() + 1));
    assert_eq!(
        api.engine.roll_up().await.unwrap(),
        10 + 7 + 1 + 7 + 1 + 2,
        "every event is read: 10 jobs started, 7 + 7 succeeded, 1 + 1 failed count (the 8 \
         tasks' starts ride on the events ending their runs), and the failed job's 2 other \
         events do not"
    );
    (api, clock)
}

fn series<'a>(stats: &'a Value, kind: &str, name: &str) -> &'a Value {
    stats[kind]
        .as_array()
        .unwrap()
        .iter()
        .find(|series| series["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}: {stats}"))
}

#[tokio::test]
async fn the_figures_of_a_known_load_are_its_counts_and_percentiles() {
    let (api, _clock) = known_load().await;
    let answer = api.send("GET", "/api/v1/stats/minutes", &[], "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let stats = answer.json();
    assert_eq!(stats["window"], "1h");
    assert_eq!(stats["to"], "2026-11-22T10:00:00Z");
    assert_eq!(stats["from"], "2026-11-22T09:01:00Z");

    let load = series(&stats, "workflows", "load");
    let totals = &load["totals"];
    assert_eq!(
        (&totals["started"], &totals["succeeded"], &totals["failed"]),
        (&json!(8), &json!(7), &json!(1))
    );
    // 7 of 8 took 30 ms (the bucket up to 30), one 4 s (the bucket up to 5 s).
    assert_eq!(totals["p50_ms"], 30);
    assert_eq!(totals["p95_ms"], 5_000);
    assert_eq!(load["minutes"].as_array().unwrap().len(), 1);
    assert_eq!(load["minutes"][0]["minute"], "2026-11-22T10:00:00Z");
    let other = &series(&stats, "workflows", "other")["totals"];
    assert_eq!(
        (&other["started"], &other["succeeded"]),
        (&json!(2), &json!(0))
    );
    assert_eq!(other["p50_ms"], Value::Null, "no job of it ended");

    let work = &series(&stats, "queues", "work")["totals"];
    assert_eq!(
        (&work["started"], &work["succeeded"], &work["failed"]),
        (&json!(8), &json!(7), &json!(1))
    );
    let rest = &series(&stats, "queues", "rest")["totals"];
    assert_eq!(
        rest["depth"], 2,
        "both tasks of `other` were ready when sampled"
    );
    assert_eq!(
        rest["oldest_wait_ms"],
        4_000 + ROLLUP_LAG.as_millis() + 1,
        "they were submitted at the start"
    );

    let only = api
        .send(
            "GET",
            "/api/v1/stats/minutes?workflow=load&window=1d",
            &[],
            "",
        )
        .await
        .json();
    assert_eq!(only["window"], "1d");
    assert_eq!(only["from"], "2026-11-21T10:01:00Z");
    assert_eq!(only["workflows"].as_array().unwrap().len(), 1);
    assert_eq!(
        only["queues"],
        json!([]),
        "a workflow filter leaves the queues out"
    );
    assert_eq!(only["workflows"][0]["totals"]["started"], 8);
}

#[tokio::test]
async fn the_dashboard_page_shows_the_totals_and_draws_the_charts() {
    let (api, _clock) = known_load().await;
    let page = api.send("GET", "/ui/dashboard", &[], "").await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.text;
    let section = html
        .split(r#"<section class="series" data-kind="workflow" data-name="load">"#)
        .nth(1)
        .expect("a section for the workflow")
        .split("</section>")
        .next()
        .unwrap();
    assert!(section.contains(r#"<td class="started">8</td><td class="succeeded">7</td><td class="failed">1</td><td class="p50">30ms</td><td class="p95">5.0s</td>"#), "{section}");
    assert_eq!(section.matches("<svg").count(), 2, "counts and durations");
    assert!(html.contains(r#"data-kind="queue" data-name="rest""#));
    assert!(!html.contains("<script>"), "no inline script");
    let nav = html.split(r#"<nav aria-label="Main">"#).nth(1).unwrap();
    assert!(
        nav.starts_with(r#"<a href="/ui/dashboard" aria-current="page">Dashboard</a>"#),
        "the dashboard is the first entry: {nav}"
    );
}

#[tokio::test]
async fn a_malformed_query_is_refused_naming_the_parameter() {
    let api = Api::start();
    for (query, field) in [
        ("window=2h", "window"),
        (&*format!("workflow={}", "w".repeat(129)), "workflow"),
        (&*format!("queue={}", "q".repeat(129)), "queue"),
        ("namespace=Not%20a%20name", "namespace"),
    ] {
        let answer = api
            .send("GET", &format!("/api/v1/stats/minutes?{query}"), &[], "")
            .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(answer.content_type, "application/problem+json", "{query}");
        assert_eq!(
            answer.json()["errors"][0]["field"],
            field,
            "{}",
            answer.text
        );
    }
    let page = api.send("GET", "/ui/dashboard?window=5m", &[], "").await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
}
