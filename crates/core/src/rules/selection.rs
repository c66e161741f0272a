//! Whether a template selects a Pod: the namespaces no template injects into, the Pod's
//! opt-out of best-effort templates, `OnRequest`, and the namespace and pod selectors. Each
//! rule in Rust, for `plan` and the census, beside its CEL, for the compiled policy, its guard,
//! the warnings policy and the webhook entries' match conditions.

use std::collections::BTreeMap;

use injector_api::names::{
    ALWAYS_EXCLUDED_NAMESPACES, INJECT_ANNOTATION, INJECTION_DISABLED, INJECTION_LABEL,
    NAMESPACE_NAME_LABEL, TEMPLATES_ANNOTATION,
};
use injector_api::{FailurePolicy, Injection};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

use super::SkipReason;
use super::selector::Selector;
use crate::cel::{cel_list, cel_string};
use crate::labels::Labels;

/// The Pod's labels, in CEL over the admitted object.
pub const LABELS: &str = "object.metadata.?labels.orValue({})";
/// The Pod's annotations, in CEL over the admitted object.
pub const ANNOTATIONS: &str = "object.metadata.?annotations.orValue({})";
/// The namespace's labels, in CEL over a policy's `namespaceObject`.
pub const NAMESPACE_LABELS: &str = "namespaceObject.metadata.?labels.orValue({})";

/// What of a template decides whether it selects a Pod (`CompiledTemplate::selecting`).
#[derive(Clone, Copy, Debug)]
pub struct Selecting<'t> {
    /// The template's name, which an `OnRequest` Pod names.
    pub name: &'t str,
    /// `Automatic` or `OnRequest`.
    pub injection: Injection,
    /// Required (`Fail`), which a Pod cannot opt out of, or best effort (`Ignore`).
    pub failure_policy: FailurePolicy,
    /// Which namespaces' Pods it selects.
    pub namespace_selector: &'t Selector,
    /// Which Pods it selects.
    pub pod_selector: &'t Selector,
}

/// The namespace a Pod is created in, as far as the caller knows it.
#[derive(Clone, Copy, Debug)]
pub struct NamespaceInfo<'a> {
    /// The namespace's name (used when the Pod's own `metadata.namespace` is empty).
    pub name: &'a str,
    /// The namespace's labels. `None` means the namespace selection was already made by the
    /// API server (webhook entries select namespaces), so namespace selectors are not checked.
    pub labels: Option<&'a BTreeMap<String, String>>,
}

/// Why no template applies to any Pod of `namespace_name`, when none does: an always-excluded
/// namespace, or one labelled `sidecar.dev/injection=disabled` (when its labels are known).
pub fn pod_wide_skip(namespace_name: &str, namespace: &NamespaceInfo<'_>) -> Option<SkipReason> {
    if ALWAYS_EXCLUDED_NAMESPACES.contains(&namespace_name) {
        Some(SkipReason::NamespaceExcluded(namespace_name.to_owned()))
    } else if namespace.labels.is_some_and(|l| {
        l.get(INJECTION_LABEL)
            .is_some_and(|v| v == INJECTION_DISABLED)
    }) {
        Some(SkipReason::NamespaceOptedOut)
    } else {
        None
    }
}

/// [`pod_wide_skip`] as the requirements of a namespace selector, which the API server
/// evaluates for the webhook entries and the policies' bindings; `also`: namespaces excluded
/// besides.
pub fn namespace_exclusions(also: &[&str]) -> [LabelSelectorRequirement; 2] {
    let mut excluded: Vec<String> = ALWAYS_EXCLUDED_NAMESPACES
        .iter()
        .map(|ns| (*ns).to_owned())
        .collect();
    for ns in also {
        if !ns.is_empty() && !excluded.iter().any(|e| e == ns) {
            excluded.push((*ns).to_owned());
        }
    }
    [
        LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(excluded),
        },
        LabelSelectorRequirement {
            key: INJECTION_LABEL.to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(vec![INJECTION_DISABLED.to_owned()]),
        },
    ]
}

/// Whether a Pod's `sidecar.dev/inject` annotation (`"false"`, any case, spaces around it
/// ignored) opts it out of best-effort templates.
pub fn opts_out(annotation: Option<&str>) -> bool {
    annotation.is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
}

/// [`opts_out`] as a CEL condition over `annotations` (a map expression).
pub fn opts_out_cel(annotations: &str) -> String {
    format!(
        "{annotations}[?{}].orValue(\"\").trim().lowerAscii() == \"false\"",
        cel_string(INJECT_ANNOTATION)
    )
}

/// Whether a Pod's `sidecar.dev/templates` annotation (names separated by commas, spaces
/// around each ignored) names `template`: what an `OnRequest` template asks.
pub fn requests(annotation: Option<&str>, template: &str) -> bool {
    annotation
        .unwrap_or_default()
        .split(',')
        .any(|name| name.trim() == template)
}

/// [`requests`] of any of `templates` as a CEL condition over `annotations` (a map
/// expression).
pub fn requests_cel<'a>(annotations: &str, templates: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = templates.into_iter().collect();
    let test = match names.as_slice() {
        [name] => format!("n.trim() == {}", cel_string(name)),
        _ => format!("n.trim() in {}", cel_list(names.iter().copied())),
    };
    format!(
        "{annotations}[?{}].orValue(\"\").split(\",\").exists(n, {test})",
        cel_string(TEMPLATES_ANNOTATION)
    )
}

/// Why `template` does not select a Pod before its labels are read, or `None`: the Pod opted
/// out (`opted_out`, of a best-effort template), or the namespace selector does not match
/// (when the namespace's labels are known).
pub fn unselected_by_namespace(
    template: Selecting<'_>,
    opted_out: bool,
    namespace: &NamespaceInfo<'_>,
) -> Option<SkipReason> {
    if opted_out && template.failure_policy == FailurePolicy::Ignore {
        Some(SkipReason::PodOptedOut)
    } else if namespace
        .labels
        .is_some_and(|labels| !template.namespace_selector.matches(labels))
    {
        Some(SkipReason::NamespaceNotSelected)
    } else {
        None
    }
}

/// Why `template` does not select a Pod with these labels and annotations, or `None` when it
/// does: its pod selector, and for an `OnRequest` template the Pod's request.
pub fn unselected_by_pod(
    template: Selecting<'_>,
    labels: &(impl Labels + ?Sized),
    annotations: &(impl Labels + ?Sized),
) -> Option<SkipReason> {
    if !template.pod_selector.matches(labels) {
        Some(SkipReason::PodNotSelected)
    } else if template.injection == Injection::OnRequest
        && !requests(annotations.label(TEMPLATES_ANNOTATION), template.name)
    {
        Some(SkipReason::NotRequested)
    } else {
        None
    }
}

/// Whether `template` selects a Pod with these labels and annotations in `namespace_name`:
/// every rule above, as admission applies them to the Pod as created.
pub fn selects(
    template: Selecting<'_>,
    labels: &(impl Labels + ?Sized),
    annotations: &(impl Labels + ?Sized),
    namespace_name: &str,
    namespace: &NamespaceInfo<'_>,
) -> bool {
    let opted_out = opts_out(annotations.label(INJECT_ANNOTATION));
    pod_wide_skip(namespace_name, namespace).is_none()
        && unselected_by_namespace(template, opted_out, namespace).is_none()
        && unselected_by_pod(template, labels, annotations).is_none()
}

/// [`selects`] as CEL conditions over the admitted Pod and `namespaceObject`, all of which
/// must hold; those that always hold are left out. The excluded namespaces are not among
/// them: a policy's binding excludes those ([`namespace_exclusions`]).
pub(crate) fn selection_cel(template: Selecting<'_>) -> Vec<String> {
    let mut conditions = vec![
        template.namespace_selector.cel(NAMESPACE_LABELS),
        template.pod_selector.cel(LABELS),
    ];
    if template.injection == Injection::OnRequest {
        conditions.push(requests_cel(ANNOTATIONS, [template.name]));
    }
    if template.failure_policy == FailurePolicy::Ignore {
        conditions.push(format!("!({})", opts_out_cel(ANNOTATIONS)));
    }
    conditions.retain(|c| c != "true");
    conditions
}

#[cfg(test)]
mod tests;
