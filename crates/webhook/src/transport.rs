//! The HTTPS transport the admission server runs on: TLS (rustls, serving what the certificate
//! store holds) and HTTP/1.1 with keep-alive, within the connection cap and the handshake and
//! header timeouts of [`Limits`]. Apart from what a request means, so that the benchmark's
//! transport-only server (`crates/cli/examples/transport_only.rs`) runs on exactly this.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::limits::Limits;
use crate::tls::CertificateStore;

/// The body of every answer: one buffer, written as it is.
pub type Body = Full<Bytes>;

/// Serves HTTPS on `listener` with `certificates`, answering each request with `handler` and
/// calling `on_handshake_failure` for each failed or timed-out handshake, until `stop` is
/// cancelled; then waits (at most `limits.shutdown_grace`) for the requests in flight.
pub async fn serve_tls<H, F, A>(
    listener: TcpListener,
    certificates: Arc<CertificateStore>,
    limits: &Limits,
    handler: H,
    on_handshake_failure: A,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
    A: Fn() + Clone + Send + 'static,
{
    let tls = crate::tls::server_config(certificates).map_err(std::io::Error::other)?;
    let acceptor = TlsAcceptor::from(tls);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let (handshake_timeout, header_read_timeout) =
        (limits.handshake_timeout, limits.header_read_timeout);
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => break,
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        let on_handshake_failure = on_handshake_failure.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    on_handshake_failure();
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    on_handshake_failure();
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .keep_alive(true)
                .serve_connection(TokioIo::new(tls), service_fn(handler));
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let grace = limits.shutdown_grace;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "requests still in flight after the grace period; closing"
        );
    }
    Ok(())
}

/// Reads `body` into one buffer of the `expected` size. Each chunk is copied and let go at
/// once: collecting the chunks would keep each one's whole read buffer alive (up to 400 KiB
/// for a 16 KiB TLS record), many times the body's size.
pub async fn read_body(
    mut body: Limited<Incoming>,
    expected: usize,
) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
    let mut bytes = Vec::with_capacity(expected);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}
