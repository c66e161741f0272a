//! JSON Schemas for kubeconform, made offline from the API server's own OpenAPI v2 document
//! (`kubectl get --raw /openapi/v2`), so that manifests are validated against exactly the
//! Kubernetes version the tests run, custom resources included, without downloading anything.
//!
//! kubeconform looks a schema up by kind and apiVersion; with the schema location
//! `<dir>/{{ .ResourceKind }}{{ .KindSuffix }}.json` (see [`schema_location`]) a Deployment of
//! `apps/v1` is `deployment-apps-v1.json` and a ConfigMap of `v1` is `configmap-v1.json`. Each
//! file holds the kind's definition and every definition it reaches, with the fixes
//! kubeconform's own schema generator applies, but one (it also accepts `null` for optional
//! fields; these schemas do not, so they are the stricter):
//! - `int-or-string` fields accept both (OpenAPI v2 calls them strings), and quantities accept
//!   numbers (`cpu: 1`);
//! - strict: an object schema with `properties` rejects other properties unless it preserves
//!   unknown fields, so a misspelt or misplaced field fails instead of being ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

/// The definition every resource quantity (`cpu`, `memory`, …) refers to.
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// The `-schema-location` to pass kubeconform for schemas written to `dir`.
pub fn schema_location(dir: &Path) -> String {
    format!(
        "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        dir.display()
    )
}

/// Writes one schema file per group, version and kind of `openapi` (an OpenAPI v2 document)
/// into `dir`; returns the file names written, sorted.
pub fn write_kubeconform_schemas(openapi: &Value, dir: &Path) -> anyhow::Result<Vec<String>> {
    let definitions = openapi["definitions"]
        .as_object()
        .context("the OpenAPI document has no definitions")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = BTreeSet::new();
    for (name, definition) in definitions {
        for gvk in definition["x-kubernetes-group-version-kind"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let (Some(group), Some(version), Some(kind)) = (
                gvk["group"].as_str(),
                gvk["version"].as_str(),
                gvk["kind"].as_str(),
            ) else {
                continue;
            };
            let file = file_name(group, version, kind);
            let schema = standalone_schema(definitions, name)?;
            let path = dir.join(&file);
            std::fs::write(&path, serde_json::to_vec(&schema)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.insert(file);
        }
    }
    if written.is_empty() {
        bail!("the OpenAPI document defines no kinds");
    }
    Ok(written.into_iter().collect())
}

/// kubeconform's name for a kind's schema: the kind in lower case, then the first label of
/// the group (none for the core group), then the version.
pub fn file_name(group: &str, version: &str, kind: &str) -> String {
    let kind = kind.to_lowercase();
    match group.split('.').next().filter(|g| !g.is_empty()) {
        None => format!("{kind}-{version}.json"),
        Some(group) => format!("{kind}-{}-{version}.json", group.to_lowercase()),
    }
}

/// The schema of definition `root`: a reference to it, with every definition it reaches
/// (fixed for kubeconform) under `definitions`.
fn standalone_schema(definitions: &Map<String, Value>, root: &str) -> anyhow::Result<Value> {
    let mut reached = BTreeMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(name) = pending.pop() {
        if reached.contains_key(&name) {
            continue;
        }
        let definition = definitions
            .get(&name)
            .with_context(|| format!("{root} refers to {name}, which is not defined"))?;
        collect_references(definition, &mut pending);
        let fixed = if name == QUANTITY {
            json!({"oneOf": [{"type": "string"}, {"type": "number"}]})
        } else {
            let mut fixed = definition.clone();
            fix_schema(&mut fixed);
            fixed
        };
        reached.insert(name, fixed);
    }
    Ok(json!({
        "$ref": format!("#/definitions/{root}"),
        "definitions": reached,
    }))
}

/// Pushes the name of every `#/definitions/<name>` reference found in `value`.
fn collect_references(value: &Value, names: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/definitions/"))
            {
                names.push(name.to_owned());
            }
            map.values().for_each(|v| collect_references(v, names));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_references(v, names)),
        _ => {}
    }
}

/// Applies the fixes of the module's doc comment to one schema and, recursively, to the
/// schemas inside it (walked by keyword, so a property that happens to be called
/// `properties` is not mistaken for the keyword).
fn fix_schema(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    if map.get("format").and_then(Value::as_str) == Some("int-or-string") {
        map.remove("type");
        map.remove("format");
        map.insert(
            "oneOf".into(),
            json!([{"type": "string"}, {"type": "integer"}]),
        );
        return;
    }
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        properties.values_mut().for_each(fix_schema);
        let preserves_unknown = map
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true);
        if !preserves_unknown && !map.contains_key("additionalProperties") {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    for keyword in ["items", "additionalProperties", "not"] {
        if let Some(inner) = map.get_mut(keyword) {
            fix_schema(inner);
        }
    }
    for keyword in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(inner)) = map.get_mut(keyword) {
            inner.iter_mut().for_each(fix_schema);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn file_names_follow_kubeconform() {
        assert_eq!(file_name("", "v1", "ConfigMap"), "configmap-v1.json");
        assert_eq!(
            file_name("apps", "v1", "Deployment"),
            "deployment-apps-v1.json"
        );
        assert_eq!(
            file_name("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            "clusterrole-rbac-v1.json"
        );
        assert_eq!(
            file_name("sidecar.dev", "v1alpha1", "SidecarTemplate"),
            "sidecartemplate-sidecar-v1alpha1.json"
        );
    }

    fn openapi() -> Value {
        json!({"definitions": {
            "io.k8s.api.core.v1.ConfigMap": {
                "type": "object",
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "ConfigMap"}],
                "properties": {
                    "data": {"type": "object", "additionalProperties": {"type": "string"}},
                    "metadata": {"$ref": "#/definitions/meta"},
                },
            },
            "meta": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "properties": {"type": "object", "properties": {"port": {
                        "type": "string", "format": "int-or-string"}}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                             "properties": {"a": {"type": "string"}}},
                    "limit": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
                },
            },
            "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
            "unreached": {"type": "string"},
        }})
    }

    #[test]
    fn a_kind_gets_what_it_reaches_fixed_for_kubeconform() {
        let dir = std::env::temp_dir().join(format!("schemas-test-{}", std::process::id()));
        let written = write_kubeconform_schemas(&openapi(), &dir).unwrap();
        assert_eq!(written, ["configmap-v1.json"]);
        let schema: Value =
            serde_json::from_slice(&std::fs::read(dir.join("configmap-v1.json")).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        assert_eq!(schema["$ref"], "#/definitions/io.k8s.api.core.v1.ConfigMap");
        let definitions = schema["definitions"].as_object().unwrap();
        assert!(!definitions.contains_key("unreached"));
        let config_map = &definitions["io.k8s.api.core.v1.ConfigMap"];
        assert_eq!(config_map["additionalProperties"], false, "strict");
        assert_eq!(
            config_map["properties"]["data"]["additionalProperties"],
            json!({"type": "string"}),
            "a map keeps its value schema"
        );
        let meta = &definitions["meta"];
        assert_eq!(meta["additionalProperties"], false);
        // A property named `properties` is a property, and its own schema is fixed.
        let port = &meta["properties"]["properties"]["properties"]["port"];
        assert_eq!(
            port["oneOf"],
            json!([{"type": "string"}, {"type": "integer"}])
        );
        assert!(port.get("format").is_none());
        assert!(
            meta["properties"]["free"]
                .get("additionalProperties")
                .is_none()
        );
        assert_eq!(
            definitions[QUANTITY]["oneOf"],
            json!([{"type": "string"}, {"type": "number"}])
        );
    }

    #[test]
    fn a_dangling_reference_is_an_error() {
        let openapi = json!({"definitions": {"k": {
            "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "K"}],
            "properties": {"m": {"$ref": "#/definitions/missing"}},
        }}});
        let dir = std::env::temp_dir().join(format!("schemas-dangling-{}", std::process::id()));
        let error = write_kubeconform_schemas(&openapi, &dir).unwrap_err();
        std::fs::remove_dir_all(&dir).ok();
        assert!(format!("{error:#}").contains("missing"), "{error:#}");
    }
}
