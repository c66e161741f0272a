//! The guard: a ValidatingAdmissionPolicy that keeps a required template's promise when no
//! webhook stands behind the policy (`--injection-backend policy`).
//!
//! The policy's mutation skips a Pod that already has a container, init container or volume
//! named like the template's, so a look-alike (the sidecar's name, another image) would be
//! admitted without the real sidecar. With the webhook behind it, the webhook refuses such a
//! Pod; without it, the guard does: validation runs after every mutation, and the guard refuses
//! a Pod a required template selects unless the Pod carries the template's items exactly as the
//! API server stores what the policy adds (the presence conditions of [`super::presence_conditions`]).
//! A required template the policy cannot serve refuses every Pod it selects, as a webhook that
//! is down refuses them.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    ANNOTATIONS, CompiledPolicy, PolicyOptions, at_validation, cel_string,
    outside_the_operators_namespace, selection_conditions, validating_policy, version_hash,
};
use crate::template::CompiledTemplate;
use injector_api::FailurePolicy;
use injector_api::names::POLICY_PROOF_ANNOTATION;

/// What the guard asks of a Pod a required template selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardRule {
    /// The Pod carries the template as this presence condition describes it.
    Carries(String),
    /// The template cannot be injected (why): every Pod it selects is refused.
    CannotInject(String),
}

/// One rule per required template in force (`templates`), in application order: `compiled`
/// is the policy the operator applies (`None` when the API server serves no
/// MutatingAdmissionPolicies) and `present` the presence conditions learned from its proof.
/// A served template that adds no container and no volume needs no rule: the policy adds it
/// to every Pod it selects.
pub fn guard_rules(
    templates: &[Arc<CompiledTemplate>],
    compiled: Option<&CompiledPolicy>,
    present: &BTreeMap<String, String>,
) -> Vec<(Arc<CompiledTemplate>, GuardRule)> {
    let mut required: Vec<&Arc<CompiledTemplate>> = templates
        .iter()
        .filter(|t| t.failure_policy == FailurePolicy::Fail)
        .collect();
    required.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    required.dedup_by(|a, b| a.name == b.name);
    required
        .into_iter()
        .filter_map(|template| {
            let rule = match compiled {
                None => GuardRule::CannotInject(
                    "the injection backend is policy, and the API server does not serve MutatingAdmissionPolicies (admissionregistration.k8s.io/v1, Kubernetes 1.36+)".to_owned(),
                ),
                Some(compiled) => {
                    if let Some((_, why)) =
                        compiled.webhook_only.iter().find(|(t, _)| t.name == template.name)
                    {
                        GuardRule::CannotInject(format!(
                            "the injection backend is policy, and a policy cannot serve it: {why}"
                        ))
                    } else if let Some(condition) = present.get(&template.name) {
                        GuardRule::Carries(condition.clone())
                    } else if template.containers.is_empty()
                        && template.init_containers.is_empty()
                        && template.volumes.is_empty()
                    {
                        return None;
                    } else {
                        GuardRule::CannotInject(
                            "the injection backend is policy, and its containers and volumes could not be recognised in what the API server stored for the policy's proof".to_owned(),
                        )
                    }
                }
            };
            Some((Arc::clone(template), rule))
        })
        .collect()
}

/// The guard policy and its binding.
#[derive(Clone, Debug)]
pub struct CompiledGuard {
    /// The ValidatingAdmissionPolicy.
    pub policy: Value,
    /// Its ValidatingAdmissionPolicyBinding (`Deny`).
    pub binding: Value,
    /// 16 hex digits of a SHA-256 of the guard's rules.
    pub hash: String,
    /// Per template, the condition (its validation's expression) a Pod passes: what this guard
    /// puts in force.
    pub passes: BTreeMap<String, String>,
}

/// On the guard policy: the templates its rules are for, in order, so that a new leader can
/// read back which condition of the guard in force is whose ([`guard_in_force_of`]).
const GUARD_TEMPLATES_ANNOTATION: &str = "sidecar.dev/guard-templates";

/// The name of the guard policy (and binding) beside the policy `name`.
pub fn guard_name(name: &str) -> String {
    format!("{name}-guard")
}

/// The guard for `rules` (from [`guard_rules`]); `None` when there is no rule, so Pods pay for
/// no validation they do not need.
///
/// With `previous` (per template, the condition of the guard in force), the guard for a
/// change, put in force before the policy changes: a Pod passes a template's rule when it
/// passes the new one or the one in force, since either policy may be the one the API server
/// runs for it; a template with no rule in force is not guarded yet.
pub fn compile_guard(
    options: &PolicyOptions,
    rules: &[(Arc<CompiledTemplate>, GuardRule)],
    previous: Option<&BTreeMap<String, String>>,
) -> Option<CompiledGuard> {
    let rules: Vec<(&CompiledTemplate, &GuardRule, String)> = rules
        .iter()
        .filter_map(|(template, rule)| {
            let new = passes(template, rule);
            match previous {
                None => Some((template.as_ref(), rule, new)),
                Some(previous) => previous
                    .get(&template.name)
                    .map(|old| (template.as_ref(), rule, format!("{new}\n|| ({old})"))),
            }
        })
        .collect();
    if rules.is_empty() {
        return None;
    }
    // The operator's namespace is never injected, so never guarded: only the dry-run Pod
    // asking whether this version is in force reaches the guard there.
    let outside = format!(
        "request.namespace == {}",
        cel_string(&options.operator_namespace)
    );
    let mut passes = BTreeMap::new();
    let mut validations = Vec::new();
    for (template, rule, condition) in &rules {
        let expression = at_validation(&format!("{outside}\n|| {condition}"));
        let message = match rule {
            GuardRule::Carries(_) => format!(
                "SidecarTemplate {:?} is required: the Pod has a container, init container or volume named like one of the template's that differs from it, so the template was not injected; rename it or remove it",
                template.name
            ),
            GuardRule::CannotInject(why) => format!(
                "SidecarTemplate {:?} is required and cannot be injected: {why}",
                template.name
            ),
        };
        validations.push(json!({"expression": expression, "message": message}));
        passes.insert(template.name.clone(), expression);
    }
    let hash = version_hash(options, &validations);
    let token = guard_token(&hash);
    validations.insert(
        0,
        json!({
            "expression": format!(
                "{ANNOTATIONS}[?{}].orValue(\"\") != {}",
                cel_string(POLICY_PROOF_ANNOTATION),
                cel_string(&token)
            ),
            "message": in_force_message(&token),
        }),
    );
    // A rule that fails to evaluate must not admit a Pod without its required sidecar.
    let (policy, binding) = validating_policy(
        &guard_name(&options.name),
        "Fail",
        outside_the_operators_namespace(options, &token),
        validations,
        "Deny",
    );
    let mut policy = policy;
    let names: Vec<&str> = rules.iter().map(|(t, _, _)| t.name.as_str()).collect();
    policy["metadata"]["annotations"] = json!({GUARD_TEMPLATES_ANNOTATION: names.join(",")});
    Some(CompiledGuard {
        policy,
        binding,
        hash,
        passes,
    })
}

/// The CEL condition that a Pod passes `rule` of `template`: it is not selected, or it
/// carries the template.
fn passes(template: &CompiledTemplate, rule: &GuardRule) -> String {
    let selected = selection_conditions(template);
    let not_selected = if selected.is_empty() {
        "false".to_owned()
    } else {
        format!("!({})", selected.join(" && "))
    };
    match rule {
        GuardRule::Carries(condition) => format!("({not_selected} || ({condition}))"),
        GuardRule::CannotInject(_) => format!("({not_selected})"),
    }
}

/// Per template, the condition of the guard policy `stored` (as read from the API server): what
/// is in force when this leader did not put it there. Empty when it is not one of ours.
pub fn guard_in_force_of(stored: &Value) -> BTreeMap<String, String> {
    let names = stored
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(GUARD_TEMPLATES_ANNOTATION))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let validations = stored
        .pointer("/spec/validations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    names
        .split(',')
        .filter(|n| !n.is_empty())
        // The first validation answers the probe.
        .zip(validations.iter().skip(1))
        .filter_map(|(name, v)| Some((name.to_owned(), v["expression"].as_str()?.to_owned())))
        .collect()
}

/// What the dry-run Pod asking whether the guard `hash` is in force carries.
fn guard_token(hash: &str) -> String {
    format!("{hash}-guard")
}

/// The guard's answer to that Pod: it refuses it, saying which version refused.
fn in_force_message(token: &str) -> String {
    format!("the sidecar-injector guard {token} is in force")
}

/// The dry-run Pod that asks whether the API server enforces `guard`: the guard refuses it
/// with [`guard_in_force`]'s message.
pub fn guard_probe_pod(guard: &CompiledGuard) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sidecar-injector-guard-probe-",
            "annotations": {POLICY_PROOF_ANNOTATION: guard_token(&guard.hash)},
        },
        "spec": {"containers": [{"name": "guard-probe", "image": "guard-probe.invalid/none:1"}]},
    })
}

/// Whether `refusal` (the message of a refused dry run of [`guard_probe_pod`]) came from
/// `guard`.
pub fn guard_in_force(guard: &CompiledGuard, refusal: &str) -> bool {
    refusal.contains(&in_force_message(&guard_token(&guard.hash)))
}
