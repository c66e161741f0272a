//! Whether a Pod already holds a template's container, as a CEL condition over the Pod: the
//! form of [`super::difference`] the webhook entries' presence conditions, the guard and the
//! warnings policy carry.
//!
//! It starts from the container as the API server stored it in the proof (its defaults filled
//! in), and accepts exactly what `difference` accepts on top of that: the ServiceAccount
//! token's mount, a LimitRange's resources, `imagePullPolicy: Always`, and on a hostNetwork
//! Pod each port's `hostPort`. [`super::holds_cel`] is the other CEL form: it starts from the
//! template's own item, before any defaulting, and asks only that the Pod's item hold it (the
//! policy's mutation uses it to leave a copy of an earlier version alone); the two differ in
//! their input, so they are two functions, and what both write (a pull policy or `Always`,
//! the mounts but the token's, a rendered placeholder, the host network) is written once, in
//! [`super`].

use serde_json::{Map, Value};

use super::{
    HOST_NETWORK_CEL, TOKEN_VOLUME_PREFIX, mounts_but_token_cel, pull_policy_cel,
    rendered_text_cel, service_account_mount_cel,
};
use crate::cel::{cel_array, cel_entry, cel_json, cel_string};
use crate::placeholder::{Node, TemplateString};
use crate::rules::placement;

/// Whether the Pod's `list` holds a container equal to `stored` (the template's `body` as the
/// API server stored it), up to what the API server adds as the webhook's comparison
/// (`crate::rules::defaulted`) allows it: the ServiceAccount token's mount, a LimitRange's resources,
/// `imagePullPolicy: Always` (the AlwaysPullImages plugin) and, on a hostNetwork Pod, each
/// port's `hostPort`. A native sidecar must also stand before the Pod's own plain init
/// containers (`template_init`, a CEL list, names those that are templates'), as `plan` asks.
pub(crate) fn container_presence(
    list: &str,
    body: &Node,
    stored: &Value,
    template_init: &str,
    text: &dyn Fn(&TemplateString) -> String,
) -> Option<String> {
    let stored = without_additions(stored.as_object()?.clone());
    let expected = expected_fields(body, &stored, text)?;
    let token_mount = service_account_mount_cel("m");
    let token_mounts = format!("c.volumeMounts.all(m, {token_mount})");
    // The name first: every guard rule and warning scans every container of the Pod, and
    // `&&` stops at the first false term, so only the container of this name costs more.
    let name = stored.get("name").and_then(Value::as_str);
    let mut terms: Vec<String> = name
        .map(|name| format!("c.?name.orValue(\"\") == {}", cel_string(name)))
        .into_iter()
        .collect();
    terms.push(no_other_fields(&expected, &stored));
    if !stored.contains_key("volumeMounts") {
        terms.push(format!("(!has(c.volumeMounts) || {token_mounts})"));
    }
    let fields = expected
        .iter()
        .filter(|(key, _)| !(key == "name" && name.is_some()))
        .map(|(key, expected)| field_term(key, expected, stored.get(key)));
    terms.extend(fields);
    if list == "initContainers"
        && stored.get("restartPolicy").and_then(Value::as_str) == Some("Always")
    {
        terms.push(placement::in_place_cel(template_init));
    }
    Some(format!(
        "object.spec.?{list}.orValue([]).exists(c, {})",
        terms.join(" && ")
    ))
}

/// The CEL condition that the container `c` has no field but the `expected` ones, the token's
/// mounts (when `stored` has none of its own: the term beside this one asks that they be the
/// token's) and a LimitRange's resources (when `stored` has none). Every field expected as a
/// value must be there (its own term asks it), so counting the fields that may be missing is
/// enough; counting, rather than looking up each of the container's fields in a list, is what
/// keeps this rule cheap on every Pod the policies and the webhook entries see.
fn no_other_fields(expected: &[(String, Expected)], stored: &Map<String, Value>) -> String {
    let required = expected
        .iter()
        .filter(|(_, e)| matches!(e, Expected::Value(_)))
        .count();
    let mut optional: Vec<&str> = expected
        .iter()
        .filter(|(_, e)| matches!(e, Expected::Text(_)))
        .map(|(key, _)| key.as_str())
        .collect();
    for added in ["volumeMounts", "resources"] {
        if !stored.contains_key(added) {
            optional.push(added);
        }
    }
    let mut count = required.to_string();
    for key in optional {
        count.push_str(&format!(" + ({} in c ? 1 : 0)", cel_string(key)));
    }
    format!("size(c) == {count}")
}

/// The stored container without what the API server added to it in the proof and adds to
/// every Pod anyway: the token's mount, and the `resources: {}` it stores for a container
/// that sets none (where any resources may stand, a LimitRange's).
fn without_additions(mut stored: Map<String, Value>) -> Map<String, Value> {
    if let Some(Value::Array(mounts)) = stored.get_mut("volumeMounts") {
        mounts.retain(|m| {
            !m.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.starts_with(TOKEN_VOLUME_PREFIX))
        });
        if mounts.is_empty() {
            stored.remove("volumeMounts");
        }
    }
    if stored
        .get("resources")
        .is_some_and(|r| r.as_object().is_some_and(Map::is_empty))
    {
        stored.remove("resources");
    }
    stored
}

/// The condition on the field `key` of the container `c`: `expected`, up to what admission
/// plugins change in it (`stored` is the field as the proof stored it).
fn field_term(key: &str, expected: &Expected, stored: Option<&Value>) -> String {
    let value = match expected {
        Expected::Value(value) => value,
        // Rendered empty, the field is left out or kept empty (see `Expected::Text`).
        Expected::Text(text) => return rendered_text_cel("c", key, text),
    };
    let field = format!("c[{}]", cel_string(key));
    let equal = match (key, stored) {
        // No `in c`: the expected list is never empty (`without_additions` drops it then), so
        // a container without mounts fails here too, as [`no_other_fields`] counts on.
        ("volumeMounts", _) => {
            return format!("{} == {value}", mounts_but_token_cel("c"));
        }
        ("imagePullPolicy", _) => pull_policy_cel(&field, value),
        // A LimitRange fills in what the template's resources leave out.
        ("resources", Some(resources)) => includes(&field, resources),
        ("ports", Some(Value::Array(ports))) => match host_ports(ports) {
            Some(on_host) => {
                format!("({field} == {value} || ({HOST_NETWORK_CEL} && {field} == {on_host}))")
            }
            None => format!("{field} == {value}"),
        },
        _ => format!("{field} == {value}"),
    };
    // `in` first: an absent key must make the condition false, never an error (an error fails
    // a required entry's call), and [`no_other_fields`] counts on every field expected as a
    // value being there.
    format!("({} in c && {equal})", cel_string(key))
}

/// A CEL condition that `expression` holds `stored` with perhaps more keys in its objects, as
/// the webhook's comparison reads resources (`crate::rules::defaulted`).
fn includes(expression: &str, stored: &Value) -> String {
    match stored {
        Value::Object(fields) if !fields.is_empty() => {
            let terms: Vec<String> = fields
                .iter()
                .map(|(key, value)| {
                    let key = cel_string(key);
                    format!(
                        "({key} in {expression} && {})",
                        includes(&format!("{expression}[{key}]"), value)
                    )
                })
                .collect();
            format!("({})", terms.join(" && "))
        }
        _ => format!("{expression} == {}", cel_json(stored)),
    }
}

/// `ports` as the API server stores them on a hostNetwork Pod, each `hostPort` its
/// `containerPort`; `None` when that changes nothing.
fn host_ports(ports: &[Value]) -> Option<String> {
    let mut changed = false;
    let on_host: Vec<Value> = ports
        .iter()
        .map(|port| {
            let mut port = port.clone();
            if let Some(fields) = port.as_object_mut()
                && !fields.contains_key("hostPort")
                && let Some(container_port) = fields.get("containerPort").cloned()
            {
                fields.insert("hostPort".to_owned(), container_port);
                changed = true;
            }
            port
        })
        .collect();
    changed.then(|| cel_json(&Value::Array(on_host)))
}

/// What a field of a stored item is expected to be.
enum Expected {
    /// Equal to this CEL value.
    Value(String),
    /// A string a placeholder renders (this CEL expression): the field holds it, or, when it
    /// renders empty, is not there (or, at a container's top level, is empty). The API server
    /// leaves most empty optional strings out of what it stores (`omitempty`), so whether the
    /// field is there follows the Pod at hand, not the proof Pod: the proof rendered
    /// `{{ pod.annotations['team'] }}` empty, and a Pod with that annotation, injected by the
    /// policy, no longer passed for carrying the template (the guard refused it). Nested in
    /// an object compared whole, a string the API server keeps when empty is expected absent
    /// (a false negative: the webhook is called, or the guard refuses).
    Text(String),
}

/// Each top-level field of a stored container, as expected: the stored value, except where
/// the template's string holds placeholders (a CEL expression over the Pod).
fn expected_fields(
    body: &Node,
    stored: &Map<String, Value>,
    text: &dyn Fn(&TemplateString) -> String,
) -> Option<Vec<(String, Expected)>> {
    match body {
        Node::Fixed(_) => Some(
            stored
                .iter()
                .map(|(key, value)| (key.clone(), Expected::Value(cel_json(value))))
                .collect(),
        ),
        Node::Object(fields) => object_fields(fields, stored, text),
        _ => None,
    }
}

/// The fields of a template's object (`fields`) as the API server stored it (`stored`), each
/// as expected: the stored value, with the template's placeholder expressions where it has
/// them; the fields whose placeholders the proof rendered empty, which `stored` lacks, as
/// texts too. `None` when their shapes differ.
fn object_fields(
    fields: &[(String, Node)],
    stored: &Map<String, Value>,
    text: &dyn Fn(&TemplateString) -> String,
) -> Option<Vec<(String, Expected)>> {
    let mut expected = Vec::new();
    for (key, value) in stored {
        let node = fields.iter().find(|(f, _)| f == key).map(|(_, n)| n);
        let field = match node {
            Some(Node::Text(template)) if value.as_str().is_some_and(|v| !v.is_empty()) => {
                Expected::Text(text(template))
            }
            Some(node) => Expected::Value(merged(node, value, text)?),
            None => Expected::Value(cel_json(value)),
        };
        expected.push((key.clone(), field));
    }
    for (key, node) in fields {
        if let Node::Text(template) = node
            && !stored.contains_key(key)
        {
            expected.push((key.clone(), Expected::Text(text(template))));
        }
    }
    Some(expected)
}

/// `stored` as a CEL literal with the template's placeholder expressions where `node` has
/// them; `None` when their shapes differ (the comparison could not be exact). A field whose
/// placeholders may render empty is an optional entry (see [`Expected::Text`]).
fn merged(node: &Node, stored: &Value, text: &dyn Fn(&TemplateString) -> String) -> Option<String> {
    match (node, stored) {
        (Node::Fixed(_), _) => Some(cel_json(stored)),
        (Node::Text(template), Value::String(_)) => Some(text(template)),
        (Node::Array(items), Value::Array(values)) if items.len() == values.len() => {
            let merged: Option<Vec<String>> = items
                .iter()
                .zip(values)
                .map(|(n, v)| merged(n, v, text))
                .collect();
            Some(cel_array(merged?.into_iter()))
        }
        (Node::Object(fields), Value::Object(values)) => {
            let entries: Vec<String> = object_fields(fields, values, text)?
                .iter()
                .map(|(key, expected)| match expected {
                    Expected::Value(value) => cel_entry(key, value),
                    Expected::Text(text) => cel_optional_entry(key, text),
                })
                .collect();
            Some(format!("{{{}}}", entries.join(", ")))
        }
        _ => None,
    }
}

/// An optional entry of a CEL map literal: there when the string `text` is not empty.
fn cel_optional_entry(key: &str, text: &str) -> String {
    format!(
        "?{}: ({text} != \"\" ? optional.of(dyn({text})) : optional.none())",
        cel_string(key)
    )
}

#[cfg(test)]
mod tests;
