//! `just bench-scale`: the operator at [`TEMPLATES`] realistic templates in [`GROUPS`]
//! namespace groups (the shape of `crates/controller/examples/admission_sizes.rs`: a sidecar
//! with ten env vars, probes, resources, a port and placeholders; the even ones required), on a
//! local control plane, once per injection backend (`webhook`, `auto`, `policy`), each on a
//! fresh control plane so that no status or admission object of another backend is read:
//!
//! 1. from spawning the operator (the templates already stored) to every template's status
//!    settled: `Ready` for its generation and, under `auto` and `policy`, `PolicyServed` for its
//!    generation with a final reason (anything but `NotProven`); the reasons are counted;
//! 2. the size of every admission object as read back (`kubectl get … -o json`, in bytes);
//! 3. an edit of one template (an env value) to a dry-run Pod in a namespace it selects
//!    carrying the new value, probed every [`PROBE_INTERVAL`], [`EDITS`] edits per template;
//! 4. dry-run Pod CREATE latency, [`CREATES`] sequential creates per namespace: a group of
//!    required templates, a group of best-effort ones, and a namespace no template selects.
//!
//! What fails is reported, not hidden: an operator that does not become ready, statuses that do
//! not settle, Pods refused, and the operator's logged warnings and errors.
//!
//! Prints a Markdown report and writes it to `target/bench-scale.md`. Needs an API server that
//! serves MutatingAdmissionPolicies for `auto` and `policy` (`SIDECAR_INJECTOR_KUBE_VERSION=v1.37.2`);
//! without one only `webhook` is measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use injector_e2e::bench::{client_for, percentile};
use injector_e2e::steps::install_crd;
use injector_e2e::{Backend, ControlPlane, Operator, OperatorOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Templates, in namespace groups (`team: team-<index % GROUPS>`).
const TEMPLATES: usize = 500;
const GROUPS: usize = 64;
/// How long every template's status gets to settle after the operator starts.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the statuses are listed while they settle (one list of every template).
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// How long every status must stay final and unchanged to count as settled.
const STABLE: Duration = Duration::from_secs(10);
/// Edits per template for figure 3, how often a dry-run Pod is created to see one land, and
/// how long one may take.
const EDITS: usize = 5;
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
const EDIT_TIMEOUT: Duration = Duration::from_secs(180);
/// Sequential dry-run creates per namespace for figure 4.
const CREATES: usize = 200;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut report = String::new();
    writeln!(
        report,
        "## At {TEMPLATES} templates (`just bench-scale`)\n\n\
         {TEMPLATES} templates in {GROUPS} namespace groups (a sidecar with ten env vars, two \
         probes, resources, a port and two placeholders; the even-numbered ones, so every \
         even group, required), stored before the operator starts; a fresh local control plane \
         per backend, the operator's release build out of cluster in url mode.\n"
    )?;
    // `SIDECAR_INJECTOR_BENCH_BACKENDS=auto,policy` measures only those.
    let only = std::env::var("SIDECAR_INJECTOR_BENCH_BACKENDS").ok();
    for backend in [Backend::Webhook, Backend::Auto, Backend::Policy] {
        if only
            .as_deref()
            .is_some_and(|only| !only.split(',').any(|b| b.trim() == backend.arg()))
        {
            continue;
        }
        let started = Instant::now();
        match run_backend(&runtime, backend, &mut report) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                eprintln!("[bench] {}: {e:#}", backend.arg());
                writeln!(report, "\n**`{}` failed**: {e:#}\n", backend.arg())?;
            }
        }
        eprintln!(
            "[bench] backend {} done in {:.0?}",
            backend.arg(),
            started.elapsed()
        );
    }
    println!("{report}");
    let path = injector_e2e::workspace_root().join("target/bench-scale.md");
    std::fs::write(&path, &report).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("[bench] report written to {}", path.display());
    Ok(())
}

/// One backend on a fresh control plane; `Ok(false)` when the API server serves no policies,
/// so the policy backends cannot be measured.
fn run_backend(
    runtime: &tokio::runtime::Runtime,
    backend: Backend,
    report: &mut String,
) -> anyhow::Result<bool> {
    let cp = ControlPlane::start()?;
    if backend != Backend::Webhook && !cp.serves_mutating_admission_policies()? {
        writeln!(
            report,
            "`auto` and `policy` not measured: this API server serves no \
             MutatingAdmissionPolicies (Kubernetes 1.36+).\n"
        )?;
        return Ok(false);
    }
    install_crd(&cp)?;
    let client = runtime.block_on(client_for(&cp))?;
    writeln!(report, "### `--injection-backend {}`\n", backend.arg())?;

    let applied = Instant::now();
    runtime.block_on(create_templates(&client))?;
    let required_ns = cp.namespace("scale-team-0", &[("team", "team-0")])?;
    let best_effort_ns = cp.namespace("scale-team-1", &[("team", "team-1")])?;
    let unselected_ns = cp.namespace("scale-none", &[])?;
    eprintln!(
        "[bench] {}: {TEMPLATES} templates stored in {:.1?}",
        backend.arg(),
        applied.elapsed()
    );

    // Figure 1: the clock starts before the spawn; `Operator::start` returns at `/readyz` 200.
    let spawned = Instant::now();
    let operator = Operator::start(
        &cp,
        OperatorOptions {
            extra_args: backend.args(),
            ..OperatorOptions::default()
        },
    );
    let operator = match operator {
        Ok(operator) => operator,
        Err(e) => {
            writeln!(
                report,
                "**The operator did not become ready**: {e:#}\n\n```\n{}\n```\n",
                cp.log_tails(20)
            )?;
            return Ok(true);
        }
    };
    let ready = spawned.elapsed();
    let settled = runtime.block_on(settle(&client, backend, spawned));
    let settled = match settled {
        Ok(settled) => settled,
        Err(e) => {
            writeln!(report, "**Statuses did not settle**: {e:#}\n")?;
            operator_log(&operator, report)?;
            sizes(&cp, report)?;
            return Ok(true);
        }
    };
    writeln!(
        report,
        "- operator start to `/readyz` 200: {}\n\
         - to every template's `Ready` for its generation: {}\n\
         - to every template's status settled{}: **{}** (first all final at {}; then \
         unchanged for {STABLE:?})\n\
         - reasons: {}\n",
        secs(ready),
        secs(settled.observed),
        if backend == Backend::Webhook {
            ""
        } else {
            " (`PolicyServed` final)"
        },
        secs(settled.settled),
        secs(settled.first_all_final),
        settled.reasons_line(),
    )?;
    for (reason, message) in &settled.samples {
        writeln!(report, "  - `{reason}`, e.g.: {message}")?;
    }
    writeln!(report)?;

    sizes(&cp, report)?;

    // Figure 3: a required template of group 0 and a best-effort one of group 1, each the
    // first of its group the backend injects; under `auto` also one left to the webhook.
    let mut targets = vec![
        (settled.first_in_group(0), required_ns.clone()),
        (settled.first_in_group(1), best_effort_ns.clone()),
    ];
    if backend == Backend::Auto
        && let Some(left) = settled.first_left_to_webhook()
    {
        let group = index_of(&left) % GROUPS;
        let ns = cp.namespace(
            &format!("scale-team-{group}"),
            &[("team", &format!("team-{group}"))],
        )?;
        targets.push((Some(left), ns));
    }
    writeln!(
        report,
        "Edit to landing ({EDITS} edits of `SETTING_0` per template, a dry-run Pod every \
         {PROBE_INTERVAL:?} until it carries the new value):\n\n\
         | template | its `PolicyServed` | namespace | median | max | all |\n|---|---|---|---:|---:|---|"
    )?;
    for (target, namespace) in targets {
        let Some(name) = target else {
            writeln!(
                report,
                "| — | — | {namespace} | — | — | no template of this group is injected |"
            )?;
            continue;
        };
        let row = runtime.block_on(edits(&client, backend, &name, &namespace));
        let served = settled.reason_of(&name);
        match row {
            Ok(times) => writeln!(
                report,
                "| {name} | {served} | {namespace} | {} | {} | {} |",
                secs(percentile(&times, 50.0)),
                secs(percentile(&times, 100.0)),
                times
                    .iter()
                    .map(|t| secs(*t))
                    .collect::<Vec<_>>()
                    .join(", "),
            )?,
            Err(e) => writeln!(
                report,
                "| {name} | {served} | {namespace} | — | — | **{}** |",
                one_line(&format!("{e:#}"))
            )?,
        }
    }
    writeln!(report)?;

    // Figure 4.
    writeln!(
        report,
        "Pod CREATE latency ({CREATES} sequential server-side dry-run creates per namespace, \
         the client's view):\n\n\
         | namespace | templates selecting it | admitted | refused | p50 | p99 |\n\
         |---|---|---:|---:|---:|---:|"
    )?;
    let per_group = TEMPLATES.div_ceil(GROUPS);
    for (namespace, label) in [
        (&required_ns, format!("group 0: ~{per_group} required")),
        (
            &best_effort_ns,
            format!("group 1: ~{per_group} best-effort"),
        ),
        (&unselected_ns, "none".to_owned()),
    ] {
        let (times, refused) = runtime.block_on(creates(&client, namespace))?;
        let refusal = refused
            .first()
            .map(|m| format!(" ({})", one_line(m)))
            .unwrap_or_default();
        writeln!(
            report,
            "| {namespace} | {label} | {} | {}{refusal} | {} | {} |",
            times.len() - refused.len(),
            refused.len(),
            ms(percentile(&times, 50.0)),
            ms(percentile(&times, 99.0)),
        )?;
    }
    writeln!(report)?;
    operator_log(&operator, report)?;
    drop(operator);
    drop(cp);
    Ok(true)
}

fn templates_api(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "sidecar.dev".into(),
        version: "v1alpha1".into(),
        api_version: "sidecar.dev/v1alpha1".into(),
        kind: "SidecarTemplate".into(),
        plural: "sidecartemplates".into(),
    };
    Api::all_with(client.clone(), &resource)
}

/// Template `index` as in `admission_sizes.rs` (the same shape, so the sizes compare), in
/// group `index % GROUPS`; the edits change its `SETTING_0`.
fn template(index: usize) -> Value {
    let name = format!("sidecar-{index}");
    let env: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{index}-{i}")}))
        .collect();
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name},
        "spec": {
            "priority": index % 7,
            "failurePolicy": if index.is_multiple_of(2) { "Fail" } else { "Ignore" },
            "namespaceSelector": {"matchLabels": {"team": format!("team-{}", index % GROUPS)}},
            "podSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["system"]}]},
            "containers": [{
                "name": format!("{name}-agent"),
                "image": format!("registry.invalid/agents/{name}:1.2.{index}"),
                "args": ["--pod", "{{ pod.name }}", "--namespace", "{{ pod.namespace }}"],
                "env": env,
                "ports": [{"containerPort": 9100, "name": "metrics"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 9100}, "periodSeconds": 5},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9100}},
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "10m", "memory": "32Mi"}},
            }],
        },
    })
}

fn index_of(name: &str) -> usize {
    name.trim_start_matches("sidecar-").parse().unwrap_or(0)
}

async fn create_templates(client: &kube::Client) -> anyhow::Result<()> {
    let api = templates_api(client);
    for index in 0..TEMPLATES {
        let object: DynamicObject = serde_json::from_value(template(index))?;
        api.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("cannot create sidecar-{index}"))?;
    }
    Ok(())
}

/// Every template's status as figure 1 reads it, once settled.
struct Settled {
    /// From the spawn to every template's `Ready` for its generation.
    observed: Duration,
    /// To the last change of a status before every one was final and stayed so.
    settled: Duration,
    /// To the first time every status was final (earlier than `settled` when one changed
    /// again afterwards).
    first_all_final: Duration,
    /// Template name to its final reason (`Served`, `PolicyFull`, …; `Ready` under `webhook`).
    reasons: BTreeMap<String, String>,
    /// One message per reason other than `Served`.
    samples: BTreeMap<String, String>,
    /// Whether the backend writes `PolicyServed` (`auto`, `policy`).
    policy: bool,
}

impl Settled {
    fn reasons_line(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for reason in self.reasons.values() {
            *counts.entry(reason).or_default() += 1;
        }
        counts
            .iter()
            .map(|(reason, n)| format!("`{reason}` {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn reason_of(&self, name: &str) -> String {
        self.reasons
            .get(name)
            .map_or_else(|| "—".to_owned(), |r| format!("`{r}`"))
    }

    /// The lowest-numbered template of `group` that the policy serves (any under `webhook`,
    /// which serves them all).
    fn first_in_group(&self, group: usize) -> Option<String> {
        (0..TEMPLATES)
            .filter(|i| i % GROUPS == group)
            .map(|i| format!("sidecar-{i}"))
            .find(|name| {
                self.reasons
                    .get(name)
                    .is_some_and(|r| !self.policy || r == "Served")
            })
    }

    /// The lowest-numbered best-effort template left to the webhook (`PolicyFull`), whose
    /// group admits Pods under `auto` and `policy` alike.
    fn first_left_to_webhook(&self) -> Option<String> {
        (0..TEMPLATES)
            .filter(|i| i % 2 == 1)
            .map(|i| format!("sidecar-{i}"))
            .find(|name| self.reasons.get(name).is_some_and(|r| r == "PolicyFull"))
    }
}

/// A condition of `template` of `type_` for the template's current generation.
fn condition<'a>(template: &'a Value, type_: &str) -> Option<&'a Value> {
    let generation = &template["metadata"]["generation"];
    template["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && &c["observedGeneration"] == generation)
}

/// The template's final reason, once its status is settled for its generation.
fn settled_reason(template: &Value, backend: Backend) -> Option<String> {
    if template["status"]["observedGeneration"] != template["metadata"]["generation"] {
        return None;
    }
    let ready = template["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    if backend == Backend::Webhook {
        return Some(ready["reason"].as_str().unwrap_or("Ready").to_owned());
    }
    let served = condition(template, "PolicyServed")?;
    let reason = served["reason"].as_str()?;
    // `NotProven`: a required template waiting for its proof, refused meanwhile.
    (reason != "NotProven").then(|| reason.to_owned())
}

/// Figure 1: lists every template until each is settled.
async fn settle(
    client: &kube::Client,
    backend: Backend,
    spawned: Instant,
) -> anyhow::Result<Settled> {
    let api = templates_api(client);
    let mut observed = None;
    let mut last_report = Instant::now();
    // A reason may be final-looking and still change (a proof retried after a failure): the
    // statuses count as settled once every one is final and none changed for [`STABLE`], and
    // the figure is the time of the last change.
    let mut previous = BTreeMap::new();
    let mut changed_at = spawned;
    let mut first_all_final = None;
    loop {
        let list = api.list(&ListParams::default()).await?;
        let templates: Vec<Value> = list
            .items
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        let all_observed = templates.len() == TEMPLATES
            && templates
                .iter()
                .all(|t| t["status"]["observedGeneration"] == t["metadata"]["generation"]);
        if all_observed && observed.is_none() {
            observed = Some(spawned.elapsed());
        }
        let reasons: BTreeMap<String, Option<String>> = templates
            .iter()
            .map(|t| {
                (
                    t["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    settled_reason(t, backend),
                )
            })
            .collect();
        let pending = reasons.values().filter(|r| r.is_none()).count();
        if reasons != previous {
            changed_at = Instant::now();
            previous = reasons.clone();
        }
        let all_final = all_observed && pending == 0;
        if all_final && first_all_final.is_none() {
            first_all_final = Some(spawned.elapsed());
        }
        if all_final && changed_at.elapsed() >= STABLE {
            let mut samples = BTreeMap::new();
            for t in &templates {
                if let Some(c) = condition(t, "PolicyServed")
                    && c["reason"] != "Served"
                {
                    let reason = c["reason"].as_str().unwrap_or_default().to_owned();
                    samples.entry(reason).or_insert_with(|| {
                        format!(
                            "{} ({}): {}",
                            t["metadata"]["name"].as_str().unwrap_or_default(),
                            t["spec"]["failurePolicy"].as_str().unwrap_or_default(),
                            c["message"].as_str().unwrap_or_default()
                        )
                    });
                }
            }
            return Ok(Settled {
                observed: observed.unwrap_or_default(),
                settled: changed_at.duration_since(spawned),
                first_all_final: first_all_final.unwrap_or_default(),
                reasons: reasons
                    .into_iter()
                    .map(|(n, r)| (n, r.unwrap_or_default()))
                    .collect(),
                samples,
                policy: backend != Backend::Webhook,
            });
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "[bench] {:.0?}: {pending} of {} templates not settled",
                spawned.elapsed(),
                templates.len()
            );
        }
        if spawned.elapsed() > SETTLE_TIMEOUT {
            let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
            for t in &templates {
                if settled_reason(t, backend).is_none() {
                    let what = condition(t, "PolicyServed").map_or_else(
                        || "no PolicyServed for its generation".to_owned(),
                        |c| format!("{} ({})", c["reason"], c["message"]),
                    );
                    *waiting.entry(what).or_default() += 1;
                }
            }
            bail!("after {SETTLE_TIMEOUT:?}, {pending} templates not settled: {waiting:?}");
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// Figure 2: every admission object of the kinds the operator writes, as read back.
fn sizes(cp: &ControlPlane, report: &mut String) -> anyhow::Result<()> {
    writeln!(
        report,
        "Admission objects as read back (`kubectl get … -o json | wc -c`, managedFields \
         included):\n\n| object | bytes |\n|---|---:|"
    )?;
    for kind in [
        "mutatingwebhookconfigurations",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ] {
        let names = cp.kubectl(&["get", kind, "-o", "name"])?;
        if !names.status.success() {
            continue;
        }
        for name in String::from_utf8_lossy(&names.stdout).lines() {
            let json = cp.kubectl_ok(&["get", name, "-o", "json"])?;
            writeln!(report, "| `{name}` | {} |", json.len())?;
        }
    }
    writeln!(report)?;
    Ok(())
}

fn probe_pod() -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "scale-", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]},
    }))?)
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// `SETTING_0` of container `<name>-agent` in a Pod, if injected.
fn setting(pod: &Pod, name: &str) -> Option<String> {
    let agent = format!("{name}-agent");
    let spec = pod.spec.as_ref()?;
    let container = spec.containers.iter().find(|c| c.name == agent)?;
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "SETTING_0")
        .and_then(|e| e.value.clone())
}

/// Figure 3: [`EDITS`] edits of template `name`, each timed from before the patch to the first
/// dry-run Pod in `namespace` carrying the new value; after each, the template's status is let
/// settle so that edits do not overlap.
async fn edits(
    client: &kube::Client,
    backend: Backend,
    name: &str,
    namespace: &str,
) -> anyhow::Result<Vec<Duration>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let templates = templates_api(client);
    let pod = probe_pod()?;
    let before = pods
        .create(&dry_run(), &pod)
        .await
        .context("a Pod before the edits")?;
    if setting(&before, name).is_none() {
        bail!("a Pod before the edits does not carry {name}-agent");
    }
    let mut times = Vec::new();
    for edit in 0..EDITS {
        let value = format!("edited-{edit}");
        // A merge patch replaces the list whole: the container as created, one value changed.
        let mut containers = template(index_of(name))["spec"]["containers"].clone();
        containers[0]["env"][0]["value"] = json!(value);
        let patch = json!({"spec": {"containers": containers}});
        let started = Instant::now();
        templates
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let mut last_refusal = None;
        loop {
            match pods.create(&dry_run(), &pod).await {
                Ok(created) if setting(&created, name).as_deref() == Some(&value) => break,
                Ok(_) => {}
                Err(e) => last_refusal = Some(e.to_string()),
            }
            if started.elapsed() > EDIT_TIMEOUT {
                bail!(
                    "edit {edit} did not land within {EDIT_TIMEOUT:?}{}",
                    last_refusal
                        .map(|r| format!(" (last refusal: {r})"))
                        .unwrap_or_default()
                );
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
        let took = started.elapsed();
        eprintln!(
            "[bench] {}: edit {edit} of {name} landed after {took:.1?}",
            backend.arg()
        );
        times.push(took);
        let settled_by = Instant::now() + EDIT_TIMEOUT;
        loop {
            let template = serde_json::to_value(templates.get(name).await?)?;
            if settled_reason(&template, backend).is_some() {
                break;
            }
            if Instant::now() > settled_by {
                bail!("{name} did not settle after edit {edit}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(times)
}

/// Figure 4: [`CREATES`] sequential dry-run creates; every latency, and the refusals' messages.
async fn creates(
    client: &kube::Client,
    namespace: &str,
) -> anyhow::Result<(Vec<Duration>, Vec<String>)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = probe_pod()?;
    let mut times = Vec::with_capacity(CREATES);
    let mut refused = Vec::new();
    for _ in 0..CREATES {
        let started = Instant::now();
        let outcome = pods.create(&dry_run(), &pod).await;
        times.push(started.elapsed());
        if let Err(e) = outcome {
            refused.push(e.to_string());
        }
    }
    Ok((times, refused))
}

/// The operator's logged warnings and errors: how many, and the first few distinct ones.
fn operator_log(operator: &Operator, report: &mut String) -> anyhow::Result<()> {
    let Some(path) = operator.log_path() else {
        return Ok(());
    };
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let flagged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    writeln!(
        report,
        "The operator logged {} warnings and errors{}",
        flagged.len(),
        if flagged.is_empty() {
            "."
        } else {
            ", the first:"
        }
    )?;
    let mut seen = Vec::new();
    for line in flagged {
        // Timestamps differ: compare from the level on.
        let key: String = line
            .find("WARN")
            .or_else(|| line.find("ERROR"))
            .map_or(line, |at| &line[at..])
            .chars()
            .take(120)
            .collect();
        if !seen.contains(&key) {
            seen.push(key);
            // The cause of an API error comes last (a refused object is quoted whole first).
            let count = line.chars().count();
            let end: String = line.chars().skip(count.saturating_sub(300)).collect();
            writeln!(
                report,
                "- `{}` … `{}`",
                one_line(&truncate(line, 300)),
                one_line(&end)
            )?;
        }
        if seen.len() >= 5 {
            break;
        }
    }
    writeln!(report)?;
    Ok(())
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// A message fit for a table cell.
fn one_line(text: &str) -> String {
    truncate(&text.replace(['\n', '|'], " "), 300)
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

fn secs(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}
