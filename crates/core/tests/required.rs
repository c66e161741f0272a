//! "Required means required": what a Pod carries counts only when it is really there, and a
//! look-alike of a required template's container denies the Pod.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use injector_core::SkipReason;
use serde_json::{Value, json};

const AGENT: &str = r#"
metadata: {name: agent, generation: 4}
spec:
  containers:
  - name: agent
    image: agent:1.2
    args: ["--enforce"]
    ports: [{containerPort: 9090}]
    resources: {limits: {cpu: "0.5", memory: 64Mi}}
  volumes:
  - name: agent-state
    emptyDir: {}
"#;

const NATIVE: &str = r#"
metadata: {name: proxy, generation: 2}
spec:
  initContainers:
  - name: proxy
    image: proxy:1
    restartPolicy: Always
    readinessProbe: {httpGet: {port: 15021}}
"#;

fn with_annotations(mut pod: Value, annotations: Value) -> Value {
    pod["metadata"]["annotations"] = annotations;
    pod
}

#[test]
fn a_claimed_injection_is_not_trusted() {
    for claim in ["agent@4", "agent", "agent@999,other@1"] {
        let pod = with_annotations(pod(APP_POD), json!({"sidecar.dev/injected": claim}));
        let plan = plan_in(&pod, &[template(AGENT)]);
        assert_eq!(plan.applied.len(), 1, "{claim}");
        let out = apply(&pod, &plan);
        assert_eq!(
            names(&out["spec"]["containers"]),
            ["app", "agent"],
            "{claim}"
        );
        let record = out["metadata"]["annotations"]["sidecar.dev/injected"]
            .as_str()
            .unwrap();
        assert!(record.contains("agent@4"), "{record}");
        assert!(!record.contains("agent@999"), "{record}");
    }
}

#[test]
fn the_record_keeps_claims_it_does_not_decide() {
    let pod = with_annotations(
        pod(APP_POD),
        json!({"sidecar.dev/injected": "mesh@3,agent@1"}),
    );
    let unselecting = template(
        "metadata: {name: agent}\nspec:\n  podSelector: {matchLabels: {app: other}}\n  containers: [{name: agent, image: a}]",
    );
    let plan = plan_in(&pod, &[unselecting]);
    // Neither claim is acted on: "mesh" belongs to another webhook entry and "agent" does not
    // select the Pod, so both are left as the Pod has them and nothing is written.
    assert!(plan.patch.is_empty(), "{:?}", plan.patch);
    assert_eq!(plan.skipped[0].reason, SkipReason::PodNotSelected);
}

#[test]
fn a_look_alike_container_denies_a_required_template() {
    let cases = [
        (
            json!({"name": "agent", "image": "agent:1.2", "args": ["--enforce"], "command": ["sleep", "infinity"], "ports": [{"containerPort": 9090}], "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}),
            "command differs",
        ),
        (
            json!({"name": "agent", "image": "agent:1.2", "args": ["--off"], "ports": [{"containerPort": 9090}], "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}),
            "args[0] differs",
        ),
        (
            json!({"name": "agent", "image": "agent:1.2", "args": ["--enforce"], "ports": [{"containerPort": 9090}], "resources": {"limits": {"cpu": "1m", "memory": "64Mi"}}}),
            "resources.limits.cpu differs",
        ),
    ];
    for (look_alike, field) in cases {
        let mut pod = with_annotations(pod(APP_POD), json!({"sidecar.dev/injected": "agent@4"}));
        pod["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(look_alike);
        let plan = plan_in(&pod, &[template(AGENT)]);
        let out = apply(&pod, &plan);
        assert_eq!(out["spec"], pod["spec"], "{field}: all or nothing");
        // The false claim is not repeated.
        assert_eq!(record(&out), "");
        let message = plan.denial_message().expect(field);
        assert!(
            message.contains(&format!(
                "container \"agent\" already exists (in the pod) and is not the template's: {field}"
            )),
            "{message}"
        );

        let best_effort = template(&format!("{AGENT}  failurePolicy: Ignore\n"));
        let plan = plan_in(&pod, &[best_effort]);
        assert!(plan.denials.is_empty());
        assert!(matches!(plan.skipped[0].reason, SkipReason::Conflict(_)));
        assert!(
            plan.warnings[0].to_string().contains(field),
            "{:?}",
            plan.warnings
        );
    }
}

#[test]
fn an_exact_copy_is_present_and_recorded() {
    let pod = pod(APP_POD);
    let once = apply(&pod, &plan_in(&pod, &[template(AGENT)]));
    // The same Pod written by hand, with no record.
    let mut copy = once.clone();
    copy["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .clear();
    let plan = plan_in(&copy, &[template(AGENT)]);
    assert_eq!(plan.skipped[0].reason, SkipReason::AlreadyPresent);
    assert!(plan.denials.is_empty());
    let out = apply(&copy, &plan);
    assert_eq!(names(&out["spec"]["containers"]), ["app", "agent"]);
    assert_eq!(record(&out), "agent@4");
}

/// What the API server and its admission plugins do to a Pod between our first call and the
/// re-invocation: defaults, canonical quantities, the ServiceAccount token volume and mounts.
fn as_the_api_server_leaves_it(mut pod: Value) -> Value {
    let token_mount = json!({
        "name": "kube-api-access-7xk2q",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": true,
    });
    for list in ["containers", "initContainers"] {
        for container in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let c = container.as_object_mut().unwrap();
            c.insert(
                "terminationMessagePath".into(),
                "/dev/termination-log".into(),
            );
            c.insert("terminationMessagePolicy".into(), "File".into());
            c.entry("imagePullPolicy").or_insert("IfNotPresent".into());
            let resources = c.entry("resources").or_insert(json!({}));
            if let Some(limits) = resources.get("limits").cloned() {
                let mut canonical = limits.clone();
                if canonical.get("cpu") == Some(&json!("0.5")) {
                    canonical["cpu"] = "500m".into();
                }
                resources["limits"] = canonical.clone();
                resources["requests"] = canonical;
            }
            for port in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                port["protocol"] = "TCP".into();
            }
            if let Some(probe) = c.get_mut("readinessProbe") {
                probe["timeoutSeconds"] = 1.into();
                probe["periodSeconds"] = 10.into();
                probe["successThreshold"] = 1.into();
                probe["failureThreshold"] = 3.into();
                probe["httpGet"]["path"] = "/".into();
                probe["httpGet"]["scheme"] = "HTTP".into();
            }
            c.entry("volumeMounts")
                .or_insert(json!([]))
                .as_array_mut()
                .unwrap()
                .push(token_mount.clone());
        }
    }
    pod["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "kube-api-access-7xk2q", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}));
    pod
}

#[test]
fn a_reinvocation_after_defaulting_and_the_token_mount_adds_nothing() {
    let mut pod = pod(APP_POD);
    pod["spec"]["initContainers"] = json!([{"name": "migrate", "image": "app:1"}]);
    let templates = [template(AGENT), template(NATIVE)];
    let once = apply(&pod, &plan_in(&pod, &templates));
    let reinvoked = as_the_api_server_leaves_it(once);
    assert_adds_nothing(&plan_in(&reinvoked, &templates));
}

#[test]
fn a_native_sidecar_after_the_pods_own_init_container_is_misplaced() {
    let mut pod = pod(APP_POD);
    pod["spec"]["initContainers"] = json!([
        {"name": "migrate", "image": "app:1"},
        {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "readinessProbe": {"httpGet": {"port": 15021}}},
    ]);
    let plan = plan_in(&pod, &[template(NATIVE)]);
    let message = plan.denial_message().unwrap();
    assert!(
        message.contains("container \"proxy\" is in the pod after its init container \"migrate\"; a native sidecar must come before the pod's own init containers"),
        "{message}"
    );

    // First, or after another native sidecar, it is where it belongs.
    pod["spec"]["initContainers"] = json!([
        {"name": "mesh", "image": "mesh:1", "restartPolicy": "Always"},
        {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "readinessProbe": {"httpGet": {"port": 15021}}},
        {"name": "migrate", "image": "app:1"},
    ]);
    let plan = plan_in(&pod, &[template(NATIVE)]);
    assert!(plan.denials.is_empty(), "{:?}", plan.denials);
    assert_eq!(plan.skipped[0].reason, SkipReason::AlreadyPresent);
}

#[test]
fn a_container_in_the_wrong_list_is_misplaced() {
    let mut pod = pod(APP_POD);
    pod["spec"]["containers"].as_array_mut().unwrap().push(
        json!({"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "readinessProbe": {"httpGet": {"port": 15021}}}),
    );
    let plan = plan_in(&pod, &[template(NATIVE)]);
    let message = plan.denial_message().unwrap();
    assert!(
        message.contains(
            "container \"proxy\" is in the pod's containers; the template adds it to initContainers"
        ),
        "{message}"
    );
}

/// Plans `templates`, one webhook entry's, among `known`, the registry's.
fn plan_among_in(
    pod: &Value,
    templates: &[std::sync::Arc<injector_core::CompiledTemplate>],
    known: &[std::sync::Arc<injector_core::CompiledTemplate>],
) -> injector_core::Plan<'static> {
    injector_core::plan_among(
        &injector_core::Pod::from_value(pod).unwrap(),
        &injector_core::NamespaceInfo {
            name: "default",
            labels: None,
        },
        templates,
        known,
    )
    .into_owned()
}

#[test]
fn another_entrys_additions_between_two_calls_are_not_look_alikes() {
    // Two webhook entries: a required agent with a native sidecar, then a best-effort template
    // adding env to every container and a plain init container (placed after the first
    // entry's native sidecar, before the Pod's own: entries are called in priority order).
    let required = [template(AGENT), template(NATIVE)];
    let best_effort = [template(
        "metadata: {name: telemetry}\nspec:\n  failurePolicy: Ignore\n  appContainers:\n    env: [{name: OTEL, value: enabled}]\n  initContainers: [{name: fetch-config, image: fetch:1}]",
    )];
    let known: Vec<_> = required.iter().chain(&best_effort).cloned().collect();
    let pod = pod(APP_POD);
    let first = apply(&pod, &plan_among_in(&pod, &required, &known));
    let second = apply(&first, &plan_among_in(&first, &best_effort, &known));
    assert_eq!(second["spec"]["containers"][0]["env"][0]["name"], "OTEL");
    assert_eq!(
        second["spec"]["containers"][1].get("env"),
        None,
        "the agent is not the Pod's own"
    );
    assert_eq!(
        names(&second["spec"]["initContainers"]),
        ["proxy", "fetch-config"]
    );

    // The API server calls the first entry again: it finds its items, and nothing else.
    let again = plan_among_in(&second, &required, &known);
    assert!(again.denials.is_empty(), "{:?}", again.denials);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
    let again = plan_among_in(&second, &best_effort, &known);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
}

#[test]
fn a_native_sidecar_behind_an_init_container_named_like_a_templates_is_misplaced() {
    // The init container is named like another template's, but its content is the author's.
    let setup = template(
        "metadata: {name: setup}\nspec:\n  injection: OnRequest\n  initContainers: [{name: b-setup, image: setup:1}]",
    );
    let templates = [template(NATIVE), setup];
    let mut pod = pod(APP_POD);
    pod["spec"]["initContainers"] = json!([
        {"name": "b-setup", "image": "evil:1", "command": ["sh"]},
        {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "readinessProbe": {"httpGet": {"port": 15021}}},
    ]);
    let plan = plan_in(&pod, &templates);
    let message = plan.denial_message().unwrap();
    assert!(
        message.contains("after its init container \"b-setup\""),
        "{message}"
    );
}

#[test]
fn the_record_lists_each_template_once() {
    let pod = with_annotations(
        pod(APP_POD),
        json!({"sidecar.dev/injected": "agent@1,mesh@2,agent@1,mesh@3"}),
    );
    let out = apply(&pod, &plan_in(&pod, &[template(AGENT)]));
    assert_eq!(record(&out), "agent@4,mesh@2");
}
