//! `starbridge top` against a real server process with a real shell worker: the figures of
//! jobs that succeeded and failed show up once the server's rollup counted them, as JSON and
//! as the terminal table, and a bad window is refused naming the parameter.

mod common;

use std::time::Instant;

use serde_json::Value;

use common::{Harness, STUCK, succeeded};

const GOOD: &str = "steps:\n- {id: a, queue: shell, command: 'true'}\n";
const BAD: &str = "steps:\n- {id: a, queue: shell, command: 'false', retry: {max_attempts: 1}}\n";

fn totals<'a>(stats: &'a Value, name: &str) -> Option<&'a Value> {
    stats["workflows"]
        .as_array()?
        .iter()
        .find(|series| series["name"] == name)
        .map(|series| &series["totals"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_once_shows_the_jobs_that_ran_per_workflow_and_queue() {
    let mut h = Harness::start().await;
    h.apply("good", GOOD).await;
    h.apply("bad", BAD).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(h.submit("good", serde_json::json!({})).await);
    }
    for _ in 0..2 {
        jobs.push(h.submit("bad", serde_json::json!({})).await);
    }
    h.start_worker("top-worker", "shell");
    for job in &jobs {
        h.wait_for_end(job).await;
    }

    // The rollup counts events a few seconds old, every few seconds: wait for it.
    let deadline = Instant::now() + STUCK;
    let stats = loop {
        let output = h.cli(&["top", "--once", "-o", "json"]);
        succeeded(&output);
        let stats: Value = serde_json::from_slice(&output.stdout).unwrap();
        let counted = |name: &str, field: &str| {
            totals(&stats, name).map_or(0, |totals| totals[field].as_u64().unwrap())
        };
        if counted("good", "succeeded") == 3 && counted("bad", "failed") == 2 {
            break stats;
        }
        assert!(Instant::now() < deadline, "not counted: {stats}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let good = totals(&stats, "good").unwrap();
    assert_eq!(
        (good["started"].as_u64(), good["failed"].as_u64()),
        (Some(3), Some(0))
    );
    let bad = totals(&stats, "bad").unwrap();
    assert_eq!(
        (bad["started"].as_u64(), bad["succeeded"].as_u64()),
        (Some(2), Some(0))
    );
    let shell = stats["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|series| series["name"] == "shell")
        .unwrap();
    assert_eq!(shell["totals"]["succeeded"], 3);
    assert_eq!(shell["totals"]["failed"], 2);

    let output = h.cli(&["top", "--once"]);
    succeeded(&output);
    let text = String::from_utf8(output.stdout).unwrap();
    let line = |name: &str| -> Vec<String> {
        text.lines()
            .find(|line| line.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line for {name}: {text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(line("good")[1..4], ["3", "3", "0"], "{text}");
    assert_eq!(line("bad")[1..4], ["2", "0", "2"], "{text}");
    assert_eq!(line("shell")[1..4], ["5", "3", "2"], "{text}");
    assert!(
        text.contains("WORKFLOW") && text.contains("OLDEST WAIT"),
        "{text}"
    );

    let refused = h.cli(&["top", "--once", "--window", "2h"]);
    assert!(!refused.status.success());
    let error = String::from_utf8(refused.stderr).unwrap();
    assert!(error.contains("window"), "{error}");
}
