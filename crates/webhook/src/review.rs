//! AdmissionReview in and out (`admission.k8s.io/v1` and `v1beta1`), and the decision for one
//! review. No I/O: bytes in, bytes out, so it is tested without a server.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use injector_api::FailurePolicy;
use injector_core::pod::json::{PodJsonError, decode_pod_among};
use injector_core::policy_of_id;
use injector_core::{
    Applied, CompiledTemplate, Group, NamespaceInfo, Patch, Pod, Snapshot, plan_among,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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

/// Where a request is answered from: its target looked up once, in one snapshot.
#[derive(Clone, Copy, Debug)]
pub enum Route<'s> {
    /// `/mutate`: every template whose pod selector matches.
    All,
    /// `/mutate/<id>` of a group this replica knows.
    Group(&'s Group),
    /// `/mutate/<id>` of a group this replica does not know (its configuration is ahead).
    Unknown(&'s str),
}

impl<'s> Route<'s> {
    /// Looks `target` up in `snapshot`.
    pub fn resolve(target: Target<'s>, snapshot: &'s Snapshot) -> Self {
        match target {
            Target::All => Route::All,
            Target::Group(id) => snapshot
                .group(id)
                .map_or(Route::Unknown(id), |g| Route::Group(g)),
        }
    }

    /// The `group` label of metrics and logs.
    pub fn label(&self) -> &'s str {
        match self {
            Route::All => "all",
            Route::Group(group) => group.id.as_str(),
            Route::Unknown(_) => "unknown",
        }
    }
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
    /// Allowed unchanged: the path names a best-effort group this replica does not know.
    UnknownGroup,
    /// Denied: the path names a required group (`fail-…`) this replica does not know; it lags
    /// behind the cluster's templates, and admitting the Pod could skip a required template.
    UnknownRequiredGroup,
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
            Outcome::UnknownRequiredGroup => "unknown_required_group",
            Outcome::BadRequest => "bad_request",
        }
    }
}

/// The answer to one review.
#[derive(Clone, Debug)]
pub struct Decision<'s> {
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
    /// The `group` label of metrics and logs (see [`Route::label`]).
    pub group: &'s str,
    /// The templates applied.
    pub applied: Vec<Applied>,
    /// The same, as `name@generation#fingerprint,...` (the audit annotation's value and the
    /// log's).
    pub applied_record: String,
    /// How many warnings were returned.
    pub warnings: usize,
    /// The required templates that could not be applied.
    pub denied_by: Vec<String>,
}

/// A request that is not an AdmissionReview this webhook can answer (HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadReview(pub String);

// The review is read into these, borrowing from the body: the fields the answer needs, the
// object kept as a slice of the body (its Pod is then decoded by `pod_json` within the
// request's allowance), and nothing else (userInfo, oldObject, options, … are skipped unbuilt).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(default, borrow)]
    api_version: Cow<'a, str>,
    #[serde(default, borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: Option<RequestIn<'a>>,
}

#[derive(Deserialize, Default)]
struct GroupVersionKind<'a> {
    #[serde(default, borrow)]
    group: Cow<'a, str>,
    #[serde(default, borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(default, borrow)]
    uid: Cow<'a, str>,
    #[serde(default, borrow)]
    kind: GroupVersionKind<'a>,
    #[serde(default, borrow)]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    namespace: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    operation: Cow<'a, str>,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
}

/// What opens the AdmissionReview answered: its API version and the request's uid.
#[derive(Clone, Copy)]
struct ResponseHead<'a> {
    api_version: &'a str,
    uid: &'a str,
}

impl ResponseHead<'_> {
    /// The answer written up to the response's uid, with room for `capacity` bytes. By hand
    /// rather than derived, as the rest: the patch, kilobytes of base64, needs no escaping,
    /// and checking it byte by byte (as a JSON string or a `RawValue`) was a large share of
    /// encoding.
    fn open(&self, capacity: usize) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::with_capacity(capacity);
        out.extend_from_slice(br#"{"apiVersion":"#);
        serde_json::to_writer(&mut out, self.api_version)?;
        out.extend_from_slice(br#","kind":"AdmissionReview","response":{"uid":"#);
        serde_json::to_writer(&mut out, self.uid)?;
        Ok(out)
    }

    /// The answer allowing the Pod with `patch`, written up to the end of the patch's base64:
    /// the patch is encoded into the buffer that becomes the body, where copying it there
    /// from a buffer of its own took an allocation and a copy of kilobytes every request.
    fn with_patch(&self, patch: &Patch<'_>) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = self.open(ANSWER_BYTES)?;
        out.extend_from_slice(br#","allowed":true,"patch":""#);
        patch.write_base64(&mut out)?;
        Ok(out)
    }
}

/// Room made for an answer with a patch, so that a typical one is not grown and copied.
const ANSWER_BYTES: usize = 8192 + 1024;

/// The AdmissionReview answered, written as JSON by [`ResponseOut::write`].
struct ResponseOut {
    verdict: Verdict,
    warnings: Vec<String>,
    audit_annotations: BTreeMap<String, String>,
}

/// Whether the Pod is admitted, and how.
enum Verdict {
    /// Allowed with a patch: the answer written up to the end of the patch's base64
    /// ([`ResponseHead::with_patch`]).
    Patched(Vec<u8>),
    /// Allowed unchanged.
    Allowed,
    /// Denied, and why.
    Denied(StatusOut),
}

impl ResponseOut {
    /// The response of an answer: denied with `denial`, else allowed with `patched` (recording
    /// `applied_record` in the audit annotation), else allowed unchanged. A denial wins over a
    /// patch, should an answer ever hold both.
    fn new(
        denial: Option<StatusOut>,
        patched: Option<Vec<u8>>,
        warnings: Vec<String>,
        applied_record: &str,
    ) -> Self {
        let (verdict, audit_annotations) = match (denial, patched) {
            (Some(status), _) => (Verdict::Denied(status), BTreeMap::new()),
            (None, Some(patched)) => (
                Verdict::Patched(patched),
                BTreeMap::from([(AUDIT_ANNOTATION.into(), applied_record.to_owned())]),
            ),
            (None, None) => (Verdict::Allowed, BTreeMap::new()),
        };
        ResponseOut {
            verdict,
            warnings,
            audit_annotations,
        }
    }

    /// The AdmissionReview holding this response, opened by `head`.
    fn write(self, head: ResponseHead<'_>) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = match self.verdict {
            Verdict::Patched(mut out) => {
                out.extend_from_slice(br#"","patchType":"JSONPatch""#);
                out
            }
            Verdict::Allowed => {
                let mut out = head.open(1024)?;
                out.extend_from_slice(br#","allowed":true"#);
                out
            }
            Verdict::Denied(status) => {
                let mut out = head.open(1024)?;
                out.extend_from_slice(br#","allowed":false,"status":"#);
                serde_json::to_writer(&mut out, &status)?;
                out
            }
        };
        if !self.warnings.is_empty() {
            out.extend_from_slice(br#","warnings":"#);
            serde_json::to_writer(&mut out, &self.warnings)?;
        }
        if !self.audit_annotations.is_empty() {
            out.extend_from_slice(br#","auditAnnotations":"#);
            serde_json::to_writer(&mut out, &self.audit_annotations)?;
        }
        out.extend_from_slice(b"}}");
        Ok(out)
    }
}

#[derive(Serialize)]
struct StatusOut {
    code: u16,
    message: String,
}

const API_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Decides one review: `body` is the request's JSON, `snapshot` the templates to answer from,
/// `allowance` the memory decoding its Pod may take (see [`injector_core::pod::json`]).
pub fn decide<'s>(
    body: &[u8],
    target: Target<'s>,
    snapshot: &'s Snapshot,
    allowance: usize,
) -> Result<Decision<'s>, BadReview> {
    let route = Route::resolve(target, snapshot);
    let review = serde_json::from_slice::<ReviewIn>(body)
        .map_err(|e| BadReview(format!("the body is not a valid AdmissionReview: {e}")))?;
    let (api_version, request) = review.into_request()?;

    let namespace = request.namespace.as_deref().unwrap_or_default().to_owned();
    let head = ResponseHead {
        api_version,
        uid: &request.uid,
    };
    let answer = if request.is_pod_create() {
        answer_pod(request.object, route, snapshot, &namespace, allowance, head)
    } else {
        Answer::allowed(Outcome::Ignored)
    };
    let pod = answer
        .pod_name
        .clone()
        .or_else(|| request.name.as_deref().map(str::to_owned))
        .unwrap_or_default();

    let applied_record = record_of(&answer.applied);
    let response = ResponseOut::new(
        answer.denial,
        answer.patched,
        answer.warnings,
        &applied_record,
    );
    let warnings = response.warnings.len();
    let body = response
        .write(head)
        .map_err(|e| BadReview(format!("cannot encode the response: {e}")))?;
    Ok(Decision {
        body,
        outcome: answer.outcome,
        uid: request.uid.into_owned(),
        namespace,
        pod,
        group: route.label(),
        applied: answer.applied,
        applied_record,
        warnings,
        denied_by: answer.denied_by,
    })
}

impl<'a> ReviewIn<'a> {
    /// The supported API version of the review and its request; `Err` when it is not an
    /// AdmissionReview this webhook can answer.
    fn into_request(self) -> Result<(&'static str, RequestIn<'a>), BadReview> {
        let api_version = API_VERSIONS
            .into_iter()
            .find(|v| *v == self.api_version)
            .ok_or_else(|| {
                BadReview(format!(
                    "apiVersion {:?} is not supported; use admission.k8s.io/v1 or v1beta1",
                    self.api_version
                ))
            })?;
        if self.kind != "AdmissionReview" {
            return Err(BadReview(format!(
                "kind {:?} is not AdmissionReview",
                self.kind
            )));
        }
        let request = self
            .request
            .ok_or_else(|| BadReview("the AdmissionReview has no request".into()))?;
        if request.uid.is_empty() {
            return Err(BadReview("request.uid is missing".into()));
        }
        Ok((api_version, request))
    }
}

impl RequestIn<'_> {
    /// Whether it asks to create a Pod (not one of its subresources): the only request
    /// answered from the templates.
    fn is_pod_create(&self) -> bool {
        self.kind.group.is_empty()
            && self.kind.kind == "Pod"
            && self.operation == "CREATE"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }
}

/// What answering a Pod CREATE decided, before it is encoded.
struct Answer {
    outcome: Outcome,
    /// Set when the Pod is denied.
    denial: Option<StatusOut>,
    /// The answer allowing the Pod with its patch, written up to the end of the patch's
    /// base64 ([`ResponseHead::with_patch`]).
    patched: Option<Vec<u8>>,
    warnings: Vec<String>,
    applied: Vec<Applied>,
    denied_by: Vec<String>,
    /// The Pod's name, or its generateName, when it was read.
    pod_name: Option<String>,
}

impl Answer {
    fn allowed(outcome: Outcome) -> Self {
        Answer {
            pod_name: None,
            outcome,
            denial: None,
            patched: None,
            warnings: Vec::new(),
            applied: Vec::new(),
            denied_by: Vec::new(),
        }
    }

    fn denied(outcome: Outcome, code: u16, message: String) -> Self {
        Answer {
            denial: Some(StatusOut { code, message }),
            ..Answer::allowed(outcome)
        }
    }
}

/// The denial of a request for a required group this replica does not know.
fn unknown_required_group(id: &str) -> String {
    format!(
        "sidecar-injector: this webhook replica does not know the required selector group {id:?}: \
         it is not in sync with the cluster's SidecarTemplates (it lags behind the webhook \
         configuration), so it cannot tell which required templates apply; retry the request \
         (another replica, or this one once in sync, will serve it)"
    )
}

/// The applied templates' entries (`name@generation#fingerprint`), comma-separated, as the
/// audit annotation and the log line record them.
fn record_of(applied: &[Applied]) -> String {
    // One string sized for the entries and their commas, not one per entry joined.
    let mut record = String::with_capacity(applied.iter().map(|a| a.entry_len_bound() + 1).sum());
    for (i, entry) in applied.iter().enumerate() {
        if i > 0 {
            record.push(',');
        }
        entry.push_entry(&mut record);
    }
    record
}

/// The answer to a Pod CREATE, routed by `route`: refused when its group is unknown and
/// required, or its Pod (`object`) cannot be read within `allowance`; else from its plan.
fn answer_pod(
    object: Option<&RawValue>,
    route: Route<'_>,
    snapshot: &Snapshot,
    namespace: &str,
    allowance: usize,
    head: ResponseHead<'_>,
) -> Answer {
    let group = match route {
        Route::All => None,
        Route::Group(group) => Some(group),
        Route::Unknown(id) if policy_of_id(id) == Some(FailurePolicy::Fail) => {
            return Answer::denied(
                Outcome::UnknownRequiredGroup,
                503,
                unknown_required_group(id),
            );
        }
        Route::Unknown(_) => return Answer::allowed(Outcome::UnknownGroup),
    };
    let missing = || {
        Answer::denied(
            Outcome::Denied,
            400,
            "sidecar-injector: request.object is missing: there is no Pod to inspect".into(),
        )
    };
    let decoded = match object {
        None => return missing(),
        Some(raw) if raw.get() == "null" => return missing(),
        Some(raw) => decode_pod_among(raw.get(), allowance, snapshot),
    };
    match decoded {
        Ok(pod) => answer_planned(pod, group, snapshot, namespace, head),
        Err(error @ PodJsonError::TooComplex { .. }) => {
            Answer::denied(Outcome::Denied, 413, format!("sidecar-injector: {error}"))
        }
        Err(error) => Answer::denied(Outcome::Denied, 400, format!("sidecar-injector: {error}")),
    }
}

/// The answer to the Pod CREATE of `pod`, from its plan with the templates of `group` (every
/// template whose pod selector matches it, without one).
fn answer_planned(
    pod: Pod<'_>,
    group: Option<&Group>,
    snapshot: &Snapshot,
    namespace: &str,
    head: ResponseHead<'_>,
) -> Answer {
    let matched;
    let templates: &[Arc<CompiledTemplate>] = match group {
        Some(group) => &group.templates,
        None => {
            matched = snapshot.matching(&pod.labels(), None);
            &matched
        }
    };
    let info = NamespaceInfo {
        name: namespace,
        labels: None,
    };
    // Every template in force, so that what another webhook entry injected is recognised.
    let plan = plan_among(&pod, &info, templates, snapshot);
    let mut answer = Answer::allowed(Outcome::Unchanged);
    answer.pod_name = (!pod.name().is_empty()).then(|| pod.name().to_owned());
    if let Some(message) = plan.denial_message() {
        answer.outcome = Outcome::Denied;
        answer.denial = Some(StatusOut {
            code: 403,
            message: format!("sidecar-injector: {message}"),
        });
        answer.denied_by = plan.denials.into_iter().map(|d| d.template).collect();
    } else if !plan.patch.is_empty() {
        match head.with_patch(&plan.patch) {
            Ok(patched) => {
                answer.outcome = Outcome::Injected;
                answer.patched = Some(patched);
            }
            Err(error) => {
                return Answer::denied(
                    Outcome::Denied,
                    500,
                    format!("sidecar-injector: cannot encode the patch: {error}"),
                );
            }
        }
    }
    answer.warnings = plan.warnings.iter().map(ToString::to_string).collect();
    answer.applied = plan.applied;
    answer
}

#[cfg(test)]
mod tests;
