//! The registry of compiled templates, and the immutable snapshots the webhook reads.
//!
//! The registry is fed by one writer (the controller's watch, or template files) and read
//! through [`Snapshot`]s: cheap to clone, never locked, rebuilt only when something changed.
//! Before it: which generation of each template is in force ([`in_force`]); after it: the
//! cell the controller publishes snapshots into and the webhook reads ([`published`]), with
//! the template watch's health ([`freshness`]).

pub mod freshness;
pub mod in_force;
pub mod published;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::labels::Labels;

use crate::group::{Group, GroupId, GroupKey, merge_past_bound};
use crate::template::CompiledTemplate;

/// foldhash, randomly seeded: the webhook looks names up here for every request (a group id,
/// each of the Pod's container, volume and env names), several times faster than with SipHash
/// and still resistant to keys chosen to collide.
type Hasher = foldhash::fast::RandomState;

/// An immutable view of every valid template, indexed for the webhook.
#[derive(Debug, Default)]
pub struct Snapshot {
    templates: Vec<Arc<CompiledTemplate>>,
    groups: HashMap<GroupId, Arc<Group>, Hasher>,
    groups_in_order: Vec<Arc<Group>>,
    /// The templates adding a container or init container, by its name: a re-invocation
    /// recognises what other entries injected with a lookup, however many templates exist.
    by_container: HashMap<String, Vec<Arc<CompiledTemplate>>, Hasher>,
    /// The names of the volumes templates add, and of the env vars they add to the Pod's own
    /// containers: a Pod's item of such a name is compared whole, so decoded whole.
    volumes: Names,
    app_env: Names,
    /// The paths templates mount in the Pod's own containers.
    app_mounts: Names,
    /// Whether a template adds envFrom sources to the Pod's own containers: only then are
    /// theirs compared, so decoded.
    app_env_from: bool,
}

/// A set of names, looked up for each of a Pod's items of their kind. Most of those are not
/// in it (a template adds a few env vars; a Pod holds dozens): a name whose length no name of
/// the set has is told so without hashing it.
#[derive(Debug, Default)]
struct Names {
    /// A bit for each length of a name in the set, lengths from 63 on sharing the last.
    lengths: u64,
    set: HashSet<String, Hasher>,
}

impl Names {
    fn length_bit(name: &str) -> u64 {
        1 << name.len().min(63)
    }

    fn contains(&self, name: &str) -> bool {
        self.lengths & Names::length_bit(name) != 0 && self.set.contains(name)
    }
}

impl FromIterator<String> for Names {
    fn from_iter<I: IntoIterator<Item = String>>(names: I) -> Self {
        let set: HashSet<String, Hasher> = names.into_iter().collect();
        let lengths = set
            .iter()
            .fold(0, |bits, name| bits | Names::length_bit(name));
        Names { lengths, set }
    }
}

impl Snapshot {
    fn build(templates: impl Iterator<Item = Arc<CompiledTemplate>>) -> Self {
        let mut templates: Vec<_> = templates.collect();
        templates.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        let mut grouped: BTreeMap<&GroupKey, Vec<Arc<CompiledTemplate>>> = BTreeMap::new();
        for template in &templates {
            grouped
                .entry(&template.group)
                .or_default()
                .push(Arc::clone(template));
        }
        let groups: Vec<Group> = grouped
            .into_iter()
            .filter_map(|(key, templates)| {
                let id = templates.first()?.group_id.clone();
                Some(Group {
                    id,
                    key: key.clone(),
                    templates,
                })
            })
            .collect();
        let mut groups_in_order: Vec<Arc<Group>> =
            merge_past_bound(groups).into_iter().map(Arc::new).collect();
        groups_in_order.sort_by(|a, b| (a.priority(), &a.id).cmp(&(b.priority(), &b.id)));
        let groups = groups_in_order
            .iter()
            .map(|g| (g.id.clone(), Arc::clone(g)))
            .collect();
        let mut by_container: HashMap<String, Vec<Arc<CompiledTemplate>>, Hasher> =
            HashMap::default();
        for template in &templates {
            for item in template.containers.iter().chain(&template.init_containers) {
                by_container
                    .entry(item.key.clone())
                    .or_default()
                    .push(Arc::clone(template));
            }
        }
        let volumes = templates
            .iter()
            .flat_map(|t| &t.volumes)
            .map(|item| item.key.clone())
            .collect();
        let app_env = templates
            .iter()
            .filter_map(|t| t.app.as_ref())
            .flat_map(|app| &app.env)
            .map(|item| item.key.clone())
            .collect();
        let app_mounts = templates
            .iter()
            .filter_map(|t| t.app.as_ref())
            .flat_map(|app| &app.volume_mounts)
            .map(|item| item.key.clone())
            .collect();
        let app_env_from = templates
            .iter()
            .filter_map(|t| t.app.as_ref())
            .any(|app| !app.env_from.is_empty());
        Snapshot {
            templates,
            groups,
            groups_in_order,
            by_container,
            volumes,
            app_env,
            app_mounts,
            app_env_from,
        }
    }

    /// Every template, in application order.
    pub fn templates(&self) -> &[Arc<CompiledTemplate>] {
        &self.templates
    }

    /// The templates that add a container or an init container called `name`.
    pub fn adding_container(&self, name: &str) -> &[Arc<CompiledTemplate>] {
        self.by_container.get(name).map_or(&[], Vec::as_slice)
    }

    /// Whether a template adds a volume called `name`.
    pub fn adds_volume(&self, name: &str) -> bool {
        self.volumes.contains(name)
    }

    /// Whether a template adds an env var called `name` to the Pod's own containers.
    pub fn adds_app_env(&self, name: &str) -> bool {
        self.app_env.contains(name)
    }

    /// Whether a template mounts a volume at `path` in the Pod's own containers.
    pub fn adds_app_mount(&self, path: &str) -> bool {
        self.app_mounts.contains(path)
    }

    /// Whether a template adds envFrom sources to the Pod's own containers.
    pub fn adds_app_env_from(&self) -> bool {
        self.app_env_from
    }

    /// The template called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<CompiledTemplate>> {
        self.templates.iter().find(|t| t.name == name)
    }

    /// The group served at `/mutate/<id>`; a constant-time lookup however many templates exist.
    pub fn group(&self, id: &str) -> Option<&Arc<Group>> {
        self.groups.get(id)
    }

    /// Every group, ordered by their templates' lowest priority, then id: the order of the
    /// webhook configuration's entries unless templates select on labels others add (the
    /// controller then orders those after).
    pub fn groups(&self) -> &[Arc<Group>] {
        &self.groups_in_order
    }

    /// The templates whose selectors match a Pod with `pod_labels` in a namespace with
    /// `namespace_labels`, in application order. `None` for the namespace labels means the
    /// namespace selection was already made (by the API server).
    pub fn matching(
        &self,
        pod_labels: &impl Labels,
        namespace_labels: Option<&BTreeMap<String, String>>,
    ) -> Vec<Arc<CompiledTemplate>> {
        let mut found: Vec<_> = self
            .groups_in_order
            .iter()
            .filter(|g| {
                g.key.pod_selector.matches(pod_labels)
                    && namespace_labels.is_none_or(|ns| g.key.namespace_selector.matches(ns))
            })
            .flat_map(|g| g.templates.iter().cloned())
            .collect();
        found.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        found
    }

    /// How many templates the snapshot holds.
    pub fn len(&self) -> usize {
        self.templates.len()
    }

    /// Whether the snapshot holds no template.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

/// The set of valid templates, keyed by name, with a cached snapshot.
#[derive(Debug, Default)]
pub struct Registry {
    templates: BTreeMap<String, Arc<CompiledTemplate>>,
    snapshot: Option<Arc<Snapshot>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `template`, or replaces the template of the same name.
    pub fn apply(&mut self, template: CompiledTemplate) {
        self.templates
            .insert(template.name.clone(), Arc::new(template));
        self.snapshot = None;
    }

    /// The template called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<CompiledTemplate>> {
        self.templates.get(name)
    }

    /// Removes the template called `name`; whether it was there.
    pub fn delete(&mut self, name: &str) -> bool {
        let removed = self.templates.remove(name).is_some();
        if removed {
            self.snapshot = None;
        }
        removed
    }

    /// Replaces every template (after a full list of the cluster's templates).
    pub fn reset(&mut self, templates: impl IntoIterator<Item = CompiledTemplate>) {
        self.templates = templates
            .into_iter()
            .map(|t| (t.name.clone(), Arc::new(t)))
            .collect();
        self.snapshot = None;
    }

    /// The current state, shareable across threads. Built at most once per change, so a burst
    /// of applies (a full list) costs one build.
    pub fn snapshot(&mut self) -> Arc<Snapshot> {
        if let Some(snapshot) = &self.snapshot {
            return Arc::clone(snapshot);
        }
        let snapshot = Arc::new(Snapshot::build(self.templates.values().cloned()));
        self.snapshot = Some(Arc::clone(&snapshot));
        snapshot
    }

    /// How many templates the registry holds.
    pub fn len(&self) -> usize {
        self.templates.len()
    }

    /// Whether the registry holds no template.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

/// Every template in force, as `plan_among` and the Pod decoder look them up.
pub trait KnownTemplates {
    /// Those that add a container or an init container called `name`.
    fn adding_container<'s>(&'s self, name: &str) -> impl Iterator<Item = &'s CompiledTemplate>;

    /// Whether one adds a volume called `name` (planning then compares the Pod's whole).
    fn adds_volume(&self, name: &str) -> bool;

    /// Whether one adds an env var called `name` to the Pod's own containers (planning then
    /// compares the Pod's whole).
    fn adds_app_env(&self, name: &str) -> bool;

    /// Whether one mounts a volume at `path` in the Pod's own containers (planning then
    /// compares the Pod's mount there whole).
    fn adds_app_mount(&self, path: &str) -> bool;

    /// Whether one adds envFrom sources to the Pod's own containers (planning then compares
    /// the sources the Pod's containers have).
    fn adds_app_env_from(&self) -> bool;
}

impl KnownTemplates for [Arc<CompiledTemplate>] {
    fn adding_container<'s>(&'s self, name: &str) -> impl Iterator<Item = &'s CompiledTemplate> {
        self.iter().map(Arc::as_ref).filter(move |t| {
            t.containers
                .iter()
                .chain(&t.init_containers)
                .any(|item| item.key == name)
        })
    }

    fn adds_volume(&self, name: &str) -> bool {
        self.iter()
            .any(|t| t.volumes.iter().any(|item| item.key == name))
    }

    fn adds_app_env(&self, name: &str) -> bool {
        self.iter()
            .filter_map(|t| t.app.as_ref())
            .any(|app| app.env.iter().any(|item| item.key == name))
    }

    fn adds_app_mount(&self, path: &str) -> bool {
        self.iter()
            .filter_map(|t| t.app.as_ref())
            .any(|app| app.volume_mounts.iter().any(|item| item.key == path))
    }

    fn adds_app_env_from(&self) -> bool {
        self.iter()
            .filter_map(|t| t.app.as_ref())
            .any(|app| !app.env_from.is_empty())
    }
}

impl KnownTemplates for Snapshot {
    fn adding_container<'s>(&'s self, name: &str) -> impl Iterator<Item = &'s CompiledTemplate> {
        Snapshot::adding_container(self, name)
            .iter()
            .map(Arc::as_ref)
    }

    fn adds_volume(&self, name: &str) -> bool {
        Snapshot::adds_volume(self, name)
    }

    fn adds_app_env(&self, name: &str) -> bool {
        Snapshot::adds_app_env(self, name)
    }

    fn adds_app_mount(&self, path: &str) -> bool {
        Snapshot::adds_app_mount(self, path)
    }

    fn adds_app_env_from(&self) -> bool {
        Snapshot::adds_app_env_from(self)
    }
}

#[cfg(test)]
mod tests;
