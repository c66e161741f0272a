//! The leader's census of Pods: where every Pod stands with each template (current, stale or
//! missing, [`injector_core::lifecycle`]), for the templates' `status.pods`, the
//! `sidecar_injector_template_pods` metric and the event on a template that leaves Pods stale.
//!
//! It works from a metadata-only view of Pods and Namespaces (a metadata watch: the API
//! server never sends a spec or status), and keeps of each Pod only what the census reads:
//! its name, labels, owners, deletion time and the annotations admission reads
//! (`sidecar.dev/injected`, `sidecar.dev/inject`, `sidecar.dev/templates`). The count runs
//! off the async runtime at most once per [`CENSUS_PERIOD`], when a Pod, a Namespace or the
//! templates changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use injector_api::WorkloadRef;
use injector_api::names::{INJECT_ANNOTATION, INJECTED_ANNOTATION, TEMPLATES_ANNOTATION};
use injector_core::Templates;
use injector_core::lifecycle::{self, PodMeta, TemplateCensus};
use injector_core::workload::owner_of;
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

/// The annotations of a Pod the census reads; the view drops every other.
const READ_ANNOTATIONS: [&str; 3] = [INJECTED_ANNOTATION, INJECT_ANNOTATION, TEMPLATES_ANNOTATION];

/// The leader's view of Pods (stripped metadata), which a rollout reads for the Pods to
/// update in place.
pub type PodView = Store<PartialObjectMeta<Pod>>;

/// The leader's view of Namespaces (their names and labels), for the namespace selectors of
/// a Pod planned again.
pub type NamespaceView = Store<PartialObjectMeta<Namespace>>;

/// A census, the templates it counted against and the views of Pods and Namespaces it was
/// counted from.
#[derive(Clone)]
pub struct Counted {
    /// Where the Pods stand with each template.
    pub census: Arc<Census>,
    /// The templates in force when it was counted (a rollout works from these, so that its
    /// fingerprints and the counts agree).
    pub snapshot: Arc<injector_core::Snapshot>,
    /// The Pods.
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

/// Keeps only what the census reads of a Pod's metadata.
pub fn strip_pod(meta: &mut ObjectMeta) {
    let kept = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        resource_version: meta.resource_version.take(),
        labels: meta.labels.take(),
        annotations: meta.annotations.take().map(|mut annotations| {
            annotations.retain(|key, _| READ_ANNOTATIONS.contains(&key.as_str()));
            annotations
        }),
        owner_references: meta.owner_references.take(),
        deletion_timestamp: meta.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
    *meta = kept;
}

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
    pods: &[Arc<PartialObjectMeta<Pod>>],
    namespaces: &[Arc<PartialObjectMeta<Namespace>>],
    operator_namespace: &str,
) -> Census {
    let labels = lifecycle::selectable_namespaces(
        namespaces.iter().map(|ns| &ns.metadata),
        operator_namespace,
    );
    let metas = pods
        .iter()
        .filter(|pod| lifecycle::counts(&pod.metadata))
        .map(|pod| (PodMeta::of(&pod.metadata), owner_of(&pod.metadata)));
    lifecycle::census_by_owner(snapshot.templates(), metas, |name| {
        labels.get(name).copied()
    })
}

/// A metadata-only watch of every `K` (an `Api` of [`PartialObjectMeta`] asks the API server
/// for metadata only), each object stripped by `strip` before it is kept.
fn metadata_view<K>(
    client: Client,
    strip: fn(&mut ObjectMeta),
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
    watcher::watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .map(move |event| event.map(|event| event.modify(|object| strip(&mut object.metadata))))
}

/// Keeps the metadata-only views of Pods and Namespaces and, at most once per
/// [`CENSUS_PERIOD`] when something changed, counts them against the templates in force and
/// hands the tallies to `publish`. Runs until dropped (the leader's term ends) or until the
/// watches end.
pub async fn run(
    client: Client,
    templates: Arc<Templates>,
    operator_namespace: String,
    mut publish: impl FnMut(Counted),
) {
    let (pods, mut pods_writer) = reflector::store::<PartialObjectMeta<Pod>>();
    let (namespaces, mut namespaces_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let mut pod_events = metadata_view::<Pod>(client.clone(), strip_pod).boxed();
    let mut namespace_events = metadata_view::<Namespace>(client, strip_namespace).boxed();
    let mut pods_listed = false;
    let mut namespaces_listed = false;
    let mut dirty = true;
    let mut counted: Option<Arc<injector_core::Snapshot>> = None;
    let mut tick = tokio::time::interval(CENSUS_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = pod_events.next() => match event {
                Some(Ok(event)) => {
                    pods_listed |= matches!(event, Event::InitDone);
                    pods_writer.apply_watcher_event(&event);
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
                if !(pods_listed && namespaces_listed && templates.is_synced()) {
                    continue;
                }
                let snapshot = templates.snapshot();
                let templates_changed = counted.as_ref().is_none_or(|c| !Arc::ptr_eq(c, &snapshot));
                if !(dirty || templates_changed) {
                    continue;
                }
                dirty = false;
                counted = Some(Arc::clone(&snapshot));
                match count_off_runtime(Arc::clone(&snapshot), &pods, &namespaces, &operator_namespace).await {
                    Ok(census) => publish(Counted {
                        census: Arc::new(census),
                        snapshot,
                        pods: pods.clone(),
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
    pods: &Store<PartialObjectMeta<Pod>>,
    namespaces: &Store<PartialObjectMeta<Namespace>>,
    operator_namespace: &str,
) -> Result<Census, tokio::task::JoinError> {
    let pods = pods.state();
    let namespaces = namespaces.state();
    let operator_namespace = operator_namespace.to_owned();
    tokio::task::spawn_blocking(move || count(&snapshot, &pods, &namespaces, &operator_namespace))
        .await
}

#[cfg(test)]
mod tests;
