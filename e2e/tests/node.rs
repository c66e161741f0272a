//! Scenarios that need Pods to run: the local control plane with a real node (containerd,
//! kubelet, kube-scheduler, kube-proxy; `injector_e2e::Cluster`), the operator out of cluster,
//! and the examples with their images replaced by local stand-ins.
//!
//! Each scenario is a test of its own (`cargo test -p injector-e2e --test node NAME`). One node
//! per machine, so they share it: the first that runs starts it, they run one at a time in
//! order (each in its own namespaces), and it all stops when the last ends, also after a
//! failure (the harness is libtest-mimic's, `harness = false`). Needs root and the host
//! packages (`just node-packages`). Ignored unless `SIDECAR_INJECTOR_E2E=1`.
//!
//! The last scenarios (from g on) run on the chart installed from the release artifacts of
//! `just dist` (the packaged chart and the image archive), as a user installs it: the
//! first of them that runs installs it, and the last (l) uninstalls it and checks that nothing
//! is left (or, when l did not run, it is uninstalled at the end).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use injector_e2e::harness::{self, Shared};
use injector_e2e::host::{BRIDGE_ADDRESS, check_fence};
use injector_e2e::images::with_stand_ins;
use injector_e2e::pod::{containers, init_containers};
use injector_e2e::release::{CRD, Release};
use injector_e2e::steps::{
    CONFIGURATION, example, kubectl_run_args, wait_crd_established, wait_injected, wait_served,
};
use injector_e2e::{
    Cluster, Operator, OperatorOptions, http_get_at, poll, run_scenario, workspace_root,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

type Scenario = fn(&Cluster) -> anyhow::Result<()>;

/// The first scenario on the chart's operator, which replaces the one out of cluster.
const CHART: &str = "g-chart-installed-from-the-release-artifacts";
const REQUIRED_DOWN: &str = "h-required-pod-refused-while-no-replica-serves";
const FORCE_DELETED: &str = "i-operator-pod-force-deleted-under-load";
const UPGRADE: &str = "j-helm-upgrade-under-load";
const RBAC: &str = "k-rbac-of-the-installed-chart";
const ROLLING: &str = "m-rolling-restart-within-the-budget";
const HEALING: &str = "n-a-stuck-rollout-halts-and-missing-pods-heal";
const IN_PLACE: &str = "o-in-place-image-updates";
/// Runs last (after m, n and o, which need the chart installed).
const UNINSTALL: &str = "l-helm-uninstall-leaves-nothing";
/// The scenarios that run on the chart's operator (last in `SCENARIOS`).
const ON_THE_CHART: [&str; 9] = [
    CHART,
    REQUIRED_DOWN,
    FORCE_DELETED,
    UPGRADE,
    RBAC,
    ROLLING,
    HEALING,
    IN_PLACE,
    UNINSTALL,
];

/// The chart's release, its namespace, and the name of its objects (the Deployment, the
/// Service, the MutatingWebhookConfiguration).
const RELEASE: &str = "chart";
const RELEASE_NAMESPACE: &str = "chart-system";
const CHART_OBJECTS: &str = "chart-sidecar-injector";
const INSTALLED_CHART: Release<'static> = Release {
    namespace: RELEASE_NAMESPACE,
    fullname: CHART_OBJECTS,
};

#[path = "node/rollouts.rs"]
mod rollouts;

const SCENARIOS: [(&str, Scenario); 15] = [
    ("a-fence-and-no-registry", fence_and_no_registry),
    (
        "b-kubernetes-service-from-a-pod",
        kubernetes_service_from_a_pod,
    ),
    ("c-nginx-sidecar-deployment-ready", nginx_sidecar_deployment),
    (
        "d-native-sidecar-ready-before-app",
        native_sidecar_before_app,
    ),
    (
        "e-job-with-native-sidecar-completes",
        job_with_native_sidecar,
    ),
    ("f-log-shipper-reads-the-app-log", log_shipper),
    (CHART, chart_from_the_image),
    (REQUIRED_DOWN, required_while_no_replica_serves),
    (FORCE_DELETED, operator_pod_force_deleted_under_load),
    (UPGRADE, helm_upgrade_under_load),
    (RBAC, rbac_of_the_installed_chart),
    (ROLLING, rollouts::rolling_restart_within_the_budget),
    (
        HEALING,
        rollouts::a_stuck_rollout_halts_and_missing_pods_heal,
    ),
    (IN_PLACE, rollouts::in_place_image_updates),
    (UNINSTALL, helm_uninstall_leaves_nothing),
];

/// The cluster with its node, and the operator out of cluster until the chart's replaces it.
/// The operator is declared first: it is dropped (stopped) before the cluster.
struct Node {
    operator: Operator,
    cluster: Cluster,
    /// Whether the chart's operator has replaced the one out of cluster.
    on_the_chart: bool,
}

impl Node {
    fn start() -> anyhow::Result<Self> {
        let started = Instant::now();
        let cluster = Cluster::start()?;
        eprintln!(
            "[e2e] cluster with its node up in {:.1?}",
            started.elapsed()
        );
        cluster
            .apply_file(&workspace_root().join("crds"))
            .context("kubectl apply -f crds/")?;
        wait_crd_established(&cluster)?;
        let operator = Operator::start(&cluster, OperatorOptions::default())?;
        Ok(Node {
            operator,
            cluster,
            on_the_chart: false,
        })
    }
}

fn main() -> ExitCode {
    // The node (containerd 1.6, cgroup v1 here) runs the default version only.
    let ignored_because = injector_e2e::kube_version().map(|version| {
        format!(
            "{}={version}; the node runs only the default Kubernetes version \
             (e2e/control-plane/versions.env)",
            injector_e2e::KUBE_VERSION_VAR
        )
    });
    harness::run_shared(Shared {
        binary: "node",
        ignored_because,
        scenarios: SCENARIOS
            .iter()
            .map(|&(name, scenario)| (name, scenario, false))
            .collect(),
        start: Node::start,
        run,
        finish,
    })
}

/// Runs one scenario on the shared node.
fn run(node: &mut Node, name: &'static str, scenario: Scenario) -> Result<(), String> {
    if ON_THE_CHART.contains(&name) && !node.on_the_chart {
        node.on_the_chart = true;
        // The chart's operator replaces the one out of cluster (and its configuration, which
        // would point the API server at a stopped process).
        let _ = node.operator.stop();
        node.cluster
            .kubectl_ok(&["delete", "mutatingwebhookconfiguration", CONFIGURATION])
            .map_err(|e| format!("deleting the out-of-cluster configuration: {e:#}"))?;
    }
    run_scenario(name, || scenario(&node.cluster))
}

/// After the last scenario: the chart uninstalled (unless l did, or it never ran), the fence
/// checked again, the logs when something failed, then everything stopped.
fn finish(node: Node, mut failed: bool) -> bool {
    if node.on_the_chart
        && is_installed(&node.cluster)
        && let Err(e) = uninstall(&node.cluster)
    {
        eprintln!("[e2e] FAIL helm uninstall: {e:#}");
        failed = true;
    }
    // kube-proxy resyncs all along: the fence must still be first at the end.
    if let Err(e) = check_fence() {
        eprintln!("[e2e] FAIL the fence at the end: {e:#}");
        failed = true;
    }
    if failed {
        eprintln!("{}", node.cluster.log_tails(30));
        eprintln!("{}", node.operator.log_tail(30));
    }
    failed
}

// ---------------------------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------------------------

/// a. The fence is first in FORWARD and INPUT, and a pull from a registry the node has no
/// configuration for only ever reaches the closed local port. (The registry is an IP literal,
/// so that even a broken configuration could not make the node resolve a name.)
fn fence_and_no_registry(cluster: &Cluster) -> anyhow::Result<()> {
    check_fence()?;
    let ns = cluster.namespace("pull", &[])?;
    let (name, image) = ("other", "127.0.0.2:5/never-built:1");
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{
            "name": "c", "image": image, "imagePullPolicy": "Always",
        }]},
    });
    cluster.apply_yaml(&pod.to_string())?;
    let message = poll(Duration::from_secs(60), "the pull to fail", || {
        Ok(cluster
            .list_json("events", Some(&ns), None)?
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == "Failed")
            .find_map(|e| e["message"].as_str().map(str::to_owned)))
    })?;
    eprintln!("[e2e] pull of {image}: {message}");
    ensure!(
        message.contains("127.0.0.1:1") && !message.contains("dial tcp 127.0.0.2"),
        "the pull of {image} did not go to the closed local port: {message}"
    );
    Ok(())
}

/// b. The `kubernetes` Service's endpoint is the API server on the bridge, and a Pod reaches it
/// through the ClusterIP (kube-proxy's rules) with its ServiceAccount token.
fn kubernetes_service_from_a_pod(cluster: &Cluster) -> anyhow::Result<()> {
    let slices = cluster.list_json(
        "endpointslices",
        Some("default"),
        Some("kubernetes.io/service-name=kubernetes"),
    )?;
    let addresses: Vec<&Value> = slices
        .iter()
        .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .collect();
    ensure!(
        addresses == [&Value::from(BRIDGE_ADDRESS.to_string())],
        "endpoints of the kubernetes Service: {addresses:?}"
    );
    let ns = cluster.namespace("in-cluster", &[])?;
    let script = "wget -q -O- -Y off --no-check-certificate \
        --header \"Authorization: Bearer $(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\" \
        https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version";
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "client",
                "image": "stand-in.invalid/busybox:1.36",
                "command": ["sh", "-c", script],
            }],
        },
    });
    cluster.apply_yaml(&pod.to_string())?;
    wait_phase(cluster, &ns, "client", "Succeeded", Duration::from_secs(60))?;
    let logs = cluster.kubectl_ok(&["logs", "-n", &ns, "client"])?;
    let version: Value =
        serde_json::from_str(&logs).with_context(|| format!("/version: {logs}"))?;
    ensure!(
        version["gitVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.")),
        "/version from the Pod: {logs}"
    );
    Ok(())
}

/// c. The tutorial for real: examples/nginx-sidecar (stand-in images) into a 2-replica
/// Deployment: every Pod 2/2 Ready, and the sidecar serves its ConfigMap's content to the host,
/// by Pod IP and through a ClusterIP Service.
fn nginx_sidecar_deployment(cluster: &Cluster) -> anyhow::Result<()> {
    apply_template(cluster, "nginx-sidecar")?;
    let probe_ns = cluster.namespace("probe-nginx", &[("sidecar.dev/example", "nginx-sidecar")])?;
    wait_injected(cluster, &probe_ns, &["app=web"], "nginx-sidecar")?;

    let created = Instant::now();
    cluster.apply_yaml(&with_stand_ins(&read_example(
        "nginx-sidecar/workload.yaml",
    )?))?;
    cluster.kubectl_ok(&[
        "scale",
        "deployment/web",
        "-n",
        "nginx-demo",
        "--replicas=2",
    ])?;
    let pods = poll(Duration::from_secs(90), "2 Pods of web, 2/2 Ready", || {
        let pods = cluster.list_json("pods", Some("nginx-demo"), Some("app=web"))?;
        let ready = pods.len() == 2
            && pods.iter().all(|p| {
                let statuses = p["status"]["containerStatuses"].as_array();
                statuses.is_some_and(|s| s.len() == 2 && s.iter().all(|c| c["ready"] == true))
            });
        Ok(ready.then_some(pods))
    })?;
    eprintln!(
        "[e2e] 2 Pods 2/2 Ready {:.1?} after the workload was applied",
        created.elapsed()
    );
    let expected = cluster.get_json("configmap", Some("nginx-demo"), "nginx-sidecar-conf")?["data"]
        ["default.conf"]
        .as_str()
        .context("the ConfigMap has no default.conf")?
        .to_owned();
    for pod in &pods {
        ensure!(
            containers(pod) == ["web", "nginx-sidecar"],
            "containers: {:?}",
            containers(pod)
        );
        let ip: IpAddr = pod["status"]["podIP"]
            .as_str()
            .context("no podIP")?
            .parse()?;
        let (status, body) = http_get_at(
            SocketAddr::new(ip, 8080),
            "/default.conf",
            Duration::from_secs(5),
        )?;
        ensure!(
            status == 200 && body == expected,
            "GET {ip}:8080/default.conf: {status} {body:?}"
        );
    }
    cluster.kubectl_ok(&[
        "expose",
        "deployment/web",
        "-n",
        "nginx-demo",
        "--name=web-sidecar",
        "--port=8080",
    ])?;
    let service = cluster.get_json("service", Some("nginx-demo"), "web-sidecar")?;
    let cluster_ip: IpAddr = service["spec"]["clusterIP"]
        .as_str()
        .context("no clusterIP")?
        .parse()?;
    let body = poll(Duration::from_secs(30), "the ClusterIP to answer", || {
        Ok(http_get_at(
            SocketAddr::new(cluster_ip, 8080),
            "/default.conf",
            Duration::from_secs(2),
        )
        .ok()
        .filter(|(status, _)| *status == 200)
        .map(|(_, body)| body))
    })?;
    ensure!(
        body == expected,
        "GET {cluster_ip}:8080/default.conf: {body:?}"
    );
    Ok(())
}

/// d. examples/native-proxy (stand-in envoy, plus a startupProbe so that the kubelet waits
/// for it): the proxy is started and ready before the app container starts, from the Pod's
/// container statuses and from the app itself, which finds the proxy answering when it starts.
fn native_sidecar_before_app(cluster: &Cluster) -> anyhow::Result<()> {
    apply_native_proxy(cluster)?;
    let ns = cluster.namespace("native", &[])?;
    let app = "if wget -q -O- -Y off http://127.0.0.1:15000/ready >/dev/null; then \
               echo proxy-ready-at-app-start; else echo proxy-not-ready-at-app-start; fi; \
               exec sleep 3600";
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "checkout",
            "namespace": ns,
            "labels": {"app": "checkout"},
            "annotations": {"sidecar.dev/templates": "native-proxy"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "checkout",
                "image": "stand-in.invalid/busybox:1.36",
                "command": ["sh", "-c", app],
            }],
        },
    });
    let pod = wait_created_with(cluster, &ns, &pod, "proxy")?;
    ensure!(
        init_containers(&pod) == ["proxy"],
        "init containers: {:?}",
        init_containers(&pod)
    );
    let pod = poll(Duration::from_secs(60), "checkout to be Ready", || {
        let pod = cluster.get_json("pod", Some(&ns), "checkout")?;
        let ready = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        Ok(ready.then_some(pod))
    })?;
    let proxy = &pod["status"]["initContainerStatuses"][0];
    let app_status = &pod["status"]["containerStatuses"][0];
    ensure!(
        proxy["name"] == "proxy" && proxy["started"] == true && proxy["ready"] == true,
        "proxy status: {proxy}"
    );
    let proxy_started = proxy["state"]["running"]["startedAt"]
        .as_str()
        .context("the proxy is not running")?;
    let app_started = app_status["state"]["running"]["startedAt"]
        .as_str()
        .context("the app is not running")?;
    // RFC 3339 in UTC with whole seconds: compared as text.
    ensure!(
        proxy_started <= app_started,
        "proxy started at {proxy_started}, the app at {app_started}"
    );
    let logs = poll(Duration::from_secs(30), "the app's log", || {
        let logs = cluster.kubectl_ok(&["logs", "-n", &ns, "checkout", "-c", "checkout"])?;
        Ok((!logs.trim().is_empty()).then_some(logs))
    })?;
    ensure!(
        logs.trim() == "proxy-ready-at-app-start",
        "the app's log: {logs:?}"
    );
    eprintln!(
        "[e2e] proxy started {proxy_started}, app started {app_started}: {}",
        logs.trim()
    );
    Ok(())
}

/// e. A Job whose Pod gets the native sidecar completes: the sidecar is stopped once the
/// Job's container has exited.
fn job_with_native_sidecar(cluster: &Cluster) -> anyhow::Result<()> {
    apply_native_proxy(cluster)?;
    let ns = cluster.namespace("job", &[])?;
    let job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "report", "namespace": ns},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "labels": {"app": "report"},
                    "annotations": {"sidecar.dev/templates": "native-proxy"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "report",
                        "image": "stand-in.invalid/busybox:1.36",
                        "command": ["sh", "-c", "echo report done"],
                    }],
                },
            },
        },
    });
    let created = Instant::now();
    cluster.apply_yaml(&job.to_string())?;
    poll(Duration::from_secs(90), "the Job to complete", || {
        let job = cluster.get_json("job", Some(&ns), "report")?;
        let conditions = job["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c["type"] == "Failed" && c["status"] == "True")
        {
            bail!("the Job failed: {}", job["status"]);
        }
        Ok(conditions
            .iter()
            .any(|c| c["type"] == "Complete" && c["status"] == "True")
            .then_some(()))
    })?;
    let pods = cluster.list_json("pods", Some(&ns), Some("app=report"))?;
    let pod = pods.first().context("the Job's Pod is gone")?;
    ensure!(
        init_containers(pod) == ["proxy"],
        "the Job's Pod has no native sidecar: {:?}",
        init_containers(pod)
    );
    eprintln!(
        "[e2e] Job complete {:.1?} after it was created",
        created.elapsed()
    );
    Ok(())
}

/// f. examples/log-shipper (stand-in images): the app writes to the shared emptyDir and the
/// shipper prints what it wrote.
fn log_shipper(cluster: &Cluster) -> anyhow::Result<()> {
    apply_template(cluster, "log-shipper")?;
    let probe_ns = cluster.namespace("probe-logs", &[("sidecar.dev/example", "log-shipper")])?;
    wait_injected(cluster, &probe_ns, &["app=api"], "log-shipper")?;
    cluster.apply_yaml(&with_stand_ins(&read_example("log-shipper/workload.yaml")?))?;
    let pod = poll(Duration::from_secs(90), "the api Pod 2/2 Ready", || {
        Ok(cluster
            .list_json("pods", Some("logs-demo"), Some("app=api"))?
            .into_iter()
            .find(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| s.len() == 2 && s.iter().all(|c| c["ready"] == true))
            }))
    })?;
    let name = pod["metadata"]["name"]
        .as_str()
        .context("no name")?
        .to_owned();
    let first_line = poll(Duration::from_secs(30), "the app's first log line", || {
        let out = cluster.kubectl(&[
            "exec",
            "-n",
            "logs-demo",
            &name,
            "-c",
            "api",
            "--",
            "head",
            "-n",
            "1",
            "/var/log/app/api.log",
        ])?;
        let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Ok((out.status.success() && !line.is_empty()).then_some(line))
    })?;
    poll(Duration::from_secs(30), "the shipper to print it", || {
        let logs = cluster.kubectl_ok(&["logs", "-n", "logs-demo", &name, "-c", "log-shipper"])?;
        Ok(logs.lines().any(|l| l.trim() == first_line).then_some(()))
    })?;
    eprintln!("[e2e] the shipper printed the app's line {first_line:?}");
    Ok(())
}

/// g. The chart installed for real as a user installs a release: `just dist`'s packaged chart
/// and image archive (the image imported into the node's containerd, the chart's default tag,
/// its appVersion, naming it): 2 replicas Ready, the certificate and the configuration created
/// by the operator in the cluster (a Service, not a URL), and a Pod injected through it (the
/// API server calls the webhook through the Service), running 2/2. It stays installed for the
/// next scenarios.
fn chart_from_the_image(cluster: &Cluster) -> anyhow::Result<()> {
    let archive = dist_file(&format!("sidecar-injector-image-{VERSION}.tar"))?;
    let chart = dist_file(&format!("sidecar-injector-{VERSION}.tgz"))?;
    let started = Instant::now();
    cluster.import_image(&archive)?;
    helm(
        cluster,
        &[
            "install",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            "chart-system",
            "--create-namespace",
            // The name `just dist` gives the image; the tag is the chart's appVersion.
            "--set",
            "image.repository=sidecar-injector.invalid/sidecar-injector",
            "--set",
            "image.pullPolicy=Never",
            // The rollout scenarios restart workloads.
            "--set",
            "rollouts.enabled=true",
            // The node's operator ran first, on the CRD of crds/ applied with kubectl, which
            // helm would refuse to take over (no release owns it).
            "--set",
            "crds.install=false",
            "--wait",
            "--timeout=3m",
        ],
    )?;
    let deployment =
        cluster.get_json("deployment", Some("chart-system"), "chart-sidecar-injector")?;
    ensure!(
        deployment["status"]["readyReplicas"] == 2,
        "ready replicas: {}",
        deployment["status"]
    );
    eprintln!(
        "[e2e] chart installed, 2 replicas Ready, {:.1?} after the import",
        started.elapsed()
    );
    // Applied by c too; again here, so that g (or a later scenario) also runs alone: with no
    // template the configuration has no entry to wait for.
    cluster.apply_yaml(&with_stand_ins(&read_example(
        "nginx-sidecar/sidecartemplate.yaml",
    )?))?;
    let configuration = poll(
        Duration::from_secs(60),
        "the chart's webhook configuration",
        || {
            Ok(cluster
                .try_get_json(
                    "mutatingwebhookconfiguration",
                    None,
                    "chart-sidecar-injector",
                )?
                .filter(|c| c["webhooks"].as_array().is_some_and(|w| !w.is_empty())))
        },
    )?;
    let client = &configuration["webhooks"][0]["clientConfig"];
    ensure!(
        client["service"]["name"] == "chart-sidecar-injector"
            && client["url"].is_null()
            && client["caBundle"].as_str().is_some_and(|b| !b.is_empty()),
        "clientConfig: {client}"
    );
    cluster.get_json("secret", Some("chart-system"), "chart-sidecar-injector-tls")?;

    let ns = cluster.namespace("chart-web", &[("sidecar.dev/example", "nginx-sidecar")])?;
    // The only webhook configuration now is the chart's: an injection is a call through the
    // Service.
    wait_injected(cluster, &ns, &["app=web"], "nginx-sidecar")?;
    cluster.apply_yaml(&with_stand_ins(
        &read_example("nginx-sidecar/workload.yaml")?.replace("nginx-demo", &ns),
    ))?;
    let pod = poll(Duration::from_secs(90), "a web Pod 2/2 Ready", || {
        Ok(cluster
            .list_json("pods", Some(&ns), Some("app=web"))?
            .into_iter()
            .find(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| s.len() == 2 && s.iter().all(|c| c["ready"] == true))
            }))
    })?;
    ensure!(
        containers(&pod) == ["web", "nginx-sidecar"],
        "containers: {:?}",
        containers(&pod)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn read_example(path: &str) -> anyhow::Result<String> {
    let path = example(path);
    std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
}

/// Applies examples/NAME/sidecartemplate.yaml with its images replaced by the stand-ins, and
/// waits until it is served.
fn apply_template(cluster: &Cluster, name: &str) -> anyhow::Result<String> {
    let yaml = with_stand_ins(&read_example(&format!("{name}/sidecartemplate.yaml"))?);
    cluster.apply_yaml(&yaml)?;
    wait_served(cluster, name, CONFIGURATION)
}

/// examples/native-proxy's template with the stand-in envoy and a startupProbe (the kubelet
/// starts the next container once a native sidecar has started, not once it is ready).
fn apply_native_proxy(cluster: &Cluster) -> anyhow::Result<()> {
    let yaml = with_stand_ins(&read_example("native-proxy/sidecartemplate.yaml")?);
    let out = cluster.kubectl_with_stdin(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        &yaml,
    )?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut template: Value = serde_json::from_slice(&out.stdout)?;
    template["spec"]["initContainers"][0]["startupProbe"] = json!({"httpGet": {"path": "/ready", "port": 15000}, "periodSeconds": 1, "failureThreshold": 30});
    cluster.apply_yaml(&template.to_string())?;
    wait_served(cluster, "native-proxy", CONFIGURATION)?;
    // OnRequest: probe with Pods that ask for it (server-side dry runs) until one gets it.
    let ns = cluster.namespace("probe-native", &[])?;
    poll(
        Duration::from_secs(30),
        "native-proxy to be injected",
        || {
            let mut args =
                kubectl_run_args("probe", &ns, &[], &["sidecar.dev/templates=native-proxy"]);
            args.extend(["--dry-run=server", "-o", "json"].map(str::to_owned));
            let pod: Value = serde_json::from_str(&cluster.kubectl_ok(&args)?)?;
            Ok(init_containers(&pod)
                .iter()
                .any(|c| c == "proxy")
                .then_some(()))
        },
    )
}

/// Creates `pod` until it gets `container` (the API server picks a new webhook entry up
/// asynchronously), deleting a Pod created without it; returns the stored Pod.
fn wait_created_with(
    cluster: &Cluster,
    ns: &str,
    pod: &Value,
    container: &str,
) -> anyhow::Result<Value> {
    let name = pod["metadata"]["name"]
        .as_str()
        .context("no name")?
        .to_owned();
    poll(
        Duration::from_secs(30),
        &format!("{name} with {container}"),
        || {
            cluster.apply_yaml(&pod.to_string())?;
            let stored = cluster.get_json("pod", Some(ns), &name)?;
            if init_containers(&stored).iter().any(|c| c == container)
                || containers(&stored).iter().any(|c| c == container)
            {
                return Ok(Some(stored));
            }
            cluster.kubectl_ok(&[
                "delete",
                "pod",
                "-n",
                ns,
                &name,
                "--grace-period=0",
                "--force",
            ])?;
            Ok(None)
        },
    )
}

fn wait_phase(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> anyhow::Result<Value> {
    poll(timeout, &format!("{ns}/{name} {phase}"), || {
        let pod = cluster.get_json("pod", Some(ns), name)?;
        let now = pod["status"]["phase"].as_str().unwrap_or_default();
        if now == "Failed" && phase != "Failed" {
            let logs = cluster.kubectl(&["logs", "-n", ns, name])?;
            bail!(
                "{ns}/{name} failed: {}; log: {}",
                pod["status"],
                String::from_utf8_lossy(&logs.stdout)
            );
        }
        Ok((now == phase).then_some(pod))
    })
}

// ---------------------------------------------------------------------------------------------
// On the chart's operator: required templates while replicas go away
// ---------------------------------------------------------------------------------------------

/// The required template of h, i and j: a `guard` container (the stand-in busybox, asleep)
/// for every Pod of a namespace with the label.
const GUARD: &str = "e2e-guard";
const GUARD_LABEL: (&str, &str) = ("e2e.sidecar.dev/guard", "required");

/// The load of i and j: Pods created at this rate, each on its own task so that a creation the
/// API server holds (a webhook call to a replica that is gone) does not delay the next.
const LOAD_RATE: u32 = 12;
/// Bounds of one load, whatever happens: it stops by itself at either.
const LOAD_MAX_PODS: usize = 1800;
const LOAD_MAX_TIME: Duration = Duration::from_secs(150);

/// h. A required template on the node, no replica serving (the Deployment scaled to 0, the
/// Service without endpoints): a Pod it selects is refused; once the replicas are back it is
/// admitted with its sidecar and runs 2/2. No Pod of the namespace ever exists without it.
fn required_while_no_replica_serves(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    apply_guard(cluster)?;
    let ns = cluster.namespace("guarded", &[GUARD_LABEL])?;
    wait_injected(cluster, &ns, &[], GUARD)?;

    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": "stand-in.invalid/busybox:1.36",
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    });
    let create =
        || cluster.kubectl_with_stdin(&["create", "-f", "-", "-o", "json"], &pod.to_string());
    scale_operator(cluster, 0)?;
    // Back to 2 replicas whatever happens meanwhile, so that a failure here does not fail the
    // scenarios after this one too.
    let down = (|| -> anyhow::Result<u32> {
        wait_no_operator(cluster)?;
        let mut refused = 0;
        for _ in 0..3 {
            let out = create()?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            ensure!(
                !out.status.success(),
                "admitted while no replica serves: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            ensure!(
                stderr.contains("webhook"),
                "refused, but not by the webhook: {stderr}"
            );
            if refused == 0 {
                eprintln!("[e2e] no replica: {}", stderr.trim());
            }
            refused += 1;
        }
        ensure!(
            cluster.list_json("pods", Some(&ns), None)?.is_empty(),
            "a refused Pod exists"
        );
        Ok(refused)
    })();
    scale_operator(cluster, 2)?;
    let mut refused = down?;
    wait_operator_ready(cluster)?;
    // Until the API server's Service routing has the new endpoints, a creation may still be
    // refused; it is never admitted without the sidecar.
    let admitted = poll(Duration::from_secs(60), "app admitted", || {
        let out = create()?;
        if out.status.success() {
            return Ok(Some(serde_json::from_slice::<Value>(&out.stdout)?));
        }
        refused += 1;
        Ok(None)
    })?;
    ensure!(
        containers(&admitted) == ["app", GUARD],
        "admitted with containers {:?}",
        containers(&admitted)
    );
    poll(Duration::from_secs(60), "app Running 2/2 Ready", || {
        let pod = cluster.get_json("pod", Some(&ns), "app")?;
        let ready = pod["status"]["phase"] == "Running"
            && pod["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|s| s.len() == 2 && s.iter().all(|c| c["ready"] == true));
        Ok(ready.then_some(()))
    })?;
    // Nothing deletes a Pod of this namespace: every Pod it ever held is in this list.
    let pods = cluster.list_json("pods", Some(&ns), None)?;
    ensure!(pods.len() == 1, "{} Pods in {ns}", pods.len());
    ensure_guarded(&pods)?;
    eprintln!("[e2e] {refused} creations refused while no replica served, then admitted 2/2");
    let _ = cluster.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    Ok(())
}

/// i. One of the 2 operator Pods force-deleted (`--grace-period=0 --force`) while Pods a
/// required template selects are created at `LOAD_RATE`: none is admitted without the sidecar
/// (every created Pod checked); refused creations are counted and reported.
fn operator_pod_force_deleted_under_load(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    apply_guard(cluster)?;
    let ns = cluster.namespace("failover", &[GUARD_LABEL])?;
    wait_injected(cluster, &ns, &[], GUARD)?;
    let before = wait_operator_ready(cluster)?;
    let victim = before.first().context("no operator Pod")?.clone();

    let load = Load::start(cluster, &ns)?;
    // Some admissions with both replicas first, so that the load spans the whole failover.
    std::thread::sleep(Duration::from_secs(2));
    cluster.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        RELEASE_NAMESPACE,
        &victim,
        "--grace-period=0",
        "--force",
    ])?;
    let deleted = Instant::now();
    // The force-deleted Pod is gone from the API when kubectl returns: 2 Pods Ready and
    // served are the other one and the replacement.
    let outcome = wait_operator_ready(cluster).and_then(|pods| {
        ensure!(!pods.contains(&victim), "{victim} is still there: {pods:?}");
        Ok(())
    });
    eprintln!(
        "[e2e] replacement served {:.1?} after the force deletion",
        deleted.elapsed()
    );
    settle();
    let report = load.stop()?;
    outcome?;
    report.check(cluster, &ns, "the force deletion", Refusals::Reported)?;
    let _ = cluster.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    Ok(())
}

/// j. `helm upgrade` with a changed Pod annotation, which rolls the Deployment (one surge
/// replica, then the old ones stopped with SIGTERM, each draining before it stops accepting),
/// while Pods a required template selects are created at `LOAD_RATE`, through the Service,
/// until the old replicas are gone: every creation succeeds, and none is admitted without the
/// sidecar.
fn helm_upgrade_under_load(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    apply_guard(cluster)?;
    let ns = cluster.namespace("rollout", &[GUARD_LABEL])?;
    wait_injected(cluster, &ns, &[], GUARD)?;
    let before = wait_operator_ready(cluster)?;
    let selector = operator_selector(cluster)?;
    let chart = dist_file(&format!("sidecar-injector-{VERSION}.tgz"))?;

    let load = Load::start(cluster, &ns)?;
    std::thread::sleep(Duration::from_secs(2));
    let upgraded = Instant::now();
    let outcome = helm(
        cluster,
        &[
            "upgrade",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--reuse-values",
            "--set-string",
            "podAnnotations.e2e-rollout=j",
            "--wait",
            "--timeout=3m",
        ],
    )
    .and_then(|_| {
        // Rolled: the Deployment's new Pods only, all Ready and behind the Service.
        poll(Duration::from_secs(60), "the rollout to finish", || {
            let deployment =
                cluster.get_json("deployment", Some(RELEASE_NAMESPACE), CHART_OBJECTS)?;
            let status = &deployment["status"];
            let done = status["observedGeneration"] == deployment["metadata"]["generation"]
                && status["updatedReplicas"] == 2
                && status["replicas"] == 2;
            let pods = operator_pods_served(cluster, &selector)?.unwrap_or_default();
            Ok((done && pods.len() == 2 && pods.iter().all(|p| !before.contains(p))).then_some(()))
        })
    });
    eprintln!(
        "[e2e] helm upgrade rolled both replicas in {:.1?}",
        upgraded.elapsed()
    );
    settle();
    let report = load.stop()?;
    outcome?;
    report.check(cluster, &ns, "the rollout", Refusals::NoneAllowed)?;
    let _ = cluster.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    Ok(())
}

/// k. The installed chart's RBAC, as its ServiceAccount (`kubectl auth can-i`): what the
/// operator needs is allowed and nothing around it; and the replicas running (j's, after
/// their rollout and leader handover) were refused nothing (no "forbidden" in their logs).
fn rbac_of_the_installed_chart(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    INSTALLED_CHART.can_i_matrix(
        cluster,
        true,
        injector_core::policy::NAMESPACE_BINDING_SLOTS,
    )?;
    let selector = operator_selector(cluster)?;
    let logs = cluster.kubectl_ok(&[
        "logs",
        "-n",
        RELEASE_NAMESPACE,
        "-l",
        &selector,
        "--tail=-1",
        "--prefix",
    ])?;
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    ensure!(
        refused.is_empty(),
        "the operator was refused something:\n{}",
        refused.join("\n")
    );
    eprintln!(
        "[e2e] the replicas' logs: {} lines, nothing refused",
        logs.lines().count()
    );
    Ok(())
}

/// l. `helm uninstall`: helm deletes what it installed, the operator's Pods stop (after
/// their drain), and what the operator created (the configuration, the Secret and the Lease,
/// owned by the chart's ClusterRole) is garbage-collected; nothing comes back, and nothing of
/// the release is left anywhere but the CRD, which helm never deletes (README: Uninstalling).
fn helm_uninstall_leaves_nothing(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    // Garbage collection, not the test, must be what deletes those three.
    INSTALLED_CHART.check_owned(cluster)?;
    let selector = operator_selector(cluster)?;
    uninstall(cluster)?;
    let started = Instant::now();
    INSTALLED_CHART.wait_uninstalled(cluster)?;
    eprintln!(
        "[e2e] the release's objects and what the operator created gone {:.1?} after helm \
         uninstall returned",
        started.elapsed()
    );
    poll(
        Duration::from_secs(90),
        "the operator's Pods to stop",
        || {
            let pods = cluster.list_json("pods", Some(RELEASE_NAMESPACE), Some(&selector))?;
            Ok(pods.is_empty().then_some(()))
        },
    )?;
    eprintln!(
        "[e2e] the operator's Pods gone (drained) {:.1?} after helm uninstall returned",
        started.elapsed()
    );
    // Nothing comes back once the replicas have stopped either, and nothing else was left.
    std::thread::sleep(Duration::from_secs(3));
    let mut left = INSTALLED_CHART.leftovers(cluster)?;
    left.extend(left_in_the_namespace(cluster)?);
    left.extend(
        cluster
            .kubectl_ok(&[
                "get",
                "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,\
                 validatingwebhookconfigurations",
                "-l",
                &format!("app.kubernetes.io/instance={RELEASE}"),
                "-o",
                "name",
            ])?
            .lines()
            .map(str::to_owned),
    );
    ensure!(
        left.is_empty(),
        "left after helm uninstall: {}",
        left.join(", ")
    );
    cluster
        .get_json("crd", None, CRD)
        .context("the CRD is gone")?;
    Ok(())
}

/// What the release's namespace still holds, but for what Kubernetes puts in every namespace
/// (the `default` ServiceAccount, the `kube-root-ca.crt` ConfigMap) and Events.
fn left_in_the_namespace(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    const KINDS: &str = "pods,services,endpointslices,deployments,replicasets,secrets,\
                         configmaps,serviceaccounts,leases,networkpolicies,poddisruptionbudgets,\
                         roles,rolebindings";
    let names = cluster.kubectl_ok(&["get", KINDS, "-n", RELEASE_NAMESPACE, "-o", "name"])?;
    Ok(names
        .lines()
        .filter(|n| !matches!(*n, "serviceaccount/default" | "configmap/kube-root-ca.crt"))
        .map(|n| format!("{RELEASE_NAMESPACE}/{n}"))
        .collect())
}

/// The load goes on a little after the Deployment is back to 2 served replicas: kube-proxy's
/// rules and the kubelet's stopping of the old containers follow the API objects.
fn settle() {
    std::thread::sleep(Duration::from_secs(3));
}

/// The workspace's version: `just dist` names its artifacts after it.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The artifact NAME of `just dist`, in dist/ of cargo's target directory (or in
/// `SIDECAR_INJECTOR_DIST`), which must exist.
fn dist_file(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::var_os("SIDECAR_INJECTOR_DIST").map_or_else(
        // Cargo's temporary directory for tests is `tmp` in its target directory.
        || {
            Path::new(env!("CARGO_TARGET_TMPDIR"))
                .parent()
                .map_or_else(|| workspace_root().join("target"), Path::to_path_buf)
                .join("dist")
        },
        PathBuf::from,
    );
    let path = dir.join(name);
    ensure!(
        path.exists(),
        "{} does not exist: run `just dist` first (just e2e does)",
        path.display()
    );
    Ok(path)
}

/// Runs helm with its homes in the cluster's directory against the cluster.
fn helm(cluster: &Cluster, args: &[&str]) -> anyhow::Result<String> {
    let home = cluster.dir().join("helm");
    let out = std::process::Command::new(injector_e2e::tool("helm")?)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs the chart (scenario g) unless it already is, for a scenario run alone.
fn ensure_chart(cluster: &Cluster) -> anyhow::Result<()> {
    if !is_installed(cluster) {
        chart_from_the_image(cluster)?;
    }
    Ok(())
}

fn is_installed(cluster: &Cluster) -> bool {
    helm(
        cluster,
        &["status", RELEASE, "--namespace", RELEASE_NAMESPACE],
    )
    .is_ok()
}

fn uninstall(cluster: &Cluster) -> anyhow::Result<String> {
    helm(
        cluster,
        &[
            "uninstall",
            RELEASE,
            "--namespace",
            RELEASE_NAMESPACE,
            "--wait",
        ],
    )
}

fn apply_guard(cluster: &Cluster) -> anyhow::Result<()> {
    let template = json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": GUARD},
        "spec": {
            "namespaceSelector": {"matchLabels": {GUARD_LABEL.0: GUARD_LABEL.1}},
            "failurePolicy": "Fail",
            "containers": [{
                "name": GUARD,
                "image": "stand-in.invalid/busybox:1.36",
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    });
    cluster.apply_yaml(&template.to_string())?;
    wait_served(cluster, GUARD, CHART_OBJECTS).map(drop)
}

fn scale_operator(cluster: &Cluster, replicas: u32) -> anyhow::Result<()> {
    cluster.kubectl_ok(&[
        "scale",
        &format!("deployment/{CHART_OBJECTS}"),
        "-n",
        RELEASE_NAMESPACE,
        &format!("--replicas={replicas}"),
    ])?;
    Ok(())
}

/// Waits until no operator Pod runs and the Service has no endpoint.
fn wait_no_operator(cluster: &Cluster) -> anyhow::Result<()> {
    let selector = operator_selector(cluster)?;
    poll(
        Duration::from_secs(60),
        "no operator Pod and no endpoint",
        || {
            let pods = cluster.list_json("pods", Some(RELEASE_NAMESPACE), Some(&selector))?;
            Ok((pods.is_empty() && service_endpoints(cluster)?.is_empty()).then_some(()))
        },
    )
}

/// The label selector of the operator's Pods, from the Deployment.
fn operator_selector(cluster: &Cluster) -> anyhow::Result<String> {
    let deployment = cluster.get_json("deployment", Some(RELEASE_NAMESPACE), CHART_OBJECTS)?;
    let labels = deployment["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("the Deployment has no matchLabels")?;
    Ok(labels
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(","))
}

/// The ready addresses behind the chart's Service, sorted.
fn service_endpoints(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let slices = cluster.list_json(
        "endpointslices",
        Some(RELEASE_NAMESPACE),
        Some(&format!("kubernetes.io/service-name={CHART_OBJECTS}")),
    )?;
    let mut addresses: Vec<String> = slices
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] == true)
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    addresses.sort();
    Ok(addresses)
}

/// Waits until exactly 2 operator Pods run, both Ready and both (only they) behind the
/// Service; returns their names.
fn wait_operator_ready(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let selector = operator_selector(cluster)?;
    poll(
        Duration::from_secs(90),
        "2 operator Pods Ready and served",
        || operator_pods_served(cluster, &selector),
    )
}

/// The names of the operator's Pods if there are exactly 2, both Ready and both (only they)
/// behind the Service.
fn operator_pods_served(cluster: &Cluster, selector: &str) -> anyhow::Result<Option<Vec<String>>> {
    let pods = cluster.list_json("pods", Some(RELEASE_NAMESPACE), Some(selector))?;
    let ready = pods.len() == 2
        && pods.iter().all(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| s.iter().all(|c| c["ready"] == true))
        });
    if !ready {
        return Ok(None);
    }
    let mut ips: Vec<String> = pods
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_owned))
        .collect();
    ips.sort();
    if service_endpoints(cluster)? != ips {
        return Ok(None);
    }
    Ok(Some(
        pods.iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect(),
    ))
}

/// Fails naming every Pod without the guard container.
fn ensure_guarded(pods: &[Value]) -> anyhow::Result<()> {
    let unguarded: Vec<String> = pods
        .iter()
        .filter(|p| !containers(p).iter().any(|c| c == GUARD))
        .map(|p| format!("{} {:?}", p["metadata"]["name"], containers(p)))
        .collect();
    ensure!(
        unguarded.is_empty(),
        "{} Pod(s) admitted without their required sidecar: {}",
        unguarded.len(),
        unguarded.join(", ")
    );
    Ok(())
}

/// Pods a required template selects, created from a thread at `LOAD_RATE` until `stop` or a
/// bound. They are never scheduled (a scheduling gate): what is checked is admission, and the
/// node stays idle for the operator's own Pods.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<LoadReport>>>,
}

/// A scenario that fails before `stop` stops the load too, rather than leave it to its bounds.
impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct LoadReport {
    attempted: usize,
    elapsed: Duration,
    by_limit: bool,
    admitted: Vec<Value>,
    refused: Vec<String>,
}

impl Load {
    fn start(cluster: &Cluster, ns: &str) -> anyhow::Result<Self> {
        let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, ns) = (stop.clone(), ns.to_owned());
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(create_pods(kubeconfig, ns, flag))
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops creating, waits for the creations under way, and returns what happened.
    fn stop(mut self) -> anyhow::Result<LoadReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .context("the load was stopped already")?
            .join()
            .map_err(|_| anyhow!("the load thread panicked"))?
    }
}

async fn create_pods(
    kubeconfig: kube::config::Kubeconfig,
    ns: String,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<LoadReport> {
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config)?, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "load-"},
        "spec": {
            "schedulingGates": [{"name": "e2e.sidecar.dev/never"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app",
                "image": "stand-in.invalid/busybox:1.36",
                "imagePullPolicy": "Never",
            }],
        },
    }))?;
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / LOAD_RATE);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut by_limit = false;
    loop {
        ticker.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if tasks.len() >= LOAD_MAX_PODS || started.elapsed() >= LOAD_MAX_TIME {
            by_limit = true;
            break;
        }
        let (pods, pod) = (pods.clone(), pod.clone());
        tasks.push(tokio::spawn(async move {
            pods.create(&PostParams::default(), &pod).await
        }));
    }
    let elapsed = started.elapsed();
    let mut report = LoadReport {
        attempted: tasks.len(),
        elapsed,
        by_limit,
        admitted: Vec::new(),
        refused: Vec::new(),
    };
    for task in tasks {
        match task.await? {
            Ok(pod) => report.admitted.push(serde_json::to_value(pod)?),
            // The API server's message alone: the whole Status repeats it three times.
            Err(kube::Error::Api(status)) => report.refused.push(status.message),
            Err(e) => report.refused.push(e.to_string()),
        }
    }
    Ok(report)
}

impl LoadReport {
    /// Prints the figures and checks every Pod: each one the API server answered with, and
    /// each one the namespace holds (a creation the client saw fail may still have been
    /// stored); none may lack the sidecar. The load must have lasted the whole of `what`, and
    /// refused or failed creations are only reported, or fail the check, as `refusals` says.
    fn check(
        &self,
        cluster: &Cluster,
        ns: &str,
        what: &str,
        refusals: Refusals,
    ) -> anyhow::Result<()> {
        let stored = cluster.list_json("pods", Some(ns), None)?;
        eprintln!(
            "[e2e] load during {what}: {} creations in {:.1?} ({:.1}/s), {} admitted, {} refused \
             or failed, {} Pods stored",
            self.attempted,
            self.elapsed,
            self.attempted as f64 / self.elapsed.as_secs_f64(),
            self.admitted.len(),
            self.refused.len(),
            stored.len(),
        );
        let mut reasons: Vec<(String, usize)> = Vec::new();
        for message in &self.refused {
            match reasons.iter_mut().find(|(m, _)| m == message) {
                Some((_, n)) => *n += 1,
                None => reasons.push((message.clone(), 1)),
            }
        }
        for (message, n) in &reasons {
            eprintln!("[e2e]   {n} x {message}");
        }
        ensure!(
            !self.by_limit,
            "the load reached its bound ({LOAD_MAX_PODS} Pods or {LOAD_MAX_TIME:?}) before the \
             end of {what}"
        );
        ensure_guarded(&self.admitted)?;
        ensure_guarded(&stored)?;
        ensure!(
            refusals == Refusals::Reported || self.refused.is_empty(),
            "{} of {} creations refused or failed during {what}",
            self.refused.len(),
            self.attempted
        );
        Ok(())
    }
}

/// What a load's refused or failed creations mean.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refusals {
    /// Counted and reported (the goal is zero, but a replica killed without a drain may
    /// leave the API server calling it for a moment).
    Reported,
    /// A failure: the replicas drain.
    NoneAllowed,
}
