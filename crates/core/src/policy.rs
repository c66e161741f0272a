//! Compiling templates into one MutatingAdmissionPolicy (`admissionregistration.k8s.io/v1`,
//! Kubernetes 1.36+), so the API server injects them itself with no webhook call.
//!
//! The policy holds the templates' JSONPatch mutations in application order (priority, then
//! name): the API server runs the mutations of one policy in order, each seeing the result of
//! the one before, but orders separate policies arbitrarily, so every template the policy
//! serves lives in the one policy. Consecutive templates that read and write nothing of each
//! other's share one mutation (`batch`): the API server re-encodes the whole Pod after each.
//! A template's part is a CEL expression that evaluates to `[]`
//! unless the template selects the Pod (namespace and pod selectors, `OnRequest`, the opt-out)
//! and none of its containers, init containers and volumes is in the Pod yet. So a mutation
//! adds nothing twice (the API server evaluates a policy that changed the object again) and a
//! Pod the template conflicts with, or already carries, is left to the webhook, which decides
//! it with `plan` and a readable answer. Every other addition (env, mounts, pull secrets,
//! labels, annotations) is made only where the Pod has none by that key, as `plan` does.
//!
//! Template values become CEL literals whose strings are either literals or, for placeholders,
//! CEL string expressions over the Pod's metadata: substitution still produces a string, never
//! structure. What a policy cannot express as `plan` does keeps the template on the webhook,
//! with the reason ([`WebhookOnly`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::sync::Arc;

use injector_api::FailurePolicy;
use injector_api::names::{
    INJECTED_ANNOTATION, NAMESPACE_NAME_LABEL, POLICY_PROOF_ANNOTATION,
    POLICY_PROOF_ROUND_ANNOTATION, POLICY_PROVEN_ANNOTATION,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::cel::{cel_array, cel_entry, cel_json, cel_list, cel_object, cel_string};
use crate::placeholder::{Node, Part, TemplateString};
use crate::plan::Applied;
use crate::rules::defaulted::{
    ItemKind, SERVICE_ACCOUNT_MOUNT_PATH, TOKEN_VOLUME_PREFIX, container_presence, holds_cel,
    stored_volume,
};
use crate::rules::placement;
use crate::rules::record;
use crate::rules::selection::{self, ANNOTATIONS, LABELS, NAMESPACE_LABELS, selection_cel};
use crate::rules::selector::Selector;
use crate::syntax::LABEL_VALUE_PATTERN;
use crate::template::{AppAdditions, CompiledTemplate, Item, Text};

mod after_admission;
mod batch;
mod guard;
mod warnings;

pub use after_admission::{CompiledAfterAdmission, after_admission_name, compile_after_admission};

pub use warnings::{compile_warnings, warnings_name};

pub use guard::{
    CompiledGuard, GuardConditions, GuardKept, GuardRule, compile_guard, guard_in_force,
    guard_in_force_of, guard_name, guard_probe_pod, guard_rules, keep_guard, unserved_rules,
};

/// The policy's API version.
pub const POLICY_API_VERSION: &str = "admissionregistration.k8s.io/v1";

/// Where the compiled policy applies, and what it is called.
#[derive(Clone, Debug)]
pub struct PolicyOptions {
    /// The name of the policy and of its binding.
    pub name: String,
    /// The operator's own namespace, never injected (beside `kube-system` and the others).
    pub operator_namespace: String,
    /// Whether the webhook stands behind the policy (the `auto` backend), called after it for
    /// the templates left to it; `false` with the `policy` backend, where nothing is.
    pub webhook_behind: bool,
}

/// Why a template stays on the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookOnly {
    /// `appContainers.envFrom`: the webhook compares sources by content, which a policy cannot.
    AppEnvFrom,
    /// Its pod selector reads a label that a template applied after it adds: `plan` runs passes
    /// until nothing changes, a policy's mutations run once, in order.
    SelectsOnLaterLabel {
        /// The label key.
        label: String,
        /// The template that adds it.
        added_by: String,
    },
    /// A placeholder reads a label or annotation that a template applied after it adds.
    ReadsLaterMetadata {
        /// The key.
        key: String,
        /// The template that adds it.
        added_by: String,
    },
    /// A placeholder reads a label or annotation that a template the webhook serves adds: the
    /// webhook is called after the policy ran.
    ReadsWebhookMetadata {
        /// The key.
        key: String,
        /// The template that adds it.
        added_by: String,
    },
    /// Its pod selector reads a label that a template the webhook serves adds: the webhook is
    /// called after the policy ran (and with the `policy` backend, not at all).
    SelectsOnWebhookLabel {
        /// The label key.
        label: String,
        /// The template that adds it.
        added_by: String,
    },
    /// A template applied before it, which may select the same Pods, is left to the webhook:
    /// the webhook is called after the policy ran, so the policy would apply this one first
    /// (its init containers before the other's, its env winning, its record entry first).
    AfterWebhookTemplate {
        /// That template.
        template: String,
    },
    /// The policy (or its proof) would grow past what the API server stores in one object:
    /// the templates applied first are served, the rest left.
    PolicyFull {
        /// The budget of the mutations' expressions, in bytes.
        budget: usize,
    },
}

impl WebhookOnly {
    /// The reason of the template's `PolicyServed` condition: `PolicyFull` when the policy has
    /// no room left for it, `NotExpressible` otherwise.
    pub fn reason(&self) -> &'static str {
        match self {
            WebhookOnly::PolicyFull { .. } => "PolicyFull",
            _ => "NotExpressible",
        }
    }
}

impl fmt::Display for WebhookOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WebhookOnly::AppEnvFrom => write!(
                f,
                "appContainers.envFrom is compared by content, which a policy cannot do"
            ),
            WebhookOnly::SelectsOnLaterLabel { label, added_by } => write!(
                f,
                "its podSelector reads label {label:?}, which SidecarTemplate {added_by:?} adds after it"
            ),
            WebhookOnly::ReadsLaterMetadata { key, added_by } => write!(
                f,
                "a placeholder reads {key:?}, which SidecarTemplate {added_by:?} adds after it"
            ),
            WebhookOnly::ReadsWebhookMetadata { key, added_by } => write!(
                f,
                "a placeholder reads {key:?}, which SidecarTemplate {added_by:?} adds from the webhook, called after the policy"
            ),
            WebhookOnly::SelectsOnWebhookLabel { label, added_by } => write!(
                f,
                "its podSelector reads label {label:?}, which SidecarTemplate {added_by:?} adds from the webhook, called after the policy (with the policy backend, never)"
            ),
            WebhookOnly::AfterWebhookTemplate { template } => write!(
                f,
                "SidecarTemplate {template:?} applies before it and may select the same Pods, but is left to the webhook, called after the policy"
            ),
            WebhookOnly::PolicyFull { budget } => write!(
                f,
                "the templates applied before it fill the policy (its mutations would pass {} KiB, and etcd stores at most 1.5 MiB per object)",
                budget / 1024
            ),
        }
    }
}

/// The policy, its binding, and which templates it serves.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    /// The MutatingAdmissionPolicy; `None` when no template can be served by one.
    pub policy: Option<Value>,
    /// Its MutatingAdmissionPolicyBindings (none without the policy): the one named like it
    /// first, then those of the namespace groups, if any ([`policy_bindings`]).
    pub bindings: Vec<Value>,
    /// The templates the policy serves, in application order.
    pub served: Vec<Arc<CompiledTemplate>>,
    /// The templates left to the webhook, and why.
    pub webhook_only: Vec<(Arc<CompiledTemplate>, WebhookOnly)>,
    /// 16 hex digits of a SHA-256 of the policy: equal policies, equal hashes.
    pub hash: String,
    /// The proof policy and binding: the same mutations without the selection, applied only to
    /// a Pod of the operator's namespace annotated with the hash (see [`proof_pod`]).
    pub proof: Option<(Value, Value)>,
    /// Per template served (in the order of `served`), the round of the proof whose Pod shows
    /// it (see [`proof_rounds`]).
    pub proof_rounds: Vec<usize>,
}

impl CompiledPolicy {
    /// How many proof Pods the proof takes: one per round.
    pub fn proof_round_count(&self) -> usize {
        self.proof_rounds.iter().max().map_or(0, |last| last + 1)
    }
}

/// A JSONPatch mutation of a policy.
fn patch_mutation(expression: String) -> Value {
    json!({"patchType": "JSONPatch", "jsonPatch": {"expression": expression}})
}

/// How many bytes the mutations' expressions of the policy, and of its proof, may take: etcd
/// stores at most 1.5 MiB per object (its default `--max-request-bytes`), and the rest of the
/// policy (the variable, the conditions, the JSON around each mutation) must fit beside them.
pub const POLICY_MUTATIONS_BUDGET: usize = 1024 * 1024;

/// What a proof mutation's round condition adds to it, at most (see [`proof_round_condition`]).
const PROOF_ROUND_BYTES: usize = 128;

/// How many bytes of its members' own mutations a batch may hold: half the API server's limit
/// on one expression ([`MAX_EXPRESSION`]), so that what the batch adds (its bound conditions,
/// each member's record entry twice) never takes it past.
const BATCH_BYTES: usize = MAX_EXPRESSION / 2;

/// Compiles `templates` (every template in force) into one policy for those a policy can serve.
pub fn compile_policy(
    templates: &[Arc<CompiledTemplate>],
    options: &PolicyOptions,
) -> CompiledPolicy {
    compile_policy_within(templates, options, POLICY_MUTATIONS_BUDGET)
}

/// [`compile_policy`], the mutations within `budget` bytes.
pub(crate) fn compile_policy_within(
    templates: &[Arc<CompiledTemplate>],
    options: &PolicyOptions,
    budget: usize,
) -> CompiledPolicy {
    let mut ordered: Vec<&Arc<CompiledTemplate>> = templates.iter().collect();
    ordered.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    ordered.dedup_by(|a, b| a.name == b.name);

    // Every init container a template adds: the leading ones of the Pod's are templates', and
    // a template's go after them, where `plan` puts them.
    let template_init = init_container_names(ordered.iter().copied());
    let service_account_volume = service_account_volume_cel(&ordered);
    let Written {
        served,
        written,
        webhook_only,
    } = write_mutations(&ordered, options, &template_init, budget);
    if served.is_empty() {
        return CompiledPolicy {
            policy: None,
            bindings: Vec::new(),
            served,
            webhook_only,
            hash: String::new(),
            proof: None,
            proof_rounds: Vec::new(),
        };
    }

    // Every container a template adds, so that `appContainers` never changes one (a webhook
    // template's too: the API server re-runs the policy after the webhook added it). The proof
    // applies every template; a Pod, those that select it (`TEMPLATE_CONTAINERS`).
    let every_container = cel_list(
        ordered
            .iter()
            .flat_map(|t| t.containers.iter().map(|i| i.key.as_str()))
            .collect::<BTreeSet<&str>>()
            .into_iter(),
    );
    let rounds = proof_rounds(&served);
    let (mutations, proof_mutations) = batched_mutations(&served, written, &rounds, &template_init);
    // The hash names this version: of everything the policy and its proof do, before the
    // parts that carry it. The proof's own mutations count: a proof policy of an operator
    // that proved otherwise (in one round, say), still loaded by the API server, must not
    // answer for this one.
    let hash = version_hash(options, &[mutations.as_slice(), &proof_mutations].concat());
    let live = live_token(&hash);
    let mutations = live_mutations(options, mutations, &live);
    let policy = policy_object(
        options,
        &ordered,
        &served,
        &webhook_only,
        &service_account_volume,
        mutations,
    );
    let variables = json!([
        // Every template applies to the proof Pod, so every template's containers are.
        {"name": TEMPLATE_CONTAINERS_VARIABLE, "expression": every_container},
        {"name": SERVICE_ACCOUNT_VOLUME_VARIABLE, "expression": service_account_volume},
    ]);
    let proof = proof_policy(options, &hash, variables, proof_mutations);
    CompiledPolicy {
        policy: Some(policy),
        bindings: policy_bindings(options, &served),
        served,
        webhook_only,
        hash,
        proof: Some(proof),
        proof_rounds: rounds,
    }
}

/// The policy's mutations and its proof's, one per batch of `served` ([`batch::batches`]): a
/// template alone keeps its own (`written`, in application order), a batch gets one for all.
fn batched_mutations(
    served: &[Arc<CompiledTemplate>],
    written: Vec<(String, String)>,
    rounds: &[usize],
    template_init: &BTreeSet<&str>,
) -> (Vec<Value>, Vec<Value>) {
    let several_rounds = rounds.iter().any(|&round| round > 0);
    let mut mutations: Vec<Value> = Vec::new();
    let mut proof_mutations = Vec::new();
    let sizes: Vec<usize> = written
        .iter()
        .map(|(policy, proof)| policy.len().max(proof.len() + PROOF_ROUND_BYTES))
        .collect();
    let mut written = written.into_iter();
    for range in batch::batches(served, &sizes, BATCH_BYTES) {
        let members: Vec<&CompiledTemplate> = served
            .get(range.clone())
            .unwrap_or_default()
            .iter()
            .map(Arc::as_ref)
            .collect();
        let singles: Vec<(String, String)> = written.by_ref().take(range.len()).collect();
        match (&singles[..], rounds.get(range).unwrap_or_default()) {
            ([(policy, proof)], [round]) => {
                mutations.push(patch_mutation(policy.clone()));
                proof_mutations.push(patch_mutation(if several_rounds {
                    format!("{}\n? ({proof})\n: []", proof_round_condition(*round))
                } else {
                    proof.clone()
                }));
            }
            (_, rounds) => {
                mutations.push(patch_mutation(batch::mutation(
                    &members,
                    template_init,
                    true,
                    None,
                )));
                proof_mutations.push(patch_mutation(batch::mutation(
                    &members,
                    template_init,
                    false,
                    several_rounds.then_some(rounds),
                )));
            }
        }
    }
    (mutations, proof_mutations)
}

/// What [`write_mutations`] decided: the templates the policy serves, with their mutation and
/// their proof's (without its round), and the others with why.
struct Written {
    served: Vec<Arc<CompiledTemplate>>,
    written: Vec<(String, String)>,
    webhook_only: Vec<(Arc<CompiledTemplate>, WebhookOnly)>,
}

/// Writes the mutation of each template of `ordered` (in application order) a policy can
/// serve within `budget` bytes, and its proof's.
fn write_mutations(
    ordered: &[&Arc<CompiledTemplate>],
    options: &PolicyOptions,
    template_init: &BTreeSet<&str>,
    budget: usize,
) -> Written {
    let mut served: Vec<Arc<CompiledTemplate>> = Vec::new();
    let mut written: Vec<(String, String)> = Vec::new();
    let (mut policy_bytes, mut proof_bytes) = (0, 0);
    let mut webhook_only: Vec<(Arc<CompiledTemplate>, WebhookOnly)> = Vec::new();
    for (index, template) in ordered.iter().enumerate() {
        let by_webhook: Vec<&Arc<CompiledTemplate>> = webhook_only.iter().map(|(t, _)| t).collect();
        if let Some(reason) =
            webhook_only_because(template, &ordered[index + 1..], &by_webhook, options)
        {
            webhook_only.push((Arc::clone(template), reason));
            continue;
        }
        let policy = mutation(template, TEMPLATE_CONTAINERS, template_init, true);
        let proof = mutation(template, TEMPLATE_CONTAINERS, template_init, false);
        // Each proof mutation also carries its round's condition: a few dozen bytes.
        let proof_size = proof.len() + PROOF_ROUND_BYTES;
        if policy_bytes + policy.len() > budget || proof_bytes + proof_size > budget {
            webhook_only.push((Arc::clone(template), WebhookOnly::PolicyFull { budget }));
            continue;
        }
        policy_bytes += policy.len();
        proof_bytes += proof_size;
        written.push((policy, proof));
        served.push(Arc::clone(template));
    }
    Written {
        served,
        written,
        webhook_only,
    }
}

/// Why `template` stays on the webhook, if it does: what it needs of `plan`, given the
/// templates applied after it (`later`) and those already left to the webhook (`by_webhook`).
fn webhook_only_because(
    template: &CompiledTemplate,
    later: &[&Arc<CompiledTemplate>],
    by_webhook: &[&Arc<CompiledTemplate>],
    options: &PolicyOptions,
) -> Option<WebhookOnly> {
    webhook_only_reason(template, later)
        .or_else(|| {
            reads_added_by(template, by_webhook)
                .map(|(key, added_by)| WebhookOnly::ReadsWebhookMetadata { key, added_by })
        })
        .or_else(|| {
            selects_added_by(template, by_webhook)
                .map(|(label, added_by)| WebhookOnly::SelectsOnWebhookLabel { label, added_by })
        })
        .or_else(|| {
            // Behind the policy, the webhook applies its templates after the policy's,
            // whatever their priority: a template after one of them stays with it, so that
            // `plan` applies both in order. Without a webhook, nothing applies that one.
            let earlier = by_webhook
                .iter()
                .find(|w| options.webhook_behind && may_select_alike(w, template))?;
            Some(WebhookOnly::AfterWebhookTemplate {
                template: earlier.name.clone(),
            })
        })
}

/// The MutatingAdmissionPolicy of `mutations` (the served templates', then the marker of
/// `live`, this version's token).
fn policy_object(
    options: &PolicyOptions,
    ordered: &[&Arc<CompiledTemplate>],
    served: &[Arc<CompiledTemplate>],
    webhook_only: &[(Arc<CompiledTemplate>, WebhookOnly)],
    service_account_volume: &str,
    mutations: Vec<Value>,
) -> Value {
    let required = served
        .iter()
        .any(|t| t.failure_policy == FailurePolicy::Fail);
    let reinvoke = webhook_only
        .iter()
        .any(|(t, _)| !t.labels.is_empty() || !t.annotations.is_empty());
    json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": options.name},
        "spec": {
            // A policy that fails to evaluate for a required template must not admit the Pod
            // without it; with only best-effort templates, it must not refuse one.
            "failurePolicy": if required { "Fail" } else { "Ignore" },
            // Run again after the webhook changed the Pod only when a template the webhook
            // serves adds labels or annotations, which a policy template may select on or read
            // (every mutation adds only what is missing, so a second run adds nothing twice);
            // otherwise the second evaluation is pure cost on every Pod CREATE.
            "reinvocationPolicy": if reinvoke { "IfNeeded" } else { "Never" },
            "matchConstraints": {
                "resourceRules": pod_create_rules(),
                "namespaceSelector": {"matchExpressions": namespace_exclusions()},
            },
            "variables": template_containers(ordered)
                .into_iter()
                .chain([json!({
                    "name": SERVICE_ACCOUNT_VOLUME_VARIABLE,
                    "expression": service_account_volume,
                })])
                .collect::<Vec<Value>>(),
            "mutations": mutations,
        },
    })
}

/// The policy's variable naming the containers the templates that select the Pod add.
const TEMPLATE_CONTAINERS_VARIABLE: &str = "templateContainers";
/// That variable, as the mutations read it.
const TEMPLATE_CONTAINERS: &str = "variables.templateContainers";

/// The policy's variable naming the volume whose mount the ServiceAccount admission plugin
/// appends to each container; empty when there is none.
const SERVICE_ACCOUNT_VOLUME_VARIABLE: &str = "serviceAccountVolume";
/// That variable, as the mutations read it.
const SERVICE_ACCOUNT_VOLUME: &str = "variables.serviceAccountVolume";

/// The CEL string naming the volume whose token mount the ServiceAccount admission plugin
/// appends to every container without a mount at the token's path, as `plan` finds it
/// (`Pod::service_account_volume`): the first volume named `kube-api-access-*` that is not a
/// template's, when it holds a token and the Pod does not turn the token off; else `""`.
fn service_account_volume_cel(ordered: &[&Arc<CompiledTemplate>]) -> String {
    let template_volumes = cel_list(
        ordered
            .iter()
            .flat_map(|t| t.volumes.iter().map(|i| i.key.as_str()))
            .collect::<BTreeSet<&str>>()
            .into_iter(),
    );
    format!(
        "!object.spec.?automountServiceAccountToken.orValue(true) ? \"\" : (object.spec.?volumes.orValue([]).filter(v, v.?name.orValue(\"\").startsWith({prefix}) && !(v.?name.orValue(\"\") in {template_volumes})).map(v, v.?projected.?sources.orValue([]).exists(s, has(s.serviceAccountToken)) ? v.?name.orValue(\"\") : \"\") + [\"\"])[0]",
        prefix = cel_string(TOKEN_VOLUME_PREFIX),
    )
}

/// `item` (a container a template adds) as the CEL value the policy adds, with the
/// ServiceAccount token's mount appended to its mounts exactly as the ServiceAccount admission
/// plugin would append it when the API server runs it again after the policy: so the policy's
/// Pod is final, and no webhook or policy is called again for the plugin's change. In the
/// item's own value rather than an operation of its own, since the API server turns each
/// operation into JSON and applies it on the encoded Pod. Without a token mount when the
/// container mounts something at the token's path itself (volume mounts hold no placeholder).
fn item_value(item: &Item) -> String {
    let fields: Vec<(&str, String)> = match &item.body {
        Node::Fixed(fixed) => match fixed.value().as_object() {
            Some(fields) => fields
                .iter()
                .map(|(key, value)| (key.as_str(), cel_json(value)))
                .collect(),
            None => return cel_node(&item.body),
        },
        Node::Object(fields) => fields
            .iter()
            .map(|(key, node)| (key.as_str(), cel_node(node)))
            .collect(),
        _ => return cel_node(&item.body),
    };
    let mount = cel_object(
        [
            ("name", SERVICE_ACCOUNT_VOLUME.to_owned()),
            ("readOnly", "true".to_owned()),
            ("mountPath", cel_string(SERVICE_ACCOUNT_MOUNT_PATH)),
        ]
        .into_iter(),
    );
    let mounts = fields.iter().find(|(key, _)| *key == "volumeMounts");
    if mounts.is_some() && mounts_at_token_path(&item.body) {
        return cel_node(&item.body);
    }
    let mut entries: Vec<String> = fields
        .iter()
        .map(|(key, value)| {
            if *key == "volumeMounts" {
                cel_entry(
                    key,
                    &format!("{value} + ({SERVICE_ACCOUNT_VOLUME} == \"\" ? [] : [dyn({mount})])"),
                )
            } else {
                cel_entry(key, value)
            }
        })
        .collect();
    if mounts.is_none() {
        entries.push(format!(
            "?\"volumeMounts\": ({SERVICE_ACCOUNT_VOLUME} == \"\" ? optional.none() : optional.of(dyn([dyn({mount})])))"
        ));
    }
    format!("{{{}}}", entries.join(", "))
}

/// Whether a container a template adds mounts something at the token's path itself (the
/// ServiceAccount admission plugin then mounts nothing there).
fn mounts_at_token_path(body: &Node) -> bool {
    let mounts = match body {
        Node::Fixed(fixed) => fixed.value().get("volumeMounts"),
        Node::Object(fields) => fields.iter().find_map(|(key, node)| match node {
            Node::Fixed(fixed) if key == "volumeMounts" => Some(fixed.value()),
            _ => None,
        }),
        _ => None,
    };
    mounts
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(SERVICE_ACCOUNT_MOUNT_PATH))
}

/// The CEL list of the container names that the templates of `ordered` selecting the Pod add:
/// `appContainers` leaves those alone, as `plan` leaves alone what it recognises as a
/// template's among those selecting the Pod. Every template's names were left alone, so an
/// app container named like the container of a template that does not select the Pod lost a
/// required template's env (`plan` recognises by content too; here, by name).
///
/// The API server compiles no CEL expression over 100,000 code points ([`MAX_EXPRESSION`]
/// here, with room), and each template adds a few hundred: the list is cut into variables
/// `templateContainers0`, `templateContainers1`, … of at most that much, which the variable
/// itself adds up (one variable when it fits). Found at 500 templates, where the policy was
/// refused: "expression code point size exceeds limit".
fn template_containers(ordered: &[&Arc<CompiledTemplate>]) -> Vec<Value> {
    let parts: Vec<String> = ordered
        .iter()
        .filter(|t| !t.containers.is_empty())
        .map(|t| {
            let names = cel_list(t.containers.iter().map(|i| i.key.as_str()));
            let mut selects = vec![
                t.namespace_selector.cel(NAMESPACE_LABELS),
                t.pod_selector.cel(LABELS),
            ];
            selects.retain(|c| c != "true");
            if selects.is_empty() {
                names
            } else {
                format!("({} ? {names} : [])", selects.join(" && "))
            }
        })
        .collect();
    // A list of the parts, flattened: a chain of `+` as long nests as deep, and the API
    // server refused one of 296 templates ("max recursion depth exceeded").
    let mut chunks: Vec<Vec<String>> = Vec::new();
    let mut size = 0;
    for part in parts {
        match chunks.last_mut() {
            Some(chunk) if size + part.len() + 16 <= MAX_EXPRESSION => {
                size += part.len() + 4;
                chunk.push(part);
            }
            _ => {
                size = part.len() + 16;
                chunks.push(vec![part]);
            }
        }
    }
    let mut chunks: Vec<String> = chunks
        .into_iter()
        .map(|mut parts| {
            if parts.len() == 1 {
                parts.remove(0)
            } else {
                format!("[{}].flatten()", parts.join(",\n  "))
            }
        })
        .collect();
    let variable =
        |name: String, expression: String| json!({"name": name, "expression": expression});
    match chunks.len() {
        0 => vec![variable(
            TEMPLATE_CONTAINERS_VARIABLE.to_owned(),
            "[]".to_owned(),
        )],
        1 => vec![variable(
            TEMPLATE_CONTAINERS_VARIABLE.to_owned(),
            chunks.remove(0),
        )],
        count => {
            let sum = (0..count)
                .map(|i| format!("variables.{TEMPLATE_CONTAINERS_VARIABLE}{i}"))
                .collect::<Vec<_>>()
                .join(" + ");
            chunks
                .into_iter()
                .enumerate()
                .map(|(i, chunk)| variable(format!("{TEMPLATE_CONTAINERS_VARIABLE}{i}"), chunk))
                .chain([variable(TEMPLATE_CONTAINERS_VARIABLE.to_owned(), sum)])
                .collect()
        }
    }
}

/// The longest CEL expression the operator writes, in bytes (the API server's limit is
/// 100,000 code points; these expressions are ASCII but for template values).
pub const MAX_EXPRESSION: usize = 90_000;

/// The length, in code points, of the longest CEL `expression` in `object` (a policy, its
/// binding, …), as the API server measures it against its limit.
pub fn longest_expression(object: &Value) -> usize {
    match object {
        Value::Object(fields) => fields
            .iter()
            .map(|(key, value)| match (key.as_str(), value) {
                ("expression", Value::String(text)) => text.chars().count(),
                _ => longest_expression(value),
            })
            .max()
            .unwrap_or(0),
        Value::Array(items) => items.iter().map(longest_expression).max().unwrap_or(0),
        _ => 0,
    }
}

/// Per template of `served` (in application order), the round of the proof that shows it.
///
/// The proof runs every template's mutation on one Pod, without their selection, and a
/// mutation adds nothing where an item of its name is already there: a template that adds a
/// container, init container or volume named like one an earlier template adds would show the
/// earlier one's item in its place, and its presence would be learned from another template's
/// content (a Pod carrying the earlier one would pass for carrying it, and skip the webhook or
/// the guard). So it goes to the first round where its names are free, a dry-run Pod of its own.
fn proof_rounds(served: &[Arc<CompiledTemplate>]) -> Vec<usize> {
    // Per round, the container (and init container) names and the volume names taken.
    let mut taken: Vec<(BTreeSet<&str>, BTreeSet<&str>)> = Vec::new();
    served
        .iter()
        .map(|template| {
            let containers: Vec<&str> = template
                .containers
                .iter()
                .chain(&template.init_containers)
                .map(|i| i.key.as_str())
                .collect();
            let volumes: Vec<&str> = template.volumes.iter().map(|i| i.key.as_str()).collect();
            let free = |(c, v): &(BTreeSet<&str>, BTreeSet<&str>)| {
                !containers.iter().any(|n| c.contains(n)) && !volumes.iter().any(|n| v.contains(n))
            };
            let round = match taken.iter().position(free) {
                Some(round) => round,
                None => {
                    taken.push(Default::default());
                    taken.len() - 1
                }
            };
            if let Some((c, v)) = taken.get_mut(round) {
                c.extend(&containers);
                v.extend(&volumes);
            }
            round
        })
        .collect()
}

/// The CEL condition that the proof Pod at hand is the one of `round`.
fn proof_round_condition(round: usize) -> String {
    format!(
        "{ANNOTATIONS}[?{}].orValue(\"0\") == {}",
        cel_string(POLICY_PROOF_ROUND_ANNOTATION),
        cel_string(&round.to_string())
    )
}

/// 16 hex digits of a SHA-256 naming a version of what the operator applies: its `rules`
/// (mutations or validations) under `options`.
fn version_hash(options: &PolicyOptions, rules: &[Value]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(options.name.as_bytes());
    hasher.update(options.operator_namespace.as_bytes());
    hasher.update(Value::Array(rules.to_vec()).to_string().as_bytes());
    hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the dry-run Pod carries to ask whether the API server runs the policy itself (not its
/// proof) at version `hash`.
fn live_token(hash: &str) -> String {
    format!("{hash}-live")
}

/// The live policy's mutations: each applies outside the operator's namespace, and there
/// only to the dry-run Pod asking for `token` (this version), which the last one marks.
///
/// Neither is a mutation or a match condition of its own, for the time of every Pod CREATE
/// the policy sees: after each mutation the API server encodes the Pod, applies the patch,
/// decodes and defaults it again, even for an empty patch ([`batch`]); and it evaluates the
/// match conditions again, on a fresh CEL copy of the Pod, in the second pass of the
/// admission chain that follows any mutation, before it finds the policy is not to run again.
fn live_mutations(options: &PolicyOptions, mutations: Vec<Value>, token: &str) -> Vec<Value> {
    let outside = outside_the_operators_namespace_cel(options, token);
    let marker = marker_expression(token, true);
    let mut live: Vec<String> = mutations
        .iter()
        .map(|mutation| {
            let expression = mutation["jsonPatch"]["expression"]
                .as_str()
                .unwrap_or_default();
            format!("({outside})\n? ({expression})\n: []")
        })
        .collect();
    match live.last_mut() {
        Some(last) if last.len() + marker.len() + 8 <= MAX_EXPRESSION => {
            *last = format!("({last})\n+ ({marker})");
        }
        _ => live.push(marker),
    }
    live.into_iter().map(patch_mutation).collect()
}

/// What marks the dry-run Pod asking for `token`, so the operator knows the API server loaded
/// this version: the live policy's last mutation ends with it, the proof's last mutation is
/// it. `only_asking`: the policy also sees other Pods.
fn marker_expression(token: &str, only_asking: bool) -> String {
    let mark = json_patch(
        &cel_string(&format!(
            "/metadata/annotations/{}",
            pointer_token(POLICY_PROVEN_ANNOTATION)
        )),
        &cel_string(token),
    );
    if only_asking {
        format!(
            "{ANNOTATIONS}[?{}].orValue(\"\") == {} ? [{mark}] : []",
            cel_string(POLICY_PROOF_ANNOTATION),
            cel_string(token)
        )
    } else {
        format!("[{mark}]")
    }
}

/// The match conditions of a policy that leaves the operator's namespace alone, except the
/// dry-run Pod asking for `token` (a version of this policy).
fn outside_the_operators_namespace(options: &PolicyOptions, token: &str) -> Value {
    json!([{
        "name": "not-the-operators-namespace",
        "expression": outside_the_operators_namespace_cel(options, token),
    }])
}

/// That condition's CEL.
fn outside_the_operators_namespace_cel(options: &PolicyOptions, token: &str) -> String {
    format!(
        "request.namespace != {} || {ANNOTATIONS}[?{}].orValue(\"\") == {}",
        cel_string(&options.operator_namespace),
        cel_string(POLICY_PROOF_ANNOTATION),
        cel_string(token)
    )
}

/// A ValidatingAdmissionPolicy `name` over Pod CREATE, outside the namespaces never injected
/// and those `excluded`, and its binding with `action` (`Deny` or `Warn`).
fn validating_policy(
    name: &str,
    failure_policy: &str,
    excluded: &[&str],
    match_conditions: Option<Value>,
    validations: Vec<Value>,
    action: &str,
) -> (Value, Value) {
    let mut policy = json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": failure_policy,
            "matchConstraints": {
                "resourceRules": pod_create_rules(),
                "namespaceSelector": {
                    "matchExpressions": selection::namespace_exclusions(excluded),
                },
            },
            "validations": validations,
        },
    });
    if let Some(conditions) = match_conditions {
        policy["spec"]["matchConditions"] = conditions;
    }
    (policy, validating_binding(name, action))
}

/// The ValidatingAdmissionPolicyBindings of the warnings policy `name`: one per namespace
/// group of the templates `served` ([`namespace_groups`]), else one for every namespace.
fn warnings_bindings(
    options: &PolicyOptions,
    served: &[Arc<CompiledTemplate>],
    name: &str,
) -> Vec<Value> {
    let Some(groups) = namespace_groups(options, served) else {
        return vec![validating_binding(name, "Warn")];
    };
    group_bindings("ValidatingAdmissionPolicyBinding", name, groups)
        .map(|mut binding| {
            binding["spec"]["validationActions"] = json!(["Warn"]);
            binding
        })
        .collect()
}

/// The ValidatingAdmissionPolicyBinding of the policy `name`, with `action` (`Deny` or `Warn`).
fn validating_binding(name: &str, action: &str) -> Value {
    json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": [action]},
    })
}

/// Pod CREATE, the only request a policy mutates.
fn pod_create_rules() -> Value {
    json!([{
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods"],
    }])
}

fn binding(policy: &str) -> Value {
    json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy},
    })
}

/// How many namespace groups the policy's bindings tell apart at most, one binding each
/// ([`namespace_binding_name`]); the chart grants the operator these names.
pub const NAMESPACE_BINDING_SLOTS: usize = 8;

/// The name of the binding of the policy `name` for namespace group `slot`.
pub fn namespace_binding_name(name: &str, slot: usize) -> String {
    format!("{name}-namespaces-{slot}")
}

/// The policy's bindings. The API server runs a policy on every Pod its binding matches, and a
/// mutation that changes nothing still costs a Pod a round through the codec (0.6 ms here,
/// where a Pod CREATE takes 3): so when every template served selects namespaces, and no
/// namespace can match two of their selectors (at most [`NAMESPACE_BINDING_SLOTS`] of them),
/// each selector gets a binding of its own, matching the namespaces it selects but the
/// operator's, and the binding named like the policy matches only the operator's namespace,
/// where the dry-run Pod asking whether the API server runs this version is. Otherwise that
/// binding matches every namespace the policy does. A Pod in a namespace no template selects
/// then never reaches the policy, as it never reaches a webhook entry; the Pods of the others
/// meet the policy once, as before.
fn policy_bindings(options: &PolicyOptions, served: &[Arc<CompiledTemplate>]) -> Vec<Value> {
    let Some(groups) = namespace_groups(options, served) else {
        return vec![binding(&options.name)];
    };
    let name = &options.name;
    let mut bindings = vec![bound_to(
        "MutatingAdmissionPolicyBinding",
        name,
        name,
        json!({"matchLabels": {NAMESPACE_NAME_LABEL: options.operator_namespace}}),
    )];
    bindings.extend(group_bindings(
        "MutatingAdmissionPolicyBinding",
        name,
        groups,
    ));
    bindings
}

/// The bindings (of `kind`) of the policy `name` to the namespace groups' selectors `groups`
/// ([`namespace_groups`]), each in its slot ([`namespace_binding_name`]).
fn group_bindings<'a>(
    kind: &'a str,
    name: &'a str,
    groups: Vec<Value>,
) -> impl Iterator<Item = Value> + 'a {
    groups.into_iter().enumerate().map(move |(slot, selector)| {
        bound_to(kind, &namespace_binding_name(name, slot), name, selector)
    })
}

/// The namespace selectors of the templates `served`, each with the operator's namespace left
/// out, as the bindings of the policies serving them match namespaces ([`policy_bindings`]);
/// `None` when a template selects every namespace, two selectors may match one namespace (the
/// policy would run twice on its Pods), or there are more than [`NAMESPACE_BINDING_SLOTS`].
fn namespace_groups(
    options: &PolicyOptions,
    served: &[Arc<CompiledTemplate>],
) -> Option<Vec<Value>> {
    let mut selectors: Vec<&Selector> = Vec::new();
    for template in served {
        let selector = template.selecting().namespace_selector;
        if selector.is_empty() {
            return None;
        }
        if !selectors.contains(&selector) {
            selectors.push(selector);
        }
    }
    let disjoint = selectors
        .iter()
        .enumerate()
        .all(|(at, a)| selectors[at + 1..].iter().all(|b| a.disjoint(b)));
    if !disjoint || selectors.len() > NAMESPACE_BINDING_SLOTS {
        return None;
    }
    let groups = selectors.into_iter().map(|selector| {
        let mut selector = selector.to_label_selector();
        selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(vec![options.operator_namespace.clone()]),
            });
        json!(selector)
    });
    Some(groups.collect())
}

/// The binding (of `kind`) `name` of the policy `policy` to the namespaces `namespace_selector`
/// matches.
fn bound_to(kind: &str, name: &str, policy: &str, namespace_selector: Value) -> Value {
    json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            "policyName": policy,
            "matchResources": {"namespaceSelector": namespace_selector},
        },
    })
}

/// The name of the proof policy (and binding) of the policy `name`.
pub fn proof_name(name: &str) -> String {
    format!("{name}-proof")
}

/// The API server accepts a policy whose expressions fail only when they run: a mistake would
/// show as an error on every matching Pod. The proof policy runs every template's additions,
/// without their selection, on a dry-run Pod of the operator's namespace that carries the
/// policy's hash, and nothing else: it fails closed, so an expression that errs fails the dry
/// run, and its last mutation marks the Pod, so the operator knows this version ran.
fn proof_policy(
    options: &PolicyOptions,
    hash: &str,
    variables: Value,
    mut mutations: Vec<Value>,
) -> (Value, Value) {
    mutations.push(patch_mutation(marker_expression(hash, false)));
    let name = proof_name(&options.name);
    let policy = json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": pod_create_rules(),
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: options.operator_namespace}},
            },
            "matchConditions": [{
                "name": "proof-of-this-version",
                "expression": format!(
                    "{ANNOTATIONS}[?{}].orValue(\"\") == {}",
                    cel_string(POLICY_PROOF_ANNOTATION),
                    cel_string(hash)
                ),
            }],
            "variables": variables,
            "mutations": mutations,
        },
    });
    (policy, binding(&name))
}

/// The dry-run Pod the proof policy of `compiled` applies to (`live`: the policy itself, to
/// learn whether the API server loaded it): annotated with its hash, with labels and
/// annotations for placeholders to read and one container of its own, named so that no
/// template's name clashes with it.
pub fn proof_pod(compiled: &CompiledPolicy, live: bool) -> Value {
    let token = if live {
        live_token(&compiled.hash)
    } else {
        compiled.hash.clone()
    };
    let taken: BTreeSet<&str> = compiled
        .served
        .iter()
        .flat_map(|t| t.containers.iter().chain(&t.init_containers))
        .map(|i| i.key.as_str())
        .collect();
    let app = (0..)
        .map(|n| format!("policy-proof-{n}"))
        .find(|name| !taken.contains(name.as_str()))
        .unwrap_or_default();
    dry_run_pod(
        json!({
            "generateName": "sidecar-injector-policy-proof-",
            "labels": {"app": "policy-proof"},
            "annotations": {POLICY_PROOF_ANNOTATION: token},
        }),
        &app,
        "policy-proof.invalid/none:1",
    )
}

/// A dry-run Pod of the operator's namespace with `metadata` and one container of its own,
/// that passes the `restricted` Pod Security Standard: a namespace enforcing it refused the
/// proof Pods, and a required template was left unguarded. The settings are the Pod's and its
/// own container's, never a template's: a template's containers keep their own, so the proof
/// fails when they break the namespace's standard, as the template's Pods would.
pub(crate) fn dry_run_pod(metadata: Value, container: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "securityContext": {
                "runAsNonRoot": true,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": container,
                "image": image,
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsUser": 65534,
                },
            }],
        },
    })
}

/// The dry-run Pod of round `round` of the proof of `compiled` (see [`proof_rounds`]).
pub fn proof_round_pod(compiled: &CompiledPolicy, round: usize) -> Value {
    let mut pod = proof_pod(compiled, false);
    if round > 0
        && let Some(annotations) = pod
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
    {
        annotations.insert(
            POLICY_PROOF_ROUND_ANNOTATION.to_owned(),
            Value::from(round.to_string()),
        );
    }
    pod
}

/// Whether the live dry-run Pod `stored` shows the API server running the policy of
/// `compiled`.
pub fn runs_live(compiled: &CompiledPolicy, stored: &Value) -> bool {
    stored
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(POLICY_PROVEN_ANNOTATION))
        .and_then(Value::as_str)
        == Some(live_token(&compiled.hash).as_str())
}

/// Why the dry-run Pod `stored`, of round `round`, does not prove `compiled`: the proof policy
/// did not run to its end, or the containers or volumes of a template of that round are not
/// there. `None` when it proves it.
pub fn proof_problem(compiled: &CompiledPolicy, round: usize, stored: &Value) -> Option<String> {
    let proven = stored
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(POLICY_PROVEN_ANNOTATION))
        .and_then(Value::as_str);
    if proven != Some(compiled.hash.as_str()) {
        return Some(format!(
            "the proof policy did not run on the dry-run Pod (its annotation {POLICY_PROVEN_ANNOTATION} is {proven:?}, want {:?})",
            compiled.hash
        ));
    }
    let of_round: Vec<&Arc<CompiledTemplate>> = compiled
        .served
        .iter()
        .zip(&compiled.proof_rounds)
        .filter(|&(_, &r)| r == round)
        .map(|(template, _)| template)
        .collect();
    // Each mutation records its template: exactly this round's must have run.
    let recorded: BTreeSet<&str> = stored
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(INJECTED_ANNOTATION))
        .and_then(Value::as_str)
        .map(|record| record::names(record).collect())
        .unwrap_or_default();
    let expected: BTreeSet<&str> = of_round.iter().map(|t| t.name.as_str()).collect();
    if recorded != expected {
        return Some(format!(
            "the dry-run Pod of round {round} of the proof records the templates {recorded:?}, want {expected:?}"
        ));
    }
    let added = Added::of(stored);
    of_round
        .into_iter()
        .find_map(|template| added.problem(template, stored))
}

/// The names of what the dry-run Pod of a proof holds, by list.
struct Added<'s> {
    containers: BTreeSet<&'s str>,
    init_containers: BTreeSet<&'s str>,
    volumes: BTreeSet<&'s str>,
}

impl<'s> Added<'s> {
    fn of(stored: &'s Value) -> Self {
        let names = |field: &str| -> BTreeSet<&'s str> {
            stored
                .pointer(&format!("/spec/{field}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|item| item.get("name").and_then(Value::as_str))
                .collect()
        };
        Added {
            containers: names("containers"),
            init_containers: names("initContainers"),
            volumes: names("volumes"),
        }
    }

    /// Why the dry-run Pod `stored` shows `template` was not applied as the policy applies
    /// it: an item missing, or a volume stored otherwise than predicted.
    fn problem(&self, template: &CompiledTemplate, stored: &Value) -> Option<String> {
        let missing = template
            .containers
            .iter()
            .filter(|i| !self.containers.contains(i.key.as_str()))
            .chain(
                template
                    .init_containers
                    .iter()
                    .filter(|i| !self.init_containers.contains(i.key.as_str())),
            )
            .chain(
                template
                    .volumes
                    .iter()
                    .filter(|i| !self.volumes.contains(i.key.as_str())),
            )
            .map(|i| i.key.as_str())
            .next();
        if let Some(name) = missing {
            return Some(format!(
                "SidecarTemplate {:?}: the proof policy did not add {name:?} to the dry-run Pod",
                template.name
            ));
        }
        volume_problem(template, stored)
    }
}

/// The policy took a Pod's own volume by this name for the template's when it equals the
/// prediction: the API server must store each of `template`'s volumes so.
fn volume_problem(template: &CompiledTemplate, stored: &Value) -> Option<String> {
    for item in &template.volumes {
        let (Some(predicted), Some(stored)) = (
            predicted_volume(item),
            stored
                .pointer("/spec/volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|v| v.get("name").and_then(Value::as_str) == Some(item.key.as_str())),
        ) else {
            continue;
        };
        if &predicted != stored {
            return Some(format!(
                "SidecarTemplate {:?}: the API server stored volume {:?} as {stored}, the policy expected {predicted}",
                template.name, item.key
            ));
        }
    }
    None
}

/// Why `template` cannot be served by the policy, given the templates applied after it.
fn webhook_only_reason(
    template: &CompiledTemplate,
    later: &[&Arc<CompiledTemplate>],
) -> Option<WebhookOnly> {
    if template
        .app
        .as_ref()
        .is_some_and(|a| !a.env_from.is_empty())
    {
        return Some(WebhookOnly::AppEnvFrom);
    }
    if let Some((label, added_by)) = selects_added_by(template, later) {
        return Some(WebhookOnly::SelectsOnLaterLabel { label, added_by });
    }
    reads_added_by(template, later)
        .map(|(key, added_by)| WebhookOnly::ReadsLaterMetadata { key, added_by })
}

/// A label the pod selector of `template` reads that one of `others` adds, and which one.
fn selects_added_by(
    template: &CompiledTemplate,
    others: &[&Arc<CompiledTemplate>],
) -> Option<(String, String)> {
    for key in template.pod_selector.keys() {
        if let Some(by) = others
            .iter()
            .find(|t| t.labels.iter().any(|(k, _)| k == key))
        {
            return Some((key.to_owned(), by.name.clone()));
        }
    }
    None
}

/// Whether `a` and `b` may select one Pod: not when their namespace or pod selectors ask for
/// different values of one label.
fn may_select_alike(a: &CompiledTemplate, b: &CompiledTemplate) -> bool {
    !(a.namespace_selector.disjoint(&b.namespace_selector)
        || a.pod_selector.disjoint(&b.pod_selector))
}

/// A label or annotation a placeholder of `template` reads that one of `others` adds, and
/// which one.
fn reads_added_by(
    template: &CompiledTemplate,
    others: &[&Arc<CompiledTemplate>],
) -> Option<(String, String)> {
    for read in &template.metadata_reads {
        let (key, adds): (&str, fn(&CompiledTemplate, &str) -> bool) = match read {
            crate::placeholder::MetadataKey::Label(key) => {
                (key, |t, k| t.labels.iter().any(|(l, _)| l == k))
            }
            crate::placeholder::MetadataKey::Annotation(key) => {
                (key, |t, k| t.annotations.iter().any(|(a, _)| a == k))
            }
        };
        if let Some(by) = others.iter().find(|t| adds(t, key)) {
            return Some((key.to_owned(), by.name.clone()));
        }
    }
    None
}

/// CEL conditions, per template the policy serves, that hold when the Pod carries the
/// template's containers, init containers and volumes exactly as the API server stores what the
/// policy adds: `proven` holds the proof's dry-run Pods, one per round (each template is read
/// from its round's, where its items are its own), so the API server's defaults are learned
/// from the API server itself rather than guessed. A placeholder's string stays a CEL
/// expression, evaluated on the Pod at hand. Only the ServiceAccount token's mounts are
/// allowed beside the template's; any other difference (an extra field, another image, one
/// more env var) makes the condition false.
///
/// The webhook entries use them to skip Pods the policy served (see
/// `webhook_config`): a content check, never a claim, so a look-alike still reaches the
/// webhook. Templates that add no container and no volume get none (nothing to recognise them
/// by), and neither does a template whose stored items cannot be matched to its own.
pub fn presence_conditions(
    compiled: &CompiledPolicy,
    proven: &[Value],
) -> BTreeMap<String, String> {
    let mut conditions = BTreeMap::new();
    let every_template = compiled
        .served
        .iter()
        .chain(compiled.webhook_only.iter().map(|(t, _)| t));
    let template_init = cel_list(init_container_names(every_template).into_iter());
    'templates: for (template, &round) in compiled.served.iter().zip(&compiled.proof_rounds) {
        let Some(proven) = proven.get(round) else {
            continue;
        };
        let mut terms = Vec::new();
        for (list, items, container) in [
            ("containers", &template.containers, true),
            ("initContainers", &template.init_containers, true),
            ("volumes", &template.volumes, false),
        ] {
            for item in items {
                let stored = proven
                    .pointer(&format!("/spec/{list}"))
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|v| v.get("name").and_then(Value::as_str) == Some(item.key.as_str()));
                let Some(stored) = stored else {
                    continue 'templates;
                };
                let term = if container {
                    container_presence(list, &item.body, stored, &template_init, &cel_text)
                } else {
                    // Volumes hold no placeholder: the stored volume is the whole expectation.
                    // The name first, as for containers: comparing every volume of the Pod
                    // with a map literal cost a sixth of the warnings policy's validation.
                    Some(format!(
                        "object.spec.?{list}.orValue([]).exists(v, v.?name.orValue(\"\") == {} && v == {})",
                        cel_string(&item.key),
                        cel_json(stored)
                    ))
                };
                let Some(term) = term else {
                    continue 'templates;
                };
                terms.push(term);
            }
        }
        if !terms.is_empty() {
            // The policy records each template it applies: a copy of an injected Pod without
            // the entry has not been through it, and may lack the rest of the template (env,
            // labels, …), which the webhook then adds, as it does alone. The entry must name
            // this version: while an edit travels, the new policy writes its entry on a copy
            // of the old version's containers (it adds the rest of a required template to any
            // Pod carrying its containers by name), and a guard accepting either version
            // took that Pod for the old version's while its record claimed the new one.
            terms.push(format!(
                "{ANNOTATIONS}[?{}].orValue(\"\").split(\",\").map(e, e.trim()).exists(e, e == {})",
                cel_string(INJECTED_ANNOTATION),
                cel_string(&Applied::of(template).to_string())
            ));
            conditions.insert(template.name.clone(), terms.join(" && "));
        }
    }
    conditions
}

/// Every init container name `templates` add (the webhook's too): one of these in front of a
/// native sidecar is a template's, which `plan` lets stand there, and a template's go after the
/// leading ones.
fn init_container_names<'t>(
    templates: impl Iterator<Item = &'t Arc<CompiledTemplate>>,
) -> BTreeSet<&'t str> {
    templates
        .flat_map(|t| t.init_containers.iter().map(|i| i.key.as_str()))
        .collect()
}

/// The namespaces no template injects into, as the webhook entries exclude them.
/// (The operator's own namespace is excluded by a match condition, which lets its dry-run Pod
/// through.)
fn namespace_exclusions() -> Value {
    json!(selection::namespace_exclusions(&[]))
}

/// The CEL expression of one template's mutation: its JSONPatch operations when it selects
/// the Pod (`selection`; the proof policy leaves it out) and none of its containers and
/// volumes is there yet, else `[]`.
///
/// A Pod that has containers and init containers of a required template by name gets the
/// rest of it (env, mounts, pull secrets, labels, annotations, the record), as `plan` gives it
/// to a copy of an injected Pod, when each of them holds what this version sets
/// ([`carries_this_version`]); otherwise it gets nothing, and the guard (or, with `auto`, the
/// webhook) refuses it as `plan` refuses a look-alike, unless it is an earlier version's whole.
/// A best-effort template's look-alike must get nothing, so such a Pod is left to the webhook.
fn mutation(
    template: &CompiledTemplate,
    template_containers: &str,
    template_init: &BTreeSet<&str>,
    selection: bool,
) -> String {
    let mut selected = if selection {
        selection_cel(template.selecting())
    } else {
        Vec::new()
    };
    selected.retain(|c| c != "true");
    // A required template adds each of its containers the Pod lacks, as `plan` does: one the
    // Pod has by name is either the template's (kept) or a look-alike, which the guard or the
    // webhook refuses anyway. A best-effort one is skipped whole when the Pod has any of them
    // by name: no webhook may stand behind to tell a copy from a look-alike.
    let each_missing = selection && template.failure_policy == FailurePolicy::Fail;
    let (conditions, volumes) = presence_conditions_of(template, each_missing);
    // One operation list per line, so that the policy reads in `kubectl get -o yaml`.
    let all = item_ops(template, each_missing, template_init, false)
        .into_iter()
        .chain(rest_ops(template, template_containers, false))
        .collect::<Vec<_>>()
        .join("\n  + ");
    let mut body = if conditions.is_empty() {
        all
    } else {
        format!("({})\n? {all}\n: []", conditions.join("\n  && "))
    };
    if let Some(volumes) = volumes {
        body = format!("({volumes})\n? ({body})\n: []");
    }
    if selected.is_empty() {
        body
    } else {
        format!("({})\n? ({body})\n: []", selected.join("\n  && "))
    }
}

/// The conditions on what the Pod already has under which [`mutation`] adds `template`, and
/// apart, the one on its volumes (which holds for every branch, so it goes outermost).
fn presence_conditions_of(
    template: &CompiledTemplate,
    each_missing: bool,
) -> (Vec<String>, Option<String>) {
    let mut conditions = Vec::new();
    let container_names: Vec<&str> = template
        .containers
        .iter()
        .chain(&template.init_containers)
        .map(|i| i.key.as_str())
        .collect();
    if each_missing {
        conditions.push(carries_this_version(template));
    } else if !container_names.is_empty() {
        let names = cel_list(container_names.iter().copied());
        conditions.push(format!(
            "!object.spec.containers.exists(c, c.name in {names}) && !object.spec.?initContainers.orValue([]).exists(c, c.name in {names})"
        ));
    }
    conditions.retain(|c| c != "true");
    if template.volumes.is_empty() {
        return (conditions, None);
    }
    // A volume of the Pod's own by one of the template's names must be the template's, as the
    // API server stores it (`plan` then leaves it and injects the rest); where that cannot be
    // told, the Pod is left to the webhook or the guard.
    let each: Vec<String> = template
        .volumes
        .iter()
        .map(|i| match predicted_volume(i) {
            Some(stored) => format!(
                "(v.name != {} || v == {})",
                cel_string(&i.key),
                cel_json(&stored)
            ),
            None => format!("v.name != {}", cel_string(&i.key)),
        })
        .collect();
    let volumes = format!(
        "object.spec.?volumes.orValue([]).all(v, {})",
        each.join(" && ")
    );
    (conditions, Some(volumes))
}

/// The operations adding the template's own items: its init containers, containers (each
/// only where the Pod lacks it by name, when `each_missing`) and volumes. In a batch
/// (`batched`), the batch creates the volume list.
fn item_ops(
    template: &CompiledTemplate,
    each_missing: bool,
    template_init: &BTreeSet<&str>,
    batched: bool,
) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    let missing = |list: &[Item]| -> Vec<Option<String>> {
        list.iter()
            .map(|i| each_missing.then(|| missing_container(&i.key)))
            .collect()
    };
    if !template.init_containers.is_empty() {
        items.extend(init_container_ops(
            &template.init_containers,
            &missing(&template.init_containers),
            template_init,
        ));
    }
    if !template.containers.is_empty() {
        let missing = missing(&template.containers);
        for (item, missing) in template.containers.iter().zip(&missing) {
            items.push(added_item("\"/spec/containers/-\"", item, missing.as_ref()));
        }
    }
    if !template.volumes.is_empty() {
        // Only those the Pod lacks: one it has is the template's (the volumes' condition).
        let adds: Vec<String> = template
            .volumes
            .iter()
            .map(|i| {
                format!(
                    "(object.spec.?volumes.orValue([]).exists(v, v.name == {}) ? [] : [{}])",
                    cel_string(&i.key),
                    json_patch("\"/spec/volumes/-\"", &cel_node(&i.body))
                )
            })
            .collect();
        let adds = adds.join(" + ");
        items.push(if batched {
            adds
        } else {
            format!("{} + {adds}", create_list("volumes"))
        });
    }
    items
}

/// The operations adding the rest of the template: pull secrets, env and mounts into the app
/// containers (never `template_containers`, a CEL list), labels, annotations and its record
/// entry, each only where missing. In a batch (`batched`), the batch creates the metadata maps
/// and writes the record.
fn rest_ops(template: &CompiledTemplate, template_containers: &str, batched: bool) -> Vec<String> {
    let mut ops: Vec<String> = Vec::new();
    if !template.image_pull_secrets.is_empty() {
        let secrets = template
            .image_pull_secrets
            .iter()
            .map(|s| format!("{{\"name\": {}}}", cel_string(s)))
            .collect::<Vec<_>>()
            .join(", ");
        ops.push(format!(
            "{} + [{secrets}].filter(s, !object.spec.?imagePullSecrets.orValue([]).exists(x, x.name == s[\"name\"])).map(s, {})",
            create_list("imagePullSecrets"),
            json_patch("\"/spec/imagePullSecrets/-\"", "s"),
        ));
    }
    if let Some(app) = &template.app {
        ops.extend(app_ops(app, template_containers));
    }
    if !template.labels.is_empty() {
        if !batched {
            ops.push(create_map("labels"));
        }
        ops.extend(map_ops("labels", &template.labels, LABELS, true));
    }
    // The record always goes into the annotations.
    if batched {
        ops.extend(map_ops(
            "annotations",
            &template.annotations,
            ANNOTATIONS,
            false,
        ));
    } else if template.annotations.is_empty() {
        // A Pod without annotations gets them with the record in one operation.
        ops.push(format!(
            "(has(object.metadata.annotations) ? [{}] : [{}])",
            record_op(template),
            json_patch(
                "\"/metadata/annotations\"",
                &format!(
                    "{{{}: {}}}",
                    cel_string(INJECTED_ANNOTATION),
                    cel_string(&template.entry().to_string())
                )
            )
        ));
    } else {
        ops.push(create_map("annotations"));
        ops.extend(map_ops(
            "annotations",
            &template.annotations,
            ANNOTATIONS,
            false,
        ));
        ops.push(format!("[{}]", record_op(template)));
    }
    ops
}

/// The operations adding `app`'s env and mounts to the app containers it names (all of them
/// when it names none), never to `template_containers`, where the name or path is free.
fn app_ops(app: &AppAdditions, template_containers: &str) -> Vec<String> {
    let mut targets = format!("!(object.spec.containers[i].name in {template_containers})");
    if !app.names.is_empty() {
        write!(
            targets,
            " && object.spec.containers[i].name in {}",
            cel_list(app.names.iter().map(String::as_str))
        )
        .ok();
    }
    let mut ops = Vec::new();
    for (field, key, items) in [
        ("env", "name", &app.env),
        ("volumeMounts", "mountPath", &app.volume_mounts),
    ] {
        if items.is_empty() {
            continue;
        }
        let list = cel_array(items.iter().map(|i| cel_node(&i.body)));
        let at = format!("\"/spec/containers/\" + string(i) + \"/{field}\"");
        ops.push(format!(
            "object.spec.containers.map(c, object.spec.containers.indexOf(c)).filter(i, {targets}).map(i, !has(object.spec.containers[i].{field}) ? [{}] : {list}.filter(e, !object.spec.containers[i].{field}.exists(x, x.{key} == e[\"{key}\"])).map(e, {})).flatten()",
            json_patch(&at, &list),
            json_patch(&format!("{at} + \"/-\""), "e"),
        ));
    }
    ops
}

/// Places the template's init containers after the Pod's leading init containers that are
/// templates' (`template_init`, by name) and before the Pod's own, in order, as `plan` places
/// them. Counting templates' init containers anywhere in the Pod put a template's after one of
/// the Pod's own whenever a template's stood behind it. `missing`, per item: the condition
/// under which it is added (`None`: always), each one after those added before it.
/// Each with the token's mount ([`item_value`]).
fn init_container_ops(
    items: &[Item],
    missing: &[Option<String>],
    template_init: &BTreeSet<&str>,
) -> Vec<String> {
    let first = placement::first_init_cel(&cel_list(template_init.iter().copied()));
    let mut ops = vec![create_list("initContainers")];
    for (offset, item) in items.iter().enumerate() {
        let index = format!("{first}{}", added_before(missing, offset));
        ops.push(added_item(
            &format!("\"/spec/initContainers/\" + string({index})"),
            item,
            missing.get(offset).and_then(Option::as_ref),
        ));
    }
    ops
}

/// The operation adding `item` to `spec.<list>` at `at` (a CEL JSON pointer), with the
/// token's mount ([`item_value`]); only when `missing` holds, if given.
fn added_item(at: &str, item: &Item, missing: Option<&String>) -> String {
    let ops = format!("[{}]", json_patch(at, &item_value(item)));
    match missing {
        Some(missing) => format!("({missing} ? {ops} : [])"),
        None => ops,
    }
}

/// The CEL condition that each container and init container of `template` the Pod has by name
/// holds what this version sets (`defaulted::holds_cel`). The API server re-invokes a policy
/// by name in the same request, and may load a new version between the two calls: the new
/// version then finds the containers the earlier one added, and writing its record entry and
/// its rest over them made a Pod that claimed the new version while it carried the old one.
fn carries_this_version(template: &CompiledTemplate) -> String {
    let placed = [
        ("containers", &template.containers),
        ("initContainers", &template.init_containers),
    ];
    let terms: Vec<String> = placed
        .into_iter()
        .flat_map(|(list, items)| {
            items.iter().map(move |item| {
                format!(
                    "object.spec.?{list}.orValue([]).all(c, c.name != {} || {})",
                    cel_string(&item.key),
                    holds_cel(&item.body, "c", ItemKind::Container, &cel_text)
                )
            })
        })
        .collect();
    if terms.is_empty() {
        "true".to_owned()
    } else {
        terms.join(" && ")
    }
}

/// The CEL condition that the Pod has no container or init container named `name`.
fn missing_container(name: &str) -> String {
    let name = cel_string(name);
    format!(
        "!object.spec.containers.exists(c, c.name == {name}) && !object.spec.?initContainers.orValue([]).exists(c, c.name == {name})"
    )
}

/// What to add to the index of the item at `offset`: ` + N` for the items before it, each
/// counted when its condition in `missing` holds (always when `None`); empty for none.
fn added_before(missing: &[Option<String>], offset: usize) -> String {
    let before = missing.get(..offset).unwrap_or_default();
    let always = before.iter().filter(|m| m.is_none()).count();
    let conditional: Vec<&str> = before.iter().flatten().map(String::as_str).collect();
    let mut sum = String::new();
    if always > 0 {
        sum.push_str(&format!(" + {always}"));
    }
    if !conditional.is_empty() {
        sum.push_str(&format!(
            " + size([{}].filter(b, b))",
            conditional
                .iter()
                .map(|c| format!("({c})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    sum
}

/// A template's volume as the API server stores it (`defaulted::stored_volume`), when it
/// holds no placeholder and that can be told.
fn predicted_volume(item: &Item) -> Option<Value> {
    match &item.body {
        Node::Fixed(fixed) => stored_volume(fixed.value()),
        _ => None,
    }
}

/// Creates the empty map `metadata.<field>` when the Pod has none, so that keys can be added.
fn create_map(field: &str) -> String {
    format!(
        "(has(object.metadata.{field}) ? [] : [{}])",
        json_patch(&format!("\"/metadata/{field}\""), "{}")
    )
}

/// Creates the empty list `spec.<field>` when the Pod has none, so that items can be added.
fn create_list(field: &str) -> String {
    format!(
        "(has(object.spec.{field}) ? [] : [{}])",
        json_patch(&format!("\"/spec/{field}\""), "[]")
    )
}

/// Adds each key the Pod's metadata map lacks; a templated label value that renders to an
/// invalid label value is left out, as `plan` leaves it out.
fn map_ops(field: &str, entries: &[(String, Text)], current: &str, labels: bool) -> Vec<String> {
    let mut ops = Vec::new();
    for (key, text) in entries {
        let value = match text {
            Text::Fixed(value) => cel_string(value),
            Text::Templated(template) => cel_text(template),
        };
        let add = json_patch(
            &cel_string(&format!("/metadata/{field}/{}", pointer_token(key))),
            &value,
        );
        let mut condition = format!("!({} in {current})", cel_string(key));
        if labels && matches!(text, Text::Templated(_)) {
            write!(
                condition,
                " && size({value}) <= 63 && {value}.matches({})",
                cel_string(LABEL_VALUE_PATTERN)
            )
            .ok();
        }
        ops.push(format!("({condition} ? [{add}] : [])"));
    }
    ops
}

/// Writes the template's entry into `sidecar.dev/injected` ([`record::updated_cel`]).
fn record_op(template: &CompiledTemplate) -> String {
    json_patch(
        &cel_string(&format!(
            "/metadata/annotations/{}",
            pointer_token(INJECTED_ANNOTATION)
        )),
        &record::updated_cel(template.entry()),
    )
}

fn json_patch(path: &str, value: &str) -> String {
    format!("JSONPatch{{op: \"add\", path: {path}, value: {value}}}")
}

/// A template value as a CEL literal; placeholders become string expressions.
fn cel_node(node: &Node) -> String {
    match node {
        Node::Fixed(fixed) => cel_json(fixed.value()),
        Node::Text(template) => cel_text(template),
        Node::Array(items) => cel_array(items.iter().map(cel_node)),
        Node::Object(fields) => cel_object(fields.iter().map(|(k, v)| (k.as_str(), cel_node(v)))),
    }
}

/// `{{ pod.name }}` as mutating admission sees the Pod: its name, or, since the API server
/// generates one only after mutating admission, `generateName` (as `plan` renders it).
const NAME_AT_MUTATION: &str = "(object.metadata.?name.orValue(\"\") != \"\" ? object.metadata.name : object.metadata.?generateName.orValue(\"\"))";

/// `{{ pod.name }}` as it was rendered, seen from validating admission, which runs after the
/// name was generated: `generateName` when the name is it (cut to 58 characters, as the API
/// server cuts it) followed by the 5 generated characters, else the name.
const NAME_AT_VALIDATION: &str = "(object.metadata.?generateName.orValue(\"\") != \"\" && object.metadata.?name.orValue(\"\").startsWith(size(object.metadata.generateName) > 58 ? object.metadata.generateName.substring(0, 58) : object.metadata.generateName) && size(object.metadata.?name.orValue(\"\")) == (size(object.metadata.generateName) > 58 ? 58 : size(object.metadata.generateName)) + 5 ? object.metadata.generateName : object.metadata.?name.orValue(\"\"))";

/// `expression` (built for mutating admission) for a ValidatingAdmissionPolicy: placeholders
/// of the Pod's name read it as it was when the policy rendered them. The mutation-time text
/// cannot occur inside a CEL string literal (its quotes would be escaped there).
fn at_validation(expression: &str) -> String {
    expression.replace(NAME_AT_MUTATION, NAME_AT_VALIDATION)
}

/// A string with placeholders as a CEL string expression over the Pod's metadata.
fn cel_text(template: &TemplateString) -> String {
    let parts: Vec<String> = template
        .parts()
        .map(|part| match part {
            Part::Literal(text) => cel_string(text),
            Part::Name => NAME_AT_MUTATION.to_owned(),
            Part::Namespace => "(object.metadata.?namespace.orValue(\"\") != \"\" ? object.metadata.namespace : request.namespace)".to_owned(),
            Part::ServiceAccountName => "(object.spec.?serviceAccountName.orValue(\"\") != \"\" ? object.spec.serviceAccountName : (object.spec.?serviceAccount.orValue(\"\") != \"\" ? object.spec.serviceAccount : \"default\"))".to_owned(),
            Part::Label(key) => format!("{LABELS}[?{}].orValue(\"\")", cel_string(key)),
            Part::Annotation(key) => format!("{ANNOTATIONS}[?{}].orValue(\"\")", cel_string(key)),
        })
        .collect();
    format!("({})", parts.join(" + "))
}

/// One RFC 6901 reference token.
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
