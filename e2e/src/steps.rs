//! What a user does and then waits for, shared by the scenarios, the chart test, the demo and
//! the end-to-end benchmarks: the examples' paths, a template served, a container injected.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use crate::bench::webhook_calls;
use crate::control_plane::ControlPlane;
use crate::pod::{containers, init_containers, names};
use crate::{poll, poll_every, workspace_root};

/// The name of the MutatingWebhookConfiguration the operator writes by default (and the chart
/// writes under the default release name `sidecar-injector`).
pub const CONFIGURATION: &str = "sidecar-injector";

/// `examples/<path>` of the workspace.
pub fn example(path: &str) -> PathBuf {
    workspace_root().join("examples").join(path)
}

/// Applies the SidecarTemplate CRD of `crds/` and waits until it is Established.
pub fn install_crd(cp: &ControlPlane) -> anyhow::Result<()> {
    cp.apply_file(&workspace_root().join("crds"))?;
    wait_crd_established(cp)
}

/// Waits until the CRD `sidecartemplates.sidecar.dev` is Established (up to 30 s).
pub fn wait_crd_established(cp: &ControlPlane) -> anyhow::Result<()> {
    poll(Duration::from_secs(30), "the CRD to be established", || {
        let crd = cp.get_json("crd", None, "sidecartemplates.sidecar.dev")?;
        let established = crd["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Established" && c["status"] == "True");
        Ok(established.then_some(()))
    })
}

/// Waits until template `name` is `Ready=True` for its generation and its webhook entry is in
/// the configuration `configuration`; returns the entry's name.
pub fn wait_served(cp: &ControlPlane, name: &str, configuration: &str) -> anyhow::Result<String> {
    let entry = poll(
        Duration::from_secs(30),
        &format!("{name} Ready=True"),
        || {
            let template = cp.get_json("sidecartemplate", None, name)?;
            if template["status"]["observedGeneration"] != template["metadata"]["generation"] {
                return Ok(None);
            }
            Ok(ready_condition(&template)
                .filter(|c| c["status"] == "True")
                .and_then(|c| {
                    c["message"]
                        .as_str()?
                        .strip_prefix("in use; served by webhook entry ")
                        .map(str::to_owned)
                }))
        },
    )?;
    poll(
        Duration::from_secs(30),
        &format!("entry {entry} in the webhook configuration"),
        || {
            Ok(cp
                .try_get_json("mutatingwebhookconfiguration", None, configuration)?
                .filter(|c| webhook_names(c).contains(&entry))
                .map(|_| ()))
        },
    )?;
    Ok(entry)
}

/// Waits until the entry `entry` of the operator's webhook configuration skips the Pods the
/// policy served (its `not-injected-by-policy` match condition); up to 30 s.
pub fn wait_entry_skips_policy_served(cp: &ControlPlane, entry: &str) -> anyhow::Result<()> {
    poll(
        Duration::from_secs(30),
        &format!("entry {entry} to skip the Pods the policy served"),
        || {
            let configuration = cp.get_json("mutatingwebhookconfiguration", None, CONFIGURATION)?;
            Ok(configuration["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|w| w["name"] == entry)
                .flat_map(|w| w["matchConditions"].as_array().into_iter().flatten())
                .any(|c| c["name"] == "not-injected-by-policy")
                .then_some(()))
        },
    )
}

/// Creates Pods with a server-side dry run (admission runs, nothing is stored) until one gets
/// the container or init container `container`; returns that Pod. Up to 30 s.
pub fn wait_injected(
    cp: &ControlPlane,
    namespace: &str,
    labels: &[&str],
    container: &str,
) -> anyhow::Result<Value> {
    static PROBES: AtomicU32 = AtomicU32::new(0);
    poll(
        Duration::from_secs(30),
        &format!("{container} to be injected in namespace {namespace}"),
        || {
            let name = format!("probe-{}", PROBES.fetch_add(1, Ordering::Relaxed));
            let mut args = kubectl_run_args(&name, namespace, labels, &[]);
            args.extend(["--dry-run=server", "-o", "json"].map(str::to_owned));
            let pod: Value = serde_json::from_str(&cp.kubectl_ok(&args)?)?;
            let has = containers(&pod).iter().any(|c| c == container)
                || init_containers(&pod).iter().any(|c| c == container);
            Ok(has.then_some(pod))
        },
    )
}

/// Waits (up to 300 s) until `injected` (a dry run that comes back injected) makes no webhook
/// call: under `auto` the webhook injects too while the policy is proven and loaded, and the
/// entries skip the Pods the policy served only once the API server runs it; under `policy`
/// the entries go once the policy serves.
pub fn wait_policy_alone(
    cp: &ControlPlane,
    mut injected: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let calls = || -> anyhow::Result<f64> {
        Ok(webhook_calls(
            &cp.kubectl_ok(&["get", "--raw", "/metrics"])?,
        ))
    };
    poll_every(
        Duration::from_secs(300),
        Duration::from_secs(1),
        "the policy injecting without a webhook call",
        || {
            let before = calls()?;
            injected()?;
            Ok((calls()? == before).then_some(()))
        },
    )
}

/// The arguments of `kubectl run NAME --image=busybox:1.36 --restart=Never -n NAMESPACE`, with
/// `--labels` and one `--annotations` per annotation when given (`key=value` each).
pub fn kubectl_run_args(
    name: &str,
    namespace: &str,
    labels: &[&str],
    annotations: &[&str],
) -> Vec<String> {
    let mut args = vec![
        "run".to_owned(),
        name.to_owned(),
        "--image=busybox:1.36".to_owned(),
        "--restart=Never".to_owned(),
        "-n".to_owned(),
        namespace.to_owned(),
    ];
    if !labels.is_empty() {
        args.push(format!("--labels={}", labels.join(",")));
    }
    args.extend(annotations.iter().map(|a| format!("--annotations={a}")));
    args
}

/// Waits (up to 30 s) for the Warning Event `Invalid` the operator publishes on SidecarTemplate
/// `name` (in namespace `default`, as the template is cluster-scoped); returns it.
pub fn wait_invalid_event(cp: &ControlPlane, name: &str) -> anyhow::Result<Value> {
    poll(
        Duration::from_secs(30),
        &format!("a Warning event Invalid on {name}"),
        || {
            Ok(cp
                .list_json("events.events.k8s.io", Some("default"), None)?
                .into_iter()
                .find(|e| {
                    e["regarding"]["name"] == name
                        && e["regarding"]["kind"] == "SidecarTemplate"
                        && e["reason"] == "Invalid"
                }))
        },
    )
}

/// The names of a MutatingWebhookConfiguration's entries.
pub fn webhook_names(configuration: &Value) -> Vec<String> {
    names(&configuration["webhooks"])
}

/// A SidecarTemplate's `Ready` condition.
pub fn ready_condition(template: &Value) -> Option<Value> {
    template["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
}

/// `status.pods` of template `name` as [injected, current, stale, missing], once the leader has
/// written them.
pub fn pod_counts(cp: &ControlPlane, name: &str) -> anyhow::Result<Option<[u64; 4]>> {
    let template = cp.get_json("sidecartemplate", None, name)?;
    let pods = &template["status"]["pods"];
    let counts = ["injected", "current", "stale", "missing"].map(|k| pods[k].as_u64());
    Ok(counts
        .iter()
        .all(Option::is_some)
        .then(|| counts.map(Option::unwrap_or_default)))
}

/// Waits (up to `timeout`) until template `name`'s `status.pods` is `want`; returns how long
/// it took.
pub fn wait_pod_counts(
    cp: &ControlPlane,
    name: &str,
    want: [u64; 4],
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut last = None;
    poll(
        timeout,
        &format!("{name}'s status.pods (injected, current, stale, missing) to be {want:?}"),
        || {
            last = pod_counts(cp, name)?;
            Ok((last == Some(want)).then_some(()))
        },
    )
    .with_context(|| format!("last seen: {last:?}"))?;
    Ok(started.elapsed())
}

/// Waits (up to `timeout`) until template `name` has the condition `type_` with `status` and
/// `reason`; returns it.
pub fn wait_condition(
    cp: &ControlPlane,
    name: &str,
    (type_, status, reason): (&str, &str, &str),
    timeout: Duration,
) -> anyhow::Result<Value> {
    poll(
        timeout,
        &format!("{name}: {type_}={status}/{reason}"),
        || {
            let template = cp.get_json("sidecartemplate", None, name)?;
            Ok(template["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_ && c["status"] == status && c["reason"] == reason)
                .cloned())
        },
    )
}

/// Whether a MutatingAdmissionPolicy serves the template `name`: its `PolicyServed` condition
/// for its current generation (the operator's `auto` backend writes one, `False` where the API
/// server serves no policies), waited for up to 30 s.
pub fn policy_served(cp: &ControlPlane, name: &str) -> anyhow::Result<bool> {
    poll(
        Duration::from_secs(30),
        &format!("{name}'s PolicyServed condition"),
        || {
            let template = cp.get_json("sidecartemplate", None, name)?;
            let generation = &template["metadata"]["generation"];
            Ok(template["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "PolicyServed" && &c["observedGeneration"] == generation)
                .map(|c| c["status"] == "True"))
        },
    )
}

/// Where the API server serves MutatingAdmissionPolicies: waits until the operator's policy
/// holds generation `generation` of the template `name` (`None`: no generation of it), as
/// its record entry `name@generation#…` says; up to 30 s. The policy follows template changes
/// a second or two after the webhook (it is proven first): a scenario that changes a template
/// and then expects new Pods to reflect it waits for this too.
pub fn wait_policy_holds(
    cp: &ControlPlane,
    name: &str,
    generation: Option<i64>,
) -> anyhow::Result<()> {
    if !cp.serves_mutating_admission_policies()? {
        return Ok(());
    }
    let needle = match generation {
        Some(generation) => format!("{name}@{generation}#"),
        None => format!("{name}@"),
    };
    poll(
        Duration::from_secs(30),
        &format!("the operator's policy to hold {needle}"),
        || {
            let text = cp
                .try_get_json("mutatingadmissionpolicy", None, "sidecar-injector")?
                .map(|policy| policy.to_string())
                .unwrap_or_default();
            Ok((text.contains(&needle) == generation.is_some()).then_some(()))
        },
    )
}
