//! `sidecar-injector policy` on the examples: the policy and its bindings as YAML, and which
//! backend serves each template.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use injector_cli::policy::{PolicyRequest, policy};
use injector_core::policy::PolicyOptions;

#[test]
fn the_examples_compile_into_one_policy_and_its_bindings() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let output = policy(&PolicyRequest {
        template_files: vec![examples],
        options: PolicyOptions {
            name: "injector".into(),
            operator_namespace: "injector-system".into(),
            webhook_behind: true,
        },
    })
    .unwrap();
    let documents: Vec<&str> = output.stdout.split("\n---\n").collect();
    assert_eq!(documents.len(), 3, "{}", output.stdout);
    assert!(documents[0].starts_with(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingAdmissionPolicy\n"
    ));
    assert!(
        documents[0].contains("request.namespace != \"injector-system\""),
        "{}",
        documents[0]
    );
    // One template, whose mutation ends with the mark of a dry run asking whether this
    // version runs: each mutation costs every Pod CREATE an encode and decode of the Pod.
    assert_eq!(documents[0].matches("patchType: JSONPatch").count(), 1);
    assert!(documents[0].contains("sidecar.dev~1policy-proven"));
    // The one template served selects namespaces: the policy is bound to those (but the
    // operator's), and by its own name to the operator's namespace, for the dry run asking
    // whether this version runs.
    for binding in &documents[1..] {
        assert!(binding.contains("kind: MutatingAdmissionPolicyBinding\n"));
        assert!(
            binding.trim_end().ends_with("policyName: injector"),
            "{binding}"
        );
    }
    assert!(
        documents[1].contains("name: injector\n")
            && documents[1].contains("kubernetes.io/metadata.name: injector-system\n"),
        "{}",
        documents[1]
    );
    assert!(
        documents[2].contains("name: injector-namespaces-0\n")
            && documents[2].contains("security: enforced\n")
            && documents[2].contains("operator: NotIn\n"),
        "{}",
        documents[2]
    );
    // In application order (priority, then name). `app-env` stays on the webhook, which is
    // called after the policy: the templates after it that may select the same Pods stay with
    // it, so that they apply in order.
    assert_eq!(
        output.stderr,
        "security-agent: served by the policy\n\
         app-env: webhook only: appContainers.envFrom is compared by content, which a policy cannot do\n\
         native-proxy: webhook only: SidecarTemplate \"app-env\" applies before it and may select the same Pods, but is left to the webhook, called after the policy\n\
         nginx-sidecar: webhook only: SidecarTemplate \"native-proxy\" applies before it and may select the same Pods, but is left to the webhook, called after the policy\n\
         log-shipper: webhook only: SidecarTemplate \"native-proxy\" applies before it and may select the same Pods, but is left to the webhook, called after the policy\n"
    );
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let error = policy(&PolicyRequest {
        template_files: vec!["/nonexistent/templates.yaml".into()],
        options: PolicyOptions {
            name: "x".into(),
            operator_namespace: "y".into(),
            webhook_behind: true,
        },
    })
    .unwrap_err();
    assert!(
        error.to_string().contains("/nonexistent/templates.yaml"),
        "{error}"
    );
}
