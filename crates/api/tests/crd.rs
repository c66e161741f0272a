//! The generated CRD: its shape, its documentation, and its CEL rules (evaluated client-side
//! with kube's CEL interpreter, as the API server evaluates them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_api::{SidecarTemplate, crd};
use serde_json::{Value, json};

fn schema() -> Value {
    let crd = serde_json::to_value(crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn template(spec: Value) -> SidecarTemplate {
    serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": "t"},
        "spec": spec,
    }))
    .unwrap()
}

fn cel_errors(spec: Value) -> String {
    match kube::core::cel::validate_cel(&template(spec)) {
        Ok(()) => String::new(),
        Err(errors) => format!("{errors:?}"),
    }
}

#[test]
fn the_crd_is_cluster_scoped_with_short_name_and_columns() {
    let crd = serde_json::to_value(crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "sidecartemplates.sidecar.dev");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["sct"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Priority",
            "Injection",
            "Failure-Policy",
            "Ready",
            "Reason",
            "Injected",
            "Current",
            "Stale",
            "Missing",
            "Age"
        ]
    );
}

#[test]
fn every_spec_and_status_field_is_documented() {
    let schema = schema();
    for part in ["spec", "status"] {
        let properties = schema["properties"][part]["properties"]
            .as_object()
            .unwrap();
        for (name, field) in properties {
            let description = field["description"].as_str().unwrap_or_default();
            assert!(description.len() > 20, "{part}.{name} has no description");
        }
    }
    let app = &schema["properties"]["spec"]["properties"]["appContainers"]["properties"];
    for name in ["names", "env", "envFrom", "volumeMounts"] {
        assert!(app[name]["description"].is_string(), "appContainers.{name}");
    }
}

#[test]
fn defaults_and_bounds_are_in_the_schema() {
    let spec = &schema()["properties"]["spec"]["properties"];
    assert_eq!(spec["priority"]["default"], 100);
    assert_eq!(spec["injection"]["default"], "Automatic");
    assert_eq!(spec["failurePolicy"]["default"], "Fail");
    assert_eq!(spec["injection"]["enum"], json!(["Automatic", "OnRequest"]));
    assert_eq!(spec["containers"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        spec["containers"]["items"]["properties"]["name"]["maxLength"],
        63
    );
    assert_eq!(
        spec["initContainers"]["items"]["properties"]["name"]["maxLength"],
        63
    );
}

#[test]
fn cel_accepts_a_valid_template() {
    assert_eq!(
        cel_errors(json!({"containers": [{"name": "a", "image": "a"}]})),
        ""
    );
    assert_eq!(cel_errors(json!({"metadata": {"labels": {"a": "b"}}})), "");
    assert_eq!(
        cel_errors(
            json!({"containers": [{"name": "a", "image": "a"}], "initContainers": [{"name": "b", "image": "b"}]})
        ),
        ""
    );
}

#[test]
fn cel_rejects_a_template_that_injects_nothing() {
    let errors = cel_errors(json!({"priority": 5}));
    assert!(errors.contains("must inject something"), "{errors}");
    for nothing in [
        json!({"containers": []}),
        json!({"appContainers": {"names": ["app"]}}),
        json!({"appContainers": {"env": []}}),
        json!({"metadata": {}}),
        json!({"metadata": {"labels": {}}}),
    ] {
        let errors = cel_errors(nothing.clone());
        assert!(
            errors.contains("must inject something"),
            "{nothing}: {errors}"
        );
    }
    assert_eq!(
        cel_errors(json!({"appContainers": {"envFrom": [{"configMapRef": {"name": "c"}}]}})),
        ""
    );
}

#[test]
fn cel_rejects_a_name_in_both_container_lists() {
    let errors = cel_errors(json!({
        "containers": [{"name": "proxy", "image": "a"}],
        "initContainers": [{"name": "proxy", "image": "b"}],
    }));
    assert!(
        errors.contains("containers or initContainers, not both"),
        "{errors}"
    );
}
