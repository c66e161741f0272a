use prometheus_client::encoding::text::encode;

use super::*;

#[test]
fn build_info_names_the_version() {
    let mut registry = Registry::default();
    let _metrics = WebhookMetrics::register(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    let line = format!(
        "sidecar_injector_build_info{{version=\"{}\",revision=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        BuildLabels::current().revision
    );
    assert!(text.contains(&line), "no {line} in:\n{text}");
    assert!(
        text.contains("# TYPE sidecar_injector_build info"),
        "{text}"
    );
}
