//! The controller's Prometheus metrics, registered beside the webhook's.

use std::sync::atomic::AtomicI64;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use injector_core::after_admission::lifecycle::Tally;

use crate::sync::TemplateCounts;

/// Labels of a reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// What was reconciled: templates, certificates, webhook_configuration, status.
    pub kind: String,
}

/// Labels of the template gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateStateLabels {
    /// `valid` or `invalid`.
    pub state: String,
}

/// Labels of a certificate Secret key.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SecretKeyLabels {
    /// The Secret key: `ca.crt`, `ca.key`, `ca-previous.crt`, `tls.crt` or `tls.key`.
    pub key: String,
}

/// Labels of the Pod census gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplatePodLabels {
    /// The template's name.
    pub template: String,
    /// `current`, `stale` or `missing`.
    pub state: String,
}

/// The states the Pod census gauge has a series for.
const POD_STATES: [&str; 3] = ["current", "stale", "missing"];

/// Every controller metric.
#[derive(Debug)]
pub struct ControllerMetrics {
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ReconcileLabels, Counter>,
    templates: Family<TemplateStateLabels, Gauge>,
    certificate_expiry: Gauge<i64, AtomicI64>,
    leader: Gauge,
    entry_cycles: Gauge,
    unreadable_secret_keys: Family<SecretKeyLabels, Counter>,
    templates_not_served: Gauge,
    template_pods: Family<TemplatePodLabels, Gauge>,
}

impl ControllerMetrics {
    /// Creates the metrics and registers them (prefix `sidecar_injector_`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            templates: Family::default(),
            certificate_expiry: Gauge::default(),
            leader: Gauge::default(),
            entry_cycles: Gauge::default(),
            unreadable_secret_keys: Family::default(),
            templates_not_served: Gauge::default(),
            template_pods: Family::default(),
        };
        let registry = registry.sub_registry_with_prefix("sidecar_injector");
        registry.register(
            "reconciles",
            "Reconciles, by kind",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by kind",
            metrics.errors.clone(),
        );
        registry.register(
            "templates",
            "SidecarTemplates known to this replica, valid (in use) or invalid",
            metrics.templates.clone(),
        );
        registry.register(
            "serving_certificate_expiry_timestamp_seconds",
            "When the serving certificate this replica serves expires (Unix time)",
            metrics.certificate_expiry.clone(),
        );
        registry.register(
            "leader",
            "1 when this replica is the leader (writes configuration, Secret and status)",
            metrics.leader.clone(),
        );
        registry.register(
            "webhook_entry_cycles",
            "Cycles among templates that select on labels other templates add: their entries cannot all be ordered after the labels they need (set by the leader)",
            metrics.entry_cycles.clone(),
        );
        registry.register(
            "certificate_secret_unreadable_keys",
            "Reads of the certificate Secret that found this key missing or unreadable (the rest of the Secret is kept)",
            metrics.unreadable_secret_keys.clone(),
        );
        registry.register(
            "templates_not_served",
            "Valid templates left without a webhook entry because the configuration would not fit with it (set by the leader)",
            metrics.templates_not_served.clone(),
        );
        registry.register(
            "template_pods",
            "Pods by template and where they stand: current (carry what it injects now), stale (an earlier version), missing (selected now, not carrying it); set by the leader",
            metrics.template_pods.clone(),
        );
        metrics
    }

    /// Sets the Pod census of every template in `tallies`, and removes the series of
    /// `gone`, templates counted before and no longer.
    pub fn set_template_pods<'a>(
        &self,
        tallies: impl IntoIterator<Item = (&'a String, Tally)>,
        gone: impl IntoIterator<Item = &'a str>,
    ) {
        for (template, tally) in tallies {
            for (state, count) in
                POD_STATES
                    .into_iter()
                    .zip([tally.current, tally.stale, tally.missing])
            {
                self.template_pods
                    .get_or_create(&TemplatePodLabels {
                        template: template.clone(),
                        state: state.to_owned(),
                    })
                    .set(i64::from(count));
            }
        }
        for template in gone {
            for state in POD_STATES {
                self.template_pods.remove(&TemplatePodLabels {
                    template: template.to_owned(),
                    state: state.to_owned(),
                });
            }
        }
    }

    /// Removes every Pod census series (a replica that stops leading no longer counts).
    pub fn clear_template_pods(&self) {
        self.template_pods.clear();
    }

    /// Sets how many valid templates have no webhook entry.
    pub fn set_templates_not_served(&self, count: usize) {
        self.templates_not_served
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Counts one read of the certificate Secret that found `key` missing or unreadable.
    pub fn record_unreadable_secret_key(&self, key: &str) {
        self.unreadable_secret_keys
            .get_or_create(&SecretKeyLabels {
                key: key.to_owned(),
            })
            .inc();
    }

    /// Sets how many dependency cycles the webhook configuration's entry order met.
    pub fn set_entry_cycles(&self, cycles: usize) {
        self.entry_cycles
            .set(i64::try_from(cycles).unwrap_or(i64::MAX));
    }

    /// Counts one reconcile of `kind`, and whether it failed.
    pub fn record_reconcile(&self, kind: &str, ok: bool) {
        let labels = ReconcileLabels {
            kind: kind.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        if !ok {
            self.errors.get_or_create(&labels).inc();
        }
    }

    /// Sets the template counts.
    pub fn set_templates(&self, counts: TemplateCounts) {
        for (state, count) in [("valid", counts.valid), ("invalid", counts.invalid)] {
            self.templates
                .get_or_create(&TemplateStateLabels {
                    state: state.to_owned(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Sets the serving certificate's expiry.
    pub fn set_certificate_expiry(&self, expiry: SystemTime) {
        let seconds = expiry.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.certificate_expiry
            .set(i64::try_from(seconds).unwrap_or(i64::MAX));
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

#[cfg(test)]
mod tests;
