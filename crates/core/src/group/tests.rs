#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

use crate::template::compile;

/// A template selecting Pods labelled `app=<app>` in namespaces labelled `team=<team>`.
fn template(name: &str, app: &str, team: &str, policy: &str) -> Arc<CompiledTemplate> {
    let value = serde_json::json!({
        "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": policy,
            "podSelector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": {"team": team}},
            "containers": [{"name": name, "image": "x"}],
        },
    });
    Arc::new(compile(&serde_json::from_value(value).unwrap()).unwrap())
}

/// One group per template (each has a key of its own).
fn groups(templates: &[Arc<CompiledTemplate>]) -> Vec<Group> {
    templates
        .iter()
        .map(|t| Group {
            id: t.group_id.clone(),
            key: t.group.clone(),
            templates: vec![Arc::clone(t)],
        })
        .collect()
}

fn ids(groups: &[Group]) -> BTreeSet<&str> {
    groups.iter().map(|g| g.id.as_str()).collect()
}

#[test]
fn groups_within_the_bound_are_kept_as_they_are() {
    let templates: Vec<_> = (0..MAX_GROUPS)
        .map(|i| template(&format!("t{i}"), &format!("app{i}"), "a", "Fail"))
        .collect();
    let kept = merge_past_bound(groups(&templates));
    assert_eq!(ids(&kept), ids(&groups(&templates)));
}

#[test]
fn past_the_bound_the_largest_set_sharing_namespaces_and_policy_is_merged() {
    let mut templates = Vec::new();
    for (team, policy, count) in [("a", "Fail", 40), ("b", "Fail", 20), ("a", "Ignore", 10)] {
        for i in 0..count {
            let name = format!("{team}-{policy}-{i:02}").to_lowercase();
            templates.push(template(&name, &format!("app{i}"), team, policy));
        }
    }
    let bounded = merge_past_bound(groups(&templates));
    assert_eq!(
        bounded.len(),
        70 - 39,
        "only team a's 40 required groups merged"
    );
    let merged: Vec<_> = bounded.iter().filter(|g| g.templates.len() > 1).collect();
    assert_eq!(merged.len(), 1);
    let merged = merged[0];
    assert_eq!(merged.templates.len(), 40);
    assert!(merged.key.pod_selector.is_empty(), "called for every Pod");
    assert_eq!(
        merged.key.namespace_selector,
        templates[0].group.namespace_selector
    );
    assert_eq!(merged.key.failure_policy, FailurePolicy::Fail);
    assert_eq!(policy_of_id(merged.id.as_str()), Some(FailurePolicy::Fail));
    assert_ne!(
        merged.id,
        merged.key.id(),
        "not the id of a catch-all selector group"
    );
    let names: Vec<&str> = merged.templates.iter().map(|t| t.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "in application order");
    // The same templates always make the same groups.
    assert_eq!(ids(&merge_past_bound(groups(&templates))), ids(&bounded));
}

#[test]
fn groups_of_different_namespaces_are_never_merged() {
    let templates: Vec<_> = (0..MAX_GROUPS + 6)
        .map(|i| template(&format!("t{i}"), "web", &format!("team{i}"), "Fail"))
        .collect();
    assert_eq!(merge_past_bound(groups(&templates)).len(), MAX_GROUPS + 6);
}

#[test]
fn the_policy_is_read_back_from_an_id() {
    for policy in [FailurePolicy::Fail, FailurePolicy::Ignore] {
        let key = GroupKey::new(&Selector::default(), &Selector::default(), policy);
        assert_eq!(policy_of_id(key.id().as_str()), Some(policy));
    }
    assert_eq!(policy_of_id("failed"), None);
    assert_eq!(policy_of_id(""), None);
}
