#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::x509::{CertInfo, cert_chain, single_cert};
use super::*;

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

/// The bundle read back from `data`, which must hold no problem.
fn read_back(data: &BTreeMap<String, ByteString>) -> CertificateBundle {
    let content = CertificateBundle::from_secret_data(data);
    assert!(content.problems.is_empty(), "{:?}", content.problems);
    content.bundle.unwrap()
}

#[test]
fn secret_data_round_trip() {
    let bundle = fresh();
    let data = bundle.to_secret_data();
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        [CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY]
    );
    assert_eq!(read_back(&data), bundle);

    let rotated = reconcile(Some(&bundle), &names(), &short(), after(20, 0))
        .unwrap()
        .bundle;
    let data = rotated.to_secret_data();
    assert_eq!(
        data[PREVIOUS_CA_CERT_KEY].0,
        bundle.ca.cert_pem.as_bytes().to_vec()
    );
    assert_eq!(read_back(&data), rotated);
}

#[test]
fn empty_secret_is_none() {
    let content = CertificateBundle::from_secret_data(&BTreeMap::new());
    assert_eq!(content.bundle, None);
    assert!(content.problems.is_empty());
    let mut data = BTreeMap::new();
    data.insert("unrelated".to_owned(), ByteString(b"x".to_vec()));
    data.insert(TLS_CERT_KEY.to_owned(), ByteString(Vec::new()));
    data.insert(CA_KEY_KEY.to_owned(), ByteString(b" \n".to_vec()));
    let content = CertificateBundle::from_secret_data(&data);
    assert_eq!(content.bundle, None);
    assert!(content.problems.is_empty());
}

/// What reading `good` with `key` set to `value` (or removed, for `None`) gives: the bundle,
/// and the one problem it must report, about `key`.
fn with_bad_key(
    good: &BTreeMap<String, ByteString>,
    key: &str,
    value: Option<&[u8]>,
) -> (CertificateBundle, CertError) {
    let mut data = good.clone();
    match value {
        Some(value) => data.insert(key.to_owned(), ByteString(value.to_vec())),
        None => data.remove(key),
    };
    let mut content = CertificateBundle::from_secret_data(&data);
    assert_eq!(content.problems.len(), 1, "{:?}", content.problems);
    let problem = content.problems.pop().unwrap();
    assert_eq!(problem.key, key);
    (content.bundle.unwrap(), problem.error)
}

#[test]
fn garbage_secret_data_gives_clear_errors_and_keeps_the_rest() {
    let bundle = fresh();
    let good = bundle.to_secret_data();

    let (read, e) = with_bad_key(&good, CA_CERT_KEY, Some(b"not a certificate"));
    assert!(matches!(&e, CertError::Certificate { what, .. } if what == CA_CERT_KEY));
    assert_eq!(
        e.to_string(),
        "ca.crt: not a usable certificate: no CERTIFICATE PEM block"
    );
    assert_eq!(read.serving, bundle.serving, "the rest is kept");
    assert_eq!(read.ca.key_pem, bundle.ca.key_pem);

    let (read, e) = with_bad_key(
        &good,
        TLS_CERT_KEY,
        Some(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
    );
    assert!(
        matches!(&e, CertError::Certificate { what, .. } if what == TLS_CERT_KEY),
        "{e}"
    );
    assert_eq!(read.ca, bundle.ca, "a bad serving certificate keeps the CA");

    let (read, e) = with_bad_key(
        &good,
        PREVIOUS_CA_CERT_KEY,
        Some(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n"),
    );
    assert!(
        e.to_string()
            .starts_with("ca-previous.crt: not a usable certificate: bad PEM"),
        "{e}"
    );
    assert_eq!(
        read, bundle,
        "an unreadable previous CA is left out, the rest kept"
    );

    let key_pem = good[CA_KEY_KEY].0.clone();
    let (_, e) = with_bad_key(&good, CA_CERT_KEY, Some(&key_pem));
    assert!(
        e.to_string()
            .contains("unexpected PEM block \"PRIVATE KEY\""),
        "{e}"
    );

    let (read, e) = with_bad_key(&good, TLS_KEY_KEY, Some(b"garbage"));
    assert!(
        matches!(&e, CertError::Key { what, .. } if what == TLS_KEY_KEY),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("tls.key: not a usable private key"),
        "{e}"
    );
    assert_eq!(read.ca, bundle.ca);

    let (read, e) = with_bad_key(&good, CA_KEY_KEY, Some(&[0xff, 0xfe, 0x00]));
    assert!(matches!(e, CertError::NotUtf8(CA_KEY_KEY)), "{e}");
    assert_eq!(
        e.to_string(),
        "the certificate Secret's \"ca.key\" is not UTF-8 text"
    );
    assert_eq!(read.ca.cert_pem, bundle.ca.cert_pem);
    assert_eq!(read.ca.key_pem, "");

    let (_, e) = with_bad_key(&good, PREVIOUS_CA_CERT_KEY, Some(&[0xff]));
    assert!(matches!(e, CertError::NotUtf8(PREVIOUS_CA_CERT_KEY)), "{e}");

    let (read, e) = with_bad_key(&good, TLS_KEY_KEY, None);
    assert!(matches!(e, CertError::MissingKey(TLS_KEY_KEY)), "{e}");
    assert_eq!(
        e.to_string(),
        "the certificate Secret has some of its keys but not \"tls.key\""
    );
    assert_eq!(read.ca, bundle.ca);
}

#[test]
fn what_cannot_be_read_is_replaced_and_a_readable_ca_is_kept() {
    let bundle = fresh();
    let good = bundle.to_secret_data();
    // A bad serving certificate or key, or none: a new one from the same CA.
    for (key, value) in [
        (TLS_CERT_KEY, Some(&b"junk"[..])),
        (TLS_KEY_KEY, Some(&b"junk"[..])),
        (TLS_CERT_KEY, None),
    ] {
        let (read, _) = with_bad_key(&good, key, value);
        let r = reconcile(Some(&read), &names(), &short(), after(1, 0)).unwrap();
        assert!(r.changed);
        assert_eq!(r.bundle.ca, bundle.ca, "{key}");
        assert_serving_from(&r.bundle, &bundle.ca.cert_pem);
    }
    // An unreadable previous CA: dropped, nothing else changes.
    let (read, _) = with_bad_key(&good, PREVIOUS_CA_CERT_KEY, Some(b"junk"));
    unchanged(&read, after(1, 0));
    // An unreadable CA key: a new CA, the old certificate still trusted as the previous one.
    let (read, _) = with_bad_key(&good, CA_KEY_KEY, Some(b"junk"));
    let r = reconcile(Some(&read), &names(), &short(), after(1, 0)).unwrap();
    assert_ne!(r.bundle.ca, bundle.ca);
    assert_eq!(
        r.bundle.previous_ca_cert_pem,
        Some(bundle.ca.cert_pem.clone())
    );
    // An unreadable CA certificate: the caBundle leaves it out rather than carry garbage.
    let (read, _) = with_bad_key(&good, CA_CERT_KEY, Some(b"junk"));
    assert_eq!(read.ca_bundle_pem(after(1, 0)), "");
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
