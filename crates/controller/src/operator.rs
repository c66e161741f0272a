//! The operator's loops, wired together: template sync (every replica), serving-certificate
//! reload (every replica), and — on the leader only — certificate rotation, the webhook
//! configuration (with drift repair) and template status.
//!
//! Each loop is a thin shell around a pure decision ([`crate::sync`], [`crate::certs`],
//! [`crate::webhook_config`], [`crate::status`]); the API calls live in small functions here
//! that the mocked-API-server tests drive directly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use injector_api::SidecarTemplate;
use injector_core::Templates;
use injector_webhook::CertificateStore;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::FIELD_MANAGER;
use crate::certs::{self, CertificateBundle, Lifetimes, ServingNames};
use crate::entry_order::entry_order;
use crate::metrics::ControllerMetrics;
use crate::ownership;
use crate::sync::{ObservedTemplates, TemplateSync};
use crate::webhook_config::{self, WebhookConfigOptions};

/// How often the leader re-checks what it owns even when nothing happened.
const RESYNC: Duration = Duration::from_secs(60);

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Certificates could not be generated or parsed.
    #[error("certificates: {0}")]
    Certificates(#[from] certs::CertError),
    /// A blocking task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Everything the operator needs to know about where it runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// The operator's namespace (its Secret and Lease live there).
    pub namespace: String,
    /// The Secret holding the CA and the serving certificate.
    pub secret_name: String,
    /// The names the serving certificate must cover.
    pub serving_names: ServingNames,
    /// Certificate lifetimes.
    pub lifetimes: Lifetimes,
    /// The webhook configuration to write.
    pub webhook: WebhookConfigOptions,
}

/// Loads the serving certificate from `secret` into the store; returns the bundle, or `None`
/// when the Secret holds no usable bundle yet (the current certificate stays in service).
pub fn load_secret(secret: &Secret, store: &CertificateStore) -> Option<CertificateBundle> {
    let bundle = bundle_in(secret, "keeping the current certificate")?;
    match store.set_pem(
        bundle.serving.chain_pem.as_bytes(),
        bundle.serving.key_pem.as_bytes(),
    ) {
        Ok(()) => Some(bundle),
        Err(error) => {
            tracing::warn!(%error, "the serving certificate in the Secret is unusable; keeping the current one");
            None
        }
    }
}

/// The bundle `secret` holds; `None` when it holds none, or an unusable one (logged, with
/// what happens `then`).
fn bundle_in(secret: &Secret, then: &str) -> Option<CertificateBundle> {
    match CertificateBundle::from_secret_data(secret.data.as_ref()?) {
        Ok(bundle) => bundle,
        Err(error) => {
            tracing::warn!(%error, "the certificate Secret is unusable; {then}");
            None
        }
    }
}

/// Reads the certificate Secret, decides with [`certs::reconcile`] (off the async runtime:
/// key generation is CPU work) and, when something must change, publishes the new caBundle
/// through `publish_ca` *before* writing the Secret, so the API server trusts the new CA
/// before any replica serves a certificate signed by it.
pub async fn rotate_certificates<F, Fut>(
    secrets: &Api<Secret>,
    options: &OperatorOptions,
    publish_ca: F,
) -> Result<CertificateBundle, OperatorError>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), OperatorError>>,
{
    let current = secrets.get_opt(&options.secret_name).await?;
    let existing = current
        .as_ref()
        .and_then(|secret| bundle_in(secret, "replacing it"));
    let names = options.serving_names.clone();
    let lifetimes = options.lifetimes;
    let reconciled = tokio::task::spawn_blocking(move || {
        certs::reconcile(existing.as_ref(), &names, &lifetimes, SystemTime::now())
    })
    .await??;
    let owner = options.webhook.owner.as_ref();
    if !reconciled.changed {
        // A Secret written before the owner was configured (an upgrade) gets it now, so that
        // uninstalling removes it.
        if let (Some(mut secret), Some(owner)) = (current, owner)
            && ownership::add_owner(&mut secret.metadata, owner)
        {
            secrets
                .replace(&options.secret_name, &PostParams::default(), &secret)
                .await?;
        }
        return Ok(reconciled.bundle);
    }
    tracing::info!(reasons = %reconciled.reasons.join("; "), "rotating certificates");
    publish_ca(reconciled.bundle.ca_bundle_pem(SystemTime::now())).await?;
    let data = reconciled.bundle.to_secret_data();
    match current {
        Some(mut secret) => {
            secret.data = Some(data);
            if let Some(owner) = owner {
                ownership::add_owner(&mut secret.metadata, owner);
            }
            secrets
                .replace(&options.secret_name, &PostParams::default(), &secret)
                .await?;
        }
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(options.secret_name.clone()),
                    namespace: Some(options.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        webhook_config::MANAGED_BY_LABEL.to_owned(),
                        webhook_config::MANAGED_BY.to_owned(),
                    )])),
                    owner_references: owner.map(|owner| vec![owner.clone()]),
                    ..ObjectMeta::default()
                },
                type_: Some("kubernetes.io/tls".to_owned()),
                data: Some(data),
                ..Secret::default()
            };
            secrets.create(&PostParams::default(), &secret).await?;
        }
    }
    Ok(reconciled.bundle)
}

/// Applies the desired webhook configuration with server-side apply (forcing ownership of
/// the fields it sets, so a hand edit is undone).
pub async fn apply_configuration(
    configurations: &Api<MutatingWebhookConfiguration>,
    desired: &MutatingWebhookConfiguration,
) -> Result<(), OperatorError> {
    let name = desired.metadata.name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    configurations
        .patch(&name, &params, &kube::api::Patch::Apply(desired))
        .await?;
    Ok(())
}

/// Why the webhook configuration must be applied now, or `None` when it is as it should be.
///
/// `observed` is what a watch event showed (`Some(None)`: it was deleted), `None` when the
/// trigger was not a watch event (templates or the caBundle changed, leadership, resync);
/// `last_applied` is what this replica last applied (`None` after a resync, to apply again).
pub fn configuration_change(
    desired: &MutatingWebhookConfiguration,
    observed: Option<Option<&MutatingWebhookConfiguration>>,
    last_applied: Option<&MutatingWebhookConfiguration>,
) -> Option<String> {
    match observed {
        Some(None) => Some("it was deleted; restoring it".to_owned()),
        Some(Some(actual)) => webhook_config::drift(desired, actual)
            .map(|what| format!("someone else changed it ({what}); restoring it")),
        None if last_applied == Some(desired) => None,
        None => Some("the templates or the caBundle changed".to_owned()),
    }
}

/// Feeds `sync` from the template watch that `start_watch` starts, until `stop` is cancelled
/// or the watch ends; `report` hears of every event (whether it changed the registry) and
/// every error.
///
/// A failing watch is recorded in `templates`, whose readiness turns false once it has failed
/// for longer than its grace period; a complete list ends the failures. The watcher retries on
/// its own, but when it recovers by resuming its watch nothing tells us so; so half a grace
/// period into a run of failures the watch is started again, and its fresh list (as soon as
/// the API server answers) ends the run, before the replica turns not ready when the failure
/// was a blip.
pub async fn watch_templates<W, S>(
    mut start_watch: W,
    mut sync: TemplateSync,
    templates: &Templates,
    stop: CancellationToken,
    mut report: impl FnMut(&TemplateSync, Result<bool, &watcher::Error>),
) where
    W: FnMut() -> S,
    S: futures::Stream<Item = Result<Event<SidecarTemplate>, watcher::Error>> + Unpin,
{
    let mut events = start_watch();
    let mut restart_at: Option<Instant> = None;
    loop {
        let restart = async {
            match restart_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            _ = restart => {
                restart_at = None;
                tracing::warn!("the SidecarTemplate watch keeps failing; starting it again to list every template");
                events = start_watch();
                continue;
            }
            event = events.next() => event,
        };
        match event {
            Some(Ok(event)) => {
                if matches!(event, Event::InitDone) {
                    restart_at = None;
                }
                let changed = sync.handle(event);
                report(&sync, Ok(changed));
            }
            Some(Err(error)) => {
                let now = Instant::now();
                if templates.watch_failed(now.into_std()) {
                    restart_at = Some(now + templates.watch_grace() / 2);
                }
                report(&sync, Err(&error));
            }
            None => return,
        }
    }
}

/// The shared state of the operator's loops.
pub struct Operator {
    client: Client,
    options: OperatorOptions,
    templates: Arc<Templates>,
    certificates: Arc<CertificateStore>,
    metrics: Arc<ControllerMetrics>,
    observed: ObservedTemplates,
    templates_changed: Notify,
    /// Wakes the certificate loop when the Secret is deleted.
    secret_deleted: Notify,
    /// The configuration this replica last applied, shared by the certificate loop (which
    /// applies a new caBundle itself, before writing the Secret) and the configuration loop,
    /// so the loop does not apply it again.
    last_applied: Mutex<Option<MutatingWebhookConfiguration>>,
    ca_bundle: watch::Sender<Option<String>>,
    leading: watch::Receiver<bool>,
}

impl Operator {
    /// The operator; `leading` says whether this replica leads (always true without
    /// leader election).
    pub fn new(
        client: Client,
        options: OperatorOptions,
        templates: Arc<Templates>,
        certificates: Arc<CertificateStore>,
        metrics: Arc<ControllerMetrics>,
        leading: watch::Receiver<bool>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            options,
            templates,
            certificates,
            metrics,
            observed: ObservedTemplates::default(),
            templates_changed: Notify::new(),
            secret_deleted: Notify::new(),
            last_applied: Mutex::new(None),
            ca_bundle: watch::channel(None).0,
            leading,
        })
    }

    /// Runs every loop until `stop` is cancelled.
    pub async fn run_loops(self: Arc<Self>, stop: CancellationToken) {
        let loops = [
            tokio::spawn(Arc::clone(&self).sync_templates(stop.clone())),
            tokio::spawn(Arc::clone(&self).watch_certificate(stop.clone())),
            tokio::spawn(Arc::clone(&self).rotate_loop(stop.clone())),
            tokio::spawn(Arc::clone(&self).configuration_loop(stop.clone())),
            tokio::spawn(Arc::clone(&self).status_loop(stop.clone())),
        ];
        for task in loops {
            if let Err(error) = task.await {
                tracing::error!(%error, "an operator loop failed");
            }
        }
    }

    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Every replica: SidecarTemplates into the registry the webhook serves from.
    async fn sync_templates(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<SidecarTemplate> = Api::all(self.client.clone());
        let sync = TemplateSync::new(Arc::clone(&self.templates), Arc::clone(&self.observed));
        let start_watch = || {
            watcher::watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .boxed()
        };
        watch_templates(start_watch, sync, &self.templates, stop, |sync, outcome| {
            self.metrics.set_templates(sync.counts());
            match outcome {
                Ok(changed) => {
                    if changed {
                        self.templates_changed.notify_one();
                    }
                    // Status may need writing even when the registry did not change (an
                    // invalid template, a new generation of one).
                    self.metrics.record_reconcile("templates", true);
                }
                Err(error) => {
                    self.metrics.record_reconcile("templates", false);
                    tracing::warn!(%error, "watching SidecarTemplates failed; retrying");
                }
            }
        })
        .await;
    }

    /// Every replica: the serving certificate from the Secret, reloaded on every change.
    async fn watch_certificate(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.options.namespace);
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.options.secret_name));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = events.try_next() => event,
            };
            match event {
                Ok(Some(Event::Apply(secret) | Event::InitApply(secret))) => {
                    if let Some(bundle) = load_secret(&secret, &self.certificates) {
                        tracing::info!("serving certificate loaded from the Secret");
                        self.ca_bundle
                            .send_replace(Some(bundle.ca_bundle_pem(SystemTime::now())));
                        if let Ok(expiry) = bundle.serving_expiry() {
                            self.metrics.set_certificate_expiry(expiry);
                        }
                    }
                }
                // Replicas keep serving the certificate they hold; the leader makes a new one
                // now rather than at its next periodic check.
                Ok(Some(Event::Delete(_))) => {
                    tracing::warn!("the certificate Secret was deleted; the leader regenerates it");
                    self.secret_deleted.notify_one();
                }
                Ok(Some(Event::Init | Event::InitDone)) => {}
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(%error, "watching the certificate Secret failed; retrying")
                }
            }
        }
    }

    /// Leader: keeps the CA and serving certificate current.
    async fn rotate_loop(self: Arc<Self>, stop: CancellationToken) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.options.namespace);
        let mut leading = self.leading.clone();
        loop {
            let mut wait = Duration::from_secs(5);
            if self.is_leader() {
                let this = Arc::clone(&self);
                let result = rotate_certificates(&secrets, &self.options, |ca| async move {
                    this.ca_bundle.send_replace(Some(ca));
                    this.apply_current_configuration().await
                })
                .await;
                match result {
                    Ok(bundle) => {
                        self.metrics.record_reconcile("certificates", true);
                        let next = certs::next_check(&bundle, &self.options.lifetimes);
                        let until = next.duration_since(SystemTime::now()).unwrap_or_default();
                        wait = until.clamp(Duration::from_secs(1), RESYNC);
                    }
                    Err(error) => {
                        self.metrics.record_reconcile("certificates", false);
                        tracing::warn!(%error, "certificate reconcile failed; retrying");
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = leading.changed() => {}
                _ = self.secret_deleted.notified() => {}
            }
        }
    }

    /// The configuration the templates and the caBundle call for; `None` before there is a
    /// caBundle, or while the registry is not synced (an entry list built from a partial
    /// registry would drop entries).
    fn desired_configuration(&self) -> Option<MutatingWebhookConfiguration> {
        let ca = self.ca_bundle.borrow().clone()?;
        if !self.templates.is_synced() {
            return None;
        }
        Some(webhook_config::desired_configuration(
            &self.templates.snapshot(),
            &self.options.webhook,
            ca.as_bytes(),
        ))
    }

    /// Applies `desired` and remembers it as the last applied.
    async fn apply_desired(
        &self,
        desired: MutatingWebhookConfiguration,
    ) -> Result<(), OperatorError> {
        apply_configuration(&Api::all(self.client.clone()), &desired).await?;
        self.set_last_applied(Some(desired));
        Ok(())
    }

    fn set_last_applied(&self, configuration: Option<MutatingWebhookConfiguration>) {
        *self
            .last_applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = configuration;
    }

    async fn apply_current_configuration(&self) -> Result<(), OperatorError> {
        match self.desired_configuration() {
            Some(desired) => self.apply_desired(desired).await,
            None => Ok(()),
        }
    }

    /// Leader: the webhook configuration follows the templates and the caBundle, and is
    /// restored within seconds when someone edits or deletes it.
    async fn configuration_loop(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.options.webhook.name));
        let mut drift = watcher::watcher(api, config).default_backoff().boxed();
        let mut ca = self.ca_bundle.subscribe();
        let mut leading = self.leading.clone();
        loop {
            let mut observed: Option<Option<MutatingWebhookConfiguration>> = None;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.templates_changed.notified() => {}
                _ = ca.changed() => {}
                _ = leading.changed() => self.set_last_applied(None),
                _ = tokio::time::sleep(RESYNC) => self.set_last_applied(None),
                event = drift.next() => match event {
                    Some(Ok(Event::Apply(actual) | Event::InitApply(actual))) => observed = Some(Some(actual)),
                    Some(Ok(Event::Delete(_))) => observed = Some(None),
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "watching the webhook configuration failed; retrying");
                        continue;
                    }
                    None => return,
                },
            }
            if !self.is_leader() {
                continue;
            }
            let Some(desired) = self.desired_configuration() else {
                continue;
            };
            let reason = configuration_change(
                &desired,
                observed.as_ref().map(Option::as_ref),
                self.last_applied
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref(),
            );
            let Some(reason) = reason else {
                continue;
            };
            tracing::info!(name = %self.options.webhook.name, %reason, "applying the webhook configuration");
            self.report_entry_cycles();
            let entries = desired.webhooks.as_ref().map_or(0, Vec::len);
            match self.apply_desired(desired).await {
                Ok(()) => {
                    self.metrics.record_reconcile("webhook_configuration", true);
                    tracing::info!(name = %self.options.webhook.name, entries, "webhook configuration applied");
                }
                Err(error) => {
                    self.metrics
                        .record_reconcile("webhook_configuration", false);
                    tracing::warn!(%error, "applying the webhook configuration failed; retrying");
                    self.set_last_applied(None);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    self.templates_changed.notify_one();
                }
            }
        }
    }

    /// Logs every dependency cycle among the templates' groups (their entries cannot all
    /// come after the groups whose labels they select on) and sets the metric.
    fn report_entry_cycles(&self) {
        let snapshot = self.templates.snapshot();
        let cycles = entry_order(&snapshot).cycles;
        self.metrics.set_entry_cycles(cycles.len());
        for templates in cycles {
            tracing::warn!(
                templates = %templates.join(","),
                "these templates select on labels each other adds, in a cycle: their webhook entries are ordered by priority, and a Pod may miss a template whose entry comes before the label it selects on is added"
            );
        }
    }

    /// Leader: each template's status, and an Event when one is invalid (`Invalid`, or
    /// `InvalidGenerationKept` when a required template's last valid generation stays).
    async fn status_loop(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<SidecarTemplate> = Api::all(self.client.clone());
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        let mut evented: BTreeSet<(String, i64)> = BTreeSet::new();
        let mut leading = self.leading.clone();
        loop {
            if self.is_leader() {
                let work: Vec<_> = self
                    .observed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .values()
                    .cloned()
                    .collect();
                for observed in work {
                    let template = &observed.template;
                    let name = template.metadata.name.clone().unwrap_or_default();
                    let outcome = observed.outcome.as_ref().map(|_| ()).map_err(Clone::clone);
                    let desired = crate::status::desired_status_kept(
                        template,
                        &observed.outcome,
                        observed.kept.as_ref(),
                        now(),
                    );
                    if crate::status::needs_update(template.status.as_ref(), &desired) {
                        match crate::status::write_status(&api, &name, &desired).await {
                            Ok(()) => self.metrics.record_reconcile("status", true),
                            Err(error) => {
                                self.metrics.record_reconcile("status", false);
                                tracing::warn!(template = %name, %error, "writing template status failed");
                            }
                        }
                    }
                    if let Err(errors) = outcome {
                        let key = (
                            name.clone(),
                            template.metadata.generation.unwrap_or_default(),
                        );
                        if !evented.contains(&key) {
                            let published = match &observed.kept {
                                Some(kept) => {
                                    crate::status::record_kept(&recorder, template, &errors, kept)
                                        .await
                                }
                                None => {
                                    crate::status::record_invalid(&recorder, template, &errors)
                                        .await
                                }
                            };
                            match published {
                                Ok(()) => {
                                    evented.insert(key);
                                }
                                Err(error) => {
                                    tracing::warn!(template = %name, %error, "recording the Invalid event failed")
                                }
                            }
                        }
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = leading.changed() => {}
            }
        }
    }
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}
