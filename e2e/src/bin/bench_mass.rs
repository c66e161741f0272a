//! `just bench-mass`: mass creation. A Deployment scaled from 0 to [`REPLICAS`] replicas (its
//! Pods never run: there is no node) on a fresh local control plane whose controller manager
//! has its client limits raised, so that admission, not the ReplicaSet controller, is the
//! bottleneck; with no injection, then under the `webhook`, `auto` and `policy` backends with 3 and
//! with 50 templates selecting every Pod (the even ones required):
//!
//! * the time from the scale to every Pod stored;
//! * the Pod CREATE requests' p50 and p99 (`apiserver_request_duration_seconds`) and the
//!   mutating admission step's p99 (`apiserver_admission_step_admission_duration_seconds`, of
//!   every CREATE: it has no resource label) from the API server's own histograms, interpolated
//!   within their buckets as `histogram_quantile` does, and the webhook calls it counted;
//! * what must be zero: Pod creations the ReplicaSet controller reported failed (`FailedCreate`
//!   Events), admission rejections (those of dry-run CREATEs, the operator's own probes, counted
//!   apart), and stored Pods missing a template that selects them.
//!
//! Then with 3 templates under each backend again, the **leader killed half-way**: two replicas
//! behind one address ([`injector_e2e::LocalService`], as a Service in a cluster), and the
//! leader SIGKILLed at [`KILL_AT`] Pods stored, inside a batch of creations; the standby takes
//! over when the lease expires. The counts that must be zero stay the same.
//!
//! Prints a Markdown report and writes it to `target/bench-mass.md`. The `policy` backend needs
//! an API server that serves MutatingAdmissionPolicies (`SIDECAR_INJECTOR_KUBE_VERSION=v1.37.2`,
//! the recipe's default). `SIDECAR_INJECTOR_BENCH_BACKENDS=none,webhook,policy/kill` measures
//! only those (`/kill`: the runs with the leader killed).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use injector_e2e::bench::{Histogram, client_for, counter, webhook_calls};
use injector_e2e::steps::{install_crd, wait_policy_alone};
use injector_e2e::{
    Backend, ControlPlane, ControlPlaneOptions, LocalService, Operator, OperatorOptions, poll_every,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// The Deployment's replicas once scaled.
const REPLICAS: usize = 1000;
/// How many templates select every Pod, per run with injection.
const TEMPLATE_COUNTS: [usize; 2] = [3, 50];
/// How many templates select every Pod in the runs with the leader killed.
const KILL_TEMPLATES: usize = 3;
/// Pods stored when the leader is killed: inside the ReplicaSet controller's second sync
/// (its first creates 500, its burst, and the count reaches 500 only once that sync is done;
/// the second creates in doubling batches, the largest 256 from 755 on), so that calls are in
/// flight.
const KILL_AT: usize = 800;
/// How long every Pod gets to be stored after the scale.
const CREATE_TIMEOUT: Duration = Duration::from_secs(600);
/// The controller manager's client limits: high enough that its own rate limiter never waits.
const CONTROLLER_MANAGER_LIMITS: [&str; 3] = [
    "--kube-api-qps=5000",
    "--kube-api-burst=10000",
    "--concurrent-replicaset-syncs=10",
];

/// One run's figures.
struct Row {
    backend: &'static str,
    templates: usize,
    stored_in: Duration,
    requests: Histogram,
    admission: Histogram,
    webhook_calls: f64,
    failed_creations: u64,
    first_failure: Option<String>,
    rejections: f64,
    /// Pod CREATEs answered with an error, real ones and dry runs apart.
    refused: Refused,
    missing: usize,
    /// With the leader killed half-way: what happened.
    killed: Option<Killed>,
}

/// Pod CREATEs the API server answered with an error (`apiserver_request_total`).
#[derive(Clone, Copy, Default)]
struct Refused {
    pods: f64,
    dry_runs: f64,
}

/// The leader killed half-way.
struct Killed {
    /// Pods stored when it was killed.
    at_pods: usize,
    /// From the kill to the standby leading.
    takeover: Option<Duration>,
    /// Connections the local Service found no replica for.
    unrouted: usize,
    /// Connections the killed replica ended while the API server kept them open.
    cut: usize,
}

/// The kill of a run, watched from its poll of the stored Pods.
#[derive(Default)]
struct KillWatch {
    /// Pods stored at the kill, when, and which replica led.
    killed: Option<(usize, Instant, usize)>,
    /// From the kill to the standby leading, once seen.
    took_over: Option<Duration>,
}

impl KillWatch {
    /// Kills the leader once `stored` reaches [`KILL_AT`]; then notes when the standby leads.
    fn step(&mut self, replicas: &mut Replicas, stored: usize) -> anyhow::Result<()> {
        match self.killed {
            None if stored >= KILL_AT => {
                let leader = replicas.kill_leader()?;
                eprintln!("[bench] the leader killed at {stored} Pods stored");
                self.killed = Some((stored, Instant::now(), leader));
            }
            Some((_, at, leader))
                if self.took_over.is_none() && replicas.operators[1 - leader].leads() =>
            {
                self.took_over = Some(at.elapsed());
            }
            _ => {}
        }
        Ok(())
    }
}

/// The two replicas of a run with the leader killed, and the address in front of them.
struct Replicas {
    operators: [Operator; 2],
    service: LocalService,
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let only = std::env::var("SIDECAR_INJECTOR_BENCH_BACKENDS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|b| b.trim() == name))
    };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let backends = [Backend::Webhook, Backend::Auto, Backend::Policy];
    let runs = [(None, 0, false)]
        .into_iter()
        .chain(
            backends
                .into_iter()
                .flat_map(|b| TEMPLATE_COUNTS.map(|n| (Some(b), n, false))),
        )
        .chain(backends.map(|b| (Some(b), KILL_TEMPLATES, true)));
    for (backend, templates, kill) in runs {
        let backend_name = backend.map_or("none", Backend::arg);
        let name = if kill {
            format!("{backend_name}/kill")
        } else {
            backend_name.to_owned()
        };
        if !wanted(&name) {
            continue;
        }
        eprintln!("[bench] {name}, {templates} templates: scaling to {REPLICAS}");
        match run(&runtime, backend, templates, kill) {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("[bench] {name}, {templates} templates: {e:#}");
                failures.push(format!("{name}, {templates} templates: {e:#}"));
            }
        }
    }
    let report = report(&rows, &failures)?;
    println!("{report}");
    let path = injector_e2e::workspace_root().join("target/bench-mass.md");
    std::fs::write(&path, &report)?;
    eprintln!("[bench] report written to {}", path.display());
    Ok(())
}

/// One run on a fresh control plane.
fn run(
    runtime: &tokio::runtime::Runtime,
    backend: Option<Backend>,
    templates: usize,
    kill: bool,
) -> anyhow::Result<Row> {
    let cp = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager_args: CONTROLLER_MANAGER_LIMITS.map(str::to_owned).to_vec(),
        ..ControlPlaneOptions::default()
    })?;
    if matches!(backend, Some(Backend::Policy | Backend::Auto))
        && !cp.serves_mutating_admission_policies()?
    {
        bail!("this API server serves no MutatingAdmissionPolicy (1.36+)");
    }
    install_crd(&cp)?;
    let (_operator, mut replicas) = match (backend, kill) {
        (Some(backend), false) => (Some(Operator::start(&cp, operator_options(backend))?), None),
        (Some(backend), true) => (None, Some(two_replicas(&cp, backend)?)),
        (None, _) => (None, None),
    };
    let namespace = cp.namespace("mass", &[("bench", "mass")])?;
    for index in 0..templates {
        cp.apply_yaml(&template(index).to_string())?;
    }
    let containers: Vec<String> = (0..templates).map(container_name).collect();
    wait_injected(&cp, &namespace, &containers)?;
    if backend == Some(Backend::Auto) {
        wait_policy_alone(&cp, || wait_injected(&cp, &namespace, &containers))?;
    }
    cp.apply_yaml(&deployment(&namespace).to_string())?;

    let client = runtime.block_on(client_for(&cp))?;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let before = cp.kubectl_ok(&["get", "--raw", "/metrics"])?;
    let started = Instant::now();
    cp.kubectl_ok(&[
        "scale",
        "deployment/web",
        "-n",
        &namespace,
        &format!("--replicas={REPLICAS}"),
    ])?;
    let mut kill = KillWatch::default();
    poll_every(
        CREATE_TIMEOUT,
        Duration::from_millis(100),
        &format!("{REPLICAS} Pods stored"),
        || {
            let stored = runtime
                .block_on(pods.list_metadata(&ListParams::default()))?
                .items
                .len();
            if let Some(replicas) = replicas.as_mut() {
                kill.step(replicas, stored)?;
            }
            Ok((stored >= REPLICAS).then_some(()))
        },
    )?;
    let stored_in = started.elapsed();
    let after = cp.kubectl_ok(&["get", "--raw", "/metrics"])?;
    let killed = match (kill.killed, &replicas) {
        (Some((at_pods, at, leader)), Some(replicas)) => Some(Killed {
            at_pods,
            takeover: kill.took_over.or_else(|| replicas.takeover(1 - leader, at)),
            unrouted: replicas.service.unrouted(),
            cut: replicas.service.cut(),
        }),
        _ => None,
    };

    let (failed_creations, first_failure) = failed_creations(&cp, &namespace)?;
    let stored = runtime.block_on(pods.list(&ListParams::default()))?;
    let missing = stored
        .items
        .iter()
        .filter(|pod| {
            let names: Vec<&str> = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .map(|c| c.name.as_str())
                .collect();
            containers.iter().any(|c| !names.contains(&c.as_str()))
        })
        .count();
    Ok(Row {
        backend: backend.map_or("none", Backend::arg),
        templates,
        stored_in,
        requests: requests(&after).minus(&requests(&before)),
        admission: admission(&after).minus(&admission(&before)),
        webhook_calls: webhook_calls(&after) - webhook_calls(&before),
        failed_creations,
        first_failure,
        rejections: rejections(&after) - rejections(&before),
        refused: refused(&after).minus(refused(&before)),
        missing,
        killed,
    })
}

fn operator_options(backend: Backend) -> OperatorOptions {
    OperatorOptions {
        extra_args: backend.args(),
        ..OperatorOptions::default()
    }
}

/// Two replicas behind one local Service, one of them leading.
fn two_replicas(cp: &ControlPlane, backend: Backend) -> anyhow::Result<Replicas> {
    let service = LocalService::start()?;
    let options = OperatorOptions {
        service_url: Some(service.url()),
        ..operator_options(backend)
    };
    let first = Operator::start(cp, options.clone())?;
    let second = Operator::start(cp, options)?;
    service.route_to(&[first.listen_port(), second.listen_port()]);
    let replicas = Replicas {
        operators: [first, second],
        service,
    };
    poll_every(
        Duration::from_secs(30),
        Duration::from_millis(200),
        "a replica to lead",
        || Ok(replicas.leader()),
    )?;
    Ok(replicas)
}

impl Replicas {
    /// Which replica leads, if one says so.
    fn leader(&self) -> Option<usize> {
        self.operators.iter().position(Operator::leads)
    }

    /// SIGKILLs the leader; returns which it was.
    fn kill_leader(&mut self) -> anyhow::Result<usize> {
        let leader = self.leader().context("no replica leads")?;
        self.operators[leader].kill();
        Ok(leader)
    }

    /// How long after `killed_at` the replica `standby` led (`None`: not within a minute).
    fn takeover(&self, standby: usize, killed_at: Instant) -> Option<Duration> {
        poll_every(
            Duration::from_secs(60),
            Duration::from_millis(200),
            "the standby to lead",
            || Ok(self.operators[standby].leads().then(|| killed_at.elapsed())),
        )
        .ok()
    }
}

/// Pod CREATEs answered with an error, from `apiserver_request_total`.
fn refused(metrics: &str) -> Refused {
    let refused_pod_creates = |dry_run: bool| {
        counter(metrics, "apiserver_request_total", |l| {
            l.get("verb").is_some_and(|v| v == "POST")
                && l.get("resource").is_some_and(|v| v == "pods")
                && l.get("subresource").is_none_or(String::is_empty)
                && l.get("code").is_some_and(|code| !code.starts_with('2'))
                && l.get("dry_run").is_some_and(|d| !d.is_empty()) == dry_run
        })
    };
    Refused {
        pods: refused_pod_creates(false),
        dry_runs: refused_pod_creates(true),
    }
}

impl Refused {
    fn minus(self, earlier: Refused) -> Refused {
        Refused {
            pods: self.pods - earlier.pods,
            dry_runs: self.dry_runs - earlier.dry_runs,
        }
    }
}

/// Pod CREATE requests, as the API server timed them (admission and storage).
fn requests(metrics: &str) -> Histogram {
    Histogram::parse(metrics, "apiserver_request_duration_seconds", |l| {
        l.get("verb").is_some_and(|v| v == "POST")
            && l.get("resource").is_some_and(|v| v == "pods")
            && l.get("subresource").is_none_or(String::is_empty)
    })
}

/// The mutating admission step of every CREATE, every plugin together (the webhook's calls
/// and the policy's evaluation included): the histogram has no resource label, so the Events
/// and ReplicaSets created meanwhile count too (most are the Pods').
fn admission(metrics: &str) -> Histogram {
    Histogram::parse(
        metrics,
        "apiserver_admission_step_admission_duration_seconds",
        |l| {
            l.get("type").is_some_and(|v| v == "admit")
                && l.get("operation").is_some_and(|v| v == "CREATE")
                && l.get("rejected").is_some_and(|v| v == "false")
        },
    )
}

/// CREATEs refused in admission, by any plugin (a timeout of a required webhook too).
fn rejections(metrics: &str) -> f64 {
    Histogram::parse(
        metrics,
        "apiserver_admission_step_admission_duration_seconds",
        |l| {
            l.get("operation").is_some_and(|v| v == "CREATE")
                && l.get("rejected").is_some_and(|v| v == "true")
        },
    )
    .count
}

/// The Pod creations the ReplicaSet controller reported failed, counting each Event's series,
/// and the first one's message.
fn failed_creations(cp: &ControlPlane, namespace: &str) -> anyhow::Result<(u64, Option<String>)> {
    let events: Value = serde_json::from_str(&cp.kubectl_ok(&[
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        "reason=FailedCreate",
        "-o",
        "json",
    ])?)?;
    let events = events["items"].as_array().cloned().unwrap_or_default();
    let count = events
        .iter()
        .map(|e| e["count"].as_u64().unwrap_or(1))
        .sum();
    let first = events
        .first()
        .and_then(|e| e["message"].as_str())
        .map(str::to_owned);
    Ok((count, first))
}

/// Waits until a server-side dry-run Pod in `namespace` carries every one of `containers`: the
/// templates are served (by the webhook entries, or the proven policy).
fn wait_injected(cp: &ControlPlane, namespace: &str, containers: &[String]) -> anyhow::Result<()> {
    let probe = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "app.invalid/app:1"}]}});
    poll_every(
        Duration::from_secs(300),
        Duration::from_millis(500),
        "every template injected",
        || {
            let Ok(Ok(stored)) = injector_e2e::pod::dry_run_create(cp, namespace, &probe) else {
                return Ok(None);
            };
            let names = injector_e2e::pod::containers(&stored);
            Ok(containers.iter().all(|c| names.contains(c)).then_some(()))
        },
    )
    .context("the templates are not served")
}

fn container_name(index: usize) -> String {
    format!("agent-{index}")
}

/// Template `index`: one container with placeholders, two env vars, a port and resources,
/// selecting every Pod of the namespace; the even ones required.
fn template(index: usize) -> Value {
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": format!("mass-{index}")},
        "spec": {
            "priority": index,
            "failurePolicy": if index.is_multiple_of(2) { "Fail" } else { "Ignore" },
            "namespaceSelector": {"matchLabels": {"bench": "mass"}},
            "containers": [{
                "name": container_name(index),
                "image": format!("registry.invalid/agents/agent-{index}:1.0"),
                "args": ["--pod", "{{ pod.name }}", "--namespace", "{{ pod.namespace }}"],
                "env": [{"name": "INDEX", "value": index.to_string()}, {"name": "MODE", "value": "mass"}],
                "ports": [{"containerPort": 9100 + index, "name": format!("m-{index}")}],
                "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}},
            }],
        },
    })
}

/// The Deployment, at zero replicas until the benchmark scales it.
fn deployment(namespace: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "app.invalid/app:1"}]},
            },
        },
    })
}

fn report(rows: &[Row], failures: &[String]) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "## Mass creation (`just bench-mass`)\n\n\
         A Deployment scaled from 0 to {REPLICAS} replicas (no node: the Pods are only stored) on \
         a fresh control plane per row, its controller manager started with {}; the templates \
         each add one container and select every Pod (the even ones required). From the API \
         server's histograms, quantiles interpolated within their buckets as \
         `histogram_quantile` does: Pod CREATE requests (buckets 5, 25, 50, 100, 200 ms, …), and \
         the mutating admission step of every CREATE (5, 25, 100 ms, …; Events and ReplicaSets \
         included, it has no resource label).\n",
        CONTROLLER_MANAGER_LIMITS.join(" ")
    )?;
    writeln!(
        out,
        "| backend | templates | every Pod stored in | Pods/s | Pod CREATE p50 / p99 | mutating admission p99 | webhook calls | failed creations | rejections | Pod CREATEs refused (dry runs) | Pods missing a template |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for row in rows {
        let backend = if row.killed.is_some() {
            format!("{}, leader killed", row.backend)
        } else {
            row.backend.to_owned()
        };
        writeln!(
            out,
            "| {} | {} | {:.2} s | {:.0} | {:.1} / {:.1} ms | {:.1} ms | {:.0} | {} | {:.0} | {:.0} ({:.0}) | {} |",
            backend,
            row.templates,
            row.stored_in.as_secs_f64(),
            REPLICAS as f64 / row.stored_in.as_secs_f64(),
            row.requests.quantile(0.5) * 1e3,
            row.requests.quantile(0.99) * 1e3,
            row.admission.quantile(0.99) * 1e3,
            row.webhook_calls,
            row.failed_creations,
            row.rejections,
            row.refused.pods,
            row.refused.dry_runs,
            row.missing,
        )?;
    }
    for row in rows {
        if let Some(killed) = &row.killed {
            let takeover = killed.takeover.map_or_else(
                || "no takeover within a minute".to_owned(),
                |t| format!("the standby led {:.1} s later", t.as_secs_f64()),
            );
            writeln!(
                out,
                "\n{}, leader killed: at {} Pods stored; {takeover}; {} connections found no replica; {} connections cut by the kill.",
                row.backend, killed.at_pods, killed.unrouted, killed.cut
            )?;
        }
    }
    for row in rows {
        if let Some(message) = &row.first_failure {
            writeln!(
                out,
                "\n{} with {} templates, the first failed creation: {message}",
                row.backend, row.templates
            )?;
        }
    }
    for failure in failures {
        writeln!(out, "\n**Failed**: {failure}")?;
    }
    Ok(out)
}
