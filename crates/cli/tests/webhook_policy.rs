//! Webhook destinations end to end with the real binary: local and private destinations are
//! refused at creation and, for subscriptions stored before, at delivery without a connection;
//! redirects are not followed; `--webhook-allow` opens chosen destinations; only callers who
//! may operate see full subscription URLs.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Served, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_starbridge");
/// How long a test waits for the server to act (a liveness bound, not a benchmark).
const PATIENCE: Duration = Duration::from_secs(60);

/// A server process on a loopback port, with the database in `dir`.
struct Server {
    url: String,
    http: reqwest::Client,
    _process: Served,
}

impl Server {
    async fn start(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Server {
        // reqwest is built without a default crypto provider: the process chooses `ring`.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut command = Command::new(BIN);
        command
            .arg("server")
            .arg("--database")
            .arg(format!("sqlite://{}", dir.join("hooks.db").display()))
            .args(args)
            .env("STARBRIDGE_LOG", "warn")
            .env_remove("STARBRIDGE_WEBHOOK_ALLOW");
        for (name, value) in envs {
            command.env(name, value);
        }
        let served = Served::start(command);
        Server {
            url: served.url(),
            http: reqwest::Client::new(),
            _process: served,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Creates a subscription to every status change: the answer's status and body.
    async fn subscribe(&self, url: &str, token: Option<&str>) -> (u16, Value) {
        let mut request = self
            .http
            .post(self.url("/api/v1/webhooks"))
            .json(&json!({"url": url}));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Applies a one-step workflow and submits a job of it: its creation is a status change.
    async fn submit_job(&self) {
        common::apply_yaml(
            &self.http,
            &self.url,
            "hooked",
            "steps:\n- {id: a, queue: nobody, command: echo hi}\n",
        )
        .await;
        let submitted = self
            .http
            .post(self.url("/api/v1/jobs"))
            .json(&json!({"workflow": "hooked"}))
            .send()
            .await
            .unwrap();
        assert!(
            submitted.status().is_success(),
            "{}",
            submitted.text().await.unwrap()
        );
    }

    /// The subscription's newest delivery, once it is no longer pending.
    async fn settled_delivery(&self, webhook: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let history = common::webhook_deliveries(&self.http, &self.url, webhook).await;
            let newest = &history["items"][0];
            if newest.is_object() && newest["attempts"].as_u64() > Some(0) {
                return newest.clone();
            }
            assert!(Instant::now() < deadline, "no attempt recorded: {history}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A loopback TCP listener that counts the connections made to it (and answers none).
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            open.push(stream);
        }
    });
    (port, count)
}

/// A loopback HTTP receiver answering every request with `status` (and `location`, if given);
/// counts the requests.
async fn receiver(status: u16, location: Option<String>) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let app = axum::Router::new().fallback(move || {
        let seen = seen.clone();
        let location = location.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut response = axum::http::Response::new(axum::body::Body::empty());
            *response.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
            if let Some(location) = location {
                response
                    .headers_mut()
                    .insert("location", location.parse().unwrap());
            }
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://127.0.0.1:{port}/hook"), count)
}

#[tokio::test]
async fn creating_a_webhook_to_a_local_destination_is_refused_naming_the_field_and_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[], &[]).await;
    let own_api = server.url("/api/v1/jobs");
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://0.0.0.0:9/hook",
        "http://2130706433/hook",
        "http://0x7f.1/hook",
        "http://[::1]:9/hook",
        "http://[::ffff:127.0.0.1]:9/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/hook",
        "http://192.168.1.1/hook",
        own_api.as_str(),
    ] {
        let (status, problem) = server.subscribe(url, None).await;
        assert_eq!(status, 422, "{url}: {problem}");
        assert_eq!(problem["errors"][0]["field"], "url", "{url}: {problem}");
        let message = problem["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains("destination refused by policy")
                && message.contains("--webhook-allow"),
            "{url}: {message}"
        );
    }
    let list: Value = server
        .http
        .get(server.url("/api/v1/webhooks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["items"], json!([]), "nothing was stored");
    // A public address is accepted (nothing is sent: no job changes here).
    let (status, created) = server.subscribe("https://192.0.2.10/hook", None).await;
    assert_eq!(status, 201, "{created}");
}

#[tokio::test]
async fn a_subscription_stored_before_the_policy_is_refused_at_delivery_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let (port, connections) = counting_listener().await;
    let webhook = {
        let server = Server::start(dir.path(), &["--webhook-allow", "127.0.0.1"], &[]).await;
        let (status, created) = server
            .subscribe(&format!("http://127.0.0.1:{port}/hook"), None)
            .await;
        assert_eq!(status, 201, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }; // the server is killed here, with nothing to deliver yet

    let server = Server::start(dir.path(), &[], &[]).await;
    server.submit_job().await;
    let delivery = server.settled_delivery(&webhook).await;
    let error = delivery["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("destination refused by policy") && error.contains("127.0.0.1"),
        "{delivery}"
    );
    assert_eq!(delivery["state"], "failed", "not retried: {delivery}");
    assert_eq!(delivery["attempts"], 1, "{delivery}");
    assert_eq!(delivery["last_status"], Value::Null, "{delivery}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(connections.load(Ordering::SeqCst), 0, "nothing connected");
}

#[tokio::test]
async fn a_redirect_from_an_allowed_receiver_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (elsewhere, connections) = counting_listener().await;
    let (hook, requests) = receiver(307, Some(format!("http://127.0.0.1:{elsewhere}/"))).await;
    let server = Server::start(dir.path(), &["--webhook-allow", "127.0.0.1"], &[]).await;
    let (status, created) = server.subscribe(&hook, None).await;
    assert_eq!(status, 201, "{created}");
    server.submit_job().await;
    let delivery = server
        .settled_delivery(created["id"].as_str().unwrap())
        .await;
    assert_eq!(delivery["last_status"], 307, "{delivery}");
    assert!(
        delivery["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("redirects are not followed"),
        "{delivery}"
    );
    assert!(requests.load(Ordering::SeqCst) >= 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}

#[tokio::test]
async fn an_allowed_host_name_from_the_environment_lets_a_local_receiver_get_its_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let (hook, requests) = receiver(200, None).await;
    let hook = hook.replace("127.0.0.1", "localhost");
    let server = Server::start(
        dir.path(),
        &[],
        &[("STARBRIDGE_WEBHOOK_ALLOW", "10.0.0.0/8, localhost,")],
    )
    .await;
    let (status, created) = server.subscribe(&hook, None).await;
    assert_eq!(status, 201, "{created}");
    server.submit_job().await;
    let delivery = server
        .settled_delivery(created["id"].as_str().unwrap())
        .await;
    assert_eq!(delivery["state"], "delivered", "{delivery}");
    assert_eq!(delivery["last_status"], 200, "{delivery}");
    assert!(requests.load(Ordering::SeqCst) >= 1);
}

#[test]
fn an_invalid_allow_entry_stops_the_server_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["server", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--database")
        .arg(format!("sqlite://{}", dir.path().join("bad.db").display()))
        .args(["--webhook-allow", "10.0.0.1/8"])
        .env("STARBRIDGE_LOG", "warn")
        .env_remove("STARBRIDGE_WEBHOOK_ALLOW")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        text.contains("--webhook-allow") && text.contains("did you mean 10.0.0.0/8?"),
        "{text}"
    );
}

fn run(args: &[&str], token: &str) -> Output {
    Command::new(BIN)
        .args(args)
        .env("STARBRIDGE_LOG", "warn")
        .env("STARBRIDGE_TOKEN", token)
        .output()
        .unwrap()
}

/// A new token with `scope`, made by the admin through the CLI.
fn token(server: &Server, admin: &str, name: &str, scope: &str) -> String {
    let created = run(
        &[
            "token",
            "create",
            name,
            "--scope",
            scope,
            "--server",
            &server.url,
        ],
        admin,
    );
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&created.stdout),
        String::from_utf8_lossy(&created.stderr)
    );
    text.split_whitespace()
        .find(|word| word.starts_with("sbt_"))
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_read_only_token_sees_a_redacted_url_and_an_operate_token_the_full_one() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("hooks.db").display());
    let bootstrap = Command::new(BIN)
        .args(["token", "bootstrap", "--database", &database])
        .env("STARBRIDGE_LOG", "warn")
        .output()
        .unwrap();
    assert!(bootstrap.status.success());
    let admin = String::from_utf8(bootstrap.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let server = Server::start(dir.path(), &["--auth"], &[]).await;
    let secret_url = "https://user:pass@192.0.2.10:8443/hooks/s3cr3t?key=abc#frag";
    let (status, created) = server.subscribe(secret_url, Some(&admin)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["url"], secret_url, "the creator sees what it gave");

    let list = |token: String| {
        let server = &server;
        async move {
            let list: Value = server
                .http
                .get(server.url("/api/v1/webhooks"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            list["items"][0]["url"].as_str().unwrap().to_owned()
        }
    };
    let redacted = "https://192.0.2.10:8443/…";
    assert_eq!(
        list(token(&server, &admin, "viewer", "read")).await,
        redacted
    );
    assert_eq!(list(token(&server, &admin, "ci", "submit")).await, redacted);
    assert_eq!(
        list(token(&server, &admin, "ops", "operate")).await,
        secret_url
    );
    assert_eq!(list(admin.clone()).await, secret_url);
}
