//! Each admission rule written once, its Rust evaluation beside its CEL rendering.
//!
//! The webhook and `render` evaluate the Rust form (through `plan`), and so do the census
//! (`lifecycle`) and the plugin; the compiled policy, its guard, the warnings policy and the
//! webhook entries' match conditions carry the CEL form. Each rule's tests evaluate both forms
//! on the same inputs (generated ones for the selection and the record), the CEL one with a CEL
//! interpreter, so the two cannot drift.
//!
//! - [`defaulted`]: whether an item of a Pod is a template's, up to what the API server fills
//!   in;
//! - [`placement`]: where a template's native sidecar must stand among the init containers;
//! - [`selector`]: label selectors;
//! - [`record`]: the record `sidecar.dev/injected`, read and written;
//! - [`selection`]: whether a template selects a Pod (excluded namespaces, the opt-out,
//!   `OnRequest`, the namespace and pod selectors);
//! - [`warning`]: what a Pod's author is told, each warning with one text.

pub mod defaulted;
pub(crate) mod placement;
pub mod record;
pub mod selection;
pub mod selector;
pub mod warning;

use std::fmt;

use injector_api::names::{
    INJECT_ANNOTATION, INJECTION_DISABLED, INJECTION_LABEL, TEMPLATES_ANNOTATION,
};
use serde::Serialize;

/// Why a template was not applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", content = "detail")]
pub enum SkipReason {
    /// The Pod has the annotation `sidecar.dev/inject: "false"` (best-effort templates only).
    PodOptedOut,
    /// The namespace has the label `sidecar.dev/injection: disabled`.
    NamespaceOptedOut,
    /// The namespace is one no template ever applies to.
    NamespaceExcluded(String),
    /// The namespace selector does not match the namespace's labels.
    NamespaceNotSelected,
    /// The pod selector does not match the Pod's labels.
    PodNotSelected,
    /// An `OnRequest` template the Pod's `sidecar.dev/templates` annotation does not name.
    NotRequested,
    /// Everything the template adds is in the Pod already, equal to what it would add.
    AlreadyPresent,
    /// Applying it would clash with what the Pod (or an earlier template) already has.
    Conflict(String),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::PodOptedOut => {
                write!(f, "the pod opts out ({INJECT_ANNOTATION}: \"false\")")
            }
            SkipReason::NamespaceOptedOut => {
                write!(
                    f,
                    "the namespace opts out ({INJECTION_LABEL}={INJECTION_DISABLED})"
                )
            }
            SkipReason::NamespaceExcluded(ns) => {
                write!(f, "namespace {ns:?} is never injected")
            }
            SkipReason::NamespaceNotSelected => {
                write!(
                    f,
                    "the namespace selector does not match the namespace's labels"
                )
            }
            SkipReason::PodNotSelected => {
                write!(f, "the pod selector does not match the pod's labels")
            }
            SkipReason::NotRequested => write!(
                f,
                "injection is OnRequest and the pod's {TEMPLATES_ANNOTATION} annotation does not name it"
            ),
            SkipReason::AlreadyPresent => {
                write!(f, "already present: everything it adds is in the pod")
            }
            SkipReason::Conflict(detail) => write!(f, "conflict: {detail}"),
        }
    }
}
