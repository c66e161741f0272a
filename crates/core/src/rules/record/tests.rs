//! The record read and written in Rust and in CEL, evaluated by a CEL interpreter with the
//! Kubernetes libraries (`kube-cel`) on generated records: the policy writes what `plan`
//! writes, and the after-admission policy reads the names `plan` and the census read.

use injector_api::SidecarTemplate;
use kube_cel::cel;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::cel::testing::evaluate;
use crate::template::{CompiledTemplate, compile};

fn template(name: &str, generation: i64) -> CompiledTemplate {
    let source = json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": {"containers": [{"name": name, "image": format!("{name}.invalid/{name}:1")}]},
    });
    let parsed: SidecarTemplate = serde_json::from_value(source).unwrap();
    compile(&parsed).unwrap()
}

/// `source` evaluated over a Pod whose record is `record`.
fn evaluated(source: &str, record: &str) -> cel::Value {
    let object = json!({"metadata": {"annotations": {INJECTED_ANNOTATION: record}}});
    evaluate(source, &[("object", &object)])
}

fn strings(value: cel::Value) -> Vec<String> {
    match value {
        cel::Value::List(items) => items
            .iter()
            .map(|item| match item {
                cel::Value::String(s) => s.to_string(),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// An entry as Pods carry them: of a template or not, with or without its generation and
/// fingerprint, spaces around it, a name holding an `@`.
fn entry() -> impl Strategy<Value = String> {
    (
        prop::sample::select(&["agent", "logs", "mesh", "d@e", ""][..]),
        prop::sample::select(&["", "@1", "@7", "@x", "@7#00000000000000ff"][..]),
        prop::sample::select(&["", " ", "\t"][..]),
    )
        .prop_map(|(name, rest, space)| format!("{space}{name}{rest}{space}"))
}

fn record() -> impl Strategy<Value = String> {
    prop::collection::vec(entry(), 0..5).prop_map(|entries| entries.join(","))
}

proptest! {
    /// Entries and their names, as `plan`, the census and the after-admission policy read them.
    #[test]
    fn a_record_reads_the_same_in_rust_and_in_cel(record in record()) {
        let rust: Vec<&str> = entries(&record).collect();
        prop_assert_eq!(&rust, &strings(evaluated(&entries_cel(), &record)));
        let names_cel = format!("{}.map(e, {ENTRY_NAME_CEL})", entries_cel());
        let rust: Vec<&str> = names(&record).collect();
        prop_assert_eq!(rust, strings(evaluated(&names_cel, &record)));
    }

    /// The policy's record is `plan`'s wherever the record names each template once (the
    /// policy leaves a second entry in place; the webhook drops it).
    #[test]
    fn the_policy_writes_the_record_plan_writes(record in record(), generation in 1..4i64) {
        let once = {
            let mut seen = Vec::new();
            entries(&record).all(|e| {
                let name = entry_name(e);
                let first = !seen.contains(&name);
                seen.push(name);
                first
            })
        };
        prop_assume!(once);
        for name in ["agent", "other"] {
            let template = template(name, generation);
            let rust = updated(&record, &[template.entry()], &[]);
            match evaluated(&updated_cel(template.entry()), &record) {
                cel::Value::String(cel) => prop_assert_eq!(&rust, cel.as_str()),
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn names_are_what_comes_before_the_last_at() {
    let names: Vec<_> = names(" a@1, b@2 ,,c,d@e@3").collect();
    assert_eq!(names, ["a", "b", "c", "d@e"]);
}

#[test]
fn plan_keeps_entries_in_place_drops_the_absent_and_a_second_entry() {
    let agent = template("agent", 2);
    let logs = template("logs", 1);
    let record = updated(
        " other@1 , agent@1#00, mesh@3, agent@9,gone@1",
        &[logs.entry(), agent.entry()],
        &["gone"],
    );
    assert_eq!(
        record,
        format!("other@1,{},mesh@3,{}", agent.entry(), logs.entry())
    );
}

#[test]
fn an_update_in_place_rewrites_the_templates_entry_only() {
    let agent = template("agent", 2);
    assert_eq!(
        rewritten("mesh@3, agent@1#00", agent.entry()),
        Some(format!("mesh@3,{}", agent.entry()))
    );
    assert_eq!(rewritten("mesh@3", agent.entry()), None);
}
