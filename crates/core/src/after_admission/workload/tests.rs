#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;

fn reference(kind: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        kind: kind.to_owned(),
        namespace: "shop".to_owned(),
        name: name.to_owned(),
    }
}

/// A Pod `name` in `shop`, owned by `owners` (kind, name, controller).
fn pod(name: &str, owners: &[(&str, &str, Option<bool>)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("shop".to_owned()),
        owner_references: (!owners.is_empty()).then(|| {
            owners
                .iter()
                .map(|(kind, name, controller)| OwnerReference {
                    kind: (*kind).to_owned(),
                    name: (*name).to_owned(),
                    controller: *controller,
                    ..OwnerReference::default()
                })
                .collect()
        }),
        ..ObjectMeta::default()
    }
}

fn annotated(value: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        annotations: value.map(|v| BTreeMap::from([(ROLLOUT_ANNOTATION.to_owned(), v.to_owned())])),
        ..ObjectMeta::default()
    }
}

#[test]
fn the_owner_is_the_controlling_one_in_the_objects_namespace() {
    let owned = pod(
        "p",
        &[("Node", "n1", None), ("ReplicaSet", "web-1", Some(true))],
    );
    assert_eq!(owner_of(&owned), Some(reference("ReplicaSet", "web-1")));
    assert_eq!(
        owner_of(&pod("p", &[("ReplicaSet", "web-1", Some(false))])),
        None
    );
    assert_eq!(owner_of(&pod("p", &[])), None);
}

#[test]
fn the_controlling_owner_reference_carries_its_uid_and_api_version() {
    let mut owned = pod(
        "p",
        &[("Node", "n1", None), ("ReplicaSet", "web-1", Some(true))],
    );
    if let Some(owners) = owned.owner_references.as_mut() {
        owners[1].uid = "u-1".to_owned();
        owners[1].api_version = "apps/v1".to_owned();
    }
    let controller = controller_of(&owned).unwrap();
    assert_eq!(
        (controller.name.as_str(), controller.uid.as_str()),
        ("web-1", "u-1")
    );
    assert_eq!(controller.api_version, "apps/v1");
    assert!(controller_of(&pod("p", &[("ReplicaSet", "web-1", Some(false))])).is_none());
    assert!(controller_of(&pod("p", &[])).is_none());
}

#[test]
fn only_replicasets_and_jobs_are_named_by_their_owner() {
    for (kind, named, restarted) in [
        ("ReplicaSet", true, true),
        ("Job", true, false),
        ("StatefulSet", false, false),
        ("DaemonSet", false, false),
        ("Deployment", false, false),
        ("ReplicationController", false, false),
    ] {
        let owner = reference(kind, "x");
        assert_eq!(named_by_its_owner(&owner), named, "{kind}");
        assert_eq!(restarted_through_its_owner(&owner), restarted, "{kind}");
    }
}

#[test]
fn each_owner_resolves_to_its_workload_by_kind() {
    use NotRestartable::*;
    let deployment = reference("Deployment", "web");
    let cron_job = reference("CronJob", "nightly");
    let rollout = reference("Rollout", "canary");
    let cases: [(
        WorkloadRef,
        Option<&WorkloadRef>,
        WorkloadRef,
        Option<NotRestartable>,
    ); 9] = [
        (
            reference("ReplicaSet", "web-1"),
            Some(&deployment),
            deployment.clone(),
            None,
        ),
        (
            reference("StatefulSet", "db"),
            None,
            reference("StatefulSet", "db"),
            None,
        ),
        (
            reference("DaemonSet", "node"),
            None,
            reference("DaemonSet", "node"),
            None,
        ),
        (
            reference("ReplicaSet", "lone"),
            None,
            reference("ReplicaSet", "lone"),
            Some(NoDeployment),
        ),
        (
            reference("ReplicaSet", "r-1"),
            Some(&rollout),
            rollout.clone(),
            Some(Kind),
        ),
        (
            reference("Job", "nightly-1"),
            Some(&cron_job),
            cron_job.clone(),
            Some(CronJob),
        ),
        (
            reference("Job", "once"),
            None,
            reference("Job", "once"),
            Some(Job),
        ),
        (
            reference("ReplicationController", "rc"),
            None,
            reference("ReplicationController", "rc"),
            Some(Kind),
        ),
        // A Deployment owning Pods itself is no controller Kubernetes ships.
        (deployment.clone(), None, deployment.clone(), Some(Kind)),
    ];
    for (owner, owners_owner, workload, why) in cases {
        assert_eq!(
            Workload::behind(&owner, owners_owner),
            Workload {
                reference: workload,
                not_restartable: why,
            },
            "{owner}"
        );
    }
}

#[test]
fn a_pod_resolves_through_its_owner_only_when_that_names_the_workload() {
    let mut asked = Vec::new();
    let mut lookup = |owner: &WorkloadRef| {
        asked.push(owner.clone());
        Some(reference("Deployment", "web"))
    };
    let of = Workload::of_pod(
        &pod("p", &[("ReplicaSet", "web-1", Some(true))]),
        &mut lookup,
    );
    assert_eq!(of.restartable(), Some(&reference("Deployment", "web")));
    let of = Workload::of_pod(&pod("p", &[("StatefulSet", "db", Some(true))]), &mut lookup);
    assert_eq!(of.restartable(), Some(&reference("StatefulSet", "db")));
    assert_eq!(asked, [reference("ReplicaSet", "web-1")]);

    let bare = Workload::of_pod(&pod("p", &[]), |_| panic!("a bare Pod has no owner"));
    assert_eq!(
        bare,
        Workload {
            reference: reference("Pod", "p"),
            not_restartable: Some(NotRestartable::BarePod),
        }
    );
    // An owner that is not the controller does not count.
    let not_controller = pod("p", &[("ReplicaSet", "web-1", None)]);
    assert_eq!(
        Workload::of_pod(&not_controller, |_| panic!("not looked up")).reference,
        reference("Pod", "p")
    );
}

#[test]
fn the_object_can_rule_out_a_restart_but_not_rule_one_in() {
    let by_kind = Workload::behind(&reference("StatefulSet", "db"), None);
    assert_eq!(
        by_kind.clone().judged(None).restartable(),
        Some(&by_kind.reference)
    );
    for verdict in [
        NotRestartable::OptedOut,
        NotRestartable::OnDelete,
        NotRestartable::Gone,
    ] {
        assert_eq!(
            by_kind.clone().judged(Some(verdict)).not_restartable,
            Some(verdict)
        );
    }
    let job = Workload::behind(&reference("Job", "once"), None);
    assert_eq!(
        job.judged(Some(NotRestartable::Gone)).not_restartable,
        Some(NotRestartable::Job)
    );
}

#[test]
fn the_opt_out_annotation_is_read_loosely() {
    for (value, out) in [
        (Some("disabled"), true),
        (Some(" Disabled "), true),
        (Some("DISABLED"), true),
        (Some("enabled"), false),
        (Some(""), false),
        (None, false),
    ] {
        assert_eq!(
            opted_out(annotated(value).annotations.as_ref()),
            out,
            "{value:?}"
        );
    }
}

/// A workload whose update strategy (`field` of its spec) is `strategy`, annotated
/// `sidecar.dev/rollout: rollout`.
fn object<K: serde::de::DeserializeOwned>(
    field: &str,
    strategy: Option<&str>,
    rollout: Option<&str>,
) -> K {
    let mut spec = serde_json::json!({"selector": {}, "template": {}});
    if let Some(strategy) = strategy {
        spec[field] = serde_json::json!({ "type": strategy });
    }
    let metadata = serde_json::to_value(annotated(rollout)).unwrap();
    serde_json::from_value(serde_json::json!({"metadata": metadata, "spec": spec})).unwrap()
}

#[test]
fn on_delete_and_the_opt_out_rule_a_restart_out() {
    use NotRestartable::*;
    let cases = [
        (None, None, None),
        (Some("RollingUpdate"), None, None),
        (Some("OnDelete"), None, Some(OnDelete)),
        (Some("RollingUpdate"), Some("disabled"), Some(OptedOut)),
        (Some("OnDelete"), Some("disabled"), Some(OptedOut)),
    ];
    for (strategy, rollout, want) in cases {
        let set: StatefulSet = object("updateStrategy", strategy, rollout);
        let daemon: DaemonSet = object("updateStrategy", strategy, rollout);
        assert_eq!(WorkloadObject::StatefulSet(&set).not_restartable(), want);
        assert_eq!(WorkloadObject::DaemonSet(&daemon).not_restartable(), want);
    }
    for (strategy, rollout, want) in [
        (None, None, None),
        (Some("Recreate"), None, None),
        (Some("RollingUpdate"), Some("disabled"), Some(OptedOut)),
    ] {
        let deployment: Deployment = object("strategy", strategy, rollout);
        assert_eq!(
            WorkloadObject::Deployment(&deployment).not_restartable(),
            want
        );
    }
    let set: StatefulSet = object("updateStrategy", Some("OnDelete"), None);
    assert_eq!(
        WorkloadObject::StatefulSet(&set).update_strategy(),
        Some("OnDelete")
    );
}

#[test]
fn reasons_read_as_words() {
    assert_eq!(NotRestartable::BarePod.to_string(), "bare Pod");
    assert_eq!(NotRestartable::CronJob.to_string(), "CronJob");
    assert_eq!(
        NotRestartable::OptedOut.to_string(),
        "sidecar.dev/rollout: disabled"
    );
    assert_eq!(
        NotRestartable::OnDelete.to_string(),
        "updateStrategy OnDelete"
    );
}
