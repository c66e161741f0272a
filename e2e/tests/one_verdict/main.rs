//! One verdict whichever engine decides: Pod authors' attempts at skipping a required template,
//! and legitimate Pods the API server changes on its own, through every injection backend the
//! API server supports (`webhook` and `auto` everywhere, `policy` where MutatingAdmissionPolicies
//! are served: Kubernetes 1.36+, so v1.37.2 in `just e2e-next`).
//!
//! Each case is a Pod created with a server-side dry run under each backend in turn (the
//! operator restarted with `--injection-backend`): every backend must refuse it or admit it
//! alike, and store the same Pod. The webhook backend is `plan`, what `render` prints, so it is
//! the reference. The cases are the rows of issue 33 that the policy backend got wrong:
//!
//! * an exact copy of the required sidecars with an `emptyDir` named like the token's volume
//!   (`kube-api-access-x`) mounted into the sidecar over its binaries: the policies took any
//!   mount of that name for the token's;
//! * the Pod's own plain init container, then an exact copy of the required native sidecar:
//!   the policies did not ask where the sidecar stands;
//! * a `hostNetwork` Pod, whose ports the API server gives a `hostPort`;
//! * a Pod in a namespace with a LimitRange, which gives the sidecar resources;
//! * a best-effort template applied after a required one the policy cannot express: under
//!   `auto` the webhook applied the required one after the policy applied the other, so the
//!   other's init container ran first and its env value won. Under `policy` that required
//!   template refuses what it selects, as documented;
//! * an app container named like the container of a template that does not select the Pod:
//!   the policies left it without the required template's env;
//! * a required template selecting on a label that a template the policy cannot express adds:
//!   under `policy` the label never came and the Pod was admitted with neither; now the
//!   required template refuses the Pods the other selects, saying why;
//! * a Pod that already has volumes identical to the required template's (written as the
//!   author would, without the API server's defaults) and mounts one itself: the policy skipped
//!   the template and its guard refused the Pod; and one whose volume of that name differs,
//!   which every backend refuses.
//!
//! Beside the named cases, generated ones (`generated.rs`, seeded): an exact copy of the
//! injected Pod, or a plain one, changed in one to three ways. And every case goes through
//! `render` too: its patch applied to the Pod as written, the result created where nothing
//! injects, must be stored as the webhook stored it (or refused where the webhook refuses).
//!
//! Under each backend it also counts, with the API server's own counter, the calls to the
//! operator's webhook entries that plain Pods cause: the first answer carries the ServiceAccount
//! token's mount as the plugin would add it, so the plugin's second run changes nothing and
//! the webhook is called once per injected Pod (never, where the policy injected it).
//!
//! After admission, generated UPDATEs of a running injected Pod (`updates.rs`) must be refused
//! by the after-admission policy exactly when they touch a required template, alike under every
//! backend. Last, a required template is edited under each backend while Pods are created
//! (`edited.rs`): mid-way either version may decide, never neither.
//!
//! Off unless `SIDECAR_INJECTOR_E2E=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};
use std::time::Duration;

use injector_e2e::harness;
use injector_e2e::pod::{dry_run_create, stored_view, without_token_mount};
use injector_e2e::steps::{CONFIGURATION, install_crd, wait_condition, wait_served};
use injector_e2e::{Backend, ControlPlane, Operator, OperatorOptions, operator_binary, poll};

mod edited;
mod generated;
mod updates;
use serde_json::{Value, json};

const TEMPLATES: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: mesh}
spec:
  priority: 10
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {verdict: "on"}}
  initContainers:
  - name: mesh-proxy
    image: "mesh.invalid/proxy:1"
    restartPolicy: Always
    ports: [{containerPort: 15001, name: proxy}]
    volumeMounts: [{name: mesh-config, mountPath: /etc/mesh}]
  volumes:
  - {name: mesh-config, emptyDir: {}}
  - {name: mesh-ca, configMap: {name: mesh-ca, optional: true}}
  appContainers:
    env: [{name: MESH, value: "on"}]
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: logs}
spec:
  priority: 20
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {verdict: "on"}}
  containers:
  - name: log-agent
    image: "logs.invalid/agent:1"
    args: ["--pod", "{{ pod.name }}"]
    ports: [{containerPort: 9100, name: metrics}]
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: elsewhere}
spec:
  failurePolicy: Ignore
  namespaceSelector: {matchLabels: {verdict: elsewhere}}
  containers: [{name: elsewhere-agent, image: "elsewhere.invalid/agent:1"}]
"#;

/// A required template the policy cannot express (`appContainers.envFrom`), applied first, and
/// a best-effort one after it that a policy could, both adding an init container and one app
/// env var: in a namespace of their own (`verdict: order`, apart from the others' by that
/// label, so the others stay in the policy).
const ORDERED: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: ordered-mesh}
spec:
  priority: 1
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {verdict: order}}
  initContainers:
  - {name: ordered-proxy, image: "mesh.invalid/proxy:2", restartPolicy: Always}
  appContainers:
    env: [{name: MODE, value: mesh}]
    envFrom: [{configMapRef: {name: mesh-env, optional: true}}]
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: fetch}
spec:
  priority: 5
  failurePolicy: Ignore
  namespaceSelector: {matchLabels: {verdict: order}}
  initContainers:
  - {name: fetch-config, image: "fetch.invalid/fetch:1"}
  appContainers:
    env: [{name: MODE, value: fetch}]
"#;

/// A best-effort template the policy cannot express adding a label, and a required one selecting
/// on it: with the `policy` backend the label never comes (`verdict: labelled`).
const LABELLED: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: labeller}
spec:
  priority: 1
  failurePolicy: Ignore
  namespaceSelector: {matchLabels: {verdict: labelled}}
  podSelector: {matchLabels: {app: web}}
  appContainers:
    envFrom: [{configMapRef: {name: settings, optional: true}}]
  metadata:
    labels: {tier: meshed}
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: labelled-agent}
spec:
  priority: 5
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {verdict: labelled}}
  podSelector: {matchLabels: {tier: meshed}}
  containers: [{name: labelled-agent, image: "labelled.invalid/agent:1"}]
"#;

/// A required template of two init containers (a plain one and a native sidecar) and two
/// containers, in a namespace of its own (`verdict: pair`): a Pod carrying a copy of some of
/// them gets the others, as from `plan` (the policy once refused it under `policy`).
const PAIR: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: pair}
spec:
  priority: 30
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {verdict: pair}}
  initContainers:
  - {name: pair-init, image: "pair.invalid/init:1"}
  - {name: pair-proxy, image: "pair.invalid/proxy:1", restartPolicy: Always}
  containers:
  - {name: pair-a, image: "pair.invalid/a:1"}
  - {name: pair-b, image: "pair.invalid/b:1", args: ["--pod", "{{ pod.name }}"]}
  appContainers:
    env: [{name: PAIR, value: "on"}]
"#;

/// The templates the policy serves under `auto` and `policy`.
const TEMPLATE_NAMES: [&str; 3] = ["mesh", "logs", "pair"];

/// The policy (and its guard) beside the operator's default names.
const POLICY: &str = "sidecar-injector";
const GUARD: &str = "sidecar-injector-guard";

/// One attempt: a name, where, and the Pod.
struct Case {
    name: String,
    namespace: String,
    pod: Value,
    /// Whether the webhook (the reference) must refuse it: checked too, so that a case that
    /// stopped testing what it names fails (`None` for a generated case).
    refused: Option<bool>,
    /// Whether the `policy` backend refuses it by design: a required template it selects cannot
    /// be expressed by a policy (docs/reference.md), so nothing can inject it there.
    policy_refuses: bool,
}

/// The outcome of a dry-run create: the stored Pod (as compared) or the refusal.
fn create(cp: &ControlPlane, namespace: &str, pod: &Value) -> Result<Value, String> {
    dry_run_create(cp, namespace, pod)
        .unwrap()
        .map(|stored| stored_view(&stored, namespace).unwrap())
}

fn pod(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn app() -> Value {
    json!({"name": "app", "image": "app.invalid/app:1"})
}

fn named<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod["spec"][list]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{list} {name} in {pod}"))
}

/// An exact copy of what the webhook stored for a plain Pod (`injected`), token mounts left
/// out as the plugin adds its own.
fn exact_copy(injected: &Value) -> Value {
    pod(
        "copy",
        json!({
            "containers": [app(), without_token_mount(named(injected, "containers", "log-agent"))],
            "initContainers": [without_token_mount(named(injected, "initContainers", "mesh-proxy"))],
            "volumes": [named(injected, "volumes", "mesh-config"), named(injected, "volumes", "mesh-ca")],
        }),
    )
}

/// How many generated cases run beside the named ones.
const GENERATED: usize = 48;

/// The generated cases, in `namespace` or `limited` (a LimitRange's).
fn generated_cases(namespace: &str, limited: &str, injected: &Value) -> Vec<Case> {
    let seed = generated::seed();
    eprintln!("[one-verdict] generated cases: SIDECAR_INJECTOR_E2E_SEED={seed}");
    let mut draw = generated::Draw::new(seed);
    let record = injected["annotations"]["sidecar.dev/injected"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let plain = pod("plain", json!({"containers": [app()]}));
    generated::attempts(&mut draw, GENERATED, &exact_copy(injected), &plain, &record)
        .into_iter()
        .map(|(what, pod)| Case {
            namespace: if draw.below(4) == 0 {
                limited
            } else {
                namespace
            }
            .to_owned(),
            name: format!("generated {what}"),
            pod,
            refused: None,
            policy_refuses: false,
        })
        .collect()
}

/// Where `a` and `b` first differ, as a JSON pointer.
fn first_difference(a: &Value, b: &Value) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x
            .keys()
            .chain(y.keys())
            .find(|k| x.get(*k) != y.get(*k))
            .map(|k| {
                let (p, q) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                format!("/{k}{}", first_difference(p, q))
            })
            .unwrap_or_default(),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .position(|(p, q)| p != q)
            .map(|i| format!("/{i}{}", first_difference(&x[i], &y[i])))
            .unwrap_or_default(),
        _ => format!(": {a} vs {b}"),
    }
}

/// `view` as `render`'s is compared with it: the admission plugins that run around the webhook
/// run once on the rendered Pod, so the ServiceAccount token's volume comes after the
/// template's volumes rather than before, and the LimitRange's annotation names every
/// container rather than those it defaulted last.
fn as_rendered(view: &Value) -> Value {
    let mut view = view.clone();
    if let Some(annotations) = view["annotations"].as_object_mut() {
        annotations.remove("kubernetes.io/limit-ranger");
    }
    if let Some(volumes) = view["spec"]["volumes"].as_array_mut() {
        volumes.sort_by_key(|v| {
            v["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("kube-api-access-"))
        });
    }
    view
}

/// What `render` makes of `case`: its patch applied to the Pod as written, then created (dry
/// run) in `elsewhere`, a namespace nothing injects into (with the same LimitRange as the
/// case's namespace, if any), as the webhook's result is compared.
fn render(
    cp: &ControlPlane,
    templates: &std::path::Path,
    case: &Case,
    labels: &str,
    elsewhere: &str,
) -> Result<Value, String> {
    let pod_file = cp.dir().join("render-pod.json");
    std::fs::write(&pod_file, case.pod.to_string()).unwrap();
    let output = Command::new(operator_binary().unwrap())
        .arg("render")
        .arg("--template")
        .arg(templates)
        .arg("--pod")
        .arg(&pod_file)
        .args(["--namespace", &case.namespace])
        .args(["--namespace-labels", labels])
        .args(["--output", "patch"])
        .output()
        .unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    let patch: json_patch::Patch = serde_json::from_slice(&output.stdout).unwrap();
    let mut rendered = case.pod.clone();
    json_patch::patch(&mut rendered, &patch).unwrap();
    dry_run_create(cp, elsewhere, &rendered)
        .unwrap()
        .map(|stored| as_rendered(&stored_view(&stored, &case.namespace).unwrap()))
        .map_err(|refusal| format!("the rendered Pod was refused where nothing injects: {refusal}"))
}

/// The cases, the exact copies taken from what the webhook stored for a plain Pod.
fn cases(
    namespace: &str,
    limited: &str,
    ordered: &str,
    labelled: &str,
    injected: &Value,
) -> Vec<Case> {
    let proxy = without_token_mount(named(injected, "initContainers", "mesh-proxy"));
    let mut agent = without_token_mount(named(injected, "containers", "log-agent"));
    let config = named(injected, "volumes", "mesh-config").clone();
    let ca = named(injected, "volumes", "mesh-ca").clone();

    // The copy, and a volume named like the token's mounted over the sidecar's binaries.
    agent["args"] = json!(["--pod", "forged-mount"]);
    let mut forged_agent = agent.clone();
    forged_agent["volumeMounts"] = json!([{"name": "kube-api-access-x", "mountPath": "/bin"}]);
    let forged_mount = pod(
        "forged-mount",
        json!({
            "containers": [app(), forged_agent],
            "initContainers": [proxy.clone()],
            "volumes": [config.clone(), ca.clone(), {"name": "kube-api-access-x", "emptyDir": {}}],
        }),
    );

    // The Pod's own plain init container first, then the copy of the native sidecar.
    agent["args"] = json!(["--pod", "sidecar-behind"]);
    let behind = pod(
        "sidecar-behind",
        json!({
            "containers": [app(), agent.clone()],
            "initContainers": [{"name": "setup", "image": "app.invalid/setup:1"}, proxy],
            "volumes": [config, ca],
        }),
    );

    // The template's volumes, written as a Pod author would, one mounted by the app.
    let mut mounting = app();
    mounting["volumeMounts"] = json!([{"name": "mesh-ca", "mountPath": "/etc/ca"}]);
    let own_volumes = pod(
        "own-volumes",
        json!({
            "containers": [mounting.clone()],
            "volumes": [
                {"name": "mesh-ca", "configMap": {"name": "mesh-ca", "optional": true}},
                {"name": "mesh-config", "emptyDir": {}},
            ],
        }),
    );
    let other_volume = pod(
        "other-volume",
        json!({
            "containers": [mounting],
            "volumes": [{"name": "mesh-ca", "configMap": {"name": "my-own-ca"}}],
        }),
    );

    vec![
        Case {
            name: "a volume named like the token's mounted into the sidecar".to_owned(),
            namespace: namespace.to_owned(),
            pod: forged_mount,
            refused: Some(true),
            policy_refuses: false,
        },
        Case {
            name: "the native sidecar behind the Pod's own init container".to_owned(),
            namespace: namespace.to_owned(),
            pod: behind,
            refused: Some(true),
            policy_refuses: false,
        },
        Case {
            name: "a hostNetwork Pod (hostPort defaulted)".to_owned(),
            namespace: namespace.to_owned(),
            pod: pod(
                "host-network",
                json!({"hostNetwork": true, "containers": [app()]}),
            ),
            refused: Some(false),
            policy_refuses: false,
        },
        Case {
            name: "a namespace with a LimitRange (resources defaulted)".to_owned(),
            namespace: limited.to_owned(),
            pod: pod("limited", json!({"containers": [app()]})),
            refused: Some(false),
            policy_refuses: false,
        },
        // Under `auto` the policy applied `fetch` before the webhook applied `ordered-mesh`:
        // its init container ran before the proxy, and its env value won.
        Case {
            name: "a best-effort template after one the policy cannot express".to_owned(),
            namespace: ordered.to_owned(),
            pod: pod("ordered", json!({"containers": [app()]})),
            refused: Some(false),
            policy_refuses: true,
        },
        // The policies left alone every container named like any template's, so this one
        // missed the required template's env.
        Case {
            name: "an app container named like the container of a template that does not select the Pod".to_owned(),
            namespace: namespace.to_owned(),
            pod: pod(
                "named-like",
                json!({"containers": [app(), {"name": "elsewhere-agent", "image": "app.invalid/helper:1"}]}),
            ),
            refused: Some(false),
            policy_refuses: false,
        },
        // Under `policy` the label never came, and the Pod was admitted with neither.
        Case {
            name: "a required template selecting on a label a webhook-only template adds".to_owned(),
            namespace: labelled.to_owned(),
            pod: json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "labelled", "labels": {"app": "web"}},
                "spec": {"containers": [app()]},
            }),
            refused: Some(false),
            policy_refuses: true,
        },
        Case {
            name: "a Pod with the required template's volumes, one mounted by the app".to_owned(),
            namespace: namespace.to_owned(),
            pod: own_volumes,
            refused: Some(false),
            policy_refuses: false,
        },
        Case {
            name: "a Pod with a volume named like the required template's that differs".to_owned(),
            namespace: namespace.to_owned(),
            pod: other_volume,
            refused: Some(true),
            policy_refuses: false,
        },
        Case {
            name: "a plain Pod".to_owned(),
            namespace: namespace.to_owned(),
            pod: pod("plain", json!({"containers": [app()]})),
            refused: Some(false),
            policy_refuses: false,
        },
    ]
}

/// Copies of some of `pair`'s items, taken from what the webhook stored for a plain Pod
/// (`injected`): each gets the others, in the places `plan` gives them; a look-alike among
/// them is refused.
fn pair_cases(paired: &str, injected: &Value) -> Vec<Case> {
    let item = |list: &str, name: &str| without_token_mount(named(injected, list, name));
    let case = |name: &str, refused: bool, spec: Value| Case {
        name: name.to_owned(),
        namespace: paired.to_owned(),
        pod: pod("copied", spec),
        refused: Some(refused),
        policy_refuses: false,
    };
    let mut look_alike = item("containers", "pair-a");
    look_alike["image"] = json!("evil.invalid/a:1");
    vec![
        case(
            "a copy of one of a required template's containers",
            false,
            json!({"containers": [app(), item("containers", "pair-a")]}),
        ),
        case(
            "a copy of the other, before the app",
            false,
            json!({"containers": [item("containers", "pair-b"), app()]}),
        ),
        case(
            "a copy of a required template's native sidecar alone",
            false,
            json!({"containers": [app()], "initContainers": [item("initContainers", "pair-proxy")]}),
        ),
        case(
            "a copy of its plain init container, its containers and not its native sidecar",
            false,
            json!({
                "containers": [app(), item("containers", "pair-a"), item("containers", "pair-b")],
                "initContainers": [item("initContainers", "pair-init")],
            }),
        ),
        case(
            "a look-alike of one of its containers and not the others",
            true,
            json!({"containers": [app(), look_alike]}),
        ),
    ]
}

/// Starts the operator with `backend` and waits until what it puts in force is in force: the
/// required templates served by it, and a look-alike refused.
fn start(cp: &ControlPlane, backend: Backend, namespace: &str, policies: bool) -> Operator {
    let operator = Operator::start(
        cp,
        OperatorOptions {
            extra_args: backend.args(),
            ..OperatorOptions::default()
        },
    )
    .expect("the operator starts");
    let by_policy = policies && backend != Backend::Webhook;
    for name in TEMPLATE_NAMES {
        if by_policy {
            wait_condition(
                cp,
                name,
                ("PolicyServed", "True", "Served"),
                Duration::from_secs(60),
            )
            .unwrap();
        }
    }
    if backend != Backend::Policy {
        let webhook_only = ["ordered-mesh", "fetch", "labeller", "labelled-agent"];
        for name in TEMPLATE_NAMES.into_iter().chain(webhook_only) {
            wait_served(cp, name, CONFIGURATION).unwrap();
        }
    }
    if policies {
        // What the backend does not use is gone.
        let wanted = [(POLICY, by_policy), (GUARD, backend == Backend::Policy)];
        for (object, wanted) in wanted {
            let kind = if object == POLICY {
                "mutatingadmissionpolicy"
            } else {
                "validatingadmissionpolicy"
            };
            poll(Duration::from_secs(30), &format!("{kind} {object}"), || {
                let there = cp.try_get_json(kind, None, object)?.is_some();
                Ok((there == wanted).then_some(()))
            })
            .unwrap();
        }
    }
    // The API server loads admission objects asynchronously: wait until it refuses a
    // look-alike and injects a plain Pod, then every case is tried once.
    let look_alike = pod(
        "look-alike",
        json!({"containers": [app(), {"name": "log-agent", "image": "elsewhere.invalid/agent:1"}]}),
    );
    poll(
        Duration::from_secs(30),
        "a look-alike to be refused",
        || Ok(create(cp, namespace, &look_alike).err().map(|_| ())),
    )
    .unwrap();
    poll(
        Duration::from_secs(30),
        "a plain Pod to be injected",
        || {
            Ok(
                create(cp, namespace, &pod("probe", json!({"containers": [app()]})))
                    .ok()
                    .filter(|p| {
                        p.to_string().contains("mesh-proxy") && p.to_string().contains("log-agent")
                    })
                    .map(|_| ()),
            )
        },
    )
    .unwrap();
    operator
}

/// The calls to the operator's webhook entries so far, by the API server's counter
/// (`apiserver_admission_webhook_admission_duration_seconds_count`, Pod CREATEs).
fn webhook_calls(cp: &ControlPlane) -> f64 {
    let metrics = cp.kubectl_ok(&["get", "--raw", "/metrics"]).unwrap();
    metrics
        .lines()
        .filter_map(|line| {
            let series =
                line.strip_prefix("apiserver_admission_webhook_admission_duration_seconds_count{")?;
            let (labels, value) = series.rsplit_once("} ")?;
            let ours = labels.split(',').any(|l| {
                l.strip_prefix("name=\"")
                    .is_some_and(|n| n.ends_with(".webhook.sidecar.dev\""))
            });
            let create = labels.split(',').any(|l| l == "operation=\"CREATE\"");
            (ours && create).then(|| value.parse::<f64>().unwrap())
        })
        .sum()
}

/// How many plain Pods the counted stream creates under each backend.
const COUNTED_PODS: u32 = 10;

/// Creates [`COUNTED_PODS`] plain Pods (dry runs; the templates inject both sidecars) and
/// returns the webhook calls per Pod, checking that every stored Pod's injected containers
/// carry the token's mount the ServiceAccount plugin adds.
fn calls_per_injected_pod(cp: &ControlPlane, namespace: &str) -> f64 {
    let before = webhook_calls(cp);
    for index in 0..COUNTED_PODS {
        let stored = create(
            cp,
            namespace,
            &pod(&format!("counted-{index}"), json!({"containers": [app()]})),
        )
        .expect("a plain Pod is admitted");
        for (list, name) in [
            ("initContainers", "mesh-proxy"),
            ("containers", "log-agent"),
        ] {
            let mounts = named(&stored, list, name)["volumeMounts"].to_string();
            assert!(
                mounts.contains("/var/run/secrets/kubernetes.io/serviceaccount"),
                "{name} without the token's mount: {stored}"
            );
        }
    }
    (webhook_calls(cp) - before) / f64::from(COUNTED_PODS)
}

fn main() -> ExitCode {
    harness::run_tests(
        "one_verdict",
        &[(
            "every_backend_gives_one_verdict_and_stores_one_pod",
            every_backend_gives_one_verdict_and_stores_one_pod,
        )],
    )
}

fn every_backend_gives_one_verdict_and_stores_one_pod() {
    let cp = ControlPlane::start().expect("the control plane starts");
    install_crd(&cp).unwrap();
    let namespace = cp.namespace("verdict", &[("verdict", "on")]).unwrap();
    let limited = cp.namespace("limited", &[("verdict", "on")]).unwrap();
    let limit_range = json!({
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "defaults", "namespace": limited},
        "spec": {"limits": [{
            "type": "Container",
            "default": {"cpu": "200m", "memory": "128Mi"},
            "defaultRequest": {"cpu": "100m", "memory": "64Mi"},
        }]},
    });
    cp.apply_yaml(&limit_range.to_string()).unwrap();
    let ordered = cp.namespace("ordered", &[("verdict", "order")]).unwrap();
    let labelled = cp
        .namespace("labelled", &[("verdict", "labelled")])
        .unwrap();
    cp.apply_yaml(TEMPLATES).unwrap();
    cp.apply_yaml(ORDERED).unwrap();
    cp.apply_yaml(LABELLED).unwrap();
    let paired = cp.namespace("paired", &[("verdict", "pair")]).unwrap();
    cp.apply_yaml(PAIR).unwrap();
    let policies = cp.serves_mutating_admission_policies().unwrap();
    let backends: &[Backend] = if policies {
        &[Backend::Webhook, Backend::Auto, Backend::Policy]
    } else {
        &[Backend::Webhook, Backend::Auto]
    };

    // Where `render`'s Pods are stored: namespaces no template selects, one with the same
    // LimitRange.
    let elsewhere = cp.namespace("rendered", &[]).unwrap();
    let elsewhere_limited = cp.namespace("rendered-limited", &[]).unwrap();
    let mut limit_range = limit_range;
    limit_range["metadata"]["namespace"] = json!(elsewhere_limited);
    cp.apply_yaml(&limit_range.to_string()).unwrap();
    let templates = cp.dir().join("one-verdict-templates.yaml");
    std::fs::write(
        &templates,
        [TEMPLATES, ORDERED, LABELLED, PAIR].join("\n---\n"),
    )
    .unwrap();
    let labels: BTreeMap<&str, &str> = [
        (namespace.as_str(), "verdict=on"),
        (limited.as_str(), "verdict=on"),
        (ordered.as_str(), "verdict=order"),
        (labelled.as_str(), "verdict=labelled"),
        (paired.as_str(), "verdict=pair"),
    ]
    .into();

    let mut outcomes: Vec<(&str, Vec<Result<Value, String>>)> = Vec::new();
    let mut update_outcomes: Vec<(&str, Vec<Result<Value, String>>)> = Vec::new();
    let update_attempts = updates::attempts(
        &mut generated::Draw::new(generated::seed().wrapping_add(1)),
        UPDATES,
    );
    let mut all_cases = Vec::new();
    for &backend in backends {
        let mut operator = start(&cp, backend, &namespace, policies);
        if all_cases.is_empty() {
            let injected = create(
                &cp,
                &namespace,
                &pod("copied", json!({"containers": [app()]})),
            )
            .expect("a plain Pod is admitted");
            all_cases = cases(&namespace, &limited, &ordered, &labelled, &injected);
            let paired_injected =
                create(&cp, &paired, &pod("copied", json!({"containers": [app()]})))
                    .expect("a plain Pod is admitted");
            all_cases.extend(pair_cases(&paired, &paired_injected));
            all_cases.extend(generated_cases(&namespace, &limited, &injected));
        }
        let calls = calls_per_injected_pod(&cp, &namespace);
        eprintln!(
            "[one-verdict] {}: webhook calls per injected Pod: {calls:.2}",
            backend.arg()
        );
        // Where the policy injects both templates, their entry skips the Pod.
        let by_webhook = backend == Backend::Webhook || (backend == Backend::Auto && !policies);
        let expected = if by_webhook { 1.0 } else { 0.0 };
        assert_eq!(
            calls,
            expected,
            "{}: webhook calls per injected Pod",
            backend.arg()
        );
        let results: Vec<Result<Value, String>> = all_cases
            .iter()
            .map(|case| create(&cp, &case.namespace, &case.pod))
            .collect();
        for (case, result) in all_cases.iter().zip(&results) {
            let verdict = match result {
                Ok(_) => "admitted".to_owned(),
                Err(refusal) => format!("refused: {refusal}"),
            };
            eprintln!("[one-verdict] {}: {}: {verdict}", backend.arg(), case.name);
        }
        outcomes.push((backend.arg(), results));
        // UPDATEs of a running Pod, in the LimitRange's namespace: every container has
        // resources there, so a resize keeps the Pod's QoS class.
        let updated = updates::outcomes(&cp, &limited, &update_attempts);
        for (attempt, result) in update_attempts.iter().zip(&updated) {
            let verdict = if result.is_ok() { "allowed" } else { "refused" };
            eprintln!(
                "[one-verdict] {}: {}: {verdict}",
                backend.arg(),
                attempt.name()
            );
        }
        update_outcomes.push((backend.arg(), updated));
        operator.stop().unwrap();
    }
    let rendered: Vec<Result<Value, String>> = all_cases
        .iter()
        .map(|case| {
            let elsewhere = if case.namespace == limited {
                &elsewhere_limited
            } else {
                &elsewhere
            };
            render(
                &cp,
                &templates,
                case,
                labels[case.namespace.as_str()],
                elsewhere,
            )
        })
        .collect();
    outcomes.push(("render", rendered));

    let mut disagreements = Vec::new();
    let (_, reference) = &outcomes[0];
    for (index, case) in all_cases.iter().enumerate() {
        if let Some(refused) = case.refused {
            assert_eq!(
                reference[index].is_err(),
                refused,
                "the webhook's verdict on {:?}: {:?}",
                case.name,
                reference[index]
            );
        }
        for (backend, results) in &outcomes[1..] {
            if *backend == Backend::Policy.arg() && case.policy_refuses {
                if let Ok(stored) = &results[index] {
                    disagreements.push(format!(
                        "policy: {:?} admitted, a required template it cannot express selects it: {stored}",
                        case.name
                    ));
                }
                continue;
            }
            let expected = match &reference[index] {
                Ok(expected) if *backend == "render" => Ok(as_rendered(expected)),
                other => other.clone(),
            };
            match (&expected, &results[index]) {
                (Ok(expected), Ok(stored)) if expected != stored => disagreements.push(format!(
                    "{backend}: {:?} stored another Pod, at {}:\n  {stored}\n  the webhook's: {expected}",
                    case.name,
                    first_difference(stored, expected)
                )),
                (Err(_), Ok(_)) => disagreements.push(format!(
                    "{backend}: {:?} admitted, the webhook refused it",
                    case.name
                )),
                (Ok(_), Err(refusal)) => disagreements.push(format!(
                    "{backend}: {:?} refused, the webhook admitted it: {refusal}",
                    case.name
                )),
                _ => {}
            }
        }
    }
    disagreements.extend(update_disagreements(&update_attempts, &update_outcomes));

    // Last, as it changes the templates: `logs` edited while Pods are created, under each
    // backend.
    for &backend in backends {
        let mut operator = start(&cp, backend, &namespace, policies);
        for edit in [edited::Edit::Image, edited::Edit::WebhookOnly] {
            disagreements.extend(edited::edit_midway(&cp, backend, &namespace, edit));
        }
        operator.stop().unwrap();
    }
    assert!(
        disagreements.is_empty(),
        "the backends disagree:\n{}",
        disagreements.join("\n")
    );
}

/// How many UPDATEs are tried under each backend: every change alone, then drawn pairs.
const UPDATES: usize = 24;

/// Where an UPDATE's outcome is not the one known in advance (refused, by the after-admission
/// policy, exactly when it changes a required template's containers or record), or stores
/// another Pod than under the webhook backend.
fn update_disagreements(
    attempts: &[updates::Attempt],
    outcomes: &[(&str, Vec<Result<Value, String>>)],
) -> Vec<String> {
    let mut disagreements = Vec::new();
    let (_, reference) = &outcomes[0];
    for (backend, results) in outcomes {
        for ((attempt, result), expected) in attempts.iter().zip(results).zip(reference) {
            let name = attempt.name();
            match result {
                Ok(_) if attempt.refused() => {
                    disagreements.push(format!("{backend}: {name:?} was allowed"));
                }
                Ok(stored) if Some(stored) != expected.as_ref().ok() => {
                    disagreements.push(format!(
                        "{backend}: {name:?} stored another Pod than the webhook backend's, at {}",
                        first_difference(stored, expected.as_ref().unwrap_or(&Value::Null))
                    ));
                }
                Err(refusal) if !attempt.refused() => {
                    disagreements.push(format!("{backend}: {name:?} was refused: {refusal}"));
                }
                Err(refusal) if !refusal.contains(updates::AFTER_ADMISSION) => {
                    disagreements.push(format!(
                        "{backend}: {name:?} was refused, not by the after-admission policy: {refusal}"
                    ));
                }
                _ => {}
            }
        }
    }
    disagreements
}
