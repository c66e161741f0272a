//! Which templates share a mutation, and the batch's record evaluated by a CEL interpreter
//! beside the members' own record operations applied one after another.

use std::sync::Arc;

use kube_cel::KubeCelExt as _;
use kube_cel::cel;
use serde_json::{Value, json};

use super::{batches, record_value};
use crate::plan::Applied;
use crate::template::{CompiledTemplate, compile};
use injector_api::SidecarTemplate;

fn template(name: &str, priority: i32, spec: Value) -> Arc<CompiledTemplate> {
    let mut spec = spec;
    spec["priority"] = json!(priority);
    let source = json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    });
    let parsed: SidecarTemplate = serde_json::from_value(source).unwrap();
    Arc::new(compile(&parsed).unwrap())
}

fn container(name: &str) -> Value {
    json!({"containers": [{"name": name, "image": format!("{name}.invalid/{name}:1")}]})
}

fn with(mut spec: Value, key: &str, value: Value) -> Value {
    spec[key] = value;
    spec
}

/// The batches of `templates` as lists of names.
fn grouped(templates: &[Arc<CompiledTemplate>]) -> Vec<Vec<&str>> {
    let sizes = vec![100; templates.len()];
    batches(templates, &sizes, 10_000)
        .into_iter()
        .map(|r| templates[r].iter().map(|t| t.name.as_str()).collect())
        .collect()
}

#[test]
fn independent_templates_share_one_mutation() {
    let templates = [
        template("a", 1, container("a")),
        template(
            "b",
            2,
            with(container("b"), "failurePolicy", json!("Ignore")),
        ),
        template(
            "c",
            3,
            with(
                with(
                    container("c"),
                    "volumes",
                    json!([{"name": "c-data", "emptyDir": {}}]),
                ),
                "metadata",
                json!({"labels": {"c.example/on": "true"}, "annotations": {"c.example/note": "x"}}),
            ),
        ),
    ];
    assert_eq!(grouped(&templates), [["a", "b", "c"]]);
}

#[test]
fn a_template_reading_or_writing_what_an_earlier_member_writes_starts_a_batch() {
    let labelled = with(
        container("first"),
        "metadata",
        json!({"labels": {"team": "x"}, "annotations": {"note": "y"}}),
    );
    let cases: [(&str, Value); 7] = [
        ("the same container name", container("first")),
        (
            "a selector on its label",
            with(
                container("second"),
                "podSelector",
                json!({"matchLabels": {"team": "x"}}),
            ),
        ),
        (
            "a placeholder reading its annotation",
            json!({"containers": [{"name": "second", "image": "s.invalid/s:1", "env": [{"name": "NOTE", "value": "{{ pod.annotations['note'] }}"}]}]}),
        ),
        (
            "the same label",
            with(
                container("second"),
                "metadata",
                json!({"labels": {"team": "z"}}),
            ),
        ),
        (
            "init containers",
            json!({"initContainers": [{"name": "second", "image": "s.invalid/s:1"}]}),
        ),
        (
            "the same volume",
            json!({"containers": [{"name": "second", "image": "s.invalid/s:1"}], "volumes": [{"name": "v", "emptyDir": {}}]}),
        ),
        (
            "app containers after app containers",
            json!({"containers": [{"name": "second", "image": "s.invalid/s:1"}], "appContainers": {"env": [{"name": "B", "value": "1"}]}}),
        ),
    ];
    for (why, second) in cases {
        let mut first = labelled.clone();
        if why == "the same volume" {
            first["volumes"] = json!([{"name": "v", "emptyDir": {}}]);
        }
        if why == "app containers after app containers" {
            first["appContainers"] = json!({"env": [{"name": "A", "value": "1"}]});
        }
        let templates = [template("first", 1, first), template("second", 2, second)];
        assert_eq!(grouped(&templates), [["first"], ["second"]], "{why}");
    }
    // A template with init containers stands alone: the one after it starts a batch too.
    let templates = [
        template("a", 1, container("a")),
        template(
            "init",
            2,
            json!({"initContainers": [{"name": "i", "image": "i.invalid/i:1"}]}),
        ),
        template("b", 3, container("b")),
        template("c", 4, container("c")),
    ];
    assert_eq!(
        grouped(&templates),
        [vec!["a"], vec!["init"], vec!["b", "c"]]
    );
}

#[test]
fn a_batch_holds_at_most_its_bytes() {
    let templates: Vec<_> = (0..5)
        .map(|i| template(&format!("t{i}"), i, container(&format!("t{i}"))))
        .collect();
    let sizes = vec![400; 5];
    let ranges = batches(&templates, &sizes, 1_000);
    assert_eq!(ranges, [0..2, 2..4, 4..5]);
}

/// The record as the members' own operations leave it, one after another (`record_op`): an
/// entry naming the template replaced where it stands, else one appended.
fn sequential(existing: &str, members: &[&CompiledTemplate], applies: &[bool]) -> String {
    let mut entries: Vec<String> = existing
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    for (member, _) in members.iter().zip(applies).filter(|(_, a)| **a) {
        let entry = Applied::of(member).to_string();
        let named = |e: &String| e.rsplit_once('@').map_or(e.as_str(), |(n, _)| n) == member.name;
        if entries.iter().any(named) {
            for e in entries.iter_mut().filter(|e| named(e)) {
                e.clone_from(&entry);
            }
        } else {
            entries.push(entry);
        }
    }
    entries.join(",")
}

fn evaluated(existing: Option<&str>, members: &[&CompiledTemplate], applies: &[bool]) -> String {
    let source = record_value(members);
    let program = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .parse(&source)
        .unwrap_or_else(|e| panic!("{source}: {e:?}"));
    let mut context = cel::Context::default().with_all();
    let annotations: Value = match existing {
        Some(record) => json!({"sidecar.dev/injected": record}),
        None => json!({}),
    };
    context
        .add_variable("object", json!({"metadata": {"annotations": annotations}}))
        .unwrap();
    context.add_variable("applies", applies.to_vec()).unwrap();
    match context.resolve(&program) {
        Ok(cel::Value::String(record)) => record.to_string(),
        other => panic!("{source}: {other:?}"),
    }
}

#[test]
fn the_batch_writes_the_record_its_members_would_one_after_another() {
    let templates = [
        template("a", 1, container("a")),
        template("b", 2, container("b")),
        template("c", 3, container("c")),
    ];
    let members: Vec<&CompiledTemplate> = templates.iter().map(Arc::as_ref).collect();
    let records = [
        None,
        Some(""),
        Some("other@3#00"),
        Some("b@0, other@3#00"),
        Some("c@1#11,a@0,b"),
        Some(" a@0 ,, other"),
    ];
    for existing in records {
        for bits in 0..8u8 {
            let applies: Vec<bool> = (0..3).map(|i| bits & (1 << i) != 0).collect();
            assert_eq!(
                evaluated(existing, &members, &applies),
                sequential(existing.unwrap_or_default(), &members, &applies),
                "record {existing:?}, applies {applies:?}"
            );
        }
    }
}
