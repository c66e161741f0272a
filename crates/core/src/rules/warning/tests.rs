//! Each warning's CEL text, evaluated by a CEL interpreter, is its Rust text: the warnings
//! policy tells a Pod's author what the webhook would have.

use kube_cel::cel;

use super::*;
use crate::cel::testing::evaluate;

fn evaluated(source: &str) -> String {
    match evaluate(source, &[]) {
        cel::Value::String(text) => text.to_string(),
        other => panic!("{source}: {other:?}"),
    }
}

/// Every warning, its field filled in at admission set to `filled`.
fn warnings(filled: &str) -> Vec<(Warning, Option<Warning>)> {
    let template = || "agent".to_owned();
    let with = |hole: bool| {
        if hole {
            HOLE.to_owned()
        } else {
            filled.to_owned()
        }
    };
    vec![
        (Warning::Unsettled { passes: 4 }, None),
        (
            Warning::RequiredDespiteOptOut {
                template: template(),
            },
            None,
        ),
        (
            Warning::NotApplied {
                template: template(),
                detail: "container \"agent\" already exists (in the pod)".to_owned(),
            },
            None,
        ),
        (
            Warning::NamedLikeUnderPolicy {
                template: template(),
            },
            None,
        ),
        (
            Warning::MetadataKept {
                template: template(),
                kind: MetadataKind::Annotation,
                key: "example.com/note".to_owned(),
                holder: Holder::Pod,
            },
            None,
        ),
        (
            Warning::MetadataKept {
                template: template(),
                kind: MetadataKind::Label,
                key: "zone".to_owned(),
                holder: Holder::Template("first".to_owned()),
            },
            None,
        ),
        (
            Warning::InvalidLabelValue {
                template: template(),
                key: "owner".to_owned(),
                value: with(false),
            },
            Some(Warning::InvalidLabelValue {
                template: template(),
                key: "owner".to_owned(),
                value: with(true),
            }),
        ),
        (
            Warning::EnvKept {
                template: template(),
                name: "AGENT_SOCKET".to_owned(),
                container: with(false),
                holder: Holder::Pod,
            },
            Some(Warning::EnvKept {
                template: template(),
                name: "AGENT_SOCKET".to_owned(),
                container: with(true),
                holder: Holder::Pod,
            }),
        ),
        (
            Warning::MountKept {
                template: template(),
                path: "/run/agent".to_owned(),
                container: with(false),
                holder: Holder::Template("first".to_owned()),
            },
            Some(Warning::MountKept {
                template: template(),
                path: "/run/agent".to_owned(),
                container: with(true),
                holder: Holder::Template("first".to_owned()),
            }),
        ),
    ]
}

#[test]
fn each_warning_reads_the_same_from_cel_and_from_rust() {
    for (warning, with_hole) in warnings("app") {
        assert_eq!(evaluated(&warning.message_cel()), warning.to_string());
        if let Some(with_hole) = with_hole {
            let source = with_hole.message_cel_with("\"ap\" + \"p\"");
            assert_eq!(evaluated(&source), warning.to_string(), "{source}");
        }
    }
}

#[test]
fn a_warning_is_written_out_as_its_text() {
    let warning = Warning::RequiredDespiteOptOut {
        template: "agent".to_owned(),
    };
    assert_eq!(
        serde_json::to_value(&warning).unwrap(),
        serde_json::json!(warning.to_string())
    );
}
