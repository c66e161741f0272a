//! The workload behind a Pod, and whether the operator's rollout would restart it: written
//! once, for the leader's census and rollouts and for `kubectl sidecar status` alike, so the
//! two cannot disagree.
//!
//! A Pod's workload is found through its controlling owner (the owner reference with
//! `controller: true`): a StatefulSet or a DaemonSet is the workload; a ReplicaSet's is its
//! Deployment, a Job's its CronJob, each read from that owner's own controlling owner; a Pod
//! without one is bare. A rollout restarts only Deployments, StatefulSets and DaemonSets
//! (docs/architecture.md, decision 23), and of those neither one annotated
//! `sidecar.dev/rollout: disabled` nor one updated only on delete (`updateStrategy.type:
//! OnDelete`, where a restart would replace none of its Pods). The kind is told by owner
//! references; the rest by the workload object. Both are read at the edges; what they mean is
//! decided here.

use std::collections::BTreeMap;
use std::fmt;

use injector_api::WorkloadRef;
use injector_api::names::{ROLLOUT_ANNOTATION, ROLLOUT_DISABLED};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The update strategy under which a workload's controller replaces a Pod only once it is
/// deleted: a restart changes its Pod template and replaces nothing.
const ON_DELETE: &str = "OnDelete";

/// The owner reference of the object `meta` describes that names its controlling owner (the
/// one with `controller: true`): with the owner's uid and `apiVersion`, which [`owner_of`]
/// leaves out.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
}

/// The controlling owner of the object `meta` describes (its owner reference with
/// `controller: true`), in the object's namespace.
pub fn owner_of(meta: &ObjectMeta) -> Option<WorkloadRef> {
    let owner = controller_of(meta)?;
    Some(WorkloadRef {
        kind: owner.kind.clone(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: owner.name.clone(),
    })
}

/// Whether the workload behind Pods owned by `owner` is named by `owner`'s own controlling
/// owner, which must then be looked up: a ReplicaSet's Deployment, a Job's CronJob.
pub fn named_by_its_owner(owner: &WorkloadRef) -> bool {
    matches!(owner.kind.as_str(), "ReplicaSet" | "Job")
}

/// Whether a rollout can restart Pods owned by `owner` only through `owner`'s own controlling
/// owner, which must then be looked up: a ReplicaSet, through its Deployment. (A Job's CronJob
/// is never restarted, so a rollout need not look it up.)
pub fn restarted_through_its_owner(owner: &WorkloadRef) -> bool {
    owner.kind == "ReplicaSet"
}

/// Why the operator's rollout does not restart a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotRestartable {
    /// A Pod without a controlling owner: nobody would create it again.
    BarePod,
    /// A Job's Pod (a Job without a CronJob).
    Job,
    /// A CronJob's Pod: its next Jobs get the change.
    CronJob,
    /// A ReplicaSet's Pod without a Deployment (or whose ReplicaSet is gone).
    NoDeployment,
    /// An owner of a kind rollouts do not restart.
    Kind,
    /// The workload is annotated `sidecar.dev/rollout: disabled`.
    OptedOut,
    /// The workload is updated only on delete (`updateStrategy.type: OnDelete`).
    OnDelete,
    /// The workload object is gone.
    Gone,
}

impl NotRestartable {
    /// What it says, in a few words.
    pub fn as_str(self) -> &'static str {
        match self {
            NotRestartable::BarePod => "bare Pod",
            NotRestartable::Job => "Job",
            NotRestartable::CronJob => "CronJob",
            NotRestartable::NoDeployment => "no Deployment",
            NotRestartable::Kind => "kind not restartable",
            NotRestartable::OptedOut => "sidecar.dev/rollout: disabled",
            NotRestartable::OnDelete => "updateStrategy OnDelete",
            NotRestartable::Gone => "gone",
        }
    }
}

impl fmt::Display for NotRestartable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The workload behind a Pod: what a rollout would restart, or why none does.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Workload {
    /// The workload: a Deployment, a StatefulSet, a DaemonSet, or what stands in for one that
    /// is not restarted (the Pod itself when bare, a Job, a CronJob, a ReplicaSet without a
    /// Deployment, another owner).
    pub reference: WorkloadRef,
    /// Why no rollout restarts it; `None` when one does.
    pub not_restartable: Option<NotRestartable>,
}

impl Workload {
    /// The workload behind a Pod without a controlling owner: the Pod itself.
    pub fn bare(pod: &ObjectMeta) -> Self {
        Workload {
            reference: WorkloadRef {
                kind: "Pod".to_owned(),
                namespace: pod.namespace.clone().unwrap_or_default(),
                name: pod.name.clone().unwrap_or_default(),
            },
            not_restartable: Some(NotRestartable::BarePod),
        }
    }

    /// The workload behind Pods owned by `owner`, judged by kind: `owners_owner` is `owner`'s
    /// own controlling owner, looked up when [`named_by_its_owner`] (`None`: it has none, it
    /// is gone, or it was not looked up).
    pub fn behind(owner: &WorkloadRef, owners_owner: Option<&WorkloadRef>) -> Self {
        let of = |reference: &WorkloadRef, why: Option<NotRestartable>| Workload {
            reference: reference.clone(),
            not_restartable: why,
        };
        match (owner.kind.as_str(), owners_owner) {
            ("StatefulSet" | "DaemonSet", _) => of(owner, None),
            ("ReplicaSet", Some(found)) if found.kind == "Deployment" => of(found, None),
            ("Job", Some(found)) if found.kind == "CronJob" => {
                of(found, Some(NotRestartable::CronJob))
            }
            ("ReplicaSet" | "Job", Some(found)) => of(found, Some(NotRestartable::Kind)),
            ("ReplicaSet", None) => of(owner, Some(NotRestartable::NoDeployment)),
            ("Job", None) => of(owner, Some(NotRestartable::Job)),
            _ => of(owner, Some(NotRestartable::Kind)),
        }
    }

    /// The workload behind `pod`: [`Workload::behind`] its controlling owner, whose own owner
    /// `owners_owner` gives when [`named_by_its_owner`], else [`Workload::bare`].
    pub fn of_pod(
        pod: &ObjectMeta,
        owners_owner: impl FnOnce(&WorkloadRef) -> Option<WorkloadRef>,
    ) -> Self {
        match owner_of(pod) {
            Some(owner) => {
                let found = named_by_its_owner(&owner)
                    .then(|| owners_owner(&owner))
                    .flatten();
                Workload::behind(&owner, found.as_ref())
            }
            None => Workload::bare(pod),
        }
    }

    /// This workload, judged also by what its object says (`verdict`:
    /// [`WorkloadObject::not_restartable`] of it, [`NotRestartable::Gone`] when it is gone).
    /// A workload its kind already rules out keeps that reason.
    pub fn judged(self, verdict: Option<NotRestartable>) -> Self {
        Workload {
            not_restartable: self.not_restartable.or(verdict),
            ..self
        }
    }

    /// The workload, when a rollout restarts it.
    pub fn restartable(&self) -> Option<&WorkloadRef> {
        self.not_restartable.is_none().then_some(&self.reference)
    }
}

/// A workload a rollout may restart, as read from the API server.
#[derive(Clone, Copy, Debug)]
pub enum WorkloadObject<'a> {
    /// A Deployment.
    Deployment(&'a Deployment),
    /// A StatefulSet.
    StatefulSet(&'a StatefulSet),
    /// A DaemonSet.
    DaemonSet(&'a DaemonSet),
}

impl WorkloadObject<'_> {
    /// Its metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            WorkloadObject::Deployment(object) => &object.metadata,
            WorkloadObject::StatefulSet(object) => &object.metadata,
            WorkloadObject::DaemonSet(object) => &object.metadata,
        }
    }

    /// Its update strategy's type (`RollingUpdate`, `OnDelete`; a Deployment's `Recreate`).
    pub fn update_strategy(&self) -> Option<&str> {
        match self {
            Self::Deployment(set) => set.spec.as_ref()?.strategy.as_ref()?.type_.as_deref(),
            Self::StatefulSet(set) => {
                let strategy = set.spec.as_ref()?.update_strategy.as_ref()?;
                strategy.type_.as_deref()
            }
            Self::DaemonSet(set) => {
                let strategy = set.spec.as_ref()?.update_strategy.as_ref()?;
                strategy.type_.as_deref()
            }
        }
    }

    /// Why it says a rollout must not restart it: opted out, or updated only on delete.
    pub fn not_restartable(&self) -> Option<NotRestartable> {
        if opted_out(self.metadata().annotations.as_ref()) {
            Some(NotRestartable::OptedOut)
        } else if self.update_strategy() == Some(ON_DELETE) {
            Some(NotRestartable::OnDelete)
        } else {
            None
        }
    }
}

/// Whether `annotations` (a workload's) opt it out of rollouts: `sidecar.dev/rollout:
/// disabled`, in any case, spaces around it ignored.
pub fn opted_out(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ROLLOUT_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(ROLLOUT_DISABLED))
}

#[cfg(test)]
mod tests;
