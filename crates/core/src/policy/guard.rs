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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    ANNOTATIONS, CompiledPolicy, NAMESPACE_LABELS, PolicyOptions, WebhookOnly, at_validation,
    cel_string, dry_run_pod, outside_the_operators_namespace, selection_cel, validating_policy,
    version_hash,
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
    /// The template cannot be injected (`why`), and selects on a label a template the policy
    /// backend never applies would add: every Pod it selects is refused, and so is every Pod
    /// `also` holds for (that template selects it, in the template's namespaces), which it
    /// would select once the label were there.
    CannotInjectWhere {
        /// Why.
        why: String,
        /// The CEL condition of the further Pods refused.
        also: String,
    },
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
    required(templates)
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
                        let why = format!(
                            "the injection backend is policy, and a policy cannot serve it: {why}"
                        );
                        match label_adder(compiled, template) {
                            Some(also) => GuardRule::CannotInjectWhere { why, also },
                            None => GuardRule::CannotInject(why),
                        }
                    } else if let Some(condition) = present.get(&template.name) {
                        GuardRule::Carries(condition.clone())
                    } else if adds_nothing_to_recognise(template) {
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

/// When `template` is left to the webhook for selecting on a label another template the webhook
/// serves adds, the Pods it would select once that template added it: those the other selects,
/// in `template`'s namespaces. (Its other pod selector requirements are not asked: refusing too
/// many is the safe side, and the template's status says why.) Without a webhook the label never
/// comes, and the Pod was admitted with neither while `plan` injects both.
fn label_adder(compiled: &CompiledPolicy, template: &CompiledTemplate) -> Option<String> {
    let added_by = compiled
        .webhook_only
        .iter()
        .find_map(|(t, why)| match why {
            WebhookOnly::SelectsOnWebhookLabel { added_by, .. } if t.name == template.name => {
                Some(added_by)
            }
            _ => None,
        })?;
    let (adder, _) = compiled
        .webhook_only
        .iter()
        .find(|(t, _)| &t.name == added_by)?;
    let mut conditions = selection_cel(adder.selecting());
    conditions.push(template.namespace_selector.cel(NAMESPACE_LABELS));
    conditions.retain(|c| c != "true");
    Some(if conditions.is_empty() {
        "true".to_owned()
    } else {
        conditions.join(" && ")
    })
}

/// The required templates of `templates`, in application order.
fn required(templates: &[Arc<CompiledTemplate>]) -> Vec<&Arc<CompiledTemplate>> {
    let mut required: Vec<&Arc<CompiledTemplate>> = templates
        .iter()
        .filter(|t| t.failure_policy == FailurePolicy::Fail)
        .collect();
    required.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    required.dedup_by(|a, b| a.name == b.name);
    required
}

/// What the guard puts in force for one template: the conditions a Pod may pass (each one a
/// guard's for one policy alone, so that a guard built from them never nests another) and the
/// message it is refused with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardKept {
    /// The settled conditions, newest first: a Pod passes when it passes any.
    pub conditions: Vec<String>,
    /// Why a Pod that passes none is refused.
    pub message: String,
    /// Why every Pod the template selects is refused: its only condition is that of a
    /// [`GuardRule::CannotInject`]. `None` when a Pod carrying the template may pass.
    pub refuses: Option<String>,
}

/// Per template, what a guard puts in force.
pub type GuardConditions = BTreeMap<String, GuardKept>;

/// The guard policy and its binding.
#[derive(Clone, Debug)]
pub struct CompiledGuard {
    /// The ValidatingAdmissionPolicy.
    pub policy: Value,
    /// Its ValidatingAdmissionPolicyBinding (`Deny`).
    pub binding: Value,
    /// 16 hex digits of a SHA-256 of the guard's rules.
    pub hash: String,
    /// Per template, what this guard puts in force.
    pub passes: GuardConditions,
}

/// On the guard policy: the templates its rules are for, in order, so that a new leader can
/// read back which condition of the guard in force is whose ([`guard_in_force_of`]).
const GUARD_TEMPLATES_ANNOTATION: &str = "sidecar.dev/guard-templates";

/// How many settled conditions a template's rule accepts at most: the new one, the one the
/// API server most likely runs and the last one confirmed. A series of changes whose policy
/// never lands would otherwise add one each (and nesting them grew the guard past CEL's cost
/// and etcd's size limits, after which no guard landed again). Dropping one only refuses more.
const MAX_CONDITIONS: usize = 3;

/// The message of a refused Pod that carries a look-alike of `template`.
fn carries_message(template: &str) -> String {
    format!(
        "SidecarTemplate {template:?} is required: the Pod has a container, init container or volume named like one of the template's that differs from it, so the template was not injected; rename it or remove it"
    )
}

/// The message of a refused Pod of `template`, new to the guard, while the API server does
/// not run the policy that injects it yet (or it carries a look-alike).
fn not_injected_yet_message(template: &str) -> String {
    format!(
        "SidecarTemplate {template:?} is required and not injected yet: the API server does not run the policy that injects it yet (or the Pod has a container, init container or volume named like one of the template's that differs from it); try again"
    )
}

/// The prefix of the message of a template that cannot be injected, before why.
fn cannot_inject_prefix(template: &str) -> String {
    format!("SidecarTemplate {template:?} is required and cannot be injected: ")
}

/// The name of the guard policy (and binding) beside the policy `name`.
pub fn guard_name(name: &str) -> String {
    format!("{name}-guard")
}

/// What `rule` of `template` alone puts in force.
fn settled(template: &CompiledTemplate, rule: &GuardRule) -> GuardKept {
    let (message, refuses) = match rule {
        GuardRule::Carries(_) => (carries_message(&template.name), None),
        GuardRule::CannotInject(why) | GuardRule::CannotInjectWhere { why, .. } => {
            // A validation's message holds no line break (the API server refuses one).
            let why = why.replace(['\n', '\r'], " ");
            (
                format!("{}{why}", cannot_inject_prefix(&template.name)),
                Some(why),
            )
        }
    };
    GuardKept {
        conditions: vec![at_validation(&passes(template, rule))],
        message,
        refuses,
    }
}

/// The guard for `rules` (from [`guard_rules`]); `None` when there is no rule, so Pods pay for
/// no validation they do not need.
///
/// With `previous` (what the guard in force puts in force), the guard for a change, put in
/// force before the policy changes: a Pod passes a template's rule when it passes the new one
/// or one in force, since either policy may be the one the API server runs for it. The
/// conditions are settled ones, never a guard wrapping another, and at most
/// `MAX_CONDITIONS`, so a series of changes that fail keeps the guard's size bounded. A
/// template with no rule in force gets its new rule alone: until the new policy runs, its Pods
/// are refused, never admitted without it.
pub fn compile_guard(
    options: &PolicyOptions,
    rules: &[(Arc<CompiledTemplate>, GuardRule)],
    previous: Option<&GuardConditions>,
) -> Option<CompiledGuard> {
    let kept = rules
        .iter()
        .map(|(template, rule)| {
            let mut kept = settled(template, rule);
            // A rule that refused every Pod the template selects was for a version no policy
            // injected: no Pod carries it.
            let old = previous
                .and_then(|p| p.get(&template.name))
                .filter(|old| old.refuses.is_none());
            if let Some(old) = old {
                let mut conditions = kept.conditions.clone();
                for condition in &old.conditions {
                    if !conditions.contains(condition) {
                        conditions.push(condition.clone());
                    }
                }
                if conditions.len() > MAX_CONDITIONS {
                    // Keep the newest in force (the API server most likely runs it) and the
                    // oldest (the last one confirmed).
                    let oldest = conditions.split_off(MAX_CONDITIONS - 1).pop();
                    conditions.extend(oldest);
                }
                if conditions.len() > 1 {
                    // A Pod carrying either version may pass.
                    kept.refuses = None;
                }
                kept.conditions = conditions;
            }
            if previous.is_some()
                && kept.conditions.len() == 1
                && matches!(rule, GuardRule::Carries(_))
            {
                // Only the new version passes: until the policy runs, a Pod is refused for
                // not carrying it yet, not for a look-alike (mostly).
                kept.message = not_injected_yet_message(&template.name);
            }
            (template.name.clone(), kept)
        })
        .collect();
    guard_of(options, kept)
}

/// The guard that keeps, for each template of `rules`, what `in_force` puts in force, and
/// gives the others their rule (each a [`GuardRule::CannotInject`] saying why the template is
/// not served yet): put in force before a proof, and kept when it fails, so that a required
/// template is guarded before the policy serves it. `refreshed`: a rule in force that refuses
/// every Pod the template selects gives way to the new one (whose why is newer); otherwise
/// only what the policy in force injects is kept. `None` when there is no rule.
pub fn keep_guard(
    options: &PolicyOptions,
    rules: &[(Arc<CompiledTemplate>, GuardRule)],
    in_force: &GuardConditions,
    refreshed: bool,
) -> Option<CompiledGuard> {
    let kept = rules
        .iter()
        .map(|(template, rule)| {
            let kept = in_force
                .get(&template.name)
                .filter(|kept| !refreshed || kept.refuses.is_none())
                .cloned()
                .unwrap_or_else(|| settled(template, rule));
            (template.name.clone(), kept)
        })
        .collect();
    guard_of(options, kept)
}

/// Every required template of `templates` (in application order) refusing what it selects,
/// for `why`: what [`keep_guard`] gives a template with nothing in force. A template of
/// `serving` (the policy in force serves it) that adds no container and no volume has no rule
/// in force and needs none (see [`guard_rules`]): the policy in force injects it still.
pub fn unserved_rules(
    templates: &[Arc<CompiledTemplate>],
    serving: &BTreeSet<String>,
    why: &str,
) -> Vec<(Arc<CompiledTemplate>, GuardRule)> {
    required(templates)
        .into_iter()
        .filter(|t| !(serving.contains(&t.name) && adds_nothing_to_recognise(t)))
        .map(|t| (Arc::clone(t), GuardRule::CannotInject(why.to_owned())))
        .collect()
}

/// Whether `template` adds no container and no volume: nothing a guard could recognise.
fn adds_nothing_to_recognise(template: &CompiledTemplate) -> bool {
    template.containers.is_empty()
        && template.init_containers.is_empty()
        && template.volumes.is_empty()
}

/// The guard putting `kept` (per template, in order) in force.
fn guard_of(options: &PolicyOptions, kept: Vec<(String, GuardKept)>) -> Option<CompiledGuard> {
    if kept.is_empty() {
        return None;
    }
    // The operator's namespace is never injected, so never guarded: only the dry-run Pod
    // asking whether this version is in force reaches the guard there.
    let outside = format!(
        "request.namespace == {}",
        cel_string(&options.operator_namespace)
    );
    let mut variables = Vec::new();
    let mut validations = Vec::new();
    for (index, (_, kept)) in kept.iter().enumerate() {
        // Each condition is a variable, so that a guard read back yields its settled
        // conditions as they are, to be combined again without wrapping.
        let mut expression = outside.clone();
        for (n, condition) in kept.conditions.iter().enumerate() {
            let name = variable_name(index, n);
            expression.push_str(&format!("\n|| variables.{name}"));
            variables.push(json!({"name": name, "expression": condition}));
        }
        validations.push(json!({"expression": expression, "message": kept.message}));
    }
    let hash = version_hash(options, &[json!(variables), json!(validations)]);
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
    let (mut policy, binding) = validating_policy(
        &guard_name(&options.name),
        "Fail",
        &[],
        Some(outside_the_operators_namespace(options, &token)),
        validations,
        "Deny",
    );
    policy["spec"]["variables"] = Value::Array(variables);
    let names: Vec<&str> = kept.iter().map(|(name, _)| name.as_str()).collect();
    policy["metadata"]["annotations"] = json!({GUARD_TEMPLATES_ANNOTATION: names.join(",")});
    Some(CompiledGuard {
        policy,
        binding,
        hash,
        passes: kept.into_iter().collect(),
    })
}

/// The variable holding condition `n` of the rule at `index`.
fn variable_name(index: usize, n: usize) -> String {
    format!("t{index}_{n}")
}

/// The CEL condition that a Pod passes `rule` of `template`: it is not selected, or it
/// carries the template.
fn passes(template: &CompiledTemplate, rule: &GuardRule) -> String {
    let selected = selection_cel(template.selecting());
    let not_selected = if selected.is_empty() {
        "false".to_owned()
    } else {
        format!("!({})", selected.join(" && "))
    };
    match rule {
        GuardRule::Carries(condition) => format!("({not_selected} || ({condition}))"),
        GuardRule::CannotInject(_) => format!("({not_selected})"),
        GuardRule::CannotInjectWhere { also, .. } => format!("({not_selected} && !({also}))"),
    }
}

/// What the guard policy `stored` (as read from the API server) puts in force: what is in
/// force when this leader did not put it there. Empty when it is not one of ours. A guard in
/// between two policies yields the settled conditions of both, to be combined again, never
/// wrapped; one from before the guard had variables yields its whole expressions.
pub fn guard_in_force_of(stored: &Value) -> GuardConditions {
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
    let variables: BTreeMap<&str, &str> = stored
        .pointer("/spec/variables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v["expression"].as_str()?)))
        .collect();
    names
        .split(',')
        .filter(|n| !n.is_empty())
        // The first validation answers the probe.
        .zip(validations.iter().skip(1))
        .enumerate()
        .filter_map(|(index, (name, validation))| {
            let message = validation["message"].as_str()?.to_owned();
            let mut conditions: Vec<String> = (0..)
                .map_while(|n| variables.get(variable_name(index, n).as_str()))
                .map(|c| (*c).to_owned())
                .collect();
            if conditions.is_empty() {
                conditions.push(validation["expression"].as_str()?.to_owned());
            }
            let refuses = message
                .strip_prefix(&cannot_inject_prefix(name))
                .filter(|_| conditions.len() == 1)
                .map(str::to_owned);
            Some((
                name.to_owned(),
                GuardKept {
                    conditions,
                    message,
                    refuses,
                },
            ))
        })
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
    dry_run_pod(
        json!({
            "generateName": "sidecar-injector-guard-probe-",
            "annotations": {POLICY_PROOF_ANNOTATION: guard_token(&guard.hash)},
        }),
        "guard-probe",
        "guard-probe.invalid/none:1",
    )
}

/// Whether `refusal` (the message of a refused dry run of [`guard_probe_pod`]) came from
/// `guard`.
pub fn guard_in_force(guard: &CompiledGuard, refusal: &str) -> bool {
    refusal.contains(&in_force_message(&guard_token(&guard.hash)))
}
