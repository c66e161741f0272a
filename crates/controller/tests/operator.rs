//! The operator's API calls against a mocked API server (tower-test), in the manner of
//! kube-rs/controller-rs: a task plays the API server, asserting each request and answering it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_controller::policy_backend::Backend;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::{Method, Request, Response, StatusCode};
use injector_controller::certs::{self, CertificateBundle, Lifetimes, ServingNames};
use injector_controller::metrics::ControllerMetrics;
use injector_controller::operator::{
    OperatorOptions, apply_configuration, load_secret, rotate_certificates,
};
use injector_controller::webhook_config::{Endpoint, WebhookConfigOptions, desired_configuration};
use injector_core::{Registry, compile};
use injector_webhook::CertificateStore;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::client::Body;
use prometheus_client::registry::Registry as MetricsRegistry;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn mock() -> (kube::Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "sidecar-injector"), handle)
}

async fn next(
    handle: &mut Handle,
) -> (
    http::request::Parts,
    Value,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("a request")
        .expect("the client is alive");
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (parts, body, send)
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, status: StatusCode, body: Value) {
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

fn not_found(name: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
        "message": format!("secrets \"{name}\" not found")})
}

/// The certificate Secret as the API server returns it, holding `bundle`.
fn stored_secret(bundle: &CertificateBundle, resource_version: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("sidecar-injector-tls".into()),
            namespace: Some("sidecar-injector".into()),
            resource_version: Some(resource_version.into()),
            ..Default::default()
        },
        data: Some(bundle.to_secret_data()),
        ..Default::default()
    }
}

fn options() -> OperatorOptions {
    OperatorOptions {
        namespace: "sidecar-injector".into(),
        secret_name: "sidecar-injector-tls".into(),
        serving_names: ServingNames::for_service("sidecar-injector", "sidecar-injector", None),
        lifetimes: Lifetimes::default(),
        webhook: WebhookConfigOptions::new(
            "sidecar-injector",
            Endpoint::Service {
                namespace: "sidecar-injector".into(),
                name: "sidecar-injector".into(),
                port: 443,
            },
            "sidecar-injector",
        ),
        backend: Backend::Webhook,
        policy_name: "sidecar-injector".into(),
    }
}

/// A bundle issued now for `options`.
fn fresh_bundle(options: &OperatorOptions) -> CertificateBundle {
    certs::reconcile(
        None,
        &options.serving_names,
        &options.lifetimes,
        SystemTime::now(),
    )
    .unwrap()
    .bundle
}

/// Metrics for one test, with the registry that exposes them.
fn metrics() -> (ControllerMetrics, MetricsRegistry) {
    let mut registry = MetricsRegistry::default();
    (ControllerMetrics::register(&mut registry), registry)
}

/// The text exposition of `registry`.
fn exposed(registry: &MetricsRegistry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// [`rotate_certificates`] where publishing a CA would be a bug (the certificates are current).
async fn rotate_without_publishing(
    client: kube::Client,
    options: &OperatorOptions,
) -> CertificateBundle {
    let secrets: Api<Secret> = Api::namespaced(client, "sidecar-injector");
    rotate_certificates(&secrets, options, &metrics().0, |_| async {
        panic!("nothing to publish")
    })
    .await
    .unwrap()
}

/// [`options`] with the chart's ClusterRole as the owner of what the operator creates.
fn owned_options() -> OperatorOptions {
    let mut options = options();
    options.webhook.owner = Some(OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: "sidecar-injector".into(),
        uid: "role-uid".into(),
        ..OwnerReference::default()
    });
    options
}

#[tokio::test]
async fn a_missing_secret_is_created_after_the_ca_is_published() {
    let (client, mut handle) = mock();
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let server_events = Arc::clone(&events);
    let server = tokio::spawn(async move {
        let (parts, _, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::GET);
        assert_eq!(
            parts.uri.path(),
            "/api/v1/namespaces/sidecar-injector/secrets/sidecar-injector-tls"
        );
        respond(
            send,
            StatusCode::NOT_FOUND,
            not_found("sidecar-injector-tls"),
        );

        let (parts, body, send) = next(&mut handle).await;
        server_events.lock().unwrap().push("secret created".into());
        assert_eq!(parts.method, Method::POST);
        assert_eq!(
            parts.uri.path(),
            "/api/v1/namespaces/sidecar-injector/secrets"
        );
        assert_eq!(body["metadata"]["name"], "sidecar-injector-tls");
        assert_eq!(body["type"], "kubernetes.io/tls");
        assert_eq!(
            body["metadata"]["ownerReferences"][0]["uid"], "role-uid",
            "owned by the installation's ClusterRole"
        );
        for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
            assert!(body["data"][key].is_string(), "{key} missing: {body}");
        }
        respond(send, StatusCode::CREATED, body.clone());
        body
    });
    let secrets: Api<Secret> = Api::namespaced(client, "sidecar-injector");
    let published = Arc::clone(&events);
    let bundle = rotate_certificates(&secrets, &owned_options(), &metrics().0, |ca| async move {
        assert!(ca.contains("BEGIN CERTIFICATE"));
        published.lock().unwrap().push("ca published".into());
        Ok(())
    })
    .await
    .unwrap();
    let created = server.await.unwrap();
    assert_eq!(
        *events.lock().unwrap(),
        ["ca published", "secret created"],
        "the API server trusts the CA first"
    );

    // What was written is what was returned, and a replica loads it.
    let secret: Secret = serde_json::from_value(created).unwrap();
    let store = CertificateStore::new();
    let loaded = load_secret(&secret, &store, &metrics().0).unwrap();
    assert_eq!(loaded, bundle);
    assert!(store.is_loaded());
}

#[tokio::test]
async fn a_current_secret_is_left_alone() {
    let (client, mut handle) = mock();
    let options = options();
    let fresh = fresh_bundle(&options);
    let secret = stored_secret(&fresh, "7");
    let server = tokio::spawn(async move {
        let (parts, _, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::GET);
        respond(send, StatusCode::OK, serde_json::to_value(&secret).unwrap());
        // No further request may come (before the timeout or the client is dropped).
        assert!(
            !matches!(
                tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await,
                Ok(Some(_))
            ),
            "an unexpected request"
        );
    });
    assert_eq!(rotate_without_publishing(client, &options).await, fresh);
    server.await.unwrap();
}

#[tokio::test]
async fn a_current_secret_without_the_owner_gets_it_and_keeps_its_certificates() {
    let (client, mut handle) = mock();
    let options = owned_options();
    let fresh = fresh_bundle(&options);
    let secret = stored_secret(&fresh, "7");
    let stored_data = serde_json::to_value(&secret).unwrap()["data"].clone();
    let server = tokio::spawn(async move {
        let (_, _, send) = next(&mut handle).await;
        respond(send, StatusCode::OK, serde_json::to_value(&secret).unwrap());
        let (parts, body, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::PUT);
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "role-uid");
        assert_eq!(body["data"], stored_data, "the certificates are unchanged");
        respond(send, StatusCode::OK, body);
    });
    assert_eq!(rotate_without_publishing(client, &options).await, fresh);
    server.await.unwrap();
}

#[tokio::test]
async fn an_expiring_serving_certificate_is_replaced_keeping_its_resource_version() {
    let (client, mut handle) = mock();
    let mut options = options();
    options.lifetimes = Lifetimes {
        ca: Duration::from_secs(3600),
        serving: Duration::from_secs(600),
    };
    let long_ago = SystemTime::now() - Duration::from_secs(500);
    let old = certs::reconcile(None, &options.serving_names, &options.lifetimes, long_ago)
        .unwrap()
        .bundle;
    let secret = stored_secret(&old, "42");
    let old_serving = old.serving.chain_pem.clone();
    let server = tokio::spawn(async move {
        let (_, _, send) = next(&mut handle).await;
        respond(send, StatusCode::OK, serde_json::to_value(&secret).unwrap());
        let (parts, body, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::PUT);
        assert_eq!(
            parts.uri.path(),
            "/api/v1/namespaces/sidecar-injector/secrets/sidecar-injector-tls"
        );
        assert_eq!(
            body["metadata"]["resourceVersion"], "42",
            "optimistic concurrency"
        );
        respond(send, StatusCode::OK, body);
    });
    let secrets: Api<Secret> = Api::namespaced(client, "sidecar-injector");
    let bundle = rotate_certificates(&secrets, &options, &metrics().0, |_| async { Ok(()) })
        .await
        .unwrap();
    assert_ne!(bundle.serving.chain_pem, old_serving);
    assert_eq!(bundle.ca, old.ca, "the CA is not due yet");
    server.await.unwrap();
}

/// The Secret of `bundle` with `ca-previous.crt` garbage.
fn with_garbage_previous(bundle: &CertificateBundle) -> Secret {
    let mut secret = stored_secret(bundle, "9");
    secret.data.as_mut().unwrap().insert(
        "ca-previous.crt".into(),
        k8s_openapi::ByteString(b"-----BEGIN CERTIFICATE-----\ngarbage\n".to_vec()),
    );
    secret
}

#[tokio::test]
async fn an_unreadable_previous_ca_is_dropped_and_the_readable_ca_kept() {
    let (client, mut handle) = mock();
    let options = options();
    let fresh = fresh_bundle(&options);
    let secret = with_garbage_previous(&fresh);
    let server = tokio::spawn(async move {
        let (parts, _, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::GET);
        respond(send, StatusCode::OK, serde_json::to_value(&secret).unwrap());
        let (parts, body, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::PUT);
        respond(send, StatusCode::OK, body.clone());
        body
    });
    let (metrics, registry) = metrics();
    let secrets: Api<Secret> = Api::namespaced(client, "sidecar-injector");
    // The CA stays: nothing new to publish.
    let bundle = rotate_certificates(&secrets, &options, &metrics, |_| async {
        panic!("the readable CA was replaced")
    })
    .await
    .unwrap();
    assert_eq!(bundle, fresh);
    let written = server.await.unwrap();
    let expected = serde_json::to_value(fresh.to_secret_data()).unwrap();
    assert_eq!(
        written["data"], expected,
        "the rest kept, the garbage dropped"
    );
    let text = exposed(&registry);
    assert!(
        text.contains(
            "sidecar_injector_certificate_secret_unreadable_keys_total{key=\"ca-previous.crt\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn a_replica_serves_from_a_secret_with_an_unreadable_previous_ca() {
    let options = options();
    let fresh = fresh_bundle(&options);
    let store = CertificateStore::new();
    let (metrics, registry) = metrics();
    let loaded = load_secret(&with_garbage_previous(&fresh), &store, &metrics).unwrap();
    assert_eq!(loaded, fresh);
    assert!(store.is_loaded());
    assert!(exposed(&registry).contains(
        "sidecar_injector_certificate_secret_unreadable_keys_total{key=\"ca-previous.crt\"} 1"
    ));
}

fn snapshot() -> Arc<injector_core::Snapshot> {
    let mut registry = Registry::new();
    for yaml in [
        "metadata: {name: a}\nspec:\n  priority: 5\n  podSelector: {matchLabels: {app: web}}\n  containers: [{name: a, image: a}]",
        "metadata: {name: b}\nspec:\n  failurePolicy: Ignore\n  containers: [{name: b, image: b}]",
    ] {
        let mut value: Value = serde_saphyr::from_str(yaml).unwrap();
        value["apiVersion"] = "sidecar.dev/v1alpha1".into();
        value["kind"] = "SidecarTemplate".into();
        registry.apply(compile(&serde_json::from_value(value).unwrap()).unwrap());
    }
    registry.snapshot()
}

#[tokio::test]
async fn the_configuration_is_server_side_applied_with_force() {
    let (client, mut handle) = mock();
    let options = options();
    let desired = desired_configuration(
        &snapshot(),
        &options.webhook,
        b"-----BEGIN CERTIFICATE-----\n",
    );
    let expected = serde_json::to_value(&desired).unwrap();
    let server = tokio::spawn(async move {
        let (parts, body, send) = next(&mut handle).await;
        assert_eq!(parts.method, Method::PATCH);
        assert_eq!(
            parts.uri.path(),
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sidecar-injector"
        );
        let query = parts.uri.query().unwrap_or_default();
        assert!(
            query.contains("fieldManager=sidecar-injector") && query.contains("force=true"),
            "{query}"
        );
        assert_eq!(
            parts.headers["content-type"],
            "application/apply-patch+yaml"
        );
        assert_eq!(body, expected);
        let entries: Vec<&str> = body["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].as_str().unwrap())
            .collect();
        assert_eq!(entries.len(), 2);
        assert!(
            entries[0].starts_with("fail-"),
            "the priority-5 group first: {entries:?}"
        );
        for entry in body["webhooks"].as_array().unwrap() {
            let excluded = &entry["namespaceSelector"]["matchExpressions"];
            assert!(excluded.to_string().contains("kube-system"), "{excluded}");
            assert!(
                entry["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap()
                    .starts_with("/mutate/")
            );
            assert!(entry["clientConfig"]["caBundle"].is_string());
        }
        respond(send, StatusCode::OK, body);
    });
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    apply_configuration(&api, &desired).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn an_unusable_secret_keeps_the_current_certificate() {
    let store = CertificateStore::new();
    let garbage = Secret {
        data: Some(
            [(
                "tls.crt".to_owned(),
                k8s_openapi::ByteString(b"junk".to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    assert!(load_secret(&garbage, &store, &metrics().0).is_none());
    assert!(!store.is_loaded());
    let empty = Secret::default();
    assert!(load_secret(&empty, &store, &metrics().0).is_none());
}

#[test]
fn drift_is_repaired_and_only_drift() {
    use injector_controller::operator::configuration_change;
    let options = options();
    let desired = desired_configuration(&snapshot(), &options.webhook, b"ca");
    // Nothing applied yet, or a resync: apply.
    assert!(configuration_change(&desired, None, None).is_some());
    // Applied and nothing happened since: nothing to do.
    assert_eq!(configuration_change(&desired, None, Some(&desired)), None);
    // The watch shows our own write, with the API server's defaults: not drift.
    let mut echoed = serde_json::to_value(&desired).unwrap();
    echoed["metadata"]["resourceVersion"] = "12".into();
    echoed["metadata"]["managedFields"] =
        json!([{"manager": "sidecar-injector", "operation": "Apply"}]);
    let echoed: MutatingWebhookConfiguration = serde_json::from_value(echoed).unwrap();
    assert_eq!(
        configuration_change(&desired, Some(Some(&echoed)), Some(&desired)),
        None
    );
    // Someone deleted it.
    let reason = configuration_change(&desired, Some(None), Some(&desired)).unwrap();
    assert!(reason.contains("deleted"), "{reason}");
    // Someone changed an entry's failure policy, or removed an entry.
    let mut edited = desired.clone();
    edited.webhooks.as_mut().unwrap()[0].failure_policy = Some("Ignore".into());
    assert!(
        configuration_change(&desired, Some(Some(&edited)), Some(&desired))
            .unwrap()
            .contains("someone else changed it")
    );
    let mut removed = desired.clone();
    removed.webhooks.as_mut().unwrap().pop();
    assert!(configuration_change(&desired, Some(Some(&removed)), Some(&desired)).is_some());
    // A new caBundle (a CA rotation) means a new desired configuration: apply.
    let rotated = desired_configuration(&snapshot(), &options.webhook, b"ca2");
    assert!(configuration_change(&rotated, None, Some(&desired)).is_some());
}
