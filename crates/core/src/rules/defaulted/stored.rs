//! A template's volume as the API server stores it: the policies compare a Pod's own volume of
//! that name with it, where `plan` compares by [`super::difference`].
//!
//! Only the volume sources whose defaults are all known are predicted; for any other (a
//! quantity the API server may rewrite, a source not listed) there is no prediction, and the
//! policy leaves a Pod with a volume of that name to the webhook or the guard. The policy's
//! proof checks each prediction against what the API server really stored
//! (`policy::proof_problem`), so a wrong one is refused there, never trusted.

use serde_json::{Map, Value};

use super::{
    DEFAULT_MODE, FIELD_REF_API_VERSION, HOST_PATH_TYPE, TOKEN_EXPIRATION_SECONDS,
    default_pull_policy,
};

/// `volume` (a template's, placeholders none) as the API server stores it, or `None` when that
/// cannot be told for sure.
pub(crate) fn stored_volume(volume: &Value) -> Option<Value> {
    let mut volume = without_omitted(volume).as_object()?.clone();
    let sources: Vec<String> = volume.keys().filter(|k| *k != "name").cloned().collect();
    match sources.as_slice() {
        // A volume with no source is an `emptyDir`.
        [] => {
            volume.insert("emptyDir".to_owned(), Value::Object(Map::new()));
        }
        [source] => {
            let body = volume.get_mut(source)?.as_object_mut()?;
            match source.as_str() {
                "emptyDir" if !body.contains_key("sizeLimit") => {}
                "configMap" | "secret" => default_mode(body),
                "downwardAPI" => {
                    default_mode(body);
                    field_refs(body)?;
                }
                "projected" => {
                    default_mode(body);
                    projections(body)?;
                }
                "hostPath" => {
                    body.entry("type")
                        .or_insert_with(|| Value::from(HOST_PATH_TYPE));
                }
                "persistentVolumeClaim" => {
                    // `readOnly` is a plain bool there: `false` is left out.
                    if body.get("readOnly") == Some(&Value::Bool(false)) {
                        body.remove("readOnly");
                    }
                }
                "image" => {
                    let reference = body.get("reference")?.as_str()?;
                    let policy = default_pull_policy(reference);
                    body.entry("pullPolicy")
                        .or_insert_with(|| Value::from(policy));
                }
                _ => return None,
            }
        }
        _ => return None,
    }
    Some(Value::Object(volume))
}

/// `value` without what Go's encoder leaves out: empty strings, empty lists and nulls (empty
/// objects are pointers to structs there, and stay).
fn without_omitted(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(_, v)| !is_omitted(v))
                .map(|(k, v)| (k.clone(), without_omitted(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_omitted).collect()),
        other => other.clone(),
    }
}

fn is_omitted(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(text) => text.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

fn default_mode(source: &mut Map<String, Value>) {
    source
        .entry("defaultMode")
        .or_insert_with(|| Value::from(DEFAULT_MODE));
}

/// The `apiVersion` of each item's `fieldRef`; `None` for a `resourceFieldRef`, whose divisor
/// is a quantity.
fn field_refs(source: &mut Map<String, Value>) -> Option<()> {
    let Some(items) = source.get_mut("items") else {
        return Some(());
    };
    for item in items.as_array_mut()? {
        let item = item.as_object_mut()?;
        if item.contains_key("resourceFieldRef") {
            return None;
        }
        if let Some(field_ref) = item.get_mut("fieldRef") {
            field_ref
                .as_object_mut()?
                .entry("apiVersion")
                .or_insert_with(|| Value::from(FIELD_REF_API_VERSION));
        }
    }
    Some(())
}

/// The defaults of a projected volume's sources; `None` for a source not known here.
fn projections(projected: &mut Map<String, Value>) -> Option<()> {
    let Some(sources) = projected.get_mut("sources") else {
        return Some(());
    };
    for source in sources.as_array_mut()? {
        for (kind, body) in source.as_object_mut()? {
            let body = body.as_object_mut()?;
            match kind.as_str() {
                "configMap" | "secret" => {}
                "downwardAPI" => field_refs(body)?,
                "serviceAccountToken" => {
                    body.entry("expirationSeconds")
                        .or_insert_with(|| Value::from(TOKEN_EXPIRATION_SECONDS));
                }
                _ => return None,
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests;
