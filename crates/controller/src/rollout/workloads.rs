//! Where a workload's rollout stands, read from the workload itself (as
//! `kubectl rollout status` judges it), and the patch that restarts it. Pure.

use injector_api::names::{RESTARTED_AT_ANNOTATION, RESTARTED_FOR_ANNOTATION};
use injector_core::after_admission::rollout::with_restarted_for;
use injector_core::after_admission::workload::{NotRestartable, WorkloadObject};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::jiff::Timestamp;

/// What is known of a workload's rollout, read from the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadView {
    /// Why a rollout must not restart it, when it says so itself
    /// ([`WorkloadObject::not_restartable`]: annotated `sidecar.dev/rollout: disabled`, or
    /// updated only on delete, where a restart would not replace its Pods).
    pub not_restartable: Option<NotRestartable>,
    /// Its `sidecar.dev/restarted-for` annotation.
    pub restarted_for: Option<String>,
    /// Every replica updated and available.
    pub complete: bool,
    /// Counts that grow as its rollout progresses: a change is progress.
    pub progress: [i64; 4],
    /// Its resourceVersion, so that a restart does not overwrite a change made meanwhile.
    pub resource_version: Option<String>,
    /// When it was last restarted by a rollout (its Pod template's `sidecar.dev/restartedAt`).
    pub restarted_at: Option<Timestamp>,
}

/// The `sidecar.dev/restartedAt` of a Pod template.
fn restarted_at(template: Option<&PodTemplateSpec>) -> Option<Timestamp> {
    template?
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTARTED_AT_ANNOTATION)?
        .parse()
        .ok()
}

/// A workload's view from the object (what it says of a restart, the restart record and time,
/// the resourceVersion) and what its kind says of its rollout: whether it is complete, and its
/// progress counts.
fn view_of(
    object: WorkloadObject<'_>,
    template: Option<&PodTemplateSpec>,
    complete: bool,
    progress: [i64; 4],
) -> WorkloadView {
    let meta = object.metadata();
    WorkloadView {
        not_restartable: object.not_restartable(),
        restarted_for: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESTARTED_FOR_ANNOTATION))
            .cloned(),
        complete,
        progress,
        resource_version: meta.resource_version.clone(),
        restarted_at: restarted_at(template),
    }
}

/// Where a Deployment's rollout stands (as `kubectl rollout status` judges it).
pub fn deployment_view(deployment: &Deployment) -> WorkloadView {
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
    view_of(
        WorkloadObject::Deployment(deployment),
        deployment.spec.as_ref().map(|s| &s.template),
        complete,
        [observed, updated, ready, available],
    )
}

/// Where a StatefulSet's rollout stands.
pub fn stateful_set_view(set: &StatefulSet) -> WorkloadView {
    let spec = set.spec.clone().unwrap_or_default();
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
    view_of(
        WorkloadObject::StatefulSet(set),
        set.spec.as_ref().map(|s| &s.template),
        complete,
        [observed, updated, ready, available],
    )
}

/// Where a DaemonSet's rollout stands.
pub fn daemon_set_view(set: &DaemonSet) -> WorkloadView {
    let status = set.status.clone().unwrap_or_default();
    let generation = set.metadata.generation.unwrap_or_default();
    let observed = status.observed_generation.unwrap_or_default();
    let desired = i64::from(status.desired_number_scheduled);
    let updated = i64::from(status.updated_number_scheduled.unwrap_or_default());
    let ready = i64::from(status.number_ready);
    let available = i64::from(status.number_available.unwrap_or_default());
    let complete = observed >= generation && updated >= desired && available >= desired;
    view_of(
        WorkloadObject::DaemonSet(set),
        set.spec.as_ref().map(|s| &s.template),
        complete,
        [observed, updated, ready, available],
    )
}

/// The merge patch that restarts a workload for `entries` (`template#fingerprint` of every
/// template whose new version the restart brings) at `now`.
pub fn restart_patch(view: &WorkloadView, entries: &[String], now: &str) -> serde_json::Value {
    let restarted_for = entries
        .iter()
        .fold(view.restarted_for.clone(), |value, entry| {
            Some(with_restarted_for(value.as_deref(), entry))
        });
    serde_json::json!({
        "metadata": {
            "resourceVersion": view.resource_version,
            "annotations": {RESTARTED_FOR_ANNOTATION: restarted_for},
        },
        "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: now}}}},
    })
}

#[cfg(test)]
mod tests;
