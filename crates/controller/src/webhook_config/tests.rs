#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_core::{Registry, compile};
use serde_json::{Value, json};

use super::*;

const CA: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";

/// A SidecarTemplate from YAML (apiVersion and kind are filled in).
fn parse_template(yaml: &str) -> SidecarTemplate {
    let mut value: Value = serde_saphyr::from_str(yaml).unwrap();
    value["apiVersion"] = "sidecar.dev/v1alpha1".into();
    value["kind"] = "SidecarTemplate".into();
    serde_json::from_value(value).unwrap()
}

/// A template called `name` with this priority, failure policy and selectors (YAML flow
/// mappings, `{}` for everything).
fn template(
    name: &str,
    priority: i32,
    policy: &str,
    namespace_selector: &str,
    pod_selector: &str,
) -> SidecarTemplate {
    parse_template(&format!(
        "metadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  failurePolicy: {policy}\n  namespaceSelector: {namespace_selector}\n  podSelector: {pod_selector}\n  containers: [{{name: {name}, image: x}}]"
    ))
}

fn snapshot_of(templates: &[SidecarTemplate]) -> Arc<Snapshot> {
    let mut registry = Registry::new();
    for t in templates {
        registry.apply(compile(t).unwrap_or_else(|e| panic!("{e}")));
    }
    registry.snapshot()
}

pub(crate) fn service_options() -> WebhookConfigOptions {
    WebhookConfigOptions::new(
        "sidecar-injector",
        Endpoint::Service {
            namespace: "sidecar-system".into(),
            name: "sidecar-injector-webhook".into(),
            port: 8443,
        },
        "sidecar-system",
    )
}

fn url_options(base: &str) -> WebhookConfigOptions {
    WebhookConfigOptions::new(
        "sidecar-injector",
        Endpoint::Url { base: base.into() },
        "sidecar-system",
    )
}

/// Three groups: `web` (Fail, priority 10, two templates), `db` (Ignore, priority 5) and
/// `all` (Fail, priority 50, every pod of namespaces labelled team=a).
fn three_groups() -> Arc<Snapshot> {
    snapshot_of(&[
        template("web-a", 10, "Fail", "{}", "{matchLabels: {app: web}}"),
        template("web-b", 20, "Fail", "{}", "{matchLabels: {app: web}}"),
        template("db", 5, "Ignore", "{}", "{matchLabels: {app: db}}"),
        template("all", 50, "Fail", "{matchLabels: {team: a}}", "{}"),
    ])
}

fn webhooks(config: &MutatingWebhookConfiguration) -> &[MutatingWebhook] {
    config.webhooks.as_deref().unwrap()
}

fn names(config: &MutatingWebhookConfiguration) -> Vec<&str> {
    webhooks(config).iter().map(|w| w.name.as_str()).collect()
}

fn group_of<'a>(snapshot: &'a Snapshot, template: &str) -> &'a GroupId {
    let t = snapshot.get(template).unwrap();
    &snapshot
        .groups()
        .iter()
        .find(|g| g.templates.iter().any(|x| x.name == t.name))
        .unwrap()
        .id
}

fn entry_for<'a>(
    config: &'a MutatingWebhookConfiguration,
    snapshot: &Snapshot,
    template: &str,
) -> &'a MutatingWebhook {
    let name = entry_name(group_of(snapshot, template));
    webhooks(config).iter().find(|w| w.name == name).unwrap()
}

#[test]
fn entry_names_are_fully_qualified() {
    let id = GroupId::from("fail-0123456789abcdef");
    assert_eq!(entry_name(&id), "fail-0123456789abcdef.webhook.sidecar.dev");
}

#[test]
fn one_entry_per_group_named_and_routed_by_group_id() {
    let snapshot = three_groups();
    assert_eq!(snapshot.groups().len(), 3);
    let config = desired_configuration(&snapshot, &service_options(), CA);
    assert_eq!(
        webhooks(&config).len(),
        3,
        "web-a and web-b share one entry"
    );
    for (group, webhook) in snapshot.groups().iter().zip(webhooks(&config)) {
        assert_eq!(webhook.name, format!("{}.webhook.sidecar.dev", group.id));
        let service = webhook.client_config.service.as_ref().unwrap();
        assert_eq!(service.path.as_deref(), Some(group.id.path().as_str()));
        assert_eq!(
            service.path.as_deref(),
            Some(format!("/mutate/{}", group.id).as_str())
        );
    }
}

#[test]
fn entries_are_ordered_by_their_lowest_priority() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let expected: Vec<String> = ["db", "web-a", "all"]
        .iter()
        .map(|t| entry_name(group_of(&snapshot, t)))
        .collect();
    assert_eq!(names(&config), expected);
    assert!(expected[0].starts_with("ignore-"));
    assert!(expected[1].starts_with("fail-") && expected[2].starts_with("fail-"));

    // Lowering web-b's priority below db's moves the web entry first.
    let snapshot = snapshot_with_priorities(&[("web-a", 10), ("web-b", 1), ("db", 5)]);
    let config = desired_configuration(&snapshot, &service_options(), CA);
    assert_eq!(
        names(&config),
        [
            entry_name(group_of(&snapshot, "web-b")),
            entry_name(group_of(&snapshot, "db"))
        ]
    );
}

#[test]
fn an_entry_selecting_on_a_label_another_template_adds_comes_after_it() {
    let snapshot = snapshot_of(&[
        parse_template(
            "metadata: {name: adds}\nspec:\n  priority: 50\n  podSelector: {matchLabels: {app: dep-web}}\n  metadata: {labels: {mesh: 'on'}}\n  containers: [{name: a, image: x}]",
        ),
        parse_template(
            "metadata: {name: selects}\nspec:\n  priority: 10\n  podSelector: {matchLabels: {mesh: 'on'}}\n  containers: [{name: b, image: x}]",
        ),
    ]);
    let config = desired_configuration(&snapshot, &service_options(), CA);
    assert_eq!(
        names(&config),
        [
            entry_name(group_of(&snapshot, "adds")),
            entry_name(group_of(&snapshot, "selects"))
        ],
        "by priority alone, selects (10) would come first and never be called"
    );
    // Applying the same templates again gives the same order: no drift.
    let again = desired_configuration(&snapshot, &service_options(), CA);
    assert_eq!(drift(&config, &again), None);
}

fn snapshot_with_priorities(priorities: &[(&str, i32)]) -> Arc<Snapshot> {
    snapshot_of(
        &priorities
            .iter()
            .map(|(name, priority)| {
                let (policy, app) = if name.starts_with("web") {
                    ("Fail", "web")
                } else {
                    ("Ignore", "db")
                };
                template(
                    name,
                    *priority,
                    policy,
                    "{}",
                    &format!("{{matchLabels: {{app: {app}}}}}"),
                )
            })
            .collect::<Vec<_>>(),
    )
}

#[test]
fn namespace_selector_keeps_the_groups_and_appends_the_exclusions() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let exclusions = json!([
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["kube-system", "kube-public", "kube-node-lease", "sidecar-system"]},
        {"key": "sidecar.dev/injection", "operator": "NotIn", "values": ["disabled"]},
    ]);
    let web = entry_for(&config, &snapshot, "web-a");
    assert_eq!(
        serde_json::to_value(web.namespace_selector.as_ref().unwrap()).unwrap(),
        json!({"matchExpressions": exclusions})
    );
    let all = entry_for(&config, &snapshot, "all");
    assert_eq!(
        serde_json::to_value(all.namespace_selector.as_ref().unwrap()).unwrap(),
        json!({"matchLabels": {"team": "a"}, "matchExpressions": exclusions})
    );
}

#[test]
fn exclusions_follow_the_groups_own_expressions() {
    let snapshot = snapshot_of(&[template(
        "t",
        1,
        "Fail",
        "{matchExpressions: [{key: env, operator: In, values: [prod, dev]}]}",
        "{}",
    )]);
    let config = desired_configuration(&snapshot, &service_options(), CA);
    assert_eq!(
        serde_json::to_value(webhooks(&config)[0].namespace_selector.as_ref().unwrap()).unwrap(),
        json!({"matchExpressions": [
            {"key": "env", "operator": "In", "values": ["dev", "prod"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": ["kube-system", "kube-public", "kube-node-lease", "sidecar-system"]},
            {"key": "sidecar.dev/injection", "operator": "NotIn", "values": ["disabled"]},
        ]})
    );
}

#[test]
fn an_operator_namespace_already_excluded_is_not_listed_twice() {
    let snapshot = three_groups();
    let mut options = service_options();
    options.operator_namespace = "kube-system".into();
    let config = desired_configuration(&snapshot, &options, CA);
    let expressions = webhooks(&config)[0]
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap();
    assert_eq!(
        expressions[0].values.as_deref().unwrap(),
        ["kube-system", "kube-public", "kube-node-lease"]
    );
}

#[test]
fn object_selector_is_the_pod_selector_and_absent_when_it_selects_everything() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let web = entry_for(&config, &snapshot, "web-a");
    assert_eq!(
        serde_json::to_value(web.object_selector.as_ref().unwrap()).unwrap(),
        json!({"matchLabels": {"app": "web"}})
    );
    let all = entry_for(&config, &snapshot, "all");
    assert_eq!(all.object_selector, None);
}

#[test]
fn failure_policy_is_the_groups() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let policy = |t| entry_for(&config, &snapshot, t).failure_policy.as_deref();
    assert_eq!(policy("web-a"), Some("Fail"));
    assert_eq!(policy("db"), Some("Ignore"));
    assert_eq!(policy("all"), Some("Fail"));

    // Same selectors, different policies: two entries.
    let snapshot = snapshot_of_policies();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let policies: Vec<_> = webhooks(&config)
        .iter()
        .map(|w| w.failure_policy.as_deref().unwrap())
        .collect();
    assert_eq!(policies, ["Fail", "Ignore"]);
}

fn snapshot_of_policies() -> Arc<Snapshot> {
    snapshot_of(&[
        template("required", 1, "Fail", "{}", "{}"),
        template("best-effort", 2, "Ignore", "{}", "{}"),
    ])
}

#[test]
fn fixed_fields_of_every_entry() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    for webhook in webhooks(&config) {
        assert_eq!(
            serde_json::to_value(webhook.rules.as_ref().unwrap()).unwrap(),
            json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                    "resources": ["pods"], "scope": "Namespaced"}])
        );
        assert_eq!(webhook.side_effects, "None");
        assert_eq!(webhook.admission_review_versions, ["v1"]);
        assert_eq!(webhook.reinvocation_policy.as_deref(), Some("IfNeeded"));
        assert_eq!(webhook.match_policy.as_deref(), Some("Equivalent"));
        assert_eq!(webhook.timeout_seconds, Some(DEFAULT_TIMEOUT_SECONDS));
    }
}

#[test]
fn no_entry_carries_a_condition_of_its_own_but_on_request() {
    // The API server evaluates an entry's conditions on every Pod it matches, twice for an
    // injected one: no opt-out condition (the webhook skips an opted-out Pod itself).
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    for webhook in webhooks(&config) {
        assert_eq!(
            webhook.match_conditions, None,
            "no OnRequest-only group here"
        );
    }
}

#[test]
fn an_on_request_only_group_is_called_only_for_pods_that_ask() {
    let snapshot = snapshot_of(&[
        parse_template(
            "metadata: {name: proxy}\nspec:\n  injection: OnRequest\n  containers: [{name: p, image: p}]",
        ),
        parse_template(
            "metadata: {name: mesh}\nspec:\n  injection: OnRequest\n  containers: [{name: m, image: m}]",
        ),
        parse_template(
            "metadata: {name: agent}\nspec:\n  failurePolicy: Ignore\n  injection: OnRequest\n  containers: [{name: a, image: a}]",
        ),
        parse_template(
            "metadata: {name: logs}\nspec:\n  failurePolicy: Ignore\n  containers: [{name: l, image: l}]",
        ),
    ]);
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let conditions = |entry: &MutatingWebhook| -> Vec<String> {
        entry
            .match_conditions
            .iter()
            .flatten()
            .map(|c| c.expression.clone())
            .collect()
    };
    let fail = webhooks(&config)
        .iter()
        .find(|w| w.failure_policy.as_deref() == Some("Fail"))
        .unwrap();
    let requested = conditions(fail);
    assert_eq!(requested.len(), 1, "no opt-out condition");
    assert_eq!(
        requested[0],
        selection::requests_cel(selection::ANNOTATIONS, ["mesh", "proxy"])
    );
    // A group with an Automatic template (agent and logs share one) is called for every
    // selected Pod.
    let ignore = webhooks(&config)
        .iter()
        .find(|w| w.failure_policy.as_deref() == Some("Ignore"))
        .unwrap();
    assert!(conditions(ignore).is_empty());
}

#[test]
fn service_mode_calls_the_service_at_the_groups_path() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let web = entry_for(&config, &snapshot, "web-a");
    let id = group_of(&snapshot, "web-a");
    assert_eq!(web.client_config.url, None);
    assert_eq!(
        web.client_config.service,
        Some(ServiceReference {
            namespace: "sidecar-system".into(),
            name: "sidecar-injector-webhook".into(),
            path: Some(format!("/mutate/{id}")),
            port: Some(8443),
        })
    );
}

#[test]
fn url_mode_appends_the_groups_path_to_the_base() {
    let snapshot = three_groups();
    let id = group_of(&snapshot, "db");
    for base in ["https://127.0.0.1:8443", "https://127.0.0.1:8443/"] {
        let config = desired_configuration(&snapshot, &url_options(base), CA);
        let db = entry_for(&config, &snapshot, "db");
        assert_eq!(db.client_config.service, None);
        assert_eq!(
            db.client_config.url.as_deref(),
            Some(format!("https://127.0.0.1:8443/mutate/{id}").as_str())
        );
    }
    let config =
        desired_configuration(&snapshot, &url_options("https://localhost:9443/prefix"), CA);
    assert_eq!(
        entry_for(&config, &snapshot, "db")
            .client_config
            .url
            .as_deref(),
        Some(format!("https://localhost:9443/prefix/mutate/{id}").as_str())
    );
}

#[test]
fn ca_bundle_is_the_pem_bytes_base64_encoded_on_the_wire() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &service_options(), CA);
    for webhook in webhooks(&config) {
        assert_eq!(webhook.client_config.ca_bundle.as_ref().unwrap().0, CA);
    }
    use base64::Engine as _;
    let json = serde_json::to_value(&config).unwrap();
    let encoded = json["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
        CA
    );

    let without = desired_configuration(&snapshot, &service_options(), b"");
    assert!(
        webhooks(&without)
            .iter()
            .all(|w| w.client_config.ca_bundle.is_none())
    );
}

#[test]
fn no_templates_give_an_empty_list_of_entries() {
    let empty = snapshot_of(&[]);
    let config = desired_configuration(&empty, &service_options(), CA);
    assert_eq!(config.webhooks, Some(vec![]));
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(
        json["webhooks"],
        json!([]),
        "serialized, so server-side apply removes old entries"
    );
}

#[test]
fn metadata_has_the_name_labels_and_owner() {
    let snapshot = three_groups();
    let mut options = service_options();
    options.labels = BTreeMap::from([
        ("app.kubernetes.io/instance".to_owned(), "prod".to_owned()),
        (MANAGED_BY_LABEL.to_owned(), "helm".to_owned()),
    ]);
    let owner = OwnerReference {
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        name: "sidecartemplates.sidecar.dev".into(),
        uid: "0b5c0c3e-1111-2222-3333-444455556666".into(),
        controller: Some(false),
        block_owner_deletion: None,
    };
    options.owner = Some(owner.clone());
    let config = desired_configuration(&snapshot, &options, CA);
    assert_eq!(config.metadata.name.as_deref(), Some("sidecar-injector"));
    assert_eq!(
        config.metadata.labels,
        Some(BTreeMap::from([
            ("app.kubernetes.io/instance".to_owned(), "prod".to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "sidecar-injector".to_owned()
            ),
        ]))
    );
    assert_eq!(config.metadata.owner_references, Some(vec![owner]));
    assert_eq!(config.metadata.namespace, None, "cluster-scoped");

    let config = desired_configuration(&snapshot, &service_options(), CA);
    assert_eq!(config.metadata.owner_references, None);
    assert_eq!(
        config.metadata.labels,
        Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_owned(),
            "sidecar-injector".to_owned()
        )]))
    );
}

#[test]
fn timeout_comes_from_the_options_and_is_kept_in_range() {
    let snapshot = three_groups();
    let timeouts = |timeout: i32| {
        let mut options = service_options();
        options.timeout_seconds = timeout;
        let config = desired_configuration(&snapshot, &options, CA);
        webhooks(&config)
            .iter()
            .map(|w| w.timeout_seconds.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(timeouts(3), [3, 3, 3]);
    assert_eq!(timeouts(30), [30, 30, 30]);
    assert_eq!(timeouts(0), [1, 1, 1]);
    assert_eq!(timeouts(300), [30, 30, 30]);
}

#[test]
fn serializes_to_what_the_api_server_accepts() {
    let snapshot = three_groups();
    let config = desired_configuration(&snapshot, &url_options("https://127.0.0.1:8443"), CA);
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(json["kind"], "MutatingWebhookConfiguration");
    assert_eq!(json["metadata"]["name"], "sidecar-injector");
    let entries = json["webhooks"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    for entry in entries {
        let name = entry["name"].as_str().unwrap();
        assert!(is_dns_subdomain(name), "{name}");
        assert!(name.split('.').count() >= 3, "{name}");
        assert!(name.ends_with(".webhook.sidecar.dev"), "{name}");
        let id = name.split('.').next().unwrap();
        assert!(
            (id.starts_with("fail-") || id.starts_with("ignore-")) && is_dns_label(id),
            "{name}"
        );
        assert!(
            entry["clientConfig"]["url"]
                .as_str()
                .unwrap()
                .starts_with("https://127.0.0.1:8443/mutate/")
        );
        assert!(entry["clientConfig"].get("service").is_none());
        assert_eq!(entry["sideEffects"], "None");
        assert_eq!(entry["admissionReviewVersions"], json!(["v1"]));
        assert!(matches!(
            entry["failurePolicy"].as_str(),
            Some("Fail" | "Ignore")
        ));
        assert!(entry.get("matchConditions").is_none(), "{entry}");
    }
    let first = &entries[0];
    assert!(first["name"].as_str().unwrap().starts_with("ignore-"));
    assert_eq!(
        first["objectSelector"],
        json!({"matchLabels": {"app": "db"}})
    );
    assert_eq!(first["timeoutSeconds"], 10);
    assert_eq!(first["reinvocationPolicy"], "IfNeeded");
    assert_eq!(first["matchPolicy"], "Equivalent");
    assert!(entries[2].get("objectSelector").is_none());

    let back: MutatingWebhookConfiguration = serde_json::from_value(json).unwrap();
    assert_eq!(back, config, "the JSON reads back the same");
}

#[test]
fn options_are_validated() {
    assert_eq!(service_options().validate(), Ok(()));
    assert_eq!(url_options("https://127.0.0.1:8443").validate(), Ok(()));
    assert_eq!(
        url_options("https://localhost:8443/prefix/").validate(),
        Ok(())
    );

    let mut options = service_options();
    for timeout in [0, 31, -1] {
        options.timeout_seconds = timeout;
        assert_eq!(
            options.validate(),
            Err(WebhookConfigError::TimeoutOutOfRange(timeout))
        );
    }
    for timeout in [1, 30] {
        options.timeout_seconds = timeout;
        assert_eq!(options.validate(), Ok(()));
    }

    let mut options = service_options();
    options.name = "Not A Name".into();
    assert!(matches!(
        options.validate(),
        Err(WebhookConfigError::InvalidName(_))
    ));
    let mut options = service_options();
    options.operator_namespace = String::new();
    assert!(matches!(
        options.validate(),
        Err(WebhookConfigError::InvalidNamespace(_))
    ));
    let mut options = service_options();
    options.labels.insert("bad key!".into(), "x".into());
    assert!(matches!(
        options.validate(),
        Err(WebhookConfigError::InvalidLabel { .. })
    ));
    for port in [0, 65536] {
        let mut options = service_options();
        options.endpoint = Endpoint::Service {
            namespace: "ns".into(),
            name: "svc".into(),
            port,
        };
        assert!(matches!(
            options.validate(),
            Err(WebhookConfigError::InvalidService { .. })
        ));
    }
    for (base, reason) in [
        ("http://127.0.0.1:8443", "the scheme must be https"),
        ("127.0.0.1:8443", "the scheme must be https"),
        (
            "https://127.0.0.1:8443/?a=b",
            "query parameters and fragments are not allowed",
        ),
        (
            "https://127.0.0.1:8443#x",
            "query parameters and fragments are not allowed",
        ),
        (
            "https://user@127.0.0.1:8443",
            "user information is not allowed",
        ),
        ("https://", "the host is missing"),
        ("https://:8443", "the host is missing"),
    ] {
        assert_eq!(
            url_options(base).validate(),
            Err(WebhookConfigError::InvalidUrl {
                base: base.into(),
                reason
            }),
            "{base}"
        );
    }
    assert_eq!(
        WebhookConfigError::TimeoutOutOfRange(31).to_string(),
        "webhook timeout of 31 s is out of range: use 1 to 30 seconds"
    );
}

/// The configuration as the API server returns it: defaults filled in, metadata added by
/// the server and by other field managers.
fn as_returned_by_the_api_server(
    config: &MutatingWebhookConfiguration,
) -> MutatingWebhookConfiguration {
    let mut json = serde_json::to_value(config).unwrap();
    json["metadata"]["uid"] = "d3b07384-0000-0000-0000-000000000000".into();
    json["metadata"]["resourceVersion"] = "12345".into();
    json["metadata"]["generation"] = 3.into();
    json["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z".into();
    json["metadata"]["managedFields"] = json!([{
        "manager": "sidecar-injector", "operation": "Apply",
        "apiVersion": "admissionregistration.k8s.io/v1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:webhooks": {}}
    }]);
    json["metadata"]["labels"]["added-by"] = "someone-else".into();
    json["metadata"]["annotations"] = json!({"note": "hello"});
    for entry in json["webhooks"].as_array_mut().unwrap() {
        let entry = entry.as_object_mut().unwrap();
        entry.entry("objectSelector").or_insert_with(|| json!({}));
        entry
            .entry("namespaceSelector")
            .or_insert_with(|| json!({}));
    }
    serde_json::from_value(json).unwrap()
}

#[test]
fn not_drifted_when_only_defaults_and_other_managers_fields_differ() {
    let snapshot = three_groups();
    let desired = desired_configuration(&snapshot, &service_options(), CA);
    assert!(drift(&desired, &desired).is_none());
    let actual = as_returned_by_the_api_server(&desired);
    assert_ne!(actual, desired);
    assert_eq!(drift(&desired, &actual), None);

    // Fields the operator leaves out, defaulted by the API server.
    let mut sparse = desired.clone();
    for webhook in sparse.webhooks.as_mut().unwrap() {
        webhook.match_policy = None;
        webhook.timeout_seconds = None;
        webhook.rules.as_mut().unwrap()[0].scope = None;
        if let Some(service) = webhook.client_config.service.as_mut() {
            service.port = None;
        }
    }
    let mut defaulted = as_returned_by_the_api_server(&sparse);
    for webhook in defaulted.webhooks.as_mut().unwrap() {
        webhook.match_policy = Some("Equivalent".into());
        webhook.timeout_seconds = Some(10);
        webhook.rules.as_mut().unwrap()[0].scope = Some("*".into());
        webhook.client_config.service.as_mut().unwrap().port = Some(443);
    }
    assert!(drift(&sparse, &defaulted).is_none());

    // A namespaceSelector defaulted on an entry that had none.
    let mut bare = desired.clone();
    bare.webhooks.as_mut().unwrap()[0].namespace_selector = None;
    let mut filled = bare.clone();
    filled.webhooks.as_mut().unwrap()[0].namespace_selector = Some(LabelSelector::default());
    assert!(drift(&bare, &filled).is_none());

    // No entries: absent and empty are the same.
    let empty = desired_configuration(&snapshot_of(&[]), &service_options(), CA);
    let mut none = empty.clone();
    none.webhooks = None;
    assert!(drift(&empty, &none).is_none());

    // Other owners next to the operator's.
    let mut options = service_options();
    options.owner = Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Namespace".into(),
        name: "sidecar-system".into(),
        uid: "owner-uid".into(),
        ..OwnerReference::default()
    });
    let owned = desired_configuration(&snapshot, &options, CA);
    let mut actual = as_returned_by_the_api_server(&owned);
    actual.metadata.owner_references.as_mut().unwrap().insert(
        0,
        OwnerReference {
            uid: "other".into(),
            ..OwnerReference::default()
        },
    );
    assert!(drift(&owned, &actual).is_none());
}

#[test]
fn drifted_when_the_operators_fields_change() {
    let snapshot = three_groups();
    let desired = desired_configuration(&snapshot, &service_options(), CA);
    let actual = as_returned_by_the_api_server(&desired);
    let edited = |edit: &dyn Fn(&mut MutatingWebhookConfiguration)| {
        let mut changed = actual.clone();
        edit(&mut changed);
        drift(&desired, &changed)
    };
    let entry_names: Vec<String> = names(&desired).into_iter().map(String::from).collect();
    let second = entry_names[1].clone();
    let field = |field: &'static str| {
        Some(Drift::Entry {
            entry: second.clone(),
            field,
        })
    };

    // The set and order of entries.
    let deleted = edited(&|c| {
        c.webhooks.as_mut().unwrap().remove(1);
    });
    assert!(
        matches!(deleted, Some(Drift::Entries { .. })),
        "{deleted:?}"
    );
    let reordered = edited(&|c| c.webhooks.as_mut().unwrap().swap(0, 2));
    assert!(matches!(reordered, Some(Drift::Entries { .. })));
    let added = edited(&|c| {
        let mut extra = c.webhooks.as_ref().unwrap()[0].clone();
        extra.name = "extra.webhook.sidecar.dev".into();
        c.webhooks.as_mut().unwrap().push(extra);
    });
    assert!(matches!(added, Some(Drift::Entries { .. })));
    assert!(edited(&|c| c.webhooks = None).is_some());
    assert!(edited(&|c| c.webhooks = Some(vec![])).is_some());

    // Each owned field of one entry.
    let edit_entry = |edit: &dyn Fn(&mut MutatingWebhook)| {
        edited(&|c| edit(&mut c.webhooks.as_mut().unwrap()[1]))
    };
    assert_eq!(
        edit_entry(&|w| w.client_config.ca_bundle = Some(ByteString(b"other".to_vec()))),
        field("clientConfig")
    );
    assert_eq!(
        edit_entry(&|w| w.client_config.ca_bundle = None),
        field("clientConfig")
    );
    assert_eq!(
        edit_entry(&|w| {
            w.client_config.service.as_mut().unwrap().path = Some("/mutate".into())
        }),
        field("clientConfig")
    );
    assert_eq!(
        edit_entry(&|w| w.client_config.service.as_mut().unwrap().port = None),
        field("clientConfig"),
        "8443 was asked for, the default is 443"
    );
    assert_eq!(
        edit_entry(&|w| {
            w.rules.as_mut().unwrap()[0].operations = Some(vec!["CREATE".into(), "UPDATE".into()])
        }),
        field("rules")
    );
    assert_eq!(edit_entry(&|w| w.rules = None), field("rules"));
    assert_eq!(
        edit_entry(&|w| {
            w.namespace_selector
                .as_mut()
                .unwrap()
                .match_expressions
                .as_mut()
                .unwrap()
                .pop();
        }),
        field("namespaceSelector")
    );
    assert_eq!(
        edit_entry(&|w| w.object_selector = None),
        field("objectSelector")
    );
    assert_eq!(
        edit_entry(&|w| w.failure_policy = Some("Ignore".into())),
        field("failurePolicy")
    );
    assert_eq!(
        edit_entry(&|w| w.side_effects = "NoneOnDryRun".into()),
        field("sideEffects")
    );
    assert_eq!(
        edit_entry(&|w| w.timeout_seconds = Some(30)),
        field("timeoutSeconds")
    );
    assert_eq!(
        edit_entry(&|w| w.reinvocation_policy = None),
        field("reinvocationPolicy"),
        "the default is Never"
    );
    assert_eq!(
        edit_entry(&|w| w.admission_review_versions = vec!["v1beta1".into()]),
        field("admissionReviewVersions")
    );
    assert_eq!(
        edit_entry(&|w| w.match_policy = Some("Exact".into())),
        field("matchPolicy")
    );
    // No entry here has a condition: one added by hand would let Pods skip it.
    assert_eq!(desired.webhooks.as_ref().unwrap()[1].match_conditions, None);
    assert_eq!(
        edit_entry(&|w| {
            w.match_conditions = Some(vec![MatchCondition {
                name: "not-opted-out".into(),
                expression: "true".into(),
            }])
        }),
        field("matchConditions")
    );
    assert_eq!(
        edited(&|c| {
            c.webhooks.as_mut().unwrap()[0].match_conditions = Some(vec![MatchCondition {
                name: "skip".into(),
                expression: "false".into(),
            }])
        }),
        Some(Drift::Entry {
            entry: entry_names[0].clone(),
            field: "matchConditions",
        })
    );

    // The operator's label.
    assert_eq!(
        edited(&|c| {
            c.metadata.labels.as_mut().unwrap().remove(MANAGED_BY_LABEL);
        }),
        Some(Drift::Label {
            key: MANAGED_BY_LABEL.into()
        })
    );
}

#[test]
fn drifted_when_the_owner_reference_is_removed() {
    let mut options = service_options();
    options.owner = Some(OwnerReference {
        uid: "owner-uid".into(),
        ..OwnerReference::default()
    });
    let desired = desired_configuration(&three_groups(), &options, CA);
    let mut actual = as_returned_by_the_api_server(&desired);
    actual.metadata.owner_references = None;
    let drift = drift(&desired, &actual);
    assert_eq!(
        drift,
        Some(Drift::OwnerReference {
            uid: "owner-uid".into()
        })
    );
    assert_eq!(
        drift.unwrap().to_string(),
        "the owner reference to owner-uid was removed"
    );
}

#[test]
fn a_new_ca_or_a_new_template_group_is_drift() {
    let snapshot = three_groups();
    let old = desired_configuration(&snapshot, &service_options(), CA);
    let rotated = [
        CA,
        b"-----BEGIN CERTIFICATE-----\nMIIBnew\n-----END CERTIFICATE-----\n",
    ]
    .concat();
    let new = desired_configuration(&snapshot, &service_options(), &rotated);
    assert!(drift(&new, &as_returned_by_the_api_server(&old)).is_some());
    assert!(matches!(
        drift(&new, &old),
        Some(Drift::Entry {
            field: "clientConfig",
            ..
        })
    ));

    let more = snapshot_of(&[
        template("web-a", 10, "Fail", "{}", "{matchLabels: {app: web}}"),
        template("web-b", 20, "Fail", "{}", "{matchLabels: {app: web}}"),
        template("db", 5, "Ignore", "{}", "{matchLabels: {app: db}}"),
        template("all", 50, "Fail", "{matchLabels: {team: a}}", "{}"),
        template("late", 60, "Ignore", "{}", "{}"),
    ]);
    let grown = desired_configuration(&more, &service_options(), CA);
    let drift = drift(&grown, &old).unwrap();
    assert!(
        drift.to_string().starts_with("the entries are ["),
        "{drift}"
    );
}

/// `count` best-effort templates that neither share an entry nor can be merged (each selects
/// namespaces of its own), each selector listing `values` values of 54 bytes: an entry takes
/// about `values * 57` bytes. (Best effort, so that their status records no `lastValid`.)
pub(crate) fn templates_with_large_selectors(count: usize, values: usize) -> Vec<SidecarTemplate> {
    (0..count)
        .map(|i| {
            let values: Vec<String> = (0..values)
                .map(|v| format!("team-{i:03}-{v:04}-{}", "x".repeat(40)))
                .collect();
            serde_json::from_value(json!({
                "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
                "metadata": {"name": format!("large-{i:03}"), "generation": 1},
                "spec": {
                    "failurePolicy": "Ignore",
                    "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": values}]},
                    "containers": [{"name": format!("large-{i:03}"), "image": "x"}],
                },
            }))
            .unwrap()
        })
        .collect()
}

#[test]
fn many_groups_sharing_namespaces_are_merged_into_at_most_the_bound_of_entries() {
    let mut templates = Vec::new();
    for (team, policy) in [("a", "Fail"), ("b", "Fail"), ("a", "Ignore")] {
        for i in 0..100 {
            templates.push(template(
                &format!("{team}-{}-{i:03}", policy.to_lowercase()),
                i,
                policy,
                &format!("{{matchLabels: {{team: {team}}}}}"),
                &format!("{{matchLabels: {{app: app-{i}}}}}"),
            ));
        }
    }
    let snapshot = snapshot_of(&templates);
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let entries = webhooks(&config);
    assert_eq!(
        entries.len(),
        3,
        "one merged entry per namespace selector and policy"
    );
    assert!(
        left_out(&snapshot, &config).is_empty(),
        "every template is served"
    );
    for entry in entries {
        assert_eq!(
            entry.object_selector, None,
            "{}: called for every Pod",
            entry.name
        );
    }
    let served: usize = snapshot.groups().iter().map(|g| g.templates.len()).sum();
    assert_eq!(served, templates.len());
}

#[test]
fn a_configuration_that_would_not_fit_leaves_entries_out_and_says_which() {
    let snapshot = snapshot_of(&templates_with_large_selectors(120, 250));
    let config = desired_configuration(&snapshot, &service_options(), CA);
    let bytes = serde_json::to_vec(&config).unwrap().len();
    assert!(bytes <= MAX_CONFIGURATION_BYTES, "{bytes}");
    assert!(
        bytes > MAX_CONFIGURATION_BYTES - 20_000,
        "as many as fit: {bytes}"
    );
    let missing = left_out(&snapshot, &config);
    assert!(!missing.is_empty());
    assert_eq!(webhooks(&config).len() + missing.len(), 120);
    // The entries kept are the first ones, in entry order.
    let order: Vec<String> = entry_order(&snapshot)
        .groups
        .iter()
        .map(|g| entry_name(&g.id))
        .collect();
    assert_eq!(names(&config), order[..webhooks(&config).len()]);
    // Within the bound, nothing is left out.
    let small = snapshot_of(&templates_with_large_selectors(10, 250));
    let config = desired_configuration(&small, &service_options(), CA);
    assert!(left_out(&small, &config).is_empty());
    assert_eq!(webhooks(&config).len(), 10);
}

#[test]
fn an_entry_skips_pods_that_carry_every_template_the_policy_served() {
    let snapshot = snapshot_of(&[
        parse_template("metadata: {name: agent}\nspec:\n  containers: [{name: a, image: a}]"),
        parse_template(
            "metadata: {name: proxy}\nspec:\n  injection: OnRequest\n  containers: [{name: p, image: p}]",
        ),
        parse_template(
            "metadata: {name: logs}\nspec:\n  failurePolicy: Ignore\n  containers: [{name: l, image: l}]",
        ),
    ]);
    let present: BTreeMap<String, String> = [
        ("agent".to_owned(), "AGENT_PRESENT".to_owned()),
        ("proxy".to_owned(), "PROXY_PRESENT".to_owned()),
    ]
    .into();
    let config = desired_configuration_with_policy(&snapshot, &service_options(), CA, &present);
    let skip = |policy: &str| {
        webhooks(&config)
            .iter()
            .find(|w| w.failure_policy.as_deref() == Some(policy))
            .unwrap()
            .match_conditions
            .iter()
            .flatten()
            .find(|c| c.name == "not-injected-by-policy")
            .map(|c| c.expression.clone())
    };
    // Called unless the agent is present and the proxy, when asked for, is too.
    assert_eq!(
        skip("Fail").unwrap(),
        format!(
            "!((AGENT_PRESENT) && (!{} || (PROXY_PRESENT)))",
            selection::requests_cel(selection::ANNOTATIONS, ["proxy"])
        )
    );
    // `logs` has no presence condition (the policy does not serve it): always called.
    assert_eq!(skip("Ignore"), None);
    // Served, a best-effort entry also skips a Pod that opted out, which the policy left
    // alone as the webhook would.
    let present: BTreeMap<String, String> = present
        .into_iter()
        .chain([("logs".to_owned(), "LOGS_PRESENT".to_owned())])
        .collect();
    let config = desired_configuration_with_policy(&snapshot, &service_options(), CA, &present);
    let logs = webhooks(&config)
        .iter()
        .find(|w| w.failure_policy.as_deref() == Some("Ignore"))
        .unwrap()
        .match_conditions
        .clone()
        .unwrap();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(
        logs[0].expression,
        format!(
            "!({} || ((LOGS_PRESENT)))",
            selection::opts_out_cel(selection::ANNOTATIONS)
        )
    );
    // Without a policy, no entry skips anything.
    let plain = desired_configuration(&snapshot, &service_options(), CA);
    assert!(
        webhooks(&plain)
            .iter()
            .flat_map(|w| w.match_conditions.iter().flatten())
            .all(|c| c.name != "not-injected-by-policy")
    );
}

#[test]
fn the_configuration_keeps_aks_admissions_enforcer_away() {
    let config = desired_configuration(&three_groups(), &service_options(), CA);
    assert_eq!(
        config
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(AKS_ENFORCER_ANNOTATION))
            .map(String::as_str),
        Some("true")
    );
}
