//! Which generation of each template is in force, and what compiling it gave: the rule the
//! controller's template sync applies to every watch event, and `kubectl sidecar` to one
//! listing, so both keep the same templates in force.
//!
//! A valid template is in force as it is. An invalid one is not, unless it is required: then
//! its last valid generation stays in force until the template is fixed or deleted (issue 11,
//! rule 6), because dropping it would silently admit Pods without a sidecar they must have.
//! That generation is the one in force already (a replica that saw it), else the one the
//! template's `status.lastValid` records (a replica started while it is invalid).

use std::collections::BTreeMap;
use std::sync::Arc;

use injector_api::{FailurePolicy, SidecarTemplate};

use crate::error::ValidationErrors;
use crate::group::GroupId;
use crate::registry::{Registry, Snapshot};
use crate::template::{CompiledTemplate, compile};

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

impl Observed {
    /// The generation of the template in force for it: its own when valid, the kept one when
    /// invalid and required, `None` when none is in force.
    pub fn generation_in_force(&self) -> Option<i64> {
        match (&self.outcome, &self.kept) {
            (Ok(_), _) => self.template.metadata.generation,
            (Err(_), kept) => kept.as_ref().map(|kept| kept.generation),
        }
    }
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
    /// `in_force` (the template of that name in force), else the one its status records.
    fn find(
        in_force: Option<&Arc<CompiledTemplate>>,
        template: &SidecarTemplate,
    ) -> Option<(Self, CompiledTemplate)> {
        Self::from_in_force(in_force).or_else(|| Self::from_status(template))
    }

    /// The generation `template.status.lastValid` records, compiled, when it is required.
    fn from_status(template: &SidecarTemplate) -> Option<(Self, CompiledTemplate)> {
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
        Some((kept, compiled))
    }

    /// The template in force, when it is required and so must stay.
    fn from_in_force(in_force: Option<&Arc<CompiledTemplate>>) -> Option<(Self, CompiledTemplate)> {
        let current = in_force.filter(|t| t.failure_policy == FailurePolicy::Fail)?;
        let kept = Kept {
            generation: current.generation,
            group: current.group_id.clone(),
        };
        Some((kept, current.as_ref().clone()))
    }
}

/// Compiles `template`, given `in_force`, the template of its name in force now (if any):
/// what it puts in force (itself when valid, its last valid generation when it is invalid
/// and required, else nothing), and what the status writer needs.
pub fn observe(
    template: SidecarTemplate,
    in_force: Option<&Arc<CompiledTemplate>>,
) -> (Option<CompiledTemplate>, Observed) {
    let (valid, outcome) = match compile(&template) {
        Ok(compiled) => {
            let group = compiled.group_id.clone();
            (Some(compiled), Ok(group))
        }
        Err(errors) => (None, Err(errors)),
    };
    let mut observed = Observed {
        template: Arc::new(template),
        outcome,
        kept: None,
    };
    if valid.is_some() {
        return (valid, observed);
    }
    match Kept::find(in_force, &observed.template) {
        Some((kept, current)) => {
            observed.kept = Some(kept);
            (Some(current), observed)
        }
        None => (None, observed),
    }
}

/// What a complete listing of templates puts in force, given `previous`, what was in force
/// before it ([`observe`] for each one): the templates in force, and what compiling each gave,
/// by name.
pub fn listed(
    listing: impl IntoIterator<Item = SidecarTemplate>,
    previous: &Snapshot,
) -> (Vec<CompiledTemplate>, BTreeMap<String, Observed>) {
    let mut compiled = Vec::new();
    let mut observed = BTreeMap::new();
    for template in listing {
        let name = template.metadata.name.clone().unwrap_or_default();
        let (in_force, record) = observe(template, previous.get(&name));
        compiled.extend(in_force);
        observed.insert(name, record);
    }
    (compiled, observed)
}

/// What `listing` puts in force in a replica started now: [`listed`] with nothing in force
/// before, as a snapshot.
pub fn from_listing(
    listing: impl IntoIterator<Item = SidecarTemplate>,
) -> (Arc<Snapshot>, BTreeMap<String, Observed>) {
    let mut registry = Registry::new();
    let (compiled, observed) = listed(listing, &registry.snapshot());
    registry.reset(compiled);
    (registry.snapshot(), observed)
}

#[cfg(test)]
mod tests;
