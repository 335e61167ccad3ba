//! `starbridge bench` end to end: the real binary runs each workload at a small size with
//! `-o json`. The test checks correctness figures and that every figure is present — never
//! throughput or latency values, which depend on the machine.

mod common;

use std::process::Command;

use serde_json::Value;

use common::{KillOnDrop, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_starbridge");

/// Runs the benchmark with `args` and returns its JSON report; fails on a non-zero exit.
fn bench(args: &[&str]) -> Value {
    let output = Command::new(BIN)
        .arg("bench")
        .args(args)
        .args(["-o", "json"])
        .env("STARBRIDGE_LOG", "warn")
        .output()
        .expect("the starbridge binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|error| panic!("bench {args:?} printed no JSON ({error}):\n{stdout}"))
}

fn assert_latency(report: &Value, key: &str) {
    let latency = &report["latency_ms"][key];
    for field in ["count", "p50", "p90", "p99", "p99_9", "max"] {
        assert!(
            latency[field].is_number(),
            "latency_ms.{key}.{field}: {report:#}"
        );
    }
    assert!(
        latency["count"].as_u64().unwrap() > 0,
        "latency_ms.{key}: {report:#}"
    );
}

fn assert_throughput(report: &Value, key: &str) {
    let rate = &report["throughput"][key];
    for field in ["count", "seconds", "per_second"] {
        assert!(
            rate[field].is_number(),
            "throughput.{key}.{field}: {report:#}"
        );
    }
}

/// Every job succeeded, each task ran once, nothing else was found.
fn assert_correct(report: &Value, jobs: u64, tasks_per_job: u64) {
    let correctness = &report["correctness"];
    assert_eq!(correctness["ok"], true, "{report:#}");
    assert_eq!(correctness["anomaly_count"], 0, "{report:#}");
    assert_eq!(correctness["anomalies"], Value::Array(Vec::new()));
    assert_eq!(correctness["submit_errors"], 0);
    let submitted = correctness["jobs_submitted"].as_u64().unwrap();
    assert!(submitted >= jobs, "{report:#}");
    assert_eq!(correctness["jobs_succeeded"].as_u64(), Some(submitted));
    let by_status = correctness["jobs_by_status"].as_object().unwrap();
    assert_eq!(by_status.len(), 1, "{report:#}");
    assert_eq!(by_status["succeeded"].as_u64(), Some(submitted));
    assert_eq!(
        correctness["tasks_checked"].as_u64(),
        Some(submitted * tasks_per_job)
    );
    assert_eq!(
        correctness["handler_invocations"].as_u64(),
        Some(submitted * tasks_per_job)
    );
    assert_eq!(correctness["tasks_not_attempt_1"], 0);
    assert_eq!(correctness["duplicate_invocations"], 0);
}

fn assert_common(report: &Value, workload: &str) {
    assert_eq!(report["workload"], workload);
    assert_eq!(report["resources"]["server"], "in this process");
    if !report["database"]["url"]
        .as_str()
        .unwrap()
        .starts_with("postgres")
    {
        assert_eq!(
            report["durability"],
            "sqlite WAL, synced before each answer"
        );
    }
    for field in [
        "database_bytes_before",
        "database_bytes_after",
        "database_growth_bytes",
        "db_file_bytes_after",
        "wal_file_bytes_after",
    ] {
        assert!(report["resources"][field].is_number(), "resources.{field}");
    }
    assert!(report["resources"].get("peak_rss_bytes").is_some());
    assert!(report["wall_seconds"].is_number());
    assert!(report["verification_seconds"].is_number());
    assert_eq!(report["database"]["kept"], false);
}

#[test]
fn every_workload_runs_each_job_exactly_once() {
    let single = bench(&["--workload", "single", "--jobs", "200"]);
    assert_common(&single, "single");
    assert_correct(&single, 400, 1);
    for key in [
        "submit",
        "drain",
        "end_to_end_full",
        "end_to_end",
        "end_to_end_completed",
    ] {
        assert_throughput(&single, key);
    }
    assert!(single["throughput"]["end_to_end"]["target_per_second"].is_number());
    for key in [
        "submit_request",
        "submit_request_loaded",
        "submit_to_start",
        "submit_to_complete",
    ] {
        assert_latency(&single, key);
    }

    let chain = bench(&["--workload", "chain", "--jobs", "5"]);
    assert_common(&chain, "chain");
    assert_correct(&chain, 5, 10);
    for key in ["submit", "steps", "steps_one_at_a_time", "jobs"] {
        assert_throughput(&chain, key);
    }
    // A step run alone costs about one group commit: its report and the claim of the next step
    // go together, and the waiting polls are not woken for the step that claim took.
    let alone = &chain["throughput"]["steps_one_at_a_time"];
    let (steps, commits) = (alone["count"].as_u64(), alone["work"]["commits"].as_u64());
    assert_eq!(steps, Some(50), "{chain:#}");
    assert!(
        commits.is_some_and(|commits| commits <= 2 * 50),
        "{chain:#}"
    );
    assert_latency(&chain, "submit_request");
    for how in ["all_at_once", "one_at_a_time"] {
        for key in ["step_overhead", "step_handoff", "step_gap", "job"] {
            assert_latency(&chain, &format!("{key}_{how}"));
        }
    }

    let fanout = bench(&["--workload", "fanout", "--jobs", "2"]);
    assert_common(&fanout, "fanout");
    assert_correct(&fanout, 2, 102);
    for key in ["submit", "tasks", "tasks_one_at_a_time", "jobs"] {
        assert_throughput(&fanout, key);
    }
    assert_latency(&fanout, "submit_request");
    for how in ["all_at_once", "one_at_a_time"] {
        for key in ["fan_out_ready", "fan_out", "fan_in_ready", "fan_in", "job"] {
            assert_latency(&fanout, &format!("{key}_{how}"));
        }
    }
}

#[test]
fn batched_and_backlog_runs_are_checked_the_same_way() {
    let single = bench(&["--workload", "single", "--jobs", "300", "--batch", "50"]);
    assert_common(&single, "single");
    assert_correct(&single, 600, 1);
    assert_eq!(single["config"]["batch"], 50);
    for key in ["submit", "drain", "end_to_end"] {
        assert_throughput(&single, key);
    }

    let backlog = bench(&["--workload", "backlog", "--jobs", "100"]);
    assert_common(&backlog, "backlog");
    // The finished and ready fills, and a sample per worker count and store state.
    assert_correct(&backlog, 100 * 2 + 100 * 4, 1);
    for key in ["fill_submit", "fill_drain"] {
        assert_throughput(&backlog, key);
    }
    for store in ["empty", "backlog"] {
        for workers in ["1w", "8w"] {
            for what in ["claim", "complete", "claim_complete"] {
                assert_latency(&backlog, &format!("{what}_{store}_{workers}"));
            }
        }
    }
}

#[test]
fn a_run_on_postgresql_uses_a_schema_of_its_own() {
    // Skipped (with a message) when no PostgreSQL test server answers and none is required.
    let Some(probe) = starbridge_store::scratch::ScratchSchema::create("bench_probe") else {
        return;
    };
    drop(probe);
    let server = starbridge_store::scratch::server_url();
    let single = bench(&[
        "--workload",
        "single",
        "--jobs",
        "100",
        "--batch",
        "20",
        "--database",
        &server,
    ]);
    assert_common(&single, "single");
    assert_correct(&single, 100, 1);
    let durability = single["durability"].as_str().unwrap();
    assert!(
        durability.starts_with("postgresql synchronous_commit="),
        "{durability}"
    );
    assert!(
        single["resources"]["database_growth_bytes"]
            .as_i64()
            .unwrap()
            > 0
    );
}

#[test]
fn an_existing_database_is_refused_without_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taken.db");
    std::fs::write(&path, b"").unwrap();
    let output = Command::new(BIN)
        .args(["bench", "--jobs", "1", "--database"])
        .arg(format!("sqlite://{}", path.display()))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--reuse"), "{stderr}");
}

#[test]
fn a_run_against_an_external_server_reads_its_memory_and_writer_from_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("external.db").display());
    let port = free_port();
    let _server = KillOnDrop(
        Command::new(BIN)
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", &database])
            .env("STARBRIDGE_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("the server starts"),
    );
    // A liveness bound, not a measurement: the server listens once its database is open.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let url = format!("http://127.0.0.1:{port}");
    let single = bench(&[
        "--workload",
        "single",
        "--jobs",
        "100",
        "--batch",
        "20",
        "--servers",
        &url,
        "--database",
        &database,
    ]);
    assert_correct(&single, 200, 1);
    assert_eq!(single["resources"]["server"], "external");
    assert!(single["resources"]["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(
        single["resources"]["database_growth_bytes"]
            .as_i64()
            .unwrap()
            > 0
    );
    let drain = &single["throughput"]["drain"]["work"];
    assert!(drain["commits"].as_u64().unwrap() > 0, "{single:#}");
    assert!(
        drain["cpu_ms_per_item"].as_f64().unwrap() > 0.0,
        "{single:#}"
    );
}
