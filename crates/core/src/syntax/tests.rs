use super::*;

#[test]
fn dns_labels() {
    assert!(is_dns_label("istio-proxy"));
    assert!(is_dns_label("a"));
    assert!(!is_dns_label(""));
    assert!(!is_dns_label("-a"));
    assert!(!is_dns_label("a-"));
    assert!(!is_dns_label("Proxy"));
    assert!(!is_dns_label("a.b"));
    assert!(!is_dns_label(&"a".repeat(64)));
    assert!(is_dns_label(&"a".repeat(63)));
}

#[test]
fn subdomains() {
    assert!(is_dns_subdomain("sidecar.dev"));
    assert!(!is_dns_subdomain("sidecar..dev"));
    assert!(!is_dns_subdomain(&format!("{}.dev", "a".repeat(250))));
}

#[test]
fn label_keys_and_values() {
    assert!(is_qualified_name("app"));
    assert!(is_qualified_name("sidecar.dev/injected"));
    assert!(is_qualified_name("app.kubernetes.io/name"));
    assert!(!is_qualified_name("/name"));
    assert!(!is_qualified_name("Sidecar.Dev/name"));
    assert!(!is_qualified_name("a/b/c"));
    assert!(is_label_value(""));
    assert!(is_label_value("v1.2_x-y"));
    assert!(!is_label_value("has space"));
    assert!(!is_label_value("-x"));
}
