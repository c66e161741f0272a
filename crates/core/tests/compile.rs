//! Template validation: every problem is reported, each with its field path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::parse_template;
use injector_core::compile;

/// `found` holds exactly one message starting with each of `expected`.
fn assert_exactly(found: &[String], expected: &[impl AsRef<str>]) {
    for want in expected {
        let want = want.as_ref();
        assert!(
            found.iter().any(|f| f.starts_with(want)),
            "missing {want:?} in\n{found:#?}"
        );
    }
    assert_eq!(found.len(), expected.len(), "{found:#?}");
}

fn errors(yaml: &str) -> Vec<String> {
    compile(&parse_template(yaml))
        .map(|_| Vec::new())
        .unwrap_or_else(|e| e.messages())
}

#[test]
fn a_valid_template_compiles_with_defaults() {
    let t = compile(&parse_template(
        "metadata: {name: ok}\nspec:\n  containers: [{name: c, image: i}]",
    ))
    .unwrap();
    assert_eq!(t.priority, 100);
    assert_eq!(t.injection, injector_api::Injection::Automatic);
    assert_eq!(t.failure_policy, injector_api::FailurePolicy::Fail);
    assert_eq!(t.generation, 1, "a file's template has no generation");
    assert!(t.namespace_selector.is_empty() && t.pod_selector.is_empty());
}

#[test]
fn every_error_is_reported_with_its_path() {
    let found = errors(
        r#"
metadata: {name: Bad_Name}
spec:
  podSelector: {matchExpressions: [{key: app, operator: Near}]}
  containers:
  - {name: proxy, image: envoy}
  - {name: proxy, image: envoy}
  - {name: Upper, image: x}
  - {name: noimage}
  - {name: restart, image: x, restartPolicy: Always}
  initContainers:
  - {name: proxy, image: envoy}
  - {name: init, image: x, restartPolicy: OnFailure}
  volumes: [{name: v, emptyDir: {}}, {name: v, emptyDir: {}}]
  imagePullSecrets: [{name: s}, {name: s}]
  appContainers:
    names: [App]
    env: [{name: A, value: "{{ pod.uid }}"}, {name: A, value: x}, {name: ""}]
    volumeMounts: [{name: v, mountPath: /x}, {name: v, mountPath: /x}, {name: "", mountPath: ""}]
  metadata:
    labels: {"bad key": x, ok: "bad value!", tmpl: "{{ pod.name"}
    annotations: {"sidecar.dev/injected": x}
"#,
    );
    let expected = [
        "metadata.name: \"Bad_Name\" is not a DNS-1123 subdomain",
        "spec.podSelector.matchExpressions[0].operator: unknown operator \"Near\"",
        "spec.containers[1].name: duplicate container name \"proxy\"",
        "spec.containers[2].name: \"Upper\" is not a DNS-1123 label",
        "spec.containers[3].image: is required",
        "spec.containers[4].restartPolicy: is only allowed on initContainers",
        "spec.initContainers[0].name: duplicate container name \"proxy\"",
        "spec.initContainers[1].restartPolicy: \"OnFailure\" is not allowed",
        "spec.volumes[1].name: duplicate volume name \"v\"",
        "spec.imagePullSecrets[1].name: duplicate image pull secret \"s\"",
        "spec.appContainers.names[0]: \"App\" is not a valid container name",
        "spec.appContainers.env[0].value: unknown placeholder {{ pod.uid }}",
        "spec.appContainers.env[1].name: duplicate env name \"A\"",
        "spec.appContainers.env[2].name: is required",
        "spec.appContainers.volumeMounts[1].mountPath: duplicate mount path \"/x\"",
        "spec.appContainers.volumeMounts[2].name: is required",
        "spec.appContainers.volumeMounts[2].mountPath: is required",
        "spec.metadata.labels[\"bad key\"]: \"bad key\" is not a valid key",
        "spec.metadata.labels[\"ok\"]: \"bad value!\" is not a valid label value",
        "spec.metadata.labels[\"tmpl\"]: unterminated placeholder",
        "spec.metadata.annotations[\"sidecar.dev/injected\"]: \"sidecar.dev/injected\" is reserved",
    ];
    assert_exactly(&found, &expected);
}

#[test]
fn an_empty_template_is_invalid() {
    let found = errors("metadata: {name: empty}\nspec: {appContainers: {names: [app]}}");
    assert_eq!(
        found,
        [
            "spec: injects nothing: set containers, initContainers, volumes, imagePullSecrets, appContainers or metadata"
        ]
    );
}

#[test]
fn a_missing_name_is_reported() {
    assert_eq!(
        errors("metadata: {}\nspec:\n  containers: [{name: c, image: i}]"),
        ["metadata.name: is required"]
    );
}

#[test]
fn placeholders_are_checked_everywhere() {
    let found = errors(
        r#"
metadata: {name: t}
spec:
  containers: [{name: c, image: "repo/{{ pod.image }}", args: ["{{ pod.name }}", "{{ nope }}"]}]
  volumes: [{name: v, configMap: {name: "{{ pod.labels['app'] }}-{{ pod.labels[app] }}"}}]
"#,
    );
    assert_eq!(found.len(), 3, "{found:#?}");
    for want in [
        "spec.containers[0].image: unknown placeholder {{ pod.image }}",
        "spec.containers[0].args[1]: unknown placeholder {{ nope }}",
        "spec.volumes[0].configMap.name: unknown placeholder {{ pod.labels[app] }}",
    ] {
        assert!(
            found.iter().any(|f| f.starts_with(want)),
            "missing {want:?} in\n{found:#?}"
        );
    }
}

#[test]
fn templates_cannot_add_the_injectors_own_keys() {
    let found = errors(
        r#"
metadata: {name: t}
spec:
  metadata:
    labels: {"sidecar.dev/injection": disabled, "security.sidecar.dev/agent": "on"}
    annotations: {"sidecar.dev/inject": "false", "sidecar.dev/templates": other, "sidecar.dev/anything": x}
"#,
    );
    let expected = [
        "spec.metadata.labels[\"sidecar.dev/injection\"]: \"sidecar.dev/injection\" is reserved",
        "spec.metadata.annotations[\"sidecar.dev/inject\"]: \"sidecar.dev/inject\" is reserved",
        "spec.metadata.annotations[\"sidecar.dev/templates\"]: \"sidecar.dev/templates\" is reserved",
        "spec.metadata.annotations[\"sidecar.dev/anything\"]: \"sidecar.dev/anything\" is reserved",
    ];
    assert_exactly(&found, &expected);
}

#[test]
fn a_pod_author_cannot_choose_what_runs_in_a_sidecar() {
    let found = errors(
        r#"
metadata: {name: t}
spec:
  containers:
  - name: c
    image: "agent:{{ pod.labels['version'] }}"
    command: ["/agent", "{{ pod.name }}"]
    args: ["--id={{ pod.name }}", "--app={{ pod.labels['app'] }}", "--note={{ pod.annotations['note'] }}"]
    env:
    - {name: NOTE, value: "{{ pod.annotations['note'] }}"}
    - {name: KEY, valueFrom: {secretKeyRef: {name: "{{ pod.name }}", key: k}}}
    securityContext: {runAsUser: 0, seLinuxOptions: {type: "{{ pod.labels['t'] }}"}}
    lifecycle: {preStop: {exec: {command: ["sh", "-c", "{{ pod.name }}"]}}}
    livenessProbe: {exec: {command: ["{{ pod.namespace }}"]}}
    readinessProbe: {httpGet: {path: "/{{ pod.name }}", port: 80, httpHeaders: [{name: X, value: "{{ pod.annotations['h'] }}"}]}}
    workingDir: "/work/{{ pod.namespace }}"
  volumes: [{name: v, configMap: {name: "{{ pod.name }}-config"}}]
  appContainers:
    env: [{name: A, value: "{{ pod.annotations['a'] }}"}, {name: B, valueFrom: {configMapKeyRef: {name: "{{ pod.name }}", key: b}}}]
    envFrom: [{prefix: "{{ pod.annotations['p'] }}", configMapRef: {name: "{{ pod.name }}"}}]
    volumeMounts: [{name: v, mountPath: "/data/{{ pod.annotations['d'] }}"}]
  metadata:
    labels: {owner: "{{ pod.annotations['team'] }}"}
    annotations: {copy: "{{ pod.annotations['sidecar.dev/injected'] }}", note: "{{ pod.annotations['note'] }}"}
"#,
    );
    let fixed = "placeholders are not allowed here";
    let annotations = "pod.annotations[...] is not allowed here";
    let expected = [
        ("spec.containers[0].image", fixed),
        ("spec.containers[0].command[1]", fixed),
        ("spec.containers[0].args[2]", annotations),
        (
            "spec.containers[0].env[1].valueFrom.secretKeyRef.name",
            fixed,
        ),
        (
            "spec.containers[0].securityContext.seLinuxOptions.type",
            fixed,
        ),
        (
            "spec.containers[0].lifecycle.preStop.exec.command[2]",
            fixed,
        ),
        ("spec.containers[0].livenessProbe.exec.command[0]", fixed),
        (
            "spec.containers[0].readinessProbe.httpGet.httpHeaders[0].value",
            annotations,
        ),
        ("spec.volumes[0].configMap.name", fixed),
        (
            "spec.appContainers.env[1].valueFrom.configMapKeyRef.name",
            fixed,
        ),
        ("spec.appContainers.envFrom[0].prefix", annotations),
        ("spec.appContainers.volumeMounts[0].mountPath", annotations),
        (
            "spec.metadata.annotations[\"copy\"]",
            "a placeholder cannot read \"sidecar.dev/injected\"",
        ),
    ];
    let expected: Vec<String> = expected
        .iter()
        .map(|(path, message)| format!("{path}: {message}"))
        .collect();
    assert_exactly(&found, &expected);
}

#[test]
fn a_pod_author_cannot_choose_a_sidecars_env_names_mounts_or_resources() {
    let found = errors(
        r#"
metadata: {name: t}
spec:
  containers:
  - name: c
    image: agent:1
    env: [{name: "{{ pod.labels['k'] }}", value: x}]
    volumeMounts: [{name: "{{ pod.labels['v'] }}", mountPath: /data}]
    resources: {limits: {cpu: "{{ pod.labels['cpu'] }}"}}
    envFrom: [{configMapRef: {name: "{{ pod.name }}"}}]
    readinessProbe: {tcpSocket: {port: 80, host: "{{ pod.labels['h'] }}"}}
"#,
    );
    let expected = [
        "spec.containers[0].env[0].name",
        "spec.containers[0].volumeMounts[0].name",
        "spec.containers[0].resources.limits.cpu",
        "spec.containers[0].envFrom[0].configMapRef.name",
        "spec.containers[0].readinessProbe.tcpSocket.host",
    ];
    let expected: Vec<String> = expected
        .iter()
        .map(|path| format!("{path}: placeholders are not allowed here"))
        .collect();
    assert_exactly(&found, &expected);
}
