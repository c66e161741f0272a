//! The leader's census of Pods: where every Pod stands with each template (current, stale or
//! missing, [`injector_core::after_admission::lifecycle`]), for the templates' `status.pods`, the
//! `sidecar_injector_template_pods` metric and the event on a template that leaves Pods stale.
//!
//! It works from a metadata-only view of Pods and Namespaces (a metadata watch: the API
//! server never sends a spec or status). The count runs off the async runtime at most once
//! per [`CENSUS_PERIOD`], when a Pod, a Namespace or the templates changed.
//!
//! **Why a record and an index of its own** (issue 36 item 3: 100,000 Pods within +100 MiB):
//! a Pod is kept as a [`PodRecord`], not as the watch's `PartialObjectMeta<Pod>` in a kube
//! reflector store. k8s-openapi's `ObjectMeta` is mostly fields the census leaves empty, and
//! its labels and annotations are `BTreeMap`s whose one node holds room for eleven entries:
//! about 2.4 KiB a Pod. A record keeps only what the census, the rollout and the skipped-Pod
//! warnings read, and shares what Pods repeat (namespaces, label keys and whole label sets,
//! the annotation values, controlling owners) through [`Interner`]s. And a reflector store,
//! on a relist (the watch restarted after `410 Gone`), fills a second full map before it
//! swaps it in: two views at once. [`PodIndex`] instead upserts each listed Pod into the live
//! map, marked with the list's epoch, keeps the record already there when nothing changed,
//! and on `InitDone` drops what the list did not see: one view, and until `InitDone` the
//! counts read the previous view brought partly up to date, never a half-listed one.
//!
//! **Why an `Arc` per record and a snapshot of them**: the count runs on a blocking thread,
//! and the rollout and the skip warnings read the Pods of the census they act on, while the
//! index goes on changing with every event on the runtime. A count takes [`PodIndex::snapshot`],
//! an `Arc<[Arc<PodRecord>]>`: one pointer copy a Pod (3 ms for 100,000, release build), no
//! record cloned and no lock shared between the runtime and the blocking thread (a lock the
//! count held would stall the watch's events behind it; one taken per event would be taken
//! 100,000 times a list). A record replaced after a snapshot lives until that snapshot is
//! dropped, at the next count. Namespaces are few: they stay in a kube reflector store, whose
//! second copy during a relist is small.

use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use injector_api::WorkloadRef;
use injector_api::names::{INJECT_ANNOTATION, INJECTED_ANNOTATION, TEMPLATES_ANNOTATION};
use injector_core::after_admission::lifecycle::{self, PodMeta, TemplateCensus};
use injector_core::after_admission::workload::{controller_of, owner_of};
use injector_core::{Labels, Templates};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};

/// How often, at most, the census is counted again.
pub const CENSUS_PERIOD: Duration = Duration::from_secs(1);

/// The Pods a census was counted from ([`PodIndex::snapshot`]), which a rollout reads for the
/// Pods to update in place and the skip warnings for the Pods missing a template.
pub type PodView = Arc<[Arc<PodRecord>]>;

/// The leader's view of Namespaces (their names and labels), for the namespace selectors of
/// a Pod planned again.
pub type NamespaceView = Store<PartialObjectMeta<Namespace>>;

/// A Pod as the census keeps it: what the census, the rollout and the skip warnings read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    /// Its namespace (shared by the records of one namespace).
    pub namespace: Arc<str>,
    /// Its name.
    pub name: Arc<str>,
    /// Its `resourceVersion` (empty when it had none): a Pod found not updatable in place is
    /// not read again until it changes.
    pub resource_version: Box<str>,
    /// Its labels.
    pub labels: Arc<LabelSet>,
    /// The annotations the census reads.
    pub annotations: ReadAnnotations,
    /// Its controlling owner, when it has one.
    pub owner: Option<Arc<PodOwner>>,
    /// Being deleted (`deletionTimestamp` set): not counted, never updated in place.
    pub deleting: bool,
}

impl PodRecord {
    /// What is kept of `meta` (a Pod's), sharing nothing with other records; `None` without a
    /// name.
    pub fn of(meta: ObjectMeta) -> Option<Self> {
        PodIndex::default().record(meta)
    }

    /// What the census's rules read of it.
    pub fn meta(&self) -> PodMeta<'_> {
        PodMeta {
            namespace: &self.namespace,
            labels: &*self.labels,
            annotations: &self.annotations,
        }
    }

    /// Its controlling owner's reference ([`owner_of`]), when it has one.
    pub fn workload(&self) -> Option<&WorkloadRef> {
        self.owner.as_deref().map(|owner| &owner.reference)
    }
}

/// A Pod's labels, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSet(Box<[(Arc<str>, Box<str>)]>);

impl Labels for LabelSet {
    fn label(&self, key: &str) -> Option<&str> {
        let at = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        self.0.get(at).map(|(_, value)| &**value)
    }
}

/// The three annotations of a Pod the census reads; every other is dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadAnnotations {
    /// `sidecar.dev/injected`: what admission injected.
    pub injected: Option<Arc<str>>,
    /// `sidecar.dev/inject`: the Pod's opt-out.
    pub inject: Option<Arc<str>>,
    /// `sidecar.dev/templates`: the templates it asks for.
    pub templates: Option<Arc<str>>,
}

impl Labels for ReadAnnotations {
    fn label(&self, key: &str) -> Option<&str> {
        let value = match key {
            INJECTED_ANNOTATION => &self.injected,
            INJECT_ANNOTATION => &self.inject,
            TEMPLATES_ANNOTATION => &self.templates,
            _ => return None,
        };
        value.as_deref()
    }
}

/// A Pod's controlling owner, as its owner reference names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodOwner {
    /// The owner, in the Pod's namespace ([`owner_of`]).
    pub reference: WorkloadRef,
    /// Its uid: an owner deleted and created again under its name is another.
    pub uid: String,
    /// Its `apiVersion`: a custom owner (an Argo Rollout, a CloneSet) is of a group no kind
    /// tells.
    pub api_version: String,
}

/// One shared copy of each value many records hold. A value no record holds any more is
/// dropped by [`Interner::sweep`]; a snapshot that still holds one keeps it alive, and a
/// record made meanwhile gets another copy, equal to it.
#[derive(Debug)]
pub struct Interner<T: ?Sized>(HashSet<Arc<T>>);

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner(HashSet::new())
    }
}

impl<T: ?Sized + Eq + Hash> Interner<T> {
    /// The shared copy of `value`, made of it when there is none.
    pub fn shared<Q>(&mut self, value: Q) -> Arc<T>
    where
        Q: Borrow<T>,
        Arc<T>: From<Q>,
    {
        if let Some(found) = self.0.get(value.borrow()) {
            return Arc::clone(found);
        }
        let made = Arc::from(value);
        self.0.insert(Arc::clone(&made));
        made
    }

    /// Drops the values only the interner holds.
    pub fn sweep(&mut self) {
        self.0.retain(|value| Arc::strong_count(value) > 1);
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A record in the index, with the epoch of the last list or event that saw it.
#[derive(Debug)]
struct Slot {
    record: Arc<PodRecord>,
    seen: u64,
}

/// The leader's Pods, by namespace and name, kept from a watch's events ([`PodIndex::apply`]).
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<(Arc<str>, Arc<str>), Slot>,
    /// The current list's epoch: a list (`Init`) starts the next one, and `InitDone` drops
    /// the records it did not see.
    epoch: u64,
    /// Whether a list has completed: until then the index is not every Pod.
    listed: bool,
    /// Namespaces, label keys and annotation values.
    strings: Interner<str>,
    labels: Interner<LabelSet>,
    owners: Interner<PodOwner>,
    /// Records removed since the interners were last swept.
    removed: usize,
}

impl PodIndex {
    /// An index that has listed `pods` (what a completed list of them leaves).
    pub fn listed(pods: impl IntoIterator<Item = PartialObjectMeta<Pod>>) -> Self {
        let mut index = PodIndex::default();
        index.apply(Event::Init);
        for pod in pods {
            index.apply(Event::InitApply(pod));
        }
        index.apply(Event::InitDone);
        index
    }

    /// Takes in one event of the watch.
    pub fn apply(&mut self, event: Event<PartialObjectMeta<Pod>>) {
        match event {
            Event::Apply(pod) | Event::InitApply(pod) => self.upsert(pod.metadata),
            Event::Delete(pod) => {
                let meta = pod.metadata;
                let key = (
                    Arc::from(meta.namespace.unwrap_or_default()),
                    Arc::from(meta.name.unwrap_or_default()),
                );
                if self.pods.remove(&key).is_some() {
                    self.dropped(1);
                }
            }
            Event::Init => self.epoch += 1,
            Event::InitDone => {
                let epoch = self.epoch;
                let before = self.pods.len();
                self.pods.retain(|_, slot| slot.seen == epoch);
                self.listed = true;
                self.dropped(before - self.pods.len());
                self.sweep();
            }
        }
    }

    /// Whether a list has completed: until then the index is not every Pod.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    /// How many Pods it holds.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Every record, as of now.
    pub fn snapshot(&self) -> PodView {
        self.pods
            .values()
            .map(|slot| Arc::clone(&slot.record))
            .collect()
    }

    /// Keeps `meta` (a Pod's), seen in this epoch; the record already kept stays when it is
    /// equal, so that a relist holds a second copy only of the Pods that changed (and of those
    /// only while a snapshot holds the old one).
    fn upsert(&mut self, meta: ObjectMeta) {
        let Some(record) = self.record(meta) else {
            return;
        };
        let key = (Arc::clone(&record.namespace), Arc::clone(&record.name));
        let seen = self.epoch;
        let replaced = match self.pods.entry(key) {
            Entry::Occupied(mut slot) => {
                let slot = slot.get_mut();
                slot.seen = seen;
                let changed = *slot.record != record;
                if changed {
                    slot.record = Arc::new(record);
                }
                changed
            }
            Entry::Vacant(slot) => {
                slot.insert(Slot {
                    record: Arc::new(record),
                    seen,
                });
                false
            }
        };
        if replaced {
            self.dropped(1);
        }
    }

    /// What is kept of `meta`; `None` without a name.
    fn record(&mut self, meta: ObjectMeta) -> Option<PodRecord> {
        let name = Arc::from(meta.name.as_deref()?);
        let owner = controller_of(&meta)
            .zip(owner_of(&meta))
            .map(|(controller, reference)| {
                let owner = PodOwner {
                    reference,
                    uid: controller.uid.clone(),
                    api_version: controller.api_version.clone(),
                };
                self.owners.shared(owner)
            });
        let strings = &mut self.strings;
        let mut labels: Vec<(Arc<str>, Box<str>)> = meta
            .labels
            .into_iter()
            .flatten()
            .map(|(key, value)| (strings.shared(key.as_str()), value.into_boxed_str()))
            .collect();
        // A BTreeMap's keys come sorted; sorted again in case, as the lookup needs.
        labels.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let labels = LabelSet(labels.into_boxed_slice());
        let labels = self.labels.shared(labels);
        let annotations = meta.annotations.unwrap_or_default();
        let mut read = |key: &str| {
            let value = annotations.get(key)?;
            Some(self.strings.shared(value.as_str()))
        };
        let annotations = ReadAnnotations {
            injected: read(INJECTED_ANNOTATION),
            inject: read(INJECT_ANNOTATION),
            templates: read(TEMPLATES_ANNOTATION),
        };
        Some(PodRecord {
            namespace: self
                .strings
                .shared(meta.namespace.as_deref().unwrap_or_default()),
            name,
            resource_version: meta.resource_version.unwrap_or_default().into_boxed_str(),
            labels,
            annotations,
            owner,
            deleting: meta.deletion_timestamp.is_some(),
        })
    }

    /// Counts `records` removed or replaced: once as many went as the interners hold values,
    /// they are swept (so a sweep's cost is spread over as many events).
    fn dropped(&mut self, records: usize) {
        self.removed += records;
        if self.removed > self.strings.len() + self.labels.len() + self.owners.len() {
            self.sweep();
        }
    }

    /// Drops the shared values no record holds any more, and the map's room left by many
    /// Pods gone.
    fn sweep(&mut self) {
        if self.pods.capacity() > 4 * self.pods.len() + 1024 {
            self.pods.shrink_to_fit();
        }
        // Label sets first: they hold label keys of `strings`.
        self.labels.sweep();
        self.owners.sweep();
        self.strings.sweep();
        self.removed = 0;
    }
}

/// A census, the templates it counted against and the views of Pods and Namespaces it was
/// counted from.
#[derive(Clone)]
pub struct Counted {
    /// Where the Pods stand with each template.
    pub census: Arc<Census>,
    /// The templates in force when it was counted (a rollout works from these, so that its
    /// fingerprints and the counts agree).
    pub snapshot: Arc<injector_core::Snapshot>,
    /// The Pods it counted.
    pub pods: PodView,
    /// Their Namespaces.
    pub namespaces: NamespaceView,
}

impl Counted {
    /// What it counted of the template `name`: the generation of it in force then, with its
    /// tally; `None` when none was.
    pub fn of(&self, name: &str) -> Option<(i64, lifecycle::Tally)> {
        let generation = self.snapshot.get(name)?.generation;
        Some((generation, self.census.get(name)?.tally))
    }
}

/// Where the Pods stand with each template in force, by template name, with the stale and
/// missing ones by controlling owner ([`owner_of`]; `None`: a Pod without one).
pub type Census = BTreeMap<String, TemplateCensus<Option<WorkloadRef>>>;

/// Keeps only a Namespace's name and labels.
pub fn strip_namespace(meta: &mut ObjectMeta) {
    let kept = ObjectMeta {
        name: meta.name.take(),
        resource_version: meta.resource_version.take(),
        labels: meta.labels.take(),
        ..ObjectMeta::default()
    };
    *meta = kept;
}

/// Counts `pods` against the templates of `snapshot`. A Pod being deleted is left out; Pods in
/// `operator_namespace` (which no template may select) count only for what they carry.
pub fn count(
    snapshot: &injector_core::Snapshot,
    pods: &[Arc<PodRecord>],
    namespaces: &[Arc<PartialObjectMeta<Namespace>>],
    operator_namespace: &str,
) -> Census {
    let labels = lifecycle::selectable_namespaces(
        namespaces.iter().map(|ns| &ns.metadata),
        operator_namespace,
    );
    let metas = pods
        .iter()
        .filter(|pod| !pod.deleting)
        .map(|pod| (pod.meta(), pod.workload()));
    let found = lifecycle::census_by_owner(snapshot.templates(), metas, |name| {
        labels.get(name).copied()
    });
    let owned = |by: BTreeMap<Option<&WorkloadRef>, u32>| -> BTreeMap<Option<WorkloadRef>, u32> {
        by.into_iter()
            .map(|(owner, pods)| (owner.cloned(), pods))
            .collect()
    };
    found
        .into_iter()
        .map(|(name, found)| {
            let census = TemplateCensus {
                tally: found.tally,
                behind: owned(found.behind),
                in_place: owned(found.in_place),
            };
            (name, census)
        })
        .collect()
}

/// A metadata-only watch of every `K` (an `Api` of [`PartialObjectMeta`] asks the API server
/// for metadata only).
fn metadata_watch<K>(
    client: Client,
) -> impl Stream<Item = Result<Event<PartialObjectMeta<K>>, watcher::Error>> + Send
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<PartialObjectMeta<K>> = Api::all(client);
    watcher::watcher(api, watcher::Config::default().any_semantic()).default_backoff()
}

/// Keeps the metadata-only views of Pods ([`PodIndex`]) and Namespaces and, at most once per
/// [`CENSUS_PERIOD`] when something changed, counts them against the templates in force and
/// hands the tallies to `publish`; not before both have been listed once. Runs until dropped
/// (the leader's term ends) or until the watches end.
pub async fn run(
    client: Client,
    templates: Arc<Templates>,
    operator_namespace: String,
    mut publish: impl FnMut(Counted),
) {
    let mut pods = PodIndex::default();
    let (namespaces, mut namespaces_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let mut pod_events = metadata_watch::<Pod>(client.clone()).boxed();
    let mut namespace_events = metadata_watch::<Namespace>(client)
        .map(|event| event.map(|event| event.modify(|ns| strip_namespace(&mut ns.metadata))))
        .boxed();
    let mut namespaces_listed = false;
    // The Pods counted last, taken again only when an event changed the index.
    let mut view: Option<PodView> = None;
    let mut dirty = true;
    let mut counted: Option<Arc<injector_core::Snapshot>> = None;
    let mut tick = tokio::time::interval(CENSUS_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = pod_events.next() => match event {
                Some(Ok(event)) => {
                    pods.apply(event);
                    view = None;
                    dirty = true;
                }
                Some(Err(error)) => tracing::warn!(%error, "watching Pods (metadata) failed; retrying"),
                None => return,
            },
            event = namespace_events.next() => match event {
                Some(Ok(event)) => {
                    namespaces_listed |= matches!(event, Event::InitDone);
                    namespaces_writer.apply_watcher_event(&event);
                    dirty = true;
                }
                Some(Err(error)) => tracing::warn!(%error, "watching Namespaces (metadata) failed; retrying"),
                None => return,
            },
            _ = tick.tick() => {
                if !(pods.is_listed() && namespaces_listed && templates.is_synced()) {
                    continue;
                }
                let snapshot = templates.snapshot();
                let templates_changed = counted.as_ref().is_none_or(|c| !Arc::ptr_eq(c, &snapshot));
                if !(dirty || templates_changed) {
                    continue;
                }
                dirty = false;
                counted = Some(Arc::clone(&snapshot));
                let view = Arc::clone(view.get_or_insert_with(|| pods.snapshot()));
                match count_off_runtime(Arc::clone(&snapshot), Arc::clone(&view), &namespaces, &operator_namespace).await {
                    Ok(census) => publish(Counted {
                        census: Arc::new(census),
                        snapshot,
                        pods: view,
                        namespaces: namespaces.clone(),
                    }),
                    Err(error) => tracing::error!(%error, "counting Pods failed"),
                }
            }
        }
    }
}

/// [`count`] on a blocking thread: thousands of Pods times every template is CPU work.
async fn count_off_runtime(
    snapshot: Arc<injector_core::Snapshot>,
    pods: PodView,
    namespaces: &NamespaceView,
    operator_namespace: &str,
) -> Result<Census, tokio::task::JoinError> {
    let namespaces = namespaces.state();
    let operator_namespace = operator_namespace.to_owned();
    tokio::task::spawn_blocking(move || count(&snapshot, &pods, &namespaces, &operator_namespace))
        .await
}

#[cfg(test)]
mod tests;
