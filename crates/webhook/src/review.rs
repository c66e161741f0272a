//! AdmissionReview in and out (`admission.k8s.io/v1` and `v1beta1`), and the decision for one
//! review. No I/O: bytes in, bytes out, so it is tested without a server.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use injector_core::{Applied, CompiledTemplate, NamespaceInfo, Snapshot, plan};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The annotation key (prefixed by the API server with the webhook's name) under which the
/// audit log records the templates applied.
pub const AUDIT_ANNOTATION: &str = "templates-applied";

/// Which templates a request is answered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// `/mutate/<id>`: the templates of one selector group (the API server chose the namespace
    /// and the pod's labels matched the entry's selectors).
    Group(&'a str),
    /// `/mutate`: every template whose pod selector matches (the namespace selection was the
    /// API server's job). What `serve` answers from template files.
    All,
}

/// How a review was answered, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// A patch was returned.
    Injected,
    /// Allowed without a patch: nothing applied (or all already applied).
    Unchanged,
    /// Denied: a required template could not be applied, or the Pod could not be read.
    Denied,
    /// Allowed unchanged: not a Pod CREATE.
    Ignored,
    /// Allowed unchanged: the path names a group this replica does not know.
    UnknownGroup,
    /// The request was not a valid AdmissionReview (answered with HTTP 4xx).
    BadRequest,
}

impl Outcome {
    /// The label value used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Injected => "injected",
            Outcome::Unchanged => "unchanged",
            Outcome::Denied => "denied",
            Outcome::Ignored => "ignored",
            Outcome::UnknownGroup => "unknown_group",
            Outcome::BadRequest => "bad_request",
        }
    }
}

/// The answer to one review.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The AdmissionReview to send back, as JSON.
    pub body: Vec<u8>,
    /// How it was answered.
    pub outcome: Outcome,
    /// The request's uid.
    pub uid: String,
    /// The request's namespace.
    pub namespace: String,
    /// The Pod's name, or its generateName.
    pub pod: String,
    /// The templates applied.
    pub applied: Vec<Applied>,
    /// How many warnings were returned.
    pub warnings: usize,
    /// The required templates that could not be applied.
    pub denied_by: Vec<String>,
}

/// A request that is not an AdmissionReview this webhook can answer (HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadReview(pub String);

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<RequestIn>,
}

#[derive(Deserialize, Default)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    object: Option<Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'a str,
    kind: &'static str,
    response: ResponseOut,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct ResponseOut {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    audit_annotations: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct StatusOut {
    code: u16,
    message: String,
}

const API_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Decides one review: `body` is the request's JSON, `snapshot` the templates to answer from.
pub fn decide(body: &[u8], target: Target<'_>, snapshot: &Snapshot) -> Result<Decision, BadReview> {
    let review: ReviewIn = serde_json::from_slice(body)
        .map_err(|e| BadReview(format!("the body is not a valid AdmissionReview: {e}")))?;
    let api_version = API_VERSIONS
        .into_iter()
        .find(|v| *v == review.api_version)
        .ok_or_else(|| {
            BadReview(format!(
                "apiVersion {:?} is not supported; use admission.k8s.io/v1 or v1beta1",
                review.api_version
            ))
        })?;
    if review.kind != "AdmissionReview" {
        return Err(BadReview(format!(
            "kind {:?} is not AdmissionReview",
            review.kind
        )));
    }
    let request = review
        .request
        .ok_or_else(|| BadReview("the AdmissionReview has no request".into()))?;
    if request.uid.is_empty() {
        return Err(BadReview("request.uid is missing".into()));
    }

    let namespace = request.namespace.clone().unwrap_or_default();
    let pod_name = request
        .object
        .as_ref()
        .and_then(|o| o.get("metadata"))
        .and_then(|m| m.get("name").or_else(|| m.get("generateName")))
        .and_then(Value::as_str)
        .or(request.name.as_deref())
        .unwrap_or_default()
        .to_owned();
    let mut decision = Decision {
        body: Vec::new(),
        outcome: Outcome::Ignored,
        uid: request.uid.clone(),
        namespace: namespace.clone(),
        pod: pod_name,
        applied: Vec::new(),
        warnings: 0,
        denied_by: Vec::new(),
    };
    let mut response = ResponseOut {
        uid: request.uid.clone(),
        allowed: true,
        ..ResponseOut::default()
    };

    let is_pod_create = request.kind.group.is_empty()
        && request.kind.kind == "Pod"
        && request.operation == "CREATE"
        && request.sub_resource.as_deref().is_none_or(str::is_empty);
    if is_pod_create {
        answer_pod(
            &request,
            target,
            snapshot,
            &namespace,
            &mut response,
            &mut decision,
        );
    }

    decision.warnings = response.warnings.len();
    decision.body = serde_json::to_vec(&ReviewOut {
        api_version,
        kind: "AdmissionReview",
        response,
    })
    .map_err(|e| BadReview(format!("cannot encode the response: {e}")))?;
    Ok(decision)
}

fn answer_pod(
    request: &RequestIn,
    target: Target<'_>,
    snapshot: &Snapshot,
    namespace: &str,
    response: &mut ResponseOut,
    decision: &mut Decision,
) {
    let deny = |response: &mut ResponseOut, code: u16, message: String| {
        response.allowed = false;
        response.status = Some(StatusOut { code, message });
    };
    let Some(pod) = request.object.as_ref().filter(|o| !o.is_null()) else {
        decision.outcome = Outcome::Denied;
        deny(
            response,
            400,
            "sidecar-injector: request.object is missing: there is no Pod to inspect".into(),
        );
        return;
    };
    let pod_labels = pod.pointer("/metadata/labels").and_then(Value::as_object);
    let matched;
    let templates: &[Arc<CompiledTemplate>] = match target {
        Target::All => {
            matched = snapshot.matching(pod_labels, None);
            &matched
        }
        Target::Group(id) => match snapshot.group(id) {
            Some(group) => &group.templates,
            None => {
                decision.outcome = Outcome::UnknownGroup;
                return;
            }
        },
    };
    let info = NamespaceInfo {
        name: namespace,
        labels: None,
    };
    let plan = match plan(pod, &info, templates) {
        Ok(plan) => plan,
        Err(error) => {
            decision.outcome = Outcome::Denied;
            deny(response, 400, format!("sidecar-injector: {error}"));
            return;
        }
    };
    response.warnings = plan.warnings.clone();
    decision.applied = plan.applied.clone();
    if let Some(message) = plan.denial_message() {
        decision.outcome = Outcome::Denied;
        decision.denied_by = plan.denials.iter().map(|d| d.template.clone()).collect();
        deny(response, 403, format!("sidecar-injector: {message}"));
        return;
    }
    if plan.patch.is_empty() {
        decision.outcome = Outcome::Unchanged;
        return;
    }
    match serde_json::to_vec(&plan.patch) {
        Ok(patch) => {
            response.patch = Some(base64::engine::general_purpose::STANDARD.encode(patch));
            response.patch_type = Some("JSONPatch");
            let applied: Vec<String> = plan.applied.iter().map(ToString::to_string).collect();
            response
                .audit_annotations
                .insert(AUDIT_ANNOTATION.into(), applied.join(","));
            decision.outcome = Outcome::Injected;
        }
        Err(error) => {
            decision.outcome = Outcome::Denied;
            deny(
                response,
                500,
                format!("sidecar-injector: cannot encode the patch: {error}"),
            );
        }
    }
}
