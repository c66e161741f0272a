//! The chart's release as the tests see it: what `helm install` creates, what the operator
//! creates at run time (owned by the chart's ClusterRole, so garbage-collected with the
//! release), the `kubectl auth can-i` matrix of its ServiceAccount, and what `helm uninstall`
//! may leave (only the CRD, which the chart keeps: `helm.sh/resource-policy: keep`).

use std::time::Duration;

use anyhow::{bail, ensure};

use crate::ControlPlane;

/// A release of `charts/sidecar-injector`: its namespace and its full name, which names every
/// object it creates (the Deployment, the Service, the RBAC, the webhook configuration).
#[derive(Clone, Copy, Debug)]
pub struct Release<'a> {
    /// `--namespace` of the install.
    pub namespace: &'a str,
    /// The chart's full name (`<release>-sidecar-injector`, or the release name when it
    /// contains the chart's).
    pub fullname: &'a str,
}

/// The kinds `helm install` creates with the default values, each named after the release
/// (`true`: namespaced, in the release's namespace).
pub const INSTALLED: [(&str, bool); 9] = [
    ("deployment", true),
    ("service", true),
    ("serviceaccount", true),
    ("poddisruptionbudget", true),
    ("networkpolicy", true),
    ("role", true),
    ("rolebinding", true),
    ("clusterrole", false),
    ("clusterrolebinding", false),
];

/// The CRD: one of the chart's templates (so `helm upgrade` upgrades it), kept on `helm
/// uninstall` by its `helm.sh/resource-policy: keep` (the default `crds.keep`).
pub const CRD: &str = "sidecartemplates.sidecar.dev";

impl Release<'_> {
    /// The Secret holding the CA and the serving certificate.
    pub fn secret(&self) -> String {
        format!("{}-tls", self.fullname)
    }

    /// The leader-election Lease.
    pub fn lease(&self) -> String {
        format!("{}-leader", self.fullname)
    }

    /// The ValidatingAdmissionPolicy and binding that hold the operator's ServiceAccount to
    /// what RBAC cannot limit (`leastPrivilegePolicy.enabled`, the default, on Kubernetes
    /// 1.30+).
    pub fn least_privilege_policy(&self) -> String {
        format!("{}-least-privilege", self.fullname)
    }

    /// The operator's ServiceAccount, as a user name for `--as`.
    pub fn service_account(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.fullname)
    }

    /// What the operator creates at run time, which uninstalling must remove: (kind,
    /// namespace, name).
    pub fn created_at_run_time(&self) -> [(&'static str, Option<&str>, String); 3] {
        [
            (
                "mutatingwebhookconfiguration",
                None,
                self.fullname.to_owned(),
            ),
            ("secret", Some(self.namespace), self.secret()),
            ("lease", Some(self.namespace), self.lease()),
        ]
    }

    /// Every object `helm install` creates (default values): (kind, namespace).
    pub fn installed(&self) -> impl Iterator<Item = (&'static str, Option<&str>)> {
        INSTALLED
            .into_iter()
            .map(|(kind, namespaced)| (kind, namespaced.then_some(self.namespace)))
    }

    /// Fails unless the three objects the operator created are owned by the chart's
    /// ClusterRole (what makes garbage collection delete them with the release).
    pub fn check_owned(&self, cp: &ControlPlane) -> anyhow::Result<()> {
        let owner_uid = cp.get_json("clusterrole", None, self.fullname)?["metadata"]["uid"].clone();
        for (kind, namespace, name) in self.created_at_run_time() {
            let object = cp.get_json(kind, namespace, &name)?;
            let owners = &object["metadata"]["ownerReferences"];
            ensure!(
                owners
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|o| o["kind"] == "ClusterRole" && o["uid"] == owner_uid),
                "{kind} {name} is not owned by ClusterRole {}: {owners}",
                self.fullname
            );
        }
        Ok(())
    }

    /// The objects of the release, and those the operator created, still there.
    pub fn leftovers(&self, cp: &ControlPlane) -> anyhow::Result<Vec<String>> {
        let mut left = Vec::new();
        for (kind, namespace, name) in self.created_at_run_time() {
            if cp.try_get_json(kind, namespace, &name)?.is_some() {
                left.push(format!("{kind}/{name}"));
            }
        }
        for (kind, namespace) in self.installed() {
            if cp.try_get_json(kind, namespace, self.fullname)?.is_some() {
                left.push(format!("{kind}/{}", self.fullname));
            }
        }
        let policy = self.least_privilege_policy();
        for kind in [
            "validatingadmissionpolicy",
            "validatingadmissionpolicybinding",
        ] {
            if cp.try_get_json(kind, None, &policy)?.is_some() {
                left.push(format!("{kind}/{policy}"));
            }
        }
        Ok(left)
    }

    /// Waits until [`Release::leftovers`] is empty (garbage collection removes what the
    /// operator created once helm has deleted the owning ClusterRole).
    pub fn wait_uninstalled(&self, cp: &ControlPlane) -> anyhow::Result<()> {
        crate::poll_every(
            Duration::from_secs(60),
            Duration::from_secs(1),
            "nothing left after helm uninstall",
            || {
                let left = self.leftovers(cp)?;
                if !left.is_empty() {
                    eprintln!("[e2e] still there: {}", left.join(", "));
                }
                Ok(left.is_empty().then_some(()))
            },
        )
    }

    /// `kubectl auth can-i` as the release's ServiceAccount: what the operator needs is
    /// allowed, and nothing around it; restarting workloads only when the release has
    /// `rollouts.enabled`. `namespace_groups`: how many namespace groups' bindings the
    /// operator may write beside its policy's own (`NAMESPACE_BINDING_SLOTS`).
    pub fn can_i_matrix(
        &self,
        cp: &ControlPlane,
        rollouts: bool,
        namespace_groups: usize,
    ) -> anyhow::Result<()> {
        let (ns, name) = (self.namespace, self.fullname);
        let (secret, lease) = (
            format!("secrets/{}", self.secret()),
            format!("leases.coordination.k8s.io/{}", self.lease()),
        );
        let configuration = format!("mutatingwebhookconfigurations/{name}");
        let cluster_role = format!("clusterroles/{name}");
        let policy = format!("mutatingadmissionpolicies.admissionregistration.k8s.io/{name}");
        let proof = format!("{policy}-proof");
        let binding =
            format!("mutatingadmissionpolicybindings.admissionregistration.k8s.io/{name}");
        let last_group = format!("{binding}-namespaces-{}", namespace_groups - 1);
        let past_the_groups = format!("{binding}-namespaces-{namespace_groups}");
        let guard =
            format!("validatingadmissionpolicies.admissionregistration.k8s.io/{name}-guard");
        let warnings =
            format!("validatingadmissionpolicies.admissionregistration.k8s.io/{name}-warnings");
        let guard_binding =
            format!("validatingadmissionpolicybindings.admissionregistration.k8s.io/{name}-guard");
        let warnings_group = format!(
            "validatingadmissionpolicybindings.admissionregistration.k8s.io/{name}-warnings-namespaces-{}",
            namespace_groups - 1
        );
        let past_the_warnings_groups = format!(
            "validatingadmissionpolicybindings.admissionregistration.k8s.io/{name}-warnings-namespaces-{namespace_groups}"
        );
        let after_admission = format!(
            "validatingadmissionpolicies.admissionregistration.k8s.io/{name}-after-admission"
        );
        let after_admission_binding = format!(
            "validatingadmissionpolicybindings.admissionregistration.k8s.io/{name}-after-admission"
        );
        // (verb, resource, namespace, allowed)
        let matrix: &[(&str, &str, Option<&str>, bool)] = &[
            // What it needs.
            ("list", "sidecartemplates.sidecar.dev", None, true),
            ("watch", "sidecartemplates.sidecar.dev", None, true),
            ("patch", "sidecartemplates.sidecar.dev/status", None, true),
            ("create", "events.events.k8s.io", Some("default"), true),
            ("create", "mutatingwebhookconfigurations", None, true),
            ("patch", &configuration, None, true),
            ("watch", &configuration, None, true),
            ("get", &secret, Some(ns), true),
            ("update", &secret, Some(ns), true),
            ("create", "secrets", Some(ns), true),
            ("update", &lease, Some(ns), true),
            ("create", "leases.coordination.k8s.io", Some(ns), true),
            ("get", &cluster_role, None, true),
            // The leader's Pod census: metadata watches of Pods and Namespaces.
            ("list", "pods", None, true),
            ("watch", "pods", None, true),
            ("list", "namespaces", None, true),
            ("watch", "namespaces", None, true),
            // To add its owner to a Secret or Lease written before an upgrade, under the
            // OwnerReferencesPermissionEnforcement admission plugin (the local API server has
            // it on).
            ("delete", &secret, Some(ns), true),
            ("delete", &lease, Some(ns), true),
            // The policy backend: its policy, proof policy and bindings; a dry-run proof Pod.
            (
                "create",
                "mutatingadmissionpolicies.admissionregistration.k8s.io",
                None,
                true,
            ),
            ("patch", &policy, None, true),
            ("patch", &proof, None, true),
            ("delete", &policy, None, true),
            ("patch", &binding, None, true),
            ("patch", &last_group, None, true),
            ("delete", &last_group, None, true),
            ("patch", &past_the_groups, None, false),
            ("create", "pods", Some(ns), true),
            (
                "patch",
                "mutatingadmissionpolicies.admissionregistration.k8s.io/other",
                None,
                false,
            ),
            (
                "delete",
                "mutatingadmissionpolicybindings.admissionregistration.k8s.io/other",
                None,
                false,
            ),
            (
                "list",
                "mutatingadmissionpolicies.admissionregistration.k8s.io",
                None,
                false,
            ),
            // The guard of the policy backend.
            (
                "create",
                "validatingadmissionpolicies.admissionregistration.k8s.io",
                None,
                true,
            ),
            ("patch", &guard, None, true),
            ("patch", &warnings, None, true),
            ("delete", &guard_binding, None, true),
            ("patch", &warnings_group, None, true),
            ("patch", &past_the_warnings_groups, None, false),
            // The after-admission policy, on every backend.
            ("patch", &after_admission, None, true),
            ("delete", &after_admission_binding, None, true),
            (
                "patch",
                "validatingadmissionpolicies.admissionregistration.k8s.io/other",
                None,
                false,
            ),
            (
                "list",
                "validatingadmissionpolicies.admissionregistration.k8s.io",
                None,
                false,
            ),
            // Other Secrets, here and elsewhere.
            ("get", "secrets/other", Some(ns), false),
            ("list", "secrets", Some(ns), false),
            ("get", "secrets", Some("kube-system"), false),
            ("list", "secrets", None, false),
            // Other webhook configurations.
            ("list", "mutatingwebhookconfigurations", None, false),
            ("patch", "mutatingwebhookconfigurations/other", None, false),
            ("delete", "mutatingwebhookconfigurations/other", None, false),
            (
                "update",
                "validatingwebhookconfigurations/other",
                None,
                false,
            ),
            ("create", "validatingwebhookconfigurations", None, false),
            // Rollouts: restarting workloads, only with rollouts.enabled; never more.
            ("patch", "deployments.apps", Some("default"), rollouts),
            ("get", "deployments.apps", Some("default"), rollouts),
            ("patch", "statefulsets.apps", Some("default"), rollouts),
            ("patch", "daemonsets.apps", Some("default"), rollouts),
            ("get", "replicasets.apps", Some("default"), rollouts),
            ("patch", "pods", Some("default"), rollouts),
            ("get", "pods", Some("default"), rollouts),
            ("patch", "replicasets.apps", Some("default"), false),
            ("create", "deployments.apps", Some("default"), false),
            ("delete", "deployments.apps", Some("default"), false),
            ("list", "deployments.apps", None, false),
            // Pods, anywhere: the census only lists and watches (InPlace gets and patches).
            ("create", "pods", Some("default"), false),
            ("delete", "pods", Some(ns), false),
            ("update", "pods/status", Some("default"), false),
            ("get", "pods/log", Some("default"), false),
            ("create", "pods/exec", Some("default"), false),
            ("patch", "namespaces/default", None, false),
            // The templates themselves, other Leases, RBAC.
            ("update", "sidecartemplates.sidecar.dev", None, false),
            ("delete", "sidecartemplates.sidecar.dev", None, false),
            (
                "update",
                "leases.coordination.k8s.io/other",
                Some(ns),
                false,
            ),
            ("update", &cluster_role, None, false),
            ("create", "clusterrolebindings", None, false),
            ("bind", "clusterroles", None, false),
            ("escalate", "clusterroles", None, false),
            ("impersonate", "serviceaccounts", Some(ns), false),
            ("*", "*", None, false),
        ];
        // kubectl resolves a resource through discovery, and answers no for one the API server
        // does not serve: MutatingAdmissionPolicies are served from Kubernetes 1.36 on.
        let policies_served = cp.serves_mutating_admission_policies()?;
        let service_account = self.service_account();
        let mut wrong = Vec::new();
        for &(verb, resource, namespace, allowed) in matrix {
            if resource.starts_with("mutatingadmissionpolic") && !policies_served {
                continue;
            }
            // kubectl reads `resource/name`; a subresource is a flag of its own.
            let mut args = vec!["auth", "can-i", verb, "--as", &service_account];
            let subresource = ["status", "log", "exec"].into_iter().find_map(|sub| {
                resource
                    .strip_suffix(sub)
                    .and_then(|base| base.strip_suffix('/'))
                    .map(|base| (base, sub))
            });
            match subresource {
                Some((base, sub)) => args.extend([base, "--subresource", sub]),
                None => args.push(resource),
            }
            match namespace {
                Some(ns) => args.extend(["--namespace", ns]),
                None => args.push("--all-namespaces"),
            }
            let out = cp.kubectl(&args)?;
            let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let yes = match answer.as_str() {
                "yes" => true,
                "no" => false,
                _ => bail!(
                    "kubectl auth can-i {verb} {resource}: {answer:?} {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
            };
            let scope = namespace.unwrap_or("cluster");
            eprintln!("[e2e] can-i {verb:<11} {resource:<60} {scope:<17} {answer}");
            if yes != allowed {
                wrong.push(format!(
                    "{verb} {resource} ({scope}): {answer}, expected {}",
                    if allowed { "yes" } else { "no" }
                ));
            }
        }
        ensure!(
            wrong.is_empty(),
            "RBAC matrix mismatches:\n{}",
            wrong.join("\n")
        );
        Ok(())
    }
}
