#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

use injector_controller::certs::{Ca, ServingNames, generate_ca, issue_serving};
use k8s_openapi::ByteString;
use serde_json::{Value, json};

use super::*;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// The chart's names, as its Deployment runs with them.
fn names() -> Names {
    Names {
        source: Source::Deployment,
        ..Names::of_release("sidecar-injector", "sidecar-injector", None)
    }
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn system_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn ca() -> Ca {
    generate_ca(system_now() - DAY, 365 * DAY, "sidecar-injector-ca@1").unwrap()
}

/// The serving chain (PEM) `ca` issues for the operator's Service, and 127.0.0.1.
fn serving(ca: &Ca) -> String {
    let names = ServingNames::for_service(
        "sidecar-injector",
        "sidecar-injector",
        Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    );
    issue_serving(ca, &names, system_now() - DAY, 90 * DAY)
        .unwrap()
        .chain_pem
}

fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

/// A template named `name` selecting `app: web` in namespaces labelled `team: shop`, created
/// at second 1,700,000,000, `Ready` as given.
fn template(name: &str, failure_policy: &str, ready: bool, extra: Value) -> SidecarTemplate {
    let mut conditions = vec![json!({
        "type": "Ready",
        "status": if ready { "True" } else { "False" },
        "reason": if ready { "Valid" } else { "Invalid" },
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    })];
    if let Some(more) = extra.as_array() {
        conditions.extend(more.iter().cloned());
    }
    from(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {
            "name": name,
            "generation": 1,
            "creationTimestamp": "2023-11-14T22:13:20Z",
        },
        "spec": {
            "namespaceSelector": {"matchLabels": {"team": "shop"}},
            "podSelector": {"matchLabels": {"app": "web"}},
            "failurePolicy": failure_policy,
            "containers": [{"name": name, "image": "agent:1"}],
        },
        "status": {"conditions": conditions},
    }))
}

/// The entry names the templates' groups call for.
fn entries_for(templates: &[SidecarTemplate]) -> Vec<String> {
    let (in_force, _) = injector_core::registry::in_force::from_listing(templates.iter().cloned());
    in_force
        .groups()
        .iter()
        .map(|g| entry_name(&g.id))
        .collect()
}

fn configuration(entries: &[String], client: Value) -> MutatingWebhookConfiguration {
    let webhooks: Vec<Value> = entries
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "clientConfig": client,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            })
        })
        .collect();
    from(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "sidecar-injector"},
        "webhooks": webhooks,
    }))
}

fn service_client(ca: &Ca) -> Value {
    json!({
        "service": {"namespace": "sidecar-injector", "name": "sidecar-injector", "port": 443, "path": "/mutate/x"},
        "caBundle": ByteString(ca.cert_pem.clone().into_bytes()),
    })
}

fn secret(ca: &Ca, serving_pem: &str) -> Secret {
    Secret {
        data: Some(BTreeMap::from([
            (
                CA_CERT_KEY.to_owned(),
                ByteString(ca.cert_pem.clone().into_bytes()),
            ),
            (
                TLS_CERT_KEY.to_owned(),
                ByteString(serving_pem.as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    }
}

fn deployment(ready: i32) -> Deployment {
    from(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sidecar-injector", "namespace": "sidecar-injector"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "sidecar-injector"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "sidecar-injector", "app.kubernetes.io/instance": "sidecar-injector"}},
                "spec": {"containers": [{
                    "name": "sidecar-injector",
                    "image": "sidecar-injector:0.1.0",
                    "ports": [{"name": "webhook", "containerPort": 8443}, {"name": "admin", "containerPort": 8080}],
                }]},
            },
        },
        "status": {"replicas": 2, "readyReplicas": ready, "updatedReplicas": 2},
    }))
}

fn lease(holder: &str, renewed: &str) -> Lease {
    from(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sidecar-injector-leader", "namespace": "sidecar-injector"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed},
    }))
}

fn service() -> Service {
    from(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "sidecar-injector", "namespace": "sidecar-injector"},
        "spec": {
            "selector": {"app.kubernetes.io/name": "sidecar-injector", "app.kubernetes.io/instance": "sidecar-injector"},
            "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook"}],
        },
    }))
}

fn slices(ready: &[bool]) -> Vec<EndpointSlice> {
    let endpoints: Vec<Value> = ready
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"addresses": [format!("10.0.0.{i}")], "conditions": {"ready": r}}))
        .collect();
    vec![from(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "sidecar-injector-abc", "namespace": "sidecar-injector"},
        "addressType": "IPv4",
        "endpoints": endpoints,
    }))]
}

fn network_policy(rule: Value) -> NetworkPolicy {
    from(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "sidecar-injector", "namespace": "sidecar-injector"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "sidecar-injector"}},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
        },
    }))
}

/// An installation where every link works: the chart's objects, in a cluster, one template
/// `agent` served by the webhook.
fn healthy() -> Observed {
    let ca = ca();
    let templates = vec![template("agent", "Ignore", true, json!([]))];
    Observed {
        deployment: Read::Found(deployment(2)),
        lease: Read::Found(lease("sidecar-injector-abc", "2027-01-15T08:00:00.000000Z")),
        configuration: Read::Found(configuration(&entries_for(&templates), service_client(&ca))),
        service: Read::Found(service()),
        slices: Read::Found(slices(&[true, true])),
        secret: Read::Found(secret(&ca, &serving(&ca))),
        handshake: None,
        endpoint_handshake: None,
        network_policies: Read::Found(vec![network_policy(
            json!({"ports": [{"port": 8443, "protocol": "TCP"}]}),
        )]),
        policy: Read::Missing,
        policy_binding: Read::Missing,
        guard: Read::Missing,
        templates: Read::Found(templates),
        target: None,
    }
}

fn the<'r>(report: &'r Report, name: &str) -> &'r Link {
    report
        .links
        .iter()
        .find(|l| l.link == name)
        .unwrap_or_else(|| panic!("no link {name:?} in {report:#?}"))
}

#[test]
fn the_renew_time_of_the_fixture_is_now() {
    // 1,800,000,000 s is 2027-01-15T08:00:00Z: the healthy Lease was renewed just now.
    assert_eq!(now().to_string(), "2027-01-15T08:00:00Z");
}

#[test]
fn a_healthy_installation_is_ok_link_by_link() {
    let report = judge(&healthy(), &names(), now());
    assert!(!report.broken, "{report:#?}");
    for l in &report.links {
        let expected = if l.link == POLICY_BACKEND {
            State::Skipped
        } else {
            State::Ok
        };
        assert_eq!(l.state, expected, "{l:?}");
    }
    assert!(
        the(&report, CA_BUNDLE)
            .message
            .contains("verifies its serving certificate for sidecar-injector.sidecar-injector.svc"),
        "{report:#?}"
    );
    assert!(
        the(&report, NETWORK_POLICY)
            .message
            .contains("lets any source reach the webhook's port 8443")
    );
    let table = to_table(&report);
    assert!(table.starts_with("LINK "), "{table}");
    assert_eq!(table.lines().count(), 1 + report.links.len(), "{table}");
    let json: Value = serde_json::from_str(&to_json(&report).unwrap()).unwrap();
    assert_eq!(json["broken"], false);
    assert_eq!(json["links"][0]["link"], "names");
    assert_eq!(json["links"][1]["link"], "operator");
    assert_eq!(json["links"][1]["state"], "ok");
}

#[test]
fn a_deleted_configuration_is_the_broken_link() {
    let mut observed = healthy();
    observed.configuration = Read::Missing;
    let report = judge(&observed, &names(), now());
    assert!(report.broken);
    let configuration = the(&report, CONFIGURATION);
    assert_eq!(configuration.state, State::Broken);
    assert!(
        configuration.message.contains("not found"),
        "{configuration:?}"
    );
    assert_eq!(the(&report, CA_BUNDLE).state, State::Skipped);
}

#[test]
fn a_ca_bundle_of_another_ca_is_broken() {
    let mut observed = healthy();
    let other = ca();
    let entries = entries_for(observed.templates.found().unwrap());
    observed.configuration = Read::Found(configuration(&entries, service_client(&other)));
    let report = judge(&observed, &names(), now());
    let bundle = the(&report, CA_BUNDLE);
    assert_eq!(bundle.state, State::Broken, "{bundle:?}");
    assert!(
        bundle
            .message
            .contains("does not hold the CA of secret/sidecar-injector-tls")
    );
    assert!(report.broken);
}

#[test]
fn a_replica_reachable_from_here_is_checked_by_a_handshake() {
    let mut observed = healthy();
    let ca = ca();
    let entries = entries_for(observed.templates.found().unwrap());
    observed.configuration = Read::Found(configuration(&entries, service_client(&ca)));
    observed.secret = Read::Found(secret(&ca, &serving(&ca)));
    let handshake = |served| Handshake {
        url: "https://10.0.0.1:8443".to_owned(),
        host: "sidecar-injector.sidecar-injector.svc".to_owned(),
        served,
    };
    let chain = certificate::pem_certificates(serving(&ca).as_bytes()).unwrap();
    observed.endpoint_handshake = Some(handshake(Ok(chain)));
    let report = judge(&observed, &names(), now());
    let l = the(&report, CA_BUNDLE);
    assert_eq!(l.state, State::Ok, "{l:?}");
    assert!(
        l.message.starts_with(
            "verifies the certificate served at https://10.0.0.1:8443, a replica's address"
        ),
        "{l:?}"
    );
    // A replica serving another CA's certificate (one not reloaded, say).
    observed.endpoint_handshake = Some(handshake(Ok(ca_other_serving())));
    assert_eq!(
        the(&judge(&observed, &names(), now()), CA_BUNDLE).state,
        State::Broken
    );
    // Not reachable from here: the Secret's certificate, saying so.
    observed.endpoint_handshake = Some(handshake(Err("no TLS handshake within 2s".to_owned())));
    let report = judge(&observed, &names(), now());
    let l = the(&report, CA_BUNDLE);
    assert_eq!(l.state, State::Ok, "{l:?}");
    assert!(
        l.message
            .contains("cannot be reached from here: no TLS handshake within 2s"),
        "{l:?}"
    );
    assert!(!report.broken);
}

/// A replica's webhook on 127.0.0.1 serving `issued` to every handshake, as a Pod behind the
/// Service does; its port.
async fn replica(issued: &injector_controller::certs::Serving) -> u16 {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            // The client hangs up after the handshake: how the stream ends does not matter.
            tokio::spawn(async move { drop(acceptor.accept(tcp).await) });
        }
    });
    port
}

#[tokio::test]
async fn through_the_service_the_handshake_with_a_replica_is_verified_by_the_ca_bundle() {
    let issuer = ca();
    let for_service = ServingNames::for_service("sidecar-injector", "sidecar-injector", None);
    let issued = issue_serving(&issuer, &for_service, system_now() - DAY, 90 * DAY).unwrap();
    let port = replica(&issued).await;
    // The Service's endpoint is the replica, as its EndpointSlice names it.
    let slices: Vec<EndpointSlice> = vec![from(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "sidecar-injector-abc", "namespace": "sidecar-injector"},
        "addressType": "IPv4",
        "ports": [{"name": "webhook", "port": port}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
    }))];
    let handshake =
        crate::kubectl::plumbing::endpoint_handshake(&slices, &names().service_host()).await;
    let handshake = handshake.unwrap();
    assert_eq!(handshake.url, format!("https://127.0.0.1:{port}"));
    assert!(handshake.served.is_ok(), "{handshake:?}");
    let mut observed = healthy();
    let entries = entries_for(observed.templates.found().unwrap());
    observed.slices = Read::Found(slices);
    observed.endpoint_handshake = Some(handshake);
    // The caBundle of the CA that issued the served certificate.
    observed.configuration = Read::Found(configuration(&entries, service_client(&issuer)));
    let report = judge(&observed, &names(), now());
    let l = the(&report, CA_BUNDLE);
    assert_eq!(l.state, State::Ok, "{l:?}");
    assert_eq!(
        l.message,
        format!(
            "verifies the certificate served at https://127.0.0.1:{port}, a replica's address (a TLS handshake, for sidecar-injector.sidecar-injector.svc)"
        )
    );
    // Another CA's caBundle (each `ca()` is a new one): the API server's calls would fail
    // their handshake.
    observed.configuration = Read::Found(configuration(&entries, service_client(&ca())));
    let report = judge(&observed, &names(), now());
    let l = the(&report, CA_BUNDLE);
    assert_eq!(l.state, State::Broken, "{l:?}");
    assert!(
        l.message.starts_with(&format!(
            "does not verify the certificate served at https://127.0.0.1:{port}, a replica's address"
        )),
        "{l:?}"
    );
    assert!(report.broken);
}

#[test]
fn a_serving_certificate_the_bundle_does_not_verify_is_broken() {
    let mut observed = healthy();
    let ca = ca();
    let entries = entries_for(observed.templates.found().unwrap());
    observed.configuration = Read::Found(configuration(&entries, service_client(&ca)));
    // Issued for another Service's name.
    let elsewhere = ServingNames::for_service("other", "sidecar-injector", None);
    let serving = issue_serving(&ca, &elsewhere, system_now() - DAY, DAY)
        .unwrap()
        .chain_pem;
    observed.secret = Read::Found(secret(&ca, &serving));
    let bundle = judge(&observed, &names(), now());
    let bundle = the(&bundle, CA_BUNDLE);
    assert_eq!(bundle.state, State::Broken, "{bundle:?}");
    assert!(bundle.message.contains("does not verify"), "{bundle:?}");
    // Expired: ten days later than its one day.
    let mut observed = healthy();
    let serving = issue_serving(
        &ca,
        &ServingNames::for_service("sidecar-injector", "sidecar-injector", None),
        system_now() - 10 * DAY,
        DAY,
    )
    .unwrap()
    .chain_pem;
    observed.configuration = Read::Found(configuration(&entries, service_client(&ca)));
    observed.secret = Read::Found(secret(&ca, &serving));
    let report = judge(&observed, &names(), now());
    assert_eq!(the(&report, CA_BUNDLE).state, State::Broken);
}

#[test]
fn an_entry_calling_another_service_or_missing_is_broken() {
    let mut observed = healthy();
    let ca = ca();
    let entries = entries_for(observed.templates.found().unwrap());
    let mut client = service_client(&ca);
    client["service"]["name"] = json!("old-release-sidecar-injector");
    observed.configuration = Read::Found(configuration(&entries, client));
    let report = judge(&observed, &names(), now());
    let l = the(&report, CONFIGURATION);
    assert_eq!(l.state, State::Broken);
    assert!(
        l.message
            .contains("calls service sidecar-injector/old-release-sidecar-injector"),
        "{l:?}"
    );

    let mut observed = healthy();
    observed.configuration = Read::Found(configuration(&[], service_client(&ca)));
    let report = judge(&observed, &names(), now());
    let l = the(&report, CONFIGURATION);
    assert_eq!(l.state, State::Broken);
    assert!(l.message.contains("(templates agent)"), "{l:?}");

    let mut client = service_client(&ca);
    client["service"]["port"] = json!(8443);
    let mut observed = healthy();
    observed.configuration = Read::Found(configuration(&entries, client));
    let report = judge(&observed, &names(), now());
    assert!(
        the(&report, CONFIGURATION)
            .message
            .contains("calls port 8443")
    );
}

#[test]
fn every_group_in_force_has_its_entry_by_the_controllers_rule() {
    let ca = ca();
    // A required template whose current generation is invalid: its last valid one is in
    // force (status.lastValid), so its entry must stay, although it is not Ready.
    let mut kept = template("agent", "Fail", false, json!([]));
    let spec = serde_json::to_value(&kept.spec).unwrap();
    kept.spec.containers[0].name = "Not A Name".to_owned();
    kept.metadata.generation = Some(2);
    kept.status.as_mut().unwrap().last_valid = Some(from(json!({"generation": 1, "spec": spec})));
    let templates = vec![kept];
    let (in_force, _) = injector_core::registry::in_force::from_listing(templates.iter().cloned());
    assert_eq!(
        in_force.templates().len(),
        1,
        "the fixture keeps generation 1"
    );
    let mut observed = healthy();
    observed.templates = Read::Found(templates.clone());
    observed.configuration = Read::Found(configuration(&[], service_client(&ca)));
    let l = the(&judge(&observed, &names(), now()), CONFIGURATION).clone();
    assert_eq!(l.state, State::Broken, "{l:?}");
    assert!(l.message.contains("(templates agent)"), "{l:?}");
    observed.configuration =
        Read::Found(configuration(&entries_for(&templates), service_client(&ca)));
    assert_eq!(
        the(&judge(&observed, &names(), now()), CONFIGURATION).state,
        State::Ok
    );

    // Left out for room by the controller (NotServed): no entry is wanted.
    let mut not_served = template("agent", "Ignore", false, json!([]));
    let ready = &mut not_served.status.as_mut().unwrap().conditions[0];
    ready.reason = REASON_NOT_SERVED.to_owned();
    let mut observed = healthy();
    observed.templates = Read::Found(vec![not_served]);
    observed.configuration = Read::Found(configuration(&[], service_client(&ca)));
    assert_eq!(
        the(&judge(&observed, &names(), now()), CONFIGURATION).state,
        State::Ok
    );
}

#[test]
fn entries_cannot_be_judged_without_the_templates_or_the_guard() {
    let mut observed = healthy();
    observed.templates = Read::Forbidden("forbidden by RBAC".to_owned());
    let report = judge(&observed, &names(), now());
    let l = the(&report, CONFIGURATION);
    assert_eq!(l.state, State::Unknown, "{l:?}");
    assert!(
        l.message
            .contains("whether every template in force has its entry is not known: cannot read sidecartemplates"),
        "{l:?}"
    );
    let mut observed = healthy();
    observed.guard = Read::Failed("connection reset".to_owned());
    observed.configuration = Read::Found(configuration(&[], service_client(&ca())));
    let l = the(&judge(&observed, &names(), now()), CONFIGURATION).clone();
    assert_eq!(l.state, State::Unknown, "{l:?}");
    assert!(
        l.message
            .contains("cannot read validatingadmissionpolicy/sidecar-injector-guard"),
        "{l:?}"
    );
}

#[test]
fn no_ready_endpoint_and_no_ready_replica_are_broken() {
    let mut observed = healthy();
    observed.slices = Read::Found(slices(&[false, false]));
    observed.deployment = Read::Found(deployment(0));
    let report = judge(&observed, &names(), now());
    assert_eq!(the(&report, ENDPOINTS).state, State::Broken);
    assert!(
        the(&report, ENDPOINTS)
            .message
            .contains("no ready endpoint (2 not ready)")
    );
    assert_eq!(the(&report, OPERATOR).state, State::Broken);
    observed.deployment = Read::Found(deployment(1));
    observed.service = Read::Missing;
    let report = judge(&observed, &names(), now());
    assert_eq!(the(&report, OPERATOR).state, State::Warning);
    assert_eq!(the(&report, ENDPOINTS).state, State::Broken);
}

#[test]
fn a_lease_nobody_renews_means_no_leader() {
    let mut observed = healthy();
    observed.lease = Read::Found(lease("gone-replica", "2027-01-15T07:58:00.000000Z"));
    let report = judge(&observed, &names(), now());
    let l = the(&report, LEADER);
    assert_eq!(l.state, State::Broken);
    assert!(l.message.contains("last renewed 120s ago"), "{l:?}");
    observed.lease = Read::Found(lease("", "2027-01-15T08:00:00.000000Z"));
    assert_eq!(
        the(&judge(&observed, &names(), now()), LEADER).state,
        State::Broken
    );
    observed.lease = Read::Missing;
    assert_eq!(
        the(&judge(&observed, &names(), now()), LEADER).state,
        State::Broken
    );
}

#[test]
fn a_lease_late_by_less_than_the_clock_skew_allowance_is_a_warning() {
    let mut observed = healthy();
    // 15 s of lease and 60 s of allowance: 75 s late at most is this laptop's clock, maybe.
    for (renewed, state) in [
        ("2027-01-15T07:59:45.000000Z", State::Ok),
        ("2027-01-15T07:59:00.000000Z", State::Warning),
        ("2027-01-15T07:58:45.000000Z", State::Warning),
        ("2027-01-15T07:58:44.000000Z", State::Broken),
    ] {
        observed.lease = Read::Found(lease("sidecar-injector-abc", renewed));
        let report = judge(&observed, &names(), now());
        let l = the(&report, LEADER);
        assert_eq!(l.state, state, "{renewed}: {l:?}");
        if state == State::Warning {
            assert!(
                l.message.contains("this machine's clock may run ahead"),
                "{l:?}"
            );
            assert!(!report.broken);
        }
    }
}

#[test]
fn what_cannot_be_read_is_unknown_and_not_broken() {
    let forbidden = || "forbidden by RBAC".to_owned();
    let observed = Observed {
        deployment: Read::Forbidden(forbidden()),
        lease: Read::Forbidden(forbidden()),
        configuration: Read::Forbidden(forbidden()),
        service: Read::Forbidden(forbidden()),
        slices: Read::Forbidden(forbidden()),
        secret: Read::Forbidden(forbidden()),
        handshake: None,
        endpoint_handshake: None,
        network_policies: Read::Forbidden(forbidden()),
        policy: Read::Forbidden(forbidden()),
        policy_binding: Read::Forbidden(forbidden()),
        guard: Read::Forbidden(forbidden()),
        templates: Read::Forbidden(forbidden()),
        target: None,
    };
    let assumed = operator_names(&observed.deployment, names());
    let report = judge(&observed, &assumed, now());
    assert!(!report.broken, "{report:#?}");
    for l in &report.links {
        assert_eq!(l.state, State::Unknown, "{l:?}");
        assert!(l.message.starts_with("cannot read "), "{l:?}");
        assert!(l.message.contains(": forbidden"), "{l:?}");
    }
    assert_eq!(
        the(&report, OPERATOR).message,
        "cannot read deployment/sidecar-injector -n sidecar-injector: forbidden (forbidden by RBAC)"
    );
    // The configuration alone: a Deployment or Service not found may be an operator out of
    // the cluster, which only the configuration tells.
    let mut observed = healthy();
    observed.configuration = Read::Forbidden(forbidden());
    observed.deployment = Read::Missing;
    observed.service = Read::Missing;
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pods: Read::Found(Vec::new()),
    });
    let report = judge(&observed, &names(), now());
    assert!(!report.broken, "{report:#?}");
    assert_eq!(the(&report, OPERATOR).state, State::Unknown);
    assert_eq!(the(&report, ENDPOINTS).state, State::Unknown);
    // The templates: nothing said of what selects what.
    observed.templates = Read::Forbidden(forbidden());
    let report = judge(&observed, &names(), now());
    assert_eq!(the(&report, NAMESPACE).state, State::Unknown);
    assert_eq!(the(&report, PODS).state, State::Unknown);
    // Only the Secret: the caBundle is then checked no further.
    let mut observed = healthy();
    observed.secret = Read::Forbidden(forbidden());
    let report = judge(&observed, &names(), now());
    assert!(!report.broken);
    assert_eq!(the(&report, CA_BUNDLE).state, State::Unknown);
}

#[test]
fn an_operator_out_of_the_cluster_is_checked_by_a_handshake() {
    let ca = ca();
    let templates = vec![template("agent", "Ignore", true, json!([]))];
    let client = json!({
        "url": "https://127.0.0.1:9443/mutate/x",
        "caBundle": ByteString(ca.cert_pem.clone().into_bytes()),
    });
    let served = certificate::pem_certificates(serving(&ca).as_bytes()).unwrap();
    let observed = Observed {
        deployment: Read::Missing,
        service: Read::Missing,
        slices: Read::Found(Vec::new()),
        secret: Read::Missing,
        network_policies: Read::Found(Vec::new()),
        configuration: Read::Found(configuration(&entries_for(&templates), client)),
        handshake: Some(Handshake {
            url: "https://127.0.0.1:9443".to_owned(),
            host: "127.0.0.1".to_owned(),
            served: Ok(served),
        }),
        templates: Read::Found(templates),
        ..healthy()
    };
    let report = judge(&observed, &names(), now());
    assert!(!report.broken, "{report:#?}");
    assert_eq!(the(&report, OPERATOR).state, State::Skipped);
    assert_eq!(the(&report, NETWORK_POLICY).state, State::Skipped);
    assert_eq!(the(&report, ENDPOINTS).state, State::Ok);
    let bundle = the(&report, CA_BUNDLE);
    assert_eq!(bundle.state, State::Ok);
    assert!(
        bundle
            .message
            .contains("verifies the certificate served at https://127.0.0.1:9443")
    );

    // Served by a certificate of another CA.
    let other = ca_other_serving();
    let mut wrong = observed.clone();
    wrong.handshake = Some(Handshake {
        served: Ok(other),
        ..observed.handshake.clone().unwrap()
    });
    let report = judge(&wrong, &names(), now());
    assert_eq!(the(&report, CA_BUNDLE).state, State::Broken);
    // Nobody answers.
    let mut down = observed.clone();
    down.handshake = Some(Handshake {
        served: Err("cannot connect to 127.0.0.1:9443: Connection refused".to_owned()),
        ..observed.handshake.clone().unwrap()
    });
    let report = judge(&down, &names(), now());
    assert_eq!(the(&report, ENDPOINTS).state, State::Broken);
    assert_eq!(the(&report, CA_BUNDLE).state, State::Unknown);
}

fn ca_other_serving() -> Vec<Vec<u8>> {
    let other = ca();
    certificate::pem_certificates(serving(&other).as_bytes()).unwrap()
}

#[test]
fn a_network_policy_is_reported_not_proven() {
    let mut observed = healthy();
    let peers =
        json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "webhook"}]});
    observed.network_policies = Read::Found(vec![network_policy(peers)]);
    let report = judge(&observed, &names(), now());
    let l = the(&report, NETWORK_POLICY);
    assert_eq!(l.state, State::Warning, "{l:?}");
    assert!(l.message.contains("cannot be proven"), "{l:?}");
    assert!(!report.broken);

    let metrics_only = json!({"ports": [{"port": 8080}]});
    observed.network_policies = Read::Found(vec![network_policy(metrics_only)]);
    let report = judge(&observed, &names(), now());
    assert_eq!(the(&report, NETWORK_POLICY).state, State::Broken);

    // A range holding the port.
    let range = json!({"ports": [{"port": 8000, "endPort": 9000}]});
    observed.network_policies = Read::Found(vec![network_policy(range)]);
    assert_eq!(
        the(&judge(&observed, &names(), now()), NETWORK_POLICY).state,
        State::Ok
    );

    // One selecting other Pods does not count.
    let mut other = network_policy(json!({"ports": [{"port": 1}]}));
    other.spec.as_mut().unwrap().pod_selector = Some(from(json!({"matchLabels": {"app": "db"}})));
    observed.network_policies = Read::Found(vec![other]);
    let report = judge(&observed, &names(), now());
    assert!(
        the(&report, NETWORK_POLICY)
            .message
            .starts_with("none selects")
    );
}

#[test]
fn unknown_operator_labels_leave_the_network_policy_unknown() {
    fn forbidden<T>() -> Read<T> {
        Read::Forbidden("forbidden by RBAC".to_owned())
    }
    let mut observed = healthy();
    observed.deployment = forbidden();
    observed.service = forbidden();
    // Selects every Pod, and lets nothing reach the webhook: whether it is the operator's
    // Pods it limits cannot be told.
    let mut np = network_policy(json!({"ports": [{"port": 8080}]}));
    np.spec.as_mut().unwrap().pod_selector = Some(from(json!({"matchLabels": {"app": "db"}})));
    observed.network_policies = Read::Found(vec![np]);
    let report = judge(&observed, &names(), now());
    let l = the(&report, NETWORK_POLICY);
    assert_eq!(l.state, State::Unknown, "{l:?}");
    assert!(
        l.message
            .starts_with("cannot read deployment/sidecar-injector -n sidecar-injector: forbidden"),
        "{l:?}"
    );
    // The Service's selector tells the labels; the port's number is not known then, so a
    // rule by number is not judged broken.
    observed.service = Read::Found(service());
    observed.network_policies =
        Read::Found(vec![network_policy(json!({"ports": [{"port": 8443}]}))]);
    let l = the(&judge(&observed, &names(), now()), NETWORK_POLICY).clone();
    assert_eq!(l.state, State::Unknown, "{l:?}");
    assert!(l.message.contains("its number is not known"), "{l:?}");
    // No policy in the namespace at all: nothing to select.
    observed.service = forbidden();
    observed.network_policies = Read::Found(Vec::new());
    assert_eq!(
        the(&judge(&observed, &names(), now()), NETWORK_POLICY).state,
        State::Ok
    );
}

#[test]
fn the_policy_backend_is_judged_from_the_templates_conditions() {
    let served = json!([{
        "type": "PolicyServed", "status": "True", "reason": "Served", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]);
    let mut observed = healthy();
    let templates = vec![template("agent", "Ignore", true, served)];
    observed.templates = Read::Found(templates);
    let report = judge(&observed, &names(), now());
    let l = the(&report, POLICY_BACKEND);
    assert_eq!(l.state, State::Broken, "{l:?}");
    assert!(
        l.message.contains("while agent say PolicyServed=True"),
        "{l:?}"
    );

    observed.policy = Read::Found(());
    observed.policy_binding = Read::Found(());
    let report = judge(&observed, &names(), now());
    assert_eq!(the(&report, POLICY_BACKEND).state, State::Ok);
    assert!(!report.broken, "{report:#?}");

    let not_available = json!([{
        "type": "PolicyServed", "status": "False", "reason": "NotAvailable", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]);
    let mut observed = healthy();
    observed.templates = Read::Found(vec![template("agent", "Ignore", true, not_available)]);
    let l = judge(&observed, &names(), now());
    let l = the(&l, POLICY_BACKEND);
    assert_eq!(l.state, State::Skipped);
    assert!(l.message.starts_with("not available"), "{l:?}");
}

#[test]
fn a_missing_binding_is_judged_by_what_the_policy_should_serve() {
    let served = json!([{
        "type": "PolicyServed", "status": "True", "reason": "Served", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]);
    let mut observed = healthy();
    observed.policy = Read::Found(());
    observed.policy_binding = Read::Missing;
    // Nothing served: nothing lost, a warning.
    let l = the(&judge(&observed, &names(), now()), POLICY_BACKEND).clone();
    assert_eq!(l.state, State::Warning, "{l:?}");
    assert!(
        l.message.starts_with(
            "mutatingadmissionpolicybinding/sidecar-injector not found, while no template says PolicyServed=True"
        ),
        "{l:?}"
    );
    // Templates the policy should serve: broken.
    observed.templates = Read::Found(vec![template("agent", "Ignore", true, served)]);
    let l = the(&judge(&observed, &names(), now()), POLICY_BACKEND).clone();
    assert_eq!(l.state, State::Broken, "{l:?}");
    assert!(
        l.message.contains("while agent say PolicyServed=True"),
        "{l:?}"
    );
    // The templates unreadable: what the policy serves is not known.
    observed.policy_binding = Read::Found(());
    observed.templates = Read::Failed("timed out".to_owned());
    let l = the(&judge(&observed, &names(), now()), POLICY_BACKEND).clone();
    assert_eq!(l.state, State::Unknown, "{l:?}");
    assert!(
        l.message
            .ends_with("which templates the policy backend serves is not known"),
        "{l:?}"
    );
}

#[test]
fn no_template_is_said_and_expects_no_entry() {
    let mut observed = healthy();
    observed.templates = Read::Found(Vec::new());
    let ca = ca();
    observed.configuration = Read::Found(configuration(&[], service_client(&ca)));
    let report = judge(&observed, &names(), now());
    assert!(!report.broken, "{report:#?}");
    assert_eq!(
        the(&report, TEMPLATES).message,
        "no SidecarTemplate: nothing is injected"
    );
    assert_eq!(the(&report, CA_BUNDLE).state, State::Skipped);
}

#[test]
fn a_template_not_ready_is_broken() {
    let mut observed = healthy();
    let templates = vec![
        template("agent", "Ignore", true, json!([])),
        template("broken", "Fail", false, json!([])),
    ];
    observed.templates = Read::Found(templates);
    let report = judge(&observed, &names(), now());
    let l = the(&report, TEMPLATES);
    assert_eq!(l.state, State::Broken);
    assert!(
        l.message.contains("1 of 2 not Ready: broken (Invalid)"),
        "{l:?}"
    );
}

fn shop(labels: Value) -> Read<BTreeMap<String, String>> {
    Read::Found(from(labels))
}

fn pod(created: &str, annotations: Value) -> ObjectMeta {
    from(json!({
        "name": "web-1",
        "namespace": "shop",
        "creationTimestamp": created,
        "labels": {"app": "web"},
        "annotations": annotations,
    }))
}

fn record_of(templates: &[SidecarTemplate], name: &str) -> String {
    let (in_force, _) = injector_core::registry::in_force::from_listing(templates.iter().cloned());
    let t = in_force
        .templates()
        .iter()
        .find(|t| t.name == name)
        .unwrap()
        .clone();
    format!("{name}@{}#{}", t.generation, t.fingerprint)
}

#[test]
fn a_namespace_says_which_templates_select_it() {
    let mut observed = healthy();
    let templates = observed.templates.found().unwrap().clone();
    let current = pod(
        "2026-01-01T00:00:00Z",
        json!({INJECTED_ANNOTATION: record_of(&templates, "agent")}),
    );
    let before = pod("2023-01-01T00:00:00Z", json!({}));
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pods: Read::Found(vec![current.clone(), before]),
    });
    let report = judge(&observed, &names(), now());
    let l = the(&report, NAMESPACE);
    assert_eq!(
        l.message,
        "shop: selected by agent (best effort) (each then by its pod selector)"
    );
    let pods = the(&report, PODS);
    assert_eq!(pods.state, State::Warning, "{pods:?}");
    assert!(
        pods.message
            .starts_with("2 Pods: 1 current, 0 stale, 1 missing a template (0 required)"),
        "{pods:?}"
    );

    // Created after the best-effort template, without it: skipped for a conflict, or selected
    // since (a selector widened, the namespace relabelled), which is no broken link.
    let after = pod("2026-01-01T00:00:00Z", json!({}));
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pods: Read::Found(vec![current, after]),
    });
    let report = judge(&observed, &names(), now());
    let pods = the(&report, PODS);
    assert_eq!(pods.state, State::Warning, "{pods:?}");
    assert!(
        pods.message
            .contains("--field-selector reason=TemplateSkipped"),
        "{pods:?}"
    );
    assert!(!report.broken);

    // Opted out.
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: shop(json!({"team": "shop", "sidecar.dev/injection": "disabled"})),
        pods: Read::Found(Vec::new()),
    });
    let report = judge(&observed, &names(), now());
    assert!(
        the(&report, NAMESPACE)
            .message
            .contains("no template applies: the namespace opts out")
    );
    // The operator's own.
    observed.target = Some(Target::Namespace {
        name: "sidecar-injector".to_owned(),
        labels: shop(json!({})),
        pods: Read::Found(Vec::new()),
    });
    let report = judge(&observed, &names(), now());
    assert!(
        the(&report, NAMESPACE)
            .message
            .contains("the operator's own")
    );
}

#[test]
fn a_pods_record_is_compared_with_the_templates_in_force() {
    let mut observed = healthy();
    let templates = observed.templates.found().unwrap().clone();
    let target = |pod: ObjectMeta| Target::Pod {
        namespace: "shop".to_owned(),
        name: "web-1".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pod: Read::Found(Box::new(pod)),
    };
    observed.target = Some(target(pod(
        "2026-01-01T00:00:00Z",
        json!({INJECTED_ANNOTATION: record_of(&templates, "agent")}),
    )));
    let report = judge(&observed, &names(), now());
    assert!(!report.broken, "{report:#?}");
    assert_eq!(
        the(&report, SELECTION).message,
        "pod/web-1 -n shop: selected by agent (best effort)"
    );
    assert!(
        the(&report, RECORD)
            .message
            .ends_with("; current with agent")
    );

    // Created after the best-effort template, without it: skipped, a warning.
    observed.target = Some(target(pod("2026-01-01T00:00:00Z", json!({}))));
    let report = judge(&observed, &names(), now());
    let l = the(&report, RECORD);
    assert_eq!(l.state, State::Warning, "{l:?}");
    assert!(
        l.message
            .contains("missing best-effort agent: skipped at admission"),
        "{l:?}"
    );
    assert!(l.message.contains("TemplateSkipped Event"), "{l:?}");
    assert!(!report.broken);

    // An earlier version, and a template gone.
    observed.target = Some(target(pod(
        "2026-01-01T00:00:00Z",
        json!({INJECTED_ANNOTATION: "agent@0#0000000000000000,old@3"}),
    )));
    let report = judge(&observed, &names(), now());
    let l = the(&report, RECORD);
    assert_eq!(l.state, State::Warning, "{l:?}");
    assert!(l.message.contains("stale agent"), "{l:?}");
    assert!(
        l.message
            .contains("carries old, which is no longer in force"),
        "{l:?}"
    );

    // Opted out of the best-effort template: selected by none, nothing missing.
    observed.target = Some(target(pod(
        "2026-01-01T00:00:00Z",
        json!({INJECT_ANNOTATION: "false"}),
    )));
    let report = judge(&observed, &names(), now());
    let l = the(&report, SELECTION);
    assert!(
        l.message
            .contains("no template in force selects it; it opts out"),
        "{l:?}"
    );
    assert_eq!(the(&report, RECORD).state, State::Ok);

    // Not there.
    observed.target = Some(Target::Pod {
        namespace: "shop".to_owned(),
        name: "web-1".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pod: Read::Missing,
    });
    assert_eq!(
        the(&judge(&observed, &names(), now()), SELECTION).state,
        State::Broken
    );
}

#[test]
fn a_missing_required_template_is_broken_whenever_the_pod_was_created() {
    let mut observed = healthy();
    observed.templates = Read::Found(vec![template("agent", "Fail", true, json!([]))]);
    for created in ["2023-01-01T00:00:00Z", "2026-01-01T00:00:00Z"] {
        observed.target = Some(Target::Pod {
            namespace: "shop".to_owned(),
            name: "web-1".to_owned(),
            labels: shop(json!({"team": "shop"})),
            pod: Read::Found(Box::new(pod(created, json!({})))),
        });
        let report = judge(&observed, &names(), now());
        let l = the(&report, RECORD);
        assert_eq!(l.state, State::Broken, "{l:?}");
        assert!(l.message.contains("missing required agent"), "{l:?}");
        assert!(
            l.message
                .contains("kubectl sidecar explain pod/web-1 -n shop"),
            "{l:?}"
        );
    }
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pods: Read::Found(vec![pod("2023-01-01T00:00:00Z", json!({}))]),
    });
    let report = judge(&observed, &names(), now());
    let pods = the(&report, PODS);
    assert_eq!(pods.state, State::Broken, "{pods:?}");
    assert!(
        pods.message
            .starts_with("1 Pod: 0 current, 0 stale, 1 missing a template (1 required)"),
        "{pods:?}"
    );
    assert!(report.broken);
}

#[test]
fn a_namespace_lists_a_few_pods_and_counts_the_rest() {
    let mut observed = healthy();
    let pods: Vec<ObjectMeta> = (1..=8)
        .map(|i| {
            let mut p = pod("2026-01-01T00:00:00Z", json!({}));
            p.name = Some(format!("web-{i}"));
            p
        })
        .collect();
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pods: Read::Found(pods),
    });
    let report = judge(&observed, &names(), now());
    let l = the(&report, PODS);
    assert!(
        l.message.contains(
            "web-1 (agent), web-2 (agent), web-3 (agent), web-4 (agent), web-5 (agent) and 3 more"
        ),
        "{l:?}"
    );
    assert!(!l.message.contains("web-6"), "{l:?}");
}

#[test]
fn a_mistyped_pod_or_namespace_is_an_error_not_a_link() {
    let mut observed = healthy();
    assert_eq!(absent_target(&observed), None);
    observed.target = Some(Target::Pod {
        namespace: "shop".to_owned(),
        name: "web-l".to_owned(),
        labels: shop(json!({"team": "shop"})),
        pod: Read::Missing,
    });
    assert_eq!(
        absent_target(&observed).as_deref(),
        Some("pod/web-l -n shop")
    );
    observed.target = Some(Target::Pod {
        namespace: "shpo".to_owned(),
        name: "web-1".to_owned(),
        labels: Read::Missing,
        pod: Read::Missing,
    });
    assert_eq!(absent_target(&observed).as_deref(), Some("namespace/shpo"));
    observed.target = Some(Target::Namespace {
        name: "shpo".to_owned(),
        labels: Read::Missing,
        pods: Read::Found(Vec::new()),
    });
    assert_eq!(absent_target(&observed).as_deref(), Some("namespace/shpo"));
    // Not readable is no error: its links say so.
    observed.target = Some(Target::Namespace {
        name: "shop".to_owned(),
        labels: Read::Forbidden("forbidden by RBAC".to_owned()),
        pods: Read::Found(Vec::new()),
    });
    assert_eq!(absent_target(&observed), None);
}
