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

    /// `template` made best-effort.
    fn best_effort(mut template: SidecarTemplate) -> SidecarTemplate {
        template.spec.failure_policy = FailurePolicy::Ignore;
        template
    }

    fn kept(observed: &ObservedTemplates, name: &str) -> Option<Kept> {
        observed.lock().unwrap()[name].kept.clone()
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

        sync.handle(Event::Apply(best_effort(template("good", 2, "x"))));
        assert!(sync.handle(Event::Apply(best_effort(invalid("good")))));
        assert!(names(&webhook).is_empty(), "a best-effort template leaves");
        assert_eq!(kept(&observed, "good"), None);
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

    #[test]
    fn a_required_template_made_invalid_keeps_its_last_valid_generation_until_fixed() {
        let webhook = Templates::new();
        let observed = ObservedTemplates::default();
        let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
        sync.handle(Event::Init);
        sync.handle(Event::InitDone);
        sync.handle(Event::Apply(template("agent", 1, "agent:1")));
        let group = webhook.snapshot().get("agent").unwrap().group_id.clone();

        assert!(
            !sync.handle(Event::Apply(invalid("agent"))),
            "the registry does not change"
        );
        let in_force = webhook.snapshot().get("agent").cloned().unwrap();
        assert_eq!(in_force.generation, 1);
        assert_eq!(
            kept(&observed, "agent"),
            Some(Kept {
                generation: 1,
                group: group.clone()
            })
        );
        assert!(observed.lock().unwrap()["agent"].outcome.is_err());
        assert_eq!(
            sync.counts(),
            TemplateCounts {
                valid: 1,
                invalid: 1
            }
        );

        // A relist keeps it too.
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(invalid("agent")));
        sync.handle(Event::InitDone);
        assert_eq!(webhook.snapshot().get("agent").unwrap().generation, 1);
        assert_eq!(kept(&observed, "agent").unwrap().generation, 1);

        // Fixed: the new generation replaces it and nothing is kept any more.
        assert!(sync.handle(Event::Apply(template("agent", 3, "agent:3"))));
        assert_eq!(webhook.snapshot().get("agent").unwrap().generation, 3);
        assert_eq!(kept(&observed, "agent"), None);
    }

    /// `invalid(name)` whose status records generation 1 of `template(name, 1, image)`.
    fn invalid_with_last_valid(name: &str, image: &str) -> SidecarTemplate {
        let mut template = invalid(name);
        template.status = Some(injector_api::SidecarTemplateStatus {
            last_valid: Some(injector_api::LastValid {
                generation: 1,
                spec: serde_json::to_value(self::template(name, 1, image).spec).unwrap(),
            }),
            ..Default::default()
        });
        template
    }

    #[test]
    fn a_replica_started_while_a_required_template_is_invalid_keeps_what_its_status_records() {
        for listed in [true, false] {
            let webhook = Templates::new();
            let observed = ObservedTemplates::default();
            let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
            sync.handle(Event::Init);
            if listed {
                sync.handle(Event::InitApply(invalid_with_last_valid(
                    "agent", "agent:1",
                )));
                sync.handle(Event::InitDone);
            } else {
                sync.handle(Event::InitDone);
                assert!(sync.handle(Event::Apply(invalid_with_last_valid("agent", "agent:1"))));
            }
            let in_force = webhook.snapshot().get("agent").cloned().unwrap();
            assert_eq!(in_force.generation, 1);
            assert_eq!(
                in_force.containers[0].body.render(&facts())["image"],
                "agent:1"
            );
            assert_eq!(kept(&observed, "agent").unwrap().generation, 1);
        }

        // Not for a best-effort template, nor without a record.
        let webhook = Templates::new();
        let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
        sync.handle(Event::Init);
        let mut best_effort_record = invalid_with_last_valid("logs", "logs:1");
        if let Some(status) = &mut best_effort_record.status {
            let spec = best_effort(template("logs", 1, "logs:1")).spec;
            status.last_valid.as_mut().unwrap().spec = serde_json::to_value(spec).unwrap();
        }
        sync.handle(Event::InitApply(best_effort_record));
        sync.handle(Event::InitApply(invalid("plain")));
        sync.handle(Event::InitDone);
        assert!(names(&webhook).is_empty(), "{:?}", names(&webhook));
    }

    fn facts() -> injector_core::placeholder::PodFacts<'static> {
        injector_core::placeholder::PodFacts {
            name: "p",
            namespace: "n",
            service_account_name: "default",
            labels: None,
            annotations: None,
        }
    }

    #[test]
    fn a_kept_required_template_leaves_when_deleted() {
        let webhook = Templates::new();
        let observed = ObservedTemplates::default();
        let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(template("agent", 1, "agent:1")));
        sync.handle(Event::InitDone);
        sync.handle(Event::Apply(invalid("agent")));
        assert_eq!(names(&webhook), ["agent"]);
        assert!(sync.handle(Event::Delete(invalid("agent"))));
        assert!(names(&webhook).is_empty());
        assert!(observed.lock().unwrap().is_empty());
        // Deleted during a watch gap: the relist drops it as well.
        sync.handle(Event::Apply(template("agent", 1, "agent:1")));
        sync.handle(Event::Apply(invalid("agent")));
        sync.handle(Event::Init);
        sync.handle(Event::InitDone);
        assert!(names(&webhook).is_empty());
    }

    #[test]
    fn a_required_template_invalid_from_the_start_has_nothing_to_keep() {
        let webhook = Templates::new();
        let observed = ObservedTemplates::default();
        let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
        sync.handle(Event::Init);
        sync.handle(Event::InitApply(invalid("agent")));
        sync.handle(Event::InitDone);
        assert!(names(&webhook).is_empty());
        assert_eq!(kept(&observed, "agent"), None);
    }
}
