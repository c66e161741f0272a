//! `sidecar-injector render`: an offline dry run of the injection, from files.
//!
//! Reads templates and a Pod (or a workload holding a pod template), plans exactly as the
//! webhook does, and prints the mutated object or the patch, with an explanation on request.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use injector_api::names::NAMESPACE_NAME_LABEL;
use injector_core::{CompiledTemplate, NamespaceInfo, Plan, plan};
use serde_json::{Map, Value};

use crate::documents::{Document, DocumentError, found_kinds, read_documents};
use crate::templates::{TemplateFileError, load_templates};

/// What to print on standard output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// The mutated object(s), as YAML.
    #[default]
    Pod,
    /// The RFC 6902 JSON patch for each Pod.
    Patch,
}

/// One dry run.
#[derive(Clone, Debug, Default)]
pub struct RenderRequest {
    /// Files holding SidecarTemplates (other kinds in them are ignored).
    pub template_files: Vec<PathBuf>,
    /// The file holding the Pod or workload(s).
    pub pod_file: PathBuf,
    /// The namespace for objects that name none (default `default`).
    pub namespace: Option<String>,
    /// The namespace's labels, over those of a Namespace of that name in the pod file;
    /// `kubernetes.io/metadata.name` is always added, as the API server does.
    pub namespace_labels: BTreeMap<String, String>,
    /// What to print.
    pub output: OutputFormat,
    /// Whether to explain, per template, why it applied or was skipped.
    pub explain: bool,
}

/// What a dry run produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The mutated objects or the patches.
    pub stdout: String,
    /// Warnings (as kubectl would print them) and, on request, the explanation.
    pub stderr: String,
    /// Set when the API server would reject a Pod: a required template cannot be applied.
    pub denied: Option<String>,
}

/// Why a dry run could not be made. Each names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A file could not be read or parsed.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// A template file cannot be used.
    #[error(transparent)]
    Template(#[from] TemplateFileError),
    /// The pod file holds no Pod or workload.
    #[error(
        "{path}: no Pod or workload found (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job or CronJob){}",
        found_kinds(.kinds)
    )]
    NoPod {
        /// The file.
        path: PathBuf,
        /// The kinds it does hold.
        kinds: Vec<String>,
    },
    /// An object's pod template is missing or not a valid Pod.
    #[error("{path}: {object}: {message}")]
    BadPod {
        /// The file.
        path: PathBuf,
        /// `Kind/name`.
        object: String,
        /// What is wrong.
        message: String,
    },
}

/// Where each pod-bearing kind keeps its pod template, as a JSON pointer.
pub(crate) fn pod_template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Makes the dry run described by `request`.
pub fn render(request: &RenderRequest) -> Result<Rendered, RenderError> {
    let templates: Vec<Arc<CompiledTemplate>> = load_templates(&request.template_files)?
        .into_iter()
        .map(Arc::new)
        .collect();
    let documents = read_documents(&request.pod_file)?;
    let kinds: Vec<String> = documents.iter().map(Document::describe).collect();
    let namespaces = namespace_labels(&documents);
    let objects: Vec<Document> = documents
        .into_iter()
        .filter(|d| pod_template_pointer(d.kind()).is_some())
        .collect();
    if objects.is_empty() {
        return Err(RenderError::NoPod {
            path: request.pod_file.clone(),
            kinds,
        });
    }

    let mut rendered = Rendered::default();
    let mut outputs = Vec::new();
    let mut denials = Vec::new();
    for object in objects {
        let (mutated, plan) = render_object(request, &namespaces, &templates, object)?;
        let name = mutated.0;
        let containers = container_summary(&mutated.1);
        for warning in &plan.warnings {
            let _ = writeln!(rendered.stderr, "Warning: {name}: {warning}");
        }
        if request.explain {
            rendered.stderr.push_str(&explain(&name, &plan, &templates));
            rendered.stderr.push_str(&containers);
        }
        if let Some(message) = plan.denial_message() {
            denials.push(format!("{name}: {message}"));
        }
        outputs.push(match request.output {
            OutputFormat::Pod => to_yaml(&mutated.1),
            OutputFormat::Patch => to_json(&plan.patch),
        });
    }
    rendered.stdout = match request.output {
        OutputFormat::Pod => outputs.join("---\n"),
        OutputFormat::Patch => outputs.join(""),
    };
    if !denials.is_empty() {
        rendered.denied = Some(denials.join("\n"));
    }
    Ok(rendered)
}

fn to_yaml(value: &Value) -> String {
    injector_api::yaml::to_string(value)
        .unwrap_or_else(|e| format!("# cannot print as YAML: {e}\n"))
}

fn to_json(value: &impl serde::Serialize) -> String {
    match serde_json::to_string_pretty(value) {
        Ok(text) => text + "\n",
        Err(e) => format!("cannot print as JSON: {e}\n"),
    }
}

/// The labels of the Namespaces in a file, by name: a pod file that creates its namespace
/// renders as it would be admitted there.
fn namespace_labels(documents: &[Document]) -> BTreeMap<String, BTreeMap<String, String>> {
    documents
        .iter()
        .filter(|d| d.kind() == "Namespace")
        .filter_map(|d| {
            let name = d.value.pointer("/metadata/name")?.as_str()?.to_owned();
            let labels = d
                .value
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|labels| {
                    labels
                        .iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default();
            Some((name, labels))
        })
        .collect()
}

/// Plans one object; returns its display name with the mutated object, and the plan.
fn render_object<'t>(
    request: &RenderRequest,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    templates: &'t [Arc<CompiledTemplate>],
    object: Document,
) -> Result<((String, Value), Plan<'t>), RenderError> {
    let display = object.describe();
    let bad = |message: String| RenderError::BadPod {
        path: request.pod_file.clone(),
        object: display.clone(),
        message,
    };
    let value = object.value;
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .or(request.namespace.as_deref())
        .unwrap_or("default")
        .to_owned();
    let mut labels = namespaces.get(&namespace).cloned().unwrap_or_default();
    labels.extend(request.namespace_labels.clone());
    labels
        .entry(NAMESPACE_NAME_LABEL.to_owned())
        .or_insert_with(|| namespace.clone());
    let info = NamespaceInfo {
        name: &namespace,
        labels: Some(&labels),
    };
    let (mutated, plan) = plan_object(value, &info, templates).map_err(bad)?;
    Ok(((format!("{display} in {namespace}"), mutated), plan))
}

/// Plans `object` as admission would in `namespace` and applies the patch: a Pod as it is, a
/// workload's pod template as the Pod its controller would create (named by `generateName`
/// when it names none, as those Pods are). Returns the mutated object and the plan; the error
/// says what is wrong with the object. `render` and `kubectl sidecar explain` share it.
pub(crate) fn plan_object<'t>(
    mut value: Value,
    namespace: &NamespaceInfo<'_>,
    templates: &'t [Arc<CompiledTemplate>],
) -> Result<(Value, Plan<'t>), String> {
    let kind = text_at(&value, "/kind").to_owned();
    let pointer = pod_template_pointer(&kind)
        .ok_or_else(|| format!("a {kind:?} holds no Pod nor pod template"))?;

    if pointer.is_empty() {
        let plan = plan(&value, namespace, templates).map_err(|e| e.to_string())?;
        json_patch::patch(&mut value, &plan.patch.to_json_patch())
            .map_err(|e| format!("patch does not apply: {e}"))?;
        return Ok((value, plan));
    }

    // A workload: plan its pod template as the Pod its controller would create.
    let workload_name = text_at(&value, "/metadata/name").to_owned();
    let template = value
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| format!("has no pod template at {pointer}"))?;
    let mut metadata = match template.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let had_generate_name = metadata.contains_key("generateName") || metadata.contains_key("name");
    if !had_generate_name {
        metadata.insert(
            "generateName".into(),
            Value::String(format!("{workload_name}-")),
        );
    }
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": template.remove("spec").unwrap_or(Value::Null),
    });
    let plan = plan(&pod, namespace, templates).map_err(|e| e.to_string())?;
    json_patch::patch(&mut pod, &plan.patch.to_json_patch())
        .map_err(|e| format!("patch does not apply: {e}"))?;
    if let Value::Object(mut pod) = pod {
        if let Some(Value::Object(mut metadata)) = pod.remove("metadata") {
            if !had_generate_name {
                metadata.remove("generateName");
            }
            template.insert("metadata".into(), Value::Object(metadata));
        }
        if let Some(spec) = pod.remove("spec") {
            template.insert("spec".into(), spec);
        }
    }
    Ok((value, plan))
}

/// The string at `pointer` in `value`, empty when there is none.
pub(crate) fn text_at<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Explains `plan` per template (applied, skipped and why, denied) under the heading `name`.
pub(crate) fn explain(name: &str, plan: &Plan, templates: &[Arc<CompiledTemplate>]) -> String {
    let priority = |template: &str| {
        templates
            .iter()
            .find(|t| t.name == template)
            .map_or_else(String::new, |t| {
                format!(
                    "priority {}, {}, failurePolicy {}",
                    t.priority,
                    t.injection.as_str(),
                    t.failure_policy.as_str()
                )
            })
    };
    let mut out = format!("{name}:\n");
    for applied in &plan.applied {
        let _ = writeln!(
            out,
            "  applied  {} (generation {}; {})",
            applied.name,
            applied.generation,
            priority(&applied.name)
        );
    }
    for skipped in &plan.skipped {
        let _ = writeln!(
            out,
            "  skipped  {} ({}): {}",
            skipped.name,
            priority(&skipped.name),
            skipped.reason
        );
    }
    for denial in &plan.denials {
        let _ = writeln!(
            out,
            "  DENIED   the API server would reject this Pod: {}",
            denial.reason
        );
    }
    if plan.applied.is_empty() && plan.skipped.is_empty() {
        out.push_str("  no template given\n");
    }
    out
}

/// The containers a mutated object's Pods run, one line each kind.
pub(crate) fn container_summary(object: &Value) -> String {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let pointer = pod_template_pointer(kind).unwrap_or_default();
    let spec = object.pointer(&format!("{pointer}/spec"));
    let names = |field: &str| -> String {
        let names: Vec<&str> = spec
            .and_then(|s| s.get(field))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .collect();
        if names.is_empty() {
            "-".to_owned()
        } else {
            names.join(", ")
        }
    };
    format!(
        "  result   initContainers: {}; containers: {}\n",
        names("initContainers"),
        names("containers")
    )
}

/// Parses `k=v,k2=v2` (what `--namespace-labels` takes).
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            if !injector_core::syntax::is_qualified_name(key) {
                return Err(format!("{key:?} is not a valid label key"));
            }
            if !injector_core::syntax::is_label_value(value) {
                return Err(format!("{value:?} is not a valid label value"));
            }
            Ok((key.to_owned(), value.to_owned()))
        })
        .collect()
}
