//! `sidecar-injector serve` as a user runs it: the binary, template files, certificate files,
//! a request over TLS, and SIGTERM (a drain, then a clean exit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{Killed, Served, binary, certificate, examples, http_get, https_post, scratch};

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

/// What a request carries into the log line of its admission (uid, namespace, Pod name) cannot
/// start a line of its own, in either format: it is quoted and escaped.
#[test]
fn a_request_cannot_forge_a_log_line() {
    const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO forged";
    for format in ["text", "json"] {
        let dir = scratch();
        let root = certificate(&dir);
        let log = dir.join("serve.log");
        let _child = Killed(
            Command::new(binary())
                .args(["serve", "--templates"])
                .arg(examples())
                .arg("--tls-cert")
                .arg(dir.join("tls.crt"))
                .arg("--tls-key")
                .arg(dir.join("tls.key"))
                .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
                .args(["--log-format", format])
                .stderr(std::fs::File::create(&log).unwrap())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let admission = logged_address(&log);
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("u\n{FORGED} uid"),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": format!("ns\r\n{FORGED} namespace"),
                "operation": "CREATE",
                "object": {
                    "metadata": {"name": format!("p\n{FORGED} name"), "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx"}]}
                }
            }
        });
        let response = https_post(
            &admission,
            &root,
            "/mutate",
            &serde_json::to_vec(&review).unwrap(),
        );
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        // The admission's line is written before the answer is sent.
        let text = std::fs::read_to_string(&log).unwrap();
        let line = text
            .lines()
            .find(|line| line.contains("forged uid"))
            .unwrap_or_else(|| panic!("{format}: no admission line in\n{text}"));
        for part in ["uid", "namespace", "name"] {
            assert!(
                line.contains(&format!("{FORGED} {part}")),
                "{format}: {line}"
            );
        }
        for line in text.lines() {
            assert!(
                !line.starts_with(FORGED),
                "{format}: a forged line:\n{text}"
            );
            if format == "json" {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            }
        }
    }
}

/// The admission address from the "serving" line of the log at `path` (text or JSON).
fn logged_address(path: &std::path::Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().find(|line| line.contains("serving")) {
            let at = line.find("admission").unwrap() + "admission".len();
            let address: String = line[at..]
                .trim_start_matches(['"', ':', '='])
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect();
            return address;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "serve did not start: {}",
        std::fs::read_to_string(path).unwrap_or_default()
    );
}
