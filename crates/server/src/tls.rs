//! HTTPS for the API: loads a PEM certificate chain and private key into a rustls configuration
//! (the `ring` provider), and a listener for `axum::serve` that completes TLS handshakes in their
//! own tasks, so a slow or silent client cannot hold up the others.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const BACKLOG: usize = 128;

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the certificate {path}: {reason}")]
    Certificate { path: String, reason: String },
    #[error("cannot read the private key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Installs `ring` as the process's rustls provider unless one is installed already; HTTPS
/// clients built afterwards (webhook deliveries) use it.
pub fn install_crypto_provider() {
    // An error only means a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A server configuration from a PEM certificate chain (leaf first) and a PEM private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, Error> {
    let certificate_error = |reason: String| Error::Certificate {
        path: cert.display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| certificate_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| certificate_error(e.to_string()))?;
    if chain.is_empty() {
        return Err(certificate_error(
            "no PEM certificate in the file".to_owned(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| Error::Key {
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts TCP connections and hands over those whose TLS handshake succeeded.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (sender, accepted) = mpsc::channel(BACKLOG);
        let acceptor = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), sender));
        Ok(TlsListener {
            accepted,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    sender: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait for some to be freed.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let sender = sender.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = sender.send((tls, peer)).await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended (the runtime is shutting down): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
