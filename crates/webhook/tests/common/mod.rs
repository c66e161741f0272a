//! A webhook on 127.0.0.1 with generated certificates, and a real TLS client for it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use injector_core::{Registry, Templates, compile};
use injector_webhook::{
    CertificateStore, Limits, Webhook, serve_admin, serve_admission, serve_both,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

pub type Body = BoxBody<Bytes, std::convert::Infallible>;

/// A certificate authority for tests.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A serving certificate for 127.0.0.1: (chain PEM, key PEM, leaf DER).
    pub fn issue(&self, name: &str) -> (String, String, CertificateDer<'static>) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }
}

pub fn template(yaml: &str) -> injector_core::CompiledTemplate {
    let mut value: Value = serde_saphyr::from_str(yaml).unwrap();
    value["apiVersion"] = "sidecar.dev/v1alpha1".into();
    value["kind"] = "SidecarTemplate".into();
    compile(&serde_json::from_value(value).unwrap()).unwrap()
}

pub const LOGGER: &str = r#"
metadata: {name: logger, generation: 2}
spec:
  podSelector: {matchLabels: {app: web}}
  failurePolicy: Ignore
  containers: [{name: logger, image: fluent-bit, args: ["--pod={{ pod.name }}"]}]
  volumes: [{name: logs, emptyDir: {}}]
"#;

pub const AGENT: &str = r#"
metadata: {name: agent}
spec:
  podSelector: {matchLabels: {app: web}}
  priority: 10
  containers: [{name: agent, image: agent}]
"#;

pub struct Server {
    pub admission: SocketAddr,
    pub admin: SocketAddr,
    pub webhook: Arc<Webhook>,
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    pub ca: Ca,
}

pub async fn start(templates: &[&str]) -> Server {
    start_with(templates, Limits::default()).await
}

pub async fn start_with(templates: &[&str], limits: Limits) -> Server {
    let (webhook, ca) = webhook_with(templates, limits);
    let (admission, admin, addresses) = listeners().await;
    let stop = CancellationToken::new();
    tokio::spawn(serve_admin(admin, Arc::clone(&webhook), stop.clone()));
    let task = tokio::spawn(serve_admission(
        admission,
        Arc::clone(&webhook),
        stop.clone(),
    ));
    Server::new(addresses, webhook, stop, task, ca)
}

/// Both servers as `run` and `serve` run them ([`serve_both`]): `stop` begins the drain.
pub async fn start_both(templates: &[&str], limits: Limits) -> Server {
    let (webhook, ca) = webhook_with(templates, limits);
    let (admission, admin, addresses) = listeners().await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve_both(
        admission,
        admin,
        Arc::clone(&webhook),
        stop.clone(),
    ));
    Server::new(addresses, webhook, stop, task, ca)
}

/// A webhook serving `templates` (synced) with a certificate from a new CA.
fn webhook_with(templates: &[&str], limits: Limits) -> (Arc<Webhook>, Ca) {
    let mut registry = Registry::new();
    registry.reset(templates.iter().map(|t| template(t)));
    let shared = Templates::new();
    shared.publish(registry.snapshot());
    shared.mark_synced();
    let ca = Ca::new("test-ca");
    let (cert, key, _) = ca.issue("webhook");
    let certificates = CertificateStore::new();
    certificates
        .set_pem(cert.as_bytes(), key.as_bytes())
        .unwrap();
    let webhook = Arc::new(Webhook::new(
        shared,
        certificates,
        prometheus_client::registry::Registry::default(),
        limits,
    ));
    (webhook, ca)
}

/// The admission and the admin listener on free ports of 127.0.0.1, and their addresses.
async fn listeners() -> (TcpListener, TcpListener, (SocketAddr, SocketAddr)) {
    let admission = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addresses = (admission.local_addr().unwrap(), admin.local_addr().unwrap());
    (admission, admin, addresses)
}

impl Server {
    fn new(
        (admission, admin): (SocketAddr, SocketAddr),
        webhook: Arc<Webhook>,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
        ca: Ca,
    ) -> Self {
        Self {
            admission,
            admin,
            webhook,
            stop,
            task,
            ca,
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.admission, &[self.ca.der()])
            .await
            .unwrap()
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, String) {
        let tcp = TcpStream::connect(self.admin).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(connection);
        let request = Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }
}

/// A TLS connection to `addr`, trusting `roots`.
pub async fn tls_connect(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let server_name = ServerName::IpAddress(addr.ip().into());
    TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// One TLS connection (HTTP/1.1 keep-alive).
pub struct Client {
    sender: SendRequest<Body>,
    pub peer_certificate: CertificateDer<'static>,
}

impl Client {
    pub async fn connect(
        addr: SocketAddr,
        roots: &[CertificateDer<'static>],
    ) -> Result<Client, String> {
        let tls = tls_connect(addr, roots).await?;
        let peer_certificate = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(Client {
            sender,
            peer_certificate,
        })
    }

    /// Whether the connection can take another request: false once the server closed it (say
    /// after an answer with `Connection: close`), which a client learns without sending.
    pub async fn ready(&mut self) -> bool {
        self.sender.ready().await.is_ok()
    }

    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Body,
    ) -> Result<(StatusCode, Bytes), String> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("content-type", content_type)
            .body(body)
            .unwrap();
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }

    pub async fn post(
        &mut self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<(StatusCode, Bytes), String> {
        self.send(Method::POST, path, "application/json", full(body))
            .await
    }

    /// Posts a review and returns the parsed AdmissionReview response (expects HTTP 200).
    pub async fn review(&mut self, path: &str, review: &Value) -> Value {
        let (status, body) = self
            .post(path, serde_json::to_vec(review).unwrap())
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }
}

pub fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

/// An AdmissionReview for a Pod CREATE.
pub fn pod_review(api_version: &str, uid: &str, pod: Value) -> Value {
    serde_json::json!({
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": pod,
            "dryRun": false,
        }
    })
}

pub fn web_pod() -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-5d8f-", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}
    })
}

/// The pod with the response's patch applied.
pub fn patched(pod: &Value, response: &Value) -> Value {
    use base64::Engine as _;
    let patch = response["response"]["patch"].as_str().expect("a patch");
    assert_eq!(response["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = pod.clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}
