//! Reading a label or an annotation, whatever holds it: a Pod's metadata as JSON or as
//! strings, a namespace's labels, or the labels a plan adds on top of a Pod's. Selectors,
//! placeholders, the census and `plan` read through it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Anything that can answer "what is the value of label `key`?".
pub trait Labels {
    /// The value of `key`, if the label is set.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// Labels as they appear in a Pod's JSON (`metadata.labels`); non-string values never match.
impl Labels for Map<String, Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

impl<T: Labels> Labels for Option<&T> {
    fn label(&self, key: &str) -> Option<&str> {
        self.and_then(|labels| labels.label(key))
    }
}
