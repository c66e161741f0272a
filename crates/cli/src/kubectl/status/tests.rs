#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_api::names::{INJECTED_ANNOTATION, ROLLOUT_ANNOTATION};
use injector_core::after_admission::workload::WorkloadObject;
use injector_core::compile;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use serde_json::{Value, json};

use super::*;
use injector_core::registry::in_force::from_listing;

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

fn key(namespace: &str, kind: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
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
    let census = injector_core::after_admission::lifecycle::census(
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
fn each_pod_resolves_to_its_workload_through_what_was_looked_up() {
    let owners = BTreeMap::from([
        (
            key("shop", "ReplicaSet", "web-1"),
            Some(key("shop", "Deployment", "web")),
        ),
        (
            key("shop", "ReplicaSet", "quiet-1"),
            Some(key("shop", "Deployment", "quiet")),
        ),
        (key("shop", "ReplicaSet", "lone"), None),
        (
            key("shop", "Job", "nightly-1"),
            Some(key("shop", "CronJob", "nightly")),
        ),
    ]);
    let verdicts = BTreeMap::from([
        (key("shop", "Deployment", "web"), None),
        (
            key("shop", "Deployment", "quiet"),
            Some(NotRestartable::OptedOut),
        ),
        (
            key("shop", "StatefulSet", "db"),
            Some(NotRestartable::OnDelete),
        ),
        (key("shop", "DaemonSet", "node"), None),
    ]);
    let lookups = Lookups { owners, verdicts };
    let resolve = |owner: Option<(&str, &str)>| {
        let workload = workload_of(&meta("shop", "p", owner, None), &lookups);
        (kubectl_name(&workload.reference), workload.not_restartable)
    };
    let expected = [
        (Some(("ReplicaSet", "web-1")), "deployment/web", None),
        (
            Some(("ReplicaSet", "quiet-1")),
            "deployment/quiet",
            Some(NotRestartable::OptedOut),
        ),
        (
            Some(("StatefulSet", "db")),
            "statefulset/db",
            Some(NotRestartable::OnDelete),
        ),
        (Some(("DaemonSet", "node")), "daemonset/node", None),
        // Not read (gone since the list): counted as gone.
        (
            Some(("DaemonSet", "other")),
            "daemonset/other",
            Some(NotRestartable::Gone),
        ),
        (
            Some(("ReplicaSet", "lone")),
            "replicaset/lone",
            Some(NotRestartable::NoDeployment),
        ),
        (
            Some(("Job", "nightly-1")),
            "cronjob/nightly",
            Some(NotRestartable::CronJob),
        ),
        (None, "pod/p", Some(NotRestartable::BarePod)),
    ];
    for (owner, reference, why) in expected {
        assert_eq!(resolve(owner), (reference.to_owned(), why), "{owner:?}");
    }
}

#[test]
fn only_workloads_restartable_by_kind_are_read() {
    let (templates, pods, namespaces) = cluster();
    let (snapshot, _) = from_listing(templates.iter().cloned());
    let live = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    let owners = BTreeMap::from([
        (
            key("shop", "ReplicaSet", "web-old"),
            Some(key("shop", "Deployment", "web")),
        ),
        (
            key("shop", "Job", "nightly-1"),
            Some(key("shop", "CronJob", "nightly")),
        ),
    ]);
    assert_eq!(
        workload_lookups(&live, &owners)
            .into_iter()
            .collect::<Vec<_>>(),
        [key("shop", "Deployment", "web")]
    );
}

#[test]
fn a_non_controller_owner_leaves_the_pod_bare() {
    let mut pod = meta("shop", "p", Some(("ReplicaSet", "web-1")), None);
    if let Some(owners) = &mut pod.owner_references {
        owners[0].controller = None;
    }
    let workload = workload_of(&pod, &Lookups::default());
    assert_eq!(kubectl_name(&workload.reference), "pod/p");
}

fn report_of_cluster() -> StatusReport {
    let (templates, pods, namespaces) = cluster();
    let (snapshot, observed) = from_listing(templates.iter().cloned());
    let live = count(&snapshot, &pods, &namespaces, "sidecar-injector");
    let lookups = Lookups {
        owners: BTreeMap::from([
            (
                key("shop", "ReplicaSet", "web-old"),
                Some(key("shop", "Deployment", "web")),
            ),
            (
                key("shop", "Job", "nightly-1"),
                Some(key("shop", "CronJob", "nightly")),
            ),
        ]),
        verdicts: BTreeMap::from([(key("shop", "Deployment", "web"), None)]),
    };
    report(&templates, &observed, &live, &lookups)
}

#[test]
fn stale_and_missing_pods_are_grouped_by_workload_restartable_first() {
    let report = report_of_cluster();
    let workloads: Vec<(String, Vec<String>, Vec<String>)> = report.templates[0]
        .workloads
        .iter()
        .map(|w| {
            (
                kubectl_name(&w.workload),
                w.stale.clone(),
                w.missing.clone(),
            )
        })
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
    let report = report(&templates, &observed, &live, &Lookups::default());
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

/// Workloads of every kind and setting the rules tell apart, each owning one stale and one
/// missing Pod of `agent` in `shop`, as the API server would return them.
struct Workloads {
    pods: Vec<ObjectMeta>,
    replica_sets: Vec<ObjectMeta>,
    jobs: Vec<ObjectMeta>,
    deployments: Vec<Deployment>,
    stateful_sets: Vec<StatefulSet>,
    daemon_sets: Vec<DaemonSet>,
}

/// `kind` named `name` in `shop` with `spec`, annotated `sidecar.dev/rollout: rollout`, as
/// JSON for `K`.
fn object<K: serde::de::DeserializeOwned>(name: &str, rollout: Option<&str>, spec: Value) -> K {
    let annotations = rollout.map(|r| json!({ (ROLLOUT_ANNOTATION): r }));
    let mut spec = spec;
    spec["selector"] = json!({});
    spec["template"] = json!({});
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn workloads() -> Workloads {
    let owned = |name: &str, owner: Option<(&str, &str)>| {
        let mut meta = meta("shop", name, owner, None);
        meta.labels = None;
        meta
    };
    // (owner of the Pods, their name prefix)
    let owners = [
        (Some(("ReplicaSet", "web-1")), "web"),
        (Some(("ReplicaSet", "quiet-1")), "quiet"),
        (Some(("ReplicaSet", "orphan-1")), "orphan"),
        (Some(("ReplicaSet", "lone")), "lone"),
        (Some(("ReplicaSet", "vanished")), "vanished"),
        (Some(("ReplicaSet", "canary-1")), "canary"),
        (Some(("StatefulSet", "db")), "db"),
        (Some(("StatefulSet", "cache")), "cache"),
        (Some(("StatefulSet", "ledger")), "ledger"),
        (Some(("DaemonSet", "node")), "node"),
        (Some(("DaemonSet", "logs")), "logs"),
        (Some(("DaemonSet", "gone")), "gone"),
        (Some(("Job", "nightly-1")), "nightly"),
        (Some(("Job", "once")), "once"),
        (Some(("ReplicationController", "rc")), "rc"),
        (None, "bare"),
    ];
    let stale = Some(record_of("agent:1", 1));
    let pods = owners
        .iter()
        .flat_map(|(owner, prefix)| {
            [
                meta("shop", &format!("{prefix}-stale"), *owner, stale.clone()),
                meta("shop", &format!("{prefix}-missing"), *owner, None),
            ]
        })
        .collect();
    Workloads {
        pods,
        replica_sets: vec![
            owned("web-1", Some(("Deployment", "web"))),
            owned("quiet-1", Some(("Deployment", "quiet"))),
            // Its Deployment is gone.
            owned("orphan-1", Some(("Deployment", "orphan"))),
            owned("lone", None),
            owned("canary-1", Some(("Rollout", "canary"))),
        ],
        jobs: vec![
            owned("nightly-1", Some(("CronJob", "nightly"))),
            owned("once", None),
        ],
        deployments: vec![
            object("web", None, json!({"strategy": {"type": "Recreate"}})),
            object("quiet", Some("Disabled"), json!({})),
        ],
        stateful_sets: vec![
            object("db", None, json!({"updateStrategy": {"type": "OnDelete"}})),
            object("cache", None, json!({})),
            object("ledger", Some("disabled"), json!({})),
        ],
        daemon_sets: vec![
            object(
                "node",
                None,
                json!({"updateStrategy": {"type": "RollingUpdate"}}),
            ),
            object(
                "logs",
                None,
                json!({"updateStrategy": {"type": "OnDelete"}}),
            ),
        ],
    }
}

fn find<'a, K>(objects: &'a [K], name: &str, meta: impl Fn(&K) -> &ObjectMeta) -> Option<&'a K> {
    objects
        .iter()
        .find(|o| meta(o).name.as_deref() == Some(name))
}

/// What `kubectl sidecar status` decides of `cluster`: each restartable workload with its
/// stale and missing Pods, and how many such Pods no rollout restarts.
fn as_the_plugin_sees(
    cluster: &Workloads,
    snapshot: &Snapshot,
) -> (BTreeMap<WorkloadRef, u32>, u32) {
    let namespaces = [namespace("shop", "shop")];
    let live = count(snapshot, &cluster.pods, &namespaces, "sidecar-injector");
    // What cluster::owners and cluster::verdicts read.
    let owners = owner_lookups(&live)
        .into_iter()
        .map(|key| {
            let found = match key.kind.as_str() {
                "ReplicaSet" => find(&cluster.replica_sets, &key.name, |m| m),
                _ => find(&cluster.jobs, &key.name, |m| m),
            };
            (key, found.and_then(owner_of))
        })
        .collect();
    let verdicts = workload_lookups(&live, &owners)
        .into_iter()
        .map(|key| {
            let verdict = match key.kind.as_str() {
                "Deployment" => find(&cluster.deployments, &key.name, |o| &o.metadata)
                    .map(|o| WorkloadObject::Deployment(o).not_restartable()),
                "StatefulSet" => find(&cluster.stateful_sets, &key.name, |o| &o.metadata)
                    .map(|o| WorkloadObject::StatefulSet(o).not_restartable()),
                _ => find(&cluster.daemon_sets, &key.name, |o| &o.metadata)
                    .map(|o| WorkloadObject::DaemonSet(o).not_restartable()),
            };
            (key, verdict.unwrap_or(Some(NotRestartable::Gone)))
        })
        .collect();
    let groups = group_by_workload(&live.behind["agent"], &Lookups { owners, verdicts });
    let mut restartable = BTreeMap::new();
    let mut not_restartable = 0;
    for group in groups {
        let pods = u32::try_from(group.stale.len() + group.missing.len()).unwrap();
        match group.not_restartable {
            None => *restartable.entry(group.workload).or_default() += pods,
            Some(_) => not_restartable += pods,
        }
    }
    (restartable, not_restartable)
}

/// What the operator's leader decides of `cluster`, step by step as its census and
/// `RolloutDriver` do: the census by owner, each owner's restartable workload (a ReplicaSet's
/// owner read), each workload's view, and the rollout's decision.
fn as_the_controller_sees(
    cluster: &Workloads,
    snapshot: &Snapshot,
) -> (BTreeMap<WorkloadRef, u32>, u32) {
    use injector_controller::rollout::{daemon_set_view, deployment_view, stateful_set_view};
    use injector_core::after_admission::rollout::{WorkloadState, next_restarts};
    use injector_core::after_admission::workload::restarted_through_its_owner;
    use k8s_openapi::api::core::v1::{Namespace as CoreNamespace, Pod};
    use kube::core::PartialObjectMeta;
    use std::sync::Arc;

    let pods = injector_controller::census::PodIndex::listed(cluster.pods.iter().map(|meta| {
        PartialObjectMeta::<Pod> {
            metadata: meta.clone(),
            ..PartialObjectMeta::default()
        }
    }))
    .snapshot();
    let shop = PartialObjectMeta::<CoreNamespace> {
        metadata: namespace("shop", "shop"),
        ..PartialObjectMeta::default()
    };
    let census =
        injector_controller::census::count(snapshot, &pods, &[Arc::new(shop)], "sidecar-injector");
    let mut workloads: BTreeMap<WorkloadRef, u32> = BTreeMap::new();
    let mut not_restartable = 0;
    for (owner, &pods) in &census["agent"].behind {
        let workload = owner.as_ref().and_then(|owner| {
            let owners_owner = restarted_through_its_owner(owner)
                .then(|| find(&cluster.replica_sets, &owner.name, |m| m).and_then(owner_of))
                .flatten();
            Workload::behind(owner, owners_owner.as_ref())
                .restartable()
                .cloned()
        });
        match workload {
            Some(workload) => *workloads.entry(workload).or_default() += pods,
            None => not_restartable += pods,
        }
    }
    let mut states = Vec::new();
    for (workload, pods) in workloads {
        let view = match workload.kind.as_str() {
            "Deployment" => {
                find(&cluster.deployments, &workload.name, |o| &o.metadata).map(deployment_view)
            }
            "StatefulSet" => {
                find(&cluster.stateful_sets, &workload.name, |o| &o.metadata).map(stateful_set_view)
            }
            _ => find(&cluster.daemon_sets, &workload.name, |o| &o.metadata).map(daemon_set_view),
        };
        let Some(view) = view else {
            not_restartable += pods;
            continue;
        };
        states.push(WorkloadState {
            workload,
            opted_out: view.not_restartable.is_some(),
            restarted: false,
            complete: view.complete,
            since_progress: std::time::Duration::ZERO,
            pods,
        });
    }
    let template = snapshot.get("agent").unwrap();
    let decision = next_restarts(&template.update_strategy, &states, not_restartable);
    let restartable = states
        .into_iter()
        .filter(|s| !s.opted_out)
        .map(|s| (s.workload, s.pods))
        .collect();
    (restartable, decision.status.not_restartable)
}

#[test]
fn the_plugin_and_the_controller_classify_workloads_alike() {
    let (templates, _, _) = cluster();
    let (snapshot, _) = from_listing(templates);
    let cluster = workloads();
    let plugin = as_the_plugin_sees(&cluster, &snapshot);
    let controller = as_the_controller_sees(&cluster, &snapshot);
    assert_eq!(plugin, controller);
    // Only these are restarted; OnDelete, opted out, gone and every other kind are not.
    let restartable: Vec<String> = plugin.0.keys().map(kubectl_name).collect();
    assert_eq!(
        restartable,
        ["daemonset/node", "deployment/web", "statefulset/cache"]
    );
    assert!(plugin.0.values().all(|&pods| pods == 2));
    assert_eq!(plugin.1, 2 * 13);
}
