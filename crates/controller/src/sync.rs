//! SidecarTemplate watch events into the registry, and the registry into the webhook.
//!
//! [`TemplateSync`] is a state machine without I/O: it takes the watcher's events, compiles
//! each template, keeps the valid ones in the registry, publishes a new snapshot to the
//! webhook after every change, and marks the webhook synced after the first complete list.
//! After a watch gap the watcher lists again (`Init` … `InitDone`); the registry is then
//! replaced whole, so templates deleted during the gap disappear too.
//!
//! A template that becomes invalid leaves the registry, unless it is required: then its last
//! valid generation stays in force until the template is fixed or deleted (issue 11, rule 6),
//! because dropping it would silently admit Pods without a sidecar they must have. A replica
//! that saw that generation keeps it from its registry; one started while the template is
//! invalid takes it from the template's `status.lastValid`, which the leader writes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use injector_api::{FailurePolicy, SidecarTemplate};
use injector_core::{CompiledTemplate, GroupId, Registry, Templates, ValidationErrors, compile};
use kube::runtime::watcher::Event;

/// The last outcome of compiling one template, for the status writer.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The template as last seen.
    pub template: Arc<SidecarTemplate>,
    /// What compiling it gave: the webhook entry's group id, or every validation error.
    pub outcome: Result<GroupId, ValidationErrors>,
    /// When it is invalid but required: the last valid generation, still in force.
    pub kept: Option<Kept>,
}

/// The last valid generation of a required template whose current generation is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The generation in force.
    pub generation: i64,
    /// The id of the selector group that serves it.
    pub group: GroupId,
}

impl Kept {
    /// The last valid generation of the invalid template `template` that must stay in force:
    /// `in_force` (the registry's template of that name), else the one its status records.
    fn find(
        in_force: Option<&Arc<CompiledTemplate>>,
        template: &SidecarTemplate,
    ) -> Option<(Self, Arc<CompiledTemplate>)> {
        Self::from_registry(in_force).or_else(|| Self::from_status(template))
    }

    /// The generation `template.status.lastValid` records, compiled, when it is required.
    fn from_status(template: &SidecarTemplate) -> Option<(Self, Arc<CompiledTemplate>)> {
        let last_valid = template.status.as_ref()?.last_valid.as_ref()?;
        let mut recorded = SidecarTemplate::new(
            template.metadata.name.as_deref().unwrap_or_default(),
            serde_json::from_value(last_valid.spec.clone()).ok()?,
        );
        recorded.metadata.generation = Some(last_valid.generation);
        let compiled = compile(&recorded).ok()?;
        if compiled.failure_policy != FailurePolicy::Fail {
            return None;
        }
        let kept = Kept {
            generation: compiled.generation,
            group: compiled.group_id.clone(),
        };
        Some((kept, Arc::new(compiled)))
    }

    /// The template in force, when it is required and so must stay.
    fn from_registry(
        in_force: Option<&Arc<CompiledTemplate>>,
    ) -> Option<(Self, Arc<CompiledTemplate>)> {
        let current = in_force.filter(|t| t.failure_policy == FailurePolicy::Fail)?;
        let kept = Kept {
            generation: current.generation,
            group: current.group_id.clone(),
        };
        Some((kept, Arc::clone(current)))
    }
}

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
                let previous = self.registry.snapshot();
                let mut compiled = Vec::with_capacity(listed.len());
                let mut observed = BTreeMap::new();
                for template in listed {
                    let (valid, (name, mut record)) = compile_one(template);
                    match valid {
                        Some(valid) => compiled.push(valid),
                        None => {
                            if let Some((kept, current)) =
                                Kept::find(previous.get(&name), &record.template)
                            {
                                compiled.push(current.as_ref().clone());
                                record.kept = Some(kept);
                            }
                        }
                    }
                    observed.insert(name, record);
                }
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
        let (valid, (name, mut record)) = compile_one(template);
        let changed = match valid {
            Some(compiled) => {
                let unchanged = self
                    .registry
                    .get(&compiled.name)
                    .is_some_and(|current| current.as_ref() == &compiled);
                if !unchanged {
                    tracing::info!(template = %name, generation = compiled.generation, "template in use");
                    self.registry.apply(compiled);
                }
                !unchanged
            }
            None => match Kept::find(self.registry.get(&name), &record.template) {
                Some((kept, current)) => {
                    if let Err(errors) = &record.outcome {
                        tracing::warn!(template = %name, %errors, generation = kept.generation, "required template invalid; its last valid generation stays in force");
                    }
                    record.kept = Some(kept);
                    let known = self
                        .registry
                        .get(&name)
                        .is_some_and(|t| t.as_ref() == current.as_ref());
                    if !known {
                        self.registry.apply(current.as_ref().clone());
                    }
                    !known
                }
                None => {
                    if let Err(errors) = &record.outcome {
                        tracing::warn!(template = %name, %errors, "template invalid; not in use");
                    }
                    self.registry.delete(&name)
                }
            },
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

/// Compiles one template: the valid form (if it is), and the record for the status writer.
fn compile_one(template: SidecarTemplate) -> (Option<CompiledTemplate>, (String, Observed)) {
    let name = template.metadata.name.clone().unwrap_or_default();
    let compiled = compile(&template);
    let (valid, outcome) = match compiled {
        Ok(compiled) => {
            let group = compiled.group_id.clone();
            (Some(compiled), Ok(group))
        }
        Err(errors) => (None, Err(errors)),
    };
    let record = Observed {
        template: Arc::new(template),
        outcome,
        kept: None,
    };
    (valid, (name, record))
}

#[cfg(test)]
mod tests;
