//! Figure 3 of `bench-e2e`: what injection adds to a Pod CREATE, and where that time goes.
//!
//! A steady stream of creations per path, each path once per round and the rounds repeated,
//! so that the machine's drift touches every path alike; each path's cost is its p50 over the
//! same round's *no injection*. A stream's Pods are deleted after it, so that however many
//! rounds ran, every stream meets the same store and every operator start the same census.
//! Besides the backends, two paths that no backend can beat split the cost: *the injected
//! Pod, posted* (the Pod as the webhook leaves it, created with no injection to do: what the
//! larger Pod itself costs) and *a minimal policy* (a hand-written MutatingAdmissionPolicy
//! adding the same container and volume with no condition: the least a policy costs on this
//! API server). The API server's per-plugin admission histograms say which of its steps the
//! time is spent in.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use injector_e2e::bench::{Histogram, percentile};
use injector_e2e::steps::{example, wait_injected, wait_policy_alone, wait_served};
use injector_e2e::{Backend, ControlPlane, Operator, OperatorOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use super::{count_var, ms, ms_f, probe_pod};

/// Pods created per second, and for how long, in each stream.
const STREAM_RATE: u32 = 20;
const STREAM_SECONDS: u32 = 20;
/// How long the watchers (the operator's census, the controller-manager) get to take in a
/// stream's deletions before the next stream.
const SETTLE: Duration = Duration::from_secs(3);
/// Every path is measured once per round, this many rounds unless [`ROUNDS_VAR`] says.
const ROUNDS: usize = 3;
/// More rounds (say `9`) narrow what the machine's drift does to the medians, at about half a
/// minute per path and round.
const ROUNDS_VAR: &str = "SIDECAR_INJECTOR_BENCH_ROUNDS";
/// Measures only these paths (say `none,policy`; *no injection* always), for a quicker
/// comparison of two builds.
const PATHS_VAR: &str = "SIDECAR_INJECTOR_BENCH_PATHS";
/// The container examples/nginx-sidecar adds.
const SIDECAR: &str = "nginx-sidecar";
/// The label of the namespace the minimal policy injects.
const MINIMAL_LABEL: &str = "bench.sidecar.dev/minimal-policy";
/// The admission plugins whose time is reported apart.
const PLUGINS: [&str; 4] = [
    "ServiceAccount",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
];

/// What a stream's Pods go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// A plain Pod into a namespace nothing selects.
    NoInjection,
    /// The Pod as the webhook leaves it, into that namespace: no injection to do.
    Posted,
    /// A plain Pod into a namespace the minimal policy injects.
    MinimalPolicy,
    /// The operator with `--injection-backend webhook`.
    Webhook,
    /// With `--injection-backend policy`: the policy and its guard, no webhook.
    Policy,
    /// A plain Pod into the namespace nothing selects, with `--injection-backend policy`:
    /// what the policy costs the Pods it does not inject.
    PolicyUnselected,
    /// With `--injection-backend auto`: the policy, and the webhook entry skipping what it served.
    Auto,
}

impl Path {
    /// Its name in [`PATHS_VAR`].
    fn key(self) -> &'static str {
        match self {
            Path::NoInjection => "none",
            Path::Posted => "posted",
            Path::MinimalPolicy => "minimal",
            Path::Webhook => "webhook",
            Path::Policy => "policy",
            Path::PolicyUnselected => "policy-unselected",
            Path::Auto => "auto",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Path::NoInjection => "no injection",
            Path::Posted => "the injected Pod, posted",
            Path::MinimalPolicy => "a minimal policy",
            Path::Webhook => "webhook backend",
            Path::Policy => "policy backend",
            Path::PolicyUnselected => "no injection, policy backend installed",
            Path::Auto => "auto backend",
        }
    }

    /// The operator's backend while this path is measured.
    fn backend(self) -> Backend {
        match self {
            Path::Policy | Path::PolicyUnselected => Backend::Policy,
            Path::Auto => Backend::Auto,
            _ => Backend::Webhook,
        }
    }

    /// Whether it needs an API server that serves MutatingAdmissionPolicies.
    fn needs_policies(self) -> bool {
        matches!(
            self,
            Path::MinimalPolicy | Path::Policy | Path::PolicyUnselected | Path::Auto
        )
    }
}

/// In measuring order: grouped by the operator's backend, ending with `auto`, which the
/// census (figure 4) then runs with.
const PATHS: [Path; 7] = [
    Path::NoInjection,
    Path::Posted,
    Path::MinimalPolicy,
    Path::Webhook,
    Path::Policy,
    Path::PolicyUnselected,
    Path::Auto,
];

/// The namespaces and Pods the streams use.
struct Streams {
    selected: String,
    unselected: String,
    minimal: String,
    /// The Pod as the webhook leaves it, ready to post again.
    injected: Pod,
}

/// One stream: the client's latencies and what the API server and the webhook measured.
struct Sample {
    latencies: Vec<Duration>,
    /// `apiserver_request_duration_seconds` of the Pod CREATEs.
    requests: Histogram,
    /// The admission chain's mutating and validating steps.
    admit: Histogram,
    validate: Histogram,
    /// Each of [`PLUGINS`].
    plugins: Vec<Histogram>,
    /// `apiserver_admission_webhook_admission_duration_seconds` (CREATE).
    calls: Histogram,
    /// The webhook's own `sidecar_injector_admission_duration_seconds`.
    own: Histogram,
}

/// Figure 3: every path of [`PATHS`] the API server can run, [`ROUNDS`] times. Takes the
/// operator running with the webhook backend and returns the one running at the end (`auto`
/// where the API server serves policies, else the webhook backend).
pub(super) fn pod_create_latency(
    cp: &ControlPlane,
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    mut operator: Operator,
    report: &mut String,
) -> anyhow::Result<Operator> {
    cp.apply_file(&example("nginx-sidecar/sidecartemplate.yaml"))?;
    wait_served(cp, SIDECAR, "sidecar-injector")?;
    let policies = cp.serves_mutating_admission_policies()?;
    let only = std::env::var(PATHS_VAR).ok();
    let wanted = |path: &Path| {
        *path == Path::NoInjection
            || only
                .as_deref()
                .is_none_or(|only| only.split(',').any(|key| key.trim() == path.key()))
    };
    let paths: Vec<Path> = PATHS
        .into_iter()
        .filter(|path| (policies || !path.needs_policies()) && wanted(path))
        .collect();
    let rounds = count_var(ROUNDS_VAR, ROUNDS, "rounds")?;
    if rounds == 0 {
        bail!("{ROUNDS_VAR}=0: at least one round is needed");
    }
    let streams = prepare(cp, policies)?;
    let mut samples: BTreeMap<usize, Vec<Sample>> = BTreeMap::new();
    let mut backend = Backend::Webhook;
    for round in 1..=rounds {
        for (index, path) in paths.iter().enumerate() {
            if path.backend() != backend {
                backend = path.backend();
                operator = switch_backend(cp, &streams, operator, backend)?;
            }
            eprintln!("[bench] round {round}: {}", path.label());
            let sample = measure(cp, runtime, client, &operator, &streams, *path)?;
            samples.entry(index).or_default().push(sample);
        }
    }
    write_report(report, &paths, &samples, rounds)?;
    Ok(operator)
}

/// The namespaces, the minimal policy where the API server serves policies, and the injected
/// Pod read back from a dry run (its API token volume and mounts left out: the ServiceAccount
/// plugin adds them again, as to every Pod).
fn prepare(cp: &ControlPlane, policies: bool) -> anyhow::Result<Streams> {
    let selected = cp.namespace(
        "bench-stream-selected",
        &[("sidecar.dev/example", "nginx-sidecar")],
    )?;
    let unselected = cp.namespace("bench-stream-unselected", &[])?;
    let minimal = cp.namespace("bench-stream-minimal", &[(MINIMAL_LABEL, "true")])?;
    // The API server picks the configuration up asynchronously: warm up until it injects.
    let injected = wait_injected(cp, &selected, &["app=web"], SIDECAR)?;
    if policies {
        cp.apply_yaml(&minimal_policy().to_string())?;
        cp.apply_yaml(&minimal_binding().to_string())?;
        wait_injected(cp, &minimal, &["app=web"], SIDECAR)?;
    }
    Ok(Streams {
        selected,
        unselected,
        minimal,
        injected: as_posted(injected)?,
    })
}

/// The operator restarted with `backend`, once the API server injects the selected
/// namespace's Pods through it (the policy backends: with no webhook call).
fn switch_backend(
    cp: &ControlPlane,
    streams: &Streams,
    mut operator: Operator,
    backend: Backend,
) -> anyhow::Result<Operator> {
    operator.stop()?;
    drop(operator);
    let operator = Operator::start(
        cp,
        OperatorOptions {
            extra_args: backend.args(),
            ..OperatorOptions::default()
        },
    )?;
    if backend == Backend::Webhook {
        wait_injected(cp, &streams.selected, &["app=web"], SIDECAR)?;
        return Ok(operator);
    }
    if !injector_e2e::steps::policy_served(cp, SIDECAR)? {
        bail!("{SIDECAR} is not served by the policy");
    }
    wait_policy_alone(cp, || {
        wait_injected(cp, &streams.selected, &["app=web"], SIDECAR).map(drop)
    })
    .with_context(|| format!("the {} backend", backend.arg()))?;
    Ok(operator)
}

/// One stream down `path`, with the metrics read before and after it; its Pods are then
/// deleted ([`clear`]).
fn measure(
    cp: &ControlPlane,
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    operator: &Operator,
    streams: &Streams,
    path: Path,
) -> anyhow::Result<Sample> {
    let (namespace, pod) = match path {
        Path::NoInjection | Path::PolicyUnselected => (&streams.unselected, labelled(probe_pod())),
        Path::Posted => (&streams.unselected, streams.injected.clone()),
        Path::MinimalPolicy => (&streams.minimal, labelled(probe_pod())),
        Path::Webhook | Path::Policy | Path::Auto => (&streams.selected, labelled(probe_pod())),
    };
    let scrape = || -> anyhow::Result<[String; 2]> {
        Ok([
            cp.kubectl_ok(&["get", "--raw", "/metrics"])?,
            operator.metrics()?,
        ])
    };
    let before = scrape()?;
    let latencies = runtime.block_on(stream(client, namespace, pod))?;
    let after = scrape()?;
    runtime.block_on(clear(client, namespace))?;
    // From the API server's metrics ([0]) or the operator's ([1]).
    let delta = |from: usize, name: &str, keep: &dyn Fn(&BTreeMap<String, String>) -> bool| {
        Histogram::parse(&after[from], name, keep).minus(&Histogram::parse(
            &before[from],
            name,
            keep,
        ))
    };
    let create = |l: &BTreeMap<String, String>| l.get("operation").is_some_and(|v| v == "CREATE");
    let step = |kind: &'static str| {
        move |l: &BTreeMap<String, String>| create(l) && l.get("type").is_some_and(|v| v == kind)
    };
    Ok(Sample {
        latencies,
        requests: delta(0, "apiserver_request_duration_seconds", &|l| {
            l.get("verb").is_some_and(|v| v == "POST")
                && l.get("resource").is_some_and(|v| v == "pods")
                && l.get("subresource").is_none_or(String::is_empty)
                && l.get("dry_run").is_none_or(String::is_empty)
        }),
        admit: delta(
            0,
            "apiserver_admission_step_admission_duration_seconds",
            &step("admit"),
        ),
        validate: delta(
            0,
            "apiserver_admission_step_admission_duration_seconds",
            &step("validate"),
        ),
        plugins: PLUGINS
            .iter()
            .map(|plugin| {
                delta(
                    0,
                    "apiserver_admission_controller_admission_duration_seconds",
                    &|l| create(l) && l.get("name").is_some_and(|v| v == plugin),
                )
            })
            .collect(),
        calls: delta(
            0,
            "apiserver_admission_webhook_admission_duration_seconds",
            &create,
        ),
        own: delta(1, "sidecar_injector_admission_duration_seconds", &|_| true),
    })
}

/// The stream's Pod: labelled as examples/nginx-sidecar selects.
fn labelled(mut pod: Pod) -> Pod {
    pod.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    pod
}

/// Creates `STREAM_RATE` Pods a second for `STREAM_SECONDS`, each on its own task so a slow
/// creation does not delay the next; returns each creation's latency as the client saw it.
async fn stream(client: &kube::Client, namespace: &str, pod: Pod) -> anyhow::Result<Vec<Duration>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / STREAM_RATE);
    let mut tasks = Vec::new();
    for _ in 0..STREAM_RATE * STREAM_SECONDS {
        ticker.tick().await;
        let pods = pods.clone();
        let pod = pod.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            pods.create(&PostParams::default(), &pod).await?;
            anyhow::Ok(started.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.push(task.await??);
    }
    Ok(latencies)
}

/// Deletes the stream's Pods (Pending, bound to no node: gone at once) and lets the watchers
/// catch up, so that every stream meets the same store and every operator start lists the
/// same few Pods, however many rounds ran before.
async fn clear(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .with_context(|| format!("deleting the Pods of {namespace}"))?;
    tokio::time::sleep(SETTLE).await;
    Ok(())
}

/// A dry run's injected Pod as a client would post it: named by the API server, without what
/// the API server fills in (status, identity, the API token's volume and mounts, the priority
/// the Priority plugin sets).
fn as_posted(mut pod: Value) -> anyhow::Result<Pod> {
    let token_volume = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| {
            v["projected"].is_object()
                && v["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kube-api-access-"))
        })
        .and_then(|v| v["name"].as_str())
        .map(str::to_owned)
        .context("the injected Pod has no API token volume")?;
    let metadata = json!({
        "generateName": "bench-",
        "labels": pod["metadata"]["labels"],
        "annotations": pod["metadata"]["annotations"],
    });
    pod["metadata"] = metadata;
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        bail!("the injected Pod has no spec");
    };
    spec.remove("priority");
    if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        volumes.retain(|v| v["name"] != token_volume.as_str());
    }
    for list in ["containers", "initContainers"] {
        for container in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(mounts) = container
                .get_mut("volumeMounts")
                .and_then(Value::as_array_mut)
            {
                mounts.retain(|m| m["name"] != token_volume.as_str());
            }
        }
    }
    if let Some(object) = pod.as_object_mut() {
        object.remove("status");
    }
    Ok(serde_json::from_value(pod)?)
}

/// The least a policy can do to inject examples/nginx-sidecar: append its container and
/// volume, in every Pod of the namespaces labelled [`MINIMAL_LABEL`], with no condition, never
/// run again. (The ServiceAccount plugin's second pass mounts the API token into the
/// container, as it does into every container the first pass did not see.)
fn minimal_policy() -> Value {
    let mutation = r#"[
  JSONPatch{op: "add", path: "/spec/containers/-", value: Object.spec.containers{
    name: "nginx-sidecar",
    image: "nginx:1.27",
    ports: [Object.spec.containers.ports{name: "http-sidecar", containerPort: 8080}],
    volumeMounts: [Object.spec.containers.volumeMounts{
      name: "nginx-sidecar-conf", mountPath: "/etc/nginx/conf.d", readOnly: true}],
    resources: Object.spec.containers.resources{
      requests: {"cpu": "10m", "memory": "16Mi"}, limits: {"memory": "64Mi"}}
  }},
  JSONPatch{op: "add", path: "/spec/volumes/-", value: Object.spec.volumes{
    name: "nginx-sidecar-conf",
    configMap: Object.spec.volumes.configMap{name: "nginx-sidecar-conf"}
  }}
]"#;
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": "bench-minimal-policy"},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {MINIMAL_LABEL: "true"}},
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }],
            },
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": mutation}}],
        },
    })
}

fn minimal_binding() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": "bench-minimal-policy"},
        "spec": {"policyName": "bench-minimal-policy"},
    })
}

/// Two tables: each round's p50 over that round's *no injection*, and every path's streams
/// pooled, with the API server's view per Pod.
fn write_report(
    report: &mut String,
    paths: &[Path],
    samples: &BTreeMap<usize, Vec<Sample>>,
    rounds: usize,
) -> anyhow::Result<()> {
    let none = samples.get(&0).context("no stream without injection")?;
    let p50 = |sample: &Sample| percentile(&sample.latencies, 50.0).as_secs_f64();
    writeln!(
        report,
        "### Pod CREATE latency: where injection's time goes\n\n\
         {STREAM_RATE} Pods/s for {STREAM_SECONDS} s per stream (real creates, stored, \
         Pending, deleted after their stream), one template (examples/nginx-sidecar), every \
         path once per round, rounds: {rounds}. *The injected Pod, posted*: the Pod as the \
         webhook leaves it, created where nothing selects it (the larger Pod's own cost). *A \
         minimal policy*: a hand-written MutatingAdmissionPolicy appending the same container \
         and volume, no condition. *Policy backend*: `--injection-backend policy` (the policy \
         and its guard, and the warnings policy), and a plain Pod where nothing selects it \
         under that backend (what the policies cost the Pods they see and leave alone); \
         *auto*: the policy, and the webhook entry that skips what it served.\n\n\
         Client p50 per round, and over that round's no injection:\n"
    )?;
    write!(report, "| path |")?;
    for round in 1..=rounds {
        write!(report, " round {round} |")?;
    }
    writeln!(report, " median over none (range) |")?;
    writeln!(report, "|---|{}---:|", "---:|".repeat(rounds))?;
    for (index, path) in paths.iter().enumerate() {
        let rounds = samples.get(&index).map(Vec::as_slice).unwrap_or_default();
        write!(report, "| {} |", path.label())?;
        let mut over = Vec::new();
        for (sample, baseline) in rounds.iter().zip(none) {
            let extra = p50(sample) - p50(baseline);
            over.push(extra);
            if index == 0 {
                write!(report, " {} |", ms_f(p50(sample)))?;
            } else {
                write!(report, " {} ({:+.1}) |", ms_f(p50(sample)), extra * 1e3)?;
            }
        }
        over.sort_by(f64::total_cmp);
        match (over.first(), over.get(over.len() / 2), over.last()) {
            (Some(low), Some(median), Some(high)) if index != 0 => writeln!(
                report,
                // Two decimals: with many rounds the median resolves less than a tenth.
                " **{:+.2} ms** ({:+.1} to {:+.1}) |",
                median * 1e3,
                low * 1e3,
                high * 1e3
            )?,
            _ => writeln!(report, " — |")?,
        }
    }
    writeln!(
        report,
        "\nAll rounds pooled. The API server's histograms are given per Pod (sum / Pods): its \
         buckets are too coarse for percentiles (the first ends at 5 ms). *Admission*: its \
         mutating and validating steps; then the plugins' own time (the second pass, after a \
         mutation, included); webhook calls as the API server counts them, and the webhook's \
         own handling of each.\n\n\
         | path | Pods | client p50 | client p99 | POST pods | admission: mutating + validating | {} | webhook calls: per Pod, mean | webhook's own |\n\
         |---|---:|---:|---:|---:|---:|{}---:|---:|",
        PLUGINS.join(" | "),
        "---:|".repeat(PLUGINS.len())
    )?;
    for (index, path) in paths.iter().enumerate() {
        let rounds = samples.get(&index).map(Vec::as_slice).unwrap_or_default();
        let latencies: Vec<Duration> = rounds.iter().flat_map(|s| s.latencies.clone()).collect();
        let pods = latencies.len() as f64;
        let sum = |pick: &dyn Fn(&Sample) -> &Histogram| pooled(rounds.iter().map(pick));
        // Two decimals: a sum over every Pod is exact where the buckets are coarse, and the
        // A/B of a change to what the API server runs lives in its tens of µs.
        let per_pod = |h: &Histogram| {
            if pods == 0.0 {
                "—".to_owned()
            } else {
                format!("{:.2} ms", h.sum / pods * 1e3)
            }
        };
        let requests = sum(&|s| &s.requests);
        let (calls, own) = (sum(&|s| &s.calls), sum(&|s| &s.own));
        write!(
            report,
            "| {} | {} | {} | {} | {} | {} + {} |",
            path.label(),
            latencies.len(),
            ms(percentile(&latencies, 50.0)),
            ms(percentile(&latencies, 99.0)),
            ms_f(requests.mean()),
            per_pod(&sum(&|s| &s.admit)),
            per_pod(&sum(&|s| &s.validate)),
        )?;
        for plugin in 0..PLUGINS.len() {
            write!(report, " {} |", per_pod(&sum(&|s| &s.plugins[plugin])))?;
        }
        let calls_cell = if calls.count == 0.0 {
            "none".to_owned()
        } else {
            format!("{:.2}, {}", calls.count / pods, ms_f(calls.mean()))
        };
        let own_cell = if own.count == 0.0 {
            "—".to_owned()
        } else {
            format!("{:.2} ms", own.mean() * 1e3)
        };
        writeln!(report, " {calls_cell} | {own_cell} |")?;
    }
    writeln!(report)?;
    Ok(())
}

/// The sums and counts of `histograms` added up (their buckets are not needed here).
fn pooled<'a>(histograms: impl Iterator<Item = &'a Histogram>) -> Histogram {
    histograms.fold(Histogram::default(), |total, h| Histogram {
        buckets: Vec::new(),
        sum: total.sum + h.sum,
        count: total.count + h.count,
    })
}
