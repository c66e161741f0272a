//! `kubectl sidecar status`, without I/O: where every Pod stands with each template in force
//! (the operator's own decision, [`injector_core::lifecycle`]), the workloads behind the stale
//! and missing Pods, and the report as a table or as JSON.
//!
//! The counts are taken here, live, from the same Pods and Namespaces the operator's leader
//! counts (Pods being deleted left out, the operator's namespace selected by no template), so
//! they agree with the workloads listed under them; the operator's `status.pods` is shown
//! beside them when it says otherwise (it lags by up to a second, or more when the leader is
//! down).

use std::collections::{BTreeMap, BTreeSet};

use injector_api::{PodCounts, RolloutStatus, SidecarTemplate, UpdateStrategyType};
use injector_core::Snapshot;
use injector_core::in_force::Observed;
use injector_core::lifecycle::{PodMeta, PodState, Tally, standing};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;

use super::table::Table;

/// Where the Pods stand with each template in force, counted now.
#[derive(Debug, Default)]
pub struct LiveCount<'p> {
    /// How many Pods stand where, by template name.
    pub tallies: BTreeMap<String, Tally>,
    /// The stale and missing Pods, by template name.
    pub behind: BTreeMap<String, Vec<Behind<'p>>>,
}

/// A Pod that does not carry a template's current version.
#[derive(Clone, Copy, Debug)]
pub struct Behind<'p> {
    /// The Pod's metadata.
    pub pod: &'p ObjectMeta,
    /// Stale or missing.
    pub state: PodState,
}

/// Counts `pods` against the templates of `in_force`, as the operator's census does: a Pod
/// being deleted is left out, and in `operator_namespace` (or a namespace not listed) a Pod
/// counts only for what it carries.
pub fn count<'p>(
    in_force: &Snapshot,
    pods: &'p [ObjectMeta],
    namespaces: &[ObjectMeta],
    operator_namespace: &str,
) -> LiveCount<'p> {
    let empty = BTreeMap::new();
    let labels: BTreeMap<&str, &BTreeMap<String, String>> = namespaces
        .iter()
        .filter_map(|ns| Some((ns.name.as_deref()?, ns.labels.as_ref().unwrap_or(&empty))))
        .filter(|(name, _)| *name != operator_namespace)
        .collect();
    let mut live = LiveCount::default();
    for template in in_force.templates() {
        let tally = live.tallies.entry(template.name.clone()).or_default();
        let behind = live.behind.entry(template.name.clone()).or_default();
        for pod in pods.iter().filter(|p| p.deletion_timestamp.is_none()) {
            let meta = PodMeta::of(pod);
            let Some(state) = standing(template, &meta, labels.get(meta.namespace).copied()) else {
                continue;
            };
            tally.add(state);
            if state != PodState::Current {
                behind.push(Behind { pod, state });
            }
        }
    }
    live
}

/// An object by namespace, kind and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Its namespace.
    pub namespace: String,
    /// Its kind.
    pub kind: String,
    /// Its name.
    pub name: String,
}

/// The controller owner (kind, name) of each ReplicaSet and Job looked up, by its key; `None`
/// for one that has none or is gone.
pub type Owners = BTreeMap<ObjectKey, Option<(String, String)>>;

/// The ReplicaSets and Jobs that own stale or missing Pods: whose owner must be looked up to
/// name the workload (a Deployment, a CronJob).
pub fn owner_lookups(live: &LiveCount<'_>) -> BTreeSet<ObjectKey> {
    live.behind
        .values()
        .flatten()
        .filter_map(|behind| {
            let (kind, name) = controller(behind.pod)?;
            matches!(kind, "ReplicaSet" | "Job").then(|| ObjectKey {
                namespace: behind.pod.namespace.clone().unwrap_or_default(),
                kind: kind.to_owned(),
                name: name.to_owned(),
            })
        })
        .collect()
}

/// The controller owner of an object, from its owner references.
pub fn controller(meta: &ObjectMeta) -> Option<(&str, &str)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner: &&OwnerReference| owner.controller == Some(true))
        .map(|owner| (owner.kind.as_str(), owner.name.as_str()))
}

/// The workload behind a Pod: what a rollout would restart, or why none can.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// `Deployment`, `StatefulSet`, `DaemonSet`; or, not restartable, `Pod` (a bare Pod),
    /// `Job`, `CronJob`, `ReplicaSet` (without a Deployment) or another owner's kind.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Why no rollout restarts it, when none does (`bare Pod`, `Job`, `CronJob`, `no
    /// Deployment`, `kind not restartable`): its Pods get the change only when created again by
    /// whoever creates them (a CronJob's next Jobs, a person).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_restartable: Option<String>,
}

impl Workload {
    /// `kind/name`, as kubectl names objects.
    pub fn reference(&self) -> String {
        format!("{}/{}", self.kind.to_lowercase(), self.name)
    }
}

/// Why a workload of a kind rollouts do not restart (only Deployments, StatefulSets and
/// DaemonSets) is not restartable.
const NOT_RESTARTABLE_KIND: &str = "kind not restartable";

/// The workload behind `pod`, through its controller owner and, for a ReplicaSet or a Job, that
/// one's owner in `owners`.
pub fn workload_of(pod: &ObjectMeta, owners: &Owners) -> Workload {
    let namespace = pod.namespace.clone().unwrap_or_default();
    let make = |kind: &str, name: &str, why: Option<&str>| Workload {
        kind: kind.to_owned(),
        namespace: namespace.clone(),
        name: name.to_owned(),
        not_restartable: why.map(str::to_owned),
    };
    let Some((kind, name)) = controller(pod) else {
        return make(
            "Pod",
            pod.name.as_deref().unwrap_or_default(),
            Some("bare Pod"),
        );
    };
    let owner_of = |kind: &str| {
        owners
            .get(&ObjectKey {
                namespace: namespace.clone(),
                kind: kind.to_owned(),
                name: name.to_owned(),
            })
            .cloned()
            .flatten()
    };
    match kind {
        "StatefulSet" | "DaemonSet" => make(kind, name, None),
        "ReplicaSet" => match owner_of(kind) {
            Some((owner, owner_name)) if owner == "Deployment" => make(&owner, &owner_name, None),
            Some((owner, owner_name)) => make(&owner, &owner_name, Some(NOT_RESTARTABLE_KIND)),
            None => make(kind, name, Some("no Deployment")),
        },
        "Job" => match owner_of(kind) {
            Some((owner, owner_name)) if owner == "CronJob" => {
                make(&owner, &owner_name, Some("CronJob"))
            }
            Some((owner, owner_name)) => make(&owner, &owner_name, Some(NOT_RESTARTABLE_KIND)),
            None => make(kind, name, Some("Job")),
        },
        _ => make(kind, name, Some(NOT_RESTARTABLE_KIND)),
    }
}

/// A workload and its Pods that do not carry a template's current version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPods {
    /// The workload.
    #[serde(flatten)]
    pub workload: Workload,
    /// Its Pods that carry an earlier version.
    pub stale: Vec<String>,
    /// Its Pods the template selects that do not carry it.
    pub missing: Vec<String>,
}

/// Groups `behind` by workload: restartable workloads first, then by namespace, kind and name;
/// Pod names sorted.
pub fn group_by_workload(behind: &[Behind<'_>], owners: &Owners) -> Vec<WorkloadPods> {
    let mut groups: BTreeMap<(bool, Workload), (Vec<String>, Vec<String>)> = BTreeMap::new();
    for entry in behind {
        let workload = workload_of(entry.pod, owners);
        let (stale, missing) = groups
            .entry((workload.not_restartable.is_some(), workload))
            .or_default();
        let name = entry.pod.name.clone().unwrap_or_default();
        match entry.state {
            PodState::Missing => missing.push(name),
            PodState::Stale { .. } | PodState::Current => stale.push(name),
        }
    }
    groups
        .into_iter()
        .map(|((_, workload), (mut stale, mut missing))| {
            stale.sort();
            missing.sort();
            WorkloadPods {
                workload,
                stale,
                missing,
            }
        })
        .collect()
}

/// A template's `Ready` condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// What `status` reports of one template.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateStatus {
    /// The template's name.
    pub name: String,
    /// Its `Ready` condition, once the operator wrote one.
    pub ready: Option<Ready>,
    /// The generation the operator keeps in force, `None` when it keeps none (invalid).
    pub generation_in_force: Option<i64>,
    /// `OnCreate` or `RollingRestart`.
    pub update_strategy: &'static str,
    /// The counts taken now; `None` when the template is not in force.
    pub pods: Option<PodCounts>,
    /// The counts the operator last wrote (`status.pods`).
    pub status_pods: Option<PodCounts>,
    /// The operator's `status.rollout`.
    pub rollout: Option<RolloutStatus>,
    /// The workloads behind the stale and missing Pods.
    pub workloads: Vec<WorkloadPods>,
}

/// What `status` prints: every template asked for, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatusReport {
    /// The templates.
    pub templates: Vec<TemplateStatus>,
}

/// The report of `templates` (as listed, with their status), `observed` (what compiling them
/// gave, as the operator's sync does), the live count and the owners looked up.
pub fn report(
    templates: &[SidecarTemplate],
    observed: &BTreeMap<String, Observed>,
    live: &LiveCount<'_>,
    owners: &Owners,
) -> StatusReport {
    let mut rows: Vec<TemplateStatus> = templates
        .iter()
        .map(|template| {
            let name = template.metadata.name.clone().unwrap_or_default();
            let status = template.status.as_ref();
            let ready = status
                .into_iter()
                .flat_map(|s| &s.conditions)
                .find(|c| c.type_ == "Ready")
                .map(|c| Ready {
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                });
            let generation_in_force = observed.get(&name).and_then(|o| match &o.outcome {
                Ok(_) => o.template.metadata.generation,
                Err(_) => o.kept.as_ref().map(|k| k.generation),
            });
            let in_force = generation_in_force.is_some();
            let strategy = template
                .spec
                .update_strategy
                .as_ref()
                .map_or(UpdateStrategyType::OnCreate, |s| s.type_);
            TemplateStatus {
                pods: live
                    .tallies
                    .get(&name)
                    .filter(|_| in_force)
                    .map(|t| PodCounts::from(*t)),
                workloads: live
                    .behind
                    .get(&name)
                    .filter(|_| in_force)
                    .map(|b| group_by_workload(b, owners))
                    .unwrap_or_default(),
                name,
                ready,
                generation_in_force,
                update_strategy: strategy.as_str(),
                status_pods: status.and_then(|s| s.pods),
                rollout: status.and_then(|s| s.rollout.clone()),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    StatusReport { templates: rows }
}

/// The report as kubectl would print it: one table of the templates, then, per template with
/// stale or missing Pods, the workloads behind them.
pub fn to_table(report: &StatusReport) -> String {
    if report.templates.is_empty() {
        return "No SidecarTemplates found.\n".to_owned();
    }
    let mut table = Table::new([
        "TEMPLATE", "READY", "STRATEGY", "INJECTED", "CURRENT", "STALE", "MISSING", "ROLLOUT",
    ]);
    for template in &report.templates {
        let count = |pick: fn(&PodCounts) -> u32| {
            template
                .pods
                .as_ref()
                .map_or_else(|| "-".to_owned(), |p| pick(p).to_string())
        };
        table.row([
            template.name.clone(),
            template.ready.as_ref().map_or_else(
                || "-".to_owned(),
                |r| match r.status.as_str() {
                    "True" => r.status.clone(),
                    _ => format!("{} ({})", r.status, r.reason),
                },
            ),
            template.update_strategy.to_owned(),
            count(|p| p.injected),
            count(|p| p.current),
            count(|p| p.stale),
            count(|p| p.missing),
            template
                .rollout
                .as_ref()
                .map_or_else(|| "-".to_owned(), |r| r.state.clone()),
        ]);
    }
    let mut out = table.render();
    for template in &report.templates {
        out.push_str(&details(template));
    }
    out
}

/// What the table's row of `template` leaves out: a count the operator wrote that differs,
/// its rollout, and the workloads behind its stale and missing Pods.
fn details(template: &TemplateStatus) -> String {
    let mut lines = Vec::new();
    match (template.pods, template.status_pods) {
        (None, _) => lines.push(
            "not in force (invalid, no earlier generation kept): no Pod is counted".to_owned(),
        ),
        (Some(live), Some(written)) if live != written => lines.push(format!(
            "the operator's status.pods differs (injected {}, current {}, stale {}, missing {}): \
             it counts at most once a second, and only while it has a leader; the table counts now",
            written.injected, written.current, written.stale, written.missing
        )),
        (Some(_), None) => lines.push(
            "no status.pods from the operator yet (is it running, with a leader?)".to_owned(),
        ),
        (Some(_), Some(_)) => {}
    }
    if let Some(rollout) = &template.rollout {
        let mut line = format!("rollout {}", rollout.state);
        if !rollout.restarting.is_empty() {
            let restarting: Vec<String> =
                rollout.restarting.iter().map(|w| w.to_string()).collect();
            line.push_str(&format!("; restarting {}", restarting.join(", ")));
        }
        if !rollout.updating.is_empty() {
            line.push_str(&format!(
                "; updating in place {}",
                rollout.updating.join(", ")
            ));
        }
        line.push_str(&format!(
            "; {} waiting; {} Pods not restartable",
            rollout.waiting, rollout.not_restartable
        ));
        if let Some(message) = &rollout.message {
            line.push_str(&format!(": {message}"));
        }
        lines.push(line);
    }
    let mut out = String::new();
    if lines.is_empty() && template.workloads.is_empty() {
        return out;
    }
    out.push_str(&format!("\n{}:\n", template.name));
    for line in lines {
        out.push_str(&format!("  {line}\n"));
    }
    if !template.workloads.is_empty() {
        let mut table = Table::new([
            "NAMESPACE",
            "WORKLOAD",
            "RESTARTABLE",
            "STALE",
            "MISSING",
            "PODS",
        ]);
        for group in &template.workloads {
            let pods: Vec<&str> = group
                .stale
                .iter()
                .chain(&group.missing)
                .map(String::as_str)
                .collect();
            table.row([
                group.workload.namespace.clone(),
                group.workload.reference(),
                group
                    .workload
                    .not_restartable
                    .as_ref()
                    .map_or_else(|| "yes".to_owned(), |why| format!("no: {why}")),
                group.stale.len().to_string(),
                group.missing.len().to_string(),
                pods.join(","),
            ]);
        }
        for line in table.render().lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// The report as JSON, for scripts.
pub fn to_json(report: &StatusReport) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(report).map(|text| text + "\n")
}

#[cfg(test)]
#[path = "status/tests.rs"]
mod tests;
