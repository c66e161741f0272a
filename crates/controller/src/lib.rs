//! The controller: keeps the webhook's template registry in step with the cluster, writes
//! template status, owns the operator's MutatingWebhookConfiguration and its caBundle, keeps
//! the CA and serving certificate in a Secret and rotates them, and elects a leader so only
//! one replica writes. The leader also counts where running Pods stand with each template
//! ([`census`]), restarts or updates the workloads behind stale and missing Pods ([`rollout`]),
//! tells the owners of Pods a best-effort template was skipped for why, in an Event
//! ([`skips`]), and compiles, proves and applies the admission policies ([`policy_backend`]).
//!
//! Pure decisions live in their own modules ([`certs`], [`webhook_config`], [`entry_order`],
//! [`sync`]), or beside the few functions that publish them ([`status`]: `write_status` and
//! the events on templates; [`skips`]: `tell_skip`), and are tested without a cluster; the
//! modules that talk to the API server are thin around them, wired together in [`operator`].

/// The field manager of every write the operator makes (server-side apply and updates).
pub const FIELD_MANAGER: &str = "sidecar-injector";

pub mod census;
pub mod certs;
pub mod entry_order;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod ownership;
pub mod policy_backend;
pub mod rollout;
pub mod skips;
pub mod status;
pub mod sync;
pub mod webhook_config;
pub mod world;
