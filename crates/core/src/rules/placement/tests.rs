//! The placement rule's two forms on generated init container lists: [`first_blocking`] as
//! `plan` asks it, and [`in_place_cel`] evaluated by a CEL interpreter (`kube-cel`) as the
//! policy's presence conditions and guard carry it, templates' init containers known by name.

use kube_cel::cel;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::cel::cel_list;
use crate::cel::testing::evaluate;

/// One init container of the Pod: a native sidecar or not, a template's or the Pod's own.
#[derive(Clone, Copy, Debug)]
struct Init {
    native_sidecar: bool,
    templates: bool,
}

fn name(index: usize, init: Init) -> String {
    let owner = if init.templates { "tmpl" } else { "own" };
    format!("{owner}-{index}")
}

/// The names of `inits` that are templates'.
fn template_names(inits: &[Init]) -> Vec<String> {
    inits
        .iter()
        .enumerate()
        .filter(|(_, init)| init.templates)
        .map(|(index, &init)| name(index, init))
        .collect()
}

/// `source` evaluated over a Pod holding these init containers.
fn resolve(source: &str, init_containers: Vec<Value>) -> cel::Value {
    evaluate(
        source,
        &[(
            "object",
            &json!({"spec": {"initContainers": init_containers}}),
        )],
    )
}

/// The CEL verdict on the native sidecar at `at` of `inits`.
fn cel_in_place(inits: &[Init], at: usize) -> bool {
    let containers: Vec<Value> = inits
        .iter()
        .enumerate()
        .map(|(index, &init)| {
            // A plain one gets an empty `restartPolicy` rather than none: the interpreter
            // (`cel` 0.13 under `kube-cel` 0.8) fails `x.?field` on a map without the key,
            // where CEL gives `optional.none()`; `orValue("")` reads both the same.
            let policy = if init.native_sidecar { "Always" } else { "" };
            json!({"name": name(index, init), "image": "x.invalid/x:1", "restartPolicy": policy})
        })
        .collect();
    let template_names = template_names(inits);
    let source = format!(
        "object.spec.initContainers.filter(c, c.name == {}).all(c, {})",
        Value::from(name(at, inits[at])),
        in_place_cel(&cel_list(template_names.iter().map(String::as_str)))
    );
    match resolve(&source, containers) {
        cel::Value::Bool(verdict) => verdict,
        other => panic!("{source}: {other:?}"),
    }
}

fn inits() -> impl Strategy<Value = (Vec<Init>, usize)> {
    prop::collection::vec(
        (any::<bool>(), any::<bool>()).prop_map(|(native_sidecar, templates)| Init {
            native_sidecar,
            templates,
        }),
        1..7,
    )
    .prop_flat_map(|inits| {
        let len = inits.len();
        (Just(inits), 0..len)
    })
    .prop_map(|(mut inits, at)| {
        // The container judged is a native sidecar.
        inits[at].native_sidecar = true;
        (inits, at)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_rust_and_cel_forms_of_placement_agree((inits, at) in inits()) {
        let before = inits[..at].iter().map(|init| Before {
            native_sidecar: init.native_sidecar,
            templates: init.templates,
        });
        let rust = first_blocking(before).is_none();
        prop_assert_eq!(rust, cel_in_place(&inits, at), "{:?}, the sidecar at {}", inits, at);
    }
}

/// The CEL form of where templates' init containers go, on `inits`.
fn cel_first_init(inits: &[Init]) -> i64 {
    let containers: Vec<Value> = inits
        .iter()
        .enumerate()
        .map(|(index, &init)| json!({"name": name(index, init), "image": "x.invalid/x:1"}))
        .collect();
    let template_names = template_names(inits);
    let source = first_init_cel(&cel_list(template_names.iter().map(String::as_str)));
    match resolve(&source, containers) {
        cel::Value::Int(index) => index,
        other => panic!("{source}: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_rust_and_cel_forms_of_where_init_containers_go_agree((inits, _) in inits()) {
        let rust = first_init(inits.iter().map(|init| init.templates));
        prop_assert_eq!(rust as i64, cel_first_init(&inits), "{:?}", inits);
    }
}

#[test]
fn a_native_sidecar_may_follow_templates_and_sidecars_but_not_the_pod_s_own_plain_ones() {
    let init = |native_sidecar, templates| Before {
        native_sidecar,
        templates,
    };
    assert_eq!(first_blocking([]), None);
    assert_eq!(first_blocking([init(false, true), init(true, false)]), None);
    assert_eq!(
        first_blocking([init(true, false), init(false, false), init(false, false)]),
        Some(1)
    );
}
