//! The operator's loops, wired together: template sync (every replica, here), serving-certificate
//! reload (every replica) and — on the leader only — certificate rotation (`certificates`), the
//! webhook configuration with drift repair (`configuration`), template status (`status_loop`),
//! the Pod census, rollouts and skip events (`census_loops`), and the policy backend
//! (`policy_loop`).
//!
//! Each loop is a thin shell around a pure decision ([`crate::sync`], [`crate::certs`],
//! [`crate::world`] for the webhook configuration and the templates' statuses,
//! [`injector_core::after_admission::rollout`]); the loops feed the observations
//! (`Operator::world` gathers them) and the API calls live in small functions here that the
//! mocked-API-server tests drive directly.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use injector_api::SidecarTemplate;
use injector_core::Templates;
use injector_webhook::CertificateStore;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::FIELD_MANAGER;
use crate::census::Counted;
use crate::certs::{self, Lifetimes, ServingNames};
use crate::metrics::ControllerMetrics;
use crate::policy_backend::Backend;
use crate::rollout::Rollouts;
use crate::status::PolicyState;
use crate::sync::{ObservedTemplates, TemplateSync};
use crate::webhook_config::WebhookConfigOptions;
use crate::world::World;

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
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

mod census_loops;
mod certificates;
mod configuration;
mod policy_loop;
mod status_loop;

pub use certificates::{load_secret, rotate_certificates};
pub use configuration::{apply_configuration, configuration_change, overwritten};

#[cfg(test)]
mod tests;
