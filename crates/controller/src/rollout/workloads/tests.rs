#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_api::names::ROLLOUT_ANNOTATION;
use k8s_openapi::api::apps::v1::{
    DaemonSetSpec, DaemonSetStatus, DaemonSetUpdateStrategy, DeploymentSpec, DeploymentStatus,
    StatefulSetSpec, StatefulSetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;

fn deployment(replicas: i32, status: DeploymentStatus, annotations: &[(&str, &str)]) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some("web".into()),
            generation: Some(3),
            resource_version: Some("41".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            ..DeploymentSpec::default()
        }),
        status: Some(status),
    }
}

fn deployment_status(
    observed: i64,
    replicas: i32,
    updated: i32,
    available: i32,
) -> DeploymentStatus {
    DeploymentStatus {
        observed_generation: Some(observed),
        replicas: Some(replicas),
        updated_replicas: Some(updated),
        available_replicas: Some(available),
        ready_replicas: Some(available),
        ..DeploymentStatus::default()
    }
}

#[test]
fn a_deployment_is_complete_as_kubectl_rollout_status_says() {
    assert!(deployment_view(&deployment(2, deployment_status(3, 2, 2, 2), &[])).complete);
    // Not observed yet, old replicas still there, new ones not available.
    for status in [
        deployment_status(2, 2, 2, 2),
        deployment_status(3, 3, 2, 2),
        deployment_status(3, 2, 2, 1),
        deployment_status(3, 1, 1, 1),
    ] {
        assert!(
            !deployment_view(&deployment(2, status.clone(), &[])).complete,
            "{status:?}"
        );
    }
    // Progress shows in the counts.
    let before = deployment_view(&deployment(2, deployment_status(3, 3, 1, 1), &[]));
    let after = deployment_view(&deployment(2, deployment_status(3, 3, 2, 1), &[]));
    assert_ne!(before.progress, after.progress);
}

#[test]
fn an_opted_out_or_on_delete_workload_is_not_restartable() {
    let opted_out = deployment(
        1,
        deployment_status(3, 1, 1, 1),
        &[(ROLLOUT_ANNOTATION, "Disabled")],
    );
    assert_eq!(
        deployment_view(&opted_out).not_restartable,
        Some(NotRestartable::OptedOut)
    );

    let on_delete = StatefulSet {
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            update_strategy: Some(k8s_openapi::api::apps::v1::StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..Default::default()
            }),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    assert_eq!(
        stateful_set_view(&on_delete).not_restartable,
        Some(NotRestartable::OnDelete)
    );

    let daemons = DaemonSet {
        spec: Some(DaemonSetSpec {
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..Default::default()
            }),
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    };
    assert_eq!(
        daemon_set_view(&daemons).not_restartable,
        Some(NotRestartable::OnDelete)
    );
}

#[test]
fn stateful_and_daemon_sets_are_complete_when_every_replica_is_updated() {
    let set = |current: &str, ready| StatefulSet {
        metadata: ObjectMeta {
            generation: Some(2),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(2),
            ..StatefulSetSpec::default()
        }),
        status: Some(StatefulSetStatus {
            observed_generation: Some(2),
            updated_replicas: Some(2),
            ready_replicas: Some(ready),
            current_revision: Some(current.into()),
            update_revision: Some("web-2".into()),
            ..StatefulSetStatus::default()
        }),
    };
    assert!(stateful_set_view(&set("web-2", 2)).complete);
    assert!(!stateful_set_view(&set("web-1", 2)).complete);
    assert!(!stateful_set_view(&set("web-2", 1)).complete);

    let daemons = |updated, available| DaemonSet {
        metadata: ObjectMeta {
            generation: Some(1),
            ..ObjectMeta::default()
        },
        status: Some(DaemonSetStatus {
            observed_generation: Some(1),
            desired_number_scheduled: 3,
            updated_number_scheduled: Some(updated),
            number_available: Some(available),
            ..DaemonSetStatus::default()
        }),
        ..DaemonSet::default()
    };
    assert!(daemon_set_view(&daemons(3, 3)).complete);
    assert!(!daemon_set_view(&daemons(2, 3)).complete);
}

#[test]
fn a_restart_is_the_pod_templates_annotation_guarded_by_the_resource_version() {
    let view = deployment_view(&deployment(
        1,
        deployment_status(3, 1, 1, 1),
        &[(RESTARTED_FOR_ANNOTATION, "logger#1,mesh#2")],
    ));
    let patch = restart_patch(
        &view,
        &["mesh#3".to_owned(), "agent#1".to_owned()],
        "2026-11-23T19:00:00Z",
    );
    assert_eq!(
        patch,
        json!({
            "metadata": {
                "resourceVersion": "41",
                "annotations": {RESTARTED_FOR_ANNOTATION: "agent#1,logger#1,mesh#3"},
            },
            "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: "2026-11-23T19:00:00Z"}}}},
        })
    );
}

#[test]
fn the_restart_time_is_read_from_the_pod_template() {
    let mut restarted = deployment(1, deployment_status(3, 1, 1, 1), &[]);
    restarted.spec.as_mut().unwrap().template.metadata = Some(ObjectMeta {
        annotations: Some(
            [(
                RESTARTED_AT_ANNOTATION.to_owned(),
                "2026-11-23T19:00:00Z".to_owned(),
            )]
            .into(),
        ),
        ..ObjectMeta::default()
    });
    assert_eq!(
        deployment_view(&restarted).restarted_at,
        Some("2026-11-23T19:00:00Z".parse().unwrap())
    );
    assert_eq!(
        deployment_view(&deployment(1, deployment_status(3, 1, 1, 1), &[])).restarted_at,
        None
    );
}
