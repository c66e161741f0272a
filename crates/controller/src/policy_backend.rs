//! The policy backend's calls to the API server (leader only): whether it serves
//! MutatingAdmissionPolicies, proving a compiled policy with a dry run, applying it and its
//! binding, and removing them. What to apply is decided in `injector_core::policy`.

use std::time::Duration;

use injector_core::policy::{CompiledPolicy, POLICY_API_VERSION, proof_pod, proof_problem};
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
}

/// How long the proof waits for the API server to load a new proof policy.
const PROOF_TIMEOUT: Duration = Duration::from_secs(20);

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

/// Whether the API server serves MutatingAdmissionPolicies (`admissionregistration.k8s.io/v1`,
/// Kubernetes 1.36+).
pub async fn serves_policies(client: &Client) -> Result<bool, PolicyBackendError> {
    match client.list_api_group_resources(POLICY_API_VERSION).await {
        Ok(list) => Ok(list
            .resources
            .iter()
            .any(|r| r.name == "mutatingadmissionpolicies")),
        Err(kube::Error::Api(response)) if response.code == 404 => Ok(false),
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

/// Proves `compiled` with its proof policy and a dry-run Pod in `namespace`, then applies the
/// policy and its binding. The policy in force is not touched unless the proof passes.
pub async fn prove_and_apply(
    client: &Client,
    compiled: &CompiledPolicy,
    namespace: &str,
    owner: Option<&OwnerReference>,
) -> Result<(), PolicyBackendError> {
    let (Some(policy), Some(binding), Some((proof, proof_binding))) =
        (&compiled.policy, &compiled.binding, &compiled.proof)
    else {
        return Ok(());
    };
    apply(&policies(client), proof.clone(), owner).await?;
    apply(&bindings(client), proof_binding.clone(), owner).await?;
    prove(client, compiled, namespace).await?;
    apply(&policies(client), policy.clone(), owner).await?;
    apply(&bindings(client), binding.clone(), owner).await?;
    Ok(())
}

/// Dry-runs the proof Pod until the API server has loaded this version of the proof policy
/// (it marks the Pod) or the policy fails. An error from the proof policy is a failed proof
/// once the API server has had time to load it; before, it may be a version still loading.
async fn prove(
    client: &Client,
    compiled: &CompiledPolicy,
    namespace: &str,
) -> Result<(), PolicyBackendError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(proof_pod(compiled)).map_err(|source| {
        PolicyBackendError::Shape {
            what: "the proof Pod".into(),
            source,
        }
    })?;
    let params = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    let started = tokio::time::Instant::now();
    let mut last_problem = String::from("no answer yet");
    while started.elapsed() < PROOF_TIMEOUT {
        match pods.create(&params, &pod).await {
            Ok(stored) => {
                let stored =
                    serde_json::to_value(&stored).map_err(|source| PolicyBackendError::Shape {
                        what: "the dry-run Pod".into(),
                        source,
                    })?;
                match proof_problem(compiled, &stored) {
                    None => return Ok(()),
                    Some(problem) => last_problem = problem,
                }
                // The marker is missing while the API server has not loaded this version yet;
                // anything else it got wrong is final.
                if stored
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(injector_api::names::POLICY_PROVEN_ANNOTATION))
                    .is_some()
                {
                    return Err(PolicyBackendError::Proof(last_problem));
                }
            }
            Err(kube::Error::Api(response)) if response.code >= 400 && response.code < 600 => {
                last_problem = format!("the dry-run Pod was refused: {}", response.message);
                if response.code == 403 && response.message.contains("cannot create resource") {
                    // No permission to create the proof Pod: nothing to wait for.
                    return Err(PolicyBackendError::Proof(last_problem));
                }
            }
            Err(source) => {
                return Err(PolicyBackendError::Api {
                    what: "dry-running the proof Pod".into(),
                    source,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(PolicyBackendError::Proof(last_problem))
}

/// Deletes the policy `name`, its binding, and their proof objects; absent ones are fine.
pub async fn remove(client: &Client, name: &str) -> Result<bool, PolicyBackendError> {
    let mut removed = false;
    let proof = injector_core::policy::proof_name(name);
    for (api, object) in [
        (bindings(client), name),
        (policies(client), name),
        (bindings(client), proof.as_str()),
        (policies(client), proof.as_str()),
    ] {
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
