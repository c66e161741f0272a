//! The policy backend against the webhook backend, on a real API server that serves
//! MutatingAdmissionPolicies (Kubernetes 1.36+: `just e2e-next` runs it on v1.37.2).
//!
//! Templates that interact (priorities, a best-effort template taking a required one's
//! container name first, a native sidecar before the Pod's own init containers,
//! env into app containers, a label one template adds and another selects on, placeholders,
//! `OnRequest`, the opt-out, a namespace selector) are compiled by `sidecar-injector policy`
//! and the policy is applied. Then, for generated Pods and the real ones of the Kubernetes
//! project's examples (`fixtures/kubernetes-examples-pods.json`), in two namespaces, the Pod
//! the API server stores through the policy (a server-side dry run) must equal the Pod `plan`
//! produces (the webhook's patch applied to it), stored the same way in a namespace the policy
//! does not serve, so that both get the API server's defaults. Then the operator runs
//! its own `auto` backend (its policy, and webhook entries that skip what the policy served),
//! and the same Pods must be stored as the webhook alone stored them, some without a webhook
//! call. A difference is a bug in one of them; the test lists every one.
//!
//! Off unless `SIDECAR_INJECTOR_E2E=1`; on an API server older than 1.36 it says so and does
//! nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use injector_e2e::bench::counter;
use injector_e2e::harness;
use injector_e2e::pod::{TOKEN_VOLUME_PREFIX, without_token_mount};
use injector_e2e::steps::{CONFIGURATION, install_crd, wait_condition, wait_served};
use injector_e2e::{Backend, ControlPlane, Operator, OperatorOptions, operator_binary, poll};
use serde_json::{Map, Value, json};

const TEMPLATES: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: agent}
spec:
  priority: 10
  podSelector:
    matchExpressions: [{key: tier, operator: NotIn, values: [system]}]
  containers:
  - name: agent
    image: "agent.invalid/agent:2"
    args: ["--pod", "{{ pod.namespace }}/{{ pod.name }}", "--sa", "{{ pod.serviceAccountName }}"]
    env:
    - {name: TEAM, value: "{{ pod.annotations['team'] }}"}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    ports: [{containerPort: 9100, name: metrics}]
    resources: {limits: {memory: 64Mi}, requests: {cpu: 10m}}
  imagePullSecrets: [{name: agent-pull}]
  metadata:
    labels: {agent.example/injected: "true"}
    annotations: {agent.example/team: "{{ pod.annotations['team'] }}"}
---
# Applied right after agent, reading and writing nothing agent writes: the two share one
# mutation of the policy (its containers land after agent's, the maps and the record once).
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: logs}
spec:
  priority: 12
  failurePolicy: Ignore
  podSelector:
    matchExpressions: [{key: app, operator: In, values: [web, batch]}]
  containers:
  - name: logs
    image: "logs.invalid/logs:1"
    args: ["--app", "{{ pod.labels['app'] }}"]
    volumeMounts: [{name: logs-buffer, mountPath: /buffer}]
  volumes:
  - {name: logs-buffer, emptyDir: {}}
  metadata:
    labels: {logs.example/collected: "true"}
    annotations: {logs.example/app: "{{ pod.labels['app'] }}"}
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: agent-lite}
spec:
  priority: 8
  failurePolicy: Ignore
  podSelector: {matchLabels: {tier: frontend}}
  containers: [{name: agent, image: "agent.invalid/lite:1"}]
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: proxy}
spec:
  priority: 20
  failurePolicy: Ignore
  podSelector:
    matchExpressions: [{key: app, operator: In, values: [web, api]}]
  initContainers:
  - name: proxy
    image: "proxy.invalid/proxy:1"
    restartPolicy: Always
    args: ["--cluster", "{{ pod.labels['app'] }}"]
    volumeMounts: [{name: proxy-certs, mountPath: /certs}]
    readinessProbe: {httpGet: {path: /ready, port: 15000}}
  volumes:
  - {name: proxy-certs, emptyDir: {}}
  appContainers:
    names: [app]
    env: [{name: HTTP_PROXY, value: "http://127.0.0.1:15001"}]
    volumeMounts: [{name: proxy-certs, mountPath: /proxy-certs, readOnly: true}]
  metadata:
    labels:
      mesh: "on"
      note: "{{ pod.annotations['note'] }}"
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: meshed}
spec:
  priority: 30
  failurePolicy: Ignore
  podSelector: {matchLabels: {mesh: "on"}}
  containers: [{name: meshed, image: "meshed.invalid/meshed:1", args: ["{{ pod.labels['mesh'] }}"]}]
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: setup}
spec:
  priority: 5
  injection: OnRequest
  initContainers: [{name: setup-certs, image: "setup.invalid/setup:1", command: [/bin/setup]}]
  volumes:
  - {name: setup-config, configMap: {name: setup-config}}
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: tracing}
spec:
  priority: 40
  failurePolicy: Ignore
  namespaceSelector: {matchLabels: {team: a}}
  appContainers:
    env:
    - {name: OTEL_SERVICE_NAME, value: "{{ pod.labels['app'] }}"}
    - {name: HTTP_PROXY, value: "http://tracing.invalid"}
  metadata:
    annotations: {tracing.example/enabled: "true"}
"#;

/// A small deterministic generator, so a failure names a Pod that can be made again.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.next(items.len() as u64) as usize]
    }
}

/// Pods generated with a random mix of what the templates look at.
const GENERATED: usize = 40;

/// The Pods of the Kubernetes project's examples (`kubernetes/examples`, Apache-2.0: every Pod,
/// and every workload's Pod template, with its labels and annotations): real Pods nobody here
/// wrote. Three in four are given an `app` label that some templates select.
fn real_pods() -> Vec<Value> {
    let entries: Vec<Value> =
        serde_json::from_str(include_str!("fixtures/kubernetes-examples-pods.json")).unwrap();
    entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let mut pod = entry["pod"].clone();
            pod["apiVersion"] = json!("v1");
            pod["kind"] = json!("Pod");
            pod["metadata"]["name"] = json!(format!("real-{index}"));
            if let Some(app) = ["web", "api", "batch"].get(index % 4) {
                pod["metadata"]["labels"]["app"] = json!(app);
            }
            pod
        })
        .collect()
}

/// A Pod with a random mix of what the templates look at.
fn generated_pod(index: usize, random: &mut Lcg) -> Value {
    let mut labels = Map::new();
    if let Some(app) = random.pick(&[Some("web"), Some("api"), Some("batch"), None]) {
        labels.insert("app".into(), json!(app));
    }
    if random.next(4) == 0 {
        labels.insert("mesh".into(), json!("off"));
    }
    if random.next(5) == 0 {
        labels.insert("tier".into(), json!(random.pick(&["system", "frontend"])));
    }
    let mut annotations = Map::new();
    if random.next(4) == 0 {
        annotations.insert(
            "sidecar.dev/inject".into(),
            json!(random.pick(&["false", " False "])),
        );
    }
    if random.next(2) == 0 {
        annotations.insert(
            "sidecar.dev/templates".into(),
            json!(random.pick(&["setup", "other, setup", "other"])),
        );
    }
    if random.next(2) == 0 {
        annotations.insert(
            "team".into(),
            json!(random.pick(&["payments", "a \"quoted\" {{ pod.name }} \\ team"])),
        );
    }
    if random.next(2) == 0 {
        annotations.insert(
            "note".into(),
            json!(random.pick(&["fine-value", "not a label value!"])),
        );
    }
    if random.next(5) == 0 {
        annotations.insert(
            "sidecar.dev/injected".into(),
            json!(random.pick(&["agent@0", "other@3#00, proxy@1"])),
        );
    }
    let mut app = json!({"name": "app", "image": "app.invalid/app:1"});
    if random.next(3) == 0 {
        app["env"] = json!([{"name": "HTTP_PROXY", "value": "mine"}]);
    }
    let data = random.next(2) == 0;
    if data && random.next(2) == 0 {
        app["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    }
    let mut containers = vec![app];
    if random.next(2) == 0 {
        containers.push(json!({"name": "worker", "image": "app.invalid/worker:1"}));
    }
    let mut spec = json!({"containers": containers});
    if random.next(2) == 0 {
        spec["initContainers"] = json!([{"name": "migrate", "image": "app.invalid/migrate:1"}]);
    }
    if data {
        spec["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    }
    if random.next(3) == 0 {
        spec["imagePullSecrets"] = json!([{"name": random.pick(&["agent-pull", "own-pull"])}]);
    }
    if random.next(3) == 0 {
        spec["serviceAccountName"] = json!("default");
    }
    let mut metadata = json!({"labels": labels});
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    if random.next(2) == 0 {
        metadata["generateName"] = json!(format!("gen-{index}-"));
    } else {
        metadata["name"] = json!(format!("pod-{index}"));
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// The JSON pointers at which `a` and `b` differ.
fn differences(a: &Value, b: &Value, at: String, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let next = format!("{at}/{key}");
                differences(
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                    next,
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, format!("{at}/{i}"), out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("{at}: {a}, the webhook's {b}")),
    }
}

/// The admission requests the operator's webhook answered so far.
fn webhook_calls(operator: &Operator) -> u64 {
    operator
        .metrics()
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("sidecar_injector_admission_requests_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn dry_run_create(cp: &ControlPlane, namespace: &str, pod: &Value) -> anyhow::Result<Value> {
    injector_e2e::pod::dry_run_create(cp, namespace, pod)?
        .map_err(|refusal| anyhow::anyhow!("kubectl create -n {namespace}: {refusal}"))
}

fn stored_view(pod: &Value, namespace: &str) -> Value {
    injector_e2e::pod::stored_view(pod, namespace).unwrap()
}

/// The policy and binding `sidecar-injector policy` compiles the templates in `file` to, as
/// YAML; every template must compile.
fn compile(binary: &std::path::Path, name: &str, file: &std::path::Path) -> String {
    let compiled = Command::new(binary)
        .args(["policy", "--name", name, "-t"])
        .arg(file)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&compiled.stderr);
    assert!(compiled.status.success(), "{report}");
    eprintln!("[policy] {}", report.trim().replace('\n', "; "));
    assert!(
        !report.contains("webhook only"),
        "every template compiles: {report}"
    );
    String::from_utf8_lossy(&compiled.stdout).into_owned()
}

/// A control plane serving MutatingAdmissionPolicies; `None` (said why) when the API server
/// serves none (before 1.36).
fn control_plane() -> Option<ControlPlane> {
    let cp = ControlPlane::start().expect("the control plane starts");
    if !cp.serves_mutating_admission_policies().unwrap() {
        eprintln!(
            "[policy] this API server serves no MutatingAdmissionPolicy (1.36+): nothing to test"
        );
        return None;
    }
    Some(cp)
}

fn main() -> ExitCode {
    harness::run_tests(
        "policy",
        &[
            (
                "the_policy_backend_stores_what_the_webhook_stores",
                the_policy_backend_stores_what_the_webhook_stores,
            ),
            (
                "a_newer_policy_leaves_what_an_older_version_injected_to_it",
                a_newer_policy_leaves_what_an_older_version_injected_to_it,
            ),
        ],
    )
}

fn the_policy_backend_stores_what_the_webhook_stores() {
    let Some(cp) = control_plane() else {
        return;
    };
    install_crd(&cp).unwrap();
    // The operator serves the webhook alone, so that the namespaces without the test's policy
    // show the webhook backend.
    let mut operator = Operator::start(
        &cp,
        OperatorOptions {
            extra_args: Backend::Webhook.args(),
            ..OperatorOptions::default()
        },
    )
    .expect("the operator starts");
    let binary = operator_binary().expect("the binary builds");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("policy-differential");
    std::fs::create_dir_all(&dir).unwrap();
    let templates = dir.join("templates.yaml");
    std::fs::write(&templates, TEMPLATES).unwrap();

    // The webhook backend: the templates as the operator serves them.
    cp.apply_file(&templates).unwrap();
    for name in ["agent", "logs", "proxy", "meshed", "setup", "tracing"] {
        wait_served(&cp, name, CONFIGURATION).unwrap();
    }

    // The policy backend: the same file compiled by `sidecar-injector policy`, applied to the
    // namespaces labelled `backend=policy` only, so that the others show the webhook alone.
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, compile(&binary, "differential", &templates)).unwrap();
    let documents = cp
        .kubectl_ok(&[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            policy_file.to_str().unwrap(),
        ])
        .unwrap();
    let mut documents: Vec<Value> = serde_json::Deserializer::from_str(&documents)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    documents[0]["spec"]["matchConstraints"]["namespaceSelector"] =
        json!({"matchLabels": {"backend": "policy"}});
    for document in &documents {
        cp.apply_yaml(&document.to_string()).unwrap();
    }

    let mut random = Lcg(0x5eed);
    let mut pods: Vec<Value> = (0..GENERATED)
        .map(|index| generated_pod(index, &mut random))
        .collect();
    pods.extend(real_pods());
    // The ServiceAccounts the real Pods name, made in every namespace below.
    let accounts: std::collections::BTreeSet<&str> = pods
        .iter()
        .flat_map(|pod| ["serviceAccountName", "serviceAccount"].map(|key| &pod["spec"][key]))
        .filter_map(Value::as_str)
        .filter(|name| !name.is_empty() && *name != "default")
        .collect();

    // Per team (`tracing` selects team a): the webhook alone, the policy alone (the webhook
    // skips namespaces labelled sidecar.dev/injection=disabled), and both, as installed.
    for team in ["a", "b"] {
        for (backend, labels) in [
            ("webhook", vec![format!("team={team}")]),
            (
                "policy",
                vec![
                    format!("team={team}"),
                    "backend=policy".into(),
                    "sidecar.dev/injection=disabled".into(),
                ],
            ),
            (
                "both",
                vec![format!("team={team}"), "backend=policy".into()],
            ),
        ] {
            let name = format!("{backend}-{team}");
            cp.kubectl_ok(&["create", "namespace", &name]).unwrap();
            let mut args = vec!["label".to_owned(), "namespace".into(), name.clone()];
            args.extend(labels);
            cp.kubectl_ok(&args).unwrap();
            cp.wait_for_service_account(&name).unwrap();
            for account in &accounts {
                cp.kubectl_ok(&["create", "serviceaccount", "-n", &name, account])
                    .unwrap();
            }
        }
    }
    // Both backends are in force once a Pod every template condition selects gets the agent.
    let probe = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "app", "image": "app.invalid/app:1"}]}});
    for namespace in ["webhook-a", "policy-a"] {
        poll(
            Duration::from_secs(30),
            &format!("injection in {namespace}"),
            || {
                let stored = dry_run_create(&cp, namespace, &probe)?;
                Ok(stored["spec"]["containers"]
                    .as_array()
                    .is_some_and(|c| c.len() == 2)
                    .then_some(()))
            },
        )
        .unwrap();
    }

    let mut failures = Vec::new();
    // What the webhook alone stored, per Pod compared: the baseline of the operator's own
    // policy backend below.
    let mut baseline: Vec<(usize, Value, Value)> = Vec::new();
    let mut denied = 0;
    let mut refused: Vec<(usize, Value)> = Vec::new();
    let mut applied: std::collections::BTreeMap<String, usize> = Default::default();
    let cases = pods.len();
    for (index, pod) in pods.into_iter().enumerate() {
        let team = ["a", "b"][index % 2];
        let through_webhook = dry_run_create(&cp, &format!("webhook-{team}"), &pod);
        if let Err(refusal) = &through_webhook
            && !refusal.to_string().contains("SidecarTemplate")
        {
            failures.push(format!(
                "Pod {index} refused, not for a template, so it tests nothing:\n    {pod}\n  {refusal}"
            ));
        }
        let Ok(through_webhook) = through_webhook else {
            // A required template the webhook denies (readably) is not the policy's to decide;
            // the auto backend, where the webhook stays behind the policy, must deny it too.
            denied += 1;
            refused.push((index, pod));
            continue;
        };
        let expected = stored_view(&through_webhook, &format!("webhook-{team}"));
        let record = expected["annotations"]["sidecar.dev/injected"]
            .as_str()
            .unwrap_or_default();
        for entry in record.split(',').filter(|e| !e.is_empty()) {
            let name = entry.split('@').next().unwrap_or_default();
            *applied.entry(name.to_owned()).or_default() += 1;
        }
        baseline.push((index, pod.clone(), expected.clone()));
        for backend in ["policy", "both"] {
            let stored = dry_run_create(&cp, &format!("{backend}-{team}"), &pod).unwrap();
            let mut diff = Vec::new();
            differences(
                &stored_view(&stored, &format!("{backend}-{team}")),
                &expected,
                String::new(),
                &mut diff,
            );
            if !diff.is_empty() {
                failures.push(format!(
                    "Pod {index} in {backend}-{team}:\n    {pod}\n  differs at\n    {}",
                    diff.join("\n    ")
                ));
            }
        }
    }
    eprintln!(
        "[policy] {cases} Pods, 2 comparisons each: {} different, {denied} Pods denied by the webhook; Pods per template: {applied:?}",
        failures.len()
    );

    // The operator's own policy backend (`auto`): its policy injects, and the webhook entries
    // skip the Pods it provably served. The same Pods must be stored as the webhook alone
    // stored them, and some must have been decided without a webhook call.
    for kind in ["mutatingadmissionpolicybinding", "mutatingadmissionpolicy"] {
        cp.kubectl_ok(&["delete", kind, "differential"]).unwrap();
    }
    operator.stop().unwrap();
    drop(operator);
    let operator = Operator::start(&cp, OperatorOptions::default()).expect("the operator starts");
    for name in ["agent", "agent-lite", "proxy", "meshed", "setup", "tracing"] {
        wait_condition(
            &cp,
            name,
            ("PolicyServed", "True", "Served"),
            Duration::from_secs(60),
        )
        .unwrap();
    }
    poll(
        Duration::from_secs(30),
        "the entries' skip conditions",
        || {
            let configuration = cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?;
            Ok(configuration
                .to_string()
                .contains("not-injected-by-policy")
                .then_some(()))
        },
    )
    .unwrap();
    let mut auto_failures = Vec::new();
    let (mut calls, mut without_call) = (0, 0);
    for (index, pod, expected) in &baseline {
        let team = ["a", "b"][index % 2];
        let namespace = format!("webhook-{team}");
        let before = webhook_calls(&operator);
        let stored = dry_run_create(&cp, &namespace, pod).unwrap();
        let made = webhook_calls(&operator) - before;
        calls += made;
        without_call += usize::from(made == 0);
        let mut diff = Vec::new();
        differences(
            &stored_view(&stored, &namespace),
            expected,
            String::new(),
            &mut diff,
        );
        if !diff.is_empty() {
            auto_failures.push(format!(
                "Pod {index} through the auto backend:\n    {pod}\n  differs at\n    {}",
                diff.join("\n    ")
            ));
        }
    }
    // The required agent cannot be injected where agent-lite (applied first) took its
    // container's name: the webhook alone denies those Pods, and so must the auto backend.
    // (The proof once learned agent's presence from agent-lite's container, and the entry
    // skipped those Pods: admitted without the required agent.)
    for (index, pod) in &refused {
        let team = ["a", "b"][index % 2];
        if let Ok(stored) = dry_run_create(&cp, &format!("webhook-{team}"), pod) {
            auto_failures.push(format!(
                "Pod {index}, denied by the webhook alone, admitted through the auto backend:\n    {pod}\n  stored as\n    {}",
                stored_view(&stored, &format!("webhook-{team}"))
            ));
        }
    }
    eprintln!(
        "[policy] the auto backend: {} Pods, {} different, {calls} webhook calls, {without_call} Pods without one, {} denied Pods tried",
        baseline.len(),
        auto_failures.len(),
        refused.len()
    );
    assert!(
        refused
            .iter()
            .any(|(_, pod)| pod["metadata"]["labels"]["tier"] == "frontend"),
        "no generated Pod had agent-lite take the required agent's name"
    );
    failures.extend(auto_failures);
    assert!(
        without_call > 0,
        "every Pod called the webhook: the entries skipped none ({calls} calls)"
    );
    // The generated Pods exercise every template, each on some Pods and not on others.
    for name in ["agent", "logs", "proxy", "meshed", "setup", "tracing"] {
        let count = applied.get(name).copied().unwrap_or_default();
        assert!(
            count > 0 && count < cases - denied,
            "{name} applied to {count} of {cases} Pods"
        );
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        denied < cases / 4,
        "too few Pods compared: {denied} of {cases} denied"
    );
}

/// Two required templates at generation 1, then `logs` at generation 2 with another image:
/// `mesh` has what the API server fills in (a native sidecar's probe, ports, env from a field,
/// mounts, resources), so that its stored containers test the policy's comparison with them.
fn versioned_templates(logs_generation: i64, logs_image: &str) -> String {
    format!(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {{name: mesh, generation: 1}}
spec:
  priority: 10
  failurePolicy: Fail
  namespaceSelector: {{matchLabels: {{versions: "on"}}}}
  initContainers:
  - name: mesh-proxy
    image: "mesh.invalid/proxy:1"
    restartPolicy: Always
    args: ["--pod", "{{{{ pod.name }}}}"]
    ports: [{{containerPort: 15001, name: proxy}}]
    env: [{{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]
    readinessProbe: {{httpGet: {{port: 15021}}}}
    resources: {{limits: {{memory: 0.5Gi}}}}
    volumeMounts: [{{name: mesh-config, mountPath: /etc/mesh, readOnly: false}}]
  volumes:
  - {{name: mesh-config, emptyDir: {{}}}}
  appContainers:
    env: [{{name: MESH, value: "on"}}]
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {{name: logs, generation: {logs_generation}}}
spec:
  priority: 20
  failurePolicy: Fail
  namespaceSelector: {{matchLabels: {{versions: "on"}}}}
  containers:
  - name: log-agent
    image: "{logs_image}"
    args: ["--pod", "{{{{ pod.name }}}}"]
    ports: [{{containerPort: 9100, name: metrics}}]
"#
    )
}

/// Where two stored Pods differ, one path per line. Volumes by name: the ServiceAccount plugin
/// appends the token's to a Pod made again with the template's volumes, where the policy added
/// them after it.
fn differing(a: &Value, b: &Value, namespace: &str) -> String {
    let view = |pod: &Value| {
        let mut view = stored_view(pod, namespace);
        if let Some(volumes) = view["spec"]["volumes"].as_array_mut() {
            volumes.sort_by(|x, y| x["name"].as_str().cmp(&y["name"].as_str()));
        }
        view
    };
    let mut out = Vec::new();
    differences(&view(a), &view(b), String::new(), &mut out);
    out.join("\n")
}

/// `logs@…` in the stored Pod's record.
fn logs_entry(stored: &Value) -> Option<String> {
    stored["metadata"]["annotations"]["sidecar.dev/injected"]
        .as_str()?
        .split(',')
        .find(|e| e.starts_with("logs@"))
        .map(str::to_owned)
}

/// A Pod as the policy stored it, made again: its containers as stored (the token's mount left
/// out, as the ServiceAccount plugin adds its own) and its record, if `record`.
fn made_again(stored: &Value, record: bool) -> Value {
    let without_token = |items: &Value| -> Vec<Value> {
        items
            .as_array()
            .into_iter()
            .flatten()
            .map(without_token_mount)
            .collect()
    };
    let volumes: Vec<Value> = stored["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| {
            !v["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(TOKEN_VOLUME_PREFIX))
        })
        .cloned()
        .collect();
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": stored["metadata"]["name"]},
        "spec": {
            "containers": without_token(&stored["spec"]["containers"]),
            "initContainers": without_token(&stored["spec"]["initContainers"]),
            "volumes": volumes,
        },
    });
    if record {
        pod["metadata"]["annotations"] = json!({
            "sidecar.dev/injected": stored["metadata"]["annotations"]["sidecar.dev/injected"],
        });
    }
    pod
}

/// The API server calls a policy again by name in the same request (its reinvocation), and may
/// load a newer version between the two calls: the newer one then meets a Pod the older one
/// injected. It must leave it to the older version whole, never write its own record entry
/// over the older version's container. And a Pod carrying the newer version's containers as
/// the API server stored them gets its rest and record, which tests the policy's comparison of
/// stored containers with the template's (`defaulted::holds_cel`) against the API server's own
/// defaults.
fn a_newer_policy_leaves_what_an_older_version_injected_to_it() {
    let Some(cp) = control_plane() else {
        return;
    };
    let binary = operator_binary().expect("the binary builds");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("policy-versions");
    std::fs::create_dir_all(&dir).unwrap();
    let apply_version = |generation: i64, image: &str| {
        let templates = dir.join(format!("templates-{generation}.yaml"));
        std::fs::write(&templates, versioned_templates(generation, image)).unwrap();
        cp.apply_yaml(&compile(&binary, "versions", &templates))
            .unwrap();
    };
    let namespace = "versions";
    cp.kubectl_ok(&["create", "namespace", namespace]).unwrap();
    cp.kubectl_ok(&["label", "namespace", namespace, "versions=on"])
        .unwrap();
    cp.wait_for_service_account(namespace).unwrap();
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "app.invalid/app:1"}]}});
    let injected_with = |image: &'static str| {
        poll(
            Duration::from_secs(60),
            &format!("the policy injecting {image}"),
            || {
                let stored = dry_run_create(&cp, namespace, &plain)?;
                Ok(stored["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["image"] == image)
                    .then_some(stored))
            },
        )
        .unwrap()
    };

    apply_version(1, "logs.invalid/agent:1");
    let first = injected_with("logs.invalid/agent:1");
    // Both templates select `versions=on` namespaces: the policy is bound to those, so a Pod of
    // a namespace no template selects never meets it (the API server counts each mutation it
    // runs, per policy and binding).
    let checks = |binding: &str| {
        let metrics = cp.kubectl_ok(&["get", "--raw", "/metrics"]).unwrap();
        counter(
            &metrics,
            "apiserver_mutating_admission_policy_check_total",
            |l| {
                l.get("policy").is_some_and(|p| p == "versions")
                    && l.get("policy_binding").is_some_and(|b| b == binding)
            },
        )
    };
    let unselected = "versions-off";
    cp.kubectl_ok(&["create", "namespace", unselected]).unwrap();
    cp.wait_for_service_account(unselected).unwrap();
    let (grouped, everywhere) = (checks("versions-namespaces-0"), checks("versions"));
    let stored = dry_run_create(&cp, unselected, &plain).unwrap();
    assert_eq!(
        stored["spec"]["containers"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(
        (checks("versions-namespaces-0"), checks("versions")),
        (grouped, everywhere),
        "the policy ran on a Pod no template selects"
    );
    dry_run_create(&cp, namespace, &plain).unwrap();
    assert!(
        checks("versions-namespaces-0") > grouped,
        "the policy's group binding"
    );
    let first_entry = logs_entry(&first).expect("version 1 records logs");
    assert!(first_entry.starts_with("logs@1#"), "{first_entry}");
    // Made again under version 1, the Pod is stored as it was: the comparison holds.
    let again = dry_run_create(&cp, namespace, &made_again(&first, false)).unwrap();
    assert_eq!(
        differing(&again, &first, namespace),
        "",
        "made again under version 1"
    );

    apply_version(2, "logs.invalid/agent:2");
    let second = injected_with("logs.invalid/agent:2");
    let second_entry = logs_entry(&second).expect("version 2 records logs");
    assert!(second_entry.starts_with("logs@2#"), "{second_entry}");

    // What version 1 made, met by version 2: left as version 1 made it.
    let older = dry_run_create(&cp, namespace, &made_again(&first, true)).unwrap();
    assert_eq!(
        differing(&older, &first, namespace),
        "",
        "version 2 changed a Pod version 1 injected"
    );
    // What version 2 made, without its record: given it back, and nothing else.
    for record in [false, true] {
        let newer = dry_run_create(&cp, namespace, &made_again(&second, record)).unwrap();
        assert_eq!(
            differing(&newer, &second, namespace),
            "",
            "version 2's own containers (record kept: {record})"
        );
    }
}
