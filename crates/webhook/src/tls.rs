//! The serving certificate: held behind an atomic pointer that the TLS handshake reads, so a
//! new certificate takes effect for the next connection without a restart and without
//! disturbing connections already open.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate PEM holds no certificate, or cannot be parsed.
    #[error("invalid certificate PEM: {0}")]
    Certificate(String),
    /// The key PEM holds no private key, or cannot be parsed.
    #[error("invalid private key PEM: {0}")]
    Key(String),
    /// The key is of a type rustls cannot sign with, or does not match the certificate.
    #[error("unusable private key: {0}")]
    Unusable(String),
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The current serving certificate, swapped atomically.
#[derive(Default)]
pub struct CertificateStore {
    current: ArcSwapOption<CertifiedKey>,
}

impl fmt::Debug for CertificateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateStore")
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl CertificateStore {
    /// An empty store: handshakes fail until a certificate is set.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Parses a PEM certificate chain and private key and makes them current.
    pub fn set_pem(&self, chain_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let key = certified_key(chain_pem, key_pem)?;
        self.current.store(Some(Arc::new(key)));
        Ok(())
    }

    /// The leaf certificate being served.
    pub fn leaf(&self) -> Option<CertificateDer<'static>> {
        self.current
            .load()
            .as_ref()
            .and_then(|key| key.cert.first().cloned())
    }

    /// Whether a certificate is loaded.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// Parses and checks a certificate chain and its key.
pub fn certified_key(chain_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::Certificate("no CERTIFICATE block found".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
    let provider = rustls::crypto::ring::default_provider();
    let key = CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| TlsError::Unusable(e.to_string()))?;
    Ok(key)
}

/// A rustls server configuration that serves whatever `store` holds: TLS 1.2 and 1.3 only
/// (older ClientHellos are refused), HTTP/1.1.
pub fn server_config(store: Arc<CertificateStore>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Loads a certificate from files into `store` now, then reloads it whenever the files change
/// (checked every `interval`) until `stop` is cancelled. A pair that fails to load (say, the
/// certificate was rewritten but not yet the key) keeps the previous certificate in service
/// and is retried at the next check.
pub async fn load_and_watch_files(
    store: Arc<CertificateStore>,
    cert_path: PathBuf,
    key_path: PathBuf,
    interval: Duration,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, TlsError> {
    let read = |path: PathBuf| async move {
        tokio::fs::read(&path)
            .await
            .map_err(|source| TlsError::Read { path, source })
    };
    let mut loaded = (
        read(cert_path.clone()).await?,
        read(key_path.clone()).await?,
    );
    store.set_pem(&loaded.0, &loaded.1)?;
    Ok(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let (cert, key) = match (read(cert_path.clone()).await, read(key_path.clone()).await) {
                (Ok(cert), Ok(key)) => (cert, key),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "cannot read the serving certificate; keeping the current one");
                    continue;
                }
            };
            if (&cert, &key) == (&loaded.0, &loaded.1) {
                continue;
            }
            match store.set_pem(&cert, &key) {
                Ok(()) => {
                    tracing::info!(cert = %cert_path.display(), "serving certificate reloaded");
                    loaded = (cert, key);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "new serving certificate not usable yet; keeping the current one")
                }
            }
        }
    }))
}
