#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

/// The operator's Deployment as the chart renders it for release `prod` in `infra` with
/// `fullnameOverride: injector` (templates/deployment.yaml, its container only), with
/// `extra_args` after the chart's and `extra_env` as `extraEnv`.
fn rendered(extra_args: &str, extra_env: &str) -> Deployment {
    let yaml = format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: injector
  namespace: infra
  labels:
    app.kubernetes.io/name: sidecar-injector
    app.kubernetes.io/instance: prod
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: sidecar-injector
      app.kubernetes.io/instance: prod
  template:
    metadata:
      labels:
        app.kubernetes.io/name: sidecar-injector
        app.kubernetes.io/instance: prod
    spec:
      serviceAccountName: injector
      containers:
        - name: sidecar-injector
          image: "ghcr.io/example/sidecar-injector:0.1.0"
          args:
            - run
            - --namespace
            - $(POD_NAMESPACE)
            - --service-name
            - injector
            - --service-port
            - "443"
            - --webhook-config-name
            - injector
            - --secret-name
            - injector-tls
            - --lease-name
            - injector-leader
            - --owner-cluster-role
            - injector
            - --ca-lifetime
            - "365d"
            - --serving-lifetime
            - "90d"
            - --timeout-seconds
            - "10"
            - --injection-backend
            - "auto"
            - --policy-name
            - injector
            - --drain-period
            - "10s"
            - --listen
            - "0.0.0.0:8443"
            - --admin-listen
            - "0.0.0.0:8080"
            - --log-format
            - json
            - --log
            - "info"
{extra_args}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: MIMALLOC_PURGE_DELAY
              value: "0"
{extra_env}
"#
    );
    serde_saphyr::from_str(&yaml).unwrap()
}

/// `deployment` with its container's arguments replaced by `args`.
fn with_args(mut deployment: Deployment, args: &[&str]) -> Deployment {
    let spec = deployment.spec.as_mut().unwrap().template.spec.as_mut();
    spec.unwrap().containers[0].args = Some(args.iter().map(|a| (*a).to_owned()).collect());
    deployment
}

fn assumed() -> Names {
    Names::of_release("infra", "prod", None)
}

#[test]
fn names_are_read_from_a_deployment_rendered_with_a_fullname_override() {
    let names = operator_names(&Read::Found(rendered("", "")), assumed());
    assert_eq!(
        names,
        Names {
            namespace: "infra".to_owned(),
            deployment: "injector".to_owned(),
            service: "injector".to_owned(),
            webhook_configuration: "injector".to_owned(),
            secret: "injector-tls".to_owned(),
            lease: "injector-leader".to_owned(),
            policy: "injector".to_owned(),
            source: Source::Deployment,
        }
    );
    assert_eq!(names.guard(), "injector-guard");
    assert_eq!(names.service_host(), "injector.infra.svc");
    // What the release's name alone would have given, and the chart did not make.
    assert_eq!(assumed().secret, "prod-sidecar-injector-tls");
}

#[test]
fn the_operators_own_rules_apply_to_its_flags_and_variables() {
    // A flag given again (extraArgs) wins, as in the operator, and a flag wins over its
    // variable; a reference to a known variable is expanded, as the kubelet does.
    let deployment = rendered(
        "            - --lease-name=$(LEASE)\n            - --secret-name\n            - custom-tls",
        "            - name: LEASE\n              value: custom-$(POD_NAMESPACE)\n            - name: SIDECAR_INJECTOR_SERVICE\n              value: from-env-but-flagged",
    );
    let names = operator_names(&Read::Found(deployment), assumed());
    assert_eq!(names.source, Source::Deployment);
    assert_eq!(names.lease, "custom-infra");
    assert_eq!(names.secret, "custom-tls");
    assert_eq!(names.service, "injector");
    assert_eq!(names.policy, "injector");
    // Without the chart's flags: a variable sets what no flag does, and a flag neither given
    // nor set by a variable has the operator's default, not the chart's.
    let bare = with_args(
        rendered(
            "",
            "            - name: SIDECAR_INJECTOR_POLICY_NAME\n              value: from-env",
        ),
        &["run"],
    );
    let names = operator_names(&Read::Found(bare), assumed());
    assert_eq!(names.policy, "from-env");
    assert_eq!(names.secret, "sidecar-injector-tls");
    assert_eq!(names.lease, "sidecar-injector-leader");
    assert_eq!(names.namespace, "infra");
}

#[test]
fn names_are_assumed_and_say_why_when_the_deployment_cannot_tell() {
    let why = |names: Names| match names.source {
        Source::Assumed(why) => why,
        Source::Deployment => panic!("read: {names:?}"),
    };
    let names = operator_names(&Read::Missing, assumed());
    assert_eq!(names.secret, "prod-sidecar-injector-tls");
    assert_eq!(
        why(names),
        "deployment/prod-sidecar-injector -n infra not found"
    );
    let forbidden = operator_names(&Read::Forbidden("no".to_owned()), assumed());
    assert!(why(forbidden).contains("forbidden (no)"));
    // No container runs the operator.
    let other = with_args(rendered("", ""), &["serve"]);
    assert!(!runs_operator(&other));
    let why_other = why(operator_names(&Read::Found(other), assumed()));
    assert!(why_other.contains("no container runs"), "{why_other}");
    // A flag this version does not know.
    let newer = rendered("            - --flag-of-a-later-version", "");
    let why_newer = why(operator_names(&Read::Found(newer), assumed()));
    assert!(
        why_newer.contains("the arguments of container sidecar-injector do not parse"),
        "{why_newer}"
    );
}

#[test]
fn references_are_expanded_as_the_kubelet_does() {
    let env = BTreeMap::from([("A".to_owned(), "x".to_owned())]);
    assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
    assert_eq!(expand("$(A", &env), "$(A");
}

#[test]
fn assumed_names_follow_the_charts_fullname() {
    let default = Names::of_release("sidecar-injector", "sidecar-injector", None);
    assert_eq!(default.deployment, "sidecar-injector");
    assert_eq!(default.secret, "sidecar-injector-tls");
    assert_eq!(default.lease, "sidecar-injector-leader");
    assert_eq!(default.guard(), "sidecar-injector-guard");
    assert_eq!(assumed().service, "prod-sidecar-injector");
    assert_eq!(
        Names::of_release("infra", "my-sidecar-injector", None).webhook_configuration,
        "my-sidecar-injector"
    );
    assert_eq!(
        Names::of_release("infra", "prod", Some("injector")).policy,
        "injector"
    );
    // Cut at 52 characters, without a trailing dash.
    let long = Names::of_release("infra", &"a".repeat(51), None);
    assert_eq!(long.deployment, "a".repeat(51));
}
