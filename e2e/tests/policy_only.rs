//! The `policy` backend (`--injection-backend policy`) on a real API server: no webhook entry,
//! and a ValidatingAdmissionPolicy (the guard) that keeps required templates' promise.
//!
//! Where the API server serves MutatingAdmissionPolicies (1.36+: `just e2e-next` runs this on
//! v1.37.2), a required template's Pods are injected by the API server, with the operator
//! running and stopped; it gets the warnings the webhook would give (from the warnings policy);
//! a best-effort template a Pod conflicts with is left out with a warning; a Pod whose
//! annotation a placeholder reads (empty on the proof Pod) is recognised as injected; a best-effort
//! template that takes the required one's container name first has the Pods it selects
//! refused and leaves the others to the required one; a look-alike of the
//! required sidecar is refused by the guard with a readable message; after admission, the
//! required sidecar's image cannot be changed (the after-admission policy), the app's can; and
//! while the template changes, Pods created one after another are all admitted,
//! with one version or the other. Where it does not (v1.34), the required template's Pods are
//! refused, saying why, and the template's status says so.
//!
//! With the operator's namespace enforcing the `restricted` Pod Security Standard (where the
//! proof's dry-run Pods are made), the guard never fails open: from the moment a required
//! template is applied, each Pod it selects is refused or injected, never admitted without it;
//! a template whose sidecar passes the standard is proven and injected; one whose sidecar
//! breaks it fails its proof, and its Pods are refused saying why, as its status does.
//!
//! Off unless `SIDECAR_INJECTOR_E2E=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use injector_e2e::harness;
use injector_e2e::steps::{CONFIGURATION, install_crd, wait_condition};
use injector_e2e::{Backend, ControlPlane, Operator, OperatorOptions, operator_binary, poll};
use serde_json::{Value, json};

const GUARDED: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: guarded}
spec:
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {guard: "on"}}
  containers:
  - name: guarded-agent
    image: "guarded.invalid/agent:IMAGE_TAG"
    workingDir: "{{ pod.labels['dir'] }}"
    env:
    - {name: POD, value: "{{ pod.name }}"}
    - {name: OWNER, value: "{{ pod.annotations['owner'] }}"}
  appContainers:
    env: [{name: MODE, value: guarded}]
  metadata:
    labels: {guarded.example/owner: "{{ pod.annotations['owner'] }}"}
"#;

const EXTRA: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: extra}
spec:
  failurePolicy: Ignore
  namespaceSelector: {matchLabels: {guard: "on"}}
  podSelector: {matchLabels: {app: extra}}
  containers: [{name: extra-agent, image: "extra.invalid/agent:1"}]
"#;

/// Best-effort, applied before `guarded` (a lower priority), and adding a container of the
/// same name: on the Pods it selects, `guarded` cannot be injected.
const SHADOW: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: shadow}
spec:
  priority: 1
  failurePolicy: Ignore
  namespaceSelector: {matchLabels: {guard: "on"}}
  podSelector: {matchLabels: {app: shadow}}
  containers: [{name: guarded-agent, image: "shadow.invalid/agent:1"}]
"#;

/// Required, and passes `restricted` (with the Pod's own `runAsNonRoot` and seccomp profile).
const SECURE: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: secure}
spec:
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {secure: "on"}}
  containers:
  - name: secure-agent
    image: "secure.invalid/agent:1"
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
"#;

/// Required, and breaks `restricted`: a privileged sidecar.
const PRIVILEGED: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: privileged}
spec:
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {privileged: "on"}}
  containers:
  - name: privileged-agent
    image: "privileged.invalid/agent:1"
    securityContext: {privileged: true}
"#;

/// The guard's name beside the operator's default policy name.
const GUARD: &str = "sidecar-injector-guard";
/// The warnings policy's.
const WARNINGS: &str = "sidecar-injector-warnings";
/// The after-admission policy's.
const AFTER_ADMISSION: &str = "sidecar-injector-after-admission";

fn guarded(tag: &str) -> String {
    GUARDED.replace("IMAGE_TAG", tag)
}

/// Creates `pod` in `namespace` (`dry_run`: server-side); the stored Pod, or the refusal.
fn create(
    cp: &ControlPlane,
    namespace: &str,
    pod: &Value,
    dry_run: bool,
) -> anyhow::Result<Result<Value, String>> {
    Ok(create_warned(cp, namespace, pod, dry_run)?.0)
}

/// [`create`], and the warnings the API server gave.
fn create_warned(
    cp: &ControlPlane,
    namespace: &str,
    pod: &Value,
    dry_run: bool,
) -> anyhow::Result<(Result<Value, String>, BTreeSet<String>)> {
    let mut args = vec!["create", "-n", namespace, "-o", "json", "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    let out = cp.kubectl_with_stdin(&args, &pod.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("Warning: "))
        .map(str::to_owned)
        .collect();
    if out.status.success() {
        Ok((Ok(serde_json::from_slice(&out.stdout)?), warnings))
    } else {
        Ok((Err(stderr.trim().to_owned()), warnings))
    }
}

/// The warnings `sidecar-injector render` gives for `pod` in `namespace` (labelled
/// `guard=on`), under the template `yaml`: those the webhook would give.
fn render_warnings(yaml: &str, pod: &Value, namespace: &str) -> BTreeSet<String> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("policy-only");
    std::fs::create_dir_all(&dir).unwrap();
    let (templates, pod_file) = (dir.join("templates.yaml"), dir.join("pod.json"));
    std::fs::write(&templates, yaml).unwrap();
    std::fs::write(&pod_file, pod.to_string()).unwrap();
    let out = Command::new(operator_binary().unwrap())
        .args([
            "render",
            "-o",
            "patch",
            "--namespace-labels",
            "guard=on",
            "-n",
            namespace,
            "-t",
        ])
        .arg(&templates)
        .arg("--pod")
        .arg(&pod_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = pod["metadata"]["name"].as_str().unwrap();
    let prefix = format!("Warning: Pod/{name} in {namespace}: ");
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .map(str::to_owned)
        .collect()
}

fn pod(name: &str, containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": containers}})
}

fn container_image(pod: &Value, name: &str) -> Option<String> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["image"].as_str())
        .map(str::to_owned)
}

fn main() -> ExitCode {
    harness::run_tests(
        "policy_only",
        &[
            (
                "the_policy_backend_alone_injects_and_guards_required_templates",
                the_policy_backend_alone_injects_and_guards_required_templates,
            ),
            (
                "under_the_restricted_standard_a_required_template_never_fails_open",
                under_the_restricted_standard_a_required_template_never_fails_open,
            ),
        ],
    )
}

fn the_policy_backend_alone_injects_and_guards_required_templates() {
    let cp = ControlPlane::start().expect("the control plane starts");
    install_crd(&cp).unwrap();
    let mut operator = Operator::start(
        &cp,
        OperatorOptions {
            extra_args: Backend::Policy.args(),
            ..OperatorOptions::default()
        },
    )
    .expect("the operator starts");
    let guarded_ns = cp.namespace("guarded", &[("guard", "on")]).unwrap();
    let plain_ns = cp.namespace("plain", &[]).unwrap();
    cp.apply_yaml(&guarded("1")).unwrap();
    let app = json!([{"name": "app", "image": "app.invalid/app:1"}]);

    if !cp.serves_mutating_admission_policies().unwrap() {
        // Nothing can inject: the required template refuses what it selects, and says why.
        let ready = wait_condition(
            &cp,
            "guarded",
            ("Ready", "False", "NotServed"),
            Duration::from_secs(60),
        )
        .unwrap();
        let message = ready["message"].as_str().unwrap();
        eprintln!("[policy-only] no policies served: {message}");
        assert!(message.contains("refused"), "{message}");
        let refusal = poll(Duration::from_secs(30), "the guard to refuse", || {
            Ok(create(&cp, &guarded_ns, &pod("refused", app.clone()), true)?.err())
        })
        .unwrap();
        eprintln!("[policy-only] refused: {refusal}");
        assert!(
            refusal.contains("\"guarded\" is required and cannot be injected"),
            "{refusal}"
        );
        let elsewhere = create(&cp, &plain_ns, &pod("elsewhere", app.clone()), false)
            .unwrap()
            .expect("a Pod the template does not select is admitted");
        assert_eq!(elsewhere["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_no_webhook_entry(&cp);
        return;
    }

    wait_condition(
        &cp,
        "guarded",
        ("PolicyServed", "True", "Served"),
        Duration::from_secs(60),
    )
    .unwrap();
    poll(Duration::from_secs(30), "the guard", || {
        cp.try_get_json("validatingadmissionpolicy", None, GUARD)
    })
    .unwrap();
    let injected = create(&cp, &guarded_ns, &pod("injected", app.clone()), false)
        .unwrap()
        .expect("the Pod is admitted");
    assert_eq!(
        container_image(&injected, "guarded-agent").as_deref(),
        Some("guarded.invalid/agent:1")
    );
    assert_no_webhook_entry(&cp);
    // After admission, the required sidecar cannot be replaced; the app's container can.
    let refusal = poll(
        Duration::from_secs(30),
        "the after-admission policy to refuse a new sidecar image",
        || {
            let out = cp.kubectl(&[
                "set",
                "image",
                "-n",
                &guarded_ns,
                "pod/injected",
                "guarded-agent=guarded.invalid/agent:other",
                "--dry-run=server",
            ])?;
            Ok((!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned()))
        },
    )
    .unwrap();
    let out = cp
        .kubectl(&[
            "set",
            "image",
            "-n",
            &guarded_ns,
            "pod/injected",
            "guarded-agent=guarded.invalid/agent:other",
        ])
        .unwrap();
    assert!(!out.status.success(), "the sidecar's image was replaced");
    eprintln!("[policy-only] set image: {refusal}");
    assert!(refusal.contains(AFTER_ADMISSION), "{refusal}");
    assert!(refusal.contains("\"guarded\" is required"), "{refusal}");
    cp.kubectl_ok(&[
        "set",
        "image",
        "-n",
        &guarded_ns,
        "pod/injected",
        "app=app.invalid/app:2",
    ])
    .unwrap();
    let stored = cp.get_json("pod", Some(&guarded_ns), "injected").unwrap();
    assert_eq!(
        container_image(&stored, "guarded-agent").as_deref(),
        Some("guarded.invalid/agent:1")
    );
    assert_eq!(
        container_image(&stored, "app").as_deref(),
        Some("app.invalid/app:2")
    );
    // A Pod named by the API server (a Deployment's): the policy renders `{{ pod.name }}` from
    // `generateName`, before the name is generated; the guard, which runs after, must judge it
    // the same way.
    let mut generated = pod("unused", app.clone());
    generated["metadata"] = json!({"generateName": "generated-"});
    let generated = create(&cp, &guarded_ns, &generated, false)
        .unwrap()
        .expect("a Pod with a generated name is admitted");
    let env = &generated["spec"]["containers"][1]["env"][0];
    assert_eq!(env["value"], "generated-", "{generated}");

    // No webhook call, yet the webhook's warnings: the warnings policy gives the same as
    // `render` (the opt-out a required template ignores, env kept as the Pod's, a templated
    // label value that is not one).
    let mut warned = pod(
        "warned",
        json!([{"name": "app", "image": "app.invalid/app:1", "env": [{"name": "MODE", "value": "other"}]}]),
    );
    // Its `owner` annotation also gives OWNER a value, which the proof Pod (without it) left
    // out: the guard must still recognise the template (it once refused this Pod).
    warned["metadata"]["annotations"] =
        json!({"sidecar.dev/inject": "false", "owner": "not a label value!"});
    let expected = render_warnings(&guarded("1"), &warned, &guarded_ns);
    assert_eq!(expected.len(), 3, "{expected:?}");
    let given = poll(Duration::from_secs(30), "the warnings policy", || {
        let (stored, warnings) = create_warned(&cp, &guarded_ns, &warned, true)?;
        anyhow::ensure!(stored.is_ok(), "refused: {stored:?}");
        Ok((!warnings.is_empty()).then_some(warnings))
    })
    .unwrap();
    eprintln!("[policy-only] warnings: {given:?}");
    // The API server says which policy warns, and by which binding: every template here
    // selects `guard=on` namespaces, the warnings policy's one namespace group.
    let from = format!(
        "Validation failed for ValidatingAdmissionPolicy '{WARNINGS}' with binding '{WARNINGS}-namespaces-0': "
    );
    let given: BTreeSet<String> = given
        .iter()
        .map(|w| w.strip_prefix(from.as_str()).unwrap_or(w).to_owned())
        .collect();
    assert_eq!(given, expected);

    // A best-effort template the Pod conflicts with is not applied, with a warning (`render`
    // names the field that differs; a policy cannot).
    cp.apply_yaml(EXTRA).unwrap();
    wait_condition(
        &cp,
        "extra",
        ("PolicyServed", "True", "Served"),
        Duration::from_secs(60),
    )
    .unwrap();
    let mut conflicting = pod(
        "conflicting",
        json!([
            {"name": "app", "image": "app.invalid/app:1"},
            {"name": "extra-agent", "image": "elsewhere.invalid/extra:1"},
        ]),
    );
    conflicting["metadata"]["labels"] = json!({"app": "extra"});
    let conflict = "SidecarTemplate \"extra\" not applied: the pod has a container, init container or volume named like one of the template's; without a webhook to tell a copy from a look-alike, the policy adds nothing of the template to such a pod";
    poll(Duration::from_secs(30), "the conflict warning", || {
        let (stored, warnings) = create_warned(&cp, &guarded_ns, &conflicting, true)?;
        let stored = stored.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            container_image(&stored, "extra-agent").as_deref() == Some("elsewhere.invalid/extra:1"),
            "the Pod's own container was replaced"
        );
        Ok(warnings.iter().any(|w| w.ends_with(conflict)).then_some(()))
    })
    .unwrap();
    cp.kubectl_ok(&["delete", "sidecartemplate", "extra"])
        .unwrap();

    // A best-effort template that takes the required one's container name first: the Pods it
    // selects are refused (without the required sidecar), the others still get it. The proof
    // once showed the shadow's container in the required one's place, so the guard took the
    // shadow's container for the required one: it admitted the first and refused the others.
    cp.apply_yaml(SHADOW).unwrap();
    wait_condition(
        &cp,
        "shadow",
        ("PolicyServed", "True", "Served"),
        Duration::from_secs(60),
    )
    .unwrap();
    let mut shadowed = pod("shadowed", app.clone());
    shadowed["metadata"]["labels"] = json!({"app": "shadow"});
    let refusal = poll(
        Duration::from_secs(30),
        "the guard to refuse a shadowed Pod",
        || Ok(create(&cp, &guarded_ns, &shadowed, true)?.err()),
    )
    .unwrap();
    eprintln!("[policy-only] shadowed: {refusal}");
    assert!(refusal.contains("\"guarded\" is required"), "{refusal}");
    let beside = create(&cp, &guarded_ns, &pod("beside-shadow", app.clone()), true)
        .unwrap()
        .expect("a Pod the shadow does not select is admitted");
    assert_eq!(
        container_image(&beside, "guarded-agent").as_deref(),
        Some("guarded.invalid/agent:1")
    );
    cp.kubectl_ok(&["delete", "sidecartemplate", "shadow"])
        .unwrap();

    let look_alike = pod(
        "look-alike",
        json!([
            {"name": "app", "image": "app.invalid/app:1"},
            {"name": "guarded-agent", "image": "elsewhere.invalid/agent:1"},
        ]),
    );
    let refusal = create(&cp, &guarded_ns, &look_alike, true)
        .unwrap()
        .expect_err("the guard refuses a look-alike");
    eprintln!("[policy-only] look-alike: {refusal}");
    assert!(refusal.contains("\"guarded\" is required"), "{refusal}");
    assert!(refusal.contains(GUARD), "{refusal}");

    // The operator stopped: the API server injects and guards alone.
    operator.stop().unwrap();
    let down = create(&cp, &guarded_ns, &pod("down", app.clone()), false)
        .unwrap()
        .expect("the Pod is admitted while the operator is down");
    assert!(container_image(&down, "guarded-agent").is_some());
    let refusal = create(&cp, &guarded_ns, &look_alike, true)
        .unwrap()
        .expect_err("the guard refuses a look-alike while the operator is down");
    assert!(refusal.contains("\"guarded\" is required"), "{refusal}");
    operator.restart().unwrap();

    // A change of the template: Pods created meanwhile get one version or the other, and
    // none is refused (the guard in between accepts both).
    cp.apply_yaml(&guarded("2")).unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    for n in 0.. {
        let stored = create(
            &cp,
            &guarded_ns,
            &pod(&format!("during-{n}"), app.clone()),
            true,
        )
        .unwrap()
        .unwrap_or_else(|refusal| panic!("a Pod was refused during the change: {refusal}"));
        let image = container_image(&stored, "guarded-agent").expect("injected");
        if seen.last() != Some(&image) {
            seen.push(image.clone());
        }
        if image.ends_with(":2") {
            // A few more after the switch: the guard for the new policy alone follows it.
            if seen.len() > 1 && n > 0 && started.elapsed() > Duration::from_secs(8) {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the new version never came: {seen:?}"
        );
    }
    eprintln!(
        "[policy-only] during the change: {seen:?} in {:?}",
        started.elapsed()
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("guarded.invalid/agent:2")
    );
    // The old version's look-alike is refused once the change settled.
    let old = pod(
        "old-version",
        json!([
            {"name": "app", "image": "app.invalid/app:1"},
            {"name": "guarded-agent", "image": "guarded.invalid/agent:1", "env": [{"name": "POD", "value": "old-version"}]},
        ]),
    );
    poll(
        Duration::from_secs(30),
        "the guard to drop version 1",
        || Ok(create(&cp, &guarded_ns, &old, true)?.err()),
    )
    .unwrap();
}

/// Creates Pods (server-side dry runs) of `app` in `namespace` one after another until `done`
/// holds for one (at most 90 s), and checks each: refused with a message `refused` accepts, or
/// admitted with `sidecar`. Once one was, never one admitted without it: before, the operator
/// has not taken the template in yet (a template is in force once the guard refuses what it
/// selects). The refusals' reasons, in order, deduplicated.
fn each_refused_or_injected(
    cp: &ControlPlane,
    namespace: &str,
    sidecar: &str,
    refused: impl Fn(&str) -> bool,
    done: impl Fn(&Result<Value, String>) -> bool,
) -> Vec<String> {
    let app = json!([{"name": "app", "image": "app.invalid/app:1"}]);
    let started = Instant::now();
    let mut refusals: Vec<String> = Vec::new();
    let mut before = 0;
    for n in 0.. {
        let answer = create(cp, namespace, &pod(&format!("pod-{n}"), app.clone()), true).unwrap();
        match &answer {
            Ok(stored) if container_image(stored, sidecar).is_none() => {
                assert!(
                    refusals.is_empty() && before == n,
                    "a Pod was admitted without {sidecar:?} after the guard answered: {stored}"
                );
                before += 1;
            }
            Ok(_) => {}
            Err(refusal) => {
                assert!(refused(refusal), "an unexpected refusal: {refusal}");
                // The same refusal of each Pod, whatever its name.
                let why = refusal
                    .split_once("denied request: ")
                    .map_or(refusal.as_str(), |(_, why)| why);
                if refusals.last().map(String::as_str) != Some(why) {
                    refusals.push(why.to_owned());
                }
            }
        }
        if done(&answer) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "never done; {before} admitted without {sidecar:?} first; refusals: {refusals:?}"
        );
    }
    eprintln!("[policy-only] {before} Pods admitted before the template was taken in");
    refusals
}

fn under_the_restricted_standard_a_required_template_never_fails_open() {
    let cp = ControlPlane::start().expect("the control plane starts");
    install_crd(&cp).unwrap();
    // The operator's namespace, where the proof's dry-run Pods are made, enforces `restricted`
    // (labelled before the operator applies it, which keeps labels it did not set).
    let operator_ns = "sidecar-injector-restricted";
    cp.kubectl_ok(&["create", "namespace", operator_ns])
        .unwrap();
    cp.kubectl_ok(&[
        "label",
        "namespace",
        operator_ns,
        "pod-security.kubernetes.io/enforce=restricted",
    ])
    .unwrap();
    let _operator = Operator::start(
        &cp,
        OperatorOptions {
            namespace: operator_ns.to_owned(),
            extra_args: Backend::Policy.args(),
            ..OperatorOptions::default()
        },
    )
    .expect("the operator starts");
    let labels = cp.get_json("namespace", None, operator_ns).unwrap()["metadata"]["labels"].clone();
    assert_eq!(
        labels["pod-security.kubernetes.io/enforce"], "restricted",
        "{labels}"
    );
    let secure_ns = cp.namespace("secure", &[("secure", "on")]).unwrap();
    let privileged_ns = cp.namespace("privileged", &[("privileged", "on")]).unwrap();
    let serves = cp.serves_mutating_admission_policies().unwrap();

    // (a) From the moment it is applied, each Pod the required template selects is refused
    // (until its policy runs) or injected: never admitted without it.
    cp.apply_yaml(SECURE).unwrap();
    let refusals = each_refused_or_injected(
        &cp,
        &secure_ns,
        "secure-agent",
        |refusal| refusal.contains("\"secure\" is required"),
        |answer| match answer {
            Ok(stored) => container_image(stored, "secure-agent").is_some(),
            Err(_) => !serves,
        },
    );
    eprintln!("[policy-only] restricted, secure: refused {refusals:?}");
    if !serves {
        // Nothing can inject: refused, saying why (the guard's probe Pod passes `restricted`).
        assert!(
            refusals
                .iter()
                .any(|r| r.contains("does not serve MutatingAdmissionPolicies")),
            "{refusals:?}"
        );
        return;
    }
    wait_condition(
        &cp,
        "secure",
        ("PolicyServed", "True", "Served"),
        Duration::from_secs(60),
    )
    .unwrap();

    // (b) A sidecar that breaks `restricted` fails its proof: the Pods the template selects are
    // refused from the start, saying why once the proof failed; never admitted without it.
    cp.apply_yaml(PRIVILEGED).unwrap();
    let refusals = each_refused_or_injected(
        &cp,
        &privileged_ns,
        "privileged-agent",
        |refusal| refusal.contains("\"privileged\" is required"),
        |answer| {
            answer
                .as_ref()
                .is_err_and(|refusal| refusal.contains("its proof failed"))
        },
    );
    eprintln!("[policy-only] restricted, privileged: refused {refusals:?}");
    let last = refusals.last().unwrap();
    assert!(last.contains("violates PodSecurity"), "{last}");
    let served = wait_condition(
        &cp,
        "privileged",
        ("PolicyServed", "False", "ProofFailed"),
        Duration::from_secs(60),
    )
    .unwrap();
    let message = served["message"].as_str().unwrap();
    assert!(
        message.contains("violates PodSecurity") && message.contains("refuses"),
        "{message}"
    );
    let ready = cp.get_json("sidecartemplate", None, "privileged").unwrap()["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready["status"], "False", "{ready}");
    // The guard is the settled one for each template, never a guard wrapping another: one
    // condition (a variable) per template, however often the proof is tried again.
    let guard = cp
        .get_json("validatingadmissionpolicy", None, GUARD)
        .unwrap();
    assert_eq!(
        guard["metadata"]["annotations"]["sidecar.dev/guard-templates"], "privileged,secure",
        "{guard}"
    );
    let variables: Vec<&str> = guard["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["t0_0", "t1_0"], "{guard}");
    // The policy in force stays, and still injects the template it serves.
    let app = json!([{"name": "app", "image": "app.invalid/app:1"}]);
    let stored = create(&cp, &secure_ns, &pod("still-served", app), true)
        .unwrap()
        .expect("the served template's Pods are admitted");
    assert!(
        container_image(&stored, "secure-agent").is_some(),
        "{stored}"
    );
}

/// With the `policy` backend, the webhook configuration has no entry: the webhook is never
/// called.
fn assert_no_webhook_entry(cp: &ControlPlane) {
    let configuration = poll(Duration::from_secs(30), "the webhook configuration", || {
        cp.try_get_json("mutatingwebhookconfiguration", None, CONFIGURATION)
    })
    .unwrap();
    assert_eq!(
        configuration["webhooks"].as_array().map_or(0, Vec::len),
        0,
        "{configuration}"
    );
}
