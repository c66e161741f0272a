//! Monitoring against real components: the chart's alerts through `promtool check rules` and
//! `promtool test rules` (`e2e/monitoring/check-rules.sh`, on the PrometheusRule the chart
//! renders), then a real Prometheus (built from its Go module at the version of
//! `e2e/control-plane/versions.env`) on 127.0.0.1 scraping the operator's admin port and the API
//! server's `/metrics` (with a ServiceAccount token, as an in-cluster Prometheus does), evaluating
//! those same rendered rules every second.
//!
//! The test brings about the condition of ten alerts for real (a webhook outage with a required
//! and a best-effort template, denied Pods, an invalid template, stale and missing Pods, status
//! writes refused by an admission policy, a damaged certificate Secret, a short-lived serving
//! certificate, failed TLS handshakes), and proves that each alert's expression returns data and
//! that the alert is pending or firing. Three conditions it cannot bring about on a healthy
//! operator (no leader, templates left out of a full configuration, a p99 above 50 ms): their
//! expressions are evaluated without the final comparison, which must be exactly the threshold
//! the rule has, and must return data. Every rule must be evaluated with health `ok`. Then every
//! query of the Grafana dashboard the chart renders (its ConfigMap applied to the API server and
//! read back) must evaluate without error and return data.
//!
//! Off unless `SIDECAR_INJECTOR_E2E=1` (`just e2e`). Everything listens on 127.0.0.1; the
//! processes are killed and the temporary directory removed at the end, also on failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use injector_e2e::harness;
use injector_e2e::prometheus::{HttpsScrape, Prometheus, ScrapeTarget};
use injector_e2e::steps::{CONFIGURATION, install_crd, wait_invalid_event, wait_served};
use injector_e2e::{
    Backend, ControlPlane, Operator, OperatorOptions, poll, poll_every, tool, workspace_root,
};
use serde_json::{Value, json};

/// How one alert is shown to work on real metrics.
#[derive(Debug, Clone, Copy)]
enum Evidence {
    /// The test brings about the condition: the whole expression returns data, and the alert is
    /// pending (its `for` not yet over) or firing.
    Fires,
    /// The expression less this final comparison (as Prometheus prints the rule) returns data.
    WithoutThreshold(&'static str),
}

/// Every alert of the chart's rules, and how the test shows it works.
const ALERTS: [(&str, Evidence); 13] = [
    ("SidecarInjectorWebhookUnreachable", Evidence::Fires),
    ("SidecarInjectorBestEffortSkipped", Evidence::Fires),
    (
        "SidecarInjectorNoLeader",
        Evidence::WithoutThreshold(" < 1"),
    ),
    ("SidecarInjectorPodsDenied", Evidence::Fires),
    ("SidecarInjectorInvalidTemplates", Evidence::Fires),
    (
        "SidecarInjectorTemplatesNotServed",
        Evidence::WithoutThreshold(" > 0"),
    ),
    ("SidecarInjectorStalePods", Evidence::Fires),
    ("SidecarInjectorMissingSidecars", Evidence::Fires),
    ("SidecarInjectorReconcileErrors", Evidence::Fires),
    ("SidecarInjectorCertificateSecretDamaged", Evidence::Fires),
    ("SidecarInjectorCertificateNotRotated", Evidence::Fires),
    (
        "SidecarInjectorSlowAdmissions",
        Evidence::WithoutThreshold(" > 0.05"),
    ),
    ("SidecarInjectorTLSHandshakeFailures", Evidence::Fires),
];

/// The namespace label the two templates select on.
const SCENARIO_LABEL: &str = "e2e.sidecar.dev/monitoring";
const REQUIRED: &str = "e2e-mon-required";
const BEST_EFFORT: &str = "e2e-mon-best-effort";
/// How long Prometheus gets to show what was brought about (it scrapes and evaluates every
/// second).
const SEEN_TIMEOUT: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    harness::run_tests("monitoring", &[("monitoring", monitoring)])
}

fn monitoring() {
    let cp = ControlPlane::start().expect("the control plane starts");

    step("promtool check rules and test rules, on the rules the chart renders");
    let rules = check_rules(&cp.dir().join("rules")).unwrap();

    install_crd(&cp).unwrap();
    // The webhook backend on every version, so that the API server calls the webhook for the
    // templates below (the alerts on its calls are about the webhook); a serving certificate of
    // 2 hours, which the certificate alert must see as expiring within a week.
    let mut operator = Operator::start(
        &cp,
        OperatorOptions {
            serving_lifetime: Some("2h".to_owned()),
            extra_args: Backend::Webhook.args(),
            ..OperatorOptions::default()
        },
    )
    .expect("the operator starts");

    step("Prometheus scraping the operator and the API server, with the chart's rules");
    let prometheus = start_prometheus(&cp, &operator, &rules).unwrap();

    step("bringing about the alerts' conditions");
    bring_about_conditions(&cp, &mut operator, &prometheus).unwrap();

    step("every alert: evaluated, and its expression returns data");
    check_alerts(&prometheus).unwrap();

    step("every query of the chart's Grafana dashboard returns data");
    check_dashboard(&cp, &prometheus).unwrap();
}

fn step(what: &str) {
    eprintln!("\n[monitoring] ===== {what}");
}

/// Runs `e2e/monitoring/check-rules.sh DIR` (the rendered rules through promtool) and returns
/// the rules file it wrote there.
fn check_rules(dir: &Path) -> anyhow::Result<PathBuf> {
    let script = workspace_root().join("e2e/monitoring/check-rules.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(dir)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}", script.display()))?;
    ensure!(status.success(), "{} failed: {status}", script.display());
    let rules = dir.join("sidecar-injector.rules.yaml");
    ensure!(
        rules.is_file(),
        "{} wrote no {}",
        script.display(),
        rules.display()
    );
    Ok(rules)
}

/// Starts Prometheus with two jobs: the operator's admin port, and the API server with the
/// token of a ServiceAccount allowed only `get` on `/metrics`; waits until both are scraped.
fn start_prometheus(
    cp: &ControlPlane,
    operator: &Operator,
    rules: &Path,
) -> anyhow::Result<Prometheus> {
    let rbac = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "prometheus", "namespace": "default"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "e2e-prometheus"},
             "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "e2e-prometheus"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "e2e-prometheus"},
             "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "default"}]},
        ],
    });
    cp.apply_yaml(&rbac.to_string())?;
    let token = cp.kubectl_ok(&[
        "create",
        "token",
        "prometheus",
        "--namespace",
        "default",
        "--duration",
        "1h",
    ])?;
    let dir = cp.dir().join("prometheus");
    std::fs::create_dir_all(&dir)?;
    let token_file = dir.join("token");
    std::fs::write(&token_file, token.trim())?;
    let api_server: SocketAddr = cp
        .server_url()
        .strip_prefix("https://")
        .context("the API server's URL")?
        .parse()?;
    let targets = [
        ScrapeTarget {
            job: "sidecar-injector".to_owned(),
            address: SocketAddr::from(([127, 0, 0, 1], operator.admin_port())),
            https: None,
        },
        ScrapeTarget {
            job: "apiserver".to_owned(),
            address: api_server,
            https: Some(HttpsScrape {
                ca_file: cp.ca_cert_path(),
                token_file,
            }),
        },
    ];
    let prometheus = Prometheus::start(&dir, &targets, &[rules.to_path_buf()])?;
    poll(SEEN_TIMEOUT, "both targets scraped", || {
        let targets = prometheus.targets()?;
        let up: Vec<&str> = targets
            .iter()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| t["scrapePool"].as_str())
            .collect();
        eprintln!("[monitoring] targets up: {up:?}");
        Ok((up.contains(&"sidecar-injector") && up.contains(&"apiserver")).then_some(()))
    })
    .with_context(|| format!("targets: {:?}", prometheus.targets()))?;
    Ok(prometheus)
}

/// A SidecarTemplate selecting the namespaces labelled `SCENARIO_LABEL=<scenario>`, adding one
/// container.
fn template(
    name: &str,
    scenario: &str,
    failure_policy: &str,
    container: &str,
    image: &str,
) -> String {
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {SCENARIO_LABEL: scenario}},
            "failurePolicy": failure_policy,
            "containers": [{"name": container, "image": image}],
        },
    })
    .to_string()
}

/// Creates a Pod whose one container is `container`; the Pod, or kubectl's error.
fn create_pod(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    container: &str,
) -> anyhow::Result<Value> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": container, "image": "busybox:1.36"}]},
    });
    let out = cp.kubectl_with_stdin(&["create", "-f", "-", "-o", "json"], &pod.to_string())?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Creates a Pod with a generated name (`current-N`) whose one container is `container`.
fn create_pod_named(cp: &ControlPlane, namespace: &str, container: &str) -> anyhow::Result<Value> {
    static PODS: AtomicU32 = AtomicU32::new(0);
    let n = PODS.fetch_add(1, Ordering::Relaxed);
    create_pod(cp, namespace, &format!("current-{n}"), container)
}

/// Creates a Pod that must be refused, with an error saying `reason`.
fn refused_pod(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    container: &str,
    reason: &str,
) -> anyhow::Result<()> {
    match create_pod(cp, namespace, name, container) {
        Ok(pod) => bail!("{namespace}/{name} was admitted: {pod}"),
        Err(e) => {
            let e = format!("{e:#}");
            ensure!(
                e.contains(reason),
                "{namespace}/{name} refused, but not for {reason:?}: {e}"
            );
            Ok(())
        }
    }
}

/// Waits until `expr` returns data; returns the result.
fn wait_data(prometheus: &Prometheus, expr: &str) -> anyhow::Result<Vec<Value>> {
    poll(SEEN_TIMEOUT, &format!("data for {expr}"), || {
        let result = prometheus.query(expr)?;
        Ok((!result.is_empty()).then_some(result))
    })
}

/// Does `act` twice, with a scrape of the counter `series` seen in between, then waits until
/// Prometheus has scraped its increase: a labelled counter appears with its first increment,
/// and `rate` and `increase` need two samples of it to see one (a process stopped next may
/// never be scraped again). The selector must be the one `act` creates: a denial by the
/// webhook also counts in the API server's rejections, as `error_type="no_error"`.
fn twice(
    prometheus: &Prometheus,
    series: &str,
    mut act: impl FnMut(u32) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    act(1)?;
    wait_data(prometheus, series)?;
    act(2)?;
    wait_data(prometheus, &format!("increase({series}[10m]) > 0"))?;
    Ok(())
}

fn bring_about_conditions(
    cp: &ControlPlane,
    operator: &mut Operator,
    prometheus: &Prometheus,
) -> anyhow::Result<()> {
    let required_ns = cp.namespace("mon-required", &[(SCENARIO_LABEL, "required")])?;
    let best_effort_ns = cp.namespace("mon-best-effort", &[(SCENARIO_LABEL, "best-effort")])?;
    // Before the best-effort template: missing once it exists.
    create_pod(cp, &best_effort_ns, "early", "app")?;
    // Images no Pod of the test has: a Pod's own `mon-agent` container (busybox) clashes.
    cp.apply_yaml(&template(
        REQUIRED,
        "required",
        "Fail",
        "mon-agent",
        "agent.invalid/agent:1",
    ))?;
    cp.apply_yaml(&template(
        BEST_EFFORT,
        "best-effort",
        "Ignore",
        "mon-helper",
        "busybox:1.36",
    ))?;
    wait_served(cp, REQUIRED, CONFIGURATION)?;
    wait_served(cp, BEST_EFFORT, CONFIGURATION)?;
    let pod = create_pod(cp, &required_ns, "injected", "app")?;
    ensure!(
        injector_e2e::pod::containers(&pod).contains(&"mon-agent".to_owned()),
        "not injected: {pod}"
    );

    eprintln!("[monitoring] a container clashing with the required template's: denied, twice");
    twice(prometheus, "sidecar_injector_denials_total", |n| {
        refused_pod(
            cp,
            &required_ns,
            &format!("clash-{n}"),
            "mon-agent",
            REQUIRED,
        )
    })?;

    eprintln!("[monitoring] the operator stopped: required Pods refused, best-effort ones skipped");
    operator.stop()?;
    twice(
        prometheus,
        r#"apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error"}"#,
        |n| {
            refused_pod(
                cp,
                &required_ns,
                &format!("refused-{n}"),
                "app",
                "failed calling webhook",
            )
        },
    )?;
    twice(
        prometheus,
        "apiserver_admission_webhook_fail_open_count",
        |n| {
            let pod = create_pod(cp, &best_effort_ns, &format!("skipped-{n}"), "app")?;
            ensure!(
                !injector_e2e::pod::containers(&pod).contains(&"mon-helper".to_owned()),
                "injected while the operator was stopped: {pod}"
            );
            Ok(())
        },
    )?;
    operator.restart()?;

    eprintln!("[monitoring] an image edit: the injected Pod is stale");
    cp.apply_yaml(&template(
        REQUIRED,
        "required",
        "Fail",
        "mon-agent",
        "agent.invalid/agent:2",
    ))?;
    wait_served(cp, REQUIRED, CONFIGURATION)?;
    // Admissions and injections by the restarted operator too (its counters started afresh):
    // a current Pod of each template.
    for (namespace, container) in [(&required_ns, "mon-agent"), (&best_effort_ns, "mon-helper")] {
        let pod = poll(
            SEEN_TIMEOUT,
            &format!("{container} injected by the restarted operator"),
            || {
                let pod = create_pod_named(cp, namespace, "app")?;
                Ok(injector_e2e::pod::containers(&pod)
                    .contains(&container.to_owned())
                    .then_some(pod))
            },
        )?;
        eprintln!(
            "[monitoring] injected: {}/{}",
            namespace, pod["metadata"]["name"]
        );
    }

    eprintln!("[monitoring] an invalid template");
    let invalid = json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": "e2e-mon-invalid"},
        "spec": {
            "namespaceSelector": {"matchLabels": {SCENARIO_LABEL: "none"}},
            "containers": [{"name": "bad", "image": "busybox:1.36", "args": ["{{ pod.nope }}"]}],
        },
    });
    cp.apply_yaml(&invalid.to_string())?;
    wait_invalid_event(cp, "e2e-mon-invalid")?;

    eprintln!("[monitoring] an unreadable key in the certificate Secret, twice");
    twice(
        prometheus,
        "sidecar_injector_certificate_secret_unreadable_keys_total",
        |_| {
            // base64 of "not a certificate": the leader drops the key and writes the Secret again.
            cp.kubectl_ok(&[
                "patch",
                "secret",
                "sidecar-injector-tls",
                "-n",
                "sidecar-injector",
                "--type=merge",
                "-p",
                r#"{"data":{"ca-previous.crt":"bm90IGEgY2VydGlmaWNhdGU="}}"#,
            ])?;
            Ok(())
        },
    )?;

    eprintln!("[monitoring] 100 connections to the webhook that are not TLS");
    let webhook: SocketAddr = operator
        .webhook_url()
        .strip_prefix("https://")
        .context("the webhook's URL")?
        .parse()?;
    for _ in 0..100 {
        not_tls(webhook)?;
    }

    eprintln!("[monitoring] status writes refused by an admission policy: reconcile errors");
    refuse_status_writes(cp)?;
    let mut priority = 0;
    poll_every(
        SEEN_TIMEOUT,
        Duration::from_secs(2),
        "reconcile errors of kind status",
        || {
            // Each edit is a new generation, whose status the operator must write.
            priority += 1;
            let patch = json!({"spec": {"priority": priority}}).to_string();
            cp.kubectl_ok(&[
                "patch",
                "sidecartemplate",
                BEST_EFFORT,
                "--type=merge",
                "-p",
                patch.as_str(),
            ])?;
            let errors =
                prometheus.query(r#"sidecar_injector_reconcile_errors_total{kind="status"}"#)?;
            Ok((!errors.is_empty()).then_some(()))
        },
    )?;
    Ok(())
}

/// Connects to `addr`, sends bytes that are not a TLS ClientHello, and reads until the server
/// closes: one failed handshake.
fn not_tls(addr: SocketAddr) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: not-tls\r\n\r\n")?;
    let mut rest = Vec::new();
    // The server's alert or a reset: either ends the handshake.
    let _ = stream.read_to_end(&mut rest);
    Ok(())
}

/// A ValidatingAdmissionPolicy, with its binding, refusing every update of a SidecarTemplate's
/// status.
fn refuse_status_writes(cp: &ControlPlane) -> anyhow::Result<()> {
    let name = "e2e-refuse-template-status";
    let policy = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {
                 "failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": ["sidecar.dev"], "apiVersions": ["*"],
                     "operations": ["UPDATE"], "resources": ["sidecartemplates/status"],
                 }]},
                 "validations": [{"expression": "false",
                                  "message": "e2e: status writes refused (monitoring test)"}],
             }},
            {"apiVersion": "admissionregistration.k8s.io/v1",
             "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name},
             "spec": {"policyName": name, "validationActions": ["Deny"]}},
        ],
    });
    cp.apply_yaml(&policy.to_string())?;
    Ok(())
}

/// Every rule healthy and evaluated; each alert shown to work as [`ALERTS`] says.
fn check_alerts(prometheus: &Prometheus) -> anyhow::Result<()> {
    let rules = poll(SEEN_TIMEOUT, "every rule evaluated", || {
        let rules = prometheus.rules()?;
        let evaluated = rules.iter().all(|r| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001"))
        });
        Ok(evaluated.then_some(rules))
    })?;
    let mut names: Vec<&str> = rules.iter().filter_map(|r| r["name"].as_str()).collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = ALERTS.iter().map(|(name, _)| *name).collect();
    expected.sort_unstable();
    ensure!(
        names == expected,
        "the rules loaded are {names:?}, the test knows {expected:?}"
    );
    for rule in &rules {
        ensure!(
            rule["health"] == "ok" && rule["lastError"].as_str().unwrap_or_default().is_empty(),
            "rule {} evaluated with an error: {rule}",
            rule["name"]
        );
    }

    for (name, evidence) in ALERTS {
        let rule = rules
            .iter()
            .find(|r| r["name"] == name)
            .with_context(|| format!("no rule {name}"))?;
        let query = rule["query"].as_str().context("a rule without a query")?;
        match evidence {
            Evidence::Fires => {
                let result = wait_data(prometheus, query).with_context(|| {
                    format!(
                        "{name}: its condition was brought about; the series it reads: {}",
                        series_of(prometheus, query)
                    )
                })?;
                let state = poll(SEEN_TIMEOUT, &format!("{name} pending or firing"), || {
                    Ok(prometheus
                        .alerts()?
                        .into_iter()
                        .find(|a| a["labels"]["alertname"] == name)
                        .map(|a| a["state"].clone()))
                })?;
                eprintln!(
                    "[monitoring] {name}: {state}, {query} = {}",
                    values(&result)
                );
            }
            Evidence::WithoutThreshold(threshold) => {
                let bare = query.strip_suffix(threshold).with_context(|| {
                    format!("{name}: {query:?} does not end with the threshold {threshold:?}")
                })?;
                let result = wait_data(prometheus, bare)?;
                // A number, not NaN (a quantile of no admissions would be NaN).
                for sample in &result {
                    let value: f64 = sample["value"][1]
                        .as_str()
                        .context("a sample without a value")?
                        .parse()?;
                    ensure!(value.is_finite(), "{name}: {bare} = {sample}");
                }
                eprintln!(
                    "[monitoring] {name}: not brought about; without{threshold}: {bare} = {}",
                    values(&result)
                );
            }
        }
    }
    Ok(())
}

/// What Prometheus holds now of each metric `query` names, for an error message.
fn series_of(prometheus: &Prometheus, query: &str) -> String {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("sidecar_injector_") || word.starts_with("apiserver_"))
        .map(|metric| match prometheus.query(metric) {
            Ok(result) => format!("{metric}: [{}]", values(&result)),
            Err(e) => format!("{metric}: {e:#}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The samples of an instant query's result, as `{labels} value` strings.
fn values(result: &[Value]) -> String {
    result
        .iter()
        .map(|s| format!("{} {}", s["metric"], s["value"][1]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Renders the chart's dashboard ConfigMap, applies it, reads the dashboard back from the API
/// server and runs every panel's queries.
fn check_dashboard(cp: &ControlPlane, prometheus: &Prometheus) -> anyhow::Result<()> {
    let helm = tool("helm")?;
    let home = cp.dir().join("helm");
    let out = Command::new(&helm)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .args(["template", "sidecar-injector"])
        .arg(workspace_root().join("charts/sidecar-injector"))
        .args([
            "--namespace",
            "sidecar-injector",
            "--set",
            "grafanaDashboard.enabled=true",
            "--show-only",
            "templates/grafana-dashboard.yaml",
        ])
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    cp.apply_yaml(&String::from_utf8_lossy(&out.stdout))?;
    let configmap = cp.get_json(
        "configmap",
        Some("sidecar-injector"),
        "sidecar-injector-dashboard",
    )?;
    ensure!(
        configmap["metadata"]["labels"]["grafana_dashboard"] == "1",
        "the dashboard's ConfigMap lacks the Grafana sidecar's label: {}",
        configmap["metadata"]
    );
    let dashboard: Value = serde_json::from_str(
        configmap["data"]["sidecar-injector.json"]
            .as_str()
            .context("no sidecar-injector.json in the ConfigMap")?,
    )?;
    let mut exprs = Vec::new();
    collect_exprs(&dashboard["panels"], &mut exprs);
    ensure!(
        exprs.len() >= 20,
        "only {} queries in the dashboard",
        exprs.len()
    );
    for expr in exprs {
        // Grafana would substitute a variable; the panels use none, so each runs as it is.
        ensure!(
            !expr.contains('$'),
            "a dashboard query with a variable: {expr}"
        );
        let result = wait_data(prometheus, &expr)?;
        eprintln!("[monitoring] dashboard: {expr} = {}", values(&result));
    }
    Ok(())
}

/// The `expr` of every target of every panel, rows' nested panels included.
fn collect_exprs(panels: &Value, exprs: &mut Vec<String>) {
    for panel in panels.as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                exprs.push(expr.to_owned());
            }
        }
        collect_exprs(&panel["panels"], exprs);
    }
}
