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

impl CertificateBundle {
    /// Reads the bundle from a Secret's `data`.
    ///
    /// `Ok(None)` when the Secret holds none of `ca.crt`, `ca.key`, `tls.crt`, `tls.key` (or only
    /// empty values): nothing was generated yet. An error when some of them are present but not
    /// all, a value is not UTF-8, or a certificate or key cannot be parsed. Whether the pieces
    /// fit together (key matches certificate, serving certificate issued by the CA, validity) is
    /// [`reconcile`](super::reconcile)'s business, not this function's.
    pub fn from_secret_data(
        data: &BTreeMap<String, ByteString>,
    ) -> Result<Option<Self>, CertError> {
        let text = |key: &'static str| -> Result<Option<String>, CertError> {
            match data.get(key) {
                None => Ok(None),
                Some(bytes) => {
                    let text =
                        String::from_utf8(bytes.0.clone()).map_err(|_| CertError::NotUtf8(key))?;
                    Ok((!text.trim().is_empty()).then_some(text))
                }
            }
        };
        let ca_cert = text(CA_CERT_KEY)?;
        let ca_key = text(CA_KEY_KEY)?;
        let tls_cert = text(TLS_CERT_KEY)?;
        let tls_key = text(TLS_KEY_KEY)?;
        let previous = text(PREVIOUS_CA_CERT_KEY)?;
        if ca_cert.is_none() && ca_key.is_none() && tls_cert.is_none() && tls_key.is_none() {
            return Ok(None);
        }
        let required = |value: Option<String>, key: &'static str| -> Result<String, CertError> {
            value.ok_or(CertError::MissingKey(key))
        };
        let bundle = CertificateBundle {
            ca: Ca {
                cert_pem: required(ca_cert, CA_CERT_KEY)?,
                key_pem: required(ca_key, CA_KEY_KEY)?,
            },
            previous_ca_cert_pem: previous,
            serving: Serving {
                chain_pem: required(tls_cert, TLS_CERT_KEY)?,
                key_pem: required(tls_key, TLS_KEY_KEY)?,
            },
        };
        single_cert(CA_CERT_KEY, &bundle.ca.cert_pem)?;
        parse_key(CA_KEY_KEY, &bundle.ca.key_pem)?;
        if let Some(previous) = &bundle.previous_ca_cert_pem {
            single_cert(PREVIOUS_CA_CERT_KEY, previous)?;
        }
        cert_chain(TLS_CERT_KEY, &bundle.serving.chain_pem)?;
        parse_key(TLS_KEY_KEY, &bundle.serving.key_pem)?;
        Ok(Some(bundle))
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
    /// while it is still valid at `now` (a previous CA that cannot be parsed is left out).
    pub fn ca_bundle_pem(&self, now: SystemTime) -> String {
        let mut pem = with_newline(&self.ca.cert_pem);
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

pub(super) fn with_newline(pem: &str) -> String {
    let mut pem = pem.to_owned();
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem
}
