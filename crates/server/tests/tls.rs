//! HTTPS: the server serves the API over TLS with a certificate from a private CA made in the
//! test; the SDK client reaches it when given that CA, and refuses it when not.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use starbridge_engine::Engine;
use starbridge_server::{Server, tls};
use starbridge_worker::Client;
use tokio::sync::watch;

/// A private CA and a server certificate it signed for `localhost` and `127.0.0.1`, on disk.
struct Pki {
    ca_pem: String,
    cert: PathBuf,
    key: PathBuf,
    dir: tempfile::TempDir,
}

fn ca() -> (CertificateParams, KeyPair, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (params, key, pem)
}

fn pki() -> Pki {
    let (ca_params, ca_key, ca_pem) = ca();
    let issuer = Issuer::new(ca_params, ca_key);
    let params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("server.pem");
    let key_path = dir.path().join("server.key");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    Pki {
        ca_pem,
        cert: cert_path,
        key: key_path,
        dir,
    }
}

/// Serves HTTPS on a free loopback port until the sender is dropped or sent `true`.
async fn serve(pki: &Pki) -> (String, watch::Sender<bool>) {
    let url = format!("sqlite://{}", pki.dir.path().join("tls.db").display());
    let store = Engine::open(&url).unwrap();
    let config = tls::server_config(&pki.cert, &pki.key).unwrap();
    let server = Server::bind(store, "127.0.0.1:0")
        .await
        .unwrap()
        .with_tls(config);
    let url = server.url();
    let (stop, mut stopped) = watch::channel(false);
    tokio::spawn(server.run(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    }));
    (url, stop)
}

#[tokio::test]
async fn the_sdk_reaches_an_https_server_whose_certificate_the_given_ca_signed() {
    let pki = pki();
    let (url, stop) = serve(&pki).await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let client = Client::with_ca_pem(&url, pki.ca_pem.as_bytes()).unwrap();
    let health = client.health().await.unwrap();
    assert_eq!(health.status, starbridge_api::HealthStatus::Ok);
    let answer = client
        .poll(&starbridge_api::PollRequest {
            worker_id: "w".into(),
            queues: vec!["q".into()],
            max_tasks: None,
            wait_ms: None,
            namespace: None,
            complete: Vec::new(),
        })
        .await
        .unwrap();
    assert!(answer.tasks.is_empty());
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_server_certificate_no_trusted_ca_signed_is_refused() {
    let pki = pki();
    let (url, stop) = serve(&pki).await;
    // The system's roots only.
    let client = Client::new(&url).unwrap();
    let error = client.health().await.unwrap_err();
    assert!(
        matches!(error, starbridge_worker::Error::Transport(_)),
        "{error:?}"
    );
    assert!(
        format!("{error:?}").contains("InvalidCertificate"),
        "{error:?}"
    );
    // Another CA than the one that signed the server's certificate.
    let (_, _, other_ca) = ca();
    let client = Client::with_ca_pem(&url, other_ca.as_bytes()).unwrap();
    let error = client.health().await.unwrap_err();
    assert!(
        format!("{error:?}").contains("InvalidCertificate"),
        "{error:?}"
    );
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_ca_file_without_a_certificate_is_refused_when_the_client_is_made() {
    let error = Client::with_ca_pem("https://127.0.0.1:1", b"not a certificate").unwrap_err();
    assert!(
        matches!(error, starbridge_worker::Error::InvalidCaCertificate(_)),
        "{error:?}"
    );
}

#[test]
fn a_missing_or_unreadable_key_names_the_file() {
    let pki = pki();
    let missing = pki.dir.path().join("missing.key");
    let error = tls::server_config(&pki.cert, &missing).unwrap_err();
    assert!(matches!(error, tls::Error::Key { .. }), "{error}");
    assert!(error.to_string().contains("missing.key"), "{error}");
    let error = tls::server_config(&pki.key, &pki.key).unwrap_err();
    assert!(matches!(error, tls::Error::Certificate { .. }), "{error}");
}
