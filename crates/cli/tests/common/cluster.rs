//! Several `starbridge server` nodes on one PostgreSQL scratch schema, with real worker
//! processes each connected to a node (see cluster.rs and step_limits.rs).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use starbridge_store::scratch::ScratchSchema;

use super::{BIN, free_port};

/// How long a cluster run may take before it is declared stuck (a liveness bound, not a
/// benchmark).
pub(crate) const CLUSTER_STUCK: Duration = Duration::from_secs(300);

/// Calls of `submit_each`, which keep the job keys of each call apart.
static BATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub(crate) struct Node {
    pub(crate) url: String,
    pub(crate) listen: String,
    pub(crate) process: Option<Child>,
}

pub(crate) struct Cluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) database: String,
    pub(crate) nodes: Vec<Node>,
    pub(crate) workers: Vec<Child>,
    pub(crate) http: reqwest::Client,
    // Dropped last: the nodes and workers are gone by then.
    _schema: ScratchSchema,
}

impl Cluster {
    pub(crate) async fn start(schema: ScratchSchema, nodes: usize) -> Cluster {
        // reqwest is built without a default crypto provider: the process chooses `ring`.
        starbridge_server::tls::install_crypto_provider();
        let mut cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
            database: schema.url.clone(),
            nodes: Vec::new(),
            workers: Vec::new(),
            http: reqwest::Client::new(),
            _schema: schema,
        };
        for _ in 0..nodes {
            let port = free_port();
            cluster.nodes.push(Node {
                url: format!("http://127.0.0.1:{port}"),
                listen: format!("127.0.0.1:{port}"),
                process: None,
            });
        }
        // All nodes start at once: their migrations must not race.
        for index in 0..nodes {
            cluster.spawn_node(index);
        }
        for index in 0..nodes {
            cluster.wait_healthy(index).await;
        }
        cluster
    }

    pub(crate) fn spawn_node(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let child = Command::new(BIN)
            .args([
                "server",
                "--listen",
                &node.listen,
                "--database",
                &self.database,
            ])
            .args(["--db-lock-timeout", "100ms", "--db-connect-timeout", "2s"])
            .env("STARBRIDGE_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        node.process = Some(child);
    }

    pub(crate) async fn wait_healthy(&self, index: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.healthy(index).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {index} did not become healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn healthy(&self, index: usize) -> bool {
        let url = format!("{}/healthz", self.nodes[index].url);
        matches!(self.http.get(url).send().await, Ok(r) if r.status().is_success())
    }

    pub(crate) fn kill_node(&mut self, index: usize) {
        if let Some(mut process) = self.nodes[index].process.take() {
            process.kill().unwrap(); // SIGKILL: no shutdown code runs
            process.wait().unwrap();
        }
    }

    pub(crate) fn start_worker(&mut self, node: usize, name: &str) {
        let child = Command::new(BIN)
            .args(["worker", "--queue", "shell", "--concurrency", "12"])
            .args(["--worker-id", name, "--server", &self.nodes[node].url])
            .env("STARBRIDGE_LOG", "error")
            .env("E2E_DIR", self.dir.path())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.workers.push(child);
    }

    pub(crate) async fn apply(&self, node: usize, name: &str, yaml: &str) {
        super::apply_yaml(&self.http, &self.nodes[node].url, name, yaml).await;
    }

    /// Submits `count` jobs, spread over the nodes, 16 requests at a time; returns their ids.
    pub(crate) async fn submit_many(&self, workflow: &str, count: usize) -> Vec<String> {
        self.submit_each(workflow, vec![Value::Null; count]).await
    }

    /// Submits one job of `workflow` per params (`null`: none), spread over the nodes, 16
    /// requests at a time; returns their ids in the order of `params`.
    pub(crate) async fn submit_each(&self, workflow: &str, params: Vec<Value>) -> Vec<String> {
        let count = params.len();
        let batch = BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut ids = vec![String::new(); count];
        let mut pending = tokio::task::JoinSet::new();
        for (n, params) in params.into_iter().enumerate() {
            let url = format!("{}/api/v1/jobs", self.nodes[n % self.nodes.len()].url);
            let (http, workflow) = (self.http.clone(), workflow.to_owned());
            pending.spawn(async move {
                // As a real client would: a 503 is retried, and the key makes that safe.
                let key = format!("{workflow}-{batch}-{n}");
                let mut body = json!({"workflow": workflow, "key": key});
                if !params.is_null() {
                    body["params"] = params;
                }
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let response = http.post(&url).json(&body).send().await.unwrap();
                    if response.status().is_success() {
                        let job: Value = response.json().await.unwrap();
                        return (n, job["id"].as_str().unwrap().to_owned());
                    }
                    assert_eq!(response.status(), 503, "submit refused");
                    assert!(Instant::now() < deadline, "submit kept failing");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            if pending.len() >= 16 {
                let (n, id) = pending.join_next().await.unwrap().unwrap();
                ids[n] = id;
            }
        }
        while let Some(done) = pending.join_next().await {
            let (n, id) = done.unwrap();
            ids[n] = id;
        }
        ids
    }

    /// Every job, read from the first live node, once none is running any more.
    pub(crate) async fn wait_all_ended(&self, ids: &[String]) -> Vec<Value> {
        let deadline = Instant::now() + CLUSTER_STUCK;
        let node = self
            .nodes
            .iter()
            .find(|node| node.process.is_some())
            .expect("a live node");
        let mut ended = HashMap::new();
        loop {
            for id in ids {
                if ended.contains_key(id) {
                    continue;
                }
                let url = format!("{}/api/v1/jobs/{id}", node.url);
                if let Ok(response) = self.http.get(url).send().await
                    && response.status().is_success()
                    && let Ok(job) = response.json::<Value>().await
                    && [
                        "succeeded",
                        "failed",
                        "cancelled",
                        "timed_out",
                        "compensation_failed",
                    ]
                    .contains(&job["status"].as_str().unwrap_or(""))
                {
                    ended.insert(id.clone(), job);
                }
            }
            if ended.len() == ids.len() {
                return ids.iter().map(|id| ended.remove(id).unwrap()).collect();
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} jobs never ended",
                ids.len() - ended.len(),
                ids.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        for index in 0..self.nodes.len() {
            self.kill_node(index);
        }
    }
}
