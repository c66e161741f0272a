//! `holds_cel` evaluated by a CEL interpreter beside `difference` on the same items: where the
//! Rust comparison finds the Pod's item the template's, the CEL condition holds; where a field
//! the template sets differs, it does not.

use kube_cel::cel;
use serde_json::{Value, json};

use super::super::{ItemKind, Surroundings, difference};
use super::holds_cel;
use crate::cel::testing::evaluate;
use crate::placeholder::{Node, Part, TemplateString};

const TOKEN_VOLUME: &str = "kube-api-access-x7k2p";

/// The Pod around the item: its ServiceAccount token volume, and its name.
fn pod() -> Value {
    json!({
        "metadata": {"name": "web-1"},
        "spec": {"volumes": [{"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]},
    })
}

/// `{{ pod.name }}` and the rest as the policy renders them, over `object`.
fn text(template: &TemplateString) -> String {
    let parts: Vec<String> = template
        .parts()
        .map(|part| match part {
            Part::Literal(text) => Value::from(text).to_string(),
            Part::Name => "object.metadata.name".to_owned(),
            _ => "\"\"".to_owned(),
        })
        .collect();
    format!("({})", parts.join(" + "))
}

fn holds(ours: &Value, theirs: &Value) -> bool {
    let node = Node::parse(ours, "container", &mut Vec::new());
    let source = holds_cel(&node, "c", ItemKind::Container, &text);
    match evaluate(&source, &[("object", &pod()), ("c", theirs)]) {
        cel::Value::Bool(verdict) => verdict,
        other => panic!("{source}: {other:?}"),
    }
}

/// `difference` with the placeholder rendered for this Pod.
fn same(ours: &Value, theirs: &Value) -> bool {
    let rendered: Value =
        serde_json::from_str(&ours.to_string().replace("{{ pod.name }}", "web-1")).unwrap();
    let pod = Surroundings {
        host_network: false,
        token_volumes: &[TOKEN_VOLUME],
    };
    difference(&rendered, theirs, ItemKind::Container, &pod).is_none()
}

fn ours() -> Value {
    json!({
        "name": "log-agent",
        "image": "logs.invalid/agent:2",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--pod", "{{ pod.name }}"],
        "stdin": false,
        "ports": [{"containerPort": 9100, "name": "metrics"}],
        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"port": 9100, "path": ""}, "timeoutSeconds": 0},
        "resources": {"limits": {"cpu": "0.5"}},
        "volumeMounts": [{"name": "logs", "mountPath": "/var/log/pods", "readOnly": false}],
    })
}

/// `ours` as the API server stores it, given the token's mount.
fn stored() -> Value {
    json!({
        "name": "log-agent",
        "image": "logs.invalid/agent:2",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--pod", "web-1"],
        "ports": [{"containerPort": 9100, "name": "metrics", "protocol": "TCP"}],
        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "readinessProbe": {
            "httpGet": {"port": 9100, "path": "/", "scheme": "HTTP"},
            "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3,
        },
        "resources": {"limits": {"cpu": "500m"}, "requests": {"cpu": "500m"}},
        "volumeMounts": [
            {"name": "logs", "mountPath": "/var/log/pods"},
            {"name": TOKEN_VOLUME, "readOnly": true,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    })
}

fn with(change: impl FnOnce(&mut Value)) -> Value {
    let mut stored = stored();
    change(&mut stored);
    stored
}

#[test]
fn the_template_s_item_as_stored_holds_in_both_forms() {
    let cases = [
        ("as stored", stored()),
        (
            "pulled always (AlwaysPullImages)",
            with(|c| c["imagePullPolicy"] = json!("Always")),
        ),
        (
            "without the token's mount",
            with(|c| {
                c["volumeMounts"].as_array_mut().unwrap().pop();
            }),
        ),
        (
            "the token's mount first",
            with(|c| c["volumeMounts"].as_array_mut().unwrap().reverse()),
        ),
    ];
    for (what, theirs) in cases {
        assert!(same(&ours(), &theirs), "{what}: difference disagrees");
        assert!(
            holds(&ours(), &theirs),
            "{what}: the CEL form does not hold"
        );
    }
}

#[test]
fn another_version_s_item_fails_both_forms() {
    let cases = [
        (
            "another image",
            with(|c| c["image"] = json!("logs.invalid/agent:1")),
        ),
        (
            "another Pod's name",
            with(|c| c["args"][1] = json!("web-2")),
        ),
        (
            "an argument more",
            with(|c| c["args"] = json!(["--pod", "web-1", "-v"])),
        ),
        (
            "another port",
            with(|c| c["ports"][0]["containerPort"] = json!(9200)),
        ),
        ("a port less", with(|c| c["ports"] = json!([]))),
        (
            "another env source",
            with(|c| c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] = json!("metadata.uid")),
        ),
        (
            "another probe timeout than the zero's default",
            with(|c| c["readinessProbe"]["timeoutSeconds"] = json!(5)),
        ),
        (
            "another probe port",
            with(|c| c["readinessProbe"]["httpGet"]["port"] = json!(9200)),
        ),
        (
            "a mount less",
            with(|c| c["volumeMounts"] = json!([c["volumeMounts"][1].clone()])),
        ),
        (
            "a read-only mount",
            with(|c| c["volumeMounts"][0]["readOnly"] = json!(true)),
        ),
        (
            "no ports",
            with(|c| {
                c.as_object_mut().unwrap().remove("ports");
            }),
        ),
        (
            "another pull policy",
            with(|c| c["imagePullPolicy"] = json!("Never")),
        ),
        ("stdin on", with(|c| c["stdin"] = json!(true))),
    ];
    for (what, theirs) in cases {
        assert!(
            !same(&ours(), &theirs),
            "{what}: difference finds no difference"
        );
        assert!(!holds(&ours(), &theirs), "{what}: the CEL form holds");
    }
}

/// Where the CEL form leans to "holds": what only the Pod's item sets, and quantities. The
/// webhook and the guard, which compare whole items, judge those.
#[test]
fn what_the_template_does_not_set_is_not_looked_at() {
    for (what, theirs) in [
        ("a command added", with(|c| c["command"] = json!(["sh"]))),
        (
            "other resources",
            with(|c| c["resources"] = json!({"limits": {"cpu": "2"}})),
        ),
    ] {
        assert!(
            !same(&ours(), &theirs),
            "{what}: difference finds no difference"
        );
        assert!(
            holds(&ours(), &theirs),
            "{what}: the CEL form does not hold"
        );
    }
}

/// `hostPort: 0` is Go's unset: the API server leaves it out, and on a hostNetwork Pod stores
/// the port's `containerPort` there (the presence property test found `difference` refusing
/// that; both forms now allow it, and only it).
#[test]
fn a_zero_host_port_is_the_container_s_port_on_the_host_network() {
    let ours =
        json!({"name": "a", "image": "a:1", "ports": [{"containerPort": 9100, "hostPort": 0}]});
    let node = Node::parse(&ours, "container", &mut Vec::new());
    let source = holds_cel(&node, "c", ItemKind::Container, &text);
    for (host_network, host_port, held) in [
        (false, None, true),
        (true, None, true),
        (true, Some(9100), true),
        (false, Some(9100), false),
        (true, Some(9101), false),
    ] {
        let mut port = json!({"containerPort": 9100, "protocol": "TCP"});
        if let Some(host_port) = host_port {
            port["hostPort"] = json!(host_port);
        }
        let theirs = json!({"name": "a", "image": "a:1", "ports": [port]});
        let surroundings = Surroundings {
            host_network,
            token_volumes: &[TOKEN_VOLUME],
        };
        let same = difference(&ours, &theirs, ItemKind::Container, &surroundings).is_none();
        let mut pod = pod();
        pod["spec"]["hostNetwork"] = json!(host_network);
        let holds = matches!(
            evaluate(&source, &[("object", &pod), ("c", &theirs)]),
            cel::Value::Bool(true)
        );
        assert_eq!(same, held, "difference, {host_network} {host_port:?}");
        assert_eq!(
            holds, held,
            "holds_cel, {host_network} {host_port:?}: {source}"
        );
    }
}
