//! The rollout budget of `updateStrategy: RollingRestart`, as a pure decision: given the
//! workloads that own a template's stale or missing Pods and where each one's rollout stands,
//! which to restart next, and where the template's rollout stands.
//!
//! A workload is restarted once per version of what the template injects (its
//! `sidecar.dev/restarted-for` annotation names the fingerprint), so a workload whose new
//! Pods still miss the sidecar (a best-effort template's webhook was down again) is not
//! restarted in a loop. At most `maxConcurrentWorkloads` restarts are under way at once; a
//! restart under way that made no progress for `progressDeadlineSeconds` halts the template's
//! rollout; `paused` starts nothing new.

use std::time::Duration;

use injector_api::{
    DEFAULT_MAX_CONCURRENT_WORKLOADS, DEFAULT_PROGRESS_DEADLINE_SECONDS, RolloutStatus,
    UpdateStrategy, WorkloadRef,
};

/// Where one workload owning stale or missing Pods stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadState {
    /// The workload.
    pub workload: WorkloadRef,
    /// Annotated `sidecar.dev/rollout: disabled`: reported, never restarted.
    pub opted_out: bool,
    /// Already restarted for the template's current version.
    pub restarted: bool,
    /// Its rollout is complete (every replica updated and available).
    pub complete: bool,
    /// How long since its rollout last made progress (more replicas updated or ready), for a
    /// restart under way.
    pub since_progress: Duration,
    /// Its stale or missing Pods.
    pub pods: u32,
}

/// What to do next, and what the template's `status.rollout` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutDecision {
    /// The workloads to restart now.
    pub restart: Vec<WorkloadRef>,
    /// The template's rollout status.
    pub status: RolloutStatus,
}

/// `status.rollout.state` values.
pub mod states {
    /// Restarts are under way or waiting for a slot.
    pub const PROGRESSING: &str = "Progressing";
    /// No restartable workload owns a stale or missing Pod.
    pub const COMPLETE: &str = "Complete";
    /// `paused: true` and workloads wait.
    pub const PAUSED: &str = "Paused";
    /// A restart made no progress in time.
    pub const HALTED: &str = "Halted";
    /// The operator may not restart workloads.
    pub const FORBIDDEN: &str = "Forbidden";
}

/// Decides the next step of a template's rollout: `workloads` own its stale or missing Pods,
/// `not_restartable` more such Pods have no restartable owner.
pub fn next_restarts(
    strategy: &UpdateStrategy,
    workloads: &[WorkloadState],
    not_restartable: u32,
) -> RolloutDecision {
    let max_concurrent = strategy
        .max_concurrent_workloads
        .unwrap_or(DEFAULT_MAX_CONCURRENT_WORKLOADS)
        .max(1) as usize;
    let deadline = Duration::from_secs(u64::from(
        strategy
            .progress_deadline_seconds
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS),
    ));
    let opted_out: u32 = workloads
        .iter()
        .filter(|w| w.opted_out)
        .map(|w| w.pods)
        .sum();
    let mut restarting: Vec<&WorkloadState> = workloads
        .iter()
        .filter(|w| !w.opted_out && w.restarted && !w.complete)
        .collect();
    restarting.sort_by(|a, b| a.workload.cmp(&b.workload));
    let mut waiting: Vec<&WorkloadState> = workloads
        .iter()
        .filter(|w| !w.opted_out && !w.restarted)
        .collect();
    waiting.sort_by(|a, b| a.workload.cmp(&b.workload));
    let stuck = restarting.iter().find(|w| w.since_progress >= deadline);

    let (state, message, restart) = if let Some(stuck) = stuck {
        let message = format!(
            "{} made no progress for {}s after its restart; no other workload restarts until it completes or the template changes",
            stuck.workload,
            deadline.as_secs()
        );
        (states::HALTED, Some(message), Vec::new())
    } else if strategy.paused {
        let state = if waiting.is_empty() && restarting.is_empty() {
            states::COMPLETE
        } else {
            states::PAUSED
        };
        (state, None, Vec::new())
    } else {
        let slots = max_concurrent.saturating_sub(restarting.len());
        let restart: Vec<WorkloadRef> = waiting
            .iter()
            .take(slots)
            .map(|w| w.workload.clone())
            .collect();
        let state = if waiting.is_empty() && restarting.is_empty() {
            states::COMPLETE
        } else {
            states::PROGRESSING
        };
        (state, None, restart)
    };
    let started = restart.len();
    let mut now_restarting: Vec<WorkloadRef> =
        restarting.iter().map(|w| w.workload.clone()).collect();
    now_restarting.extend(restart.iter().cloned());
    now_restarting.sort();
    RolloutDecision {
        restart,
        status: RolloutStatus {
            state: state.to_owned(),
            restarting: now_restarting,
            waiting: u32::try_from(waiting.len() - started).unwrap_or(u32::MAX),
            not_restartable: not_restartable + opted_out,
            message,
        },
    }
}

/// The `sidecar.dev/restarted-for` entry of a template's version: `name#fingerprint`.
pub fn restarted_for_entry(template: &str, fingerprint: &str) -> String {
    format!("{template}#{fingerprint}")
}

/// Whether a `sidecar.dev/restarted-for` value names `entry`.
pub fn restarted_for(value: Option<&str>, entry: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|e| e.trim() == entry))
}

/// The `sidecar.dev/restarted-for` value after a restart for `entry` (`name#fingerprint`):
/// the template's earlier entry replaced, the other templates' kept.
pub fn with_restarted_for(value: Option<&str>, entry: &str) -> String {
    let name = entry.split('#').next().unwrap_or(entry);
    let mut entries: Vec<&str> = value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty() && e.split('#').next() != Some(name))
        .collect();
    entries.push(entry);
    entries.sort_unstable();
    entries.join(",")
}

#[cfg(test)]
#[path = "rollout/tests.rs"]
mod tests;
