//! The webhook's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::review::Outcome;

/// Labels of an admission request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The selector group (`all` for `/mutate`, `none` for requests that named none).
    pub group: String,
    /// How the request was answered.
    pub outcome: String,
}

/// Labels naming a template.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateLabels {
    /// The template's name.
    pub template: String,
}

/// Labels naming a selector group.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// The selector group.
    pub group: String,
}

/// Labels of `sidecar_injector_build_info`: what is running, for dashboards and alerts that
/// compare replicas or follow an upgrade.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version (the workspace's, one for every binary).
    pub version: String,
    /// The source revision the binary was built from: `SIDECAR_INJECTOR_REVISION` in the
    /// build's environment, which the release build (`build/release.sh`: `just release`,
    /// `just image`, `just dist`) sets to the commit (`-dirty` when files differ from it);
    /// `unknown` when it was not set, as in an ordinary `cargo build` (and in the release
    /// build's instrumented binaries, so that its profile is not recorded again for every
    /// commit).
    pub revision: String,
}

impl BuildLabels {
    /// This binary's.
    pub fn current() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            revision: option_env!("SIDECAR_INJECTOR_REVISION")
                .filter(|r| !r.is_empty())
                .unwrap_or("unknown")
                .to_owned(),
        }
    }
}

/// Every webhook metric, registered in a shared registry.
#[derive(Debug)]
pub struct WebhookMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<GroupLabels, Histogram>,
    injections: Family<TemplateLabels, Counter>,
    denials: Family<TemplateLabels, Counter>,
    warnings: Counter,
    body_bytes: Histogram,
    handshake_failures: Counter,
    busy: Counter,
}

impl WebhookMetrics {
    /// Creates the metrics and registers them (prefix `sidecar_injector_`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            // 100 µs to ~1.6 s.
            duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.0, 15))
            }),
            injections: Family::default(),
            denials: Family::default(),
            warnings: Counter::default(),
            // 1 KiB to 4 MiB.
            body_bytes: Histogram::new(exponential_buckets(1024.0, 2.0, 13)),
            handshake_failures: Counter::default(),
            busy: Counter::default(),
        };
        let registry = registry.sub_registry_with_prefix("sidecar_injector");
        // Registered here because `serve` and `run` both register the webhook's metrics.
        registry.register(
            "build",
            "The running build: always 1, its version and revision as labels",
            Info::new(BuildLabels::current()),
        );
        registry.register(
            "admission_requests",
            "Admission requests, by selector group and outcome",
            metrics.requests.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request, from the first byte of the body to the response",
            metrics.duration.clone(),
        );
        registry.register(
            "injections",
            "Pods a template was applied to",
            metrics.injections.clone(),
        );
        registry.register(
            "denials",
            "Pods denied because a required template could not be applied",
            metrics.denials.clone(),
        );
        registry.register(
            "admission_warnings",
            "Warnings returned to clients",
            metrics.warnings.clone(),
        );
        registry.register(
            "admission_request_body_bytes",
            "Size of admission request bodies",
            metrics.body_bytes.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "Connections that failed or timed out in the TLS handshake",
            metrics.handshake_failures.clone(),
        );
        registry.register(
            "admission_busy",
            "Requests answered 503 because the memory budget for requests in flight stayed taken",
            metrics.busy.clone(),
        );
        metrics
    }

    /// Records one answered request.
    pub fn record(&self, group: &str, outcome: Outcome, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                group: group.to_owned(),
                outcome: outcome.as_str().to_owned(),
            })
            .inc();
        self.duration
            .get_or_create(&GroupLabels {
                group: group.to_owned(),
            })
            .observe(seconds);
    }

    /// Records the templates applied, the denials and the warnings of one decision.
    pub fn record_decision(
        &self,
        applied: &[injector_core::Applied],
        denied_by: &[String],
        warnings: usize,
    ) {
        for a in applied {
            self.injections
                .get_or_create(&TemplateLabels {
                    template: a.name.clone(),
                })
                .inc();
        }
        for template in denied_by {
            self.denials
                .get_or_create(&TemplateLabels {
                    template: template.clone(),
                })
                .inc();
        }
        self.warnings.inc_by(warnings as u64);
    }

    /// Records a request body's size.
    pub fn record_body(&self, bytes: usize) {
        self.body_bytes.observe(bytes as f64);
    }

    /// Records a failed TLS handshake.
    pub fn record_handshake_failure(&self) {
        self.handshake_failures.inc();
    }

    /// Records a request turned away because the memory budget stayed taken.
    pub fn record_busy(&self) {
        self.busy.inc();
    }
}

#[cfg(test)]
mod tests;
