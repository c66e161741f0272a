//! A Service of this machine: one address on 127.0.0.1 in front of several operator replicas,
//! as a Kubernetes Service with kube-proxy is in front of the operator's Pods. Out of cluster,
//! in url mode, the webhook configuration otherwise calls one replica's own port, so a killed
//! leader would take the webhook with it; through this, the API server keeps reaching whichever
//! replica still listens.
//!
//! Each connection is forwarded, bytes both ways, to the next replica in turn that accepts it
//! (TLS passes through: every replica serves the same certificate). A replica that is gone
//! refuses the connection at once, so it drops out at once; kube-proxy drops an endpoint only
//! once the Pod is seen gone or not ready, so a real cluster's gap is longer.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;

/// How long a replica gets to accept a forwarded connection before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// One address forwarding to the replicas [`LocalService::route_to`] names; stops accepting
/// when dropped (connections open then are forwarded until either side closes them).
pub struct LocalService {
    port: u16,
    shared: Arc<Shared>,
    accepting: Option<JoinHandle<()>>,
}

struct Shared {
    backends: Mutex<Vec<u16>>,
    next: AtomicUsize,
    stopping: AtomicBool,
    /// Connections that found no replica accepting, or could not be accepted.
    unrouted: AtomicUsize,
    /// Connections a replica ended while the client kept them open: what a killed replica
    /// cuts (with a call in flight on it or not).
    cut: AtomicUsize,
}

impl LocalService {
    /// Listens on a free port of 127.0.0.1, with no replica behind it yet.
    pub fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            backends: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            unrouted: AtomicUsize::new(0),
            cut: AtomicUsize::new(0),
        });
        let accepting = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || accept(&listener, &shared))
        };
        Ok(Self {
            port,
            shared,
            accepting: Some(accepting),
        })
    }

    /// The URL the webhook configuration calls: `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Forwards to these ports of 127.0.0.1 from now on.
    pub fn route_to(&self, ports: &[u16]) {
        *self
            .shared
            .backends
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = ports.to_vec();
    }

    /// How many connections found no replica accepting them (each fails the API server's
    /// call).
    pub fn unrouted(&self) -> usize {
        self.shared.unrouted.load(Ordering::Relaxed)
    }

    /// How many forwarded connections a replica ended while the client kept them open (a
    /// killed replica ends all of its own, whether a call was in flight on one or not).
    pub fn cut(&self) -> usize {
        self.shared.cut.load(Ordering::Relaxed)
    }
}

impl Drop for LocalService {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        // Wakes the accept loop, which then sees it is stopping.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = incoming else {
            shared.unrouted.fetch_add(1, Ordering::Relaxed);
            // An error such as too many open files: give it a moment rather than spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let shared = Arc::clone(shared);
        std::thread::spawn(move || forward(client, &shared));
    }
}

/// Connects `client` to the next replica that accepts, and copies both ways until either
/// side closes; counts a connection no replica took as unrouted, and one the replica ended
/// first as cut.
fn forward(client: TcpStream, shared: &Shared) {
    let backends = shared
        .backends
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let start = shared.next.fetch_add(1, Ordering::Relaxed);
    let replica = (0..backends.len())
        .map(|i| backends[(start + i) % backends.len()])
        .find_map(|port| {
            TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), CONNECT_TIMEOUT)
                .ok()
        });
    let Some(replica) = replica else {
        shared.unrouted.fetch_add(1, Ordering::Relaxed);
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut client_read), Ok(mut replica_write)) = (client.try_clone(), replica.try_clone())
    else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let client_done = Arc::new(AtomicBool::new(false));
    let upstream = {
        let client_done = Arc::clone(&client_done);
        std::thread::spawn(move || {
            let _ = io::copy(&mut client_read, &mut replica_write);
            client_done.store(true, Ordering::Release);
            let _ = replica_write.shutdown(Shutdown::Write);
        })
    };
    let (mut replica_read, mut client_write) = (replica, client);
    let _ = io::copy(&mut replica_read, &mut client_write);
    // The API server keeps its connections to a webhook open: one the replica ends first was
    // cut (a killed replica's kernel closes every connection it held).
    if !client_done.load(Ordering::Acquire) {
        shared.cut.fetch_add(1, Ordering::Relaxed);
    }
    // Both ways: a replica that is gone ends the client's connection, as a Service's would.
    let _ = client_write.shutdown(Shutdown::Both);
    let _ = upstream.join();
}
