//! Where templates' init containers go among a Pod's, and where a template's native sidecar
//! (an init container with `restartPolicy: Always`) must stand: before every plain one of the
//! Pod's own, so that it runs from the start. Other templates' init containers may come before
//! it (templates apply in priority order, and another engine may have placed its own first),
//! so a template's init containers are added after the Pod's leading ones that are
//! templates' ([`first_init`], [`first_init_cel`]).
//!
//! `plan` evaluates [`first_blocking`] on the Pod's init containers, knowing which are
//! templates' by their content; the policy's presence conditions and guard carry
//! [`in_place_cel`], knowing them by name (the CEL list of every template's init container
//! name): a Pod's own init container named like a template's is taken for the template's
//! there, and the webhook, which compares content, still judges such a Pod.

/// What placement reads of an init container standing before a native sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Before {
    /// Whether it is a native sidecar itself.
    pub(crate) native_sidecar: bool,
    /// Whether it is a template's.
    pub(crate) templates: bool,
}

/// Which of `before` (the init containers in front of a native sidecar, in order) keeps it
/// from running from the start: the first plain one that is not a template's. `None`: the
/// sidecar is in place.
pub(crate) fn first_blocking(before: impl IntoIterator<Item = Before>) -> Option<usize> {
    before
        .into_iter()
        .position(|init| !init.native_sidecar && !init.templates)
}

/// [`first_blocking`] finding none, as a CEL condition on the init container `c` of
/// `object`, the Pod under admission; `template_init` is a CEL list of every template's init
/// container name.
pub(crate) fn in_place_cel(template_init: &str) -> String {
    format!(
        "!object.spec.initContainers.exists(d, object.spec.initContainers.indexOf(d) < object.spec.initContainers.indexOf(c) && d.?restartPolicy.orValue(\"\") != \"Always\" && !(d.name in {template_init}))"
    )
}

/// Where a template's init containers are added: after the Pod's leading init containers
/// that are templates' (`templates`: whether each of the Pod's is, in order).
pub(crate) fn first_init(templates: impl IntoIterator<Item = bool>) -> usize {
    templates.into_iter().take_while(|&theirs| theirs).count()
}

/// [`first_init`] as a CEL int over `object`, the Pod under admission; `template_init` is a
/// CEL list of every template's init container name.
pub(crate) fn first_init_cel(template_init: &str) -> String {
    let leading = format!(
        "object.spec.?initContainers.orValue([]).map(c, c.name in {template_init}).indexOf(false)"
    );
    format!("({leading} < 0 ? size(object.spec.?initContainers.orValue([])) : {leading})")
}

#[cfg(test)]
mod tests;
