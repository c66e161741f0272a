//! No client starves another: connections stalled before the TLS handshake or in the middle of
//! their headers, more of them than the server serves at once, and requests holding the memory
//! budget, never keep a well-behaved client from its answer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{LOGGER, pod_review, start_with, tls_connect, web_pod};
use http_body_util::BodyExt as _;
use hyper::{Method, StatusCode};
use injector_webhook::Limits;
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

/// A bound on waiting for an answer, far above what it takes: only a starved client hits it.
const PATIENCE: Duration = Duration::from_secs(30);

fn limits() -> Limits {
    Limits {
        max_connections: 16,
        handshake_timeout: Duration::from_millis(500),
        header_read_timeout: Duration::from_millis(500),
        ..Limits::default()
    }
}

async fn well_behaved_client_is_answered(server: &common::Server, uid: &str) {
    let answered = tokio::time::timeout(PATIENCE, async {
        let mut client = server.client().await;
        client
            .review(
                "/mutate",
                &pod_review("admission.k8s.io/v1", uid, web_pod()),
            )
            .await
    })
    .await
    .unwrap_or_else(|_| panic!("{uid}: no answer within {PATIENCE:?}"));
    assert_eq!(answered["response"]["uid"], uid);
    assert_eq!(answered["response"]["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stalled_before_the_handshake_do_not_starve_others() {
    let server = start_with(&[LOGGER], limits()).await;
    let mut stalled = Vec::new();
    for _ in 0..4 * limits().max_connections {
        stalled.push(TcpStream::connect(server.admission).await.unwrap());
    }
    well_behaved_client_is_answered(&server, "after-stalled-handshakes").await;
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stalled_in_their_headers_do_not_starve_others() {
    let server = start_with(&[LOGGER], limits()).await;
    let mut stalled = Vec::new();
    let roots = [server.ca.der()];
    for _ in 0..4 * limits().max_connections {
        // Connections beyond the cap wait in the backlog: their handshake may time out.
        let connect = tls_connect(server.admission, &roots);
        if let Ok(Ok(mut tls)) = tokio::time::timeout(Duration::from_millis(50), connect).await {
            tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
                .await
                .unwrap();
            tls.flush().await.unwrap();
            stalled.push(tls);
        }
    }
    assert!(
        stalled.len() >= limits().max_connections,
        "{}",
        stalled.len()
    );
    well_behaved_client_is_answered(&server, "after-stalled-headers").await;
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_holding_the_memory_budget_makes_others_wait_not_starve() {
    let limits = Limits {
        request_timeout: Duration::from_millis(800),
        memory_budget_bytes: 256 * 1024,
        ..Limits::default()
    };
    let server = start_with(&[LOGGER], limits).await;

    // A slow body that reserves the whole budget (no Content-Length: it may be the largest).
    let mut slow = server.client().await;
    let (mut sender, channel) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    sender.send_data(Bytes::from_static(b"{")).await.unwrap();
    let held = tokio::spawn(async move {
        slow.send(Method::POST, "/mutate", "application/json", channel.boxed())
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Meanwhile another waits for the budget, and is answered once the slow one times out.
    let mut client = server.client().await;
    let review = pod_review("admission.k8s.io/v1", "waits", web_pod());
    let waiting = tokio::spawn(async move { client.review("/mutate", &review).await });
    let (status, _) = held.await.unwrap().unwrap();
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    let answer = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer["response"]["uid"], "waits");
    drop(sender);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_larger_than_the_budget_allows_at_once_are_answered_in_turn() {
    let limits = Limits {
        memory_budget_bytes: 1024 * 1024,
        ..Limits::default()
    };
    let server = start_with(&[LOGGER], limits).await;
    let mut pod = web_pod();
    pod["metadata"]["annotations"] = serde_json::json!({"padding": "x".repeat(200 * 1024)});
    let mut tasks = Vec::new();
    for i in 0..6 {
        let review = pod_review("admission.k8s.io/v1", &format!("big-{i}"), pod.clone());
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            client.review("/mutate", &review).await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let answer = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
        assert_eq!(answer["response"]["uid"], format!("big-{i}"));
        assert_eq!(answer["response"]["allowed"], Value::Bool(true));
    }
}
