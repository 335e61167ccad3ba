//! Helpers the end-to-end test files share. Each test file is a crate of its own and uses only
//! some of them.
#![allow(dead_code)]

use std::process::Child;

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

/// A webhook subscription's deliveries, newest first, as the API at `base` lists them.
pub(crate) async fn webhook_deliveries(
    http: &reqwest::Client,
    base: &str,
    webhook: &str,
) -> serde_json::Value {
    http.get(format!("{base}/api/v1/webhooks/{webhook}/deliveries"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
