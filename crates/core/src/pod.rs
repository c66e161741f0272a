//! The Pod as the planner reads it: typed, and borrowed from its JSON (or from its `Value`)
//! wherever it can be.
//!
//! Planning reads a handful of fields: the metadata placeholders and selectors read, and the
//! names of what the Pod already holds where templates add (containers, init containers,
//! volumes, pull secrets, and of the Pod's own containers their env, envFrom and mounts). An
//! item is compared field for field only with a template's of the same name, so only such an
//! item is kept whole, as JSON ([`Whole`]); of the others, their name is enough. A Pod comes
//! from a `serde_json::Value` ([`Pod::from_value`], borrowing it: `render`, tests) or straight
//! from the request's bytes ([`json`], the webhook), so no whole-Pod `Value` and no
//! copy of a string without escapes is made on the hot path.

pub mod json;

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::labels::Labels;
use crate::rules::defaulted::TOKEN_VOLUME_PREFIX;

/// The Pod is not a Pod: a field the planner needs is missing or of the wrong type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a valid Pod: {0}")]
pub struct MalformedPod(String);

impl MalformedPod {
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        MalformedPod(reason.into())
    }
}

/// A string of the Pod, borrowed from its JSON unless it had to be unescaped.
pub type Str<'a> = Cow<'a, str>;

/// An item of the Pod kept whole, for comparing it with a template's.
pub type Whole<'a> = Cow<'a, Value>;

/// What the planner reads of a Pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pod<'a> {
    /// Whether `metadata` is there (a patch adding labels must create it otherwise).
    pub(crate) has_metadata: bool,
    /// `metadata.name`, else `metadata.generateName`; empty when neither is a non-empty string.
    pub(crate) name: Str<'a>,
    /// `metadata.namespace`, when a non-empty string.
    pub(crate) namespace: Option<Str<'a>>,
    /// `spec.serviceAccountName`, else `spec.serviceAccount`, else `default`.
    pub(crate) service_account_name: Str<'a>,
    pub(crate) labels: Option<Strings<'a>>,
    pub(crate) annotations: Option<Strings<'a>>,
    pub(crate) containers: Vec<Container<'a>>,
    pub(crate) init_containers: Option<Vec<Container<'a>>>,
    pub(crate) volumes: Option<Vec<Volume<'a>>>,
    /// The names of `spec.imagePullSecrets` (empty where an entry has none).
    pub(crate) image_pull_secrets: Option<Vec<Str<'a>>>,
    /// `spec.hostNetwork: true`.
    pub(crate) host_network: bool,
    /// `spec.automountServiceAccountToken: false`: the ServiceAccount plugin then mounts no
    /// token, whatever volume the Pod holds.
    pub(crate) token_automount_off: bool,
}

/// A container or an init container of the Pod. One kept whole is read from its whole: its
/// `env`, `envFrom` and `volumeMounts` are then `None` here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Container<'a> {
    pub(crate) name: Str<'a>,
    /// All of it, when a template adds a container of its name.
    pub(crate) whole: Option<Whole<'a>>,
    /// `env`, when a list.
    pub(crate) env: Option<Vec<EnvVar<'a>>>,
    /// `envFrom`, when a list. Decoded from JSON among templates none of which adds envFrom
    /// sources to the Pod's containers, it is an empty list: planning then only reads that
    /// there is one.
    pub(crate) env_from: Option<Whole<'a>>,
    /// `volumeMounts`, when a list.
    pub(crate) volume_mounts: Option<Vec<Mount<'a>>>,
    /// `restartPolicy: Always`: a native sidecar.
    pub(crate) native_sidecar: bool,
}

/// An item known by its name (an env var), whole when a template adds one of its name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvVar<'a> {
    pub(crate) name: Str<'a>,
    pub(crate) whole: Option<Whole<'a>>,
}

/// A volume mount of one of the Pod's containers, whole when a template mounts a volume at
/// its path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mount<'a> {
    /// `mountPath`; empty when it has none.
    pub(crate) path: Str<'a>,
    pub(crate) whole: Option<Whole<'a>>,
}

/// A volume of the Pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Volume<'a> {
    pub(crate) name: Str<'a>,
    /// All of it, when a template adds a volume of its name.
    pub(crate) whole: Option<Whole<'a>>,
    /// A projected volume with a `serviceAccountToken` source, as the ServiceAccount plugin
    /// adds.
    pub(crate) holds_token: bool,
}

/// Up to this many keys, [`Strings::get`] scans rather than searches: a Pod has about ten
/// labels.
const SCANNED_KEYS: usize = 16;

/// Labels or annotations: each key once (the last one given wins, as in JSON objects), with
/// its value when that is a string.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Strings<'a> {
    /// Sorted by key.
    entries: Vec<(Str<'a>, Option<Str<'a>>)>,
}

impl<'a> Strings<'a> {
    /// From entries in the order given; of a key given twice, the last counts.
    pub fn from_entries(mut entries: Vec<(Str<'a>, Option<Str<'a>>)>) -> Self {
        // The API server writes a map's keys sorted (Go's `encoding/json` does), so keys in
        // strictly rising order, sorted and each once, are the common case.
        if entries.is_sorted_by(|a, b| a.0 < b.0) {
            return Strings { entries };
        }
        // A stable sort of the reversed list puts each key's last entry first among its own.
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, kept| later.0 == kept.0);
        Strings { entries }
    }

    /// Borrows a JSON object's keys and string values.
    pub fn of_map(map: &'a Map<String, Value>) -> Self {
        // A `Map` is sorted and unique already.
        let mut entries: Vec<_> = map
            .iter()
            .map(|(k, v)| (Cow::Borrowed(k.as_str()), v.as_str().map(Cow::Borrowed)))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Strings { entries }
    }

    /// `Some(value)` when `key` is there: `value` is `None` when it is not a string.
    pub fn get(&self, key: &str) -> Option<Option<&str>> {
        let at = if self.entries.len() <= SCANNED_KEYS {
            // Equality compares lengths first: a scan calls `memcmp` about once, where a
            // binary search calls it at every step.
            self.entries.iter().position(|(k, _)| k.as_ref() == key)
        } else {
            self.entries
                .binary_search_by(|(k, _)| k.as_ref().cmp(key))
                .ok()
        };
        at.map(|at| self.entries[at].1.as_deref())
    }

    /// Sets `key` to `value`.
    pub fn insert(&mut self, key: Str<'a>, value: Str<'a>) {
        match self
            .entries
            .binary_search_by(|(k, _)| k.as_ref().cmp(key.as_ref()))
        {
            Ok(at) => self.entries[at].1 = Some(value),
            Err(at) => self.entries.insert(at, (key, Some(value))),
        }
    }

    /// The keys and string values, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.entries.iter().map(|(k, v)| (k.as_ref(), v.as_deref()))
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Labels for Strings<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).flatten()
    }
}

impl<'a> Pod<'a> {
    /// Reads `pod`, a Pod's JSON as a `Value`, borrowing from it.
    pub fn from_value(pod: &'a Value) -> Result<Self, MalformedPod> {
        let pod = pod
            .as_object()
            .ok_or_else(|| MalformedPod::new("the object is not a JSON object"))?;
        let metadata = optional_object(pod, "metadata", "metadata")?;
        let spec = optional_object(pod, "spec", "spec")?
            .ok_or_else(|| MalformedPod::new("spec is missing"))?;
        let containers = optional_array(spec, "containers", "spec.containers")?
            .ok_or_else(|| MalformedPod::new("spec.containers is missing"))?;
        let init_containers = optional_array(spec, "initContainers", "spec.initContainers")?;
        for (field, list) in [
            ("spec.containers", Some(containers)),
            ("spec.initContainers", init_containers),
        ] {
            if list.into_iter().flatten().any(|c| !c.is_object()) {
                return Err(MalformedPod::new(format!("{field} holds a non-object")));
            }
        }
        let labels = metadata
            .map(|m| optional_object(m, "labels", "metadata.labels"))
            .transpose()?
            .flatten();
        let annotations = metadata
            .map(|m| optional_object(m, "annotations", "metadata.annotations"))
            .transpose()?
            .flatten();
        let volumes = optional_array(spec, "volumes", "spec.volumes")?;
        let image_pull_secrets = optional_array(spec, "imagePullSecrets", "spec.imagePullSecrets")?;
        Ok(Pod {
            has_metadata: metadata.is_some(),
            name: Cow::Borrowed(
                text(metadata, "name")
                    .or_else(|| text(metadata, "generateName"))
                    .unwrap_or_default(),
            ),
            namespace: text(metadata, "namespace").map(Cow::Borrowed),
            service_account_name: Cow::Borrowed(
                text(Some(spec), "serviceAccountName")
                    .or_else(|| text(Some(spec), "serviceAccount"))
                    .unwrap_or("default"),
            ),
            labels: labels.map(Strings::of_map),
            annotations: annotations.map(Strings::of_map),
            containers: containers.iter().map(Container::of_value).collect(),
            init_containers: init_containers
                .map(|list| list.iter().map(Container::of_value).collect()),
            volumes: volumes.map(|list| {
                list.iter()
                    .map(|volume| Volume {
                        name: Cow::Borrowed(name_of(volume)),
                        whole: volume.is_object().then_some(Cow::Borrowed(volume)),
                        holds_token: holds_service_account_token(volume),
                    })
                    .collect()
            }),
            image_pull_secrets: image_pull_secrets
                .map(|list| list.iter().map(|s| Cow::Borrowed(name_of(s))).collect()),
            host_network: spec.get("hostNetwork") == Some(&Value::Bool(true)),
            token_automount_off: spec.get("automountServiceAccountToken")
                == Some(&Value::Bool(false)),
        })
    }

    /// `metadata.name`, else `metadata.generateName`; empty when neither is set.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.labels`, when an object.
    pub fn labels(&self) -> Option<&Strings<'a>> {
        self.labels.as_ref()
    }

    /// The value of annotation `key`, when a string.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref().and_then(|a| a.get(key)).flatten()
    }

    /// The names of the volumes holding a ServiceAccount token.
    pub(crate) fn token_volumes(&self) -> Vec<&str> {
        self.volumes
            .iter()
            .flatten()
            .filter(|v| v.holds_token)
            .map(|v| v.name.as_ref())
            .collect()
    }
}

impl Pod<'_> {
    /// The volume whose mount the ServiceAccount admission plugin appends to every container
    /// lacking a mount at the token's path, when it runs again after a mutation
    /// (`mountServiceAccountToken` in k8s.io/kubernetes `plugin/pkg/admission/serviceaccount`):
    /// the first volume named with its prefix, taken only when it holds a token, and none
    /// when the Pod turns the token off. Templates' volumes (`is_templates`) are left out: the
    /// plugin's volume is the Pod's own, listed before anything injected.
    pub(crate) fn service_account_volume(
        &self,
        is_templates: impl Fn(&str) -> bool,
    ) -> Option<&str> {
        if self.token_automount_off {
            return None;
        }
        self.volumes
            .iter()
            .flatten()
            .find(|v| v.name.starts_with(TOKEN_VOLUME_PREFIX) && !is_templates(&v.name))
            .filter(|v| v.holds_token)
            .map(|v| v.name.as_ref())
    }
}

impl<'a> Container<'a> {
    /// Reads a container (an object) of a Pod's `Value`, whole.
    pub(crate) fn of_value(container: &'a Value) -> Self {
        Container {
            name: Cow::Borrowed(name_of(container)),
            native_sidecar: is_native_sidecar(container),
            whole: Some(Cow::Borrowed(container)),
            ..Container::default()
        }
    }

    /// Reads a container decoded whole.
    pub(crate) fn of_owned(container: Value) -> Container<'static> {
        Container {
            name: Cow::Owned(name_of(&container).to_owned()),
            native_sidecar: is_native_sidecar(&container),
            whole: Some(Cow::Owned(container)),
            ..Container::default()
        }
    }

    /// Its name, and all of it when it was kept whole.
    pub(crate) fn key_and_whole(&self) -> (&str, Option<&Value>) {
        (self.name.as_ref(), self.whole.as_deref())
    }
}

/// The `mountPath` of a volume mount; empty when it has none.
pub(crate) fn mount_path(mount: &Value) -> &str {
    mount
        .get("mountPath")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A non-empty string at `key` of `map`.
fn text<'a>(map: Option<&'a Map<String, Value>>, key: &str) -> Option<&'a str> {
    map.and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn optional_object<'a>(
    parent: &'a Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<Option<&'a Map<String, Value>>, MalformedPod> {
    match parent.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(_) => Err(MalformedPod::new(format!("{field} is not an object"))),
    }
}

fn optional_array<'a>(
    parent: &'a Map<String, Value>,
    key: &str,
    field: &str,
) -> Result<Option<&'a [Value]>, MalformedPod> {
    match parent.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(_) => Err(MalformedPod::new(format!("{field} is not a list"))),
    }
}

/// A projected volume with a `serviceAccountToken` source.
pub(crate) fn holds_service_account_token(volume: &Value) -> bool {
    volume["projected"]["sources"]
        .as_array()
        .is_some_and(|sources| {
            sources
                .iter()
                .any(|s| s.get("serviceAccountToken").is_some())
        })
}

/// An init container with `restartPolicy: Always`.
fn is_native_sidecar(container: &Value) -> bool {
    container.get("restartPolicy").and_then(Value::as_str) == Some("Always")
}

/// The `name` of an item; empty when it has none.
pub(crate) fn name_of(item: &Value) -> &str {
    item.get("name").and_then(Value::as_str).unwrap_or_default()
}

#[cfg(test)]
mod tests;
