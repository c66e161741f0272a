#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_core::pod::json::MIN_ALLOWANCE;
use serde_json::{Value, json};

use super::*;

fn pod_create() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }))
    .unwrap()
}

fn answer(decision: &Decision) -> Value {
    serde_json::from_slice::<Value>(&decision.body).unwrap()["response"].clone()
}

#[test]
fn an_unknown_required_group_is_denied_and_an_unknown_best_effort_group_allowed() {
    let snapshot = Snapshot::default();
    let required = decide(
        &pod_create(),
        Target::Group("fail-00000000000000ff"),
        &snapshot,
        MIN_ALLOWANCE,
    )
    .unwrap();
    assert_eq!(required.outcome, Outcome::UnknownRequiredGroup);
    assert_eq!(required.outcome.as_str(), "unknown_required_group");
    let response = answer(&required);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 503);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("not in sync"), "{message}");

    for id in ["ignore-00000000000000ff", "not-a-group-id"] {
        let decision = decide(&pod_create(), Target::Group(id), &snapshot, MIN_ALLOWANCE).unwrap();
        assert_eq!(decision.outcome, Outcome::UnknownGroup, "{id}");
        let response = answer(&decision);
        assert_eq!(response["allowed"], true, "{id}");
        assert!(response.get("patch").is_none(), "{id}");
    }
}

#[test]
fn an_answer_with_a_patch_written_in_place_reads_back_whole() {
    use base64::Engine as _;
    let template = serde_saphyr::from_str(
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: t}\n\
         spec:\n  containers: [{name: s, image: i, args: [\"--pod={{ pod.name }}\"]}]\n",
    )
    .unwrap();
    let mut registry = injector_core::Registry::new();
    registry.reset([injector_core::compile(&template).unwrap()]);
    let snapshot = registry.snapshot();
    let mut body: Value = serde_json::from_slice(&pod_create()).unwrap();
    // A uid that must be escaped, and the older API version, both echoed.
    body["apiVersion"] = "admission.k8s.io/v1beta1".into();
    body["request"]["uid"] = "u\"1\\".into();
    let decision = decide(
        &serde_json::to_vec(&body).unwrap(),
        Target::All,
        &snapshot,
        MIN_ALLOWANCE,
    )
    .unwrap();
    assert_eq!(decision.outcome, Outcome::Injected);
    let whole: Value = serde_json::from_slice(&decision.body).unwrap();
    assert_eq!(whole["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(whole["kind"], "AdmissionReview");
    let response = &whole["response"];
    assert_eq!(response["uid"], "u\"1\\");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    assert_eq!(
        response["auditAnnotations"][AUDIT_ANNOTATION],
        decision.applied_record.as_str()
    );
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    let added = patch
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["path"] == "/spec/containers/-")
        .unwrap();
    assert_eq!(added["value"]["args"][0], "--pod=p");
}

#[test]
fn only_a_pod_create_is_denied_for_an_unknown_required_group() {
    let mut body: Value = serde_json::from_slice(&pod_create()).unwrap();
    body["request"]["operation"] = "UPDATE".into();
    let snapshot = Snapshot::default();
    let decision = decide(
        &serde_json::to_vec(&body).unwrap(),
        Target::Group("fail-00000000000000ff"),
        &snapshot,
        MIN_ALLOWANCE,
    )
    .unwrap();
    assert_eq!(decision.outcome, Outcome::Ignored);
    assert_eq!(answer(&decision)["allowed"], true);
}
