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

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use injector_api::names::{
    RESTARTED_AT_ANNOTATION, RESTARTED_FOR_ANNOTATION, ROLLOUT_ANNOTATION, ROLLOUT_DISABLED,
};
use injector_api::{RolloutStatus, UpdateStrategyType, WorkloadRef};
use injector_core::CompiledTemplate;
use injector_core::rollout::{
    WorkloadState, next_restarts, restarted_for, restarted_for_entry, states, with_restarted_for,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::{Client, Resource};
use tokio::time::Instant;

use crate::census::{Census, PodOwner};

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
    /// Whether the operator may restart workloads, and when that was asked.
    permitted: Option<(Result<(), String>, Instant)>,
}

impl RolloutDriver {
    /// A driver with nothing known yet (a new leader's term).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            replica_sets: HashMap::new(),
            progress: HashMap::new(),
            permitted: None,
        }
    }

    /// One round over every template with `RollingRestart`: what each one's rollout says, and
    /// the restarts it calls for, made. `on_restart` hears of each restart made.
    pub async fn round(
        &mut self,
        templates: &[std::sync::Arc<CompiledTemplate>],
        census: &Census,
        mut on_restart: impl FnMut(&CompiledTemplate, &WorkloadRef),
    ) -> Rollouts {
        let mut rollouts = Rollouts::new();
        let rolling: Vec<&CompiledTemplate> = templates
            .iter()
            .map(AsRef::as_ref)
            .filter(|t| t.update_strategy.type_ == UpdateStrategyType::RollingRestart)
            .collect();
        if rolling.is_empty() {
            self.progress.clear();
            return rollouts;
        }
        let permitted = self.permitted().await;
        let mut seen = Vec::new();
        for template in rolling {
            // Without the permission, not even the ReplicaSets are read (they would be refused).
            if let Err(why) = &permitted {
                rollouts.insert(
                    template.name.clone(),
                    RolloutStatus {
                        state: states::FORBIDDEN.to_owned(),
                        message: Some(why.clone()),
                        ..RolloutStatus::default()
                    },
                );
                continue;
            }
            let behind = census
                .get(&template.name)
                .map(|c| &c.behind)
                .cloned()
                .unwrap_or_default();
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
            rollouts.insert(template.name.clone(), status);
        }
        self.progress.retain(|workload, _| seen.contains(workload));
        rollouts
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

    /// Whether the operator may restart workloads: asked of the API server at most once per
    /// [`PERMISSION_TTL`]; `Err` says what it may not do.
    async fn permitted(&mut self) -> Result<(), String> {
        if let Some((answer, at)) = &self.permitted
            && at.elapsed() < PERMISSION_TTL
        {
            return answer.clone();
        }
        let answer = self.ask_permission().await;
        self.permitted = Some((answer.clone(), Instant::now()));
        answer
    }

    async fn ask_permission(&self) -> Result<(), String> {
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let needed = [
            ("patch", "deployments"),
            ("patch", "statefulsets"),
            ("patch", "daemonsets"),
            ("get", "deployments"),
            ("get", "statefulsets"),
            ("get", "daemonsets"),
            ("get", "replicasets"),
        ];
        let mut refused = Vec::new();
        for (verb, resource) in needed {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(Deployment::group(&()).into_owned()),
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
                Ok(_) => refused.push(format!("{verb} {resource}.apps")),
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
        let what = if refused.len() == needed.len() {
            "restart workloads (get and patch Deployments, StatefulSets and DaemonSets, get ReplicaSets)"
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
