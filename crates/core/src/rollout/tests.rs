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
