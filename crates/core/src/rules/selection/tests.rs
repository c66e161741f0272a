//! Each selection rule's two forms on generated Pods, namespaces and templates: the Rust one
//! as `plan` and the census evaluate it, the CEL one evaluated by a CEL interpreter with the
//! Kubernetes libraries (`kube-cel`), as the compiled policy, its guard, the warnings policy
//! and the webhook entries' match conditions carry it. They must agree on every input.

use std::collections::BTreeMap;

use injector_api::SidecarTemplate;
use injector_api::names::{INJECT_ANNOTATION, INJECTION_DISABLED, INJECTION_LABEL};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_cel::cel;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::cel::testing::evaluate;
use crate::rules::selector::Selector;
use crate::template::{CompiledTemplate, compile};

/// Evaluates `source` (a CEL condition) over the Pod `object` and the namespace.
fn cel_holds(source: &str, object: &Value, namespace: &Value) -> bool {
    match evaluate(
        source,
        &[("object", object), ("namespaceObject", namespace)],
    ) {
        cel::Value::Bool(verdict) => verdict,
        other => panic!("{source}: {other:?}"),
    }
}

/// All of `conditions` in CEL (`true` when there is none).
fn all(conditions: &[String]) -> String {
    if conditions.is_empty() {
        "true".to_owned()
    } else {
        conditions.join(" && ")
    }
}

const KEYS: [&str; 3] = ["app", "tier", "example.com/team"];
const VALUES: [&str; 4] = ["web", "db", "a", ""];

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(&KEYS[..]).prop_map(str::to_owned),
        prop::sample::select(&VALUES[..]).prop_map(str::to_owned),
        0..3,
    )
}

/// A label selector over [`KEYS`], in API form.
fn selector() -> impl Strategy<Value = Value> {
    let requirement = (
        prop::sample::select(&KEYS[..]),
        prop::sample::select(&["In", "NotIn", "Exists", "DoesNotExist"][..]),
        prop::collection::btree_set(prop::sample::select(&VALUES[..3]), 1..3),
    )
        .prop_map(|(key, operator, values)| match operator {
            "In" | "NotIn" => json!({"key": key, "operator": operator, "values": values}),
            _ => json!({"key": key, "operator": operator}),
        });
    (
        prop::collection::btree_map(
            prop::sample::select(&KEYS[..]),
            prop::sample::select(&VALUES[..3]),
            0..2,
        ),
        prop::collection::vec(requirement, 0..3),
    )
        .prop_map(
            |(labels, expressions)| json!({"matchLabels": labels, "matchExpressions": expressions}),
        )
}

/// Values of `sidecar.dev/inject` near and far from an opt-out.
const INJECT_VALUES: [&str; 9] = [
    "false",
    "FALSE",
    " False\t",
    "\u{a0}false",
    "true",
    "no",
    "",
    "fals",
    "false,",
];
/// Values of `sidecar.dev/templates` near and far from naming `agent`.
const REQUEST_VALUES: [&str; 9] = [
    "agent",
    "logs, agent",
    " agent ,logs",
    "agents",
    "log-agent",
    "",
    ",",
    "Agent",
    "logs",
];

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    (
        prop::option::of(prop::sample::select(&INJECT_VALUES[..])),
        prop::option::of(prop::sample::select(&REQUEST_VALUES[..])),
    )
        .prop_map(|(inject, requested)| {
            let mut annotations = BTreeMap::new();
            if let Some(value) = inject {
                annotations.insert(INJECT_ANNOTATION.to_owned(), value.to_owned());
            }
            if let Some(value) = requested {
                annotations.insert(TEMPLATES_ANNOTATION.to_owned(), value.to_owned());
            }
            annotations
        })
}

/// The template `agent`, best-effort or required, `OnRequest` or not, with these selectors.
fn template() -> impl Strategy<Value = CompiledTemplate> {
    (any::<bool>(), any::<bool>(), selector(), selector()).prop_map(
        |(required, on_request, namespaces, pods)| {
            let source = json!({
                "apiVersion": "sidecar.dev/v1alpha1",
                "kind": "SidecarTemplate",
                "metadata": {"name": "agent", "generation": 1},
                "spec": {
                    "failurePolicy": if required { "Fail" } else { "Ignore" },
                    "injection": if on_request { "OnRequest" } else { "Automatic" },
                    "namespaceSelector": namespaces,
                    "podSelector": pods,
                    "containers": [{"name": "agent", "image": "agent.invalid/agent:1"}],
                },
            });
            let parsed: SidecarTemplate = serde_json::from_value(source).unwrap();
            compile(&parsed).unwrap()
        },
    )
}

/// A Pod's JSON with these labels and annotations. Empty maps are kept, where the API server
/// leaves them out: the interpreter's optional field selection (`cel` 0.13, which `kube-cel`
/// 0.8 uses) fails on a missing key where CEL gives `optional.none()` (fixed in `cel` 0.15).
fn pod(labels: &BTreeMap<String, String>, annotations: &BTreeMap<String, String>) -> Value {
    json!({
        "metadata": {"name": "web-1", "labels": labels, "annotations": annotations},
        "spec": {"containers": []},
    })
}

fn namespace(labels: &BTreeMap<String, String>) -> Value {
    json!({"metadata": {"name": "team-a", "labels": labels}})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The whole selection: `selects` (outside the excluded namespaces) against the CEL
    /// conditions the policy, the guard and the warnings policy evaluate.
    #[test]
    fn selection_is_one_rule_in_rust_and_in_cel(
        template in template(),
        pod_labels in labels(),
        pod_annotations in annotations(),
        namespace_labels in labels(),
    ) {
        let info = NamespaceInfo { name: "team-a", labels: Some(&namespace_labels) };
        let rust = selects(template.selecting(), &pod_labels, &pod_annotations, "team-a", &info);
        let source = all(&selection_cel(template.selecting()));
        let object = pod(&pod_labels, &pod_annotations);
        prop_assert_eq!(rust, cel_holds(&source, &object, &namespace(&namespace_labels)), "{}", source);
    }

    /// The opt-out and the request alone, as the webhook entries' match conditions use them.
    #[test]
    fn opt_out_and_request_are_one_rule_in_rust_and_in_cel(pod_annotations in annotations()) {
        let object = pod(&BTreeMap::new(), &pod_annotations);
        let none = json!({});
        prop_assert_eq!(
            opts_out(pod_annotations.get(INJECT_ANNOTATION).map(String::as_str)),
            cel_holds(&opts_out_cel(ANNOTATIONS), &object, &none)
        );
        let requested = pod_annotations.get(TEMPLATES_ANNOTATION).map(String::as_str);
        for names in [&["agent"][..], &["logs", "agent"], &["other", "logs"]] {
            prop_assert_eq!(
                names.iter().any(|n| requests(requested, n)),
                cel_holds(&requests_cel(ANNOTATIONS, names.iter().copied()), &object, &none),
                "{:?}", names
            );
        }
    }

    /// A selector alone, in `matches` and in `cel`.
    #[test]
    fn a_selector_is_one_rule_in_rust_and_in_cel(source in selector(), pod_labels in labels()) {
        let parsed = serde_json::from_value(source).unwrap();
        let selector = Selector::compile(Some(&parsed), "spec.podSelector").unwrap();
        let object = pod(&pod_labels, &BTreeMap::new());
        prop_assert_eq!(
            selector.matches(&pod_labels),
            cel_holds(&selector.cel(LABELS), &object, &json!({}))
        );
    }
}

/// The excluded namespaces as the API server reads the entries' and bindings' namespace
/// selector (it labels every namespace with its name) against `pod_wide_skip`.
#[test]
fn excluded_namespaces_are_one_rule_in_rust_and_as_a_namespace_selector() {
    let exclusions = LabelSelector {
        match_expressions: Some(namespace_exclusions(&["operator-ns"]).to_vec()),
        ..LabelSelector::default()
    };
    let selector = Selector::compile(Some(&exclusions), "namespaceSelector").unwrap();
    for name in [
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "default",
        "team-a",
    ] {
        for disabled in [None, Some(INJECTION_DISABLED), Some("enabled")] {
            let mut labels = BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned())]);
            if let Some(value) = disabled {
                labels.insert(INJECTION_LABEL.to_owned(), value.to_owned());
            }
            let info = NamespaceInfo {
                name,
                labels: Some(&labels),
            };
            assert_eq!(
                pod_wide_skip(name, &info).is_none(),
                selector.matches(&labels),
                "{name} {disabled:?}"
            );
        }
    }
    // The operator's own namespace is excluded from the entries only.
    let operator = BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), "operator-ns".to_owned())]);
    assert!(!selector.matches(&operator));
}
