use super::*;
use crate::patch::PatchValue;
use serde_json::{Map, json};

fn facts<'a>(labels: &'a Map<String, Value>, annotations: &'a Map<String, Value>) -> PodFacts<'a> {
    PodFacts {
        name: "web-abc",
        namespace: "shop",
        service_account_name: "web",
        labels: Some(labels),
        annotations: Some(annotations),
    }
}

fn render(text: &str) -> String {
    let labels = json!({"app": "web", "a/b~c": "x"});
    let annotations = json!({"team": "payments"});
    let pod = facts(
        labels.as_object().unwrap(),
        annotations.as_object().unwrap(),
    );
    TemplateString::parse(text).unwrap().unwrap().render(&pod)
}

#[test]
fn every_placeholder_renders() {
    assert_eq!(render("{{ pod.name }}"), "web-abc");
    assert_eq!(render("{{pod.namespace}}"), "shop");
    assert_eq!(render("sa={{ pod.serviceAccountName }}!"), "sa=web!");
    assert_eq!(render("{{ pod.labels['app'] }}"), "web");
    assert_eq!(render("{{ pod.labels[\"a/b~c\"] }}"), "x");
    assert_eq!(render("{{ pod.annotations['team'] }}"), "payments");
    assert_eq!(render("{{ pod.labels['missing'] }}"), "");
    assert_eq!(
        render("{{ pod.namespace }}/{{ pod.name }}.svc"),
        "shop/web-abc.svc"
    );
}

#[test]
fn plain_strings_are_not_templates() {
    assert_eq!(TemplateString::parse("plain }} text").unwrap(), None);
}

#[test]
fn unknown_and_unterminated_placeholders_are_errors() {
    let unknown = TemplateString::parse("{{ pod.uid }}").unwrap_err();
    assert!(
        unknown.contains("unknown placeholder {{ pod.uid }}"),
        "{unknown}"
    );
    assert!(TemplateString::parse("{{ pod.labels[app] }}").is_err());
    assert!(TemplateString::parse("{{ pod.labels[''] }}").is_err());
    assert!(TemplateString::parse("{{ env.HOME }}").is_err());
    let open = TemplateString::parse("x {{ pod.name").unwrap_err();
    assert!(open.contains("unterminated"), "{open}");
}

#[test]
fn substitution_never_produces_structure() {
    let labels = json!({"evil": "\", \"privileged\": true, \"x\": \"{{ pod.name }}"});
    let annotations = json!({});
    let pod = facts(
        labels.as_object().unwrap(),
        annotations.as_object().unwrap(),
    );
    let mut errors = Vec::new();
    let node = Node::parse(
        &json!({"env": [{"name": "A", "value": "{{ pod.labels['evil'] }}"}], "n": 1}),
        "spec",
        &mut errors,
    );
    assert!(errors.is_empty());
    let rendered = node.render(&pod);
    assert_eq!(
        rendered,
        json!({"env": [{"name": "A", "value": labels["evil"]}], "n": 1})
    );
}

/// The patch value as it was built before layouts: nested arrays and objects.
fn nested<'t>(node: &'t Node, pod: &PodFacts<'_>) -> PatchValue<'t> {
    match node {
        Node::Fixed(fixed) => PatchValue::Fixed(fixed),
        Node::Text(template) => PatchValue::String(template.render(pod)),
        Node::Array(items) => PatchValue::Array(items.iter().map(|n| nested(n, pod)).collect()),
        Node::Object(fields) => PatchValue::Object(
            fields
                .iter()
                .map(|(k, n)| (k.as_str(), nested(n, pod)))
                .collect(),
        ),
    }
}

#[test]
fn a_rendered_node_writes_compares_and_copies_as_its_nested_value() {
    let labels = json!({"app": "web", "odd": "a\"b\\c\u{1}"});
    let annotations = json!({});
    let pod = facts(
        labels.as_object().unwrap(),
        annotations.as_object().unwrap(),
    );
    let mut errors = Vec::new();
    let node = Node::parse(
        &json!({
            "args": ["fixed", "--app={{ pod.labels['app'] }}", "{{ pod.labels['odd'] }}"],
            "env": [{"name": "A", "value": "{{ pod.name }}"}, {"name": "B", "value": "b"}],
            "name": "{{ pod.namespace }}",
            "ports": [{"containerPort": 80}],
        }),
        "spec",
        &mut errors,
    );
    assert!(errors.is_empty());
    let rendered = PatchValue::render(&node, &pod);
    assert!(matches!(rendered, PatchValue::Rendered(..)));
    let expected = nested(&node, &pod);
    assert_eq!(rendered.to_value(), node.render(&pod));
    assert_eq!(rendered.to_value(), expected.to_value());
    assert_eq!(
        serde_json::to_vec(&rendered).unwrap(),
        serde_json::to_vec(&expected).unwrap()
    );
    let op = |value| {
        crate::patch::Patch(vec![crate::patch::AddOperation {
            path: crate::patch::PatchPath::escaped("/spec"),
            value,
        }])
    };
    assert_eq!(
        op(rendered.clone()).to_json().unwrap(),
        op(expected.clone()).to_json().unwrap()
    );

    let same = node.render(&pod);
    let mut defaulted = same.clone();
    defaulted["imagePullPolicy"] = json!("Always");
    defaulted["ports"][0]["protocol"] = json!("TCP");
    let mut other_text = same.clone();
    other_text["args"][1] = json!("--app=other");
    let mut missing = same.clone();
    missing.as_object_mut().unwrap().remove("env");
    let mut longer = same.clone();
    longer["args"].as_array_mut().unwrap().push(json!("more"));
    let mut retyped = same.clone();
    retyped["env"] = json!({"name": "A"});
    for (case, theirs) in [
        ("same", same),
        ("defaulted", defaulted),
        ("other text", other_text),
        ("missing", missing),
        ("longer", longer),
        ("retyped", retyped),
        ("null", Value::Null),
    ] {
        assert_eq!(
            rendered.is_subset_of(&theirs),
            expected.is_subset_of(&theirs),
            "{case}"
        );
    }
}

#[test]
fn untemplated_subtrees_stay_fixed_and_errors_carry_paths() {
    let mut errors = Vec::new();
    let node = Node::parse(
        &json!({"a": [1, "x"], "b": {"c": "y"}}),
        "spec",
        &mut errors,
    );
    assert!(matches!(node, Node::Fixed(_)));
    let node = Node::parse(&json!({"a": [1, "{{ pod.bogus }}"]}), "spec", &mut errors);
    assert!(matches!(node, Node::Fixed(_)));
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].path, "spec.a[1]");
}
