//! The `SidecarTemplate` custom resource (`sidecar.dev/v1alpha1`, cluster-scoped), the
//! annotation and label names the injector reads and writes, CRD generation, and the YAML
//! writer ([`yaml`]) every YAML the project prints goes through.
//!
//! This crate holds types only: no I/O, no logic beyond defaults.

pub mod names;
pub mod yaml;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, EnvVar, LocalObjectReference, Volume, VolumeMount,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The default of `spec.priority`.
pub const DEFAULT_PRIORITY: i32 = 100;

/// What to inject into Pods, and into which Pods.
///
/// A SidecarTemplate is cluster-scoped: it selects namespaces with `namespaceSelector` and pods
/// with `podSelector`, and adds containers, native sidecars, volumes, pull secrets, metadata, and
/// env and mounts for the pod's own containers when a selected Pod is created.
// The printer columns repeat `type_ = "string"`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "sidecar.dev",
    version = "v1alpha1",
    kind = "SidecarTemplate",
    plural = "sidecartemplates",
    singular = "sidecartemplate",
    shortname = "sct",
    category = "sidecar",
    status = "SidecarTemplateStatus",
    derive = "PartialEq",
    // Without it, `kubectl explain sct` shows kube's "Auto-generated derived type" line.
    doc = "Sidecars, volumes, env and metadata injected into the Pods a template selects.\n\n\
           A SidecarTemplate is cluster-scoped (short name `sct`). `spec` says what to inject and\n\
           into which Pods: the namespaces `namespaceSelector` selects (never kube-system,\n\
           kube-public, kube-node-lease, the operator's own, or one labelled\n\
           `sidecar.dev/injection=disabled`), the Pods `podSelector` selects in them, and for an\n\
           `OnRequest` template only the Pods whose `sidecar.dev/templates` annotation names it.\n\
           It is injected when a selected Pod is created; `updateStrategy` says what happens to\n\
           Pods already running. `status`, written by the operator, says whether the template is\n\
           in use (the `Ready` condition) and where the Pods it selects stand (`pods`).\n\n\
           Creating one is an admin act: RBAC on sidecartemplates.sidecar.dev is the boundary.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "Injection", type_ = "string", json_path = ".spec.injection"),
    printcolumn(
        name = "Failure-Policy",
        type_ = "string",
        json_path = ".spec.failurePolicy"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    // Why it is (not) Ready at a glance: `Invalid`, `NotServed`, … (docs/reference.md, status).
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Injected",
        type_ = "integer",
        json_path = ".status.pods.injected"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        json_path = ".status.pods.current"
    ),
    printcolumn(name = "Stale", type_ = "integer", json_path = ".status.pods.stale"),
    printcolumn(
        name = "Missing",
        type_ = "integer",
        json_path = ".status.pods.missing"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new(
        "(has(self.containers) && size(self.containers) > 0) || (has(self.initContainers) && size(self.initContainers) > 0) || (has(self.volumes) && size(self.volumes) > 0) || (has(self.imagePullSecrets) && size(self.imagePullSecrets) > 0) || (has(self.appContainers) && ((has(self.appContainers.env) && size(self.appContainers.env) > 0) || (has(self.appContainers.envFrom) && size(self.appContainers.envFrom) > 0) || (has(self.appContainers.volumeMounts) && size(self.appContainers.volumeMounts) > 0))) || (has(self.metadata) && ((has(self.metadata.labels) && size(self.metadata.labels) > 0) || (has(self.metadata.annotations) && size(self.metadata.annotations) > 0)))"
    ).message("a SidecarTemplate must inject something: containers, initContainers, volumes, imagePullSecrets, appContainers or metadata"),
    validation = Rule::new(
        "!has(self.containers) || !has(self.initContainers) || self.initContainers.all(i, !self.containers.exists(c, c.name == i.name))"
    ).message("a container name may appear in containers or initContainers, not both")
)]
#[serde(rename_all = "camelCase")]
pub struct SidecarTemplateSpec {
    /// Selects the namespaces whose Pods this template applies to, by namespace labels.
    /// Absent or empty selects every namespace that is not excluded (kube-system, kube-public,
    /// kube-node-lease, the operator's own namespace, and namespaces labelled
    /// `sidecar.dev/injection=disabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Selects the Pods this template applies to, by Pod labels. Absent or empty selects every
    /// Pod in the selected namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,

    /// `Automatic` (default) injects into every selected Pod. `OnRequest` injects only into
    /// selected Pods whose annotation `sidecar.dev/templates` lists this template's name.
    #[serde(default)]
    pub injection: Injection,

    /// Order of application: lower applies first, ties are broken by name. When two templates
    /// add the same container, volume or key, the one applied first wins. Default 100.
    #[serde(default = "default_priority")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub priority: i32,

    /// `Fail` (default): the template is required; a selected Pod is not admitted without it,
    /// also while the injector is unavailable. `Ignore`: best effort; a Pod is admitted without
    /// it when it cannot be applied.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// Containers appended to the Pod's containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(transform = item_names_are_dns_labels)]
    pub containers: Vec<Container>,

    /// Init containers placed before the Pod's own, in this order. An init container with
    /// `restartPolicy: Always` is a native sidecar: it starts before the app and runs beside it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(transform = item_names_are_dns_labels)]
    pub init_containers: Vec<Container>,

    /// Volumes added to the Pod, for the injected containers (and `appContainers.volumeMounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Vec<Volume>,

    /// Image pull secrets added to the Pod (the Secrets must exist in the Pod's namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Env, envFrom and volume mounts added to the Pod's own containers. An existing env name
    /// or mount path is never overwritten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_containers: Option<AppContainers>,

    /// Labels and annotations added to the Pod. Existing keys keep their values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<InjectedMetadata>,

    /// How a change of what this template injects reaches running Pods. Absent: `OnCreate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// How a change of what a template injects reaches the Pods that carry an earlier version
/// (stale) or that it selects and that do not carry it (missing).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// `OnCreate` (default): only Pods created from now on get the change; stale and missing
    /// Pods are counted in `status.pods`. `RollingRestart`: the operator restarts the
    /// Deployments, StatefulSets and DaemonSets that own stale or missing Pods, as
    /// `kubectl rollout restart` does, a few at a time. `InPlace`: when only the images of
    /// injected containers changed, the operator sets the new images on the running Pods (the
    /// kubelet restarts just those containers), `maxUnavailable` at a time; any other change
    /// is rolled out as `RollingRestart`. Both need the chart's `rollouts.enabled`.
    #[serde(default, rename = "type")]
    pub type_: UpdateStrategyType,

    /// `RollingRestart`: how many workloads restart at once; each must complete its rollout
    /// before another starts. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_concurrent_workloads: Option<u32>,

    /// `InPlace`: how many of the template's Pods may be not Ready at once while their images
    /// are updated: a count, or a percentage of the Pods carrying the template (rounded down,
    /// at least 1). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,

    /// No new restart starts while true; the ones under way complete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,

    /// A restarted workload that makes no progress (no more of its Pods updated or ready) for
    /// this long halts the template's rollout, with the `RolloutBlocked` condition naming it.
    /// Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86_400))]
    pub progress_deadline_seconds: Option<u32>,
}

/// The default of `updateStrategy.maxConcurrentWorkloads`.
pub const DEFAULT_MAX_CONCURRENT_WORKLOADS: u32 = 1;

/// The default of `updateStrategy.progressDeadlineSeconds`.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: u32 = 600;

/// How a change reaches running Pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum UpdateStrategyType {
    /// New Pods only.
    #[default]
    OnCreate,
    /// Restart the workloads owning stale or missing Pods.
    RollingRestart,
    /// Update the images of injected containers on running Pods when only images changed;
    /// otherwise as `RollingRestart`.
    InPlace,
}

impl UpdateStrategyType {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateStrategyType::OnCreate => "OnCreate",
            UpdateStrategyType::RollingRestart => "RollingRestart",
            UpdateStrategyType::InPlace => "InPlace",
        }
    }
}

/// Bounds `items.name` to a DNS-1123 label, as the API server bounds Pod container names. Besides
/// rejecting bad names at `kubectl apply`, the bound keeps the cost of the CEL rule comparing
/// names across `containers` and `initContainers` within the API server's budget.
fn item_names_are_dns_labels(schema: &mut schemars::Schema) {
    let name = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(|properties| properties.get_mut("name"))
        .and_then(|name| name.as_object_mut());
    if let Some(name) = name {
        name.insert("maxLength".into(), 63.into());
        name.insert("pattern".into(), names::DNS_LABEL_PATTERN.into());
    }
}

fn default_priority() -> i32 {
    DEFAULT_PRIORITY
}

/// When a selected Pod receives the template.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum Injection {
    /// Every selected Pod.
    #[default]
    Automatic,
    /// Only selected Pods whose `sidecar.dev/templates` annotation names this template.
    OnRequest,
}

/// What happens to a selected Pod when the template cannot be applied.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    JsonSchema,
)]
pub enum FailurePolicy {
    /// Required: the Pod is denied.
    #[default]
    Fail,
    /// Best effort: the Pod is admitted without the template, with a warning.
    Ignore,
}

impl FailurePolicy {
    /// The name used in the API and in webhook configurations.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

impl Injection {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Injection::Automatic => "Automatic",
            Injection::OnRequest => "OnRequest",
        }
    }
}

/// Additions to the Pod's own containers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppContainers {
    /// Names of the Pod's containers to change. Absent or empty means every container the Pod
    /// itself declares (not injected ones, not init containers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub names: Vec<String>,

    /// Environment variables added to each named container, unless it already has that name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub env: Vec<EnvVar>,

    /// Sources of environment variables (ConfigMaps, Secrets) added to each named container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub env_from: Vec<EnvFromSource>,

    /// Volume mounts added to each named container, unless it already mounts that path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub volume_mounts: Vec<VolumeMount>,
}

/// Labels and annotations added to the Pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
pub struct InjectedMetadata {
    /// Labels added to the Pod; a label the Pod already has keeps its value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Annotations added to the Pod; an annotation the Pod already has keeps its value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What the injector last observed about the template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarTemplateStatus {
    /// What the operator observed, one condition per type, each with a reason and a message:
    ///
    /// - `Ready`: `True`/`Valid` when the template is in use (the message names the webhook
    ///   entry or the MutatingAdmissionPolicy that serves it); `False`/`Invalid` with every
    ///   validation message; `False`/`NotServed` when it is valid but not in use (no room for
    ///   it in the webhook configuration, or the `policy` backend cannot inject it).
    /// - `Degraded`: `True`/`InvalidGenerationKept` when an edit made a required template
    ///   invalid and its last valid generation (`lastValid`) stays in force.
    /// - `PolicyServed` (`auto` and `policy` backends, Kubernetes 1.36+): `True`/`Served` when
    ///   the API server injects it from the operator's MutatingAdmissionPolicy; `False` with
    ///   `NotExpressible` (a policy cannot express it), `PolicyFull` (the templates applied
    ///   before it fill the policy), `NotAvailable` (the API server does not
    ///   serve such policies), `ProofFailed` (the policy's dry-run proof or apply failed) or
    ///   `NotProven` (a required template whose Pods are refused until its proof ends).
    /// - `RolloutBlocked`: `True`/`Halted` when a restarted workload made no progress within
    ///   `progressDeadlineSeconds`, `True`/`Forbidden` when the operator may not restart
    ///   workloads.
    /// - `WideSelection`: `True`/`NoNamespaceSelector` or `True`/`ExcludingSelectorOnly` when a
    ///   required template selects every namespace (but the few never injected).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` the operator has observed: `pods` was counted against it (it
    /// advances only together with those counts); each condition carries its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// A required template's last valid generation and its spec, written by the operator. When
    /// an edit makes the template invalid, this generation stays in force, also in operator
    /// replicas started after the edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_valid: Option<LastValid>,

    /// Where the Pods this template selects or that carry it stand, as the leader last counted
    /// them from their metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodCounts>,

    /// The rollout of the template's current version to stale and missing Pods
    /// (`updateStrategy` other than `OnCreate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// Where a template's rollout stands.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// `Progressing` (workloads are restarting or wait their turn), `Complete` (no restartable
    /// workload owns a stale or missing Pod), `Paused`, `Halted` (a restarted workload made no
    /// progress in time) or `Forbidden` (the operator may not restart workloads).
    pub state: String,
    /// The workloads restarting now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarting: Vec<WorkloadRef>,
    /// `InPlace`: the Pods (`namespace/name`) whose images are being updated now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub updating: Vec<String>,
    /// How many workloads own stale or missing Pods and wait their turn.
    #[serde(default)]
    pub waiting: u32,
    /// Stale or missing Pods no restartable workload owns (bare Pods, Jobs, CronJobs, or a
    /// workload annotated `sidecar.dev/rollout: disabled`): never touched, only reported.
    #[serde(default)]
    pub not_restartable: u32,
    /// Why the rollout is `Halted` or `Forbidden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A workload, by kind, namespace and name.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    /// `Deployment`, `StatefulSet` or `DaemonSet`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} -n {}",
            self.kind.to_lowercase(),
            self.name,
            self.namespace
        )
    }
}

/// How many Pods carry a template, and whether what they carry is what it injects now.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodCounts {
    /// Pods that carry the template (`current` + `stale`).
    pub injected: u32,
    /// Pods that carry what the template injects now.
    pub current: u32,
    /// Pods that carry an earlier version of what it injects: they get the new one when they
    /// are created again.
    pub stale: u32,
    /// Pods the template selects now that do not carry it: created before it, or admitted
    /// while a best-effort template's webhook was down.
    pub missing: u32,
}

/// A generation of a template and its spec, as the operator last found it valid.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastValid {
    /// The template's `metadata.generation` then.
    pub generation: i64,
    /// The template's `spec` then, as it was applied (validated by the operator, not by the
    /// API server: only the operator writes status).
    #[schemars(schema_with = "any_object")]
    pub spec: serde_json::Value,
}

/// An object whose fields the schema leaves open (and the API server keeps as written).
fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The CustomResourceDefinition of [`SidecarTemplate`], as the API server receives it.
pub fn crd() -> CustomResourceDefinition {
    SidecarTemplate::crd()
}

/// The CRD as YAML, exactly as `crds/` holds it.
pub fn crd_yaml() -> Result<String, yaml::YamlError> {
    let body = yaml::to_string(&crd())?;
    Ok(format!(
        "# Generated by `sidecar-injector crd` (just generate). Do not edit.\n{body}"
    ))
}
