//! The operator's certificates, as pure logic: the CA and serving certificate the leader keeps
//! in a Secret ([`CertificateBundle`]), generating them ([`generate_ca`], [`issue_serving`]),
//! reading their validity ([`validity`]), and the rotation decision ([`reconcile`],
//! [`next_check`]) with the caBundle every webhook entry carries
//! ([`CertificateBundle::ca_bundle_pem`]).
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType,
};
use time::OffsetDateTime;
use x509_parser::asn1_rs::Tag;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::pem::Pem;
use x509_parser::x509::X509Name;

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

/// Longest common name X.509 allows (`ub-common-name`).
const MAX_COMMON_NAME_LEN: usize = 64;

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
    /// [`reconcile`]'s business, not this function's.
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

/// The names the serving certificate is valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingNames {
    /// DNS names (subjectAltName dNSName).
    pub dns_names: Vec<String>,
    /// IP addresses (subjectAltName iPAddress).
    pub ip_addresses: Vec<IpAddr>,
}

impl ServingNames {
    /// The names of a webhook reached through the Service `service` in `namespace`:
    /// `<service>.<namespace>.svc`, `<service>.<namespace>.svc.cluster.local`, `<service>` and
    /// `<service>.<namespace>`, plus `url_mode_ip` when the webhook is reached by URL (for
    /// instance `127.0.0.1` out of cluster). Names are lowercased.
    pub fn for_service(service: &str, namespace: &str, url_mode_ip: Option<IpAddr>) -> Self {
        let service = service.to_ascii_lowercase();
        let namespace = namespace.to_ascii_lowercase();
        ServingNames {
            dns_names: vec![
                format!("{service}.{namespace}.svc"),
                format!("{service}.{namespace}.svc.cluster.local"),
                service.clone(),
                format!("{service}.{namespace}"),
            ],
            ip_addresses: url_mode_ip.into_iter().collect(),
        }
    }

    /// Whether there is no name at all.
    pub fn is_empty(&self) -> bool {
        self.dns_names.is_empty() && self.ip_addresses.is_empty()
    }

    /// The DNS names lowercased, as a set (the order and case of SANs do not matter).
    fn dns_set(&self) -> BTreeSet<String> {
        self.dns_names
            .iter()
            .map(|name| name.to_ascii_lowercase())
            .collect()
    }

    /// The IP addresses as a set.
    fn ip_set(&self) -> BTreeSet<IpAddr> {
        self.ip_addresses.iter().copied().collect()
    }
}

/// How long newly issued certificates are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// The CA's lifetime (default 365 days).
    pub ca: Duration,
    /// The serving certificate's lifetime (default 90 days). A serving certificate never
    /// outlives the CA that issued it.
    pub serving: Duration,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes {
            ca: DEFAULT_CA_LIFETIME,
            serving: DEFAULT_SERVING_LIFETIME,
        }
    }
}

/// A certificate's validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// `notBefore`.
    pub not_before: SystemTime,
    /// `notAfter`.
    pub not_after: SystemTime,
}

impl Validity {
    /// Whether the certificate counts as expired at `now`: from its `notAfter` second on.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// The length of the validity period (zero when `notAfter` is before `notBefore`).
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO)
    }

    /// When a certificate with this validity is renewed: two thirds into its own lifetime, or
    /// two thirds into `configured` (plus the clock skew allowance) when that is shorter.
    fn renew_at(&self, configured: Duration) -> SystemTime {
        let span = self
            .lifetime()
            .min(configured.saturating_add(CLOCK_SKEW_ALLOWANCE));
        self.not_before
            .checked_add(span / 3 * 2)
            .unwrap_or(self.not_after)
    }
}

/// The validity of the first certificate in `cert_pem` (for a chain, the leaf's).
pub fn validity(cert_pem: &str) -> Result<Validity, CertError> {
    let chain = cert_chain("certificate", cert_pem)?;
    chain
        .first()
        .map(|leaf| leaf.validity)
        .ok_or_else(|| CertError::Certificate {
            what: "certificate".into(),
            reason: "no CERTIFICATE block".into(),
        })
}

/// Generates a self-signed CA (ECDSA P-256) named `common_name`, valid from a minute before
/// `now` (for clock skew) until `now + lifetime`: basicConstraints CA (path length 0), key
/// usages keyCertSign and cRLSign.
///
/// CPU work: call it from a blocking thread in async code.
pub fn generate_ca(
    now: SystemTime,
    lifetime: Duration,
    common_name: &str,
) -> Result<Ca, CertError> {
    let (not_before, not_after) = window(now, lifetime)?;
    let mut params = CertificateParams::default();
    params.not_before = not_before;
    params.not_after = not_after;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let cert = params.self_signed(&key)?;
    Ok(Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues a serving certificate (ECDSA P-256) for `names`, signed by `ca`, valid from a minute
/// before `now` until `now + lifetime` or the CA's expiry, whichever comes first: key usages
/// digitalSignature and keyEncipherment, extended key usage serverAuth, basicConstraints not a
/// CA, the subjectAltNames from `names`, and an authority key identifier naming the CA. The
/// chain holds the leaf, then the CA certificate.
///
/// CPU work: call it from a blocking thread in async code.
pub fn issue_serving(
    ca: &Ca,
    names: &ServingNames,
    now: SystemTime,
    lifetime: Duration,
) -> Result<Serving, CertError> {
    if names.is_empty() {
        return Err(CertError::NoNames);
    }
    let (not_before, mut not_after) = window(now, lifetime)?;
    let signer = Signer::load(ca)?;
    if signer.info.validity.is_expired(now) {
        return Err(CertError::CaCannotIssue(format!(
            "it expired at {}",
            display_time(signer.info.validity.not_after)
        )));
    }
    not_after = not_after.min(to_offset(signer.info.validity.not_after)?);

    let mut params = CertificateParams::default();
    params.not_before = not_before;
    params.not_after = not_after;
    let mut subject = DistinguishedName::new();
    let common_name = names
        .dns_names
        .iter()
        .find(|name| name.len() <= MAX_COMMON_NAME_LEN)
        .cloned()
        .or_else(|| names.ip_addresses.first().map(IpAddr::to_string));
    if let Some(common_name) = common_name {
        subject.push(DnType::CommonName, common_name);
    }
    params.distinguished_name = subject;
    let mut sans = Vec::new();
    for name in &names.dns_names {
        sans.push(SanType::DnsName(name.to_ascii_lowercase().try_into()?));
    }
    sans.extend(names.ip_addresses.iter().copied().map(SanType::IpAddress));
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let cert = params.signed_by(&key, &signer.issuer)?;
    let leaf = CertInfo::from_der(TLS_CERT_KEY, cert.der())?;
    signer
        .info
        .check_issued(&leaf)
        .map_err(|reason| CertError::CaCannotIssue(format!("the issued certificate {reason}")))?;
    let mut chain_pem = with_newline(&cert.pem());
    chain_pem.push_str(&with_newline(&ca.cert_pem));
    Ok(Serving {
        chain_pem,
        key_pem: key.serialize_pem(),
    })
}

/// The result of [`reconcile`].
///
/// During a CA rotation the new serving certificate is issued by the new CA at once: publish
/// [`CertificateBundle::ca_bundle_pem`] (which trusts both CAs) to every webhook entry as soon
/// as the Secret is written, so that the API server trusts the new CA by the time replicas
/// serve the new certificate; certificates still served from the old CA stay trusted through
/// the previous CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// The bundle to keep: the existing one when nothing changed.
    pub bundle: CertificateBundle,
    /// Whether `bundle` differs from the existing one (the Secret and the caBundle need
    /// writing).
    pub changed: bool,
    /// Why something changed, one line per decision (empty when nothing changed).
    pub reasons: Vec<String>,
}

/// Decides what the certificate Secret should hold at `now`.
///
/// * no bundle → a new CA and a serving certificate;
/// * a CA that cannot be used (unparseable, not a CA, key not matching), that has expired, or
///   that is past two thirds of its lifetime → a new CA, the old CA certificate kept as the
///   previous one unless it has expired (or cannot be parsed), and a serving certificate
///   issued by the new CA;
/// * a previous CA that has expired (or cannot be parsed) is dropped;
/// * a serving certificate that cannot be used (unparseable, key not matching), is not issued
///   by the current CA (issuer name and authority key identifier), whose chain does not end
///   with the current CA, whose names differ from `names`, that has expired or is past two
///   thirds of its lifetime → a new serving certificate from the current CA;
/// * otherwise nothing changes.
///
/// Errors only when generating fails (or `lifetimes` are shorter than [`MIN_LIFETIME`], or
/// `names` are empty); a broken bundle is replaced, not reported as an error.
///
/// CPU work when something is generated: call it from a blocking thread in async code.
pub fn reconcile(
    existing: Option<&CertificateBundle>,
    names: &ServingNames,
    lifetimes: &Lifetimes,
    now: SystemTime,
) -> Result<Reconciled, CertError> {
    check_lifetime(lifetimes.ca)?;
    check_lifetime(lifetimes.serving)?;
    if names.is_empty() {
        return Err(CertError::NoNames);
    }
    let mut reasons = Vec::new();
    let Some(existing) = existing else {
        reasons.push("no certificates yet: generated a CA and a serving certificate".to_owned());
        let ca = new_ca(now, lifetimes)?;
        let serving = issue_serving(&ca, names, now, lifetimes.serving)?;
        return Ok(Reconciled {
            bundle: CertificateBundle {
                ca,
                previous_ca_cert_pem: None,
                serving,
            },
            changed: true,
            reasons,
        });
    };

    let signer = match assess_ca(existing, lifetimes, now) {
        Ok(signer) => signer,
        Err(CaReplacement { reason, keep_old }) => {
            reasons.push(reason);
            if let Some(previous) = &existing.previous_ca_cert_pem
                && single_cert(PREVIOUS_CA_CERT_KEY, previous)
                    .is_ok_and(|info| !info.validity.is_expired(now))
            {
                reasons.push(
                    "the older previous CA is no longer published (only one previous CA is kept)"
                        .to_owned(),
                );
            }
            let ca = new_ca(now, lifetimes)?;
            let serving = issue_serving(&ca, names, now, lifetimes.serving)?;
            reasons.push("issued a serving certificate from the new CA".to_owned());
            if keep_old {
                reasons.push("the old CA stays in the caBundle until it expires".to_owned());
            }
            return Ok(Reconciled {
                bundle: CertificateBundle {
                    ca,
                    previous_ca_cert_pem: keep_old.then(|| existing.ca.cert_pem.clone()),
                    serving,
                },
                changed: true,
                reasons,
            });
        }
    };

    let mut bundle = existing.clone();
    if let Some(previous) = &existing.previous_ca_cert_pem {
        match single_cert(PREVIOUS_CA_CERT_KEY, previous) {
            Ok(info) if info.validity.is_expired(now) => {
                reasons.push(format!(
                    "dropped the previous CA: it expired at {}",
                    display_time(info.validity.not_after)
                ));
                bundle.previous_ca_cert_pem = None;
            }
            Ok(_) => {}
            Err(e) => {
                reasons.push(format!("dropped the previous CA: {e}"));
                bundle.previous_ca_cert_pem = None;
            }
        }
    }

    if let Some(reason) = serving_problem(existing, &signer.info, names, lifetimes, now) {
        reasons.push(format!("{reason}: issued a new serving certificate"));
        bundle.serving = issue_serving(&existing.ca, names, now, lifetimes.serving)?;
    }

    Ok(Reconciled {
        changed: !reasons.is_empty(),
        bundle,
        reasons,
    })
}

/// The earliest moment at which [`reconcile`] would change `bundle` (for unchanged serving
/// names): the CA's or the serving certificate's renewal time, or the previous CA's expiry.
/// The caller sleeps until then (capped by its own resync period).
///
/// A bundle that [`reconcile`] would change whatever the time (a CA or serving certificate
/// that cannot be used, a previous CA that cannot be parsed) gives [`UNIX_EPOCH`]: a moment in
/// the past, meaning "now".
pub fn next_check(bundle: &CertificateBundle, lifetimes: &Lifetimes) -> SystemTime {
    let Ok(signer) = Signer::load(&bundle.ca) else {
        return UNIX_EPOCH;
    };
    let mut at = signer.info.validity.renew_at(lifetimes.ca);
    if let Some(previous) = &bundle.previous_ca_cert_pem {
        match single_cert(PREVIOUS_CA_CERT_KEY, previous) {
            Ok(info) => at = at.min(info.validity.not_after),
            Err(_) => return UNIX_EPOCH,
        }
    }
    match usable_serving(bundle, &signer.info) {
        Ok(leaf) => at.min(leaf.validity.renew_at(lifetimes.serving)),
        Err(_) => UNIX_EPOCH,
    }
}

/// A new CA for [`reconcile`], named after its issuing time.
fn new_ca(now: SystemTime, lifetimes: &Lifetimes) -> Result<Ca, CertError> {
    let stamp = to_offset(now)?.unix_timestamp();
    generate_ca(now, lifetimes.ca, &format!("{CA_COMMON_NAME}@{stamp}"))
}

/// Why the current CA must be replaced, and whether its certificate stays as the previous CA.
struct CaReplacement {
    reason: String,
    keep_old: bool,
}

/// The current CA if it can keep issuing at `now`.
fn assess_ca(
    bundle: &CertificateBundle,
    lifetimes: &Lifetimes,
    now: SystemTime,
) -> Result<Signer, CaReplacement> {
    let signer = match Signer::load(&bundle.ca) {
        Ok(signer) => signer,
        Err(e) => {
            let keep_old = single_cert(CA_CERT_KEY, &bundle.ca.cert_pem)
                .is_ok_and(|info| info.is_ca && !info.validity.is_expired(now));
            return Err(CaReplacement {
                reason: format!("the CA cannot be used ({e}): generated a new CA"),
                keep_old,
            });
        }
    };
    let validity = signer.info.validity;
    if validity.is_expired(now) {
        return Err(CaReplacement {
            reason: format!(
                "the CA expired at {}: generated a new CA",
                display_time(validity.not_after)
            ),
            keep_old: false,
        });
    }
    let renew_at = validity.renew_at(lifetimes.ca);
    if now >= renew_at {
        return Err(CaReplacement {
            reason: format!(
                "the CA is past two thirds of its lifetime (renewal due at {}, expiry at {}): \
                 generated a new CA",
                display_time(renew_at),
                display_time(validity.not_after)
            ),
            keep_old: true,
        });
    }
    Ok(signer)
}

/// Why the serving certificate must be re-issued, if it must.
fn serving_problem(
    bundle: &CertificateBundle,
    ca: &CertInfo,
    names: &ServingNames,
    lifetimes: &Lifetimes,
    now: SystemTime,
) -> Option<String> {
    let leaf = match usable_serving(bundle, ca) {
        Ok(leaf) => leaf,
        Err(reason) => return Some(reason),
    };
    let (want_dns, want_ips) = (names.dns_set(), names.ip_set());
    if leaf.dns_names != want_dns || leaf.ip_addresses != want_ips {
        return Some(format!(
            "the serving certificate's names {} differ from the wanted {}",
            describe_names(&leaf.dns_names, &leaf.ip_addresses),
            describe_names(&want_dns, &want_ips)
        ));
    }
    if leaf.validity.is_expired(now) {
        return Some(format!(
            "the serving certificate expired at {}",
            display_time(leaf.validity.not_after)
        ));
    }
    let renew_at = leaf.validity.renew_at(lifetimes.serving);
    if now >= renew_at {
        return Some(format!(
            "the serving certificate is past two thirds of its lifetime (renewal due at {}, \
             expiry at {})",
            display_time(renew_at),
            display_time(leaf.validity.not_after)
        ));
    }
    None
}

/// The serving leaf when the serving certificate parses, matches its key, is issued by `ca`,
/// and its chain is the leaf followed by `ca`.
fn usable_serving(bundle: &CertificateBundle, ca: &CertInfo) -> Result<CertInfo, String> {
    let mut chain = cert_chain(TLS_CERT_KEY, &bundle.serving.chain_pem)
        .map_err(|e| format!("the serving certificate cannot be used ({e})"))?
        .into_iter();
    let Some(leaf) = chain.next() else {
        return Err("the serving certificate is missing".to_owned());
    };
    let key = parse_key(TLS_KEY_KEY, &bundle.serving.key_pem)
        .map_err(|e| format!("the serving certificate cannot be used ({e})"))?;
    if key.subject_public_key_info() != leaf.spki {
        return Err(format!(
            "the serving certificate cannot be used ({TLS_KEY_KEY} does not match {TLS_CERT_KEY})"
        ));
    }
    ca.check_issued(&leaf).map_err(|reason| {
        format!("the serving certificate is not issued by the current CA: {reason}")
    })?;
    let rest: Vec<CertInfo> = chain.collect();
    if rest.len() != 1 || rest.iter().any(|cert| cert.der != ca.der) {
        return Err(format!(
            "the serving certificate chain ({TLS_CERT_KEY}) is not the leaf followed by the \
             current CA"
        ));
    }
    Ok(leaf)
}

/// A CA ready to sign: what its certificate says, and an rcgen issuer reproducing its subject
/// and key identifier.
struct Signer {
    info: CertInfo,
    issuer: Issuer<'static, KeyPair>,
}

impl Signer {
    /// Checks that `ca` is a CA certificate allowed to sign certificates, with a matching key
    /// and a subject rcgen can reproduce byte for byte.
    fn load(ca: &Ca) -> Result<Self, CertError> {
        let info = single_cert(CA_CERT_KEY, &ca.cert_pem)?;
        let unusable = |reason: String| CertError::Certificate {
            what: CA_CERT_KEY.into(),
            reason,
        };
        if !info.is_ca {
            return Err(unusable("not a CA certificate (basicConstraints)".into()));
        }
        if !info.can_sign_certificates {
            return Err(unusable("its key usage does not allow keyCertSign".into()));
        }
        let key = parse_key(CA_KEY_KEY, &ca.key_pem)?;
        if key.subject_public_key_info() != info.spki {
            return Err(CertError::Key {
                what: CA_KEY_KEY.into(),
                reason: format!("does not match {CA_CERT_KEY}"),
            });
        }
        let subject = info
            .subject_dn
            .clone()
            .map_err(|reason| unusable(format!("its subject cannot be reproduced: {reason}")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject;
        params.key_identifier_method = match &info.ski {
            Some(ski) => KeyIdMethod::PreSpecified(ski.clone()),
            None => KeyIdMethod::Sha256,
        };
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ok(Signer {
            info,
            issuer: Issuer::new(params, key),
        })
    }
}

/// What the operator needs to know about one parsed certificate.
#[derive(Clone)]
struct CertInfo {
    der: Vec<u8>,
    subject: String,
    subject_raw: Vec<u8>,
    /// The subject as rcgen can write it, or why it cannot be.
    subject_dn: Result<DistinguishedName, String>,
    issuer: String,
    issuer_raw: Vec<u8>,
    validity: Validity,
    is_ca: bool,
    can_sign_certificates: bool,
    spki: Vec<u8>,
    ski: Option<Vec<u8>>,
    aki: Option<Vec<u8>>,
    dns_names: BTreeSet<String>,
    ip_addresses: BTreeSet<IpAddr>,
}

impl CertInfo {
    fn from_der(what: &str, der: &[u8]) -> Result<Self, CertError> {
        let invalid = |reason: String| CertError::Certificate {
            what: what.to_owned(),
            reason,
        };
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| invalid(e.to_string()))?;
        let validity = Validity {
            not_before: from_timestamp(cert.validity().not_before.timestamp())?,
            not_after: from_timestamp(cert.validity().not_after.timestamp())?,
        };
        let can_sign_certificates = cert
            .key_usage()
            .map_err(|e| invalid(e.to_string()))?
            .is_none_or(|usage| usage.value.key_cert_sign());
        let mut ski = None;
        let mut aki = None;
        for extension in cert.iter_extensions() {
            match extension.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => ski = Some(id.0.to_vec()),
                ParsedExtension::AuthorityKeyIdentifier(id) => {
                    aki = id.key_identifier.as_ref().map(|id| id.0.to_vec());
                }
                _ => {}
            }
        }
        let mut dns_names = BTreeSet::new();
        let mut ip_addresses = BTreeSet::new();
        if let Some(san) = cert
            .subject_alternative_name()
            .map_err(|e| invalid(e.to_string()))?
        {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => {
                        dns_names.insert(dns.to_ascii_lowercase());
                    }
                    GeneralName::IPAddress(bytes) => {
                        if let Some(ip) = ip_from_bytes(bytes) {
                            ip_addresses.insert(ip);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(CertInfo {
            der: der.to_vec(),
            subject: cert.subject().to_string(),
            subject_raw: cert.subject().as_raw().to_vec(),
            subject_dn: reproduce_name(cert.subject()),
            issuer: cert.issuer().to_string(),
            issuer_raw: cert.issuer().as_raw().to_vec(),
            validity,
            is_ca: cert.is_ca(),
            can_sign_certificates,
            spki: cert.public_key().raw.to_vec(),
            ski,
            aki,
            dns_names,
            ip_addresses,
        })
    }

    /// Whether `leaf` names this certificate as its issuer: the issuer name is this subject
    /// (byte for byte) and, when this certificate has a subject key identifier, the leaf's
    /// authority key identifier is that identifier. The signature itself is not verified.
    fn check_issued(&self, leaf: &CertInfo) -> Result<(), String> {
        if leaf.issuer_raw != self.subject_raw {
            return Err(format!(
                "its issuer {:?} is not the CA {:?}",
                leaf.issuer, self.subject
            ));
        }
        if let Some(ski) = &self.ski
            && leaf.aki.as_ref() != Some(ski)
        {
            return Err(
                "its authority key identifier is not the CA's subject key identifier".to_owned(),
            );
        }
        Ok(())
    }
}

/// The certificates of a PEM chain, in order; at least one.
fn cert_chain(what: &str, pem: &str) -> Result<Vec<CertInfo>, CertError> {
    let invalid = |reason: String| CertError::Certificate {
        what: what.to_owned(),
        reason,
    };
    let mut chain = Vec::new();
    for block in Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| invalid(format!("bad PEM: {e}")))?;
        if block.label != "CERTIFICATE" {
            return Err(invalid(format!(
                "unexpected PEM block {:?} (expected CERTIFICATE)",
                block.label
            )));
        }
        chain.push(CertInfo::from_der(what, &block.contents)?);
    }
    if chain.is_empty() {
        return Err(invalid("no CERTIFICATE PEM block".into()));
    }
    Ok(chain)
}

/// The one certificate of a PEM text.
fn single_cert(what: &str, pem: &str) -> Result<CertInfo, CertError> {
    let mut chain = cert_chain(what, pem)?;
    if chain.len() != 1 {
        return Err(CertError::Certificate {
            what: what.to_owned(),
            reason: format!("expected one certificate, found {}", chain.len()),
        });
    }
    chain.pop().ok_or_else(|| CertError::Certificate {
        what: what.to_owned(),
        reason: "no CERTIFICATE PEM block".into(),
    })
}

/// A PKCS#8 PEM private key.
fn parse_key(what: &str, pem: &str) -> Result<KeyPair, CertError> {
    KeyPair::from_pem(pem).map_err(|e| CertError::Key {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

/// The subject as an rcgen name that serializes to the same bytes: one attribute per RDN, no
/// attribute type twice, UTF8String, PrintableString or IA5String values.
fn reproduce_name(name: &X509Name<'_>) -> Result<DistinguishedName, String> {
    let mut out = DistinguishedName::new();
    let mut seen = BTreeSet::new();
    for rdn in name.iter() {
        let mut attributes = rdn.iter();
        let (Some(attribute), None) = (attributes.next(), attributes.next()) else {
            return Err("a multi-valued relative distinguished name".into());
        };
        let oid: Vec<u64> = attribute
            .attr_type()
            .iter()
            .ok_or("an attribute type OID with an oversized arc")?
            .collect();
        if !seen.insert(oid.clone()) {
            return Err(format!(
                "attribute type {} appears twice",
                attribute.attr_type()
            ));
        }
        let value = attribute.attr_value();
        let text = std::str::from_utf8(value.data)
            .map_err(|_| "an attribute value that is not UTF-8".to_owned())?
            .to_owned();
        let value = match value.tag() {
            Tag::Utf8String => DnValue::Utf8String(text),
            Tag::PrintableString => {
                DnValue::PrintableString(text.try_into().map_err(|e| format!("{e}"))?)
            }
            Tag::Ia5String => DnValue::Ia5String(text.try_into().map_err(|e| format!("{e}"))?),
            other => return Err(format!("an attribute value of type {other}")),
        };
        out.push(DnType::from_oid(&oid), value);
    }
    Ok(out)
}

/// An IP address from a subjectAltName's octets.
fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(IpAddr::V4(Ipv4Addr::from(v4)));
    }
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(|v6| IpAddr::V6(Ipv6Addr::from(v6)))
}

fn describe_names(dns: &BTreeSet<String>, ips: &BTreeSet<IpAddr>) -> String {
    let all: Vec<String> = dns
        .iter()
        .cloned()
        .chain(ips.iter().map(IpAddr::to_string))
        .collect();
    format!("[{}]", all.join(", "))
}

fn check_lifetime(lifetime: Duration) -> Result<(), CertError> {
    if lifetime < MIN_LIFETIME {
        return Err(CertError::Lifetime(lifetime));
    }
    Ok(())
}

/// `notBefore` and `notAfter` for a certificate issued at `now` (whole seconds).
fn window(
    now: SystemTime,
    lifetime: Duration,
) -> Result<(OffsetDateTime, OffsetDateTime), CertError> {
    check_lifetime(lifetime)?;
    let now = to_offset(now)?;
    let out_of_range = || CertError::Time(format!("{lifetime:?} after {now} is out of range"));
    let skew = i64::try_from(CLOCK_SKEW_ALLOWANCE.as_secs()).map_err(|_| out_of_range())?;
    let lifetime_secs = i64::try_from(lifetime.as_secs()).map_err(|_| out_of_range())?;
    let not_before = now
        .checked_sub(time::Duration::seconds(skew))
        .ok_or_else(out_of_range)?;
    let not_after = now
        .checked_add(time::Duration::seconds(lifetime_secs))
        .ok_or_else(out_of_range)?;
    Ok((not_before, not_after))
}

/// `t` truncated to whole seconds.
fn to_offset(t: SystemTime) -> Result<OffsetDateTime, CertError> {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).ok(),
        Err(before) => i64::try_from(before.duration().as_secs())
            .ok()
            .map(|secs| -secs),
    };
    secs.and_then(|secs| OffsetDateTime::from_unix_timestamp(secs).ok())
        .ok_or_else(|| CertError::Time(format!("{t:?} is out of range")))
}

fn from_timestamp(secs: i64) -> Result<SystemTime, CertError> {
    let offset = Duration::from_secs(secs.unsigned_abs());
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(offset)
    } else {
        UNIX_EPOCH.checked_sub(offset)
    };
    t.ok_or_else(|| CertError::Time(format!("unix time {secs} is out of range")))
}

/// RFC 3339, UTC, whole seconds.
fn display_time(t: SystemTime) -> String {
    match to_offset(t) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{t:?}"),
    }
}

fn with_newline(pem: &str) -> String {
    let mut pem = pem.to_owned();
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use x509_parser::prelude::{FromDer, X509Certificate};

    const MINUTE: Duration = Duration::from_secs(60);

    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_750_000_000)
    }

    fn after(minutes: u64, seconds: u64) -> SystemTime {
        t0() + MINUTE * minutes as u32 + Duration::from_secs(seconds)
    }

    /// CA 30 minutes, serving 9 minutes. With the one-minute backdate the CA spans 31 minutes
    /// (renewal due 20m40s after notBefore: t0 + 19m40s) and the serving certificate 10
    /// minutes (renewal due 6m40s after notBefore: t0 + 5m40s).
    fn short() -> Lifetimes {
        Lifetimes {
            ca: MINUTE * 30,
            serving: MINUTE * 9,
        }
    }

    fn names() -> ServingNames {
        ServingNames::for_service("sidecar-injector", "sidecar-system", None)
    }

    fn fresh() -> CertificateBundle {
        reconcile(None, &names(), &short(), t0()).unwrap().bundle
    }

    fn leaf(bundle: &CertificateBundle) -> CertInfo {
        cert_chain(TLS_CERT_KEY, &bundle.serving.chain_pem)
            .unwrap()
            .remove(0)
    }

    fn ca_info(pem: &str) -> CertInfo {
        single_cert(CA_CERT_KEY, pem).unwrap()
    }

    /// The serving certificate chains to the bundle's CA (issuer name, AKI = SKI), its key
    /// matches (rustls, through the webhook's own loader, checks the pair), and its chain is the
    /// leaf followed by the CA.
    fn assert_serving_from(bundle: &CertificateBundle, ca_pem: &str) {
        let ca = ca_info(ca_pem);
        let leaf = leaf(bundle);
        ca.check_issued(&leaf).unwrap();
        assert_eq!(leaf.aki, ca.ski);
        assert!(ca.ski.is_some());
        assert_eq!(leaf.issuer_raw, ca.subject_raw);
        let chain = cert_chain(TLS_CERT_KEY, &bundle.serving.chain_pem).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1].der, ca.der);
        injector_webhook::tls::certified_key(
            bundle.serving.chain_pem.as_bytes(),
            bundle.serving.key_pem.as_bytes(),
        )
        .expect("the webhook loads the serving certificate and its key");
    }

    fn unchanged(bundle: &CertificateBundle, now: SystemTime) {
        let r = reconcile(Some(bundle), &names(), &short(), now).unwrap();
        assert!(!r.changed, "unexpected change at {now:?}: {:?}", r.reasons);
        assert!(r.reasons.is_empty());
        assert_eq!(&r.bundle, bundle);
    }

    fn pem_count(pem: &str) -> usize {
        pem.matches("-----BEGIN CERTIFICATE-----").count()
    }

    #[test]
    fn fresh_generation() {
        let r = reconcile(None, &names(), &short(), t0()).unwrap();
        assert!(r.changed);
        assert_eq!(r.reasons.len(), 1, "{:?}", r.reasons);
        let bundle = r.bundle;
        assert!(bundle.previous_ca_cert_pem.is_none());

        // The CA: self-signed, a CA, keyCertSign + cRLSign, backdated one minute.
        let ca_der = &ca_info(&bundle.ca.cert_pem).der;
        let (_, ca) = X509Certificate::from_der(ca_der).unwrap();
        assert!(ca.is_ca());
        assert_eq!(ca.subject().as_raw(), ca.issuer().as_raw());
        let cn = ca
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap();
        assert_eq!(cn, format!("{CA_COMMON_NAME}@1750000000"));
        let usage = ca.key_usage().unwrap().unwrap().value;
        assert!(usage.key_cert_sign() && usage.crl_sign());
        let v = validity(&bundle.ca.cert_pem).unwrap();
        assert_eq!(v.not_before, t0() - MINUTE);
        assert_eq!(v.not_after, t0() + MINUTE * 30);

        // The serving certificate.
        let leaf_der = leaf(&bundle).der;
        let (_, cert) = X509Certificate::from_der(&leaf_der).unwrap();
        assert!(!cert.is_ca());
        let usage = cert.key_usage().unwrap().unwrap().value;
        assert!(usage.digital_signature() && usage.key_encipherment());
        assert!(!usage.key_cert_sign());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            sans,
            [
                "DNSName(sidecar-injector.sidecar-system.svc)",
                "DNSName(sidecar-injector.sidecar-system.svc.cluster.local)",
                "DNSName(sidecar-injector)",
                "DNSName(sidecar-injector.sidecar-system)",
            ]
        );
        let v = validity(&bundle.serving.chain_pem).unwrap();
        assert_eq!(v.not_before, t0() - MINUTE);
        assert_eq!(v.not_after, t0() + MINUTE * 9);
        assert_eq!(bundle.serving_expiry().unwrap(), t0() + MINUTE * 9);
        assert_serving_from(&bundle, &bundle.ca.cert_pem);

        // Only the current CA in the caBundle.
        assert_eq!(bundle.ca_bundle_pem(t0()), bundle.ca.cert_pem);
    }

    #[test]
    fn keys_are_ecdsa_p256() {
        let bundle = fresh();
        for key in [&bundle.ca.key_pem, &bundle.serving.key_pem] {
            let key = KeyPair::from_pem(key).unwrap();
            assert!(key.is_compatible(&PKCS_ECDSA_P256_SHA256));
        }
    }

    #[test]
    fn no_change_right_after() {
        let bundle = fresh();
        unchanged(&bundle, t0());
        unchanged(&bundle, after(1, 0));
        unchanged(&bundle, after(5, 39));
        assert_eq!(next_check(&bundle, &short()), after(5, 40));
    }

    #[test]
    fn serving_rotates_at_two_thirds_of_its_lifetime() {
        let bundle = fresh();
        let due = next_check(&bundle, &short());
        assert_eq!(due, after(5, 40));
        unchanged(&bundle, due - Duration::from_secs(1));

        let r = reconcile(Some(&bundle), &names(), &short(), due).unwrap();
        assert!(r.changed);
        assert_eq!(r.reasons.len(), 1, "{:?}", r.reasons);
        assert!(r.reasons[0].contains("two thirds"), "{:?}", r.reasons);
        assert_eq!(r.bundle.ca, bundle.ca, "the CA is kept");
        assert!(r.bundle.previous_ca_cert_pem.is_none());
        assert_ne!(r.bundle.serving, bundle.serving);
        assert_ne!(
            r.bundle.serving.key_pem, bundle.serving.key_pem,
            "a new key"
        );
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);
        let v = validity(&r.bundle.serving.chain_pem).unwrap();
        assert_eq!(v.not_before, due - MINUTE);
        assert_eq!(v.not_after, due + MINUTE * 9);
        // The next serving renewal is 5m40s later.
        assert_eq!(
            next_check(&r.bundle, &short()),
            due + MINUTE * 5 + Duration::from_secs(40)
        );
        unchanged(&r.bundle, due);
    }

    #[test]
    fn expired_serving_certificate_is_reissued() {
        let bundle = fresh();
        let r = reconcile(Some(&bundle), &names(), &short(), after(9, 0)).unwrap();
        assert!(r.changed);
        assert!(r.reasons[0].contains("expired"), "{:?}", r.reasons);
        assert_eq!(r.bundle.ca, bundle.ca);
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);
    }

    #[test]
    fn ca_rotation_keeps_previous_and_reissues_serving() {
        // Keep the serving certificate fresh until just before the CA's renewal.
        let mut bundle = fresh();
        let mut now = t0();
        while next_check(&bundle, &short()) < after(19, 40) {
            now = next_check(&bundle, &short());
            let r = reconcile(Some(&bundle), &names(), &short(), now).unwrap();
            assert_eq!(r.bundle.ca, bundle.ca);
            bundle = r.bundle;
        }
        assert!(now < after(19, 40));
        assert_eq!(next_check(&bundle, &short()), after(19, 40));
        unchanged(&bundle, after(19, 39));

        let old_ca = bundle.ca.clone();
        let r = reconcile(Some(&bundle), &names(), &short(), after(19, 40)).unwrap();
        assert!(r.changed);
        assert!(
            r.reasons[0].contains("two thirds of its lifetime"),
            "{:?}",
            r.reasons
        );
        let rotated = r.bundle;
        assert_ne!(rotated.ca, old_ca, "a new CA");
        assert_ne!(rotated.ca.key_pem, old_ca.key_pem);
        assert_eq!(
            rotated.previous_ca_cert_pem.as_deref(),
            Some(old_ca.cert_pem.as_str())
        );
        // The new serving certificate is issued by the new CA, not the old one.
        assert_serving_from(&rotated, &rotated.ca.cert_pem);
        assert!(
            ca_info(&old_ca.cert_pem)
                .check_issued(&leaf(&rotated))
                .is_err()
        );
        // Both CAs in the caBundle, new first; the old serving certificate (still served by
        // replicas that have not reloaded) stays trusted through the previous CA.
        let ca_bundle = rotated.ca_bundle_pem(after(19, 40));
        assert_eq!(pem_count(&ca_bundle), 2);
        assert!(ca_bundle.starts_with(&rotated.ca.cert_pem));
        assert!(ca_bundle.contains(&old_ca.cert_pem));
        assert!(
            ca_info(&old_ca.cert_pem)
                .check_issued(&leaf(&bundle))
                .is_ok()
        );
        // The old CA stays until it expires at t0 + 30m.
        assert_eq!(
            rotated.ca_bundle_pem(after(29, 59)),
            rotated.ca_bundle_pem(after(19, 40))
        );
        assert_eq!(rotated.ca_bundle_pem(after(30, 0)), rotated.ca.cert_pem);
        unchanged(&rotated, after(19, 41));
    }

    #[test]
    fn previous_ca_dropped_after_it_expires() {
        let bundle = fresh();
        // At t0 + 20m both certificates are due: new CA, old one kept as previous.
        let rotated = reconcile(Some(&bundle), &names(), &short(), after(20, 0))
            .unwrap()
            .bundle;
        assert!(rotated.previous_ca_cert_pem.is_some());
        // Serving renewal due at t0 + 25m40s, while the previous CA is still valid.
        assert_eq!(next_check(&rotated, &short()), after(25, 40));
        let renewed = reconcile(Some(&rotated), &names(), &short(), after(25, 40))
            .unwrap()
            .bundle;
        assert!(renewed.previous_ca_cert_pem.is_some());
        // The previous CA expires at t0 + 30m: that is the next change.
        assert_eq!(next_check(&renewed, &short()), after(30, 0));
        unchanged(&renewed, after(29, 59));
        let r = reconcile(Some(&renewed), &names(), &short(), after(30, 0)).unwrap();
        assert!(r.changed);
        assert_eq!(r.reasons.len(), 1, "{:?}", r.reasons);
        assert!(
            r.reasons[0].contains("dropped the previous CA"),
            "{:?}",
            r.reasons
        );
        assert!(r.bundle.previous_ca_cert_pem.is_none());
        assert_eq!(r.bundle.ca, renewed.ca);
        assert_eq!(r.bundle.serving, renewed.serving);
        assert!(!r.bundle.to_secret_data().contains_key(PREVIOUS_CA_CERT_KEY));
    }

    #[test]
    fn expired_ca_is_replaced_without_previous() {
        let bundle = fresh();
        let r = reconcile(Some(&bundle), &names(), &short(), after(45, 0)).unwrap();
        assert!(r.changed);
        assert!(r.reasons[0].contains("the CA expired"), "{:?}", r.reasons);
        assert_ne!(r.bundle.ca, bundle.ca);
        assert!(r.bundle.previous_ca_cert_pem.is_none());
        assert_serving_from(&r.bundle, &r.bundle.ca.cert_pem);
        assert!(validity(&r.bundle.ca.cert_pem).unwrap().not_after > after(45, 0));
    }

    #[test]
    fn san_change_triggers_reissue() {
        let bundle = fresh();
        let url_mode = ServingNames::for_service(
            "sidecar-injector",
            "sidecar-system",
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        );
        let r = reconcile(Some(&bundle), &url_mode, &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert_eq!(r.reasons.len(), 1, "{:?}", r.reasons);
        assert!(r.reasons[0].contains("names"), "{:?}", r.reasons);
        assert!(r.reasons[0].contains("127.0.0.1"), "{:?}", r.reasons);
        assert_eq!(r.bundle.ca, bundle.ca);
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);
        let new_leaf = leaf(&r.bundle);
        assert!(
            new_leaf
                .ip_addresses
                .contains(&IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(new_leaf.dns_names, url_mode.dns_set());
        // Stable with the new names, whatever their order or case.
        let mut shuffled = url_mode.clone();
        shuffled.dns_names.reverse();
        shuffled.dns_names[0] = shuffled.dns_names[0].to_uppercase();
        let again = reconcile(Some(&r.bundle), &shuffled, &short(), after(1, 0)).unwrap();
        assert!(!again.changed, "{:?}", again.reasons);

        // A different service name also re-issues.
        let other = ServingNames::for_service("other", "sidecar-system", None);
        let r = reconcile(Some(&bundle), &other, &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert!(
            leaf(&r.bundle)
                .dns_names
                .contains("other.sidecar-system.svc")
        );
    }

    #[test]
    fn serving_names_for_service() {
        let names = ServingNames::for_service("Hook", "NS", Some("::1".parse().unwrap()));
        assert_eq!(
            names.dns_names,
            [
                "hook.ns.svc",
                "hook.ns.svc.cluster.local",
                "hook",
                "hook.ns"
            ]
        );
        assert_eq!(names.ip_addresses, [IpAddr::V6(Ipv6Addr::LOCALHOST)]);
        assert!(!names.is_empty());
    }

    #[test]
    fn ip_only_serving_certificate() {
        let ca = generate_ca(t0(), MINUTE * 30, "test-ca").unwrap();
        let names = ServingNames {
            dns_names: vec![],
            ip_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        };
        let serving = issue_serving(&ca, &names, t0(), MINUTE * 9).unwrap();
        let leaf = cert_chain(TLS_CERT_KEY, &serving.chain_pem)
            .unwrap()
            .remove(0);
        assert!(leaf.dns_names.is_empty());
        assert_eq!(leaf.ip_addresses, names.ip_set());
        assert_eq!(leaf.subject, "CN=127.0.0.1");
    }

    #[test]
    fn serving_certificate_never_outlives_its_ca() {
        let ca = generate_ca(t0(), MINUTE * 10, "test-ca").unwrap();
        let serving = issue_serving(&ca, &names(), t0(), MINUTE * 60).unwrap();
        assert_eq!(
            validity(&serving.chain_pem).unwrap().not_after,
            validity(&ca.cert_pem).unwrap().not_after
        );
        assert!(matches!(
            issue_serving(&ca, &names(), after(10, 0), MINUTE * 9),
            Err(CertError::CaCannotIssue(_))
        ));
    }

    #[test]
    fn generate_and_issue_with_explicit_ca() {
        let ca = generate_ca(t0(), MINUTE * 30, "my CA").unwrap();
        let serving = issue_serving(&ca, &names(), t0(), MINUTE * 9).unwrap();
        let bundle = CertificateBundle {
            ca: ca.clone(),
            previous_ca_cert_pem: None,
            serving,
        };
        assert_serving_from(&bundle, &ca.cert_pem);
        assert_eq!(ca_info(&ca.cert_pem).subject, "CN=my CA");
        // A bundle assembled by hand is accepted as is by reconcile.
        unchanged(&bundle, after(1, 0));
    }

    #[test]
    fn secret_data_round_trip() {
        let bundle = fresh();
        let data = bundle.to_secret_data();
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            [CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY]
        );
        let back = CertificateBundle::from_secret_data(&data).unwrap().unwrap();
        assert_eq!(back, bundle);

        let rotated = reconcile(Some(&bundle), &names(), &short(), after(20, 0))
            .unwrap()
            .bundle;
        let data = rotated.to_secret_data();
        assert_eq!(
            data[PREVIOUS_CA_CERT_KEY].0,
            bundle.ca.cert_pem.as_bytes().to_vec()
        );
        assert_eq!(
            CertificateBundle::from_secret_data(&data).unwrap().unwrap(),
            rotated
        );
    }

    #[test]
    fn empty_secret_is_none() {
        assert_eq!(
            CertificateBundle::from_secret_data(&BTreeMap::new()).unwrap(),
            None
        );
        let mut data = BTreeMap::new();
        data.insert("unrelated".to_owned(), ByteString(b"x".to_vec()));
        data.insert(TLS_CERT_KEY.to_owned(), ByteString(Vec::new()));
        data.insert(CA_KEY_KEY.to_owned(), ByteString(b" \n".to_vec()));
        assert_eq!(CertificateBundle::from_secret_data(&data).unwrap(), None);
    }

    #[test]
    fn garbage_secret_data_gives_clear_errors() {
        let good = fresh().to_secret_data();
        let with = |key: &str, value: &[u8]| {
            let mut data = good.clone();
            data.insert(key.to_owned(), ByteString(value.to_vec()));
            CertificateBundle::from_secret_data(&data).unwrap_err()
        };

        let e = with(CA_CERT_KEY, b"not a certificate");
        assert!(matches!(&e, CertError::Certificate { what, .. } if what == CA_CERT_KEY));
        assert_eq!(
            e.to_string(),
            "ca.crt: not a usable certificate: no CERTIFICATE PEM block"
        );

        let e = with(
            TLS_CERT_KEY,
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        assert!(
            matches!(&e, CertError::Certificate { what, .. } if what == TLS_CERT_KEY),
            "{e}"
        );

        let e = with(
            PREVIOUS_CA_CERT_KEY,
            b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        );
        assert!(
            e.to_string()
                .starts_with("ca-previous.crt: not a usable certificate: bad PEM"),
            "{e}"
        );

        let key_pem = good[CA_KEY_KEY].0.clone();
        let e = with(CA_CERT_KEY, &key_pem);
        assert!(
            e.to_string()
                .contains("unexpected PEM block \"PRIVATE KEY\""),
            "{e}"
        );

        let e = with(TLS_KEY_KEY, b"garbage");
        assert!(
            matches!(&e, CertError::Key { what, .. } if what == TLS_KEY_KEY),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("tls.key: not a usable private key"),
            "{e}"
        );

        let e = with(CA_KEY_KEY, &[0xff, 0xfe, 0x00]);
        assert!(matches!(e, CertError::NotUtf8(CA_KEY_KEY)), "{e}");
        assert_eq!(
            e.to_string(),
            "the certificate Secret's \"ca.key\" is not UTF-8 text"
        );

        let mut partial = good.clone();
        partial.remove(TLS_KEY_KEY);
        let e = CertificateBundle::from_secret_data(&partial).unwrap_err();
        assert!(matches!(e, CertError::MissingKey(TLS_KEY_KEY)), "{e}");
        assert_eq!(
            e.to_string(),
            "the certificate Secret has some of its keys but not \"tls.key\""
        );
    }

    #[test]
    fn validity_errors() {
        assert!(matches!(validity(""), Err(CertError::Certificate { .. })));
        assert!(validity("garbage").is_err());
        let bundle = fresh();
        // The leaf's validity for a chain.
        assert_eq!(
            validity(&bundle.serving.chain_pem).unwrap().not_after,
            t0() + MINUTE * 9
        );
        let v = validity(&bundle.ca.cert_pem).unwrap();
        assert_eq!(v.lifetime(), MINUTE * 31);
        assert!(!v.is_expired(after(29, 59)));
        assert!(v.is_expired(after(30, 0)));
    }

    #[test]
    fn unusable_ca_is_replaced_keeping_the_old_certificate() {
        let bundle = fresh();
        let mut broken = bundle.clone();
        broken.ca.key_pem = bundle.serving.key_pem.clone();
        let r = reconcile(Some(&broken), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert!(r.reasons[0].contains("ca.key"), "{:?}", r.reasons);
        assert!(r.reasons[0].contains("does not match"), "{:?}", r.reasons);
        assert_ne!(r.bundle.ca.cert_pem, bundle.ca.cert_pem);
        assert_eq!(
            r.bundle.previous_ca_cert_pem.as_deref(),
            Some(bundle.ca.cert_pem.as_str())
        );
        assert_serving_from(&r.bundle, &r.bundle.ca.cert_pem);
        assert_eq!(next_check(&broken, &short()), UNIX_EPOCH);

        // A CA certificate that is not a CA (the serving leaf) is replaced, not kept.
        let mut not_ca = bundle.clone();
        not_ca.ca = Ca {
            cert_pem: leaf_pem(&bundle),
            key_pem: bundle.serving.key_pem.clone(),
        };
        let r = reconcile(Some(&not_ca), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.reasons[0].contains("not a CA"), "{:?}", r.reasons);
        assert!(r.bundle.previous_ca_cert_pem.is_none());

        // Garbage is replaced.
        let mut garbage = bundle.clone();
        garbage.ca.cert_pem = "garbage".into();
        let r = reconcile(Some(&garbage), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert!(r.bundle.previous_ca_cert_pem.is_none());
        assert_serving_from(&r.bundle, &r.bundle.ca.cert_pem);
    }

    fn leaf_pem(bundle: &CertificateBundle) -> String {
        let end = "-----END CERTIFICATE-----\n";
        let chain = &bundle.serving.chain_pem;
        let cut = chain.find(end).unwrap() + end.len();
        chain[..cut].to_owned()
    }

    #[test]
    fn unusable_serving_certificate_is_reissued() {
        let bundle = fresh();
        let other = reconcile(None, &names(), &short(), t0()).unwrap().bundle;

        // Issued by another CA.
        let mut foreign = bundle.clone();
        foreign.serving = other.serving.clone();
        let r = reconcile(Some(&foreign), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert!(
            r.reasons[0].contains("not issued by the current CA"),
            "{:?}",
            r.reasons
        );
        assert_eq!(r.bundle.ca, bundle.ca);
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);
        assert_eq!(next_check(&foreign, &short()), UNIX_EPOCH);

        // Key not matching the certificate.
        let mut mismatched = bundle.clone();
        mismatched.serving.key_pem = other.serving.key_pem.clone();
        let r = reconcile(Some(&mismatched), &names(), &short(), after(1, 0)).unwrap();
        assert!(
            r.reasons[0].contains("tls.key does not match tls.crt"),
            "{:?}",
            r.reasons
        );
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);

        // The leaf alone, without the CA after it.
        let mut leaf_only = bundle.clone();
        leaf_only.serving.chain_pem = leaf_pem(&bundle);
        let r = reconcile(Some(&leaf_only), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.reasons[0].contains("chain"), "{:?}", r.reasons);
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);

        // Garbage.
        let mut garbage = bundle.clone();
        garbage.serving.chain_pem = "garbage".into();
        let r = reconcile(Some(&garbage), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert_eq!(r.bundle.ca, bundle.ca);
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);
    }

    #[test]
    fn unparseable_previous_ca_is_dropped() {
        let mut bundle = fresh();
        bundle.previous_ca_cert_pem = Some("garbage".into());
        assert_eq!(next_check(&bundle, &short()), UNIX_EPOCH);
        assert_eq!(bundle.ca_bundle_pem(t0()), bundle.ca.cert_pem);
        let r = reconcile(Some(&bundle), &names(), &short(), t0()).unwrap();
        assert!(r.changed);
        assert!(r.bundle.previous_ca_cert_pem.is_none());
        assert_eq!(r.bundle.serving, bundle.serving);
    }

    #[test]
    fn shorter_configured_lifetime_takes_effect() {
        let bundle = reconcile(None, &names(), &Lifetimes::default(), t0())
            .unwrap()
            .bundle;
        let year = validity(&bundle.ca.cert_pem).unwrap();
        assert_eq!(year.not_after, t0() + DEFAULT_CA_LIFETIME);
        assert_eq!(
            validity(&bundle.serving.chain_pem).unwrap().not_after,
            t0() + DEFAULT_SERVING_LIFETIME
        );
        let defaults = Lifetimes::default();
        // Serving renewal 2/3 into 90 days and one minute.
        assert_eq!(
            next_check(&bundle, &defaults),
            t0() - MINUTE + (DEFAULT_SERVING_LIFETIME + MINUTE) / 3 * 2
        );
        // Configured down to minutes: the certificates are renewed as if issued under it.
        assert_eq!(next_check(&bundle, &short()), after(5, 40));
        let r = reconcile(Some(&bundle), &names(), &short(), after(20, 0)).unwrap();
        assert!(r.changed);
        assert_ne!(r.bundle.ca, bundle.ca);
        assert_eq!(
            r.bundle.previous_ca_cert_pem.as_deref(),
            Some(bundle.ca.cert_pem.as_str())
        );
    }

    #[test]
    fn invalid_parameters_are_errors() {
        let tiny = Lifetimes {
            ca: MINUTE * 30,
            serving: Duration::from_secs(59),
        };
        assert!(matches!(
            reconcile(None, &names(), &tiny, t0()),
            Err(CertError::Lifetime(_))
        ));
        assert!(matches!(
            generate_ca(t0(), Duration::ZERO, "ca"),
            Err(CertError::Lifetime(_))
        ));
        let empty = ServingNames {
            dns_names: vec![],
            ip_addresses: vec![],
        };
        assert!(matches!(
            reconcile(None, &empty, &short(), t0()),
            Err(CertError::NoNames)
        ));
        let non_ascii = ServingNames {
            dns_names: vec!["héllo.svc".into()],
            ip_addresses: vec![],
        };
        assert!(matches!(
            reconcile(None, &non_ascii, &short(), t0()),
            Err(CertError::Generate(_))
        ));
        assert_eq!(
            Lifetimes::default(),
            Lifetimes {
                ca: Duration::from_secs(365 * 86_400),
                serving: Duration::from_secs(90 * 86_400),
            }
        );
    }

    #[test]
    fn debug_does_not_print_keys() {
        let bundle = fresh();
        let debug = format!("{bundle:?}");
        assert!(!debug.contains("PRIVATE KEY"));
        assert!(debug.contains("[elided]"));
    }

    /// Drives the loop a caller runs (sleep until `next_check`, reconcile) over three CA
    /// lifetimes and checks, at every step, that whatever was being served just before stays
    /// trusted by the new caBundle, the new serving certificate is valid and chains to the
    /// current CA, and the caBundle never holds more than two CAs.
    #[test]
    fn rotation_loop_keeps_continuity() {
        let mut bundle = fresh();
        let mut now = t0();
        let mut ca_rotations = 0;
        let mut serving_rotations = 0;
        while now < after(90, 0) {
            let next = next_check(&bundle, &short());
            assert!(next > now, "next_check {next:?} is not after {now:?}");
            unchanged(&bundle, next - Duration::from_secs(1));
            now = next;
            let r = reconcile(Some(&bundle), &names(), &short(), now).unwrap();
            assert!(r.changed, "nothing changed at next_check");
            let ca_bundle = r.bundle.ca_bundle_pem(now);
            assert!(pem_count(&ca_bundle) <= 2);
            // The certificate served so far is trusted by the new caBundle, if still valid.
            let old_leaf = leaf(&bundle);
            if !old_leaf.validity.is_expired(now) {
                let trusted = cert_chain("caBundle", &ca_bundle)
                    .unwrap()
                    .iter()
                    .any(|ca| ca.check_issued(&old_leaf).is_ok());
                assert!(trusted, "the served certificate lost trust at {now:?}");
            }
            let new_leaf = leaf(&r.bundle);
            assert!(new_leaf.validity.not_before <= now && !new_leaf.validity.is_expired(now));
            assert_serving_from(&r.bundle, &r.bundle.ca.cert_pem);
            if r.bundle.ca != bundle.ca {
                ca_rotations += 1;
            }
            if r.bundle.serving != bundle.serving {
                serving_rotations += 1;
            }
            bundle = r.bundle;
        }
        assert_eq!(ca_rotations, 4, "every 20m40s over 90 minutes");
        assert!(serving_rotations >= 15, "{serving_rotations}");
    }
}
