#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_api::SidecarTemplate;
use injector_core::compile;
use serde_json::json;

use super::*;

fn template(name: &str, generation: i64, image: &str, spec: Value) -> Arc<CompiledTemplate> {
    let mut spec = spec;
    spec["containers"] = json!([{"name": name, "image": image}]);
    spec["failurePolicy"] = json!("Ignore");
    let template: SidecarTemplate = serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": spec,
    }))
    .unwrap();
    Arc::new(compile(&template).unwrap())
}

/// `agent` (generation 2, selecting `app: web`), `mesh` (selecting namespaces labelled
/// `mesh: on`, which `shop` is not) and `debug` (`OnRequest`).
fn in_force() -> Vec<Arc<CompiledTemplate>> {
    vec![
        template(
            "agent",
            2,
            "agent:2",
            json!({"podSelector": {"matchLabels": {"app": "web"}}}),
        ),
        template(
            "mesh",
            1,
            "envoy:1",
            json!({"namespaceSelector": {"matchLabels": {"mesh": "on"}}}),
        ),
        template("debug", 1, "busybox:1", json!({"injection": "OnRequest"})),
    ]
}

fn shop_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), "shop".to_owned())])
}

#[test]
fn targets_are_read_as_kubectl_names_them() {
    let parse = |text: &str| text.parse::<Target>();
    let good = [
        ("pod/web-0", TargetKind::Pod, "web-0"),
        ("po/web-0", TargetKind::Pod, "web-0"),
        ("Deployment/web", TargetKind::Deployment, "web"),
        ("deploy/web", TargetKind::Deployment, "web"),
        ("deployment.apps/web", TargetKind::Deployment, "web"),
        ("sts/db", TargetKind::StatefulSet, "db"),
        ("daemonsets/node", TargetKind::DaemonSet, "node"),
        ("rs/web-1", TargetKind::ReplicaSet, "web-1"),
        ("job.batch/once", TargetKind::Job, "once"),
        ("cj/nightly", TargetKind::CronJob, "nightly"),
    ];
    for (text, kind, name) in good {
        let target = Target {
            kind,
            name: name.to_owned(),
        };
        assert_eq!(parse(text), Ok(target), "{text}");
    }
    for kind in ["service", "deployment.batch"] {
        let text = format!("{kind}/web");
        assert_eq!(
            parse(&text),
            Err(TargetError::Kind(kind.to_owned())),
            "{text}"
        );
    }
    for bad in ["web", "pod/", "/web", "pod/a/b"] {
        assert_eq!(parse(bad), Err(TargetError::Shape(bad.to_owned())), "{bad}");
    }
}

#[test]
fn checks_pod_is_read_as_explain_reads_a_pod() {
    for text in ["pod/web-0", "po/web-0", "pods/web-0", "Pod/web-0"] {
        let target: Target = text.parse().unwrap();
        assert_eq!(target.kind, TargetKind::Pod, "{text}");
        assert_eq!(
            pod_name(text).as_deref(),
            Ok(target.name.as_str()),
            "{text}"
        );
    }
    // A bare name is a Pod's, as `kubectl logs` takes it.
    assert_eq!(pod_name("web-0").as_deref(), Ok("web-0"));
    assert_eq!(
        pod_name("deploy/web"),
        Err(TargetError::NotPod("deploy/web".to_owned()))
    );
    assert_eq!(
        pod_name("svc/web"),
        Err(TargetError::Kind("svc".to_owned()))
    );
    for bad in ["", "pod/", "pod/a/b"] {
        assert_eq!(
            pod_name(bad),
            Err(TargetError::Shape(bad.to_owned())),
            "{bad}"
        );
    }
}

#[test]
fn a_pod_shows_what_it_carries_and_why_each_template_applies_or_not() {
    let templates = in_force();
    let old = template(
        "agent",
        1,
        "agent:1",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-1",
            "namespace": "shop",
            "labels": {"app": "web"},
            "annotations": {"sidecar.dev/injected": format!("agent@1#{},retired@4", old.fingerprint)},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9", "uid": "u", "controller": true}],
        },
        "spec": {"containers": [
            {"name": "web", "image": "nginx"},
            {"name": "agent", "image": "agent:1"},
        ]},
    });
    let labels = shop_labels();
    let namespace = Namespace {
        name: "shop",
        labels: Some(&labels),
    };
    let text = explain(pod, &namespace, &templates).unwrap();
    for line in [
        "pod/web-1 in shop",
        "  namespace labels: kubernetes.io/metadata.name=shop",
        "  carries (sidecar.dev/injected): agent@1#",
        "  stale    agent (carries generation 1; in force: generation 2, only images changed since)",
        "  gone     retired (no template of that name is in force)",
        "  created by replicaset/web-5d9: `kubectl sidecar explain replicaset/web-5d9 -n shop`",
        "planned again now, as it is (what admission would decide for this Pod today):",
        "  skipped  agent (priority 100, Automatic, failurePolicy Ignore): conflict: ",
        "  skipped  debug (priority 100, OnRequest, failurePolicy Ignore): injection is OnRequest",
        "  skipped  mesh (priority 100, Automatic, failurePolicy Ignore): the namespace selector does not match",
        "  result   initContainers: -; containers: web, agent",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(!text.contains("current  "), "{text}");
}

#[test]
fn a_workload_is_planned_as_the_pod_its_controller_creates() {
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        }},
    });
    let labels = shop_labels();
    let namespace = Namespace {
        name: "shop",
        labels: Some(&labels),
    };
    let text = explain(deployment, &namespace, &in_force()).unwrap();
    assert!(!text.contains("carries"), "{text}");
    for line in [
        "deployment/web in shop",
        "planned now, as the Pod its controller would create:",
        "  applied  agent (generation 2; priority 100, Automatic, failurePolicy Ignore)",
        "  result   initContainers: -; containers: web, agent",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
}

#[test]
fn a_missing_template_is_named_and_a_current_one_recognised() {
    let templates = in_force();
    let agent = &templates[0];
    let pod = |record: Option<String>| {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-2", "namespace": "shop", "labels": {"app": "web"},
                "annotations": record.map_or_else(|| json!({}), |r| json!({"sidecar.dev/injected": r})),
            },
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        })
    };
    let labels = shop_labels();
    let namespace = Namespace {
        name: "shop",
        labels: Some(&labels),
    };
    let text = explain(pod(None), &namespace, &templates).unwrap();
    assert!(
        text.contains("  carries (sidecar.dev/injected): nothing"),
        "{text}"
    );
    assert!(
        text.contains("  missing  agent (selects it, not carried"),
        "{text}"
    );
    assert!(text.contains("  applied  agent"), "{text}");
    let current = format!("agent@2#{}", agent.fingerprint);
    let text = explain(pod(Some(current)), &namespace, &templates).unwrap();
    assert!(text.contains("  current  agent (generation 2"), "{text}");
}

#[test]
fn the_operators_namespace_is_never_planned() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "operator-1", "namespace": "sidecar-injector", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "operator", "image": "x"}]},
    });
    let namespace = Namespace {
        name: "sidecar-injector",
        labels: None,
    };
    let text = explain(pod, &namespace, &in_force()).unwrap();
    assert!(text.contains("is the operator's own"), "{text}");
    assert!(!text.contains("planned"), "{text}");
}

#[test]
fn an_object_without_a_pod_template_is_an_error() {
    let labels = shop_labels();
    let namespace = Namespace {
        name: "shop",
        labels: Some(&labels),
    };
    let job =
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": {}});
    assert!(explain(job, &namespace, &in_force()).is_err());
}
