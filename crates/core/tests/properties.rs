//! Property tests of the planner: random but realistic Pods and sets of `SidecarTemplate`s,
//! checked against the rules every plan must keep whatever the input.
//!
//! - the patch applies to the Pod and the result is still a `v1.Pod`;
//! - planning the mutated Pod again with the same templates adds nothing;
//! - the result does not depend on the order templates were given or registered in;
//! - the Pod as the webhook decodes it (only the fields the planner reads) plans the same;
//! - an opted-out namespace is never patched, and an opted-out Pod only by required templates;
//! - no Pod is admitted without every required template that selects it, present and equal,
//!   whatever it claims in its annotations and whatever look-alike containers it declares;
//! - the Pod's own containers (and init containers, volumes, labels and annotations) are only
//!   ever added to, never changed;
//! - re-planning stays a no-op when a label one template adds is what selects another;
//! - a template name given twice counts once.
//!
//! The generators draw names from small pools so that templates collide with each other and
//! with the Pod (container, volume, env and mount names, label keys), priorities from a small
//! range so that ties are common, and string values from a pool of `{{ pod.* }}` placeholders.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use injector_api::{FailurePolicy, SidecarTemplate};
use injector_core::pod::json::{allowance, decode_pod, decode_pod_among};
use injector_core::{
    CompiledTemplate, NamespaceInfo, Plan, Registry, SkipReason, compile, plan, plan_among,
};
use k8s_openapi::api::core::v1::Pod;
use proptest::collection::{btree_map, btree_set, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use common::names_first;

// ---------------------------------------------------------------------------------------------
// Pools. Small on purpose: the interesting cases are the collisions.
// ---------------------------------------------------------------------------------------------

const CONTAINER_NAMES: &[&str] = &["app", "web", "proxy", "logger", "agent"];
const IMAGES: &[&str] = &["nginx:1.27", "busybox", "envoy:1.30", "fluent-bit:3"];
const VOLUME_NAMES: &[&str] = &["data", "logs", "certs", "config"];
const ENV_NAMES: &[&str] = &["LOG_LEVEL", "POD_NAME", "REGION", "MODE"];
const MOUNT_PATHS: &[&str] = &["/data", "/var/log", "/certs", "/etc/config"];
const SECRETS: &[&str] = &["regcred", "mirror", "private"];
const TEMPLATE_NAMES: &[&str] = &["mesh", "logging", "agent", "a", "zz-last"];

/// Label keys and values a Pod may carry (and selectors look at).
const LABEL_KEYS: &[&str] = &["app", "tier", "example.com/x", "team"];
const LABEL_VALUES: &[&str] = &["web", "db", "frontend", "v1"];
/// Annotation keys a Pod may carry (placeholders read `example.com/x`).
const ANNOTATION_KEYS: &[&str] = &["example.com/x", "team", "note", "prometheus.io/scrape"];

/// String values of a template, with and without placeholders.
const TEXTS: &[&str] = &[
    "x",
    "v1",
    "debug",
    "{{ pod.name }}",
    "{{ pod.labels['app'] }}",
    "{{ pod.namespace }}/{{ pod.name }}",
    "{{ pod.annotations['example.com/x'] }}",
    "sa-{{ pod.serviceAccountName }}",
];
/// `TEXTS` without the placeholders only env values and metadata may hold (a Pod author sets
/// annotations to anything).
const CONSTRAINED_TEXTS: &[&str] = &[
    "x",
    "v1",
    "{{ pod.name }}",
    "{{ pod.labels['app'] }}",
    "{{ pod.namespace }}/{{ pod.name }}",
];
/// String values of a Pod's own env vars (some equal to template values).
const POD_TEXTS: &[&str] = &["x", "v1", "debug", "", "info"];

/// Labels a template adds. Keys that no selector reads: a template whose labels feed another
/// template's selection is a separate property,
/// `what_one_template_adds_does_not_select_another_on_replanning`.
const TEMPLATE_LABEL_KEYS: &[&str] = &["example.com/injected-by", "example.com/mesh", "owner"];
const TEMPLATE_LABEL_VALUES: &[&str] = &[
    "mesh",
    "on",
    "{{ pod.labels['app'] }}",
    "{{ pod.name }}",
    "{{ pod.annotations['team'] }}",
];
const TEMPLATE_ANNOTATION_KEYS: &[&str] = &[
    "example.com/x",
    "team",
    "prometheus.io/scrape",
    "mesh.example.com/version",
];

/// The namespace every scenario is planned in.
const NAMESPACE: &str = "shop";

// ---------------------------------------------------------------------------------------------
// Scenario
// ---------------------------------------------------------------------------------------------

/// A Pod, the templates, a permutation of them and what is known of the namespace.
#[derive(Clone)]
struct Scenario {
    pod: Value,
    /// The templates as written, for failure reports.
    sources: Vec<Value>,
    templates: Vec<Arc<CompiledTemplate>>,
    /// A permutation of `0..templates.len()`.
    order: Vec<usize>,
    /// `None`: the API server selected the namespace.
    ns_labels: Option<BTreeMap<String, String>>,
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "pod: {}", self.pod)?;
        for source in &self.sources {
            writeln!(f, "template: {source}")?;
        }
        writeln!(f, "order: {:?}", self.order)?;
        write!(f, "namespace labels: {:?}", self.ns_labels)
    }
}

impl Scenario {
    fn namespace(&self) -> NamespaceInfo<'_> {
        NamespaceInfo {
            name: NAMESPACE,
            labels: self.ns_labels.as_ref(),
        }
    }

    fn shuffled(&self) -> Vec<Arc<CompiledTemplate>> {
        self.order
            .iter()
            .map(|&i| Arc::clone(&self.templates[i]))
            .collect()
    }
}

fn plan_for<'t>(
    pod: &Value,
    namespace: &NamespaceInfo<'_>,
    templates: &'t [Arc<CompiledTemplate>],
) -> Plan<'t> {
    plan(pod, namespace, templates).unwrap_or_else(|e| panic!("{e}"))
}

fn plan_decoded<'t>(
    pod: &injector_core::Pod<'_>,
    namespace: &NamespaceInfo<'_>,
    templates: &'t [Arc<CompiledTemplate>],
) -> Plan<'t> {
    plan_among(pod, namespace, templates, templates)
}

/// The pod with the plan's patch applied.
fn apply(pod: &Value, plan: &Plan) -> Result<Value, TestCaseError> {
    let mut out = pod.clone();
    json_patch::patch(&mut out, &plan.patch.to_json_patch()).map_err(|e| {
        TestCaseError::fail(format!(
            "patch does not apply: {e}\npatch: {}",
            serde_json::to_string(&plan.patch).unwrap_or_default()
        ))
    })?;
    Ok(out)
}

/// Plans `s`, applies the patch and plans the mutated Pod again: the second plan adds and
/// applies nothing (what a webhook re-invocation or a replayed request must see).
fn replanning_adds_nothing(s: &Scenario) -> Result<(), TestCaseError> {
    let ns = s.namespace();
    let first = plan_for(&s.pod, &ns, &s.templates);
    let once = apply(&s.pod, &first)?;
    let again = plan_for(&once, &ns, &s.templates);
    prop_assert!(
        again.patch.is_empty(),
        "second patch: {}\napplied first: {:?}\napplied again: {:?}\nmutated pod: {once}",
        serde_json::to_string(&again.patch).unwrap_or_default(),
        first.applied,
        again.applied,
    );
    prop_assert!(again.applied.is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Strategies: pieces
// ---------------------------------------------------------------------------------------------

fn pick(pool: &'static [&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(pool).prop_map(str::to_owned).boxed()
}

fn container_name() -> BoxedStrategy<String> {
    prop_oneof![4 => pick(CONTAINER_NAMES), 1 => "[a-z][a-z0-9]{0,4}"].boxed()
}

fn env_var(templated: bool) -> BoxedStrategy<Value> {
    let name = prop_oneof![3 => pick(ENV_NAMES), 1 => "[A-Z][A-Z0-9_]{0,5}"];
    let value = if templated {
        pick(TEXTS)
    } else {
        pick(POD_TEXTS)
    };
    (
        name,
        prop_oneof![4 => value.prop_map(Some), 1 => Just(None)],
    )
        .prop_map(|(name, value)| match value {
            Some(value) => json!({"name": name, "value": value}),
            None => json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
        })
        .boxed()
}

fn env_from(templated: bool) -> BoxedStrategy<Value> {
    let secret = if templated {
        "{{ pod.name }}-env"
    } else {
        "app-env"
    };
    prop_oneof![
        Just(json!({"configMapRef": {"name": "cfg"}})),
        Just(json!({"secretRef": {"name": secret}, "prefix": "S_"})),
    ]
    .boxed()
}

fn mount() -> BoxedStrategy<Value> {
    (pick(VOLUME_NAMES), pick(MOUNT_PATHS), any::<bool>())
        .prop_map(|(name, path, read_only)| {
            let mut m = json!({"name": name, "mountPath": path});
            if read_only {
                m["readOnly"] = true.into();
            }
            m
        })
        .boxed()
}

/// A volume. Never templated: a Pod author must not choose a sidecar's volume sources.
fn volume() -> BoxedStrategy<Value> {
    let config = Just("app-config");
    (pick(VOLUME_NAMES), 0..3u8, config)
        .prop_map(|(name, kind, config)| match kind {
            0 => json!({"name": name, "emptyDir": {}}),
            1 => json!({"name": name, "configMap": {"name": config}}),
            _ => json!({"name": name, "secret": {"secretName": "tls", "defaultMode": 420}}),
        })
        .boxed()
}

/// Keeps the first item of each `key`.
fn dedup(items: Vec<Value>, key: &str, seen: &mut HashSet<String>) -> Vec<Value> {
    items
        .into_iter()
        .filter(|item| seen.insert(item[key].as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn dedup_strings(items: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|s| seen.insert(s.clone()))
        .collect()
}

fn string_map(map: BTreeMap<String, String>) -> Value {
    Value::Object(
        map.into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// Strategies: Pods
// ---------------------------------------------------------------------------------------------

fn pod_container() -> BoxedStrategy<Value> {
    (
        container_name(),
        pick(IMAGES),
        option::of(vec(env_var(false), 0..4)),
        option::of(vec(mount(), 0..3)),
        option::weighted(0.2, vec(env_from(false), 1..2)),
        any::<bool>(),
    )
        .prop_map(|(name, image, env, mounts, env_from, ports)| {
            let mut c = json!({"name": name, "image": image});
            if let Some(env) = env {
                c["env"] = Value::Array(dedup(env, "name", &mut HashSet::new()));
            }
            if let Some(mounts) = mounts {
                c["volumeMounts"] = Value::Array(dedup(mounts, "mountPath", &mut HashSet::new()));
            }
            if let Some(env_from) = env_from {
                c["envFrom"] = Value::Array(env_from);
            }
            if ports {
                c["ports"] = json!([{"containerPort": 8080, "protocol": "TCP"}]);
            }
            c
        })
        .boxed()
}

fn pod_metadata() -> BoxedStrategy<Value> {
    let name = prop_oneof![
        "[a-z]{1,6}(-[a-z0-9]{1,5})?".prop_map(|n| ("name", n)),
        "[a-z]{1,6}-".prop_map(|n| ("generateName", n)),
    ];
    (
        name,
        option::of(prop::sample::select(&[NAMESPACE, "default"][..])),
        option::of(btree_map(pick(LABEL_KEYS), pick(LABEL_VALUES), 0..4)),
        option::of(btree_map(pick(ANNOTATION_KEYS), "[ -~]{0,8}", 0..3)),
    )
        .prop_map(|((field, name), namespace, labels, annotations)| {
            let mut m = Map::new();
            m.insert(field.into(), name.into());
            if let Some(namespace) = namespace {
                m.insert("namespace".into(), namespace.into());
            }
            if let Some(labels) = labels {
                m.insert("labels".into(), string_map(labels));
            }
            if let Some(annotations) = annotations {
                m.insert("annotations".into(), string_map(annotations));
            }
            Value::Object(m)
        })
        .boxed()
}

fn pod() -> BoxedStrategy<Value> {
    (
        option::weighted(0.9, pod_metadata()),
        vec(pod_container(), 1..=4),
        option::of(vec(pod_container(), 0..=2)),
        option::of(vec(volume(), 0..=3)),
        option::of(vec(pick(SECRETS), 0..=2)),
        option::of(prop::sample::select(&["web", "builder"][..])),
    )
        .prop_map(
            |(metadata, containers, init_containers, volumes, secrets, service_account)| {
                // Container names are unique across containers and initContainers.
                let mut names = HashSet::new();
                let mut spec = Map::new();
                spec.insert(
                    "containers".into(),
                    Value::Array(dedup(containers, "name", &mut names)),
                );
                if let Some(init) = init_containers {
                    spec.insert(
                        "initContainers".into(),
                        Value::Array(dedup(init, "name", &mut names)),
                    );
                }
                if let Some(volumes) = volumes {
                    spec.insert(
                        "volumes".into(),
                        Value::Array(dedup(volumes, "name", &mut HashSet::new())),
                    );
                }
                if let Some(secrets) = secrets {
                    let secrets = dedup_strings(secrets)
                        .into_iter()
                        .map(|name| json!({"name": name}))
                        .collect();
                    spec.insert("imagePullSecrets".into(), Value::Array(secrets));
                }
                if let Some(account) = service_account {
                    spec.insert("serviceAccountName".into(), account.into());
                }
                let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "spec": spec});
                if let Some(metadata) = metadata {
                    pod["metadata"] = metadata;
                }
                pod
            },
        )
        .boxed()
}

fn namespace_labels() -> BoxedStrategy<Option<BTreeMap<String, String>>> {
    option::of(btree_map(
        prop::sample::select(&["team", "env"][..]).prop_map(str::to_owned),
        prop::sample::select(&["shop", "prod", "dev"][..]).prop_map(str::to_owned),
        0..3,
    ))
    .prop_map(|labels| {
        labels.map(|mut l| {
            l.insert("kubernetes.io/metadata.name".into(), NAMESPACE.into());
            l
        })
    })
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Strategies: templates
// ---------------------------------------------------------------------------------------------

fn template_name() -> BoxedStrategy<String> {
    prop_oneof![pick(TEMPLATE_NAMES), "[a-z]([a-z0-9-]{0,8}[a-z0-9])?"].boxed()
}

fn template_container(init: bool) -> BoxedStrategy<Value> {
    (
        container_name(),
        pick(IMAGES),
        vec(pick(CONSTRAINED_TEXTS), 0..3),
        vec(env_var(true), 0..3),
        vec(mount(), 0..3),
        any::<bool>(),
    )
        .prop_map(move |(name, image, args, env, mounts, always)| {
            let mut c = json!({"name": name, "image": image});
            if !args.is_empty() {
                c["args"] = json!(args);
            }
            if !env.is_empty() {
                c["env"] = Value::Array(dedup(env, "name", &mut HashSet::new()));
            }
            if !mounts.is_empty() {
                c["volumeMounts"] = Value::Array(dedup(mounts, "mountPath", &mut HashSet::new()));
            }
            if init && always {
                c["restartPolicy"] = "Always".into();
            }
            c
        })
        .boxed()
}

fn pod_selector() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        4 => Just(None),
        1 => Just(Some(json!({}))),
        1 => pick(LABEL_VALUES).prop_map(|v| Some(json!({"matchLabels": {"app": v}}))),
        1 => Just(Some(json!({"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["frontend", "db"]}]}))),
        1 => Just(Some(json!({"matchExpressions": [
            {"key": "example.com/x", "operator": "Exists"}]}))),
        1 => Just(Some(json!({"matchExpressions": [
            {"key": "team", "operator": "DoesNotExist"}]}))),
    ]
    .boxed()
}

fn namespace_selector() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        4 => Just(None),
        1 => Just(Some(json!({"matchLabels": {"team": "shop"}}))),
        1 => Just(Some(json!({"matchExpressions": [
            {"key": "env", "operator": "NotIn", "values": ["prod"]}]}))),
    ]
    .boxed()
}

fn app_containers() -> BoxedStrategy<Value> {
    (
        option::weighted(0.3, vec(container_name(), 1..3)),
        vec(env_var(true), 0..3),
        vec(env_from(true), 0..2),
        vec(mount(), 0..3),
    )
        .prop_map(|(names, env, env_from, mounts)| {
            let mut app = Map::new();
            if let Some(names) = names {
                app.insert("names".into(), json!(dedup_strings(names)));
            }
            if !env.is_empty() {
                let env = dedup(env, "name", &mut HashSet::new());
                app.insert("env".into(), Value::Array(env));
            }
            if !env_from.is_empty() {
                app.insert("envFrom".into(), Value::Array(env_from));
            }
            if !mounts.is_empty() {
                let mounts = dedup(mounts, "mountPath", &mut HashSet::new());
                app.insert("volumeMounts".into(), Value::Array(mounts));
            }
            Value::Object(app)
        })
        .boxed()
}

/// Everything of a template but its name.
#[derive(Clone, Debug)]
struct TemplateParts {
    priority: i32,
    generation: i64,
    on_request: bool,
    ignore: bool,
    pod_selector: Option<Value>,
    namespace_selector: Option<Value>,
    containers: Vec<Value>,
    init_containers: Vec<Value>,
    volumes: Vec<Value>,
    secrets: Vec<String>,
    app: Option<Value>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn template_parts() -> BoxedStrategy<TemplateParts> {
    let policy = (
        0..3i32,
        1..4i64,
        prop::bool::weighted(0.25),
        any::<bool>(),
        pod_selector(),
        namespace_selector(),
    );
    let content = (
        vec(template_container(false), 0..3),
        vec(template_container(true), 0..3),
        vec(volume(), 0..3),
        vec(pick(SECRETS), 0..3),
        option::weighted(0.4, app_containers()),
        btree_map(pick(TEMPLATE_LABEL_KEYS), pick(TEMPLATE_LABEL_VALUES), 0..3),
        btree_map(pick(TEMPLATE_ANNOTATION_KEYS), pick(TEXTS), 0..3),
    );
    (policy, content)
        .prop_map(
            |(
                (priority, generation, on_request, ignore, pod_selector, namespace_selector),
                (containers, init_containers, volumes, secrets, app, labels, annotations),
            )| TemplateParts {
                priority,
                generation,
                on_request,
                ignore,
                pod_selector,
                namespace_selector,
                containers,
                init_containers,
                volumes,
                secrets,
                app,
                labels,
                annotations,
            },
        )
        .boxed()
}

/// The template's JSON, valid by construction.
fn template_source(name: &str, parts: TemplateParts) -> Value {
    let mut spec = Map::new();
    spec.insert("priority".into(), parts.priority.into());
    if parts.on_request {
        spec.insert("injection".into(), "OnRequest".into());
    }
    if parts.ignore {
        spec.insert("failurePolicy".into(), "Ignore".into());
    }
    if let Some(selector) = parts.pod_selector {
        spec.insert("podSelector".into(), selector);
    }
    if let Some(selector) = parts.namespace_selector {
        spec.insert("namespaceSelector".into(), selector);
    }
    let mut names = HashSet::new();
    let mut content = false;
    let mut list = |spec: &mut Map<String, Value>, field: &str, items: Vec<Value>| {
        if !items.is_empty() {
            content = true;
            spec.insert(field.into(), Value::Array(items));
        }
    };
    list(
        &mut spec,
        "containers",
        dedup(parts.containers, "name", &mut names),
    );
    list(
        &mut spec,
        "initContainers",
        dedup(parts.init_containers, "name", &mut names),
    );
    list(
        &mut spec,
        "volumes",
        dedup(parts.volumes, "name", &mut HashSet::new()),
    );
    let secrets = dedup_strings(parts.secrets)
        .into_iter()
        .map(|name| json!({"name": name}))
        .collect();
    list(&mut spec, "imagePullSecrets", secrets);
    if let Some(app) = parts.app {
        // `names` alone adds nothing.
        content |= ["env", "envFrom", "volumeMounts"]
            .iter()
            .any(|field| app.get(field).is_some());
        spec.insert("appContainers".into(), app);
    }
    let mut metadata = Map::new();
    if !parts.labels.is_empty() {
        metadata.insert("labels".into(), string_map(parts.labels));
    }
    if !parts.annotations.is_empty() || (!content && metadata.is_empty()) {
        let mut annotations = parts.annotations;
        if annotations.is_empty() {
            // A template must inject something.
            annotations.insert("example.com/x".into(), "x".into());
        }
        metadata.insert("annotations".into(), string_map(annotations));
    }
    if !metadata.is_empty() {
        spec.insert("metadata".into(), Value::Object(metadata));
    }
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": parts.generation},
        "spec": spec,
    })
}

fn compile_source(source: &Value) -> Arc<CompiledTemplate> {
    let template: SidecarTemplate = serde_json::from_value(source.clone())
        .unwrap_or_else(|e| panic!("generator bug: {e}\n{source}"));
    Arc::new(compile(&template).unwrap_or_else(|e| panic!("generator bug: {e}\n{source}")))
}

fn scenario() -> BoxedStrategy<Scenario> {
    btree_set(template_name(), 1..=5)
        .prop_flat_map(|names| {
            let names: Vec<String> = names.into_iter().collect();
            let n = names.len();
            (
                vec(template_parts(), n),
                pod(),
                option::of(prop::sample::subsequence(names.clone(), 0..=n)),
                Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
                namespace_labels(),
                Just(names),
            )
        })
        .prop_map(|(parts, mut pod, requested, order, ns_labels, names)| {
            let sources: Vec<Value> = names
                .iter()
                .zip(parts)
                .map(|(name, parts)| template_source(name, parts))
                .collect();
            let templates = sources.iter().map(compile_source).collect();
            if let Some(requested) = requested
                && pod.get("metadata").is_some()
            {
                pod["metadata"]["annotations"]["sidecar.dev/templates"] =
                    requested.join(", ").into();
            }
            Scenario {
                pod,
                sources,
                templates,
                order,
                ns_labels,
            }
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// `before` is a prefix of `after` (an absent list counts as empty).
fn is_prefix(before: Option<&Value>, after: Option<&Value>) -> bool {
    let empty = Vec::new();
    let before = before.and_then(Value::as_array).unwrap_or(&empty);
    let after = after.and_then(Value::as_array).unwrap_or(&empty);
    after.len() >= before.len() && after.iter().zip(before).all(|(a, b)| a == b)
}

/// Every key of `before` is in `after` with the same value, but `except`.
fn map_kept(before: Option<&Value>, after: Option<&Value>, except: &str) -> bool {
    let Some(before) = before.and_then(Value::as_object) else {
        return true;
    };
    before
        .iter()
        .filter(|(k, _)| k.as_str() != except)
        .all(|(k, v)| after.and_then(|a| a.get(k)) == Some(v))
}

fn pod_labels(pod: &Value) -> Option<&Map<String, Value>> {
    pod.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
}

fn config() -> ProptestConfig {
    // The default number of cases (256, or PROPTEST_CASES); no regression files are written
    // into the source tree.
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_patch_applies_and_yields_a_pod(s in scenario()) {
        let plan = plan_for(&s.pod, &s.namespace(), &s.templates);
        // The webhook's JSON, with fixed parts copied, is the patch serialized.
        let json = plan.patch.to_json().unwrap();
        prop_assert_eq!(&json, &serde_json::to_vec(&plan.patch).unwrap());
        // Its base64, with each long fixed part's own base64 copied, is the JSON's.
        let mut encoded = Vec::new();
        plan.patch.write_base64(&mut encoded).unwrap();
        prop_assert_eq!(
            String::from_utf8(encoded).unwrap(),
            base64::engine::general_purpose::STANDARD.encode(&json)
        );
        let out = apply(&s.pod, &plan)?;
        if let Err(e) = serde_json::from_value::<Pod>(out.clone()) {
            return Err(TestCaseError::fail(format!("not a Pod: {e}\n{out}")));
        }
        // Every applied template is recorded, and nothing is both applied and denied.
        for applied in &plan.applied {
            let record = out["metadata"]["annotations"]["sidecar.dev/injected"]
                .as_str()
                .unwrap_or_default();
            prop_assert!(
                record.split(',').any(|e| e == applied.to_string()),
                "{} missing from {record:?}", applied.name
            );
            prop_assert!(plan.denials.iter().all(|d| d.template != applied.name));
        }
        prop_assert_eq!(plan.applied.len() + plan.skipped.len(), s.templates.len());
    }

    #[test]
    fn the_pod_as_the_webhook_decodes_it_is_planned_like_the_whole_pod(s in scenario()) {
        // Fields the planner does not read, which decoding skips.
        let mut whole = s.pod.clone();
        whole["status"] = json!({"phase": "Pending", "conditions": [{"type": "x"}]});
        whole["spec"]["nodeName"] = json!("node-1");
        if let Some(metadata) = whole.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert("managedFields".into(), json!([{"manager": "kubectl"}]));
        }
        let json = whole.to_string();
        let decoded = decode_pod(&json, allowance(json.len())).unwrap_or_else(|e| panic!("{e}"));
        let ns = s.namespace();
        let reference = plan_for(&whole, &ns, &s.templates);
        prop_assert_eq!(&plan_decoded(&decoded, &ns, &s.templates), &reference);

        // As the webhook decodes it, with containers whole only where a template adds one of
        // the same name: first calls, and re-invocations (the Pod as the first call left it,
        // its injected containers named as the templates' are). Both with names first, as the
        // API server writes containers (such a container is built whole), and in `Value`'s
        // order (the Pod is then decoded again whole).
        fn among<'j>(json: &'j str, templates: &[Arc<CompiledTemplate>]) -> injector_core::Pod<'j> {
            decode_pod_among(json, allowance(json.len()), templates)
                .unwrap_or_else(|e| panic!("{e}"))
        }
        let mutated = apply(&whole, &reference)?;
        let again = plan_for(&mutated, &ns, &s.templates);
        for (pod, expected) in [(&whole, &reference), (&mutated, &again)] {
            for json in [pod.to_string(), names_first(pod)] {
                prop_assert_eq!(&plan_decoded(&among(&json, &s.templates), &ns, &s.templates), expected);
            }
        }
    }

    #[test]
    fn planning_the_mutated_pod_again_adds_nothing(s in scenario()) {
        replanning_adds_nothing(&s)?;
    }

    #[test]
    fn the_result_does_not_depend_on_the_order_of_the_templates(s in scenario()) {
        let ns = s.namespace();
        let mut given = Registry::new();
        for template in &s.templates {
            given.apply(CompiledTemplate::clone(template));
        }
        let mut shuffled = Registry::new();
        for template in s.shuffled() {
            shuffled.apply(CompiledTemplate::clone(&template));
        }
        let all = given.snapshot().templates().to_vec();
        let matching = shuffled.snapshot().matching(&pod_labels(&s.pod), s.ns_labels.as_ref());

        let reference = plan_for(&s.pod, &ns, &s.templates);
        let expected = apply(&s.pod, &reference)?;
        for (what, templates) in [
            ("the registry's templates", all),
            ("the shuffled registry's matching templates", matching),
            ("the templates in shuffled order", s.shuffled()),
        ] {
            let other = plan_for(&s.pod, &ns, &templates);
            let out = apply(&s.pod, &other)?;
            prop_assert_eq!(&other.applied, &reference.applied, "applied, with {}", what);
            prop_assert_eq!(&other.denials, &reference.denials, "denials, with {}", what);
            prop_assert_eq!(&other.warnings, &reference.warnings, "warnings, with {}", what);
            prop_assert_eq!(&out, &expected, "patched pod, with {}", what);
        }
    }

    #[test]
    fn an_opted_out_namespace_is_never_patched(mut s in scenario()) {
        s.ns_labels
            .get_or_insert_with(BTreeMap::new)
            .insert("sidecar.dev/injection".into(), "disabled".into());
        let plan = plan_for(&s.pod, &s.namespace(), &s.templates);
        prop_assert!(plan.patch.is_empty(), "{:?}", plan.patch);
        prop_assert!(plan.applied.is_empty());
        prop_assert!(plan.denials.is_empty());
        prop_assert_eq!(plan.skipped.len(), s.templates.len());
        prop_assert!(plan.skipped.iter().all(|skip| skip.reason == SkipReason::NamespaceOptedOut));
    }

    #[test]
    fn an_opted_out_pod_gets_only_its_required_templates(
        mut s in scenario(),
        value in prop::sample::select(&["false", "False", " FALSE "][..]),
    ) {
        s.pod["metadata"]["annotations"]["sidecar.dev/inject"] = value.into();
        let plan = plan_for(&s.pod, &s.namespace(), &s.templates);
        let required = |name: &str| {
            s.templates
                .iter()
                .any(|t| t.name == name && t.failure_policy == FailurePolicy::Fail)
        };
        for applied in &plan.applied {
            prop_assert!(required(&applied.name), "best-effort {} applied", applied.name);
        }
        for skip in &plan.skipped {
            prop_assert_eq!(
                skip.reason == SkipReason::PodOptedOut,
                !required(&skip.name),
                "{:?}", skip
            );
        }
    }

    #[test]
    fn the_pods_own_containers_are_only_added_to(s in scenario()) {
        let plan = plan_for(&s.pod, &s.namespace(), &s.templates);
        let out = apply(&s.pod, &plan)?;
        let (before, after) = (&s.pod["spec"], &out["spec"]);

        let own = before["containers"].as_array().unwrap();
        let patched = after["containers"].as_array().unwrap();
        prop_assert!(patched.len() >= own.len());
        for (old, new) in own.iter().zip(patched) {
            let (old, new) = (old.as_object().unwrap(), new.as_object().unwrap());
            for (key, value) in old {
                match key.as_str() {
                    "env" | "envFrom" | "volumeMounts" => prop_assert!(
                        is_prefix(Some(value), new.get(key)),
                        "{key} of {:?} changed: {value} became {:?}", old["name"], new.get(key)
                    ),
                    _ => prop_assert_eq!(Some(value), new.get(key), "{} changed", key),
                }
            }
            for key in new.keys() {
                let addable = ["env", "envFrom", "volumeMounts"].contains(&key.as_str());
                prop_assert!(old.contains_key(key) || addable, "{key} added to {:?}", old["name"]);
            }
            // Each env var the container had keeps its value: the first of its name is the
            // pod's own.
            for var in old.get("env").and_then(Value::as_array).into_iter().flatten() {
                let first = new["env"]
                    .as_array()
                    .and_then(|env| env.iter().find(|v| v["name"] == var["name"]));
                prop_assert_eq!(first, Some(var));
            }
        }

        // The pod's own init containers keep their order and content, after the injected ones.
        let own_init = before["initContainers"].as_array().cloned().unwrap_or_default();
        let own_names: HashSet<&Value> = own_init.iter().map(|c| &c["name"]).collect();
        let kept: Vec<Value> = after["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| own_names.contains(&c["name"]))
            .cloned()
            .collect();
        prop_assert_eq!(&kept, &own_init);
        let patched_init = after["initContainers"].as_array().cloned().unwrap_or_default();
        prop_assert_eq!(&patched_init[patched_init.len() - own_init.len()..], &own_init[..]);

        // Volumes, pull secrets, labels and annotations are only added to.
        for list in ["volumes", "imagePullSecrets"] {
            prop_assert!(is_prefix(before.get(list), after.get(list)), "{} changed", list);
        }
        let (meta_before, meta_after) = (s.pod.get("metadata"), out.get("metadata"));
        for (map, except) in [("labels", ""), ("annotations", "sidecar.dev/injected")] {
            prop_assert!(
                map_kept(
                    meta_before.and_then(|m| m.get(map)),
                    meta_after.and_then(|m| m.get(map)),
                    except,
                ),
                "{} changed", map
            );
        }
        let unique: BTreeSet<&str> = patched
            .iter()
            .chain(after["initContainers"].as_array().into_iter().flatten())
            .filter_map(|c| c["name"].as_str())
            .collect();
        prop_assert_eq!(
            unique.len(),
            patched.len() + patched_init.len(),
            "container names are no longer unique"
        );
    }
}

/// A template that adds a label another template's pod selector reads, with `matchLabels` or
/// with `matchExpressions` (`by_expression`). (A template cannot request an `OnRequest` one:
/// `sidecar.dev/` keys are reserved.)
fn feeding_pair(
    feeder: &str,
    follower: &str,
    priorities: (i32, i32),
    by_expression: bool,
) -> [Value; 2] {
    let feed = json!({"labels": {"tier": "frontend"}});
    let selection = if by_expression {
        json!({"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend", "edge"]}]}})
    } else {
        json!({"podSelector": {"matchLabels": {"tier": "frontend"}}})
    };
    let mut follower_spec = json!({
        "priority": priorities.1,
        "containers": [{"name": "follower-sidecar", "image": "busybox"}],
    });
    follower_spec
        .as_object_mut()
        .unwrap()
        .extend(selection.as_object().unwrap().clone());
    [
        json!({
            "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
            "metadata": {"name": feeder},
            "spec": {"priority": priorities.0, "metadata": feed},
        }),
        json!({
            "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
            "metadata": {"name": follower},
            "spec": follower_spec,
        }),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Idempotence when what one template adds changes which templates select the Pod.
    ///
    /// This failed while `plan` selected on the Pod's labels as they were before the patch: a
    /// template whose pod selector is satisfied only by what another template adds was skipped on the first call and applied on the second,
    /// breaking "a webhook re-invocation adds nothing". `plan` now runs passes until one
    /// applies nothing.
    #[test]
    fn what_one_template_adds_does_not_select_another_on_replanning(
        mut s in scenario(),
        priorities in (0..3i32, 0..3i32),
        names in prop::sample::subsequence(&["feeder-a", "feeder-z", "follow-m"][..], 2),
        swap in any::<bool>(),
        by_expression in any::<bool>(),
    ) {
        let (feeder, follower) = if swap { (names[1], names[0]) } else { (names[0], names[1]) };
        // The Pod neither has the label nor requests the follower itself.
        if let Some(metadata) = s.pod.get_mut("metadata").and_then(Value::as_object_mut) {
            for (map, key) in [("labels", "tier"), ("annotations", "sidecar.dev/templates")] {
                if let Some(m) = metadata.get_mut(map).and_then(Value::as_object_mut) {
                    m.remove(key);
                }
            }
        }
        for source in feeding_pair(feeder, follower, priorities, by_expression) {
            s.templates.push(compile_source(&source));
            s.sources.push(source);
        }
        replanning_adds_nothing(&s)?;
    }
}

proptest! {
    #![proptest_config(config())]

    /// `plan` promises that a name given twice counts once (the CLI passes every template of
    /// every file it is given, so two versions of one template can meet).
    ///
    /// Fails today: the dedup runs after sorting by (priority, name), so two templates of the
    /// same name and different priorities are not adjacent, and both are applied and recorded.
    #[test]
    fn a_name_given_twice_counts_once(
        s in scenario(),
        index in any::<prop::sample::Index>(),
        shift in 1..3i32,
    ) {
        let original = index.get(&s.sources);
        let mut copy = original.clone();
        let priority = original["spec"]["priority"].as_i64().unwrap() + i64::from(shift);
        copy["spec"]["priority"] = priority.into();
        let mut templates = s.templates.clone();
        templates.push(compile_source(&copy));
        let plan = plan_for(&s.pod, &s.namespace(), &templates);
        let mut seen = HashSet::new();
        for applied in &plan.applied {
            prop_assert!(
                seen.insert(applied.name.as_str()),
                "{:?} applied twice: {:?}\ncopy: {copy}",
                applied.name,
                plan.applied
            );
        }
        prop_assert_eq!(plan.applied.len() + plan.skipped.len(), s.templates.len());
    }
}

/// `value` without its empty lists and objects, at any depth.
fn without_empty(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !matches!(v, Value::Array(a) if a.is_empty()))
                .filter(|(_, v)| !matches!(v, Value::Object(o) if o.is_empty()))
                .map(|(k, v)| (k.clone(), without_empty(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_empty).collect()),
        other => other.clone(),
    }
}

/// How a Pod author copies a template's container into their Pod.
#[derive(Clone, Copy, Debug)]
enum Copy {
    /// As it is, in the list the template puts it in.
    Exact,
    /// As it is, in the other list (a native sidecar as a plain container, or the reverse).
    OtherList,
    /// With another command.
    Command,
    /// With another image.
    Image,
    /// With one more env var.
    Env,
    /// With the author's own volume mounted where the ServiceAccount token goes.
    TokenMount,
    /// With its port published on the node.
    HostPort,
}

fn copies() -> BoxedStrategy<Vec<Copy>> {
    vec(
        prop::sample::select(
            &[
                Copy::Exact,
                Copy::OtherList,
                Copy::Command,
                Copy::Image,
                Copy::Env,
                Copy::TokenMount,
                Copy::HostPort,
            ][..],
        ),
        1..8,
    )
    .boxed()
}

/// The Pod with copies of the templates' containers (the first `copies.len()`, in template
/// order; none whose name the Pod has already) and claims in its annotations.
fn forged(s: &Scenario, copies: &[Copy], opt_out: bool) -> (Value, Vec<String>) {
    let mut pod = s.pod.clone();
    let mut names: HashSet<String> = ["containers", "initContainers"]
        .iter()
        .flat_map(|list| pod["spec"][*list].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    let mut altered = Vec::new();
    let items = s.sources.iter().flat_map(|source| {
        let spec = &source["spec"];
        let plain = spec["containers"].as_array().cloned().unwrap_or_default();
        let init = spec["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        plain
            .into_iter()
            .map(|c| (c, "containers"))
            .chain(init.into_iter().map(|c| (c, "initContainers")))
    });
    for ((mut container, list), copy) in items.zip(copies) {
        let name = container["name"].as_str().unwrap().to_owned();
        if !names.insert(name.clone()) {
            continue;
        }
        let mut list = list;
        match copy {
            Copy::Exact => {}
            Copy::OtherList => {
                list = if list == "containers" {
                    "initContainers"
                } else {
                    "containers"
                };
                if list == "containers" {
                    container.as_object_mut().unwrap().remove("restartPolicy");
                }
                altered.push(name.clone());
            }
            Copy::Command => {
                container["command"] = json!(["sleep", "infinity"]);
                altered.push(name.clone());
            }
            Copy::Image => {
                container["image"] = "look-alike:1".into();
                altered.push(name.clone());
            }
            Copy::Env => {
                container["env"]
                    .as_array_mut()
                    .map(|env| env.push(json!({"name": "EXTRA", "value": "1"})))
                    .unwrap_or_else(|| container["env"] = json!([{"name": "EXTRA", "value": "1"}]));
                altered.push(name.clone());
            }
            Copy::TokenMount => {
                let mount = json!({
                    "name": "kube-api-access-mine",
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "readOnly": true,
                });
                container["volumeMounts"]
                    .as_array_mut()
                    .map(|mounts| mounts.push(mount.clone()))
                    .unwrap_or_else(|| container["volumeMounts"] = json!([mount]));
                let volume =
                    json!({"name": "kube-api-access-mine", "configMap": {"name": "fake-token"}});
                match pod["spec"]["volumes"].as_array_mut() {
                    Some(volumes) => volumes.push(volume),
                    None => pod["spec"]["volumes"] = json!([volume]),
                }
                altered.push(name.clone());
            }
            Copy::HostPort => {
                container["ports"] = json!([{"containerPort": 9901, "hostPort": 9901}]);
                altered.push(name.clone());
            }
        }
        match pod["spec"][list].as_array_mut() {
            Some(items) => items.push(container),
            None => pod["spec"][list] = json!([container]),
        }
    }
    if pod.get("metadata").is_none() {
        pod["metadata"] = json!({});
    }
    let claims: Vec<String> = s
        .templates
        .iter()
        .map(|t| format!("{}@{}", t.name, t.generation))
        .collect();
    pod["metadata"]["annotations"]["sidecar.dev/injected"] = claims.join(",").into();
    if opt_out {
        pod["metadata"]["annotations"]["sidecar.dev/inject"] = "false".into();
    }
    (pod, altered)
}

proptest! {
    // More cases than the others: a look-alike must meet a required template that selects
    // the Pod, which a quarter of the default cases do not draw.
    #![proptest_config(ProptestConfig { cases: 1024, ..config() })]

    /// A Pod admitted by `plan` (no denial) carries every required template that selects it,
    /// present and equal: whatever it claims in `sidecar.dev/injected`, whether it opts out,
    /// and whatever look-alikes of the templates' containers it declares.
    #[test]
    fn no_pod_is_admitted_without_its_required_templates(
        s in scenario(),
        copies in copies(),
        opt_out in any::<bool>(),
    ) {
        let (pod, altered) = forged(&s, &copies, opt_out);
        let plan = plan_for(&pod, &s.namespace(), &s.templates);
        if !plan.denials.is_empty() {
            return Ok(());
        }
        let out = apply(&pod, &plan)?;
        let in_force: HashSet<&str> = plan
            .applied
            .iter()
            .map(|a| a.name.as_str())
            .chain(
                plan.skipped
                    .iter()
                    .filter(|skip| skip.reason == SkipReason::AlreadyPresent)
                    .map(|skip| skip.name.as_str()),
            )
            .collect();
        for (template, source) in s.templates.iter().zip(&s.sources) {
            if template.failure_policy != FailurePolicy::Fail {
                continue;
            }
            let skip = plan.skipped.iter().find(|skip| skip.name == template.name);
            match skip.map(|skip| &skip.reason) {
                None | Some(SkipReason::AlreadyPresent) => {}
                Some(SkipReason::PodOptedOut) => {
                    prop_assert!(false, "required {} skipped for the opt-out", template.name)
                }
                Some(SkipReason::Conflict(detail)) => {
                    prop_assert!(false, "required {} in conflict but not denied: {detail}", template.name)
                }
                // It does not select the Pod.
                Some(_) => continue,
            }
            prop_assert!(in_force.contains(template.name.as_str()));
            for (list, item) in ["containers", "initContainers"].into_iter().flat_map(|list| {
                source["spec"][list]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |item| (list, item))
            }) {
                let name = item["name"].as_str().unwrap();
                prop_assert!(
                    !altered.iter().any(|a| a == name),
                    "required {} admitted with a look-alike {name}", template.name
                );
                let found = out["spec"][list]
                    .as_array()
                    .and_then(|items| items.iter().find(|c| c["name"] == name));
                prop_assert!(found.is_some(), "{name} of {} not in {list}", template.name);
                if !item.to_string().contains("{{") {
                    // An empty list or object is the same as none (the API server drops them).
                    prop_assert_eq!(
                        found.map(without_empty),
                        Some(without_empty(&item)),
                        "{} of {}", name, template.name
                    );
                }
            }
            let record = out["metadata"]["annotations"]["sidecar.dev/injected"]
                .as_str()
                .unwrap_or_default();
            prop_assert!(
                record.split(',').any(|e| e == format!("{}@{}#{}", template.name, template.generation, template.fingerprint)),
                "{} missing from the record {record:?}", template.name
            );
        }
    }
}
