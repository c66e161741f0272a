//! Why a best-effort template is missing from a workload's Pods, told where the app team reads
//! it: an Event on the Pods' controlling owner (a ReplicaSet, a StatefulSet, a Job, …).
//!
//! At admission the reasons go back as warnings to whoever created the Pod, which for a
//! Deployment's Pods is kube-controller-manager: nobody reads them. So the leader finds them
//! again from what it sees, whichever engine admitted the Pod (the webhook, or the
//! MutatingAdmissionPolicy, which calls no webhook): the census says which Pods a best-effort
//! template selects but that do not carry it ([`missing`], by owner); one of them is planned
//! again as it is stored, in its namespace with that namespace's labels, and the template's
//! conflict there ([`conflicts`]) is the reason. An owner whose Pods would get the template now (created before it, or
//! admitted while the webhook was unreachable) is told nothing.
//!
//! [`SkipLog`] keeps what was learned per owner (by uid), template and generation, so that
//! each Pod is planned again at most once per key and a 1,000-replica scale-up makes one
//! Event; it is told again, by a patch of that Event's series count, only when more Pods are
//! missing and a while has passed. The decisions are pure; [`tell_skip`], last, is the only
//! function here that talks to the API server (the leader's loop reads the Pod).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use injector_api::{FailurePolicy, SidecarTemplate, WorkloadRef};
use injector_core::after_admission::lifecycle::carried;
use injector_core::{NamespaceInfo, SkipReason, Snapshot};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::census::{Census, PodRecord};
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
    /// Its uid, as the Pods' owner reference names it: an owner deleted and created again
    /// under its name is another key, with another Event.
    pub owner_uid: String,
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
    /// The owner's `apiVersion`, as that Pod's owner reference names it: a custom owner (an
    /// Argo Rollout, a CloneSet) is of a group no kind tells.
    pub api_version: String,
}

/// What [`missing`] finds: the Pods missing each key's template.
pub type MissingPods = BTreeMap<SkipKey, Missing>;

/// Whether `snapshot` has a best-effort template: without one, nothing is ever skipped for a
/// reason worth telling, and the Pods need not be looked at.
pub fn has_best_effort(snapshot: &Snapshot) -> bool {
    snapshot
        .templates()
        .iter()
        .any(|t| t.failure_policy == FailurePolicy::Ignore)
}

/// The Pods missing a best-effort template of `snapshot`, by owner, from the census (which
/// owners have Pods behind) and the Pods it counted: of an owner behind on a template, the
/// Pods that do not carry it. Pods without an owner are left out: whoever created one got the
/// warnings.
pub fn missing(snapshot: &Snapshot, census: &Census, pods: &[Arc<PodRecord>]) -> MissingPods {
    let behind: Vec<_> = snapshot
        .templates()
        .iter()
        .filter(|t| t.failure_policy == FailurePolicy::Ignore)
        .filter_map(|t| Some((t, census.get(&t.name)?)))
        .filter(|(_, census)| !census.behind.is_empty())
        .collect();
    let mut found = BTreeMap::new();
    // Most rounds have no owner behind on a best-effort template: no Pod is looked at then.
    if behind.is_empty() {
        return found;
    }
    let mut by_owner: BTreeMap<&WorkloadRef, Vec<&PodRecord>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| !p.deleting) {
        if let Some(owner) = pod.workload() {
            by_owner.entry(owner).or_default().push(pod);
        }
    }
    for (template, census) in behind {
        for owner in census.behind.keys().flatten() {
            let without = by_owner
                .get(owner)
                .into_iter()
                .flatten()
                .filter(|pod| carried(template, &pod.meta()).is_none());
            for (owner_uid, missing) in by_uid(without) {
                let key = SkipKey {
                    owner: owner.clone(),
                    owner_uid,
                    template: template.name.clone(),
                    generation: template.generation,
                };
                found.insert(key, missing);
            }
        }
    }
    found
}

/// `pods` by the uid of their controlling owner (one, unless the owner was deleted and created
/// again under its name while its Pods were still there).
fn by_uid<'p>(pods: impl Iterator<Item = &'p &'p PodRecord>) -> BTreeMap<String, Missing> {
    let mut found: BTreeMap<String, Missing> = BTreeMap::new();
    for pod in pods {
        let Some(owner) = pod.owner.as_deref() else {
            continue;
        };
        found
            .entry(owner.uid.clone())
            .and_modify(|m| m.pods = m.pods.saturating_add(1))
            .or_insert_with(|| Missing {
                pods: 1,
                sample: pod.name.to_string(),
                api_version: owner.api_version.clone(),
            });
    }
    found
}

/// The conflicts `pod`, as it is stored, has with the templates of `snapshot` in its
/// namespace, labelled `namespace_labels`: why each template skipped there for a reason worth
/// telling was, by template name. A template whose namespace selector leaves the namespace
/// out takes no part, so it is never skipped nor makes another one skip. Any other outcome
/// (applied, not selected, already present) says a template was not skipped at this Pod's
/// admission for a reason of the Pod's.
pub fn conflicts(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    snapshot: &Snapshot,
) -> BTreeMap<String, String> {
    let namespace = NamespaceInfo {
        name: pod.metadata.namespace.as_deref().unwrap_or_default(),
        labels: Some(namespace_labels),
    };
    let plan = serde_json::to_value(pod)
        .ok()
        .and_then(|value| injector_core::plan(&value, &namespace, snapshot.templates()).ok());
    plan.iter()
        .flat_map(|plan| &plan.skipped)
        .filter(|s| matches!(s.reason, SkipReason::Conflict(_)))
        .map(|s| (s.name.clone(), s.reason.to_string()))
        .collect()
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
    /// The owner's `apiVersion` ([`Missing::api_version`]).
    pub api_version: String,
}

/// What was learned of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// Planned again, the template is not skipped for a reason of the Pod's.
    NotSkipped,
    /// Skipped, for this reason; told for `told` Pods at `told_at` (`None`: not yet).
    Skipped {
        reason: String,
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
    /// The keys whose sample Pod to plan again, at most `limit`: the keys of `missing` not
    /// planned yet.
    pub fn to_plan(&self, missing: &MissingPods, limit: usize) -> Vec<SkipKey> {
        missing
            .keys()
            .filter(|key| !self.known.contains_key(*key))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Records what planning one of `key`'s Pods again said: `reason` when the template was
    /// skipped ([`conflicts`]).
    pub fn learn(&mut self, key: SkipKey, reason: Option<String>) {
        let known = match reason {
            Some(reason) => Known::Skipped {
                reason,
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
                    api_version: now_missing.api_version.clone(),
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
/// Its name is the same for one key whoever tells it ([`event_name`]), so a new leader adds to
/// the Event of the last one rather than making another: [`series_patch`] then updates it. An
/// Event's note cannot change after it is created, so the number of Pods is in its series
/// (`count`, from 2), not in the note.
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
            api_version: Some(tell.api_version.clone()),
            kind: Some(owner.kind.clone()),
            namespace: Some(owner.namespace.clone()),
            name: Some(owner.name.clone()),
            uid: Some(tell.key.owner_uid.clone()),
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

/// Whether `existing`, an Event found under the name of `key`'s, tells of `key`: about the
/// same owner (by uid) and template. One that does not (a hash collision, or an Event someone
/// else so named) is another object's series, whose count is not this one's to change.
pub fn tells_of(existing: &Event, key: &SkipKey) -> bool {
    let regarding = existing.regarding.as_ref();
    existing.reason.as_deref() == Some(REASON_SKIPPED)
        && regarding.and_then(|r| r.uid.as_deref()) == Some(key.owner_uid.as_str())
        && regarding.and_then(|r| r.kind.as_deref()) == Some(key.owner.kind.as_str())
        && existing.related.as_ref().and_then(|r| r.name.as_deref()) == Some(key.template.as_str())
}

/// The merge patch that brings an Event of `tell`'s key, created before, to its count now;
/// with the `resource_version` it was read at, so that it applies to that Event only (the
/// API server refuses it when the Event changed or was made again since).
pub fn series_patch(
    tell: &Tell,
    now: Timestamp,
    resource_version: Option<&str>,
) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "series": series(tell.pods, now),
    })
}

/// A series of `pods` observations (none for one: the API server wants at least 2).
fn series(pods: u32, now: Timestamp) -> Option<EventSeries> {
    (pods >= 2).then(|| EventSeries {
        count: i32::try_from(pods).unwrap_or(i32::MAX),
        last_observed_time: MicroTime(now),
    })
}

/// `<owner>.<16 hex digits>`: the owner's name (cut so that the name stays within 253
/// characters) and an FNV-1a hash of the owner's kind and uid and the template's name and
/// generation, stable across replicas and restarts. Owners of two kinds with one name, or an
/// owner and the one created again under its name, get Events of their own.
pub fn event_name(key: &SkipKey) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let hashed = format!(
        "{}/{}/{}@{}",
        key.owner.kind, key.owner_uid, key.template, key.generation
    );
    for byte in hashed.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let owner: String = key.owner.name.chars().take(200).collect();
    format!("{owner}.{hash:016x}")
}

/// Publishes the Event telling `tell` on the Pods' owner ([`event`]), as `instance`; when it
/// exists already (told before, by this leader or another), brings its series to the number
/// of Pods missing the template now, unless that Event tells of another object
/// ([`tells_of`]): that one is left alone, and this key not told.
pub async fn tell_skip(
    client: &kube::Client,
    tell: &Tell,
    instance: &str,
) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let api: Api<Event> = Api::namespaced(client.clone(), &tell.key.owner.namespace);
    let created = api
        .create(
            &PostParams::default(),
            &event(tell, crate::FIELD_MANAGER, instance, now),
        )
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(response)) if response.code == 409 => {
            let name = event_name(&tell.key);
            let existing = api.get(&name).await?;
            if !tells_of(&existing, &tell.key) {
                tracing::debug!(event = %name, owner = %tell.key.owner, template = %tell.key.template, "an Event of another object has this name: not told");
                return Ok(());
            }
            let patch = series_patch(tell, now, existing.metadata.resource_version.as_deref());
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests;
