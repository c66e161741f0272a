//! The leader's configuration loop: it applies the webhook configuration the world derives
//! ([`crate::world::World::configuration`]) whenever what it is made from changes, and restores
//! it, backing off, when someone else edits or deletes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::FIELD_MANAGER;
use crate::entry_order::entry_order;
use crate::status::PolicyState;
use crate::webhook_config::{self};
use crate::world::Configuration;

use super::{Operator, OperatorError, RESYNC, next_delay, retry_backoff, sleep_until_some};

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

impl Operator {
    /// Notes in `not_served` which templates have no webhook entry, logging a change (their
    /// statuses and the metric say so too, from the status loop's world).
    fn note_left_out(&self, not_served: &mut BTreeSet<String>, left_out: BTreeSet<String>) {
        if *not_served == left_out {
            return;
        }
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
    pub(super) async fn configuration_loop(self: Arc<Self>, stop: CancellationToken) {
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
}
