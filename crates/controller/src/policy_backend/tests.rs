use super::{LOAD_TIMEOUT_MAX, LOAD_TIMEOUT_MIN, load_timeout, unnamed};
use std::time::Duration;

#[test]
fn a_larger_object_is_given_longer_to_load() {
    let of = |bytes: usize| serde_json::json!({"spec": "x".repeat(bytes)});
    assert_eq!(load_timeout(&of(0)), LOAD_TIMEOUT_MIN);
    // A 1.3 MB policy (500 templates): over two minutes.
    let large = load_timeout(&of(1_300_000));
    assert!(large > Duration::from_secs(120), "{large:?}");
    assert_eq!(load_timeout(&of(10_000_000)), LOAD_TIMEOUT_MAX);
}

#[test]
fn a_refusal_reads_the_same_whatever_the_pods_name() {
    let refusal = |name: &str| {
        format!(
            "pods \"{name}\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (container \"a\" must not set securityContext.privileged=true)"
        )
    };
    let first = unnamed(&refusal("sidecar-injector-policy-proof-abcde"));
    assert_eq!(
        first,
        unnamed(&refusal("sidecar-injector-policy-proof-fghij"))
    );
    assert!(first.starts_with("violates PodSecurity"), "{first}");
    assert_eq!(unnamed("something else"), "something else");
}
