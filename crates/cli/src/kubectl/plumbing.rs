//! What `kubectl sidecar check` reads, and nothing else: it never writes. Each read is kept
//! apart ([`Read`]), so that one the user may not make (forbidden) or that fails costs only
//! the links that need it, and [`super::check::judge`] says so on their lines.
//!
//! A TLS handshake fetches the certificate the webhook serves, which the judge verifies with
//! the caBundle: with the URL the entries call (an operator out of the cluster), else with a
//! ready endpoint of the Service (a replica's address, reachable from inside the cluster and
//! seldom from outside, so a short wait). The handshake itself trusts anything, and nothing is
//! sent over it.

use std::sync::Arc;
use std::time::Duration;

use injector_api::SidecarTemplate;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde::de::DeserializeOwned;

use super::check::{Handshake, Names, Observed, Read, Target, operator_names, runs_operator};
use super::cluster;

/// How long the handshake with the webhook's URL may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the handshake with a replica's address may take: short, as from outside the
/// cluster it is usually not reachable at all, and the Secret's certificate is checked then.
const ENDPOINT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the command was asked about.
#[derive(Clone, Debug)]
pub enum Scope {
    /// The plumbing only.
    Cluster,
    /// A namespace too.
    Namespace(String),
    /// A Pod too, in a namespace.
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// A read's result, kept apart: 404 is [`Read::Missing`], 403 [`Read::Forbidden`].
fn kept<T>(result: Result<T, kube::Error>) -> Read<T> {
    match result {
        Ok(value) => Read::Found(value),
        Err(kube::Error::Api(response)) if response.code == 404 => Read::Missing,
        Err(kube::Error::Api(response)) if response.code == 403 => {
            Read::Forbidden(response.message)
        }
        Err(error) => Read::Failed(error.to_string()),
    }
}

/// A read of what may not exist: `None` is [`Read::Missing`].
fn kept_opt<T>(result: Result<Option<T>, kube::Error>) -> Read<T> {
    kept(result).and_then(|found| found.map_or(Read::Missing, Read::Found))
}

/// The object `name` of `api`, `Missing` when absent.
async fn get<K>(api: Api<K>, name: &str) -> Read<K>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    kept_opt(api.get_opt(name).await)
}

/// Whether the object `name` of `api` exists.
async fn present<K>(api: Api<K>, name: &str) -> Read<()>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    get(api, name).await.and_then(|_| Read::Found(()))
}

/// Every object of `api` matching `params` (one page: a namespace's NetworkPolicies or a
/// Service's EndpointSlices are few).
async fn list<K>(api: Api<K>, params: &ListParams) -> Read<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    kept(api.list(params).await).and_then(|list| Read::Found(list.items))
}

/// A cluster-scoped admission object of `admissionregistration.k8s.io/v1` that k8s-openapi
/// may not know (MutatingAdmissionPolicies are served from Kubernetes 1.36).
fn admission_api(client: &Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// The operator's Deployment, and the names its objects have ([`operator_names`]): the
/// Deployment named as the chart would name it (`assumed`), else the release's
/// (`app.kubernetes.io/instance=<release>`) that runs the operator, whose name follows the
/// chart's `nameOverride` or `fullnameOverride`. The names are `assumed`, saying why, when no
/// Deployment can be read.
pub async fn operator(client: &Client, release: &str, assumed: Names) -> (Read<Deployment>, Names) {
    let api = Api::<Deployment>::namespaced(client.clone(), &assumed.namespace);
    let mut deployment = get(api.clone(), &assumed.deployment).await;
    if deployment.is_missing() {
        let of_release =
            ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
        deployment = list(api, &of_release).await.and_then(|found| {
            found
                .into_iter()
                .find(runs_operator)
                .map_or(Read::Missing, Read::Found)
        });
    }
    let names = operator_names(&deployment, assumed);
    (deployment, names)
}

/// Reads everything `check` judges, the objects named by what the operator's Deployment runs
/// with ([`operator`]), and the namespace or Pod of `scope`; returns the names too. The reads
/// after the Deployment do not depend on each other, so they are made at once: only the
/// handshakes wait, for the configuration (the URL it calls) and the Service's EndpointSlices.
pub async fn observe(
    client: &Client,
    release: &str,
    assumed: Names,
    scope: &Scope,
) -> (Names, Observed) {
    let (deployment, names) = operator(client, release, assumed).await;
    let ns = names.namespace.as_str();
    let every = ListParams::default();
    let (
        (configuration, slices, handshake, endpoint_handshake),
        lease,
        service,
        secret,
        network_policies,
        (policy, policy_binding, guard),
        templates,
        target,
    ) = tokio::join!(
        webhook(client, &names),
        get(Api::<Lease>::namespaced(client.clone(), ns), &names.lease),
        get(
            Api::<Service>::namespaced(client.clone(), ns),
            &names.service
        ),
        get(Api::<Secret>::namespaced(client.clone(), ns), &names.secret),
        list(Api::<NetworkPolicy>::namespaced(client.clone(), ns), &every),
        admission(client, &names),
        list(Api::<SidecarTemplate>::all(client.clone()), &every),
        target(client, scope),
    );
    let observed = Observed {
        deployment,
        lease,
        configuration,
        service,
        slices,
        secret,
        handshake,
        endpoint_handshake,
        network_policies,
        policy,
        policy_binding,
        guard,
        templates,
        target,
    };
    (names, observed)
}

/// The webhook configuration, the Service's EndpointSlices, and the handshake each allows:
/// with the URL the entries call, else with a ready endpoint (a replica's address).
async fn webhook(
    client: &Client,
    names: &Names,
) -> (
    Read<MutatingWebhookConfiguration>,
    Read<Vec<EndpointSlice>>,
    Option<Handshake>,
    Option<Handshake>,
) {
    let of_service =
        ListParams::default().labels(&format!("kubernetes.io/service-name={}", names.service));
    let (configuration, slices) = tokio::join!(
        get(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            &names.webhook_configuration,
        ),
        list(
            Api::<EndpointSlice>::namespaced(client.clone(), &names.namespace),
            &of_service,
        ),
    );
    let handshake = match configuration.found().and_then(first_url) {
        Some(url) => Some(handshake(&url).await),
        None => None,
    };
    // Through the Service only: with a URL, the handshake above is the replica's.
    let endpoint_handshake = match (&handshake, slices.found()) {
        (None, Some(slices)) => endpoint_handshake(slices, &names.service_host()).await,
        _ => None,
    };
    (configuration, slices, handshake, endpoint_handshake)
}

/// Whether the MutatingAdmissionPolicy, its binding and the guard exist.
async fn admission(client: &Client, names: &Names) -> (Read<()>, Read<()>, Read<()>) {
    let policy = names.policy.as_str();
    let guard = names.guard();
    tokio::join!(
        present(
            admission_api(
                client,
                "MutatingAdmissionPolicy",
                "mutatingadmissionpolicies",
            ),
            policy,
        ),
        present(
            admission_api(
                client,
                "MutatingAdmissionPolicyBinding",
                "mutatingadmissionpolicybindings",
            ),
            policy,
        ),
        present(
            Api::<ValidatingAdmissionPolicy>::all(client.clone()),
            &guard,
        ),
    )
}

async fn target(client: &Client, scope: &Scope) -> Option<Target> {
    match scope {
        Scope::Cluster => None,
        Scope::Namespace(name) => {
            let (labels, pods) = tokio::join!(cluster::labels_of(client, name), pods(client, name));
            Some(Target::Namespace {
                name: name.clone(),
                labels: kept_opt(labels),
                pods,
            })
        }
        Scope::Pod { namespace, name } => {
            let (labels, pod) = tokio::join!(
                cluster::labels_of(client, namespace),
                cluster::metadata_opt::<Pod>(client, namespace, name)
            );
            Some(Target::Pod {
                namespace: namespace.clone(),
                name: name.clone(),
                labels: kept_opt(labels),
                pod: kept_opt(pod).and_then(|meta| Read::Found(Box::new(meta))),
            })
        }
    }
}

/// The metadata of the Pods of `namespace`, without their `managedFields`.
async fn pods(client: &Client, namespace: &str) -> Read<Vec<ObjectMeta>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    kept(cluster::metadata_pages(&api).await)
}

/// The base URL of the configuration's first entry, when it calls one.
fn first_url(configuration: &MutatingWebhookConfiguration) -> Option<String> {
    configuration
        .webhooks
        .as_ref()?
        .first()?
        .client_config
        .url
        .clone()
}

/// A TLS handshake with `url`'s host and port: the certificate chain it serves.
async fn handshake(url: &str) -> Handshake {
    let (host, port) = host_and_port(url);
    let served = bounded(served_chain(&host, port, &host), HANDSHAKE_TIMEOUT).await;
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    Handshake {
        url: format!("https://{authority}"),
        host,
        served,
    }
}

/// A TLS handshake with the first ready endpoint of `slices` (its address and the port named
/// `webhook`, else its first), asking for `host` (the Service's name, as the API server does):
/// the certificate a replica serves. `None` when there is no such endpoint. From outside the
/// cluster a Pod's address is seldom reachable: that is an error here, not a broken link.
pub(super) async fn endpoint_handshake(slices: &[EndpointSlice], host: &str) -> Option<Handshake> {
    let (address, port) = first_ready_endpoint(slices)?;
    let served = bounded(
        served_chain(&address, port, host),
        ENDPOINT_HANDSHAKE_TIMEOUT,
    )
    .await;
    let shown = if address.contains(':') {
        format!("[{address}]")
    } else {
        address
    };
    Some(Handshake {
        url: format!("https://{shown}:{port}"),
        host: host.to_owned(),
        served,
    })
}

/// The address and webhook port of the first ready endpoint of `slices` (the port named
/// `webhook`, as the chart's Service names it, else the slice's first); an endpoint whose
/// `ready` is unset counts as ready.
fn first_ready_endpoint(slices: &[EndpointSlice]) -> Option<(String, u16)> {
    slices.iter().find_map(|slice| {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some("webhook"))
            .or_else(|| ports.first())
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())?;
        let endpoint = slice
            .endpoints
            .iter()
            .find(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))?;
        Some((endpoint.addresses.first()?.clone(), port))
    })
}

/// `handshake`, or an error once `timeout` has passed.
async fn bounded(
    handshake: impl Future<Output = Result<Vec<Vec<u8>>, String>>,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, String> {
    tokio::time::timeout(timeout, handshake)
        .await
        .unwrap_or_else(|_| Err(format!("no TLS handshake within {timeout:?}")))
}

/// The host (without IPv6 brackets) and port (443 unless given) of an `https://` URL.
fn host_and_port(url: &str) -> (String, u16) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, rest) = bracketed.split_once(']').unwrap_or((bracketed, ""));
        let port = rest.strip_prefix(':').and_then(|p| p.parse().ok());
        return (host.to_owned(), port.unwrap_or(443));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => (host.to_owned(), port.parse().unwrap_or(443)),
        None => (authority.to_owned(), 443),
    }
}

/// The chain served at `address`:`port` to a client asking for `host`.
async fn served_chain(address: &str, port: u16, host: &str) -> Result<Vec<Vec<u8>>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let recorder = Arc::new(Recorder {
        provider: provider.clone(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(recorder)
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host:?}: {e}"))?;
    let tcp = tokio::net::TcpStream::connect((address, port))
        .await
        .map_err(|e| format!("cannot connect to {address}:{port}: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {address}:{port}: {e}"))?;
    let (_, connection) = stream.get_ref();
    Ok(connection
        .peer_certificates()
        .unwrap_or_default()
        .iter()
        .map(|c| c.to_vec())
        .collect())
}

/// Accepts any certificate (the judge verifies the chain afterwards, with the caBundle), but
/// checks the handshake's signatures as usual.
#[derive(Debug)]
struct Recorder {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests;
