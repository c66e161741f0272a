//! `sidecar-injector serve` as a user runs it: the binary, template files, certificate files,
//! a request over TLS, and SIGTERM (a drain, then a clean exit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{Served, certificate, examples, http_get, scratch};

#[test]
fn serve_answers_from_template_files_and_drains_on_sigterm() {
    let mut served = Served::start(&examples(), &["--drain-period", "5s"]);
    let admin = served.admin.clone();
    assert!(http_get(&admin, "/readyz").starts_with("HTTP/1.1 200"));

    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "serve-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "proxy-demo",
            "operation": "CREATE",
            "object": {
                "metadata": {"name": "checkout", "labels": {"app": "checkout"}, "annotations": {"sidecar.dev/templates": "native-proxy"}},
                "spec": {"containers": [{"name": "checkout", "image": "nginx"}]}
            }
        }
    });
    let request = serde_json::to_vec(&review).unwrap();
    let response = served.post("/mutate", &request);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    let review: serde_json::Value = serde_json::from_str(body).unwrap();
    let applied = review["response"]["auditAnnotations"]["templates-applied"]
        .as_str()
        .unwrap();
    assert!(applied.contains("native-proxy@1"), "{applied}");

    // SIGTERM: not ready at once, still answering during the drain, then a clean exit.
    sigterm(&served.child.0);
    let not_ready = wait_not_ready(&admin);
    assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
    assert!(not_ready.contains("shutting down"), "{not_ready}");
    let response = served.post("/mutate", &request);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{response}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = served.child.0.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_sigterm_cuts_the_drain_short() {
    let mut served = Served::start(&examples(), &["--drain-period", "10m"]);
    sigterm(&served.child.0);
    // The first signal is taken (draining) before the second is sent.
    assert!(wait_not_ready(&served.admin).starts_with("HTTP/1.1 503"));
    sigterm(&served.child.0);
    let status = served.child.0.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `/readyz` once it no longer answers 200 (or after 5 s).
fn wait_not_ready(admin: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let readyz = http_get(admin, "/readyz");
        if !readyz.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
            return readyz;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn serve_refuses_an_invalid_template_with_a_clear_error() {
    let scratch = scratch();
    let dir = scratch.join("invalid");
    std::fs::create_dir_all(&dir).unwrap();
    certificate(&dir);
    std::fs::write(
        dir.join("bad.yaml"),
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: bad}\nspec:\n  containers: [{name: x}]\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .args(["serve", "--templates"])
        .arg(dir.join("bad.yaml"))
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "bad.yaml: template \"bad\" is invalid: spec.containers[0].image: is required"
        ),
        "{stderr}"
    );
}

#[test]
fn run_without_a_cluster_fails_with_a_clear_error() {
    let scratch = scratch();
    let dir = scratch.join("no-cluster");
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", dir.join("missing-kubeconfig"))
        .env("HOME", &dir)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: cannot connect to Kubernetes"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
