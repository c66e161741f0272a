#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;

use super::super::{MIN_ALLOWANCE, PodJsonError, allowance, decode};
use super::*;

const TYPICAL_POD: &str = include_str!("../../../../../bench/fixtures/typical-pod.json");

/// Decodes `json` both ways, keeping whole what `wanted` says: where the pull decoder accepts
/// it, the `serde` decoder gives the same Pod, charged the same. Whether it was accepted.
fn both_ways(json: &str, allowance: usize, wanted: &dyn Fn(Named, &str) -> bool) -> bool {
    let mut reader = Reader::new(json);
    let pulled = pull(&mut reader, allowance, wanted).and_then(|d| reader.end().map(|()| d));
    let decoded = decode(json, allowance, Some(wanted));
    if let Ok(pulled) = &pulled {
        let decoded = decoded
            .as_ref()
            .unwrap_or_else(|e| panic!("pulled, not decoded ({e}): {json}"));
        assert_eq!(pulled.pod, decoded.pod, "{json}");
        assert_eq!(pulled.charged, decoded.charged, "{json}");
    }
    pulled.is_ok()
}

fn none(_: Named, _: &str) -> bool {
    false
}

fn every(_: Named, _: &str) -> bool {
    true
}

/// Written as the API server writes a Pod: an item's name first.
const NAMED_FIRST: &str = r#"{
    "metadata": {"name": "web", "labels": {"a": "1", "b": null}, "annotations": {"z": "\u00e9"}},
    "spec": {
        "containers": [
            {
                "name": "app", "image": "nginx", "ports": [{"containerPort": 80}],
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ],
                "envFrom": [{"configMapRef": {"name": "c"}}],
                "volumeMounts": [
                    {"name": "d", "readOnly": true, "mountPath": "/d"},
                    {"name": "e", "mountPath": "/e", "subPath": null}
                ]
            },
            {"name": "proxy", "image": "envoy", "env": [{"name": "A", "value": "2"}],
             "resources": {"limits": {"cpu": 1.5}}, "x": [-1, 0, 2]}
        ],
        "initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Always"}],
        "volumes": [
            {"name": "d", "emptyDir": {}},
            {"name": "logs", "emptyDir": {"medium": "Memory"}, "n": [1, {"k": "\"q\""}]},
            {"name": "token", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}},
                {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
            ]}}
        ],
        "imagePullSecrets": [{"name": "regcred"}, null, {}],
        "hostNetwork": false,
        "serviceAccountName": "builder"
    }
}"#;

#[test]
fn pods_as_the_api_server_writes_them_are_pulled_as_decoded() {
    let some = |named: Named, name: &str| {
        matches!(
            (named, name),
            (Named::Container, "proxy")
                | (Named::Env, "B")
                | (Named::Volume, "logs")
                | (Named::Mount, "/d")
                | (Named::EnvFrom, "")
        )
    };
    // Sorted by key (as `serde_json` writes it), its items are named after other fields.
    for wanted in [&none as &dyn Fn(Named, &str) -> bool, &some] {
        assert!(both_ways(TYPICAL_POD, allowance(TYPICAL_POD.len()), wanted));
    }
    for wanted in [&none as &dyn Fn(Named, &str) -> bool, &every, &some] {
        assert!(both_ways(NAMED_FIRST, allowance(NAMED_FIRST.len()), wanted));
    }
    // Numbers kept whole that the reader leaves to `serde_json`, read as it reads them.
    let numbers = r#"{"spec":{"containers":[{"name":"a","x":[-0,-9223372036854775808,1.5e3]}]}}"#;
    assert!(both_ways(numbers, MIN_ALLOWANCE, &every));
    // Whitespace anywhere, and `null` where the `serde` decoder reads it as absent.
    let spaced = " { \"metadata\" : null , \"spec\" : { \"containers\" : [ { \"name\" : \"a\" , \
                  \"env\" : null , \"volumeMounts\" : [ ] } ] , \"volumes\" : null } } ";
    assert!(both_ways(spaced, MIN_ALLOWANCE, &every));
}

#[test]
fn what_the_api_server_does_not_write_is_refused() {
    for json in [
        // Another type than a Pod's, where it is read.
        r#"[]"#,
        r#"{"spec":{"containers":{}}}"#,
        r#"{"spec":{"containers":[null]}}"#,
        r#"{"spec":{"containers":[{"name":5}]}}"#,
        r#"{"metadata":{"labels":[]},"spec":{"containers":[]}}"#,
        r#"{"metadata":{"labels":{"a":1}},"spec":{"containers":[]}}"#,
        r#"{"spec":{"containers":[],"hostNetwork":"yes"}}"#,
        r#"{"spec":{"containers":[{"name":"a","envFrom":{}}]}}"#,
        r#"{"spec":{"containers":[{"name":"a","volumeMounts":[{"mountPath":{}}]}]}}"#,
        r#"{"spec":{"containers":[],"volumes":[{"name":"v","projected":{"sources":{}}}]}}"#,
        // Missing what the planner needs.
        r#"{"metadata":{}}"#,
        r#"{"spec":{}}"#,
        // A key with an escape, a float where it is read.
        r#"{"spec":{"contain\u0065rs":[]}}"#,
        r#"{"spec":{"containers":[{"name":"a","volumeMounts":[{"mountPath":"/d","n":1.5}]}]}}"#,
        // Not JSON.
        r#"{"spec":{"containers":[],}}"#,
        r#"{"spec":{"containers":[]}} x"#,
    ] {
        assert!(!both_ways(json, MIN_ALLOWANCE, &none), "{json}");
    }
    // Broken after a number the reader leaves to `serde_json`, in an item kept whole (found by
    // review: the reader once moved past such a number, and built what followed uncharged).
    for json in [
        r#"{"spec":{"containers":[{"name":"a","x":-0"abc"}]}}"#,
        r#"{"spec":{"containers":[{"name":"a","x":-9223372036854775808[{"":0}]}]}}"#,
    ] {
        assert!(!both_ways(json, MIN_ALLOWANCE, &every), "{json}");
    }
    // An item named after its other fields, when it is to be kept whole.
    let late = r#"{"spec":{"containers":[{"image":"i","name":"a"}]}}"#;
    assert!(both_ways(late, MIN_ALLOWANCE, &none));
    assert!(!both_ways(late, MIN_ALLOWANCE, &every));
    let late_env = r#"{"spec":{"containers":[{"name":"a","env":[{"value":"1","name":"A"}]}]}}"#;
    assert!(both_ways(late_env, MIN_ALLOWANCE, &none));
    let env = |named: Named, _: &str| named == Named::Env;
    assert!(!both_ways(late_env, MIN_ALLOWANCE, &env));
}

#[test]
fn past_the_allowance_it_is_refused_where_the_serde_decoder_refuses() {
    let labels = (0..3000)
        .map(|i| format!("\"k{i:05}\":\"v\""))
        .collect::<Vec<_>>()
        .join(",");
    let json = format!(r#"{{"metadata":{{"labels":{{{labels}}}}},"spec":{{"containers":[]}}}}"#);
    assert!(!both_ways(&json, MIN_ALLOWANCE, &none));
    assert!(matches!(
        decode(&json, MIN_ALLOWANCE, Some(&none)),
        Err(PodJsonError::TooComplex { .. })
    ));
    assert!(both_ways(&json, allowance(json.len()), &none));
}

/// A JSON string: mostly plain, some with escapes.
fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["app", "proxy", "A", "B", "/d", "logs", "", "Always"]),
        1 => prop::sample::select(vec!["\u{e9}", "a\"b", "x\\y", "\u{1F600}"]),
    ]
    .prop_map(|s| serde_json::to_string(s).unwrap())
}

/// An object with `entries` in the given order (`name` first when there is one).
fn object(entries: Vec<(&'static str, String)>) -> String {
    let entries: Vec<String> = entries
        .into_iter()
        .map(|(key, value)| format!("\"{key}\":{value}"))
        .collect();
    format!("{{{}}}", entries.join(","))
}

fn list(items: Vec<String>) -> String {
    format!("[{}]", items.join(","))
}

/// Some of the given entries, in their order.
fn some_of(
    entries: Vec<(&'static str, BoxedStrategy<String>)>,
) -> impl Strategy<Value = Vec<(&'static str, String)>> {
    entries
        .into_iter()
        .map(|(key, value)| prop::option::of(value.prop_map(move |v| (key, v))))
        .collect::<Vec<_>>()
        .prop_map(|entries| entries.into_iter().flatten().collect())
}

/// A value the planner does not read.
fn skipped() -> BoxedStrategy<String> {
    prop_oneof![
        Just("{\"a\":[1,-2,3.5e2,true,null]}".to_owned()),
        Just("[]".to_owned()),
        string(),
        Just("18446744073709551616".to_owned()),
    ]
    .boxed()
}

fn env() -> BoxedStrategy<String> {
    some_of(vec![
        ("name", string().boxed()),
        ("value", string().boxed()),
        ("valueFrom", skipped()),
    ])
    .prop_map(object)
    .boxed()
}

fn mount() -> BoxedStrategy<String> {
    some_of(vec![
        ("name", string().boxed()),
        (
            "readOnly",
            any::<bool>().prop_map(|b| b.to_string()).boxed(),
        ),
        ("mountPath", string().boxed()),
        (
            "subPath",
            prop_oneof![string(), Just("null".to_owned())].boxed(),
        ),
        ("n", Just("7".to_owned()).boxed()),
    ])
    .prop_map(object)
    .boxed()
}

fn container() -> BoxedStrategy<String> {
    some_of(vec![
        ("name", string().boxed()),
        ("image", string().boxed()),
        (
            "env",
            prop::collection::vec(env(), 0..3).prop_map(list).boxed(),
        ),
        (
            "envFrom",
            prop_oneof![skipped(), Just("null".to_owned())]
                .prop_filter("a list or null", |v| v.starts_with('[') || v == "null")
                .boxed(),
        ),
        (
            "volumeMounts",
            prop::collection::vec(mount(), 0..3).prop_map(list).boxed(),
        ),
        ("restartPolicy", string().boxed()),
        ("resources", skipped()),
    ])
    .prop_map(object)
    .boxed()
}

fn volume() -> BoxedStrategy<String> {
    let sources = prop::collection::vec(
        prop::sample::select(vec![
            "{\"serviceAccountToken\":{\"path\":\"t\"}}",
            "{\"configMap\":{\"name\":\"c\"}}",
            "null",
        ]),
        0..3,
    )
    .prop_map(|s| format!("{{\"sources\":[{}]}}", s.join(",")));
    some_of(vec![
        ("name", string().boxed()),
        ("projected", sources.boxed()),
        ("emptyDir", skipped()),
    ])
    .prop_map(object)
    .boxed()
}

fn pod() -> impl Strategy<Value = String> {
    let labels = || {
        let key = prop::sample::select(vec!["app", "b", "a/b", "\u{e9}"])
            .prop_map(|k| format!("\"{k}\""));
        prop::collection::vec((key, string()), 0..4).prop_map(|entries| {
            let entries: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            format!("{{{}}}", entries.join(","))
        })
    };
    let metadata = some_of(vec![
        ("name", string().boxed()),
        ("generateName", string().boxed()),
        ("namespace", string().boxed()),
        ("labels", labels().boxed()),
        ("annotations", labels().boxed()),
        ("managedFields", skipped()),
    ])
    .prop_map(object);
    let spec = (
        some_of(vec![
            (
                "initContainers",
                prop::collection::vec(container(), 0..2)
                    .prop_map(list)
                    .boxed(),
            ),
            (
                "volumes",
                prop::collection::vec(volume(), 0..3).prop_map(list).boxed(),
            ),
            (
                "imagePullSecrets",
                prop::collection::vec(env(), 0..2).prop_map(list).boxed(),
            ),
            (
                "hostNetwork",
                any::<bool>().prop_map(|b| b.to_string()).boxed(),
            ),
            ("serviceAccountName", string().boxed()),
            ("serviceAccount", string().boxed()),
        ]),
        prop::collection::vec(container(), 0..3).prop_map(list),
    )
        .prop_map(|(mut entries, containers)| {
            entries.insert(0, ("containers", containers));
            object(entries)
        });
    (prop::option::of(metadata), spec, skipped()).prop_map(|(metadata, spec, status)| {
        let mut entries = vec![("spec", spec), ("status", status)];
        if let Some(metadata) = metadata {
            entries.insert(0, ("metadata", metadata));
        }
        object(entries)
    })
}

proptest! {
    #[test]
    fn generated_pods_are_pulled_as_decoded(
        json in pod(),
        wanted in prop::collection::btree_set(
            prop::sample::select(vec!["app", "proxy", "A", "B", "/d", "logs", ""]), 0..4),
        env_from in any::<bool>(),
    ) {
        let wanted = |named: Named, name: &str| match named {
            Named::EnvFrom => env_from,
            _ => wanted.contains(name),
        };
        both_ways(&json, allowance(json.len()), &wanted);
        // With nothing kept whole, only a name after its other fields can be refused: none is.
        prop_assert!(both_ways(&json, allowance(json.len()), &none), "{}", json);
    }

    #[test]
    fn broken_pods_are_never_pulled_otherwise_than_decoded(
        json in pod(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0..12usize, any::<bool>()), 1..4),
    ) {
        let mut bytes = json.into_bytes();
        for (at, byte, insert) in edits {
            let at = at.index(bytes.len() + 1);
            if insert || at == bytes.len() {
                bytes.insert(at, b"{}[]\",:\\ 0n1"[byte]);
            } else {
                bytes.remove(at);
            }
        }
        if let Ok(json) = std::str::from_utf8(&bytes) {
            both_ways(json, allowance(json.len()), &every);
        }
    }
}
