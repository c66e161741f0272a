//! Annotation and label names that users and the injector share.

/// Pod annotation: `"false"` opts the Pod out of every best-effort template (required ones
/// still apply).
pub const INJECT_ANNOTATION: &str = "sidecar.dev/inject";

/// Pod annotation: a comma-separated list of `OnRequest` template names to apply.
pub const TEMPLATES_ANNOTATION: &str = "sidecar.dev/templates";

/// Pod annotation written by the injector: the templates found in the Pod by their content, as
/// `name@generation#fingerprint` separated by commas. The fingerprint is 16 hex digits of what
/// the template injects, everything but the images in the first 8 and the images in the last 8,
/// so an edit that changes only the generation (a priority, a selector) leaves the Pod current
/// and one that changes only images can be made in place. An entry without a fingerprint
/// (written before there were any) counts as stale. A record, never read as input: a Pod
/// claiming a template it does not carry gets it.
pub const INJECTED_ANNOTATION: &str = "sidecar.dev/injected";

/// On a Deployment, StatefulSet or DaemonSet: `disabled` keeps every template's rollout from
/// restarting it (its stale and missing Pods are reported, never touched).
pub const ROLLOUT_ANNOTATION: &str = "sidecar.dev/rollout";

/// The value of [`ROLLOUT_ANNOTATION`] that opts a workload out of rollouts.
pub const ROLLOUT_DISABLED: &str = "disabled";

/// On a workload the operator restarted: `template#fingerprint` for each template whose
/// version it was restarted for (comma-separated), so it is restarted once per version.
pub const RESTARTED_FOR_ANNOTATION: &str = "sidecar.dev/restarted-for";

/// On a restarted workload's Pod template: when the operator restarted it (RFC 3339), as
/// `kubectl rollout restart` writes `kubectl.kubernetes.io/restartedAt`.
pub const RESTARTED_AT_ANNOTATION: &str = "sidecar.dev/restartedAt";

/// The prefix of every label and annotation key the injector reads or writes. A template may not
/// add such a key: it would switch off or fake the injector's own controls for the Pod.
pub const RESERVED_PREFIX: &str = "sidecar.dev/";

/// Namespace label: `disabled` opts every Pod of the namespace out.
pub const INJECTION_LABEL: &str = "sidecar.dev/injection";

/// The value of [`INJECTION_LABEL`] that opts a namespace out.
pub const INJECTION_DISABLED: &str = "disabled";

/// The label the API server sets on every namespace to its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Namespaces no template ever applies to.
pub const ALWAYS_EXCLUDED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// A DNS-1123 label (at most 63 characters), as a regular expression. Container, volume and
/// template names must match it.
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// On the operator's dry-run proof Pod: which compiled policy (its hash) the Pod is a proof of;
/// only the proof policy of that hash applies to it.
pub const POLICY_PROOF_ANNOTATION: &str = "sidecar.dev/policy-proof";

/// On a proof Pod: which round of the proof it is (absent: the first). Templates that add
/// items of the same name cannot show on one Pod, so each round's Pod shows some of them.
pub const POLICY_PROOF_ROUND_ANNOTATION: &str = "sidecar.dev/policy-proof-round";

/// Written on the proof Pod by the proof policy's last mutation: that policy ran to the end.
pub const POLICY_PROVEN_ANNOTATION: &str = "sidecar.dev/policy-proven";
