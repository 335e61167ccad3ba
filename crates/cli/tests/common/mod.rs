//! Helpers the end-to-end test files share. Each test file is a crate of its own and uses only
//! some of them.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub(crate) mod cluster;

/// A loopback port nothing listens on at the moment.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process killed when the test ends, however it ends.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `starbridge` command serving on a free loopback port, killed when dropped.
pub(crate) struct Served {
    pub(crate) process: KillOnDrop,
    pub(crate) port: u16,
}

impl Served {
    /// Starts `command` (the subcommand, its database and flags) listening on a free loopback
    /// port, and waits until its `/healthz` answers 200.
    pub(crate) fn start(mut command: std::process::Command) -> Served {
        let port = free_port();
        command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdin(std::process::Stdio::null());
        let served = Served {
            process: KillOnDrop(command.spawn().unwrap()),
            port,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while health_status(port) != Some(200) {
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not become healthy"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        served
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The status `GET /healthz` answers on a loopback port, if anything answers there.
fn health_status(port: u16) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    text.split(' ').nth(1)?.parse().ok()
}

/// Applies a YAML workflow definition through the API at `base`; panics unless it is taken.
pub(crate) async fn apply_yaml(http: &reqwest::Client, base: &str, name: &str, yaml: &str) {
    let response = http
        .put(format!("{base}/api/v1/workflows/{name}"))
        .header("content-type", "application/yaml")
        .body(yaml.to_owned())
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "apply failed: {}",
        response.text().await.unwrap()
    );
}

/// Submits a job of `workflow` with `params` through the API at `base`; returns its id.
pub(crate) async fn submit_job(
    http: &reqwest::Client,
    base: &str,
    workflow: &str,
    params: Value,
) -> String {
    let response: Value = http
        .post(format!("{base}/api/v1/jobs"))
        .json(&json!({"workflow": workflow, "params": params}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    response["id"].as_str().expect("job id").to_owned()
}

/// The JSON answer of `GET url`.
pub(crate) async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

pub(crate) async fn get_text(http: &reqwest::Client, url: &str) -> String {
    http.get(url).send().await.unwrap().text().await.unwrap()
}

/// A webhook subscription's deliveries, newest first, as the API at `base` lists them.
pub(crate) async fn webhook_deliveries(
    http: &reqwest::Client,
    base: &str,
    webhook: &str,
) -> serde_json::Value {
    get_json(
        http,
        &format!("{base}/api/v1/webhooks/{webhook}/deliveries"),
    )
    .await
}

/// A `starbridge server` process on a SQLite file of a temporary folder, with worker
/// processes, restartable (`kill_server` is a kill -9), and an HTTP client for its API.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_starbridge");
/// How long a test waits for a job before declaring it stuck (a liveness bound, not a benchmark).
pub(crate) const STUCK: Duration = Duration::from_secs(90);

pub(crate) struct Harness {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) port: u16,
    pub(crate) url: String,
    pub(crate) server: Option<Child>,
    pub(crate) workers: Vec<Child>,
    pub(crate) http: reqwest::Client,
    /// More flags for every server start.
    pub(crate) server_flags: Vec<String>,
    /// The PostgreSQL schema the server runs on (`start_on_postgres`); `None`: a SQLite file.
    pub(crate) postgres: Option<starbridge_store::scratch::ScratchSchema>,
}

impl Harness {
    pub(crate) async fn start() -> Harness {
        Harness::start_with(&[]).await
    }

    /// A harness whose server runs on a scratch schema of the test PostgreSQL server; `None`
    /// (the test is skipped, with a message) when that server cannot be reached outside CI.
    pub(crate) async fn start_on_postgres(label: &str) -> Option<Harness> {
        Harness::start_on_postgres_with(label, &[]).await
    }

    /// `start_on_postgres` with more server flags.
    pub(crate) async fn start_on_postgres_with(
        label: &str,
        server_flags: &[&str],
    ) -> Option<Harness> {
        let schema = starbridge_store::scratch::ScratchSchema::create(label)?;
        Some(Harness::start_on(Some(schema), server_flags).await)
    }

    /// A harness whose server also takes `server_flags`.
    pub(crate) async fn start_with(server_flags: &[&str]) -> Harness {
        Harness::start_on(None, server_flags).await
    }

    async fn start_on(
        postgres: Option<starbridge_store::scratch::ScratchSchema>,
        server_flags: &[&str],
    ) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // reqwest is built without a default crypto provider: the process chooses `ring`.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut harness = Harness {
            url: format!("http://127.0.0.1:{port}"),
            dir,
            port,
            server: None,
            workers: Vec::new(),
            http: reqwest::Client::new(),
            server_flags: server_flags.iter().map(|flag| (*flag).to_owned()).collect(),
            postgres,
        };
        harness.start_server().await;
        harness
    }

    pub(crate) fn database(&self) -> PathBuf {
        self.dir.path().join("e2e.db")
    }

    pub(crate) async fn start_server(&mut self) {
        let child = Command::new(BIN)
            .args(["server", "--listen", &format!("127.0.0.1:{}", self.port)])
            // The webhook test's receiver listens on loopback, which webhooks may not reach
            // by default.
            .args(["--webhook-allow", "127.0.0.1"])
            .arg("--database")
            .arg(match &self.postgres {
                Some(schema) => schema.url.clone(),
                None => format!("sqlite://{}", self.database().display()),
            })
            .args(&self.server_flags)
            .env("STARBRIDGE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = self.http.get(format!("{}/healthz", self.url)).send().await
                && response.status().is_success()
            {
                return;
            }
            assert!(Instant::now() < deadline, "server did not become healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn kill_server(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill().unwrap(); // SIGKILL: no shutdown code runs
            server.wait().unwrap();
        }
    }

    pub(crate) fn start_worker(&mut self, name: &str, queue: &str) -> usize {
        self.start_worker_with(name, queue, &[], &[])
    }

    /// A worker process with more flags and environment variables.
    pub(crate) fn start_worker_with(
        &mut self,
        name: &str,
        queue: &str,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let child = Command::new(BIN)
            .args([
                "worker",
                "--queue",
                queue,
                "--worker-id",
                name,
                "--server",
                &self.url,
            ])
            .args(flags)
            .env("STARBRIDGE_LOG", "warn")
            .env("E2E_DIR", self.dir.path())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.workers.push(child);
        self.workers.len() - 1
    }

    pub(crate) fn kill_worker(&mut self, index: usize) {
        self.workers[index].kill().unwrap();
        self.workers[index].wait().unwrap();
    }

    pub(crate) async fn apply(&self, name: &str, yaml: &str) {
        apply_yaml(&self.http, &self.url, name, yaml).await;
    }

    pub(crate) async fn submit(&self, workflow: &str, params: Value) -> String {
        submit_job(&self.http, &self.url, workflow, params).await
    }

    pub(crate) async fn events(&self, id: &str) -> Vec<Value> {
        let list = get_json(&self.http, &format!("{}/api/v1/jobs/{id}/events", self.url)).await;
        list["items"].as_array().unwrap().clone()
    }

    pub(crate) async fn wait_for_end(&self, id: &str) -> Value {
        let deadline = Instant::now() + STUCK;
        loop {
            if let Ok(response) = self
                .http
                .get(format!("{}/api/v1/jobs/{id}", self.url))
                .send()
                .await
                && let Ok(job) = response.json::<Value>().await
            {
                let status = job["status"].as_str().unwrap_or("");
                if [
                    "succeeded",
                    "failed",
                    "compensation_failed",
                    "cancelled",
                    "timed_out",
                ]
                .contains(&status)
                {
                    return job;
                }
                assert!(Instant::now() < deadline, "job stuck: {job:#}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .args(["--server", &self.url])
            .env("STARBRIDGE_LOG", "warn")
            .output()
            .unwrap()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        self.kill_server();
    }
}

/// Asserts that a CLI command succeeded, showing what it printed when it did not.
pub(crate) fn succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Makes two tests of each `async fn(Harness)`: `sqlite::name` on a SQLite file and
/// `postgres::name` on a scratch PostgreSQL schema (skipped, saying so, when the test server
/// cannot be reached outside CI).
#[macro_export]
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::common::Harness::start().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let Some(harness) =
                        $crate::common::Harness::start_on_postgres(stringify!($test)).await
                    else {
                        return;
                    };
                    super::$test(harness).await;
                }
            )*
        }
    };
}
