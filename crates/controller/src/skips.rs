//! Why a best-effort template is missing from a workload's Pods, told where the app team reads
//! it: an Event on the Pods' controlling owner (a ReplicaSet, a StatefulSet, a Job, …).
//!
//! At admission the reasons go back as warnings to whoever created the Pod, which for a
//! Deployment's Pods is kube-controller-manager: nobody reads them. So the leader finds them
//! again from what it sees, whichever engine admitted the Pod (the webhook, or the
//! MutatingAdmissionPolicy, which calls no webhook): the census says which Pods a best-effort
//! template selects but that do not carry it ([`missing`], by owner); one of them is planned
//! again as it is stored, and the template's skip reason there ([`skip_reason`], a conflict)
//! is the reason. An owner whose Pods would get the template now (created before it, or
//! admitted while the webhook was unreachable) is told nothing.
//!
//! [`SkipLog`] keeps what was learned per owner, template and generation, so that each Pod is
//! planned again at most once per key and a 1,000-replica scale-up makes one Event, told again
//! (the recorder folds repeats into one Event's series) only when more Pods are missing and a
//! while has passed. Nothing here does I/O: the leader's loop reads the Pod and publishes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use injector_api::{FailurePolicy, SidecarTemplate, WorkloadRef};
use injector_core::lifecycle::{PodMeta, carried, counts};
use injector_core::workload::owner_of;
use injector_core::{Plan, SkipReason, Snapshot};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource as _;
use kube::core::PartialObjectMeta;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use crate::census::Census;
use crate::status::{NOTE_MAX_BYTES, truncate};

/// How many Pods one round plans again at most: each is a read from the API server.
pub const LOOKUPS_PER_ROUND: usize = 10;

/// How long after telling an owner's skip it is told again, when more of its Pods miss the
/// template.
pub const RETELL_AFTER: Duration = Duration::from_secs(60);

/// One best-effort template, at one generation, missing from the Pods of one owner.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SkipKey {
    /// The Pods' controlling owner.
    pub owner: WorkloadRef,
    /// The template's name.
    pub template: String,
    /// Its generation in force.
    pub generation: i64,
}

/// The Pods of one owner missing one template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// How many.
    pub pods: u32,
    /// One of them (its name), to plan again.
    pub sample: String,
}

/// What [`missing`] finds: the Pods missing each key's template.
pub type MissingPods = BTreeMap<SkipKey, Missing>;

/// The Pods missing a best-effort template of `snapshot`, by owner, from the census (which
/// owners have Pods behind) and the Pods it counted: of an owner behind on a template, the
/// Pods that do not carry it. Pods without an owner are left out: whoever created one got the
/// warnings.
pub fn missing(
    snapshot: &Snapshot,
    census: &Census,
    pods: &[Arc<PartialObjectMeta<Pod>>],
) -> MissingPods {
    let mut by_owner: BTreeMap<WorkloadRef, Vec<&PartialObjectMeta<Pod>>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| counts(&p.metadata)) {
        if let Some(owner) = owner_of(&pod.metadata) {
            by_owner.entry(owner).or_default().push(pod);
        }
    }
    let mut found = BTreeMap::new();
    for template in snapshot.templates() {
        if template.failure_policy != FailurePolicy::Ignore {
            continue;
        }
        let Some(behind) = census.get(&template.name) else {
            continue;
        };
        for owner in behind.behind.keys().flatten() {
            let without: Vec<&str> = by_owner
                .get(owner)
                .into_iter()
                .flatten()
                .filter(|pod| carried(template, &PodMeta::of(&pod.metadata)).is_none())
                .filter_map(|pod| pod.metadata.name.as_deref())
                .collect();
            let Some(sample) = without.first() else {
                continue;
            };
            found.insert(
                SkipKey {
                    owner: owner.clone(),
                    template: template.name.clone(),
                    generation: template.generation,
                },
                Missing {
                    pods: u32::try_from(without.len()).unwrap_or(u32::MAX),
                    sample: (*sample).to_owned(),
                },
            );
        }
    }
    found
}

/// Why `plan` skipped `template`, when it was for a reason worth telling: a conflict with what
/// the Pod has. Any other outcome (applied, not selected, already present) says the template
/// was not skipped at this Pod's admission for a reason of the Pod's.
pub fn skip_reason(plan: &Plan<'_>, template: &str) -> Option<String> {
    plan.skipped
        .iter()
        .find(|s| s.name == template)
        .filter(|s| matches!(s.reason, SkipReason::Conflict(_)))
        .map(|s| s.reason.to_string())
}

/// What to tell of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tell {
    /// Which owner, template and generation.
    pub key: SkipKey,
    /// Why the template was skipped.
    pub reason: String,
    /// How many of the owner's Pods miss it now.
    pub pods: u32,
    /// One of them, for `kubectl sidecar explain`.
    pub sample: String,
    /// The owner's uid, when known (from the Pod planned again): `kubectl describe` finds an
    /// object's Events by it.
    pub owner_uid: Option<String>,
}

/// What was learned of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// Planned again, the template is not skipped for a reason of the Pod's.
    NotSkipped,
    /// Skipped, for this reason; told for `told` Pods at `told_at` (`None`: not yet).
    Skipped {
        reason: String,
        owner_uid: Option<String>,
        told: u32,
        told_at: Option<Duration>,
    },
}

/// What the leader learned of each key, and told.
#[derive(Clone, Debug, Default)]
pub struct SkipLog {
    known: BTreeMap<SkipKey, Known>,
}

impl SkipLog {
    /// The Pods to plan again (a key, the Pod's namespace and name), at most `limit`: the keys
    /// of `missing` not planned yet.
    pub fn to_plan(&self, missing: &MissingPods, limit: usize) -> Vec<SkipKey> {
        missing
            .keys()
            .filter(|key| !self.known.contains_key(*key))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Records what planning one of `key`'s Pods again said: `reason` when the template was
    /// skipped ([`skip_reason`]), with the owner's uid as that Pod names it.
    pub fn learn(&mut self, key: SkipKey, reason: Option<String>, owner_uid: Option<String>) {
        let known = match reason {
            Some(reason) => Known::Skipped {
                reason,
                owner_uid,
                told: 0,
                told_at: None,
            },
            None => Known::NotSkipped,
        };
        self.known.insert(key, known);
    }

    /// What to tell now (`now`: a monotonic time), and remembers it as told: a key skipped and
    /// never told, or one told for fewer Pods than miss it now, [`RETELL_AFTER`] ago or more.
    /// Keys no longer missing are forgotten, so that the log is as large as what is missing.
    pub fn due(&mut self, missing: &MissingPods, now: Duration) -> Vec<Tell> {
        let present: BTreeSet<&SkipKey> = missing.keys().collect();
        self.known.retain(|key, _| present.contains(key));
        let mut tell = Vec::new();
        for (key, known) in &mut self.known {
            let Known::Skipped {
                reason,
                owner_uid,
                told,
                told_at,
            } = known
            else {
                continue;
            };
            let Some(now_missing) = missing.get(key) else {
                continue;
            };
            let due = match told_at {
                None => true,
                Some(at) => now_missing.pods > *told && now.saturating_sub(*at) >= RETELL_AFTER,
            };
            if due {
                tell.push(Tell {
                    key: key.clone(),
                    reason: reason.clone(),
                    pods: now_missing.pods,
                    sample: now_missing.sample.clone(),
                    owner_uid: owner_uid.clone(),
                });
                *told = now_missing.pods;
                *told_at = Some(now);
            }
        }
        tell
    }

    /// Forgets that `key` was told (its Event could not be written): the next round tells it
    /// again.
    pub fn untold(&mut self, key: &SkipKey) {
        if let Some(Known::Skipped { told, told_at, .. }) = self.known.get_mut(key) {
            *told = 0;
            *told_at = None;
        }
    }
}

/// The Event's reason.
pub const REASON_SKIPPED: &str = "TemplateSkipped";

/// The Event's action.
pub const ACTION_INJECT: &str = "Inject";

/// The Event telling `tell`, reported by `controller` (`instance`: this replica) at `now`.
///
/// Its name is the same for one key whoever tells it (`<owner>.<hash of template and
/// generation>`), so a new leader adds to the Event of the last one rather than making
/// another: [`series_patch`] then updates it. An Event's note cannot change after it is
/// created, so the number of Pods is in its series (`count`, from 2), not in the note.
pub fn event(tell: &Tell, controller: &str, instance: &str, now: Timestamp) -> Event {
    let owner = &tell.key.owner;
    let note = format!(
        "best-effort SidecarTemplate {} (generation {}) was not injected into the Pods of {}/{}: {}; `kubectl sidecar explain pod/{} -n {}` shows the decision",
        tell.key.template,
        tell.key.generation,
        owner.kind.to_lowercase(),
        owner.name,
        tell.reason,
        tell.sample,
        owner.namespace,
    );
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(&tell.key)),
            namespace: Some(owner.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some("Warning".to_owned()),
        reason: Some(REASON_SKIPPED.to_owned()),
        action: Some(ACTION_INJECT.to_owned()),
        note: Some(truncate(note, NOTE_MAX_BYTES)),
        regarding: Some(ObjectReference {
            api_version: Some(api_version(&owner.kind).to_owned()),
            kind: Some(owner.kind.clone()),
            namespace: Some(owner.namespace.clone()),
            name: Some(owner.name.clone()),
            uid: tell.owner_uid.clone(),
            ..ObjectReference::default()
        }),
        related: Some(ObjectReference {
            api_version: Some(SidecarTemplate::api_version(&()).into_owned()),
            kind: Some("SidecarTemplate".to_owned()),
            name: Some(tell.key.template.clone()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(controller.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        series: series(tell.pods, now),
        ..Event::default()
    }
}

/// The merge patch that brings an Event of `tell`'s key, created before, to its count now.
pub fn series_patch(tell: &Tell, now: Timestamp) -> serde_json::Value {
    serde_json::json!({ "series": series(tell.pods, now) })
}

/// A series of `pods` observations (none for one: the API server wants at least 2).
fn series(pods: u32, now: Timestamp) -> Option<EventSeries> {
    (pods >= 2).then(|| EventSeries {
        count: i32::try_from(pods).unwrap_or(i32::MAX),
        last_observed_time: MicroTime(now),
    })
}

/// `<owner>.<16 hex digits>`: the owner's name (cut so that the name stays within 253
/// characters) and an FNV-1a hash of the template's name and generation, stable across
/// replicas and restarts.
pub fn event_name(key: &SkipKey) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("{}@{}", key.template, key.generation).bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let owner: String = key.owner.name.chars().take(200).collect();
    format!("{owner}.{hash:016x}")
}

/// The `apiVersion` of an owner's kind, for the Event's reference to it.
pub fn api_version(kind: &str) -> &'static str {
    match kind {
        "ReplicaSet" | "Deployment" | "StatefulSet" | "DaemonSet" => "apps/v1",
        "Job" | "CronJob" => "batch/v1",
        _ => "v1",
    }
}

#[cfg(test)]
#[path = "skips/tests.rs"]
mod tests;
