//! The rotation decision: what the certificate Secret should hold at a given moment, why,
//! and when to look again.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::PublicKeyData;

use super::bundle::{Ca, CertificateBundle};
use super::issue::{ServingNames, Signer, check_lifetime, generate_ca, issue_serving};
use super::x509::{CertInfo, cert_chain, display_time, parse_key, single_cert, to_offset};
use super::{
    CA_CERT_KEY, CA_COMMON_NAME, CertError, DEFAULT_CA_LIFETIME, DEFAULT_SERVING_LIFETIME,
    PREVIOUS_CA_CERT_KEY, TLS_CERT_KEY, TLS_KEY_KEY,
};

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
/// Errors only when generating fails (or `lifetimes` are shorter than
/// [`MIN_LIFETIME`](super::MIN_LIFETIME), or `names` are empty); a broken bundle is replaced,
/// not reported as an error.
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
    let Some(existing) = existing else {
        return first_bundle(names, lifetimes, now);
    };
    let signer = match assess_ca(existing, lifetimes, now) {
        Ok(signer) => signer,
        Err(replacement) => return rotate_ca(existing, replacement, names, lifetimes, now),
    };

    let mut reasons = Vec::new();
    let mut bundle = existing.clone();
    if let Some(reason) = previous_ca_problem(existing, now) {
        reasons.push(format!("dropped the previous CA: {reason}"));
        bundle.previous_ca_cert_pem = None;
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

/// A new CA and a serving certificate issued by it, where there were no certificates.
fn first_bundle(
    names: &ServingNames,
    lifetimes: &Lifetimes,
    now: SystemTime,
) -> Result<Reconciled, CertError> {
    let ca = new_ca(now, lifetimes)?;
    let serving = issue_serving(&ca, names, now, lifetimes.serving)?;
    Ok(Reconciled {
        bundle: CertificateBundle {
            ca,
            previous_ca_cert_pem: None,
            serving,
        },
        changed: true,
        reasons: vec!["no certificates yet: generated a CA and a serving certificate".to_owned()],
    })
}

/// A new CA in place of `existing`'s, which `replacement` says why it is replaced (and
/// whether it stays as the previous CA, in place of any older one), and a serving certificate
/// issued by the new CA.
fn rotate_ca(
    existing: &CertificateBundle,
    replacement: CaReplacement,
    names: &ServingNames,
    lifetimes: &Lifetimes,
    now: SystemTime,
) -> Result<Reconciled, CertError> {
    let CaReplacement { reason, keep_old } = replacement;
    let mut reasons = vec![reason];
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
    Ok(Reconciled {
        bundle: CertificateBundle {
            ca,
            previous_ca_cert_pem: keep_old.then(|| existing.ca.cert_pem.clone()),
            serving,
        },
        changed: true,
        reasons,
    })
}

/// Why the previous CA of `existing` is dropped at `now`: it expired, or cannot be parsed;
/// `None` when there is none or it stays.
fn previous_ca_problem(existing: &CertificateBundle, now: SystemTime) -> Option<String> {
    let previous = existing.previous_ca_cert_pem.as_ref()?;
    match single_cert(PREVIOUS_CA_CERT_KEY, previous) {
        Ok(info) if info.validity.is_expired(now) => Some(format!(
            "it expired at {}",
            display_time(info.validity.not_after)
        )),
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
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

fn describe_names(dns: &BTreeSet<String>, ips: &BTreeSet<IpAddr>) -> String {
    let all: Vec<String> = dns
        .iter()
        .cloned()
        .chain(ips.iter().map(IpAddr::to_string))
        .collect();
    format!("[{}]", all.join(", "))
}
