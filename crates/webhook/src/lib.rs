//! The admission webhook: an HTTPS server (hyper + rustls) that answers AdmissionReviews for
//! Pods from an in-memory template snapshot, never calling the API server on the hot path.
//!
//! * [`review`] decides one AdmissionReview (pure: bytes in, bytes out);
//! * [`tls`] holds the serving certificate behind an atomic pointer and reloads it;
//! * [`server`] runs the admission and admin servers with their limits and graceful shutdown,
//!   and reports ready only while the templates can be trusted
//!   ([`injector_core::registry::freshness`]);
//! * [`limits`] bound what one client can make the server do, and its shutdown;
//! * [`transport`] is the HTTPS transport the admission server runs on (TLS, HTTP/1.1, limits);
//! * [`metrics`] are the Prometheus metrics.

pub mod limits;
pub mod metrics;
pub mod review;
pub mod server;
pub mod tls;
pub mod transport;

pub use limits::Limits;
pub use review::{Decision, Outcome, Route, Target, decide};
pub use server::{Webhook, serve_admin, serve_admission, serve_both};
pub use tls::CertificateStore;
