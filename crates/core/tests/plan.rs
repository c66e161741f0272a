//! The planning rules, one test each.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use injector_core::{NamespaceInfo, SkipReason, plan};
use serde_json::{Value, json};

const SIDECAR: &str = r#"
metadata: {name: logger, generation: 3}
spec:
  containers:
  - name: logger
    image: fluent-bit:3
    volumeMounts: [{name: logs, mountPath: /var/log/app}]
  volumes:
  - name: logs
    emptyDir: {}
"#;

#[test]
fn injects_containers_and_creates_missing_lists() {
    let pod = pod(APP_POD);
    let plan = plan_in(&pod, &[template(SIDECAR)]);
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    let out = apply(&pod, &plan);
    assert_eq!(names(&out["spec"]["containers"]), ["app", "logger"]);
    assert_eq!(names(&out["spec"]["volumes"]), ["logs"]);
    assert_eq!(record(&out), "logger@3");
    assert_eq!(plan.applied.len(), 1);
    assert_eq!(
        (plan.applied[0].name.as_str(), plan.applied[0].generation),
        ("logger", 3)
    );
    // The volumes list and annotations map did not exist: each is created by one operation.
    let patch = serde_json::to_value(&plan.patch).unwrap();
    let paths: Vec<&str> = patch
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/metadata/annotations",
            "/spec/containers/-",
            "/spec/volumes"
        ]
    );
}

#[test]
fn planning_a_mutated_pod_again_adds_nothing() {
    let pod = pod(APP_POD);
    let templates = [template(SIDECAR)];
    let once = apply(&pod, &plan_in(&pod, &templates));
    let again = plan_in(&once, &templates);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
    assert_eq!(again.skipped[0].reason, SkipReason::AlreadyPresent);
}

#[test]
fn a_reinvocation_adds_only_new_templates_and_extends_the_record() {
    let pod = pod(APP_POD);
    let first = apply(&pod, &plan_in(&pod, &[template(SIDECAR)]));
    let second =
        template("metadata: {name: agent}\nspec:\n  containers: [{name: agent, image: agent:1}]");
    let plan = plan_in(&first, &[template(SIDECAR), second]);
    let out = apply(&first, &plan);
    assert_eq!(
        names(&out["spec"]["containers"]),
        ["app", "logger", "agent"]
    );
    assert_eq!(record(&out), "logger@3,agent@1");
}

#[test]
fn injected_items_already_present_after_defaulting_are_not_conflicts() {
    // The annotation is gone (another webhook dropped it) and the API server defaulted the
    // injected container: nothing is added twice and nothing conflicts.
    let pod = pod(APP_POD);
    let mut once = apply(&pod, &plan_in(&pod, &[template(SIDECAR)]));
    once["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .clear();
    once["spec"]["containers"][1]["imagePullPolicy"] = "IfNotPresent".into();
    let again = plan_in(&once, &[template(SIDECAR)]);
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    let out = apply(&once, &again);
    assert_eq!(names(&out["spec"]["containers"]), ["app", "logger"]);
}

#[test]
fn pod_annotation_opts_out_of_best_effort_templates_only() {
    let mut pod = pod(APP_POD);
    pod["metadata"]["annotations"] = json!({"sidecar.dev/inject": "false"});
    let best_effort = template(&format!("{SIDECAR}  failurePolicy: Ignore\n"));
    let plan = plan_in(&pod, &[best_effort]);
    assert!(plan.patch.is_empty());
    assert_eq!(plan.skipped[0].reason, SkipReason::PodOptedOut);

    let plan = plan_in(&pod, &[template(SIDECAR)]);
    assert_eq!(plan.applied.len(), 1, "a required template still applies");
    assert_eq!(
        texts(&plan.warnings),
        [
            "SidecarTemplate \"logger\" is required: the pod's sidecar.dev/inject: \"false\" does not apply to it"
        ]
    );
    let out = apply(&pod, &plan);
    assert_eq!(names(&out["spec"]["containers"]), ["app", "logger"]);
}

#[test]
fn namespace_label_opts_out() {
    let pod = pod(APP_POD);
    let plan = plan_with_labels(
        &pod,
        &labels(&[("sidecar.dev/injection", "disabled")]),
        &[template(SIDECAR)],
    );
    assert!(plan.patch.is_empty());
    assert_eq!(plan.skipped[0].reason, SkipReason::NamespaceOptedOut);
}

#[test]
fn system_namespaces_are_never_injected() {
    let mut pod = pod(APP_POD);
    pod["metadata"]["namespace"] = "kube-system".into();
    let system = plan_in(&pod, &[template(SIDECAR)]);
    assert!(system.patch.is_empty());
    assert_eq!(
        system.skipped[0].reason,
        SkipReason::NamespaceExcluded("kube-system".into())
    );
    // A Pod without metadata.namespace takes the request's namespace.
    pod["metadata"].as_object_mut().unwrap().remove("namespace");
    let public = plan(
        &pod,
        &NamespaceInfo {
            name: "kube-public",
            labels: None,
        },
        &[template(SIDECAR)],
    )
    .unwrap()
    .into_owned();
    assert!(public.patch.is_empty());
}

#[test]
fn selectors_choose_pods_and_namespaces() {
    let pod = pod(APP_POD);
    let selective = template(
        "metadata: {name: sel}\nspec:\n  namespaceSelector: {matchLabels: {team: shop}}\n  podSelector: {matchLabels: {app: web}}\n  containers: [{name: s, image: s}]",
    );
    let other_pods = template(
        "metadata: {name: db}\nspec:\n  podSelector: {matchLabels: {app: db}}\n  containers: [{name: d, image: d}]",
    );
    let shop = labels(&[("team", "shop")]);
    let plan = plan_with_labels(&pod, &shop, &[selective.clone(), other_pods.clone()]);
    assert_eq!(plan.applied.len(), 1);
    assert_eq!(plan.skipped[0].reason, SkipReason::PodNotSelected);
    let plan = plan_with_labels(
        &pod,
        &labels(&[("team", "other")]),
        std::slice::from_ref(&selective),
    );
    assert_eq!(plan.skipped[0].reason, SkipReason::NamespaceNotSelected);
    // Unknown namespace labels: the API server already selected the namespace.
    assert_eq!(plan_in(&pod, &[selective]).applied.len(), 1);
}

#[test]
fn on_request_templates_apply_only_when_named() {
    let on_request = template(
        "metadata: {name: proxy}\nspec:\n  injection: OnRequest\n  initContainers: [{name: proxy, image: envoy, restartPolicy: Always}]",
    );
    let mut pod = pod(APP_POD);
    let plan = plan_in(&pod, std::slice::from_ref(&on_request));
    assert_eq!(plan.skipped[0].reason, SkipReason::NotRequested);
    pod["metadata"]["annotations"] = json!({"sidecar.dev/templates": "other, proxy"});
    let out = apply(&pod, &plan_in(&pod, &[on_request]));
    assert_eq!(names(&out["spec"]["initContainers"]), ["proxy"]);
    assert_eq!(out["spec"]["initContainers"][0]["restartPolicy"], "Always");
}

#[test]
fn init_containers_go_before_the_pods_own_in_priority_order() {
    let mut pod = pod(APP_POD);
    pod["spec"]["initContainers"] = json!([{"name": "migrate", "image": "m"}]);
    let a = template(
        "metadata: {name: a}\nspec:\n  priority: 10\n  initContainers: [{name: a1, image: a}, {name: a2, image: a}]",
    );
    let b = template(
        "metadata: {name: b}\nspec:\n  priority: 20\n  initContainers: [{name: b1, image: b, restartPolicy: Always}]",
    );
    let out = apply(&pod, &plan_in(&pod, &[b, a]));
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["a1", "a2", "b1", "migrate"]
    );
}

#[test]
fn priority_then_name_decides_order_whatever_the_input_order() {
    let pod = pod(APP_POD);
    let mk = |name: &str, priority: i32| {
        template(&format!(
            "metadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  containers: [{{name: {name}, image: x}}]"
        ))
    };
    let (a, b, c) = (mk("zeta", 1), mk("alpha", 5), mk("beta", 5));
    let one = apply(&pod, &plan_in(&pod, &[a.clone(), b.clone(), c.clone()]));
    let two = apply(&pod, &plan_in(&pod, &[c, b, a]));
    assert_eq!(one, two);
    assert_eq!(
        names(&one["spec"]["containers"]),
        ["app", "zeta", "alpha", "beta"]
    );
    assert_eq!(record(&one), "zeta@1,alpha@1,beta@1");
}

#[test]
fn a_conflict_with_the_pod_skips_the_template_whole_and_denies_when_required() {
    let pod = pod(APP_POD);
    let required = template(
        "metadata: {name: agent}\nspec:\n  containers: [{name: app, image: agent}]\n  volumes: [{name: v, emptyDir: {}}]",
    );
    let plan = plan_in(&pod, &[required]);
    assert!(plan.patch.is_empty(), "all or nothing: {:?}", plan.patch);
    assert!(
        matches!(&plan.skipped[0].reason, SkipReason::Conflict(d) if d.contains("container \"app\" already exists (in the pod) and is not the template's: image differs"))
    );
    assert_eq!(plan.warnings.len(), 1);
    let message = plan.denial_message().unwrap();
    assert!(
        message.contains("required SidecarTemplate \"agent\" cannot be applied"),
        "{message}"
    );

    let best_effort = template(
        "metadata: {name: agent}\nspec:\n  failurePolicy: Ignore\n  containers: [{name: app, image: agent}]",
    );
    let plan = plan_in(&pod, &[best_effort]);
    assert!(plan.denials.is_empty());
    assert_eq!(plan.warnings.len(), 1);
}

#[test]
fn between_two_templates_the_first_in_order_wins() {
    let pod = pod(APP_POD);
    let first = template(
        "metadata: {name: first}\nspec:\n  priority: 1\n  containers: [{name: proxy, image: one}]",
    );
    let second = template(
        "metadata: {name: second}\nspec:\n  priority: 2\n  failurePolicy: Ignore\n  containers: [{name: proxy, image: two}]",
    );
    let plan = plan_in(&pod, &[second, first]);
    let out = apply(&pod, &plan);
    assert_eq!(out["spec"]["containers"][1]["image"], "one");
    assert_eq!(plan.skipped[0].name, "second");
    assert!(
        plan.warnings[0]
            .to_string()
            .contains("added by SidecarTemplate \"first\""),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn volumes_conflict_only_when_different() {
    let mut pod = pod(APP_POD);
    pod["spec"]["volumes"] = json!([{"name": "logs", "emptyDir": {}}]);
    let plan = plan_in(&pod, &[template(SIDECAR)]);
    assert!(plan.warnings.is_empty());
    assert_eq!(names(&apply(&pod, &plan)["spec"]["volumes"]), ["logs"]);
    pod["spec"]["volumes"] = json!([{"name": "logs", "hostPath": {"path": "/"}}]);
    let plan = plan_in(&pod, &[template(SIDECAR)]);
    assert!(plan.applied.is_empty());
    assert!(
        plan.warnings[0].to_string().contains("volume \"logs\" already exists (in the pod) and is not the template's: hostPath differs"),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn image_pull_secrets_are_added_once() {
    let mut pod = pod(APP_POD);
    let t = template(
        "metadata: {name: t}\nspec:\n  imagePullSecrets: [{name: regcred}, {name: other}]",
    );
    assert_eq!(
        names(&apply(&pod, &plan_in(&pod, std::slice::from_ref(&t)))["spec"]["imagePullSecrets"]),
        ["regcred", "other"]
    );
    pod["spec"]["imagePullSecrets"] = json!([{"name": "regcred"}]);
    assert_eq!(
        names(&apply(&pod, &plan_in(&pod, &[t]))["spec"]["imagePullSecrets"]),
        ["regcred", "other"]
    );
}

#[test]
fn app_containers_get_env_and_mounts_without_overwriting() {
    let pod = pod(r#"
metadata: {name: p}
spec:
  containers:
  - name: app
    image: a
    env: [{name: KEEP, value: pod}]
    volumeMounts: [{name: data, mountPath: /data}]
  - name: worker
    image: w
  - name: other
    image: o
"#);
    let t = template(
        r#"
metadata: {name: t}
spec:
  appContainers:
    names: [app, worker, missing]
    env: [{name: KEEP, value: template}, {name: NEW, value: "{{ pod.name }}"}]
    envFrom: [{configMapRef: {name: cfg}}]
    volumeMounts: [{name: data2, mountPath: /data}, {name: certs, mountPath: /certs}]
"#,
    );
    let plan = plan_in(&pod, &[t]);
    let out = apply(&pod, &plan);
    let app = &out["spec"]["containers"][0];
    assert_eq!(
        app["env"],
        json!([{"name": "KEEP", "value": "pod"}, {"name": "NEW", "value": "p"}])
    );
    assert_eq!(app["volumeMounts"][0]["name"], "data");
    assert_eq!(app["volumeMounts"][1]["mountPath"], "/certs");
    assert_eq!(app["envFrom"], json!([{"configMapRef": {"name": "cfg"}}]));
    let worker = &out["spec"]["containers"][1];
    assert_eq!(names(&worker["env"]), ["KEEP", "NEW"]);
    assert_eq!(out["spec"]["containers"][2].get("env"), None, "not named");
    assert_eq!(plan.warnings.len(), 2, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0]
            .to_string()
            .contains("env \"KEEP\" of container \"app\" not added")
    );
    assert!(
        plan.warnings[1]
            .to_string()
            .contains("volume mount at \"/data\"")
    );
}

#[test]
fn app_containers_without_names_means_every_own_container_not_injected_ones() {
    let pod = pod(APP_POD);
    let sidecar = template(SIDECAR);
    let env = template(
        "metadata: {name: env}\nspec:\n  priority: 200\n  appContainers:\n    env: [{name: A, value: b}]",
    );
    let out = apply(&pod, &plan_in(&pod, &[sidecar, env]));
    assert_eq!(names(&out["spec"]["containers"][0]["env"]), ["A"]);
    assert_eq!(out["spec"]["containers"][1].get("env"), None);
}

#[test]
fn metadata_keys_are_escaped_and_existing_keys_kept() {
    let mut pod = pod(APP_POD);
    pod["metadata"]["annotations"] = json!({"keep": "pod"});
    let t = template(
        r#"
metadata: {name: t}
spec:
  metadata:
    labels: {"example.com/injected-by": t, app: other}
    annotations: {"example.com/a.b": x, keep: template}
"#,
    );
    let plan = plan_in(&pod, &[t]);
    let patch = serde_json::to_value(&plan.patch).unwrap();
    let paths: Vec<&str> = patch
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"/metadata/labels/example.com~1injected-by"),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"/metadata/annotations/example.com~1a.b"),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"/metadata/annotations/sidecar.dev~1injected"),
        "{paths:?}"
    );
    let out = apply(&pod, &plan);
    assert_eq!(out["metadata"]["labels"]["app"], "web");
    assert_eq!(out["metadata"]["labels"]["example.com/injected-by"], "t");
    assert_eq!(out["metadata"]["annotations"]["keep"], "pod");
    assert_eq!(out["metadata"]["annotations"]["example.com/a.b"], "x");
    assert_eq!(plan.warnings.len(), 2, "{:?}", plan.warnings);
}

#[test]
fn a_key_two_templates_add_keeps_the_first_value() {
    let pod = pod(APP_POD);
    let first = template(
        r#"
metadata: {name: first}
spec:
  priority: 1
  metadata:
    labels: {tier: gold, zone: a}
    annotations: {note: one}
"#,
    );
    let second = template(
        r#"
metadata: {name: second}
spec:
  priority: 2
  metadata:
    labels: {zone: b, tier: gold, rack: r1}
    annotations: {note: two}
"#,
    );
    let plan = plan_in(&pod, &[first, second]);
    // A different value is a warning naming the template that set it; the same one is not.
    assert_eq!(
        texts(&plan.warnings),
        [
            r#"SidecarTemplate "second": label "zone" is already set by SidecarTemplate "first"; kept that value"#,
            r#"SidecarTemplate "second": annotation "note" is already set by SidecarTemplate "first"; kept that value"#,
        ]
    );
    let out = apply(&pod, &plan);
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "web", "tier": "gold", "zone": "a", "rack": "r1"})
    );
    assert_eq!(out["metadata"]["annotations"]["note"], "one");
    // Each key is added once, in the order templates added them.
    let patch = serde_json::to_value(&plan.patch).unwrap();
    let added: Vec<&str> = patch
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|op| op["path"].as_str()?.strip_prefix("/metadata/labels/"))
        .collect();
    assert_eq!(added, ["tier", "zone", "rack"]);
}

#[test]
fn many_keys_added_are_checked_as_a_few() {
    // Past a few keys, those added are found through a hash map: the same answers.
    let pod = pod(APP_POD);
    let labels = |value: &str| {
        (0..40)
            .map(|n| format!("k{n}: {value}{}", n % 2))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = template(&format!(
        "metadata: {{name: first}}\nspec:\n  priority: 1\n  metadata: {{labels: {{{}}}}}",
        labels("v")
    ));
    // The same values for even keys, others for odd ones.
    let second = template(&format!(
        "metadata: {{name: second}}\nspec:\n  priority: 2\n  metadata: {{labels: {{{}}}}}",
        (0..40)
            .map(|n| format!("k{n}: {}", if n % 2 == 0 { "v0" } else { "x" }))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let plan = plan_in(&pod, &[first, second]);
    assert_eq!(plan.warnings.len(), 20, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0]
            .to_string()
            .contains(r#"label "k1" is already set by SidecarTemplate "first""#)
    );
    let out = apply(&pod, &plan);
    let labels = out["metadata"]["labels"].as_object().unwrap();
    assert_eq!(labels.len(), 41);
    assert_eq!(labels["k39"], "v1");
    assert_eq!(labels["k38"], "v0");
}

#[test]
fn the_record_carries_a_fingerprint_of_what_was_injected() {
    let pod = pod(APP_POD);
    let v1 = template(SIDECAR);
    let out = apply(&pod, &plan_in(&pod, std::slice::from_ref(&v1)));
    let entry = format!("logger@3#{}", v1.fingerprint);
    assert_eq!(
        out["metadata"]["annotations"]["sidecar.dev/injected"],
        entry
    );

    // Not what selects or orders it, only what it injects.
    let reordered = template(
        &SIDECAR
            .replace(
                "generation: 3",
                "generation: 4
  ",
            )
            .replace(
                "spec:",
                "spec:
  priority: 7",
            ),
    );
    assert_eq!(reordered.fingerprint, v1.fingerprint);
    let reimaged = template(&SIDECAR.replace("fluent-bit:3", "fluent-bit:4"));
    assert!(reimaged.fingerprint.only_images_differ(&v1.fingerprint));
}

#[test]
fn missing_metadata_maps_are_created() {
    let pod = pod("spec:\n  containers: [{name: app, image: a}]");
    let t = template("metadata: {name: t}\nspec:\n  metadata: {labels: {a: b}}");
    let out = apply(&pod, &plan_in(&pod, &[t]));
    assert_eq!(out["metadata"]["labels"], json!({"a": "b"}));
    assert_eq!(record(&out), "t@1");
    assert_eq!(out["metadata"]["annotations"].as_object().unwrap().len(), 1);
}

#[test]
fn placeholders_draw_from_the_pod() {
    let pod = pod(r#"
metadata:
  generateName: web-7d9f-
  labels: {app: web}
  annotations: {team: payments}
spec:
  containers: [{name: app, image: a}]
"#);
    let t = template(
        r#"
metadata: {name: t}
spec:
  containers:
  - name: agent
    image: agent
    args: ["--id={{ pod.namespace }}/{{ pod.name }}", "--sa={{ pod.serviceAccountName }}", "--app={{ pod.labels['app'] }}"]
    env: [{name: TEAM, value: "{{ pod.annotations['team'] }}"}]
  metadata:
    labels: {owner: "{{ pod.annotations['team'] }}", bad: "{{ pod.namespace }}/x"}
"#,
    );
    let plan = plan(
        &pod,
        &NamespaceInfo {
            name: "shop",
            labels: None,
        },
        &[t],
    )
    .unwrap()
    .into_owned();
    let out = apply(&pod, &plan);
    assert_eq!(
        out["spec"]["containers"][1]["args"],
        json!(["--id=shop/web-7d9f-", "--sa=default", "--app=web",])
    );
    assert_eq!(
        out["spec"]["containers"][1]["env"],
        json!([{"name": "TEAM", "value": "payments"}])
    );
    assert_eq!(out["metadata"]["labels"]["owner"], "payments");
    assert_eq!(out["metadata"]["labels"].get("bad"), None);
    assert!(
        plan.warnings[0]
            .to_string()
            .contains("\"shop/x\" is not a valid label value"),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn malformed_pods_are_errors_not_panics() {
    let ns = NamespaceInfo {
        name: "default",
        labels: None,
    };
    for bad in [
        json!(null),
        json!([]),
        json!({}),
        json!({"spec": {}}),
        json!({"spec": {"containers": 3}}),
        json!({"spec": {"containers": [1]}}),
        json!({"metadata": 1, "spec": {"containers": []}}),
        json!({"spec": {"containers": [], "volumes": {}}}),
    ] {
        let error = plan(&bad, &ns, &[template(SIDECAR)]).unwrap_err();
        assert!(error.to_string().starts_with("not a valid Pod"), "{error}");
    }
}

#[test]
fn a_pod_with_thousands_of_env_vars_is_planned_correctly() {
    let env: Vec<_> = (0..3000)
        .map(|i| json!({"name": format!("VAR_{i}"), "value": "x"}))
        .collect();
    let pod = json!({"metadata": {"name": "big"}, "spec": {"containers": [{"name": "app", "image": "a", "env": env}]}});
    let t = template(
        "metadata: {name: t}\nspec:\n  appContainers:\n    env: [{name: VAR_2999, value: w}, {name: EXTRA, value: z}]",
    );
    let plan = plan_in(&pod, &[t]);
    let out = apply(&pod, &plan);
    assert_eq!(
        out["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .len(),
        3001
    );
    assert_eq!(plan.warnings.len(), 1);
}

#[test]
fn a_template_may_select_on_what_another_adds_and_replanning_stays_empty() {
    let pod = pod(APP_POD);
    // "logging" sorts first but selects on a label "mesh" adds, and so does "proxy".
    let logging = template(
        "metadata: {name: a-logging}\nspec:\n  podSelector: {matchLabels: {mesh: enabled}}\n  containers: [{name: log, image: l}]",
    );
    let proxy = template(
        "metadata: {name: proxy}\nspec:\n  podSelector: {matchLabels: {mesh: enabled}}\n  containers: [{name: proxy, image: p}]",
    );
    let mesh = template("metadata: {name: mesh}\nspec:\n  metadata:\n    labels: {mesh: enabled}");
    let templates = [logging, proxy, mesh];
    let plan = plan_in(&pod, &templates);
    let applied: Vec<&str> = plan.applied.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        applied,
        ["mesh", "proxy", "a-logging"],
        "passes in (priority, name) order"
    );
    let out = apply(&pod, &plan);
    assert_eq!(names(&out["spec"]["containers"]), ["app", "proxy", "log"]);
    assert!(plan_in(&out, &templates).patch.is_empty());
}

#[test]
fn a_name_given_twice_counts_once_and_the_newest_generation_wins() {
    let pod = pod(APP_POD);
    let old = template(
        "metadata: {name: t, generation: 1}\nspec:\n  priority: 1\n  containers: [{name: old, image: old}]",
    );
    let new = template(
        "metadata: {name: t, generation: 2}\nspec:\n  priority: 9\n  containers: [{name: new, image: new}]",
    );
    for templates in [[old.clone(), new.clone()], [new.clone(), old.clone()]] {
        let out = apply(&pod, &plan_in(&pod, &templates));
        assert_eq!(names(&out["spec"]["containers"]), ["app", "new"]);
        assert_eq!(record(&out), "t@2");
    }
}

#[test]
fn a_placeholder_reading_what_a_template_adds_renders_it_and_replanning_stays_empty() {
    let pod = pod(APP_POD);
    // "a-mesh" applies first and reads an annotation "z-version" (applied later) adds.
    let mesh = template(
        "metadata: {name: a-mesh}\nspec:\n  containers: [{name: proxy, image: p, env: [{name: V, value: \"{{ pod.annotations['mesh/version'] }}\"}]}]",
    );
    let version = template(
        "metadata: {name: z-version}\nspec:\n  metadata:\n    annotations: {mesh/version: \"1.2\"}",
    );
    let templates = [mesh, version];
    let plan = plan_in(&pod, &templates);
    let out = apply(&pod, &plan);
    assert_eq!(out["spec"]["containers"][1]["env"][0]["value"], "1.2");
    let again = plan_in(&out, &templates);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
    assert!(again.denials.is_empty() && again.warnings.is_empty());
}

#[test]
fn app_containers_never_reach_injected_containers_on_replanning() {
    let pod = pod(APP_POD);
    let env = template(
        "metadata: {name: a-env}\nspec:\n  appContainers:\n    env: [{name: REGION, value: eu}]",
    );
    let sidecar =
        template("metadata: {name: b-sidecar}\nspec:\n  containers: [{name: sidecar, image: s}]");
    let templates = [env, sidecar];
    let out = apply(&pod, &plan_in(&pod, &templates));
    assert_eq!(out["spec"]["containers"][1].get("env"), None);
    let again = plan_in(&out, &templates);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
}

/// Where the ServiceAccount admission plugin mounts the token.
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount admission plugin's `mountServiceAccountToken`
/// (k8s.io/kubernetes plugin/pkg/admission/serviceaccount/admission.go), as the API server
/// runs it again after a mutation, for a Pod that has its volume already (the only case this
/// models: a new volume's name is random): the first volume named `kube-api-access-*`, mounted
/// read-only at the token's path into every init container and container without a mount
/// there, appended. Nothing when the Pod turns the token off. Whether it changed the Pod.
fn service_account_plugin(pod: &mut Value) -> bool {
    if pod["spec"]["automountServiceAccountToken"] == json!(false) {
        return false;
    }
    let Some(volume) = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .find(|name| name.starts_with("kube-api-access-"))
    else {
        return false;
    };
    let mount = json!({"name": volume, "readOnly": true, "mountPath": TOKEN_PATH});
    let mut changed = false;
    for list in ["initContainers", "containers"] {
        for container in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let mounted = container["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"] == TOKEN_PATH);
            if !mounted {
                let c = container.as_object_mut().unwrap();
                let mounts = c.entry("volumeMounts").or_insert(json!([]));
                mounts.as_array_mut().unwrap().push(mount.clone());
                changed = true;
            }
        }
    }
    changed
}

/// A Pod as the webhook first sees it: the ServiceAccount plugin ran before it, so its token
/// volume is there and mounted into the Pod's own containers.
fn pod_with_token() -> Value {
    let mut pod = pod(APP_POD);
    pod["spec"]["initContainers"] = json!([{"name": "setup", "image": "busybox"}]);
    pod["spec"]["volumes"] = json!([
        {"name": "data", "emptyDir": {}},
        {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]}},
    ]);
    assert!(service_account_plugin(&mut pod));
    pod
}

/// Containers with and without mounts, one mounting its own volume at the token's path, a
/// native sidecar and a plain init container.
const TOKEN_TEMPLATES: [&str; 2] = [
    r#"
metadata: {name: mesh}
spec:
  priority: 1
  initContainers:
  - {name: proxy, image: proxy:1, restartPolicy: Always}
  - name: fetch
    image: fetch:1
    volumeMounts: [{name: certs, mountPath: /certs}]
  containers:
  - name: agent
    image: agent:1
    args: ["--pod", "{{ pod.name }}"]
    env: [{name: APP, value: "{{ pod.labels['app'] }}"}]
    volumeMounts: [{name: certs, mountPath: /certs}]
  - {name: bare, image: bare:1, workingDir: "/srv/{{ pod.namespace }}"}
  volumes:
  - {name: certs, emptyDir: {}}
"#,
    r#"
metadata: {name: own-token}
spec:
  priority: 2
  containers:
  - name: tokened
    image: t:1
    volumeMounts: [{name: other-token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]
  volumes:
  - {name: other-token, emptyDir: {}}
"#,
];

#[test]
fn injected_containers_carry_the_token_mount_so_the_plugin_changes_nothing() {
    let pod = pod_with_token();
    let templates = TOKEN_TEMPLATES.map(template);
    let plan = plan_in(&pod, &templates);
    // Each mount is part of its container's value: no operation of its own for the API
    // server to apply.
    assert!(
        plan.patch
            .0
            .iter()
            .all(|op| !op.path.as_str().contains("/volumeMounts")),
        "{:?}",
        plan.patch
    );
    let mut out = apply(&pod, &plan);
    let token = json!({"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": TOKEN_PATH});
    let mounts = |list: &str, name: &str| -> Vec<Value> {
        let container = out["spec"][list]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap();
        container["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let certs = json!({"name": "certs", "mountPath": "/certs"});
    assert_eq!(
        mounts("initContainers", "proxy"),
        std::slice::from_ref(&token)
    );
    assert_eq!(
        mounts("initContainers", "fetch"),
        [certs.clone(), token.clone()]
    );
    assert_eq!(mounts("containers", "agent"), [certs, token.clone()]);
    assert_eq!(mounts("containers", "bare"), [token]);
    // Containers with placeholders keep their rendered strings beside the mount.
    let container = |name: &str| -> Value {
        out["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(container("agent")["args"], json!(["--pod", "web-1"]));
    assert_eq!(
        container("agent")["env"],
        json!([{"name": "APP", "value": "web"}])
    );
    assert_eq!(container("bare")["workingDir"], "/srv/shop");
    // A mount of its own at the token's path keeps the plugin away: nothing is added.
    assert_eq!(
        mounts("containers", "tokened"),
        [json!({"name": "other-token", "mountPath": TOKEN_PATH})]
    );
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["proxy", "fetch", "setup"]
    );

    // The API server runs the plugin again after the patch: it finds nothing to add, so the
    // webhook is not called again. Were it called, it would answer "unchanged".
    assert!(!service_account_plugin(&mut out), "{out:#}");
    assert_adds_nothing(&plan_in(&out, &templates));
}

#[test]
fn the_token_mount_lands_on_containers_added_where_lists_are_created() {
    // No init containers of the Pod's own: the list is created, indices start at 0.
    let mut pod = pod(APP_POD);
    pod["spec"]["volumes"] = json!([{"name": "kube-api-access-abcde", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}},
    ]}}]);
    assert!(service_account_plugin(&mut pod));
    let templates = [template(TOKEN_TEMPLATES[0])];
    let mut out = apply(&pod, &plan_in(&pod, &templates));
    assert!(!service_account_plugin(&mut out), "{out:#}");
    assert_eq!(names(&out["spec"]["initContainers"]), ["proxy", "fetch"]);
}

#[test]
fn without_the_plugins_token_volume_no_mount_is_added() {
    let templates = TOKEN_TEMPLATES.map(template);
    let mounted = |pod: &Value| {
        let out = apply(pod, &plan_in(pod, &templates));
        ["initContainers", "containers"].iter().any(|list| {
            out["spec"][list].as_array().unwrap().iter().any(|c| {
                c["name"] != "app"
                    && c["name"] != "setup"
                    && c["name"] != "tokened"
                    && c["volumeMounts"].to_string().contains("kube-api-access")
            })
        })
    };
    // No token volume: the ServiceAccount or the Pod turned the token off.
    assert!(!mounted(&pod(APP_POD)));
    // The Pod turns it off and carries a token volume of its own: the plugin mounts nothing.
    let mut off = pod_with_token();
    off["spec"]["automountServiceAccountToken"] = json!(false);
    assert!(!mounted(&off));
    assert!(!service_account_plugin(&mut apply(
        &off,
        &plan_in(&off, &templates)
    )));
    // The first volume named like the token's is no token: the plugin would mount that one,
    // which is no token mount; left to the plugin (and to the webhook's comparison).
    let mut look_alike = pod_with_token();
    look_alike["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"name": "kube-api-access-0", "emptyDir": {}}));
    assert!(!mounted(&look_alike));
}

/// The warnings' texts, as kubectl prints them.
fn texts(warnings: &[injector_core::rules::warning::Warning]) -> Vec<String> {
    warnings.iter().map(ToString::to_string).collect()
}
