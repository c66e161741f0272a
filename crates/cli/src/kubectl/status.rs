//! `kubectl sidecar status`, without I/O: where every Pod stands with each template in force
//! (the operator's own decision, [`injector_core::after_admission::lifecycle`]), the workloads behind the stale
//! and missing Pods and whether a rollout would restart each ([`injector_core::after_admission::workload`], the
//! rules the operator's rollouts follow), and the report as a table or as JSON.
//!
//! The counts are taken here, live, from the same Pods and Namespaces the operator's leader
//! counts (Pods being deleted left out, the operator's namespace selected by no template), so
//! they agree with the workloads listed under them; the operator's `status.pods` is shown
//! beside them when it says otherwise (it lags by up to a second, or more when the leader is
//! down).

use std::collections::{BTreeMap, BTreeSet};

use injector_api::{PodCounts, RolloutStatus, SidecarTemplate, UpdateStrategyType, WorkloadRef};
use injector_core::Snapshot;
use injector_core::after_admission::lifecycle::{
    self, PodMeta, PodState, Tally, selectable_namespaces, standing,
};
use injector_core::after_admission::workload::{
    NotRestartable, Workload, named_by_its_owner, owner_of,
};
use injector_core::registry::in_force::Observed;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Serialize, Serializer};

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
    let labels = selectable_namespaces(namespaces, operator_namespace);
    let mut live = LiveCount::default();
    for template in in_force.templates() {
        let tally = live.tallies.entry(template.name.clone()).or_default();
        let behind = live.behind.entry(template.name.clone()).or_default();
        for pod in pods.iter().filter(|p| lifecycle::counts(p)) {
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

/// What was read of the workloads behind the stale and missing Pods.
#[derive(Clone, Debug, Default)]
pub struct Lookups {
    /// The controlling owner of each ReplicaSet and Job that owns such Pods
    /// ([`owner_lookups`]); `None` when it has none or is gone.
    pub owners: BTreeMap<WorkloadRef, Option<WorkloadRef>>,
    /// What each Deployment, StatefulSet and DaemonSet behind such Pods says of a restart
    /// ([`workload_lookups`]; [`NotRestartable::Gone`] when it is not found).
    pub verdicts: BTreeMap<WorkloadRef, Option<NotRestartable>>,
}

/// The ReplicaSets and Jobs that own stale or missing Pods: their owners name the workloads
/// (a Deployment, a CronJob).
pub fn owner_lookups(live: &LiveCount<'_>) -> BTreeSet<WorkloadRef> {
    live.behind
        .values()
        .flatten()
        .filter_map(|behind| owner_of(behind.pod))
        .filter(named_by_its_owner)
        .collect()
}

/// The workloads a rollout could restart, by kind, behind stale or missing Pods (given the
/// `owners` looked up): what each says of a restart must be read.
pub fn workload_lookups(
    live: &LiveCount<'_>,
    owners: &BTreeMap<WorkloadRef, Option<WorkloadRef>>,
) -> BTreeSet<WorkloadRef> {
    live.behind
        .values()
        .flatten()
        .filter_map(|behind| by_kind(behind.pod, owners).restartable().cloned())
        .collect()
}

/// The workload behind `pod`, judged by kind alone.
fn by_kind(pod: &ObjectMeta, owners: &BTreeMap<WorkloadRef, Option<WorkloadRef>>) -> Workload {
    Workload::of_pod(pod, |owner| owners.get(owner).cloned().flatten())
}

/// The workload behind `pod` and whether a rollout restarts it: by kind, through its owner
/// looked up, then by what the workload says (one not read counts as gone).
pub fn workload_of(pod: &ObjectMeta, lookups: &Lookups) -> Workload {
    let workload = by_kind(pod, &lookups.owners);
    let verdict = lookups
        .verdicts
        .get(&workload.reference)
        .copied()
        .unwrap_or(Some(NotRestartable::Gone));
    workload.judged(verdict)
}

/// `kind/name`, as kubectl names objects.
pub fn kubectl_name(workload: &WorkloadRef) -> String {
    format!("{}/{}", workload.kind.to_lowercase(), workload.name)
}

/// A workload and its Pods that do not carry a template's current version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPods {
    /// The workload: `Deployment`, `StatefulSet`, `DaemonSet`; or what stands for one no
    /// rollout restarts: `Pod` (a bare Pod), `Job`, `CronJob`, `ReplicaSet` (without a
    /// Deployment) or another owner's kind.
    #[serde(flatten)]
    pub workload: WorkloadRef,
    /// Why no rollout restarts it, when none does: its Pods get the change only when created
    /// again by whoever creates them (a CronJob's next Jobs, a person).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_reason"
    )]
    pub not_restartable: Option<NotRestartable>,
    /// Its Pods that carry an earlier version.
    pub stale: Vec<String>,
    /// Its Pods the template selects that do not carry it.
    pub missing: Vec<String>,
}

/// A reason why a workload is not restartable, in its words.
fn serialize_reason<S: Serializer>(
    why: &Option<NotRestartable>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match why {
        Some(why) => serializer.serialize_str(why.as_str()),
        None => serializer.serialize_none(),
    }
}

/// Groups `behind` by workload: restartable workloads first, then by kind, namespace and
/// name; Pod names sorted.
pub fn group_by_workload(behind: &[Behind<'_>], lookups: &Lookups) -> Vec<WorkloadPods> {
    type Group = (Vec<String>, Vec<String>);
    let mut groups: BTreeMap<(bool, WorkloadRef, Option<NotRestartable>), Group> = BTreeMap::new();
    for entry in behind {
        let workload = workload_of(entry.pod, lookups);
        let key = (
            workload.not_restartable.is_some(),
            workload.reference,
            workload.not_restartable,
        );
        let (stale, missing) = groups.entry(key).or_default();
        let name = entry.pod.name.clone().unwrap_or_default();
        match entry.state {
            PodState::Missing => missing.push(name),
            PodState::Stale { .. } | PodState::Current => stale.push(name),
        }
    }
    groups
        .into_iter()
        .map(
            |((_, workload, not_restartable), (mut stale, mut missing))| {
                stale.sort();
                missing.sort();
                WorkloadPods {
                    workload,
                    not_restartable,
                    stale,
                    missing,
                }
            },
        )
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
/// gave, as the operator's sync does), the live count and the workloads looked up.
pub fn report(
    templates: &[SidecarTemplate],
    observed: &BTreeMap<String, Observed>,
    live: &LiveCount<'_>,
    lookups: &Lookups,
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
            let generation_in_force = observed.get(&name).and_then(Observed::generation_in_force);
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
                    .map(|b| group_by_workload(b, lookups))
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
                kubectl_name(&group.workload),
                group
                    .not_restartable
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
mod tests;
