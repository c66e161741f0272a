//! The Pod as the planner reads it, decoded from JSON with bounded memory.
//!
//! A `serde_json::Value` of a whole Pod costs up to a hundred times its JSON: `[{"":0},…]`
//! turns 7 bytes into a map node of ~600. A webhook that builds one lets any Pod author make a
//! replica take hundreds of MiB with one 3 MiB request. So the Pod is decoded here instead:
//!
//! - only the fields [`plan`](crate::plan()) reads are built ([`READ`]); everything else
//!   (status, managedFields, the rest of the spec, …) is skipped by the parser unbuilt;
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
}

/// What the planner reads of a Pod (`PodView` in plan.rs): metadata and the lists it adds to.
pub const READ: Fields = Fields::Only(&[
    (
        "metadata",
        Fields::Only(&[
            ("name", Fields::All),
            ("generateName", Fields::All),
            ("namespace", Fields::All),
            ("labels", Fields::All),
            ("annotations", Fields::All),
        ]),
    ),
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

/// The memory `json` may take to decode: [`COST_PER_BYTE`] × its size, at least
/// [`MIN_ALLOWANCE`].
pub fn allowance(json_len: usize) -> usize {
    json_len.saturating_mul(COST_PER_BYTE).max(MIN_ALLOWANCE)
}

/// Decodes `json`, keeping `fields`, within `allowance` bytes.
pub fn decode(json: &str, fields: &Fields, allowance: usize) -> Result<Decoded, PodJsonError> {
    let budget = Budget {
        left: Cell::new(allowance),
        exceeded: Cell::new(false),
    };
    let mut parser = serde_json::Deserializer::from_str(json);
    let decoded = Pruned {
        fields,
        budget: &budget,
    }
    .deserialize(&mut parser)
    .and_then(|value| parser.end().map(|()| value));
    decoded
        .map(|value| Decoded {
            value,
            charged: allowance - budget.left.get(),
        })
        .map_err(|error| {
            if budget.exceeded.get() {
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

/// Builds the value at hand, keeping `fields` of it.
#[derive(Clone, Copy)]
struct Pruned<'f, 'b> {
    fields: &'f Fields,
    budget: &'b Budget,
}

impl Pruned<'_, '_> {
    fn string<E: de::Error>(self, text: &str, cost: usize) -> Result<Value, E> {
        if matches!(self.fields, Fields::Only(_)) {
            // An object was expected: the planner only needs to know it is a string.
            return Ok(Value::String(String::new()));
        }
        self.budget.charge(cost)?;
        Ok(Value::String(text.to_owned()))
    }
}

impl<'de> DeserializeSeed<'de> for Pruned<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pruned<'_, '_> {
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
        if matches!(self.fields, Fields::Only(_)) {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Value::Array(Vec::new()));
        }
        let mut items = Vec::new();
        loop {
            self.budget.charge(if items.is_empty() {
                cost::LIST_FIRST_ITEM
            } else {
                cost::LIST_ITEM
            })?;
            match seq.next_element_seed(self)? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(Key)? {
            let fields = match self.fields {
                Fields::All => &Fields::All,
                Fields::Only(kept) => match kept.iter().find(|(name, _)| *name == key.as_str()) {
                    Some((_, fields)) => fields,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                },
            };
            let first = if object.is_empty() {
                cost::MAP_FIRST_NODE
            } else {
                0
            };
            self.budget
                .charge(first + cost::MAP_ENTRY + cost::string(key.as_str().len()))?;
            let value = map.next_value_seed(Pruned {
                fields,
                budget: self.budget,
            })?;
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
