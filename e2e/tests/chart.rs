//! The helm chart against a real local control plane, without a node: lint, schema
//! validation of what it renders (and of the examples) with kubeconform, `helm install` of a
//! chart whose CRD lacks a field and the `helm upgrade` that brings it (the CRD is one of the
//! chart's templates, and the template written before keeps its data), and
//! the operator run out of cluster with the chart's ServiceAccount token and the Deployment's
//! arguments (its RBAC is enough for everything the operator does, including adopting a Lease
//! left by an older release). Least privilege past RBAC, impersonating that ServiceAccount:
//! what the chart's ValidatingAdmissionPolicy refuses and admits, that no API-registered policy
//! runs on admission policies while the chart's static policy does (1.37+), and no `create` on
//! MutatingAdmissionPolicies with the webhook backend (ValidatingAdmissionPolicies it still
//! creates: the after-admission policy). Then `helm uninstall` leaving nothing behind but the
//! CRD (`helm.sh/resource-policy: keep`). The chart
//! installed for real on the node and its `kubectl auth can-i` matrix (no more than enough) are
//! node scenarios too (`e2e/tests/node.rs`).
//!
//! Off unless `SIDECAR_INJECTOR_E2E=1` (`just e2e`), like the scenarios.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use injector_core::policy::NAMESPACE_BINDING_SLOTS;
use injector_e2e::harness;
use injector_e2e::release::{CRD, Release};
use injector_e2e::schemas::{schema_location, write_kubeconform_schemas};
use injector_e2e::steps::{
    example, wait_condition, wait_crd_established, wait_injected, wait_invalid_event, wait_served,
};
use injector_e2e::{
    ControlPlane, ControlPlaneOptions, Operator, OperatorOptions, kube_version, poll, tool,
    workspace_root,
};
use serde_json::Value;

/// The release, its namespace, and so (the chart's full name being the release name when it
/// contains the chart's name) the name of every object it creates.
const RELEASE: &str = "sidecar-injector";
const NAMESPACE: &str = "sidecar-injector";
const CHART: Release<'static> = Release {
    namespace: NAMESPACE,
    fullname: RELEASE,
};

fn main() -> ExitCode {
    harness::run_tests("chart", &[("chart", chart)])
}

fn chart() {
    let started = Instant::now();
    let helm = Helm::new().expect("helm is built");
    let chart = workspace_root().join("charts/sidecar-injector");

    step("helm lint --strict, with the defaults and with every optional object");
    helm.run(&["lint", "--strict", path(&chart)]).unwrap();
    let mut lint = vec!["lint", "--strict", path(&chart)];
    for set in OPTIONALS {
        lint.extend(["--set", set]);
    }
    helm.run(&lint).unwrap();

    // Static admission policies, the one kind the API server runs on admission policies, are on
    // by default from Kubernetes 1.37 (the default control plane is 1.34).
    let static_policies = kube_minor().is_some_and(|minor| minor >= 37);
    let cp = ControlPlane::start_with(ControlPlaneOptions {
        static_policies,
        ..ControlPlaneOptions::default()
    })
    .expect("the control plane starts");

    step(
        "helm install of a release whose CRD lacks a field, then helm upgrade brings it (no --wait: nothing runs Pods here)",
    );
    upgrade_brings_the_crd(&cp, &helm, &chart).unwrap();
    for (kind, namespace) in CHART.installed() {
        cp.get_json(kind, namespace, RELEASE)
            .unwrap_or_else(|e| panic!("helm install created no {kind}: {e:#}"));
    }
    for (kind, namespace, name) in CHART.created_at_run_time() {
        assert!(
            cp.try_get_json(kind, namespace, &name).unwrap().is_none(),
            "helm rendered {kind} {name}: the operator owns it"
        );
    }
    for kind in [
        "validatingadmissionpolicy",
        "validatingadmissionpolicybinding",
    ] {
        cp.get_json(kind, None, &least_privilege_policy())
            .unwrap_or_else(|e| panic!("helm install created no least-privilege {kind}: {e:#}"));
    }

    step("helm template validated by kubeconform against this API server's own schemas");
    validate_with_kubeconform(&cp, &helm, &chart).unwrap();

    step(
        "managed clusters: the webhook's port, hostNetwork and priorityClassName, and what follows them",
    );
    managed_cluster_values(&cp, &helm, &chart).unwrap();

    step("the NetworkPolicy lets a Prometheus in any namespace scrape, and a value narrows it");
    metrics_network_policy(&cp, &helm, &chart).unwrap();

    step("reading SidecarTemplates: the built-in view role (aggregated), and viewerRbac.subjects");
    viewer_rbac(&cp, &helm, &chart).unwrap();

    step(
        "writing a required template that selects every namespace, or the cluster's own, is warned about",
    );
    template_safety_warnings(&cp).unwrap();

    step("the operator with the chart's ServiceAccount token and the chart's arguments");
    let mut operator = start_operator_as_service_account(&cp).expect("the operator starts");
    exercise_operator(&cp, &operator)
        .unwrap_or_else(|e| panic!("the chart's RBAC is not enough: {e:#}"));

    step("least privilege in the cluster: what RBAC allows and the chart's policy refuses");
    prove_least_privilege(&cp).unwrap();
    if static_policies {
        step(
            "the chart's static policy, loaded by the API server, limits the admission policies' names too",
        );
        prove_static_policy(&cp, &helm, &chart).unwrap();
    }
    let log = std::fs::read_to_string(operator.log_path().unwrap()).unwrap();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused something:\n{}",
        operator.log_tail(40)
    );
    operator.stop().unwrap();

    step("the ServiceAccount's permissions, without and with rollouts.enabled");
    CHART
        .can_i_matrix(&cp, false, NAMESPACE_BINDING_SLOTS)
        .unwrap();
    helm.run_with(
        &cp,
        &[
            "upgrade",
            RELEASE,
            path(&chart),
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "rollouts.enabled=true",
        ],
    )
    .unwrap();
    CHART
        .can_i_matrix(&cp, true, NAMESPACE_BINDING_SLOTS)
        .unwrap();

    step(
        "operator.injectionBackend=webhook: no create on MutatingAdmissionPolicies or Pods, the after-admission ValidatingAdmissionPolicy still written, and the operator removes its other policies under that",
    );
    helm.run_with(
        &cp,
        &[
            "upgrade",
            RELEASE,
            path(&chart),
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "operator.injectionBackend=webhook",
        ],
    )
    .unwrap();
    webhook_backend_needs_no_create(&cp).unwrap();

    step("helm uninstall leaves nothing behind, the least-privilege policy included");
    helm.run_with(&cp, &["uninstall", RELEASE, "--namespace", NAMESPACE])
        .unwrap();
    CHART.wait_uninstalled(&cp).unwrap();
    eprintln!("[chart] passed in {:.1?}", started.elapsed());
}

/// `spec.updateStrategy`, the field the CRD of the release installed first lacks, as a CRD of
/// an older chart would.
const MISSING_FIELD: &str = "updateStrategy";

/// The CRD follows the chart (it is one of its templates, not of its `crds/`): installs a copy
/// of the chart whose CRD lacks [`MISSING_FIELD`] and writes a template, then `helm upgrade`s
/// to the chart itself and checks that the CRD gained the field, kept its
/// `helm.sh/resource-policy: keep`, and that the template written before kept its data and can
/// now carry the field.
fn upgrade_brings_the_crd(cp: &ControlPlane, helm: &Helm, chart: &Path) -> anyhow::Result<()> {
    let older = cp.dir().join("chart-older-crd");
    copy_dir(chart, &older)?;
    let mut crd = serde_json::to_value(injector_api::crd())?;
    let removed =
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_object_mut()
            .context("no spec properties in the CRD")?
            .remove(MISSING_FIELD);
    ensure!(removed.is_some(), "the CRD has no spec.{MISSING_FIELD}");
    // JSON is YAML: the template reads it with fromYaml.
    std::fs::write(
        older.join("files/sidecartemplates.sidecar.dev.yaml"),
        serde_json::to_string_pretty(&crd)?,
    )?;
    helm.run_with(
        cp,
        &[
            "install",
            RELEASE,
            path(&older),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ],
    )?;
    wait_crd_established(cp)?;
    ensure!(
        !crd_has_field(cp)?,
        "the older CRD has spec.{MISSING_FIELD}"
    );

    let written = "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: \
                   written-before-upgrade}\nspec:\n  priority: 7\n  failurePolicy: Ignore\n  \
                   podSelector: {matchLabels: {app: before}}\n  containers: [{name: side, image: \
                   stand-in.invalid/busybox:1.36}]\n";
    let with_field = format!("{written}  updateStrategy: {{type: RollingRestart, paused: true}}\n");
    // kubectl validates fields strictly: the older CRD refuses what it does not know.
    let refused = cp.kubectl_with_stdin(&["apply", "-f", "-"], &with_field)?;
    ensure!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains(MISSING_FIELD),
        "the older CRD accepted spec.{MISSING_FIELD}: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    cp.apply_yaml(written)?;
    let before = cp.get_json("sidecartemplate", None, "written-before-upgrade")?;

    helm.run_with(
        cp,
        &["upgrade", RELEASE, path(chart), "--namespace", NAMESPACE],
    )?;
    let upgraded = cp.get_json("crd", None, CRD)?;
    ensure!(
        upgraded["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep",
        "the CRD is not kept on uninstall: {}",
        upgraded["metadata"]
    );
    poll(
        Duration::from_secs(30),
        "helm upgrade to bring the field into the CRD",
        || Ok(crd_has_field(cp)?.then_some(())),
    )?;
    let after = cp.get_json("sidecartemplate", None, "written-before-upgrade")?;
    ensure!(
        after["spec"] == before["spec"]
            && after["metadata"]["generation"] == before["metadata"]["generation"],
        "the template written before the upgrade changed:\nbefore {}\nafter {}",
        before["spec"],
        after["spec"]
    );
    // Applied as soon as the API server serves the new schema (an update of a CRD takes a
    // moment to reach the handlers).
    poll(
        Duration::from_secs(30),
        "the upgraded CRD to take spec.updateStrategy",
        || {
            Ok(cp
                .kubectl_with_stdin(&["apply", "-f", "-"], &with_field)?
                .status
                .success()
                .then_some(()))
        },
    )?;
    let kept = cp.get_json("sidecartemplate", None, "written-before-upgrade")?;
    ensure!(
        kept["spec"][MISSING_FIELD]["type"] == "RollingRestart"
            && kept["spec"]["containers"] == before["spec"]["containers"]
            && kept["spec"]["podSelector"] == before["spec"]["podSelector"]
            && kept["spec"]["priority"] == 7,
        "after the upgrade: {}",
        kept["spec"]
    );
    cp.kubectl_ok(&["delete", "sidecartemplate", "written-before-upgrade"])?;
    eprintln!(
        "[chart] helm upgrade brought spec.{MISSING_FIELD} into the CRD; the template written before kept its data"
    );
    Ok(())
}

/// Whether the served CRD has `spec.updateStrategy`.
fn crd_has_field(cp: &ControlPlane) -> anyhow::Result<bool> {
    let crd = cp.get_json("crd", None, CRD)?;
    Ok(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .get(MISSING_FIELD)
            .is_some(),
    )
}

/// Copies the directory `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// `--set` values of a managed cluster whose control plane cannot reach Pod addresses (EKS with
/// an overlay CNI): the node's network, ports of the node's, a critical priority.
const MANAGED: [&str; 4] = [
    "hostNetwork=true",
    "webhookPort=9443",
    "adminPort=9080",
    "priorityClassName=system-cluster-critical",
];

/// Renders the chart with [`MANAGED`] and checks what follows the values: the Pod's network
/// and DNS policy, its priority, the listen addresses, the container ports the probes and the
/// Service's targetPorts name, the NetworkPolicy's ports; and that the kubelet's port is
/// refused on the node's network.
fn managed_cluster_values(cp: &ControlPlane, helm: &Helm, chart: &Path) -> anyhow::Result<()> {
    let list = render_objects(cp, helm, chart, &MANAGED)?;
    let object = |kind: &str| rendered_object(&list, kind);
    let pod = &object("Deployment")?["spec"]["template"]["spec"];
    ensure!(
        pod["hostNetwork"] == true
            && pod["dnsPolicy"] == "ClusterFirstWithHostNet"
            && pod["priorityClassName"] == "system-cluster-critical",
        "the Pod spec: {pod}"
    );
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .context("no args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for (flag, address) in [
        ("--listen", "0.0.0.0:9443"),
        ("--admin-listen", "0.0.0.0:9080"),
    ] {
        ensure!(
            args.windows(2).any(|w| w == [flag, address]),
            "{flag} {address} not in {args:?}"
        );
    }
    let ports: Vec<(&str, i64)> = container["ports"]
        .as_array()
        .context("no ports")?
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?, p["containerPort"].as_i64()?)))
        .collect();
    ensure!(
        ports == [("webhook", 9443), ("admin", 9080)],
        "container ports {ports:?}"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        ensure!(
            container[probe]["httpGet"]["port"] == "admin",
            "{probe}: {}",
            container[probe]
        );
    }
    let service_ports = &object("Service")?["spec"]["ports"];
    ensure!(
        service_ports[0]["targetPort"] == "webhook" && service_ports[1]["targetPort"] == "admin",
        "Service ports: {service_ports}"
    );
    let ingress = &object("NetworkPolicy")?["spec"]["ingress"];
    ensure!(
        ingress[0]["ports"][0]["port"] == 9443 && ingress[1]["ports"][0]["port"] == 9080,
        "NetworkPolicy ingress: {ingress}"
    );

    let clash = helm.run(&[
        "template",
        RELEASE,
        path(chart),
        "--set",
        "hostNetwork=true",
        "--set",
        "webhookPort=10250",
    ]);
    ensure!(
        format!(
            "{:#}",
            clash
                .err()
                .context("hostNetwork on the kubelet's port rendered")?
        )
        .contains("kubelet"),
        "not refused for the kubelet's port"
    );
    Ok(())
}

/// The chart rendered with `sets`, as a List of the objects kubectl reads from it (there is no
/// YAML parser here).
fn render_objects(
    cp: &ControlPlane,
    helm: &Helm,
    chart: &Path,
    sets: &[&str],
) -> anyhow::Result<Value> {
    let mut args = vec!["template", RELEASE, path(chart), "--namespace", NAMESPACE];
    for set in sets {
        args.extend(["--set", set]);
    }
    let rendered = helm.run(&args)?;
    let converted = cp.kubectl_with_stdin(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        &rendered,
    )?;
    ensure!(
        converted.status.success(),
        "kubectl could not read the chart: {}",
        String::from_utf8_lossy(&converted.stderr)
    );
    // One JSON document per object, or one List: either way, one List here.
    let mut items = Vec::new();
    for document in serde_json::Deserializer::from_slice(&converted.stdout).into_iter::<Value>() {
        let document = document?;
        match document["items"].as_array() {
            Some(list) if document["kind"] == "List" => items.extend(list.iter().cloned()),
            _ => items.push(document),
        }
    }
    Ok(serde_json::json!({ "kind": "List", "items": items }))
}

/// The object of `kind` in a List of [`render_objects`].
fn rendered_object<'a>(list: &'a Value, kind: &str) -> anyhow::Result<&'a Value> {
    list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|o| o["kind"] == kind))
        .with_context(|| format!("no {kind} rendered"))
}

/// The NetworkPolicy's rule for the admin port: by default any Pod of any namespace (a
/// Prometheus wherever it runs) may scrape, and `networkPolicy.metrics.from` narrows it.
fn metrics_network_policy(cp: &ControlPlane, helm: &Helm, chart: &Path) -> anyhow::Result<()> {
    let admin_rule = |list: &Value| -> anyhow::Result<Value> {
        let ingress = rendered_object(list, "NetworkPolicy")?["spec"]["ingress"]
            .as_array()
            .context("no ingress rules")?;
        ingress
            .iter()
            .find(|rule| rule["ports"][0]["port"] == 8080)
            .cloned()
            .context("no rule for the admin port")
    };
    let default = admin_rule(&render_objects(cp, helm, chart, &[])?)?;
    // One peer, an empty namespaceSelector and no podSelector: every Pod of every namespace.
    ensure!(
        default["from"] == serde_json::json!([{"namespaceSelector": {}}]),
        "the default admin rule: {default}"
    );
    let narrowed = admin_rule(&render_objects(
        cp,
        helm,
        chart,
        &[
            "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.team=monitoring",
            "networkPolicy.metrics.from[0].podSelector.matchLabels.app=prometheus",
        ],
    )?)?;
    ensure!(
        narrowed["from"]
            == serde_json::json!([{
                "namespaceSelector": {"matchLabels": {"team": "monitoring"}},
                "podSelector": {"matchLabels": {"app": "prometheus"}},
            }]),
        "the narrowed admin rule: {narrowed}"
    );
    Ok(())
}

/// `kubectl auth can-i VERB sidecartemplates.sidecar.dev` as `who` (`--as` and `--as-group`
/// arguments): whether it says yes. `--all-namespaces`, as a request for a cluster-scoped
/// object is: without it kubectl asks in its current namespace, where a RoleBinding counts.
fn can_on_templates(cp: &ControlPlane, verb: &str, who: &[&str]) -> anyhow::Result<bool> {
    let mut args = vec![
        "auth",
        "can-i",
        verb,
        "sidecartemplates.sidecar.dev",
        "--all-namespaces",
    ];
    args.extend(who);
    let output = cp.kubectl(&args)?;
    Ok(String::from_utf8_lossy(&output.stdout).trim() == "yes")
}

/// The chart's read-only ClusterRole on SidecarTemplates: aggregated into the built-in view
/// and edit roles (a cluster-wide holder reads templates, and may still not write them), not
/// reaching a holder of `view` in one namespace (RBAC grants no cluster-scoped object through
/// a RoleBinding), which `viewerRbac.subjects` binds instead.
fn viewer_rbac(cp: &ControlPlane, helm: &Helm, chart: &Path) -> anyhow::Result<()> {
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "e2e-cluster-viewer",
        "--clusterrole=view",
        "--user=cluster-viewer",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "e2e-cluster-editor",
        "--clusterrole=edit",
        "--user=cluster-editor",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "e2e-namespace-viewer",
        "--namespace=default",
        "--clusterrole=view",
        "--user=namespace-viewer",
    ])?;
    // kube-controller-manager aggregates the chart's rules into view and edit.
    poll(
        Duration::from_secs(30),
        "the chart's rules aggregated into view and edit",
        || {
            Ok((can_on_templates(cp, "list", &["--as=cluster-viewer"])?
                && can_on_templates(cp, "get", &["--as=cluster-editor"])?)
            .then_some(()))
        },
    )?;
    for (verb, who) in [
        ("create", "--as=cluster-viewer"),
        ("update", "--as=cluster-editor"),
        ("delete", "--as=cluster-editor"),
        ("list", "--as=namespace-viewer"),
    ] {
        ensure!(
            !can_on_templates(cp, verb, &[who])?,
            "{who} may {verb} SidecarTemplates"
        );
    }
    helm.run_with(
        cp,
        &[
            "upgrade",
            RELEASE,
            path(chart),
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set-json",
            r#"viewerRbac.subjects=[{"kind":"Group","name":"app-teams","apiGroup":"rbac.authorization.k8s.io"}]"#,
        ],
    )?;
    let app_team = ["--as=someone", "--as-group=app-teams"];
    ensure!(
        can_on_templates(cp, "list", &app_team)? && can_on_templates(cp, "watch", &app_team)?,
        "viewerRbac.subjects may not read SidecarTemplates"
    );
    ensure!(
        !can_on_templates(cp, "create", &app_team)? && !can_on_templates(cp, "patch", &app_team)?,
        "viewerRbac.subjects may write SidecarTemplates"
    );
    explain_as_an_app_team(cp)?;
    for binding in [
        "clusterrolebinding/e2e-cluster-viewer",
        "clusterrolebinding/e2e-cluster-editor",
    ] {
        cp.kubectl_ok(&["delete", binding])?;
    }
    cp.kubectl_ok(&[
        "delete",
        "rolebinding",
        "e2e-namespace-viewer",
        "-n",
        "default",
    ])?;
    eprintln!(
        "[chart] view and edit read SidecarTemplates and write none; view in one namespace does not; viewerRbac.subjects read them"
    );
    Ok(())
}

/// `kubectl sidecar explain` as an app team: `view` in its own namespace only, plus the chart's
/// `viewerRbac.subjects` (group `app-teams`), through a kubeconfig that impersonates such a
/// user. Without the group it stops, saying which value grants what it lacks.
fn explain_as_an_app_team(cp: &ControlPlane) -> anyhow::Result<()> {
    let ns = cp.namespace("app-team", &[])?;
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "app-team-view",
        "--namespace",
        &ns,
        "--clusterrole=view",
        "--user=someone",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "deployment",
        "web",
        "--namespace",
        &ns,
        "--image=app.invalid/web:1",
    ])?;
    let kubeconfig = |groups: &[&str]| -> anyhow::Result<PathBuf> {
        let path = cp.dir().join(format!("app-team-{}.json", groups.len()));
        cp.write_impersonating_kubeconfig("someone", groups, &path)?;
        Ok(path)
    };
    let explain = |kubeconfig: &Path| -> anyhow::Result<std::process::Output> {
        Ok(Command::new(injector_e2e::operator_binary()?)
            .args(["kubectl", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["explain", "deployment/web", "-n", &ns])
            .output()?)
    };
    let alone = explain(&kubeconfig(&[])?)?;
    let refusal = String::from_utf8_lossy(&alone.stderr);
    ensure!(
        !alone.status.success() && refusal.contains("viewerRbac.subjects"),
        "explain without viewerRbac.subjects: {refusal}"
    );
    let team = explain(&kubeconfig(&["app-teams", "system:authenticated"])?)?;
    ensure!(
        team.status.success(),
        "explain as an app team: {}",
        String::from_utf8_lossy(&team.stderr)
    );
    let shown = String::from_utf8_lossy(&team.stdout);
    ensure!(
        shown.contains("web"),
        "explain as an app team printed: {shown}"
    );
    eprintln!(
        "[chart] kubectl sidecar explain as an app team (view in {ns}, viewerRbac.subjects): works; without the subjects it names the value"
    );
    // `kubectl sidecar check` as the same team: the role grants, by name, what `view` lacks
    // (the Lease, the webhook configuration, the admission policies), and not the Secret.
    let team = kubeconfig(&["app-teams", "system:authenticated"])?;
    let checked = Command::new(injector_e2e::operator_binary()?)
        .args(["kubectl", "--kubeconfig"])
        .arg(&team)
        .args(["check", "-n", &ns, "-o", "json"])
        .output()?;
    let report: Value = serde_json::from_slice(&checked.stdout).with_context(|| {
        format!(
            "check as an app team: {}",
            String::from_utf8_lossy(&checked.stderr)
        )
    })?;
    let links = report["links"].as_array().cloned().unwrap_or_default();
    let message = |link: &str| -> String {
        links
            .iter()
            .find(|l| l["link"] == link)
            .and_then(|l| l["message"].as_str())
            .unwrap_or("absent")
            .to_owned()
    };
    for link in [
        "leader",
        "webhook configuration",
        "policy backend",
        "templates",
        "namespace",
    ] {
        let said = message(link);
        ensure!(
            !said.contains("forbidden") && said != "absent",
            "check as an app team, {link}: {said}"
        );
    }
    let secret = format!("secret/{RELEASE}-tls");
    ensure!(
        !cp.kubectl(&[
            "auth",
            "can-i",
            "get",
            &secret,
            "-n",
            NAMESPACE,
            "--as=someone",
            "--as-group=app-teams"
        ])?
        .status
        .success(),
        "the view role grants the certificate Secret"
    );
    eprintln!(
        "[chart] kubectl sidecar check as an app team reads the Lease, the webhook configuration, the policies and the templates; not the Secret"
    );
    cp.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}

/// The chart's `<release>-template-safety` ValidatingAdmissionPolicy (`Warn`): writing a
/// required template with no namespaceSelector, with one that only excludes, or with one
/// naming `kube-system` prints a warning and stores the template; a best-effort one, or one
/// selecting ordinary namespaces, gets none.
fn template_safety_warnings(cp: &ControlPlane) -> anyhow::Result<()> {
    let template = |name: &str, extra: &str| {
        format!(
            "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {{name: {name}}}\n\
             spec:\n  containers: [{{name: side, image: stand-in.invalid/busybox:1.36}}]\n{extra}"
        )
    };
    // `kubectl create`: an `apply` that changes nothing sends no request, so gets no warning.
    let apply = |yaml: &str| -> anyhow::Result<String> {
        let output = cp.kubectl_with_stdin(&["create", "-f", "-"], yaml)?;
        ensure!(
            output.status.success(),
            "kubectl create refused: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let everywhere = template("e2e-safety-everywhere", "");
    // The policy and its binding take a moment to be in force.
    let warning = poll(
        Duration::from_secs(30),
        "the template-safety policy to warn",
        || {
            let stderr = apply(&everywhere)?;
            if stderr.contains("selects every namespace") {
                return Ok(Some(stderr));
            }
            cp.kubectl_ok(&["delete", "sidecartemplate", "e2e-safety-everywhere"])?;
            Ok(None)
        },
    )?;
    eprintln!("[chart] no namespaceSelector: {}", warning.trim());
    let cases = [
        (
            "e2e-safety-excludes",
            "  namespaceSelector: {matchExpressions: [{key: team, operator: DoesNotExist}]}\n",
            Some("only excludes"),
        ),
        (
            "e2e-safety-system",
            "  namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [apps, kube-system]}]}\n",
            Some("cluster's own components"),
        ),
        ("e2e-safety-best-effort", "  failurePolicy: Ignore\n", None),
        (
            "e2e-safety-selected",
            "  namespaceSelector: {matchLabels: {team: payments}}\n",
            None,
        ),
    ];
    for (name, extra, expected) in cases {
        let stderr = apply(&template(name, extra))?;
        match expected {
            Some(text) => ensure!(
                stderr.contains("Warning") && stderr.contains(text),
                "{name}: no warning saying {text:?}: {stderr}"
            ),
            None => ensure!(!stderr.contains("Warning"), "{name} was warned: {stderr}"),
        }
        cp.get_json("sidecartemplate", None, name)?;
    }
    let mut names = vec!["delete", "sidecartemplate", "e2e-safety-everywhere"];
    names.extend(cases.iter().map(|(name, _, _)| *name));
    cp.kubectl_ok(&names)?;
    eprintln!("[chart] warned about every case, and stored every template");
    Ok(())
}

/// `--set` values that turn every optional object on.
const OPTIONALS: [&str; 5] = [
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "networkPolicy.webhook.from[0].ipBlock.cidr=10.0.0.0/24",
    "rollouts.enabled=true",
];

fn step(what: &str) {
    eprintln!("\n[chart] ===== {what}");
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// The cached helm, with its configuration, cache and data in a temporary directory (so the
/// test neither reads nor writes the user's).
struct Helm {
    binary: PathBuf,
    home: PathBuf,
}

impl Helm {
    fn new() -> anyhow::Result<Self> {
        let binary = tool("helm")?;
        let home =
            std::env::temp_dir().join(format!("sidecar-injector-helm-{}", std::process::id()));
        std::fs::create_dir_all(&home)?;
        Ok(Self { binary, home })
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .env_remove("KUBECONFIG");
        command
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        output(self.command().args(args), "helm")
    }

    fn run_with(&self, cp: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
        output(
            self.command()
                .env("KUBECONFIG", cp.kubeconfig_path())
                .args(args),
            "helm",
        )
    }
}

impl Drop for Helm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// Runs `command`; its stdout, or an error with its stderr.
fn output(command: &mut Command, what: &str) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            stdout
        );
    }
    Ok(stdout)
}

/// Renders the chart (defaults, then every optional object) and validates the manifests, and
/// every example, with kubeconform in strict mode against schemas made from this API server's
/// OpenAPI document (which publishes the CRD the chart just installed). The ServiceMonitor and
/// the PrometheusRule are skipped: their CRDs belong to the Prometheus Operator, which is not
/// installed here (`e2e/tests/monitoring.rs` loads the rules into a real Prometheus).
fn validate_with_kubeconform(cp: &ControlPlane, helm: &Helm, chart: &Path) -> anyhow::Result<()> {
    let kubeconform = tool("kubeconform")?;
    let openapi = poll(
        Duration::from_secs(30),
        "the SidecarTemplate schema in /openapi/v2",
        || {
            let openapi: Value =
                serde_json::from_str(&cp.kubectl_ok(&["get", "--raw", "/openapi/v2"])?)?;
            Ok(openapi["definitions"]
                .get("dev.sidecar.v1alpha1.SidecarTemplate")
                .is_some()
                .then_some(openapi))
        },
    )?;
    let dir = cp.dir().join("schemas");
    let written = write_kubeconform_schemas(&openapi, &dir)?;
    eprintln!(
        "[chart] {} schemas written to {}",
        written.len(),
        dir.display()
    );

    // The validator is not vacuous: a misspelt field and a wrong type are caught.
    let bad = cp.dir().join("bad-deployment.yaml");
    std::fs::write(
        &bad,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: bad}\nspec:\n  replicas: two\n  \
         selector: {matchLabels: {app: bad}}\n  template:\n    metadata: {labels: {app: bad}}\n    \
         spec:\n      containerz: []\n      containers: [{name: app, image: busybox}]\n",
    )?;
    let caught = output(
        Command::new(&kubeconform)
            .args(["-strict", "-schema-location", &schema_location(&dir)])
            .arg(&bad),
        "kubeconform",
    );
    let caught = format!(
        "{:#}",
        caught
            .err()
            .context("kubeconform accepted a bad Deployment")?
    );
    ensure!(
        caught.contains("containerz") && caught.contains("replicas"),
        "kubeconform: {caught}"
    );

    let mut files = Vec::new();
    for (label, sets) in [
        ("defaults", &[][..]),
        ("optionals", &OPTIONALS[..]),
        ("managed", &MANAGED[..]),
    ] {
        let mut args = vec![
            "template",
            RELEASE,
            path(chart),
            "--namespace",
            NAMESPACE,
            "--include-crds",
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        let rendered = helm.run(&args)?;
        let file = cp.dir().join(format!("chart-{label}.yaml"));
        std::fs::write(&file, rendered)?;
        files.push(file);
    }
    for entry in std::fs::read_dir(workspace_root().join("examples"))? {
        for file in std::fs::read_dir(entry?.path())? {
            let file = file?.path();
            if file.extension().is_some_and(|e| e == "yaml") {
                files.push(file);
            }
        }
    }
    let mut command = Command::new(&kubeconform);
    command.args([
        "-strict",
        "-verbose",
        "-output",
        "json",
        "-skip",
        "ServiceMonitor,PrometheusRule",
        "-schema-location",
        &schema_location(&dir),
    ]);
    command.args(&files);
    let report = output(&mut command, "kubeconform");
    let report: Value = match report {
        Ok(stdout) => serde_json::from_str(&stdout)?,
        Err(e) => bail!("kubeconform found invalid manifests: {e:#}"),
    };
    let resources = report["resources"]
        .as_array()
        .context("no resources in the report")?;
    let mut kinds: Vec<String> = Vec::new();
    for resource in resources {
        let kind = resource["kind"].as_str().unwrap_or_default().to_owned();
        let status = resource["status"].as_str().unwrap_or_default();
        let expected = if kind == "ServiceMonitor" || kind == "PrometheusRule" {
            "statusSkipped"
        } else {
            "statusValid"
        };
        ensure!(status == expected, "kubeconform: {resource}");
        kinds.push(kind);
    }
    kinds.sort();
    kinds.dedup();
    eprintln!(
        "[chart] kubeconform: {} manifests valid, kinds {kinds:?}",
        resources.len()
    );
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "SidecarTemplate",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        ensure!(
            kinds.iter().any(|k| k == kind),
            "nothing of kind {kind} was checked"
        );
    }
    for kind in ["MutatingWebhookConfiguration", "Secret"] {
        ensure!(
            !kinds.iter().any(|k| k == kind),
            "the chart renders a {kind}: the operator owns it"
        );
    }
    Ok(())
}

/// Starts the operator with a kubeconfig holding a token of the chart's ServiceAccount and
/// with the arguments of the chart's Deployment (in url mode, since nothing runs Pods here:
/// listening addresses, log format and identity are the harness's).
fn start_operator_as_service_account(cp: &ControlPlane) -> anyhow::Result<Operator> {
    let token = cp.kubectl_ok(&[
        "create",
        "token",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--duration",
        "1h",
    ])?;
    let kubeconfig = cp.dir().join("chart-service-account.kubeconfig");
    cp.write_token_kubeconfig(token.trim(), &kubeconfig)?;

    // A Lease without the owner reference, as a release from before owner references would
    // have left it (and long expired): the operator must adopt it, which under
    // OwnerReferencesPermissionEnforcement needs the chart's `delete` on it.
    let lease = CHART.lease();
    cp.apply_yaml(&format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {lease}, namespace: {NAMESPACE}}}\n\
         spec: {{holderIdentity: an-older-replica, leaseDurationSeconds: 15, \
         renewTime: \"2025-01-01T00:00:00.000000Z\"}}\n"
    ))?;

    let deployment = cp.get_json("deployment", Some(NAMESPACE), RELEASE)?;
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("the Deployment's container has no args")?
        .iter()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let extra_args = chart_arguments(&args)?;
    eprintln!(
        "[chart] the Deployment's arguments used: {}",
        extra_args.join(" ")
    );
    Operator::start(
        cp,
        OperatorOptions {
            namespace: NAMESPACE.to_owned(),
            leader_election: true,
            kubeconfig: Some(kubeconfig),
            extra_args,
            ..OperatorOptions::default()
        },
    )
}

/// The Deployment's `run` arguments, less those the harness sets itself. Every argument is a
/// `--flag value` pair or a `--flag=value`, as the chart writes them (`operator.extraArgs` in
/// the same forms; a bare boolean flag would need a value here).
fn chart_arguments(args: &[String]) -> anyhow::Result<Vec<String>> {
    const HARNESS: [&str; 7] = [
        "--namespace",
        "--listen",
        "--admin-listen",
        "--log-format",
        "--leader-election",
        "--identity",
        "--drain-period",
    ];
    let mut rest = args.iter();
    ensure!(
        rest.next().map(String::as_str) == Some("run"),
        "args: {args:?}"
    );
    let mut kept = Vec::new();
    while let Some(flag) = rest.next() {
        ensure!(flag.starts_with("--"), "a value without its flag: {flag}");
        if let Some((name, _)) = flag.split_once('=') {
            if !HARNESS.contains(&name) {
                kept.push(flag.clone());
            }
            continue;
        }
        let value = rest
            .next()
            .with_context(|| format!("{flag} has no value"))?;
        if !HARNESS.contains(&flag.as_str()) {
            kept.extend([flag.clone(), value.clone()]);
        }
    }
    Ok(kept)
}

/// Everything the operator does, done under the chart's RBAC: status, Events, the
/// configuration (created, watched, restored), the Secret, the Lease, and owner references
/// to the chart's ClusterRole on all three.
fn exercise_operator(cp: &ControlPlane, operator: &Operator) -> anyhow::Result<()> {
    poll(Duration::from_secs(30), "the operator to lead", || {
        Ok(operator
            .metrics()?
            .lines()
            .any(|l| l.trim() == "sidecar_injector_leader 1")
            .then_some(()))
    })?;
    cp.apply_file(&example("nginx-sidecar/sidecartemplate.yaml"))?;
    let entry = wait_served(cp, "nginx-sidecar", RELEASE)?;
    let ns = cp.namespace("chart", &[("sidecar.dev/example", "nginx-sidecar")])?;
    wait_injected(cp, &ns, &["app=web"], "nginx-sidecar")?;
    eprintln!("[chart] nginx-sidecar Ready, served by {entry}, and injected");
    // The policy backend (the chart's default, `auto`): where the API server serves
    // MutatingAdmissionPolicies, the chart's RBAC lets the operator prove and apply one.
    let policies_served = cp.serves_mutating_admission_policies()?;
    let by_policy = injector_e2e::steps::policy_served(cp, "nginx-sidecar")?;
    ensure!(
        by_policy == policies_served,
        "PolicyServed is {by_policy}, the API server serves policies: {policies_served}"
    );
    if by_policy {
        let policy = cp.get_json("mutatingadmissionpolicy", None, RELEASE)?;
        ensure!(
            policy["metadata"]["ownerReferences"][0]["name"] == RELEASE,
            "the policy is not owned by the chart's ClusterRole: {}",
            policy["metadata"]
        );
    }
    eprintln!("[chart] served by a MutatingAdmissionPolicy too: {by_policy}");
    if by_policy {
        // A template that can warn: the warnings policy beside it, also under the chart's RBAC.
        cp.apply_yaml(
            "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata:\n  name: chart-warns\n\
             spec:\n  failurePolicy: Ignore\n  namespaceSelector: {matchLabels: {chart: warns}}\n\
             \x20 appContainers:\n    env: [{name: CHART, value: \"on\"}]\n",
        )?;
        let warnings = format!("{RELEASE}-warnings");
        let policy = poll(Duration::from_secs(30), "the warnings policy", || {
            cp.try_get_json("validatingadmissionpolicy", None, &warnings)
        })?;
        ensure!(
            policy["metadata"]["ownerReferences"][0]["name"] == RELEASE,
            "the warnings policy is not owned by the chart's ClusterRole: {}",
            policy["metadata"]
        );
        let served = wait_condition(
            cp,
            "chart-warns",
            ("PolicyServed", "True", "Served"),
            Duration::from_secs(30),
        )?;
        let message = served["message"].as_str().unwrap_or_default();
        ensure!(
            !message.contains("failed"),
            "the policy backend failed: {message}"
        );
        cp.kubectl_ok(&["delete", "sidecartemplate", "chart-warns"])?;
        eprintln!("[chart] the warnings policy {warnings} is applied too");
    }

    // An invalid template: its status says why and an Event is published.
    cp.apply_yaml(
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata:\n  name: chart-invalid\n\
         spec:\n  containers:\n    - name: broken\n      image: busybox:1.36\n      args: [\"{{ pod.nope }}\"]\n",
    )?;
    wait_invalid_event(cp, "chart-invalid")?;
    eprintln!("[chart] an invalid template got its Event");

    // A Deployment whose Pods hold a container named like nginx-sidecar's, another: the
    // template is skipped, and the chart's RBAC lets the leader read one Pod (a list by name)
    // and publish the TemplateSkipped Event on the ReplicaSet.
    let clash = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "clash", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web", "chart": "clash"}},
            "template": {
                "metadata": {"labels": {"app": "web", "chart": "clash"}},
                "spec": {"containers": [{"name": "nginx-sidecar", "image": "app.invalid/clash:1"}]},
            },
        },
    });
    cp.apply_yaml(&clash.to_string())?;
    let told = poll(
        Duration::from_secs(60),
        "the TemplateSkipped Event under the chart's RBAC",
        || {
            let events = cp.list_json("events.events.k8s.io", Some(&ns), None)?;
            Ok(events.into_iter().find(|e| {
                e["reason"] == "TemplateSkipped" && e["regarding"]["kind"] == "ReplicaSet"
            }))
        },
    )?;
    eprintln!(
        "[chart] a skipped template told on its ReplicaSet: {}",
        told["note"]
    );
    cp.kubectl_ok(&["delete", "deployment", "clash", "-n", &ns, "--wait=false"])?;

    // A template asking for rollouts, which the chart's defaults do not allow: a condition
    // says so, and nothing is tried.
    cp.apply_yaml(
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata:\n  name: chart-rolling\n\
         spec:\n  updateStrategy: {type: RollingRestart}\n  namespaceSelector: {matchLabels: {none: none}}\n\
         \x20 containers:\n    - name: rolling\n      image: busybox:1.36\n",
    )?;
    let blocked = injector_e2e::steps::wait_condition(
        cp,
        "chart-rolling",
        ("RolloutBlocked", "True", "Forbidden"),
        Duration::from_secs(30),
    )?;
    let message = blocked["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("rollouts.enabled=true"),
        "RolloutBlocked message: {message}"
    );
    eprintln!("[chart] a RollingRestart template without rollouts.enabled: {message}");
    // It is required (the default failurePolicy) and adds a container: the after-admission
    // policy keeps it, written under the chart's RBAC on every backend and owned by the
    // ClusterRole (so `helm uninstall` removes it), and goes with the last such template.
    let after_admission = format!("{RELEASE}-after-admission");
    let policy = poll(
        Duration::from_secs(30),
        "the after-admission policy",
        || cp.try_get_json("validatingadmissionpolicy", None, &after_admission),
    )?;
    ensure!(
        policy["metadata"]["ownerReferences"][0]["name"] == RELEASE,
        "the after-admission policy is not owned by the chart's ClusterRole: {}",
        policy["metadata"]
    );
    cp.kubectl_ok(&["delete", "sidecartemplate", "chart-rolling"])?;
    poll(
        Duration::from_secs(30),
        "the after-admission policy to be removed",
        || {
            Ok(cp
                .try_get_json("validatingadmissionpolicy", None, &after_admission)?
                .is_none()
                .then_some(()))
        },
    )?;
    eprintln!("[chart] the after-admission policy {after_admission}: owned, then removed");

    CHART.check_owned(cp)?;

    let uid =
        cp.get_json("mutatingwebhookconfiguration", None, RELEASE)?["metadata"]["uid"].clone();
    cp.kubectl_ok(&["delete", "mutatingwebhookconfiguration", RELEASE])?;
    poll(
        Duration::from_secs(20),
        "the configuration to be restored",
        || {
            Ok(cp
                .try_get_json("mutatingwebhookconfiguration", None, RELEASE)?
                .filter(|c| c["metadata"]["uid"] != uid)
                .map(|_| ()))
        },
    )?;
    eprintln!(
        "[chart] the configuration, Secret and Lease are owned by the ClusterRole; a deleted configuration was restored"
    );
    cp.kubectl_ok(&["delete", "sidecartemplate", "chart-invalid"])?;
    Ok(())
}

/// The chart's ValidatingAdmissionPolicy (and binding) holding the operator's ServiceAccount to
/// what RBAC cannot say.
fn least_privilege_policy() -> String {
    CHART.least_privilege_policy()
}

/// What a request of the operator's ServiceAccount came to: stored (or accepted as a dry run),
/// refused by an admission policy (its message), or failed otherwise (kubectl's stderr).
#[derive(Debug)]
enum Outcome {
    Accepted,
    Refused(String),
    Failed(String),
}

/// `kubectl create -f - ARGS` of `yaml` as the operator's ServiceAccount (impersonated by the
/// admin, who may).
fn create_as_operator(cp: &ControlPlane, yaml: &str, args: &[&str]) -> anyhow::Result<Outcome> {
    let service_account = CHART.service_account();
    let mut all = vec!["create", "-f", "-", "--as", &service_account];
    all.extend(args);
    let out = cp.kubectl_with_stdin(&all, yaml)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Ok(if out.status.success() {
        Outcome::Accepted
    } else if stderr.contains("ValidatingAdmissionPolicy") && stderr.contains("denied request") {
        Outcome::Refused(stderr)
    } else {
        Outcome::Failed(stderr)
    })
}

/// A Pod named `name` (nothing schedules it here).
fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\n\
         spec: {{containers: [{{name: app, image: least-privilege.invalid/none:1}}]}}\n"
    )
}

/// Impersonating the operator's ServiceAccount, which RBAC lets create Pods in its namespace
/// and Secrets, Leases, webhook configurations and admission policies under any name: a real
/// Pod is refused by the chart's policy and a dry-run Pod accepted; a Secret, a Lease or a
/// MutatingWebhookConfiguration under another name is refused, under its own name it passes
/// admission (and only then finds its object already there, created by the operator under this
/// very policy). Admission policies and their bindings are beyond any policy registered
/// through the API: with a probe policy in force that refuses everything the ServiceAccount
/// creates under the probe's name, the API server still accepts such a policy from it, so
/// their names stay limited by RBAC for every verb but `create` (docs/operations.md).
fn prove_least_privilege(cp: &ControlPlane) -> anyhow::Result<()> {
    let policy = least_privilege_policy();
    // The policy in force: the API server compiles a new policy shortly after it is stored
    // (helm created this one before the operator started, so this returns at once).
    let other_secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: least-privilege-other, namespace: {NAMESPACE}}}\n"
    );
    poll(
        Duration::from_secs(30),
        "the least-privilege policy in force",
        || {
            Ok(
                match create_as_operator(cp, &other_secret, &["--dry-run=server"])? {
                    Outcome::Refused(message) => Some(message),
                    _ => None,
                },
            )
        },
    )?;

    let real = create_as_operator(cp, &pod("least-privilege-real"), &[])?;
    let Outcome::Refused(message) = real else {
        bail!("a real Pod of the operator's ServiceAccount was not refused: {real:?}");
    };
    ensure!(
        message.contains(&policy) && message.contains("dry runs"),
        "a real Pod refused, but not by {policy}: {message}"
    );
    ensure!(
        cp.try_get_json("pod", Some(NAMESPACE), "least-privilege-real")?
            .is_none(),
        "the refused Pod was stored"
    );
    eprintln!("[chart] a real Pod of the operator's ServiceAccount: refused by {policy}");
    let dry = create_as_operator(cp, &pod("least-privilege-dry-run"), &["--dry-run=server"])?;
    ensure!(
        matches!(dry, Outcome::Accepted),
        "a dry-run Pod of the operator's ServiceAccount: {dry:?}"
    );
    eprintln!("[chart] a dry-run Pod of the operator's ServiceAccount: accepted");

    let lease = |name: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\n"
        )
    };
    let secret = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\n"
        )
    };
    let configuration = |name: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\n\
             metadata: {{name: {name}}}\nwebhooks: []\n"
        )
    };
    let cases = [
        (
            "Secret",
            secret("least-privilege-other"),
            secret(&CHART.secret()),
        ),
        (
            "Lease",
            lease("least-privilege-other"),
            lease(&CHART.lease()),
        ),
        (
            "MutatingWebhookConfiguration",
            configuration("least-privilege-other"),
            configuration(RELEASE),
        ),
    ];
    for (kind, other, own) in cases {
        let refused = create_as_operator(cp, &other, &["--dry-run=server"])?;
        ensure!(
            matches!(&refused, Outcome::Refused(m) if m.contains(&policy)),
            "a {kind} of another name: {refused:?}"
        );
        let own = create_as_operator(cp, &own, &["--dry-run=server"])?;
        ensure!(
            matches!(&own, Outcome::Failed(m) if m.contains("AlreadyExists")),
            "the operator's own {kind}: {own:?}"
        );
        eprintln!("[chart] a {kind} of another name: refused; of its own name: admitted");
    }

    // The API server runs no policy registered through the API on admission policies and
    // their bindings: proved with a probe that refuses whatever the ServiceAccount creates
    // under the probe's name, Pods included (which show it in force).
    let service_account = CHART.service_account();
    let probe = "least-privilege-probe";
    cp.apply_yaml(&format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {probe}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - {{apiGroups: [""], apiVersions: ["*"], operations: ["CREATE"], resources: ["pods"]}}
      - apiGroups: ["admissionregistration.k8s.io"]
        apiVersions: ["*"]
        operations: ["CREATE"]
        resources: [validatingadmissionpolicies, validatingadmissionpolicybindings, mutatingadmissionpolicies, mutatingadmissionpolicybindings]
  matchConditions:
    - name: the-probe
      expression: 'request.userInfo.username == "{service_account}" && object.metadata.name.startsWith("{probe}")'
  validations:
    - {{expression: "false", message: "refused by the probe"}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {probe}}}
spec: {{policyName: {probe}, validationActions: [Deny]}}
"#
    ))?;
    poll(Duration::from_secs(30), "the probe policy in force", || {
        Ok(
            match create_as_operator(cp, &pod(&format!("{probe}-pod")), &["--dry-run=server"])? {
                Outcome::Refused(message) if message.contains("refused by the probe") => Some(()),
                _ => None,
            },
        )
    })?;
    let other = format!("{probe}-other");
    for kind in admission_policy_kinds(cp)? {
        let outcome =
            create_as_operator(cp, &admission_policy(kind, &other), &["--dry-run=server"])?;
        ensure!(
            matches!(outcome, Outcome::Accepted),
            "a {kind} of another name, with a policy refusing it in force: {outcome:?} \
             (if the API server now runs policies on admission policies, the chart's policy can \
             limit their names too)"
        );
        eprintln!(
            "[chart] a {kind} of another name: accepted although a policy refusing it is in force \
             (the API server runs no API-registered policy on admission policies)"
        );
    }
    cp.kubectl_ok(&["delete", "validatingadmissionpolicybinding", probe])?;
    cp.kubectl_ok(&["delete", "validatingadmissionpolicy", probe])?;

    // The ServiceAccount cannot undo the chart's policy.
    for (verb, resource) in [
        (
            "delete",
            format!("validatingadmissionpolicies.admissionregistration.k8s.io/{policy}"),
        ),
        (
            "patch",
            format!("validatingadmissionpolicies.admissionregistration.k8s.io/{policy}"),
        ),
        (
            "update",
            format!("validatingadmissionpolicybindings.admissionregistration.k8s.io/{policy}"),
        ),
        (
            "delete",
            format!("validatingadmissionpolicybindings.admissionregistration.k8s.io/{policy}"),
        ),
    ] {
        let out = cp.kubectl(&["auth", "can-i", verb, &resource, "--as", &service_account])?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        ensure!(answer == "no", "can-i {verb} {resource}: {answer}");
    }
    eprintln!("[chart] the ServiceAccount may neither change nor delete {policy}");
    Ok(())
}

/// With `operator.injectionBackend=webhook` the chart grants no `create` on
/// MutatingAdmissionPolicies, their bindings or Pods (the backend proves and applies no policy;
/// it only deletes what another backend applied, by name), but does on ValidatingAdmissionPolicies
/// and their bindings: the after-admission policy is written on every backend. The operator, run
/// again with the Deployment's arguments and the ServiceAccount's token, removes the policies it
/// applied before and writes the after-admission policy for a required template, with nothing
/// refused.
fn webhook_backend_needs_no_create(cp: &ControlPlane) -> anyhow::Result<()> {
    let service_account = CHART.service_account();
    let policies_served = cp.serves_mutating_admission_policies()?;
    let mut checks = vec![
        // The after-admission policy, on every backend.
        (
            "create",
            "validatingadmissionpolicies.admissionregistration.k8s.io".to_owned(),
            None,
            true,
        ),
        (
            "create",
            "validatingadmissionpolicybindings.admissionregistration.k8s.io".to_owned(),
            None,
            true,
        ),
        ("create", "pods".to_owned(), Some(NAMESPACE), false),
        (
            "delete",
            format!("validatingadmissionpolicies.admissionregistration.k8s.io/{RELEASE}-warnings"),
            None,
            true,
        ),
    ];
    if policies_served {
        checks.extend([
            (
                "create",
                "mutatingadmissionpolicies.admissionregistration.k8s.io".to_owned(),
                None,
                false,
            ),
            (
                "create",
                "mutatingadmissionpolicybindings.admissionregistration.k8s.io".to_owned(),
                None,
                false,
            ),
            (
                "delete",
                format!("mutatingadmissionpolicies.admissionregistration.k8s.io/{RELEASE}"),
                None,
                true,
            ),
        ]);
    }
    for (verb, resource, namespace, allowed) in &checks {
        let mut args = vec!["auth", "can-i", verb, resource, "--as", &service_account];
        match namespace {
            Some(ns) => args.extend(["--namespace", ns]),
            None => args.push("--all-namespaces"),
        }
        let out = cp.kubectl(&args)?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        eprintln!("[chart] can-i {verb} {resource}: {answer}");
        ensure!(
            answer == if *allowed { "yes" } else { "no" },
            "with the webhook backend, can-i {verb} {resource}: {answer}"
        );
    }

    let mut operator = start_operator_as_service_account(cp)?;
    poll(Duration::from_secs(30), "the operator to lead", || {
        Ok(operator
            .metrics()?
            .lines()
            .any(|l| l.trim() == "sidecar_injector_leader 1")
            .then_some(()))
    })?;
    if policies_served {
        poll(Duration::from_secs(30), "the policy removed", || {
            Ok(cp
                .try_get_json("mutatingadmissionpolicy", None, RELEASE)?
                .is_none()
                .then_some(()))
        })?;
        eprintln!("[chart] the webhook backend removed the MutatingAdmissionPolicy {RELEASE}");
    }
    // The webhook is still kept: a template is served by it.
    cp.apply_yaml(
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata:\n  name: chart-webhook-only\n\
         spec:\n  namespaceSelector: {matchLabels: {none: none}}\n\
         \x20 containers:\n    - name: webhook-only\n      image: busybox:1.36\n",
    )?;
    let entry = wait_served(cp, "chart-webhook-only", RELEASE)?;
    eprintln!("[chart] a template served by {entry} with the webhook backend");
    // It is required (the default failurePolicy): the after-admission policy keeps it.
    let after_admission = format!("{RELEASE}-after-admission");
    poll(
        Duration::from_secs(30),
        "the after-admission policy with the webhook backend",
        || cp.try_get_json("validatingadmissionpolicy", None, &after_admission),
    )?;
    eprintln!("[chart] the webhook backend wrote {after_admission}");
    cp.kubectl_ok(&["delete", "sidecartemplate", "chart-webhook-only"])?;
    let log = std::fs::read_to_string(operator.log_path().context("the operator has no log")?)?;
    ensure!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused something with the webhook backend:\n{}",
        operator.log_tail(40)
    );
    operator.stop()?;
    Ok(())
}

/// The minor version of [`kube_version`] (`v1.37.2`: 37); `None` for the default (1.34).
fn kube_minor() -> Option<u32> {
    kube_version()?.split('.').nth(1)?.parse().ok()
}

/// One admission policy object of `kind` named `name`, valid (a policy matching ConfigMaps; a
/// binding to the policy of the same name), as YAML.
fn admission_policy(kind: &str, name: &str) -> String {
    let head = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata: {{name: {name}}}\n"
    );
    let rules = "  matchConstraints:\n    resourceRules:\n      - {apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}\n";
    match kind {
        "ValidatingAdmissionPolicy" => {
            format!("{head}spec:\n{rules}  validations: [{{expression: \"true\"}}]\n")
        }
        "ValidatingAdmissionPolicyBinding" => {
            format!("{head}spec: {{policyName: {name}, validationActions: [Deny]}}\n")
        }
        "MutatingAdmissionPolicy" => format!(
            "{head}spec:\n{rules}  reinvocationPolicy: Never\n  mutations:\n    - patchType: ApplyConfiguration\n\
             \x20     applyConfiguration: {{expression: 'Object{{metadata: Object.metadata{{labels: {{\"a\": \"b\"}}}}}}'}}\n"
        ),
        _ => format!("{head}spec: {{policyName: {name}}}\n"),
    }
}

/// The four kinds of admission policy objects (the mutating ones only where served).
fn admission_policy_kinds(cp: &ControlPlane) -> anyhow::Result<Vec<&'static str>> {
    let mut kinds = vec![
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    if cp.serves_mutating_admission_policies()? {
        kinds.extend(["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]);
    }
    Ok(kinds)
}

/// The chart's static policy (`leastPrivilegePolicy.staticManifest`, rendered with `helm
/// template --show-only`), copied into the API server's static policy directory: impersonating
/// the operator's ServiceAccount, an admission policy or binding of another name is refused,
/// and every one of the operator's own names is admitted (dry runs: nothing is stored).
fn prove_static_policy(cp: &ControlPlane, helm: &Helm, chart: &Path) -> anyhow::Result<()> {
    let dir = cp
        .static_policy_dir()
        .context("the control plane loads no static policies")?;
    let manifest = helm.run(&[
        "template",
        RELEASE,
        path(chart),
        "--namespace",
        NAMESPACE,
        "--set",
        "leastPrivilegePolicy.staticManifest=true",
        "--show-only",
        "templates/leastprivilege-static.yaml",
    ])?;
    std::fs::write(dir.join("sidecar-injector-least-privilege.yaml"), &manifest)?;
    let kinds = admission_policy_kinds(cp)?;
    let other = format!("{RELEASE}-least-privilege-other");
    // The API server reads its static policy directory again every minute.
    poll(
        Duration::from_secs(150),
        "the static policy in force",
        || {
            Ok(
                match create_as_operator(
                    cp,
                    &admission_policy("ValidatingAdmissionPolicy", &other),
                    &["--dry-run=server"],
                )? {
                    Outcome::Refused(message) if message.contains(".static.k8s.io") => Some(()),
                    _ => None,
                },
            )
        },
    )?;
    let own_mutating = [
        RELEASE.to_owned(),
        format!("{RELEASE}-proof"),
        format!("{RELEASE}-namespaces-0"),
        format!("{RELEASE}-namespaces-{}", NAMESPACE_BINDING_SLOTS - 1),
    ];
    let own_validating = [
        format!("{RELEASE}-guard"),
        format!("{RELEASE}-warnings"),
        format!("{RELEASE}-after-admission"),
        format!("{RELEASE}-warnings-namespaces-0"),
        format!(
            "{RELEASE}-warnings-namespaces-{}",
            NAMESPACE_BINDING_SLOTS - 1
        ),
    ];
    for kind in kinds {
        let refused =
            create_as_operator(cp, &admission_policy(kind, &other), &["--dry-run=server"])?;
        ensure!(
            matches!(&refused, Outcome::Refused(m) if m.contains(".static.k8s.io")),
            "a {kind} of another name under the static policy: {refused:?}"
        );
        let own = if kind.starts_with("Mutating") {
            &own_mutating[..]
        } else {
            &own_validating[..]
        };
        for name in own {
            let outcome =
                create_as_operator(cp, &admission_policy(kind, name), &["--dry-run=server"])?;
            // Admitted: stored as a dry run, or found already there (applied by the operator).
            ensure!(
                matches!(&outcome, Outcome::Accepted)
                    || matches!(&outcome, Outcome::Failed(m) if m.contains("AlreadyExists")),
                "the operator's own {kind} {name} under the static policy: {outcome:?}"
            );
        }
        eprintln!(
            "[chart] static policy: a {kind} of another name refused, of the operator's names ({}) admitted",
            own.join(", ")
        );
    }
    Ok(())
}
