//! SidecarTemplate watch events into the registry, and the registry into the webhook.
//!
//! [`TemplateSync`] is a state machine without I/O: it takes the watcher's events, compiles
//! each template, keeps the valid ones in the registry, publishes a new snapshot to the
//! webhook after every change, and marks the webhook synced after the first complete list.
//! After a watch gap the watcher lists again (`Init` … `InitDone`); the registry is then
//! replaced whole, so templates deleted during the gap disappear too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use injector_api::SidecarTemplate;
use injector_core::{CompiledTemplate, Registry, ValidationErrors, compile};
use injector_webhook::Templates;
use kube::runtime::watcher::Event;

/// The last outcome of compiling one template, for the status writer.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The template as last seen.
    pub template: Arc<SidecarTemplate>,
    /// What compiling it gave: the webhook entry's group id, or every validation error.
    pub outcome: Result<String, ValidationErrors>,
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
                let mut compiled = Vec::with_capacity(listed.len());
                let mut observed = BTreeMap::new();
                for template in listed {
                    let (valid, record) = compile_one(template);
                    if let Some(valid) = valid {
                        compiled.push(valid);
                    }
                    observed.insert(record.0, record.1);
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
        let (valid, (name, record)) = compile_one(template);
        let changed = match valid {
            Some(compiled) => {
                let unchanged = self
                    .registry
                    .snapshot()
                    .get(&compiled.name)
                    .is_some_and(|current| current.as_ref() == &compiled);
                if !unchanged {
                    tracing::info!(template = %name, generation = compiled.generation, "template in use");
                    self.registry.apply(compiled);
                }
                !unchanged
            }
            None => {
                if let Err(errors) = &record.outcome {
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

/// Compiles one template: the valid form (if it is), and the record for the status writer.
fn compile_one(template: SidecarTemplate) -> (Option<CompiledTemplate>, (String, Observed)) {
    let name = template.metadata.name.clone().unwrap_or_default();
    let compiled = compile(&template);
    let (valid, outcome) = match compiled {
        Ok(compiled) => {
            let group = compiled.group.id().to_string();
            (Some(compiled), Ok(group))
        }
        Err(errors) => (None, Err(errors)),
    };
    let record = Observed {
        template: Arc::new(template),
        outcome,
    };
    (valid, (name, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str, generation: i64, image: &str) -> SidecarTemplate {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sidecar.dev/v1alpha1",
            "kind": "SidecarTemplate",
            "metadata": {"name": name, "generation": generation},
            "spec": {"containers": [{"name": name, "image": image}]},
        }))
        .unwrap()
    }

    fn invalid(name: &str) -> SidecarTemplate {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sidecar.dev/v1alpha1",
            "kind": "SidecarTemplate",
            "metadata": {"name": name, "generation": 2},
            "spec": {"containers": [{"name": "Bad Name"}]},
        }))
        .unwrap()
    }

    fn names(webhook: &Templates) -> Vec<String> {
        webhook
            .snapshot()
            .templates()
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    #[test]
    fn readiness_waits_for_the_first_complete_list() {
        let webhook = Templates::new();
        let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(template("a", 1, "x")));
        assert!(!webhook.is_synced());
        assert!(
            names(&webhook).is_empty(),
            "nothing is served from a partial list"
        );
        assert!(sync.handle(Event::InitDone));
        assert!(webhook.is_synced());
        assert_eq!(names(&webhook), ["a"]);
    }

    #[test]
    fn applies_updates_and_deletes() {
        let webhook = Templates::new();
        let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
        sync.handle(Event::Init);
        sync.handle(Event::InitDone);
        assert!(sync.handle(Event::Apply(template("a", 1, "x"))));
        assert!(
            !sync.handle(Event::Apply(template("a", 1, "x"))),
            "an identical template changes nothing"
        );
        assert!(sync.handle(Event::Apply(template("a", 2, "y"))));
        assert_eq!(webhook.snapshot().get("a").unwrap().generation, 2);
        assert!(sync.handle(Event::Delete(template("a", 2, "y"))));
        assert!(names(&webhook).is_empty());
        assert!(!sync.handle(Event::Delete(template("a", 2, "y"))));
    }

    #[test]
    fn an_invalid_template_never_enters_and_a_template_that_becomes_invalid_leaves() {
        let webhook = Templates::new();
        let observed = ObservedTemplates::default();
        let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(template("good", 1, "x")));
        sync.handle(Event::InitApply(invalid("bad")));
        sync.handle(Event::InitDone);
        assert_eq!(names(&webhook), ["good"]);
        assert_eq!(
            sync.counts(),
            TemplateCounts {
                valid: 1,
                invalid: 1
            }
        );
        let bad = observed.lock().unwrap()["bad"].outcome.clone().unwrap_err();
        assert!(
            bad.messages()
                .iter()
                .any(|m| m.starts_with("spec.containers[0].name"))
        );

        assert!(sync.handle(Event::Apply(invalid("good"))));
        assert!(names(&webhook).is_empty());
        assert_eq!(
            sync.counts(),
            TemplateCounts {
                valid: 0,
                invalid: 2
            }
        );
    }

    #[test]
    fn a_relist_after_a_watch_gap_replaces_the_registry() {
        let webhook = Templates::new();
        let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(template("a", 1, "x")));
        sync.handle(Event::InitApply(template("b", 1, "x")));
        sync.handle(Event::InitDone);
        // The watch broke; "a" was deleted and "c" created meanwhile.
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(template("b", 1, "x")));
        sync.handle(Event::InitApply(template("c", 1, "x")));
        assert_eq!(
            names(&webhook),
            ["a", "b"],
            "the old snapshot serves until the list is complete"
        );
        sync.handle(Event::InitDone);
        assert_eq!(names(&webhook), ["b", "c"]);
    }
}
