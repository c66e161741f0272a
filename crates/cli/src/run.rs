//! `sidecar-injector run`: the controller and the webhook in one process, against a cluster
//! (in-cluster service account, or a kubeconfig).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use injector_controller::FIELD_MANAGER;
use injector_controller::certs::{Lifetimes, ServingNames};
use injector_controller::leader::{self, LeaderElectionConfig};
use injector_controller::metrics::ControllerMetrics;
use injector_controller::operator::{Operator, OperatorOptions};
use injector_controller::webhook_config::{Endpoint, WebhookConfigOptions};
use injector_core::Templates;
use injector_webhook::{CertificateStore, Limits, Webhook, serve_both};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PatchParams};
use prometheus_client::registry::Registry as MetricsRegistry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What `run` needs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The operator's namespace.
    pub namespace: String,
    /// The Service in front of the webhook (in-cluster mode).
    pub service_name: String,
    /// The Service's port.
    pub service_port: i32,
    /// Out-of-cluster mode: the webhook's base URL (`https://127.0.0.1:8443`).
    pub webhook_url: Option<String>,
    /// The HTTPS admission address.
    pub listen: SocketAddr,
    /// The admin address.
    pub admin_listen: SocketAddr,
    /// The MutatingWebhookConfiguration's name.
    pub webhook_config_name: String,
    /// The Secret holding the certificates.
    pub secret_name: String,
    /// Certificate lifetimes.
    pub lifetimes: Lifetimes,
    /// Whether replicas elect a leader (off: this replica always writes).
    pub leader_election: bool,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// The webhook's timeoutSeconds.
    pub timeout_seconds: i32,
    /// How long the template watch may fail before the replica is not ready.
    pub template_watch_grace: Duration,
    /// A ClusterRole to own the configuration, the Secret and the Lease, so deleting it
    /// (uninstalling the chart) deletes all three.
    pub owner_cluster_role: Option<String>,
    /// `--injection-backend`.
    pub backend: injector_controller::policy_backend::Backend,
    /// `--policy-name`.
    pub policy_name: String,
    /// Development: apply the CRD at start.
    pub install_crd: bool,
    /// How long, once stopped, the webhook reports not ready while still serving.
    pub drain_period: Duration,
}

/// Why `run` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable cluster configuration.
    #[error("cannot connect to Kubernetes: {0}")]
    Connect(#[from] kube::Error),
    /// The webhook configuration options are invalid.
    #[error("invalid webhook configuration options: {0}")]
    Options(#[from] injector_controller::webhook_config::WebhookConfigError),
    /// A listener failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The owner ClusterRole does not exist.
    #[error("ClusterRole {0:?} (--owner-cluster-role) not found")]
    Owner(String),
}

/// Runs the operator until `stop` is cancelled. The controller's loops and the leader
/// election stop at once (a leader gives up leadership and releases the Lease, so another
/// replica takes over while this one drains); the webhook drains, then stops.
pub async fn run(options: RunOptions, stop: CancellationToken) -> Result<(), RunError> {
    let client = kube::Client::try_default().await?;
    if options.install_crd {
        install_crd(&client).await?;
    }
    let owner = match &options.owner_cluster_role {
        None => None,
        Some(name) => Some(owner_reference(&client, name).await?),
    };
    let operator_options = operator_options(&options, owner)?;

    let mut registry = MetricsRegistry::default();
    let controller_metrics = Arc::new(ControllerMetrics::register(&mut registry));
    let webhook = Arc::new(Webhook::new(
        Templates::with_watch_grace(options.template_watch_grace),
        CertificateStore::new(),
        registry,
        Limits {
            drain_period: options.drain_period,
            ..Limits::default()
        },
    ));

    let (leading_tx, leading) = watch::channel(!options.leader_election);
    let mut tasks = Vec::new();
    if options.leader_election {
        let config = LeaderElectionConfig {
            owner: operator_options.webhook.owner.clone(),
            ..LeaderElectionConfig::new(&options.lease_name, &options.namespace, &options.identity)
        };
        tasks.push(spawn_leader_election(
            client.clone(),
            config,
            leading_tx,
            stop.clone(),
        ));
    } else {
        controller_metrics.set_leader(true);
    }
    tasks.push(spawn_leader_gauge(
        Arc::clone(&controller_metrics),
        leading.clone(),
        stop.clone(),
    ));
    let operator = Operator::new(
        client,
        operator_options,
        Arc::clone(&webhook.templates),
        Arc::clone(&webhook.certificates),
        controller_metrics,
        leading,
    );
    tasks.push(tokio::spawn(operator.run_loops(stop.clone())));

    let (admission, admin) = bind(&options).await?;
    let result = serve_both(admission, admin, webhook, stop).await;
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    tracing::info!("stopped");
    Ok(result?)
}

/// `--install-crd`: applies the SidecarTemplate CRD (server-side, as the operator's field
/// manager).
async fn install_crd(client: &kube::Client) -> Result<(), RunError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = injector_api::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(&crd),
    )
    .await?;
    tracing::info!(%name, "CRD applied (--install-crd)");
    Ok(())
}

/// `--owner-cluster-role`: the reference that makes the ClusterRole `name` own what the
/// operator creates.
async fn owner_reference(client: &kube::Client, name: &str) -> Result<OwnerReference, RunError> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = roles
        .get_opt(name)
        .await?
        .ok_or_else(|| RunError::Owner(name.to_owned()))?;
    Ok(OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: name.to_owned(),
        uid: role.metadata.uid.unwrap_or_default(),
        block_owner_deletion: None,
        controller: None,
    })
}

/// The operator's options: where the API server reaches the webhook (a Service, or a URL
/// out of cluster, whose certificate then also covers 127.0.0.1), validated.
fn operator_options(
    options: &RunOptions,
    owner: Option<OwnerReference>,
) -> Result<OperatorOptions, RunError> {
    let (endpoint, url_mode_ip) = match &options.webhook_url {
        Some(base) => (
            Endpoint::Url { base: base.clone() },
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ),
        None => (
            Endpoint::Service {
                namespace: options.namespace.clone(),
                name: options.service_name.clone(),
                port: options.service_port,
            },
            None,
        ),
    };
    let mut webhook_options =
        WebhookConfigOptions::new(&options.webhook_config_name, endpoint, &options.namespace);
    webhook_options.timeout_seconds = options.timeout_seconds;
    webhook_options.owner = owner;
    webhook_options.validate()?;
    Ok(OperatorOptions {
        namespace: options.namespace.clone(),
        secret_name: options.secret_name.clone(),
        serving_names: ServingNames::for_service(
            &options.service_name,
            &options.namespace,
            url_mode_ip,
        ),
        lifetimes: options.lifetimes,
        webhook: webhook_options,
        backend: options.backend,
        policy_name: options.policy_name.clone(),
    })
}

/// Takes part in the election until `stop`; `leading` follows whether this replica leads.
fn spawn_leader_election(
    client: kube::Client,
    config: LeaderElectionConfig,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = leader::campaign(client, config, leading, stop).await {
            tracing::error!(%error, "leader election stopped");
        }
    })
}

/// Keeps the leader gauge equal to `leading` until `stop`.
fn spawn_leader_gauge(
    metrics: Arc<ControllerMetrics>,
    mut leading: watch::Receiver<bool>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            metrics.set_leader(*leading.borrow());
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
    })
}

/// Binds the admission and the admin listener.
async fn bind(options: &RunOptions) -> Result<(TcpListener, TcpListener), RunError> {
    let admission = injector_webhook::server::bind(options.listen).await?;
    let admin = injector_webhook::server::bind(options.admin_listen).await?;
    tracing::info!(
        admission = %admission.local_addr()?,
        admin = %admin.local_addr()?,
        namespace = %options.namespace,
        leader_election = options.leader_election,
        "serving"
    );
    Ok((admission, admin))
}
