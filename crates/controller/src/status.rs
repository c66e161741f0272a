//! A template's `status` and the events that explain it.
//!
//! [`desired_status`] turns the outcome of compiling a template into the status the controller
//! wants: one `Ready` condition, `True`/`Valid` naming the webhook entry that serves the
//! template, or `False`/`Invalid` with every validation message, both stamped with the
//! generation they describe. A required template whose current generation is invalid but whose
//! last valid generation stays in force also gets `Degraded=True`/`InvalidGenerationKept`,
//! naming that generation and every validation message. A valid template the webhook
//! configuration has no room for gets `Ready=False`/`NotServed`
//! ([`desired_status_not_served`]), and so does a template the `policy` backend cannot inject.
//! [`with_policy`] adds `PolicyServed` (which backend serves it), [`with_rollout`] adds
//! `status.rollout` and `RolloutBlocked`, and [`with_counts`] the census's Pod counts, with
//! `status.observedGeneration` only once they were counted for that generation
//! ([`counts_for`]). [`needs_update`]
//! tells whether that status differs from the one in the cluster on anything but
//! `lastTransitionTime`, so that a resync of an unchanged template writes nothing. They are
//! pure.
//!
//! [`write_status`] applies a status to the `status` subresource, and [`record_invalid`]
//! publishes a `Warning` event on an invalid template (`kubectl describe` shows it), reason
//! `Invalid`, or `InvalidGenerationKept` when its last valid generation stays in force
//! ([`record_kept`]), or `NotServed` ([`record_not_served`]); [`record_stale`] and
//! [`record_restart`] publish the `Normal` events `PodsStale` and `Restarted`. They are the
//! only functions here that talk to the API server.

use injector_api::{
    FailurePolicy, LastValid, RolloutStatus, SidecarTemplate, SidecarTemplateStatus, WorkloadRef,
};
use injector_core::after_admission::lifecycle::Tally;
use injector_core::after_admission::rollout::states;
use injector_core::registry::in_force::Kept;
use injector_core::{GroupId, ValidationErrors};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Resource};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use crate::webhook_config::entry_name;

/// The type of the condition the controller owns.
pub const READY: &str = "Ready";

/// The type of the condition saying an invalid required template's last valid generation is
/// still in force.
pub const DEGRADED: &str = "Degraded";

/// The reason of a `Degraded=True` condition, and of the event on such a template.
pub const REASON_INVALID_GENERATION_KEPT: &str = "InvalidGenerationKept";

/// The type of the condition saying a template's rollout cannot go on (`Halted`: a
/// restarted workload made no progress in time; `Forbidden`: the operator may not restart
/// workloads).
pub const ROLLOUT_BLOCKED: &str = "RolloutBlocked";

/// The type of the condition saying a required template selects every namespace (no
/// `namespaceSelector`, or one that only excludes): a typo's reach is the whole cluster, and
/// while the injector is down no selected Pod can be created there.
pub const WIDE_SELECTION: &str = "WideSelection";

/// The condition types the controller owns: one it no longer wants is removed.
const OWNED: [&str; 5] = [
    READY,
    DEGRADED,
    ROLLOUT_BLOCKED,
    POLICY_SERVED,
    WIDE_SELECTION,
];

/// The reason of a `Ready=True` condition.
pub const REASON_VALID: &str = "Valid";

/// The reason of a `Ready=False` condition, and of the event on an invalid template.
pub const REASON_INVALID: &str = "Invalid";

/// The reason of a `Ready=False` condition on a valid template that has no webhook entry
/// (the configuration would not fit with it), and of the event on it.
pub const REASON_NOT_SERVED: &str = "NotServed";

/// The action of the event on a template that has no webhook entry.
pub const ACTION_SERVE: &str = "Serve";

/// The reason of the `Normal` event on a template whose change left Pods stale.
pub const REASON_PODS_STALE: &str = "PodsStale";

/// The action of the event on a template whose change left Pods stale.
pub const ACTION_COUNT: &str = "Count";

/// The reason of the `Normal` event on a template whose rollout restarted a workload.
pub const REASON_RESTARTED: &str = "Restarted";

/// The action of the event on a template whose rollout restarted a workload.
pub const ACTION_RESTART: &str = "Restart";

/// The action of the event on an invalid template.
pub const ACTION_VALIDATE: &str = "Validate";

/// The longest event note the events API accepts, in bytes.
pub const NOTE_MAX_BYTES: usize = 1024;

/// The longest condition message written, in bytes: the `maxLength` of `metav1.Condition`'s
/// message, which this CRD's schema does not declare but which keeps a template with hundreds
/// of problems from bloating its status.
pub const CONDITION_MESSAGE_MAX_BYTES: usize = 32 * 1024;

/// What is appended to a message cut short.
const ELLIPSIS: char = '…';

/// The status `template` should have, given the outcome of compiling it (at time `now`): the
/// id of the selector group that serves it, or every validation error.
///
/// The `Ready` condition's `lastTransitionTime` is `now` only when its status changes (or it
/// had none): while the status stays the same, the existing time is kept, as the condition
/// convention requires.
pub fn desired_status(
    template: &SidecarTemplate,
    outcome: &Result<GroupId, ValidationErrors>,
    now: Time,
) -> SidecarTemplateStatus {
    desired_status_kept(template, outcome, None, now)
}

/// [`desired_status`], for a required template whose invalid generation did not replace the
/// last valid one: `kept` is that generation (still in force), which adds `Degraded=True`,
/// reason `InvalidGenerationKept`, with every validation message.
pub fn desired_status_kept(
    template: &SidecarTemplate,
    outcome: &Result<GroupId, ValidationErrors>,
    kept: Option<&Kept>,
    now: Time,
) -> SidecarTemplateStatus {
    let (status, reason, message) = match outcome {
        Ok(group) => (
            "True",
            REASON_VALID,
            format!("in use; served by webhook entry {}", entry_name(group)),
        ),
        Err(errors) => (
            "False",
            REASON_INVALID,
            truncate(invalid_message(errors), CONDITION_MESSAGE_MAX_BYTES),
        ),
    };
    let degraded = match (kept, outcome) {
        (Some(kept), Err(errors)) => Some(truncate(
            kept_message(template, errors, kept),
            CONDITION_MESSAGE_MAX_BYTES,
        )),
        _ => None,
    };
    status_with(
        template,
        (status, reason, message),
        degraded,
        last_valid(template, outcome.is_ok(), kept.is_some()),
        now,
    )
}

/// The status of a valid `template` that has no webhook entry, because the configuration
/// would not fit with it (docs/architecture.md, decision 19): `Ready=False`, reason
/// `NotServed`, saying `why`.
pub fn desired_status_not_served(
    template: &SidecarTemplate,
    why: &str,
    now: Time,
) -> SidecarTemplateStatus {
    let message = truncate(not_served_message(why), CONDITION_MESSAGE_MAX_BYTES);
    status_with(
        template,
        ("False", REASON_NOT_SERVED, message),
        None,
        last_valid(template, true, false),
        now,
    )
}

fn not_served_message(why: &str) -> String {
    format!("valid, but not in use: {why}")
}

/// A status with a `Ready` condition saying `ready` (status, reason, message), and a
/// `Degraded=True`/`InvalidGenerationKept` condition saying `degraded` if there is one.
/// A condition keeps its `lastTransitionTime` while its status stays the same.
fn status_with(
    template: &SidecarTemplate,
    (status, reason, message): (&str, &str, String),
    degraded: Option<String>,
    last_valid: Option<LastValid>,
    now: Time,
) -> SidecarTemplateStatus {
    let generation = template.metadata.generation;
    let existing = |type_: &str| {
        template
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    };
    let since = |type_: &str, status: &str| {
        existing(type_)
            .filter(|existing| existing.status == status)
            .map_or(now.clone(), |existing| {
                existing.last_transition_time.clone()
            })
    };
    let mut conditions = vec![Condition {
        type_: READY.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: since(READY, status),
        observed_generation: generation,
    }];
    // The rollout's condition is the rollout loop's ([`with_rollout`]); until it has decided,
    // the one in the cluster stays.
    conditions.extend(existing(ROLLOUT_BLOCKED).cloned());
    if let Some(message) = degraded {
        conditions.push(Condition {
            type_: DEGRADED.to_owned(),
            status: "True".to_owned(),
            reason: REASON_INVALID_GENERATION_KEPT.to_owned(),
            message,
            last_transition_time: since(DEGRADED, "True"),
            observed_generation: generation,
        });
    }
    if let Some((reason, message)) = wide_selection(template) {
        conditions.push(Condition {
            type_: WIDE_SELECTION.to_owned(),
            status: "True".to_owned(),
            reason: reason.to_owned(),
            message,
            last_transition_time: since(WIDE_SELECTION, "True"),
            observed_generation: generation,
        });
    }
    SidecarTemplateStatus {
        conditions,
        observed_generation: generation,
        last_valid,
        // The Pod counts are the census's ([`with_counts`]); until it has counted, the counts
        // in the cluster stay.
        pods: template.status.as_ref().and_then(|status| status.pods),
        // The rollout's state is the rollout loop's, kept the same way.
        rollout: template
            .status
            .as_ref()
            .and_then(|status| status.rollout.clone()),
    }
}

/// Why a required template selects every namespace but the few never injected, if it does:
/// the reason and message of its `WideSelection` condition (the chart's template-safety
/// policy warns at `kubectl apply` time for the same).
fn wide_selection(template: &SidecarTemplate) -> Option<(&'static str, String)> {
    if template.spec.failure_policy != FailurePolicy::Fail {
        return None;
    }
    let reason = match &template.spec.namespace_selector {
        None => "NoNamespaceSelector",
        Some(selector) => {
            let includes = selector
                .match_labels
                .as_ref()
                .is_some_and(|l| !l.is_empty())
                || selector
                    .match_expressions
                    .iter()
                    .flatten()
                    .any(|e| e.operator == "In" || e.operator == "Exists");
            if includes {
                return None;
            }
            "ExcludingSelectorOnly"
        }
    };
    Some((
        reason,
        "the template is required and its namespaceSelector selects every namespace but the \
         few never injected: a Pod it selects anywhere is refused while it cannot be injected \
         (the injector down, a bad edit); give it a namespaceSelector that names the namespaces \
         it is for"
            .to_owned(),
    ))
}

/// The condition saying whether a MutatingAdmissionPolicy serves the template (`auto`
/// backend only).
pub const POLICY_SERVED: &str = "PolicyServed";

/// Where the policy backend stands, as the leader's policy loop last saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyState {
    /// The policy's name.
    pub policy: String,
    /// Whether the API server serves MutatingAdmissionPolicies.
    pub available: bool,
    /// The templates the policy in force serves.
    pub served: BTreeSet<String>,
    /// The templates the policy does not serve: the condition's reason (`NotExpressible`,
    /// `PolicyFull`) and why.
    pub webhook_only: BTreeMap<String, (&'static str, String)>,
    /// Why the last proof or apply failed (the policy in force stays).
    pub failure: Option<String>,
    /// Per template the policy in force serves, the CEL condition that a Pod carries it as
    /// the policy adds it (the webhook entries skip such Pods).
    pub present: BTreeMap<String, String>,
    /// The required templates the guard in force refuses every selected Pod for, and why
    /// (`policy` backend): not proven yet, their proof failed, or no policy can serve them.
    pub refused: BTreeMap<String, String>,
}

/// `desired` with its `PolicyServed` condition: `True`/`Served` when the policy in force
/// serves the template, else `False` with why (`NotExpressible`, `NotAvailable`,
/// `ProofFailed`, `NotProven` while the guard refuses its Pods until its proof ends); none
/// while the backend is off or has not decided yet.
///
/// `webhook_behind`: the webhook serves what the policy does not (`auto`); without it (the
/// `policy` backend) such a template is not injected.
pub fn with_policy(
    template: &SidecarTemplate,
    mut desired: SidecarTemplateStatus,
    state: Option<&PolicyState>,
    webhook_behind: bool,
    now: Time,
) -> SidecarTemplateStatus {
    desired.conditions.retain(|c| c.type_ != POLICY_SERVED);
    let Some(state) = state else {
        return desired;
    };
    let name = template.metadata.name.as_deref().unwrap_or_default();
    let otherwise = if webhook_behind {
        "served by the webhook"
    } else {
        "not injected"
    };
    let (status, reason, message) = if state.served.contains(name) {
        let mut message = format!(
            "injected by the API server from MutatingAdmissionPolicy {}",
            state.policy
        );
        message.push_str(if webhook_behind {
            "; the webhook stays installed as the safety net"
        } else {
            "; no webhook is called"
        });
        if let Some(failure) = &state.failure {
            message.push_str(&format!(
                " (a newer policy failed and was not applied: {failure})"
            ));
        }
        ("True", "Served", message)
    } else if let Some((reason, why)) = state.webhook_only.get(name) {
        ("False", *reason, format!("{otherwise}: {why}"))
    } else if !state.available {
        (
            "False",
            "NotAvailable",
            format!(
                "{otherwise}: the API server does not serve MutatingAdmissionPolicies (admissionregistration.k8s.io/v1, Kubernetes 1.36+)"
            ),
        )
    } else if let Some(why) = state.refused.get(name) {
        // Only the guard says what is in force: the Pods it selects are refused.
        let reason = if state.failure.is_some() {
            "ProofFailed"
        } else {
            "NotProven"
        };
        (
            "False",
            reason,
            format!("{otherwise}: {why}; it is required, so the guard refuses the Pods it selects"),
        )
    } else if let Some(failure) = &state.failure {
        (
            "False",
            "ProofFailed",
            format!("{otherwise}: the generated policy failed and was not applied: {failure}"),
        )
    } else {
        return desired;
    };
    let since = template
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == POLICY_SERVED))
        .filter(|c| c.status == status)
        .map_or(now, |c| c.last_transition_time.clone());
    desired.conditions.push(Condition {
        type_: POLICY_SERVED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: truncate(message, CONDITION_MESSAGE_MAX_BYTES),
        last_transition_time: since,
        observed_generation: template.metadata.generation,
    });
    desired
}

/// With the `policy` backend, why `name` is not injected: `None` when the policy in force
/// serves it (or the backend has not decided yet). A required template adds that the guard
/// refuses the Pods it selects.
pub fn not_injected_by_policy(
    state: Option<&PolicyState>,
    name: &str,
    required: bool,
) -> Option<String> {
    let state = state?;
    if state.served.contains(name) {
        return None;
    }
    let mut why = if let Some((_, why)) = state.webhook_only.get(name) {
        format!("the injection backend is policy, and a policy cannot serve it: {why}")
    } else if !state.available {
        "the injection backend is policy, and the API server does not serve MutatingAdmissionPolicies (Kubernetes 1.36+)".to_owned()
    } else if let Some(why) = state.refused.get(name) {
        why.clone()
    } else if let Some(failure) = &state.failure {
        let why =
            format!("the injection backend is policy, and the generated policy failed: {failure}");
        // The guard in force does not refuse all its Pods (or is not known yet): claim no more
        // than it enforces.
        return Some(if required {
            format!(
                "{why}; it is required, so the guard refuses the Pods it selects unless they carry a version the policy in force injects"
            )
        } else {
            why
        });
    } else {
        return None;
    };
    if required {
        why.push_str("; it is required, so the Pods it selects are refused");
    }
    Some(why)
}

/// `desired`, whose template the policy serves, saying so in its `Ready` condition (rather than
/// naming a webhook entry: with the `policy` backend there is none).
pub fn in_use_by_policy(mut desired: SidecarTemplateStatus, policy: &str) -> SidecarTemplateStatus {
    for condition in &mut desired.conditions {
        if condition.type_ == READY && condition.status == "True" {
            condition.message =
                format!("in use; injected by the API server from MutatingAdmissionPolicy {policy}");
        }
    }
    desired
}

/// `desired` with the rollout the rollout loop decided for `template` (`None`: it has no
/// rollout, its strategy is `OnCreate`): `status.rollout`, and `RolloutBlocked=True` naming
/// why when the rollout is halted or forbidden.
pub fn with_rollout(
    template: &SidecarTemplate,
    mut desired: SidecarTemplateStatus,
    rollout: Option<&RolloutStatus>,
    now: Time,
) -> SidecarTemplateStatus {
    desired.conditions.retain(|c| c.type_ != ROLLOUT_BLOCKED);
    let blocked = rollout.filter(|r| r.state == states::HALTED || r.state == states::FORBIDDEN);
    if let Some(rollout) = blocked {
        let since = template
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == ROLLOUT_BLOCKED))
            .filter(|c| c.status == "True")
            .map_or(now, |c| c.last_transition_time.clone());
        desired.conditions.push(Condition {
            type_: ROLLOUT_BLOCKED.to_owned(),
            status: "True".to_owned(),
            reason: rollout.state.clone(),
            message: truncate(
                rollout.message.clone().unwrap_or_default(),
                CONDITION_MESSAGE_MAX_BYTES,
            ),
            last_transition_time: since,
            observed_generation: template.metadata.generation,
        });
    }
    desired.rollout = rollout.cloned();
    desired
}

/// Where a template's Pod counts stand for the generation it is observed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counts {
    /// The census counted its Pods against the generation in force for it.
    Counted(Tally),
    /// No generation of it is in force (invalid, none kept): no Pod is counted.
    NotInForce,
    /// The census has not counted against that generation yet (it counts at most once a
    /// second, and a new leader only after its first list).
    Pending,
}

/// Where the Pod counts of a template stand: `in_force` is the generation of it in force for
/// the generation observed ([`injector_core::registry::in_force::Observed::generation_in_force`]),
/// `census` what the leader's latest census counted of it: the generation of it in force
/// then, with the tally (`Some(None)`: none was in force; `None`: no census yet).
pub fn counts_for(in_force: Option<i64>, census: Option<Option<(i64, Tally)>>) -> Counts {
    match (in_force, census) {
        (None, _) => Counts::NotInForce,
        (Some(wanted), Some(Some((counted, tally)))) if counted == wanted => Counts::Counted(tally),
        (Some(_), _) => Counts::Pending,
    }
}

/// `desired` with `status.pods` for `counts`, and `status.observedGeneration` advanced only
/// with them: while the census has not counted the generation observed, both stay as they
/// are in the cluster, so that whoever waits for `observedGeneration` to reach the
/// generation never reads the counts of an earlier one beside it. The conditions carry their
/// own `observedGeneration` and advance at once.
pub fn with_counts(
    template: &SidecarTemplate,
    mut desired: SidecarTemplateStatus,
    counts: Counts,
) -> SidecarTemplateStatus {
    match counts {
        Counts::Counted(tally) => desired.pods = Some(tally.into()),
        Counts::NotInForce => desired.pods = None,
        Counts::Pending => {
            let existing = template.status.as_ref();
            desired.observed_generation = existing.and_then(|s| s.observed_generation);
            desired.pods = existing.and_then(|s| s.pods);
        }
    }
    desired
}

/// What `status.lastValid` should say: for a valid required template, this generation and its
/// spec; for an invalid one whose last valid generation stays in force, what the status says
/// already (so that replicas started later keep it too); otherwise nothing.
fn last_valid(template: &SidecarTemplate, valid: bool, kept: bool) -> Option<LastValid> {
    if valid {
        let required = template.spec.failure_policy == FailurePolicy::Fail;
        let spec = serde_json::to_value(&template.spec).ok()?;
        return required.then(|| LastValid {
            generation: template.metadata.generation.unwrap_or_default(),
            spec,
        });
    }
    if kept {
        return template.status.as_ref()?.last_valid.clone();
    }
    None
}

/// What a `Degraded` condition and its event say: the generation in force, then every
/// validation message (last, so that cutting a long message keeps the generation).
fn kept_message(template: &SidecarTemplate, errors: &ValidationErrors, kept: &Kept) -> String {
    format!(
        "generation {} is invalid; the last valid generation, {}, stays in force (webhook entry {}) until the template is fixed or deleted: {}",
        template.metadata.generation.unwrap_or_default(),
        kept.generation,
        entry_name(&kept.group),
        invalid_message(errors)
    )
}

/// Whether `desired` should be written over `existing` (the status in the cluster).
///
/// Only what the controller owns is compared: `observedGeneration` and the conditions of
/// `desired`, each with the existing condition of the same type, `lastTransitionTime` left out,
/// and whether a condition type the controller owns (`Ready`, `Degraded`) is there but no
/// longer wanted. Conditions of other types, which other writers may own, do not count.
pub fn needs_update(
    existing: Option<&SidecarTemplateStatus>,
    desired: &SidecarTemplateStatus,
) -> bool {
    let Some(existing) = existing else {
        return true;
    };
    existing.observed_generation != desired.observed_generation
        || existing.last_valid != desired.last_valid
        || existing.pods != desired.pods
        || existing.rollout != desired.rollout
        || desired.conditions.iter().any(|want| {
            existing
                .conditions
                .iter()
                .find(|have| have.type_ == want.type_)
                .is_none_or(|have| !same_but_time(have, want))
        })
        // A condition the controller owns and no longer wants (Degraded, once fixed): the
        // apply removes it.
        || existing.conditions.iter().any(|have| {
            OWNED.contains(&have.type_.as_str())
                && !desired.conditions.iter().any(|want| want.type_ == have.type_)
        })
}

/// Writes `status` to the `status` subresource of the template `name`.
///
/// Server-side apply, not a JSON merge patch: `conditions` is a list map keyed by `type`, so an
/// apply merges the `Ready` entry and leaves conditions other writers own, where a merge patch
/// replaces the whole list. The apply needs no resourceVersion, so it never conflicts with a
/// concurrent spec edit, and it is forced because the controller is the only rightful owner of
/// these fields: an edit by hand (`kubectl edit --subresource=status`) is overwritten rather
/// than failing every write.
pub async fn write_status(
    api: &Api<SidecarTemplate>,
    name: &str,
    status: &SidecarTemplateStatus,
) -> Result<(), kube::Error> {
    // Only apiVersion, kind and status: any other field in the body would be claimed by the
    // field manager.
    #[derive(Debug, Serialize)]
    #[serde(rename_all = "camelCase")]
    struct StatusApply<'a> {
        api_version: &'a str,
        kind: &'a str,
        status: &'a SidecarTemplateStatus,
    }
    let body = StatusApply {
        api_version: &SidecarTemplate::api_version(&()),
        kind: &SidecarTemplate::kind(&()),
        status,
    };
    api.patch_status(
        name,
        &PatchParams::apply(crate::FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Publishes a `Warning` event, reason `Invalid`, action `Validate`, on `template`, its note
/// every validation message (cut to [`NOTE_MAX_BYTES`]).
///
/// The template is cluster-scoped, so the event lands in the `default` namespace. `recorder`
/// should live as long as the controller: it folds a repeat of the same event about the same
/// version of the template, within six minutes, into the first one (a series count) instead of
/// creating another.
pub async fn record_invalid(
    recorder: &Recorder,
    template: &SidecarTemplate,
    errors: &ValidationErrors,
) -> Result<(), kube::Error> {
    let note = invalid_message(errors);
    warn_about(recorder, template, REASON_INVALID, ACTION_VALIDATE, note).await
}

/// Publishes a `Warning` event, reason `InvalidGenerationKept`, action `Validate`, on a
/// required `template` whose invalid generation did not replace the last valid one, `kept`;
/// its note names that generation and every validation message (cut to [`NOTE_MAX_BYTES`]).
/// Folded like [`record_invalid`]'s.
pub async fn record_kept(
    recorder: &Recorder,
    template: &SidecarTemplate,
    errors: &ValidationErrors,
    kept: &Kept,
) -> Result<(), kube::Error> {
    let note = kept_message(template, errors, kept);
    let reason = REASON_INVALID_GENERATION_KEPT;
    warn_about(recorder, template, reason, ACTION_VALIDATE, note).await
}

/// Publishes a `Warning` event, reason `NotServed`, action `Serve`, on a valid `template` that
/// has no webhook entry, its note saying `why`. Folded like [`record_invalid`]'s.
pub async fn record_not_served(
    recorder: &Recorder,
    template: &SidecarTemplate,
    why: &str,
) -> Result<(), kube::Error> {
    let note = not_served_message(why);
    warn_about(recorder, template, REASON_NOT_SERVED, ACTION_SERVE, note).await
}

/// Publishes a `Normal` event, reason `PodsStale`, action `Count`, on `template`, whose
/// change left `tally.stale` of the Pods carrying it with an earlier version.
pub async fn record_stale(
    recorder: &Recorder,
    template: &SidecarTemplate,
    tally: Tally,
) -> Result<(), kube::Error> {
    let note = stale_message(template, tally);
    publish(
        recorder,
        template,
        EventType::Normal,
        REASON_PODS_STALE,
        ACTION_COUNT,
        note,
    )
    .await
}

/// Publishes a `Normal` event, reason `Restarted`, action `Restart`, on `template`, whose
/// rollout restarted `workload` for its generation `generation`.
pub async fn record_restart(
    recorder: &Recorder,
    template: &SidecarTemplate,
    generation: i64,
    workload: &WorkloadRef,
) -> Result<(), kube::Error> {
    let note = format!(
        "restarted {workload} so that its Pods get generation {generation} of this template"
    );
    // The workload as the related object: one event per workload (the recorder folds events
    // by regarding, related, reason and action).
    let related = ObjectReference {
        api_version: Some("apps/v1".to_owned()),
        kind: Some(workload.kind.clone()),
        namespace: Some(workload.namespace.clone()),
        name: Some(workload.name.clone()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: REASON_RESTARTED.to_owned(),
        note: Some(truncate(note, NOTE_MAX_BYTES)),
        action: ACTION_RESTART.to_owned(),
        secondary: Some(related),
    };
    recorder.publish(&event, &template.object_ref(&())).await
}

/// The note of the `PodsStale` event.
pub fn stale_message(template: &SidecarTemplate, tally: Tally) -> String {
    let generation = template.metadata.generation.unwrap_or_default();
    let name = template.metadata.name.as_deref().unwrap_or_default();
    format!(
        "{} of the {} Pods carrying this template have an earlier version of what it injects \
         (now generation {generation}); they get the new one when they are created again \
         ('kubectl sidecar status {name}' lists their workloads)",
        tally.stale,
        tally.injected()
    )
}

/// Publishes a `Warning` event on `template` (its note cut to [`NOTE_MAX_BYTES`]).
async fn warn_about(
    recorder: &Recorder,
    template: &SidecarTemplate,
    reason: &str,
    action: &str,
    note: String,
) -> Result<(), kube::Error> {
    publish(recorder, template, EventType::Warning, reason, action, note).await
}

/// Publishes an event of `type_` on `template` (its note cut to [`NOTE_MAX_BYTES`]).
async fn publish(
    recorder: &Recorder,
    template: &SidecarTemplate,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) -> Result<(), kube::Error> {
    let mut regarding = template.object_ref(&());
    // The recorder folds repeats by reference, reason and action, not by note, and a folded
    // repeat keeps the first note: naming the resourceVersion makes an edited template (with
    // different problems) a new event, while a resync of the same version is still folded.
    regarding.resource_version = template.metadata.resource_version.clone();
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note, NOTE_MAX_BYTES)),
        action: action.to_owned(),
        secondary: None,
    };
    recorder.publish(&event, &regarding).await
}

/// Every validation message (`path: message`), joined with `; `.
fn invalid_message(errors: &ValidationErrors) -> String {
    errors.messages().join("; ")
}

/// The `Ready` condition of `status`, if it has one.
#[cfg(test)]
fn ready_condition(status: &SidecarTemplateStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == READY)
}

/// Whether two conditions say the same thing, whenever they last changed.
fn same_but_time(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

/// `text` cut to at most `max` bytes on a character boundary, ending in an ellipsis when cut.
pub(crate) fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub(ELLIPSIS.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push(ELLIPSIS);
    text
}

#[cfg(test)]
mod tests;
