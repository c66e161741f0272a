//! Shutdown as a rollout sees it: clients keep sending through the Service while a replica
//! is asked to stop, and none of their requests fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use hyper::StatusCode;
use injector_webhook::Limits;
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// Short, for the test; what matters is that the "Service" below notices the replica is not
/// ready well within it.
const DRAIN: Duration = Duration::from_secs(2);
/// How long the "Service" keeps routing new connections to the replica after its `/readyz`
/// first fails (the endpoints controller and kube-proxy, in a cluster).
const ROUTING_LAG: Duration = Duration::from_millis(200);

#[tokio::test]
async fn a_replica_stopped_under_load_fails_no_request() {
    let limits = Limits {
        drain_period: DRAIN,
        ..Limits::default()
    };
    let server = Arc::new(start_both(&[LOGGER], limits).await);
    assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
    let body = Bytes::from(
        serde_json::to_vec(&pod_review("admission.k8s.io/v1", "drain", web_pod())).unwrap(),
    );

    // The "Service": routes new connections to the replica until a little after its /readyz
    // first fails, as endpoints follow readiness.
    let routed = Arc::new(AtomicBool::new(true));
    let not_ready_at = Arc::new(OnceCell::<Instant>::new());
    let router = {
        let (server, routed, not_ready_at) = (server.clone(), routed.clone(), not_ready_at.clone());
        tokio::spawn(async move {
            while server.admin_get("/readyz").await.0 == StatusCode::OK {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            not_ready_at.set(Instant::now()).unwrap();
            tokio::time::sleep(ROUTING_LAG).await;
            routed.store(false, Ordering::Relaxed);
        })
    };

    // Clients: half keep their connection alive, half open one per request; a new
    // connection only while the Service routes to the replica, as a client behind it would.
    let (failures, answered, after_stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let stopped = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for worker in 0..4 {
        let (server, routed, body) = (server.clone(), routed.clone(), body.clone());
        let (failures, answered, after_stop, stopped) = (
            failures.clone(),
            answered.clone(),
            after_stop.clone(),
            stopped.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut kept: Option<Client> = None;
            loop {
                let reusable = match kept.as_mut() {
                    Some(client) => worker % 2 == 0 && client.ready().await,
                    None => false,
                };
                if !reusable {
                    if !routed.load(Ordering::Relaxed) {
                        return;
                    }
                    match Client::connect(server.admission, &[server.ca.der()]).await {
                        Ok(client) => kept = Some(client),
                        Err(error) => {
                            eprintln!("connect: {error}");
                            failures.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                let was_stopped = stopped.load(Ordering::Relaxed);
                match kept.as_mut().unwrap().post("/mutate", body.clone()).await {
                    Ok((StatusCode::OK, _)) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                        if was_stopped {
                            after_stop.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    other => {
                        eprintln!("request: {other:?}");
                        failures.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }));
    }

    // When the listener stops accepting.
    let closed_at = {
        let server = server.clone();
        tokio::spawn(async move {
            while TcpStream::connect(server.admission).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Instant::now()
        })
    };

    tokio::time::sleep(Duration::from_millis(300)).await;
    stopped.store(true, Ordering::Relaxed);
    let stopped_at = Instant::now();
    server.stop.cancel();

    for client in clients {
        client.await.unwrap();
    }
    router.await.unwrap();
    let closed_at = closed_at.await.unwrap();
    let not_ready_at = *not_ready_at.get().unwrap();
    let server = Arc::into_inner(server).expect("every task is done with the server");
    server.task.await.unwrap().unwrap();

    assert_eq!(failures.load(Ordering::Relaxed), 0, "failed requests");
    assert!(
        stopped_at <= not_ready_at && not_ready_at < closed_at,
        "not ready {:?} and closed {:?} after the stop: readiness must fail first",
        not_ready_at - stopped_at,
        closed_at - stopped_at
    );
    assert!(
        after_stop.load(Ordering::Relaxed) > 0,
        "no request was answered during the drain"
    );
    assert!(
        answered.load(Ordering::Relaxed) > 20,
        "too few requests to mean anything"
    );
}
