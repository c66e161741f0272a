//! Where a running Pod stands with each template, from its metadata alone: **current** (it
//! carries what the template injects now), **stale** (it carries an earlier version of it) or
//! **missing** (the template selects it now but it does not carry it: created before the
//! template, or admitted while a best-effort template's webhook was down).
//!
//! A Pod's record (`sidecar.dev/injected`, written at admission) lists `name@generation#fingerprint`
//! for each template it carries; the fingerprint covers only what is injected, so an edit of a
//! template's priority or selectors leaves its Pods current. Records written before
//! fingerprints existed (`name@generation`) count as stale: what they carry is unknown.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use injector_api::PodCounts;
use injector_api::names::{INJECT_ANNOTATION, INJECTED_ANNOTATION, TEMPLATES_ANNOTATION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::labels::Labels;
use crate::plan::NamespaceInfo;
use crate::rules;
use crate::rules::record;
pub use crate::rules::record::Recorded;
use crate::template::CompiledTemplate;

/// Where a Pod stands with a template that selects it or that it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// It carries what the template injects now.
    Current,
    /// It carries an earlier version: `in_place` when only images differ.
    Stale {
        /// Only the images of injected containers changed since.
        in_place: bool,
    },
    /// The template selects it but it does not carry it.
    Missing,
}

/// What is known of a Pod without its spec: where it runs and its labels and annotations.
/// Both are read through [`Labels`], so that a caller keeping Pods in a form of its own (the
/// leader's census keeps of the annotations only the three read here) need not build an
/// [`ObjectMeta`] to ask.
#[derive(Clone, Copy)]
pub struct PodMeta<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its labels.
    pub labels: &'a dyn Labels,
    /// Its annotations: of them, `sidecar.dev/injected`, `sidecar.dev/inject` and
    /// `sidecar.dev/templates` are read.
    pub annotations: &'a dyn Labels,
}

impl fmt::Debug for PodMeta<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let read = [INJECTED_ANNOTATION, INJECT_ANNOTATION, TEMPLATES_ANNOTATION];
        let annotations: BTreeMap<&str, &str> = read
            .into_iter()
            .filter_map(|key| Some((key, self.annotations.label(key)?)))
            .collect();
        f.debug_struct("PodMeta")
            .field("namespace", &self.namespace)
            .field("annotations", &annotations)
            .finish_non_exhaustive()
    }
}

/// The labels and annotations of an object that has none.
static NO_KEYS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> PodMeta<'a> {
    /// What `meta` (a Pod's metadata) tells: absent labels and annotations read as empty.
    pub fn of(meta: &'a ObjectMeta) -> Self {
        PodMeta {
            namespace: meta.namespace.as_deref().unwrap_or_default(),
            labels: meta.labels.as_ref().unwrap_or(&NO_KEYS),
            annotations: meta.annotations.as_ref().unwrap_or(&NO_KEYS),
        }
    }
}

/// The entries of a Pod's record.
pub fn recorded<'a>(annotations: &'a (impl Labels + ?Sized)) -> impl Iterator<Item = Recorded<'a>> {
    annotations
        .label(INJECTED_ANNOTATION)
        .into_iter()
        .flat_map(record::entries)
        .map(Recorded::parse)
}

/// Where `pod` stands with `template`, in `namespace` (its labels, when known, for the
/// template's namespace selector): `None` when the template neither selects it nor is carried.
pub fn state(
    template: &CompiledTemplate,
    pod: &PodMeta<'_>,
    namespace: &NamespaceInfo<'_>,
) -> Option<PodState> {
    if let Some(state) = carried(template, pod) {
        return Some(state);
    }
    selects(template, pod, namespace).then_some(PodState::Missing)
}

/// Whether `template` would be applied to `pod` if it were created now, as far as its
/// metadata tells: the same rules as admission's (excluded and opted-out namespaces, the
/// namespace and pod selectors, `OnRequest`, a Pod's opt-out of best-effort templates).
pub fn selects(
    template: &CompiledTemplate,
    pod: &PodMeta<'_>,
    namespace: &NamespaceInfo<'_>,
) -> bool {
    rules::selection::selects(
        template.selecting(),
        pod.labels,
        pod.annotations,
        pod.namespace,
        namespace,
    )
}

/// How many Pods stand where with one template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Pods that carry what it injects now.
    pub current: u32,
    /// Pods that carry an earlier version of it.
    pub stale: u32,
    /// Of the stale ones, those whose change is only in images.
    pub stale_in_place: u32,
    /// Pods it selects that do not carry it.
    pub missing: u32,
}

impl Tally {
    /// Counts one Pod in `state`.
    pub fn add(&mut self, state: PodState) {
        let count = match state {
            PodState::Current => &mut self.current,
            PodState::Stale { in_place } => {
                if in_place {
                    self.stale_in_place += 1;
                }
                &mut self.stale
            }
            PodState::Missing => &mut self.missing,
        };
        *count += 1;
    }

    /// Pods that carry the template, current or not.
    pub fn injected(&self) -> u32 {
        self.current + self.stale
    }
}

impl From<Tally> for PodCounts {
    fn from(tally: Tally) -> Self {
        PodCounts {
            injected: tally.injected(),
            current: tally.current,
            stale: tally.stale,
            missing: tally.missing,
        }
    }
}

/// Where every Pod of `pods` stands with each of `templates`, by template name (every template
/// has a tally, zero when no Pod is concerned). `namespace` gives a namespace's labels, or
/// `None` for a namespace whose Pods no template may select (the operator's own, or one not
/// seen yet): a Pod there counts only when it carries a template.
pub fn census<'p>(
    templates: &[Arc<CompiledTemplate>],
    pods: impl IntoIterator<Item = PodMeta<'p>>,
    namespace: impl Fn(&str) -> Option<&'p BTreeMap<String, String>>,
) -> BTreeMap<String, Tally> {
    census_by_owner(templates, pods.into_iter().map(|pod| (pod, ())), namespace)
        .into_iter()
        .map(|(name, census)| (name, census.tally))
        .collect()
}

/// The labels of each of `namespaces` whose Pods templates may select, by name: every one but
/// `operator_namespace`, which no template may select. A Pod of a namespace left out counts
/// only for what it carries ([`standing`]).
pub fn selectable_namespaces<'n>(
    namespaces: impl IntoIterator<Item = &'n ObjectMeta>,
    operator_namespace: &str,
) -> BTreeMap<&'n str, &'n BTreeMap<String, String>> {
    namespaces
        .into_iter()
        .filter_map(|ns| {
            let name = ns.name.as_deref()?;
            (name != operator_namespace).then(|| (name, ns.labels.as_ref().unwrap_or(&NO_KEYS)))
        })
        .collect()
}

/// Whether a Pod counts at all: one being deleted does not.
pub fn counts(pod: &ObjectMeta) -> bool {
    pod.deletion_timestamp.is_none()
}

/// One template's census: its tally, and its stale and missing Pods by owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateCensus<O> {
    /// Where its Pods stand.
    pub tally: Tally,
    /// How many stale or missing Pods each owner has.
    pub behind: BTreeMap<O, u32>,
    /// Of those, how many are stale only in images (they can be updated in place).
    pub in_place: BTreeMap<O, u32>,
}

impl<O> Default for TemplateCensus<O> {
    fn default() -> Self {
        TemplateCensus {
            tally: Tally::default(),
            behind: BTreeMap::new(),
            in_place: BTreeMap::new(),
        }
    }
}

/// [`census`], with each Pod's owner `O`: the stale and missing Pods are also counted by
/// owner, which is what a rollout restarts.
pub fn census_by_owner<'p, O: Ord + Clone>(
    templates: &[Arc<CompiledTemplate>],
    pods: impl IntoIterator<Item = (PodMeta<'p>, O)>,
    namespace: impl Fn(&str) -> Option<&'p BTreeMap<String, String>>,
) -> BTreeMap<String, TemplateCensus<O>> {
    let mut found: Vec<TemplateCensus<O>> = templates
        .iter()
        .map(|_| TemplateCensus::default())
        .collect();
    for (pod, owner) in pods {
        let labels = namespace(pod.namespace);
        for (template, census) in templates.iter().zip(&mut found) {
            let Some(state) = standing(template, &pod, labels) else {
                continue;
            };
            census.tally.add(state);
            if state != PodState::Current {
                *census.behind.entry(owner.clone()).or_default() += 1;
            }
            if state == (PodState::Stale { in_place: true }) {
                *census.in_place.entry(owner.clone()).or_default() += 1;
            }
        }
    }
    templates
        .iter()
        .map(|t| t.name.clone())
        .zip(found)
        .collect()
}

/// Where `pod` stands with `template` as [`census`] counts it: by [`state`] when its
/// namespace's labels are known, else (a namespace whose Pods no template may select) by what
/// it carries alone. For callers that need each Pod's standing, not only the tallies.
pub fn standing(
    template: &CompiledTemplate,
    pod: &PodMeta<'_>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Option<PodState> {
    match namespace_labels {
        Some(labels) => state(
            template,
            pod,
            &NamespaceInfo {
                name: pod.namespace,
                labels: Some(labels),
            },
        ),
        None => carried(template, pod),
    }
}

/// Where `pod` stands with `template` by its record alone: `None` when it does not carry it.
pub fn carried(template: &CompiledTemplate, pod: &PodMeta<'_>) -> Option<PodState> {
    let entry = recorded(pod.annotations).find(|e| e.name == template.name)?;
    Some(match entry.fingerprint {
        Some(fingerprint) if fingerprint == template.fingerprint => PodState::Current,
        Some(fingerprint) => PodState::Stale {
            in_place: fingerprint.only_images_differ(&template.fingerprint),
        },
        None => PodState::Stale { in_place: false },
    })
}

#[cfg(test)]
mod tests;
