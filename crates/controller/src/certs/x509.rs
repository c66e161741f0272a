//! Reading certificates and keys: what the operator needs to know of a certificate (names,
//! validity, issuer, key identifiers), and the times certificates carry.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{DistinguishedName, DnType, DnValue, KeyPair};
use time::OffsetDateTime;
use x509_parser::asn1_rs::Tag;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::pem::Pem;
use x509_parser::x509::X509Name;

use super::{CLOCK_SKEW_ALLOWANCE, CertError};

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
    pub(super) fn renew_at(&self, configured: Duration) -> SystemTime {
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

/// What the operator needs to know about one parsed certificate.
#[derive(Clone)]
pub(super) struct CertInfo {
    pub(super) der: Vec<u8>,
    pub(super) subject: String,
    pub(super) subject_raw: Vec<u8>,
    /// The subject as rcgen can write it, or why it cannot be.
    pub(super) subject_dn: Result<DistinguishedName, String>,
    pub(super) issuer: String,
    pub(super) issuer_raw: Vec<u8>,
    pub(super) validity: Validity,
    pub(super) is_ca: bool,
    pub(super) can_sign_certificates: bool,
    pub(super) spki: Vec<u8>,
    pub(super) ski: Option<Vec<u8>>,
    pub(super) aki: Option<Vec<u8>>,
    pub(super) dns_names: BTreeSet<String>,
    pub(super) ip_addresses: BTreeSet<IpAddr>,
}

impl CertInfo {
    pub(super) fn from_der(what: &str, der: &[u8]) -> Result<Self, CertError> {
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
    pub(super) fn check_issued(&self, leaf: &CertInfo) -> Result<(), String> {
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
pub(super) fn cert_chain(what: &str, pem: &str) -> Result<Vec<CertInfo>, CertError> {
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
pub(super) fn single_cert(what: &str, pem: &str) -> Result<CertInfo, CertError> {
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
pub(super) fn parse_key(what: &str, pem: &str) -> Result<KeyPair, CertError> {
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

/// `t` truncated to whole seconds.
pub(super) fn to_offset(t: SystemTime) -> Result<OffsetDateTime, CertError> {
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
pub(super) fn display_time(t: SystemTime) -> String {
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
