use std::collections::BTreeMap;

use super::*;

#[test]
fn every_metric_is_exposed() {
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry);
    metrics.record_reconcile("webhook_configuration", true);
    metrics.record_reconcile("webhook_configuration", false);
    metrics.set_templates(TemplateCounts {
        valid: 3,
        invalid: 1,
    });
    metrics.set_certificate_expiry(UNIX_EPOCH + std::time::Duration::from_secs(1_900_000_000));
    metrics.set_leader(true);
    metrics.set_entry_cycles(1);
    metrics.record_unreadable_secret_key("ca-previous.crt");
    metrics.set_templates_not_served(2);
    let tally = |current, stale, missing| Tally {
        current,
        stale,
        stale_in_place: 0,
        missing,
    };
    let tallies = BTreeMap::from([
        ("mesh".to_owned(), tally(4, 2, 1)),
        ("gone".to_owned(), tally(1, 1, 1)),
    ]);
    metrics.set_template_pods(tallies.iter().map(|(k, v)| (k, *v)), []);
    let mesh = "mesh".to_owned();
    metrics.set_template_pods([(&mesh, tally(5, 1, 1))], ["gone"]);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "sidecar_injector_reconciles_total{kind=\"webhook_configuration\"} 2",
        "sidecar_injector_reconcile_errors_total{kind=\"webhook_configuration\"} 1",
        "sidecar_injector_templates{state=\"valid\"} 3",
        "sidecar_injector_templates{state=\"invalid\"} 1",
        "sidecar_injector_serving_certificate_expiry_timestamp_seconds 1900000000",
        "sidecar_injector_leader 1",
        "sidecar_injector_webhook_entry_cycles 1",
        "sidecar_injector_certificate_secret_unreadable_keys_total{key=\"ca-previous.crt\"} 1",
        "sidecar_injector_templates_not_served 2",
        "sidecar_injector_template_pods{template=\"mesh\",state=\"current\"} 5",
        "sidecar_injector_template_pods{template=\"mesh\",state=\"stale\"} 1",
        "sidecar_injector_template_pods{template=\"mesh\",state=\"missing\"} 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(!text.contains("template=\"gone\""), "{text}");
}
