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
