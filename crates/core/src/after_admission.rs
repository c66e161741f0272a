//! The life after admission, from what running Pods and their workloads say: where each Pod
//! stands with each template ([`lifecycle`], the census), the workload behind a Pod and whether
//! a rollout would restart it ([`workload`]), and which workloads a rollout restarts next
//! ([`rollout`]). The controller's census and rollouts and the plugin's `status` ask the same
//! functions.

pub mod lifecycle;
pub mod rollout;
pub mod workload;
