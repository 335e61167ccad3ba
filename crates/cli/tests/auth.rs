//! Authentication end to end with the real binary: the secure default on a non-loopback address,
//! the bootstrap admin token, tokens made and used through the CLI.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{KillOnDrop, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_starbridge");

fn run(args: &[&str], token: Option<&str>) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env("STARBRIDGE_LOG", "warn");
    command.env_remove("STARBRIDGE_TOKEN");
    if let Some(token) = token {
        command.env("STARBRIDGE_TOKEN", token);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_server_refuses_a_non_loopback_address_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("a.db").display());
    let listen = format!("0.0.0.0:{}", free_port());
    let output = run(
        &["server", "--listen", &listen, "--database", &database],
        None,
    );
    assert!(!output.status.success());
    assert!(text(&output).contains("--auth"), "{}", text(&output));
}

#[test]
fn an_admin_bootstraps_makes_a_scoped_token_and_the_cli_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("auth.db").display());
    let bootstrap = run(&["token", "bootstrap", "--database", &database], None);
    assert!(bootstrap.status.success(), "{}", text(&bootstrap));
    let admin = String::from_utf8(bootstrap.stdout)
        .unwrap()
        .trim()
        .to_owned();
    assert!(admin.starts_with("sbt_"));

    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = KillOnDrop(
        Command::new(BIN)
            .args(["server", "--auth", "--database", &database])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("STARBRIDGE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !run(&["workflows", "--server", &url], Some(&admin))
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "server did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }

    let refused = run(&["jobs", "--server", &url], None);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("STARBRIDGE_TOKEN"),
        "{}",
        text(&refused)
    );

    let created = run(
        &[
            "token",
            "create",
            "ci",
            "--scope",
            "submit",
            "--for-namespace",
            "default",
            "--reason",
            "pipeline",
            "--server",
            &url,
        ],
        Some(&admin),
    );
    assert!(created.status.success(), "{}", text(&created));
    let ci = text(&created)
        .split_whitespace()
        .find(|word| word.starts_with("sbt_"))
        .unwrap()
        .to_owned();
    let jobs = run(&["jobs", "--server", &url, "-o", "json"], Some(&ci));
    assert!(jobs.status.success(), "{}", text(&jobs));
    let tokens = run(&["token", "list", "--server", &url], Some(&ci));
    assert!(
        !tokens.status.success(),
        "a submit token cannot list tokens"
    );

    let audit = run(&["audit", "--server", &url], Some(&admin));
    assert!(audit.status.success(), "{}", text(&audit));
    let audit = text(&audit);
    assert!(
        audit.contains("POST /api/v1/tokens") && audit.contains("pipeline"),
        "{audit}"
    );
}
