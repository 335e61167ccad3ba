//! Several server nodes on one PostgreSQL database: three real `starbridge server` processes on
//! a scratch schema of the test server, real worker processes each connected to a different
//! node, and a thousand-plus jobs of a four-step DAG. Also: kill -9 of a node mid-run, and the
//! database stopped mid-run (the nodes report unhealthy) and started again (they recover alone).
//!
//! Skipped with a message when no PostgreSQL server is reachable, unless `CI` or
//! `STARBRIDGE_REQUIRE_POSTGRES` is set (see `starbridge_store::scratch`).

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use starbridge_store::scratch::ScratchSchema;

use common::cluster::Cluster;

/// How long a run may take before it is declared stuck (a liveness bound, not a benchmark).
const STUCK: Duration = Duration::from_secs(300);

/// The tests of this file restart the database and load the machine: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A diamond: `a`, then `b` and `c` in parallel, then `d`. Every attempt appends its idempotency
/// key (task and attempt) to one file, so a side effect run twice for an attempt shows.
const DIAMOND: &str = r#"
steps:
  - id: a
    queue: shell
    command: echo "$STARBRIDGE_IDEMPOTENCY_KEY" >> "$E2E_DIR/effects"
    timeout: 3s
    retry: { max_attempts: 20, initial: 100ms, max_interval: 1s }
  - id: b
    queue: shell
    command: echo "$STARBRIDGE_IDEMPOTENCY_KEY" >> "$E2E_DIR/effects"
    depends_on: [a]
    timeout: 3s
    retry: { max_attempts: 20, initial: 100ms, max_interval: 1s }
  - id: c
    queue: shell
    command: echo "$STARBRIDGE_IDEMPOTENCY_KEY" >> "$E2E_DIR/effects"
    depends_on: [a]
    timeout: 3s
    retry: { max_attempts: 20, initial: 100ms, max_interval: 1s }
  - id: d
    queue: shell
    command: echo "$STARBRIDGE_IDEMPOTENCY_KEY" >> "$E2E_DIR/effects"
    depends_on: [b, c]
    timeout: 3s
    retry: { max_attempts: 20, initial: 100ms, max_interval: 1s }
"#;

impl Cluster {
    fn effects(&self) -> Vec<String> {
        read_effects(self.dir.path())
    }

    /// Waits until at least `count` side effects happened.
    async fn wait_for_effects(&self, count: usize) {
        let deadline = Instant::now() + STUCK;
        while self.effects().len() < count {
            assert!(Instant::now() < deadline, "the run stalled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn read_effects(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("effects"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Checks every job succeeded with all four tasks, and no attempt's side effect ran twice.
fn assert_all_succeeded_once_per_attempt(jobs: &[Value], effects: &[String]) {
    let failed: Vec<&Value> = jobs.iter().filter(|j| j["status"] != "succeeded").collect();
    assert!(failed.is_empty(), "jobs did not succeed: {:#}", failed[0]);
    for job in jobs {
        let tasks = job["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 4, "{job:#}");
        assert!(tasks.iter().all(|t| t["status"] == "succeeded"), "{job:#}");
    }
    let unique: HashSet<&String> = effects.iter().collect();
    assert_eq!(
        unique.len(),
        effects.len(),
        "an attempt's side effect ran twice"
    );
    let succeeded_attempts: usize = jobs
        .iter()
        .flat_map(|job| job["tasks"].as_array().unwrap())
        .map(|task| task["attempt"].as_u64().unwrap() as usize)
        .sum();
    assert!(
        effects.len() <= succeeded_attempts,
        "{} side effects for {succeeded_attempts} attempts",
        effects.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_run_1200_jobs_with_every_task_claimed_exactly_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(schema) = ScratchSchema::create("cluster_once") else {
        return;
    };
    let mut cluster = Cluster::start(schema, 3).await;
    cluster.apply(0, "diamond", DIAMOND).await;
    for node in 0..3 {
        cluster.start_worker(node, &format!("worker-{node}"));
    }
    let ids = cluster.submit_many("diamond", 1200).await;
    let jobs = cluster.wait_all_ended(&ids).await;
    let effects = cluster.effects();
    assert_all_succeeded_once_per_attempt(&jobs, &effects);
    // Nothing failed and no lease lapsed: every task ran exactly once, on a single claim.
    assert_eq!(effects.len(), 1200 * 4);
    for job in &jobs {
        for task in job["tasks"].as_array().unwrap() {
            assert_eq!(task["attempt"], 1, "a task was claimed twice: {job:#}");
            assert_eq!(task["attempts"].as_array().unwrap().len(), 1, "{job:#}");
        }
    }
    let workers: HashSet<&str> = jobs
        .iter()
        .flat_map(|job| job["tasks"].as_array().unwrap())
        .map(|task| task["worker_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        workers.len(),
        3,
        "every node's worker got work: {workers:?}"
    );
}

/// A parent's cancel on one node races its child's completion on another: whichever commits
/// first, the parent ends `cancelled`, and its child ends `cancelled` too (cancelled while it
/// ran, or rolled back after it succeeded), with no deadlock between the nodes (parent rows are
/// always locked before child rows) and each child's work run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_cancel_racing_its_childs_completion_on_two_nodes_ends_both_cancelled() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(schema) = ScratchSchema::create("cluster_children") else {
        return;
    };
    let mut cluster = Cluster::start(schema, 2).await;
    cluster
        .apply(
            0,
            "child",
            "steps:\n- {id: work, queue: shell, command: 'echo \"$STARBRIDGE_IDEMPOTENCY_KEY\" >> \"$E2E_DIR/effects\"', compensate: {queue: shell, command: 'true'}}\n",
        )
        .await;
    cluster
        .apply(
            0,
            "parent",
            "steps:\n- {id: run, workflow: child}\n- {id: after, queue: shell, command: 'sleep 1'}\n",
        )
        .await;
    cluster.start_worker(0, "worker-0");
    let parents = cluster.submit_many("parent", 60).await;
    let mut cancels = tokio::task::JoinSet::new();
    for id in &parents {
        let url = format!("{}/api/v1/jobs/{id}/cancel", cluster.nodes[1].url);
        let http = cluster.http.clone();
        cancels.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let response = http
                    .post(&url)
                    .json(&json!({"compensate": true}))
                    .send()
                    .await
                    .unwrap();
                match response.status().as_u16() {
                    200 | 409 => return,
                    503 => assert!(Instant::now() < deadline, "cancel kept failing"),
                    other => panic!("cancel answered {other}"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    while let Some(done) = cancels.join_next().await {
        done.unwrap();
    }
    let jobs = cluster.wait_all_ended(&parents).await;
    let mut children = Vec::new();
    for job in &jobs {
        assert_eq!(job["status"], "cancelled", "{job:#}");
        children.extend(
            job["children"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_owned()),
        );
    }
    assert_eq!(children.len(), parents.len(), "one child each");
    for child in cluster.wait_all_ended(&children).await {
        assert_eq!(child["status"], "cancelled", "{child:#}");
    }
    let effects = cluster.effects();
    let unique: HashSet<&String> = effects.iter().collect();
    assert_eq!(unique.len(), effects.len(), "a child's attempt ran twice");
}

/// Runs `pg_ctlcluster <version> main <action>` on the test server's PostgreSQL cluster; false
/// when that is not possible here (no cluster tools, not allowed).
fn postgres_cluster(action: &str) -> bool {
    let Ok(versions) = std::fs::read_dir("/etc/postgresql") else {
        return false;
    };
    let Some(version) = versions
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .next()
    else {
        return false;
    };
    Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .status()
        .is_ok_and(|status| status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_and_a_database_outage_lose_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(schema) = ScratchSchema::create("cluster_faults") else {
        return;
    };
    let mut cluster = Cluster::start(schema, 3).await;
    cluster.apply(0, "diamond", DIAMOND).await;
    for node in 0..3 {
        cluster.start_worker(node, &format!("worker-{node}"));
    }
    let ids = cluster.submit_many("diamond", 1000).await;

    // kill -9 of a node mid-run: the tasks its worker held are retried by the others once their
    // leases lapse (its worker keeps running, cut off from the cluster).
    cluster.wait_for_effects(1000).await;
    cluster.kill_node(2);

    // The database goes away mid-run: the nodes say so on /healthz; it comes back, and they
    // reconnect by themselves.
    cluster.wait_for_effects(2000).await;
    if postgres_cluster("stop") {
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.healthy(0).await {
            assert!(
                Instant::now() < deadline,
                "a node without its database stays healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(postgres_cluster("start"), "PostgreSQL did not start again");
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to stop and start PostgreSQL (pg_ctlcluster)"
        );
        eprintln!("SKIPPED the database outage: pg_ctlcluster is not available to this user");
    }
    for node in 0..2 {
        cluster.wait_healthy(node).await;
    }

    let jobs = cluster.wait_all_ended(&ids).await;
    let effects = cluster.effects();
    assert_all_succeeded_once_per_attempt(&jobs, &effects);
    assert!(effects.len() >= 4000);
}
