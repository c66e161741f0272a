#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_api::UpdateStrategyType;

use super::*;

fn workload(name: &str) -> WorkloadState {
    WorkloadState {
        workload: WorkloadRef {
            kind: "Deployment".into(),
            namespace: "shop".into(),
            name: name.into(),
        },
        opted_out: false,
        restarted: false,
        complete: true,
        since_progress: Duration::ZERO,
        pods: 2,
    }
}

fn restarting(name: &str, since_progress: Duration) -> WorkloadState {
    WorkloadState {
        restarted: true,
        complete: false,
        since_progress,
        ..workload(name)
    }
}

fn rolling(max: Option<u32>) -> UpdateStrategy {
    UpdateStrategy {
        type_: UpdateStrategyType::RollingRestart,
        max_concurrent_workloads: max,
        ..UpdateStrategy::default()
    }
}

fn names(refs: &[WorkloadRef]) -> Vec<&str> {
    refs.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn one_workload_at_a_time_by_default_in_a_stable_order() {
    let decision = next_restarts(
        &rolling(None),
        &[workload("b"), workload("a"), workload("c")],
        0,
    );
    assert_eq!(names(&decision.restart), ["a"]);
    assert_eq!(decision.status.state, states::PROGRESSING);
    assert_eq!(names(&decision.status.restarting), ["a"]);
    assert_eq!(decision.status.waiting, 2);

    // While a is under way, nothing else starts.
    let decision = next_restarts(
        &rolling(None),
        &[
            restarting("a", Duration::from_secs(5)),
            workload("b"),
            workload("c"),
        ],
        0,
    );
    assert!(decision.restart.is_empty());
    assert_eq!(names(&decision.status.restarting), ["a"]);
    assert_eq!(decision.status.waiting, 2);
}

#[test]
fn the_budget_fills_the_free_slots_only() {
    let workloads = [
        restarting("a", Duration::ZERO),
        workload("b"),
        workload("c"),
        workload("d"),
    ];
    let decision = next_restarts(&rolling(Some(3)), &workloads, 0);
    assert_eq!(names(&decision.restart), ["b", "c"]);
    assert_eq!(names(&decision.status.restarting), ["a", "b", "c"]);
    assert_eq!(decision.status.waiting, 1);
}

#[test]
fn a_workload_is_restarted_once_per_version() {
    // Restarted for this version and complete, yet still owning stale Pods: not again.
    let done = WorkloadState {
        restarted: true,
        complete: true,
        ..workload("a")
    };
    let decision = next_restarts(&rolling(None), &[done], 0);
    assert!(decision.restart.is_empty());
    assert_eq!(decision.status.state, states::COMPLETE);
}

#[test]
fn no_progress_within_the_deadline_halts_the_rollout() {
    let strategy = UpdateStrategy {
        progress_deadline_seconds: Some(60),
        ..rolling(Some(2))
    };
    let decision = next_restarts(
        &strategy,
        &[restarting("stuck", Duration::from_secs(61)), workload("b")],
        0,
    );
    assert!(
        decision.restart.is_empty(),
        "a halted rollout starts nothing"
    );
    assert_eq!(decision.status.state, states::HALTED);
    let message = decision.status.message.unwrap();
    assert!(message.contains("deployment/stuck -n shop"), "{message}");

    let decision = next_restarts(
        &strategy,
        &[restarting("slow", Duration::from_secs(59)), workload("b")],
        0,
    );
    assert_eq!(names(&decision.restart), ["b"]);
}

#[test]
fn paused_starts_nothing_and_lets_the_ones_under_way_finish() {
    let strategy = UpdateStrategy {
        paused: true,
        ..rolling(Some(2))
    };
    let decision = next_restarts(
        &strategy,
        &[restarting("a", Duration::ZERO), workload("b")],
        0,
    );
    assert!(decision.restart.is_empty());
    assert_eq!(decision.status.state, states::PAUSED);
    assert_eq!(names(&decision.status.restarting), ["a"]);
    assert_eq!(decision.status.waiting, 1);
    let decision = next_restarts(&strategy, &[], 0);
    assert_eq!(decision.status.state, states::COMPLETE);
}

#[test]
fn opted_out_workloads_and_bare_pods_are_reported_never_restarted() {
    let opted_out = WorkloadState {
        opted_out: true,
        pods: 3,
        ..workload("a")
    };
    let decision = next_restarts(&rolling(None), &[opted_out], 2);
    assert!(decision.restart.is_empty());
    assert_eq!(decision.status.state, states::COMPLETE);
    assert_eq!(decision.status.not_restartable, 5);
}

#[test]
fn restarted_for_keeps_one_entry_per_template() {
    let entry = restarted_for_entry("mesh", "00000000000000aa");
    assert_eq!(entry, "mesh#00000000000000aa");
    assert!(!restarted_for(None, &entry));
    let value = with_restarted_for(Some("logger#1, mesh#00000000000000ff"), &entry);
    assert_eq!(value, "logger#1,mesh#00000000000000aa");
    assert!(restarted_for(Some(&value), &entry));
    assert!(!restarted_for(Some(&value), "mesh#00000000000000ff"));
    // A template whose name another's begins with is not mixed up.
    let value = with_restarted_for(Some("mesh-2#1"), &entry);
    assert_eq!(value, "mesh#00000000000000aa,mesh-2#1");
}

fn compiled(spec: serde_json::Value, generation: i64) -> CompiledTemplate {
    let template: injector_api::SidecarTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": "mesh", "generation": generation},
        "spec": spec,
    }))
    .unwrap();
    crate::template::compile(&template).unwrap()
}

fn mesh(proxy: &str, init: &str, generation: i64) -> CompiledTemplate {
    compiled(
        serde_json::json!({
            "containers": [{"name": "proxy", "image": proxy, "args": ["--port", "{{ pod.name }}"]}],
            "initContainers": [{"name": "agent", "image": init, "restartPolicy": "Always"}],
        }),
        generation,
    )
}

fn running_pod(template: &CompiledTemplate, proxy: &str, init: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "web-1", "namespace": "shop", "resourceVersion": "7",
            "annotations": {INJECTED_ANNOTATION: format!("logger@2#00000000000000aa,mesh@{}#{}", template.generation, template.fingerprint)},
        },
        "spec": {
            "initContainers": [{"name": "agent", "image": init, "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "app:1"}, {"name": "proxy", "image": proxy}],
        },
    }))
    .unwrap()
}

#[test]
fn an_image_change_is_patched_in_place_with_the_record() {
    let old = mesh("envoy:1.30", "agent:1", 1);
    let new = mesh("envoy:1.31", "agent:2", 2);
    assert!(new.fingerprint.only_images_differ(&old.fingerprint));
    let pod = running_pod(&old, "envoy:1.30", "agent:1");
    let patch = in_place_patch(&new, &pod).unwrap();
    assert_eq!(
        patch,
        serde_json::json!({
            "metadata": {
                "resourceVersion": "7",
                "annotations": {INJECTED_ANNOTATION: format!("logger@2#00000000000000aa,mesh@2#{}", new.fingerprint)},
            },
            "spec": {
                "containers": [{"name": "proxy", "image": "envoy:1.31"}],
                "initContainers": [{"name": "agent", "image": "agent:2"}],
            },
        })
    );
    // A Pod without one of the template's containers cannot be updated in place.
    let mut lacking = pod.clone();
    lacking.spec.as_mut().unwrap().init_containers = None;
    assert_eq!(in_place_patch(&new, &lacking), None);
    // Nor a plain init container's image change: the kubelet would restart the whole Pod.
    let plain_init = |image: &str| {
        compiled(
            serde_json::json!({"initContainers": [{"name": "setup", "image": image}]}),
            1,
        )
    };
    let mut with_init = running_pod(&plain_init("setup:1"), "envoy:1.30", "agent:1");
    with_init.spec.as_mut().unwrap().init_containers = Some(vec![Container {
        name: "setup".into(),
        image: Some("setup:1".into()),
        ..Container::default()
    }]);
    assert_eq!(in_place_patch(&plain_init("setup:2"), &with_init), None);
    // Nor one whose record does not name the template.
    let mut unrecorded = pod;
    unrecorded.metadata.annotations = None;
    assert_eq!(in_place_patch(&new, &unrecorded), None);
}

#[test]
fn an_update_in_place_is_done_when_the_new_images_run_and_the_pod_is_ready() {
    let new = mesh("envoy:1.31", "agent:2", 2);
    let pod = |proxy: &str, ready: &str, running: bool| -> Pod {
        let state = if running {
            serde_json::json!({"running": {}})
        } else {
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let mut pod = running_pod(&new, "envoy:1.31", "agent:2");
        pod.status = serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "Ready", "status": ready}],
            "initContainerStatuses": [{"name": "agent", "image": "docker.io/library/agent:2", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}],
            "containerStatuses": [
                {"name": "app", "image": "app:1", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}},
                {"name": "proxy", "image": proxy, "imageID": "", "ready": true, "restartCount": 1, "state": state},
            ],
        }))
        .unwrap();
        pod
    };
    assert!(updated_in_place(&new, &pod("envoy:1.31", "True", true)));
    assert!(!updated_in_place(&new, &pod("envoy:1.30", "True", true)));
    assert!(!updated_in_place(&new, &pod("envoy:1.31", "False", true)));
    assert!(!updated_in_place(&new, &pod("envoy:1.31", "True", false)));
}

#[test]
fn max_unavailable_is_a_count_or_a_share_and_at_least_one() {
    assert_eq!(max_unavailable(None, 40), 1);
    assert_eq!(max_unavailable(Some(&IntOrString::Int(3)), 40), 3);
    assert_eq!(max_unavailable(Some(&IntOrString::Int(0)), 40), 1);
    assert_eq!(
        max_unavailable(Some(&IntOrString::String("25%".into())), 40),
        10
    );
    assert_eq!(
        max_unavailable(Some(&IntOrString::String("25%".into())), 3),
        1
    );
    assert_eq!(
        max_unavailable(Some(&IntOrString::String("250%".into())), 4),
        4
    );
    assert_eq!(
        max_unavailable(Some(&IntOrString::String("lots".into())), 4),
        1
    );
}

#[test]
fn a_plain_init_container_does_not_keep_an_update_in_place_from_being_done() {
    let new = compiled(
        serde_json::json!({
            "containers": [{"name": "proxy", "image": "envoy:1.31"}],
            "initContainers": [{"name": "setup", "image": "setup:1"}],
        }),
        2,
    );
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "initContainerStatuses": [{"name": "setup", "image": "setup:1", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}],
            "containerStatuses": [{"name": "proxy", "image": "envoy:1.31", "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}}}],
        },
    }))
    .unwrap();
    assert!(updated_in_place(&new, &pod));
}
