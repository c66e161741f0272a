//! What `kubectl sidecar` reads from the cluster, and nothing else: it never writes. Pods,
//! ReplicaSets and Jobs are read as metadata only (the API server sends no spec), like the
//! operator's census; the Deployments, StatefulSets and DaemonSets behind stale and missing
//! Pods whole, as the operator's rollouts read them (their update strategy is in the spec).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use injector_api::{SidecarTemplate, WorkloadRef};
use injector_core::after_admission::workload::{NotRestartable, WorkloadObject, owner_of};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::{Client, Config};
use serde_json::Value;

use super::explain::{Target, TargetKind};

/// How many objects one list call asks for.
const PAGE: u32 = 500;

/// What went wrong talking to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig cannot be read or used.
    #[error("cannot use the kubeconfig")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// No client can be made from the configuration.
    #[error("cannot connect to Kubernetes")]
    Client(#[source] kube::Error),
    /// A call was forbidden: the user lacks a cluster-scoped read.
    #[error(
        "{what}: forbidden: {message}. kubectl sidecar reads SidecarTemplates and the object's Namespace, which are cluster-scoped: a role in one namespace does not grant them; the chart's viewerRbac.subjects does (docs/operations.md)"
    )]
    Forbidden {
        /// What was asked.
        what: String,
        /// The API server's message.
        message: String,
    },
    /// A call failed.
    #[error("{what}")]
    Call {
        /// What was asked.
        what: String,
        /// Why it failed.
        source: kube::Error,
    },
    /// The object does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// An object could not be turned into JSON.
    #[error("{what}")]
    Json {
        /// The object.
        what: String,
        /// Why.
        source: serde_json::Error,
    },
}

/// Where to connect: the kubeconfig (`--kubeconfig`, else `$KUBECONFIG`, else
/// `~/.kube/config`) and its context (`--context`, else the current one).
#[derive(Clone, Debug, Default)]
pub struct Connection {
    /// A kubeconfig file, over `$KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// The context to use.
    pub context: Option<String>,
}

/// A client for `connection`, and the namespace its context names (else `default`).
pub async fn connect(connection: &Connection) -> Result<(Client, String), ClusterError> {
    let options = KubeConfigOptions {
        context: connection.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &connection.kubeconfig {
        Some(path) => {
            Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?
        }
        None => Config::from_kubeconfig(&options).await?,
    };
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(ClusterError::Client)?;
    Ok((client, namespace))
}

fn call(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| match source {
        kube::Error::Api(response) if response.code == 403 => ClusterError::Forbidden {
            what,
            message: response.message,
        },
        source => ClusterError::Call { what, source },
    }
}

/// Every SidecarTemplate, or the one named.
pub async fn templates(
    client: &Client,
    name: Option<&str>,
) -> Result<Vec<SidecarTemplate>, ClusterError> {
    let api: Api<SidecarTemplate> = Api::all(client.clone());
    match name {
        Some(name) => {
            let what = format!("sidecartemplate/{name}");
            let template = api.get_opt(name).await.map_err(call(what.clone()))?;
            Ok(vec![template.ok_or(ClusterError::NotFound(what))?])
        }
        None => Ok(api
            .list(&ListParams::default())
            .await
            .map_err(call("list sidecartemplates"))?
            .items),
    }
}

/// A namespaced kind the plugin reads.
pub(super) trait Namespaced:
    kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Namespaced for K where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}

/// The metadata of every `K` in the cluster, page by page.
async fn all_metadata<K>(client: &Client, what: &str) -> Result<Vec<ObjectMeta>, ClusterError>
where
    K: Namespaced,
{
    let api: Api<K> = Api::all(client.clone());
    list_pages(&api, what).await
}

async fn list_pages<K>(api: &Api<K>, what: &str) -> Result<Vec<ObjectMeta>, ClusterError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    metadata_pages(api)
        .await
        .map_err(call(format!("list {what} (metadata)")))
}

/// The metadata of every object of `api`, page by page, without `managedFields` ([`lean`]).
pub(super) async fn metadata_pages<K>(api: &Api<K>) -> Result<Vec<ObjectMeta>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut found = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = api.list_metadata(&params).await?;
        found.extend(page.items.into_iter().map(|item| lean(item.metadata)));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(found);
        }
    }
}

/// `meta` without its `managedFields`: nothing here reads them, and they are often most of
/// an object's metadata, held for every Pod of a namespace or a cluster.
pub(super) fn lean(mut meta: ObjectMeta) -> ObjectMeta {
    meta.managed_fields = None;
    meta
}

/// The metadata of every Pod.
pub async fn pods(client: &Client) -> Result<Vec<ObjectMeta>, ClusterError> {
    all_metadata::<Pod>(client, "pods").await
}

/// The metadata of every Namespace.
pub async fn namespaces(client: &Client) -> Result<Vec<ObjectMeta>, ClusterError> {
    let api: Api<Namespace> = Api::all(client.clone());
    list_pages(&api, "namespaces").await
}

/// The labels of one Namespace.
pub async fn namespace_labels(
    client: &Client,
    name: &str,
) -> Result<BTreeMap<String, String>, ClusterError> {
    let what = format!("namespace/{name}");
    labels_of(client, name)
        .await
        .map_err(call(what.clone()))?
        .ok_or(ClusterError::NotFound(what))
}

/// The labels of the Namespace `name`, `None` when it does not exist.
pub(super) async fn labels_of(
    client: &Client,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace = api.get_metadata_opt(name).await?;
    Ok(namespace.map(|ns| ns.metadata.labels.unwrap_or_default()))
}

/// The controlling owner of each of `keys` (ReplicaSets and Jobs), read one by one; one
/// whose object is gone has none.
pub async fn owners(
    client: &Client,
    keys: BTreeSet<WorkloadRef>,
) -> Result<BTreeMap<WorkloadRef, Option<WorkloadRef>>, ClusterError> {
    let mut owners = BTreeMap::new();
    for key in keys {
        let what = key.to_string();
        let meta: Option<ObjectMeta> = match key.kind.as_str() {
            "ReplicaSet" => metadata_of::<ReplicaSet>(client, &key, &what).await?,
            "Job" => metadata_of::<Job>(client, &key, &what).await?,
            _ => None,
        };
        owners.insert(key, meta.as_ref().and_then(owner_of));
    }
    Ok(owners)
}

async fn metadata_of<K>(
    client: &Client,
    key: &WorkloadRef,
    what: &str,
) -> Result<Option<ObjectMeta>, ClusterError>
where
    K: Namespaced,
{
    metadata_opt::<K>(client, &key.namespace, &key.name)
        .await
        .map_err(call(what))
}

/// The metadata of the `K` named `name` in `namespace` ([`lean`]), `None` when it does not
/// exist.
pub(super) async fn metadata_opt<K>(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<ObjectMeta>, kube::Error>
where
    K: Namespaced,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let found: Option<PartialObjectMeta<K>> = api.get_metadata_opt(name).await?;
    Ok(found.map(|object| lean(object.metadata)))
}

/// What each of `workloads` (Deployments, StatefulSets and DaemonSets) says of a restart
/// ([`WorkloadObject::not_restartable`]), read one by one; one that is gone says
/// [`NotRestartable::Gone`].
pub async fn verdicts(
    client: &Client,
    workloads: BTreeSet<WorkloadRef>,
) -> Result<BTreeMap<WorkloadRef, Option<NotRestartable>>, ClusterError> {
    let mut verdicts = BTreeMap::new();
    for workload in workloads {
        let (namespace, name, what) = (&workload.namespace, &workload.name, workload.to_string());
        let verdict = match workload.kind.as_str() {
            "Deployment" => get::<Deployment>(client, namespace, name, &what)
                .await?
                .map(|object| WorkloadObject::Deployment(&object).not_restartable()),
            "StatefulSet" => get::<StatefulSet>(client, namespace, name, &what)
                .await?
                .map(|object| WorkloadObject::StatefulSet(&object).not_restartable()),
            "DaemonSet" => get::<DaemonSet>(client, namespace, name, &what)
                .await?
                .map(|object| WorkloadObject::DaemonSet(&object).not_restartable()),
            _ => continue,
        };
        verdicts.insert(workload, verdict.unwrap_or(Some(NotRestartable::Gone)));
    }
    Ok(verdicts)
}

/// The object `target` names in `namespace`, as JSON (with its `kind`).
pub async fn object(
    client: &Client,
    target: &Target,
    namespace: &str,
) -> Result<Value, ClusterError> {
    let what = format!(
        "{}/{} -n {namespace}",
        target.kind.as_str().to_lowercase(),
        target.name
    );
    match target.kind {
        TargetKind::Pod => typed::<Pod>(client, namespace, &target.name, what).await,
        TargetKind::Deployment => typed::<Deployment>(client, namespace, &target.name, what).await,
        TargetKind::StatefulSet => {
            typed::<StatefulSet>(client, namespace, &target.name, what).await
        }
        TargetKind::DaemonSet => typed::<DaemonSet>(client, namespace, &target.name, what).await,
        TargetKind::ReplicaSet => typed::<ReplicaSet>(client, namespace, &target.name, what).await,
        TargetKind::Job => typed::<Job>(client, namespace, &target.name, what).await,
        TargetKind::CronJob => typed::<CronJob>(client, namespace, &target.name, what).await,
    }
}

async fn typed<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    what: String,
) -> Result<Value, ClusterError>
where
    K: Namespaced + k8s_openapi::Resource + serde::Serialize,
{
    let object = get::<K>(client, namespace, name, &what)
        .await?
        .ok_or_else(|| ClusterError::NotFound(what.clone()))?;
    // k8s-openapi's types serialize their apiVersion and kind, which planning reads.
    serde_json::to_value(&object).map_err(|source| ClusterError::Json { what, source })
}

/// The `K` named `name` in `namespace`, `None` when it does not exist.
async fn get<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
) -> Result<Option<K>, ClusterError>
where
    K: Namespaced,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.get_opt(name).await.map_err(call(what))
}

#[cfg(test)]
mod tests;
