//! Scenarios that need Pods to run: the local control plane with a real node (containerd,
//! kubelet, kube-scheduler, kube-proxy; `injector_e2e::Cluster`), the operator out of cluster,
//! and the examples with their images replaced by local stand-ins.
//!
//! One node per machine, so one test starts it and runs every scenario in turn (each in its own
//! namespaces), reports which failed, and stops it all at the end, also when a scenario panics.
//! Needs root and the host packages (`just node-packages`). Off unless `SIDECAR_INJECTOR_E2E=1`;
//! `SIDECAR_INJECTOR_E2E_SCENARIOS=words` runs only the scenarios whose names contain one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use injector_e2e::host::{BRIDGE_ADDRESS, check_fence};
use injector_e2e::images::with_stand_ins;
use injector_e2e::pod::{containers, init_containers};
use injector_e2e::steps::{
    CONFIGURATION, example, kubectl_run_args, wait_crd_established, wait_injected, wait_served,
};
use injector_e2e::{Cluster, Operator, OperatorOptions, http_get_at, poll, workspace_root};
use serde_json::{Value, json};

type Scenario = fn(&Cluster) -> anyhow::Result<()>;

/// The last scenario: it replaces the operator out of cluster with the chart's.
const CHART: &str = "g-chart-installed-from-the-image";

const SCENARIOS: [(&str, Scenario); 7] = [
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
];

#[test]
fn node() {
    if !injector_e2e::enabled() {
        eprintln!(
            "[e2e] skipped: set {}=1 (or run `just e2e`) to start a local node and run the \
             scenarios that need running Pods",
            injector_e2e::ENABLE_VAR
        );
        return;
    }
    let started = Instant::now();
    let filter: Option<Vec<String>> = std::env::var("SIDECAR_INJECTOR_E2E_SCENARIOS")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());

    let cluster = Cluster::start().expect("the node starts");
    let up = started.elapsed();
    cluster
        .apply_file(&workspace_root().join("crds"))
        .expect("kubectl apply -f crds/");
    wait_crd_established(&cluster).expect("the CRD is established");
    let mut operator =
        Operator::start(&cluster, OperatorOptions::default()).expect("the operator starts");

    let mut results = Vec::new();
    for (name, scenario) in SCENARIOS {
        if let Some(words) = &filter
            && !words.iter().any(|w| name.contains(w.as_str()))
        {
            continue;
        }
        if name == CHART {
            // The chart's operator replaces the one out of cluster (and its configuration,
            // which would point the API server at a stopped process).
            let _ = operator.stop();
            cluster
                .kubectl_ok(&["delete", "mutatingwebhookconfiguration", CONFIGURATION])
                .expect("the out-of-cluster operator's configuration is deleted");
        }
        eprintln!("\n[e2e] ===== {name}");
        let t = Instant::now();
        let outcome = match catch_unwind(AssertUnwindSafe(|| scenario(&cluster))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{e:#}")),
            Err(panic) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".to_owned())),
        };
        let elapsed = t.elapsed();
        match &outcome {
            Ok(()) => eprintln!("[e2e] PASS {name} ({elapsed:.1?})"),
            Err(e) => eprintln!("[e2e] FAIL {name} ({elapsed:.1?}): {e}"),
        }
        results.push((name, elapsed, outcome));
    }
    // kube-proxy resyncs all along: the fence must still be first at the end.
    let fence_at_end = check_fence();

    eprintln!(
        "\n[e2e] ===== summary ({:.1?} in all; cluster with its node up in {up:.1?})",
        started.elapsed()
    );
    for (name, elapsed, outcome) in &results {
        let verdict = if outcome.is_ok() { "PASS" } else { "FAIL" };
        eprintln!("[e2e] {verdict} {name} ({elapsed:.1?})");
    }
    let mut failed: Vec<_> = results
        .iter()
        .filter(|(_, _, outcome)| outcome.is_err())
        .map(|(name, _, _)| (*name).to_owned())
        .collect();
    if let Err(e) = fence_at_end {
        eprintln!("[e2e] FAIL the fence at the end: {e:#}");
        failed.push("the fence at the end".to_owned());
    }
    if !failed.is_empty() {
        eprintln!("{}", cluster.log_tails(30));
        eprintln!("{}", operator.log_tail(30));
    }
    drop(operator);
    drop(cluster);
    assert!(
        failed.is_empty(),
        "{} scenario(s) failed: {}",
        failed.len(),
        failed.join(", ")
    );
    assert!(!results.is_empty(), "no scenario matched the filter");
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

/// g. The chart installed for real from `just image`'s image: 2 replicas Ready, the
/// certificate and the configuration created by the operator in the cluster (a Service, not a
/// URL), and a Pod injected through it (the API server calls the webhook through the
/// Service), running 2/2; then `helm uninstall`.
fn chart_from_the_image(cluster: &Cluster) -> anyhow::Result<()> {
    let archive = std::env::var_os("SIDECAR_INJECTOR_IMAGE").map_or_else(
        || workspace_root().join("target/sidecar-injector-image.tar"),
        std::path::PathBuf::from,
    );
    ensure!(
        archive.exists(),
        "{} does not exist: run `just image` first (just e2e does)",
        archive.display()
    );
    let started = Instant::now();
    cluster.import_image(&archive)?;
    let helm = injector_e2e::tool("helm")?;
    let home = cluster.dir().join("helm");
    let run_helm = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new(&helm)
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
    };
    let chart = workspace_root().join("charts/sidecar-injector");
    run_helm(&[
        "install",
        "chart",
        &chart.display().to_string(),
        "--namespace",
        "chart-system",
        "--create-namespace",
        "--set",
        "image.repository=sidecar-injector.invalid/sidecar-injector",
        "--set",
        "image.tag=dev",
        "--set",
        "image.pullPolicy=Never",
        "--wait",
        "--timeout=3m",
    ])?;
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
    run_helm(&[
        "uninstall",
        "chart",
        "--namespace",
        "chart-system",
        "--wait",
    ])?;
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
