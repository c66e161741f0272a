//! The registry: apply, delete, reset, snapshots and group lookup.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::{labels, parse_template};
use injector_core::{CompiledTemplate, Registry, compile};
use serde_json::json;

fn t(name: &str, priority: i32, selector: &str, policy: &str) -> CompiledTemplate {
    compile(&parse_template(&format!(
        "metadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  failurePolicy: {policy}\n  podSelector: {{matchLabels: {{app: {selector}}}}}\n  containers: [{{name: {name}, image: x}}]"
    )))
    .unwrap()
}

#[test]
fn apply_delete_and_reset() {
    let mut registry = Registry::new();
    registry.apply(t("a", 1, "web", "Fail"));
    registry.apply(t("b", 1, "web", "Fail"));
    registry.apply(t("a", 5, "web", "Fail"));
    assert_eq!(registry.len(), 2);
    let names: Vec<_> = registry
        .snapshot()
        .templates()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(
        names,
        ["b", "a"],
        "a was replaced by its priority-5 version"
    );
    assert!(registry.delete("a"));
    assert!(!registry.delete("a"));
    assert_eq!(registry.snapshot().len(), 1);
    registry.reset([t("c", 1, "db", "Ignore")]);
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.templates().len(), 1);
    assert!(snapshot.get("c").is_some() && snapshot.get("b").is_none());
}

#[test]
fn snapshots_are_cached_until_a_change_and_unaffected_by_it() {
    let mut registry = Registry::new();
    registry.apply(t("a", 1, "web", "Fail"));
    let first = registry.snapshot();
    assert!(Arc::ptr_eq(&first, &registry.snapshot()));
    registry.apply(t("b", 1, "web", "Fail"));
    let second = registry.snapshot();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(first.len(), 1, "a published snapshot never changes");
    assert_eq!(second.len(), 2);
}

#[test]
fn templates_sharing_selectors_and_policy_share_a_group() {
    let mut registry = Registry::new();
    registry.apply(t("a", 50, "web", "Fail"));
    registry.apply(t("b", 10, "web", "Fail"));
    registry.apply(t("c", 20, "web", "Ignore"));
    registry.apply(t("d", 5, "db", "Fail"));
    let snapshot = registry.snapshot();
    let groups = snapshot.groups();
    assert_eq!(groups.len(), 3);
    let order: Vec<Vec<&str>> = groups
        .iter()
        .map(|g| g.templates.iter().map(|t| t.name.as_str()).collect())
        .collect();
    assert_eq!(
        order,
        [vec!["d"], vec!["b", "a"], vec!["c"]],
        "ordered by their lowest priority"
    );
    let web_fail = &groups[1];
    assert!(web_fail.id.as_str().starts_with("fail-"));
    assert_eq!(web_fail.id.path(), format!("/mutate/{}", web_fail.id));
    assert!(std::ptr::eq(
        snapshot.group(web_fail.id.as_str()).unwrap().as_ref(),
        web_fail.as_ref()
    ));
    assert!(snapshot.group("fail-0000000000000000").is_none());
}

#[test]
fn group_ids_are_stable_and_independent_of_term_order() {
    let one = compile(&parse_template(
        "metadata: {name: a}\nspec:\n  podSelector: {matchLabels: {x: '1', y: '2'}}\n  containers: [{name: a, image: a}]",
    ))
    .unwrap();
    let two = compile(&parse_template(
        "metadata: {name: b}\nspec:\n  podSelector: {matchLabels: {y: '2', x: '1'}}\n  priority: 3\n  containers: [{name: b, image: b}]",
    ))
    .unwrap();
    assert_eq!(one.group.id(), two.group.id());
    // Pinned: changing the id scheme would orphan every webhook configuration in the field.
    assert_eq!(one.group.id().as_str(), "fail-927c5df60fa39fc8");
}

#[test]
fn matching_applies_both_selectors() {
    let mut registry = Registry::new();
    registry.apply(t("web", 1, "web", "Fail"));
    registry.apply(t("db", 1, "db", "Fail"));
    registry.apply(
        compile(&parse_template(
            "metadata: {name: shop}\nspec:\n  namespaceSelector: {matchLabels: {team: shop}}\n  containers: [{name: s, image: s}]",
        ))
        .unwrap(),
    );
    let snapshot = registry.snapshot();
    let pod_labels = json!({"app": "web"});
    let pod_labels = pod_labels.as_object();
    let names = |ns: Option<&_>| -> Vec<String> {
        snapshot
            .matching(&pod_labels, ns)
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(names(Some(&labels(&[("team", "shop")]))), ["web", "shop"]);
    assert_eq!(names(Some(&labels(&[]))), ["web"]);
    assert_eq!(names(None), ["web", "shop"]);
}

#[test]
fn the_snapshot_answers_what_templates_add_by_name_as_their_list_does() {
    use injector_core::registry::KnownTemplates;

    let mut registry = Registry::new();
    registry.apply(t("agent", 1, "web", "Fail"));
    registry.apply(
        compile(&parse_template(
            "metadata: {name: telemetry}\nspec:\n  volumes: [{name: otel, emptyDir: {}}]\n  appContainers:\n    env: [{name: OTEL_ENDPOINT, value: x}]",
        ))
        .unwrap(),
    );
    let snapshot = registry.snapshot();
    let list = snapshot.templates();
    for name in ["agent", "telemetry", "otel", "OTEL_ENDPOINT", "other"] {
        let by_snapshot: Vec<_> = snapshot
            .adding_container(name)
            .iter()
            .map(|t| &t.name)
            .collect();
        let by_list: Vec<_> = KnownTemplates::adding_container(list, name)
            .map(|t| &t.name)
            .collect();
        assert_eq!(by_snapshot, by_list, "{name}");
        assert_eq!(snapshot.adds_volume(name), list.adds_volume(name), "{name}");
        assert_eq!(
            snapshot.adds_app_env(name),
            list.adds_app_env(name),
            "{name}"
        );
    }
    assert!(snapshot.adds_volume("otel") && !snapshot.adds_volume("OTEL_ENDPOINT"));
    assert!(snapshot.adds_app_env("OTEL_ENDPOINT") && !snapshot.adds_app_env("otel"));
    assert!(!snapshot.adds_app_env_from() && !list.adds_app_env_from());

    registry.apply(
        compile(&parse_template(
            "metadata: {name: config}\nspec:\n  appContainers:\n    envFrom: [{configMapRef: {name: shared}}]",
        ))
        .unwrap(),
    );
    let snapshot = registry.snapshot();
    assert!(snapshot.adds_app_env_from() && snapshot.templates().adds_app_env_from());
}
