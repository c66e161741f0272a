//! The warnings policy: a ValidatingAdmissionPolicy bound with `Warn` that gives a Pod the
//! policy injected the warnings the webhook would have given it, since no webhook call carries
//! them (the entries skip such Pods, and the `policy` backend has none).
//!
//! Validation runs after every mutation, so each rule reads the Pod as the policy left it: a
//! template that selects the Pod and whose items are there (its presence condition) was
//! applied, and what it would not overwrite shows as a value that differs from the template's.
//! The texts are `plan`'s, one [`Warning`] each (the API server puts the policy's name before them). Where the final
//! Pod cannot tell whose a value is (another template the policy applies earlier adds the same
//! key), no warning is given rather than a wrong one; an `env` or mount conflict names the
//! first container it is found in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use injector_api::FailurePolicy;
use serde_json::{Value, json};

use super::{
    ANNOTATIONS, CompiledPolicy, LABELS, PolicyOptions, at_validation, cel_json, cel_list,
    cel_string, cel_text, selection_cel, validating_policy, warnings_bindings,
};
use crate::placeholder::Node;
use crate::rules::selection::opts_out_cel;
use crate::rules::warning::{HOLE, Holder, MetadataKind, Warning};
use crate::syntax::LABEL_VALUE_PATTERN;
use crate::template::{AppAdditions, CompiledTemplate, Text};

/// The name of the warnings policy (and binding) beside the policy `name`.
pub fn warnings_name(name: &str) -> String {
    format!("{name}-warnings")
}

/// The warnings policy and its bindings for the templates `compiled` serves, given the
/// presence conditions learned from its proof; `None` when no template can warn. Bound, as the
/// MutatingAdmissionPolicy is, per namespace group when the templates' namespace selectors
/// allow it (`namespace_groups`): a Pod of a namespace no template selects is not looked at.
///
/// `webhook_behind`: the webhook decides the Pods the policy skips (`auto`), and warns about a
/// conflict itself; without it (the `policy` backend), a best-effort template the policy
/// skipped because the Pod has an item of its name (a look-alike, or a copy the policy cannot
/// tell from one) is warned about here.
pub fn compile_warnings(
    options: &PolicyOptions,
    compiled: &CompiledPolicy,
    present: &BTreeMap<String, String>,
    webhook_behind: bool,
) -> Option<(Value, Vec<Value>)> {
    let injected: BTreeSet<&str> = compiled
        .served
        .iter()
        .chain(compiled.webhook_only.iter().map(|(t, _)| t))
        .flat_map(|t| t.containers.iter().map(|i| i.key.as_str()))
        .collect();
    let mut validations = Vec::new();
    for (index, template) in compiled.served.iter().enumerate() {
        let earlier = &compiled.served[..index];
        validations.extend(template_warnings(
            template,
            earlier,
            present.get(&template.name),
            &injected,
        ));
        if !webhook_behind && template.failure_policy == FailurePolicy::Ignore {
            validations.extend(conflict_warning(template, present.get(&template.name)));
        }
    }
    if validations.is_empty() {
        return None;
    }
    // A warning that fails to evaluate is no reason to refuse a Pod. The operator's namespace
    // (its dry-run Pods) is left out by the namespace selector, not by a match condition: the
    // API server gives each match condition a CEL copy of the Pod of its own.
    let name = warnings_name(&options.name);
    let (policy, _) = validating_policy(
        &name,
        "Ignore",
        &[options.operator_namespace.as_str()],
        None,
        validations,
        "Warn",
    );
    Some((policy, warnings_bindings(options, &compiled.served, &name)))
}

/// One validation per warning `plan` could give for `template`, applied after `earlier`.
fn template_warnings(
    template: &CompiledTemplate,
    earlier: &[Arc<CompiledTemplate>],
    present: Option<&String>,
    injected: &BTreeSet<&str>,
) -> Vec<Value> {
    let selected = {
        let mut terms = selection_cel(template.selecting());
        if terms.is_empty() {
            terms.push("true".to_owned());
        }
        terms.join(" && ")
    };
    let has_items = !(template.containers.is_empty()
        && template.init_containers.is_empty()
        && template.volumes.is_empty());
    // Applied: selected, and its items are there as the policy adds them. A template whose
    // items cannot be recognised gives no warning about what it added.
    let applied = match (has_items, present) {
        (false, _) => selected.clone(),
        (true, Some(present)) => format!("{selected} && ({present})"),
        (true, None) => String::new(),
    };
    let mut out = Vec::new();
    if template.failure_policy == FailurePolicy::Fail {
        out.push(warning(
            &format!("{selected} && {}", opts_out_cel(ANNOTATIONS)),
            &Warning::RequiredDespiteOptOut {
                template: template.name.clone(),
            }
            .message_cel(),
        ));
    }
    if applied.is_empty() {
        return out;
    }
    out.extend(metadata_warnings(template, earlier, &applied));
    if let Some(app) = &template.app {
        out.extend(app_warnings(template, app, earlier, injected, &applied));
    }
    out
}

/// One validation of the warnings policy: its message when `when` holds.
fn warning(when: &str, message: &str) -> Value {
    json!({
        "expression": at_validation(&format!("!({when})")),
        "messageExpression": at_validation(message),
    })
}

/// The warnings about `template`'s labels and annotations where it was `applied`: a templated
/// label value that is not one, and a key the Pod already set (unless an `earlier` template
/// adds it: its warning is that one's).
fn metadata_warnings(
    template: &CompiledTemplate,
    earlier: &[Arc<CompiledTemplate>],
    applied: &str,
) -> Vec<Value> {
    let mut out = Vec::new();
    for (kind, entries, current) in [
        (MetadataKind::Label, &template.labels, LABELS),
        (MetadataKind::Annotation, &template.annotations, ANNOTATIONS),
    ] {
        for (key, text) in entries {
            let value = match text {
                Text::Fixed(value) => cel_string(value),
                Text::Templated(template) => cel_text(template),
            };
            let key_literal = cel_string(key);
            let invalid = format!(
                "!(size({value}) <= 63 && {value}.matches({}))",
                cel_string(LABEL_VALUE_PATTERN)
            );
            let templated_label = kind == MetadataKind::Label && matches!(text, Text::Templated(_));
            if templated_label {
                out.push(warning(
                    &format!("{applied} && {invalid}"),
                    &Warning::InvalidLabelValue {
                        template: template.name.clone(),
                        key: key.clone(),
                        value: HOLE.to_owned(),
                    }
                    .message_cel_with(&value),
                ));
            }
            let added_earlier = earlier.iter().any(|t| {
                let entries = match kind {
                    MetadataKind::Label => &t.labels,
                    MetadataKind::Annotation => &t.annotations,
                };
                entries.iter().any(|(k, _)| k == key)
            });
            if added_earlier {
                continue;
            }
            let kept = format!("{key_literal} in {current} && {current}[{key_literal}] != {value}");
            let kept = if templated_label {
                format!("{kept} && !({invalid})")
            } else {
                kept
            };
            out.push(warning(
                &format!("{applied} && {kept}"),
                &Warning::MetadataKept {
                    template: template.name.clone(),
                    kind,
                    key: key.clone(),
                    holder: Holder::Pod,
                }
                .message_cel(),
            ));
        }
    }
    out
}

/// The warnings about `app`'s env and mounts where `template` was `applied`: one an app
/// container (never one of `injected`) already has otherwise, unless an `earlier` template
/// adds it.
fn app_warnings(
    template: &CompiledTemplate,
    app: &AppAdditions,
    earlier: &[Arc<CompiledTemplate>],
    injected: &BTreeSet<&str>,
    applied: &str,
) -> Vec<Value> {
    let mut target = format!("!(c.name in {})", cel_list(injected.iter().copied()));
    if !app.names.is_empty() {
        target.push_str(&format!(
            " && c.name in {}",
            cel_list(app.names.iter().map(String::as_str))
        ));
    }
    let mut out = Vec::new();
    for (field, key, items) in [
        ("env", "name", &app.env),
        ("volumeMounts", "mountPath", &app.volume_mounts),
    ] {
        for item in items {
            let added_earlier = earlier.iter().any(|t| {
                t.app.as_ref().is_some_and(|a| {
                    let items = if field == "env" {
                        &a.env
                    } else {
                        &a.volume_mounts
                    };
                    items.iter().any(|i| i.key == item.key)
                })
            });
            if added_earlier {
                continue;
            }
            let differs = format!(
                "c.?{field}.orValue([]).exists(x, x[{k}] == {v} && !({}))",
                subset(&item.body, "x"),
                k = cel_string(key),
                v = cel_string(&item.key),
            );
            let conflicting = format!("object.spec.containers.filter(c, {target} && {differs})");
            let (template, container, holder) =
                (template.name.clone(), HOLE.to_owned(), Holder::Pod);
            let message = if field == "env" {
                Warning::EnvKept {
                    template,
                    name: item.key.clone(),
                    container,
                    holder,
                }
            } else {
                Warning::MountKept {
                    template,
                    path: item.key.clone(),
                    container,
                    holder,
                }
            };
            out.push(warning(
                &format!("{applied} && size({conflicting}) > 0"),
                &message.message_cel_with(&format!("{conflicting}[0].name")),
            ));
        }
    }
    out
}

/// The warning that the best-effort `template` was not applied: it selects the Pod, which has
/// an item named like one of the template's, and the template is not there as the policy adds
/// it (a conflict; `plan` names the field that differs, a policy cannot).
fn conflict_warning(template: &CompiledTemplate, present: Option<&String>) -> Option<Value> {
    let present = present?;
    let mut named = Vec::new();
    for (list, items) in [
        ("containers", &template.containers),
        ("initContainers", &template.init_containers),
        ("volumes", &template.volumes),
    ] {
        if !items.is_empty() {
            named.push(format!(
                "object.spec.?{list}.orValue([]).exists(i, i.name in {})",
                cel_list(items.iter().map(|i| i.key.as_str()))
            ));
        }
    }
    let mut selected = selection_cel(template.selecting());
    selected.push(format!("({})", named.join(" || ")));
    selected.push(format!("!({present})"));
    Some(json!({
        "expression": at_validation(&format!("!({})", selected.join(" && "))),
        "messageExpression": Warning::NamedLikeUnderPolicy {
            template: template.name.clone(),
        }
        .message_cel(),
    }))
}

/// The CEL condition that `value` (an expression) sets everything `node` sets, to the same
/// value: `plan`'s test of whether an item is already there.
fn subset(node: &Node, value: &str) -> String {
    match node {
        Node::Object(fields) => {
            let terms: Vec<String> = fields
                .iter()
                .map(|(key, node)| {
                    let key = cel_string(key);
                    match node {
                        // Rendered empty, the field is not stored (`omitempty`) or stored
                        // empty: either way what the template set.
                        Node::Text(template) => {
                            format!("{value}[?{key}].orValue(\"\") == {}", cel_text(template))
                        }
                        node => format!(
                            "({key} in {value} && {})",
                            subset(node, &format!("{value}[{key}]"))
                        ),
                    }
                })
                .collect();
            all_of(terms)
        }
        Node::Fixed(fixed) => fixed_subset(fixed.value(), value),
        Node::Text(template) => format!("{value} == {}", cel_text(template)),
        Node::Array(_) => format!("{value} == {}", super::cel_node(node)),
    }
}

fn fixed_subset(fixed: &Value, value: &str) -> String {
    match fixed {
        Value::Object(fields) => all_of(
            fields
                .iter()
                .map(|(key, fixed)| {
                    let key = cel_string(key);
                    format!(
                        "({key} in {value} && {})",
                        fixed_subset(fixed, &format!("{value}[{key}]"))
                    )
                })
                .collect(),
        ),
        other => format!("{value} == {}", cel_json(other)),
    }
}

/// Every term holds (`true` when there is none).
fn all_of(terms: Vec<String>) -> String {
    if terms.is_empty() {
        "true".to_owned()
    } else {
        terms.join(" && ")
    }
}
