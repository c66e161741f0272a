//! Compiling a `SidecarTemplate` into the form the planner applies: validated, with its
//! selectors canonical and its placeholders parsed.

use std::collections::HashSet;

use injector_api::names::RESERVED_PREFIX;
use injector_api::{
    FailurePolicy, InjectedMetadata, Injection, SidecarTemplate, SidecarTemplateSpec,
    UpdateStrategy,
};
use k8s_openapi::api::core::v1::{LocalObjectReference, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use serde_json::Value;

use crate::error::{FieldError, ValidationErrors};
use crate::fingerprint::Fingerprint;
use crate::group::key::{GroupId, GroupKey};
use crate::placeholder::{Fixed, MetadataKey, Node, PathStep, Reach, TemplateString, field_path};
use crate::rules::record::Entry;
use crate::rules::selection::Selecting;
use crate::rules::selector::Selector;
use crate::syntax::{is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name};

/// The generation recorded for a template that has none (one read from a file).
pub const FILE_GENERATION: i64 = 1;

/// Something named that a template adds (a container, a volume, an env var, a mount).
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// The key that must be unique where the item lands: a name, or a mount path.
    pub key: String,
    /// The item, placeholders unrendered.
    pub body: Node,
}

/// A string value (of a label or annotation) that may hold placeholders.
#[derive(Clone, Debug, PartialEq)]
pub enum Text {
    /// Used as it is.
    Fixed(String),
    /// Rendered per Pod.
    Templated(TemplateString),
}

/// What a template adds to the Pod's own containers.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AppAdditions {
    /// Which containers; empty means all of the Pod's own.
    pub names: Vec<String>,
    /// Env vars, keyed by name.
    pub env: Vec<Item>,
    /// envFrom sources.
    pub env_from: Vec<Node>,
    /// Volume mounts, keyed by mount path.
    pub volume_mounts: Vec<Item>,
}

/// A validated template, ready to plan with.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledTemplate {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.generation`, or [`FILE_GENERATION`].
    pub generation: i64,
    /// `spec.priority`: lower applies first.
    pub priority: i32,
    /// `spec.injection`.
    pub injection: Injection,
    /// `spec.failurePolicy`.
    pub failure_policy: FailurePolicy,
    /// `spec.namespaceSelector`.
    pub namespace_selector: Selector,
    /// `spec.podSelector`.
    pub pod_selector: Selector,
    /// The webhook entry this template is served from.
    pub group: GroupKey,
    /// That entry's id, computed once here (the registry and the controller read it).
    pub group_id: GroupId,
    /// Containers to append.
    pub containers: Vec<Item>,
    /// Init containers to place before the Pod's own.
    pub init_containers: Vec<Item>,
    /// Volumes to add.
    pub volumes: Vec<Item>,
    /// Names of image pull secrets to add.
    pub image_pull_secrets: Vec<String>,
    /// Additions to the Pod's own containers.
    pub app: Option<AppAdditions>,
    /// Labels to add.
    pub labels: Vec<(String, Text)>,
    /// Annotations to add.
    pub annotations: Vec<(String, Text)>,
    /// The labels and annotations its placeholders read: when a template adds one, what this
    /// template renders depends on it.
    pub metadata_reads: Vec<MetadataKey>,
    /// What it injects, as recorded on the Pods it is applied to.
    pub fingerprint: Fingerprint,
    /// `spec.updateStrategy` (absent: `OnCreate`).
    pub update_strategy: UpdateStrategy,
}

impl CompiledTemplate {
    /// The order templates apply in: priority, then name.
    pub fn order_key(&self) -> (i32, &str) {
        (self.priority, &self.name)
    }

    /// What of it decides whether it selects a Pod.
    pub fn selecting(&self) -> Selecting<'_> {
        Selecting {
            name: &self.name,
            injection: self.injection,
            failure_policy: self.failure_policy,
            namespace_selector: &self.namespace_selector,
            pod_selector: &self.pod_selector,
        }
    }

    /// Its entry in a Pod's record, as it is now.
    pub fn entry(&self) -> Entry<'_> {
        Entry {
            name: &self.name,
            generation: self.generation,
            fingerprint: self.fingerprint,
        }
    }
}

/// Validates `template` and compiles it, reporting every problem with its field path.
pub fn compile(template: &SidecarTemplate) -> Result<CompiledTemplate, ValidationErrors> {
    let name = template.metadata.name.clone().unwrap_or_default();
    let mut errors = Vec::new();
    check_name(&name, &mut errors);
    let spec = &template.spec;
    let namespace_selector = compile_selector(
        spec.namespace_selector.as_ref(),
        "spec.namespaceSelector",
        &mut errors,
    );
    let pod_selector =
        compile_selector(spec.pod_selector.as_ref(), "spec.podSelector", &mut errors);

    let (containers, init_containers) = compile_container_lists(spec, &mut errors);

    let volumes = compile_volumes(&spec.volumes, &mut errors);

    let image_pull_secrets = compile_pull_secrets(&spec.image_pull_secrets, &mut errors);

    let app = spec
        .app_containers
        .as_ref()
        .map(|app| compile_app(app, &mut errors));

    let (labels, annotations) = spec
        .metadata
        .as_ref()
        .map_or_else(Default::default, |metadata| {
            compile_metadata(metadata, &mut errors)
        });

    let group = GroupKey::new(&namespace_selector, &pod_selector, spec.failure_policy);
    let compiled = CompiledTemplate {
        group_id: group.id(),
        group,
        name,
        generation: template.metadata.generation.unwrap_or(FILE_GENERATION),
        priority: spec.priority,
        injection: spec.injection,
        failure_policy: spec.failure_policy,
        namespace_selector,
        pod_selector,
        containers,
        init_containers,
        volumes,
        image_pull_secrets,
        app,
        labels,
        annotations,
        metadata_reads: Vec::new(),
        fingerprint: Fingerprint::of(spec),
        update_strategy: spec.update_strategy.clone().unwrap_or_default(),
    };
    validated(with_metadata_reads(compiled), errors)
}

/// The template's containers and init containers, in that order: a name is unique across
/// both lists, so they share the set of names seen.
fn compile_container_lists(
    spec: &SidecarTemplateSpec,
    errors: &mut Vec<FieldError>,
) -> (Vec<Item>, Vec<Item>) {
    let mut names = HashSet::new();
    let containers = compile_containers(
        &spec.containers,
        "spec.containers",
        false,
        &mut names,
        errors,
    );
    let init_containers = compile_containers(
        &spec.init_containers,
        "spec.initContainers",
        true,
        &mut names,
        errors,
    );
    (containers, init_containers)
}

/// A selector of the template compiled, its problems added to `errors` (then it selects as an
/// empty one would, for the rest of the checks).
fn compile_selector(
    selector: Option<&LabelSelector>,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Selector {
    Selector::compile(selector, path).unwrap_or_else(|e| {
        errors.extend(e);
        Selector::default()
    })
}

/// `compiled` with the Pod metadata its placeholders read, from every item and text that may
/// hold one.
fn with_metadata_reads(mut compiled: CompiledTemplate) -> CompiledTemplate {
    compiled.metadata_reads = metadata_reads(
        compiled
            .containers
            .iter()
            .chain(&compiled.init_containers)
            .chain(&compiled.volumes)
            .map(|i| &i.body)
            .chain(compiled.app.iter().flat_map(|a| {
                a.env
                    .iter()
                    .chain(&a.volume_mounts)
                    .map(|i| &i.body)
                    .chain(&a.env_from)
            })),
        compiled
            .labels
            .iter()
            .chain(&compiled.annotations)
            .map(|(_, text)| text),
    );
    compiled
}

/// `compiled` when it has no problem: `errors` is empty and it injects something.
fn validated(
    compiled: CompiledTemplate,
    mut errors: Vec<FieldError>,
) -> Result<CompiledTemplate, ValidationErrors> {
    if compiled.injects_nothing() {
        errors.push(FieldError::new(
            "spec",
            "injects nothing: set containers, initContainers, volumes, imagePullSecrets, appContainers or metadata",
        ));
    }
    if errors.is_empty() {
        Ok(compiled)
    } else {
        Err(ValidationErrors {
            template: compiled.name,
            errors,
        })
    }
}

/// `metadata.name`: required, a DNS-1123 subdomain.
fn check_name(name: &str, errors: &mut Vec<FieldError>) {
    if name.is_empty() {
        errors.push(FieldError::new("metadata.name", "is required"));
    } else if !is_dns_subdomain(name) {
        errors.push(FieldError::new(
            "metadata.name",
            format!(
                "{name:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"
            ),
        ));
    }
}

/// `spec.volumes`: unique names, and no placeholder (a volume is the same in every Pod).
fn compile_volumes(volumes: &[Volume], errors: &mut Vec<FieldError>) -> Vec<Item> {
    let mut volume_names = HashSet::new();
    volumes
        .iter()
        .enumerate()
        .map(|(i, volume)| {
            let path = format!("spec.volumes[{i}]");
            check_unique_label(
                &volume.name,
                &format!("{path}.name"),
                "volume",
                &mut volume_names,
                errors,
            );
            let item = item(volume.name.clone(), volume, &path, errors);
            check_reach(&item.body, &path, |_| Reach::Fixed, errors);
            item
        })
        .collect()
}

/// `spec.imagePullSecrets`: valid, unique Secret names.
fn compile_pull_secrets(
    secrets: &[LocalObjectReference],
    errors: &mut Vec<FieldError>,
) -> Vec<String> {
    let mut secret_names = HashSet::new();
    secrets
        .iter()
        .enumerate()
        .map(|(i, secret)| {
            let path = format!("spec.imagePullSecrets[{i}].name");
            if !is_dns_subdomain(&secret.name) {
                errors.push(FieldError::new(
                    &path,
                    format!("{:?} is not a valid Secret name", secret.name),
                ));
            } else if !secret_names.insert(secret.name.as_str()) {
                errors.push(FieldError::new(
                    &path,
                    format!("duplicate image pull secret {:?}", secret.name),
                ));
            }
            secret.name.clone()
        })
        .collect()
}

/// Labels or annotations a template adds, by key.
type MetadataEntries = Vec<(String, Text)>;

/// `spec.metadata`: its labels and annotations, valid keys, and a fixed label value a valid
/// label value.
fn compile_metadata(
    metadata: &InjectedMetadata,
    errors: &mut Vec<FieldError>,
) -> (MetadataEntries, MetadataEntries) {
    let labels = metadata
        .labels
        .iter()
        .map(|(key, value)| {
            let path = format!("spec.metadata.labels[{key:?}]");
            check_metadata_key(key, &path, errors);
            let before = errors.len();
            let text = text(value, &path, errors);
            if let Text::Fixed(value) = &text
                && errors.len() == before
                && !is_label_value(value)
            {
                errors.push(FieldError::new(
                    &path,
                    format!("{value:?} is not a valid label value"),
                ));
            }
            (key.clone(), text)
        })
        .collect();
    let annotations = metadata
        .annotations
        .iter()
        .map(|(key, value)| {
            let path = format!("spec.metadata.annotations[{key:?}]");
            check_metadata_key(key, &path, errors);
            (key.clone(), text(value, &path, errors))
        })
        .collect();
    (labels, annotations)
}

impl CompiledTemplate {
    fn injects_nothing(&self) -> bool {
        let app_empty = self.app.as_ref().is_none_or(|a| {
            a.env.is_empty() && a.env_from.is_empty() && a.volume_mounts.is_empty()
        });
        self.containers.is_empty()
            && self.init_containers.is_empty()
            && self.volumes.is_empty()
            && self.image_pull_secrets.is_empty()
            && app_empty
            && self.labels.is_empty()
            && self.annotations.is_empty()
    }
}

fn compile_containers(
    containers: &[k8s_openapi::api::core::v1::Container],
    field: &str,
    init: bool,
    names: &mut HashSet<String>,
    errors: &mut Vec<FieldError>,
) -> Vec<Item> {
    containers
        .iter()
        .enumerate()
        .map(|(i, container)| {
            let path = format!("{field}[{i}]");
            let name = &container.name;
            if !is_dns_label(name) {
                errors.push(FieldError::new(
                    format!("{path}.name"),
                    format!("{name:?} is not a DNS-1123 label (at most 63 lowercase letters, digits and '-')"),
                ));
            } else if !names.insert(name.clone()) {
                errors.push(FieldError::new(
                    format!("{path}.name"),
                    format!("duplicate container name {name:?} (names are unique across containers and initContainers)"),
                ));
            }
            if container.image.as_deref().is_none_or(str::is_empty) {
                errors.push(FieldError::new(format!("{path}.image"), "is required"));
            }
            match container.restart_policy.as_deref() {
                None => {}
                Some("Always") if init => {}
                Some(other) if init => errors.push(FieldError::new(
                    format!("{path}.restartPolicy"),
                    format!("{other:?} is not allowed: use Always (a native sidecar) or leave it unset"),
                )),
                Some(_) => errors.push(FieldError::new(
                    format!("{path}.restartPolicy"),
                    "is only allowed on initContainers (use it there for a native sidecar)",
                )),
            }
            let item = item(name.clone(), container, &path, errors);
            check_reach(&item.body, &path, container_reach, errors);
            item
        })
        .collect()
}

fn compile_app(app: &injector_api::AppContainers, errors: &mut Vec<FieldError>) -> AppAdditions {
    for (i, name) in app.names.iter().enumerate() {
        if !is_dns_label(name) {
            errors.push(FieldError::new(
                format!("spec.appContainers.names[{i}]"),
                format!("{name:?} is not a valid container name"),
            ));
        }
    }
    let mut env_names = HashSet::new();
    let env = app
        .env
        .iter()
        .enumerate()
        .map(|(i, var)| {
            let path = format!("spec.appContainers.env[{i}]");
            if var.name.is_empty() {
                errors.push(FieldError::new(format!("{path}.name"), "is required"));
            } else if !env_names.insert(var.name.as_str()) {
                errors.push(FieldError::new(
                    format!("{path}.name"),
                    format!("duplicate env name {:?}", var.name),
                ));
            }
            let item = item(var.name.clone(), var, &path, errors);
            check_reach(&item.body, &path, env_reach, errors);
            item
        })
        .collect();
    let env_from = app
        .env_from
        .iter()
        .enumerate()
        .map(|(i, source)| {
            let path = format!("spec.appContainers.envFrom[{i}]");
            let node = node(source, &path, errors);
            check_reach(&node, &path, |_| Reach::Constrained, errors);
            node
        })
        .collect();
    let mut mount_paths = HashSet::new();
    let volume_mounts = app
        .volume_mounts
        .iter()
        .enumerate()
        .map(|(i, mount)| {
            let path = format!("spec.appContainers.volumeMounts[{i}]");
            if mount.name.is_empty() {
                errors.push(FieldError::new(format!("{path}.name"), "is required"));
            }
            if mount.mount_path.is_empty() {
                errors.push(FieldError::new(format!("{path}.mountPath"), "is required"));
            } else if !mount_paths.insert(mount.mount_path.as_str()) {
                errors.push(FieldError::new(
                    format!("{path}.mountPath"),
                    format!("duplicate mount path {:?}", mount.mount_path),
                ));
            }
            let item = item(mount.mount_path.clone(), mount, &path, errors);
            check_reach(&item.body, &path, |_| Reach::Constrained, errors);
            item
        })
        .collect();
    AppAdditions {
        names: app.names.clone(),
        env,
        env_from,
        volume_mounts,
    }
}

fn check_unique_label(
    name: &str,
    path: &str,
    what: &str,
    seen: &mut HashSet<String>,
    errors: &mut Vec<FieldError>,
) {
    if !is_dns_label(name) {
        errors.push(FieldError::new(
            path,
            format!("{name:?} is not a DNS-1123 label"),
        ));
    } else if !seen.insert(name.to_owned()) {
        errors.push(FieldError::new(
            path,
            format!("duplicate {what} name {name:?}"),
        ));
    }
}

fn check_metadata_key(key: &str, path: &str, errors: &mut Vec<FieldError>) {
    if !is_qualified_name(key) {
        errors.push(FieldError::new(path, format!("{key:?} is not a valid key")));
    } else if key.starts_with(RESERVED_PREFIX) {
        errors.push(FieldError::new(
            path,
            format!(
                "{key:?} is reserved: {RESERVED_PREFIX} keys are the injector's own controls and record"
            ),
        ));
    }
}

fn node(value: &impl Serialize, path: &str, errors: &mut Vec<FieldError>) -> Node {
    match serde_json::to_value(value) {
        Ok(json) => Node::parse(&json, path, errors),
        Err(e) => {
            errors.push(FieldError::new(
                path,
                format!("cannot be represented as JSON: {e}"),
            ));
            Node::Fixed(Fixed::new(Value::Null))
        }
    }
}

fn item(key: String, value: &impl Serialize, path: &str, errors: &mut Vec<FieldError>) -> Item {
    Item {
        key,
        body: node(value, path, errors),
    }
}

fn text(value: &str, path: &str, errors: &mut Vec<FieldError>) -> Text {
    match TemplateString::parse(value) {
        Ok(Some(template)) => {
            check_template_reach(&template, path, Reach::Annotations, errors);
            Text::Templated(template)
        }
        Ok(None) => Text::Fixed(value.to_owned()),
        Err(message) => {
            errors.push(FieldError::new(path, message));
            Text::Fixed(value.to_owned())
        }
    }
}

fn metadata_reads<'a>(
    nodes: impl Iterator<Item = &'a Node>,
    texts: impl Iterator<Item = &'a Text>,
) -> Vec<MetadataKey> {
    let mut reads = Vec::new();
    for node in nodes {
        node.visit_templated(&mut |_, template| reads.extend(template.metadata_reads()));
    }
    for text in texts {
        if let Text::Templated(template) = text {
            reads.extend(template.metadata_reads());
        }
    }
    reads.sort();
    reads.dedup();
    reads
}

/// The most a Pod author may choose of a string at `steps` in an injected container: nothing
/// of what runs or with what (the image, the command, its privileges and resources, the hooks
/// and exec probes, env names and env from other sources, mounts, where probes connect to), in
/// `args` and the rest only values the API server constrains, and free text (annotations)
/// only in env values.
fn container_reach(steps: &[PathStep<'_>]) -> Reach {
    match steps {
        [
            PathStep::Key(
                "image" | "command" | "securityContext" | "lifecycle" | "resources"
                | "restartPolicy" | "volumeMounts" | "volumeDevices" | "envFrom",
            ),
            ..,
        ] => Reach::Fixed,
        [
            PathStep::Key("livenessProbe" | "readinessProbe" | "startupProbe"),
            PathStep::Key("exec"),
            ..,
        ] => Reach::Fixed,
        [
            PathStep::Key("livenessProbe" | "readinessProbe" | "startupProbe"),
            PathStep::Key(_),
            PathStep::Key("host"),
        ] => Reach::Fixed,
        [PathStep::Key("env"), PathStep::Index(_), rest @ ..] => match rest {
            [PathStep::Key("name")] => Reach::Fixed,
            _ => env_reach(rest),
        },
        _ => Reach::Constrained,
    }
}

/// The same for an env var (`steps` below the var).
fn env_reach(steps: &[PathStep<'_>]) -> Reach {
    match steps {
        [PathStep::Key("value")] => Reach::Annotations,
        [PathStep::Key("valueFrom"), ..] => Reach::Fixed,
        _ => Reach::Constrained,
    }
}

/// Reports every placeholder in `node` that reaches further than `allowed` says it may.
fn check_reach(
    node: &Node,
    path: &str,
    allowed: impl Fn(&[PathStep<'_>]) -> Reach,
    errors: &mut Vec<FieldError>,
) {
    node.visit_templated(&mut |steps, template| {
        check_template_reach(template, &field_path(path, steps), allowed(steps), errors);
    });
}

fn check_template_reach(
    template: &TemplateString,
    path: &str,
    allowed: Reach,
    errors: &mut Vec<FieldError>,
) {
    if let Some(key) = template.reads_key_with_prefix(RESERVED_PREFIX) {
        errors.push(FieldError::new(
            path,
            format!(
                "a placeholder cannot read {key:?}: {RESERVED_PREFIX} keys are the injector's own"
            ),
        ));
    }
    match (template.reach(), allowed) {
        (reach, allowed) if reach <= allowed => {}
        (_, Reach::Fixed) => errors.push(FieldError::new(
            path,
            "placeholders are not allowed here: a Pod author must not choose what runs in a sidecar (see the placeholder rules in docs/reference.md)",
        )),
        _ => errors.push(FieldError::new(
            path,
            "pod.annotations[...] is not allowed here: a Pod author can set an annotation to anything, so it may only be used in env values and in the metadata a template adds",
        )),
    }
}
