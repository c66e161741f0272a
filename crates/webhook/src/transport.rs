//! The HTTPS transport the admission server runs on: TLS (rustls, serving what the certificate
//! store holds) and HTTP/1.1 with keep-alive, within the connection cap and the handshake and
//! header timeouts of [`Limits`]. Apart from what a request means, so that the benchmark's
//! transport-only server (`crates/cli/examples/transport_only.rs`) runs on exactly this.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
    let service = Connection {
        acceptor: TlsAcceptor::from(tls),
        handler,
        on_handshake_failure,
        handshake_timeout: limits.handshake_timeout,
        header_read_timeout: limits.header_read_timeout,
    };
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    while let Some((permit, stream, peer)) = accept(&listener, &connections, &stop).await {
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            service.serve(stream, peer, watcher).await;
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

/// The next connection on `listener`, with its place among the `connections` allowed (taken
/// before accepting, so that past the cap connections wait in the listen backlog); `None`
/// once `stop` is cancelled.
async fn accept(
    listener: &TcpListener,
    connections: &Arc<Semaphore>,
    stop: &CancellationToken,
) -> Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)> {
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return None,
            permit = Arc::clone(connections).acquire_owned() => permit.ok()?,
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => return Some((permit, stream, peer)),
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// What serving one connection takes; each connection gets a clone.
#[derive(Clone)]
struct Connection<H, A> {
    acceptor: TlsAcceptor,
    handler: H,
    on_handshake_failure: A,
    handshake_timeout: Duration,
    header_read_timeout: Duration,
}

impl<H, F, A> Connection<H, A>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
    A: Fn() + Clone + Send + 'static,
{
    /// The TLS handshake with `peer` (within its timeout), then HTTP/1.1 with keep-alive until
    /// the client closes or the graceful shutdown `watcher` ends it.
    async fn serve(self, stream: TcpStream, peer: SocketAddr, watcher: Watcher) {
        let handshake = self.acceptor.accept(stream);
        let tls = match tokio::time::timeout(self.handshake_timeout, handshake).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                (self.on_handshake_failure)();
                tracing::debug!(%peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                (self.on_handshake_failure)();
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(tls), service_fn(self.handler));
        if let Err(error) = watcher.watch(connection).await {
            tracing::debug!(%peer, %error, "connection ended with an error");
        }
    }
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
