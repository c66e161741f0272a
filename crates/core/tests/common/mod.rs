//! Fixtures shared by the engine's integration tests.
#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use injector_core::pod::json::{allowance, decode_pod_among};
use injector_core::{CompiledTemplate, NamespaceInfo, Plan, SkipReason, plan};
use serde_json::Value;

pub mod fixtures;

pub use fixtures::*;

pub fn pod(yaml: &str) -> Value {
    serde_saphyr::from_str(yaml).unwrap()
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Plans in namespace "default" whose labels are unknown (the API server selected it); and
/// checks that the Pod as the webhook decodes it is planned the same.
pub fn plan_in(pod: &Value, templates: &[Arc<CompiledTemplate>]) -> Plan<'static> {
    let namespace = NamespaceInfo {
        name: "default",
        labels: None,
    };
    let planned = plan(pod, &namespace, templates).unwrap();
    let json = names_first(pod);
    let decoded = decode_pod_among(&json, allowance(json.len()), templates).unwrap();
    assert_eq!(
        injector_core::plan_among(&decoded, &namespace, templates, templates),
        planned,
        "planned otherwise as the webhook decodes the pod"
    );
    planned.into_owned()
}

/// `value` as JSON with each object's `name` first, as the API server writes a container.
pub fn names_first(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .filter(|(key, _)| *key == "name")
                .chain(map.iter().filter(|(key, _)| *key != "name"))
                .map(|(key, value)| format!("{}:{}", Value::from(key.as_str()), names_first(value)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(names_first).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

pub fn plan_with_labels(
    pod: &Value,
    ns_labels: &BTreeMap<String, String>,
    templates: &[Arc<CompiledTemplate>],
) -> Plan<'static> {
    plan(
        pod,
        &NamespaceInfo {
            name: "default",
            labels: Some(ns_labels),
        },
        templates,
    )
    .unwrap()
    .into_owned()
}

/// The pod with the plan's patch applied.
pub fn apply(pod: &Value, plan: &Plan) -> Value {
    let mut out = pod.clone();
    json_patch::patch(&mut out, &plan.patch.to_json_patch())
        .unwrap_or_else(|e| panic!("patch does not apply: {e}\n{:#?}", plan.patch));
    out
}

pub fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .map(|items| items.iter().map(|i| i["name"].as_str().unwrap()).collect())
        .unwrap_or_default()
}

/// The Pod's `sidecar.dev/injected` record without the entries' fingerprints (`name@generation`,
/// comma-separated), which tests that are not about fingerprints need not spell out.
pub fn record(pod: &Value) -> String {
    pod["metadata"]["annotations"]["sidecar.dev/injected"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .map(|entry| entry.split_once('#').map_or(entry, |(kept, _)| kept))
        .collect::<Vec<_>>()
        .join(",")
}

/// That planning a Pod again found every template there and adds nothing, with nothing to say.
pub fn assert_adds_nothing(again: &Plan) {
    assert!(again.patch.is_empty(), "{:?}", again.patch);
    assert!(again.denials.is_empty(), "{:?}", again.denials);
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    assert!(
        again
            .skipped
            .iter()
            .all(|s| s.reason == SkipReason::AlreadyPresent),
        "{:?}",
        again.skipped
    );
}
