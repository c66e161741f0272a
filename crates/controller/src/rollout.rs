//! The leader's rollouts (`updateStrategy: RollingRestart`): the workloads that own a
//! template's stale or missing Pods are restarted, a few at a time, the way
//! `kubectl rollout restart` does (an annotation on the Pod template), each once per version
//! of what the template injects.
//!
//! The decision is [`injector_core::after_admission::rollout::next_restarts`]; this module finds the workloads
//! behind the census's Pods (a ReplicaSet resolves to its Deployment), reads where each one's
//! rollout stands, asks the API server whether the operator may restart workloads at all
//! (a `SelfSubjectAccessReview`: the chart grants it only with `rollouts.enabled`), and makes
//! the restarts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use injector_api::{
    DEFAULT_PROGRESS_DEADLINE_SECONDS, RolloutStatus, UpdateStrategyType, WorkloadRef,
};
use injector_core::CompiledTemplate;
use injector_core::after_admission::lifecycle::{PodState, carried};
use injector_core::after_admission::rollout::{
    WorkloadState, in_place_patch, is_ready, max_unavailable, next_restarts, restarted_for,
    restarted_for_entry, states, updated_in_place,
};
use injector_core::after_admission::workload::{Workload, owner_of, restarted_through_its_owner};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use tokio::time::Instant;

use crate::census::{Counted, PodRecord};

mod workloads;

pub use workloads::{
    WorkloadView, daemon_set_view, deployment_view, restart_patch, stateful_set_view,
};

/// How long a permission check is trusted.
const PERMISSION_TTL: Duration = Duration::from_secs(60);

/// What a round decided, by template name (templates with `RollingRestart` only).
pub type Rollouts = BTreeMap<String, RolloutStatus>;

/// Whether `template` is rolled out in place where it can be.
fn in_place(template: &CompiledTemplate) -> bool {
    template.update_strategy.type_ == UpdateStrategyType::InPlace
}

/// Why an API call of a rollout failed.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// What one round has seen and done so far, across its templates.
#[derive(Default)]
struct Round {
    /// For each workload behind some template, the `restarted-for` entries of every template
    /// it is behind for: a restart brings them all.
    wanted_by: BTreeMap<WorkloadRef, Vec<String>>,
    /// The workloads restarted this round.
    restarted: BTreeSet<WorkloadRef>,
    /// The (template, workload) pairs looked at.
    seen: BTreeSet<(String, WorkloadRef)>,
    /// The ReplicaSets resolved.
    replica_sets: BTreeSet<WorkloadRef>,
    /// The Pods considered for an update in place.
    candidates: BTreeSet<(String, String)>,
}

/// A template's work before its restarts.
struct Plan {
    /// The restartable workloads behind its stale and missing Pods, with how many.
    workloads: BTreeMap<WorkloadRef, u32>,
    /// Its stale and missing Pods without a restartable owner.
    not_restartable: u32,
    /// What updating its Pods in place did.
    in_place: InPlaceRound,
}

/// Where the workloads behind a template stand, read for its restarts.
#[derive(Default)]
struct Behind {
    /// What the decision reads of each one still there.
    states: Vec<WorkloadState>,
    /// Each one still there, as read.
    views: HashMap<WorkloadRef, WorkloadView>,
    /// The ones restarted for the template's version whose rollout has not completed.
    still_restarting: BTreeSet<WorkloadRef>,
    /// Its stale and missing Pods without a restartable owner (or whose workload is gone).
    not_restartable: u32,
}

/// Why `template`'s rollout halts when its Pod `pod`, updated in place, was not Ready in time.
fn halted_message(template: &CompiledTemplate, pod: &str) -> String {
    let seconds = template
        .update_strategy
        .progress_deadline_seconds
        .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS);
    format!(
        "pod {pod} was not Ready with its new images {seconds}s after they were set; nothing more is updated until it is or the template changes"
    )
}

/// A Pod updated in place and not done yet.
#[derive(Clone, Debug)]
struct InFlight {
    /// The workload that owns it (one Pod of a workload at a time).
    workload: WorkloadRef,
    /// When it was patched.
    since: Instant,
}

/// Where a template's updates in place stand while a round goes through its candidates.
struct InPlaceUpdates {
    /// The Pods updated and not done yet (`namespace`, `name`).
    in_flight: BTreeMap<(String, String), InFlight>,
    /// How many of its Pods may be not Ready at once (`maxUnavailable`)...
    budget: usize,
    /// ...and how many are: those in flight, and the stale ones found not Ready.
    unavailable: usize,
    /// The workloads with a Pod in flight: one of a workload at a time.
    busy: BTreeSet<WorkloadRef>,
    /// Whether each workload looked at opted out of restarts.
    opted_out: HashMap<WorkloadRef, bool>,
    result: InPlaceRound,
}

impl InPlaceUpdates {
    /// Whether a Pod of `workload` may be updated now: no Pod is stuck, the budget of Pods
    /// not Ready is not spent, and no other Pod of `workload` is in flight.
    fn may_start(&self, workload: &WorkloadRef) -> bool {
        self.result.stuck.is_none()
            && self.unavailable < self.budget
            && !self.busy.contains(workload)
    }

    /// Notes the Pod `key` of `workload`, just patched, as in flight.
    fn started(&mut self, key: (String, String), workload: WorkloadRef) {
        self.busy.insert(workload.clone());
        self.in_flight.insert(
            key,
            InFlight {
                workload,
                since: Instant::now(),
            },
        );
        self.unavailable += 1;
    }
}

/// The Pods of `pods` that carry an earlier version of `template` differing only in images
/// and are not being deleted, by namespace and name.
fn in_place_candidates<'a>(
    template: &CompiledTemplate,
    pods: &'a [Arc<PodRecord>],
) -> Vec<&'a PodRecord> {
    let mut candidates: Vec<&PodRecord> = pods
        .iter()
        .filter(|pod| !pod.deleting)
        .filter(|pod| carried(template, &pod.meta()) == Some(PodState::Stale { in_place: true }))
        .map(AsRef::as_ref)
        .collect();
    candidates.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    candidates
}

/// Sets the images of `template` on the Pod `name` with `patch` ([`in_place_patch`]);
/// `false` when that failed (it is tried again next round).
async fn patch_images(
    api: &Api<Pod>,
    template: &CompiledTemplate,
    namespace: &str,
    name: &str,
    patch: serde_json::Value,
) -> bool {
    match api
        .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(template = %template.name, pod = %name, %namespace, "images updated in place");
            true
        }
        Err(error) => {
            tracing::warn!(template = %template.name, pod = %name, %namespace, %error, "updating a Pod's images failed; trying again next round");
            false
        }
    }
}

/// What updating a template's Pods in place did this round.
#[derive(Default)]
struct InPlaceRound {
    /// The Pods being updated (`namespace/name`).
    updating: Vec<String>,
    /// The owners of stale Pods that cannot be updated in place: restarted instead.
    fallback: Vec<Option<WorkloadRef>>,
    /// Stale Pods without a restartable owner, or of an opted-out one: never touched.
    not_restartable: u32,
    /// A Pod updated in place that did not come back Ready in time.
    stuck: Option<String>,
}

/// The leader's rollout state across rounds. A new leader starts empty: what a restart was
/// for is on the workload (`sidecar.dev/restarted-for`), when it was made on its Pod template
/// (`sidecar.dev/restartedAt`).
pub struct RolloutDriver {
    client: Client,
    /// Each ReplicaSet's controlling owner (`None`: it has none, or is gone), as last
    /// resolved; only those seen in the last round are kept.
    replica_sets: HashMap<WorkloadRef, Option<WorkloadRef>>,
    /// Each template's restarting workloads: their last progress counts, and when they last
    /// changed.
    progress: HashMap<(String, WorkloadRef), ([i64; 4], Instant)>,
    /// The workloads each template restarted for its current version and that have not been
    /// seen complete: they keep their slot even once none of their Pods is stale any more.
    restarted: HashMap<String, BTreeSet<WorkloadRef>>,
    /// Whether the operator may restart workloads (and update Pods in place, first), and when
    /// that was asked.
    permitted: Option<(bool, Result<(), String>, Instant)>,
    /// `InPlace`: the Pods each template updated and that are not done yet.
    in_flight: HashMap<String, BTreeMap<(String, String), InFlight>>,
    /// Pods found not updatable in place, at their resourceVersion: not read again until it
    /// changes.
    not_in_place: HashMap<(String, String), String>,
}

impl RolloutDriver {
    /// A driver with nothing known yet (a new leader's term).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            replica_sets: HashMap::new(),
            progress: HashMap::new(),
            restarted: HashMap::new(),
            permitted: None,
            in_flight: HashMap::new(),
            not_in_place: HashMap::new(),
        }
    }

    /// One round over every template with `RollingRestart` or `InPlace`, counted in
    /// `counted`: what each one's rollout says, and the restarts and updates it calls for,
    /// made. `on_restart` hears of each restart made.
    pub async fn round(
        &mut self,
        counted: &Counted,
        mut on_restart: impl FnMut(&CompiledTemplate, &WorkloadRef),
    ) -> Rollouts {
        let mut rollouts = Rollouts::new();
        let rolling: Vec<&CompiledTemplate> = counted
            .snapshot
            .templates()
            .iter()
            .map(AsRef::as_ref)
            .filter(|t| t.update_strategy.type_ != UpdateStrategyType::OnCreate)
            .collect();
        self.in_flight
            .retain(|name, _| rolling.iter().any(|t| &t.name == name && in_place(t)));
        self.restarted
            .retain(|name, _| rolling.iter().any(|t| &t.name == name));
        if rolling.is_empty() {
            self.progress.clear();
            self.replica_sets.clear();
            self.not_in_place.clear();
            return rollouts;
        }
        let permitted = self.permitted(rolling.iter().any(|t| in_place(t))).await;
        if let Err(why) = permitted {
            // Without the permission, not even the ReplicaSets are read (they would be refused).
            for template in rolling {
                let status = RolloutStatus {
                    state: states::FORBIDDEN.to_owned(),
                    message: Some(why.clone()),
                    ..RolloutStatus::default()
                };
                rollouts.insert(template.name.clone(), status);
            }
            return rollouts;
        }
        let mut round = Round::default();
        // First every template's Pods updated in place and the workloads behind the rest, so
        // that a restart brings every template's new version at once (and is made once).
        let mut plans = Vec::new();
        for template in &rolling {
            let plan = self.plan(template, counted, &mut round).await;
            for workload in plan.workloads.keys() {
                round
                    .wanted_by
                    .entry(workload.clone())
                    .or_default()
                    .push(restarted_for_entry(
                        &template.name,
                        &template.fingerprint.to_string(),
                    ));
            }
            plans.push(plan);
        }
        for (template, plan) in rolling.iter().zip(plans) {
            let status = self
                .restarts(template, plan, &mut round, &mut on_restart)
                .await;
            rollouts.insert(template.name.clone(), status);
        }
        self.progress.retain(|key, _| round.seen.contains(key));
        self.replica_sets
            .retain(|key, _| round.replica_sets.contains(key));
        self.not_in_place
            .retain(|key, _| round.candidates.contains(key));
        rollouts
    }

    /// A template's Pods updated in place (`InPlace`, when only images changed), and the
    /// workloads behind the rest of its stale and missing Pods.
    async fn plan(
        &mut self,
        template: &CompiledTemplate,
        counted: &Counted,
        round: &mut Round,
    ) -> Plan {
        let census = counted.census.get(&template.name);
        let mut behind = census.map(|c| c.behind.clone()).unwrap_or_default();
        let mut in_place_round = InPlaceRound::default();
        if in_place(template) {
            // The Pods stale only in images are updated in place, not restarted...
            for (owner, pods) in census.map(|c| &c.in_place).into_iter().flatten() {
                if let Some(count) = behind.get_mut(owner) {
                    *count = count.saturating_sub(*pods);
                }
            }
            behind.retain(|_, count| *count > 0);
            let carrying = census.map_or(0, |c| c.tally.injected());
            in_place_round = self
                .update_in_place(template, &counted.pods, carrying, round)
                .await;
            // ...unless they cannot be: those are restarted.
            for owner in std::mem::take(&mut in_place_round.fallback) {
                *behind.entry(owner).or_default() += 1;
            }
        }
        let mut workloads: BTreeMap<WorkloadRef, u32> = BTreeMap::new();
        let mut not_restartable = in_place_round.not_restartable;
        for (owner, &pods) in &behind {
            match self.workload_of(owner.as_ref(), round).await {
                Some(workload) => *workloads.entry(workload).or_default() += pods,
                None => not_restartable += pods,
            }
        }
        Plan {
            workloads,
            not_restartable,
            in_place: in_place_round,
        }
    }

    /// A template's restarts: where each workload behind it stands, the decision, and the
    /// restarts it calls for.
    async fn restarts(
        &mut self,
        template: &CompiledTemplate,
        plan: Plan,
        round: &mut Round,
        on_restart: &mut impl FnMut(&CompiledTemplate, &WorkloadRef),
    ) -> RolloutStatus {
        let mut behind = self
            .workloads_behind(template, plan.workloads, plan.not_restartable, round)
            .await;
        let strategy = &template.update_strategy;
        let decision = next_restarts(strategy, &behind.states, behind.not_restartable);
        let mut status = decision.status;
        // A Pod updated in place that never came back halts the rollout like a workload.
        let halted = plan
            .in_place
            .stuck
            .as_ref()
            .map(|pod| halted_message(template, pod));
        if halted.is_none() {
            for workload in decision.restart {
                self.restart_for(
                    template,
                    workload,
                    &mut behind,
                    round,
                    &mut status,
                    on_restart,
                )
                .await;
            }
        }
        self.restarted
            .insert(template.name.clone(), behind.still_restarting);
        if let Some(message) = halted {
            status.state = states::HALTED.to_owned();
            status.message = Some(message);
        } else if !plan.in_place.updating.is_empty() && status.state == states::COMPLETE {
            status.state = states::PROGRESSING.to_owned();
        }
        status.updating = plan.in_place.updating;
        status
    }

    /// Where each workload behind `template` stands: those of its plan (`workloads`, with
    /// `not_restartable` Pods left over), and those restarted for its version whose rollout
    /// has not completed (they keep their slot even when none of their Pods is stale any
    /// more).
    async fn workloads_behind(
        &mut self,
        template: &CompiledTemplate,
        mut workloads: BTreeMap<WorkloadRef, u32>,
        not_restartable: u32,
        round: &mut Round,
    ) -> Behind {
        let entry = restarted_for_entry(&template.name, &template.fingerprint.to_string());
        for workload in self.restarted.get(&template.name).into_iter().flatten() {
            workloads.entry(workload.clone()).or_insert(0);
        }
        let mut behind = Behind {
            not_restartable,
            ..Behind::default()
        };
        for (workload, pods) in workloads {
            let view = match self.view(&workload).await {
                Ok(Some(view)) => view,
                // Gone: nothing restarts it (NotRestartable::Gone), and its Pods go with it.
                Ok(None) => {
                    behind.not_restartable += pods;
                    continue;
                }
                Err(error) => {
                    tracing::warn!(template = %template.name, %workload, %error, "reading a workload for its rollout failed");
                    continue;
                }
            };
            let restarted = restarted_for(view.restarted_for.as_deref(), &entry);
            let restarting = restarted && !view.complete;
            if restarting {
                behind.still_restarting.insert(workload.clone());
            }
            let key = (template.name.clone(), workload.clone());
            let since_progress = self.since_progress(&key, &view, restarting);
            round.seen.insert(key);
            behind.states.push(WorkloadState {
                workload: workload.clone(),
                opted_out: view.not_restartable.is_some(),
                restarted,
                complete: view.complete,
                since_progress,
                pods,
            });
            behind.views.insert(workload, view);
        }
        behind
    }

    /// Restarts `workload`, which the decision for `template` chose, with the entries of every
    /// template it is behind for, unless another template restarted it this round; a restart
    /// that failed leaves it waiting in `status`, for the next round.
    async fn restart_for(
        &mut self,
        template: &CompiledTemplate,
        workload: WorkloadRef,
        behind: &mut Behind,
        round: &mut Round,
        status: &mut RolloutStatus,
        on_restart: &mut impl FnMut(&CompiledTemplate, &WorkloadRef),
    ) {
        let Some(view) = behind.views.get(&workload) else {
            return;
        };
        let entries = round.wanted_by.get(&workload).cloned().unwrap_or_default();
        if round.restarted.contains(&workload) {
            // Restarted this round for another template, with this one's entry too.
            return;
        }
        match self.restart(&workload, view, &entries).await {
            Ok(()) => {
                tracing::info!(template = %template.name, %workload, "restarted for the template's new version");
                round.restarted.insert(workload.clone());
                self.progress.insert(
                    (template.name.clone(), workload.clone()),
                    (view.progress, Instant::now()),
                );
                behind.still_restarting.insert(workload.clone());
                on_restart(template, &workload);
            }
            Err(error) => {
                tracing::warn!(template = %template.name, %workload, %error, "restarting a workload failed; trying again next round");
                status.restarting.retain(|w| w != &workload);
                status.waiting += 1;
            }
        }
    }

    /// `InPlace`: the Pods of `pods` that carry an earlier version of `template` differing only
    /// in images get its images: only Pods of a restartable workload that has not opted out,
    /// one Pod of a workload at a time, and at most `maxUnavailable` (of the `carrying` Pods)
    /// not Ready at once (the ones updated and not done yet, and the stale ones found not
    /// Ready).
    async fn update_in_place(
        &mut self,
        template: &CompiledTemplate,
        pods: &[Arc<PodRecord>],
        carrying: u32,
        round: &mut Round,
    ) -> InPlaceRound {
        let strategy = &template.update_strategy;
        let mut result = InPlaceRound::default();
        let in_flight = self.still_in_flight(template, &mut result).await;
        let budget = max_unavailable(strategy.max_unavailable.as_ref(), carrying) as usize;
        let mut updates = InPlaceUpdates {
            unavailable: in_flight.len(),
            busy: in_flight.values().map(|f| f.workload.clone()).collect(),
            in_flight,
            budget,
            opted_out: HashMap::new(),
            result,
        };
        for candidate in in_place_candidates(template, pods) {
            self.consider_in_place(template, candidate, &mut updates, round)
                .await;
        }
        let InPlaceUpdates {
            in_flight,
            mut result,
            ..
        } = updates;
        result.updating = in_flight
            .keys()
            .map(|(namespace, name)| format!("{namespace}/{name}"))
            .collect();
        self.in_flight.insert(template.name.clone(), in_flight);
        result
    }

    /// The Pods `template` updated in place that are still in flight: those done (new images
    /// running, Ready) or gone are not. One past the progress deadline is `result`'s `stuck`.
    async fn still_in_flight(
        &mut self,
        template: &CompiledTemplate,
        result: &mut InPlaceRound,
    ) -> BTreeMap<(String, String), InFlight> {
        let deadline = Duration::from_secs(u64::from(
            template
                .update_strategy
                .progress_deadline_seconds
                .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS),
        ));
        let in_flight = self.in_flight.remove(&template.name).unwrap_or_default();
        let mut still = BTreeMap::new();
        for ((namespace, name), flight) in in_flight {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            let done = match api.get_opt(&name).await {
                Ok(Some(pod)) => {
                    pod.metadata.deletion_timestamp.is_some() || updated_in_place(template, &pod)
                }
                Ok(None) => true,
                Err(error) => {
                    tracing::warn!(pod = %name, %namespace, %error, "reading a Pod updated in place failed");
                    false
                }
            };
            if !done {
                if flight.since.elapsed() >= deadline {
                    result.stuck = Some(format!("{namespace}/{name}"));
                }
                still.insert((namespace, name), flight);
            }
        }
        still
    }

    /// Updates `candidate`, a Pod stale only in images, in place when it may be: a Pod of a
    /// restartable workload that has not opted out and has no other Pod in flight, within the
    /// budget of Pods not Ready, and Ready itself. One that cannot be updated in place is
    /// restarted instead (`fallback`).
    async fn consider_in_place(
        &mut self,
        template: &CompiledTemplate,
        candidate: &PodRecord,
        updates: &mut InPlaceUpdates,
        round: &mut Round,
    ) {
        let (namespace, name) = (&*candidate.namespace, &*candidate.name);
        let key = (namespace.to_owned(), name.to_owned());
        round.candidates.insert(key.clone());
        if updates.in_flight.contains_key(&key) {
            return;
        }
        let owner = candidate.workload().cloned();
        // Bare Pods, Jobs' and opted-out workloads' Pods are never touched.
        let Some(workload) = self.workload_of(owner.as_ref(), round).await else {
            updates.result.not_restartable += 1;
            return;
        };
        if self.opted_out(&workload, &mut updates.opted_out).await {
            updates.result.not_restartable += 1;
            return;
        }
        let version = candidate.resource_version.to_string();
        if self.not_in_place.get(&key) == Some(&version) {
            updates.result.fallback.push(owner);
            return;
        }
        if !updates.may_start(&workload) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = match api.get_opt(name).await {
            Ok(Some(pod)) => pod,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(pod = %name, %namespace, %error, "reading a Pod to update in place failed");
                return;
            }
        };
        if !is_ready(&pod) {
            // Not Ready already: it counts against the budget, and waits.
            updates.unavailable += 1;
            return;
        }
        let Some(patch) = in_place_patch(template, &pod) else {
            self.not_in_place.insert(key, version);
            updates.result.fallback.push(owner);
            return;
        };
        if patch_images(&api, template, namespace, name, patch).await {
            updates.started(key, workload);
        }
    }

    /// Whether `workload` opted out of restarts (or cannot be read), asked once a template's
    /// round and kept in `known`.
    async fn opted_out(
        &self,
        workload: &WorkloadRef,
        known: &mut HashMap<WorkloadRef, bool>,
    ) -> bool {
        if let Some(out) = known.get(workload) {
            return *out;
        }
        let out = match self.view(workload).await {
            Ok(Some(view)) => view.not_restartable.is_some(),
            Ok(None) | Err(_) => true,
        };
        known.insert(workload.clone(), out);
        out
    }

    /// How long since a template's restart of a workload last made progress (zero when it is
    /// not restarting). A restart first seen by this leader counts from when it was made.
    fn since_progress(
        &mut self,
        key: &(String, WorkloadRef),
        view: &WorkloadView,
        restarting: bool,
    ) -> Duration {
        let now = Instant::now();
        if !restarting {
            self.progress.remove(key);
            return Duration::ZERO;
        }
        let made = view
            .restarted_at
            .and_then(|at| {
                let ago = k8s_openapi::jiff::Timestamp::now().duration_since(at);
                Duration::try_from(ago).ok()
            })
            .and_then(|ago| now.checked_sub(ago))
            .unwrap_or(now);
        let (last, at) = self
            .progress
            .entry(key.clone())
            .or_insert((view.progress, made));
        if *last != view.progress {
            *last = view.progress;
            *at = now;
        }
        now.duration_since(*at)
    }

    /// The workload a rollout restarts for Pods owned by `owner` ([`Workload::behind`] it),
    /// if its kind is restartable; a ReplicaSet's owner is looked up, once a round.
    async fn workload_of(
        &mut self,
        owner: Option<&WorkloadRef>,
        round: &mut Round,
    ) -> Option<WorkloadRef> {
        let owner = owner?;
        let owners_owner = if restarted_through_its_owner(owner) {
            self.owner_of_replica_set(owner, round).await?
        } else {
            None
        };
        Workload::behind(owner, owners_owner.as_ref())
            .restartable()
            .cloned()
    }

    /// The controlling owner of the ReplicaSet `replica_set` (`Some(None)`: it has none, or is
    /// gone; `None`: it could not be read).
    async fn owner_of_replica_set(
        &mut self,
        replica_set: &WorkloadRef,
        round: &mut Round,
    ) -> Option<Option<WorkloadRef>> {
        round.replica_sets.insert(replica_set.clone());
        if let Some(owner) = self.replica_sets.get(replica_set) {
            return Some(owner.clone());
        }
        let api: Api<PartialObjectMeta<ReplicaSet>> =
            Api::namespaced(self.client.clone(), &replica_set.namespace);
        let owner = match api.get_metadata_opt(&replica_set.name).await {
            Ok(found) => found.and_then(|rs| owner_of(&rs.metadata)),
            Err(error) => {
                tracing::warn!(namespace = %replica_set.namespace, replica_set = %replica_set.name, %error, "reading a ReplicaSet's owner failed");
                return None;
            }
        };
        self.replica_sets.insert(replica_set.clone(), owner.clone());
        Some(owner)
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

    /// Restarts `workload` for `entries`.
    async fn restart(
        &self,
        workload: &WorkloadRef,
        view: &WorkloadView,
        entries: &[String],
    ) -> Result<(), RolloutError> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = Patch::Merge(restart_patch(view, entries, &now));
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
        match self.ask_permission(pods).await {
            Ok(answer) => {
                self.permitted = Some((pods, answer.clone(), Instant::now()));
                answer
            }
            // The API server could not answer: the last answer stands until it can.
            Err(error) => {
                tracing::warn!(%error, "asking the API server whether the operator may restart workloads failed");
                match &self.permitted {
                    Some((_, answer, _)) => answer.clone(),
                    None => Err(format!(
                        "cannot ask the API server whether the operator may restart workloads: {error}"
                    )),
                }
            }
        }
    }

    /// Asks the API server (one SelfSubjectAccessReview per verb and resource): `Ok(Err)`
    /// says what the operator may not do; `Err` that it could not be asked.
    async fn ask_permission(&self, pods: bool) -> Result<Result<(), String>, kube::Error> {
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
            let answer = api.create(&PostParams::default(), &review).await?;
            if !answer.status.as_ref().is_some_and(|s| s.allowed) {
                refused.push(if group.is_empty() {
                    format!("{verb} {resource}")
                } else {
                    format!("{verb} {resource}.{group}")
                });
            }
        }
        if refused.is_empty() {
            return Ok(Ok(()));
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
        Ok(Err(format!(
            "the operator may not {what} in every namespace, so it restarts nothing: install the chart with rollouts.enabled=true, or set updateStrategy.type OnCreate"
        )))
    }
}
