//! The template's side of [`super::difference`] as a CEL condition: whether an item of the Pod
//! holds every field a template's item sets, up to what the API server fills in.
//!
//! The policy's mutation asks it of a container a required template names that the Pod
//! already has: the same admission request may have run an earlier version of the policy
//! first (the API server re-invokes a policy by name, and loads a new version between the two
//! calls), and the new version must then leave that Pod to the earlier one rather than write
//! its own record entry over the earlier version's containers.
//!
//! Only that side, and leaning to "holds" where unsure: keys the Pod's item has and the
//! template does not set are not looked at, nor are quantities (`resources`, which a
//! LimitRange fills in too). A look-alike taken for the template's item still meets the
//! webhook or the guard, which compare whole items; an item of the template's wrongly judged
//! different would have the Pod refused under the guard where the webhook admits it.

use serde_json::Value;

use super::{
    Context, HOST_NETWORK_CEL, ItemKind, child_context, is_dropped_zero, is_empty,
    mounts_but_token_cel, pull_policy_cel, rendered_text_cel, zero_default,
};
use crate::cel::{cel_json, cel_string};
use crate::placeholder::{Node, TemplateString};

/// The condition that `theirs` (a CEL expression: an item of the Pod) holds `ours` (a
/// template's item, its placeholders rendered by `text`).
pub(crate) fn holds_cel(
    ours: &Node,
    theirs: &str,
    kind: ItemKind,
    text: &dyn Fn(&TemplateString) -> String,
) -> String {
    let context = match kind {
        ItemKind::Container => Context::Container,
        ItemKind::Volume => Context::Volume,
    };
    Walk { text }.value(Ours::Node(ours), theirs, context)
}

/// A part of a template's item: a node that may hold placeholders, or a fixed value within one.
#[derive(Clone, Copy)]
enum Ours<'n> {
    Node(&'n Node),
    Value(&'n Value),
}

struct Walk<'t> {
    text: &'t dyn Fn(&TemplateString) -> String,
}

impl Walk<'_> {
    fn value(&self, ours: Ours<'_>, theirs: &str, context: Context) -> String {
        match ours {
            Ours::Node(Node::Fixed(fixed)) => {
                self.value(Ours::Value(fixed.value()), theirs, context)
            }
            Ours::Node(Node::Text(template)) => format!("{theirs} == {}", (self.text)(template)),
            Ours::Node(Node::Array(items)) => {
                self.list(items.iter().map(Ours::Node).collect(), theirs, context)
            }
            Ours::Node(Node::Object(fields)) => self.object(
                fields
                    .iter()
                    .map(|(k, v)| (k.as_str(), Ours::Node(v)))
                    .collect(),
                theirs,
                context,
            ),
            Ours::Value(Value::Array(items)) => {
                self.list(items.iter().map(Ours::Value).collect(), theirs, context)
            }
            Ours::Value(Value::Object(fields)) => self.object(
                fields
                    .iter()
                    .map(|(k, v)| (k.as_str(), Ours::Value(v)))
                    .collect(),
                theirs,
                context,
            ),
            // Quantities are stored in canonical form (`0.5` as `500m`).
            Ours::Value(Value::String(_))
                if matches!(context, Context::Resources | Context::Quantities) =>
            {
                "true".to_owned()
            }
            // The Pod's fields are typed, and a template's value has the field's type (the CRD's
            // schema is the Pod's): no `dyn` is needed, nor wanted in the interpreter tests.
            Ours::Value(scalar) => format!("{theirs} == {}", cel_json(scalar)),
        }
    }

    fn list(&self, items: Vec<Ours<'_>>, theirs: &str, context: Context) -> String {
        let mut terms = vec![format!("size({theirs}) == {}", items.len())];
        for (index, item) in items.into_iter().enumerate() {
            terms.push(self.value(item, &format!("{theirs}[{index}]"), context));
        }
        format!("({})", terms.join(" && "))
    }

    /// The container's mounts, the ServiceAccount token's left out: as many as the
    /// template's, each one of them. Mount paths are unique in a container, so that is one
    /// for one, in any order (the order is `difference`'s to judge).
    fn mounts(&self, ours: Ours<'_>, container: &str) -> String {
        let items: Vec<Ours<'_>> = match ours {
            Ours::Node(Node::Array(items)) => items.iter().map(Ours::Node).collect(),
            Ours::Value(Value::Array(items)) => items.iter().map(Ours::Value).collect(),
            _ => return "true".to_owned(),
        };
        let any_of: Vec<String> = items
            .iter()
            .map(|item| self.value(*item, "m", Context::Mount))
            .collect();
        let theirs = mounts_but_token_cel(container);
        let each = if any_of.is_empty() {
            "true".to_owned()
        } else {
            format!("{theirs}.all(m, {})", any_of.join(" || "))
        };
        format!("(size({theirs}) == {} && {each})", items.len())
    }

    fn object(&self, fields: Vec<(&str, Ours<'_>)>, theirs: &str, context: Context) -> String {
        let mut terms = Vec::new();
        for (key, ours) in fields {
            let ours = match ours {
                Ours::Node(Node::Fixed(fixed)) => Ours::Value(fixed.value()),
                other => other,
            };
            let name = cel_string(key);
            let at = format!("{theirs}[{name}]");
            let held = match (context, key, ours) {
                // A LimitRange fills in what the template leaves out.
                (Context::Container, "resources", _) => continue,
                // Rendered empty, a field is left out or kept empty.
                (_, _, Ours::Node(Node::Text(template))) => {
                    terms.push(rendered_text_cel(theirs, key, &(self.text)(template)));
                    continue;
                }
                // The AlwaysPullImages admission plugin, where enabled, overrides any policy.
                (Context::Container, "imagePullPolicy", Ours::Value(value)) => {
                    pull_policy_cel(&at, &cel_json(value))
                }
                // The ServiceAccount plugin's token mount may stand among the template's.
                (Context::Container, "volumeMounts", ours) => self.mounts(ours, theirs),
                // `hostPort: 0` is Go's unset: left out, or on a hostNetwork Pod the port's
                // `containerPort`, as `difference` allows.
                (Context::Port, "hostPort", Ours::Value(value)) if *value == 0 => format!(
                    "({at} == 0 || ({HOST_NETWORK_CEL} && \"containerPort\" in {theirs} && {at} == {theirs}[\"containerPort\"]))"
                ),
                // A zero timing or an empty path is defaulted as if left out.
                (_, _, Ours::Value(value))
                    if let Some(default) = zero_default(context, key, value) =>
                {
                    format!(
                        "({at} == {} || {at} == {})",
                        cel_json(value),
                        cel_json(&default)
                    )
                }
                (_, _, ours) => self.value(ours, &at, child_context(context, key)),
            };
            let may_be_absent = match ours {
                Ours::Value(value) => is_empty(value) || is_dropped_zero(context, key, value),
                Ours::Node(_) => false,
            };
            terms.push(if may_be_absent {
                format!("(!({name} in {theirs}) || {held})")
            } else {
                // `in` first: an absent key makes the condition false, never an error.
                format!("({name} in {theirs} && {held})")
            });
        }
        if terms.is_empty() {
            "true".to_owned()
        } else {
            format!("({})", terms.join(" && "))
        }
    }
}

#[cfg(test)]
mod tests;
