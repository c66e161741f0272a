//! The operator's world: what the watches and the leader's loops observed, in one value
//! ([`World`]), and what the leader writes, derived from that value alone: the webhook
//! configuration ([`World::configuration`]) and each template's status with the warning it
//! calls for ([`World::statuses`]).
//!
//! Pure: `operator` gathers the observations from its loops and applies the differences. Both
//! outputs come from one `World`, so they cannot tell two stories: the templates a status
//! calls `NotServed` are the ones the configuration derived from the same observations leaves
//! out, and a template's counts and `observedGeneration` come from one census of the
//! generation in force.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use injector_api::{FailurePolicy, SidecarTemplate, SidecarTemplateStatus};
use injector_core::registry::in_force::{Kept, Observed};
use injector_core::{GroupId, Snapshot, ValidationErrors};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::census::Counted;
use crate::policy_backend::Backend;
use crate::rollout::Rollouts;
use crate::status::{self, Counts, PolicyState};
use crate::webhook_config::{self, WebhookConfigOptions};

/// Everything the leader's writers derive their output from, as last observed.
#[derive(Clone)]
pub struct World<'o> {
    /// How the configuration is written.
    pub webhook: &'o WebhookConfigOptions,
    /// Which engine injects.
    pub backend: Backend,
    /// Every template as observed, with its validation outcome, in name order.
    pub templates: Vec<Observed>,
    /// The templates in force, as the webhook serves them.
    pub snapshot: Arc<Snapshot>,
    /// Whether the template watch has listed every template once.
    pub synced: bool,
    /// The caBundle the configuration carries (`None`: no CA yet).
    pub ca: Option<String>,
    /// The latest Pod census.
    pub census: Option<Counted>,
    /// The latest rollout decisions.
    pub rollouts: Option<Arc<Rollouts>>,
    /// Where the policy backend stands.
    pub policy: Option<Arc<PolicyState>>,
    /// The policy's presence conditions the API server refused in the webhook entries (an
    /// expression past its cost budget, say): the entries then go without them.
    pub skip_refused: Option<BTreeMap<String, String>>,
}

/// The webhook configuration a [`World`] calls for.
#[derive(Clone, Debug)]
pub struct Configuration {
    /// The configuration to apply.
    pub configuration: MutatingWebhookConfiguration,
    /// The caBundle it carries.
    pub ca: String,
    /// The valid templates it has no entry for (it would not fit with them).
    pub left_out: BTreeSet<String>,
    /// The presence conditions its entries skip the Pods the policy served by (empty: none).
    pub skips: BTreeMap<String, String>,
}

/// The status a template should have, and what its events are decided from.
#[derive(Clone, Debug)]
pub struct TemplateStatus {
    /// The template's name.
    pub name: String,
    /// The template as observed, pointed at the entry that serves it now.
    pub observed: Observed,
    /// The status it should have.
    pub desired: SidecarTemplateStatus,
    /// Its Pods, counted against the generation in force.
    pub counts: Counts,
    /// Whether it is valid but has no webhook entry.
    pub unserved: bool,
}

/// The warning a template's status calls for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Problem<'s> {
    /// Valid, with no webhook entry (`NotServed`).
    NotServed,
    /// Invalid, with nothing in force for it (`Invalid`).
    Invalid(&'s ValidationErrors),
    /// Invalid and required: its last valid generation stays (`InvalidGenerationKept`).
    InvalidKept(&'s ValidationErrors, &'s Kept),
}

/// Why a template has no webhook entry, for its status and event.
pub fn not_served_why() -> String {
    format!(
        "its webhook entry would take the configuration past {} bytes (too many, or too large, \
         distinct selectors across templates)",
        webhook_config::MAX_CONFIGURATION_BYTES
    )
}

impl World<'_> {
    /// The presence conditions of the policy in force (the Pods it provably served), empty
    /// when there is none.
    pub fn policy_present(&self) -> BTreeMap<String, String> {
        self.policy
            .as_ref()
            .map(|state| state.present.clone())
            .unwrap_or_default()
    }

    /// The webhook configuration the templates call for; `None` before there is a CA or
    /// before every template was listed once. Its entries skip the Pods the policy in force
    /// provably served, unless the API server refused those conditions. With the `policy`
    /// backend it has no entry: the webhook is not called.
    pub fn configuration(&self) -> Option<Configuration> {
        let ca = self.ca.clone()?;
        if !self.synced {
            return None;
        }
        let snapshot = if self.backend == Backend::Policy {
            Arc::new(Snapshot::default())
        } else {
            Arc::clone(&self.snapshot)
        };
        let present = self.policy_present();
        let skips = if self.skip_refused.as_ref() == Some(&present) {
            BTreeMap::new()
        } else {
            present
        };
        let configuration = webhook_config::desired_configuration_with_policy(
            &snapshot,
            self.webhook,
            ca.as_bytes(),
            &skips,
        );
        let left_out = webhook_config::left_out(&snapshot, &configuration)
            .into_iter()
            .flat_map(|group| group.templates.iter().map(|t| t.name.clone()))
            .collect();
        Some(Configuration {
            configuration,
            ca,
            left_out,
            skips,
        })
    }

    /// Every template's wanted status, in name order, at `now`.
    pub fn statuses(&self, now: &Time) -> Vec<TemplateStatus> {
        let not_served = self
            .configuration()
            .map(|configuration| configuration.left_out)
            .unwrap_or_default();
        let serving = serving_groups(&self.snapshot);
        self.templates
            .iter()
            .map(|observed| {
                let mut observed = observed.clone();
                let name = observed.template.metadata.name.clone().unwrap_or_default();
                name_serving_group(&mut observed, &serving, &name);
                self.status_of(observed, name, &not_served, now)
            })
            .collect()
    }

    /// The status `observed` (the template `name`) should have: why it is not served or its
    /// validation outcome, then its counts, its rollout and where the policy stands with it.
    fn status_of(
        &self,
        observed: Observed,
        name: String,
        not_served: &BTreeSet<String>,
        now: &Time,
    ) -> TemplateStatus {
        let template = &observed.template;
        let valid = observed.outcome.is_ok();
        let policy_only = self.backend == Backend::Policy;
        let not_injected = (policy_only && valid)
            .then(|| {
                status::not_injected_by_policy(
                    self.policy.as_deref(),
                    &name,
                    template.spec.failure_policy == FailurePolicy::Fail,
                )
            })
            .flatten();
        let unserved = valid && not_served.contains(&name);
        let mut desired = if let Some(why) = &not_injected {
            status::desired_status_not_served(template, why, now.clone())
        } else if unserved {
            status::desired_status_not_served(template, &not_served_why(), now.clone())
        } else {
            status::desired_status_kept(
                template,
                &observed.outcome,
                observed.kept.as_ref(),
                now.clone(),
            )
        };
        // The counts and observedGeneration from one census of this generation.
        let counts = status::counts_for(
            observed.generation_in_force(),
            self.census.as_ref().map(|counted| counted.of(&name)),
        );
        desired = status::with_counts(template, desired, counts);
        if let Some(rollouts) = &self.rollouts {
            desired = status::with_rollout(template, desired, rollouts.get(&name), now.clone());
        }
        if valid && !unserved {
            desired = self.with_policy(template, desired, not_injected.is_none(), now);
        }
        TemplateStatus {
            name,
            observed,
            desired,
            counts,
            unserved,
        }
    }

    /// `desired` with where the policy backend stands with `template`, a served one; with the
    /// `policy` backend and `injected` (the policy injects it), naming the policy in use.
    fn with_policy(
        &self,
        template: &SidecarTemplate,
        desired: SidecarTemplateStatus,
        injected: bool,
        now: &Time,
    ) -> SidecarTemplateStatus {
        let policy_only = self.backend == Backend::Policy;
        let mut desired = status::with_policy(
            template,
            desired,
            self.policy.as_deref(),
            !policy_only,
            now.clone(),
        );
        if let Some(state) = self.policy.as_deref().filter(|_| policy_only)
            && injected
        {
            desired = status::in_use_by_policy(desired, &state.policy);
        }
        desired
    }
}

impl TemplateStatus {
    /// The generation its events are published once for.
    pub fn generation(&self) -> i64 {
        self.observed
            .template
            .metadata
            .generation
            .unwrap_or_default()
    }

    /// The warning its status calls for, if any.
    pub fn problem(&self) -> Option<Problem<'_>> {
        match (&self.observed.outcome, &self.observed.kept) {
            (Ok(_), _) if self.unserved => Some(Problem::NotServed),
            (Ok(_), _) => None,
            (Err(errors), Some(kept)) => Some(Problem::InvalidKept(errors, kept)),
            (Err(errors), None) => Some(Problem::Invalid(errors)),
        }
    }
}

/// The group whose entry serves each template of `snapshot`: its own group's, or a merged one.
fn serving_groups(snapshot: &Snapshot) -> HashMap<&str, &GroupId> {
    snapshot
        .groups()
        .iter()
        .flat_map(|g| g.templates.iter().map(move |t| (t.name.as_str(), &g.id)))
        .collect()
}

/// Points `observed` (the template `name`), and the generation kept for it, at the group whose
/// entry serves it now ([`serving_groups`]), so that its status names that entry.
fn name_serving_group(observed: &mut Observed, serving: &HashMap<&str, &GroupId>, name: &str) {
    let Some(&served) = serving.get(name) else {
        return;
    };
    if let Ok(group) = &mut observed.outcome {
        group.clone_from(served);
    }
    if let Some(kept) = &mut observed.kept {
        kept.group.clone_from(served);
    }
}

#[cfg(test)]
mod tests;
