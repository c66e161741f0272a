//! The operator's certificates, as pure logic: the CA and serving certificate the leader keeps
//! in a Secret ([`CertificateBundle`], in `bundle`), generating them ([`generate_ca`],
//! [`issue_serving`], in `issue`), reading certificates and their validity ([`validity`], in
//! `x509`), and the rotation decision ([`reconcile`], [`next_check`], in `rotation`) with the
//! caBundle every webhook entry carries ([`CertificateBundle::ca_bundle_pem`]). This file holds
//! what they share: the Secret's keys, the limits, and the error.
//!
//! Nothing here does I/O or reads the clock: the current time is always a parameter. Key
//! generation and signing are CPU work (ECDSA P-256), so the functions are synchronous: an
//! async caller runs them on a blocking thread (`tokio::task::spawn_blocking`).
//!
//! Rotation policy: a certificate is renewed once two thirds of its lifetime have passed
//! (measured from its own `notBefore`/`notAfter`, and never later than two thirds of the
//! configured [`Lifetimes`], so shortening the configuration takes effect at once). A new CA
//! keeps the old CA certificate as `previous` while the old one is still valid, so the caBundle
//! trusts both and certificates already served by other replicas stay trusted until they reload.

mod bundle;
mod issue;
mod rotation;
mod x509;

use std::time::Duration;

pub use bundle::{Ca, CertificateBundle, KeyProblem, SecretContent, Serving};
pub use issue::{ServingNames, generate_ca, issue_serving};
pub use rotation::{Lifetimes, Reconciled, next_check, reconcile};
pub use x509::{Validity, validity};

/// The Secret key holding the current CA certificate (PEM).
pub const CA_CERT_KEY: &str = "ca.crt";
/// The Secret key holding the current CA private key (PKCS#8 PEM).
pub const CA_KEY_KEY: &str = "ca.key";
/// The Secret key holding the previous CA certificate (PEM), present only during a CA rotation.
pub const PREVIOUS_CA_CERT_KEY: &str = "ca-previous.crt";
/// The Secret key holding the serving certificate chain (PEM: the leaf, then the CA).
pub const TLS_CERT_KEY: &str = "tls.crt";
/// The Secret key holding the serving private key (PKCS#8 PEM).
pub const TLS_KEY_KEY: &str = "tls.key";

/// The common name prefix of the CAs [`reconcile`] generates (`sidecar-injector-ca@<unix time>`).
pub const CA_COMMON_NAME: &str = "sidecar-injector-ca";

/// How far `notBefore` is set before the issuing time, so that a peer whose clock is a little
/// behind still accepts a certificate issued just now.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(60);

/// The shortest lifetime accepted for a certificate.
pub const MIN_LIFETIME: Duration = Duration::from_secs(60);

/// Default CA lifetime: 365 days.
pub const DEFAULT_CA_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Default serving certificate lifetime: 90 days.
pub const DEFAULT_SERVING_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

/// Why certificate data cannot be read or certificates cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The Secret holds some of the bundle's keys but not this one.
    #[error("the certificate Secret has some of its keys but not {0:?}")]
    MissingKey(&'static str),
    /// A Secret value is not UTF-8 text.
    #[error("the certificate Secret's {0:?} is not UTF-8 text")]
    NotUtf8(&'static str),
    /// A certificate cannot be parsed or cannot serve its purpose.
    #[error("{what}: not a usable certificate: {reason}")]
    Certificate {
        /// Which certificate (a Secret key such as `ca.crt`, or `certificate`).
        what: String,
        /// Why.
        reason: String,
    },
    /// A private key cannot be parsed or does not match its certificate.
    #[error("{what}: not a usable private key: {reason}")]
    Key {
        /// Which key (a Secret key such as `ca.key`).
        what: String,
        /// Why.
        reason: String,
    },
    /// A lifetime is shorter than [`MIN_LIFETIME`].
    #[error("certificate lifetime {0:?} is shorter than the minimum {MIN_LIFETIME:?}")]
    Lifetime(Duration),
    /// The serving names hold neither a DNS name nor an IP address.
    #[error("no DNS name nor IP address to issue the serving certificate for")]
    NoNames,
    /// The CA cannot issue a certificate valid now (it has expired).
    #[error("the CA cannot issue: {0}")]
    CaCannotIssue(String),
    /// A time is outside what certificates can represent.
    #[error("time out of range: {0}")]
    Time(String),
    /// rcgen failed to generate a key or a certificate (for instance a DNS name that is not
    /// ASCII).
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

#[cfg(test)]
mod tests;
