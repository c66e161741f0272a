//! `sidecar-injector serve` as a user runs it: the binary, template files, certificate files,
//! a request over TLS, and SIGTERM (a drain, then a clean exit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::{CertificateDer, ServerName};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sidecar-injector-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn certificate(dir: &Path) -> CertificateDer<'static> {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    cert.der().clone()
}

/// Reads the child's log until the "serving" line and returns the admission address.
fn wait_for_address(child: &mut Child) -> (String, String) {
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        if line.contains("\"message\":\"serving\"") {
            let value: serde_json::Value = serde_json::from_str(&line).unwrap();
            // Keep draining the log so the child never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return (
                value["admission"].as_str().unwrap().to_owned(),
                value["admin"].as_str().unwrap().to_owned(),
            );
        }
    }
    panic!("serve did not start");
}

fn https_post(address: &str, root: &CertificateDer<'static>, path: &str, body: &[u8]) -> String {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp = TcpStream::connect(address).unwrap();
    let mut tls = rustls::Stream::new(&mut connection, &mut tcp);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).unwrap();
    tls.write_all(body).unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

fn http_get(address: &str, path: &str) -> String {
    let mut tcp = TcpStream::connect(address).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_answers_from_template_files_and_drains_on_sigterm() {
    let dir = scratch();
    let root = certificate(&dir);
    let (mut child, admission, admin) = spawn_serve(&dir, "5s");
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
    let response = https_post(&admission, &root, "/mutate", &request);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    let review: serde_json::Value = serde_json::from_str(body).unwrap();
    let applied = review["response"]["auditAnnotations"]["templates-applied"]
        .as_str()
        .unwrap();
    assert!(applied.contains("native-proxy@1"), "{applied}");

    // SIGTERM: not ready at once, still answering during the drain, then a clean exit.
    sigterm(&child.0);
    let not_ready = wait_not_ready(&admin);
    assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
    assert!(not_ready.contains("shutting down"), "{not_ready}");
    let response = https_post(&admission, &root, "/mutate", &request);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "{response}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_second_sigterm_cuts_the_drain_short() {
    let dir = std::env::temp_dir().join(format!(
        "sidecar-injector-serve-twice-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    certificate(&dir);
    let (mut child, _, admin) = spawn_serve(&dir, "10m");
    sigterm(&child.0);
    // The first signal is taken (draining) before the second is sent.
    assert!(wait_not_ready(&admin).starts_with("HTTP/1.1 503"));
    sigterm(&child.0);
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `serve` of the examples with the certificate in `dir`, on free ports, with `--drain-period
/// drain`; and its admission and admin addresses.
fn spawn_serve(dir: &Path, drain: &str) -> (Killed, String, String) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
            .args(["serve", "--templates"])
            .arg(&examples)
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--drain-period",
                drain,
            ])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (admission, admin) = wait_for_address(&mut child.0);
    (child, admission, admin)
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
    let dir = scratch().join("invalid");
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
    let dir = scratch().join("no-cluster");
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
