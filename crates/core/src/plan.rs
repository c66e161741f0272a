//! Planning: which templates apply to a Pod, and the RFC 6902 patch that applies them.
//!
//! The planner reads what it needs of the Pod ([`Pod`], typed and borrowed) and answers with
//! a patch that only adds (so fields it does not know survive untouched); it indexes what the
//! Pod already has once, then checks each addition against the index: the cost is linear in
//! the size of the Pod and of the templates, never quadratic.

use std::borrow::Cow;
use std::collections::HashMap;

use std::sync::Arc;

use injector_api::FailurePolicy;
use injector_api::names::{INJECT_ANNOTATION, INJECTED_ANNOTATION};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::fingerprint::Fingerprint;
use crate::labels::Labels;
use crate::patch::{AddOperation, Patch, PatchPath, PatchValue};
use crate::placeholder::{Fixed, MetadataKey, Node, PodFacts};
use crate::pod::{Container, MalformedPod, Pod, Strings, mount_path, name_of};
use crate::registry::KnownTemplates;
pub use crate::rules::SkipReason;
use crate::rules::defaulted::{ItemKind, SERVICE_ACCOUNT_MOUNT_PATH, Surroundings, difference};
use crate::rules::placement::{Before, first_blocking, first_init};
use crate::rules::record;
pub use crate::rules::selection::NamespaceInfo;
use crate::rules::selection::{
    opts_out, pod_wide_skip, unselected_by_namespace, unselected_by_pod,
};
use crate::rules::warning::{Holder, MetadataKind, Warning};
use crate::syntax::is_label_value;
use crate::template::{CompiledTemplate, Item, Text};

/// A template that was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The template's name.
    pub name: String,
    /// The template's generation.
    pub generation: i64,
    /// What it injects.
    pub fingerprint: Fingerprint,
}

impl Applied {
    /// The record entry of `template` as it is now.
    pub fn of(template: &CompiledTemplate) -> Self {
        Applied {
            name: template.name.clone(),
            generation: template.generation,
            fingerprint: template.fingerprint,
        }
    }

    /// Appends its entry in the `sidecar.dev/injected` annotation to `out`.
    pub fn push_entry(&self, out: &mut String) {
        // Writing into a `String` cannot fail.
        let _ = record::write_entry(out, &self.name, self.generation, &self.fingerprint);
    }

    /// An upper bound of the length of its entry.
    pub fn entry_len_bound(&self) -> usize {
        self.name.len() + record::ENTRY_EXTRA
    }
}

impl std::fmt::Display for Applied {
    /// `name@generation#fingerprint`, its entry in the `sidecar.dev/injected` annotation.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Written with `write_str` only, so that a caller's width or sign flags reach none of it.
        record::write_entry(f, &self.name, self.generation, &self.fingerprint)
    }
}

/// A template that was not applied, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The template's name.
    pub name: String,
    /// Why.
    pub reason: SkipReason,
}

/// A required template that selects the Pod but cannot be applied: the Pod must be denied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Denial {
    /// The template's name.
    pub template: String,
    /// Why it cannot be applied.
    pub reason: String,
}

/// The outcome of planning one Pod. The patch borrows from the templates planned with.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Plan<'t> {
    /// The RFC 6902 patch; empty when nothing is to change.
    pub patch: Patch<'t>,
    /// The templates applied, in order.
    pub applied: Vec<Applied>,
    /// The templates not applied, with the reason, in order.
    pub skipped: Vec<Skipped>,
    /// Things the Pod's author should know (kubectl prints them).
    pub warnings: Vec<Warning>,
    /// Required templates that could not be applied.
    pub denials: Vec<Denial>,
}

impl Plan<'_> {
    /// The same plan, owning its patch (to keep it beyond the templates it borrows from).
    pub fn into_owned(self) -> Plan<'static> {
        Plan {
            patch: self.patch.into_owned(),
            applied: self.applied,
            skipped: self.skipped,
            warnings: self.warnings,
            denials: self.denials,
        }
    }

    /// The message to deny the Pod with, when a required template could not be applied.
    pub fn denial_message(&self) -> Option<String> {
        if self.denials.is_empty() {
            return None;
        }
        let reasons: Vec<String> = self
            .denials
            .iter()
            .map(|d| {
                format!(
                    "required SidecarTemplate {:?} cannot be applied: {}",
                    d.template, d.reason
                )
            })
            .collect();
        Some(reasons.join("; "))
    }
}

/// Plans the injection of `templates` into `pod` (its JSON), created in `namespace`.
///
/// Templates apply in (priority, name) order whatever order they are given in; a name given
/// twice counts once.
pub fn plan<'t>(
    pod: &Value,
    namespace: &NamespaceInfo<'_>,
    templates: &'t [Arc<CompiledTemplate>],
) -> Result<Plan<'t>, MalformedPod> {
    Ok(plan_among(
        &Pod::from_value(pod)?,
        namespace,
        templates,
        templates,
    ))
}

/// [`plan`], where `templates` are some of `known`, every template in force (one webhook
/// entry's among the registry's). The others are not applied, but what they injected is
/// recognised: a container of theirs is not one of the Pod's own (`appContainers` leaves it
/// alone) and an init container of theirs may come before a native sidecar. Otherwise another
/// entry's additions, made between two calls of this one, would look like the Pod author's.
pub fn plan_among<'t>(
    view: &Pod<'_>,
    namespace: &NamespaceInfo<'_>,
    templates: &'t [Arc<CompiledTemplate>],
    known: &(impl KnownTemplates + ?Sized),
) -> Plan<'t> {
    let ordered = in_application_order(templates);
    let token_volumes = view.token_volumes();
    let service_account_volume = view.service_account_volume(|name| known.adds_volume(name));

    let namespace_name = view.namespace.as_deref().unwrap_or(namespace.name);
    if let Some(reason) = pod_wide_skip(namespace_name, namespace) {
        let skipped = ordered
            .iter()
            .map(|t| Skipped {
                name: t.name.clone(),
                reason: reason.clone(),
            })
            .collect();
        return Plan {
            skipped,
            ..Plan::default()
        };
    }

    // A pass renders placeholders with the Pod's metadata and adds env and mounts to the Pod's
    // own containers. Templates can change both: they add labels and annotations a placeholder
    // may read, and a re-invocation sees the containers the first call injected among the
    // Pod's. So passes repeat, each seeing what the one before found, until nothing changes:
    // then planning the result again sees just what the last pass saw, and adds nothing.
    let recognised = Recognised::find(view, &token_volumes, namespace, namespace_name, known);
    let mut seen = Seen::first(view);
    let mut passes = 1;
    loop {
        let mut pass = Pass::run(
            view,
            &token_volumes,
            &ordered,
            namespace,
            namespace_name,
            &seen,
            &recognised,
        );
        match pass.seen_after(view, &ordered, &seen) {
            None => return pass.finish(view, service_account_volume),
            Some(_) if passes == MAX_PASSES => {
                pass.plan
                    .warnings
                    .push(Warning::Unsettled { passes: MAX_PASSES });
                return pass.finish(view, service_account_volume);
            }
            Some(next) => seen = next,
        }
        passes += 1;
    }
}

/// A bound on planning passes. Two suffice unless a label a template adds is rendered from
/// metadata another template adds; each further pass resolves one more such link.
const MAX_PASSES: usize = 4;

/// The Pod's containers and init containers that are some known template's, found by their
/// content among the templates that select the Pod.
struct Recognised {
    /// Per container of the Pod.
    containers: Vec<bool>,
    /// Per init container of the Pod.
    init_containers: Vec<bool>,
}

impl Recognised {
    fn find(
        view: &Pod<'_>,
        token_volumes: &[&str],
        namespace: &NamespaceInfo<'_>,
        namespace_name: &str,
        known: &(impl KnownTemplates + ?Sized),
    ) -> Self {
        let facts = PodFacts {
            name: &view.name,
            namespace: namespace_name,
            service_account_name: &view.service_account_name,
            labels: view.labels.as_ref().map(|l| l as &dyn Labels),
            annotations: view.annotations.as_ref().map(|a| a as &dyn Labels),
        };
        let pod = Surroundings {
            host_network: view.host_network,
            token_volumes,
        };
        let no_additions = MapAdditions::new(None);
        let labels = Effective {
            pod: view.labels.as_ref(),
            added: &no_additions,
        };
        let selects = |t: &CompiledTemplate| {
            t.pod_selector.matches(&labels)
                && namespace
                    .labels
                    .is_none_or(|ns| t.namespace_selector.matches(ns))
        };
        let is_theirs = |container: &Container<'_>, items: fn(&CompiledTemplate) -> &[Item]| {
            let name = container.name.as_ref();
            let Some(container) = container.whole.as_deref() else {
                return false;
            };
            known.adding_container(name).any(|t| {
                selects(t)
                    && items(t).iter().any(|item| {
                        item.key == name
                            && difference(
                                &item.body.render(&facts),
                                container,
                                ItemKind::Container,
                                &pod,
                            )
                            .is_none()
                    })
            })
        };
        Recognised {
            containers: view
                .containers
                .iter()
                .map(|c| is_theirs(c, |t| &t.containers))
                .collect(),
            init_containers: view
                .init_containers
                .iter()
                .flatten()
                .map(|c| is_theirs(c, |t| &t.init_containers))
                .collect(),
        }
    }
}

/// What a pass takes as given.
#[derive(PartialEq)]
struct Seen<'k> {
    /// The labels placeholders read; `None`: the Pod's own.
    labels: Option<Strings<'k>>,
    /// The annotations placeholders read; `None`: the Pod's own.
    annotations: Option<Strings<'k>>,
    /// Per container of the Pod: whether it is a template's rather than the Pod's own.
    injected: Vec<bool>,
}

impl Seen<'_> {
    fn first(view: &Pod<'_>) -> Self {
        Seen {
            labels: None,
            annotations: None,
            injected: vec![false; view.containers.len()],
        }
    }
}

/// What placeholders read of the Pod: its labels and annotations as the previous pass left
/// them (`seen`), else its own.
fn pod_facts<'k>(view: &'k Pod<'k>, namespace_name: &'k str, seen: &'k Seen<'_>) -> PodFacts<'k> {
    PodFacts {
        name: &view.name,
        namespace: namespace_name,
        service_account_name: &view.service_account_name,
        labels: seen
            .labels
            .as_ref()
            .or(view.labels.as_ref())
            .map(|l| l as &dyn Labels),
        annotations: seen
            .annotations
            .as_ref()
            .or(view.annotations.as_ref())
            .map(|a| a as &dyn Labels),
    }
}

/// One planning pass: the decisions, and the builder holding the additions.
struct Pass<'k, 't> {
    plan: Plan<'t>,
    builder: Builder<'k, 't>,
    /// The templates whose items are all in the Pod after this pass.
    present: Vec<&'t CompiledTemplate>,
    /// The templates that select the Pod but could not be applied.
    absent: Vec<&'t str>,
}

impl<'k, 't: 'k> Pass<'k, 't> {
    fn run(
        view: &'k Pod<'k>,
        token_volumes: &'k [&'k str],
        ordered: &[&'t CompiledTemplate],
        namespace: &NamespaceInfo<'_>,
        namespace_name: &'k str,
        seen: &Seen<'_>,
        recognised: &Recognised,
    ) -> Self {
        let opted_out = opts_out(view.annotation(INJECT_ANNOTATION));
        let facts = pod_facts(view, namespace_name, seen);
        let mut pass = Pass {
            plan: Plan::default(),
            builder: Builder::new(view, token_volumes, seen, recognised),
            present: Vec::new(),
            absent: Vec::new(),
        };

        // Selection sees the Pod as the templates applied so far leave it: a template may
        // select on a label that another template adds. Rounds repeat until one applies
        // nothing, so planning the result again finds nothing left to apply.
        let mut pending: Vec<&'t CompiledTemplate> = Vec::new();
        for &template in ordered {
            match unselected_by_namespace(template.selecting(), opted_out, namespace) {
                Some(reason) => pass.plan.skipped.push(Skipped {
                    name: template.name.clone(),
                    reason,
                }),
                None => pending.push(template),
            }
        }
        let mut unselected = Vec::new();
        loop {
            let mut progressed = false;
            unselected.clear();
            for template in std::mem::take(&mut pending) {
                if let Some(reason) = pass.builder.unselected(template) {
                    unselected.push(reason);
                    pending.push(template);
                    continue;
                }
                progressed = true;
                pass.apply(template, &facts, opted_out);
            }
            if !progressed || pending.is_empty() {
                break;
            }
        }
        for (template, reason) in pending.into_iter().zip(unselected) {
            pass.plan.skipped.push(Skipped {
                name: template.name.clone(),
                reason,
            });
        }
        pass
    }

    /// Applies `template`, which selects the Pod, and records the outcome: applied, already
    /// there, or in conflict (a denial when it is required).
    fn apply(&mut self, template: &'t CompiledTemplate, facts: &PodFacts<'_>, opted_out: bool) {
        let plan = &mut self.plan;
        if opted_out {
            plan.warnings.push(Warning::RequiredDespiteOptOut {
                template: template.name.clone(),
            });
        }
        match self.builder.apply(template, facts) {
            Ok(applied) => {
                plan.warnings.extend(applied.warnings);
                self.present.push(template);
                if applied.added {
                    plan.applied.push(Applied::of(template));
                } else {
                    plan.skipped.push(Skipped {
                        name: template.name.clone(),
                        reason: SkipReason::AlreadyPresent,
                    });
                }
            }
            Err(conflicts) => {
                self.absent.push(template.name.as_str());
                let detail = conflicts.join("; ");
                plan.warnings.push(Warning::NotApplied {
                    template: template.name.clone(),
                    detail: detail.clone(),
                });
                if template.failure_policy == FailurePolicy::Fail {
                    plan.denials.push(Denial {
                        template: template.name.clone(),
                        reason: detail.clone(),
                    });
                }
                plan.skipped.push(Skipped {
                    name: template.name.clone(),
                    reason: SkipReason::Conflict(detail),
                });
            }
        }
    }

    /// What the next pass must take as given, when it differs from what this one took.
    fn seen_after<'v>(
        &self,
        view: &Pod<'v>,
        ordered: &[&CompiledTemplate],
        seen: &Seen<'v>,
    ) -> Option<Seen<'v>> {
        // Only what a placeholder reads matters: most passes add nothing that one reads.
        let read = |key: MetadataKey| ordered.iter().any(|t| t.metadata_reads.contains(&key));
        let merged = |pod: Option<&Strings<'v>>,
                      added: &MapAdditions<'_, '_>,
                      key: fn(String) -> MetadataKey| {
            let reads_added = added.added.iter().any(|(k, _)| read(key((*k).to_owned())));
            reads_added.then(|| {
                let mut map = pod.cloned().unwrap_or_default();
                for (key, value) in &added.added {
                    map.insert(Cow::Owned((*key).to_owned()), Cow::Owned(value.clone()));
                }
                map
            })
        };
        // Which containers are the Pod's own only matters to `appContainers`.
        let injected = if ordered.iter().any(|t| t.app.is_some()) {
            self.builder.found_injected.clone()
        } else {
            seen.injected.clone()
        };
        let next = Seen {
            labels: merged(
                view.labels.as_ref(),
                &self.builder.labels,
                MetadataKey::Label,
            ),
            annotations: merged(
                view.annotations.as_ref(),
                &self.builder.annotations,
                MetadataKey::Annotation,
            ),
            injected,
        };
        (next != *seen).then_some(next)
    }

    /// The plan, with the record and the patch; `service_account_volume` as
    /// [`Builder::finish`] takes it.
    fn finish(self, view: &Pod<'_>, service_account_volume: Option<&str>) -> Plan<'t> {
        let Pass {
            mut plan,
            mut builder,
            present,
            absent,
        } = self;

        // The record is ours, never read as input: it lists the templates found in the Pod
        // now by their content, and drops a claim of one that selects the Pod but is not in
        // it. Entries keep their place, so that re-planning writes the same record; claims
        // about templates not decided here (another webhook entry's, or ones that do not
        // select the Pod) are left as they are, for whoever decides them.
        let claimed = view.annotation(INJECTED_ANNOTATION).unwrap_or_default();
        let present: Vec<_> = present.iter().map(|t| t.entry()).collect();
        let record = record::updated(claimed, &present, &absent);
        if claimed != record {
            builder.annotations.set(INJECTED_ANNOTATION, record);
        }
        plan.patch = builder.finish(service_account_volume);
        plan
    }
}

/// The templates in (priority, name) order, each name once: of two templates with the same
/// name, the higher generation wins, then the one given first.
fn in_application_order(templates: &[Arc<CompiledTemplate>]) -> Vec<&CompiledTemplate> {
    let mut ordered: Vec<&CompiledTemplate> = templates.iter().map(Arc::as_ref).collect();
    // A stable sort: of a name and generation given twice, the one given first comes first.
    ordered.sort_by(|a, b| a.name.cmp(&b.name).then(b.generation.cmp(&a.generation)));
    ordered.dedup_by(|later, kept| later.name == kept.name);
    ordered.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    ordered
}

/// Who put a named item where it is.
enum Owner<'k> {
    /// The Pod.
    Pod {
        /// The item whole; `None` when it was not kept whole (no template adds one of its
        /// name, so it is never compared).
        whole: Option<&'k Value>,
        /// Its index in its list.
        index: usize,
        /// Whether that list is `initContainers`.
        init: bool,
    },
    /// A template (empty for the injector's own record), and the index of the item in the
    /// list's additions, or of the key in a map's ([`MapAdditions`]).
    Template(&'k str, usize),
}

/// Who owns each key of a list, or of the labels or annotations templates add. Most hold a
/// few keys, which a scan finds faster than a hash map is built; a long one (a Pod may hold
/// thousands of env vars, a template thousands of annotations) is hashed, so planning stays
/// linear.
enum Owners<'k> {
    Few(Vec<(&'k str, Owner<'k>)>),
    /// foldhash, randomly seeded: several times faster than SipHash on short keys, still
    /// resistant to keys chosen to collide.
    Many(HashMap<&'k str, Owner<'k>, foldhash::fast::RandomState>),
}

/// The most keys [`Owners`] scans.
const FEW_OWNERS: usize = 16;

impl<'k> Owners<'k> {
    /// Owners of `capacity` keys of the Pod, and room for the few that templates add to a
    /// list that exists (a list the Pod lacks is often left so).
    fn with_capacity(capacity: usize) -> Self {
        if capacity == 0 {
            Owners::Few(Vec::new())
        } else if capacity <= FEW_OWNERS {
            Owners::Few(Vec::with_capacity((capacity + 4).min(FEW_OWNERS)))
        } else {
            Owners::Many(HashMap::with_capacity_and_hasher(
                capacity,
                Default::default(),
            ))
        }
    }

    fn get(&self, key: &str) -> Option<&Owner<'k>> {
        match self {
            // The last of a key given twice wins, as in a map.
            Owners::Few(owners) => owners.iter().rev().find(|(k, _)| *k == key).map(|(_, o)| o),
            Owners::Many(owners) => owners.get(key),
        }
    }

    fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn insert(&mut self, key: &'k str, owner: Owner<'k>) {
        match self {
            Owners::Few(owners) if owners.len() < FEW_OWNERS => owners.push((key, owner)),
            Owners::Few(owners) => {
                let mut many: HashMap<_, _, foldhash::fast::RandomState> =
                    HashMap::with_capacity_and_hasher(2 * FEW_OWNERS, Default::default());
                many.extend(owners.drain(..));
                many.insert(key, owner);
                *self = Owners::Many(many);
            }
            Owners::Many(owners) => {
                owners.insert(key, owner);
            }
        }
    }

    fn extend(&mut self, items: impl IntoIterator<Item = (&'k str, Owner<'k>)>) {
        let mut items = items.into_iter();
        while let Owners::Few(_) = self {
            match items.next() {
                Some((key, owner)) => self.insert(key, owner),
                None => return,
            }
        }
        if let Owners::Many(owners) = self {
            owners.extend(items);
        }
    }
}

/// Where an added container goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    Containers,
    InitContainers,
}

/// Named items at one place in the Pod (containers, volumes, a container's env, …): what was
/// there, and what the plan adds.
struct Keyed<'k, 't, T = ()> {
    existed: bool,
    owners: Owners<'k>,
    added: Vec<(T, PatchValue<'t>)>,
}

/// Whether an item is in the Pod already; when different, `D` says how.
enum Presence<D = String> {
    Absent,
    Same,
    Different(D),
}

impl<'k, 't, T> Keyed<'k, 't, T> {
    /// The items of the list `existing`, each under its key and whole if it was kept so.
    fn new<I: 'k>(
        existing: Option<&'k [I]>,
        key_and_whole: impl Fn(&'k I) -> (&'k str, Option<&'k Value>),
    ) -> Self {
        let items = existing.unwrap_or_default();
        let mut owners = Owners::with_capacity(items.len());
        owners.extend(items.iter().enumerate().map(|(index, item)| {
            let (key, whole) = key_and_whole(item);
            let owner = Owner::Pod {
                whole,
                index,
                init: false,
            };
            (key, owner)
        }));
        Keyed {
            existed: existing.is_some(),
            owners,
            added: Vec::new(),
        }
    }

    fn presence(&self, key: &str, value: &PatchValue<'_>) -> Presence<Holder> {
        let (current, holder) = match self.owners.get(key) {
            None => return Presence::Absent,
            Some(Owner::Pod { whole: current, .. }) => (
                current.is_some_and(|current| value.is_subset_of(current)),
                Holder::Pod,
            ),
            // The same test as against the Pod's own items, so that planning the mutated Pod
            // again decides as this plan did.
            Some(Owner::Template(name, index)) => (
                self.added
                    .get(*index)
                    .is_some_and(|(_, added)| value.is_subset_of(&added.to_value())),
                Holder::Template((*name).to_owned()),
            ),
        };
        if current {
            Presence::Same
        } else {
            Presence::Different(holder)
        }
    }

    /// Like [`Keyed::presence`], but an item counts as present only when it is exactly the
    /// template's, up to the API server's defaults: a look-alike is named by the field that
    /// differs. An item an earlier template added is judged the same way, so that planning
    /// the mutated Pod again (where it is the Pod's) decides as this plan did.
    fn presence_exact(
        &self,
        key: &str,
        value: &PatchValue<'_>,
        kind: ItemKind,
        pod: &Surroundings<'_>,
    ) -> Presence {
        // The rendered item is copied only when the name is taken (rare but for re-invocations).
        let (difference, owner) = match self.owners.get(key) {
            None => return Presence::Absent,
            Some(Owner::Pod { whole: current, .. }) => (
                match current {
                    Some(current) => difference(&value.to_value(), current, kind, pod),
                    None => Some(String::new()),
                },
                "in the pod".to_owned(),
            ),
            Some(Owner::Template(name, index)) => (
                match self.added.get(*index) {
                    Some((_, added)) => difference(&value.to_value(), &added.to_value(), kind, pod),
                    None => Some(String::new()),
                },
                format!("added by SidecarTemplate {name:?}"),
            ),
        };
        match difference {
            None => Presence::Same,
            Some(field) if field.is_empty() => Presence::Different(format!(
                "already exists ({owner}) and is not the template's"
            )),
            Some(field) => Presence::Different(format!(
                "already exists ({owner}) and is not the template's: {field} differs"
            )),
        }
    }

    fn add(&mut self, key: &'k str, template: &'k str, tag: T, value: PatchValue<'t>) {
        self.owners
            .insert(key, Owner::Template(template, self.added.len()));
        self.added.push((tag, value));
    }

    fn into_values(self) -> Vec<PatchValue<'t>> {
        self.added.into_iter().map(|(_, value)| value).collect()
    }
}

/// A map (labels or annotations) and what the plan adds to it.
struct MapAdditions<'a, 't> {
    existing: Option<&'a Strings<'a>>,
    /// The keys added, in the order added, with their values: the keys are the templates' own,
    /// not copies.
    added: Vec<(&'t str, String)>,
    /// Which template added each key (empty for the injector's own record), and where it is
    /// in `added`.
    owners: Owners<'t>,
}

impl<'a, 't> MapAdditions<'a, 't> {
    fn new(existing: Option<&'a Strings<'a>>) -> Self {
        MapAdditions {
            existing,
            added: Vec::new(),
            owners: Owners::with_capacity(0),
        }
    }

    /// Where `key` is in `added`, and the template that added it.
    fn find(&self, key: &str) -> Option<(usize, &'t str)> {
        match self.owners.get(key) {
            Some(Owner::Template(template, at)) => Some((*at, *template)),
            // Only templates own a map's keys.
            Some(Owner::Pod { .. }) | None => None,
        }
    }

    /// Adds `key`, which is not there yet, for `template`.
    fn push(&mut self, key: &'t str, value: String, template: &'t str) {
        let owner = Owner::Template(template, self.added.len());
        self.owners.insert(key, owner);
        self.added.push((key, value));
    }

    /// Adds `key` unless present; a warning when it is present with another value.
    fn add(
        &mut self,
        kind: MetadataKind,
        key: &'t str,
        value: String,
        template: &'t str,
    ) -> Option<Warning> {
        let kept = |holder| Warning::MetadataKept {
            template: template.to_owned(),
            kind,
            key: key.to_owned(),
            holder,
        };
        if let Some(current) = self.existing.and_then(|m| m.get(key)) {
            return (current != Some(value.as_str())).then(|| kept(Holder::Pod));
        }
        if let Some((at, owner)) = self.find(key) {
            let differs = self
                .added
                .get(at)
                .is_some_and(|(_, current)| *current != value);
            return differs.then(|| kept(Holder::Template(owner.to_owned())));
        }
        self.push(key, value, template);
        None
    }

    /// Sets `key` whatever was there (the injector's own record, set last: who added it
    /// before is not read again).
    fn set(&mut self, key: &'t str, value: String) {
        match self.find(key).and_then(|(at, _)| self.added.get_mut(at)) {
            Some(entry) => entry.1 = value,
            None => self.push(key, value, ""),
        }
    }

    fn label(&self, key: &str) -> Option<&str> {
        let (at, _) = self.find(key)?;
        self.added.get(at).map(|(_, value)| value.as_str())
    }

    /// The operations adding what templates added to the map at `path`.
    fn emit<'p>(self, path: &str, ops: &mut Vec<AddOperation<'p>>) {
        if self.added.is_empty() {
            return;
        }
        let entries = self
            .added
            .into_iter()
            .map(|(key, value)| (key, Value::String(value)));
        if self.existing.is_some() {
            for (key, value) in entries {
                ops.push(AddOperation {
                    path: PatchPath::escaped_then(path, key),
                    value: PatchValue::Owned(value),
                });
            }
        } else {
            let map: Map<String, Value> = entries
                .map(|(key, value)| (key.to_owned(), value))
                .collect();
            ops.push(add(path, PatchValue::Owned(Value::Object(map))));
        }
    }
}

/// A map of the Pod's metadata as the plan leaves it: the Pod's own keys win (they are never
/// overwritten), then the keys templates added.
struct Effective<'m, 'a, 't> {
    pod: Option<&'a Strings<'a>>,
    added: &'m MapAdditions<'a, 't>,
}

impl Labels for Effective<'_, '_, '_> {
    fn label(&self, key: &str) -> Option<&str> {
        match self.pod.and_then(|m| m.get(key)) {
            Some(value) => value,
            None => self.added.label(key),
        }
    }
}

/// What applying one template did.
struct TemplateOutcome {
    /// About the parts that were left out.
    warnings: Vec<Warning>,
    /// Whether it added anything: `false` when everything was in the Pod already.
    added: bool,
}

/// Additions to one of the Pod's own containers.
struct AppContainer<'k, 't> {
    env: Keyed<'k, 't>,
    env_from_existing: Option<&'k [Value]>,
    env_from_added: Vec<PatchValue<'t>>,
    mounts: Keyed<'k, 't>,
}

impl<'k, 't> AppContainer<'k, 't> {
    /// Adds what templates add to the Pod's container at `index` to `ops`.
    fn emit(self, index: usize, ops: &mut Vec<AddOperation<'t>>) {
        let container = || PatchPath::escaped("/spec/containers").then_index(index);
        let env_existed = self.env.existed;
        append(
            || container().then_escaped("/env"),
            env_existed,
            self.env.into_values(),
            ops,
        );
        append(
            || container().then_escaped("/envFrom"),
            self.env_from_existing.is_some(),
            self.env_from_added,
            ops,
        );
        let mounts_existed = self.mounts.existed;
        append(
            || container().then_escaped("/volumeMounts"),
            mounts_existed,
            self.mounts.into_values(),
            ops,
        );
    }

    fn new(container: &'k Container<'k>) -> Self {
        if let Some(whole) = container.whole.as_deref() {
            let list = |field: &str| {
                whole
                    .get(field)
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
            };
            // Only an object is an env var or a mount that may be the same as a template's.
            let object = |item: &'k Value| item.is_object().then_some(item);
            return AppContainer {
                env: Keyed::new(list("env"), |var| (name_of(var), object(var))),
                env_from_existing: list("envFrom"),
                env_from_added: Vec::new(),
                mounts: Keyed::new(list("volumeMounts"), |mount| {
                    (mount_path(mount), object(mount))
                }),
            };
        }
        AppContainer {
            env: Keyed::new(container.env.as_deref(), |var| {
                (var.name.as_ref(), var.whole.as_deref())
            }),
            env_from_existing: container
                .env_from
                .as_deref()
                .and_then(Value::as_array)
                .map(Vec::as_slice),
            env_from_added: Vec::new(),
            mounts: Keyed::new(container.volume_mounts.as_deref(), |mount| {
                (mount.path.as_ref(), mount.whole.as_deref())
            }),
        }
    }
}

/// Accumulates what templates add, then emits the patch. `'k` is what the Pod and the
/// templates both outlive (keys come from either); `'t` is the templates', which the patch
/// borrows.
struct Builder<'k, 't> {
    view: &'k Pod<'k>,
    token_volumes: &'k [&'k str],
    /// Container names are unique across containers and initContainers, so one index serves
    /// both; the placement says which list an addition lands in.
    containers: Keyed<'k, 't, Placement>,
    init_containers_existed: bool,
    volumes: Keyed<'k, 't>,
    pull_secrets: Keyed<'k, 't>,
    app: Vec<Option<AppContainer<'k, 't>>>,
    /// Per container of the Pod: whether it is a template's rather than the Pod's own (a
    /// re-invocation sees the containers the first call injected), as the previous pass found.
    injected: Vec<bool>,
    /// The same, as this pass finds it: the containers equal to one of a template it applied.
    found_injected: Vec<bool>,
    /// Per init container of the Pod: whether it is a template's (which may come before a
    /// native sidecar), found by its content.
    template_init_containers: Vec<bool>,
    labels: MapAdditions<'k, 't>,
    annotations: MapAdditions<'k, 't>,
}

impl<'k, 't: 'k> Builder<'k, 't> {
    fn new(
        view: &'k Pod<'k>,
        token_volumes: &'k [&'k str],
        seen: &Seen<'_>,
        recognised: &Recognised,
    ) -> Self {
        let injected = seen
            .injected
            .iter()
            .zip(&recognised.containers)
            .map(|(seen, recognised)| *seen || *recognised)
            .collect();
        let mut containers = Keyed::new(Some(&view.containers), Container::key_and_whole);
        for (index, init) in view.init_containers.iter().flatten().enumerate() {
            let (name, whole) = init.key_and_whole();
            let owner = Owner::Pod {
                whole,
                index,
                init: true,
            };
            containers.owners.insert(name, owner);
        }
        Builder {
            view,
            token_volumes,
            containers,
            init_containers_existed: view.init_containers.is_some(),
            volumes: Keyed::new(view.volumes.as_deref(), |volume| {
                (volume.name.as_ref(), volume.whole.as_deref())
            }),
            pull_secrets: Keyed::new(view.image_pull_secrets.as_deref(), |name| {
                (name.as_ref(), None)
            }),
            app: view.containers.iter().map(|_| None).collect(),
            found_injected: vec![false; view.containers.len()],
            template_init_containers: recognised.init_containers.clone(),
            injected,
            labels: MapAdditions::new(view.labels.as_ref()),
            annotations: MapAdditions::new(view.annotations.as_ref()),
        }
    }

    /// Why `template` does not select the Pod as it stands now (its own labels and
    /// annotations plus those added so far), or `None` when it does.
    fn unselected(&self, template: &CompiledTemplate) -> Option<SkipReason> {
        let labels = Effective {
            pod: self.view.labels.as_ref(),
            added: &self.labels,
        };
        let annotations = Effective {
            pod: self.view.annotations.as_ref(),
            added: &self.annotations,
        };
        unselected_by_pod(template.selecting(), &labels, &annotations)
    }

    /// Applies one template, all or nothing: `Err` lists the conflicts that stop it.
    fn apply(
        &mut self,
        template: &'t CompiledTemplate,
        facts: &PodFacts<'_>,
    ) -> Result<TemplateOutcome, Vec<String>> {
        let additions_before = self.additions();
        let checked = self.check(template, facts)?;
        self.add_items(template, checked);
        let mut warnings = Vec::new();
        if let Some(app) = &template.app {
            self.apply_app(app, &template.name, facts, &mut warnings);
        }
        self.apply_metadata(template, facts, &mut warnings);
        Ok(TemplateOutcome {
            warnings,
            added: self.additions() != additions_before,
        })
    }

    /// Where `template`'s containers and volumes stand in the Pod: those to add, the Pod's
    /// own that are the template's; `Err` lists the conflicts (a look-alike, a misplaced one).
    fn check(
        &self,
        template: &'t CompiledTemplate,
        facts: &PodFacts<'_>,
    ) -> Result<Checked<'t>, Vec<String>> {
        let mut checked = Checked {
            found: Vec::new(),
            containers: Vec::new(),
            volumes: Vec::new(),
        };
        let mut conflicts = Vec::new();
        let placed = template
            .containers
            .iter()
            .map(|item| (Placement::Containers, item))
            .chain(
                template
                    .init_containers
                    .iter()
                    .map(|item| (Placement::InitContainers, item)),
            );
        for (placement, item) in placed {
            let value = PatchValue::render(&item.body, facts);
            match self.containers.presence_exact(
                &item.key,
                &value,
                ItemKind::Container,
                &self.surroundings(),
            ) {
                Presence::Absent => checked
                    .containers
                    .push((placement, item.key.as_str(), value)),
                Presence::Same => match self.misplaced(&item.key, placement) {
                    Some(problem) => conflicts.push(format!("container {:?} {problem}", item.key)),
                    None => checked.found.extend(self.pod_container_index(&item.key)),
                },
                Presence::Different(detail) => {
                    conflicts.push(format!("container {:?} {detail}", item.key))
                }
            }
        }
        for item in &template.volumes {
            let value = PatchValue::render(&item.body, facts);
            match self.volumes.presence_exact(
                &item.key,
                &value,
                ItemKind::Volume,
                &self.surroundings(),
            ) {
                Presence::Absent => checked.volumes.push((item.key.as_str(), value)),
                Presence::Same => {}
                Presence::Different(detail) => {
                    conflicts.push(format!("volume {:?} {detail}", item.key))
                }
            }
        }
        if conflicts.is_empty() {
            Ok(checked)
        } else {
            Err(conflicts)
        }
    }

    /// Adds what [`Self::check`] found missing of `template`, and its pull secrets; marks the
    /// Pod's containers that are the template's.
    fn add_items(&mut self, template: &'t CompiledTemplate, checked: Checked<'t>) {
        for index in checked.found {
            self.found_injected[index] = true;
        }
        let by = template.name.as_str();
        for (placement, name, value) in checked.containers {
            self.containers.add(name, by, placement, value);
        }
        for (name, value) in checked.volumes {
            self.volumes.add(name, by, (), value);
        }
        for secret in &template.image_pull_secrets {
            if !self.pull_secrets.owners.contains_key(secret.as_str()) {
                let value = PatchValue::Owned(serde_json::json!({ "name": secret }));
                self.pull_secrets.add(secret, by, (), value);
            }
        }
    }

    /// Adds `template`'s labels and annotations; a templated label value that renders to an
    /// invalid label value is left out, with a warning.
    fn apply_metadata(
        &mut self,
        template: &'t CompiledTemplate,
        facts: &PodFacts<'_>,
        warnings: &mut Vec<Warning>,
    ) {
        let by = template.name.as_str();
        for (key, text) in &template.labels {
            let value = render_text(text, facts);
            if !is_label_value(&value) {
                warnings.push(Warning::InvalidLabelValue {
                    template: by.to_owned(),
                    key: key.clone(),
                    value,
                });
                continue;
            }
            warnings.extend(self.labels.add(MetadataKind::Label, key, value, by));
        }
        for (key, text) in &template.annotations {
            warnings.extend(self.annotations.add(
                MetadataKind::Annotation,
                key,
                render_text(text, facts),
                by,
            ));
        }
    }

    /// How many items the plan adds so far: a template that leaves it unchanged added nothing.
    fn additions(&self) -> usize {
        let app: usize = self
            .app
            .iter()
            .flatten()
            .map(|a| a.env.added.len() + a.env_from_added.len() + a.mounts.added.len())
            .sum();
        self.containers.added.len()
            + self.volumes.added.len()
            + self.pull_secrets.added.len()
            + self.labels.added.len()
            + self.annotations.added.len()
            + app
    }

    /// What of the Pod comparing its items with a template's depends on.
    fn surroundings(&self) -> Surroundings<'_> {
        Surroundings {
            host_network: self.view.host_network,
            token_volumes: self.token_volumes,
        }
    }

    /// Where the Pod's `spec.containers` holds the container named `name`, if it does.
    fn pod_container_index(&self, name: &str) -> Option<usize> {
        match self.containers.owners.get(name) {
            Some(Owner::Pod {
                index, init: false, ..
            }) => Some(*index),
            _ => None,
        }
    }

    /// Why a container of the Pod's own, equal to one the template places at `placement`, is
    /// not where the template would put it; `None` when it is.
    fn misplaced(&self, name: &str, placement: Placement) -> Option<String> {
        let Some(Owner::Pod { index, init, .. }) = self.containers.owners.get(name) else {
            return None;
        };
        let init_containers = self.view.init_containers.as_deref().unwrap_or_default();
        let init_index = init.then_some(*index);
        match (placement, init_index) {
            (Placement::Containers, Some(_)) => Some(
                "is in the pod's initContainers; the template adds it to containers".to_owned(),
            ),
            (Placement::InitContainers, None) => Some(
                "is in the pod's containers; the template adds it to initContainers".to_owned(),
            ),
            // A native sidecar must run from the start: after a plain init container of the
            // Pod's own it would not be running while that one runs.
            (Placement::InitContainers, Some(index))
                if init_containers.get(index).is_some_and(|c| c.native_sidecar) =>
            {
                let before = init_containers[..index]
                    .iter()
                    .zip(&self.template_init_containers)
                    .map(|(c, theirs)| Before {
                        native_sidecar: c.native_sidecar,
                        templates: *theirs,
                    });
                first_blocking(before)
                    .and_then(|blocking| init_containers.get(blocking))
                    .map(|c| {
                        format!(
                            "is in the pod after its init container {:?}; a native sidecar must come before the pod's own init containers",
                            c.name
                        )
                    })
            }
            _ => None,
        }
    }

    fn apply_app(
        &mut self,
        app: &'t crate::template::AppAdditions,
        by: &'t str,
        facts: &PodFacts<'_>,
        warnings: &mut Vec<Warning>,
    ) {
        let wanted = |name: &str| app.names.is_empty() || app.names.iter().any(|n| n == name);
        let env: Vec<(&str, PatchValue<'t>)> = app
            .env
            .iter()
            .map(|i| (i.key.as_str(), PatchValue::render(&i.body, facts)))
            .collect();
        let env_from: Vec<PatchValue<'t>> = app
            .env_from
            .iter()
            .map(|n| PatchValue::render(n, facts))
            .collect();
        let mounts: Vec<(&str, PatchValue<'t>)> = app
            .volume_mounts
            .iter()
            .map(|i| (i.key.as_str(), PatchValue::render(&i.body, facts)))
            .collect();
        for ((container, slot), injected) in self
            .view
            .containers
            .iter()
            .zip(self.app.iter_mut())
            .zip(&self.injected)
        {
            let container_name = container.name.as_ref();
            if *injected || !wanted(container_name) {
                continue;
            }
            let state = slot.get_or_insert_with(|| AppContainer::new(container));
            for (name, value) in &env {
                match state.env.presence(name, value) {
                    Presence::Absent => state.env.add(name, by, (), value.clone()),
                    Presence::Same => {}
                    Presence::Different(holder) => warnings.push(Warning::EnvKept {
                        template: by.to_owned(),
                        name: (*name).to_owned(),
                        container: container_name.to_owned(),
                        holder,
                    }),
                }
            }
            for value in &env_from {
                let present = state
                    .env_from_existing
                    .into_iter()
                    .flatten()
                    .any(|e| value.is_subset_of(e))
                    || state
                        .env_from_added
                        .iter()
                        .any(|e| e.to_value() == value.to_value());
                if !present {
                    state.env_from_added.push(value.clone());
                }
            }
            for (path, value) in &mounts {
                match state.mounts.presence(path, value) {
                    Presence::Absent => state.mounts.add(path, by, (), value.clone()),
                    Presence::Same => {}
                    Presence::Different(holder) => warnings.push(Warning::MountKept {
                        template: by.to_owned(),
                        path: (*path).to_owned(),
                        container: container_name.to_owned(),
                        holder,
                    }),
                }
            }
        }
    }

    /// The patch. Each container added gets the ServiceAccount token's mount of
    /// `service_account_volume` (see [`Pod::service_account_volume`]) exactly as the
    /// ServiceAccount admission plugin would append it: the API server runs that plugin again
    /// after any mutation, and its change alone would call this webhook again
    /// (`reinvocationPolicy: IfNeeded`) for an answer that changes nothing.
    fn finish(self, service_account_volume: Option<&str>) -> Patch<'t> {
        // An operation an item at most, and one for the metadata: room made once.
        let mut ops = Vec::with_capacity(1 + self.additions());
        let first_init = self.first_init();
        let adds_metadata = !self.labels.added.is_empty() || !self.annotations.added.is_empty();
        if !self.view.has_metadata && adds_metadata {
            ops.push(add(
                "/metadata",
                PatchValue::Owned(Value::Object(Map::new())),
            ));
        }
        self.labels.emit("/metadata/labels", &mut ops);
        self.annotations.emit("/metadata/annotations", &mut ops);
        let lands = Landing {
            first_init,
            init_containers_existed: self.init_containers_existed,
            service_account_volume,
        };
        lands.emit(self.containers.added, &mut ops);
        append(
            || PatchPath::escaped("/spec/volumes"),
            self.volumes.existed,
            self.volumes.into_values(),
            &mut ops,
        );
        append(
            || PatchPath::escaped("/spec/imagePullSecrets"),
            self.pull_secrets.existed,
            self.pull_secrets.into_values(),
            &mut ops,
        );
        for (index, state) in self.app.into_iter().enumerate() {
            if let Some(state) = state {
                state.emit(index, &mut ops);
            }
        }
        Patch(ops)
    }

    /// Where templates' init containers go: before the Pod's own, in order, and after those
    /// other templates placed first (another webhook entry, called before, or a
    /// MutatingAdmissionPolicy): templates apply in priority order, so theirs come first.
    fn first_init(&self) -> usize {
        if self.init_containers_existed {
            first_init(self.template_init_containers.iter().copied())
        } else {
            0
        }
    }
}

/// What [`Builder::check`] found of a template in the Pod, for [`Builder::add_items`].
struct Checked<'t> {
    /// The Pod's containers (by index) that are the template's.
    found: Vec<usize>,
    /// The containers to add, each with its list.
    containers: Vec<(Placement, &'t str, PatchValue<'t>)>,
    /// The volumes to add.
    volumes: Vec<(&'t str, PatchValue<'t>)>,
}

/// Where the containers a plan adds land, and the token's mount each gets.
struct Landing<'v> {
    /// The index of the first init container added.
    first_init: usize,
    init_containers_existed: bool,
    service_account_volume: Option<&'v str>,
}

impl Landing<'_> {
    /// Adds `added` (each container with its list), each with its token mount, to `ops`.
    fn emit<'t>(&self, added: Vec<(Placement, PatchValue<'t>)>, ops: &mut Vec<AddOperation<'t>>) {
        let (init_containers, containers): (Vec<_>, Vec<_>) = added
            .into_iter()
            .partition(|(placement, _)| *placement == Placement::InitContainers);
        let values = |items: Vec<(Placement, PatchValue<'t>)>| -> Vec<PatchValue<'t>> {
            items
                .into_iter()
                .map(|(_, value)| match self.service_account_volume {
                    Some(volume) if wants_token_mount(&value) => with_token_mount(value, volume),
                    _ => value,
                })
                .collect()
        };
        if self.init_containers_existed {
            for (index, value) in values(init_containers).into_iter().enumerate() {
                ops.push(AddOperation {
                    path: PatchPath::escaped("/spec/initContainers")
                        .then_index(self.first_init + index),
                    value,
                });
            }
        } else {
            append(
                || PatchPath::escaped("/spec/initContainers"),
                false,
                values(init_containers),
                ops,
            );
        }
        append(
            || PatchPath::escaped("/spec/containers"),
            true,
            values(containers),
            ops,
        );
    }
}

/// `container` with the ServiceAccount token's mount of `volume` appended to its mounts, as
/// the plugin appends it. Part of the container's value rather than an operation of its own:
/// the API server turns each operation into a walk of the encoded Pod, so one operation fewer
/// is time off every injected Pod's CREATE. The container is written from its fields' own
/// JSON, made once, and its rendered strings, as the whole of it is otherwise.
fn with_token_mount<'t>(container: PatchValue<'t>, volume: &str) -> PatchValue<'t> {
    let mount = serde_json::json!({
        "name": volume,
        "readOnly": true,
        "mountPath": SERVICE_ACCOUNT_MOUNT_PATH,
    });
    let mut mounts = Vec::new();
    let mut out: Vec<(&'t str, PatchValue<'t>)> = Vec::new();
    match container {
        PatchValue::Fixed(fixed) => {
            let Some(fields) = fixed.fields() else {
                return owned_with_mount(PatchValue::Fixed(fixed), mount);
            };
            for (key, field) in fields {
                fixed_field(key, field, &mut out, &mut mounts);
            }
        }
        PatchValue::Rendered(Node::Object(fields), texts)
            if fields
                .iter()
                .all(|(key, node)| key != "volumeMounts" || matches!(node, Node::Fixed(_))) =>
        {
            let mut texts = texts.into_iter();
            for (key, node) in fields.iter() {
                let mine: Vec<String> = texts.by_ref().take(node.text_count()).collect();
                match node {
                    Node::Fixed(field) => fixed_field(key, field, &mut out, &mut mounts),
                    Node::Text(_) => out.push((
                        key.as_str(),
                        PatchValue::String(mine.into_iter().next().unwrap_or_default()),
                    )),
                    node => out.push((key.as_str(), PatchValue::Rendered(node, mine))),
                }
            }
        }
        other => return owned_with_mount(other, mount),
    }
    mounts.push(PatchValue::Owned(mount));
    // Where `serde_json` writes the key, so the patch reads as the container's own JSON.
    let at = out.partition_point(|(key, _)| *key < "volumeMounts");
    out.insert(at, ("volumeMounts", PatchValue::Array(mounts)));
    PatchValue::Object(out)
}

/// A fixed field of a container [`with_token_mount`] writes: its mounts (validation keeps
/// placeholders out of them) go before the token's, any other field into `out` as it is.
fn fixed_field<'t>(
    key: &'t str,
    field: &'t Fixed,
    out: &mut Vec<(&'t str, PatchValue<'t>)>,
    mounts: &mut Vec<PatchValue<'t>>,
) {
    if key == "volumeMounts" {
        let items = field.items().unwrap_or_default();
        mounts.extend(items.iter().map(PatchValue::Fixed));
    } else {
        out.push((key, PatchValue::Fixed(field)));
    }
}

/// [`with_token_mount`] for a container of any other shape, through an owned copy.
fn owned_with_mount<'t>(container: PatchValue<'t>, mount: Value) -> PatchValue<'t> {
    let mut value = container.to_value();
    if let Some(fields) = value.as_object_mut() {
        match fields.get_mut("volumeMounts") {
            Some(Value::Array(mounts)) => mounts.push(mount),
            _ => {
                fields.insert("volumeMounts".to_owned(), Value::Array(vec![mount]));
            }
        }
    }
    PatchValue::Owned(value)
}

/// Whether the ServiceAccount admission plugin mounts the token into a container a template
/// adds: unless the container mounts something at the token's path itself.
fn wants_token_mount(container: &PatchValue<'_>) -> bool {
    let wanted = |mounts: Option<&Value>| match mounts {
        Some(Value::Array(mounts)) => mounts
            .iter()
            .all(|m| mount_path(m) != SERVICE_ACCOUNT_MOUNT_PATH),
        _ => true,
    };
    match container {
        PatchValue::Fixed(fixed) => wanted(fixed.value().get("volumeMounts")),
        // Validation keeps placeholders out of mounts, so they are a fixed part.
        PatchValue::Rendered(Node::Object(fields), _) => {
            match fields.iter().find(|(key, _)| key == "volumeMounts") {
                None => true,
                Some((_, Node::Fixed(mounts))) => wanted(Some(mounts.value())),
                Some(_) => wanted(container.to_value().get("volumeMounts")),
            }
        }
        other => wanted(other.to_value().get("volumeMounts")),
    }
}

fn render_text(text: &Text, facts: &PodFacts<'_>) -> String {
    match text {
        Text::Fixed(value) => value.clone(),
        Text::Templated(template) => template.render(facts),
    }
}

/// The operation adding `value` at `path`, a pointer spelled escaped.
fn add<'t>(path: &str, value: PatchValue<'t>) -> AddOperation<'t> {
    AddOperation {
        path: PatchPath::escaped(path),
        value,
    }
}

/// Appends `items` to the list at `path`: one `add …/-` each when the list exists, else one
/// `add` creating it. The path is made only when there are items.
fn append<'t>(
    path: impl FnOnce() -> PatchPath,
    existed: bool,
    items: Vec<PatchValue<'t>>,
    ops: &mut Vec<AddOperation<'t>>,
) {
    if items.is_empty() {
        return;
    }
    if existed {
        let path = path().then_escaped("/-");
        ops.reserve(items.len());
        let mut items = items.into_iter();
        // The last item takes the path itself: one copy fewer for each list.
        let last = items.next_back();
        for value in items {
            ops.push(AddOperation {
                path: path.clone(),
                value,
            });
        }
        if let Some(value) = last {
            ops.push(AddOperation { path, value });
        }
    } else {
        ops.push(AddOperation {
            path: path(),
            value: PatchValue::Array(items),
        });
    }
}

#[cfg(test)]
mod tests;
