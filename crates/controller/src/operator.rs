//! The operator's loops, wired together: template sync (every replica), serving-certificate
//! reload (every replica), and — on the leader only — certificate rotation, the webhook
//! configuration (with drift repair), template status, the Pod census, rollouts and the
//! policy backend (`policy_loop`).
//!
//! Each loop is a thin shell around a pure decision ([`crate::sync`], [`crate::certs`],
//! [`crate::world`] for the webhook configuration and the templates' statuses,
//! [`injector_core::after_admission::rollout`]); the loops feed the observations
//! (`Operator::world` gathers them) and the API calls live in small functions here that the
//! mocked-API-server tests drive directly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use injector_api::{SidecarTemplate, SidecarTemplateStatus};
use injector_core::Templates;
use injector_webhook::CertificateStore;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ListParams, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::FIELD_MANAGER;
use crate::census::{self, Counted};
use crate::certs::{self, CertificateBundle, Lifetimes, ServingNames};
use crate::entry_order::entry_order;
use crate::metrics::ControllerMetrics;
use crate::ownership;
use crate::policy_backend::Backend;
use crate::rollout::{RolloutDriver, Rollouts};
use crate::skips::{self, SkipKey, SkipLog};
use crate::status::{Counts, PolicyState};
use crate::sync::{ObservedTemplates, TemplateSync};
use crate::webhook_config::{self, WebhookConfigOptions};
use crate::world::{Configuration, Problem, TemplateStatus, World, not_served_why};

/// How often the leader re-checks what it owns even when nothing happened.
const RESYNC: Duration = Duration::from_secs(60);

/// How often the leader compares each template's status with the one it wants.
const STATUS_PERIOD: Duration = Duration::from_secs(2);

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
    /// A new CA cannot be put into the webhook configuration yet, so the Secret holding it is
    /// not written either (the API server would not trust what replicas then serve).
    #[error("the new CA cannot be published to the webhook configuration yet: {0}")]
    CaNotPublished(&'static str),
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
    /// Whether templates are also served by a MutatingAdmissionPolicy.
    pub backend: Backend,
    /// The name of that policy and of its binding.
    pub policy_name: String,
}

/// Loads the serving certificate from `secret` into the store; returns the bundle, or `None`
/// when the Secret holds no usable bundle yet (the current certificate stays in service).
/// Keys that cannot be read are logged and counted in `metrics`.
pub fn load_secret(
    secret: &Secret,
    store: &CertificateStore,
    metrics: &ControllerMetrics,
) -> Option<CertificateBundle> {
    let bundle = bundle_in(secret, metrics).bundle?;
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

/// What `secret` holds, every readable part kept. Each key that cannot be read is logged and
/// counted.
fn bundle_in(secret: &Secret, metrics: &ControllerMetrics) -> certs::SecretContent {
    let Some(data) = secret.data.as_ref() else {
        return certs::SecretContent {
            bundle: None,
            problems: Vec::new(),
        };
    };
    let content = CertificateBundle::from_secret_data(data);
    for problem in &content.problems {
        metrics.record_unreadable_secret_key(problem.key);
        tracing::warn!(key = problem.key, error = %problem.error, "a key of the certificate Secret cannot be used; the rest is kept");
    }
    content
}

/// Reads the certificate Secret, decides with [`certs::reconcile`] (off the async runtime:
/// key generation is CPU work) and writes what changed; a Secret with keys that cannot be read
/// is written again without them.
///
/// When the new bundle's CA is not the one the Secret held (a rotation, or a first CA), the
/// new caBundle goes through `publish_ca` *before* the Secret is written, so the API server
/// trusts the new CA before any replica serves a certificate signed by it. If `publish_ca`
/// fails (for instance [`OperatorError::CaNotPublished`]: the configuration cannot be written
/// yet), nothing is written and the error is returned: the rotation waits for the next try.
/// A renewal from the same CA publishes nothing: that CA is trusted already.
pub async fn rotate_certificates<F, Fut>(
    secrets: &Api<Secret>,
    options: &OperatorOptions,
    metrics: &ControllerMetrics,
    publish_ca: F,
) -> Result<CertificateBundle, OperatorError>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), OperatorError>>,
{
    let current = secrets.get_opt(&options.secret_name).await?;
    let (existing, unreadable) = match current.as_ref().map(|secret| bundle_in(secret, metrics)) {
        Some(content) => (content.bundle, !content.problems.is_empty()),
        None => (None, false),
    };
    let trusted_ca = existing.as_ref().map(|bundle| bundle.ca.cert_pem.clone());
    let names = options.serving_names.clone();
    let lifetimes = options.lifetimes;
    let reconciled = tokio::task::spawn_blocking(move || {
        certs::reconcile(existing.as_ref(), &names, &lifetimes, SystemTime::now())
    })
    .await??;
    let owner = options.webhook.owner.as_ref();
    // A Secret with keys that cannot be read is written again without them, even when the
    // certificates themselves need nothing.
    if !reconciled.changed && !unreadable {
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
    if reconciled.changed {
        tracing::info!(reasons = %reconciled.reasons.join("; "), "rotating certificates");
    } else {
        tracing::info!("rewriting the certificate Secret without the keys that cannot be read");
    }
    if trusted_ca.as_ref() != Some(&reconciled.bundle.ca.cert_pem) {
        publish_ca(reconciled.bundle.ca_bundle_pem(SystemTime::now())).await?;
    }
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

/// Whether `observed` (what a watch event showed of the configuration; `None`: deleted) is
/// another writer's work undoing `last_applied`, what this replica last applied: repairing it
/// is a fight, and each round of a fight waits longer.
pub fn overwritten(
    last_applied: Option<&MutatingWebhookConfiguration>,
    observed: Option<Option<&MutatingWebhookConfiguration>>,
) -> bool {
    match (last_applied, observed) {
        (Some(_), Some(None)) => true,
        (Some(applied), Some(Some(actual))) => webhook_config::drift(applied, actual).is_some(),
        _ => false,
    }
}

/// The backoff of every retry in the operator's loops: kube-runtime's default (as client-go's
/// reflector: 0.8 s doubling up to 30 s, plus up to as much again in jitter, back to the start
/// after two quiet minutes).
fn retry_backoff() -> DefaultBackoff {
    DefaultBackoff::default()
}

/// The next delay of `backoff` (never exhausted; [`RESYNC`] if it were).
fn next_delay(backoff: &mut DefaultBackoff) -> Duration {
    backoff.next().unwrap_or(RESYNC)
}

/// Sleeps until `at`, forever when there is no `at`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The watches and channels that wake the configuration loop.
struct ConfigurationTriggers {
    /// The configuration in the cluster, to repair it.
    drift: futures::stream::BoxStream<
        'static,
        Result<Event<MutatingWebhookConfiguration>, watcher::Error>,
    >,
    ca: watch::Receiver<Option<String>>,
    policy: watch::Receiver<Option<Arc<PolicyState>>>,
    leading: watch::Receiver<bool>,
}

/// What woke the configuration loop.
enum Trigger {
    /// Stop, or the election or the watch ended.
    Stop,
    /// Nothing to act on.
    Ignored,
    /// Something the configuration is made from, or what the cluster holds, may have changed.
    Changed,
    /// A retry's delay passed.
    RetryDue,
}

/// What the configuration loop remembers between rounds.
struct ConfigurationState {
    /// What this replica last applied (`None`: apply again).
    last_applied: Option<MutatingWebhookConfiguration>,
    /// The valid templates the configuration has no entry for, as last noted.
    left_out: BTreeSet<String>,
    /// The latest watch event not acted on yet (`Some(None)`: deleted).
    observed: Option<Option<MutatingWebhookConfiguration>>,
    retry: DefaultBackoff,
    /// When a pending retry is due; other triggers wait for it.
    retry_at: Option<Instant>,
}

impl Default for ConfigurationState {
    fn default() -> Self {
        Self {
            last_applied: None,
            left_out: BTreeSet::new(),
            observed: None,
            retry: retry_backoff(),
            retry_at: None,
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
    /// The caBundle the configuration should carry.
    ca_bundle: watch::Sender<Option<String>>,
    /// The policy's presence conditions the API server refused in the webhook entries (an
    /// expression past its cost budget, say): entries then call the webhook for every Pod,
    /// as without a policy, rather than fail every apply.
    skip_refused: watch::Sender<Option<BTreeMap<String, String>>>,
    /// The caBundle of the configuration this replica last applied: the certificate loop waits
    /// for a new CA to be there before it writes the Secret.
    applied_ca: watch::Sender<Option<String>>,
    /// The leader's latest Pod census; `None` on a replica that does not lead, or before the
    /// first count.
    census: watch::Sender<Option<Counted>>,
    /// The leader's latest rollout decisions; `None` on a replica that does not lead, or
    /// before the first round.
    rollouts: watch::Sender<Option<Arc<Rollouts>>>,
    /// Where the policy backend stands, for the status loop; `None` when it is off, or on a
    /// replica that does not lead.
    policy_state: watch::Sender<Option<Arc<PolicyState>>>,
    leading: watch::Receiver<bool>,
}

impl Operator {
    /// The operator; `leading` says whether this replica leads (always true without
    /// leader election). When its sender is dropped (the election ended), this replica no
    /// longer knows whether it leads: the leader's loops stop, and the replica keeps serving.
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
            ca_bundle: watch::channel(None).0,
            skip_refused: watch::channel(None).0,
            applied_ca: watch::channel(None).0,
            census: watch::channel(None).0,
            rollouts: watch::channel(None).0,
            policy_state: watch::channel(None).0,
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
            tokio::spawn(Arc::clone(&self).census_loop(stop.clone())),
            tokio::spawn(Arc::clone(&self).rollout_loop(stop.clone())),
            tokio::spawn(Arc::clone(&self).skip_loop(stop.clone())),
            tokio::spawn(Arc::clone(&self).policy_loop(stop.clone())),
        ];
        for task in loops {
            if let Err(error) = task.await {
                tracing::error!(%error, "an operator loop failed");
            }
        }
    }

    /// Whether this replica leads; never once the election is gone (its channel closed).
    fn is_leader(&self) -> bool {
        self.leading.has_changed().is_ok() && *self.leading.borrow()
    }

    /// Waits for leadership to change; `false` when the election is gone, and the calling
    /// leader loop must stop: nothing would tell it any more when it stops leading, and a
    /// closed channel is always "changed", so waiting on it again would spin.
    async fn leadership_changed(leading: &mut watch::Receiver<bool>, what: &str) -> bool {
        if leading.changed().await.is_ok() {
            return true;
        }
        tracing::error!(
            loop_ = what,
            "leader election ended: this replica stops writing and keeps serving"
        );
        false
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
                    if let Some(bundle) = load_secret(&secret, &self.certificates, &self.metrics) {
                        tracing::info!("serving certificate loaded from the Secret");
                        let ca = bundle.ca_bundle_pem(SystemTime::now());
                        if !ca.is_empty() {
                            self.ca_bundle.send_replace(Some(ca));
                        }
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

    /// Leader: keeps the CA and serving certificate current. A failed or waiting rotation is
    /// tried again after a growing delay.
    async fn rotate_loop(self: Arc<Self>, stop: CancellationToken) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.options.namespace);
        let mut leading = self.leading.clone();
        let mut retry = retry_backoff();
        loop {
            let mut wait = RESYNC;
            if self.is_leader() {
                let this = Arc::clone(&self);
                let publish_stop = stop.clone();
                let result =
                    rotate_certificates(&secrets, &self.options, &self.metrics, |ca| async move {
                        this.publish_ca(ca, &publish_stop).await
                    })
                    .await;
                match result {
                    Ok(bundle) => {
                        self.metrics.record_reconcile("certificates", true);
                        retry.reset();
                        let next = certs::next_check(&bundle, &self.options.lifetimes);
                        let until = next.duration_since(SystemTime::now()).unwrap_or_default();
                        wait = until.clamp(Duration::from_secs(1), RESYNC);
                    }
                    Err(OperatorError::CaNotPublished(why)) => {
                        wait = next_delay(&mut retry);
                        tracing::info!(why, retry_in = ?wait, "the new certificates wait until the webhook configuration trusts their CA");
                    }
                    Err(error) => {
                        self.metrics.record_reconcile("certificates", false);
                        wait = next_delay(&mut retry);
                        tracing::warn!(%error, retry_in = ?wait, "certificate reconcile failed; retrying");
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                changed = Self::leadership_changed(&mut leading, "certificates") => if !changed { return },
                _ = self.secret_deleted.notified() => {}
            }
        }
    }

    /// Hands the new caBundle `ca` to the configuration loop (the only writer of the webhook
    /// configuration) and waits until it has applied it. Fails, so that the Secret is not
    /// written, when the configuration cannot be written yet (the template list is not
    /// synced), when it is not applied within [`RESYNC`], or when leadership is lost or `stop`
    /// comes first.
    async fn publish_ca(&self, ca: String, stop: &CancellationToken) -> Result<(), OperatorError> {
        if !self.templates.is_synced() {
            return Err(OperatorError::CaNotPublished(
                "the template list is not synced yet, so the configuration cannot be written",
            ));
        }
        let mut applied = self.applied_ca.subscribe();
        let mut leading = self.leading.clone();
        self.ca_bundle.send_replace(Some(ca.clone()));
        // Bounded: if the caBundle is replaced meanwhile (the Secret's watch reloads the old
        // one), this CA is never applied, and the rotation starts again.
        let published = tokio::time::timeout(
            RESYNC,
            applied.wait_for(|applied| applied.as_deref() == Some(ca.as_str())),
        );
        tokio::select! {
            published = published => match published {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(_)) => Err(OperatorError::CaNotPublished("the configuration loop ended")),
                Err(_) => Err(OperatorError::CaNotPublished("the configuration was not applied with it in time")),
            },
            () = stop.cancelled() => Err(OperatorError::CaNotPublished("stopping")),
            lost = leading.wait_for(|leading| !*leading) => {
                drop(lost);
                Err(OperatorError::CaNotPublished("no longer the leader"))
            }
        }
    }

    /// What this replica observed, in one value the leader's writers derive their output from.
    /// The template list counts as synced only once the registry is (a configuration built
    /// from a partial registry would drop entries).
    fn world(&self) -> World<'_> {
        World {
            webhook: &self.options.webhook,
            backend: self.options.backend,
            templates: self
                .observed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect(),
            snapshot: self.templates.snapshot(),
            synced: self.templates.is_synced(),
            ca: self.ca_bundle.borrow().clone(),
            census: self.census.borrow().clone(),
            rollouts: self.rollouts.borrow().clone(),
            policy: self.policy_state.borrow().clone(),
            skip_refused: self.skip_refused.borrow().clone(),
        }
    }

    /// Notes in `not_served` which templates have no webhook entry, setting the metric and
    /// logging a change (their statuses say so too, derived from the same world).
    fn note_left_out(&self, not_served: &mut BTreeSet<String>, left_out: BTreeSet<String>) {
        if *not_served == left_out {
            return;
        }
        self.metrics.set_templates_not_served(left_out.len());
        if !left_out.is_empty() {
            let names: Vec<&str> = left_out.iter().map(String::as_str).collect();
            tracing::warn!(
                templates = %names.join(","),
                limit_bytes = webhook_config::MAX_CONFIGURATION_BYTES,
                "these templates have no webhook entry: the configuration would not fit with them"
            );
        }
        *not_served = left_out;
    }

    /// Leader: the webhook configuration follows the templates and the caBundle, and is
    /// restored within seconds when someone edits or deletes it. The only writer of the
    /// configuration.
    ///
    /// Retries back off: a failed apply is tried again after a growing delay, and so is each
    /// repair of a configuration another writer keeps changing (two writers fighting would
    /// otherwise write as fast as the API server answers). While a retry is pending, other
    /// triggers wait for it.
    async fn configuration_loop(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.options.webhook.name));
        let mut triggers = ConfigurationTriggers {
            drift: watcher::watcher(api.clone(), config)
                .default_backoff()
                .boxed(),
            ca: self.ca_bundle.subscribe(),
            policy: self.policy_state.subscribe(),
            leading: self.leading.clone(),
        };
        let mut state = ConfigurationState::default();
        loop {
            let due = match self
                .next_configuration_trigger(&mut triggers, &mut state, &stop)
                .await
            {
                Trigger::Stop => return,
                Trigger::Ignored => continue,
                Trigger::Changed => false,
                Trigger::RetryDue => true,
            };
            if state.retry_at.is_some() || !self.is_leader() {
                continue;
            }
            self.configuration_round(&api, &mut state, due).await;
        }
    }

    /// Waits for what wakes [`Self::configuration_loop`], and notes in `state` what it says of
    /// the configuration: leadership changes and resyncs forget what was applied, a watch event
    /// is what the cluster holds now.
    async fn next_configuration_trigger(
        &self,
        triggers: &mut ConfigurationTriggers,
        state: &mut ConfigurationState,
        stop: &CancellationToken,
    ) -> Trigger {
        tokio::select! {
            _ = stop.cancelled() => Trigger::Stop,
            _ = self.templates_changed.notified() => Trigger::Changed,
            _ = triggers.ca.changed() => Trigger::Changed,
            _ = triggers.policy.changed() => Trigger::Changed,
            changed = Self::leadership_changed(&mut triggers.leading, "webhook configuration") => {
                if !changed {
                    return Trigger::Stop;
                }
                state.last_applied = None;
                Trigger::Changed
            }
            _ = tokio::time::sleep(RESYNC) => {
                state.last_applied = None;
                Trigger::Changed
            }
            () = sleep_until_some(state.retry_at) => {
                state.retry_at = None;
                Trigger::RetryDue
            }
            event = triggers.drift.next() => match event {
                Some(Ok(Event::Apply(actual) | Event::InitApply(actual))) => {
                    state.observed = Some(Some(actual));
                    Trigger::Changed
                }
                Some(Ok(Event::Delete(_))) => {
                    state.observed = Some(None);
                    Trigger::Changed
                }
                Some(Ok(_)) => Trigger::Ignored,
                Some(Err(error)) => {
                    tracing::warn!(%error, "watching the webhook configuration failed; retrying");
                    Trigger::Ignored
                }
                None => Trigger::Stop,
            },
        }
    }

    /// One round of [`Self::configuration_loop`]: applies the configuration the templates call
    /// for when it is not the one in the cluster. A repair that fights another writer waits a
    /// growing delay first, unless that delay is what is `due` now.
    async fn configuration_round(
        &self,
        api: &Api<MutatingWebhookConfiguration>,
        state: &mut ConfigurationState,
        due: bool,
    ) {
        let Some(Configuration {
            configuration: desired,
            ca: desired_ca,
            left_out,
            skips,
        }) = self.world().configuration()
        else {
            return;
        };
        self.note_left_out(&mut state.left_out, left_out);
        let fight = overwritten(
            state.last_applied.as_ref(),
            state.observed.as_ref().map(Option::as_ref),
        );
        if fight && !due {
            let delay = next_delay(&mut state.retry);
            tracing::warn!(name = %self.options.webhook.name, retry_in = ?delay, "someone else keeps changing the webhook configuration; restoring it after a delay");
            state.retry_at = Some(Instant::now() + delay);
            return;
        }
        let reason = configuration_change(
            &desired,
            state.observed.take().as_ref().map(Option::as_ref),
            state.last_applied.as_ref(),
        );
        let Some(reason) = reason else {
            // Nothing to apply: the configuration in the cluster is the desired one, so it
            // carries the desired caBundle wherever an entry needs one (with no entry, a
            // new CA needs no apply at all, and its Secret must not wait for one).
            self.applied_ca.send_replace(Some(desired_ca));
            return;
        };
        tracing::info!(name = %self.options.webhook.name, %reason, "applying the webhook configuration");
        self.report_entry_cycles();
        let entries = desired.webhooks.as_ref().map_or(0, Vec::len);
        match apply_configuration(api, &desired).await {
            Ok(()) => {
                self.metrics.record_reconcile("webhook_configuration", true);
                tracing::info!(name = %self.options.webhook.name, entries, "webhook configuration applied");
                state.last_applied = Some(desired);
                self.applied_ca.send_replace(Some(desired_ca));
                if !fight {
                    state.retry.reset();
                }
            }
            Err(error) => self.configuration_failed(state, error, skips),
        }
    }

    /// After a failed apply of a configuration (whose entries skip the Pods the policy served
    /// by the conditions `skips`): when the API server refused those conditions, the entries
    /// go without them, at once; otherwise the apply is tried again after a growing delay.
    fn configuration_failed(
        &self,
        state: &mut ConfigurationState,
        error: OperatorError,
        skips: BTreeMap<String, String>,
    ) {
        self.metrics
            .record_reconcile("webhook_configuration", false);
        state.last_applied = None;
        match error {
            OperatorError::Kube(kube::Error::Api(response))
                if response.code == 422 && !skips.is_empty() =>
            {
                tracing::error!(message = %response.message, "the API server refused the conditions that skip Pods the policy served; the webhook entries call the webhook for every Pod they select instead");
                self.skip_refused.send_replace(Some(skips));
                state.retry_at = Some(Instant::now());
            }
            error => {
                let delay = next_delay(&mut state.retry);
                tracing::warn!(%error, retry_in = ?delay, "applying the webhook configuration failed; retrying");
                state.retry_at = Some(Instant::now() + delay);
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

    /// Leader: counts where the Pods stand with each template ([`census`]), for the status
    /// loop and the metric. The Pod and Namespace views are kept only while this replica
    /// leads.
    async fn census_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut leading = self.leading.clone();
        loop {
            if self.is_leader() {
                let mut counted: Vec<String> = Vec::new();
                let counting = census::run(
                    self.client.clone(),
                    Arc::clone(&self.templates),
                    self.options.namespace.clone(),
                    |found: Counted| {
                        let gone: Vec<String> = counted
                            .drain(..)
                            .filter(|name| !found.census.contains_key(name))
                            .collect();
                        self.metrics.set_template_pods(
                            found
                                .census
                                .iter()
                                .map(|(name, census)| (name, census.tally)),
                            gone.iter().map(String::as_str),
                        );
                        counted.extend(found.census.keys().cloned());
                        self.census.send_replace(Some(found));
                    },
                );
                let still = tokio::select! {
                    _ = stop.cancelled() => false,
                    () = counting => {
                        tracing::error!("the Pod census's watches ended");
                        false
                    }
                    changed = Self::leadership_changed(&mut leading, "census") => changed,
                };
                self.census.send_replace(None);
                self.metrics.clear_template_pods();
                if !still {
                    return;
                }
            } else {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = Self::leadership_changed(&mut leading, "census") => if !changed { return },
                }
            }
        }
    }

    /// Leader: the rollouts of templates with `updateStrategy: RollingRestart`
    /// ([`crate::rollout`]), a round every [`STATUS_PERIOD`] from the latest census, each
    /// restart announced by an event on its template.
    async fn rollout_loop(self: Arc<Self>, stop: CancellationToken) {
        let recorder = self.recorder();
        let mut leading = self.leading.clone();
        let mut driver: Option<RolloutDriver> = None;
        loop {
            if self.is_leader() {
                let counted = self.census.borrow().clone();
                if let Some(counted) = counted {
                    let active =
                        driver.get_or_insert_with(|| RolloutDriver::new(self.client.clone()));
                    let mut restarted = Vec::new();
                    // A round stops where it is when leadership is lost: a deposed leader
                    // restarts and patches nothing more.
                    let round = active.round(&counted, |template, workload| {
                        restarted.push((
                            template.name.clone(),
                            template.generation,
                            workload.clone(),
                        ));
                    });
                    let outcome = tokio::select! {
                        rollouts = round => Some(rollouts),
                        _ = stop.cancelled() => return,
                        changed = Self::leadership_changed(&mut leading, "rollouts") => {
                            if !changed {
                                return;
                            }
                            None
                        }
                    };
                    let Some(rollouts) = outcome else {
                        driver = None;
                        self.rollouts.send_replace(None);
                        continue;
                    };
                    self.rollouts.send_replace(Some(Arc::new(rollouts)));
                    for (name, generation, workload) in restarted {
                        let template = self
                            .observed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get(&name)
                            .map(|o| Arc::clone(&o.template));
                        if let Some(template) = template
                            && let Err(error) = crate::status::record_restart(
                                &recorder, &template, generation, &workload,
                            )
                            .await
                        {
                            tracing::warn!(template = %name, %error, "recording the restart's event failed");
                        }
                    }
                }
            } else if driver.take().is_some() {
                self.rollouts.send_replace(None);
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(STATUS_PERIOD) => {}
                changed = Self::leadership_changed(&mut leading, "rollouts") => if !changed { return },
            }
        }
    }

    /// Leader: tells the owners of Pods a best-effort template is missing from why it was
    /// skipped, in an Event ([`crate::skips`]), a round every [`STATUS_PERIOD`] from the
    /// latest census. A new leader starts with nothing learned (and adds to the Events the
    /// last one made, which have the same names).
    async fn skip_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut leading = self.leading.clone();
        let mut log = SkipLog::default();
        let started = Instant::now();
        // As the recorder of the other events reports this replica.
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| FIELD_MANAGER.to_owned());
        // The Pods missing best-effort templates, found again only from a new census.
        let mut found: Option<(Arc<census::Census>, Arc<skips::MissingPods>)> = None;
        loop {
            let counted = self.census.borrow().clone();
            let interrupted = match counted.filter(|_| self.is_leader()) {
                // A round stops where it is when leadership changes: a deposed leader writes
                // no more Events.
                Some(counted) => tokio::select! {
                    () = self.skip_round(&counted, &mut found, &mut log, &started, &instance) => false,
                    _ = stop.cancelled() => return,
                    changed = Self::leadership_changed(&mut leading, "skip events") => {
                        if !changed {
                            return;
                        }
                        true
                    }
                },
                None => false,
            };
            if !interrupted {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(STATUS_PERIOD) => continue,
                    changed = Self::leadership_changed(&mut leading, "skip events") => if !changed { return },
                }
            }
            // Leadership changed: what a round marked as told may not have been written, and a
            // term starts with nothing learned.
            log = SkipLog::default();
            found = None;
        }
    }

    /// One round of [`Self::skip_loop`] from `counted`: the Pods missing best-effort templates
    /// (kept in `found` until the census changes), then [`Self::tell_skips`].
    async fn skip_round(
        &self,
        counted: &Counted,
        found: &mut Option<(Arc<census::Census>, Arc<skips::MissingPods>)>,
        log: &mut SkipLog,
        started: &Instant,
        instance: &str,
    ) {
        let missing = match found {
            Some((census, missing)) if Arc::ptr_eq(census, &counted.census) => Arc::clone(missing),
            _ => match Self::missing_off_runtime(counted).await {
                Some(missing) => missing,
                None => return,
            },
        };
        *found = Some((Arc::clone(&counted.census), Arc::clone(&missing)));
        self.tell_skips(counted, &missing, log, started.elapsed(), instance)
            .await;
    }

    /// [`skips::missing`] of `counted` on a blocking thread (every Pod of the census, against
    /// each best-effort template behind); `None` when that thread failed.
    async fn missing_off_runtime(counted: &Counted) -> Option<Arc<skips::MissingPods>> {
        // Most clusters' rounds: nothing best-effort, so nothing skipped worth telling.
        if !skips::has_best_effort(&counted.snapshot) {
            return Some(Arc::default());
        }
        let snapshot = Arc::clone(&counted.snapshot);
        let census = Arc::clone(&counted.census);
        let pods = Arc::clone(&counted.pods);
        let finding = move || skips::missing(&snapshot, &census, &pods);
        match tokio::task::spawn_blocking(finding).await {
            Ok(missing) => Some(Arc::new(missing)),
            Err(error) => {
                tracing::error!(%error, "finding the Pods missing best-effort templates failed");
                None
            }
        }
    }

    /// One round of [`Self::skip_loop`]: plans again a Pod of each owner of `missing` not
    /// planned yet (at most [`skips::LOOKUPS_PER_ROUND`]), then publishes what is due.
    async fn tell_skips(
        &self,
        counted: &Counted,
        missing: &skips::MissingPods,
        log: &mut SkipLog,
        now: Duration,
        instance: &str,
    ) {
        for key in log.to_plan(missing, skips::LOOKUPS_PER_ROUND) {
            let Some(sample) = missing.get(&key).map(|m| m.sample.clone()) else {
                continue;
            };
            match self.plan_again(counted, &key, &sample).await {
                Ok(Some(reason)) => log.learn(key, reason),
                // Gone meanwhile: another of its Pods next round.
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(pod = %sample, namespace = %key.owner.namespace, %error, "reading a Pod to tell why a template was skipped failed; retrying");
                }
            }
        }
        for tell in log.due(missing, now) {
            if let Err(error) = skips::tell_skip(&self.client, &tell, instance).await {
                tracing::warn!(template = %tell.key.template, owner = %tell.key.owner, %error, "recording why a template was skipped failed; retrying");
                log.untold(&tell.key);
            }
        }
    }

    /// Plans the Pod `name` of `key`'s owner again, as it is stored, with every template in
    /// force and its namespace's labels from the census's view: why `key`'s template is
    /// skipped there (`None`: it is not); `None` when the Pod or its namespace is gone. Read
    /// with a list by name, which the census's RBAC (list Pods) allows, where a get would need
    /// more; at any resourceVersion ("0"), so the API server answers from its watch cache
    /// rather than with a quorum read of etcd for each Pod (the census that chose it is no
    /// newer).
    async fn plan_again(
        &self,
        counted: &Counted,
        key: &SkipKey,
        name: &str,
    ) -> Result<Option<Option<String>>, kube::Error> {
        let namespace = &key.owner.namespace;
        let Some(labels) = counted
            .namespaces
            .get(&ObjectRef::new(namespace))
            .map(|ns| ns.metadata.labels.clone().unwrap_or_default())
        else {
            return Ok(None);
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default()
            .match_any()
            .fields(&format!("metadata.name={name}"));
        let listed = api.list(&params).await?;
        let Some(pod) = listed.items.into_iter().next() else {
            return Ok(None);
        };
        let mut conflicts = skips::conflicts(&pod, &labels, &counted.snapshot);
        Ok(Some(conflicts.remove(&key.template)))
    }

    /// The recorder of the events the operator publishes on templates.
    fn recorder(&self) -> Recorder {
        Recorder::new(
            self.client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        )
    }

    /// Leader: each template's status, naming the entry that serves it, and an Event when one
    /// is invalid (`Invalid`, or `InvalidGenerationKept` when a required template's last valid
    /// generation stays) or has no entry (`NotServed`).
    /// After a round with a failed write, the next one waits a growing delay.
    async fn status_loop(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<SidecarTemplate> = Api::all(self.client.clone());
        let recorder = self.recorder();
        let mut events = StatusEvents::default();
        let mut leading = self.leading.clone();
        let mut retry = retry_backoff();
        loop {
            let failed = self.is_leader() && self.status_round(&api, &recorder, &mut events).await;
            let wait = if failed {
                next_delay(&mut retry).max(STATUS_PERIOD)
            } else {
                retry.reset();
                STATUS_PERIOD
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                changed = Self::leadership_changed(&mut leading, "status") => if !changed { return },
            }
        }
    }

    /// One round of [`Self::status_loop`]: every observed template's status brought to the one
    /// the world wants, and the events it calls for published; `true` when a write failed.
    async fn status_round(
        &self,
        api: &Api<SidecarTemplate>,
        recorder: &Recorder,
        events: &mut StatusEvents,
    ) -> bool {
        let statuses = self.world().statuses(&now());
        let mut failed = false;
        for wanted in &statuses {
            let template = &wanted.observed.template;
            failed |= self
                .write_wanted_status(api, &wanted.name, template, &wanted.desired)
                .await;
            failed |= events.publish(recorder, wanted).await;
        }
        failed
    }

    /// Writes `desired` as the status of the template `name` unless `template` has it already;
    /// `true` when the write failed.
    async fn write_wanted_status(
        &self,
        api: &Api<SidecarTemplate>,
        name: &str,
        template: &SidecarTemplate,
        desired: &SidecarTemplateStatus,
    ) -> bool {
        if !crate::status::needs_update(template.status.as_ref(), desired) {
            return false;
        }
        match crate::status::write_status(api, name, desired).await {
            Ok(()) => {
                self.metrics.record_reconcile("status", true);
                false
            }
            Err(error) => {
                self.metrics.record_reconcile("status", false);
                tracing::warn!(template = %name, %error, "writing template status failed");
                true
            }
        }
    }
}

/// The events the status loop published, by template name and generation: each is published
/// once for a generation.
#[derive(Default)]
struct StatusEvents {
    /// `Invalid`, `InvalidGenerationKept` or `NotServed`.
    problems: BTreeSet<(String, i64)>,
    /// `PodsStale`.
    stale: BTreeSet<(String, i64)>,
}

impl StatusEvents {
    /// Publishes the events `wanted` calls for that were not published for its template's
    /// generation yet: `PodsStale` when its Pods carry an earlier version, and a warning when
    /// it is invalid or not served; `true` when a publish failed (it is tried again next
    /// round).
    async fn publish(&mut self, recorder: &Recorder, wanted: &TemplateStatus) -> bool {
        let template = &wanted.observed.template;
        let name = &wanted.name;
        let key = (name.clone(), wanted.generation());
        let mut failed = false;
        if let Counts::Counted(tally) = wanted.counts
            && tally.stale > 0
            && !self.stale.contains(&key)
        {
            match crate::status::record_stale(recorder, template, tally).await {
                Ok(()) => {
                    self.stale.insert(key.clone());
                }
                Err(error) => {
                    failed = true;
                    tracing::warn!(template = %name, %error, "recording the template's event failed")
                }
            }
        }
        if let Some(problem) = wanted.problem()
            && !self.problems.contains(&key)
        {
            match record_problem(recorder, template, problem).await {
                Ok(()) => {
                    self.problems.insert(key);
                }
                Err(error) => {
                    failed = true;
                    tracing::warn!(template = %name, %error, "recording the template's event failed")
                }
            }
        }
        failed
    }
}

/// Publishes the warning event of `template`'s `problem`.
async fn record_problem(
    recorder: &Recorder,
    template: &SidecarTemplate,
    problem: Problem<'_>,
) -> Result<(), kube::Error> {
    match problem {
        Problem::NotServed => {
            crate::status::record_not_served(recorder, template, &not_served_why()).await
        }
        Problem::InvalidKept(errors, kept) => {
            crate::status::record_kept(recorder, template, errors, kept).await
        }
        Problem::Invalid(errors) => crate::status::record_invalid(recorder, template, errors).await,
    }
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

mod policy_loop;

#[cfg(test)]
mod tests;
