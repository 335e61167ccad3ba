//! The `starbridge` command over HTTPS: `server --tls-cert/--tls-key` with a certificate from a
//! private CA made in the test; a client command trusts it with `--ca-cert` (or
//! `STARBRIDGE_CA_CERT`) and refuses it without.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use common::{KillOnDrop, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_starbridge");

fn client(server: &str, extra: &[&str], ca_env: Option<&std::path::Path>) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(["workflows", "-o", "json", "--server", server])
        .args(extra)
        .env_remove("STARBRIDGE_CA_CERT")
        .stdin(Stdio::null());
    if let Some(ca) = ca_env {
        command.env("STARBRIDGE_CA_CERT", ca);
    }
    command.output().unwrap()
}

#[test]
fn client_commands_reach_an_https_server_with_its_ca_and_refuse_it_without() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let (ca, cert_path, key_path) = (
        dir.path().join("ca.pem"),
        dir.path().join("server.pem"),
        dir.path().join("server.key"),
    );
    std::fs::write(&ca, ca_pem).unwrap();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();

    let port = free_port();
    let _server = KillOnDrop(
        Command::new(BIN)
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--database")
            .arg(format!("sqlite://{}", dir.path().join("tls.db").display()))
            .arg("--tls-cert")
            .arg(&cert_path)
            .arg("--tls-key")
            .arg(&key_path)
            .env("STARBRIDGE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let server = format!("https://127.0.0.1:{port}");
    let ca_arg = ca.to_str().unwrap();

    // Poll until the server answers (it may still be starting).
    let deadline = Instant::now() + Duration::from_secs(60);
    let trusted = loop {
        let output = client(&server, &["--ca-cert", ca_arg], None);
        if output.status.success() || Instant::now() > deadline {
            break output;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&trusted.stdout).unwrap();
    assert_eq!(listed["items"], serde_json::json!([]));

    let from_env = client(&server, &[], Some(&ca));
    assert!(
        from_env.status.success(),
        "{}",
        String::from_utf8_lossy(&from_env.stderr)
    );

    let untrusted = client(&server, &[], None);
    assert!(!untrusted.status.success());
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(stderr.contains("certificate"), "{stderr}");
}
