use super::*;
use crate::template::compile;
use injector_api::SidecarTemplate;
use injector_api::names::INJECTION_LABEL;

fn template(yaml: &str) -> Arc<CompiledTemplate> {
    let template: SidecarTemplate = serde_saphyr::from_str(yaml).unwrap();
    Arc::new(compile(&template).unwrap())
}

fn options() -> PolicyOptions {
    PolicyOptions {
        name: "sidecar-injector".into(),
        operator_namespace: "operator-ns".into(),
        webhook_behind: true,
    }
}

fn expressions(policy: &Value) -> Vec<&str> {
    policy["spec"]["mutations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["jsonPatch"]["expression"].as_str().unwrap())
        .collect()
}

const PROXY: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: proxy, generation: 3}
spec:
  priority: 20
  failurePolicy: Ignore
  podSelector: {matchLabels: {app: web}}
  initContainers:
  - {name: proxy, image: "proxy:1", restartPolicy: Always, args: ["--node", "{{ pod.name }}"]}
  volumes:
  - {name: proxy-certs, emptyDir: {}}
  metadata:
    labels: {mesh: "on"}
"#;

const AGENT: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: agent, generation: 1}
spec:
  priority: 10
  containers:
  - {name: agent, image: "agent:2", env: [{name: NS, value: "{{ pod.namespace }}"}]}
  appContainers:
    env: [{name: AGENT_SOCKET, value: /run/agent.sock}]
"#;

#[test]
fn one_policy_serves_templates_in_application_order() {
    let compiled = compile_policy(&[template(PROXY), template(AGENT)], &options());
    let names: Vec<&str> = compiled.served.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["agent", "proxy"]);
    assert!(compiled.webhook_only.is_empty());
    let policy = compiled.policy.unwrap();
    assert_eq!(policy["kind"], "MutatingAdmissionPolicy");
    assert_eq!(policy["apiVersion"], POLICY_API_VERSION);
    // One required template makes the whole policy fail closed.
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    // No template left to the webhook adds metadata a policy template could read.
    assert_eq!(policy["spec"]["reinvocationPolicy"], "Never");
    let excluded = &policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"];
    assert_eq!(
        excluded[0]["values"],
        json!(["kube-system", "kube-public", "kube-node-lease"])
    );
    assert_eq!(excluded[1]["key"], INJECTION_LABEL);
    // The operator's namespace is excluded too, but for the Pod asking for this version: by
    // each mutation, not a match condition the API server would evaluate again on every
    // injected Pod's second pass.
    assert!(policy["spec"].get("matchConditions").is_none(), "{policy}");
    let outside = format!(
        r#"(request.namespace != "operator-ns" || object.metadata.?annotations.orValue({{}})[?"sidecar.dev/policy-proof"].orValue("") == "{}-live")"#,
        compiled.hash
    );
    for expression in expressions(&policy) {
        assert!(
            expression
                .trim_start_matches('(')
                .starts_with(outside.trim_start_matches('(')),
            "{expression}"
        );
    }
    // The agent selects every namespace: one binding, for every namespace the policy matches.
    let [binding] = &compiled.bindings[..] else {
        panic!("one binding expected: {:?}", compiled.bindings)
    };
    assert_eq!(binding["metadata"]["name"], "sidecar-injector");
    assert_eq!(binding["spec"]["policyName"], "sidecar-injector");
    assert!(binding["spec"].get("matchResources").is_none(), "{binding}");

    // The marker is the last mutation's end, not a mutation of its own: after each
    // mutation the API server encodes, decodes and defaults the Pod again.
    let [agent, proxy] = expressions(&policy)[..] else {
        panic!("two mutations expected")
    };
    assert!(
        proxy.ends_with(&format!(
            r#"+ (object.metadata.?annotations.orValue({{}})[?"sidecar.dev/policy-proof"].orValue("") == "{0}-live" ? [JSONPatch{{op: "add", path: "/metadata/annotations/sidecar.dev~1policy-proven", value: "{0}-live"}}] : [])"#,
            compiled.hash
        )),
        "{proxy}"
    );
    assert!(!agent.contains("policy-proven"), "{agent}");
    // The record entry is the one plan writes.
    let entry = Applied::of(&compiled.served[0]).to_string();
    assert!(agent.contains(&format!("{entry:?}")), "{agent}");
    // Required: no opt-out; each container is added when the Pod has none of its name in
    // either list (a copy of some of them gets the others, as from `plan`).
    assert!(!agent.contains("lowerAscii"), "{agent}");
    assert!(agent.contains(r#"(!object.spec.containers.exists(c, c.name == "agent") && !object.spec.?initContainers.orValue([]).exists(c, c.name == "agent") ? ["#), "{agent}");
    assert!(!agent.contains(r#"c.name in ["agent"]"#), "{agent}");
    // The app containers exclude the containers of the templates that select the Pod.
    assert!(
        agent.contains("!(object.spec.containers[i].name in variables.templateContainers)"),
        "{agent}"
    );
    // The ServiceAccount plugin's volume: the first named like it that is not a template's.
    let token_volume = r#"!object.spec.?automountServiceAccountToken.orValue(true) ? "" : (object.spec.?volumes.orValue([]).filter(v, v.?name.orValue("").startsWith("kube-api-access-") && !(v.?name.orValue("") in ["proxy-certs"])).map(v, v.?projected.?sources.orValue([]).exists(s, has(s.serviceAccountToken)) ? v.?name.orValue("") : "") + [""])[0]"#;
    assert_eq!(
        policy["spec"]["variables"],
        json!([
            {"name": "templateContainers", "expression": r#"["agent"]"#},
            {"name": "serviceAccountVolume", "expression": token_volume},
        ])
    );
    // The proof applies every template: every template's containers are theirs.
    let (proof, _) = compiled.proof.as_ref().unwrap();
    assert_eq!(
        proof["spec"]["variables"],
        json!([
            {"name": "templateContainers", "expression": r#"["agent"]"#},
            {"name": "serviceAccountVolume", "expression": token_volume},
        ])
    );
    // Each added container gets the token's mount as the ServiceAccount plugin appends it, in
    // the container's own value: a list of mounts when it has none.
    assert!(
        agent.contains(r#"?"volumeMounts": (variables.serviceAccountVolume == "" ? optional.none() : optional.of(dyn([dyn({"name": dyn(variables.serviceAccountVolume), "readOnly": dyn(true), "mountPath": dyn("/var/run/secrets/kubernetes.io/serviceaccount")})])))}}"#),
        "{agent}"
    );
    assert!(!agent.contains("/volumeMounts\""), "{agent}");
    assert!(
        proxy.contains(r#""restartPolicy": dyn("Always"), ?"volumeMounts": (variables.serviceAccountVolume == "" ? optional.none() : "#),
        "{proxy}"
    );
    // Best effort: the opt-out, the pod selector, the volume guard; the native sidecar goes
    // first, before the Pod's own init containers (after templates' leading ones).
    assert!(
        proxy.contains(&format!(
            "!({})",
            crate::rules::selection::opts_out_cel(ANNOTATIONS)
        )),
        "{proxy}"
    );
    assert!(proxy.contains(r#"("app" in object.metadata.?labels.orValue({}) && object.metadata.?labels.orValue({})["app"] == "web")"#), "{proxy}");
    // A volume of the Pod's own by the template's name must be the template's as stored.
    assert!(
        proxy.contains(r#"object.spec.?volumes.orValue([]).all(v, (v.name != "proxy-certs" || v == {"emptyDir": dyn({}), "name": dyn("proxy-certs")}))"#),
        "{proxy}"
    );
    assert!(
        proxy.contains(
            r#"(object.spec.?volumes.orValue([]).exists(v, v.name == "proxy-certs") ? [] : ["#
        ),
        "{proxy}"
    );
    assert!(
        proxy.contains(r#"string((object.spec.?initContainers.orValue([]).map(c, c.name in ["proxy"]).indexOf(false) < 0"#),
        "{proxy}"
    );
    // The placeholder is a CEL expression, never spliced into the literal.
    assert!(proxy.contains("object.metadata.?generateName"), "{proxy}");
    assert!(!proxy.contains("{{"), "{proxy}");
}

#[test]
fn a_container_mounting_at_the_token_path_gets_no_token_mount() {
    let own = template(
        "metadata: {name: own}\nspec:\n  containers:\n  - {name: own, image: o, volumeMounts: [{name: t, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]}\n  - {name: other, image: o, volumeMounts: [{name: t, mountPath: /t}]}\n  volumes: [{name: t, emptyDir: {}}]",
    );
    let compiled = compile_policy(&[own], &options());
    let policy = compiled.policy.unwrap();
    let [own] = expressions(&policy)[..] else {
        panic!("one mutation expected")
    };
    // Only the second container gets it, appended to its list.
    assert_eq!(
        own.matches("variables.serviceAccountVolume == \"\"")
            .count(),
        1,
        "{own}"
    );
    assert!(
        own.contains(r#""volumeMounts": dyn([dyn({"mountPath": dyn("/t"), "name": dyn("t")})] + (variables.serviceAccountVolume == "" ? [] : ["#),
        "{own}"
    );
}

#[test]
fn only_best_effort_templates_make_a_policy_that_fails_open() {
    let compiled = compile_policy(&[template(PROXY)], &options());
    assert_eq!(compiled.policy.unwrap()["spec"]["failurePolicy"], "Ignore");
}

/// Init containers go after the Pod's leading init containers that are templates', as `plan`
/// puts them: counting templates' anywhere in the Pod put them behind one of the Pod's own.
#[test]
fn init_containers_go_after_the_leading_templates_ones() {
    let early = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: early}
spec:
  priority: 1
  initContainers: [{name: early-init, image: "x:1"}]
"#,
    );
    let compiled = compile_policy(&[template(PROXY), early], &options());
    let policy = compiled.policy.unwrap();
    let proxy = expressions(&policy)[1];
    let leading = r#"object.spec.?initContainers.orValue([]).map(c, c.name in ["early-init", "proxy"]).indexOf(false)"#;
    assert!(
        proxy.contains(&format!(
            "string(({leading} < 0 ? size(object.spec.?initContainers.orValue([])) : {leading}))"
        )),
        "{proxy}"
    );
    assert!(
        !proxy.contains("size(object.spec.?initContainers.orValue([]).filter("),
        "{proxy}"
    );
}

#[test]
fn what_a_policy_cannot_express_stays_on_the_webhook() {
    let env_from = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: env-from}
spec:
  appContainers:
    envFrom: [{configMapRef: {name: settings}}]
  metadata:
    labels: {settings: loaded}
"#,
    );
    // Selects on `mesh`, which `proxy` (priority 20) adds after it (priority 5).
    let meshed = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: meshed}
spec:
  priority: 5
  podSelector: {matchExpressions: [{key: mesh, operator: Exists}]}
  containers: [{name: meshed, image: "m:1"}]
"#,
    );
    let templates = [env_from, meshed, template(PROXY)];
    let alone = PolicyOptions {
        webhook_behind: false,
        ..options()
    };
    let compiled = compile_policy(&templates, &alone);
    // `env-from` stays on the webhook and adds a label, which a policy template could select
    // on: the policy runs again after the webhook.
    assert_eq!(
        compiled.policy.as_ref().unwrap()["spec"]["reinvocationPolicy"],
        "IfNeeded"
    );
    let served: Vec<&str> = compiled.served.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(served, ["proxy"]);
    let reasons = |compiled: &CompiledPolicy| -> Vec<(String, String)> {
        compiled
            .webhook_only
            .iter()
            .map(|(t, why)| (t.name.clone(), why.to_string()))
            .collect()
    };
    assert_eq!(
        reasons(&compiled),
        [
            ("meshed".to_owned(), "its podSelector reads label \"mesh\", which SidecarTemplate \"proxy\" adds after it".to_owned()),
            ("env-from".to_owned(), "appContainers.envFrom is compared by content, which a policy cannot do".to_owned()),
        ]
    );
    // Behind the policy the webhook would apply `meshed` after `proxy`: `proxy` stays with it.
    let behind = compile_policy(&templates, &options());
    assert!(behind.served.is_empty() && behind.policy.is_none());
    assert_eq!(
        reasons(&behind)[1],
        ("proxy".to_owned(), "SidecarTemplate \"meshed\" applies before it and may select the same Pods, but is left to the webhook, called after the policy".to_owned())
    );
}

#[test]
fn a_label_added_earlier_may_be_selected_on() {
    let meshed = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: meshed}
spec:
  priority: 50
  podSelector: {matchLabels: {mesh: "on"}}
  containers: [{name: meshed, image: "m:1"}]
"#,
    );
    let compiled = compile_policy(&[meshed, template(PROXY)], &options());
    assert_eq!(compiled.served.len(), 2);
}

#[test]
fn no_template_no_policy() {
    let compiled = compile_policy(&[], &options());
    assert!(compiled.policy.is_none() && compiled.bindings.is_empty());
}

/// A template selecting Pods with the label `app: <name>` in the namespaces `namespaces`
/// selects (YAML).
fn in_namespaces(name: &str, namespaces: &str) -> Arc<CompiledTemplate> {
    template(&format!(
        "metadata: {{name: {name}}}\nspec:\n  namespaceSelector: {namespaces}\n  containers:\n  - {{name: {name}, image: \"{name}:1\"}}"
    ))
}

/// The namespace selectors of the policy's bindings, by name.
fn bound(compiled: &CompiledPolicy) -> Vec<(String, Value)> {
    compiled
        .bindings
        .iter()
        .map(|b| {
            assert_eq!(b["spec"]["policyName"], "sidecar-injector");
            (
                b["metadata"]["name"].as_str().unwrap().to_owned(),
                b["spec"]["matchResources"]["namespaceSelector"].clone(),
            )
        })
        .collect()
}

#[test]
fn namespaces_no_template_selects_never_meet_the_policy() {
    let team_a = in_namespaces("a", "{matchLabels: {team: a}}");
    let team_a_too = in_namespaces("a-too", "{matchLabels: {team: a}}");
    let team_b = in_namespaces(
        "b",
        "{matchExpressions: [{key: team, operator: In, values: [b, c]}]}",
    );
    let compiled = compile_policy(&[team_a, team_a_too, team_b.clone()], &options());
    let not_the_operators = json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["operator-ns"]});
    assert_eq!(
        bound(&compiled),
        [
            // The dry-run Pod asking whether the API server runs this version.
            (
                "sidecar-injector".to_owned(),
                json!({"matchLabels": {"kubernetes.io/metadata.name": "operator-ns"}})
            ),
            // One binding per selector, however many templates share it.
            (
                "sidecar-injector-namespaces-0".to_owned(),
                json!({"matchLabels": {"team": "a"}, "matchExpressions": [not_the_operators]})
            ),
            (
                "sidecar-injector-namespaces-1".to_owned(),
                json!({"matchExpressions": [
                    {"key": "team", "operator": "In", "values": ["b", "c"]},
                    not_the_operators,
                ]})
            ),
        ]
    );

    // The warnings policy is bound to the same groups (it needs no dry run of its own).
    let team_c = template(
        "metadata: {name: c}\nspec:\n  failurePolicy: Ignore\n  namespaceSelector: {matchLabels: {team: c}}\n  containers:\n  - {name: c, image: \"c:1\"}",
    );
    let compiled = compile_policy(&[team_c], &options());
    let present = BTreeMap::from([("c".to_owned(), "C-PRESENT".to_owned())]);
    let (_, bindings) = compile_warnings(&options(), &compiled, &present, false).unwrap();
    let [binding] = &bindings[..] else {
        panic!("one binding expected: {bindings:?}")
    };
    assert_eq!(
        binding["metadata"]["name"],
        "sidecar-injector-warnings-namespaces-0"
    );
    assert_eq!(binding["spec"]["policyName"], "sidecar-injector-warnings");
    assert_eq!(binding["spec"]["validationActions"], json!(["Warn"]));
    assert_eq!(
        binding["spec"]["matchResources"]["namespaceSelector"],
        json!({"matchLabels": {"team": "c"}, "matchExpressions": [not_the_operators]})
    );

    // Selectors a namespace may match both of, a template selecting every namespace, or more
    // selectors than slots: one binding, for every namespace.
    let mesh = in_namespaces("mesh", "{matchLabels: {mesh: \"on\"}}");
    let logs = in_namespaces("logs", "{matchLabels: {logs: \"on\"}}");
    let everywhere = in_namespaces("everywhere", "{}");
    let many: Vec<_> = (0..=NAMESPACE_BINDING_SLOTS)
        .map(|i| {
            in_namespaces(
                &format!("t{i}"),
                &format!("{{matchLabels: {{team: t{i}}}}}"),
            )
        })
        .collect();
    for templates in [vec![mesh, logs], vec![team_b, everywhere], many] {
        let compiled = compile_policy(&templates, &options());
        assert_eq!(
            bound(&compiled),
            [("sidecar-injector".to_owned(), Value::Null)],
            "{templates:?}"
        );
    }
}

#[test]
fn strings_stay_single_cel_literals_whatever_they_hold() {
    for text in [
        "plain",
        "quote\" and \\ backslash",
        "line\nbreak",
        "tab\t",
        "ünïcode",
        "\u{1}",
    ] {
        let literal = cel_string(text);
        assert!(literal.starts_with('"') && literal.ends_with('"'));
        // The only unescaped quotes are the two that delimit it.
        let inner = &literal[1..literal.len() - 1];
        let mut escaped = false;
        for c in inner.chars() {
            assert!(escaped || c != '"', "{literal}");
            escaped = !escaped && c == '\\';
        }
        assert_eq!(serde_json::from_str::<String>(&literal).unwrap(), text);
    }
}

#[test]
fn json_values_become_dyn_literals() {
    let value = json!({"a": [1, "x", {"b": true}], "c": null, "d": 1.5, "e": 2.0});
    assert_eq!(
        cel_json(&value),
        r#"{"a": dyn([dyn(1), dyn("x"), dyn({"b": dyn(true)})]), "c": dyn(null), "d": dyn(1.5), "e": dyn(2.0)}"#
    );
}

#[test]
fn keys_are_escaped_as_json_pointer_tokens() {
    assert_eq!(
        pointer_token("sidecar.dev/injected"),
        "sidecar.dev~1injected"
    );
    assert_eq!(pointer_token("a~b/c"), "a~0b~1c");
}

#[test]
fn presence_is_learned_from_the_stored_proof_pod() {
    let compiled = compile_policy(&[template(AGENT), template(PROXY)], &options());
    // What the API server stored for the proof Pod: defaults filled in, the token mounted.
    let proven = json!({"spec": {
        "containers": [
            {"name": "policy-proof-0", "image": "none:1"},
            {"name": "agent", "image": "agent:2",
             "env": [{"name": "NS", "value": "sidecar-injector"}],
             "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
             "resources": {},
             "volumeMounts": [{"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]},
        ],
        "initContainers": [
            {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "args": ["--node", "sidecar-injector-policy-proof-"],
             "terminationMessagePath": "/dev/termination-log"},
        ],
        "volumes": [{"name": "proxy-certs", "emptyDir": {}}, {"name": "kube-api-access-abcde", "projected": {}}],
    }});
    let present = presence_conditions(&compiled, std::slice::from_ref(&proven));
    let agent = &present["agent"];
    // Every stored field is expected, the default included; nothing else is allowed but the
    // token's mounts.
    assert!(
        agent.contains(
            r#"size(c) == 5 + ("volumeMounts" in c ? 1 : 0) + ("resources" in c ? 1 : 0)"#
        ),
        "{agent}"
    );
    // What the API server adds as the webhook's comparison allows it: the AlwaysPullImages
    // plugin's pull policy, a LimitRange's resources where the template sets none.
    assert!(
        agent.contains(r#"("imagePullPolicy" in c && (c["imagePullPolicy"] == "IfNotPresent" || c["imagePullPolicy"] == "Always"))"#),
        "{agent}"
    );
    assert!(
        agent.contains(r#" + ("resources" in c ? 1 : 0)"#),
        "{agent}"
    );
    // The token's mount is the plugin's, of a volume holding a token, not any mount named
    // like it.
    let token_mount = crate::rules::defaulted::service_account_mount_cel("m");
    assert!(token_mount.contains(
        r#"m.?mountPath.orValue("") == "/var/run/secrets/kubernetes.io/serviceaccount""#
    ));
    assert!(token_mount.contains("m.?readOnly.orValue(false) == true"));
    assert!(token_mount.contains("has(s.serviceAccountToken)"));
    assert!(
        agent.contains(&format!("c.volumeMounts.all(m, {token_mount})")),
        "{agent}"
    );
    assert!(
        agent.contains(&format!("filter(m, !{token_mount})")) || !agent.contains("filter(m,"),
        "{agent}"
    );
    // The placeholder stays an expression over the Pod at hand, not the proof Pod's value.
    assert!(agent.contains("request.namespace"), "{agent}");
    assert!(!agent.contains(r#""sidecar-injector""#), "{agent}");
    let proxy = &present["proxy"];
    assert!(
        proxy.starts_with("object.spec.?initContainers.orValue([]).exists(c, "),
        "{proxy}"
    );
    assert!(proxy.contains(r#"object.spec.?volumes.orValue([]).exists(v, v.?name.orValue("") == "proxy-certs" && v == {"emptyDir": dyn({}), "name": dyn("proxy-certs")})"#), "{proxy}");
    assert!(
        !proxy.contains("--node\", \"sidecar-injector-policy-proof-"),
        "{proxy}"
    );
    // The native sidecar counts only before the Pod's own plain init containers.
    assert!(
        proxy.contains(r#"!object.spec.initContainers.exists(d, object.spec.initContainers.indexOf(d) < object.spec.initContainers.indexOf(c) && d.?restartPolicy.orValue("") != "Always" && !(d.name in ["proxy"]))"#),
        "{proxy}"
    );
    assert!(!agent.contains("indexOf(d)"), "{agent}");
    // The record must name this version, not only the template: a copy of another version's
    // containers that a policy recorded as this one is not this version.
    let entry = crate::plan::Applied::of(&template(AGENT)).to_string();
    assert!(entry.starts_with("agent@"), "{entry}");
    assert!(
        agent.ends_with(&format!(".exists(e, e == \"{entry}\")")),
        "{agent}"
    );

    // A template whose items the stored Pod lacks gets no condition.
    let mut lacking = proven.clone();
    lacking["spec"]["volumes"] = json!([]);
    let present = presence_conditions(&compiled, &[lacking]);
    assert!(present.contains_key("agent") && !present.contains_key("proxy"));
}

/// Two templates that add a container of the same name, the second also a volume named like
/// the first's: `winner` applies first.
fn same_names() -> [Arc<CompiledTemplate>; 3] {
    let named = |name: &str, priority: u32, image: &str, volume: &str| {
        template(&format!(
            r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {{name: {name}}}
spec:
  priority: {priority}
  failurePolicy: Fail
  containers: [{{name: helper, image: "{image}"}}]
  volumes: [{{name: {volume}, emptyDir: {{}}}}]
"#
        ))
    };
    [
        named("winner", 10, "busybox:1.36", "winner-data"),
        named("loser", 20, "alpine:3.20", "loser-data"),
        // Shares no container with the winner, but the loser's volume: a third round.
        template(
            r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: third}
spec:
  priority: 30
  containers: [{name: third, image: "third:1"}]
  volumes: [{name: loser-data, emptyDir: {}}, {name: winner-data, emptyDir: {}}]
"#,
        ),
    ]
}

#[test]
fn templates_adding_the_same_names_are_proven_on_pods_of_their_own() {
    let compiled = compile_policy(&same_names(), &options());
    assert_eq!(compiled.proof_rounds, [0, 1, 2]);
    assert_eq!(compiled.proof_round_count(), 3);
    // Each proof mutation runs on its round's Pod only; the policy itself knows no rounds.
    let (proof, _) = compiled.proof.clone().unwrap();
    let proof = expressions(&proof);
    assert!(proof[0].starts_with(r#"object.metadata.?annotations.orValue({})[?"sidecar.dev/policy-proof-round"].orValue("0") == "0""#), "{}", proof[0]);
    assert!(proof[1].contains(r#".orValue("0") == "1""#), "{}", proof[1]);
    assert!(proof[2].contains(r#".orValue("0") == "2""#), "{}", proof[2]);
    let policy = compiled.policy.clone().unwrap();
    assert!(
        expressions(&policy)
            .iter()
            .all(|e| !e.contains("policy-proof-round"))
    );
    // The first round's Pod carries no round; the others say theirs.
    let round = |pod: &Value| {
        pod["metadata"]["annotations"]
            .get(POLICY_PROOF_ROUND_ANNOTATION)
            .cloned()
    };
    assert_eq!(round(&proof_round_pod(&compiled, 0)), None);
    assert_eq!(round(&proof_round_pod(&compiled, 2)), Some(json!("2")));

    // Each round's Pod as the API server stores it: only that round's templates ran.
    let pod = |record: &str, containers: Value, volumes: Value| {
        json!({
            "metadata": {"annotations": {
                POLICY_PROVEN_ANNOTATION: compiled.hash,
                INJECTED_ANNOTATION: record,
            }},
            "spec": {"containers": containers, "volumes": volumes},
        })
    };
    let proven = [
        pod(
            "winner@1#00",
            json!([{"name": "policy-proof-0", "image": "none:1"}, {"name": "helper", "image": "busybox:1.36"}]),
            json!([{"name": "winner-data", "emptyDir": {}}]),
        ),
        pod(
            "loser@1#00",
            json!([{"name": "policy-proof-0", "image": "none:1"}, {"name": "helper", "image": "alpine:3.20"}]),
            json!([{"name": "loser-data", "emptyDir": {}}]),
        ),
        pod(
            "third@1#00",
            json!([{"name": "policy-proof-0", "image": "none:1"}, {"name": "third", "image": "third:1"}]),
            json!([{"name": "loser-data", "emptyDir": {}}, {"name": "winner-data", "emptyDir": {}}]),
        ),
    ];
    for (round, stored) in proven.iter().enumerate() {
        assert_eq!(
            proof_problem(&compiled, round, stored),
            None,
            "round {round}"
        );
    }
    // A proof that ran another round's templates too (a proof policy that knew no rounds,
    // still loaded): its Pod proves nothing.
    let mut mixed = proven[1].clone();
    mixed["metadata"]["annotations"][INJECTED_ANNOTATION] = json!("winner@1#00,loser@1#00");
    assert!(
        proof_problem(&compiled, 1, &mixed).is_some_and(|p| p.contains("records the templates"))
    );
    // The first round's Pod does not prove the second round's template, whatever it records.
    assert!(
        proof_problem(&compiled, 1, &proven[0])
            .is_some_and(|p| p.contains("records the templates"))
    );
    // A volume stored otherwise than the policy predicts, when it takes a Pod's own by that
    // name for the template's, proves nothing.
    let mut otherwise = proven[2].clone();
    otherwise["spec"]["volumes"][1] =
        json!({"name": "winner-data", "emptyDir": {"medium": "Memory"}});
    assert!(
        proof_problem(&compiled, 2, &otherwise)
            .is_some_and(|p| p.contains("stored volume \"winner-data\"")),
        "{:?}",
        proof_problem(&compiled, 2, &otherwise)
    );
    let mut first = proven[0].clone();
    first["metadata"]["annotations"][INJECTED_ANNOTATION] = json!("loser@1#00");
    assert!(
        proof_problem(&compiled, 1, &first)
            .is_some_and(|p| p.contains("loser") && p.contains("loser-data"))
    );
    // The loser's presence is its own content, not the winner's: a Pod with the winner's
    // container does not pass for carrying the loser.
    let present = presence_conditions(&compiled, &proven);
    assert!(present["winner"].contains("busybox:1.36") && !present["winner"].contains("alpine"));
    assert!(
        present["loser"].contains("alpine:3.20") && !present["loser"].contains("busybox"),
        "{}",
        present["loser"]
    );
    assert!(present["third"].contains("third:1"));
    // Without the later rounds' Pods, their templates get no condition rather than a wrong one.
    let present = presence_conditions(&compiled, &proven[..1]);
    assert_eq!(present.keys().collect::<Vec<_>>(), ["winner"]);
}

#[test]
fn templates_with_distinct_names_take_one_proof_pod() {
    let compiled = compile_policy(&[template(AGENT), template(PROXY)], &options());
    assert_eq!(compiled.proof_rounds, [0, 0]);
    assert_eq!(compiled.proof_round_count(), 1);
    let (proof, _) = compiled.proof.clone().unwrap();
    assert!(
        expressions(&proof)
            .iter()
            .all(|e| !e.contains("policy-proof-round"))
    );
}

#[test]
fn a_placeholder_that_may_render_empty_makes_its_field_optional() {
    let team = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: team}
spec:
  containers:
  - name: team
    image: "team:1"
    workingDir: "{{ pod.labels['dir'] }}"
    env:
    - {name: TEAM, value: "{{ pod.annotations['team'] }}"}
    - {name: POD, value: "{{ pod.name }}"}
"#,
    );
    let compiled = compile_policy(&[team], &options());
    // The proof Pod had neither the label nor the annotation: the API server left
    // `workingDir` and TEAM's value out.
    let proven = json!({"spec": {"containers": [
        {"name": "policy-proof-0", "image": "none:1"},
        {"name": "team", "image": "team:1",
         "env": [{"name": "TEAM"}, {"name": "POD", "value": "sidecar-injector-policy-proof-"}]},
    ]}});
    let present = &presence_conditions(&compiled, &[proven])["team"];
    let team_value = r#"?"value": ((object.metadata.?annotations.orValue({})[?"team"].orValue("")) != "" ? optional.of(dyn((object.metadata.?annotations.orValue({})[?"team"].orValue("")))) : optional.none())"#;
    assert!(present.contains(team_value), "{present}");
    // POD's value was stored, and may still be left out where a Pod's name renders empty.
    assert!(
        present.contains(r#"?"value": (((object.metadata.?name"#),
        "{present}"
    );
    // A top-level field: its text, or absent (or empty) when that renders empty.
    assert!(
        present.contains(r#"c[?"workingDir"].orValue("") == (object.metadata.?labels"#),
        "{present}"
    );
    assert!(
        present.contains(r#"size(c) == 3 + ("workingDir" in c ? 1 : 0)"#),
        "{present}"
    );
}

#[test]
fn a_template_with_nothing_to_recognise_it_by_gets_no_presence() {
    let env_only = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: env-only}
spec:
  appContainers:
    env: [{name: A, value: b}]
"#,
    );
    let compiled = compile_policy(&[env_only], &options());
    assert!(presence_conditions(&compiled, &[json!({"spec": {"containers": []}})]).is_empty());
}

const REQUIRED_ENV_FROM: &str = r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: settings}
spec:
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {team: pay}}
  containers: [{name: settings, image: "s:1"}]
  appContainers:
    envFrom: [{configMapRef: {name: settings}}]
"#;

#[test]
fn the_guard_has_a_rule_per_required_template() {
    let templates = [
        template(PROXY),
        template(AGENT),
        template(REQUIRED_ENV_FROM),
    ];
    let compiled = compile_policy(&templates, &options());
    let present = BTreeMap::from([("agent".to_owned(), "AGENT-PRESENT".to_owned())]);
    let rules = guard_rules(&templates, Some(&compiled), &present);
    // `proxy` is best-effort: no rule. `agent` is served: the Pod must carry it as stored.
    // `settings` cannot be served: every Pod it selects is refused.
    let names: Vec<&str> = rules.iter().map(|(t, _)| t.name.as_str()).collect();
    assert_eq!(names, ["agent", "settings"]);
    assert_eq!(rules[0].1, GuardRule::Carries("AGENT-PRESENT".to_owned()));
    assert!(matches!(&rules[1].1, GuardRule::CannotInject(why) if why.contains("envFrom")));

    let guard = compile_guard(&options(), &rules, None).unwrap();
    let spec = &guard.policy["spec"];
    assert_eq!(guard.policy["kind"], "ValidatingAdmissionPolicy");
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(guard.binding["spec"]["validationActions"], json!(["Deny"]));
    let validations = spec["validations"].as_array().unwrap();
    // The first answers the probe; then one per rule, in order, each reading its condition
    // from a variable.
    assert_eq!(validations.len(), 3);
    assert_eq!(
        validations[2]["expression"],
        "request.namespace == \"operator-ns\"\n|| variables.t1_0"
    );
    let variables = spec["variables"].as_array().unwrap();
    assert_eq!(variables.len(), 2);
    assert_eq!(variables[1]["name"], "t1_0");
    let settings = variables[1]["expression"].as_str().unwrap();
    assert!(settings.contains("namespaceObject.metadata.?labels.orValue({})"));
    assert!(!settings.contains("PRESENT"));
    let agent = variables[0]["expression"].as_str().unwrap();
    assert_eq!(agent, "(false || (AGENT-PRESENT))");
    assert_eq!(guard.passes["agent"].refuses, None);
    assert!(
        guard.passes["settings"]
            .refuses
            .as_deref()
            .is_some_and(|why| why.contains("envFrom"))
    );
    assert!(
        validations[1]["message"]
            .as_str()
            .unwrap()
            .contains("\"agent\" is required")
    );

    // The probe Pod is refused by this version only.
    let probe = guard_probe_pod(&guard);
    let token = probe["metadata"]["annotations"][POLICY_PROOF_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        validations[0]["expression"]
            .as_str()
            .unwrap()
            .contains(token)
    );
    let refusal = format!(
        "admission webhook denied: {}",
        validations[0]["message"].as_str().unwrap()
    );
    assert!(guard_in_force(&guard, &refusal));
    let other = compile_guard(&options(), &rules[1..], None).unwrap();
    assert_ne!(other.hash, guard.hash);
    assert!(!guard_in_force(&other, &refusal));
}

#[test]
fn without_policies_every_required_template_refuses_what_it_selects() {
    let templates = [template(PROXY), template(AGENT)];
    let rules = guard_rules(&templates, None, &BTreeMap::new());
    assert_eq!(rules.len(), 1);
    assert!(
        matches!(&rules[0].1, GuardRule::CannotInject(why) if why.contains("does not serve MutatingAdmissionPolicies"))
    );
    // `agent` selects every Pod: the rule passes only the operator's namespace.
    let guard = compile_guard(&options(), &rules, None).unwrap();
    assert_eq!(
        guard.policy["spec"]["validations"][1]["expression"],
        "request.namespace == \"operator-ns\"\n|| variables.t0_0"
    );
    assert_eq!(
        guard.policy["spec"]["variables"][0]["expression"],
        "(false)"
    );
    assert!(compile_guard(&options(), &[], None).is_none());
}

/// The rule of `template` a guard puts in force reading `condition`.
fn carries(
    template: &Arc<CompiledTemplate>,
    condition: &str,
) -> (Arc<CompiledTemplate>, GuardRule) {
    (
        Arc::clone(template),
        GuardRule::Carries(condition.to_owned()),
    )
}

#[test]
fn the_guard_between_two_policies_accepts_either_version() {
    let agent = template(AGENT);
    let agent_v2 = template(&AGENT.replace("agent:2", "agent:3"));
    let settings = template(REQUIRED_ENV_FROM);
    let before = compile_guard(&options(), &[carries(&agent, "V1")], None).unwrap();
    // What is in force is read back from the policy as the API server stores it, as a new
    // leader does.
    let in_force = guard_in_force_of(&before.policy);
    assert_eq!(in_force, before.passes);
    assert_eq!(in_force["agent"].conditions, ["(false || (V1))"]);
    let after = [
        carries(&agent_v2, "V2"),
        (settings, GuardRule::CannotInject("no".to_owned())),
    ];
    let between = compile_guard(&options(), &after, Some(&in_force)).unwrap();
    let validations = between.policy["spec"]["validations"].as_array().unwrap();
    // `settings` had no rule before: it gets its new one alone, refusing what it selects
    // from now on, never admitting it bare.
    assert_eq!(validations.len(), 3);
    assert_eq!(
        between.passes["agent"].conditions,
        ["(false || (V2))", "(false || (V1))"]
    );
    assert_eq!(
        validations[1]["expression"],
        "request.namespace == \"operator-ns\"\n|| variables.t0_0\n|| variables.t0_1"
    );
    assert_eq!(between.passes["settings"].conditions.len(), 1);
    assert!(between.passes["settings"].refuses.is_some());
    assert_eq!(guard_in_force_of(&between.policy), between.passes);
    let settled = compile_guard(&options(), &after, None).unwrap();
    assert_ne!(settled.hash, between.hash);
    assert_eq!(settled.passes.len(), 2);
    // With nothing in force, the new rules alone.
    let fresh = compile_guard(&options(), &after, Some(&BTreeMap::new())).unwrap();
    for (name, kept) in &fresh.passes {
        assert_eq!(kept.conditions, settled.passes[name].conditions);
    }
}

#[test]
fn repeated_failed_changes_keep_the_guard_bounded() {
    let agent = template(AGENT);
    let proxy = template(&PROXY.replace("failurePolicy: Ignore", "failurePolicy: Fail"));
    let mut in_force = compile_guard(&options(), &[carries(&agent, "V0")], None)
        .unwrap()
        .passes;
    let mut sizes = Vec::new();
    for version in 1..=20 {
        let rules = [
            carries(&agent, &format!("V{version}")),
            carries(&proxy, &format!("P{version}")),
        ];
        // The guard in between is applied, the policy is not; a new leader reads it back.
        let between = compile_guard(&options(), &rules, Some(&in_force)).unwrap();
        in_force = guard_in_force_of(&between.policy);
        assert_eq!(in_force, between.passes);
        // The same version again changes nothing.
        let again = compile_guard(&options(), &rules, Some(&in_force)).unwrap();
        assert_eq!(again.hash, between.hash);
        sizes.push(between.policy.to_string().len());
        let conditions = &in_force["agent"].conditions;
        assert!(conditions.len() <= 3, "{conditions:?}");
        // Never a guard wrapped in another: each condition is one version's.
        assert!(
            conditions.iter().all(|c| c.matches("(V").count() == 1),
            "{conditions:?}"
        );
        // The newest and the last confirmed (the oldest) stay.
        assert_eq!(conditions[0], format!("(false || (V{version}))"));
        assert_eq!(conditions.last().unwrap(), "(false || (V0))");
        // `proxy` was not in force before the first change: its new rule alone then.
        let proxy = &in_force["proxy"].conditions;
        assert_eq!(proxy.len(), version.min(3), "{proxy:?}");
    }
    // Bounded: from the third change on, only the versions' numbers grow.
    assert!(sizes.iter().all(|&size| size <= sizes[2] + 16), "{sizes:?}");
}

#[test]
fn before_a_proof_the_guard_keeps_what_is_in_force_and_refuses_the_rest() {
    let agent = template(AGENT);
    let proxy = template(&PROXY.replace("failurePolicy: Ignore", "failurePolicy: Fail"));
    let in_force = compile_guard(&options(), &[carries(&agent, "V1")], None)
        .unwrap()
        .passes;
    let templates = [Arc::clone(&agent), Arc::clone(&proxy), template(PROXY)];
    let unproven = unserved_rules(&templates, &BTreeSet::new(), "not proven yet");
    let names: Vec<&str> = unproven.iter().map(|(t, _)| t.name.as_str()).collect();
    assert_eq!(names, ["agent", "proxy"]);
    let guard = keep_guard(&options(), &unproven, &in_force, false).unwrap();
    // `agent` keeps the rule the policy in force injects it by; `proxy`, with nothing in
    // force, is refused where it selects, not admitted bare.
    assert_eq!(guard.passes["agent"], in_force["agent"]);
    assert_eq!(
        guard.passes["proxy"].refuses.as_deref(),
        Some("not proven yet")
    );
    let proxy_rule = guard.passes["proxy"].conditions[0].as_str();
    assert!(
        proxy_rule.starts_with("(!(") && !proxy_rule.contains("||"),
        "{proxy_rule}"
    );
    assert!(
        guard.passes["proxy"]
            .message
            .contains("\"proxy\" is required and cannot be injected: not proven yet")
    );
    // Read back, the same.
    let read = guard_in_force_of(&guard.policy);
    assert_eq!(read, guard.passes);
    // Kept again, nothing changes; when the proof fails, the refusal says why.
    let again = keep_guard(&options(), &unproven, &read, false).unwrap();
    assert_eq!(again.hash, guard.hash);
    let failed = unserved_rules(&templates, &BTreeSet::new(), "its proof failed: a\nb");
    let failed = keep_guard(&options(), &failed, &read, true).unwrap();
    assert_eq!(failed.passes["agent"], in_force["agent"]);
    assert_eq!(
        failed.passes["proxy"].refuses.as_deref(),
        Some("its proof failed: a b")
    );
    // Once proven, the guard in between gives `proxy` its new rule alone: a refusal in force
    // was for a version no policy injected.
    let between = compile_guard(
        &options(),
        &[carries(&agent, "V2"), carries(&proxy, "P2")],
        Some(&failed.passes),
    )
    .unwrap();
    assert_eq!(between.passes["proxy"].conditions.len(), 1);
    assert!(
        between.passes["proxy"]
            .message
            .contains("\"proxy\" is required and not injected yet"),
        "{}",
        between.passes["proxy"].message
    );
    assert_eq!(between.passes["agent"].conditions.len(), 2);
    assert!(
        between.passes["agent"]
            .message
            .contains("named like one of")
    );
}

#[test]
fn a_served_template_with_nothing_to_recognise_is_not_refused_before_a_proof() {
    let labels_only = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: labels-only}
spec:
  failurePolicy: Fail
  metadata:
    labels: {team: pay}
"#,
    );
    let templates = [Arc::clone(&labels_only)];
    // The policy in force injects it and no rule is needed: it stays so while a new policy is
    // proven. Not served yet, it is refused.
    let serving = BTreeSet::from(["labels-only".to_owned()]);
    assert!(unserved_rules(&templates, &serving, "not proven yet").is_empty());
    assert_eq!(
        unserved_rules(&templates, &BTreeSet::new(), "not proven yet").len(),
        1
    );
}

#[test]
fn a_guard_a_crashed_leader_left_between_two_policies_is_recovered_not_wrapped() {
    let agent = template(AGENT);
    let settled = compile_guard(&options(), &[carries(&agent, "V1")], None)
        .unwrap()
        .passes;
    // The leader crashed between the guard in between and the policy: either may run.
    let left = compile_guard(&options(), &[carries(&agent, "V2")], Some(&settled)).unwrap();
    let in_force = guard_in_force_of(&left.policy);
    assert_eq!(
        in_force["agent"].conditions,
        ["(false || (V2))", "(false || (V1))"]
    );
    // The next leader, before its proof, keeps it as it is: nothing to apply.
    let unproven = unserved_rules(std::slice::from_ref(&agent), &BTreeSet::new(), "not proven");
    let kept = keep_guard(&options(), &unproven, &in_force, false).unwrap();
    assert_eq!(kept.passes, in_force);
    assert_eq!(kept.hash, left.hash);
    // Its change accepts both versions and the new one, each as it is.
    let between = compile_guard(&options(), &[carries(&agent, "V3")], Some(&in_force)).unwrap();
    assert_eq!(
        between.passes["agent"].conditions,
        ["(false || (V3))", "(false || (V2))", "(false || (V1))"]
    );
    let variables = between.policy["spec"]["variables"].as_array().unwrap();
    assert_eq!(variables.len(), 3);
    assert!(
        variables
            .iter()
            .all(|v| !v["expression"].as_str().unwrap().contains("variables."))
    );
}

#[test]
fn a_guard_from_before_variables_is_read_whole() {
    let stored = json!({
        "metadata": {"annotations": {"sidecar.dev/guard-templates": "agent"}},
        "spec": {"validations": [
            {"expression": "probe", "message": "in force"},
            {"expression": "OLD || (OLDER)", "message": "SidecarTemplate \"agent\" is required: look-alike"},
        ]},
    });
    let read = guard_in_force_of(&stored);
    assert_eq!(read["agent"].conditions, ["OLD || (OLDER)"]);
    assert_eq!(read["agent"].refuses, None);
}

#[test]
fn dry_run_pods_pass_the_restricted_pod_security_standard() {
    let compiled = compile_policy(&[template(AGENT), template(PROXY)], &options());
    let rules = guard_rules(&[template(AGENT)], Some(&compiled), &BTreeMap::new());
    let guard = compile_guard(&options(), &rules, None).unwrap();
    for pod in [
        proof_pod(&compiled, false),
        proof_pod(&compiled, true),
        proof_round_pod(&compiled, 1),
        guard_probe_pod(&guard),
    ] {
        assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["spec"]["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let containers = pod["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        let security = &containers[0]["securityContext"];
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
        assert_ne!(security["runAsUser"], 0);
    }

    // What is learned from the proof Pod is the template's containers alone: nothing of the
    // Pod's own security settings.
    let mut stored = proof_round_pod(&compiled, 0);
    stored["metadata"]["annotations"][POLICY_PROVEN_ANNOTATION] = json!(compiled.hash);
    stored["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "agent", "image": "agent:2", "env": [{"name": "NS", "value": "operator-ns"}]}));
    stored["spec"]["initContainers"] = json!([
        {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "args": ["--node", "sidecar-injector-policy-proof-"]},
    ]);
    stored["spec"]["volumes"] = json!([{"name": "proxy-certs", "emptyDir": {}}]);
    let present = presence_conditions(&compiled, &[stored]);
    assert_eq!(present.len(), 2);
    for condition in present.values() {
        for field in [
            "runAsNonRoot",
            "seccompProfile",
            "securityContext",
            "65534",
            "ALL",
        ] {
            assert!(!condition.contains(field), "{field}: {condition}");
        }
    }
}

#[test]
fn the_warnings_policy_gives_plans_warnings_for_what_the_policy_applied() {
    let labelled = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: labelled}
spec:
  priority: 30
  failurePolicy: Ignore
  appContainers:
    names: [app]
    env: [{name: AGENT_SOCKET, value: /elsewhere.sock}, {name: REGION, value: "{{ pod.labels['region'] }}"}]
    volumeMounts: [{name: data, mountPath: /data}]
  metadata:
    labels: {owner: "{{ pod.annotations['owner'] }}", fixed: "yes"}
    annotations: {note: "hello"}
"#,
    );
    let templates = [template(AGENT), labelled];
    let compiled = compile_policy(&templates, &options());
    let present = BTreeMap::from([("agent".to_owned(), "AGENT-PRESENT".to_owned())]);
    let (policy, bindings) = compile_warnings(&options(), &compiled, &present, true).unwrap();
    // The agent selects every namespace: one binding, for all of them.
    let [binding] = &bindings[..] else {
        panic!("one binding expected: {bindings:?}")
    };
    assert_eq!(binding["metadata"]["name"], "sidecar-injector-warnings");
    assert_eq!(binding["spec"]["validationActions"], json!(["Warn"]));
    assert!(binding["spec"].get("matchResources").is_none(), "{binding}");
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    // The operator's namespace is left out by the selector, with the namespaces never
    // injected: no match condition, which would cost every Pod a CEL copy of its own.
    assert!(policy["spec"].get("matchConditions").is_none(), "{policy}");
    assert!(
        policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"]
            .as_array()
            .unwrap()
            .contains(&json!("operator-ns")),
        "{policy}"
    );
    let validations = policy["spec"]["validations"].as_array().unwrap();
    let messages: Vec<&str> = validations
        .iter()
        .map(|v| v["messageExpression"].as_str().unwrap())
        .collect();
    // `agent` (required): the opt-out, and its app env, once it is there as the policy adds it.
    assert!(messages[0].contains(r#"SidecarTemplate \"agent\" is required: the pod's sidecar.dev/inject: \"false\" does not apply to it"#), "{}", messages[0]);
    let agent_env = validations[1]["expression"].as_str().unwrap();
    assert!(agent_env.contains("(AGENT-PRESENT)"), "{agent_env}");
    assert!(
        agent_env.contains(r#"x["name"] == "AGENT_SOCKET""#),
        "{agent_env}"
    );
    assert!(
        agent_env.contains(r#"x["value"] == "/run/agent.sock""#),
        "{agent_env}"
    );
    assert!(messages[1].contains(r#"env \"AGENT_SOCKET\" of container \""#));
    // `labelled` adds no container: applied whenever it selects. Its invalid templated label,
    // the label and annotation the Pod keeps, its env and mount; not `AGENT_SOCKET`, which
    // `agent` adds before it (whose value the Pod then holds cannot be told).
    let all = messages.join("\n");
    assert!(all.contains(r#"label \"owner\" not added: \""#), "{all}");
    assert!(all.contains(r#"label \"fixed\" is already set in the pod; kept the pod's value"#));
    assert!(all.contains(r#"annotation \"note\" is already set in the pod"#));
    assert!(all.contains(r#"env \"REGION\" of container"#));
    // REGION's value renders empty where the Pod has no `region` label, and the API server
    // then stores the env var without one: that is the template's, not a value the Pod kept.
    let region = validations
        .iter()
        .map(|v| v["expression"].as_str().unwrap())
        .find(|e| e.contains(r#""REGION""#))
        .unwrap();
    assert!(
        region.contains(r#"x[?"value"].orValue("") == (object.metadata.?labels"#),
        "{region}"
    );
    assert!(all.contains(r#"volume mount at \"/data\" in container"#));
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.contains(r#"env \"AGENT_SOCKET\""#))
            .count(),
        1,
        "{all}"
    );
    for validation in validations {
        let expression = validation["expression"].as_str().unwrap();
        assert!(expression.starts_with("!("), "{expression}");
    }
    // Nothing the policy serves can warn: no policy.
    let quiet = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: quiet}
spec:
  failurePolicy: Ignore
  containers: [{name: quiet, image: "q:1"}]
"#,
    );
    let compiled = compile_policy(&[quiet], &options());
    assert!(compile_warnings(&options(), &compiled, &BTreeMap::new(), true).is_none());
    // Without the webhook behind the policy, a conflict of a best-effort template is warned
    // about here.
    let present = BTreeMap::from([("quiet".to_owned(), "QUIET-PRESENT".to_owned())]);
    let (policy, _) = compile_warnings(&options(), &compiled, &present, false).unwrap();
    let conflict = &policy["spec"]["validations"][0];
    let expression = conflict["expression"].as_str().unwrap();
    assert!(
        expression.contains(r#"exists(i, i.name in ["quiet"])"#)
            && expression.contains("!(QUIET-PRESENT)"),
        "{expression}"
    );
    assert!(
        conflict["messageExpression"]
            .as_str()
            .unwrap()
            .contains(r#"\"quiet\" not applied"#)
    );
}

#[test]
fn validating_policies_read_the_name_as_the_mutation_rendered_it() {
    // The policy renders `{{ pod.name }}` before the API server generates a name; the guard
    // and the warnings run after, so they read `generateName` where the name was generated.
    let named = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: named}
spec:
  containers: [{name: named, image: "n:1", args: ["{{ pod.name }}"]}]
  metadata:
    labels: {pod: "{{ pod.name }}"}
"#,
    );
    let compiled = compile_policy(&[Arc::clone(&named)], &options());
    let mutation = expressions(compiled.policy.as_ref().unwrap())[0];
    assert!(mutation.contains(NAME_AT_MUTATION));
    let present = BTreeMap::from([(
        "named".to_owned(),
        format!("c.args == [{NAME_AT_MUTATION}]"),
    )]);
    let rules = guard_rules(&[Arc::clone(&named)], Some(&compiled), &present);
    let guard = compile_guard(&options(), &rules, None).unwrap();
    let (warnings, _) = compile_warnings(&options(), &compiled, &present, true).unwrap();
    for policy in [&guard.policy, &warnings] {
        let text = policy["spec"].to_string();
        assert!(
            !text.contains("object.metadata.name : object.metadata.?generateName"),
            "{text}"
        );
        assert!(
            text.contains("object.metadata.generateName.substring(0, 58)"),
            "{text}"
        );
    }
}

#[test]
fn a_placeholder_reading_what_the_webhook_adds_stays_on_the_webhook() {
    // `settings` stays on the webhook (envFrom) and adds a label; the webhook is called after
    // the policy, so `reader`, applied after it, would render it empty from a policy.
    let settings = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: settings}
spec:
  priority: 5
  appContainers:
    envFrom: [{configMapRef: {name: settings}}]
  metadata:
    labels: {settings: loaded}
"#,
    );
    let reader = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: reader}
spec:
  priority: 10
  containers: [{name: reader, image: "r:1", args: ["{{ pod.labels['settings'] }}"]}]
"#,
    );
    let compiled = compile_policy(&[settings, reader, template(PROXY)], &options());
    let reasons: Vec<(String, String)> = compiled
        .webhook_only
        .iter()
        .map(|(t, why)| (t.name.clone(), why.to_string()))
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[1].0, "reader");
    assert!(
        reasons[1]
            .1
            .contains("\"settings\", which SidecarTemplate \"settings\" adds from the webhook"),
        "{reasons:?}"
    );
    // And `proxy`, applied after `settings`, stays with it on the webhook.
    assert_eq!(reasons[2].0, "proxy");
    assert!(compiled.served.is_empty());
}

/// The presence conditions allow what the API server adds to an injected container as the
/// webhook's comparison (`crate::rules::defaulted`) does: a hostNetwork Pod's `hostPort`s, a
/// LimitRange's resources beside the template's. The guard refused such Pods.
#[test]
fn presence_allows_host_ports_and_limit_range_resources() {
    let ported = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: ported}
spec:
  failurePolicy: Fail
  containers:
  - name: ported
    image: "ported:1"
    ports: [{containerPort: 9100, name: metrics}, {containerPort: 53, hostPort: 1053, protocol: UDP}]
    resources: {limits: {memory: 64Mi}}
"#,
    );
    let compiled = compile_policy(&[ported], &options());
    let proven = json!({"spec": {"containers": [
        {"name": "ported", "image": "ported:1", "imagePullPolicy": "IfNotPresent",
         "ports": [{"containerPort": 9100, "name": "metrics", "protocol": "TCP"},
                   {"containerPort": 53, "hostPort": 1053, "protocol": "UDP"}],
         "resources": {"limits": {"memory": "64Mi"}}},
    ]}});
    let present = presence_conditions(&compiled, std::slice::from_ref(&proven));
    let ported = &present["ported"];
    // On a hostNetwork Pod each port without one gets its containerPort as hostPort.
    assert!(
        ported.contains(r#"(object.spec.?hostNetwork.orValue(false) && c["ports"] == [dyn({"containerPort": dyn(9100), "hostPort": dyn(9100), "name": dyn("metrics"), "protocol": dyn("TCP")}), dyn({"containerPort": dyn(53), "hostPort": dyn(1053), "protocol": dyn("UDP")})])"#),
        "{ported}"
    );
    // The template's resources must be there; a LimitRange may add others.
    assert!(
        ported.contains(r#"("resources" in c && (("limits" in c["resources"] && (("memory" in c["resources"]["limits"] && c["resources"]["limits"]["memory"] == "64Mi")))))"#),
        "{ported}"
    );
    // Resources the template sets are expected, so not allowed as an addition.
    assert!(!ported.contains(r#" || k == "resources")"#), "{ported}");
}

/// Behind the policy, the webhook applies its templates after the policy's whatever their
/// priority: a template after one left to the webhook, which may select the same Pods, stays
/// with it (its plain init container went before the webhook template's native sidecar, and its
/// env won). Without a webhook (`policy` backend) nothing would apply it, so it stays served.
#[test]
fn a_template_after_a_webhook_template_stays_with_it_behind_the_policy() {
    let mesh = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: mesh}
spec:
  priority: 1
  initContainers: [{name: mesh-proxy, image: "mesh:1", restartPolicy: Always}]
  appContainers:
    env: [{name: MODE, value: mesh}]
    envFrom: [{configMapRef: {name: mesh-env}}]
"#,
    );
    let fetch = |name: &str, selector: &str| {
        template(&format!(
            r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {{name: {name}}}
spec:
  priority: 5
  failurePolicy: Ignore
  {selector}
  initContainers: [{{name: {name}-init, image: "fetch:1"}}]
  appContainers:
    env: [{{name: MODE, value: fetch}}]
"#
        ))
    };
    let templates = [
        mesh.clone(),
        fetch("fetch", ""),
        // Selects other namespaces than the mesh: nothing to order.
        fetch("apart", "namespaceSelector: {matchLabels: {team: b}}"),
    ];
    let compiled = compile_policy(&templates, &options());
    let left: Vec<(&str, String)> = compiled
        .webhook_only
        .iter()
        .map(|(t, why)| (t.name.as_str(), why.to_string()))
        .collect();
    // The mesh selects every namespace, so `apart` may meet it too.
    let names: Vec<&str> = left.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["mesh", "apart", "fetch"], "{left:?}");
    assert!(left[2].1.contains("\"mesh\" applies before it"), "{left:?}");
    assert!(compiled.served.is_empty());

    let alone = compile_policy(
        &templates,
        &PolicyOptions {
            webhook_behind: false,
            ..options()
        },
    );
    let served: Vec<&str> = alone.served.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(served, ["apart", "fetch"]);
}

/// A required template selecting on a label that a template left to the webhook adds: with the
/// `policy` backend that label never comes, so the Pods the other template selects were admitted
/// with neither while `plan` injects both. It stays on the webhook, and the guard refuses those
/// Pods too.
#[test]
fn a_required_template_selecting_on_a_webhook_label_refuses_where_it_would_select() {
    let labeller = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: labeller}
spec:
  priority: 1
  failurePolicy: Ignore
  podSelector: {matchLabels: {app: web}}
  appContainers:
    envFrom: [{configMapRef: {name: settings}}]
  metadata:
    labels: {tier: meshed}
"#,
    );
    let meshed = template(
        r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: meshed}
spec:
  priority: 5
  failurePolicy: Fail
  namespaceSelector: {matchLabels: {mesh: "on"}}
  podSelector: {matchLabels: {tier: meshed}}
  containers: [{name: meshed, image: "m:1"}]
"#,
    );
    let templates = [labeller, meshed];
    for webhook_behind in [true, false] {
        let compiled = compile_policy(
            &templates,
            &PolicyOptions {
                webhook_behind,
                ..options()
            },
        );
        assert!(compiled.served.is_empty());
        assert_eq!(
            compiled.webhook_only[1].1,
            WebhookOnly::SelectsOnWebhookLabel {
                label: "tier".into(),
                added_by: "labeller".into()
            }
        );
    }
    let alone = compile_policy(
        &templates,
        &PolicyOptions {
            webhook_behind: false,
            ..options()
        },
    );
    let rules = guard_rules(&templates, Some(&alone), &BTreeMap::new());
    let [(_, GuardRule::CannotInjectWhere { why, also })] = &rules[..] else {
        panic!("{rules:?}")
    };
    assert!(why.contains("\"labeller\" adds from the webhook"), "{why}");
    // The labeller's selection (its pod selector and opt-out), in the meshed template's
    // namespaces.
    assert!(
        also.contains(r#"object.metadata.?labels.orValue({})["app"] == "web""#),
        "{also}"
    );
    assert!(also.contains("lowerAscii"), "{also}");
    assert!(
        also.contains(r#"namespaceObject.metadata.?labels.orValue({})["mesh"] == "on""#),
        "{also}"
    );
    let guard = compile_guard(&options(), &rules, None).unwrap();
    let variables = guard.policy["spec"]["variables"].to_string();
    assert!(variables.contains("&& !("), "{variables}");
    assert!(variables.contains("\\\"web\\\""), "{variables}");
}

/// `count` templates shaped as in `just bench-admission-sizes`: a sidecar with ten env vars,
/// probes and resources, in 64 namespace groups, half of them required.
fn many_templates(count: usize) -> Vec<Arc<CompiledTemplate>> {
    (0..count)
        .map(|index| {
            let env: Vec<Value> = (0..10)
                .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{index}-{i}")}))
                .collect();
            let source = json!({
                "apiVersion": "sidecar.dev/v1alpha1",
                "kind": "SidecarTemplate",
                "metadata": {"name": format!("sidecar-{index:03}"), "generation": 1},
                "spec": {
                    "priority": index % 7,
                    "failurePolicy": if index.is_multiple_of(2) { "Fail" } else { "Ignore" },
                    "namespaceSelector": {"matchLabels": {"team": format!("team-{}", index % 64)}},
                    "containers": [{
                        "name": format!("sidecar-{index}-agent"),
                        "image": format!("agents.invalid/sidecar-{index}:1.2.{index}"),
                        "args": ["--pod", "{{ pod.name }}"],
                        "env": env,
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 9100}},
                        "resources": {"limits": {"memory": "64Mi"}},
                    }],
                },
            });
            let parsed: SidecarTemplate = serde_json::from_value(source).unwrap();
            Arc::new(compile(&parsed).unwrap())
        })
        .collect()
}

#[test]
fn templates_past_the_budget_are_left_to_the_webhook_in_application_order() {
    let templates = many_templates(12);
    let whole = compile_policy(&templates, &options());
    assert_eq!(whole.served.len(), 12);
    // Room for five: the first five in application order are served, the rest left, each
    // saying why. The budget counts each template's own mutation, batched or not.
    let five: usize = whole.served[..5]
        .iter()
        .map(|t| mutation(t, TEMPLATE_CONTAINERS, &BTreeSet::new(), true).len())
        .sum();
    let within = compile_policy_within(&templates, &options(), five + 10);
    assert_eq!(within.served.len(), 5);
    assert_eq!(within.served[..], whole.served[..5]);
    // Behind the policy, the webhook applies the rest after it, in their order.
    for (template, why) in &within.webhook_only {
        assert!(
            matches!(why, WebhookOnly::PolicyFull { .. })
                || matches!(why, WebhookOnly::AfterWebhookTemplate { .. }),
            "{}: {why}",
            template.name
        );
    }
    assert_eq!(within.webhook_only.len(), 7);
    assert!(
        within.webhook_only[0]
            .1
            .to_string()
            .contains("fill the policy")
    );
}

#[test]
fn five_hundred_templates_fit_in_what_etcd_stores() {
    const ETCD_LIMIT: usize = 1536 * 1024;
    let templates = many_templates(500);
    for webhook_behind in [true, false] {
        let compiled = compile_policy(
            &templates,
            &PolicyOptions {
                webhook_behind,
                ..options()
            },
        );
        let policy = compiled.policy.as_ref().unwrap().to_string().len();
        let proof = compiled.proof.as_ref().unwrap().0.to_string().len();
        assert!(
            policy < ETCD_LIMIT && proof < ETCD_LIMIT,
            "{policy} {proof}"
        );
        // The API server compiles no CEL expression over 100,000 code points: the policy was
        // refused at 500 templates for its `templateContainers` variable.
        let rules = guard_rules(&templates, Some(&compiled), &BTreeMap::new());
        let guard = compile_guard(&options(), &rules, None).map(|g| g.policy);
        let after = compile_after_admission(&templates, &options()).map(|a| a.policy);
        let objects = [
            compiled.policy.as_ref(),
            compiled.proof.as_ref().map(|(p, _)| p),
            guard.as_ref(),
            after.as_ref(),
        ];
        for object in objects.into_iter().flatten() {
            let longest = longest_expression(object);
            assert!(longest <= MAX_EXPRESSION, "{longest} in {}", object["kind"]);
        }
        assert!(compiled.served.len() > 100, "{}", compiled.served.len());
        assert_eq!(compiled.served.len() + compiled.webhook_only.len(), 500);
        if let Some((warnings, _)) =
            compile_warnings(&options(), &compiled, &BTreeMap::new(), webhook_behind)
        {
            let warnings = warnings.to_string().len();
            assert!(warnings < ETCD_LIMIT, "{warnings}");
        }
    }
}

#[test]
fn the_template_containers_variable_is_cut_below_the_expression_limit() {
    let templates = many_templates(1000);
    let ordered: Vec<&Arc<CompiledTemplate>> = templates.iter().collect();
    let variables = template_containers(&ordered);
    assert!(variables.len() > 2, "{}", variables.len());
    let names: Vec<&str> = variables
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    // The parts first, then the variable the mutations read, adding them up in order.
    assert_eq!(names.last(), Some(&"templateContainers"));
    let sum = (0..variables.len() - 1)
        .map(|i| format!("variables.templateContainers{i}"))
        .collect::<Vec<_>>()
        .join(" + ");
    assert_eq!(variables.last().unwrap()["expression"], sum);
    for variable in &variables {
        assert!(longest_expression(variable) <= MAX_EXPRESSION);
    }
}
