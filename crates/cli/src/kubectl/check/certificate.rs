//! Whether a caBundle verifies a certificate chain, as the API server checks the webhook's:
//! rustls's WebPKI verifier with the caBundle's certificates as the only roots, for the host
//! the API server calls, at a given time. Pure: the chain and the time are parameters.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// The DER certificates of a PEM bundle; an error when a block cannot be read.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .map(|cert| cert.map(|c| c.to_vec()).map_err(|e| e.to_string()))
        .collect()
}

/// Whether `roots` (DER) verify `chain` (DER, the leaf first) for `host` at `now`; the error
/// says why not, as rustls puts it.
pub fn verify_chain(
    chain: &[Vec<u8>],
    roots: &[Vec<u8>],
    host: &str,
    now: Timestamp,
) -> Result<(), String> {
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or_else(|| "no certificate".to_owned())?;
    let mut store = RootCertStore::empty();
    for root in roots {
        store
            .add(CertificateDer::from(root.clone()))
            .map_err(|e| format!("a caBundle certificate cannot be a root: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host:?}: {e}"))?;
    let intermediates: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.as_slice()))
        .collect();
    let seconds = u64::try_from(now.as_second()).unwrap_or_default();
    verifier
        .verify_server_cert(
            &CertificateDer::from(leaf.as_slice()),
            &intermediates,
            &name,
            &[],
            UnixTime::since_unix_epoch(Duration::from_secs(seconds)),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}
