//! The rollout budget of `updateStrategy: RollingRestart`, as a pure decision: given the
//! workloads that own a template's stale or missing Pods and where each one's rollout stands,
//! which to restart next, and where the template's rollout stands.
//!
//! A workload is restarted once per version of what the template injects (its
//! `sidecar.dev/restarted-for` annotation names the fingerprint), so a workload whose new
//! Pods still miss the sidecar (a best-effort template's webhook was down again) is not
//! restarted in a loop. At most `maxConcurrentWorkloads` restarts are under way at once; a
//! restart under way that made no progress for `progressDeadlineSeconds` halts the template's
//! rollout; `paused` starts nothing new.

use std::collections::BTreeMap;
use std::time::Duration;

use injector_api::names::INJECTED_ANNOTATION;
use injector_api::{
    DEFAULT_MAX_CONCURRENT_WORKLOADS, DEFAULT_PROGRESS_DEADLINE_SECONDS, RolloutStatus,
    UpdateStrategy, WorkloadRef,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::placeholder::Node;
use crate::rules::record;
use crate::template::{CompiledTemplate, Item};

/// Where one workload owning stale or missing Pods stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadState {
    /// The workload.
    pub workload: WorkloadRef,
    /// It says itself that a rollout must not restart it (`sidecar.dev/rollout: disabled`,
    /// `OnDelete`: [`crate::after_admission::workload::WorkloadObject::not_restartable`]): reported, never
    /// restarted.
    pub opted_out: bool,
    /// Already restarted for the template's current version.
    pub restarted: bool,
    /// Its rollout is complete (every replica updated and available).
    pub complete: bool,
    /// How long since its rollout last made progress (more replicas updated or ready), for a
    /// restart under way.
    pub since_progress: Duration,
    /// Its stale or missing Pods.
    pub pods: u32,
}

/// What to do next, and what the template's `status.rollout` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutDecision {
    /// The workloads to restart now.
    pub restart: Vec<WorkloadRef>,
    /// The template's rollout status.
    pub status: RolloutStatus,
}

/// `status.rollout.state` values.
pub mod states {
    /// Restarts are under way or waiting for a slot.
    pub const PROGRESSING: &str = "Progressing";
    /// No restartable workload owns a stale or missing Pod.
    pub const COMPLETE: &str = "Complete";
    /// `paused: true` and workloads wait.
    pub const PAUSED: &str = "Paused";
    /// A restart made no progress in time.
    pub const HALTED: &str = "Halted";
    /// The operator may not restart workloads.
    pub const FORBIDDEN: &str = "Forbidden";
}

/// Decides the next step of a template's rollout: `workloads` own its stale or missing Pods,
/// `not_restartable` more such Pods have no restartable owner.
pub fn next_restarts(
    strategy: &UpdateStrategy,
    workloads: &[WorkloadState],
    not_restartable: u32,
) -> RolloutDecision {
    let max_concurrent = strategy
        .max_concurrent_workloads
        .unwrap_or(DEFAULT_MAX_CONCURRENT_WORKLOADS)
        .max(1) as usize;
    let deadline = Duration::from_secs(u64::from(
        strategy
            .progress_deadline_seconds
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS),
    ));
    let opted_out: u32 = workloads
        .iter()
        .filter(|w| w.opted_out)
        .map(|w| w.pods)
        .sum();
    let mut restarting: Vec<&WorkloadState> = workloads
        .iter()
        .filter(|w| !w.opted_out && w.restarted && !w.complete)
        .collect();
    restarting.sort_by(|a, b| a.workload.cmp(&b.workload));
    let mut waiting: Vec<&WorkloadState> = workloads
        .iter()
        .filter(|w| !w.opted_out && !w.restarted)
        .collect();
    waiting.sort_by(|a, b| a.workload.cmp(&b.workload));
    let stuck = restarting.iter().find(|w| w.since_progress >= deadline);

    let (state, message, restart) = if let Some(stuck) = stuck {
        let message = format!(
            "{} made no progress for {}s after its restart; no other workload restarts until it completes or the template changes",
            stuck.workload,
            deadline.as_secs()
        );
        (states::HALTED, Some(message), Vec::new())
    } else if strategy.paused {
        let state = if waiting.is_empty() && restarting.is_empty() {
            states::COMPLETE
        } else {
            states::PAUSED
        };
        (state, None, Vec::new())
    } else {
        let slots = max_concurrent.saturating_sub(restarting.len());
        let restart: Vec<WorkloadRef> = waiting
            .iter()
            .take(slots)
            .map(|w| w.workload.clone())
            .collect();
        let state = if waiting.is_empty() && restarting.is_empty() {
            states::COMPLETE
        } else {
            states::PROGRESSING
        };
        (state, None, restart)
    };
    let started = restart.len();
    let mut now_restarting: Vec<WorkloadRef> =
        restarting.iter().map(|w| w.workload.clone()).collect();
    now_restarting.extend(restart.iter().cloned());
    now_restarting.sort();
    RolloutDecision {
        restart,
        status: RolloutStatus {
            state: state.to_owned(),
            restarting: now_restarting,
            updating: Vec::new(),
            waiting: u32::try_from(waiting.len() - started).unwrap_or(u32::MAX),
            not_restartable: not_restartable + opted_out,
            message,
        },
    }
}

/// The `sidecar.dev/restarted-for` entry of a template's version: `name#fingerprint`.
pub fn restarted_for_entry(template: &str, fingerprint: &str) -> String {
    format!("{template}#{fingerprint}")
}

/// Whether a `sidecar.dev/restarted-for` value names `entry`.
pub fn restarted_for(value: Option<&str>, entry: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|e| e.trim() == entry))
}

/// The `sidecar.dev/restarted-for` value after a restart for `entry` (`name#fingerprint`):
/// the template's earlier entry replaced, the other templates' kept.
pub fn with_restarted_for(value: Option<&str>, entry: &str) -> String {
    let name = entry.split('#').next().unwrap_or(entry);
    let mut entries: Vec<&str> = value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty() && e.split('#').next() != Some(name))
        .collect();
    entries.push(entry);
    entries.sort_unstable();
    entries.join(",")
}

/// `updateStrategy.maxUnavailable` for a template carried by `pods` Pods: a count, or a
/// percentage of them rounded down; at least 1 (so a rollout always moves), 1 when absent or
/// unreadable.
pub fn max_unavailable(value: Option<&IntOrString>, pods: u32) -> u32 {
    let allowed = match value {
        Some(IntOrString::Int(count)) => u32::try_from(*count).unwrap_or(0),
        Some(IntOrString::String(text)) => text
            .trim()
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u64>().ok())
            .map_or(1, |percent| {
                u32::try_from(u64::from(pods) * percent.min(100) / 100).unwrap_or(u32::MAX)
            }),
        None => 1,
    };
    allowed.max(1)
}

/// A string field of an injected container as written, when it holds no placeholder (an
/// image never does).
pub(crate) fn fixed_field<'i>(item: &'i Item, field: &str) -> Option<&'i str> {
    match &item.body {
        Node::Fixed(fixed) => fixed.value().get(field)?.as_str(),
        Node::Object(fields) => match fields.iter().find(|(key, _)| key == field)? {
            (_, Node::Fixed(value)) => value.value().as_str(),
            _ => None,
        },
        _ => None,
    }
}

/// The image an injected container or init container is written with.
pub(crate) fn image_of(item: &Item) -> Option<&str> {
    fixed_field(item, "image")
}

/// The strategic-merge patch that brings `pod`, which carries an earlier version of
/// `template` differing only in images, to the template as it is now: the images of the
/// template's containers and init containers (native sidecars included) set to the
/// template's, and the template's entry of the Pod's record rewritten, guarded by the Pod's
/// resourceVersion. `None` when the Pod lacks one of the template's containers or has no
/// record of it, or when the image of a plain init container changed (the kubelet would
/// restart the whole Pod for it): it cannot be updated in place.
pub fn in_place_patch(template: &CompiledTemplate, pod: &Pod) -> Option<serde_json::Value> {
    let spec = pod.spec.as_ref()?;
    let record = pod
        .metadata
        .annotations
        .as_ref()?
        .get(INJECTED_ANNOTATION)?;
    let updated = |items: &[Item], running: &[Container], init: bool| {
        let mut changes = Vec::new();
        for item in items {
            let image = image_of(item)?;
            let current = running.iter().find(|c| c.name == item.key)?;
            if current.image.as_deref() != Some(image) {
                if init && fixed_field(item, "restartPolicy") != Some("Always") {
                    return None;
                }
                changes.push(serde_json::json!({"name": item.key, "image": image}));
            }
        }
        Some(changes)
    };
    let containers = updated(&template.containers, &spec.containers, false)?;
    let init_containers = updated(
        &template.init_containers,
        spec.init_containers.as_deref().unwrap_or_default(),
        true,
    )?;
    let record = record::rewritten(record, template.entry())?;
    let mut patch = serde_json::json!({
        "metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "annotations": {INJECTED_ANNOTATION: record},
        },
    });
    let mut spec_patch = serde_json::Map::new();
    if !containers.is_empty() {
        spec_patch.insert("containers".into(), containers.into());
    }
    if !init_containers.is_empty() {
        spec_patch.insert("initContainers".into(), init_containers.into());
    }
    if !spec_patch.is_empty() {
        patch["spec"] = spec_patch.into();
    }
    Some(patch)
}

/// Whether `pod` runs the images `template` sets, every container of it started and the Pod
/// Ready: an update in place is done.
pub fn updated_in_place(template: &CompiledTemplate, pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let ready = is_ready(pod);
    let statuses: BTreeMap<&str, _> = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s))
        .collect();
    // A plain init container has run and ended (and its image is never changed in place):
    // only the containers and the native sidecars must run the new images.
    let native_sidecars = template
        .init_containers
        .iter()
        .filter(|item| fixed_field(item, "restartPolicy") == Some("Always"));
    let running_new = template
        .containers
        .iter()
        .chain(native_sidecars)
        .all(|item| {
            let (Some(image), Some(status)) = (image_of(item), statuses.get(item.key.as_str()))
            else {
                return false;
            };
            same_image(&status.image, image)
                && status.state.as_ref().is_some_and(|s| s.running.is_some())
        });
    ready && running_new
}

/// Whether `pod`'s `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the image a container status reports is `image` (the runtime may report it
/// normalized: `docker.io/library/` before a short name).
fn same_image(reported: &str, image: &str) -> bool {
    reported == image
        || reported
            .strip_suffix(image)
            .is_some_and(|prefix| prefix.ends_with('/'))
}

#[cfg(test)]
mod tests;
