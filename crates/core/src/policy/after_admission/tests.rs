//! The after-admission policy: its shape, which templates it keeps, and its rules evaluated
//! with a CEL interpreter (`cel` with the Kubernetes extension functions) on the UPDATEs that
//! matter, the operator's own in-place update among them, built by the code that makes it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube_cel::KubeCelExt as _;
use kube_cel::cel;
use serde_json::{Value, json};

use super::*;
use crate::after_admission::rollout::in_place_patch;
use crate::template::compile;

fn template(name: &str, generation: i64, spec: Value) -> Arc<CompiledTemplate> {
    let template: injector_api::SidecarTemplate = serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": spec,
    }))
    .unwrap();
    Arc::new(compile(&template).unwrap())
}

fn options() -> PolicyOptions {
    PolicyOptions {
        name: "sidecar-injector".into(),
        operator_namespace: "operator-ns".into(),
        webhook_behind: true,
    }
}

/// A required mesh: a container, a native sidecar and a plain init container.
fn mesh(proxy: &str, agent: &str, generation: i64) -> Arc<CompiledTemplate> {
    mesh_with(proxy, agent, generation, "InPlace", "--pod")
}

/// [`mesh`] with another update strategy, or another argument (what else a version changes).
fn mesh_with(
    proxy: &str,
    agent: &str,
    generation: i64,
    strategy: &str,
    flag: &str,
) -> Arc<CompiledTemplate> {
    template(
        "mesh",
        generation,
        json!({
            "failurePolicy": "Fail",
            "updateStrategy": {"type": strategy},
            "containers": [{"name": "proxy", "image": proxy, "args": [flag, "{{ pod.name }}"]}],
            "initContainers": [
                {"name": "setup", "image": "setup:1"},
                {"name": "agent", "image": agent, "restartPolicy": "Always"},
            ],
            "volumes": [{"name": "mesh-certs", "emptyDir": {}}],
        }),
    )
}

/// A best-effort logger.
fn logger() -> Arc<CompiledTemplate> {
    template(
        "logger",
        2,
        json!({
            "failurePolicy": "Ignore",
            "containers": [{"name": "logger", "image": "logger:1"}],
        }),
    )
}

/// A running Pod carrying `mesh` (with these images) and the logger, as the API server stores it.
fn pod(mesh: &CompiledTemplate, proxy: &str, agent: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-1", "namespace": "shop", "resourceVersion": "7",
            "annotations": {
                INJECTED_ANNOTATION: format!("logger@2#00000000000000aa,{}", Applied::of(mesh)),
                "team": "shop",
            },
        },
        "spec": {
            "initContainers": [
                {"name": "setup", "image": "setup:1"},
                {"name": "agent", "image": agent, "restartPolicy": "Always"},
            ],
            "containers": [
                {"name": "app", "image": "app:1", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "proxy", "image": proxy, "args": ["--pod", "web-1"], "resources": {"requests": {"cpu": "50m"}}},
                {"name": "logger", "image": "logger:1"},
            ],
            "volumes": [{"name": "mesh-certs", "emptyDir": {}}],
        },
    })
}

/// Evaluates the CEL `expression` as the API server would for an UPDATE of `old` to `new`,
/// with the policy's variables.
fn evaluate(policy: &Value, expression: &str, old: &Value, new: &Value) -> bool {
    let parse = |source: &str| {
        cel::parser::Parser::new()
            .enable_optional_syntax(true)
            .parse(source)
            .unwrap_or_else(|e| panic!("{source}: {e:?}"))
    };
    let mut context = cel::Context::default().with_all();
    context.add_variable_from_value("object", cel::to_value(new).unwrap());
    context.add_variable_from_value("oldObject", cel::to_value(old).unwrap());
    let mut variables = std::collections::HashMap::new();
    for variable in policy["spec"]["variables"].as_array().unwrap() {
        let source = variable["expression"].as_str().unwrap();
        let value = context
            .resolve(&parse(source))
            .unwrap_or_else(|e| panic!("{source}: {e:?}"));
        variables.insert(variable["name"].as_str().unwrap().to_owned(), value);
    }
    context.add_variable_from_value("variables", variables);
    match context.resolve(&parse(expression)) {
        Ok(cel::Value::Bool(verdict)) => verdict,
        other => panic!("{expression}: {other:?}"),
    }
}

/// Whether `policy` admits the UPDATE of `old` to `new`: not matched, or every validation holds.
fn admits(policy: &Value, old: &Value, new: &Value) -> bool {
    let spec = &policy["spec"];
    let matched = spec["matchConditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| evaluate(policy, c["expression"].as_str().unwrap(), old, new));
    !matched
        || spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| evaluate(policy, v["expression"].as_str().unwrap(), old, new))
}

/// Applies a strategic-merge patch as the API server does for what the operator sends:
/// annotations merged, containers and init containers merged by name, `resourceVersion` a
/// precondition.
fn strategic_merge(pod: &Value, patch: &Value) -> Value {
    let mut merged = pod.clone();
    assert_eq!(
        patch["metadata"]["resourceVersion"],
        pod["metadata"]["resourceVersion"]
    );
    for (key, value) in patch["metadata"]["annotations"].as_object().unwrap() {
        merged["metadata"]["annotations"][key] = value.clone();
    }
    for list in ["containers", "initContainers"] {
        for change in patch["spec"][list].as_array().into_iter().flatten() {
            let target = merged["spec"][list]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|c| c["name"] == change["name"])
                .unwrap();
            for (key, value) in change.as_object().unwrap() {
                target[key] = value.clone();
            }
        }
    }
    merged
}

fn set(pod: &Value, pointer: &str, value: Value) -> Value {
    let mut changed = pod.clone();
    *changed.pointer_mut(pointer).unwrap() = value;
    changed
}

#[test]
fn one_policy_keeps_the_required_templates_that_add_containers() {
    let env_only = template(
        "env-only",
        1,
        json!({"failurePolicy": "Fail", "appContainers": {"env": [{"name": "A", "value": "b"}]}}),
    );
    let early = template(
        "early",
        1,
        json!({"failurePolicy": "Fail", "priority": 1, "containers": [{"name": "early", "image": "early:1"}]}),
    );
    let templates = [mesh("proxy:1", "agent:1", 1), logger(), env_only, early];
    let compiled = compile_after_admission(&templates, &options()).unwrap();
    // Best-effort templates and one that adds no container are not kept; application order.
    assert_eq!(compiled.templates, ["early", "mesh"]);
    let policy = &compiled.policy;
    assert_eq!(policy["kind"], "ValidatingAdmissionPolicy");
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(
        policy["metadata"]["name"],
        "sidecar-injector-after-admission"
    );
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(
        spec["matchConstraints"]["resourceRules"],
        json!([{
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods", "pods/resize"],
        }])
    );
    assert!(spec["matchConstraints"].get("namespaceSelector").is_none());
    let validations = spec["validations"].as_array().unwrap();
    assert_eq!(validations.len(), 2);
    let message = validations[1]["message"].as_str().unwrap();
    assert!(message.contains("\"mesh\" is required"), "{message}");
    assert!(message.contains("proxy, setup, agent"), "{message}");
    assert_eq!(
        compiled.binding,
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "sidecar-injector-after-admission"},
            "spec": {"policyName": "sidecar-injector-after-admission", "validationActions": ["Deny"]},
        })
    );

    // The same templates, the same policy; a new version of one, another.
    let again = compile_after_admission(&templates, &options()).unwrap();
    assert_eq!(again.hash, compiled.hash);
    let newer = compile_after_admission(&[mesh("proxy:2", "agent:1", 2)], &options()).unwrap();
    assert_ne!(newer.hash, compiled.hash);
    // No required template with containers: no policy.
    assert!(compile_after_admission(&[logger()], &options()).is_none());
    assert!(compile_after_admission(&[], &options()).is_none());
}

#[test]
fn a_required_templates_containers_and_record_cannot_change() {
    let mesh = mesh("proxy:1", "agent:1", 1);
    let compiled = compile_after_admission(&[Arc::clone(&mesh), logger()], &options()).unwrap();
    let policy = &compiled.policy;
    let old = pod(&mesh, "proxy:1", "agent:1");

    // `kubectl set image` on the sidecar, the native sidecar or the plain init container.
    for pointer in [
        "/spec/containers/1/image",
        "/spec/initContainers/1/image",
        "/spec/initContainers/0/image",
    ] {
        let new = set(&old, pointer, json!("evil:1"));
        assert!(!admits(policy, &old, &new), "{pointer}");
    }
    // A resize of the sidecar's resources.
    let resized = set(
        &old,
        "/spec/containers/1/resources",
        json!({"requests": {"cpu": "1"}}),
    );
    assert!(!admits(policy, &old, &resized));
    // Its record entry dropped or forged, so that a later update would not be looked at.
    let dropped = set(
        &old,
        &format!(
            "/metadata/annotations/{}",
            INJECTED_ANNOTATION.replace('/', "~1")
        ),
        json!("logger@2#00000000000000aa"),
    );
    assert!(!admits(policy, &old, &dropped));

    // What stays allowed: the app's image and resources, a best-effort template's container,
    // any other annotation, and nothing changed at all.
    for (pointer, value) in [
        ("/spec/containers/0/image", json!("app:2")),
        (
            "/spec/containers/0/resources",
            json!({"requests": {"cpu": "1"}}),
        ),
        ("/spec/containers/2/image", json!("logger:9")),
        ("/metadata/annotations/team", json!("other")),
    ] {
        let new = set(&old, pointer, value);
        assert!(admits(policy, &old, &new), "{pointer}");
    }
    assert!(admits(policy, &old, &old));

    // A Pod whose record does not name the template is not looked at.
    let mut foreign = old.clone();
    foreign["metadata"]["annotations"] = json!({INJECTED_ANNOTATION: "logger@2#00000000000000aa"});
    let new = set(&foreign, "/spec/containers/1/image", json!("evil:1"));
    assert!(admits(policy, &foreign, &new));
    let mut bare = old.clone();
    bare["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    bare["spec"]
        .as_object_mut()
        .unwrap()
        .remove("initContainers");
    let new = set(&bare, "/spec/containers/1/image", json!("evil:1"));
    assert!(admits(policy, &bare, &new));
}

#[test]
fn the_operators_in_place_update_to_the_current_version_is_allowed() {
    let old_mesh = mesh("proxy:1", "agent:1", 1);
    let new_mesh = mesh("proxy:2", "agent:2", 2);
    assert!(
        new_mesh
            .fingerprint
            .only_images_differ(&old_mesh.fingerprint)
    );
    let compiled = compile_after_admission(&[Arc::clone(&new_mesh), logger()], &options()).unwrap();
    let policy = &compiled.policy;
    let old = pod(&old_mesh, "proxy:1", "agent:1");

    // Exactly the patch the rollout sends.
    let typed: Pod = serde_json::from_value(old.clone()).unwrap();
    let patch = in_place_patch(&new_mesh, &typed).unwrap();
    let updated = strategic_merge(&old, &patch);
    assert_eq!(updated["spec"]["containers"][1]["image"], "proxy:2");
    assert_eq!(updated["spec"]["initContainers"][1]["image"], "agent:2");
    assert!(admits(policy, &old, &updated), "{patch}");
    // Only one of the images moved (the other was current already): allowed too.
    let half = strategic_merge(
        &old,
        &json!({
            "metadata": {"resourceVersion": "7", "annotations": patch["metadata"]["annotations"]},
            "spec": {"containers": patch["spec"]["containers"]},
        }),
    );
    assert!(admits(policy, &old, &half));

    // Not to the template's current version: another image, or the record not moved.
    let other_image = set(&updated, "/spec/containers/1/image", json!("proxy:3"));
    assert!(!admits(policy, &old, &other_image));
    let unrecorded = strategic_merge(
        &old,
        &json!({"metadata": {"resourceVersion": "7", "annotations": {}}, "spec": patch["spec"]}),
    );
    assert!(!admits(policy, &old, &unrecorded));
    // The current version's images and something else: the plain init container's image, or
    // the sidecar's resources (a `resize` moves no record, but a forged one may try).
    let init_too = set(&updated, "/spec/initContainers/0/image", json!("setup:2"));
    assert!(!admits(policy, &old, &init_too));
    let resized = set(
        &updated,
        "/spec/containers/1/resources",
        json!({"requests": {"cpu": "1"}}),
    );
    assert!(!admits(policy, &old, &resized));
    // A Pod at the current version already: its images stay.
    let current = pod(&new_mesh, "proxy:2", "agent:2");
    let new = set(&current, "/spec/containers/1/image", json!("proxy:1"));
    assert!(!admits(policy, &current, &new));
}

#[test]
fn only_a_pod_stale_in_images_of_an_in_place_template_may_move_to_its_current_version() {
    let new_mesh = mesh("proxy:2", "agent:2", 3);
    let compiled = compile_after_admission(&[Arc::clone(&new_mesh)], &options()).unwrap();
    // The Pod carries a version that differs in more than images (another flag): the operator
    // restarts its workload rather than update it in place, so moving its record to the current
    // version with the current images (which would hide it from the rollout) is refused.
    let other_shape = mesh_with("proxy:1", "agent:1", 2, "InPlace", "--name");
    assert!(
        !new_mesh
            .fingerprint
            .only_images_differ(&other_shape.fingerprint)
    );
    let old = pod(&other_shape, "proxy:1", "agent:1");
    let typed: Pod = serde_json::from_value(old.clone()).unwrap();
    let forged = strategic_merge(&old, &in_place_patch(&new_mesh, &typed).unwrap());
    assert!(!admits(&compiled.policy, &old, &forged));

    // A template the operator never updates in place (RollingRestart): no exception at all.
    let rolling = mesh_with("proxy:2", "agent:2", 2, "RollingRestart", "--pod");
    let compiled = compile_after_admission(&[Arc::clone(&rolling)], &options()).unwrap();
    let old = pod(&mesh("proxy:1", "agent:1", 1), "proxy:1", "agent:1");
    let typed: Pod = serde_json::from_value(old.clone()).unwrap();
    let moved = strategic_merge(&old, &in_place_patch(&rolling, &typed).unwrap());
    assert!(!admits(&compiled.policy, &old, &moved));
    // The same move under InPlace passes (the control).
    let in_place = mesh("proxy:2", "agent:2", 2);
    let compiled = compile_after_admission(&[Arc::clone(&in_place)], &options()).unwrap();
    let moved = strategic_merge(&old, &in_place_patch(&in_place, &typed).unwrap());
    assert!(admits(&compiled.policy, &old, &moved));
}
