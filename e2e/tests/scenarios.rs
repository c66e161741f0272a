//! End-to-end scenarios against a real local control plane (etcd, kube-apiserver,
//! kube-controller-manager) and the real `kubectl`, with the operator running out of cluster.
//!
//! Each scenario is a test of its own, named after what it proves, so a failure names it and
//! one runs alone: `cargo test -p injector-e2e --test scenarios tutorial`. They share one
//! control plane and one operator (starting them per scenario would cost more than most
//! scenarios take), started by the first scenario that runs, so scenarios run one at a time,
//! each in fresh namespaces; everything is torn down when the last one ends, also when one
//! fails (`injector_e2e::harness::run_shared`: a plain `#[test]` cannot share a fixture and
//! then tear it down).
//!
//! Ignored unless `SIDECAR_INJECTOR_E2E=1` (`just e2e`), so `cargo test --workspace` stays
//! fast. `SIDECAR_INJECTOR_E2E_SLOW=1` also runs the slow ones (certificate rotation under
//! load, about 3 minutes).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use injector_e2e::harness::{self, Shared};
use injector_e2e::pod::{containers, init_containers, names};
use injector_e2e::steps::{
    CONFIGURATION, example, kubectl_run_args, policy_served, ready_condition, wait_crd_established,
    wait_entry_skips_policy_served, wait_injected, wait_invalid_event, wait_policy_holds,
    webhook_names,
};
use injector_e2e::{ControlPlane, Operator, OperatorOptions, poll, run_scenario, workspace_root};
use serde_json::Value;

const INJECTED: &str = "sidecar.dev/injected";
const NGINX_LABEL: (&str, &str) = ("sidecar.dev/example", "nginx-sidecar");
const ENFORCED_LABEL: (&str, &str) = ("security", "enforced");

/// What every scenario gets.
struct Env<'a> {
    cp: &'a ControlPlane,
    operator: &'a mut Operator,
}

type Scenario = fn(&mut Env<'_>) -> anyhow::Result<()>;

/// Scenarios that take minutes: run only with `SIDECAR_INJECTOR_E2E_SLOW=1`.
const SLOW_VAR: &str = "SIDECAR_INJECTOR_E2E_SLOW";
const SLOW: [&str; 1] = ["certificate_rotation_under_load_fails_no_call"];

const SCENARIOS: [(&str, Scenario); 24] = [
    ("tutorial_nginx_sidecar_is_injected", tutorial_nginx_sidecar),
    (
        "a_namespace_the_selector_does_not_match_gets_nothing",
        namespace_selector_non_match,
    ),
    ("opted_out_pods_and_namespaces_are_left_alone", opt_out),
    (
        "an_invalid_template_gets_ready_false_and_an_event",
        invalid_template,
    ),
    (
        "a_deleted_webhook_configuration_is_restored",
        configuration_restored,
    ),
    ("kube_system_is_never_touched", kube_system_never_touched),
    (
        "operator_down_refuses_required_pods_then_recovers",
        operator_down_then_back,
    ),
    (
        "on_request_native_proxy_only_when_asked",
        on_request_native_proxy,
    ),
    (
        "app_env_reaches_only_the_named_containers",
        app_env_named_containers,
    ),
    (
        "priority_decides_a_conflict_with_a_warning",
        priority_and_conflict,
    ),
    (
        "template_update_and_delete_reach_new_pods",
        template_updated_then_deleted,
    ),
    ("leader_election_fails_over", leader_election_failover),
    (
        "log_shipper_shares_a_volume_with_the_app",
        log_shipper_shared_volume,
    ),
    (
        "certificate_rotation_under_load_fails_no_call",
        certificate_rotation_under_load,
    ),
    (
        "a_deleted_certificate_secret_is_regenerated",
        certificate_secret_deleted,
    ),
    ("required_means_required", required_means_required),
    (
        "a_template_selecting_on_a_label_another_group_adds_is_called",
        dependent_templates_across_groups,
    ),
    (
        "an_unknown_required_group_is_denied_as_out_of_sync",
        unknown_required_group_denied,
    ),
    (
        "an_invalid_edit_keeps_a_required_templates_last_valid_generation",
        invalid_required_template_keeps_last_valid,
    ),
    (
        "pod_counts_follow_template_changes",
        pod_counts_follow_template_changes,
    ),
    (
        "kubectl_sidecar_status_and_explain",
        kubectl_sidecar_status_and_explain,
    ),
    (
        "kubectl_sidecar_check_names_the_broken_link",
        kubectl_sidecar_check,
    ),
    (
        "a_skipped_best_effort_template_leaves_an_event_on_the_replica_set",
        skipped_template_event,
    ),
    (
        "a_required_sidecar_cannot_be_replaced_after_admission",
        required_after_admission,
    ),
];

/// The control plane and the operator every scenario shares. The operator is declared first:
/// it is dropped (stopped) before the control plane.
struct Cluster {
    operator: Operator,
    cp: ControlPlane,
}

impl Cluster {
    /// Like a user: install the CRD, then start the operator.
    fn start() -> anyhow::Result<Self> {
        let cp = ControlPlane::start()?;
        cp.apply_file(&workspace_root().join("crds"))
            .context("kubectl apply -f crds/")?;
        wait_crd_established(&cp)?;
        let operator = Operator::start(&cp, OperatorOptions::default())?;
        Ok(Cluster { operator, cp })
    }
}

fn main() -> ExitCode {
    let slow = std::env::var(SLOW_VAR).is_ok_and(|v| v == "1");
    harness::run_shared(Shared {
        binary: "scenarios",
        ignored_because: None,
        scenarios: SCENARIOS
            .iter()
            .map(|&(name, scenario)| (name, scenario, SLOW.contains(&name) && !slow))
            .collect(),
        start: Cluster::start,
        run,
        finish,
    })
}

/// Runs one scenario on the shared cluster; one that failed half-way must not leave the
/// operator stopped for the next.
fn run(cluster: &mut Cluster, name: &'static str, scenario: Scenario) -> Result<(), String> {
    let mut env = Env {
        cp: &cluster.cp,
        operator: &mut cluster.operator,
    };
    let outcome = run_scenario(name, || scenario(&mut env));
    if cluster.operator.check_running().is_err() {
        eprintln!("[e2e] restarting the operator after {name}");
        let _ = cluster.operator.stop();
        cluster
            .operator
            .restart()
            .map_err(|e| format!("the operator does not restart: {e:#}"))?;
    }
    outcome
}

/// After the last scenario: the logs when one failed, then everything stopped.
fn finish(cluster: Cluster, failed: bool) -> bool {
    if failed {
        eprintln!("{}", cluster.operator.log_tail(40));
        cluster.cp.print_logs(40);
    }
    failed
}

// ---------------------------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------------------------

/// The classic tutorial: the nginx-sidecar example's template, then its workload; the
/// Deployment's Pod (created by the controller manager, Pending forever) has the sidecar.
fn tutorial_nginx_sidecar(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let entry = apply_template(cp, "nginx-sidecar")?;
    eprintln!("[e2e] nginx-sidecar is served by {entry}");
    // The API server picks webhook configuration changes up asynchronously: probe (with a
    // server-side dry run) until it injects, so the Deployment's Pod cannot race it.
    let probe_ns = cp.namespace("probe-nginx", &[NGINX_LABEL])?;
    wait_injected(cp, &probe_ns, &["app=web"], "nginx-sidecar")?;

    cp.apply_file(&example("nginx-sidecar/workload.yaml"))?;
    let pod = poll(
        Duration::from_secs(60),
        "the Pod of Deployment nginx-demo/web",
        || {
            Ok(cp
                .list_json("pods", Some("nginx-demo"), Some("app=web"))?
                .into_iter()
                .next())
        },
    )?;
    eprintln!("[e2e] pod {}", pod["metadata"]["name"]);
    ensure!(
        containers(&pod) == ["web", "nginx-sidecar"],
        "containers: {:?}",
        containers(&pod)
    );
    let injected = annotation(&pod, INJECTED).context("no sidecar.dev/injected annotation")?;
    ensure!(
        injected.starts_with("nginx-sidecar@"),
        "{INJECTED}: {injected}"
    );
    ensure!(
        volumes(&pod).contains(&"nginx-sidecar-conf".to_owned()),
        "volumes: {:?}",
        volumes(&pod)
    );
    ensure!(
        pod["status"]["phase"] == "Pending",
        "phase: {}",
        pod["status"]["phase"]
    );
    Ok(())
}

/// A Pod in a namespace the template's namespaceSelector does not match gets nothing,
/// while the same Pod in a matching namespace does.
fn namespace_selector_non_match(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "nginx-sidecar")?;
    let matching = cp.namespace("selected", &[NGINX_LABEL])?;
    wait_injected(cp, &matching, &["app=web"], "nginx-sidecar")?;

    let unlabelled = cp.namespace("unlabelled", &[])?;
    let pod = run_pod(cp, &unlabelled, "web", &["app=web"], &[])?;
    assert_untouched(&pod, "web")?;

    let other = cp.namespace("other-label", &[("sidecar.dev/example", "something-else")])?;
    let pod = run_pod(cp, &other, "web", &["app=web"], &[])?;
    assert_untouched(&pod, "web")
}

/// The opt-out annotation on a Pod and the opt-out label on a namespace.
fn opt_out(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "nginx-sidecar")?;
    let ns = cp.namespace("opt-out-pod", &[NGINX_LABEL])?;
    wait_injected(cp, &ns, &["app=web"], "nginx-sidecar")?;

    // The control: the same Pod without the annotation gets the sidecar.
    let pod = run_pod(cp, &ns, "web", &["app=web"], &[])?;
    ensure!(
        containers(&pod) == ["web", "nginx-sidecar"],
        "control pod: {:?}",
        containers(&pod)
    );
    let pod = run_pod(
        cp,
        &ns,
        "opted-out",
        &["app=web"],
        &["sidecar.dev/inject=false"],
    )?;
    assert_untouched(&pod, "opted-out")?;

    let disabled = cp.namespace(
        "opt-out-namespace",
        &[NGINX_LABEL, ("sidecar.dev/injection", "disabled")],
    )?;
    let pod = run_pod(cp, &disabled, "web", &["app=web"], &[])?;
    assert_untouched(&pod, "web")
}

/// A template the CRD's schema accepts but the injector finds invalid: `Ready=False` with
/// every message in its status, a Warning Event `Invalid` in namespace default, and it is never
/// used.
fn invalid_template(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-invalid";
    cp.apply_yaml(&format!(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: invalid}}
  containers:
    - name: broken
      image: busybox:1.36
      args: ["{{{{ pod.nope }}}}"]
  metadata:
    annotations:
      sidecar.dev/injected: forged
"#
    ))?;
    let condition = poll(
        Duration::from_secs(30),
        "Ready=False on e2e-invalid",
        || {
            let template = cp.get_json("sidecartemplate", None, name)?;
            Ok(ready_condition(&template)
                .filter(|c| c["status"] == "False")
                .filter(|_| {
                    template["status"]["observedGeneration"] == template["metadata"]["generation"]
                }))
        },
    )?;
    eprintln!("[e2e] condition: {condition}");
    ensure!(
        condition["reason"] == "Invalid",
        "reason: {}",
        condition["reason"]
    );
    let message = condition["message"].as_str().unwrap_or_default();
    for expected in [
        "spec.containers[0].args[0]",
        "unknown placeholder {{ pod.nope }}",
        r#"spec.metadata.annotations["sidecar.dev/injected"]"#,
        "reserved",
    ] {
        ensure!(
            message.contains(expected),
            "message {message:?} lacks {expected:?}"
        );
    }

    let event = wait_invalid_event(cp, name)?;
    eprintln!("[e2e] event note: {}", event["note"]);
    ensure!(event["type"] == "Warning", "type: {}", event["type"]);
    let note = event["note"].as_str().unwrap_or_default();
    ensure!(
        note.contains("spec.containers[0].args[0]"),
        "note: {note:?}"
    );

    // Never used: a Pod it would select is admitted unchanged (it has no webhook entry, so
    // even its default failurePolicy Fail blocks nothing).
    let ns = cp.namespace(
        "invalid-selected",
        &[("e2e.sidecar.dev/scenario", "invalid")],
    )?;
    let pod = run_pod(cp, &ns, "app", &[], &[])?;
    assert_untouched(&pod, "app")?;
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    Ok(())
}

/// Deleting the MutatingWebhookConfiguration: the operator puts it back within 20 s, with
/// the same entries, and injection works again.
fn configuration_restored(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let entry = apply_template(cp, "nginx-sidecar")?;
    let ns = cp.namespace("restore", &[NGINX_LABEL])?;
    wait_injected(cp, &ns, &["app=web"], "nginx-sidecar")?;
    let before =
        webhook_names(&cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?);
    ensure!(before.contains(&entry), "{entry} not in {before:?}");
    let uid_before = cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?["metadata"]
        ["uid"]
        .clone();

    cp.kubectl_ok(&["delete", "mutatingwebhookconfiguration", CONFIGURATION])?;
    let deleted = Instant::now();
    let restored = poll(
        Duration::from_secs(20),
        "the restored webhook configuration",
        || {
            Ok(cp
                .try_get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?
                .filter(|c| c["metadata"]["uid"] != uid_before))
        },
    )?;
    eprintln!("[e2e] restored after {:.1?}", deleted.elapsed());
    let after = webhook_names(&restored);
    ensure!(
        after == before,
        "entries before {before:?}, after {after:?}"
    );
    for webhook in restored["webhooks"].as_array().into_iter().flatten() {
        ensure!(
            webhook["clientConfig"]["caBundle"]
                .as_str()
                .is_some_and(|b| !b.is_empty()),
            "no caBundle in {}",
            webhook["name"]
        );
    }
    wait_injected(cp, &ns, &["app=web"], "nginx-sidecar")?;
    let pod = run_pod(cp, &ns, "web", &["app=web"], &[])?;
    ensure!(
        containers(&pod) == ["web", "nginx-sidecar"],
        "containers: {:?}",
        containers(&pod)
    );
    Ok(())
}

/// Pods in kube-system (and in the operator's own namespace) are never touched, even when
/// the namespace carries the labels a best-effort and a required template select.
fn kube_system_never_touched(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "nginx-sidecar")?;
    apply_template(cp, "security-agent")?;

    let protected = ["kube-system", "sidecar-injector"];
    let labels = [
        format!("{}={}", NGINX_LABEL.0, NGINX_LABEL.1),
        format!("{}={}", ENFORCED_LABEL.0, ENFORCED_LABEL.1),
    ];
    let result = (|| {
        for ns in protected {
            let mut args = vec!["label", "namespace", ns, "--overwrite"];
            args.extend(labels.iter().map(String::as_str));
            cp.kubectl_ok(&args)?;
        }
        // The control, created after the labels were set: once the API server injects there,
        // its namespace cache (updated in order) has the protected namespaces' labels too.
        let control = cp.namespace("both-labels", &[NGINX_LABEL, ENFORCED_LABEL])?;
        let probe = wait_injected(cp, &control, &["app=web"], "nginx-sidecar")?;
        ensure!(
            init_containers(&probe) == ["security-agent"],
            "control: init containers {:?}",
            init_containers(&probe)
        );
        for ns in protected {
            let pod = run_pod(cp, ns, "e2e-web", &["app=web"], &[])?;
            assert_untouched(&pod, "e2e-web")?;
            cp.kubectl_ok(&["delete", "pod", "e2e-web", "-n", ns, "--wait=false"])?;
        }
        Ok(())
    })();
    for ns in protected {
        cp.kubectl_ok(&[
            "label",
            "namespace",
            ns,
            "sidecar.dev/example-",
            "security-",
        ])?;
    }
    result
}

/// The operator stopped (SIGTERM): a Pod a required template selects is rejected with the
/// API server's webhook error, a Pod only a best-effort template selects is admitted without
/// the sidecar; the operator restarted: injection resumes. On Kubernetes 1.36+, where the
/// templates are served by the operator's MutatingAdmissionPolicy, both Pods are admitted
/// with their sidecars while the operator is down (the API server injects them and the
/// webhook entries skip what it served), and a look-alike of the required sidecar is still
/// rejected (it needs the webhook).
fn operator_down_then_back(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "nginx-sidecar")?;
    apply_template(cp, "security-agent")?;
    let enforced = cp.namespace("enforced", &[ENFORCED_LABEL])?;
    let best_effort = cp.namespace("best-effort", &[NGINX_LABEL])?;
    wait_injected(cp, &enforced, &[], "security-agent")?;
    wait_injected(cp, &best_effort, &["app=web"], "nginx-sidecar")?;
    // On Kubernetes 1.36+ the API server injects policy-served templates itself, and the
    // webhook entries skip the Pods it served.
    let by_policy = policy_served(cp, "nginx-sidecar")?;
    let required_by_policy = policy_served(cp, "security-agent")?;
    if required_by_policy {
        let entry = injector_e2e::steps::wait_served(cp, "security-agent", CONFIGURATION)?;
        wait_entry_skips_policy_served(cp, &entry)?;
    }

    let status = env.operator.stop()?;
    eprintln!("[e2e] operator stopped: {status}");
    ensure!(
        status.success(),
        "the operator exited with {status} after SIGTERM"
    );

    if required_by_policy {
        // The API server injects the required template and skips the webhook: admitted.
        let pod = run_pod(cp, &enforced, "agent-down", &[], &[])?;
        eprintln!(
            "[e2e] required, operator down, served by the policy: init containers {:?}",
            init_containers(&pod)
        );
        carries_security_agent(&pod, "agent-down")?;
        // A look-alike is not the template: it still needs the webhook, which is down.
        let look_alike = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "look-alike-down"},
            "spec": {
                "initContainers": [{"name": "security-agent", "image": "busybox:1.36", "restartPolicy": "Always"}],
                "containers": [{"name": "app", "image": "busybox:1.36"}],
            },
        });
        let out = cp.kubectl_with_stdin(
            &["create", "-n", &enforced, "-f", "-"],
            &look_alike.to_string(),
        )?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("[e2e] a look-alike, operator down: {}", stderr.trim());
        ensure!(
            !out.status.success() && stderr.contains("webhook"),
            "a look-alike of a required sidecar was admitted while the operator was down: {stderr}"
        );
    } else {
        let out = cp.kubectl(&kubectl_run_args("agent-down", &enforced, &[], &[]))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("[e2e] required, operator down: {}", stderr.trim());
        ensure!(
            !out.status.success(),
            "a Pod was admitted without its required template"
        );
        ensure!(
            stderr.contains("webhook"),
            "the error does not mention the webhook: {stderr}"
        );
        ensure!(
            cp.try_get_json("pod", Some(&enforced), "agent-down")?
                .is_none(),
            "the rejected Pod exists"
        );
    }

    let pod = run_pod(cp, &best_effort, "web-down", &["app=web"], &[])?;
    let while_down = containers(&pod);
    if by_policy {
        ensure!(
            while_down == ["web-down", "nginx-sidecar"],
            "the policy did not inject while the operator was down: {while_down:?}"
        );
    } else {
        assert_untouched(&pod, "web-down")?;
    }

    env.operator.restart()?;
    let probe = wait_injected(cp, &enforced, &[], "security-agent")?;
    eprintln!(
        "[e2e] injection resumed: init containers {:?}",
        init_containers(&probe)
    );
    let pod = run_pod(cp, &enforced, "agent-up", &[], &[])?;
    carries_security_agent(&pod, "agent-up")?;
    wait_injected(cp, &best_effort, &["app=web"], "nginx-sidecar")?;
    let pod = run_pod(cp, &best_effort, "web-up", &["app=web"], &[])?;
    ensure!(
        containers(&pod) == ["web-up", "nginx-sidecar"],
        "containers: {:?}",
        containers(&pod)
    );
    // The Pod admitted while the operator was down is not changed after the fact.
    let pod = cp.get_json("pod", Some(&best_effort), "web-down")?;
    ensure!(
        containers(&pod) == while_down,
        "containers {:?}, admitted with {while_down:?}",
        containers(&pod)
    );
    Ok(())
}

/// `pod` (its own container `own`) carries examples/security-agent and records it.
fn carries_security_agent(pod: &Value, own: &str) -> anyhow::Result<()> {
    ensure!(
        init_containers(pod) == ["security-agent"] && containers(pod) == [own],
        "init containers {:?}, containers {:?}",
        init_containers(pod),
        containers(pod)
    );
    ensure!(
        annotation(pod, INJECTED).is_some_and(|a| a.starts_with("security-agent@")),
        "{INJECTED}: {:?}",
        annotation(pod, INJECTED)
    );
    Ok(())
}

/// `injection: OnRequest` (examples/native-proxy): a Pod annotated
/// `sidecar.dev/templates: native-proxy` gets the `proxy` init container as a native sidecar
/// (`restartPolicy: Always`) with its placeholders rendered; a Pod without the annotation, in
/// the same namespace, gets nothing.
fn on_request_native_proxy(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "native-proxy")?;
    let ns = cp.namespace("native-proxy", &[])?;
    let requested = [("sidecar.dev/templates", "native-proxy")];
    let labels = [("app", "checkout")];
    poll(
        Duration::from_secs(30),
        "native-proxy to be injected (dry run)",
        || {
            let (pod, _) = create_pod(cp, &ns, "probe", &labels, &requested, true)?;
            Ok(init_containers(&pod)
                .contains(&"proxy".to_owned())
                .then_some(()))
        },
    )?;

    let (pod, _) = create_pod(cp, &ns, "checkout", &labels, &requested, false)?;
    ensure!(
        init_containers(&pod) == ["proxy"] && containers(&pod) == ["checkout"],
        "init containers {:?}, containers {:?}",
        init_containers(&pod),
        containers(&pod)
    );
    let proxy = &pod["spec"]["initContainers"][0];
    ensure!(
        proxy["restartPolicy"] == "Always",
        "restartPolicy: {}",
        proxy["restartPolicy"]
    );
    let args: Vec<&str> = proxy["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        args == [
            "--service-node",
            "checkout",
            "--service-cluster",
            "checkout"
        ],
        "args: {args:?}"
    );
    ensure!(
        env_value(&pod["spec"]["containers"][0], "HTTP_PROXY") == Some("http://127.0.0.1:15001"),
        "HTTP_PROXY: {:?}",
        env_value(&pod["spec"]["containers"][0], "HTTP_PROXY")
    );
    ensure!(
        pod["metadata"]["labels"]["proxy.sidecar.dev/injected"] == "true",
        "labels: {}",
        pod["metadata"]["labels"]
    );
    ensure!(
        annotation(&pod, INJECTED).is_some_and(|a| a.starts_with("native-proxy@")),
        "{INJECTED}: {:?}",
        annotation(&pod, INJECTED)
    );

    let (pod, _) = create_pod(cp, &ns, "batch", &[("app", "batch")], &[], false)?;
    assert_untouched(&pod, "batch")?;
    cp.kubectl_ok(&["delete", "sidecartemplate", "native-proxy", "--wait=true"])?;
    Ok(())
}

/// examples/app-env with its StatefulSet: the Pod the controller manager creates has the
/// env vars (placeholders rendered from its labels, annotations, name and namespace), envFrom
/// and mount in container `app`, nothing in `metrics`, and `app`'s own LOG_LEVEL kept.
fn app_env_named_containers(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "app-env")?;
    let ns = cp.namespace("app-env", &[("sidecar.dev/example", "app-env")])?;
    poll(
        Duration::from_secs(30),
        "app-env to be injected (dry run)",
        || {
            let (pod, _) = create_pod(cp, &ns, "app", &[], &[], true)?;
            Ok(annotation(&pod, INJECTED)
                .is_some_and(|a| a.starts_with("app-env@"))
                .then_some(()))
        },
    )?;

    // The example's StatefulSet, moved to the fresh namespace.
    let workload = std::fs::read_to_string(example("app-env/workload.yaml"))?;
    let statefulset = workload
        .split("\n---\n")
        .find(|doc| doc.contains("kind: StatefulSet"))
        .context("no StatefulSet in examples/app-env/workload.yaml")?
        .replace("namespace: env-demo", &format!("namespace: {ns}"));
    cp.apply_yaml(&statefulset)?;
    let pod = poll(
        Duration::from_secs(60),
        "the Pod orders-0 of StatefulSet orders",
        || cp.try_get_json("pod", Some(&ns), "orders-0"),
    )?;
    ensure!(
        containers(&pod) == ["app", "metrics"],
        "containers: {:?}",
        containers(&pod)
    );
    let app = &pod["spec"]["containers"][0];
    let metrics = &pod["spec"]["containers"][1];
    let env_names = names(&app["env"]);
    eprintln!("[e2e] app env: {env_names:?}");
    ensure!(
        env_names.first().map(String::as_str) == Some("LOG_LEVEL")
            && env_value(app, "LOG_LEVEL") == Some("info"),
        "LOG_LEVEL not kept: {}",
        app["env"]
    );
    let expected = [
        ("OTEL_SERVICE_NAME", "orders".to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            format!("k8s.namespace.name={ns},k8s.pod.name=orders-0,team=payments"),
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://otel-collector.observability.svc:4317".to_owned(),
        ),
    ];
    for (name, value) in &expected {
        ensure!(
            env_value(app, name) == Some(value.as_str()),
            "{name}: {:?}, expected {value:?}",
            env_value(app, name)
        );
    }
    let node_ip = app["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "NODE_IP")
        .context("no NODE_IP")?;
    ensure!(
        node_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP",
        "NODE_IP: {node_ip}"
    );
    ensure!(
        app["envFrom"][0]["configMapRef"]["name"] == "otel-defaults",
        "envFrom: {}",
        app["envFrom"]
    );
    let mount = app["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == "otel-certs")
        .context("no otel-certs mount in app")?;
    ensure!(
        mount["mountPath"] == "/etc/otel/certs" && mount["readOnly"] == true,
        "mount: {mount}"
    );
    ensure!(
        volumes(&pod).contains(&"otel-certs".to_owned()),
        "volumes: {:?}",
        volumes(&pod)
    );
    // metrics: nothing added (the API server's own service-account token mount aside).
    ensure!(
        names(&metrics["env"]).is_empty() && metrics["envFrom"].is_null(),
        "metrics got env {} / envFrom {}",
        metrics["env"],
        metrics["envFrom"]
    );
    ensure!(
        !names(&metrics["volumeMounts"]).contains(&"otel-certs".to_owned()),
        "metrics mounts: {:?}",
        names(&metrics["volumeMounts"])
    );
    ensure!(
        annotation(&pod, INJECTED).is_some_and(|a| a.starts_with("app-env@")),
        "{INJECTED}: {:?}",
        annotation(&pod, INJECTED)
    );
    cp.kubectl_ok(&["delete", "statefulset", "orders", "-n", &ns, "--wait=false"])?;
    cp.kubectl_ok(&["delete", "sidecartemplate", "app-env", "--wait=true"])?;
    Ok(())
}

/// Two best-effort templates add a container with the same name: the one of lower
/// priority applies first and wins (even though its name sorts last), the other is skipped,
/// and `kubectl run` prints the webhook's warning naming it.
fn priority_and_conflict(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let winner = "e2e-conflict-b";
    let loser = "e2e-conflict-a";
    let template = |name: &str, priority: u32, image: &str| {
        format!(
            r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: conflict}}
  priority: {priority}
  failurePolicy: Ignore
  containers:
    - name: helper
      image: {image}
"#
        )
    };
    cp.apply_yaml(&format!(
        "{}---{}",
        template(winner, 10, "busybox:1.36"),
        template(loser, 20, "alpine:3.20")
    ))?;
    let result = (|| {
        let entry = wait_served(cp, winner)?;
        wait_served(cp, loser)?;
        let ns = cp.namespace("conflict", &[("e2e.sidecar.dev/scenario", "conflict")])?;
        // A dry-run Pod gets the winner's container and the warning naming the loser.
        let probe = |waiting_for: &str| {
            let mut last = String::new();
            poll(Duration::from_secs(30), waiting_for, || {
                let (pod, warnings) = create_pod(cp, &ns, "probe", &[], &[], true)?;
                let image = container_image(&pod, "helper");
                last = format!(
                    "helper image {image:?}, {INJECTED} {:?}, warnings {:?}",
                    annotation(&pod, INJECTED),
                    warnings.trim()
                );
                Ok((image == Some("busybox:1.36") && warnings.contains(loser)).then_some(()))
            })
            .with_context(|| format!("the last dry run: {last}"))
        };
        // Until the API server has both entries, a Pod could get the loser's container alone.
        probe("both conflicting templates in use (dry run)")?;
        if cp.serves_mutating_admission_policies()? {
            // Once the policy serves both, the entry skips the Pods it served: not this one,
            // which lacks the loser. (The loser's presence was once learned from the winner's
            // container, which the proof Pod held in its place: the entry then skipped the
            // Pod, and the warning was lost.)
            wait_policy_holds(cp, winner, Some(1))?;
            wait_policy_holds(cp, loser, Some(1))?;
            wait_entry_skips_policy_served(cp, &entry)?;
            probe("the conflict warned about behind the policy (dry run)")?;
        }
        let out = cp.kubectl(&kubectl_run_args("app", &ns, &[], &[]))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("[e2e] kubectl run stderr: {}", stderr.trim());
        ensure!(out.status.success(), "kubectl run failed: {stderr}");
        ensure!(
            stderr.contains("Warning:") && stderr.contains(loser),
            "no warning naming {loser}: {stderr}"
        );
        let pod = cp.get_json("pod", Some(&ns), "app")?;
        ensure!(
            containers(&pod) == ["app", "helper"],
            "containers: {:?}",
            containers(&pod)
        );
        ensure!(
            container_image(&pod, "helper") == Some("busybox:1.36"),
            "helper image: {:?} (the winner's is busybox:1.36)",
            container_image(&pod, "helper")
        );
        let injected = annotation(&pod, INJECTED).unwrap_or_default();
        ensure!(
            injected.contains(&format!("{winner}@")) && !injected.contains(loser),
            "{INJECTED}: {injected:?}"
        );
        Ok(())
    })();
    cp.kubectl_ok(&["delete", "sidecartemplate", winner, loser, "--wait=true"])?;
    result
}

/// Updating a template: new Pods get the new version (`name@<new generation>`, the new
/// image); deleting it: its entry leaves the configuration and new Pods are not injected.
fn template_updated_then_deleted(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-update";
    let template = |image: &str| {
        format!(
            r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: update}}
  failurePolicy: Ignore
  containers:
    - name: updater
      image: {image}
"#
        )
    };
    cp.apply_yaml(&template("busybox:1.36"))?;
    let entry = wait_served(cp, name)?;
    let first = cp.get_json("sidecartemplate", None, name)?["metadata"]["generation"].clone();
    let ns = cp.namespace("update", &[("e2e.sidecar.dev/scenario", "update")])?;
    let pod = wait_injected(cp, &ns, &[], "updater")?;
    let (entries, fingerprints) = record(&pod);
    ensure!(
        entries == format!("{name}@{first}") && fingerprints[0].len() == 16,
        "{INJECTED}: {:?}, generation {first}",
        annotation(&pod, INJECTED)
    );
    let first_fingerprint = fingerprints[0].to_owned();

    cp.apply_yaml(&template("busybox:1.37"))?;
    wait_served(cp, name)?;
    let second = cp.get_json("sidecartemplate", None, name)?["metadata"]["generation"].clone();
    ensure!(second != first, "generation still {first}");
    wait_policy_holds(cp, name, second.as_i64())?;
    let expected = format!("{name}@{second}");
    poll(
        Duration::from_secs(30),
        &format!("{expected} to be injected (dry run)"),
        || {
            let (pod, _) = create_pod(cp, &ns, "probe", &[], &[], true)?;
            Ok((record(&pod).0 == expected).then_some(()))
        },
    )?;
    let (pod, _) = create_pod(cp, &ns, "after-update", &[], &[], false)?;
    let (entries, fingerprints) = record(&pod);
    // A new image: a new fingerprint, which tells the earlier Pods stale.
    ensure!(
        entries == expected && fingerprints[0] != first_fingerprint,
        "{INJECTED}: {:?} (before: {first_fingerprint})",
        annotation(&pod, INJECTED)
    );
    let image = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "updater")
        .map(|c| c["image"].clone());
    ensure!(
        image == Some(Value::from("busybox:1.37")),
        "updater image {image:?}"
    );

    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    wait_policy_holds(cp, name, None)?;
    poll(
        Duration::from_secs(30),
        &format!("entry {entry} to leave the webhook configuration"),
        || {
            let gone = cp
                .try_get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?
                .is_none_or(|c| !webhook_names(&c).contains(&entry));
            Ok(gone.then_some(()))
        },
    )?;
    poll(
        Duration::from_secs(30),
        "no injection after the delete (dry run)",
        || {
            let (pod, _) = create_pod(cp, &ns, "probe", &[], &[], true)?;
            Ok(annotation(&pod, INJECTED).is_none().then_some(()))
        },
    )?;
    let (pod, _) = create_pod(cp, &ns, "after-delete", &[], &[], false)?;
    assert_untouched(&pod, "after-delete")
}

/// Two replicas with leader election (in their own namespace, so their own Lease and
/// Secret; the main operator is stopped meanwhile): the leader writes the configuration with
/// its URL; stopped (SIGTERM), the other becomes leader within the lease duration, and a Pod a
/// required template selects, created right after, is injected and never admitted without it.
fn leader_election_failover(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    apply_template(cp, "security-agent")?;
    let status = env.operator.stop()?;
    ensure!(status.success(), "the main operator exited with {status}");
    let options = OperatorOptions {
        namespace: "sidecar-injector-ha".to_owned(),
        ..OperatorOptions::default()
    };
    let result = (|| {
        let mut first = Operator::start(cp, options.clone())?;
        wait_leader(&first, Duration::from_secs(30))?;
        let second = Operator::start(cp, options.clone())?;
        std::thread::sleep(Duration::from_secs(2));
        ensure!(
            !second.leads(),
            "both replicas claim leadership:\n{}",
            second.metrics().unwrap_or_default()
        );
        wait_configuration_url(cp, &first.webhook_url())?;
        let enforced = cp.namespace("ha-enforced", &[ENFORCED_LABEL])?;
        wait_injected(cp, &enforced, &[], "security-agent")?;

        let status = first.stop()?;
        let stopped = Instant::now();
        ensure!(status.success(), "the leader exited with {status}");
        wait_leader(&second, Duration::from_secs(15))?;
        eprintln!(
            "[e2e] the second replica leads {:.1?} after the leader stopped",
            stopped.elapsed()
        );
        // Right after: until the API server calls the new leader's URL, a Pod may be
        // rejected (required template, nobody answering) but never admitted without it.
        let mut rejected = 0;
        let mut n = 0;
        let pod = poll(
            Duration::from_secs(30),
            "a Pod injected by the new leader",
            || {
                n += 1;
                let name = format!("after-failover-{n}");
                match create_pod(cp, &enforced, &name, &[], &[], false) {
                    Ok((pod, _)) => Ok(Some(pod)),
                    Err(e) => {
                        rejected += 1;
                        eprintln!("[e2e] rejected meanwhile: {e:#}");
                        Ok(None)
                    }
                }
            },
        )?;
        eprintln!(
            "[e2e] first Pod admitted {:.1?} after the leader stopped ({rejected} rejected before)",
            stopped.elapsed()
        );
        ensure!(
            init_containers(&pod) == ["security-agent"],
            "admitted without its required sidecar: init containers {:?}",
            init_containers(&pod)
        );
        wait_configuration_url(cp, &second.webhook_url())?;
        Ok(())
    })();
    let restarted = env.operator.restart();
    result.and(restarted)
}

/// n (slow, `SIDECAR_INJECTOR_E2E_SLOW=1`). Certificate rotation under load: an operator with
/// `--serving-lifetime 90s --ca-lifetime 4m` (own namespace, so a fresh Secret; the main
/// operator is stopped meanwhile) while a Pod a required template selects is created (server
/// dry run) every 0.3 s, until a serving and a CA rotation have happened: every Pod is
/// admitted and injected.
fn certificate_rotation_under_load(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-rotation";
    cp.apply_yaml(&format!(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: rotation}}
  failurePolicy: Fail
  containers:
    - name: rotation-agent
      image: busybox:1.36
"#
    ))?;
    let status = env.operator.stop()?;
    ensure!(status.success(), "the main operator exited with {status}");
    let result = (|| {
        let operator = Operator::start(
            cp,
            OperatorOptions {
                namespace: "sidecar-injector-rotation".to_owned(),
                serving_lifetime: Some("90s".to_owned()),
                ca_lifetime: Some("4m".to_owned()),
                ..OperatorOptions::default()
            },
        )?;
        wait_leader(&operator, Duration::from_secs(30))?;
        wait_served(cp, name)?;
        wait_configuration_url(cp, &operator.webhook_url())?;
        let ns = cp.namespace("rotation", &[("e2e.sidecar.dev/scenario", "rotation")])?;
        wait_injected(cp, &ns, &[], "rotation-agent")?;
        let log = operator.log_path().context("no log")?.to_path_buf();
        let rotations = |text: &str| {
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("rotating certificates"))
                .collect();
            let ca = lines
                .iter()
                .filter(|l| l.contains("from the new CA"))
                .count();
            (lines.len(), ca)
        };
        let (initial, _) = rotations(&std::fs::read_to_string(&log)?);
        let started = Instant::now();
        let (mut ok, mut failures) = (0u32, Vec::new());
        let mut ca_seen: Option<Instant> = None;
        loop {
            match create_pod(cp, &ns, "load", &[], &[], true) {
                Ok((pod, _)) if containers(&pod).contains(&"rotation-agent".to_owned()) => {
                    ok += 1;
                }
                Ok((pod, _)) => failures.push(format!("not injected: {:?}", containers(&pod))),
                Err(e) => failures.push(format!("{e:#}")),
            }
            let (all, ca) = rotations(&std::fs::read_to_string(&log)?);
            if ca > 0 && ca_seen.is_none() {
                eprintln!(
                    "[e2e] CA rotated after {:.1?} ({} rotations since the load began)",
                    started.elapsed(),
                    all - initial
                );
                ca_seen = Some(Instant::now());
            }
            let serving_only = all - initial - ca;
            if serving_only >= 1 && ca_seen.is_some_and(|t| t.elapsed() > Duration::from_secs(15)) {
                break;
            }
            if started.elapsed() > Duration::from_secs(240) {
                bail!(
                    "no CA and serving rotation within 240 s ({all} rotations logged, {ca} of \
                     the CA)"
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let (all, ca) = rotations(&std::fs::read_to_string(&log)?);
        eprintln!(
            "[e2e] {ok} Pods injected in {:.1?}, {} failures; {} rotations ({ca} of the CA)",
            started.elapsed(),
            failures.len(),
            all - initial
        );
        ensure!(
            failures.is_empty(),
            "{} of {} Pods failed: {:?}",
            failures.len(),
            ok as usize + failures.len(),
            failures.iter().take(5).collect::<Vec<_>>()
        );
        Ok(())
    })();
    let restarted = env.operator.restart();
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    result.and(restarted)
}

/// The log-shipper example: its Deployment's Pod gets the shipper, the shared emptyDir, and
/// that volume mounted into the app container too; a Pod the pod selector excludes
/// (`logging.sidecar.dev/ship=false`) is left alone.
fn log_shipper_shared_volume(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let label = ("sidecar.dev/example", "log-shipper");
    apply_template(cp, "log-shipper")?;
    let probe_ns = cp.namespace("probe-logs", &[label])?;
    wait_injected(cp, &probe_ns, &[], "log-shipper")?;

    cp.apply_file(&example("log-shipper/workload.yaml"))?;
    let pod = poll(
        Duration::from_secs(60),
        "the Pod of Deployment logs-demo/api",
        || {
            Ok(cp
                .list_json("pods", Some("logs-demo"), Some("app=api"))?
                .into_iter()
                .next())
        },
    )?;
    ensure!(
        containers(&pod) == ["api", "log-shipper"],
        "containers: {:?}",
        containers(&pod)
    );
    let volume = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "app-logs")
        .context("no app-logs volume")?;
    ensure!(
        volume["emptyDir"]["sizeLimit"] == "256Mi",
        "volume: {volume}"
    );
    for (index, read_only) in [(0, false), (1, true)] {
        let container = &pod["spec"]["containers"][index];
        let mount = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == "app-logs")
            .with_context(|| format!("{} does not mount app-logs", container["name"]))?;
        ensure!(mount["mountPath"] == "/var/log/app", "mount: {mount}");
        ensure!(
            mount["readOnly"].as_bool().unwrap_or(false) == read_only,
            "mount: {mount}"
        );
    }
    let shipper = &pod["spec"]["containers"][1];
    ensure!(
        shipper["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name",
        "POD_NAME: {}",
        shipper["env"][0]
    );
    ensure!(
        env_value(shipper, "POD_NAMESPACE") == Some("logs-demo")
            && env_value(shipper, "APP") == Some("api"),
        "env: {}",
        shipper["env"]
    );
    ensure!(
        annotation(&pod, "logging.sidecar.dev/path") == Some("/var/log/app"),
        "annotations: {}",
        pod["metadata"]["annotations"]
    );

    let excluded = run_pod(
        cp,
        &probe_ns,
        "quiet",
        &["logging.sidecar.dev/ship=false"],
        &[],
    )?;
    assert_untouched(&excluded, "quiet")?;
    cp.kubectl_ok(&["delete", "namespace", "logs-demo", "--wait=false"])?;
    cp.kubectl_ok(&["delete", "sidecartemplate", "log-shipper", "--wait=true"])?;
    Ok(())
}

/// Deleting the certificate Secret: the leader notices and generates a new CA and
/// certificate within seconds (not at its next periodic check, a minute away), and injection
/// works with them.
fn certificate_secret_deleted(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let (namespace, name) = ("sidecar-injector", "sidecar-injector-tls");
    let old_ca = cp.get_json("secret", Some(namespace), name)?["data"]["ca.crt"].clone();
    cp.kubectl_ok(&["delete", "secret", name, "-n", namespace])?;
    let deleted = Instant::now();
    poll(
        Duration::from_secs(10),
        "a new certificate Secret with a new CA",
        || {
            Ok(cp
                .try_get_json("secret", Some(namespace), name)?
                .filter(|secret| secret["data"]["ca.crt"] != old_ca)
                .map(|_| ()))
        },
    )?;
    eprintln!(
        "[e2e] a new CA and certificate {:.1?} after the deletion",
        deleted.elapsed()
    );
    apply_template(cp, "nginx-sidecar")?;
    let ns = cp.namespace("new-ca", &[NGINX_LABEL])?;
    wait_injected(cp, &ns, &["app=web"], "nginx-sidecar")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `kubectl apply -f examples/NAME/sidecartemplate.yaml`, then waits until the template is
/// `Ready=True` for its generation and its webhook entry is in the configuration; returns the
/// entry's name.
/// Template B selects on a label template A adds (issue 11, rule 7). B has the lower
/// priority (10 against 50), so ordering entries by priority alone would put B's entry first:
/// the API server would skip it (the Pod does not carry the label yet) and, as it only
/// re-invokes webhooks it already called, never come back to it. Entries are ordered so that
/// A's comes first, and a Pod selected by A gets both containers.
fn dependent_templates_across_groups(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let (adds, selects) = ("e2e-dep-a", "e2e-dep-b");
    cp.apply_yaml(&format!(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {adds}
spec:
  priority: 50
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: dependent}}
  podSelector:
    matchLabels: {{app: dep-web}}
  metadata:
    labels: {{mesh: "on"}}
  containers:
    - name: dep-a
      image: busybox:1.36
---
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {selects}
spec:
  priority: 10
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: dependent}}
  podSelector:
    matchLabels: {{mesh: "on"}}
  containers:
    - name: dep-b
      image: busybox:1.36
"#
    ))?;
    let result = (|| {
        let entry_a = wait_served(cp, adds)?;
        let entry_b = wait_served(cp, selects)?;
        let ns = cp.namespace("dependent", &[("e2e.sidecar.dev/scenario", "dependent")])?;
        // Until the API server has both entries, a Pod may get A's container alone (dry runs
        // for up to 30 s; with B's entry first it never gets B's).
        wait_injected(cp, &ns, &["app=dep-web"], "dep-b")?;
        let pod = run_pod(cp, &ns, "web", &["app=dep-web"], &[])?;
        let got = containers(&pod);
        ensure!(
            got.contains(&"dep-a".to_owned()) && got.contains(&"dep-b".to_owned()),
            "containers {got:?}: both templates must apply"
        );
        ensure!(
            pod["metadata"]["labels"]["mesh"] == "on",
            "labels: {}",
            pod["metadata"]["labels"]
        );
        let injected = annotation(&pod, INJECTED).unwrap_or_default();
        ensure!(
            injected.contains(&format!("{adds}@")) && injected.contains(&format!("{selects}@")),
            "{INJECTED}: {injected:?}"
        );
        let entries =
            webhook_names(&cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?);
        eprintln!("[e2e] entries: {entries:?}");
        let position = |entry: &str| entries.iter().position(|e| e == entry);
        ensure!(
            position(&entry_a) < position(&entry_b),
            "{entry_a} (adds mesh=on) must come before {entry_b} (selects it): {entries:?}"
        );
        Ok(())
    })();
    cp.kubectl_ok(&["delete", "sidecartemplate", adds, selects, "--wait=true"])?;
    result
}

/// A replica that lags behind the cluster's templates is asked for a required group it does
/// not know (issue 11, rule 6): it denies the Pod, saying it is not in sync, instead of
/// admitting it without the required template. Played with a second webhook configuration
/// whose one entry calls the operator at `/mutate/fail-<id>` for an id no template has; a
/// best-effort id (`ignore-…`) at the same place is still allowed.
fn unknown_required_group_denied(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    // The caBundle the operator's own configuration trusts; it needs an entry, so a template.
    let name = "e2e-unknown-anchor";
    cp.apply_yaml(&format!(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  failurePolicy: Ignore
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: unknown-anchor}}
  containers:
    - name: anchor
      image: busybox:1.36
"#
    ))?;
    let stale = "e2e-stale-replica";
    let result = (|| {
        wait_served(cp, name)?;
        let configuration = cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?;
        let ca_bundle = configuration["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .context("no caBundle")?
            .to_owned();
        let base = env.operator.webhook_url();
        let entry = |policy: &str, id: &str, value: &str| {
            serde_json::json!({
                "name": format!("{id}.stale.e2e.sidecar.dev"),
                "clientConfig": {"url": format!("{base}/mutate/{id}"), "caBundle": ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"e2e.sidecar.dev/scenario": "unknown-group"}},
                "objectSelector": {"matchLabels": {"stale": value}},
                "failurePolicy": policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            })
        };
        let stale_configuration = serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": stale},
            "webhooks": [
                entry("Fail", "fail-00000000000000e2", "required"),
                entry("Ignore", "ignore-00000000000000e2", "best-effort"),
            ],
        });
        cp.apply_yaml(&stale_configuration.to_string())?;
        let ns = cp.namespace(
            "unknown-group",
            &[("e2e.sidecar.dev/scenario", "unknown-group")],
        )?;
        // The API server picks a new configuration up within a moment: until then a Pod is
        // admitted; wait for the denial with dry runs.
        let denial = poll(
            Duration::from_secs(30),
            "a Pod for an unknown required group denied",
            || {
                let mut args = kubectl_run_args("probe", &ns, &["stale=required"], &[]);
                args.extend(["--dry-run=server", "-o", "json"].map(str::to_owned));
                let out = cp.kubectl(&args)?;
                Ok((!out.status.success())
                    .then(|| String::from_utf8_lossy(&out.stderr).into_owned()))
            },
        )?;
        eprintln!("[e2e] denied: {}", denial.trim());
        ensure!(
            denial.contains("not in sync") && denial.contains("fail-00000000000000e2"),
            "the denial says why: {denial}"
        );
        let pod = run_pod(cp, &ns, "best-effort", &["stale=best-effort"], &[])?;
        assert_untouched(&pod, "best-effort")?;
        let metrics = env.operator.metrics()?;
        ensure!(
            metrics.contains("outcome=\"unknown_required_group\""),
            "no unknown_required_group outcome in the metrics"
        );
        Ok(())
    })();
    cp.kubectl_ok(&[
        "delete",
        "mutatingwebhookconfiguration",
        stale,
        "--ignore-not-found",
    ])?;
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    result
}

/// An edit that makes a required template invalid (issue 11, rule 6): its last valid
/// generation stays in force, so a new Pod still gets the sidecar of that generation; the
/// template says so with `Degraded=True`/`InvalidGenerationKept`, and a Warning event.
fn invalid_required_template_keeps_last_valid(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-kept";
    let template = |args: &str| {
        format!(
            r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  failurePolicy: Fail
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: kept}}
  containers:
    - name: kept-agent
      image: busybox:1.36
      args: ["{args}"]
"#
        )
    };
    cp.apply_yaml(&template("sleep"))?;
    let result = (|| {
        wait_served(cp, name)?;
        let valid_generation =
            cp.get_json("sidecartemplate", None, name)?["metadata"]["generation"]
                .as_i64()
                .context("no generation")?;
        let ns = cp.namespace("kept", &[("e2e.sidecar.dev/scenario", "kept")])?;
        wait_injected(cp, &ns, &[], "kept-agent")?;

        cp.apply_yaml(&template("{{ pod.nope }}"))?;
        let degraded = poll(Duration::from_secs(30), "Degraded=True on e2e-kept", || {
            let template = cp.get_json("sidecartemplate", None, name)?;
            if template["status"]["observedGeneration"] != template["metadata"]["generation"] {
                return Ok(None);
            }
            Ok(template["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Degraded"))
                .filter(|c| c["status"] == "True")
                .cloned())
        })?;
        eprintln!("[e2e] degraded: {degraded}");
        ensure!(
            degraded["reason"] == "InvalidGenerationKept",
            "reason: {}",
            degraded["reason"]
        );
        let message = degraded["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains(&format!(
                "the last valid generation, {valid_generation}, stays in force"
            )) && message.contains("spec.containers[0].args[0]"),
            "message: {message:?}"
        );
        let template_now = cp.get_json("sidecartemplate", None, name)?;
        ensure!(
            ready_condition(&template_now).is_some_and(|c| c["status"] == "False"),
            "Ready: {:?}",
            ready_condition(&template_now)
        );
        let event = poll(
            Duration::from_secs(30),
            "a Warning event InvalidGenerationKept on e2e-kept",
            || {
                Ok(cp
                    .list_json("events.events.k8s.io", Some("default"), None)?
                    .into_iter()
                    .find(|e| {
                        e["regarding"]["name"] == name
                            && e["reason"] == "InvalidGenerationKept"
                            && e["type"] == "Warning"
                    }))
            },
        )?;
        eprintln!("[e2e] event note: {}", event["note"]);

        let pod = run_pod(cp, &ns, "app", &[], &[])?;
        ensure!(
            containers(&pod) == ["app", "kept-agent"],
            "containers: {:?}",
            containers(&pod)
        );
        let injected = annotation(&pod, INJECTED).unwrap_or_default();
        ensure!(
            record(&pod).0 == format!("{name}@{valid_generation}"),
            "{INJECTED}: {injected:?}, want the last valid generation"
        );
        let recorded = &template_now["status"]["lastValid"];
        ensure!(
            recorded["generation"] == valid_generation,
            "status.lastValid: {recorded}"
        );

        // An operator started now never saw the valid generation: it keeps the one the
        // status records.
        env.operator.stop()?;
        env.operator.restart()?;
        let pod = run_pod(cp, &ns, "after-restart", &[], &[])?;
        ensure!(
            containers(&pod) == ["after-restart", "kept-agent"],
            "after a restart, containers: {:?}",
            containers(&pod)
        );
        Ok(())
    })();
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    result
}

fn apply_template(cp: &ControlPlane, name: &str) -> anyhow::Result<String> {
    cp.apply_file(&example(&format!("{name}/sidecartemplate.yaml")))?;
    wait_served(cp, name)
}

/// [`injector_e2e::steps::wait_served`] on the operator's default configuration.
fn wait_served(cp: &ControlPlane, name: &str) -> anyhow::Result<String> {
    injector_e2e::steps::wait_served(cp, name, CONFIGURATION)
}

/// `kubectl run NAME --image=busybox:1.36 -n NS [--labels] [--annotations]`, then the Pod as
/// stored.
fn run_pod(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    labels: &[&str],
    annotations: &[&str],
) -> anyhow::Result<Value> {
    let out = cp.kubectl(&kubectl_run_args(name, namespace, labels, annotations))?;
    if !out.status.success() {
        bail!(
            "kubectl run {name} -n {namespace} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let warnings = String::from_utf8_lossy(&out.stderr);
    if !warnings.trim().is_empty() {
        eprintln!("[e2e] kubectl run {name}: {}", warnings.trim());
    }
    cp.get_json("pod", Some(namespace), name)
}

/// The Pod has only its own container `own`, no init containers and no injection record.
fn assert_untouched(pod: &Value, own: &str) -> anyhow::Result<()> {
    let where_ = format!(
        "pod {}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or("?"),
        pod["metadata"]["name"].as_str().unwrap_or("?")
    );
    ensure!(
        containers(pod) == [own],
        "{where_}: containers {:?}",
        containers(pod)
    );
    ensure!(
        init_containers(pod).is_empty(),
        "{where_}: init containers {:?}",
        init_containers(pod)
    );
    ensure!(
        annotation(pod, INJECTED).is_none(),
        "{where_}: {INJECTED} = {:?}",
        annotation(pod, INJECTED)
    );
    Ok(())
}

/// Creates a Pod (one busybox container named `name`) from a manifest with `kubectl create -f -
/// -o json`, with a server-side dry run when `dry_run` (admission runs, nothing is stored);
/// returns the Pod as admitted and kubectl's standard error (the webhook's warnings).
fn create_pod(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
    dry_run: bool,
) -> anyhow::Result<(Value, String)> {
    let map = |pairs: &[(&str, &str)]| -> serde_json::Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect()
    };
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": map(labels),
            "annotations": map(annotations),
        },
        "spec": {"containers": [{"name": name, "image": "busybox:1.36"}]},
    });
    let mut args = vec!["create", "-f", "-", "-o", "json"];
    if dry_run {
        args.push("--dry-run=server");
    }
    let out = cp.kubectl_with_stdin(&args, &manifest.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!(
            "kubectl create pod {namespace}/{name} failed: {}",
            stderr.trim()
        );
    }
    Ok((serde_json::from_slice(&out.stdout)?, stderr))
}

/// The value of env var `name` of `container`.
fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// Waits until the operator's /metrics says it leads.
fn wait_leader(operator: &Operator, timeout: Duration) -> anyhow::Result<()> {
    poll(
        timeout,
        &format!("{} to lead", operator.webhook_url()),
        || Ok(operator.leads().then_some(())),
    )
}

/// Waits until every entry of the webhook configuration calls `url`.
fn wait_configuration_url(cp: &ControlPlane, url: &str) -> anyhow::Result<()> {
    poll(
        Duration::from_secs(30),
        &format!("the webhook configuration to call {url}"),
        || {
            let Some(configuration) =
                cp.try_get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?
            else {
                return Ok(None);
            };
            let webhooks = configuration["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let all = !webhooks.is_empty()
                && webhooks.iter().all(|w| {
                    w["clientConfig"]["url"]
                        .as_str()
                        .is_some_and(|u| u.starts_with(&format!("{url}/")))
                });
            Ok(all.then_some(()))
        },
    )
}

fn volumes(pod: &Value) -> Vec<String> {
    names(&pod["spec"]["volumes"])
}

fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["annotations"][key].as_str()
}

/// The Pod's record as `name@generation` entries, and the fingerprint each carries.
fn record(pod: &Value) -> (String, Vec<&str>) {
    let entries: Vec<(&str, &str)> = annotation(pod, INJECTED)
        .unwrap_or_default()
        .split(',')
        .map(|e| e.split_once('#').unwrap_or((e, "")))
        .collect();
    let names = entries
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",");
    (names, entries.into_iter().map(|(_, f)| f).collect())
}

/// A required template whose containers and volumes use most fields the API server defaults
/// or rewrites, so that a re-invocation (after the ServiceAccount plugin and a LimitRange
/// have changed the Pod) must recognise them as the template's.
const FORGED_TEMPLATE: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: e2e-forged
spec:
  namespaceSelector:
    matchLabels: {e2e.sidecar.dev/scenario: forged}
  failurePolicy: Fail
  initContainers:
    - name: guard
      image: busybox:1.36
      restartPolicy: Always
      args: ["--pod", "{{ pod.name }}"]
      startupProbe: {httpGet: {port: 9901}}
  containers:
    - name: agent
      image: busybox:1.36
      command: ["/agent"]
      args: ["--namespace", "{{ pod.namespace }}"]
      ports: [{containerPort: 9090, name: metrics}]
      env:
        - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        - {name: CPU, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: "1m"}}}
        - {name: TEAM, value: "{{ pod.annotations['team'] }}"}
      resources: {limits: {cpu: "0.5", memory: "1024Mi"}}
      readinessProbe: {httpGet: {port: 9090, path: /ready}}
      livenessProbe: {tcpSocket: {port: 9090}, periodSeconds: 20}
      lifecycle: {preStop: {httpGet: {port: 9090}}}
      volumeMounts:
        - {name: agent-config, mountPath: /etc/agent}
        - {name: agent-token, mountPath: /var/run/agent}
  volumes:
    - name: agent-config
      configMap: {name: agent-config, optional: true}
    - name: agent-secret
      secret: {secretName: agent, optional: true}
    - name: agent-token
      projected:
        sources:
          - serviceAccountToken: {path: token, audience: agent}
          - downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
    - name: agent-scratch
      emptyDir: {sizeLimit: "1024Mi"}
    - name: agent-host
      hostPath: {path: /var/log}
    - name: agent-info
      downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}
"#;

/// Required means required, through the real API server: a Pod carrying a required
/// template's defaulted, token-mounted, LimitRange-resourced containers is recognised on
/// re-invocation (admitted once, nothing added twice); a Pod's claim in `sidecar.dev/injected`
/// is not trusted; a look-alike of the sidecar, or its native sidecar placed after the Pod's own
/// init container, is denied naming what differs; an opted-out Pod still gets it, with a
/// warning.
fn required_means_required(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-forged";
    cp.apply_yaml(FORGED_TEMPLATE)?;
    let result = (|| {
        wait_served(cp, name)?;
        let ns = cp.namespace("forged", &[("e2e.sidecar.dev/scenario", "forged")])?;
        // The LimitRanger plugin then gives the injected containers resources on re-invocation.
        cp.apply_yaml(&format!(
            r#"
apiVersion: v1
kind: LimitRange
metadata: {{name: defaults, namespace: {ns}}}
spec:
  limits:
    - type: Container
      default: {{cpu: 200m, memory: 64Mi}}
      defaultRequest: {{cpu: 100m, memory: 32Mi}}
"#
        ))?;
        let create = |manifest: Value| -> anyhow::Result<std::process::Output> {
            cp.kubectl_with_stdin(&["create", "-f", "-", "-o", "json"], &manifest.to_string())
        };
        let pod = |pod_name: &str, annotations: Value, init: Value, extra: Value| {
            let mut containers = vec![serde_json::json!({"name": "app", "image": "busybox:1.36"})];
            if !extra.is_null() {
                containers.push(extra);
            }
            let mut spec = serde_json::json!({"containers": containers});
            if !init.is_null() {
                spec["initContainers"] = init;
            }
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": ns, "annotations": annotations},
                "spec": spec,
            })
        };
        let admitted = |out: &std::process::Output| -> anyhow::Result<Value> {
            ensure!(
                out.status.success(),
                "kubectl create failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(serde_json::from_slice(&out.stdout)?)
        };
        let denied = |out: &std::process::Output, expected: &str| -> anyhow::Result<()> {
            let stderr = String::from_utf8_lossy(&out.stderr);
            ensure!(
                !out.status.success(),
                "admitted, expected a denial ({expected})"
            );
            ensure!(
                stderr.contains(expected),
                "denied, but not for {expected:?}: {stderr}"
            );
            eprintln!("[e2e] denied as expected: {}", stderr.trim());
            Ok(())
        };
        let injected = |pod: &Value| -> anyhow::Result<()> {
            ensure!(
                containers(pod) == ["app", "agent"] && init_containers(pod) == ["guard"],
                "containers {:?}, init containers {:?}",
                containers(pod),
                init_containers(pod)
            );
            let record = annotation(pod, INJECTED).unwrap_or_default();
            ensure!(
                record.starts_with(&format!("{name}@")),
                "{INJECTED}: {record:?}"
            );
            Ok(())
        };

        // The API server defaults the injected containers, mounts the token into them and
        // applies the LimitRange, then calls the webhook again: it must find its sidecar there.
        // The first Pods may meet an API server whose configuration is not yet up to date.
        poll(
            Duration::from_secs(30),
            "a plain Pod admitted and injected",
            || {
                let _ = cp.kubectl(&["delete", "pod", "plain", "-n", &ns, "--wait=false"]);
                let out = create(pod(
                    "plain",
                    serde_json::json!({"team": "core"}),
                    Value::Null,
                    Value::Null,
                ))?;
                let pod = admitted(&out)?;
                Ok(injected(&pod).is_ok().then_some(()))
            },
        )?;

        // A claim is not trusted, whole or by name only.
        for (pod_name, claim) in [
            ("claims", format!("{name}@1")),
            ("claims-name", name.to_owned()),
        ] {
            let out = create(pod(
                pod_name,
                serde_json::json!({INJECTED: claim}),
                Value::Null,
                Value::Null,
            ))?;
            injected(&admitted(&out)?)?;
        }

        // A look-alike of the sidecar: its name and image, another command.
        let look_alike = serde_json::json!({"name": "agent", "image": "busybox:1.36", "command": ["sleep", "infinity"]});
        let out = create(pod(
            "look-alike",
            serde_json::json!({INJECTED: format!("{name}@1")}),
            Value::Null,
            look_alike,
        ))?;
        denied(
            &out,
            "container \"agent\" already exists (in the pod) and is not the template's",
        )?;

        // The native sidecar, exactly, but after the Pod's own init container.
        let guard = |pod_name: &str| {
            serde_json::json!({
                "name": "guard", "image": "busybox:1.36", "restartPolicy": "Always",
                "args": ["--pod", pod_name], "startupProbe": {"httpGet": {"port": 9901}},
            })
        };
        let own_init = serde_json::json!({"name": "migrate", "image": "busybox:1.36"});
        let out = create(pod(
            "late-guard",
            serde_json::json!({}),
            serde_json::json!([own_init, guard("late-guard")]),
            Value::Null,
        ))?;
        denied(
            &out,
            "a native sidecar must come before the pod's own init containers",
        )?;
        // In its place it is the template's: nothing is added twice.
        let out = create(pod(
            "early-guard",
            serde_json::json!({}),
            serde_json::json!([guard("early-guard"), own_init]),
            Value::Null,
        ))?;
        let pod_json = admitted(&out)?;
        ensure!(
            init_containers(&pod_json) == ["guard", "migrate"],
            "init containers: {:?}",
            init_containers(&pod_json)
        );

        // The opt-out does not apply to a required template; kubectl prints why.
        let out = create(pod(
            "opted-out",
            serde_json::json!({"sidecar.dev/inject": "false"}),
            Value::Null,
            Value::Null,
        ))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        injected(&admitted(&out)?)?;
        ensure!(
            stderr.contains(
                "is required: the pod's sidecar.dev/inject: \"false\" does not apply to it"
            ),
            "no warning about the opt-out: {stderr}"
        );
        Ok(())
    })();
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    result
}

/// [`injector_e2e::steps::wait_pod_counts`] within 30 s.
fn wait_pod_counts(cp: &ControlPlane, name: &str, want: [u64; 4]) -> anyhow::Result<Duration> {
    injector_e2e::steps::wait_pod_counts(cp, name, want, Duration::from_secs(30))
}

/// The leader's Pod census: Pods created before a template are missing, the ones it injects
/// current; an image edit makes them stale (with a `PodsStale` event), and the status that
/// first observes it carries those counts; a priority edit changes nothing; `kubectl get sct`
/// shows the counts and `/metrics` has them.
fn pod_counts_follow_template_changes(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-census";
    let template = |image: &str, priority: i32| {
        one_container_template(name, "census", "counted", "counted-agent", image, priority)
    };
    let ns = cp.namespace("census", &[("e2e.sidecar.dev/scenario", "census")])?;
    let counted = [("app", "counted")];
    // Before the template: these two will be missing.
    for pod in ["early-1", "early-2"] {
        create_pod(cp, &ns, pod, &counted, &[], false)?;
    }
    // A Pod the template does not select counts nowhere.
    create_pod(cp, &ns, "other", &[("app", "other")], &[], false)?;
    cp.apply_yaml(&template("busybox:1.36", 10))?;
    wait_served(cp, name)?;
    wait_dry_run_image(cp, &ns, &counted, "counted-agent", "busybox:1.36")?;
    for pod in ["late-1", "late-2"] {
        let (pod, _) = create_pod(cp, &ns, pod, &counted, &[], false)?;
        ensure!(annotation(&pod, INJECTED).is_some(), "not injected: {pod}");
    }
    let took = wait_pod_counts(cp, name, [2, 2, 0, 2])?;
    eprintln!("[e2e] counts after the Pods were created: {took:.1?}");

    // An image edit: the two injected Pods are stale; a Pod created now is current. The first
    // status that observes the edit already carries its counts: observedGeneration never
    // stands beside the previous generation's (current 2, stale 0).
    cp.apply_yaml(&template("busybox:1.37", 10))?;
    let started = Instant::now();
    let generation = cp.get_json("sidecartemplate", None, name)?["metadata"]["generation"].clone();
    let status = poll(Duration::from_secs(30), "the image edit observed", || {
        let template = cp.get_json("sidecartemplate", None, name)?;
        let status = &template["status"];
        Ok((status["observedGeneration"] == generation).then(|| status.clone()))
    })?;
    let counts = ["injected", "current", "stale", "missing"].map(|k| status["pods"][k].as_u64());
    ensure!(
        counts == [Some(2), Some(0), Some(2), Some(2)],
        "observedGeneration {generation} beside status.pods {}",
        status["pods"]
    );
    eprintln!(
        "[e2e] the image edit observed, with its counts: {:.1?}",
        started.elapsed()
    );
    wait_dry_run_image(cp, &ns, &counted, "counted-agent", "busybox:1.37")?;
    create_pod(cp, &ns, "after-edit", &counted, &[], false)?;
    wait_pod_counts(cp, name, [3, 1, 2, 2])?;
    poll(Duration::from_secs(30), "a PodsStale event", || {
        Ok(cp
            .list_json("events.events.k8s.io", Some("default"), None)?
            .into_iter()
            .find(|e| e["regarding"]["name"] == name && e["reason"] == "PodsStale"))
    })?;

    // A priority edit changes what is in force but not what is injected: nothing goes stale.
    cp.apply_yaml(&template("busybox:1.37", 20))?;
    let generation = cp.get_json("sidecartemplate", None, name)?["metadata"]["generation"].clone();
    poll(
        Duration::from_secs(30),
        "the priority edit observed",
        || {
            let template = cp.get_json("sidecartemplate", None, name)?;
            Ok((template["status"]["observedGeneration"] == generation).then_some(()))
        },
    )?;
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        injector_e2e::steps::pod_counts(cp, name)? == Some([3, 1, 2, 2]),
        "after a priority edit: {:?}",
        injector_e2e::steps::pod_counts(cp, name)?
    );

    // Deleting a stale Pod and a missing one: the counts follow.
    cp.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        &ns,
        "late-1",
        "early-1",
        "--wait=false",
    ])?;
    wait_pod_counts(cp, name, [2, 1, 1, 1])?;

    let table = cp.kubectl_ok(&["get", "sct", name])?;
    let header = table.lines().next().unwrap_or_default();
    for column in ["INJECTED", "CURRENT", "STALE", "MISSING"] {
        ensure!(header.contains(column), "kubectl get sct: {table}");
    }
    let metrics = env.operator.metrics()?;
    for (state, count) in [("current", 1), ("stale", 1), ("missing", 1)] {
        let line = format!(
            "sidecar_injector_template_pods{{template=\"{name}\",state=\"{state}\"}} {count}"
        );
        ensure!(metrics.contains(&line), "/metrics lacks {line}");
    }
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    Ok(())
}

/// The image of `pod`'s container `name`.
fn container_image<'a>(pod: &'a Value, name: &str) -> Option<&'a str> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)?["image"]
        .as_str()
}

/// `kubectl sidecar ARGS` through the real kubectl, which finds the plugin as `kubectl-sidecar`
/// on `PATH` (a symbolic link to the binary under test, first on `PATH`); its standard output.
/// kubectl takes no flag before a plugin's name, so this does without `kubectl_command`'s.
fn kubectl_sidecar(cp: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let out = kubectl_sidecar_output(cp, args)?;
    ensure!(
        out.status.success(),
        "kubectl sidecar {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `kubectl sidecar ARGS`, whatever its exit status.
fn kubectl_sidecar_output(
    cp: &ControlPlane,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    let bin = cp.dir().join("plugin-bin");
    let link = bin.join("kubectl-sidecar");
    if !link.exists() {
        std::fs::create_dir_all(&bin)?;
        std::os::unix::fs::symlink(injector_e2e::operator_binary()?, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    std::process::Command::new(cp.kubectl_path())
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("PATH", path)
        .arg("sidecar")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("cannot run kubectl")
}

/// The kubectl plugin against live Pods: a bare Pod created before the template is missing
/// and not restartable, a Deployment's Pods made stale by an image edit are shown under the
/// Deployment, the counts agree with the operator's `status.pods` (table and JSON), and
/// `explain` says what a Pod carries and why the template applies to it or not.
fn kubectl_sidecar_status_and_explain(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-plugin";
    let template = |image: &str| {
        one_container_template(name, "plugin", "plugged", "plugged-agent", image, 100)
    };
    let ns = cp.namespace("plugin", &[("e2e.sidecar.dev/scenario", "plugin")])?;
    let plugged = [("app", "plugged")];
    // Before the template: missing, and no workload can restart it.
    create_pod(cp, &ns, "bare", &plugged, &[], false)?;
    create_pod(cp, &ns, "other", &[("app", "other")], &[], false)?;
    cp.apply_yaml(&template("busybox:1.36"))?;
    wait_served(cp, name)?;
    wait_dry_run_image(cp, &ns, &plugged, "plugged-agent", "busybox:1.36")?;
    apply_web_deployment(cp, &ns, "plugged", 2, "busybox:1.36")?;
    let web_pods = poll(
        Duration::from_secs(60),
        "the Deployment's 2 Pods, injected",
        || {
            let pods: Vec<Value> = cp
                .list_json("pods", Some(&ns), None)?
                .into_iter()
                .filter(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("web-"))
                })
                .collect();
            let injected = pods.iter().all(|p| annotation(p, INJECTED).is_some());
            Ok((pods.len() == 2 && injected).then_some(pods))
        },
    )?;
    let web_pod = web_pods[0]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // An image edit: the Deployment's Pods are stale; a Pod created now is current.
    cp.apply_yaml(&template("busybox:1.37"))?;
    wait_policy_holds(cp, name, Some(2))?;
    wait_dry_run_image(cp, &ns, &plugged, "plugged-agent", "busybox:1.37")?;
    create_pod(cp, &ns, "late", &plugged, &[], false)?;
    // (injected, current, stale, missing), as the operator writes them.
    wait_pod_counts(cp, name, [3, 1, 2, 1])?;

    let table = kubectl_sidecar(cp, &["status", name])?;
    eprintln!("[e2e] kubectl sidecar status {name}:\n{table}");
    let row = |first: &str| -> Vec<&str> {
        table
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.first() == Some(&first))
            .unwrap_or_default()
    };
    ensure!(
        row(name) == [name, "True", "OnCreate", "3", "1", "2", "1", "-"],
        "the template's row: {:?}",
        row(name)
    );
    let deployment_row = table.lines().find(|l| l.contains("deployment/web"));
    ensure!(
        deployment_row.is_some_and(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.get(..5) == Some(&[ns.as_str(), "deployment/web", "yes", "2", "0"][..])
        }),
        "no Deployment with 2 stale Pods: {deployment_row:?}"
    );
    let bare_row = table.lines().find(|l| l.contains("pod/bare"));
    ensure!(
        bare_row.is_some_and(|l| l.contains("no: bare Pod")),
        "the bare Pod is not listed as not restartable: {bare_row:?}"
    );
    ensure!(
        !table.contains("pod/other") && !table.contains("pod/late"),
        "{table}"
    );
    ensure!(
        !table.contains("differs"),
        "the operator's count differs: {table}"
    );

    let json: Value = serde_json::from_str(&kubectl_sidecar(cp, &["status", "-o", "json"])?)?;
    let ours = json["templates"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == name))
        .context("the template is not in the JSON")?;
    let counts = serde_json::json!({"injected": 3, "current": 1, "stale": 2, "missing": 1});
    ensure!(ours["pods"] == counts, "pods: {}", ours["pods"]);
    ensure!(
        ours["statusPods"] == counts,
        "statusPods: {}",
        ours["statusPods"]
    );
    let workloads = ours["workloads"].as_array().cloned().unwrap_or_default();
    ensure!(
        workloads.iter().any(|w| w["kind"] == "Deployment"
            && w["name"] == "web"
            && w["stale"].as_array().map(Vec::len) == Some(2)
            && w.get("notRestartable").is_none()),
        "workloads: {workloads:?}"
    );
    ensure!(
        workloads.iter().any(|w| w["kind"] == "Pod"
            && w["name"] == "bare"
            && w["notRestartable"] == "bare Pod"),
        "workloads: {workloads:?}"
    );

    let bare = kubectl_sidecar(cp, &["explain", "pod/bare", "-n", &ns])?;
    eprintln!("[e2e] kubectl sidecar explain pod/bare:\n{bare}");
    for line in [
        "carries (sidecar.dev/injected): nothing".to_owned(),
        format!("missing  {name}"),
        format!("applied  {name}"),
    ] {
        ensure!(bare.contains(&line), "explain pod/bare lacks {line:?}");
    }
    let stale = kubectl_sidecar(cp, &["explain", &format!("pod/{web_pod}"), "-n", &ns])?;
    eprintln!("[e2e] kubectl sidecar explain pod/{web_pod}:\n{stale}");
    for line in [
        format!(
            "stale    {name} (carries generation 1; in force: generation 2, only images changed since)"
        ),
        "created by replicaset/web-".to_owned(),
        format!("skipped  {name}"),
    ] {
        ensure!(
            stale.contains(&line),
            "explain pod/{web_pod} lacks {line:?}"
        );
    }
    let other = kubectl_sidecar(cp, &["explain", "pod/other", "-n", &ns])?;
    ensure!(
        other.contains("the pod selector does not match the pod's labels"),
        "explain pod/other:\n{other}"
    );
    let workload = kubectl_sidecar(cp, &["explain", "deployment/web", "-n", &ns])?;
    ensure!(
        workload.contains(&format!("applied  {name} (generation 2")),
        "explain deployment/web:\n{workload}"
    );

    cp.kubectl_ok(&["delete", "deployment", "web", "-n", &ns, "--wait=false"])?;
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    Ok(())
}

/// A best-effort template `name` adding one container `container` of `image`, selecting Pods
/// labelled `app: APP` in namespaces labelled `e2e.sidecar.dev/scenario: SCENARIO`.
/// The links of a `kubectl sidecar check -o json` report: link, state, message.
type Links = Vec<(String, String, String)>;

/// `kubectl sidecar check ARGS -o json`: whether it exited 0, and each link's state and
/// message by link.
fn check(cp: &ControlPlane, args: &[&str]) -> anyhow::Result<(bool, Links)> {
    let args: Vec<&str> = ["check"]
        .into_iter()
        .chain(args.iter().copied())
        .chain(["-o", "json"])
        .collect();
    let out = kubectl_sidecar_output(cp, &args)?;
    report_of(&out, &args)
}

/// A `check -o json` report's exit status and links.
fn report_of(out: &std::process::Output, args: &[&str]) -> anyhow::Result<(bool, Links)> {
    let report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "kubectl sidecar {}: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let links = report["links"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let text = |key: &str| l[key].as_str().unwrap_or_default().to_owned();
            (text("link"), text("state"), text("message"))
        })
        .collect();
    // 4 is `check`'s verdict, a broken link; 1 would be an error of the command.
    let broken = report["broken"].as_bool();
    ensure!(
        out.status.code() == Some(if broken == Some(true) { 4 } else { 0 }),
        "exit status {} with broken={}",
        out.status,
        report["broken"]
    );
    Ok((out.status.success(), links))
}

/// [`check`] as `user` (impersonated through a kubeconfig of the control plane's).
fn check_as(cp: &ControlPlane, user: &str, args: &[&str]) -> anyhow::Result<(bool, Links)> {
    let kubeconfig = cp.dir().join(format!("{user}.json"));
    cp.write_impersonating_kubeconfig(user, &["system:authenticated"], &kubeconfig)?;
    let out = std::process::Command::new(injector_e2e::operator_binary()?)
        .args(["kubectl", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("check")
        .args(args)
        .args(["-o", "json"])
        .output()?;
    report_of(&out, args)
}

/// The state and message of `link` in a `check` report.
fn link_state<'r>(
    links: &'r [(String, String, String)],
    link: &str,
) -> anyhow::Result<(&'r str, &'r str)> {
    links
        .iter()
        .find(|(name, _, _)| name == link)
        .map(|(_, state, message)| (state.as_str(), message.as_str()))
        .with_context(|| format!("no link {link:?} in {links:?}"))
}

/// `kubectl sidecar check` against the live plumbing: all ok (the operator out of the
/// cluster: its URL's certificate verified by a TLS handshake), a Pod's record current; then,
/// with the operator serving but not leading (another holder in its Lease, so nothing is
/// restored behind the test's back), a caBundle of another CA and a deleted configuration are
/// each the broken link, with exit status 4; once it leads again, all ok again.
fn kubectl_sidecar_check(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-check";
    cp.apply_yaml(&one_container_template(
        name,
        "check",
        "checked",
        "check-agent",
        "busybox:1.36",
        100,
    ))?;
    wait_served(cp, name)?;
    let ns = cp.namespace("check", &[("e2e.sidecar.dev/scenario", "check")])?;
    wait_dry_run_image(
        cp,
        &ns,
        &[("app", "checked")],
        "check-agent",
        "busybox:1.36",
    )?;
    create_pod(cp, &ns, "checked", &[("app", "checked")], &[], false)?;

    // The operator runs out of cluster here: no Deployment to read the names from, so they
    // are assumed from the release's name, which `names` says as a warning.
    let all_ok = |args: &[&str]| -> anyhow::Result<Links> {
        let (ok, links) = check(cp, args)?;
        let bad: Vec<_> = links
            .iter()
            .filter(|(link, state, message)| {
                let assumed = link == "names" && state == "warning" && message.contains("assumed");
                state != "ok" && state != "skipped" && !assumed
            })
            .collect();
        ensure!(ok && bad.is_empty(), "check {args:?}: {bad:?}\n{links:#?}");
        Ok(links)
    };
    let links = all_ok(&[])?;
    let (_, bundle) = link_state(&links, "ca bundle")?;
    ensure!(
        bundle.starts_with("verifies the certificate served at https://127.0.0.1:"),
        "{bundle}"
    );
    let links = all_ok(&["checked", "-n", &ns])?;
    let (_, record) = link_state(&links, "record")?;
    ensure!(
        record.ends_with(&format!("current with {name}")),
        "{record}"
    );
    let (_, selection) = link_state(&links, "selection")?;
    ensure!(
        selection.contains(&format!("selected by {name} (best effort)")),
        "{selection}"
    );
    let table = kubectl_sidecar(cp, &["check"])?;
    eprintln!("[e2e] kubectl sidecar check:\n{table}");
    ensure!(
        table
            .lines()
            .any(|l| l.starts_with("webhook configuration") && l.contains(" ok ")),
        "{table}"
    );

    // As someone who reads less: `view` cluster-wide (no chart here, so not even
    // SidecarTemplates). What cannot be read says so, on its line; nothing is broken.
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "e2e-check-viewer",
        "--clusterrole=view",
        "--user=check-viewer",
    ])?;
    let viewed = check_as(cp, "check-viewer", &["checked", "-n", &ns]);
    cp.kubectl_ok(&["delete", "clusterrolebinding", "e2e-check-viewer"])?;
    let (ok, links) = viewed?;
    ensure!(ok, "check as a viewer: {links:#?}");
    for link in ["leader", "webhook configuration", "templates", "selection"] {
        let (state, message) = link_state(&links, link)?;
        ensure!(
            state == "unknown"
                && message.starts_with("cannot read ")
                && message.contains(": forbidden"),
            "as a viewer, {link}: {state}: {message}"
        );
    }
    eprintln!("[e2e] kubectl sidecar check as a viewer: {links:#?}");

    // The operator serves, but another holder keeps its Lease: nothing is put back.
    let status = env.operator.stop()?;
    ensure!(status.success(), "the operator exited with {status}");
    let renewed = format!(
        "{}.000000Z",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S")
    );
    let lease = serde_json::json!({"spec": {
        "holderIdentity": "e2e-someone-else",
        "leaseDurationSeconds": 3600,
        "renewTime": renewed,
        "acquireTime": renewed,
    }});
    let broken = (|| {
        cp.kubectl_ok(&[
            "patch",
            "lease",
            "sidecar-injector-leader",
            "-n",
            "sidecar-injector",
            "--type",
            "merge",
            "-p",
            &lease.to_string(),
        ])?;
        env.operator.restart()?;
        let links = all_ok(&[])?;
        let (_, leader) = link_state(&links, "leader")?;
        ensure!(leader.contains("held by e2e-someone-else"), "{leader}");

        // A caBundle of another CA (the control plane's): every entry's.
        let other = std::fs::read(cp.ca_cert_path())?;
        let configuration = cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?;
        let entries = configuration["webhooks"].as_array().map_or(0, Vec::len);
        let patch: Vec<Value> = (0..entries)
            .map(|i| {
                serde_json::json!({
                    "op": "replace",
                    "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                    // caBundle's bytes, base64 in JSON as every ByteString.
                    "value": k8s_openapi::ByteString(other.clone()),
                })
            })
            .collect();
        cp.kubectl_ok(&[
            "patch",
            "mutatingwebhookconfiguration",
            CONFIGURATION,
            "--type",
            "json",
            "-p",
            &Value::from(patch).to_string(),
        ])?;
        let (ok, links) = check(cp, &[])?;
        let (state, message) = link_state(&links, "ca bundle")?;
        eprintln!("[e2e] a caBundle of another CA: ca bundle {state}: {message}");
        ensure!(!ok && state == "broken", "{links:#?}");
        ensure!(
            message.starts_with("does not verify the certificate served at"),
            "{message}"
        );
        let (state, _) = link_state(&links, "webhook configuration")?;
        ensure!(state == "ok", "{links:#?}");

        cp.kubectl_ok(&["delete", "mutatingwebhookconfiguration", CONFIGURATION])?;
        let (ok, links) = check(cp, &[])?;
        let (state, message) = link_state(&links, "webhook configuration")?;
        eprintln!("[e2e] the configuration deleted: webhook configuration {state}: {message}");
        ensure!(!ok && state == "broken", "{links:#?}");
        ensure!(message.contains("not found"), "{message}");
        Ok(())
    })();
    // The Lease back to the operator, which then restores its configuration.
    let restored = (|| {
        cp.kubectl_ok(&[
            "delete",
            "lease",
            "sidecar-injector-leader",
            "-n",
            "sidecar-injector",
        ])?;
        if env.operator.check_running().is_err() {
            let _ = env.operator.stop();
            env.operator.restart()?;
        }
        wait_configuration_url(cp, &env.operator.webhook_url())?;
        poll(Duration::from_secs(30), "check all ok again", || {
            Ok(all_ok(&[]).ok().map(|_| ()))
        })
    })();
    broken.and(restored)?;
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    Ok(())
}

/// A Deployment's Pods with a container of the same name as a best-effort template's, but
/// another: the template is skipped at admission (a conflict), and the warning goes to
/// kube-controller-manager, which creates the Pods. The leader tells it where the app team
/// reads it: one Event on the ReplicaSet (its uid, so `kubectl describe` shows it), naming the
/// template and the conflict.
fn skipped_template_event(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let name = "e2e-skipped";
    cp.apply_yaml(&one_container_template(
        name,
        "skipped",
        "skipped",
        "web",
        "busybox:1.36",
        100,
    ))?;
    wait_served(cp, name)?;
    // Where the API server serves policies, the policy skips it: no webhook call, no warning.
    wait_policy_holds(cp, name, Some(1))?;
    let served = policy_served(cp, name)?;
    eprintln!("[e2e] {name} served by the MutatingAdmissionPolicy: {served}");
    let ns = cp.namespace("skipped", &[("e2e.sidecar.dev/scenario", "skipped")])?;
    apply_web_deployment(cp, &ns, "skipped", 3, "app.invalid/web:1")?;
    let started = Instant::now();
    let events = poll(
        Duration::from_secs(60),
        "an Event on the ReplicaSet naming the skipped template",
        || {
            let events = cp.list_json("events.events.k8s.io", Some(&ns), None)?;
            let told: Vec<Value> = events
                .into_iter()
                .filter(|e| e["reason"] == "TemplateSkipped")
                .collect();
            Ok((!told.is_empty()).then_some(told))
        },
    )?;
    eprintln!(
        "[e2e] told after {:.1?}: {}",
        started.elapsed(),
        events[0]["note"]
    );
    ensure!(
        events.len() == 1,
        "one Event per owner and template: {events:#?}"
    );
    let event = &events[0];
    let replica_sets = cp.list_json("replicasets", Some(&ns), None)?;
    ensure!(replica_sets.len() == 1, "{replica_sets:#?}");
    let rs = &replica_sets[0]["metadata"];
    ensure!(
        event["regarding"]["kind"] == "ReplicaSet"
            && event["regarding"]["name"] == rs["name"]
            && event["regarding"]["uid"] == rs["uid"],
        "regarding {}, not the ReplicaSet {}",
        event["regarding"],
        rs["name"]
    );
    let note = event["note"].as_str().unwrap_or_default();
    ensure!(
        note.contains(&format!("SidecarTemplate {name}")) && note.contains("conflict"),
        "{note}"
    );
    let rs_name = rs["name"].as_str().unwrap_or_default();
    let described = cp.kubectl_ok(&["describe", "replicaset", rs_name, "-n", &ns])?;
    ensure!(described.contains("TemplateSkipped"), "{described}");
    cp.kubectl_ok(&["delete", "deployment", "web", "-n", &ns, "--wait=false"])?;
    cp.kubectl_ok(&["delete", "sidecartemplate", name, "--wait=true"])?;
    Ok(())
}

/// Applies Deployment `web` in `namespace`: `replicas` Pods labelled `app: APP`, each with
/// one container `web` of `image`.
fn apply_web_deployment(
    cp: &ControlPlane,
    namespace: &str,
    app: &str,
    replicas: u32,
    image: &str,
) -> anyhow::Result<()> {
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
    });
    cp.apply_yaml(&deployment.to_string())?;
    Ok(())
}

fn one_container_template(
    name: &str,
    scenario: &str,
    app: &str,
    container: &str,
    image: &str,
    priority: i32,
) -> String {
    format!(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: {name}
spec:
  namespaceSelector:
    matchLabels: {{e2e.sidecar.dev/scenario: {scenario}}}
  podSelector:
    matchLabels: {{app: {app}}}
  priority: {priority}
  failurePolicy: Ignore
  containers:
    - name: {container}
      image: {image}
"#
    )
}

/// Waits until a Pod labelled `labels` created in `namespace` (a server-side dry run) gets
/// container `container` of `image`: the webhook serves that version of the template.
fn wait_dry_run_image(
    cp: &ControlPlane,
    namespace: &str,
    labels: &[(&str, &str)],
    container: &str,
    image: &str,
) -> anyhow::Result<()> {
    poll(
        Duration::from_secs(30),
        &format!("{container} of {image} injected (dry run)"),
        || {
            let (pod, _) = create_pod(cp, namespace, "probe", labels, &[], true)?;
            Ok((container_image(&pod, container) == Some(image)).then_some(()))
        },
    )
}

/// A required template selecting Pods labelled `app: kept`.
const KEPT_TEMPLATE: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata:
  name: e2e-kept
spec:
  namespaceSelector:
    matchLabels: {e2e.sidecar.dev/scenario: after-admission}
  podSelector:
    matchLabels: {app: kept}
  failurePolicy: Fail
  updateStrategy: {type: InPlace}
  containers:
    - name: kept-agent
      image: busybox:1.36
      args: ["--pod", "{{ pod.name }}"]
"#;

/// The after-admission policy beside the operator's default policy name.
const AFTER_ADMISSION: &str = "sidecar-injector-after-admission";

/// `kubectl set image pod/POD CONTAINER=IMAGE -n NAMESPACE` (`dry_run`: server-side): `Err`
/// with kubectl's message when refused.
fn set_image(
    cp: &ControlPlane,
    namespace: &str,
    pod: &str,
    container: &str,
    image: &str,
    dry_run: bool,
) -> anyhow::Result<Result<(), String>> {
    let assignment = format!("{container}={image}");
    let mut args = vec!["set", "image", "-n", namespace, pod, assignment.as_str()];
    if dry_run {
        args.push("--dry-run=server");
    }
    let out = cp.kubectl(&args)?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    })
}

/// After admission, a required template's container cannot be replaced: `kubectl set image`
/// on it is refused by the after-admission policy, saying why, on every backend; the app's own
/// container may still change, `kubectl debug` (an ephemeral container) is still allowed, the
/// operator's own in-place update to the template's new version (its exact patch) passes, and
/// a best-effort template's Pods are not affected.
fn required_after_admission(env: &mut Env<'_>) -> anyhow::Result<()> {
    let cp = env.cp;
    let loose = "e2e-loose";
    cp.apply_yaml(KEPT_TEMPLATE)?;
    cp.apply_yaml(&one_container_template(
        loose,
        "after-admission",
        "loose",
        "loose-agent",
        "busybox:1.36",
        5,
    ))?;
    let result = (|| {
        let ns = cp.namespace(
            "after-admission",
            &[("e2e.sidecar.dev/scenario", "after-admission")],
        )?;
        wait_injected(cp, &ns, &["app=kept"], "kept-agent")?;
        wait_injected(cp, &ns, &["app=loose"], "loose-agent")?;
        let kept = run_pod(cp, &ns, "kept", &["app=kept"], &[])?;
        ensure!(
            containers(&kept) == ["kept", "kept-agent"],
            "kept: {:?}",
            containers(&kept)
        );
        // The API server type-checks the policy's CEL against the Pod's schema (the unit tests'
        // interpreter has no types): no warning.
        let checked = poll(
            Duration::from_secs(30),
            "the after-admission policy, type-checked",
            || {
                let policy = cp.try_get_json("validatingadmissionpolicy", None, AFTER_ADMISSION)?;
                Ok(policy.filter(|p| p["status"]["typeChecking"].is_object()))
            },
        )?;
        let warnings = &checked["status"]["typeChecking"]["expressionWarnings"];
        ensure!(
            warnings.as_array().is_none_or(Vec::is_empty),
            "type-checking warnings: {warnings}"
        );
        // The API server loads the policy on its own time: dry runs until it refuses.
        let refusal = poll(
            Duration::from_secs(30),
            "the after-admission policy to refuse a new sidecar image",
            || Ok(set_image(cp, &ns, "pod/kept", "kept-agent", "busybox:1.37", true)?.err()),
        )?;
        eprintln!("[e2e] set image refused: {refusal}");
        for expected in [AFTER_ADMISSION, "SidecarTemplate \"e2e-kept\" is required"] {
            ensure!(refusal.contains(expected), "no {expected:?} in: {refusal}");
        }
        let refused = set_image(cp, &ns, "pod/kept", "kept-agent", "busybox:1.37", false)?;
        ensure!(refused.is_err(), "the sidecar's image was replaced");
        let stored = cp.get_json("pod", Some(&ns), "kept")?;
        ensure!(
            container_image(&stored, "kept-agent") == Some("busybox:1.36"),
            "kept-agent: {:?}",
            container_image(&stored, "kept-agent")
        );

        // The app's own container may change.
        set_image(cp, &ns, "pod/kept", "kept", "busybox:1.37", false)?
            .map_err(anyhow::Error::msg)
            .context("the app container's image change")?;
        let stored = cp.get_json("pod", Some(&ns), "kept")?;
        ensure!(
            container_image(&stored, "kept") == Some("busybox:1.37"),
            "kept: {:?}",
            container_image(&stored, "kept")
        );

        // `kubectl debug` adds an ephemeral container (pods/ephemeralcontainers): allowed.
        cp.kubectl_ok(&[
            "debug",
            "-n",
            &ns,
            "pod/kept",
            "--image=busybox:1.36",
            "--container=debugger",
        ])
        .context("kubectl debug")?;
        let stored = cp.get_json("pod", Some(&ns), "kept")?;
        ensure!(
            names(&stored["spec"]["ephemeralContainers"]) == ["debugger"],
            "ephemeral containers: {}",
            stored["spec"]["ephemeralContainers"]
        );

        // A new version differing only in images: the operator's own in-place update to it
        // (the patch `in_place_patch` builds, sent as the rollout sends it) passes; the same
        // images without the record moved do not.
        cp.apply_yaml(&KEPT_TEMPLATE.replace("image: busybox:1.36", "image: busybox:1.37"))?;
        wait_dry_run_image(cp, &ns, &[("app", "kept")], "kept-agent", "busybox:1.37")?;
        let template: injector_api::SidecarTemplate =
            serde_json::from_value(cp.get_json("sidecartemplate", None, "e2e-kept")?)?;
        let template = injector_core::compile(&template).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(cp.get_json("pod", Some(&ns), "kept")?)?;
        let patch = injector_core::after_admission::rollout::in_place_patch(&template, &pod)
            .context("no in-place patch for the Pod")?;
        let refused = set_image(cp, &ns, "pod/kept", "kept-agent", "busybox:1.37", true)?;
        ensure!(
            refused.is_err(),
            "the new version's image without the record was allowed"
        );
        // The API server loads the new version of the policy on its own time.
        let patch_args = |dry_run: bool| {
            let mut args = vec![
                "patch".to_owned(),
                "-n".to_owned(),
                ns.clone(),
                "pod/kept".to_owned(),
                "--type=strategic".to_owned(),
                format!("--patch={patch}"),
            ];
            if dry_run {
                args.push("--dry-run=server".to_owned());
            }
            args
        };
        poll(
            Duration::from_secs(30),
            "the operator's in-place update to be allowed",
            || {
                Ok(cp
                    .kubectl(&patch_args(true))?
                    .status
                    .success()
                    .then_some(()))
            },
        )?;
        cp.kubectl_ok(&patch_args(false))
            .context("the operator's in-place update")?;
        let updated = cp.get_json("pod", Some(&ns), "kept")?;
        ensure!(
            container_image(&updated, "kept-agent") == Some("busybox:1.37"),
            "kept-agent after the in-place update: {:?}",
            container_image(&updated, "kept-agent")
        );
        ensure!(
            annotation(&updated, INJECTED)
                .is_some_and(|r| r.starts_with(&format!("e2e-kept@{}#", template.generation))),
            "the record after the in-place update: {:?}",
            annotation(&updated, INJECTED)
        );
        // And the sidecar stays at that version.
        let back = set_image(cp, &ns, "pod/kept", "kept-agent", "busybox:1.36", false)?;
        ensure!(back.is_err(), "the sidecar's image was set back");

        // A best-effort template's container is not kept.
        let loose_pod = run_pod(cp, &ns, "loose", &["app=loose"], &[])?;
        ensure!(
            containers(&loose_pod) == ["loose", "loose-agent"],
            "loose: {:?}",
            containers(&loose_pod)
        );
        set_image(cp, &ns, "pod/loose", "loose-agent", "busybox:1.37", false)?
            .map_err(anyhow::Error::msg)
            .context("a best-effort sidecar's image change")?;
        Ok(())
    })();
    cp.kubectl_ok(&[
        "delete",
        "sidecartemplate",
        "e2e-kept",
        loose,
        "--wait=true",
    ])?;
    result
}
