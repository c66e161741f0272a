#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

#[test]
fn the_handshake_goes_to_the_urls_host_and_port() {
    assert_eq!(
        host_and_port("https://127.0.0.1:8443/mutate/fail-1"),
        ("127.0.0.1".to_owned(), 8443)
    );
    assert_eq!(
        host_and_port("https://webhook.example/mutate"),
        ("webhook.example".to_owned(), 443)
    );
    assert_eq!(
        host_and_port("https://[::1]:9443/mutate/x"),
        ("::1".to_owned(), 9443)
    );
    assert_eq!(host_and_port("https://[::1]"), ("::1".to_owned(), 443));
}

#[test]
fn a_replica_is_reached_at_its_first_ready_endpoint_and_webhook_port() {
    let slice = |endpoints: serde_json::Value| -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "s"},
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 8080}, {"name": "webhook", "port": 8443}],
            "endpoints": endpoints,
        }))
        .unwrap()
    };
    let not_ready = slice(serde_json::json!([
        {"addresses": ["10.0.0.1"], "conditions": {"ready": false}},
    ]));
    let ready = slice(serde_json::json!([
        {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
        {"addresses": ["10.0.0.3"]},
    ]));
    assert_eq!(first_ready_endpoint(std::slice::from_ref(&not_ready)), None);
    assert_eq!(
        first_ready_endpoint(&[not_ready, ready]),
        Some(("10.0.0.3".to_owned(), 8443))
    );
}
