//! The pure injection engine: compile and validate `SidecarTemplate`s (`template`), keep them
//! in a registry ([`registry`]), select the ones that apply to a Pod and plan the JSON patch
//! that injects them ([`plan`]), each admission rule written once in Rust and in CEL
//! ([`rules`]); read a Pod from the request's JSON with bounded memory ([`pod::json`]);
//! compile templates into admission policies ([`policy`]); and, after admission, decide where
//! a running Pod stands with each template, which workload is behind it and which workloads a
//! rollout restarts next ([`after_admission`]).
//!
//! No I/O lives here: no async runtime, no HTTP, no Kubernetes client. Everything is a function
//! of its inputs, which is what lets the webhook call it on the hot path and the tests and
//! benchmarks drive it directly.

pub mod after_admission;
mod cel;
mod error;
mod fingerprint;
mod group;
mod labels;
mod patch;
mod placeholder;
mod plan;
pub mod pod;
pub mod policy;
pub mod registry;
pub mod rules;
pub mod syntax;
mod template;

pub use error::{FieldError, ValidationErrors};
pub use group::{Group, GroupId, GroupKey, MAX_GROUPS, policy_of_id};
pub use labels::Labels;
pub use patch::{Patch, PatchValue};
pub use placeholder::PodFacts;
pub use plan::{Applied, Denial, NamespaceInfo, Plan, SkipReason, Skipped, plan, plan_among};
pub use pod::{MalformedPod, Pod};
pub use registry::freshness::{DEFAULT_WATCH_GRACE, WatchHealth};
pub use registry::published::Templates;
pub use registry::{Registry, Snapshot};
pub use rules::selector::Selector;
pub use template::{CompiledTemplate, compile};
