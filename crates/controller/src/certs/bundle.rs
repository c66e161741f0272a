//! The certificate Secret's content: the current CA, the previous CA's certificate during a
//! rotation, and the serving certificate, read from and written to the Secret's `data`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use k8s_openapi::ByteString;

use super::x509::{cert_chain, parse_key, single_cert, validity};
use super::{CA_CERT_KEY, CA_KEY_KEY, CertError, PREVIOUS_CA_CERT_KEY, TLS_CERT_KEY, TLS_KEY_KEY};

/// A CA: its self-signed certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Ca {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    /// The CA private key (PKCS#8 PEM).
    pub key_pem: String,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

/// A serving certificate: its chain (the leaf, then the issuing CA) and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Serving {
    /// The certificate chain (PEM): the leaf first, then the CA that issued it.
    pub chain_pem: String,
    /// The private key (PKCS#8 PEM).
    pub key_pem: String,
}

impl fmt::Debug for Serving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Serving")
            .field("chain_pem", &self.chain_pem)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

/// The content of the certificate Secret: the current CA, the previous CA's certificate during
/// a CA rotation, and the serving certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct CertificateBundle {
    /// The current CA, which issues the serving certificate.
    pub ca: Ca,
    /// The previous CA's certificate (PEM), kept after a CA rotation while it is still valid so
    /// that the caBundle trusts both the old and the new CA.
    pub previous_ca_cert_pem: Option<String>,
    /// The serving certificate, issued by [`Self::ca`].
    pub serving: Serving,
}

impl fmt::Debug for CertificateBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateBundle")
            .field("ca", &self.ca)
            .field("previous_ca_cert_pem", &self.previous_ca_cert_pem)
            .field("serving", &self.serving)
            .finish()
    }
}

/// What [`CertificateBundle::from_secret_data`] found in the Secret: the bundle, every readable
/// part of it kept, and each key that is missing or cannot be read.
#[derive(Debug)]
pub struct SecretContent {
    /// `None` when the Secret holds none of `ca.crt`, `ca.key`, `tls.crt`, `tls.key` (or only
    /// empty values): nothing was generated yet.
    pub bundle: Option<CertificateBundle>,
    /// The keys that are missing (while others are there) or cannot be read, with why.
    pub problems: Vec<KeyProblem>,
}

/// One key of the certificate Secret that is missing or cannot be read.
#[derive(Debug)]
pub struct KeyProblem {
    /// The Secret key (`ca.crt`, `ca-previous.crt`, …).
    pub key: &'static str,
    /// Why it cannot be used.
    pub error: CertError,
}

impl CertificateBundle {
    /// Reads the bundle from a Secret's `data`, keeping every part that can be read: one bad
    /// key must not cost a readable CA, or the leader would replace a CA the API server trusts
    /// (and that replicas still serve from) with one it does not trust yet.
    ///
    /// A key that is missing (while others are there), not UTF-8, or does not parse is reported
    /// in [`SecretContent::problems`]. An unreadable `ca-previous.crt` is left out of the
    /// bundle; any other such key is kept as its text (empty when missing or not UTF-8), and
    /// [`reconcile`](super::reconcile) replaces what cannot be used: a new serving certificate
    /// from a good CA, or a new CA when the CA itself is unusable. Whether the pieces fit
    /// together (key matches certificate, serving certificate issued by the CA, validity) is
    /// also `reconcile`'s business.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> SecretContent {
        let main = [CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY];
        if main.iter().all(|key| read(data, key).is_none()) {
            return SecretContent {
                bundle: None,
                problems: Vec::new(),
            };
        }
        let mut problems = Vec::new();
        let mut part = |key: &'static str, check: fn(&str, &str) -> Result<(), CertError>| {
            let error = match read(data, key) {
                Some(Ok(text)) => match check(key, text) {
                    Ok(()) => return text.to_owned(),
                    Err(error) => {
                        problems.push(KeyProblem { key, error });
                        return text.to_owned();
                    }
                },
                Some(Err(error)) => error,
                None => CertError::MissingKey(key),
            };
            problems.push(KeyProblem { key, error });
            String::new()
        };
        let ca = Ca {
            cert_pem: part(CA_CERT_KEY, |key, pem| single_cert(key, pem).map(drop)),
            key_pem: part(CA_KEY_KEY, |key, pem| parse_key(key, pem).map(drop)),
        };
        let serving = Serving {
            chain_pem: part(TLS_CERT_KEY, |key, pem| cert_chain(key, pem).map(drop)),
            key_pem: part(TLS_KEY_KEY, |key, pem| parse_key(key, pem).map(drop)),
        };
        let previous = read(data, PREVIOUS_CA_CERT_KEY).and_then(|text| {
            let error = match text {
                Ok(text) => match single_cert(PREVIOUS_CA_CERT_KEY, text) {
                    Ok(_) => return Some(text.to_owned()),
                    Err(error) => error,
                },
                Err(error) => error,
            };
            problems.push(KeyProblem {
                key: PREVIOUS_CA_CERT_KEY,
                error,
            });
            None
        });
        SecretContent {
            bundle: Some(CertificateBundle {
                ca,
                previous_ca_cert_pem: previous,
                serving,
            }),
            problems,
        }
    }

    /// The Secret `data` holding this bundle: `ca.crt`, `ca.key`, `ca-previous.crt` (only when
    /// there is a previous CA), `tls.crt` and `tls.key`.
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::new();
        let mut put = |key: &str, value: &str| {
            data.insert(key.to_owned(), ByteString(value.as_bytes().to_vec()));
        };
        put(CA_CERT_KEY, &self.ca.cert_pem);
        put(CA_KEY_KEY, &self.ca.key_pem);
        if let Some(previous) = &self.previous_ca_cert_pem {
            put(PREVIOUS_CA_CERT_KEY, previous);
        }
        put(TLS_CERT_KEY, &self.serving.chain_pem);
        put(TLS_KEY_KEY, &self.serving.key_pem);
        data
    }

    /// The caBundle every webhook entry carries: the current CA, followed by the previous CA
    /// while it is still valid at `now`. A certificate that cannot be parsed is left out (empty
    /// when neither can be).
    pub fn ca_bundle_pem(&self, now: SystemTime) -> String {
        let mut pem = String::new();
        if single_cert(CA_CERT_KEY, &self.ca.cert_pem).is_ok() {
            pem.push_str(&with_newline(&self.ca.cert_pem));
        }
        if let Some(previous) = &self.previous_ca_cert_pem
            && single_cert(PREVIOUS_CA_CERT_KEY, previous)
                .is_ok_and(|info| !info.validity.is_expired(now))
        {
            pem.push_str(&with_newline(previous));
        }
        pem
    }

    /// When the serving certificate (the first certificate of `tls.crt`) expires: its
    /// `notAfter`.
    pub fn serving_expiry(&self) -> Result<SystemTime, CertError> {
        Ok(validity(&self.serving.chain_pem)?.not_after)
    }
}

/// The text under `key`: `None` when absent or blank, an error when it is not UTF-8.
fn read<'a>(
    data: &'a BTreeMap<String, ByteString>,
    key: &'static str,
) -> Option<Result<&'a str, CertError>> {
    let text = std::str::from_utf8(&data.get(key)?.0).map_err(|_| CertError::NotUtf8(key));
    match text {
        Ok(text) if text.trim().is_empty() => None,
        text => Some(text),
    }
}

pub(super) fn with_newline(pem: &str) -> String {
    let mut pem = pem.to_owned();
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem
}
