#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use injector_api::SidecarTemplate;
use injector_core::{Registry, compile};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use serde_json::json;

use injector_core::after_admission::lifecycle::Tally;

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
) -> PartialObjectMeta<Pod> {
    PartialObjectMeta {
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
    }
}

fn namespace(name: &str) -> Arc<PartialObjectMeta<Namespace>> {
    let mut object: PartialObjectMeta<Namespace> = PartialObjectMeta::default();
    object.metadata.name = Some(name.to_owned());
    Arc::new(object)
}

#[test]
fn a_pod_keeps_only_what_the_census_reads() {
    let meta = ObjectMeta {
        name: Some("web-1".into()),
        namespace: Some("shop".into()),
        uid: Some("u".into()),
        resource_version: Some("41".into()),
        labels: Some(BTreeMap::from([
            ("app".into(), "web".into()),
            ("tier".into(), "front".into()),
        ])),
        annotations: Some(BTreeMap::from([
            (INJECTED_ANNOTATION.into(), "mesh@1#0123456789abcdef".into()),
            (INJECT_ANNOTATION.into(), "false".into()),
            (TEMPLATES_ANNOTATION.into(), "agent".into()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".into(),
                "{…}".repeat(1000),
            ),
        ])),
        owner_references: Some(vec![
            OwnerReference {
                kind: "Node".into(),
                name: "n1".into(),
                ..OwnerReference::default()
            },
            OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-5d9".into(),
                uid: "rs-uid".into(),
                controller: Some(true),
                ..OwnerReference::default()
            },
        ]),
        managed_fields: Some(vec![Default::default()]),
        generate_name: Some("web-".into()),
        ..ObjectMeta::default()
    };
    let record = PodRecord::of(meta.clone()).unwrap();
    assert_eq!((&*record.namespace, &*record.name), ("shop", "web-1"));
    assert_eq!(&*record.resource_version, "41");
    assert_eq!(record.labels.label("app"), Some("web"));
    assert_eq!(record.labels.label("tier"), Some("front"));
    assert_eq!(record.labels.label("zone"), None);
    let read = |key| record.annotations.label(key);
    assert_eq!(read(INJECTED_ANNOTATION), Some("mesh@1#0123456789abcdef"));
    assert_eq!(read(INJECT_ANNOTATION), Some("false"));
    assert_eq!(read(TEMPLATES_ANNOTATION), Some("agent"));
    assert_eq!(
        read("kubectl.kubernetes.io/last-applied-configuration"),
        None
    );
    let owner = record.owner.as_deref().unwrap();
    assert_eq!(Some(&owner.reference), owner_of(&meta).as_ref());
    assert_eq!(
        (owner.uid.as_str(), owner.api_version.as_str()),
        ("rs-uid", "apps/v1")
    );
    assert!(!record.deleting);
    // The census's rules read the record as they read the metadata.
    let snapshot = snapshot(&[(
        "agent",
        json!({"injection": "OnRequest", "podSelector": {"matchLabels": {"tier": "front"}}, "containers": [{"name": "agent", "image": "agent:1"}]}),
    )]);
    let agent = snapshot.get("agent").unwrap();
    let info = injector_core::NamespaceInfo {
        name: "shop",
        labels: None,
    };
    assert_eq!(
        lifecycle::state(agent, &record.meta(), &info),
        lifecycle::state(agent, &PodMeta::of(&meta), &info),
    );
    assert_eq!(
        lifecycle::state(agent, &record.meta(), &info),
        Some(lifecycle::PodState::Missing)
    );

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
    let mut deleting = pod("shop", "old", &[], None);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let pods = PodIndex::listed([
        pod("shop", "a", &[], Some(current.clone())),
        pod("shop", "b", &[], None),
        deleting,
        pod("sidecar-injector", "operator", &[], None),
        pod("kube-system", "dns", &[], None),
        // A namespace the view has not seen yet.
        pod("new", "c", &[], None),
    ])
    .snapshot();
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

/// The records of `view`, by name: (resourceVersion, labels) of each.
fn names(view: &PodView) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = view
        .iter()
        .map(|pod| (pod.name.to_string(), pod.resource_version.to_string()))
        .collect();
    found.sort();
    found
}

fn versioned(name: &str, version: &str) -> PartialObjectMeta<Pod> {
    let mut pod = pod("shop", name, &[("app", "web")], None);
    pod.metadata.resource_version = Some(version.to_owned());
    pod
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(name, version)| ((*name).to_owned(), (*version).to_owned()))
        .collect()
}

#[test]
fn the_index_follows_the_watch_and_is_listed_once_a_list_completes() {
    let mut index = PodIndex::default();
    index.apply(Event::Init);
    index.apply(Event::InitApply(versioned("a", "1")));
    index.apply(Event::InitApply(versioned("b", "1")));
    assert!(!index.is_listed(), "half a list is not every Pod");
    index.apply(Event::InitDone);
    assert!(index.is_listed());
    index.apply(Event::Apply(versioned("c", "2")));
    index.apply(Event::Apply(versioned("a", "3")));
    index.apply(Event::Delete(versioned("b", "1")));
    // A Pod without a name is not kept; deleting one never seen changes nothing.
    index.apply(Event::Apply(PartialObjectMeta::default()));
    index.apply(Event::Delete(versioned("x", "1")));
    assert_eq!(names(&index.snapshot()), pairs(&[("a", "3"), ("c", "2")]));
}

#[test]
fn a_relist_updates_the_one_view_in_place_and_drops_what_it_did_not_see() {
    let mut index = PodIndex::listed([
        versioned("a", "1"),
        versioned("b", "1"),
        versioned("c", "1"),
    ]);
    let before = index.snapshot();
    let a_before = before.iter().find(|p| &*p.name == "a").cloned().unwrap();

    // The watch restarted (410 Gone): c was deleted meanwhile, b changed.
    index.apply(Event::Init);
    index.apply(Event::InitApply(versioned("a", "1")));
    index.apply(Event::InitApply(versioned("b", "2")));
    // Half-way, the view is the previous one brought partly up to date: no Pod missing.
    let during = index.snapshot();
    assert_eq!(names(&during), pairs(&[("a", "1"), ("b", "2"), ("c", "1")]));
    // An unchanged Pod keeps its record: a relist makes no second copy of it.
    let a_during = during.iter().find(|p| &*p.name == "a").unwrap();
    assert!(Arc::ptr_eq(&a_before, a_during));
    index.apply(Event::InitDone);
    assert_eq!(names(&index.snapshot()), pairs(&[("a", "1"), ("b", "2")]));
    // A snapshot taken before is what it was.
    assert_eq!(names(&before), pairs(&[("a", "1"), ("b", "1"), ("c", "1")]));

    // A list cut short (an error, then a list again) is swept by the one that completes.
    index.apply(Event::Init);
    index.apply(Event::InitApply(versioned("a", "1")));
    index.apply(Event::Init);
    index.apply(Event::InitApply(versioned("b", "2")));
    index.apply(Event::InitDone);
    assert_eq!(names(&index.snapshot()), pairs(&[("b", "2")]));
}

#[test]
fn records_share_what_pods_repeat_and_let_go_of_it_with_them() {
    let owned = |name: &str, set: &str| {
        let mut pod = pod(
            "shop",
            name,
            &[("app", "web"), ("pod-template-hash", set)],
            Some("mesh@1#0123456789abcdef".to_owned()),
        );
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("web-{set}"),
            uid: format!("uid-{set}"),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        pod
    };
    let mut index = PodIndex::listed([owned("a", "1"), owned("b", "1"), owned("c", "2")]);
    let view = index.snapshot();
    let find = |name: &str| view.iter().find(|p| &*p.name == name).unwrap();
    let (a, b, c) = (find("a"), find("b"), find("c"));
    assert!(Arc::ptr_eq(&a.namespace, &c.namespace));
    assert!(Arc::ptr_eq(&a.labels, &b.labels));
    assert!(!Arc::ptr_eq(&a.labels, &c.labels));
    assert!(
        Arc::ptr_eq(&a.labels.0[0].0, &c.labels.0[0].0),
        "keys are shared"
    );
    assert!(Arc::ptr_eq(
        a.owner.as_ref().unwrap(),
        b.owner.as_ref().unwrap()
    ));
    assert_eq!(c.workload().unwrap().name, "web-2");
    let injected = |p: &PodRecord| p.annotations.injected.clone().unwrap();
    assert!(Arc::ptr_eq(&injected(a), &injected(c)));
    drop(view);

    for name in ["a", "b", "c"] {
        index.apply(Event::Delete(owned(name, "1")));
    }
    assert!(index.is_empty());
    index.apply(Event::Init);
    index.apply(Event::InitDone);
    assert!(index.strings.is_empty() && index.labels.is_empty() && index.owners.is_empty());
}

/// The process's `field` of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The `i`th of [`MEASURED_PODS`] Pods as a metadata watch sends it: a ReplicaSet's (ten Pods
/// each) in one of 20 namespaces, labelled with its app and template hash, injected by one
/// template, with the annotations and managed fields the view drops.
fn measured_pod(i: usize, version: usize) -> PartialObjectMeta<Pod> {
    let set = i / 10;
    let hash = format!("{:010x}", set * 7919);
    PartialObjectMeta {
        metadata: ObjectMeta {
            name: Some(format!("web-{set}-{hash}-{i:05x}")),
            namespace: Some(format!("team-{}", set % 20)),
            uid: Some(format!("{i:08x}-0000-4000-8000-000000000000")),
            resource_version: Some(format!(
                "{}",
                1_000_000 + i + usize::from(i.is_multiple_of(10)) * version
            )),
            labels: Some(BTreeMap::from([
                ("app".into(), format!("web-{set}")),
                ("pod-template-hash".into(), hash.clone()),
            ])),
            annotations: Some(BTreeMap::from([
                (
                    INJECTED_ANNOTATION.into(),
                    "mesh@3#0123456789abcdef".to_owned(),
                ),
                (
                    "kubectl.kubernetes.io/restartedAt".into(),
                    "2026-11-28T10:00:00Z".into(),
                ),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: format!("web-{set}-{hash}"),
                uid: format!("{set:08x}-1111-4000-8000-000000000000"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        ..PartialObjectMeta::default()
    }
}

const MEASURED_PODS: usize = 100_000;

/// Not a test: the view's memory a Pod, and its peak during a relist (`cargo test -p
/// injector-controller --lib census::tests::view_memory -- --ignored --exact --nocapture`,
/// alone in its process: it reads the process's RSS).
#[test]
#[ignore = "a measurement, run alone"]
fn view_memory() {
    let mut index = PodIndex::default();
    let list = |index: &mut PodIndex, version| {
        index.apply(Event::Init);
        for i in 0..MEASURED_PODS {
            index.apply(Event::InitApply(measured_pod(i, version)));
        }
        index.apply(Event::InitDone);
    };
    let before = status_kib("VmRSS:");
    list(&mut index, 0);
    let listed = status_kib("VmRSS:");
    // What a count holds while the relist goes on.
    let taking = std::time::Instant::now();
    let counted = index.snapshot();
    let taken = taking.elapsed();
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    // Every tenth Pod changed during the watch's gap.
    list(&mut index, 1);
    let peak = status_kib("VmHWM:");
    let after = status_kib("VmRSS:");
    assert_eq!(index.len(), MEASURED_PODS);
    assert_eq!(counted.len(), MEASURED_PODS);
    println!(
        "{MEASURED_PODS} Pods: +{:.1} MiB after the list ({:.0} bytes a Pod), a snapshot taken in {taken:?}; relist peak +{:.1} MiB, after +{:.1} MiB",
        (listed - before) as f64 / 1024.0,
        (listed - before) as f64 * 1024.0 / MEASURED_PODS as f64,
        (peak - before) as f64 / 1024.0,
        (after - before) as f64 / 1024.0,
    );
}
