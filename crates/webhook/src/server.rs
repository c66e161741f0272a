//! The HTTPS admission server and the plain-HTTP admin server (health, readiness, metrics).
//!
//! Bounded everywhere: request body size, JSON depth (serde_json stops at 128 levels), time to
//! read the headers, time to read the body, TLS handshake time and concurrent connections.
//!
//! Shutdown ([`serve_both`]) first drains: the replica reports not ready and keeps serving
//! for [`Limits::drain_period`], so that the Service stops routing to it while it still
//! answers; then it stops accepting, lets the requests in flight finish, and returns.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Full, Limited};
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use injector_core::Templates;
use injector_core::pod::json as pod_json;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::limits::Limits;
use crate::metrics::WebhookMetrics;
use crate::review::{Outcome, Route, Target, decide};
use crate::tls::CertificateStore;
use crate::transport::{Body, read_body, serve_tls};

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Webhook {
    /// The templates served.
    pub templates: Arc<Templates>,
    /// The serving certificate.
    pub certificates: Arc<CertificateStore>,
    /// The webhook's metrics.
    pub metrics: WebhookMetrics,
    /// The registry `/metrics` renders (the webhook's and whatever else registered there).
    pub registry: Registry,
    /// Bounds on clients.
    pub limits: Limits,
    /// The memory budget of the requests in flight, in KiB (see [`Limits::memory_budget_bytes`]).
    memory: Arc<Semaphore>,
    /// The thread deciding large requests (see [`OFF_RUNTIME_BYTES`]).
    large: Option<std::sync::mpsc::Sender<Job>>,
    /// Set once shutdown has begun: not ready, and every answer closes its connection.
    draining: AtomicBool,
}

impl Webhook {
    /// A webhook serving `templates` with `certificates`; its metrics are registered in
    /// `registry`, which `/metrics` renders with whatever else was registered there.
    pub fn new(
        templates: Arc<Templates>,
        certificates: Arc<CertificateStore>,
        mut registry: Registry,
        limits: Limits,
    ) -> Self {
        let metrics = WebhookMetrics::register(&mut registry);
        let memory = Arc::new(Semaphore::new(kib(limits.memory_budget_bytes)));
        let large = large_request_thread()
            .inspect_err(|error| {
                tracing::warn!(%error, "cannot start the thread for large requests; deciding them on the runtime");
            })
            .ok();
        Self {
            large,
            templates,
            certificates,
            metrics,
            registry,
            limits,
            memory,
            draining: AtomicBool::new(false),
        }
    }

    /// Reserves memory for a request whose body is `body_bytes` long: the body and the
    /// allowance to decode its Pod, within the budget. `None` when the budget stayed taken for
    /// `request_timeout`.
    async fn reserve(&self, body_bytes: usize) -> Option<Reservation> {
        let budget = self.limits.memory_budget_bytes;
        let allowance = pod_json::allowance(body_bytes).min(budget.saturating_sub(body_bytes));
        let bytes = body_bytes.saturating_add(allowance).min(budget);
        let permits = u32::try_from(kib(bytes)).unwrap_or(u32::MAX);
        let acquired = tokio::time::timeout(
            self.limits.request_timeout,
            Arc::clone(&self.memory).acquire_many_owned(permits),
        )
        .await;
        match acquired {
            Ok(Ok(permit)) => Some(Reservation {
                allowance,
                _permit: permit,
            }),
            _ => None,
        }
    }

    /// Begins the drain: from now on the replica is not ready, and every admission answer
    /// closes its connection, so that clients reconnect through the Service (to another
    /// replica) instead of reusing a connection this one is about to close.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the drain has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Ready means correct and staying: not shutting down, templates synced, the template
    /// watch not failing for longer than its grace period, and a certificate loaded.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.is_draining() {
            Err("shutting down")
        } else if !self.templates.is_synced() {
            Err("templates not synced yet")
        } else if let Err(stale) = self.templates.freshness(Instant::now().into_std()) {
            Err(stale)
        } else if !self.certificates.is_loaded() {
            Err("no serving certificate loaded")
        } else {
            Ok(())
        }
    }
}

/// Memory reserved for one request, released when it is answered.
struct Reservation {
    /// What decoding its Pod may take.
    allowance: usize,
    _permit: OwnedSemaphorePermit,
}

/// Bytes in whole KiB, rounded up: the budget's unit, so that it fits a semaphore's `u32`.
fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

fn text(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut message = message.into();
    message.push('\n');
    let mut response = Response::new(Full::new(Bytes::from(message)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn json(body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Answers one HTTP request to the admission server.
async fn admission(
    request: Request<Incoming>,
    webhook: Arc<Webhook>,
) -> Result<Response<Body>, Infallible> {
    let started = std::time::Instant::now();
    let path = request.uri().path().to_owned();
    if let Some(refused) = refusal(&request, &path) {
        return Ok(refused);
    }
    let limit = webhook.limits.max_body_bytes;
    let Some(expected) = expected_body_bytes(&request, limit) else {
        return Ok(too_large(limit));
    };
    let Some(reservation) = webhook.reserve(expected).await else {
        webhook.metrics.record_busy();
        return Ok(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy: the memory budget for requests in flight stayed taken; retry",
        ));
    };
    let body = Limited::new(request.into_body(), expected);
    let bytes = match read_in_time(body, expected, limit, webhook.limits.request_timeout).await {
        Ok(bytes) => bytes,
        Err(refused) => return Ok(*refused),
    };
    webhook.metrics.record_body(bytes.len());
    let large = match &webhook.large {
        Some(large) if bytes.len() >= OFF_RUNTIME_BYTES => large.clone(),
        _ => {
            return Ok(respond(
                &webhook,
                &bytes,
                &path,
                reservation.allowance,
                started,
            ));
        }
    };
    Ok(respond_on(&large, webhook, bytes, path, reservation, started).await)
}

/// [`respond`] on the thread for large requests (`large`), the memory `reservation` held until
/// it has answered.
async fn respond_on(
    large: &std::sync::mpsc::Sender<Job>,
    webhook: Arc<Webhook>,
    bytes: Vec<u8>,
    path: String,
    reservation: Reservation,
    started: std::time::Instant,
) -> Response<Body> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    let job = Box::new(move || {
        let response = respond(&webhook, &bytes, &path, reservation.allowance, started);
        drop(reservation);
        let _ = answer.send(response);
    });
    if large.send(job).is_err() {
        tracing::error!("the thread deciding large requests has stopped");
    }
    answered.await.unwrap_or_else(|_| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "answering the request failed",
        )
    })
}

/// The answer to a request that is no AdmissionReview, before its body is read: a path other
/// than the admission paths, a method other than POST, a body other than JSON; `None` when
/// it may be one.
fn refusal(request: &Request<Incoming>, path: &str) -> Option<Response<Body>> {
    if target_of(path).is_none() {
        return Some(text(
            StatusCode::NOT_FOUND,
            format!("no such path {path:?}: POST AdmissionReviews to /mutate or /mutate/<group>"),
        ));
    }
    if request.method() != Method::POST {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return Some(response);
    }
    let is_json = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Some(text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        ));
    }
    None
}

/// How large `request`'s body may be, for the memory reserved for it: its declared length,
/// or `limit` when it declares none (chunked); `None` when it declares more than `limit`.
fn expected_body_bytes(request: &Request<Incoming>, limit: usize) -> Option<usize> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => None,
        Some(n) => Some(usize::try_from(n).unwrap_or(limit)),
        // Chunked: it may be as large as allowed.
        None => Some(limit),
    }
}

/// Reads `body` (`expected` bytes, at most `limit`) within `timeout`; `Err` with the answer
/// (boxed: it is large, and rare) when it is too large, cannot be read, or is not received
/// in time.
async fn read_in_time(
    body: Limited<Incoming>,
    expected: usize,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<u8>, Box<Response<Body>>> {
    let refused = match tokio::time::timeout(timeout, read_body(body, expected)).await {
        Ok(Ok(bytes)) => return Ok(bytes),
        Ok(Err(error))
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            too_large(limit)
        }
        Ok(Err(error)) => text(
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {error}"),
        ),
        Err(_) => text(
            StatusCode::REQUEST_TIMEOUT,
            "the body was not received in time",
        ),
    };
    Err(Box::new(refused))
}

/// Bodies from this size on are decided on the one thread for large requests: decoding one
/// takes milliseconds of CPU, which would stall the other connections of a runtime thread, and
/// on one thread the memory one frees is the memory the next one gets (an allocator keeps
/// what a thread freed for that thread).
const OFF_RUNTIME_BYTES: usize = 256 * 1024;

/// Work for the thread deciding large requests.
type Job = Box<dyn FnOnce() + Send>;

/// Starts the thread that runs the jobs sent to it, until every sender is gone.
fn large_request_thread() -> std::io::Result<std::sync::mpsc::Sender<Job>> {
    let (jobs, received) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("large-reviews".into())
        .spawn(move || {
            for job in received {
                job();
            }
        })?;
    Ok(jobs)
}

/// Which templates `path` asks for; `None`: not an admission path.
fn target_of(path: &str) -> Option<Target<'_>> {
    match path {
        "/mutate" => Some(Target::All),
        other => match other.strip_prefix("/mutate/") {
            Some(id) if !id.is_empty() && !id.contains('/') => Some(Target::Group(id)),
            _ => None,
        },
    }
}

/// Decides the review in `bytes`, posted to `path` (an admission path), records it and
/// answers it.
fn respond(
    webhook: &Webhook,
    bytes: &[u8],
    path: &str,
    allowance: usize,
    started: std::time::Instant,
) -> Response<Body> {
    let target = target_of(path).unwrap_or(Target::All);
    let snapshot = webhook.templates.current();
    let decision = decide(bytes, target, &snapshot, allowance);
    let seconds = started.elapsed().as_secs_f64();
    match decision {
        Ok(decision) => {
            webhook
                .metrics
                .record(decision.group, decision.outcome, seconds);
            webhook.metrics.record_decision(
                &decision.applied,
                &decision.denied_by,
                decision.warnings,
            );
            match decision.outcome {
                Outcome::UnknownGroup => tracing::warn!(
                    uid = decision.uid.as_str(),
                    path = path,
                    "admission request for a best-effort selector group this replica does not know; allowed unchanged (stale webhook configuration?)"
                ),
                Outcome::UnknownRequiredGroup => tracing::warn!(
                    uid = decision.uid.as_str(),
                    path = path,
                    "admission request for a required selector group this replica does not know; denied (this replica is not in sync with the cluster's templates)"
                ),
                _ => {}
            }
            // Strings rather than `%` values (here and for the path): they are quoted and
            // escaped, so that text from the request cannot forge a line.
            tracing::info!(
                uid = decision.uid.as_str(),
                namespace = decision.namespace.as_str(),
                pod = decision.pod.as_str(),
                group = decision.group,
                outcome = decision.outcome.as_str(),
                templates = decision.applied_record.as_str(),
                warnings = decision.warnings,
                duration_us = (seconds * 1e6) as u64,
                "admission"
            );
            json(decision.body)
        }
        Err(bad) => {
            // The body was not read as far as the target: this is its one lookup.
            let group = Route::resolve(target, &snapshot).label();
            webhook.metrics.record(group, Outcome::BadRequest, seconds);
            tracing::info!(path = path, error = %bad, "bad admission request");
            text(StatusCode::BAD_REQUEST, bad.to_string())
        }
    }
}

fn too_large(limit: usize) -> Response<Body> {
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is larger than {limit} bytes"),
    )
}

/// Serves admission requests over TLS on `listener` until `stop` is cancelled, then waits (at
/// most `limits.shutdown_grace`) for the requests in flight.
pub async fn serve_admission(
    listener: TcpListener,
    webhook: Arc<Webhook>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let handler = {
        let webhook = Arc::clone(&webhook);
        move |request| {
            let webhook = Arc::clone(&webhook);
            async move {
                let mut response = admission(request, Arc::clone(&webhook)).await?;
                if webhook.is_draining() {
                    // hyper closes the connection after this answer; the client knows not to
                    // send another on it.
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, Infallible>(response)
            }
        }
    };
    let on_handshake_failure = {
        let webhook = Arc::clone(&webhook);
        move || webhook.metrics.record_handshake_failure()
    };
    serve_tls(
        listener,
        Arc::clone(&webhook.certificates),
        &webhook.limits,
        handler,
        on_handshake_failure,
        stop,
    )
    .await
}

/// Answers one request to the admin server.
async fn admin(
    request: Request<Incoming>,
    webhook: Arc<Webhook>,
) -> Result<Response<Body>, Infallible> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "use GET"));
    }
    Ok(match request.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok"),
        "/readyz" => match webhook.readiness() {
            Ok(()) => text(StatusCode::OK, "ok"),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, reason),
        },
        "/metrics" => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, &webhook.registry) {
                Ok(()) => {
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static(
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        ),
                    );
                    response
                }
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot encode metrics: {error}"),
                ),
            }
        }
        other => text(
            StatusCode::NOT_FOUND,
            format!("no such path {other:?}: try /healthz, /readyz or /metrics"),
        ),
    })
}

/// Serves `/healthz`, `/readyz` and `/metrics` over plain HTTP until `stop` is cancelled.
pub async fn serve_admin(
    listener: TcpListener,
    webhook: Arc<Webhook>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let webhook = Arc::clone(&webhook);
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(5))
            .serve_connection(
                TokioIo::new(stream),
                service_fn(move |request| admin(request, Arc::clone(&webhook))),
            );
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = watched.await;
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
    Ok(())
}

/// Serves the admin port in the background and admission requests until `stop` is
/// cancelled, then shuts down in three steps:
///
/// 1. drain: not ready (`/readyz` fails), still accepting and answering, every answer closing
///    its connection, for [`Limits::drain_period`] (the endpoints controller and every
///    kube-proxy, or the API server's own routing, take a moment to drop this replica);
/// 2. stop accepting and let the requests in flight finish (at most
///    [`Limits::shutdown_grace`]);
/// 3. stop the admin server.
///
/// Returns once all is done, after cancelling `stop` (so everything else sharing it stops
/// too, also when admission serving failed).
pub async fn serve_both(
    admission: TcpListener,
    admin: TcpListener,
    webhook: Arc<Webhook>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let close = CancellationToken::new();
    let admin_task = tokio::spawn(serve_admin(admin, Arc::clone(&webhook), close.clone()));
    let drain_task = tokio::spawn(drain_then_close(
        Arc::clone(&webhook),
        stop.clone(),
        close.clone(),
    ));
    let result = serve_admission(admission, webhook, close.clone()).await;
    close.cancel();
    stop.cancel();
    let _ = drain_task.await;
    let _ = admin_task.await;
    result
}

/// Once `stop` is cancelled: begins the drain, waits the drain period, then cancels `close`.
/// Returns at once when `close` is cancelled first (admission serving ended by itself).
async fn drain_then_close(
    webhook: Arc<Webhook>,
    stop: CancellationToken,
    close: CancellationToken,
) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = close.cancelled() => return,
    }
    webhook.start_draining();
    let period = webhook.limits.drain_period;
    tracing::info!(
        ?period,
        "draining: reporting not ready, still serving until the Service has dropped this replica"
    );
    tokio::select! {
        () = tokio::time::sleep(period) => {}
        () = close.cancelled() => return,
    }
    tracing::info!("drained: no longer accepting; finishing the requests in flight");
    close.cancel();
}

/// Binds a listener, with the address in the error.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))
}

#[cfg(test)]
mod tests;
