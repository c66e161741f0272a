//! The Pod as the planner reads it, decoded from JSON with bounded memory.
//!
//! A `serde_json::Value` of a whole Pod costs up to a hundred times its JSON: `[{"":0},…]`
//! turns 7 bytes into a map node of ~600. A webhook that builds one lets any Pod author make a
//! replica take hundreds of MiB with one 3 MiB request. So the Pod is decoded here instead:
//!
//! - only the fields [`plan`](crate::plan()) reads are built ([`READ`]); everything else
//!   (status, managedFields, the rest of the spec, …) is skipped by the parser unbuilt;
//! - for the webhook, containers, volumes and env vars too are read only in part
//!   ([`decode_pod_among`]): planning compares one whole only with a template's of the same
//!   name, so only such an item is built whole;
//! - where a read field holds something other than the JSON type the planner expects, an empty
//!   value of the type found stands in, so the planner reports the same error unbuilt;
//! - what is built is charged against an allowance of [`COST_PER_BYTE`] times the JSON's size,
//!   at an upper bound of what each value allocates; past it decoding stops with
//!   [`PodJsonError::TooComplex`].
//!
//! So a Pod costs at most a fixed multiple of its size whatever its shape, which is what lets
//! the webhook reserve memory for a request before reading it.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::plan::KnownTemplates;

/// The allowance, in bytes of memory per byte of JSON, for decoding a Pod. A `Value` costs
/// 10–30 times its JSON for real Pods (a list of `{name, value}` env entries is the worst: a
/// map node of 632 bytes each) and is charged about 1.7 times what it allocates; hostile
/// shapes (lists of empty maps) would cost more and are stopped.
pub const COST_PER_BYTE: usize = 48;

/// Why a Pod was not decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodJsonError {
    /// Not JSON, or JSON nested deeper than the parser allows.
    #[error("the Pod is not valid JSON: {0}")]
    Invalid(String),
    /// Decoding would take more than the allowance.
    #[error(
        "the Pod's fields would take more than {allowance} bytes of memory to inspect (the \
         allowance for its {size} bytes of JSON): it is made of too many tiny values"
    )]
    TooComplex {
        /// The JSON's size.
        size: usize,
        /// The allowance it gave.
        allowance: usize,
    },
}

/// Which fields of an object are built.
#[derive(Debug)]
pub enum Fields {
    /// All of it, whatever it holds.
    All,
    /// An object: these fields, each as given; the others are skipped.
    Only(&'static [(&'static str, Fields)]),
    /// A list: each item as given.
    Each(&'static Fields),
    /// An item planning compares whole only with a template's of the same name: all of it
    /// when its `name`, which the API server writes first, is one a known template adds (see
    /// [`decode_pod_among`]); else these fields.
    Named(Named, &'static Fields),
}

/// The items of a Pod planning compares whole only with a template's of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Named {
    /// A container or an init container.
    Container,
    /// A volume.
    Volume,
    /// An env var of a container (of the Pod's own, unless the container is built whole).
    Env,
}

/// What the planner reads of a Pod's metadata.
const METADATA: Fields = Fields::Only(&[
    ("name", Fields::All),
    ("generateName", Fields::All),
    ("namespace", Fields::All),
    ("labels", Fields::All),
    ("annotations", Fields::All),
]);

/// What the planner reads of a Pod (`PodView` in plan.rs): metadata and the lists it adds to.
pub const READ: Fields = Fields::Only(&[
    ("metadata", METADATA),
    (
        "spec",
        Fields::Only(&[
            ("containers", Fields::All),
            ("initContainers", Fields::All),
            ("volumes", Fields::All),
            ("imagePullSecrets", Fields::All),
            ("hostNetwork", Fields::All),
            ("serviceAccountName", Fields::All),
            ("serviceAccount", Fields::All),
        ]),
    ),
]);

/// What the planner reads of a container no template adds one of the same name of: its name,
/// what `appContainers` adds to, and whether it is a native sidecar. Only a container of a
/// template's name is compared whole (to tell whether it is the template's).
const CONTAINER: Fields = Fields::Named(
    Named::Container,
    &Fields::Only(&[
        ("name", Fields::All),
        ("env", Fields::Each(&ENV)),
        ("envFrom", Fields::All),
        ("volumeMounts", Fields::All),
        ("restartPolicy", Fields::All),
    ]),
);

/// An env var is compared only with one of the same name `appContainers` adds.
const ENV: Fields = Fields::Named(Named::Env, &Fields::Only(&[("name", Fields::All)]));

/// A volume is compared only with a template's of the same name; else the planner reads
/// whether it holds a ServiceAccount token.
const VOLUME: Fields = Fields::Named(
    Named::Volume,
    &Fields::Only(&[
        ("name", Fields::All),
        (
            "projected",
            Fields::Only(&[(
                "sources",
                Fields::Each(&Fields::Only(&[("serviceAccountToken", Fields::All)])),
            )]),
        ),
    ]),
);

/// [`READ`], with each container, volume and env var of a container whole only when a known
/// template adds one of its name.
pub const READ_AMONG: Fields = Fields::Only(&[
    ("metadata", METADATA),
    (
        "spec",
        Fields::Only(&[
            ("containers", Fields::Each(&CONTAINER)),
            ("initContainers", Fields::Each(&CONTAINER)),
            ("volumes", Fields::Each(&VOLUME)),
            ("imagePullSecrets", Fields::All),
            ("hostNetwork", Fields::All),
            ("serviceAccountName", Fields::All),
            ("serviceAccount", Fields::All),
        ]),
    ),
]);

/// The smallest allowance: a map's first node costs more than a tiny Pod's JSON.
pub const MIN_ALLOWANCE: usize = 64 * 1024;

/// A decoded value and what building it was charged.
#[derive(Clone, Debug)]
pub struct Decoded {
    /// The value, with the fields asked for.
    pub value: Value,
    /// The bytes charged against the allowance.
    pub charged: usize,
}

/// Decodes `json`, a Pod, keeping the fields [`READ`] names, within `allowance` bytes (see
/// [`allowance`]).
pub fn decode_pod(json: &str, allowance: usize) -> Result<Value, PodJsonError> {
    decode(json, &READ, allowance).map(|decoded| decoded.value)
}

/// Decodes `json`, a Pod to plan with [`plan_among`](crate::plan_among) among `known` (every
/// template in force), within `allowance` bytes: what [`decode_pod`] keeps, except that a
/// container, a volume or an env var of a container is built whole only when a known template
/// adds one of its name (what planning compares whole). Planning either gives the same plan.
/// Building the rest of the containers (probes, resources, securityContext, …) was most of
/// the cost of decoding a Pod.
///
/// A Pod that names such an item after its other fields (the API server never does) is
/// decoded again with [`READ`], once the first value is dropped.
pub fn decode_pod_among(
    json: &str,
    allowance: usize,
    known: &(impl KnownTemplates + ?Sized),
) -> Result<Value, PodJsonError> {
    let whole = |named: Named, name: &str| adds(known, named, name);
    let (decoded, complete) = decode_with(json, &READ_AMONG, allowance, &whole)?;
    if complete {
        Ok(decoded.value)
    } else {
        drop(decoded);
        decode_pod(json, allowance)
    }
}

/// The memory `json` may take to decode: [`COST_PER_BYTE`] × its size, at least
/// [`MIN_ALLOWANCE`].
pub fn allowance(json_len: usize) -> usize {
    json_len.saturating_mul(COST_PER_BYTE).max(MIN_ALLOWANCE)
}

/// Decodes a Pod as [`decode_pod_among`] does, in the middle of a larger document: the webhook
/// reads the Pod in the same pass as the AdmissionReview around it. It fails wherever
/// [`decode_pod_among`] fails or decodes the Pod a second time; the caller then reads the Pod
/// on its own with [`decode_pod_among`], for the error or the Pod.
pub struct PodAmong<'k, K: ?Sized> {
    /// The memory decoding may take, as for [`decode_pod_among`].
    pub allowance: usize,
    /// Every template in force.
    pub known: &'k K,
}

impl<'de, K: KnownTemplates + ?Sized> DeserializeSeed<'de> for PodAmong<'_, K> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        let whole = |named: Named, name: &str| adds(self.known, named, name);
        let state = State::new(self.allowance, &whole);
        let value = Pruned {
            fields: &READ_AMONG,
            state: &state,
        }
        .deserialize(deserializer)?;
        if state.incomplete.get() {
            return Err(de::Error::custom(
                "a container is named after its other fields; decode the Pod on its own",
            ));
        }
        Ok(value)
    }
}

/// Whether a known template adds a `named` item called `name`.
fn adds(known: &(impl KnownTemplates + ?Sized), named: Named, name: &str) -> bool {
    match named {
        Named::Container => known.adding_container(name).next().is_some(),
        Named::Volume => known.adds_volume(name),
        Named::Env => known.adds_app_env(name),
    }
}

/// Decodes `json`, keeping `fields`, within `allowance` bytes. A [`Fields::Named`] item keeps
/// its fields whatever its name.
pub fn decode(json: &str, fields: &Fields, allowance: usize) -> Result<Decoded, PodJsonError> {
    decode_with(json, fields, allowance, &|_, _| false).map(|(decoded, _)| decoded)
}

/// Whether a [`Fields::Named`] item of this name is built whole.
type Whole<'w> = &'w dyn Fn(Named, &str) -> bool;

/// [`decode`], building a [`Fields::Named`] item whole when `whole` says so of its name; and
/// whether that was done for every such item (`false`: one named after its other fields,
/// which were skipped already).
fn decode_with(
    json: &str,
    fields: &Fields,
    allowance: usize,
    whole: Whole<'_>,
) -> Result<(Decoded, bool), PodJsonError> {
    let state = State::new(allowance, whole);
    let mut parser = serde_json::Deserializer::from_str(json);
    let decoded = Pruned {
        fields,
        state: &state,
    }
    .deserialize(&mut parser)
    .and_then(|value| parser.end().map(|()| value));
    decoded
        .map(|value| {
            let decoded = Decoded {
                value,
                charged: allowance - state.budget.left.get(),
            };
            (decoded, !state.incomplete.get())
        })
        .map_err(|error| {
            if state.budget.exceeded.get() {
                PodJsonError::TooComplex {
                    size: json.len(),
                    allowance,
                }
            } else {
                PodJsonError::Invalid(error.to_string())
            }
        })
}

/// Upper bounds of what building a value allocates, with the allocator's rounding and the
/// containers' spare capacity.
mod cost {
    /// A list's first `Value`: its `Vec` starts with room for 4 (of 32 bytes).
    pub const LIST_FIRST_ITEM: usize = 128;
    /// A further `Value` in a `Vec` that grows by doubling: up to twice its 32 bytes, and
    /// while the `Vec` moves to a block twice as large, the old block as well.
    pub const LIST_ITEM: usize = 96;
    /// An entry of a `BTreeMap<String, Value>`: its 56 bytes in a node at least half full, and
    /// the inner nodes above.
    pub const MAP_ENTRY: usize = 160;
    /// A map's first node, allocated whole (11 entries' room) for its first entry.
    pub const MAP_FIRST_NODE: usize = 640;
    /// A string's heap block: its bytes rounded up, and the allocator's header.
    pub fn string(len: usize) -> usize {
        len.div_ceil(16) * 16 + 16
    }
}

/// The memory left to decode with.
struct Budget {
    left: Cell<usize>,
    exceeded: Cell<bool>,
}

impl Budget {
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.exceeded.set(true);
                Err(E::custom(
                    "the memory allowance for decoding the Pod is spent",
                ))
            }
        }
    }
}

/// What one decoding shares.
struct State<'w> {
    budget: Budget,
    whole: Whole<'w>,
    /// Set when an item's name asked for it whole after its other fields were skipped.
    incomplete: Cell<bool>,
}

impl<'w> State<'w> {
    fn new(allowance: usize, whole: Whole<'w>) -> Self {
        State {
            budget: Budget {
                left: Cell::new(allowance),
                exceeded: Cell::new(false),
            },
            whole,
            incomplete: Cell::new(false),
        }
    }
}

/// Builds the value at hand, keeping `fields` of it.
#[derive(Clone, Copy)]
struct Pruned<'f, 's, 'w> {
    fields: &'f Fields,
    state: &'s State<'w>,
}

impl<'f> Pruned<'f, '_, '_> {
    fn with(self, fields: &'f Fields) -> Self {
        Pruned { fields, ..self }
    }

    fn string<E: de::Error>(self, text: &str, cost: usize) -> Result<Value, E> {
        if !matches!(self.fields, Fields::All) {
            // Something else was expected: the planner only needs to know it is a string.
            return Ok(Value::String(String::new()));
        }
        self.state.budget.charge(cost)?;
        Ok(Value::String(text.to_owned()))
    }
}

impl<'de> DeserializeSeed<'de> for Pruned<'_, '_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pruned<'_, '_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Value, E> {
        self.string(v, cost::string(v.len()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        // Not borrowed: unescaped into the parser's scratch buffer, which grows by doubling.
        self.string(v, cost::string(v.len()) + 2 * v.len())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let item = match self.fields {
            Fields::All => self,
            Fields::Each(item) => self.with(item),
            Fields::Only(_) | Fields::Named(..) => {
                // An object was expected: the planner only needs to know it is a list.
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(Value::Array(Vec::new()));
            }
        };
        let mut items = Vec::new();
        loop {
            self.state.budget.charge(if items.is_empty() {
                cost::LIST_FIRST_ITEM
            } else {
                cost::LIST_ITEM
            })?;
            match seq.next_element_seed(item)? {
                Some(value) => items.push(value),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        let mut kept = match self.fields {
            Fields::Named(_, fields) => fields,
            fields => fields,
        };
        // Whether the key at hand is the object's first: an item named first is built whole,
        // if need be, from its next field on.
        let mut first_key = true;
        while let Some(key) = map.next_key_seed(Key)? {
            let is_first_key = std::mem::replace(&mut first_key, false);
            let fields = match kept {
                Fields::All => &Fields::All,
                Fields::Only(kept) => match kept.iter().find(|(name, _)| *name == key.as_str()) {
                    Some((_, fields)) => fields,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                },
                // A list was expected: the planner only needs to know it is an object.
                Fields::Each(_) | Fields::Named(..) => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let first_node = if object.is_empty() {
                cost::MAP_FIRST_NODE
            } else {
                0
            };
            self.state
                .budget
                .charge(first_node + cost::MAP_ENTRY + cost::string(key.as_str().len()))?;
            let value = map.next_value_seed(self.with(fields))?;
            if let Fields::Named(named, _) = self.fields
                && key.as_str() == "name"
                && value
                    .as_str()
                    .is_some_and(|name| (self.state.whole)(*named, name))
            {
                if is_first_key {
                    kept = &Fields::All;
                } else {
                    self.state.incomplete.set(true);
                }
            }
            object.insert(key.into_owned(), value);
        }
        Ok(Value::Object(object))
    }
}

/// An object's key, borrowed from the JSON unless it has escapes: a skipped field's key is
/// never copied.
enum KeyText<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl KeyText<'_> {
    fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(text) => text,
            KeyText::Owned(text) => text,
        }
    }

    fn into_owned(self) -> String {
        match self {
            KeyText::Borrowed(text) => text.to_owned(),
            KeyText::Owned(text) => text,
        }
    }
}

struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = KeyText<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<KeyText<'de>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = KeyText<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<KeyText<'de>, E> {
        Ok(KeyText::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText<'de>, E> {
        Ok(KeyText::Owned(v.to_owned()))
    }
}

#[cfg(test)]
#[path = "pod_json/tests.rs"]
mod tests;
