//! The operator's loops against a fake API server (kube's mock service, answered by a closure
//! that keeps what the test needs of the cluster's state), on a paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::policy_backend::Backend;
use std::sync::Mutex;

use base64::Engine as _;
use http::{Method, Request, Response, StatusCode};
use injector_core::{Registry, compile};
use kube::client::Body;
use prometheus_client::registry::Registry as MetricsRegistry;
use serde_json::{Value, json};

use std::collections::BTreeSet;
use std::time::SystemTime;

use super::*;
use crate::census;
use crate::skips::{self, SkipKey};
use crate::webhook_config;
use crate::webhook_config::{Endpoint, WebhookConfigOptions};

type Reply = tower_test::mock::SendResponse<Response<Body>>;

const SECRET_PATH: &str = "/api/v1/namespaces/sidecar-injector/secrets/sidecar-injector-tls";
const TEMPLATES_PATH: &str = "/apis/sidecar.dev/v1alpha1/sidecartemplates/";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
/// The caBundle of tests that do not rotate certificates.
const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\n";
const CONFIGURATIONS_PATH: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";

/// One request the fake API server received.
#[derive(Clone, Debug)]
struct Call {
    method: Method,
    path: String,
    query: String,
    body: Value,
    at: Instant,
}

impl Call {
    fn is_watch(&self) -> bool {
        self.query.contains("watch=true")
    }

    fn is(&self, method: Method, path: &str) -> bool {
        self.method == method && self.path.starts_with(path)
    }
}

/// Requests held unanswered (watches with nothing to report yet), for a later answer.
type Held = Vec<(Call, Reply)>;

/// A fake API server: `answer` gives each request's status and body, or `None` to hold it.
/// Returns the client and the log of every request.
fn fake_api(
    mut answer: impl FnMut(&Call, &mut Held) -> Option<(StatusCode, String)> + Send + 'static,
) -> (kube::Client, Arc<Mutex<Vec<Call>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&calls);
    tokio::spawn(async move {
        let mut held = Held::new();
        while let Some((request, reply)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let call = Call {
                method: parts.method,
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().unwrap_or_default().to_owned(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                at: Instant::now(),
            };
            log.lock().unwrap().push(call.clone());
            match answer(&call, &mut held) {
                Some((status, body)) => send(reply, status, body),
                None => held.push((call, reply)),
            }
        }
    });
    (kube::Client::new(service, "sidecar-injector"), calls)
}

fn send(reply: Reply, status: StatusCode, body: String) {
    reply.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body.into_bytes()))
            .unwrap(),
    );
}

fn ok(value: &Value) -> Option<(StatusCode, String)> {
    Some((StatusCode::OK, value.to_string()))
}

fn failure(code: StatusCode, reason: &str) -> Option<(StatusCode, String)> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("{reason} (test)"), "reason": reason, "code": code.as_u16()});
    Some((code, status.to_string()))
}

/// The configurations in `items` for the watcher's list; its watches are held.
fn configurations(call: &Call, items: &[Value]) -> Option<(StatusCode, String)> {
    if call.is_watch() {
        return None;
    }
    ok(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfigurationList",
        "metadata": {"resourceVersion": "5"},
        "items": items,
    }))
}

/// One watch event, the body of a watch that then ends (the watcher watches again).
fn watch_event(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}

fn options(lifetimes: Lifetimes) -> OperatorOptions {
    OperatorOptions {
        namespace: "sidecar-injector".into(),
        secret_name: "sidecar-injector-tls".into(),
        serving_names: ServingNames::for_service("sidecar-injector", "sidecar-injector", None),
        lifetimes,
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

fn operator(
    client: kube::Client,
    options: OperatorOptions,
    leading: watch::Receiver<bool>,
) -> Arc<Operator> {
    let metrics = ControllerMetrics::register(&mut MetricsRegistry::default());
    Operator::new(
        client,
        options,
        Templates::new(),
        CertificateStore::new(),
        Arc::new(metrics),
        leading,
    )
}

/// A registry snapshot of one template.
fn one_template() -> Arc<injector_core::Snapshot> {
    let template: injector_api::SidecarTemplate = serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
        "metadata": {"name": "agent", "generation": 1},
        "spec": {"containers": [{"name": "agent", "image": "agent:1"}]},
    }))
    .unwrap();
    let mut registry = Registry::new();
    registry.apply(compile(&template).unwrap());
    registry.snapshot()
}

/// Makes the operator's registry synced, holding one template, and tells the loops.
fn sync_templates(operator: &Operator) {
    operator.templates.publish(one_template());
    operator.templates.mark_synced();
    operator.templates_changed.notify_one();
}

fn calls_where(calls: &Mutex<Vec<Call>>, wanted: impl Fn(&Call) -> bool) -> Vec<Call> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| wanted(c))
        .cloned()
        .collect()
}

/// Waits (on the paused clock) until `count` requests match `wanted`; returns them.
async fn wait_for_calls(
    calls: &Mutex<Vec<Call>>,
    count: usize,
    wanted: impl Fn(&Call) -> bool,
) -> Vec<Call> {
    for _ in 0..10_000 {
        let found = calls_where(calls, &wanted);
        if found.len() >= count {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fewer than {count} such requests came");
}

fn decode(base64: &Value) -> String {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64.as_str().unwrap())
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_rotation_waits_for_the_template_list_before_writing_its_secret() {
    let lifetimes = Lifetimes {
        ca: Duration::from_secs(3600),
        serving: Duration::from_secs(3600),
    };
    let options = options(lifetimes);
    // A CA past two thirds of its lifetime: the next check rotates it.
    let issued = SystemTime::now() - Duration::from_secs(2500);
    let old = certs::reconcile(None, &options.serving_names, &lifetimes, issued)
        .unwrap()
        .bundle;
    let stored = Arc::new(Mutex::new(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "sidecar-injector-tls", "namespace": "sidecar-injector", "resourceVersion": "3"},
        "type": "kubernetes.io/tls",
        "data": serde_json::to_value(old.to_secret_data()).unwrap(),
    })));
    let (client, calls) = fake_api(move |call, _| {
        if call.is(Method::GET, SECRET_PATH) {
            ok(&stored.lock().unwrap())
        } else if call.is(Method::PUT, SECRET_PATH) {
            *stored.lock().unwrap() = call.body.clone();
            ok(&call.body)
        } else if call.is(Method::GET, CONFIGURATIONS_PATH) {
            configurations(call, &[])
        } else if call.is(Method::PATCH, CONFIGURATIONS_PATH) {
            ok(&call.body)
        } else {
            panic!("unexpected {call:?}")
        }
    });
    let (_leader, leading) = watch::channel(true);
    let operator = operator(client, options, leading);
    let stop = CancellationToken::new();
    tokio::spawn(Arc::clone(&operator).rotate_loop(stop.clone()));
    tokio::spawn(Arc::clone(&operator).configuration_loop(stop.clone()));

    // The template list is not in: the configuration cannot be written, so neither is the
    // Secret of the new CA, however long that lasts.
    wait_for_calls(&calls, 3, |c| c.is(Method::GET, SECRET_PATH)).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    let written = |c: &Call| c.method == Method::PUT || c.method == Method::PATCH;
    assert!(
        calls_where(&calls, written).is_empty(),
        "wrote before the list"
    );
    assert!(
        calls_where(&calls, |c| c.is(Method::GET, SECRET_PATH)).len() < 30,
        "the waiting rotation backs off"
    );

    // Once it is in: the configuration trusts the new CA first, then the Secret is written.
    sync_templates(&operator);
    let put = wait_for_calls(&calls, 1, |c| c.is(Method::PUT, SECRET_PATH)).await;
    let new_ca = decode(&put[0].body["data"]["ca.crt"]);
    assert_ne!(new_ca, old.ca.cert_pem, "the CA was rotated");
    let applies = calls_where(&calls, |c| c.method == Method::PATCH && c.at <= put[0].at);
    let trusted = applies.iter().any(|apply| {
        apply.body["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|entry| decode(&entry["clientConfig"]["caBundle"]).contains(new_ca.trim()))
            && !apply.body["webhooks"].as_array().unwrap().is_empty()
    });
    assert!(
        trusted,
        "the Secret came before a configuration trusting its CA"
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_new_ca_is_published_at_once_when_the_configuration_has_no_entry_to_carry_it() {
    // No template, and a configuration from an earlier start (no entry, so no caBundle): a new
    // CA needs no apply, and its Secret must not wait for one (it waited for the next resync,
    // a minute without a certificate, before).
    let existing = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "sidecar-injector", "resourceVersion": "4",
            "labels": {webhook_config::MANAGED_BY_LABEL: webhook_config::MANAGED_BY}},
    });
    let (client, calls) = fake_api(move |call, _| {
        if call.is(Method::GET, SECRET_PATH) {
            failure(StatusCode::NOT_FOUND, "NotFound")
        } else if call.method == Method::POST && call.path.ends_with("/secrets") {
            ok(&call.body)
        } else if call.is(Method::GET, CONFIGURATIONS_PATH) {
            configurations(call, std::slice::from_ref(&existing))
        } else if call.is(Method::PATCH, CONFIGURATIONS_PATH) {
            ok(&call.body)
        } else {
            panic!("unexpected {call:?}")
        }
    });
    let (_leader, leading) = watch::channel(true);
    let operator = operator(client, options(Lifetimes::default()), leading);
    operator.templates.publish(Registry::new().snapshot());
    operator.templates.mark_synced();
    let stop = CancellationToken::new();
    let started = Instant::now();
    tokio::spawn(Arc::clone(&operator).configuration_loop(stop.clone()));
    // The configuration loop has seen the configuration before the CA comes.
    wait_for_calls(&calls, 1, |c| c.is(Method::GET, CONFIGURATIONS_PATH)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::spawn(Arc::clone(&operator).rotate_loop(stop.clone()));
    let created = wait_for_calls(&calls, 1, |c| {
        c.method == Method::POST && c.path.ends_with("/secrets")
    })
    .await;
    assert!(
        created[0].at - started < Duration::from_secs(10),
        "the Secret waited {:?}",
        created[0].at - started
    );
    stop.cancel();
}

// On the real clock: a loop that spins never lets a paused clock advance to the timeout.
#[tokio::test]
async fn a_closed_leadership_channel_stops_the_leader_loops() {
    for was_leading in [false, true] {
        let (client, calls) = fake_api(|call, _| {
            if call.is(Method::GET, CONFIGURATIONS_PATH) {
                configurations(call, &[])
            } else {
                None
            }
        });
        let (sender, leading) = watch::channel(was_leading);
        drop(sender);
        let operator = operator(client, options(Lifetimes::default()), leading);
        sync_templates(&operator);
        operator.ca_bundle.send_replace(Some(TEST_CA.into()));
        let stop = CancellationToken::new();
        let loops = futures::future::join3(
            Arc::clone(&operator).rotate_loop(stop.clone()),
            Arc::clone(&operator).configuration_loop(stop.clone()),
            Arc::clone(&operator).status_loop(stop.clone()),
        );
        tokio::time::timeout(Duration::from_secs(5), loops)
            .await
            .expect("the leader loops end when the election is gone");
        let writes = calls_where(&calls, |c| c.method != Method::GET);
        assert!(writes.is_empty(), "{was_leading}: {writes:?}");
        assert!(
            calls_where(&calls, |c| c.is(Method::GET, SECRET_PATH)).is_empty(),
            "{was_leading}: a stale true is not leading"
        );
    }
}

/// The delays between consecutive requests.
fn gaps(calls: &[Call]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1].at - w[0].at).collect()
}

/// Retries that space out: each delay longer than the one before, from 0.8 s, never past
/// the cap (30 s, plus as much again in jitter).
fn assert_backs_off(gaps: &[Duration]) {
    assert!(gaps[0] >= Duration::from_millis(800), "{gaps:?}");
    for pair in gaps.windows(2) {
        assert!(pair[1] > pair[0], "{gaps:?}");
    }
    assert!(
        gaps.iter().all(|gap| *gap <= Duration::from_secs(60)),
        "{gaps:?}"
    );
}

/// An operator that leads, with a synced registry and a caBundle, so its configuration loop
/// applies at once.
fn ready_operator(client: kube::Client) -> (Arc<Operator>, watch::Sender<bool>) {
    let (leader, leading) = watch::channel(true);
    let operator = operator(client, options(Lifetimes::default()), leading);
    operator.ca_bundle.send_replace(Some(TEST_CA.into()));
    sync_templates(&operator);
    (operator, leader)
}

/// Runs the configuration loop of a ready leader on `client` until it has applied seven
/// times, and checks that the applies spaced out.
async fn assert_applies_back_off(client: kube::Client, calls: &Mutex<Vec<Call>>) {
    let (operator, _leader) = ready_operator(client);
    let stop = CancellationToken::new();
    tokio::spawn(Arc::clone(&operator).configuration_loop(stop.clone()));
    let applies = wait_for_calls(calls, 7, |c| c.method == Method::PATCH).await;
    assert_backs_off(&gaps(&applies));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failing_apply_is_retried_with_growing_delays() {
    let (client, calls) = fake_api(|call, _| {
        if call.is(Method::GET, CONFIGURATIONS_PATH) {
            configurations(call, &[])
        } else if call.is(Method::PATCH, CONFIGURATIONS_PATH) {
            failure(StatusCode::INTERNAL_SERVER_ERROR, "InternalError")
        } else {
            panic!("unexpected {call:?}")
        }
    });
    assert_applies_back_off(client, &calls).await;
}

#[tokio::test(start_paused = true)]
async fn entries_go_without_the_skip_conditions_the_api_server_refuses_and_try_a_new_policys() {
    // The API server refuses any entry carrying a presence condition (past its cost budget).
    let (client, calls) = fake_api(|call, _| {
        if call.is(Method::GET, CONFIGURATIONS_PATH) {
            configurations(call, &[])
        } else if call.is(Method::PATCH, CONFIGURATIONS_PATH) {
            if call.body.to_string().contains("served-by-policy") {
                failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid")
            } else {
                ok(&call.body)
            }
        } else {
            panic!("unexpected {call:?}")
        }
    });
    let (operator, _leader) = ready_operator(client);
    let policy = |condition: &str| PolicyState {
        policy: "sidecar-injector".into(),
        available: true,
        served: BTreeSet::from(["agent".to_owned()]),
        present: BTreeMap::from([("agent".to_owned(), condition.to_owned())]),
        ..PolicyState::default()
    };
    operator
        .policy_state
        .send_replace(Some(Arc::new(policy("'served-by-policy' != ''"))));
    let stop = CancellationToken::new();
    tokio::spawn(Arc::clone(&operator).configuration_loop(stop.clone()));

    let applies = wait_for_calls(&calls, 2, |c| c.is(Method::PATCH, CONFIGURATIONS_PATH)).await;
    assert!(applies[0].body.to_string().contains("served-by-policy"));
    // Refused: applied again at once, without them.
    assert!(!applies[1].body.to_string().contains("served-by-policy"));
    assert_eq!(applies[1].at, applies[0].at);
    assert_eq!(
        operator.world().configuration().unwrap().skips,
        BTreeMap::new()
    );

    // A new policy's conditions are tried again.
    operator
        .policy_state
        .send_replace(Some(Arc::new(policy("'served-by-policy-2' != ''"))));
    let applies = wait_for_calls(&calls, 4, |c| c.is(Method::PATCH, CONFIGURATIONS_PATH)).await;
    assert!(applies[2].body.to_string().contains("served-by-policy-2"));
    assert!(!applies[3].body.to_string().contains("served-by-policy"));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn repairing_a_configuration_another_writer_keeps_changing_backs_off() {
    // What the other writer keeps putting back: our configuration with a changed policy.
    let desired = webhook_config::desired_configuration(
        &one_template(),
        &options(Lifetimes::default()).webhook,
        TEST_CA.as_bytes(),
    );
    let mut theirs = serde_json::to_value(&desired).unwrap();
    theirs["webhooks"][0]["failurePolicy"] = "Ignore".into();
    theirs["metadata"]["resourceVersion"] = "5".into();

    let their_version = theirs.clone();
    let (client, calls) = fake_api(move |call, held| {
        if call.is(Method::GET, CONFIGURATIONS_PATH) {
            configurations(call, std::slice::from_ref(&their_version))
        } else if call.is(Method::PATCH, CONFIGURATIONS_PATH) {
            // The other writer undoes each of our applies at once.
            for (_, watch) in held.drain(..) {
                send(
                    watch,
                    StatusCode::OK,
                    watch_event("MODIFIED", &their_version),
                );
            }
            ok(&call.body)
        } else {
            panic!("unexpected {call:?}")
        }
    });
    assert_applies_back_off(client, &calls).await;
}

#[tokio::test(start_paused = true)]
async fn a_configuration_too_large_for_etcd_is_never_applied_and_what_is_left_out_is_reported() {
    // What etcd accepts by default; the fake API server refuses more, as a real one would.
    const ETCD_LIMIT: usize = 1_572_864;
    let templates = crate::webhook_config::tests::templates_with_large_selectors(120, 250);
    let stored: BTreeMap<String, Value> = templates
        .iter()
        .map(|t| {
            let name = t.metadata.name.clone().unwrap();
            (name, serde_json::to_value(t).unwrap())
        })
        .collect();
    let (client, calls) = fake_api(move |call, _| {
        if call.is(Method::GET, CONFIGURATIONS_PATH) {
            configurations(call, &[])
        } else if call.is(Method::PATCH, CONFIGURATIONS_PATH) {
            if call.body.to_string().len() > ETCD_LIMIT {
                failure(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge")
            } else {
                ok(&call.body)
            }
        } else if call.is(Method::PATCH, TEMPLATES_PATH) {
            let name = call.path.split('/').nth_back(1).unwrap();
            let mut template = stored[name].clone();
            template["status"] = call.body["status"].clone();
            ok(&template)
        } else if call.is(Method::POST, EVENTS_PATH) {
            Some((StatusCode::CREATED, call.body.to_string()))
        } else {
            panic!("unexpected {call:?}")
        }
    });
    let (_leader, leading) = watch::channel(true);
    let operator = operator(client, options(Lifetimes::default()), leading);
    let mut registry = Registry::new();
    for template in &templates {
        let compiled = compile(template).unwrap();
        operator.observed.lock().unwrap().insert(
            compiled.name.clone(),
            injector_core::registry::in_force::Observed {
                template: Arc::new(template.clone()),
                outcome: Ok(compiled.group_id.clone()),
                kept: None,
            },
        );
        registry.apply(compiled);
    }
    operator.templates.publish(registry.snapshot());
    operator.templates.mark_synced();
    operator.ca_bundle.send_replace(Some(TEST_CA.into()));
    operator.templates_changed.notify_one();
    let stop = CancellationToken::new();
    tokio::spawn(Arc::clone(&operator).configuration_loop(stop.clone()));
    tokio::spawn(Arc::clone(&operator).status_loop(stop.clone()));

    let statuses = wait_for_calls(&calls, 120, |c| c.is(Method::PATCH, TEMPLATES_PATH)).await;
    // Past a resync, which applies again.
    tokio::time::sleep(RESYNC * 2).await;
    let applies = calls_where(&calls, |c| c.is(Method::PATCH, CONFIGURATIONS_PATH));
    assert!(!applies.is_empty());
    for apply in &applies {
        let bytes = apply.body.to_string().len();
        assert!(bytes <= ETCD_LIMIT, "an apply etcd refuses: {bytes} bytes");
    }
    let entries: BTreeSet<String> = applies[0].body["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(entries.len() < 120, "some entries were left out");

    // Each template's status says whether it has an entry; those without get an Event too.
    let mut not_served = BTreeSet::new();
    for status in &statuses {
        let name = status.path.split('/').nth_back(1).unwrap().to_owned();
        let ready = &status.body["status"]["conditions"][0];
        match ready["reason"].as_str().unwrap() {
            "Valid" => {
                let message = ready["message"].as_str().unwrap();
                let entry = message.rsplit(' ').next().unwrap();
                assert!(entries.contains(entry), "{name}: {message}");
            }
            "NotServed" => {
                assert_eq!(ready["status"], "False");
                not_served.insert(name);
            }
            other => panic!("{name}: {other}"),
        }
    }
    assert_eq!(not_served.len() + entries.len(), 120);
    let events: BTreeSet<String> = calls_where(&calls, |c| c.is(Method::POST, EVENTS_PATH))
        .iter()
        .filter(|event| event.body["reason"] == "NotServed")
        .map(|event| event.body["regarding"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(events, not_served);
    stop.cancel();
}

const SHOP_PODS: &str = "/api/v1/namespaces/shop/pods";
const SHOP_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";

/// The ReplicaSet `web-abc`'s Pod `web-abc-1` of `shop`: its metadata as the census keeps it.
fn web_pod_meta() -> Value {
    json!({
        "name": "web-abc-1", "namespace": "shop", "labels": {"app": "web"},
        "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
            "uid": "uid-web-abc", "controller": true,
        }],
    })
}

/// The leader's census of that Pod, which misses the best-effort template `agent`, with the
/// namespace `shop` in its view.
fn census_missing_agent() -> Counted {
    let template: SidecarTemplate = serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
        "metadata": {"name": "agent", "generation": 1},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "failurePolicy": "Ignore",
            "containers": [{"name": "agent", "image": "agent:1"}],
        },
    }))
    .unwrap();
    let (snapshot, _) = injector_core::registry::in_force::from_listing([template]);
    let pods = census::PodRecord::of(serde_json::from_value(web_pod_meta()).unwrap()).unwrap();
    let pods: census::PodView = Arc::from([Arc::new(pods)]);
    let (namespaces, mut namespaces_writer) = kube::runtime::reflector::store();
    namespaces_writer.apply_watcher_event(&Event::Apply(kube::core::PartialObjectMeta::<
        k8s_openapi::api::core::v1::Namespace,
    > {
        types: None,
        metadata: serde_json::from_value(json!({"name": "shop"})).unwrap(),
        _phantom: std::marker::PhantomData,
    }));
    let census = census::count(&snapshot, &pods, &namespaces.state(), "sidecar-injector");
    Counted {
        census: Arc::new(census),
        snapshot,
        pods,
        namespaces,
    }
}

// On the real clock: the loop's blocking thread does not advance a paused one.
#[tokio::test]
async fn a_skip_round_is_left_when_leadership_changes_and_the_pod_is_read_from_the_cache() {
    // The Pod's read is never answered: the round waits on it until it is left.
    let (client, calls) = fake_api(|call, _| {
        if call.is(Method::GET, SHOP_PODS) {
            None
        } else {
            ok(&json!({}))
        }
    });
    let (leader, leading) = watch::channel(true);
    let operator = operator(client, options(Lifetimes::default()), leading);
    operator.census.send_replace(Some(census_missing_agent()));
    let stop = CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&operator).skip_loop(stop.clone()));
    let read = |c: &Call| c.is(Method::GET, SHOP_PODS);
    let first = wait_for_calls(&calls, 1, read).await;
    assert!(first[0].query.contains("resourceVersion=0"), "{first:?}");
    assert!(
        first[0].query.contains("resourceVersionMatch=NotOlderThan"),
        "{first:?}"
    );
    leader.send_replace(false);
    // A deposed leader's round is gone: leading again, the next term reads the Pod anew
    // (a round still waiting on the first read would never ask again).
    tokio::time::sleep(Duration::from_millis(200)).await;
    leader.send_replace(true);
    wait_for_calls(&calls, 2, read).await;
    assert!(calls_where(&calls, |c| c.method == Method::POST).is_empty());
    stop.cancel();
    task.await.unwrap();
}

/// What the leader tells of `web-abc` missing `agent` for 3 Pods.
fn tell_web() -> skips::Tell {
    skips::Tell {
        key: SkipKey {
            owner: injector_api::WorkloadRef {
                kind: "ReplicaSet".to_owned(),
                namespace: "shop".to_owned(),
                name: "web-abc".to_owned(),
            },
            owner_uid: "uid-web-abc".to_owned(),
            template: "agent".to_owned(),
            generation: 1,
        },
        reason: "conflict: container \"agent\" exists".to_owned(),
        pods: 3,
        sample: "web-abc-1".to_owned(),
        api_version: "apps/v1".to_owned(),
    }
}

#[tokio::test]
async fn a_skip_event_found_under_its_name_is_added_to_only_when_it_is_about_the_same_owner() {
    for (found_uid, added_to) in [("uid-web-abc", true), ("uid-of-another-life", false)] {
        let mut found = serde_json::to_value(skips::event(
            &tell_web(),
            FIELD_MANAGER,
            "replica-0",
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ))
        .unwrap();
        found["metadata"]["resourceVersion"] = json!("7");
        found["regarding"]["uid"] = json!(found_uid);
        let (client, calls) = fake_api(move |call, _| {
            if call.is(Method::POST, SHOP_EVENTS) {
                failure(StatusCode::CONFLICT, "AlreadyExists")
            } else {
                ok(&found)
            }
        });
        skips::tell_skip(&client, &tell_web(), "replica-1")
            .await
            .unwrap();
        let patches = calls_where(&calls, |c| c.method == Method::PATCH);
        assert_eq!(patches.len(), usize::from(added_to), "{found_uid}");
        if let Some(patch) = patches.first() {
            assert_eq!(patch.body["series"]["count"], 3);
            assert_eq!(patch.body["metadata"]["resourceVersion"], "7");
        }
    }
}
