//! The operator's certificate loops: every replica reloads the serving certificate from its
//! Secret; the leader rotates it (`certs::reconcile`), publishing a new CA to the webhook
//! configuration before it writes the Secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use injector_webhook::CertificateStore;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use crate::certs::{self, CertificateBundle};
use crate::metrics::ControllerMetrics;
use crate::ownership;
use crate::webhook_config::{self};

use super::{Operator, OperatorError, OperatorOptions, RESYNC, next_delay, retry_backoff};

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

impl Operator {
    /// Every replica: the serving certificate from the Secret, reloaded on every change.
    pub(super) async fn watch_certificate(self: Arc<Self>, stop: CancellationToken) {
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
    pub(super) async fn rotate_loop(self: Arc<Self>, stop: CancellationToken) {
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
}
