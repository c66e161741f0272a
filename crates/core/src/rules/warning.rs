//! What a Pod's author is told: each warning one variant with one text ([`fmt::Display`]),
//! which `plan` gives (the webhook and `render` answer with it) and the warnings policy renders
//! as CEL (`Warning::message_cel`) for Pods the policy injected.

use std::fmt;

use injector_api::names::INJECT_ANNOTATION;

use crate::cel::cel_string;

/// Who holds what a template would have set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The Pod, as its author wrote it.
    Pod,
    /// An earlier template, by name.
    Template(String),
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Pod => f.write_str("in the pod"),
            Holder::Template(name) => write!(f, "added by SidecarTemplate {name:?}"),
        }
    }
}

/// A label or an annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataKind {
    /// A key of `metadata.labels`.
    Label,
    /// A key of `metadata.annotations`.
    Annotation,
}

impl fmt::Display for MetadataKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MetadataKind::Label => "label",
            MetadataKind::Annotation => "annotation",
        })
    }
}

/// Something a Pod's author should know about its admission (kubectl prints it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Warning {
    /// Planning did not settle in `passes` passes: templates render labels or annotations
    /// from each other's.
    Unsettled {
        /// The passes made.
        passes: usize,
    },
    /// The Pod opts out, which a required template does not heed.
    RequiredDespiteOptOut {
        /// The template.
        template: String,
    },
    /// A template selects the Pod and was not applied.
    NotApplied {
        /// The template.
        template: String,
        /// What stopped it: its conflicts.
        detail: String,
    },
    /// Under the policy alone, a best-effort template skipped because the Pod has an item named
    /// like one of its (a look-alike, or a copy the policy cannot tell from one).
    NamedLikeUnderPolicy {
        /// The template.
        template: String,
    },
    /// A templated label rendered to a text that is no label value.
    InvalidLabelValue {
        /// The template.
        template: String,
        /// The label's key.
        key: String,
        /// What it rendered to.
        value: String,
    },
    /// A label or annotation held with another value: the holder's is kept.
    MetadataKept {
        /// The template.
        template: String,
        /// Label or annotation.
        kind: MetadataKind,
        /// Its key.
        key: String,
        /// Whose value is kept.
        holder: Holder,
    },
    /// An app container's env variable held with another value.
    EnvKept {
        /// The template.
        template: String,
        /// The variable's name.
        name: String,
        /// The app container.
        container: String,
        /// Whose value is kept.
        holder: Holder,
    },
    /// An app container's mount path held by another mount.
    MountKept {
        /// The template.
        template: String,
        /// The mount path.
        path: String,
        /// The app container.
        container: String,
        /// Whose mount is kept.
        holder: Holder,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::Unsettled { passes } => write!(
                f,
                "planning did not settle in {passes} passes (templates render labels or annotations from each other's): planning the result again may add more"
            ),
            Warning::RequiredDespiteOptOut { template } => write!(
                f,
                "SidecarTemplate {template:?} is required: the pod's {INJECT_ANNOTATION}: \"false\" does not apply to it"
            ),
            Warning::NotApplied { template, detail } => {
                write!(f, "SidecarTemplate {template:?} not applied: {detail}")
            }
            Warning::NamedLikeUnderPolicy { template } => write!(
                f,
                "SidecarTemplate {template:?} not applied: the pod has a container, init container or volume named like one of the template's; without a webhook to tell a copy from a look-alike, the policy adds nothing of the template to such a pod"
            ),
            Warning::InvalidLabelValue {
                template,
                key,
                value,
            } => write!(
                f,
                "SidecarTemplate {template:?}: label {key:?} not added: {value:?} is not a valid label value"
            ),
            Warning::MetadataKept {
                template,
                kind,
                key,
                holder: Holder::Pod,
            } => write!(
                f,
                "SidecarTemplate {template:?}: {kind} {key:?} is already set in the pod; kept the pod's value"
            ),
            Warning::MetadataKept {
                template,
                kind,
                key,
                holder: Holder::Template(holder),
            } => write!(
                f,
                "SidecarTemplate {template:?}: {kind} {key:?} is already set by SidecarTemplate {holder:?}; kept that value"
            ),
            Warning::EnvKept {
                template,
                name,
                container,
                holder,
            } => write!(
                f,
                "SidecarTemplate {template:?}: env {name:?} of container {container:?} not added: already set ({holder})"
            ),
            Warning::MountKept {
                template,
                path,
                container,
                holder,
            } => write!(
                f,
                "SidecarTemplate {template:?}: volume mount at {path:?} in container {container:?} not added: the path is already mounted ({holder})"
            ),
        }
    }
}

/// A warning is its text wherever it is written out (`render -o json`, the admission response).
impl serde::Serialize for Warning {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Stands, in a warning's field, for what CEL fills in at admission
/// ([`Warning::message_cel_with`]): a character no name, path or label value may hold.
pub(crate) const HOLE: &str = "\0";

impl Warning {
    /// The warning's text as a CEL string literal.
    pub(crate) fn message_cel(&self) -> String {
        cel_string(&self.to_string())
    }

    /// The warning's text as a CEL string expression, its quoted field holding [`HOLE`]
    /// replaced by `value` (a CEL string expression), quoted as the text quotes it. The hole
    /// is the last quoted field wherever a warning has one (only fixed text and template
    /// names come after it), so it is looked for from the end.
    pub(crate) fn message_cel_with(&self, value: &str) -> String {
        let text = self.to_string();
        match text.rsplit_once(&format!("{HOLE:?}")) {
            Some((before, after)) => format!(
                "{} + {value} + {}",
                cel_string(&format!("{before}\"")),
                cel_string(&format!("\"{after}"))
            ),
            None => cel_string(&text),
        }
    }
}

#[cfg(test)]
mod tests;
