#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_api::names::INJECTED_ANNOTATION;
use injector_core::compile;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::*;
use injector_core::in_force::from_listing;

/// A template named `agent` selecting `app: web` in namespaces labelled `team: shop`, adding
/// a container of `image`, at `generation`; with `status` as the operator wrote it.
fn agent(image: &str, generation: i64, status: Value) -> SidecarTemplate {
    serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": "agent", "generation": generation},
        "spec": {
            "namespaceSelector": {"matchLabels": {"team": "shop"}},
            "podSelector": {"matchLabels": {"app": "web"}},
            "failurePolicy": "Ignore",
            "updateStrategy": {"type": "RollingRestart"},
            "containers": [{"name": "agent", "image": image}],
        },
        "status": status,
    }))
    .unwrap()
}

/// `agent@generation#fingerprint` of the template as it was with `image`.
fn record_of(image: &str, generation: i64) -> String {
    let compiled = compile(&agent(image, generation, json!({}))).unwrap();
    format!("agent@{generation}#{}", compiled.fingerprint)
}

fn meta(
    namespace: &str,
    name: &str,
    owner: Option<(&str, &str)>,
    record: Option<String>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
        annotations: record.map(|r| BTreeMap::from([(INJECTED_ANNOTATION.to_owned(), r)])),
        owner_references: owner.map(|(kind, name)| {
            vec![OwnerReference {
                kind: kind.to_owned(),
                name: name.to_owned(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        }),
        ..ObjectMeta::default()
    }
}

fn namespace(name: &str, team: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(BTreeMap::from([("team".to_owned(), team.to_owned())])),
        ..ObjectMeta::default()
    }
}

fn key(namespace: &str, kind: &str, name: &str) -> ObjectKey {
    ObjectKey {
        namespace: namespace.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

/// The cluster of most tests: `agent` at generation 2 (image 2), and in namespace `shop`:
/// two stale Pods of Deployment `web`, one current Pod of it, a bare Pod and a CronJob's Pod
/// created before the template (missing), a Pod being deleted, a Pod of another namespace
/// and one in the operator's namespace that the template would select by its labels.
fn cluster() -> (Vec<SidecarTemplate>, Vec<ObjectMeta>, Vec<ObjectMeta>) {
    let status = json!({
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "Valid", "message": "in use",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
        "pods": {"injected": 3, "current": 1, "stale": 2, "missing": 2},
        "rollout": {"state": "Progressing", "restarting": [
            {"kind": "Deployment", "namespace": "shop", "name": "web"}
        ], "waiting": 0, "notRestartable": 2},
    });
    let templates = vec![agent("agent:2", 2, status)];
    let stale = || Some(record_of("agent:1", 1));
    let current = || Some(record_of("agent:2", 2));
    let mut deleting = meta(
        "shop",
        "web-old-gone",
        Some(("ReplicaSet", "web-old")),
        stale(),
    );
    deleting.deletion_timestamp = Some(Time(Default::default()));
    let pods = vec![
        meta(
            "shop",
            "web-old-b",
            Some(("ReplicaSet", "web-old")),
            stale(),
        ),
        meta(
            "shop",
            "web-old-a",
            Some(("ReplicaSet", "web-old")),
            stale(),
        ),
        meta(
            "shop",
            "web-new-a",
            Some(("ReplicaSet", "web-new")),
            current(),
        ),
        meta("shop", "bare", None, None),
        meta("shop", "nightly-1-x", Some(("Job", "nightly-1")), None),
        deleting,
        meta("elsewhere", "web-x", None, None),
        meta(
            "sidecar-injector",
            "operator-a",
            Some(("ReplicaSet", "op")),
            None,
        ),
    ];
    let namespaces = vec![
        namespace("shop", "shop"),
        namespace("elsewhere", "other"),
        namespace("sidecar-injector", "shop"),
    ];
    (templates, pods, namespaces)
}

#[test]
fn the_live_count_is_the_operators_census() {
    let (templates, pods, namespaces) = cluster();
    let (snapshot, _) = from_listing(templates.iter().cloned());
    let live = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    let tally = live.tallies["agent"];
    assert_eq!(
        PodCounts::from(tally),
        PodCounts {
            injected: 3,
            current: 1,
            stale: 2,
            missing: 2
        }
    );
    let states: Vec<(&str, PodState)> = live.behind["agent"]
        .iter()
        .map(|b| (b.pod.name.as_deref().unwrap(), b.state))
        .collect();
    assert_eq!(
        states,
        [
            ("web-old-b", PodState::Stale { in_place: true }),
            ("web-old-a", PodState::Stale { in_place: true }),
            ("bare", PodState::Missing),
            ("nightly-1-x", PodState::Missing),
        ]
    );
    // The same decision as the operator's leader, on the same Pods.
    let none = BTreeMap::new();
    let census = injector_core::lifecycle::census(
        snapshot.templates(),
        pods.iter()
            .filter(|p| p.deletion_timestamp.is_none())
            .map(|p| PodMeta {
                namespace: p.namespace.as_deref().unwrap(),
                labels: p.labels.as_ref().unwrap(),
                annotations: p.annotations.as_ref().unwrap_or(&none),
            }),
        |ns| {
            namespaces
                .iter()
                .find(|n| n.name.as_deref() == Some(ns) && ns != "sidecar-injector")
                .and_then(|n| n.labels.as_ref())
        },
    );
    assert_eq!(census["agent"], tally);
}

#[test]
fn only_replicasets_and_jobs_are_looked_up() {
    let (templates, pods, namespaces) = cluster();
    let (snapshot, _) = from_listing(templates.iter().cloned());
    let live = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    assert_eq!(
        owner_lookups(&live).into_iter().collect::<Vec<_>>(),
        [
            key("shop", "Job", "nightly-1"),
            key("shop", "ReplicaSet", "web-old")
        ]
    );
}

#[test]
fn each_owner_resolves_to_its_workload() {
    let owners = Owners::from([
        (
            key("shop", "ReplicaSet", "web-1"),
            Some(("Deployment".to_owned(), "web".to_owned())),
        ),
        (key("shop", "ReplicaSet", "lone"), None),
        (
            key("shop", "ReplicaSet", "rollout-1"),
            Some(("Rollout".to_owned(), "canary".to_owned())),
        ),
        (
            key("shop", "Job", "nightly-1"),
            Some(("CronJob".to_owned(), "nightly".to_owned())),
        ),
        (key("shop", "Job", "once"), None),
    ]);
    let resolve = |owner: Option<(&str, &str)>| {
        let workload = workload_of(&meta("shop", "p", owner, None), &owners);
        (workload.reference(), workload.not_restartable.is_none())
    };
    let expected = [
        (Some(("ReplicaSet", "web-1")), "deployment/web", true),
        (Some(("StatefulSet", "db")), "statefulset/db", true),
        (Some(("DaemonSet", "node")), "daemonset/node", true),
        (Some(("ReplicaSet", "lone")), "replicaset/lone", false),
        // A ReplicaSet not looked up (gone since) is taken as having no Deployment.
        (Some(("ReplicaSet", "unknown")), "replicaset/unknown", false),
        (Some(("ReplicaSet", "rollout-1")), "rollout/canary", false),
        (Some(("Job", "nightly-1")), "cronjob/nightly", false),
        (Some(("Job", "once")), "job/once", false),
        (
            Some(("ReplicationController", "rc")),
            "replicationcontroller/rc",
            false,
        ),
        (None, "pod/p", false),
    ];
    for (owner, reference, restartable) in expected {
        assert_eq!(
            resolve(owner),
            (reference.to_owned(), restartable),
            "{owner:?}"
        );
    }
}

#[test]
fn a_non_controller_owner_leaves_the_pod_bare() {
    let mut pod = meta("shop", "p", Some(("ReplicaSet", "web-1")), None);
    if let Some(owners) = &mut pod.owner_references {
        owners[0].controller = None;
    }
    assert_eq!(workload_of(&pod, &Owners::new()).reference(), "pod/p");
}

fn report_of_cluster() -> StatusReport {
    let (templates, pods, namespaces) = cluster();
    let (snapshot, observed) = from_listing(templates.iter().cloned());
    let live = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    let owners = Owners::from([
        (
            key("shop", "ReplicaSet", "web-old"),
            Some(("Deployment".to_owned(), "web".to_owned())),
        ),
        (
            key("shop", "Job", "nightly-1"),
            Some(("CronJob".to_owned(), "nightly".to_owned())),
        ),
    ]);
    report(&templates, &observed, &live, &owners)
}

#[test]
fn stale_and_missing_pods_are_grouped_by_workload_restartable_first() {
    let report = report_of_cluster();
    let workloads: Vec<(String, Vec<String>, Vec<String>)> = report.templates[0]
        .workloads
        .iter()
        .map(|w| (w.workload.reference(), w.stale.clone(), w.missing.clone()))
        .collect();
    let names = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        workloads,
        [
            (
                "deployment/web".to_owned(),
                names(&["web-old-a", "web-old-b"]),
                names(&[])
            ),
            (
                "cronjob/nightly".to_owned(),
                names(&[]),
                names(&["nightly-1-x"])
            ),
            ("pod/bare".to_owned(), names(&[]), names(&["bare"])),
        ]
    );
}

#[test]
fn the_table_shows_counts_rollout_and_workloads() {
    let table = to_table(&report_of_cluster());
    assert_eq!(
        table,
        "\
TEMPLATE   READY   STRATEGY         INJECTED   CURRENT   STALE   MISSING   ROLLOUT
agent      True    RollingRestart   3          1         2       2         Progressing

agent:
  rollout Progressing; restarting deployment/web -n shop; 0 waiting; 2 Pods not restartable
  NAMESPACE   WORKLOAD          RESTARTABLE    STALE   MISSING   PODS
  shop        deployment/web    yes            2       0         web-old-a,web-old-b
  shop        cronjob/nightly   no: CronJob    0       1         nightly-1-x
  shop        pod/bare          no: bare Pod   0       1         bare
"
    );
}

#[test]
fn a_count_the_operator_wrote_differently_is_shown_beside() {
    let mut report = report_of_cluster();
    report.templates[0].status_pods = Some(PodCounts {
        injected: 2,
        current: 0,
        stale: 2,
        missing: 3,
    });
    let table = to_table(&report);
    assert!(
        table.contains(
            "the operator's status.pods differs (injected 2, current 0, stale 2, missing 3)"
        ),
        "{table}"
    );
    report.templates[0].status_pods = None;
    assert!(to_table(&report).contains("no status.pods from the operator yet"));
}

#[test]
fn an_invalid_template_is_listed_without_counts() {
    let (mut templates, pods, namespaces) = cluster();
    // No image: invalid; best effort, so no earlier generation stays in force.
    templates[0] = agent(
        "",
        3,
        json!({"conditions": [{
            "type": "Ready", "status": "False", "reason": "Invalid", "message": "image is required",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}),
    );
    let (snapshot, observed) = from_listing(templates.iter().cloned());
    let live = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    let report = report(&templates, &observed, &live, &Owners::new());
    let template = &report.templates[0];
    assert_eq!((template.pods, template.generation_in_force), (None, None));
    let table = to_table(&report);
    assert!(table.contains("agent      False (Invalid)"), "{table}");
    assert!(table.contains("not in force"), "{table}");
}

#[test]
fn json_carries_live_and_written_counts_and_workloads() {
    let value: Value = serde_json::from_str(&to_json(&report_of_cluster()).unwrap()).unwrap();
    let agent = &value["templates"][0];
    assert_eq!(agent["name"], "agent");
    assert_eq!(agent["generationInForce"], 2);
    assert_eq!(agent["updateStrategy"], "RollingRestart");
    assert_eq!(agent["ready"]["status"], "True");
    assert_eq!(
        agent["pods"],
        json!({"injected": 3, "current": 1, "stale": 2, "missing": 2})
    );
    assert_eq!(agent["statusPods"], agent["pods"]);
    assert_eq!(agent["rollout"]["state"], "Progressing");
    assert_eq!(
        agent["workloads"][0],
        json!({
            "kind": "Deployment", "namespace": "shop", "name": "web",
            "stale": ["web-old-a", "web-old-b"], "missing": [],
        })
    );
    assert_eq!(agent["workloads"][2]["notRestartable"], "bare Pod");
}

#[test]
fn no_template_says_so() {
    assert_eq!(
        to_table(&StatusReport::default()),
        "No SidecarTemplates found.\n"
    );
}
