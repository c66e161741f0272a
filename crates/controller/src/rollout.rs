//! The leader's rollouts (`updateStrategy: RollingRestart`): the workloads that own a
//! template's stale or missing Pods are restarted, a few at a time, the way
//! `kubectl rollout restart` does (an annotation on the Pod template), each once per version
//! of what the template injects.
//!
//! The decision is [`injector_core::rollout::next_restarts`]; this module finds the workloads
//! behind the census's Pods (a ReplicaSet resolves to its Deployment), reads where each one's
//! rollout stands, asks the API server whether the operator may restart workloads at all
//! (a `SelfSubjectAccessReview`: the chart grants it only with `rollouts.enabled`), and makes
//! the restarts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use injector_api::names::{
    RESTARTED_AT_ANNOTATION, RESTARTED_FOR_ANNOTATION, ROLLOUT_ANNOTATION, ROLLOUT_DISABLED,
};
use injector_api::{RolloutStatus, UpdateStrategyType, WorkloadRef};
use injector_core::CompiledTemplate;
use injector_core::lifecycle::{PodMeta, PodState, carried};
use injector_core::rollout::{
    WorkloadState, in_place_patch, max_unavailable, next_restarts, restarted_for,
    restarted_for_entry, states, updated_in_place, with_restarted_for,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use tokio::time::Instant;

use crate::census::{Counted, PodOwner, PodView, owner_of};

/// How long a permission check is trusted.
const PERMISSION_TTL: Duration = Duration::from_secs(60);

/// What a round decided, by template name (templates with `RollingRestart` only).
pub type Rollouts = BTreeMap<String, RolloutStatus>;

/// What is known of a workload's rollout, read from the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadView {
    /// Annotated `sidecar.dev/rollout: disabled`, or updated only on delete (a restart would
    /// not replace its Pods).
    pub not_restartable: bool,
    /// Its `sidecar.dev/restarted-for` annotation.
    pub restarted_for: Option<String>,
    /// Every replica updated and available.
    pub complete: bool,
    /// Counts that grow as its rollout progresses: a change is progress.
    pub progress: [i64; 4],
    /// Its resourceVersion, so that a restart does not overwrite a change made meanwhile.
    pub resource_version: Option<String>,
}

/// Whether `template` is rolled out in place where it can be.
fn in_place(template: &CompiledTemplate) -> bool {
    template.update_strategy.type_ == UpdateStrategyType::InPlace
}

/// Whether `pod` is Ready.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Reads `annotations` for the opt-out and the restart record.
fn annotations_of(meta: &ObjectMeta) -> (bool, Option<String>) {
    let annotations = meta.annotations.as_ref();
    let opted_out = annotations
        .and_then(|a| a.get(ROLLOUT_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(ROLLOUT_DISABLED));
    let restarted = annotations
        .and_then(|a| a.get(RESTARTED_FOR_ANNOTATION))
        .cloned();
    (opted_out, restarted)
}

/// Where a Deployment's rollout stands (as `kubectl rollout status` judges it).
pub fn deployment_view(deployment: &Deployment) -> WorkloadView {
    let (opted_out, restarted_for) = annotations_of(&deployment.metadata);
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let generation = deployment.metadata.generation.unwrap_or_default();
    let observed = status.observed_generation.unwrap_or_default();
    let updated = i64::from(status.updated_replicas.unwrap_or_default());
    let replicas = i64::from(status.replicas.unwrap_or_default());
    let available = i64::from(status.available_replicas.unwrap_or_default());
    let ready = i64::from(status.ready_replicas.unwrap_or_default());
    let complete = observed >= generation
        && updated >= i64::from(wanted)
        && replicas == updated
        && available >= updated;
    WorkloadView {
        not_restartable: opted_out,
        restarted_for,
        complete,
        progress: [observed, updated, ready, available],
        resource_version: deployment.metadata.resource_version.clone(),
    }
}

/// Where a StatefulSet's rollout stands. One updated only on delete is not restartable.
pub fn stateful_set_view(set: &StatefulSet) -> WorkloadView {
    let (opted_out, restarted_for) = annotations_of(&set.metadata);
    let spec = set.spec.clone().unwrap_or_default();
    let on_delete = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        == Some("OnDelete");
    let wanted = i64::from(spec.replicas.unwrap_or(1));
    let status = set.status.clone().unwrap_or_default();
    let generation = set.metadata.generation.unwrap_or_default();
    let observed = status.observed_generation.unwrap_or_default();
    let updated = i64::from(status.updated_replicas.unwrap_or_default());
    let ready = i64::from(status.ready_replicas.unwrap_or_default());
    let available = i64::from(status.available_replicas.unwrap_or_default());
    let complete = observed >= generation
        && updated >= wanted
        && ready >= wanted
        && status.update_revision.is_some()
        && status.current_revision == status.update_revision;
    WorkloadView {
        not_restartable: opted_out || on_delete,
        restarted_for,
        complete,
        progress: [observed, updated, ready, available],
        resource_version: set.metadata.resource_version.clone(),
    }
}

/// Where a DaemonSet's rollout stands. One updated only on delete is not restartable.
pub fn daemon_set_view(set: &DaemonSet) -> WorkloadView {
    let (opted_out, restarted_for) = annotations_of(&set.metadata);
    let on_delete = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("OnDelete");
    let status = set.status.clone().unwrap_or_default();
    let generation = set.metadata.generation.unwrap_or_default();
    let observed = status.observed_generation.unwrap_or_default();
    let desired = i64::from(status.desired_number_scheduled);
    let updated = i64::from(status.updated_number_scheduled.unwrap_or_default());
    let ready = i64::from(status.number_ready);
    let available = i64::from(status.number_available.unwrap_or_default());
    let complete = observed >= generation && updated >= desired && available >= desired;
    WorkloadView {
        not_restartable: opted_out || on_delete,
        restarted_for,
        complete,
        progress: [observed, updated, ready, available],
        resource_version: set.metadata.resource_version.clone(),
    }
}

/// The merge patch that restarts a workload for `entry` (`template#fingerprint`) at `now`.
pub fn restart_patch(view: &WorkloadView, entry: &str, now: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": view.resource_version,
            "annotations": {
                RESTARTED_FOR_ANNOTATION: with_restarted_for(view.restarted_for.as_deref(), entry),
            },
        },
        "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: now}}}},
    })
}

/// Why an API call of a rollout failed.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// The leader's rollout state across rounds.
pub struct RolloutDriver {
    client: Client,
    /// Each ReplicaSet's Deployment (`None`: it has none), as last resolved.
    replica_sets: HashMap<(String, String), Option<String>>,
    /// Each restarting workload's last progress counts, and when they last changed.
    progress: HashMap<WorkloadRef, ([i64; 4], Instant)>,
    /// Whether the operator may restart workloads (and, second, update Pods in place), and
    /// when that was asked.
    permitted: Option<(bool, Result<(), String>, Instant)>,
    /// `InPlace`: the Pods each template updated and that are not done yet.
    in_flight: HashMap<String, BTreeSet<(String, String)>>,
}

impl RolloutDriver {
    /// A driver with nothing known yet (a new leader's term).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            replica_sets: HashMap::new(),
            progress: HashMap::new(),
            permitted: None,
            in_flight: HashMap::new(),
        }
    }

    /// One round over every template with `RollingRestart` or `InPlace`: what each one's
    /// rollout says, and the restarts and updates it calls for, made. `on_restart` hears of
    /// each restart made.
    pub async fn round(
        &mut self,
        templates: &[std::sync::Arc<CompiledTemplate>],
        counted: &Counted,
        mut on_restart: impl FnMut(&CompiledTemplate, &WorkloadRef),
    ) -> Rollouts {
        let mut rollouts = Rollouts::new();
        let rolling: Vec<&CompiledTemplate> = templates
            .iter()
            .map(AsRef::as_ref)
            .filter(|t| t.update_strategy.type_ != UpdateStrategyType::OnCreate)
            .collect();
        self.in_flight
            .retain(|name, _| rolling.iter().any(|t| &t.name == name && in_place(t)));
        if rolling.is_empty() {
            self.progress.clear();
            return rollouts;
        }
        let permitted = self.permitted(rolling.iter().any(|t| in_place(t))).await;
        let mut seen = Vec::new();
        for template in rolling {
            // Without the permission, not even the ReplicaSets are read (they would be refused).
            let status = match &permitted {
                Err(why) => RolloutStatus {
                    state: states::FORBIDDEN.to_owned(),
                    message: Some(why.clone()),
                    ..RolloutStatus::default()
                },
                Ok(()) => {
                    self.rollout(template, counted, &mut seen, &mut on_restart)
                        .await
                }
            };
            rollouts.insert(template.name.clone(), status);
        }
        self.progress.retain(|workload, _| seen.contains(workload));
        rollouts
    }

    /// One template's round: its Pods updated in place (`InPlace`, when only images changed),
    /// and the restarts of the workloads behind the rest.
    async fn rollout(
        &mut self,
        template: &CompiledTemplate,
        counted: &Counted,
        seen: &mut Vec<WorkloadRef>,
        on_restart: &mut impl FnMut(&CompiledTemplate, &WorkloadRef),
    ) -> RolloutStatus {
        let census = counted.census.get(&template.name);
        let mut behind = census.map(|c| c.behind.clone()).unwrap_or_default();
        let mut updating = Vec::new();
        if in_place(template) {
            // The Pods stale only in images are this round's to update, not to restart...
            for (owner, pods) in census.map(|c| &c.in_place).into_iter().flatten() {
                if let Some(count) = behind.get_mut(owner) {
                    *count = count.saturating_sub(*pods);
                }
            }
            behind.retain(|_, count| *count > 0);
            let carrying = census.map_or(0, |c| c.tally.injected());
            let (now_updating, not_in_place) = self
                .update_in_place(template, &counted.pods, carrying)
                .await;
            updating = now_updating;
            // ...unless they cannot be: those are restarted.
            for owner in not_in_place {
                *behind.entry(owner).or_default() += 1;
            }
        }
        let (workloads, not_restartable) = self.workloads_behind(&behind).await;
        let entry = restarted_for_entry(&template.name, &template.fingerprint.to_string());
        let mut states = Vec::new();
        let mut views = HashMap::new();
        for (workload, pods) in workloads {
            let view = match self.view(&workload).await {
                Ok(Some(view)) => view,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(template = %template.name, %workload, %error, "reading a workload for its rollout failed");
                    continue;
                }
            };
            let restarted = restarted_for(view.restarted_for.as_deref(), &entry);
            let since_progress =
                self.since_progress(&workload, view.progress, restarted && !view.complete);
            seen.push(workload.clone());
            states.push(WorkloadState {
                workload: workload.clone(),
                opted_out: view.not_restartable,
                restarted,
                complete: view.complete,
                since_progress,
                pods,
            });
            views.insert(workload, view);
        }
        let decision = next_restarts(&template.update_strategy, &states, not_restartable);
        let mut status = decision.status;
        for workload in decision.restart {
            let Some(view) = views.get(&workload) else {
                continue;
            };
            match self.restart(&workload, view, &entry).await {
                Ok(()) => {
                    tracing::info!(template = %template.name, %workload, "restarted for the template's new version");
                    self.progress
                        .insert(workload.clone(), (view.progress, Instant::now()));
                    on_restart(template, &workload);
                }
                Err(error) => {
                    tracing::warn!(template = %template.name, %workload, %error, "restarting a workload failed; trying again next round");
                    status.restarting.retain(|w| w != &workload);
                    status.waiting += 1;
                }
            }
        }
        if !updating.is_empty() && status.state == states::COMPLETE {
            status.state = states::PROGRESSING.to_owned();
        }
        status.updating = updating;
        status
    }

    /// `InPlace`: the Pods of `pods` that carry an earlier version of `template` differing only
    /// in images get its images, at most `maxUnavailable` (of the `carrying` Pods) not Ready
    /// at once: the ones updated and not done yet, and the stale ones found not Ready. Returns
    /// the Pods being updated (`namespace/name`) and the owners of those that cannot be
    /// updated in place.
    async fn update_in_place(
        &mut self,
        template: &CompiledTemplate,
        pods: &PodView,
        carrying: u32,
    ) -> (Vec<String>, Vec<Option<PodOwner>>) {
        let mut in_flight = self.in_flight.remove(&template.name).unwrap_or_default();
        // Done (new images running, Ready) or gone: no longer in flight.
        let mut still = BTreeSet::new();
        for (namespace, name) in in_flight {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            match api.get_opt(&name).await {
                Ok(Some(pod))
                    if pod.metadata.deletion_timestamp.is_none()
                        && !updated_in_place(template, &pod) =>
                {
                    still.insert((namespace, name));
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(pod = %name, %namespace, %error, "reading a Pod updated in place failed");
                    still.insert((namespace, name));
                }
            }
        }
        in_flight = still;
        let budget =
            max_unavailable(template.update_strategy.max_unavailable.as_ref(), carrying) as usize;
        let mut unavailable = in_flight.len();
        let mut not_in_place = Vec::new();
        let mut candidates: Vec<_> = pods
            .state()
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter(|pod| {
                let empty = BTreeMap::new();
                let meta = PodMeta {
                    namespace: pod.metadata.namespace.as_deref().unwrap_or_default(),
                    labels: pod.metadata.labels.as_ref().unwrap_or(&empty),
                    annotations: pod.metadata.annotations.as_ref().unwrap_or(&empty),
                };
                carried(template, &meta) == Some(PodState::Stale { in_place: true })
            })
            .collect();
        candidates.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        for candidate in candidates {
            if unavailable >= budget {
                break;
            }
            let (Some(namespace), Some(name)) =
                (&candidate.metadata.namespace, &candidate.metadata.name)
            else {
                continue;
            };
            let key = (namespace.clone(), name.clone());
            if in_flight.contains(&key) {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let pod = match api.get_opt(name).await {
                Ok(Some(pod)) => pod,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(pod = %name, %namespace, %error, "reading a Pod to update in place failed");
                    continue;
                }
            };
            if !is_ready(&pod) {
                // Not Ready already: it counts against the budget, and waits.
                unavailable += 1;
                continue;
            }
            let Some(patch) = in_place_patch(template, &pod) else {
                not_in_place.push(owner_of(&candidate.metadata));
                continue;
            };
            match api
                .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(template = %template.name, pod = %name, %namespace, "images updated in place");
                    in_flight.insert(key);
                    unavailable += 1;
                }
                Err(error) => {
                    tracing::warn!(template = %template.name, pod = %name, %namespace, %error, "updating a Pod's images failed; trying again next round");
                }
            }
        }
        let updating = in_flight
            .iter()
            .map(|(namespace, name)| format!("{namespace}/{name}"))
            .collect();
        self.in_flight.insert(template.name.clone(), in_flight);
        (updating, not_in_place)
    }

    /// How long since `workload`'s rollout last made progress (zero when it is not
    /// restarting).
    fn since_progress(
        &mut self,
        workload: &WorkloadRef,
        progress: [i64; 4],
        restarting: bool,
    ) -> Duration {
        let now = Instant::now();
        if !restarting {
            self.progress.remove(workload);
            return Duration::ZERO;
        }
        let (last, at) = self
            .progress
            .entry(workload.clone())
            .or_insert((progress, now));
        if *last != progress {
            *last = progress;
            *at = now;
        }
        now.duration_since(*at)
    }

    /// The workloads behind `behind`'s owners, with their stale or missing Pods, and how many
    /// such Pods have no restartable owner.
    async fn workloads_behind(
        &mut self,
        behind: &BTreeMap<Option<PodOwner>, u32>,
    ) -> (BTreeMap<WorkloadRef, u32>, u32) {
        let mut workloads: BTreeMap<WorkloadRef, u32> = BTreeMap::new();
        let mut not_restartable = 0;
        for (owner, &pods) in behind {
            match self.workload_of(owner.as_ref()).await {
                Some(workload) => *workloads.entry(workload).or_default() += pods,
                None => not_restartable += pods,
            }
        }
        (workloads, not_restartable)
    }

    /// The restartable workload that owns Pods owned by `owner`, if any.
    async fn workload_of(&mut self, owner: Option<&PodOwner>) -> Option<WorkloadRef> {
        let owner = owner?;
        let workload = |kind: &str, name: String| WorkloadRef {
            kind: kind.to_owned(),
            namespace: owner.namespace.clone(),
            name,
        };
        match owner.kind.as_str() {
            "StatefulSet" | "DaemonSet" => Some(workload(&owner.kind, owner.name.clone())),
            "ReplicaSet" => {
                let key = (owner.namespace.clone(), owner.name.clone());
                if let Some(deployment) = self.replica_sets.get(&key) {
                    return deployment.clone().map(|name| workload("Deployment", name));
                }
                let api: Api<PartialObjectMeta<ReplicaSet>> =
                    Api::namespaced(self.client.clone(), &owner.namespace);
                let deployment = match api.get_metadata_opt(&owner.name).await {
                    Ok(found) => found.and_then(|rs| {
                        rs.metadata
                            .owner_references?
                            .into_iter()
                            .find(|o| o.controller == Some(true) && o.kind == "Deployment")
                            .map(|o| o.name)
                    }),
                    Err(error) => {
                        tracing::warn!(namespace = %owner.namespace, replica_set = %owner.name, %error, "reading a ReplicaSet's owner failed");
                        return None;
                    }
                };
                self.replica_sets.insert(key, deployment.clone());
                deployment.map(|name| workload("Deployment", name))
            }
            _ => None,
        }
    }

    /// Reads `workload`; `None` when it is gone.
    async fn view(&self, workload: &WorkloadRef) -> Result<Option<WorkloadView>, RolloutError> {
        let client = self.client.clone();
        let ns = &workload.namespace;
        Ok(match workload.kind.as_str() {
            "Deployment" => Api::<Deployment>::namespaced(client, ns)
                .get_opt(&workload.name)
                .await?
                .map(|d| deployment_view(&d)),
            "StatefulSet" => Api::<StatefulSet>::namespaced(client, ns)
                .get_opt(&workload.name)
                .await?
                .map(|s| stateful_set_view(&s)),
            "DaemonSet" => Api::<DaemonSet>::namespaced(client, ns)
                .get_opt(&workload.name)
                .await?
                .map(|d| daemon_set_view(&d)),
            _ => None,
        })
    }

    /// Restarts `workload` for `entry`.
    async fn restart(
        &self,
        workload: &WorkloadRef,
        view: &WorkloadView,
        entry: &str,
    ) -> Result<(), RolloutError> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = Patch::Merge(restart_patch(view, entry, &now));
        let params = PatchParams::default();
        let client = self.client.clone();
        let ns = &workload.namespace;
        match workload.kind.as_str() {
            "Deployment" => {
                Api::<Deployment>::namespaced(client, ns)
                    .patch(&workload.name, &params, &patch)
                    .await?;
            }
            "StatefulSet" => {
                Api::<StatefulSet>::namespaced(client, ns)
                    .patch(&workload.name, &params, &patch)
                    .await?;
            }
            "DaemonSet" => {
                Api::<DaemonSet>::namespaced(client, ns)
                    .patch(&workload.name, &params, &patch)
                    .await?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the operator may restart workloads (and update Pods, with `pods`): asked of
    /// the API server at most once per [`PERMISSION_TTL`]; `Err` says what it may not do.
    async fn permitted(&mut self, pods: bool) -> Result<(), String> {
        if let Some((asked_pods, answer, at)) = &self.permitted
            && at.elapsed() < PERMISSION_TTL
            && *asked_pods == pods
        {
            return answer.clone();
        }
        let answer = self.ask_permission(pods).await;
        self.permitted = Some((pods, answer.clone(), Instant::now()));
        answer
    }

    async fn ask_permission(&self, pods: bool) -> Result<(), String> {
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let mut needed = vec![
            ("apps", "patch", "deployments"),
            ("apps", "patch", "statefulsets"),
            ("apps", "patch", "daemonsets"),
            ("apps", "get", "deployments"),
            ("apps", "get", "statefulsets"),
            ("apps", "get", "daemonsets"),
            ("apps", "get", "replicasets"),
        ];
        if pods {
            needed.extend([("", "get", "pods"), ("", "patch", "pods")]);
        }
        let mut refused = Vec::new();
        for &(group, verb, resource) in &needed {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(group.to_owned()),
                        resource: Some(resource.to_owned()),
                        verb: Some(verb.to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            match api.create(&PostParams::default(), &review).await {
                Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
                Ok(_) if group.is_empty() => refused.push(format!("{verb} {resource}")),
                Ok(_) => refused.push(format!("{verb} {resource}.{group}")),
                Err(error) => {
                    return Err(format!(
                        "cannot ask the API server whether the operator may restart workloads: {error}"
                    ));
                }
            }
        }
        if refused.is_empty() {
            return Ok(());
        }
        let what = if refused.len() == needed.len() && !pods {
            "restart workloads (get and patch Deployments, StatefulSets and DaemonSets, get ReplicaSets)"
                .to_owned()
        } else if refused.len() == needed.len() {
            "restart workloads or update Pods (get and patch Deployments, StatefulSets, DaemonSets and Pods, get ReplicaSets)"
                .to_owned()
        } else {
            refused.join(", ")
        };
        Err(format!(
            "the operator may not {what} in every namespace, so it restarts nothing: install the chart with rollouts.enabled=true, or set updateStrategy.type OnCreate"
        ))
    }
}

#[cfg(test)]
#[path = "rollout/tests.rs"]
mod tests;
