#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

use super::*;

const TYPICAL_POD: &str = include_str!("../../../../bench/fixtures/typical-pod.json");

fn repeat(item: &str, until: usize) -> String {
    let mut out = String::with_capacity(until + item.len());
    while out.len() < until {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(item);
    }
    out
}

#[test]
fn only_the_fields_the_planner_reads_are_built() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web", "namespace": "shop", "labels": {"app": "web"},
            "annotations": {"a": "b"}, "uid": "x",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-1"}],
        },
        "spec": {
            "containers": [{"name": "app", "image": "nginx", "env": [{"name": "A", "value": "1"}]}],
            "initContainers": [{"name": "init", "image": "busybox"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "imagePullSecrets": [{"name": "regcred"}],
            "hostNetwork": true,
            "serviceAccountName": "web",
            "nodeName": "n1",
            "tolerations": [{"key": "k"}],
        },
        "status": {"phase": "Pending"},
    });
    let decoded = decode_pod(&pod.to_string(), MIN_ALLOWANCE).unwrap();
    assert_eq!(
        decoded,
        json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {
                "containers": [{"name": "app", "image": "nginx", "env": [{"name": "A", "value": "1"}]}],
                "initContainers": [{"name": "init", "image": "busybox"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "imagePullSecrets": [{"name": "regcred"}],
                "hostNetwork": true,
                "serviceAccountName": "web",
            },
        })
    );
}

#[test]
fn a_field_of_the_wrong_type_keeps_its_type_but_not_its_content() {
    let decoded = decode_pod(r#"[{"":0},{"":0}]"#, MIN_ALLOWANCE).unwrap();
    assert_eq!(decoded, json!([]));
    let decoded = decode_pod(r#"{"metadata":"web","spec":[1,2,3]}"#, MIN_ALLOWANCE).unwrap();
    assert_eq!(decoded, json!({"metadata": "", "spec": []}));
    let decoded = decode_pod(
        r#"{"metadata":7,"spec":{"containers":{"a":1}}}"#,
        MIN_ALLOWANCE,
    )
    .unwrap();
    assert_eq!(
        decoded,
        json!({"metadata": 7, "spec": {"containers": {"a": 1}}})
    );
}

#[test]
fn named_items_are_built_whole_only_when_a_template_adds_one_of_their_name() {
    // Written as the API server writes a Pod: an item's name first.
    let pod = r#"{
        "metadata": {"name": "web"},
        "spec": {
            "containers": [
                {
                    "name": "app", "image": "nginx", "ports": [{"containerPort": 80}],
                    "livenessProbe": {"tcpSocket": {"port": 80}},
                    "env": [
                        {"name": "A", "value": "1"},
                        {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                    ],
                    "envFrom": [{"configMapRef": {"name": "c"}}],
                    "volumeMounts": [{"name": "d", "mountPath": "/d"}]
                },
                {"name": "proxy", "image": "envoy", "env": [{"name": "A", "value": "2"}]}
            ],
            "initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Always"}],
            "volumes": [
                {"name": "d", "emptyDir": {}},
                {"name": "logs", "emptyDir": {"medium": "Memory"}},
                {"name": "token", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                    {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
                ]}}
            ]
        }
    }"#;
    let whole = |named: Named, name: &str| {
        matches!(
            (named, name),
            (Named::Container, "proxy") | (Named::Env, "B") | (Named::Volume, "logs")
        )
    };
    let (decoded, complete) = decode_with(pod, &READ_AMONG, MIN_ALLOWANCE, &whole).unwrap();
    assert!(complete);
    assert_eq!(
        decoded.value,
        json!({
            "metadata": {"name": "web"},
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "env": [
                            {"name": "A"},
                            {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        ],
                        "envFrom": [{"configMapRef": {"name": "c"}}],
                        "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                    },
                    {"name": "proxy", "image": "envoy", "env": [{"name": "A", "value": "2"}]},
                ],
                "initContainers": [{"name": "init", "restartPolicy": "Always"}],
                "volumes": [
                    {"name": "d"},
                    {"name": "logs", "emptyDir": {"medium": "Memory"}},
                    {"name": "token", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token"}},
                        {},
                    ]}},
                ],
            },
        })
    );
}

#[test]
fn a_container_named_after_its_other_fields_is_reported_incomplete() {
    let json = r#"{"spec":{"containers":[{"image":"envoy","name":"proxy"}]}}"#;
    let (_, complete) =
        decode_with(json, &READ_AMONG, MIN_ALLOWANCE, &|_, n| n == "proxy").unwrap();
    assert!(!complete);
    let (decoded, complete) =
        decode_with(json, &READ_AMONG, MIN_ALLOWANCE, &|_, n| n == "other").unwrap();
    assert!(complete);
    assert_eq!(
        decoded.value,
        json!({"spec": {"containers": [{"name": "proxy"}]}})
    );
}

#[test]
fn containers_of_the_wrong_type_keep_their_type_but_not_their_content() {
    let json = r#"{"spec":{"containers":{"a":1},"initContainers":["x",3,[1]]}}"#;
    let (decoded, complete) = decode_with(json, &READ_AMONG, MIN_ALLOWANCE, &|_, _| true).unwrap();
    assert!(complete);
    assert_eq!(
        decoded.value,
        json!({"spec": {"containers": {}, "initContainers": ["", 3, []]}})
    );
}

#[test]
fn invalid_json_is_an_error_and_keys_with_escapes_are_read() {
    assert!(matches!(
        decode_pod("{", MIN_ALLOWANCE),
        Err(PodJsonError::Invalid(_))
    ));
    assert!(matches!(
        decode_pod("{} x", MIN_ALLOWANCE),
        Err(PodJsonError::Invalid(_))
    ));
    let decoded = decode_pod(
        r#"{"meta\u0064ata":{"labels":{"a\"b":"c"}}}"#,
        MIN_ALLOWANCE,
    )
    .unwrap();
    assert_eq!(decoded, json!({"metadata": {"labels": {"a\"b": "c"}}}));
}

#[test]
fn a_real_pod_takes_a_fraction_of_its_allowance() {
    let decoded = decode(TYPICAL_POD, &READ, allowance(TYPICAL_POD.len())).unwrap();
    let whole: Value = serde_json::from_str(TYPICAL_POD).unwrap();
    assert_eq!(
        decoded.value["spec"]["containers"],
        whole["spec"]["containers"]
    );
    let allowance = allowance(TYPICAL_POD.len());
    assert!(
        decoded.charged * 2 < allowance,
        "{} of {allowance}",
        decoded.charged
    );
}

#[test]
fn tiny_values_in_read_fields_run_out_of_allowance_and_skipped_fields_cost_nothing() {
    let size = 3 * 1024 * 1024;
    let tiny_maps = format!(
        r#"{{"spec":{{"containers":[{{"name":"a","env":[{}]}}]}}}}"#,
        repeat(r#"{"":0}"#, size)
    );
    let allowance = allowance(tiny_maps.len());
    assert_eq!(
        decode_pod(&tiny_maps, allowance).unwrap_err(),
        PodJsonError::TooComplex {
            size: tiny_maps.len(),
            allowance
        }
    );

    let skipped = format!(
        r#"{{"status":[{}],"spec":{{"containers":[]}}}}"#,
        repeat(r#"{"":0}"#, size)
    );
    let decoded = decode(&skipped, &READ, MIN_ALLOWANCE).unwrap();
    assert_eq!(decoded.value, json!({"spec": {"containers": []}}));
    assert!(decoded.charged < 4096, "{}", decoded.charged);
}
