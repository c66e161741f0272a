#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use injector_api::SidecarTemplate;
use injector_core::{Registry, compile};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use serde_json::json;

use injector_core::lifecycle::Tally;

use super::*;

fn snapshot(specs: &[(&str, serde_json::Value)]) -> Arc<injector_core::Snapshot> {
    let mut registry = Registry::new();
    for (name, spec) in specs {
        let template: SidecarTemplate = serde_json::from_value(json!({
            "apiVersion": "sidecar.dev/v1alpha1",
            "kind": "SidecarTemplate",
            "metadata": {"name": name, "generation": 1},
            "spec": spec,
        }))
        .unwrap();
        registry.apply(compile(&template).unwrap());
    }
    registry.snapshot()
}

fn pod(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    record: Option<String>,
) -> Arc<PartialObjectMeta<Pod>> {
    let object: PartialObjectMeta<Pod> = PartialObjectMeta {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            annotations: record.map(|r| BTreeMap::from([(INJECTED_ANNOTATION.to_owned(), r)])),
            ..ObjectMeta::default()
        },
        ..PartialObjectMeta::default()
    };
    Arc::new(object)
}

fn namespace(name: &str) -> Arc<PartialObjectMeta<Namespace>> {
    let mut object: PartialObjectMeta<Namespace> = PartialObjectMeta::default();
    object.metadata.name = Some(name.to_owned());
    Arc::new(object)
}

#[test]
fn a_pod_keeps_only_what_the_census_reads() {
    let mut meta = ObjectMeta {
        name: Some("web-1".into()),
        namespace: Some("shop".into()),
        uid: Some("u".into()),
        labels: Some(BTreeMap::from([("app".into(), "web".into())])),
        annotations: Some(BTreeMap::from([
            (INJECTED_ANNOTATION.into(), "mesh@1#0123456789abcdef".into()),
            (INJECT_ANNOTATION.into(), "false".into()),
            (TEMPLATES_ANNOTATION.into(), "agent".into()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".into(),
                "{…}".repeat(1000),
            ),
        ])),
        owner_references: Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            name: "web-5d9".into(),
            ..OwnerReference::default()
        }]),
        managed_fields: Some(vec![Default::default()]),
        generate_name: Some("web-".into()),
        ..ObjectMeta::default()
    };
    strip_pod(&mut meta);
    assert_eq!(meta.name.as_deref(), Some("web-1"));
    assert_eq!(meta.labels.as_ref().unwrap().len(), 1);
    let annotations: Vec<&str> = meta
        .annotations
        .as_ref()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        annotations,
        [INJECT_ANNOTATION, INJECTED_ANNOTATION, TEMPLATES_ANNOTATION]
    );
    assert_eq!(meta.owner_references.as_ref().unwrap()[0].name, "web-5d9");
    assert!(meta.managed_fields.is_none() && meta.uid.is_none() && meta.generate_name.is_none());

    let mut namespace = ObjectMeta {
        name: Some("shop".into()),
        labels: Some(BTreeMap::from([("team".into(), "a".into())])),
        annotations: Some(BTreeMap::from([("a".into(), "b".into())])),
        ..ObjectMeta::default()
    };
    strip_namespace(&mut namespace);
    assert!(namespace.annotations.is_none());
    assert_eq!(namespace.labels.unwrap().len(), 1);
}

#[test]
fn pods_being_deleted_and_the_operators_namespace_are_not_missing() {
    let snapshot = snapshot(&[(
        "mesh",
        json!({"containers": [{"name": "proxy", "image": "envoy:1"}]}),
    )]);
    let mesh = snapshot.get("mesh").unwrap();
    let current = format!("mesh@1#{}", mesh.fingerprint);
    let mut deleting = (*pod("shop", "old", &[], None)).clone();
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let pods = [
        pod("shop", "a", &[], Some(current.clone())),
        pod("shop", "b", &[], None),
        Arc::new(deleting),
        pod("sidecar-injector", "operator", &[], None),
        pod("kube-system", "dns", &[], None),
        // A namespace the view has not seen yet.
        pod("new", "c", &[], None),
    ];
    let namespaces = [
        namespace("shop"),
        namespace("sidecar-injector"),
        namespace("kube-system"),
    ];
    let tallies = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    assert_eq!(
        tallies["mesh"].tally,
        Tally {
            current: 1,
            stale: 0,
            stale_in_place: 0,
            missing: 1,
        }
    );
    assert_eq!(tallies["mesh"].behind, BTreeMap::from([(None, 1)]));
}
