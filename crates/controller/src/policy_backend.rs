//! The policy backend's calls to the API server (leader only): whether it serves
//! MutatingAdmissionPolicies and ValidatingAdmissionPolicies, proving a compiled policy with a
//! dry run, applying it and its binding, putting the guard in force, keeping required templates
//! after admission, and removing them. What to apply is decided in `injector_core::policy`.

use std::time::Duration;

use injector_core::policy::{
    CompiledAfterAdmission, CompiledGuard, CompiledPolicy, GuardConditions,
    NAMESPACE_BINDING_SLOTS, POLICY_API_VERSION, after_admission_name, guard_in_force,
    guard_in_force_of, guard_name, guard_probe_pod, namespace_binding_name, proof_pod,
    proof_problem, proof_round_pod, runs_live, warnings_name,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, DynamicObject, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use crate::FIELD_MANAGER;

/// Which injection backend the operator uses (`--injection-backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Every template through the webhook (the operator removes a policy it applied before).
    Webhook,
    /// Templates a policy can express through one MutatingAdmissionPolicy where the API server
    /// serves them, the rest (and every template elsewhere) through the webhook.
    #[default]
    Auto,
    /// Only the policy: no webhook entry. A ValidatingAdmissionPolicy (the guard) refuses the
    /// Pods a required template selects and the policy did not inject.
    Policy,
}

/// Which admission policies the API server serves (`admissionregistration.k8s.io/v1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// MutatingAdmissionPolicies (Kubernetes 1.36+).
    pub mutating: bool,
    /// ValidatingAdmissionPolicies (Kubernetes 1.30+).
    pub validating: bool,
}

/// A failed call of the policy backend.
#[derive(Debug, thiserror::Error)]
pub enum PolicyBackendError {
    /// The API server refused or failed a call.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// A generated object is not what the API expects (a bug).
    #[error("{what}: {source}")]
    Shape {
        /// What was being built.
        what: String,
        /// The error.
        source: serde_json::Error,
    },
    /// The proof policy did not prove the policy: it is not applied.
    #[error("the generated policy failed its proof: {0}")]
    Proof(String),
    /// The API server did not enforce the applied guard in time.
    #[error("the guard (ValidatingAdmissionPolicy) is not in force: {0}")]
    Guard(String),
}

/// What the API server's refusal of a Pod by the PodSecurity admission plugin says.
const POD_SECURITY_REFUSAL: &str = "violates PodSecurity";

/// How long the operator waits for the API server to load an admission object it applied, at
/// least: the API server compiles every CEL expression of the object before it runs it.
const LOAD_TIMEOUT_MIN: Duration = Duration::from_secs(20);
/// At most.
const LOAD_TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// How many bytes of an object add a second to the wait: a loaded 2-core machine took over 20
/// s to load a 1.3 MB policy (500 templates), and every proof failed with a fixed 20 s.
const LOAD_BYTES_PER_SECOND: usize = 10 * 1024;

/// How long to wait for the API server to run `object`, by its size.
fn load_timeout(object: &Value) -> Duration {
    let bytes = object.to_string().len();
    let extra = u64::try_from(bytes / LOAD_BYTES_PER_SECOND).unwrap_or(u64::MAX);
    LOAD_TIMEOUT_MIN
        .saturating_add(Duration::from_secs(extra))
        .min(LOAD_TIMEOUT_MAX)
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

fn policies(client: &Client) -> Api<DynamicObject> {
    let resource = resource("MutatingAdmissionPolicy", "mutatingadmissionpolicies");
    Api::all_with(client.clone(), &resource)
}

fn bindings(client: &Client) -> Api<DynamicObject> {
    let resource = resource(
        "MutatingAdmissionPolicyBinding",
        "mutatingadmissionpolicybindings",
    );
    Api::all_with(client.clone(), &resource)
}

fn guards(client: &Client) -> Api<DynamicObject> {
    let resource = resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies");
    Api::all_with(client.clone(), &resource)
}

fn guard_bindings(client: &Client) -> Api<DynamicObject> {
    let resource = resource(
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    Api::all_with(client.clone(), &resource)
}

/// Which admission policies the API server serves.
pub async fn served_policies(client: &Client) -> Result<Served, PolicyBackendError> {
    match client.list_api_group_resources(POLICY_API_VERSION).await {
        Ok(list) => {
            let serves = |name: &str| list.resources.iter().any(|r| r.name == name);
            Ok(Served {
                mutating: serves("mutatingadmissionpolicies"),
                validating: serves("validatingadmissionpolicies"),
            })
        }
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(Served::default()),
        Err(source) => Err(PolicyBackendError::Api {
            what: format!("discovering {POLICY_API_VERSION}"),
            source,
        }),
    }
}

/// Applies `object` (a policy or a binding) with server-side apply, owned by `owner`.
async fn apply(
    api: &Api<DynamicObject>,
    mut object: Value,
    owner: Option<&OwnerReference>,
) -> Result<(), PolicyBackendError> {
    if let Some(owner) = owner {
        object["metadata"]["ownerReferences"] =
            serde_json::to_value([owner]).map_err(|source| PolicyBackendError::Shape {
                what: "an owner reference".into(),
                source,
            })?;
    }
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &kube::api::Patch::Apply(&object))
        .await
        .map_err(|source| PolicyBackendError::Api {
            what: format!("applying {kind} {name}"),
            source,
        })?;
    Ok(())
}

/// Proves `compiled` with its proof policy and a dry-run Pod in `namespace` per round of the
/// proof; returns the proof Pods as the API server stored them, in round order. The policy in
/// force is not touched.
pub async fn prove(
    client: &Client,
    compiled: &CompiledPolicy,
    namespace: &str,
    owner: Option<&OwnerReference>,
) -> Result<Vec<Value>, PolicyBackendError> {
    let Some((proof, proof_binding)) = &compiled.proof else {
        return Ok(Vec::new());
    };
    apply(&policies(client), proof.clone(), owner).await?;
    apply(&bindings(client), proof_binding.clone(), owner).await?;
    let timeout = load_timeout(proof);
    let mut proven = Vec::new();
    for round in 0..compiled.proof_round_count() {
        let stored = dry_run_until(
            client,
            namespace,
            &proof_round_pod(compiled, round),
            timeout,
            |answer| {
                let stored = match answer {
                    Answer::Stored(stored) => stored,
                    // The Pod the proof policy made breaks the namespace's Pod Security
                    // Standard: the template's Pods would too. Final (a version of the proof
                    // policy being replaced leaves this Pod alone, and the Pod itself passes).
                    Answer::Refused(message) if message.contains(POD_SECURITY_REFUSAL) => {
                        return Check::Failed(Answer::Refused(&unnamed(message)).refusal());
                    }
                    Answer::Refused(_) => return Check::NotYet(answer.refusal()),
                };
                let marked = stored
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(injector_api::names::POLICY_PROVEN_ANNOTATION))
                    .is_some();
                match proof_problem(compiled, round, stored) {
                    None => Check::Done,
                    // Marked by this version, and still wrong: final.
                    Some(problem) if marked => Check::Failed(problem),
                    // Not marked: the API server has not loaded this version yet.
                    Some(problem) => Check::NotYet(problem),
                }
            },
        )
        .await?;
        proven.push(stored);
    }
    Ok(proven)
}

/// Applies the proven policy of `compiled` and its binding, and waits until the API server
/// runs it (a dry-run Pod in `namespace` asking for this version comes back marked).
///
/// Waiting matters to the webhook entries: their conditions that skip what the policy served
/// must describe the policy the API server runs, or a Pod the previous version injected would
/// reach the webhook, which would take the previous version's container for a look-alike.
pub async fn apply_and_confirm(
    client: &Client,
    compiled: &CompiledPolicy,
    namespace: &str,
    owner: Option<&OwnerReference>,
) -> Result<(), PolicyBackendError> {
    let Some(policy) = &compiled.policy else {
        return Ok(());
    };
    apply(&policies(client), policy.clone(), owner).await?;
    let name = policy["metadata"]["name"].as_str().unwrap_or_default();
    put_bindings(|| bindings(client), name, &compiled.bindings, owner).await?;
    dry_run_until(
        client,
        namespace,
        &proof_pod(compiled, true),
        load_timeout(policy),
        |answer| match answer {
            Answer::Stored(stored) if runs_live(compiled, stored) => Check::Done,
            Answer::Stored(_) => {
                Check::NotYet("the API server does not run the applied policy yet".to_owned())
            }
            Answer::Refused(_) => Check::NotYet(answer.refusal()),
        },
    )
    .await?;
    Ok(())
}

/// Applies `guard` and its binding, and waits until the API server enforces this version (it
/// refuses a dry-run Pod in `namespace` asking for it, saying so).
pub async fn apply_guard_and_confirm(
    client: &Client,
    guard: &CompiledGuard,
    namespace: &str,
    owner: Option<&OwnerReference>,
) -> Result<(), PolicyBackendError> {
    apply(&guards(client), guard.policy.clone(), owner).await?;
    apply(&guard_bindings(client), guard.binding.clone(), owner).await?;
    dry_run_until(
        client,
        namespace,
        &guard_probe_pod(guard),
        load_timeout(&guard.policy),
        |answer| match answer {
            Answer::Refused(message) if guard_in_force(guard, message) => Check::Done,
            Answer::Refused(_) => Check::NotYet(answer.refusal()),
            Answer::Stored(_) => Check::NotYet(
                "the probe Pod was admitted: the guard is not in force yet".to_owned(),
            ),
        },
    )
    .await
    .map(drop)
    .map_err(|error| match error {
        PolicyBackendError::Proof(last) => PolicyBackendError::Guard(last),
        other => other,
    })
}

/// `message` without the generated name of the Pod it refuses: the same refusal reads the
/// same each time (it ends up in the guard, whose every change is applied and confirmed, and in
/// the template's status).
fn unnamed(message: &str) -> String {
    message
        .strip_prefix("pods \"")
        .and_then(|rest| rest.split_once("\" is forbidden: "))
        .map_or_else(|| message.to_owned(), |(_, why)| why.to_owned())
}

/// What the API server answered a dry-run Pod.
enum Answer<'a> {
    /// It would store this Pod.
    Stored(&'a Value),
    /// It refused the Pod, saying this.
    Refused(&'a str),
}

impl Answer<'_> {
    fn refusal(&self) -> String {
        match self {
            Answer::Refused(message) => format!("the dry-run Pod was refused: {message}"),
            Answer::Stored(_) => "the dry-run Pod was admitted".to_owned(),
        }
    }
}

/// What a dry run showed.
enum Check {
    Done,
    NotYet(String),
    Failed(String),
}

/// Dry-runs `pod` in `namespace` until `check` is done with the API server's answer, for up
/// to `timeout`; returns the last Pod stored (`Null` when it was refused). A refusal is
/// retried too: it may come from a version the API server is replacing.
async fn dry_run_until(
    client: &Client,
    namespace: &str,
    pod: &Value,
    timeout: Duration,
    check: impl Fn(Answer<'_>) -> Check,
) -> Result<Value, PolicyBackendError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod =
        serde_json::from_value(pod.clone()).map_err(|source| PolicyBackendError::Shape {
            what: "the dry-run Pod".into(),
            source,
        })?;
    let params = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    let started = tokio::time::Instant::now();
    let mut last_problem = String::from("no answer yet");
    while started.elapsed() < timeout {
        let (stored, checked) = match pods.create(&params, &pod).await {
            Ok(stored) => {
                let stored =
                    serde_json::to_value(&stored).map_err(|source| PolicyBackendError::Shape {
                        what: "the dry-run Pod".into(),
                        source,
                    })?;
                let checked = check(Answer::Stored(&stored));
                (stored, checked)
            }
            Err(kube::Error::Api(response)) if (400..600).contains(&response.code) => {
                if response.code == 403 && response.message.contains("cannot create resource") {
                    // No permission to create the dry-run Pod: nothing to wait for.
                    return Err(PolicyBackendError::Proof(
                        Answer::Refused(&response.message).refusal(),
                    ));
                }
                (Value::Null, check(Answer::Refused(&response.message)))
            }
            Err(source) => {
                return Err(PolicyBackendError::Api {
                    what: "dry-running a Pod".into(),
                    source,
                });
            }
        };
        match checked {
            Check::Done => return Ok(stored),
            Check::Failed(problem) => return Err(PolicyBackendError::Proof(problem)),
            Check::NotYet(problem) => last_problem = problem,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(PolicyBackendError::Proof(last_problem))
}

/// Deletes the policy `name`, its bindings, and their proof objects; absent ones are fine.
pub async fn remove(client: &Client, name: &str) -> Result<bool, PolicyBackendError> {
    let proof = injector_core::policy::proof_name(name);
    let own = binding_names(name).map(|binding| (bindings(client), binding));
    delete_all(own.chain([
        (policies(client), name.to_owned()),
        (bindings(client), proof.clone()),
        (policies(client), proof),
    ]))
    .await
}

/// Every binding the policy `name` may have: the one named like it, and one per namespace
/// group's slot.
fn binding_names(name: &str) -> impl Iterator<Item = String> + '_ {
    std::iter::once(name.to_owned())
        .chain((0..NAMESPACE_BINDING_SLOTS).map(move |slot| namespace_binding_name(name, slot)))
}

/// Applies `bindings` of the policy `name` (with the API `api` gives) and deletes its other
/// bindings ([`binding_names`]). The namespace groups' go first, the last first, then the one
/// named like the policy, and the unused ones are deleted last: the one named like the policy
/// may narrow (to the operator's namespace, or away), and a group may move to an earlier slot,
/// so that in between a namespace a template selects is matched by a binding twice at most
/// (the policy then changes nothing the second time), never by none. (A group moving to a later
/// slot is unbound for the moment between two calls.)
async fn put_bindings(
    api: impl Fn() -> Api<DynamicObject>,
    name: &str,
    bindings: &[Value],
    owner: Option<&OwnerReference>,
) -> Result<(), PolicyBackendError> {
    let named = |binding: &Value| binding["metadata"]["name"].as_str() == Some(name);
    let (own, groups): (Vec<&Value>, Vec<&Value>) = bindings.iter().partition(|b| named(b));
    for binding in groups.into_iter().rev().chain(own) {
        apply(&api(), binding.clone(), owner).await?;
    }
    let kept: Vec<&str> = bindings
        .iter()
        .filter_map(|binding| binding["metadata"]["name"].as_str())
        .collect();
    delete_all(
        binding_names(name)
            .filter(|binding| !kept.contains(&binding.as_str()))
            .map(|binding| (api(), binding)),
    )
    .await
    .map(drop)
}

/// What the guard beside the policy `name` puts in force, per template (empty when there is
/// none).
pub async fn read_guard_in_force(
    client: &Client,
    name: &str,
) -> Result<GuardConditions, PolicyBackendError> {
    let name = guard_name(name);
    match guards(client).get_opt(&name).await {
        Ok(Some(guard)) => {
            let guard =
                serde_json::to_value(&guard).map_err(|source| PolicyBackendError::Shape {
                    what: "the guard in force".into(),
                    source,
                })?;
            Ok(guard_in_force_of(&guard))
        }
        Ok(None) => Ok(GuardConditions::new()),
        Err(source) => Err(PolicyBackendError::Api {
            what: format!("reading {name}"),
            source,
        }),
    }
}

/// Deletes the guard beside the policy `name` and its binding; absent ones are fine.
pub async fn remove_guard(client: &Client, name: &str) -> Result<bool, PolicyBackendError> {
    let guard = guard_name(name);
    delete_all([
        (guard_bindings(client), guard.as_str()),
        (guards(client), guard.as_str()),
    ])
    .await
}

/// Applies the warnings policy and its binding (`Some`), or deletes them (`None`): they only
/// ever add warnings, so nothing waits for the API server to load them.
pub async fn put_warnings(
    client: &Client,
    name: &str,
    warnings: Option<(Value, Vec<Value>)>,
    owner: Option<&OwnerReference>,
) -> Result<(), PolicyBackendError> {
    let warnings_name = warnings_name(name);
    match warnings {
        Some((policy, bindings)) => {
            apply(&guards(client), policy, owner).await?;
            put_bindings(|| guard_bindings(client), &warnings_name, &bindings, owner).await
        }
        None => delete_all(
            binding_names(&warnings_name)
                .map(|binding| (guard_bindings(client), binding))
                .chain([(guards(client), warnings_name.clone())]),
        )
        .await
        .map(drop),
    }
}

/// Applies the after-admission policy and its binding (`Some`), or deletes them (`None`, with
/// the name of the policy `name`); whether a policy was deleted. Nothing waits for the API
/// server to load it: it only ever refuses UPDATEs, and the operator's own in-place update
/// that a previous version refuses is tried again on the rollout's next round.
pub async fn put_after_admission(
    client: &Client,
    name: &str,
    after_admission: Option<&CompiledAfterAdmission>,
    owner: Option<&OwnerReference>,
) -> Result<bool, PolicyBackendError> {
    match after_admission {
        Some(compiled) => {
            apply(&guards(client), compiled.policy.clone(), owner).await?;
            apply(&guard_bindings(client), compiled.binding.clone(), owner).await?;
            Ok(false)
        }
        None => {
            let name = after_admission_name(name);
            delete_all([
                (guard_bindings(client), name.as_str()),
                (guards(client), name.as_str()),
            ])
            .await
        }
    }
}

/// Deletes each named object in order; whether any was there.
async fn delete_all<S: AsRef<str>>(
    objects: impl IntoIterator<Item = (Api<DynamicObject>, S)>,
) -> Result<bool, PolicyBackendError> {
    let mut removed = false;
    for (api, object) in objects {
        let object = object.as_ref();
        match api.delete(object, &DeleteParams::default()).await {
            Ok(_) => removed = true,
            Err(kube::Error::Api(response)) if response.code == 404 => {}
            Err(source) => {
                return Err(PolicyBackendError::Api {
                    what: format!("deleting {object}"),
                    source,
                });
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
