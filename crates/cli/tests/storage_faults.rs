//! Real storage faults under a real `starbridge server` process, on SQLite:
//!
//! - the database on a small tmpfs, which the test fills up: writes are refused with a 503
//!   saying the disk is full, `/healthz` says `full`, and once space is freed `/healthz` turns
//!   `ok` by itself (its probe write succeeds) and writes are accepted again, with no accepted
//!   job lost and no refused one stored;
//! - the database on an ext4 filesystem (a loop device) mounted `errors=remount-ro`, which the
//!   test makes the kernel turn read-only as it does on a disk error (`trigger_fs_error`):
//!   writes are refused with a 503 saying the database is read-only, `/healthz` says
//!   `read_only`, reads still work. The kernel refuses to make such a filesystem writable again
//!   without a check, so the test does what an operator would (stop, unmount, `e2fsck`, mount,
//!   start) and finds every accepted job.
//!
//! Mounting needs root: without it (or without `mount`, `mkfs.ext4`, `e2fsck`) the tests are
//! skipped with a message, except under `CI`, where they must run. Every mount is undone when a
//! test ends, however it ends.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::Served;

const BIN: &str = env!("CARGO_BIN_EXE_starbridge");

/// A workflow whose job waits for a worker that never comes: a job stays as submitted.
const WAITING: &str = "steps:\n  - id: wait\n    queue: nobody\n    command: wait\n";

/// Padding in each job's params while the disk fills, so that few jobs fill it.
const PAD_BYTES: usize = 16 * 1024;

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "0")
}

/// Runs a command; its failure as text.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => Err(format!("{program}: {error}")),
    }
}

/// A filesystem mounted for a test in a directory of its own; unmounted (lazily if something
/// still holds it) and removed on drop.
struct Mount {
    point: PathBuf,
    // Dropped after the unmount.
    _dir: tempfile::TempDir,
}

impl Mount {
    /// Mounts with `mount ARGS… POINT`, or says why it cannot.
    fn new(args: &[&str]) -> Result<Mount, String> {
        let dir = tempfile::tempdir().map_err(|error| error.to_string())?;
        let point = dir.path().join("mnt");
        std::fs::create_dir(&point).map_err(|error| error.to_string())?;
        let mut all: Vec<&str> = args.to_vec();
        let point_text = point.display().to_string();
        all.push(&point_text);
        run("mount", &all)?;
        Ok(Mount { point, _dir: dir })
    }

    fn unmount(&self) -> Result<(), String> {
        run("umount", &[&self.point.display().to_string()])
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.unmount().is_err() {
            let _ = run("umount", &["--lazy", &self.point.display().to_string()]);
        }
    }
}

/// `Some(mount)`, or `None` after saying why the test is skipped (never under CI).
fn mounted(what: &str, args: &[&str]) -> Option<Mount> {
    match Mount::new(args) {
        Ok(mount) => Some(mount),
        Err(error) => {
            assert!(
                !under_ci(),
                "CI must run the storage fault tests as root, but {what} cannot be mounted: {error}"
            );
            eprintln!(
                "SKIPPED: {what} cannot be mounted ({error}); run the tests as root to see \
                 real storage faults"
            );
            None
        }
    }
}

/// A `starbridge server` on the SQLite file `database`, killed on drop.
struct Server {
    url: String,
    http: reqwest::Client,
    _process: Served,
}

impl Server {
    async fn start(database: &Path) -> Server {
        // reqwest is built without a default crypto provider: the process chooses `ring`.
        starbridge_server::tls::install_crypto_provider();
        let mut command = Command::new(BIN);
        command
            .arg("server")
            .args(["--database", &format!("sqlite://{}", database.display())])
            .env("STARBRIDGE_LOG", "off");
        let served = Served::start(command);
        Server {
            url: served.url(),
            http: reqwest::Client::new(),
            _process: served,
        }
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Status, content type and body of a request; `body` is the content type and the body.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, String)>,
    ) -> (u16, String, Value) {
        let mut request = self
            .http
            .request(method.parse().unwrap(), self.at(path))
            .timeout(Duration::from_secs(30));
        if let Some((content_type, body)) = body {
            request = request.header("content-type", content_type).body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let kind = response
            .headers()
            .get("content-type")
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, kind, body)
    }

    async fn health(&self) -> (u16, Value) {
        let (status, _, body) = self.call("GET", "/healthz", None).await;
        (status, body)
    }

    async fn apply_waiting_workflow(&self) {
        let (status, _, body) = self
            .call(
                "PUT",
                "/api/v1/workflows/waiting",
                Some(("application/yaml", WAITING.to_owned())),
            )
            .await;
        assert!((200..300).contains(&status), "apply: {status} {body}");
    }

    /// Submits a job with `pad` bytes of padding: its id if accepted, else the status and the
    /// problem document.
    async fn submit(&self, key: &str, pad: usize) -> Result<String, (u16, String, Value)> {
        let body = json!({
            "workflow": "waiting",
            "key": key,
            "params": {"pad": "x".repeat(pad)},
        });
        let answer = self
            .call(
                "POST",
                "/api/v1/jobs",
                Some(("application/json", body.to_string())),
            )
            .await;
        match answer {
            (201, _, job) => Ok(job["id"].as_str().unwrap().to_owned()),
            refused => Err(refused),
        }
    }

    /// Every stored job's id.
    async fn job_ids(&self) -> Vec<String> {
        let (status, _, body) = self.call("GET", "/api/v1/jobs?limit=1000", None).await;
        assert_eq!(status, 200, "{body}");
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|job| job["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Waits until `/healthz` answers `database` (a liveness bound, not a measurement).
    async fn wait_health(&self, database: &str, within: Duration) -> (u16, Value) {
        let deadline = Instant::now() + within;
        loop {
            let (status, body) = self.health().await;
            if body["database"] == database {
                return (status, body);
            }
            assert!(
                Instant::now() < deadline,
                "/healthz did not turn {database}: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Asserts that a refused write is a 503 problem document of `kind` whose detail has `words`.
fn assert_refused(refused: &(u16, String, Value), kind: &str, words: &[&str]) {
    let (status, content_type, problem) = refused;
    assert_eq!(*status, 503, "{problem}");
    assert!(
        content_type.starts_with("application/problem+json"),
        "{content_type}"
    );
    assert_eq!(problem["type"], kind, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    for word in words {
        assert!(detail.contains(word), "the detail says {word}: {detail}");
    }
}

/// Asserts that `/healthz` answered 503 with `database` and a detail with `words`.
fn assert_unhealthy(health: &(u16, Value), database: &str, words: &[&str]) {
    let (status, body) = health;
    assert_eq!(*status, 503, "{body}");
    assert_eq!(body["status"], "unhealthy", "{body}");
    assert_eq!(body["database"], database, "{body}");
    let detail = body["detail"].as_str().unwrap();
    for word in words {
        assert!(detail.contains(word), "the detail says {word}: {detail}");
    }
}

/// Writes zeros to `path` until the filesystem has no room left.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::StorageFull => break,
            Err(error) => panic!("filling the disk: {error}"),
        }
    }
    // Whatever fits of a last, smaller piece.
    for size in [4096, 512, 1] {
        while file.write_all(&chunk[..size]).is_ok() {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_gets_503s_saying_so_and_health_turns_ok_by_itself_once_space_is_freed() {
    let Some(disk) = mounted(
        "a 16 MiB tmpfs",
        &["-t", "tmpfs", "-o", "size=16m", "tmpfs"],
    ) else {
        return;
    };
    let database = disk.point.join("starbridge.db");
    let mut accepted = Vec::new();
    {
        let server = Server::start(&database).await;
        server.apply_waiting_workflow().await;
        for n in 0..20 {
            accepted.push(server.submit(&format!("before-{n}"), 0).await.unwrap());
        }
        let (status, body) = server.health().await;
        assert_eq!((status, &body["database"]), (200, &json!("ok")), "{body}");

        // The disk fills up: writes go on while the database's files have room, then are
        // refused.
        let filler = disk.point.join("filler");
        fill(&filler);
        let mut refused = None;
        for n in 0..2000 {
            match server.submit(&format!("full-{n}"), PAD_BYTES).await {
                Ok(id) => accepted.push(id),
                Err(answer) => {
                    refused = Some(answer);
                    break;
                }
            }
        }
        let refused = refused.expect("a full disk refuses writes");
        assert_refused(&refused, "/problems/disk-full", &["disk", "full"]);
        assert_unhealthy(&server.health().await, "full", &["disk", "full"]);
        // A second later the last failure is too old to answer: health makes a probe write,
        // which fails too.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_unhealthy(&server.health().await, "full", &["full", "probe"]);
        // Writes stay refused.
        let again = server
            .submit("full-again", PAD_BYTES)
            .await
            .expect_err("writes stay refused while the disk is full");
        assert_refused(&again, "/problems/disk-full", &["disk", "full"]);
        // Reads still work.
        let (status, _, body) = server
            .call("GET", &format!("/api/v1/jobs/{}", accepted[0]), None)
            .await;
        assert_eq!(status, 200, "{body}");

        // Space comes back: with no other request, health's probe write notices.
        std::fs::remove_file(&filler).unwrap();
        let (status, body) = server.wait_health("ok", Duration::from_secs(30)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "ok", "{body}");
        assert!(body["detail"].as_str().unwrap().contains("probe"), "{body}");
        for n in 0..5 {
            accepted.push(
                server
                    .submit(&format!("after-{n}"), PAD_BYTES)
                    .await
                    .unwrap(),
            );
        }
        let (status, body) = server.health().await;
        assert_eq!((status, &body["database"]), (200, &json!("ok")), "{body}");
    } // kill -9

    // Every accepted job survived, and no refused one was stored.
    let server = Server::start(&database).await;
    let mut stored = server.job_ids().await;
    stored.sort();
    accepted.sort();
    assert_eq!(stored, accepted);
}

/// The sysfs file that makes ext4 act on an error, for the filesystem mounted at `point`.
fn ext4_error_trigger(point: &Path) -> PathBuf {
    let output = Command::new("findmnt")
        .args(["-n", "-o", "SOURCE"])
        .arg(point)
        .output()
        .unwrap();
    let source = String::from_utf8(output.stdout).unwrap();
    let device = Path::new(source.trim()).file_name().unwrap().to_owned();
    Path::new("/sys/fs/ext4")
        .join(device)
        .join("trigger_fs_error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_turned_read_only_gets_503s_saying_so_and_health_reports_read_only() {
    let images = tempfile::tempdir().unwrap();
    let image = images.path().join("ext4.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let image_text = image.display().to_string();
    if let Err(error) = run("mkfs.ext4", &["-q", "-F", &image_text]) {
        assert!(!under_ci(), "CI must have mkfs.ext4: {error}");
        eprintln!("SKIPPED: no ext4 filesystem can be made ({error})");
        return;
    }
    let mount_args = ["-o", "loop,errors=remount-ro", image_text.as_str()];
    let Some(disk) = mounted("an ext4 loop filesystem", &mount_args) else {
        return;
    };
    let database = disk.point.join("starbridge.db");
    let mut accepted = Vec::new();
    {
        let server = Server::start(&database).await;
        server.apply_waiting_workflow().await;
        for n in 0..20 {
            accepted.push(server.submit(&format!("before-{n}"), 0).await.unwrap());
        }

        // The kernel turns the filesystem read-only, as on a disk error.
        let trigger = ext4_error_trigger(&disk.point);
        if let Err(error) = std::fs::write(&trigger, "1") {
            assert!(!under_ci(), "CI must be able to write {trigger:?}: {error}");
            eprintln!("SKIPPED: {trigger:?} cannot be written ({error})");
            return;
        }
        let refused = server
            .submit("read-only", 0)
            .await
            .expect_err("a read-only filesystem refuses writes");
        assert_refused(&refused, "/problems/read-only", &["read-only"]);
        assert_unhealthy(&server.health().await, "read_only", &["read-only"]);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_unhealthy(&server.health().await, "read_only", &["read-only", "probe"]);
        // Reads still work.
        let (status, _, body) = server
            .call("GET", &format!("/api/v1/jobs/{}", accepted[0]), None)
            .await;
        assert_eq!(status, 200, "{body}");
    } // kill -9

    // What an operator does: check the filesystem, mount it again, start the server.
    disk.unmount().unwrap();
    let checked = Command::new("e2fsck")
        .args(["-f", "-y", &image_text])
        .output()
        .unwrap();
    // 0: clean; 1: errors were corrected.
    assert!(
        matches!(checked.status.code(), Some(0 | 1)),
        "e2fsck: {checked:?}"
    );
    let point = disk.point.display().to_string();
    run(
        "mount",
        &["-o", "loop,errors=remount-ro", &image_text, &point],
    )
    .unwrap();
    let server = Server::start(&database).await;
    let mut stored = server.job_ids().await;
    stored.sort();
    accepted.sort();
    assert_eq!(stored, accepted);
    assert_eq!(server.health().await.1["database"], "ok");
    server.submit("after", 0).await.unwrap();
}
