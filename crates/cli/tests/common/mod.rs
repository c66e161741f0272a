//! What the tests of the binary share: starting `serve` on template files with a fresh
//! certificate, and talking to it over TLS and plain HTTP.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustls_pki_types::{CertificateDer, ServerName};

/// A child process, killed when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh directory for one test's files, removed when dropped, also when the test fails.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for one test's files. Keep it bound while the test uses it: a temporary
/// (`scratch().join(…)`) is removed at the end of its statement.
pub fn scratch() -> Scratch {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sidecar-injector-serve-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

pub fn certificate(dir: &Path) -> CertificateDer<'static> {
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
pub fn wait_for_address(child: &mut Child) -> (String, String) {
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

pub fn https_post(
    address: &str,
    root: &CertificateDer<'static>,
    path: &str,
    body: &[u8],
) -> String {
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

pub fn http_get(address: &str, path: &str) -> String {
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

/// `serve` running on `templates` with a fresh certificate, logging JSON.
pub struct Served {
    pub child: Killed,
    pub admission: String,
    pub admin: String,
    pub root: CertificateDer<'static>,
    /// Dropped after the child is killed (fields drop in order).
    pub dir: Scratch,
}

impl Served {
    pub fn start(templates: &Path, extra: &[&str]) -> Served {
        let dir = scratch();
        let root = certificate(&dir);
        let mut child = Killed(
            Command::new(binary())
                .args(["serve", "--templates"])
                .arg(templates)
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
                ])
                .args(extra)
                // As the chart runs it: freed pages go back at once (see its Deployment).
                .env("MIMALLOC_PURGE_DELAY", "0")
                .stderr(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let (admission, admin) = wait_for_address(&mut child.0);
        Served {
            child,
            admission,
            admin,
            root,
            dir,
        }
    }

    pub fn post(&self, path: &str, body: &[u8]) -> String {
        https_post(&self.admission, &self.root, path, body)
    }
}

/// The binary under test: this build's, or `SIDECAR_INJECTOR_BIN` (to measure a release
/// build).
pub fn binary() -> PathBuf {
    std::env::var_os("SIDECAR_INJECTOR_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_sidecar-injector").into(),
        PathBuf::from,
    )
}

/// The examples' templates.
pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}
