//! `sidecar-injector serve`: the webhook from template files, with no cluster.
//!
//! For local testing, benchmarking, and setups that keep templates in git. Answers
//! `POST /mutate` from every template whose pod selector matches (the namespace selection is
//! the API server's, through the webhook configuration's namespaceSelector) and
//! `POST /mutate/<group>` from one selector group.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use injector_core::Registry;
use injector_core::Templates;
use injector_webhook::{CertificateStore, Limits, Webhook, serve_both};
use prometheus_client::registry::Registry as MetricsRegistry;
use tokio_util::sync::CancellationToken;

use crate::templates::{TemplateFileError, load_templates};

/// What `serve` needs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Template files or directories.
    pub template_paths: Vec<PathBuf>,
    /// PEM certificate chain.
    pub tls_cert: PathBuf,
    /// PEM private key.
    pub tls_key: PathBuf,
    /// The HTTPS admission address.
    pub listen: SocketAddr,
    /// The plain-HTTP admin address (`/healthz`, `/readyz`, `/metrics`).
    pub admin_listen: SocketAddr,
    /// How often the certificate files are checked for changes.
    pub cert_reload_interval: Duration,
    /// How long, once stopped, the webhook reports not ready while still serving.
    pub drain_period: Duration,
}

/// Why `serve` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The templates cannot be loaded.
    #[error(transparent)]
    Templates(#[from] TemplateFileError),
    /// The certificate cannot be loaded.
    #[error("TLS: {0}")]
    Tls(#[from] injector_webhook::tls::TlsError),
    /// A listener cannot be opened or failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The addresses actually bound (useful with port 0).
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// The admission server.
    pub admission: SocketAddr,
    /// The admin server.
    pub admin: SocketAddr,
}

/// Loads everything, binds both servers, reports the bound addresses through `on_bound`, and
/// serves until `stop` is cancelled; then drains (not ready, still serving) for the drain
/// period, stops accepting, and lets the requests in flight finish before it returns.
pub async fn serve(
    options: ServeOptions,
    stop: CancellationToken,
    on_bound: impl FnOnce(Bound),
) -> Result<(), ServeError> {
    let mut registry = Registry::new();
    let templates = load_templates(&options.template_paths)?;
    let count = templates.len();
    registry.reset(templates);
    let snapshot = registry.snapshot();
    for group in snapshot.groups() {
        let names: Vec<&str> = group.templates.iter().map(|t| t.name.as_str()).collect();
        tracing::info!(path = %group.id.path(), templates = %names.join(","), "selector group");
    }

    let shared = Templates::new();
    shared.publish(snapshot);
    shared.mark_synced();

    let certificates = CertificateStore::new();
    let watcher = injector_webhook::tls::load_and_watch_files(
        Arc::clone(&certificates),
        options.tls_cert.clone(),
        options.tls_key.clone(),
        options.cert_reload_interval,
        stop.clone(),
    )
    .await?;

    let webhook = Arc::new(Webhook::new(
        shared,
        certificates,
        MetricsRegistry::default(),
        Limits {
            drain_period: options.drain_period,
            ..Limits::default()
        },
    ));

    let admission = injector_webhook::server::bind(options.listen).await?;
    let admin = injector_webhook::server::bind(options.admin_listen).await?;
    let bound = Bound {
        admission: admission.local_addr()?,
        admin: admin.local_addr()?,
    };
    tracing::info!(admission = %bound.admission, admin = %bound.admin, templates = count, "serving");
    on_bound(bound);

    let result = serve_both(admission, admin, webhook, stop).await;
    let _ = watcher.await;
    tracing::info!("stopped");
    Ok(result?)
}
