//! HTTPS for the API: loads a PEM certificate chain and private key into a rustls configuration
//! (the `ring` provider). Handshakes run in each connection's own task (`serve`), bounded by the
//! header read timeout, so a slow or silent client cannot hold up the others.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
