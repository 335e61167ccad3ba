//! Page timings of the web UI with a million jobs in the store. Ignored by default (filling the
//! store takes a while); run it, preferably optimised, with
//!
//! ```sh
//! cargo test --release -p starbridge-server --test ui_scale -- --ignored --nocapture
//! ```
//!
//! It prints the server time of each jobs-list query (the median of several requests handled
//! in-process), and of the API's job list (`GET /api/v1/jobs?…`, unfiltered and by status,
//! workflow, cursor, creation time, parent and labels; p50 and p99). It
//! checks what the pages show, not how fast they are: timings depend on the machine.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;
use starbridge_engine::Engine;
use starbridge_server::{AppState, app};
use tower::ServiceExt;

const JOBS: i64 = 1_000_000;
/// Jobs are created one a second up to now.
const SPACING_MS: i64 = 1000;
const RUNS: usize = 7;

/// Fills `jobs` directly: workflows `nightly` (80%), `backup` (10%) and `adhoc` (10%); most
/// jobs succeeded, some failed, the newest still running. Labels: every other job `tier=1`, one
/// in 10,000 `team=storage` (100 jobs), half of those also `env=prod`.
fn fill(path: &std::path::Path, now: i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;")
        .unwrap();
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1) \
         INSERT INTO jobs (id, namespace, workflow, version, status, params, key, priority, \
             created_at, started_at, ended_at, deadline_at, wind_down, compensation_planned, \
             completions, round, lock_key, lock_slots) \
         SELECT printf('job_%012d', i), 'default', \
             CASE i % 10 WHEN 0 THEN 'adhoc' WHEN 1 THEN 'backup' ELSE 'nightly' END, 1, \
             CASE WHEN i >= ?1 - 500 THEN 'running' WHEN i % 97 = 0 THEN 'failed' \
                  WHEN i % 211 = 0 THEN 'cancelled' ELSE 'succeeded' END, \
             '{}', 'order-' || i, 0, ?2 - (?1 - i) * ?3, ?2 - (?1 - i) * ?3 + 5, \
             CASE WHEN i >= ?1 - 500 THEN NULL ELSE ?2 - (?1 - i) * ?3 + 900 END, \
             NULL, NULL, 0, 0, 0, NULL, NULL \
         FROM n",
        rusqlite::params![JOBS, now, SPACING_MS],
    )
    .unwrap();
    conn.execute_batch(
        "INSERT INTO job_labels (job_id, namespace, key, value) \
             SELECT id, 'default', 'tier', '1' FROM jobs WHERE CAST(substr(id, 5) AS INTEGER) % 2 = 0; \
         INSERT INTO job_labels (job_id, namespace, key, value) \
             SELECT id, 'default', 'team', 'storage' FROM jobs WHERE CAST(substr(id, 5) AS INTEGER) % 10000 = 7; \
         INSERT INTO job_labels (job_id, namespace, key, value) \
             SELECT id, 'default', 'env', 'prod' FROM jobs WHERE CAST(substr(id, 5) AS INTEGER) % 20000 = 7; \
         UPDATE jobs SET labels = (SELECT json_group_object(key, value) FROM job_labels WHERE job_id = jobs.id) \
             WHERE id IN (SELECT job_id FROM job_labels);",
    )
    .unwrap();
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// A store of `JOBS` jobs (see `fill`) behind the whole HTTP surface.
struct Filled {
    router: axum::Router,
    /// When the newest job was created.
    now: i64,
    _closing: tokio::sync::watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

async fn filled() -> Filled {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scale.db");
    let store = Engine::open(&format!("sqlite://{}", path.display())).unwrap();
    for name in ["nightly", "backup", "adhoc"] {
        store
            .apply_workflow(
                "default",
                name,
                json!({"steps": [{"id": "a", "queue": "q", "command": "c"}]}),
            )
            .await
            .unwrap();
    }
    let now = store.now().0;
    let filled = Instant::now();
    fill(&path, now);
    println!("filled {JOBS} jobs in {:.1?}", filled.elapsed());
    let (closing, closing_seen) = tokio::sync::watch::channel(false);
    Filled {
        router: app(AppState::new(store), closing_seen),
        now,
        _closing: closing,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fills a store with a million jobs: run with --ignored --nocapture"]
async fn jobs_list_pages_with_a_million_jobs() {
    let store = filled().await;
    let (router, now) = (&store.router, store.now);
    let old_from = starbridge_api::timestamp_from_millis(now - 400_000 * SPACING_MS)
        .strftime("%Y-%m-%dT%H:%M")
        .to_string();
    let old_to = starbridge_api::timestamp_from_millis(now - 399_000 * SPACING_MS)
        .strftime("%Y-%m-%dT%H:%M")
        .to_string();
    let middle = format!(
        "{}.job_{:012}",
        now - (JOBS - 500_000) * SPACING_MS,
        500_000
    );
    let cases: Vec<(&str, String, &str)> = vec![
        ("all jobs, first page", "/".into(), "100,000+</b>"),
        ("status failed", "/?status=failed".into(), "failed <b>"),
        (
            "workflow backup",
            "/?workflow=backup".into(),
            "all <b>100,000</b>",
        ),
        (
            "workflow backup, status running",
            "/?workflow=backup&status=running".into(),
            "running <b>50</b>",
        ),
        (
            "created in the last 24 hours",
            "/?range=24h".into(),
            "all <b>86,",
        ),
        (
            "failed in the last 7 days",
            "/?status=failed&range=7d".into(),
            "failed <b>",
        ),
        (
            "an old 1-hour window",
            format!("/?from={old_from}&to={old_to}"),
            "all <b>",
        ),
        ("key prefix", "/?q=order-12345".into(), "all <b>11</b>"),
        ("id prefix", "/?q=job_00000012345".into(), "all <b>10</b>"),
        (
            "label team=storage",
            "/?label=team%3Dstorage".into(),
            "all <b>100</b>",
        ),
        (
            "labels team=storage, env=prod",
            "/?label=team%3Dstorage%2C+env%3Dprod".into(),
            "all <b>50</b>",
        ),
        (
            "label tier=1 (half the jobs)",
            "/?label=tier%3D1".into(),
            "all <b title=\"more than",
        ),
        (
            "a key prefix every job has",
            "/?q=order-".into(),
            "all <b title=\"more than 2,000",
        ),
        (
            "a job's page",
            "/ui/jobs/job_000000500000".into(),
            "job_000000500000",
        ),
        (
            "a page in the middle (cursor)",
            format!("/?cursor={middle}"),
            "job_000000499999",
        ),
    ];
    println!("{:<36} {:>10} {:>10}", "page", "median", "max");
    for (name, uri, expected) in cases {
        let mut samples = Vec::with_capacity(RUNS);
        for _ in 0..RUNS + 1 {
            let request = Request::builder().uri(&uri).body(Body::empty()).unwrap();
            let started = Instant::now();
            let response = router.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            samples.push(started.elapsed());
            assert_eq!(status, StatusCode::OK, "{uri}");
            let page = String::from_utf8_lossy(&bytes);
            assert!(page.contains(expected), "{uri}: no {expected}");
        }
        // The first request warms the statement cache and the page cache.
        samples.remove(0);
        let max = *samples.iter().max().unwrap();
        println!("{name:<36} {:>10.1?} {:>10.1?}", median(samples), max);
    }
}

/// Requests per API case: enough for a 99th percentile.
const API_RUNS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fills a store with a million jobs: run with --ignored --nocapture"]
async fn the_api_job_list_with_a_million_jobs() {
    let store = filled().await;
    let router = &store.router;
    // The job in the middle of the list, and a day a week back.
    let middle = JOBS / 2;
    let cursor = format!(
        "{}.job_{middle:012}",
        store.now - (JOBS - middle) * SPACING_MS
    );
    let day_ago =
        |days: i64| starbridge_core::time::Timestamp(store.now - days * 86_400_000).to_rfc3339();
    let middle_page = format!("cursor={cursor}");
    let past_day = format!("created_after={}&created_before={}", day_ago(7), day_ago(6));
    let cases: [(&str, &str, usize); 12] = [
        ("all", "", 50),
        ("status failed", "status=failed", 50),
        (
            "workflow backup, running",
            "workflow=backup&status=running",
            50,
        ),
        ("a page in the middle (cursor)", &middle_page, 50),
        ("a day a week ago", &past_day, 50),
        ("children of a job (none)", "parent=job_000000000001", 0),
        ("team=storage (100 jobs)", "label=team%3Dstorage", 50),
        (
            "team=storage and env=prod",
            "label=team%3Dstorage&label=env%3Dprod",
            50,
        ),
        (
            "team=storage, status failed",
            "label=team%3Dstorage&status=failed",
            0,
        ),
        ("tier=1 (500,000 jobs)", "label=tier%3D1", 50),
        ("tier=1, status failed", "label=tier%3D1&status=failed", 50),
        (
            "tier=1 and team=storage (none)",
            "label=tier%3D1&label=team%3Dstorage",
            0,
        ),
    ];
    println!("{:<36} {:>10} {:>10}", "GET /api/v1/jobs?…", "p50", "p99");
    for (name, query, at_least) in cases {
        let uri = format!("/api/v1/jobs?{query}");
        let mut samples = Vec::with_capacity(API_RUNS);
        for _ in 0..API_RUNS + 1 {
            let request = Request::builder().uri(&uri).body(Body::empty()).unwrap();
            let started = Instant::now();
            let response = router.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            samples.push(started.elapsed());
            assert_eq!(status, StatusCode::OK, "{uri}");
            let list: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert!(list["items"].as_array().unwrap().len() >= at_least, "{uri}");
        }
        samples.remove(0);
        samples.sort();
        let p99 = samples[samples.len() * 99 / 100];
        println!(
            "{name:<36} {:>10.1?} {:>10.1?}",
            samples[samples.len() / 2],
            p99
        );
    }
}
