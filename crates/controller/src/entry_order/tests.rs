//! Tests of [`super::entry_order`].
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_core::{Registry, Snapshot, compile};
use serde_json::Value;

use super::*;

/// A template: `priority`, the pod selector (YAML flow mapping) and the labels it adds.
fn template(name: &str, priority: i32, pod_selector: &str, adds: &str) -> SidecarTemplate {
    let yaml = format!(
        "metadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  podSelector: {pod_selector}\n  metadata: {{labels: {adds}}}\n  containers: [{{name: {name}, image: x}}]"
    );
    let mut value: Value = serde_saphyr::from_str(&yaml).unwrap();
    value["apiVersion"] = "sidecar.dev/v1alpha1".into();
    value["kind"] = "SidecarTemplate".into();
    serde_json::from_value(value).unwrap()
}

fn snapshot_of(templates: &[SidecarTemplate]) -> Arc<Snapshot> {
    let mut registry = Registry::new();
    for t in templates {
        registry.apply(compile(t).unwrap_or_else(|e| panic!("{e}")));
    }
    registry.snapshot()
}

/// The first template of each group, in entry order.
fn order(snapshot: &Snapshot) -> Vec<&str> {
    entry_order(snapshot)
        .groups
        .iter()
        .map(|g| g.templates[0].name.as_str())
        .collect()
}

#[test]
fn without_dependencies_the_order_is_by_lowest_priority() {
    let snapshot = snapshot_of(&[
        template("c", 30, "{matchLabels: {app: c}}", "{team: x}"),
        template("a", 10, "{matchLabels: {app: a}}", "{}"),
        template("b", 20, "{matchLabels: {app: b}}", "{}"),
    ]);
    assert_eq!(order(&snapshot), ["a", "b", "c"]);
    let by_snapshot: Vec<&str> = snapshot
        .groups()
        .iter()
        .map(|g| g.templates[0].name.as_str())
        .collect();
    assert_eq!(order(&snapshot), by_snapshot);
    assert!(entry_order(&snapshot).cycles.is_empty());
}

#[test]
fn a_group_selecting_on_an_added_label_comes_after_the_group_that_adds_it() {
    let snapshot = snapshot_of(&[
        template(
            "adds-mesh",
            50,
            "{matchLabels: {app: dep-web}}",
            "{mesh: 'on'}",
        ),
        template("selects-mesh", 10, "{matchLabels: {mesh: 'on'}}", "{}"),
        template("unrelated", 20, "{matchLabels: {app: other}}", "{}"),
    ]);
    // By priority alone: selects-mesh, unrelated, adds-mesh.
    assert_eq!(order(&snapshot), ["unrelated", "adds-mesh", "selects-mesh"]);
    assert!(entry_order(&snapshot).cycles.is_empty());
}

#[test]
fn a_key_in_a_match_expression_counts_too() {
    for expression in [
        "{key: mesh, operator: Exists}",
        "{key: mesh, operator: In, values: ['on']}",
        "{key: mesh, operator: DoesNotExist}",
    ] {
        let snapshot = snapshot_of(&[
            template("adds", 50, "{}", "{mesh: 'on'}"),
            template(
                "selects",
                10,
                &format!("{{matchExpressions: [{expression}]}}"),
                "{}",
            ),
        ]);
        assert_eq!(order(&snapshot), ["adds", "selects"], "{expression}");
    }
}

#[test]
fn chains_are_followed() {
    let snapshot = snapshot_of(&[
        template("first", 30, "{matchLabels: {app: web}}", "{one: x}"),
        template("second", 20, "{matchLabels: {one: x}}", "{two: x}"),
        template("third", 10, "{matchLabels: {two: x}}", "{}"),
    ]);
    assert_eq!(order(&snapshot), ["first", "second", "third"]);
}

#[test]
fn a_label_a_group_adds_and_selects_itself_is_no_dependency() {
    let snapshot = snapshot_of(&[
        template("self", 20, "{matchLabels: {mesh: 'on'}}", "{mesh: 'on'}"),
        template("other", 10, "{matchLabels: {app: x}}", "{}"),
    ]);
    assert_eq!(order(&snapshot), ["other", "self"]);
    assert!(entry_order(&snapshot).cycles.is_empty());
}

#[test]
fn a_cycle_falls_back_to_priority_order_and_is_reported() {
    let snapshot = snapshot_of(&[
        template("x-adds-a-selects-b", 20, "{matchLabels: {b: x}}", "{a: x}"),
        template("y-adds-b-selects-a", 10, "{matchLabels: {a: x}}", "{b: x}"),
        // Depends on the cycle: after it.
        template("z-after", 1, "{matchLabels: {a: x, c: z}}", "{}"),
        template("w-free", 15, "{matchLabels: {app: w}}", "{}"),
    ]);
    let order_ = entry_order(&snapshot);
    let names: Vec<&str> = order_
        .groups
        .iter()
        .map(|g| g.templates[0].name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "y-adds-b-selects-a",
            "x-adds-a-selects-b",
            "z-after",
            "w-free"
        ],
        "the cycle goes where its lowest priority puts it, in priority order; z needs x's label"
    );
    assert_eq!(
        order_.cycles,
        [vec![
            "x-adds-a-selects-b".to_owned(),
            "y-adds-b-selects-a".to_owned()
        ]]
    );
}

#[test]
fn every_group_appears_once() {
    let snapshot = snapshot_of(&[
        template("a", 1, "{matchLabels: {k1: x}}", "{k2: x}"),
        template("b", 2, "{matchLabels: {k2: x}}", "{k3: x}"),
        template("c", 3, "{matchLabels: {k3: x}}", "{k1: x}"),
        template("d", 4, "{matchLabels: {k3: x}}", "{}"),
        template("e", 5, "{}", "{k1: x}"),
    ]);
    let mut names = order(&snapshot);
    assert_eq!(names.len(), snapshot.groups().len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), snapshot.groups().len());
}
