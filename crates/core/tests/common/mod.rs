//! Fixtures shared by the engine's integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_core::{CompiledTemplate, NamespaceInfo, Plan, compile, plan};
use serde_json::Value;

/// A template from YAML (apiVersion and kind are filled in).
pub fn template(yaml: &str) -> Arc<CompiledTemplate> {
    Arc::new(compile(&parse_template(yaml)).unwrap_or_else(|e| panic!("{e}")))
}

pub fn parse_template(yaml: &str) -> SidecarTemplate {
    let mut value: Value = serde_yaml::from_str(yaml).unwrap();
    value["apiVersion"] = "sidecar.dev/v1alpha1".into();
    value["kind"] = "SidecarTemplate".into();
    serde_json::from_value(value).unwrap()
}

pub fn pod(yaml: &str) -> Value {
    serde_yaml::from_str(yaml).unwrap()
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Plans in namespace "default" whose labels are unknown (the API server selected it).
pub fn plan_in(pod: &Value, templates: &[Arc<CompiledTemplate>]) -> Plan<'static> {
    plan(
        pod,
        &NamespaceInfo {
            name: "default",
            labels: None,
        },
        templates,
    )
    .unwrap()
    .into_owned()
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

pub const APP_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  labels: {app: web}
spec:
  containers:
  - name: app
    image: nginx
"#;
