//! `just bench-e2e`: the end-to-end figures of BENCHMARKS.md, measured against a local
//! control plane with the operator (a release build) out of cluster in url mode:
//!
//! 1. operator start to ready (`/readyz` 200), with the certificate Secret present and with
//!    it deleted first (so the start generates the CA and the serving certificate);
//! 2. from `kubectl apply` of a new template to the first Pod it injects (probing with
//!    server-side dry-run creates every 10 ms);
//! 3. Pod CREATE latency at a steady stream of creations, with no injection, under each
//!    backend (the policy ones on Kubernetes 1.36+), and down two paths that split the cost
//!    (the injected Pod posted as is, a minimal hand-written policy), in rounds: the client's
//!    view, the API server's histograms per admission step and plugin, and the webhook's own
//!    handling ([`latency`]).
//! 4. the Pod census: the operator's RSS with [`CENSUS_PODS`] injected Pods on the API server
//!    (against its RSS before they were created), the time from a template edit to counts
//!    that say every one of them is stale, and the relist: the leader stopped, a standby
//!    replica taking over and listing every Pod afresh, its peak RSS and the time until its
//!    counts are correct. [`CENSUS_PODS_VAR`] sets another number of Pods (100,000 for
//!    issue 36's census).
//!
//! Prints a Markdown report and writes it to `target/bench-e2e.md`. With
//! `SIDECAR_INJECTOR_BENCH_FIGURES` (say `3`, or `1,3`), only those figures are measured.

mod latency;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use injector_e2e::bench::{client_for, percentile};
use injector_e2e::steps::{wait_crd_established, wait_served};
use injector_e2e::{Backend, ControlPlane, Operator, OperatorOptions, READY_POLL, workspace_root};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// Templates applied, one after the other, for figure 2.
const APPLIES: usize = 25;
/// How often figure 2 probes for injection.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// Operator starts of each kind for figure 1.
const STARTS: usize = 10;

/// Injected Pods created for figure 4 unless [`CENSUS_PODS_VAR`] says otherwise, and how
/// many creations are in flight at once.
const CENSUS_PODS: usize = 10_000;
/// Another number of Pods for figure 4: 10,000 by default keeps `just bench-e2e` short; the
/// 100,000-Pod census takes minutes of creations.
const CENSUS_PODS_VAR: &str = "SIDECAR_INJECTOR_BENCH_CENSUS_PODS";
const CENSUS_CONCURRENCY: usize = 32;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cp = ControlPlane::start()?;
    cp.apply_file(&workspace_root().join("crds"))?;
    wait_crd_established(&cp)?;
    let client = runtime.block_on(client_for(&cp))?;
    let mut report = String::new();
    writeln!(
        report,
        "## End to end (`just bench-e2e`)\n\nLocal control plane (etcd, kube-apiserver, \
         kube-controller-manager, all on 127.0.0.1), operator release build out of cluster in \
         url mode, leader election on.\n"
    )?;

    // Figures 1 to 3 with the webhook backend, so that they compare across Kubernetes
    // versions; figure 3 then switches to the policy backend where the API server has one.
    let figures = std::env::var("SIDECAR_INJECTOR_BENCH_FIGURES").unwrap_or_default();
    let measured =
        |figure: &str| figures.is_empty() || figures.split(',').any(|f| f.trim() == figure);
    let mut operator = Operator::start(&cp, webhook_backend())?;
    if measured("1") {
        operator_start_to_ready(&cp, &mut operator, &mut report)?;
    }
    if measured("2") {
        apply_to_first_injection(&cp, &runtime, &client, &mut report)?;
    }
    if measured("3") {
        operator = latency::pod_create_latency(&cp, &runtime, &client, operator, &mut report)?;
    }
    if measured("4") {
        census(&cp, &runtime, &client, &mut operator, &mut report)?;
    }

    println!("{report}");
    let path = workspace_root().join("target/bench-e2e.md");
    std::fs::write(&path, &report).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("[bench] report written to {}", path.display());
    Ok(())
}

/// Figure 1: restarts with the Secret kept, and with it deleted before the start.
fn operator_start_to_ready(
    cp: &ControlPlane,
    operator: &mut Operator,
    report: &mut String,
) -> anyhow::Result<()> {
    let mut kept = Vec::new();
    let mut fresh = Vec::new();
    for start in 0..2 * STARTS {
        operator.stop()?;
        let generate = start % 2 == 1;
        if generate {
            cp.kubectl_ok(&[
                "delete",
                "secret",
                "sidecar-injector-tls",
                "-n",
                "sidecar-injector",
            ])?;
        }
        operator.restart()?;
        let took = operator.ready_after().context("no start time")?;
        if generate { &mut fresh } else { &mut kept }.push(took);
    }
    writeln!(
        report,
        "### Operator start to ready\n\nFrom spawning `sidecar-injector run` to the first \
         `/readyz` 200 (polled every {READY_POLL:?}): the templates listed and a serving \
         certificate loaded. {STARTS} starts of each kind.\n\n\
         | start | p50 | max |\n|---|---|---|\n\
         | Secret present (restart) | {} | {} |\n\
         | no Secret (CA and serving certificate generated) | {} | {} |\n",
        ms(percentile(&kept, 50.0)),
        ms(percentile(&kept, 100.0)),
        ms(percentile(&fresh, 50.0)),
        ms(percentile(&fresh, 100.0)),
    )?;
    Ok(())
}

/// Figure 2: a new template per round, selecting a namespace of its own; the clock starts
/// before `kubectl apply` and stops when a dry-run Pod in that namespace comes back injected.
fn apply_to_first_injection(
    cp: &ControlPlane,
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    report: &mut String,
) -> anyhow::Result<()> {
    let mut latencies = Vec::new();
    for round in 0..APPLIES {
        let value = round.to_string();
        let namespace = cp.namespace("bench-apply", &[("bench.sidecar.dev/round", &value)])?;
        let name = format!("bench-apply-{round}");
        let container = format!("bench-{round}");
        let template = json!({
            "apiVersion": "sidecar.dev/v1alpha1",
            "kind": "SidecarTemplate",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {"matchLabels": {"bench.sidecar.dev/round": value}},
                "failurePolicy": "Ignore",
                "containers": [{"name": container, "image": "busybox:1.36"}],
            },
        });
        let started = Instant::now();
        cp.apply_yaml(&template.to_string())?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        runtime.block_on(async {
            let deadline = started + Duration::from_secs(30);
            loop {
                let pod = pods.create(&dry_run(), &probe_pod()).await?;
                let injected = pod
                    .spec
                    .iter()
                    .flat_map(|spec| &spec.containers)
                    .any(|c| c.name == container);
                if injected {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    bail!("{name} did not inject within 30 s");
                }
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        })?;
        let took = started.elapsed();
        eprintln!("[bench] apply {round}: first injection after {took:.1?}");
        latencies.push(took);
        cp.kubectl_ok(&["delete", "sidecartemplate", &name])?;
        cp.kubectl_ok(&["delete", "namespace", &namespace, "--wait=false"])?;
        // Let the deletion's reconcile settle before the next round's clock starts.
        std::thread::sleep(Duration::from_millis(500));
    }
    writeln!(
        report,
        "### From `kubectl apply` of a new template to the first Pod it injects\n\n\
         {APPLIES} applies, one at a time; each template selects a namespace of its own, so each \
         adds a webhook entry. The clock starts before `kubectl apply` (its ~0.1 s of process \
         start and request included) and stops when a server-side dry-run Pod, created every \
         {PROBE_INTERVAL:?}, comes back with the sidecar.\n\n\
         | p50 | p99 | min | max |\n|---|---|---|---|\n| {} | {} | {} | {} |\n",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 0.0)),
        ms(percentile(&latencies, 100.0)),
    )?;
    Ok(())
}

/// Figure 3: the same stream of creations with and without the webhook in the path.
/// The operator with `--injection-backend webhook`.
fn webhook_backend() -> OperatorOptions {
    OperatorOptions {
        extra_args: Backend::Webhook.args(),
        ..OperatorOptions::default()
    }
}

/// Figure 4: RSS before and after the census's Pods (a template injects them) are created and
/// counted, then a template edit and the time until `status.pods` calls them all stale; then
/// the relist: the leader stopped (SIGTERM: it releases its Lease) and a standby replica,
/// started before the Pods and never watching them, taking over and listing every Pod afresh
/// (the leader's census is what watches Pods). Its peak RSS (VmHWM) is the relist's, and the
/// time runs from the stop to the standby's own counts (its `sidecar_injector_template_pods`
/// gauge, which only a leader sets). The standby is left running as `operator`.
fn census(
    cp: &ControlPlane,
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    operator: &mut Operator,
    report: &mut String,
) -> anyhow::Result<()> {
    let wanted = count_var(CENSUS_PODS_VAR, CENSUS_PODS, "Pods")?;
    let pid = operator.pid().context("the operator runs no process")?;
    let template = |image: &str| {
        format!(
            "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {{name: bench-census}}\n\
             spec:\n  namespaceSelector: {{matchLabels: {{bench: census}}}}\n  failurePolicy: Ignore\n\
             \x20 containers: [{{name: agent, image: \"{image}\"}}]\n"
        )
    };
    cp.apply_yaml(&template("busybox:1.36"))?;
    wait_served(cp, "bench-census", "sidecar-injector")?;
    let namespace = cp.namespace("bench-census", &[("bench", "census")])?;
    injector_e2e::steps::wait_injected(cp, &namespace, &["app=web"], "agent")?;
    let counted = |want: &str, n: usize| -> anyhow::Result<bool> {
        let template = cp.get_json("sidecartemplate", None, "bench-census")?;
        Ok(template["status"]["pods"][want].as_u64() == Some(n as u64))
    };
    // Settled: the template counted (no Pod yet; the probes were dry runs).
    poll_until(Duration::from_secs(30), || counted("injected", 0))?;
    let idle = rss_kib(pid)?;
    // Started before the Pods, so that its RSS before the takeover is that of an idle replica.
    let mut standby = Operator::start(cp, webhook_backend())?;
    let standby_pid = standby.pid().context("the standby runs no process")?;
    let others = runtime.block_on(pod_count(client))?;

    let started = Instant::now();
    runtime.block_on(create_many(client, &namespace, wanted))?;
    let created = started.elapsed();
    // Generous: the figure is the time, this only stops a run that never gets there.
    let timeout = Duration::from_secs(300);
    poll_until(timeout, || counted("current", wanted))?;
    let counted_after = started.elapsed();
    // Let a few census rounds and status writes run before reading the figure.
    std::thread::sleep(Duration::from_secs(5));
    let loaded = rss_kib(pid)?;

    let edited = Instant::now();
    cp.apply_yaml(&template("busybox:1.37"))?;
    poll_until(timeout, || counted("stale", wanted))?;
    let to_counts = edited.elapsed();
    let peak = rss_kib_peak(pid)?;

    let standby_idle = rss_kib(standby_pid)?;
    let stopped = Instant::now();
    operator.stop()?;
    let leader_exited = stopped.elapsed();
    let stale = ["template=\"bench-census\"", "state=\"stale\""];
    poll_until(timeout, || {
        Ok(gauge(&standby, "sidecar_injector_leader", &[])? == Some(1.0))
    })?;
    let leading = stopped.elapsed();
    poll_until(timeout, || {
        Ok(gauge(&standby, "sidecar_injector_template_pods", &stale)? == Some(wanted as f64))
    })?;
    let relisted = stopped.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let relist_loaded = rss_kib(standby_pid)?;
    let relist_peak = rss_kib_peak(standby_pid)?;
    // The standby leads now; the stopped leader is dropped.
    std::mem::swap(operator, &mut standby);

    let mib = |kib: u64| kib as f64 / 1024.0;
    let added = |from: u64, to: u64| (to as f64 - from as f64) / 1024.0;
    writeln!(
        report,
        "### The Pod census\n\n\
         {wanted} Pods injected by one template (created {CENSUS_CONCURRENCY} at a time \
         through the webhook in {:.1} s, {:.0} Pods/s; counted current {:.1} s after the first \
         creation), besides the {others} Pods already there. The operator's RSS (VmRSS; the \
         leader keeps a metadata-only view of every Pod):\n\n\
         | before the Pods | with them | peak (VmHWM) | template edit to `status.pods.stale` = {wanted} |\n|---|---|---|---|\n\
         | {:.1} MiB | {:.1} MiB (+{:.1}) | {:.1} MiB (+{:.1}) | {:.2} s |\n\n\
         The relist: the leader stopped (SIGTERM, it releases its Lease; exited after {:.1} s) \
         and a standby replica, running since before the Pods, took over (its \
         `sidecar_injector_leader` 1 after {:.1} s) and listed every Pod: its own \
         `sidecar_injector_template_pods` said stale = {wanted} {:.2} s after the stop.\n\n\
         | standby before the takeover | after the relist (5 s on) | peak (VmHWM) |\n|---|---|---|\n\
         | {:.1} MiB | {:.1} MiB (+{:.1}) | {:.1} MiB (+{:.1}) |\n",
        created.as_secs_f64(),
        wanted as f64 / created.as_secs_f64(),
        counted_after.as_secs_f64(),
        mib(idle),
        mib(loaded),
        added(idle, loaded),
        mib(peak),
        added(idle, peak),
        to_counts.as_secs_f64(),
        leader_exited.as_secs_f64(),
        leading.as_secs_f64(),
        relisted.as_secs_f64(),
        mib(standby_idle),
        mib(relist_loaded),
        added(standby_idle, relist_loaded),
        mib(relist_peak),
        added(standby_idle, relist_peak),
    )?;
    Ok(())
}

/// The number (of `what`) the environment variable `var` gives (`100_000` reads as 100000),
/// else `default`.
fn count_var(var: &str, default: usize, what: &str) -> anyhow::Result<usize> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => value
            .trim()
            .replace('_', "")
            .parse()
            .with_context(|| format!("{var}={value}: not a number of {what}")),
        _ => Ok(default),
    }
}

/// How many Pods the API server holds (read before the census's, while they are few).
async fn pod_count(client: &kube::Client) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::all(client.clone());
    Ok(pods
        .list_metadata(&ListParams::default())
        .await?
        .items
        .len())
}

/// The value of the series `name` on a replica's `/metrics` whose labels include each of
/// `labels` (`key="value"`); `None` when it has none.
fn gauge(operator: &Operator, name: &str, labels: &[&str]) -> anyhow::Result<Option<f64>> {
    let metrics = operator.metrics()?;
    Ok(metrics.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let rest = series.strip_prefix(name)?;
        let ours =
            (rest.is_empty() || rest.starts_with('{')) && labels.iter().all(|l| rest.contains(l));
        if ours { value.parse().ok() } else { None }
    }))
}

/// Polls `done` every 50 ms until it holds, for at most `timeout`.
fn poll_until(
    timeout: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while !done()? {
        if started.elapsed() > timeout {
            bail!("not done within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A field of `/proc/PID/status`, in KiB.
fn proc_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    proc_status_kib(pid, "VmRSS:")
}

fn rss_kib_peak(pid: u32) -> anyhow::Result<u64> {
    proc_status_kib(pid, "VmHWM:")
}

/// Creates `count` Pods labelled `app=web` in `namespace`, [`CENSUS_CONCURRENCY`] at a time,
/// saying how far it got every 10,000 (a 100,000-Pod run takes minutes).
async fn create_many(client: &kube::Client, namespace: &str, count: usize) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut pod = probe_pod();
    pod.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    let mut creations = futures::stream::iter(0..count)
        .map(|_| {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                pods.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CENSUS_CONCURRENCY);
    let started = Instant::now();
    let mut created = 0;
    while let Some(creation) = creations.next().await {
        creation?;
        created += 1;
        if created % 10_000 == 0 {
            eprintln!(
                "[bench] {created} of {count} Pods created in {:.1?}",
                started.elapsed()
            );
        }
    }
    Ok(())
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// A one-container Pod named by the API server (`bench-…`).
fn probe_pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            generate_name: Some("bench-".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".to_owned(),
                image: Some("busybox:1.36".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

fn ms_f(seconds: f64) -> String {
    if seconds.is_nan() {
        "—".to_owned()
    } else {
        format!("{:.1} ms", seconds * 1e3)
    }
}
