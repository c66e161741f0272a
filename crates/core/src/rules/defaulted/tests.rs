use serde_json::json;

use super::*;

/// A Pod whose ServiceAccount token volume is `kube-api-access-x7k2p`, not on the host network.
const POD: Surroundings<'static> = Surroundings {
    host_network: false,
    token_volumes: &["kube-api-access-x7k2p", "kube-api-access-abcde"],
};

fn container_difference(ours: Value, theirs: Value) -> Option<String> {
    difference(&ours, &theirs, ItemKind::Container, &POD)
}

#[test]
fn a_container_defaulted_and_given_the_token_mount_is_the_same() {
    let ours = json!({
        "name": "proxy",
        "image": "proxy:1.2",
        "args": ["--port", "15001"],
        "ports": [{"containerPort": 15001}],
        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"port": 15021}},
        "resources": {"limits": {"cpu": "0.5", "memory": "1024Mi"}},
        "volumeMounts": [{"name": "certs", "mountPath": "/certs"}],
    });
    let theirs = json!({
        "name": "proxy",
        "image": "proxy:1.2",
        "args": ["--port", "15001"],
        "ports": [{"containerPort": 15001, "protocol": "TCP"}],
        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "readinessProbe": {
            "httpGet": {"port": 15021, "path": "/", "scheme": "HTTP"},
            "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3,
        },
        "resources": {
            "limits": {"cpu": "500m", "memory": "1Gi"},
            "requests": {"cpu": "500m", "memory": "1Gi"},
        },
        "volumeMounts": [
            {"name": "certs", "mountPath": "/certs"},
            {"name": "kube-api-access-x7k2p", "readOnly": true,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    });
    assert_eq!(container_difference(ours, theirs), None);
}

#[test]
fn a_look_alike_is_named_by_the_field_that_differs() {
    let ours = json!({"name": "agent", "image": "agent:1", "args": ["--strict"]});
    let cases = [
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict"], "command": ["sleep", "infinity"]}),
            "command",
        ),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--lax"]}),
            "args[0]",
        ),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict", "x"]}),
            "args",
        ),
        (
            json!({"name": "agent", "image": "evil:1", "args": ["--strict"]}),
            "image",
        ),
        (json!({"name": "agent", "image": "agent:1"}), "args"),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict"], "securityContext": {"privileged": true}}),
            "securityContext",
        ),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict"], "env": [{"name": "X", "value": "1"}]}),
            "env",
        ),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict"], "volumeMounts": [{"name": "host", "mountPath": "/host"}]}),
            "volumeMounts",
        ),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict"], "imagePullPolicy": "Never"}),
            "imagePullPolicy",
        ),
        (
            json!({"name": "agent", "image": "agent:1", "args": ["--strict"], "terminationMessagePath": "/tmp/x"}),
            "terminationMessagePath",
        ),
    ];
    for (theirs, field) in cases {
        assert_eq!(
            container_difference(ours.clone(), theirs.clone()).as_deref(),
            Some(field),
            "{theirs}"
        );
    }
}

#[test]
fn probe_values_other_than_the_defaults_differ() {
    let ours = json!({"name": "a", "image": "a:1", "livenessProbe": {"tcpSocket": {"port": 80}}});
    let theirs = json!({"name": "a", "image": "a:1", "livenessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 3600}});
    assert_eq!(
        container_difference(ours, theirs).as_deref(),
        Some("livenessProbe.periodSeconds")
    );
}

#[test]
fn the_pull_policy_follows_the_image_tag() {
    assert_eq!(default_pull_policy("nginx"), "Always");
    assert_eq!(default_pull_policy("nginx:latest"), "Always");
    assert_eq!(default_pull_policy("nginx:1.27"), "IfNotPresent");
    assert_eq!(default_pull_policy("registry.local:5000/nginx"), "Always");
    assert_eq!(
        default_pull_policy("registry.local:5000/nginx:1"),
        "IfNotPresent"
    );
    assert_eq!(default_pull_policy("nginx@sha256:abcd"), "IfNotPresent");
    let ours = json!({"name": "a", "image": "a"});
    let always = json!({"name": "a", "image": "a", "imagePullPolicy": "Always"});
    assert_eq!(container_difference(ours.clone(), always), None);
    let if_not_present = json!({"name": "a", "image": "a", "imagePullPolicy": "IfNotPresent"});
    assert_eq!(
        container_difference(ours, if_not_present).as_deref(),
        Some("imagePullPolicy")
    );
}

#[test]
fn only_the_service_account_mount_may_be_added() {
    let ours = json!({"name": "a", "image": "a:1"});
    let token = json!({"name": "a", "image": "a:1", "volumeMounts": [
        {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
    ]});
    assert_eq!(container_difference(ours.clone(), token), None);
    for mount in [
        json!({"name": "mine", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}),
        // Named like the plugin's, but not a token volume of the Pod.
        json!({"name": "kube-api-access-fake", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}),
        // Writable, or only part of it.
        json!({"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}),
        json!({"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true, "subPath": "token"}),
    ] {
        let other = json!({"name": "a", "image": "a:1", "volumeMounts": [mount]});
        assert_eq!(
            container_difference(ours.clone(), other).as_deref(),
            Some("volumeMounts"),
        );
    }
}

#[test]
fn zero_values_the_api_server_drops_or_defaults_are_the_same() {
    let ours = json!({
        "name": "a", "image": "a:1", "tty": false, "stdin": false,
        "ports": [{"containerPort": 80, "hostPort": 0}],
        "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": false}],
        "livenessProbe": {"httpGet": {"port": 80, "path": "", "scheme": ""}, "timeoutSeconds": 0, "initialDelaySeconds": 0},
        "imagePullPolicy": "IfNotPresent",
    });
    let theirs = json!({
        "name": "a", "image": "a:1",
        "ports": [{"containerPort": 80, "protocol": "TCP"}],
        "volumeMounts": [{"name": "v", "mountPath": "/v"}],
        "livenessProbe": {"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
        // The AlwaysPullImages admission plugin.
        "imagePullPolicy": "Always",
    });
    assert_eq!(container_difference(ours, theirs), None);

    // A pointer field keeps its false: its absence is a difference.
    let ours = json!({"name": "a", "image": "a:1", "securityContext": {"allowPrivilegeEscalation": false}});
    let theirs = json!({"name": "a", "image": "a:1", "securityContext": {}});
    assert_eq!(
        container_difference(ours, theirs).as_deref(),
        Some("securityContext.allowPrivilegeEscalation")
    );
}

#[test]
fn a_host_port_is_a_default_only_on_the_host_network() {
    let ours = json!({"name": "a", "image": "a:1", "ports": [{"containerPort": 9090}]});
    let theirs =
        json!({"name": "a", "image": "a:1", "ports": [{"containerPort": 9090, "hostPort": 9090}]});
    assert_eq!(
        container_difference(ours.clone(), theirs.clone()).as_deref(),
        Some("ports[0].hostPort")
    );
    let host = Surroundings {
        host_network: true,
        ..POD
    };
    assert_eq!(difference(&ours, &theirs, ItemKind::Container, &host), None);
    // `hostPort: 0` is Go's unset: stored as left out, or on the host network as the
    // container's port (the presence property test found this one).
    let zero =
        json!({"name": "a", "image": "a:1", "ports": [{"containerPort": 9090, "hostPort": 0}]});
    assert_eq!(difference(&zero, &theirs, ItemKind::Container, &host), None);
    assert_eq!(
        container_difference(zero.clone(), theirs).as_deref(),
        Some("ports[0].hostPort")
    );
    let elsewhere =
        json!({"name": "a", "image": "a:1", "ports": [{"containerPort": 9090, "hostPort": 9091}]});
    assert_eq!(
        difference(&zero, &elsewhere, ItemKind::Container, &host).as_deref(),
        Some("ports[0].hostPort")
    );
}

#[test]
fn volumes_compare_up_to_their_defaults() {
    let volume = |ours: Value, theirs: Value| difference(&ours, &theirs, ItemKind::Volume, &POD);
    assert_eq!(
        volume(json!({"name": "v"}), json!({"name": "v", "emptyDir": {}})),
        None
    );
    assert_eq!(
        volume(
            json!({"name": "v", "emptyDir": {"sizeLimit": "1024Mi"}}),
            json!({"name": "v", "emptyDir": {"sizeLimit": "1Gi"}})
        ),
        None
    );
    assert_eq!(
        volume(
            json!({"name": "v", "configMap": {"name": "c"}}),
            json!({"name": "v", "configMap": {"name": "c", "defaultMode": 420}})
        ),
        None
    );
    assert_eq!(
        volume(
            json!({"name": "v", "configMap": {"name": "c"}}),
            json!({"name": "v", "configMap": {"name": "c", "defaultMode": 511}})
        )
        .as_deref(),
        Some("configMap.defaultMode")
    );
    assert_eq!(
        volume(
            json!({"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "a"}}]}}),
            json!({"name": "v", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"path": "t", "audience": "a", "expirationSeconds": 3600}}]}})
        ),
        None
    );
    assert_eq!(
        volume(
            json!({"name": "v", "emptyDir": {}}),
            json!({"name": "v", "hostPath": {"path": "/"}})
        )
        .as_deref(),
        Some("hostPath")
    );
    assert_eq!(
        volume(
            json!({"name": "v", "hostPath": {"path": "/var/log"}}),
            json!({"name": "v", "hostPath": {"path": "/var/log", "type": ""}})
        ),
        None
    );
}

#[test]
fn quantities_compare_by_amount() {
    for (a, b) in [
        ("0.5", "500m"),
        ("1024Mi", "1Gi"),
        ("1e3", "1k"),
        ("1000m", "1"),
        ("0.0001", "1m"),
        ("129e6", "129M"),
        ("1.5Gi", "1536Mi"),
    ] {
        assert!(same_quantity(a, b), "{a} = {b}");
    }
    for (a, b) in [("1", "2"), ("1Gi", "1G"), ("x", "y"), ("1", "1x")] {
        assert!(!same_quantity(a, b), "{a} != {b}");
    }
    assert_eq!(milli_units("100m"), Some(100));
    assert_eq!(milli_units("-1"), Some(-1000));
    assert_eq!(milli_units(""), None);
    assert_eq!(milli_units("."), None);
    assert_eq!(milli_units("1e999"), None);
}
