//! What one client can make the webhook server do, and how long it takes to stop: read by
//! the transport (body size, timeouts, connections) and by the server (memory budget, drain,
//! shutdown).

use std::time::Duration;

/// Bounds on what one client can make the server do, and on shutdown.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body accepted (larger: 413).
    pub max_body_bytes: usize,
    /// Time allowed to send the request headers.
    pub header_read_timeout: Duration,
    /// Time allowed to send the body and get the answer (exceeded: 408).
    pub request_timeout: Duration,
    /// Time allowed for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// How long, once asked to stop, the server reports not ready and still serves, so that
    /// the Service's endpoints drop it before it stops accepting.
    pub drain_period: Duration,
    /// How long shutdown waits for requests in flight once it stops accepting.
    pub shutdown_grace: Duration,
    /// Memory for the requests in flight: each reserves its body and the allowance to decode
    /// its Pod before its body is read, and waits (at most `request_timeout`, then 503) while
    /// the budget is taken. Also the largest reservation, so one request of the largest body
    /// always fits.
    pub memory_budget_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 3 * 1024 * 1024,
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            max_connections: 1024,
            drain_period: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(25),
            memory_budget_bytes: 24 * 1024 * 1024,
        }
    }
}
