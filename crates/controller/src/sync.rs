//! SidecarTemplate watch events into the registry, and the registry into the webhook.
//!
//! [`TemplateSync`] is a state machine without I/O: it takes the watcher's events, compiles
//! each template, keeps the valid ones in the registry, publishes a new snapshot to the
//! webhook after every change, and marks the webhook synced after the first complete list.
//! After a watch gap the watcher lists again (`Init` … `InitDone`); the registry is then
//! replaced whole, so templates deleted during the gap disappear too.
//!
//! A template that becomes invalid leaves the registry, unless it is required: then its last
//! valid generation stays in force ([`injector_core::registry::in_force`], the rule `kubectl sidecar`
//! applies too). A replica that saw that generation keeps it from its registry; one started
//! while the template is invalid takes it from the template's `status.lastValid`, which the
//! leader writes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use injector_api::SidecarTemplate;
use injector_core::registry::in_force::{self, Observed};
use injector_core::{Registry, Templates};
use kube::runtime::watcher::Event;

/// Every template seen, by name: what the status writer works from. Shared between the sync
/// task and the status writer; never locked across an `.await`.
pub type ObservedTemplates = Arc<Mutex<BTreeMap<String, Observed>>>;

/// Counts for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TemplateCounts {
    /// Templates in the registry.
    pub valid: usize,
    /// Templates seen but left out because they failed validation.
    pub invalid: usize,
}

/// Feeds the registry from watch events.
#[derive(Debug)]
pub struct TemplateSync {
    registry: Registry,
    listing: Option<Vec<SidecarTemplate>>,
    webhook: Arc<Templates>,
    observed: ObservedTemplates,
}

impl TemplateSync {
    /// A sync that publishes to `webhook` and records outcomes in `observed`.
    pub fn new(webhook: Arc<Templates>, observed: ObservedTemplates) -> Self {
        Self {
            registry: Registry::new(),
            listing: None,
            webhook,
            observed,
        }
    }

    /// Handles one watch event; returns whether the published snapshot changed.
    pub fn handle(&mut self, event: Event<SidecarTemplate>) -> bool {
        match event {
            Event::Init => {
                self.listing = Some(Vec::new());
                false
            }
            Event::InitApply(template) => {
                match &mut self.listing {
                    Some(listing) => listing.push(template),
                    // An InitApply outside a listing cannot happen; treat it as an update
                    // rather than lose it.
                    None => return self.apply(template),
                }
                false
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let (compiled, observed) = in_force::listed(listed, &self.registry.snapshot());
                self.registry.reset(compiled);
                *self.observed.lock().unwrap_or_else(PoisonError::into_inner) = observed;
                self.publish();
                self.webhook.mark_synced();
                true
            }
            Event::Apply(template) => self.apply(template),
            Event::Delete(template) => {
                let name = template.metadata.name.clone().unwrap_or_default();
                self.observed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&name);
                if self.registry.delete(&name) {
                    tracing::info!(template = %name, "template deleted");
                    self.publish();
                    true
                } else {
                    false
                }
            }
        }
    }

    fn apply(&mut self, template: SidecarTemplate) -> bool {
        let name = template.metadata.name.clone().unwrap_or_default();
        let (in_force, record) = in_force::observe(template, self.registry.get(&name));
        let changed = match (in_force, &record.outcome, &record.kept) {
            (Some(compiled), outcome, kept) => {
                let unchanged = self
                    .registry
                    .get(&name)
                    .is_some_and(|current| current.as_ref() == &compiled);
                match (outcome, kept) {
                    (Err(errors), Some(kept)) => {
                        tracing::warn!(template = %name, %errors, generation = kept.generation, "required template invalid; its last valid generation stays in force");
                    }
                    _ if !unchanged => {
                        tracing::info!(template = %name, generation = compiled.generation, "template in use");
                    }
                    _ => {}
                }
                if !unchanged {
                    self.registry.apply(compiled);
                }
                !unchanged
            }
            (None, outcome, _) => {
                if let Err(errors) = outcome {
                    tracing::warn!(template = %name, %errors, "template invalid; not in use");
                }
                self.registry.delete(&name)
            }
        };
        self.observed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, record);
        if changed {
            self.publish();
        }
        changed
    }

    fn publish(&mut self) {
        self.webhook.publish(self.registry.snapshot());
    }

    /// How many templates are valid and invalid.
    pub fn counts(&self) -> TemplateCounts {
        let observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        let invalid = observed.values().filter(|o| o.outcome.is_err()).count();
        TemplateCounts {
            valid: self.registry.len(),
            invalid,
        }
    }
}

#[cfg(test)]
mod tests;
