//! The webhook end to end: a real TLS client against the server on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use injector_webhook::Limits;
use serde_json::{Value, json};

fn group_path(server: &Server, template: &str) -> String {
    let snapshot = server.webhook.templates.snapshot();
    snapshot.get(template).unwrap().group.id().path()
}

#[tokio::test]
async fn v1_review_is_answered_with_a_patch_warnings_and_audit_annotation() {
    let server = start(&[LOGGER, AGENT]).await;
    let mut client = server.client().await;
    let pod = web_pod();
    let response = client
        .review(
            "/mutate",
            &pod_review("admission.k8s.io/v1", "uid-1", pod.clone()),
        )
        .await;
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(response["kind"], "AdmissionReview");
    let answer = &response["response"];
    assert_eq!(answer["uid"], "uid-1");
    assert_eq!(answer["allowed"], true);
    // Each entry: name@generation#fingerprint of what it injects.
    let record = format!(
        "agent@1#{},logger@2#{}",
        template(AGENT).fingerprint,
        template(LOGGER).fingerprint
    );
    assert_eq!(answer["auditAnnotations"]["templates-applied"], record);
    let mutated = patched(&pod, &response);
    let names: Vec<&str> = mutated["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web", "agent", "logger"]);
    assert_eq!(
        mutated["spec"]["containers"][2]["args"],
        json!(["--pod=web-5d8f-"])
    );
    assert_eq!(
        mutated["metadata"]["annotations"]["sidecar.dev/injected"],
        record
    );
    // The mutated pod is a valid Pod.
    let _: k8s_openapi::api::core::v1::Pod = serde_json::from_value(mutated.clone()).unwrap();

    // A reinvocation (or replay) of the mutated pod adds nothing.
    let again = client
        .review(
            "/mutate",
            &pod_review("admission.k8s.io/v1", "uid-2", mutated),
        )
        .await;
    assert_eq!(again["response"]["allowed"], true);
    assert!(again["response"].get("patch").is_none());
}

#[tokio::test]
async fn v1beta1_review_is_answered_in_v1beta1() {
    let server = start(&[LOGGER]).await;
    let mut client = server.client().await;
    let pod = web_pod();
    let response = client
        .review(
            &group_path(&server, "logger"),
            &pod_review("admission.k8s.io/v1beta1", "beta", pod.clone()),
        )
        .await;
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(response["response"]["uid"], "beta");
    assert_eq!(
        patched(&pod, &response)["spec"]["containers"][1]["name"],
        "logger"
    );
}

#[tokio::test]
async fn a_group_path_serves_only_that_groups_templates() {
    let server = start(&[LOGGER, AGENT]).await;
    let mut client = server.client().await;
    let pod = web_pod();
    let response = client
        .review(
            &group_path(&server, "agent"),
            &pod_review("admission.k8s.io/v1", "g", pod.clone()),
        )
        .await;
    let mutated = patched(&pod, &response);
    assert_eq!(mutated["spec"]["containers"].as_array().unwrap().len(), 2);
    assert_eq!(mutated["spec"]["containers"][1]["name"], "agent");
}

#[tokio::test]
async fn conflicts_are_warnings_for_best_effort_and_denials_for_required() {
    let server = start(&[LOGGER, AGENT]).await;
    let mut client = server.client().await;
    let mut pod = web_pod();
    pod["spec"]["containers"] = json!([{"name": "web", "image": "nginx"}, {"name": "agent", "image": "mine"}, {"name": "logger", "image": "mine"}]);
    let response = client
        .review(
            "/mutate",
            &pod_review("admission.k8s.io/v1", "deny", pod.clone()),
        )
        .await;
    let answer = &response["response"];
    assert_eq!(answer["allowed"], false);
    assert_eq!(answer["status"]["code"], 403);
    let message = answer["status"]["message"].as_str().unwrap();
    assert!(message.contains("required SidecarTemplate \"agent\" cannot be applied: container \"agent\" already exists"), "{message}");
    let warnings = answer["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("SidecarTemplate \"logger\" not applied")),
        "{warnings:?}"
    );

    // Best effort alone: admitted, with the warning.
    pod["spec"]["containers"] =
        json!([{"name": "web", "image": "nginx"}, {"name": "logger", "image": "mine"}]);
    let response = client
        .review(
            &group_path(&server, "logger"),
            &pod_review("admission.k8s.io/v1", "warn", pod),
        )
        .await;
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(
        response["response"]["warnings"].as_array().unwrap().len(),
        1
    );
}

#[tokio::test]
async fn bad_input_gets_its_documented_answer_and_the_server_keeps_serving() {
    let server = start(&[LOGGER]).await;
    let good = serde_json::to_vec(&pod_review("admission.k8s.io/v1", "ok", web_pod())).unwrap();
    let review = |request: Value| {
        let mut review = pod_review("admission.k8s.io/v1", "x", web_pod());
        for (key, value) in request.as_object().unwrap() {
            review["request"][key] = value.clone();
        }
        serde_json::to_vec(&review).unwrap()
    };
    let mut missing_uid = pod_review("admission.k8s.io/v1", "x", web_pod());
    missing_uid["request"]
        .as_object_mut()
        .unwrap()
        .remove("uid");
    let mut invalid_utf8 = good.clone();
    let at = invalid_utf8.windows(5).position(|w| w == b"nginx").unwrap();
    invalid_utf8[at] = 0xff;
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));

    struct Case {
        name: &'static str,
        method: Method,
        path: &'static str,
        content_type: &'static str,
        body: Vec<u8>,
        status: StatusCode,
        /// For 200 answers: (allowed, has a patch).
        answer: Option<(bool, bool)>,
    }
    let case = |name, body: Vec<u8>, status, answer| Case {
        name,
        method: Method::POST,
        path: "/mutate",
        content_type: "application/json",
        body,
        status,
        answer,
    };
    let cases = vec![
        case("empty body", Vec::new(), StatusCode::BAD_REQUEST, None),
        Case {
            method: Method::GET,
            ..case(
                "wrong method",
                good.clone(),
                StatusCode::METHOD_NOT_ALLOWED,
                None,
            )
        },
        Case {
            path: "/validate",
            ..case("wrong path", good.clone(), StatusCode::NOT_FOUND, None)
        },
        Case {
            path: "/mutate/a/b",
            ..case("nested path", good.clone(), StatusCode::NOT_FOUND, None)
        },
        Case {
            content_type: "text/plain",
            ..case(
                "wrong content type",
                good.clone(),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                None,
            )
        },
        case(
            "truncated JSON",
            good[..good.len() / 2].to_vec(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        case(
            "4 MiB body",
            vec![b' '; 4 * 1024 * 1024],
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
        ),
        case(
            "100,000-deep nesting",
            deep.into_bytes(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        case("invalid UTF-8", invalid_utf8, StatusCode::BAD_REQUEST, None),
        case(
            "missing uid",
            serde_json::to_vec(&missing_uid).unwrap(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        case(
            "not an AdmissionReview",
            br#"{"apiVersion": "v1", "kind": "Pod"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        case(
            "no request",
            br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        case(
            "object null",
            review(json!({"object": null})),
            StatusCode::OK,
            Some((false, false)),
        ),
        case(
            "non-Pod kind",
            review(json!({"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}})),
            StatusCode::OK,
            Some((true, false)),
        ),
        case(
            "DELETE",
            review(json!({"operation": "DELETE"})),
            StatusCode::OK,
            Some((true, false)),
        ),
        case(
            "UPDATE",
            review(json!({"operation": "UPDATE"})),
            StatusCode::OK,
            Some((true, false)),
        ),
        case(
            "a subresource",
            review(json!({"subResource": "ephemeralcontainers"})),
            StatusCode::OK,
            Some((true, false)),
        ),
        Case {
            path: "/mutate/ignore-0000000000000000",
            ..case(
                "unknown best-effort group",
                good.clone(),
                StatusCode::OK,
                Some((true, false)),
            )
        },
        Case {
            path: "/mutate/fail-0000000000000000",
            ..case(
                "unknown required group",
                good.clone(),
                StatusCode::OK,
                Some((false, false)),
            )
        },
        case(
            "a pod without containers",
            review(json!({"object": {"metadata": {"name": "p"}, "spec": {}}})),
            StatusCode::OK,
            Some((false, false)),
        ),
    ];
    for case in cases {
        let mut client = server.client().await;
        let result = client
            .send(
                case.method.clone(),
                case.path,
                case.content_type,
                full(case.body),
            )
            .await;
        let (status, body) = result.unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            status,
            case.status,
            "{}: {}",
            case.name,
            String::from_utf8_lossy(&body)
        );
        if let Some((allowed, has_patch)) = case.answer {
            let response: Value = serde_json::from_slice(&body).unwrap();
            assert!(response["response"]["uid"].is_string(), "{}", case.name);
            assert_eq!(
                response["response"]["allowed"], allowed,
                "{}: {response}",
                case.name
            );
            assert_eq!(
                response["response"].get("patch").is_some(),
                has_patch,
                "{}",
                case.name
            );
            if !allowed {
                assert!(
                    response["response"]["status"]["message"]
                        .as_str()
                        .unwrap()
                        .starts_with("sidecar-injector: "),
                    "{}",
                    case.name
                );
            }
        } else {
            assert!(!body.is_empty(), "{}: a 4xx says why", case.name);
        }
        // Still serving.
        let mut client = server.client().await;
        let (status, _) = client.post("/mutate", good.clone()).await.unwrap();
        assert_eq!(status, StatusCode::OK, "after {}", case.name);
    }
    let (_, metrics) = server.admin_get("/metrics").await;
    assert!(metrics.contains("outcome=\"bad_request\""), "{metrics}");
    assert!(metrics.contains("group=\"unknown\""), "{metrics}");
    assert!(metrics.contains("outcome=\"unknown_group\""), "{metrics}");
    assert!(
        metrics.contains("outcome=\"unknown_required_group\""),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_unknown_required_group_is_denied_as_out_of_sync() {
    let server = start(&[LOGGER]).await;
    let good = serde_json::to_vec(&pod_review("admission.k8s.io/v1", "x", web_pod())).unwrap();
    let mut client = server.client().await;
    let (status, body) = client
        .post("/mutate/fail-0123456789abcdef", good)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["response"]["allowed"], false, "{response}");
    assert_eq!(response["response"]["status"]["code"], 503, "{response}");
    let message = response["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("\"fail-0123456789abcdef\""), "{message}");
    assert!(message.contains("not in sync"), "{message}");
}

#[tokio::test]
async fn a_tls_1_1_client_hello_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start(&[LOGGER]).await;
    // A minimal TLS 1.1 ClientHello: record version 3.2, client_version 3.2, one cipher suite
    // (TLS_RSA_WITH_AES_128_CBC_SHA), no extensions.
    let mut hello = vec![0x03, 0x02];
    hello.extend([0u8; 32]); // random
    hello.push(0); // session id
    hello.extend([0x00, 0x02, 0x00, 0x2f]); // cipher suites
    hello.extend([0x01, 0x00]); // compression: null
    let mut handshake = vec![0x01, 0x00, (hello.len() >> 8) as u8, hello.len() as u8];
    handshake.extend(hello);
    let mut record = vec![
        0x16,
        0x03,
        0x02,
        (handshake.len() >> 8) as u8,
        handshake.len() as u8,
    ];
    record.extend(handshake);
    let mut tcp = tokio::net::TcpStream::connect(server.admission)
        .await
        .unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply))
        .await
        .unwrap();
    // Either a fatal alert (content type 21, level 2) or a closed connection; never a ServerHello.
    assert!(
        reply.is_empty() || (reply[0] == 21 && reply[5] == 2),
        "{reply:?}"
    );
    assert!(
        reply.first().is_none_or(|&t| t != 22),
        "the server answered the handshake"
    );
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = start(&[LOGGER]).await;
    assert_eq!(server.admin_get("/healthz").await.0, StatusCode::OK);
    assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
    let mut client = server.client().await;
    client
        .review(
            "/mutate",
            &pod_review("admission.k8s.io/v1", "m", web_pod()),
        )
        .await;
    let (status, metrics) = server.admin_get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for series in [
        "sidecar_injector_admission_requests_total{group=\"all\",outcome=\"injected\"} 1",
        "sidecar_injector_injections_total{template=\"logger\"} 1",
        "sidecar_injector_admission_duration_seconds_bucket{le=\"0.0001\",group=\"all\"}",
        "sidecar_injector_admission_request_body_bytes_count 1",
        "sidecar_injector_admission_warnings_total 0",
    ] {
        assert!(metrics.contains(series), "missing {series} in\n{metrics}");
    }
    assert_eq!(server.admin_get("/nope").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn readiness_requires_synced_templates_and_a_certificate() {
    let server = start(&[LOGGER]).await;
    let unsynced = injector_core::Templates::new();
    let webhook = injector_webhook::Webhook::new(
        unsynced,
        injector_webhook::CertificateStore::new(),
        Default::default(),
        Limits::default(),
    );
    assert_eq!(webhook.readiness(), Err("templates not synced yet"));
    webhook.templates.mark_synced();
    assert_eq!(webhook.readiness(), Err("no serving certificate loaded"));
    assert_eq!(server.webhook.readiness(), Ok(()));
}

#[tokio::test]
async fn a_template_watch_failing_beyond_its_grace_period_is_not_ready_until_a_fresh_list() {
    let server = start(&[LOGGER]).await;
    let templates = &server.webhook.templates;
    let grace = templates.watch_grace();
    assert_eq!(grace, Duration::from_secs(60), "the default");
    let now = tokio::time::Instant::now();
    // A failure that just began is within the grace period.
    assert!(templates.watch_failed(now.into_std()));
    assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
    // One that began longer ago than the grace period is not.
    templates.mark_synced();
    let long_ago = now.checked_sub(grace + Duration::from_secs(1)).unwrap();
    assert!(templates.watch_failed(long_ago.into_std()));
    let (status, reason) = server.admin_get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(reason.contains("SidecarTemplate watch"), "{reason}");
    // Admission keeps answering from the last snapshot meanwhile; readiness only steers the
    // Service away.
    let mut client = server.client().await;
    let (status, _) = client
        .post(
            "/mutate",
            serde_json::to_vec(&pod_review("admission.k8s.io/v1", "s", web_pod())).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    // A fresh complete list makes it ready again.
    templates.mark_synced();
    assert_eq!(server.admin_get("/readyz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn certificate_rotation_fails_no_request() {
    let server = start(&[LOGGER]).await;
    let new_ca = common::Ca::new("rotated-ca");
    let roots = vec![server.ca.der(), new_ca.der()];
    let (cert, key, new_leaf) = new_ca.issue("rotated");
    let failures = Arc::new(AtomicUsize::new(0));
    let successes = Arc::new(AtomicUsize::new(0));
    let body = Bytes::from(
        serde_json::to_vec(&pod_review("admission.k8s.io/v1", "r", web_pod())).unwrap(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (roots, failures, successes, body) = (
            roots.clone(),
            failures.clone(),
            successes.clone(),
            body.clone(),
        );
        let addr = server.admission;
        workers.push(tokio::spawn(async move {
            let mut kept: Option<Client> = None;
            while tokio::time::Instant::now() < deadline {
                // Half the workers reconnect for every request (they see the new certificate at
                // once); the others keep their connection alive across the rotation.
                if worker % 2 == 0 || kept.is_none() {
                    match Client::connect(addr, &roots).await {
                        Ok(client) => kept = Some(client),
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                }
                let client = kept.as_mut().unwrap();
                match client.post("/mutate", body.clone()).await {
                    Ok((StatusCode::OK, _)) => successes.fetch_add(1, Ordering::Relaxed),
                    _ => failures.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    server
        .webhook
        .certificates
        .set_pem(cert.as_bytes(), key.as_bytes())
        .unwrap();
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    assert!(
        successes.load(Ordering::Relaxed) > 20,
        "too few requests to mean anything"
    );
    let client = Client::connect(server.admission, &roots).await.unwrap();
    assert_eq!(
        client.peer_certificate, new_leaf,
        "new connections get the new certificate"
    );
}

#[tokio::test]
async fn certificate_files_are_reloaded_when_they_change() {
    let dir = std::env::temp_dir().join(format!("webhook-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    let ca = common::Ca::new("files-ca");
    let (cert, key, first) = ca.issue("first");
    std::fs::write(&cert_path, &cert).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    let store = injector_webhook::CertificateStore::new();
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = injector_webhook::tls::load_and_watch_files(
        store.clone(),
        cert_path.clone(),
        key_path.clone(),
        Duration::from_millis(50),
        stop.clone(),
    )
    .await
    .unwrap();
    let current = || store.leaf().unwrap();
    assert_eq!(current(), first);

    // Half a pair (the certificate without its key) keeps the old certificate in service.
    let (cert2, key2, second) = ca.issue("second");
    std::fs::write(&cert_path, &cert2).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(current(), first);
    std::fs::write(&key_path, &key2).unwrap();
    let mut waited = 0;
    while current() != second && waited < 50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(current(), second);
    stop.cancel();
    watcher.await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish() {
    let server = start(&[LOGGER]).await;
    let mut client = server.client().await;
    let body = serde_json::to_vec(&pod_review("admission.k8s.io/v1", "slow", web_pod())).unwrap();
    let (mut sender, channel) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    let (first, rest) = body.split_at(body.len() / 2);
    let (first, rest) = (Bytes::copy_from_slice(first), Bytes::copy_from_slice(rest));
    let in_flight = tokio::spawn(async move {
        client
            .send(Method::POST, "/mutate", "application/json", channel.boxed())
            .await
    });
    sender.send_data(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.stop.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The listener is closed: new connections are refused.
    assert!(
        Client::connect(server.admission, &[server.ca.der()])
            .await
            .is_err()
    );
    sender.send_data(rest).await.unwrap();
    drop(sender);
    let (status, body) = in_flight.await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["response"]["uid"], "slow");
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_slow_body_times_out_with_408() {
    let limits = Limits {
        request_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let server = start_with(&[LOGGER], limits).await;
    let mut client = server.client().await;
    let (mut sender, channel) =
        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(4);
    sender.send_data(Bytes::from_static(b"{")).await.unwrap();
    let (status, _) = client
        .send(Method::POST, "/mutate", "application/json", channel.boxed())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    drop(sender);
}
