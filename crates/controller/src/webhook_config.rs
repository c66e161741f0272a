//! The operator's own `MutatingWebhookConfiguration`, as a pure function of the registry
//! (docs/architecture.md, decision 2).
//!
//! [`desired_configuration`] turns a registry [`Snapshot`] into the configuration the leader
//! applies with server-side apply: one entry per selector group, in the order the API server
//! should call them (a group whose pod selector mentions a label another group's template
//! adds after that group, otherwise the group's lowest priority first: [`entry_order`]), each
//! pointing at `/mutate/<group>`
//! through the operator's Service (in a cluster) or a URL (out of cluster). Every entry
//! excludes `kube-system`, `kube-public`, `kube-node-lease`, the operator's own namespace and
//! namespaces labelled `sidecar.dev/injection=disabled`. With no templates the configuration
//! has no entries, so applying it removes the entries that were there. Entries that would take
//! it past [`MAX_CONFIGURATION_BYTES`] are left out ([`left_out`]) so that it can always be
//! applied; where a MutatingAdmissionPolicy serves templates, an entry skips the Pods it
//! provably served ([`desired_configuration_with_policy`]).
//!
//! [`drift`] (which says what differs) compares a desired configuration with
//! the one in the cluster on the fields the operator owns only, ignoring what the API server
//! defaults and what other field managers add: it tells the controller whether someone edited
//! its configuration and it should apply again.
//!
//! Nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeInclusive;

use injector_core::rules::selection;
use injector_core::syntax::{is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name};
use injector_core::{Group, GroupId, Snapshot};

use crate::entry_order::entry_order;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};

/// The suffix of every entry's name: the API server requires a fully qualified name of at least
/// three segments, so an entry is called `<group-id>.webhook.sidecar.dev`.
pub const ENTRY_NAME_SUFFIX: &str = "webhook.sidecar.dev";

/// The label set on the configuration to say who manages it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// The value of [`MANAGED_BY_LABEL`] on the configuration.
pub const MANAGED_BY: &str = "sidecar-injector";

/// The default `timeoutSeconds` of every entry.
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

/// The `timeoutSeconds` values the API server accepts.
pub const TIMEOUT_SECONDS_RANGE: RangeInclusive<i32> = 1..=30;

/// The most bytes the configuration may take as JSON; entries past it are left out
/// ([`desired_configuration`], docs/architecture.md, decision 19). etcd accepts objects of up
/// to 1.5 MiB by default; the rest is left for what the API server adds (`managedFields`,
/// metadata).
pub const MAX_CONFIGURATION_BYTES: usize = 1024 * 1024;

/// The port the API server uses for a service reference that names none.
const DEFAULT_SERVICE_PORT: i32 = 443;

/// Where the API server reaches the webhook (docs/architecture.md, decision 8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// In a cluster: through the operator's Service.
    Service {
        /// The Service's namespace (normally the operator's).
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service's port (1 to 65535).
        port: i32,
    },
    /// Out of cluster (local development, the e2e suite): by URL.
    Url {
        /// `https://host:port`, optionally with a path prefix, e.g. `https://127.0.0.1:8443`;
        /// each entry's URL is this followed by `/mutate/<group>`.
        base: String,
    },
}

impl Endpoint {
    /// The client configuration that calls `path` (`/mutate/<group>`) on this endpoint.
    fn client_config(&self, path: String, ca_bundle: Option<ByteString>) -> WebhookClientConfig {
        match self {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(path),
                    port: Some(*port),
                }),
                url: None,
            },
            Endpoint::Url { base } => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }
}

/// What the webhook configuration is made from, besides the registry and the CA.
#[derive(Clone, Debug, PartialEq)]
pub struct WebhookConfigOptions {
    /// The configuration's name (e.g. the helm release name).
    pub name: String,
    /// Where the API server reaches the webhook.
    pub endpoint: Endpoint,
    /// The operator's own namespace, excluded from every entry.
    pub operator_namespace: String,
    /// Every entry's `timeoutSeconds`, 1 to 30 ([`DEFAULT_TIMEOUT_SECONDS`] by default). A value
    /// out of range is clamped into it by [`desired_configuration`]; [`Self::validate`]
    /// rejects it.
    pub timeout_seconds: i32,
    /// The configuration's owner, if any, so that deleting the owner deletes the configuration.
    /// The configuration is cluster-scoped, so its owner must be cluster-scoped too (a
    /// namespaced owner, such as a Deployment, is never resolved by the garbage collector).
    pub owner: Option<OwnerReference>,
    /// Labels put on the configuration, besides `app.kubernetes.io/managed-by:
    /// sidecar-injector` (which wins over a label of the same key here).
    pub labels: BTreeMap<String, String>,
}

impl WebhookConfigOptions {
    /// Options with the default timeout, no owner and no extra labels.
    pub fn new(
        name: impl Into<String>,
        endpoint: Endpoint,
        operator_namespace: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            endpoint,
            operator_namespace: operator_namespace.into(),
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            owner: None,
            labels: BTreeMap::new(),
        }
    }

    /// Checks what the API server would reject in a configuration made from these options:
    /// call it once at start, so a bad flag fails there with a clear message rather than on
    /// every apply.
    pub fn validate(&self) -> Result<(), WebhookConfigError> {
        if !is_dns_subdomain(&self.name) {
            return Err(WebhookConfigError::InvalidName(self.name.clone()));
        }
        if !is_dns_label(&self.operator_namespace) {
            return Err(WebhookConfigError::InvalidNamespace(
                self.operator_namespace.clone(),
            ));
        }
        if !TIMEOUT_SECONDS_RANGE.contains(&self.timeout_seconds) {
            return Err(WebhookConfigError::TimeoutOutOfRange(self.timeout_seconds));
        }
        for (key, value) in &self.labels {
            if !is_qualified_name(key) || !is_label_value(value) {
                return Err(WebhookConfigError::InvalidLabel {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        match &self.endpoint {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => {
                let reason = if !is_dns_label(namespace) {
                    Some("the namespace is not a DNS-1123 label")
                } else if !is_dns_label(name) {
                    Some("the name is not a DNS-1123 label")
                } else if !(1..=65535).contains(port) {
                    Some("the port is not between 1 and 65535")
                } else {
                    None
                };
                match reason {
                    Some(reason) => Err(WebhookConfigError::InvalidService {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        port: *port,
                        reason,
                    }),
                    None => Ok(()),
                }
            }
            Endpoint::Url { base } => match url_problem(base) {
                Some(reason) => Err(WebhookConfigError::InvalidUrl {
                    base: base.clone(),
                    reason,
                }),
                None => Ok(()),
            },
        }
    }
}

/// Why the API server would reject a webhook URL built on `base`, if it would.
fn url_problem(base: &str) -> Option<&'static str> {
    let Some(rest) = base.strip_prefix("https://") else {
        return Some("the scheme must be https");
    };
    if base.contains(['?', '#']) {
        return Some("query parameters and fragments are not allowed");
    }
    if base.chars().any(char::is_whitespace) {
        return Some("whitespace is not allowed");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Some("user information is not allowed");
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Some("the host is missing");
    }
    None
}

/// Options the API server would reject (see [`WebhookConfigOptions::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WebhookConfigError {
    /// The configuration's name is not a DNS-1123 subdomain.
    #[error("webhook configuration name {0:?} is not a DNS-1123 subdomain")]
    InvalidName(String),
    /// The operator's namespace is not a DNS-1123 label.
    #[error("operator namespace {0:?} is not a DNS-1123 label")]
    InvalidNamespace(String),
    /// `timeoutSeconds` is outside 1 to 30.
    #[error("webhook timeout of {0} s is out of range: use 1 to 30 seconds")]
    TimeoutOutOfRange(i32),
    /// A label of the configuration has an invalid key or value.
    #[error("webhook configuration label {key:?}={value:?} is not a valid label")]
    InvalidLabel {
        /// The label's key.
        key: String,
        /// The label's value.
        value: String,
    },
    /// The webhook Service reference is invalid.
    #[error("webhook service {namespace}/{name}:{port}: {reason}")]
    InvalidService {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service's port.
        port: i32,
        /// What is wrong.
        reason: &'static str,
    },
    /// The webhook URL is invalid.
    #[error("webhook url {base:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        base: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// The name of the entry that serves `group_id`: `<group-id>.webhook.sidecar.dev`.
pub fn entry_name(group_id: &GroupId) -> String {
    format!("{group_id}.{ENTRY_NAME_SUFFIX}")
}

/// The configuration the operator wants in the cluster: one entry per selector group of
/// `snapshot` (at most [`MAX_GROUPS`](injector_core::MAX_GROUPS) unless their namespace
/// selectors differ: the snapshot merges the others), in [`entry_order`], each trusting
/// `ca_bundle_pem` (one or more PEM certificates; during a CA rotation, the old and the new CA).
/// An empty bundle leaves `caBundle` out, so the API server falls back to its system trust
/// roots.
///
/// The entries that would take the configuration past [`MAX_CONFIGURATION_BYTES`] (as JSON)
/// are left out, from the first that does not fit on, so that the configuration can always be
/// applied; [`left_out`] says which groups that leaves without an entry.
pub fn desired_configuration(
    snapshot: &Snapshot,
    options: &WebhookConfigOptions,
    ca_bundle_pem: &[u8],
) -> MutatingWebhookConfiguration {
    desired_configuration_with_policy(snapshot, options, ca_bundle_pem, &BTreeMap::new())
}

/// The annotation that keeps AKS's Admissions Enforcer away from the configuration.
pub const AKS_ENFORCER_ANNOTATION: &str = "admissions.enforcer/disabled";

/// [`desired_configuration`] where a MutatingAdmissionPolicy serves some templates: `present`
/// holds, per template it serves, the CEL condition that a Pod carries the template as the
/// policy adds it (`injector_core::policy::presence_conditions`). An entry whose templates all
/// have one skips the Pods that carry every template it would apply: the API server already
/// injected them, so they cost no call, and need no replica while the operator is down. A Pod
/// with a look-alike, or missing a template, still reaches the webhook.
pub fn desired_configuration_with_policy(
    snapshot: &Snapshot,
    options: &WebhookConfigOptions,
    ca_bundle_pem: &[u8],
    present: &BTreeMap<String, String>,
) -> MutatingWebhookConfiguration {
    let ca_bundle = (!ca_bundle_pem.is_empty()).then(|| ByteString(ca_bundle_pem.to_vec()));
    let namespace_exclusions = namespace_exclusions(&options.operator_namespace);
    let mut labels = options.labels.clone();
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    let mut configuration = MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(options.name.clone()),
            labels: Some(labels),
            // AKS's Admissions Enforcer otherwise adds its own namespace requirement to every
            // entry, which the operator would take for drift and put back, in turn.
            annotations: Some(BTreeMap::from([(
                AKS_ENFORCER_ANNOTATION.to_owned(),
                "true".to_owned(),
            )])),
            owner_references: options.owner.clone().map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        webhooks: Some(Vec::new()),
    };
    let mut bytes = json_size(&configuration);
    let webhooks = entry_order(snapshot)
        .groups
        .into_iter()
        .map(|group| {
            entry(
                group,
                options,
                &namespace_exclusions,
                ca_bundle.clone(),
                present,
            )
        })
        .take_while(|entry| {
            // One more for the comma between entries.
            bytes = bytes.saturating_add(json_size(entry)).saturating_add(1);
            bytes <= MAX_CONFIGURATION_BYTES
        })
        .collect();
    configuration.webhooks = Some(webhooks);
    configuration
}

/// The groups of `snapshot` that have no entry in `configuration` (left out by
/// [`desired_configuration`] because the configuration would not fit), in the snapshot's order.
pub fn left_out<'s>(
    snapshot: &'s Snapshot,
    configuration: &MutatingWebhookConfiguration,
) -> Vec<&'s Group> {
    let entries: BTreeSet<&str> = configuration
        .webhooks
        .iter()
        .flatten()
        .map(|entry| entry.name.as_str())
        .collect();
    snapshot
        .groups()
        .iter()
        .filter(|group| !entries.contains(entry_name(&group.id).as_str()))
        .map(AsRef::as_ref)
        .collect()
}

/// How many bytes `value` takes as JSON; what cannot be serialized counts as too large.
fn json_size(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(bytes.len());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// The requirements appended to every entry's namespace selector: core's excluded
/// namespaces, and the operator's own.
fn namespace_exclusions(operator_namespace: &str) -> [LabelSelectorRequirement; 2] {
    selection::namespace_exclusions(&[operator_namespace])
}

/// Pods, CREATE only.
fn pod_create_rule() -> RuleWithOperations {
    RuleWithOperations {
        operations: Some(vec!["CREATE".to_owned()]),
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".to_owned()]),
        resources: Some(vec!["pods".to_owned()]),
        scope: Some("Namespaced".to_owned()),
    }
}

/// The entry that serves `group`.
fn entry(
    group: &Group,
    options: &WebhookConfigOptions,
    namespace_exclusions: &[LabelSelectorRequirement],
    ca_bundle: Option<ByteString>,
    present: &BTreeMap<String, String>,
) -> MutatingWebhook {
    let mut namespace_selector = group.key.namespace_selector.to_label_selector();
    namespace_selector
        .match_expressions
        .get_or_insert_with(Vec::new)
        .extend_from_slice(namespace_exclusions);
    let object_selector =
        (!group.key.pod_selector.is_empty()).then(|| group.key.pod_selector.to_label_selector());
    MutatingWebhook {
        name: entry_name(&group.id),
        client_config: options.endpoint.client_config(group.id.path(), ca_bundle),
        rules: Some(vec![pod_create_rule()]),
        namespace_selector: Some(namespace_selector),
        object_selector,
        failure_policy: Some(group.key.failure_policy.as_str().to_owned()),
        side_effects: "None".to_owned(),
        admission_review_versions: vec!["v1".to_owned()],
        reinvocation_policy: Some("IfNeeded".to_owned()),
        match_policy: Some("Equivalent".to_owned()),
        timeout_seconds: Some(
            options
                .timeout_seconds
                .clamp(*TIMEOUT_SECONDS_RANGE.start(), *TIMEOUT_SECONDS_RANGE.end()),
        ),
        match_conditions: Some(match_conditions(group, present)).filter(|c| !c.is_empty()),
    }
}

/// The condition that skips Pods the policy served: every template of `group` that selects the
/// Pod is present by content (`present`); on a best-effort entry, also a Pod that opted out,
/// which the policy left alone as the webhook would (free here: the API server evaluates the
/// entry's conditions anyway). `None` unless every template has a presence condition, and for
/// a merged entry (its templates' pod selectors differ from the entry's, so which of them
/// select the Pod is not the entry's to say).
fn not_injected_by_policy(
    group: &Group,
    present: &BTreeMap<String, String>,
) -> Option<MatchCondition> {
    let mut terms = Vec::new();
    for template in &group.templates {
        if template.pod_selector != group.key.pod_selector {
            return None;
        }
        let condition = present.get(&template.name)?;
        terms.push(
            if template.injection == injector_api::Injection::OnRequest {
                format!(
                    "(!{} || ({condition}))",
                    selection::requests_cel(selection::ANNOTATIONS, [template.name.as_str()])
                )
            } else {
                format!("({condition})")
            },
        );
    }
    if terms.is_empty() {
        return None;
    }
    let mut skipped = terms.join(" && ");
    if group.key.failure_policy == injector_api::FailurePolicy::Ignore {
        skipped = format!(
            "{} || ({skipped})",
            selection::opts_out_cel(selection::ANNOTATIONS)
        );
    }
    Some(MatchCondition {
        name: "not-injected-by-policy".to_owned(),
        expression: format!("!({skipped})"),
    })
}

/// CEL conditions the API server checks before calling the webhook, only where they spare
/// calls that matter: a Pod that did not ask for any template of an `OnRequest`-only entry
/// (while the operator is down, a required one would fail it), and under `auto`, a Pod the
/// policy served.
///
/// No condition skips an opted-out Pod: the API server evaluates an entry's conditions on
/// every Pod the entry's selectors match, on a copy of the Pod made for CEL, and again in the
/// admission chain's second pass after the patch, so a condition costs every injected Pod's
/// CREATE more than the call it spares an opted-out one saves. The webhook skips an opted-out
/// Pod itself, and while the operator is down a best-effort entry lets it through as any Pod.
fn match_conditions(group: &Group, present: &BTreeMap<String, String>) -> Vec<MatchCondition> {
    let mut conditions = Vec::new();
    let on_request_only = group
        .templates
        .iter()
        .all(|t| t.injection == injector_api::Injection::OnRequest);
    if on_request_only {
        conditions.push(MatchCondition {
            name: "requested".to_owned(),
            expression: selection::requests_cel(
                selection::ANNOTATIONS,
                group.templates.iter().map(|t| t.name.as_str()),
            ),
        });
    }
    if let Some(condition) = not_injected_by_policy(group, present) {
        conditions.push(condition);
    }
    conditions
}

/// The first difference [`drift`] found between the desired configuration and the cluster's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// The entries differ in their names or their order.
    Entries {
        /// The names of the desired entries, in order.
        desired: Vec<String>,
        /// The names of the cluster's entries, in order.
        actual: Vec<String>,
    },
    /// A field the operator owns differs in one entry.
    Entry {
        /// The entry's name.
        entry: String,
        /// The field, as named in the API (`clientConfig`, `rules`, …).
        field: &'static str,
    },
    /// A label the operator sets is missing or has another value.
    Label {
        /// The label's key.
        key: String,
    },
    /// The owner reference the operator sets is missing.
    OwnerReference {
        /// The owner's uid.
        uid: String,
    },
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::Entries { desired, actual } => write!(
                f,
                "the entries are [{}], want [{}]",
                actual.join(", "),
                desired.join(", ")
            ),
            Drift::Entry { entry, field } => write!(f, "entry {entry}: {field} was changed"),
            Drift::Label { key } => write!(f, "label {key} was removed or changed"),
            Drift::OwnerReference { uid } => {
                write!(f, "the owner reference to {uid} was removed")
            }
        }
    }
}

/// The first difference between `desired` and `actual` (the configuration in the cluster) in a
/// field the operator owns, or `None` when applying `desired` again would change nothing the
/// operator cares about.
///
/// Compared: the entries' names and order, and in each entry `clientConfig` (with
/// `caBundle`), `rules`, `namespaceSelector`, `objectSelector`, `failurePolicy`,
/// `sideEffects`, `timeoutSeconds`, `reinvocationPolicy`, `admissionReviewVersions` and
/// `matchPolicy`; the labels and owner reference the operator sets must be there. Values the
/// API server defaults compare equal to their defaults (an absent `objectSelector` and `{}`,
/// an absent service port and 443, an absent rule scope and `*`, …). Ignored: metadata other
/// than those labels and owner reference (resource version, managed fields, other labels and
/// owners, annotations). `matchConditions` are compared by name and expression. (An entry added by another
/// field manager is reported, as a change of the set of entries, although applying again does
/// not remove it; server-side apply keeps the applied order of the entries since Kubernetes
/// 1.23, so applying again does fix a reordering.)
pub fn drift(
    desired: &MutatingWebhookConfiguration,
    actual: &MutatingWebhookConfiguration,
) -> Option<Drift> {
    let desired_entries = desired.webhooks.as_deref().unwrap_or_default();
    let actual_entries = actual.webhooks.as_deref().unwrap_or_default();
    let same_names = desired_entries.len() == actual_entries.len()
        && desired_entries
            .iter()
            .zip(actual_entries)
            .all(|(d, a)| d.name == a.name);
    if !same_names {
        let names = |entries: &[MutatingWebhook]| entries.iter().map(|e| e.name.clone()).collect();
        return Some(Drift::Entries {
            desired: names(desired_entries),
            actual: names(actual_entries),
        });
    }
    for (d, a) in desired_entries.iter().zip(actual_entries) {
        if let Some(field) = entry_drift(d, a) {
            return Some(Drift::Entry {
                entry: d.name.clone(),
                field,
            });
        }
    }
    let actual_labels = actual.metadata.labels.as_ref();
    for (key, value) in desired.metadata.labels.iter().flatten() {
        if actual_labels.and_then(|labels| labels.get(key)) != Some(value) {
            return Some(Drift::Label { key: key.clone() });
        }
    }
    let actual_owners = actual
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    for owner in desired.metadata.owner_references.iter().flatten() {
        if !actual_owners.iter().any(|o| o.uid == owner.uid) {
            return Some(Drift::OwnerReference {
                uid: owner.uid.clone(),
            });
        }
    }
    None
}

/// The first owned field that differs between two entries of the same name.
fn entry_drift(desired: &MutatingWebhook, actual: &MutatingWebhook) -> Option<&'static str> {
    let or = |value: &Option<String>, default: &'static str| -> String {
        value.clone().unwrap_or_else(|| default.to_owned())
    };
    let checks: [(&'static str, bool); 11] = [
        (
            "matchConditions",
            desired.match_conditions.as_deref().unwrap_or_default()
                == actual.match_conditions.as_deref().unwrap_or_default(),
        ),
        (
            "clientConfig",
            canonical_client_config(&desired.client_config)
                == canonical_client_config(&actual.client_config),
        ),
        (
            "rules",
            canonical_rules(desired.rules.as_deref()) == canonical_rules(actual.rules.as_deref()),
        ),
        (
            "namespaceSelector",
            canonical_selector(desired.namespace_selector.as_ref())
                == canonical_selector(actual.namespace_selector.as_ref()),
        ),
        (
            "objectSelector",
            canonical_selector(desired.object_selector.as_ref())
                == canonical_selector(actual.object_selector.as_ref()),
        ),
        (
            "failurePolicy",
            or(&desired.failure_policy, "Fail") == or(&actual.failure_policy, "Fail"),
        ),
        ("sideEffects", desired.side_effects == actual.side_effects),
        (
            "timeoutSeconds",
            desired.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS)
                == actual.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        ),
        (
            "reinvocationPolicy",
            or(&desired.reinvocation_policy, "Never") == or(&actual.reinvocation_policy, "Never"),
        ),
        (
            "admissionReviewVersions",
            desired.admission_review_versions == actual.admission_review_versions,
        ),
        (
            "matchPolicy",
            or(&desired.match_policy, "Equivalent") == or(&actual.match_policy, "Equivalent"),
        ),
    ];
    checks
        .into_iter()
        .find(|(_, same)| !same)
        .map(|(field, _)| field)
}

/// A client configuration with the API server's defaults filled in.
fn canonical_client_config(config: &WebhookClientConfig) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: config
            .ca_bundle
            .clone()
            .filter(|bundle| !bundle.0.is_empty()),
        service: config.service.as_ref().map(|service| ServiceReference {
            port: Some(service.port.unwrap_or(DEFAULT_SERVICE_PORT)),
            ..service.clone()
        }),
        url: config.url.clone(),
    }
}

/// Rules with the API server's defaults filled in.
fn canonical_rules(rules: Option<&[RuleWithOperations]>) -> Vec<RuleWithOperations> {
    rules
        .unwrap_or_default()
        .iter()
        .map(|rule| RuleWithOperations {
            scope: Some(rule.scope.clone().unwrap_or_else(|| "*".to_owned())),
            ..rule.clone()
        })
        .collect()
}

/// A selector where absent and empty mean the same (the API server defaults a missing
/// selector to `{}`).
fn canonical_selector(selector: Option<&LabelSelector>) -> LabelSelector {
    let selector = selector.cloned().unwrap_or_default();
    LabelSelector {
        match_labels: selector.match_labels.filter(|labels| !labels.is_empty()),
        match_expressions: selector
            .match_expressions
            .filter(|expressions| !expressions.is_empty())
            .map(|expressions| {
                expressions
                    .into_iter()
                    .map(|requirement| LabelSelectorRequirement {
                        values: requirement.values.filter(|values| !values.is_empty()),
                        ..requirement
                    })
                    .collect()
            }),
    }
}

#[cfg(test)]
pub(crate) mod tests;
