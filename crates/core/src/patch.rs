//! The JSON patch a plan produces, with values borrowed from the compiled templates.
//!
//! The webhook serializes the patch once and throws it away, so copying every injected
//! container into an owned `serde_json::Value` first would be wasted work (it was most of the
//! cost of planning a typical Pod). Fixed parts of a template are borrowed; only strings with
//! Pod metadata substituted are owned. [`Patch::to_json`] copies the fixed parts' JSON, written
//! when the template was compiled, rather than writing it again. [`Patch::to_json_patch`] gives
//! an owned `json_patch::Patch` where one is needed (to apply it in `render` and in tests).

use json_patch::jsonptr::PointerBuf;
use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::placeholder::Fixed;

/// A JSON value in a patch.
#[derive(Clone, Debug, PartialEq)]
pub enum PatchValue<'t> {
    /// A fixed part of a template.
    Fixed(&'t Fixed),
    /// A value made for this Pod.
    Owned(Value),
    /// A string with Pod metadata substituted.
    String(String),
    /// An array with something made for this Pod inside.
    Array(Vec<PatchValue<'t>>),
    /// An object with something made for this Pod inside.
    Object(Vec<(&'t str, PatchValue<'t>)>),
}

impl PatchValue<'_> {
    /// An owned copy.
    pub fn to_value(&self) -> Value {
        match self {
            PatchValue::Fixed(fixed) => fixed.value().clone(),
            PatchValue::Owned(value) => value.clone(),
            PatchValue::String(text) => Value::String(text.clone()),
            PatchValue::Array(items) => {
                Value::Array(items.iter().map(PatchValue::to_value).collect())
            }
            PatchValue::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.to_value()))
                    .collect::<Map<String, Value>>(),
            ),
        }
    }

    /// Whether everything this value sets, `theirs` sets to the same value. The API server
    /// defaults fields of what was injected (imagePullPolicy, terminationMessagePath, …), so an
    /// injected item that comes back is a subset of what is there, not equal to it.
    pub fn is_subset_of(&self, theirs: &Value) -> bool {
        match self {
            PatchValue::Fixed(fixed) => is_subset(fixed.value(), theirs),
            PatchValue::Owned(value) => is_subset(value, theirs),
            PatchValue::String(text) => theirs.as_str() == Some(text.as_str()),
            PatchValue::Array(items) => theirs.as_array().is_some_and(|t| {
                t.len() == items.len() && items.iter().zip(t).all(|(v, w)| v.is_subset_of(w))
            }),
            PatchValue::Object(fields) => theirs.as_object().is_some_and(|t| {
                fields
                    .iter()
                    .all(|(k, v)| t.get(*k).is_some_and(|w| v.is_subset_of(w)))
            }),
        }
    }
}

/// Whether everything `ours` sets, `theirs` sets to the same value.
pub fn is_subset(ours: &Value, theirs: &Value) -> bool {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|w| is_subset(v, w))),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(v, w)| is_subset(v, w))
        }
        _ => ours == theirs,
    }
}

impl Serialize for PatchValue<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        With(self, Written::Again).serialize(serializer)
    }
}

/// How the fixed parts of templates are serialized.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Written {
    /// As their values, which any serializer takes.
    Again,
    /// As their JSON, written when the template was compiled: only for `serde_json`'s
    /// serializer, which alone writes a `RawValue` as it is.
    Copied,
}

/// A value whose fixed parts are serialized so.
struct With<'v, 't>(&'v PatchValue<'t>, Written);

impl Serialize for With<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let With(value, written) = *self;
        match value {
            PatchValue::Fixed(fixed) => match fixed.json() {
                Some(json) if written == Written::Copied => json.serialize(serializer),
                _ => fixed.value().serialize(serializer),
            },
            PatchValue::Owned(value) => value.serialize(serializer),
            PatchValue::String(text) => serializer.serialize_str(text),
            PatchValue::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&With(item, written))?;
                }
                seq.end()
            }
            PatchValue::Object(fields) => {
                let mut map = serializer.serialize_map(Some(fields.len()))?;
                for (key, value) in fields {
                    map.serialize_entry(key, &With(value, written))?;
                }
                map.end()
            }
        }
    }
}

/// One RFC 6902 `add` operation (the only kind the injector needs: it never removes or
/// overwrites what the Pod has).
#[derive(Clone, Debug, PartialEq)]
pub struct AddOperation<'t> {
    /// Where, escaped per RFC 6901.
    pub path: PointerBuf,
    /// What.
    pub value: PatchValue<'t>,
}

impl Serialize for AddOperation<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        OperationWith(self, Written::Again).serialize(serializer)
    }
}

/// An operation whose value's fixed parts are serialized so.
struct OperationWith<'o, 't>(&'o AddOperation<'t>, Written);

impl Serialize for OperationWith<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let OperationWith(operation, written) = *self;
        let mut op = serializer.serialize_struct("AddOperation", 3)?;
        op.serialize_field("op", "add")?;
        op.serialize_field("path", operation.path.as_str())?;
        op.serialize_field("value", &With(&operation.value, written))?;
        op.end()
    }
}

/// Operations whose values' fixed parts are serialized so.
struct OperationsWith<'p, 't>(&'p [AddOperation<'t>], Written);

impl Serialize for OperationsWith<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for operation in self.0 {
            seq.serialize_element(&OperationWith(operation, self.1))?;
        }
        seq.end()
    }
}

/// An RFC 6902 JSON patch, serialized as the JSON array the API server expects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Patch<'t>(pub Vec<AddOperation<'t>>);

impl Patch<'_> {
    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many operations the patch holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The same patch, owning its values (to keep it beyond the templates it borrows from).
    pub fn into_owned(self) -> Patch<'static> {
        Patch(
            self.0
                .into_iter()
                .map(|op| AddOperation {
                    value: PatchValue::Owned(op.value.to_value()),
                    path: op.path,
                })
                .collect(),
        )
    }

    /// The patch as JSON: the same bytes as `serde_json::to_vec`, but each fixed part of a
    /// template is copied as it was written when the template was compiled.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut json = Vec::with_capacity(4096);
        serde_json::to_writer(&mut json, &OperationsWith(&self.0, Written::Copied))?;
        Ok(json)
    }

    /// An owned `json_patch::Patch`, to apply it.
    pub fn to_json_patch(&self) -> json_patch::Patch {
        json_patch::Patch(
            self.0
                .iter()
                .map(|op| {
                    json_patch::PatchOperation::Add(json_patch::AddOperation {
                        path: op.path.clone(),
                        value: op.value.to_value(),
                    })
                })
                .collect(),
        )
    }
}

impl Serialize for Patch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serializes_as_rfc_6902_and_converts_to_json_patch() {
        let fixed = Fixed::new(json!({"name": "proxy", "image": "envoy"}));
        let patch = Patch(vec![
            AddOperation {
                path: PointerBuf::from_tokens(["spec", "containers", "-"]),
                value: PatchValue::Fixed(&fixed),
            },
            AddOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations", "a/b"]),
                value: PatchValue::Object(vec![
                    ("k", PatchValue::String("v".into())),
                    ("n", PatchValue::Array(vec![PatchValue::Owned(json!(1))])),
                ]),
            },
        ]);
        let serialized = serde_json::to_value(&patch).unwrap();
        assert_eq!(
            serialized,
            json!([
                {"op": "add", "path": "/spec/containers/-", "value": {"name": "proxy", "image": "envoy"}},
                {"op": "add", "path": "/metadata/annotations/a~1b", "value": {"k": "v", "n": [1]}},
            ])
        );
        assert_eq!(
            serde_json::to_value(patch.to_json_patch()).unwrap(),
            serialized
        );
        assert_eq!(
            patch.to_json().unwrap(),
            serde_json::to_vec(&patch).unwrap()
        );
    }

    #[test]
    fn subset_tolerates_defaulted_fields_only() {
        let ours = json!({"name": "x", "ports": [{"containerPort": 80}]});
        let theirs = json!({"name": "x", "imagePullPolicy": "Always", "ports": [{"containerPort": 80, "protocol": "TCP"}]});
        assert!(is_subset(&ours, &theirs));
        assert!(!is_subset(&theirs, &ours));
        assert!(PatchValue::Fixed(&Fixed::new(ours.clone())).is_subset_of(&theirs));
        let templated = PatchValue::Object(vec![("name", PatchValue::String("x".into()))]);
        assert!(templated.is_subset_of(&theirs));
        let other = json!({"name": "x", "ports": [{"containerPort": 81}]});
        assert!(!is_subset(&ours, &other));
    }
}
