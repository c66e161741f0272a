//! Issuing certificates: a self-signed CA, and serving certificates signed by it for the
//! webhook's names.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType,
};
use time::OffsetDateTime;

use super::bundle::{Ca, Serving, with_newline};
use super::x509::{CertInfo, display_time, parse_key, single_cert, to_offset};
use super::{CA_CERT_KEY, CA_KEY_KEY, CLOCK_SKEW_ALLOWANCE, CertError, MIN_LIFETIME, TLS_CERT_KEY};

/// Longest common name X.509 allows (`ub-common-name`).
const MAX_COMMON_NAME_LEN: usize = 64;

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
    pub(super) fn dns_set(&self) -> BTreeSet<String> {
        self.dns_names
            .iter()
            .map(|name| name.to_ascii_lowercase())
            .collect()
    }

    /// The IP addresses as a set.
    pub(super) fn ip_set(&self) -> BTreeSet<IpAddr> {
        self.ip_addresses.iter().copied().collect()
    }
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

/// A CA ready to sign: what its certificate says, and an rcgen issuer reproducing its subject
/// and key identifier.
pub(super) struct Signer {
    pub(super) info: CertInfo,
    pub(super) issuer: Issuer<'static, KeyPair>,
}

impl Signer {
    /// Checks that `ca` is a CA certificate allowed to sign certificates, with a matching key
    /// and a subject rcgen can reproduce byte for byte.
    pub(super) fn load(ca: &Ca) -> Result<Self, CertError> {
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

pub(super) fn check_lifetime(lifetime: Duration) -> Result<(), CertError> {
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
