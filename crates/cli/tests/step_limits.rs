//! Steps' locks and per-key rates end to end, with real worker processes running shell
//! commands: three `starbridge server` nodes on one PostgreSQL database (a lock's slots hold
//! across the nodes, and tasks blocked on a lock never block their queue), and a rate per key on
//! both backends (a single server on SQLite, the three nodes on PostgreSQL).
//!
//! The PostgreSQL tests are skipped with a message when no PostgreSQL server is reachable,
//! unless `CI` or `STARBRIDGE_REQUIRE_POSTGRES` is set (see `starbridge_store::scratch`).

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use starbridge_store::scratch::ScratchSchema;

use common::cluster::{CLUSTER_STUCK, Cluster};
use common::{Harness, get_json, submit_job};

/// The cluster tests load the machine: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Each task notes how many tasks of the step run while it starts: it leaves a file in
/// `running` for as long as it runs, and appends the count of such files to `counts`.
const TWO_SLOTS: &str = r#"
steps:
  - id: work
    queue: shell
    lock: { key: "db-${{ params.db }}", slots: 2 }
    command: |
      touch "$E2E_DIR/running/$STARBRIDGE_TASK_ID"
      ls "$E2E_DIR/running" | wc -l >> "$E2E_DIR/counts"
      sleep 0.3
      rm "$E2E_DIR/running/$STARBRIDGE_TASK_ID"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_lock_with_2_slots_runs_at_most_2_tasks_across_3_nodes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(schema) = ScratchSchema::create("step_lock_slots") else {
        return;
    };
    let mut cluster = Cluster::start(schema, 3).await;
    std::fs::create_dir(cluster.dir.path().join("running")).unwrap();
    cluster.apply(0, "locked", TWO_SLOTS).await;
    for node in 0..3 {
        cluster.start_worker(node, &format!("worker-{node}"));
    }
    let ids = cluster
        .submit_each("locked", vec![json!({"db": "x"}); 12])
        .await;
    let jobs = cluster.wait_all_ended(&ids).await;
    for job in &jobs {
        assert_eq!(job["status"], "succeeded", "{job:#}");
    }
    let counts: Vec<u32> = std::fs::read_to_string(cluster.dir.path().join("counts"))
        .unwrap()
        .lines()
        .map(|line| line.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 12, "one count per task");
    assert_eq!(
        counts.iter().max(),
        Some(&2),
        "2 slots, used at once: {counts:?}"
    );
}

/// The holder of the lock runs until the test lets it end (it creates `open`).
const GATE: &str = r#"
steps:
  - id: hold
    queue: shell
    lock: { key: gate }
    command: 'while [ ! -e "$E2E_DIR/open" ]; do sleep 0.1; done'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_claims_a_free_task_behind_1000_tasks_blocked_on_a_step_lock() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(schema) = ScratchSchema::create("step_lock_queue") else {
        return;
    };
    let mut cluster = Cluster::start(schema, 3).await;
    cluster.apply(0, "gated", GATE).await;
    cluster
        .apply(
            0,
            "free",
            "steps:\n- {id: go, queue: shell, command: 'true'}\n",
        )
        .await;
    cluster.start_worker(0, "worker-0");
    let holder = cluster.submit_each("gated", vec![Value::Null]).await;
    let base = cluster.nodes[1].url.clone();
    wait_for_task(&cluster.http, &base, &holder[0], |task| {
        task["status"] == "running"
    })
    .await;
    let blocked = cluster
        .submit_each("gated", (0..1000).map(|n| json!({"n": n})).collect())
        .await;
    let free = cluster.submit_each("free", vec![Value::Null]).await;
    let ended = cluster.wait_all_ended(&free).await;
    assert_eq!(ended[0]["status"], "succeeded", "{:#}", ended[0]);
    let holder_job = get_json(&cluster.http, &format!("{base}/api/v1/jobs/{}", holder[0])).await;
    assert_eq!(
        holder_job["tasks"][0]["status"], "running",
        "the slot is still held"
    );
    for id in [&blocked[0], &blocked[999]] {
        let task = wait_for_task(&cluster.http, &base, id, |task| task["status"] == "ready").await;
        assert_eq!(
            task["waiting_reason"], "waiting for lock gate (1/1 held)",
            "{task:#}"
        );
    }
    // The holder's shell loop ends with the test.
    std::fs::write(cluster.dir.path().join("open"), "").unwrap();
}

/// At most 2 starts per key per hour: within a test, a third task of a key never starts.
const RATED: &str = r#"
steps:
  - id: call
    queue: shell
    rate: { key: "${{ params.tenant }}", limit: 2/1h }
    command: 'true'
"#;

/// Submits 3 jobs of tenant `a` and 3 of tenant `b` through `base`: 2 of each key succeed (which
/// 2 is up to the claims of the nodes), and the third of each waits ready, rate limited on its
/// own key.
async fn three_per_key_of_which_2_start(http: &reqwest::Client, base: &str) {
    let mut jobs = Vec::new();
    for tenant in ["a", "a", "a", "b", "b", "b"] {
        jobs.push((
            tenant,
            submit_job(http, base, "rated", json!({"tenant": tenant})).await,
        ));
    }
    let deadline = Instant::now() + CLUSTER_STUCK;
    loop {
        let mut tasks = Vec::new();
        for (tenant, id) in &jobs {
            let job = get_json(http, &format!("{base}/api/v1/jobs/{id}")).await;
            tasks.push((*tenant, job["tasks"][0].clone()));
        }
        let settled = ["a", "b"].iter().all(|tenant| {
            let of_tenant = || {
                tasks
                    .iter()
                    .filter(|(t, _)| t == tenant)
                    .map(|(_, task)| task)
            };
            let succeeded = of_tenant()
                .filter(|task| task["status"] == "succeeded")
                .count();
            let expected = format!("rate limited on key {tenant} (2 per 1h)");
            let limited = of_tenant()
                .filter(|task| task["status"] == "ready" && task["waiting_reason"] == *expected)
                .count();
            (succeeded, limited) == (2, 1)
        });
        if settled {
            return;
        }
        assert!(Instant::now() < deadline, "stuck: {tasks:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_rate_holds_per_key_and_not_across_keys_on_sqlite() {
    let mut h = Harness::start().await;
    h.apply("rated", RATED).await;
    h.start_worker("w1", "shell");
    three_per_key_of_which_2_start(&h.http, &h.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_rate_holds_per_key_and_not_across_keys_across_3_nodes() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(schema) = ScratchSchema::create("step_rate_keys") else {
        return;
    };
    let mut cluster = Cluster::start(schema, 3).await;
    cluster.apply(0, "rated", RATED).await;
    for node in 0..3 {
        cluster.start_worker(node, &format!("worker-{node}"));
    }
    let base = cluster.nodes[2].url.clone();
    three_per_key_of_which_2_start(&cluster.http, &base).await;
}

/// The job's first task once `ready` holds for it, as `GET /api/v1/jobs/{id}` shows it.
async fn wait_for_task(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + CLUSTER_STUCK;
    loop {
        let job = get_json(http, &format!("{base}/api/v1/jobs/{id}")).await;
        let task = &job["tasks"][0];
        if ready(task) {
            return task.clone();
        }
        assert!(Instant::now() < deadline, "stuck: {job:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
