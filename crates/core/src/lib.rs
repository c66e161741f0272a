//! The pure injection engine: compile and validate `SidecarTemplate`s, keep them in a
//! registry, select the ones that apply to a Pod, and plan the JSON patch that injects them;
//! read a Pod from the request's JSON with bounded memory ([`pod_json`]); compile
//! templates into admission policies ([`policy`]); and decide, from a running Pod's metadata,
//! where it stands with each template ([`lifecycle`]), which workload is behind it and whether a
//! rollout would restart that ([`workload`]), and which workloads a rollout restarts next
//! ([`rollout`]).
//!
//! No I/O lives here: no async runtime, no HTTP, no Kubernetes client. Everything is a function
//! of its inputs, which is what lets the webhook call it on the hot path and the tests and
//! benchmarks drive it directly.

mod cel;
pub mod error;
pub mod fingerprint;
pub mod freshness;
pub mod group;
pub mod in_force;
pub mod lifecycle;
pub mod patch;
pub mod placeholder;
pub mod plan;
pub mod pod;
pub mod pod_json;
pub mod policy;
pub mod published;
pub mod registry;
pub mod rollout;
pub mod rules;
pub mod syntax;
pub mod template;
pub mod workload;

pub use error::{FieldError, ValidationErrors};
pub use freshness::{DEFAULT_WATCH_GRACE, WatchHealth};
pub use group::{Group, GroupId, GroupKey};
pub use patch::{Patch, PatchValue};
pub use plan::{Applied, Denial, NamespaceInfo, Plan, SkipReason, Skipped, plan, plan_among};
pub use pod::{MalformedPod, Pod};
pub use published::Templates;
pub use registry::{Registry, Snapshot};
pub use rules::selector::{Labels, Selector};
pub use template::{CompiledTemplate, compile};
