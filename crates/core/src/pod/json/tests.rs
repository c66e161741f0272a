#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use super::*;

const TYPICAL_POD: &str = include_str!("../../../../../bench/fixtures/typical-pod.json");

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

/// Decodes `json` whole and checks it reads as `Pod::from_value` of its `Value` reads.
fn same_as_value(json: &str) -> Result<Pod<'_>, PodJsonError> {
    let value: Value = serde_json::from_str(json).unwrap();
    let decoded = decode_pod(json, allowance(json.len()));
    let expected = Pod::from_value(&value).map_err(PodJsonError::from);
    assert_eq!(decoded, expected, "{json}");
    decoded
}

#[test]
fn only_the_fields_the_planner_reads_are_built() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web", "namespace": "shop", "labels": {"app": "web", "n": 1},
            "annotations": {"a": "b"}, "uid": "x",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-1"}],
        },
        "spec": {
            "containers": [{"name": "app", "image": "nginx", "env": [{"name": "A", "value": "1"}]}],
            "initContainers": [{"name": "init", "image": "busybox", "restartPolicy": "Always"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "imagePullSecrets": [{"name": "regcred"}, "x"],
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "serviceAccountName": "web",
            "nodeName": "n1",
            "tolerations": [{"key": "k"}],
        },
        "status": {"phase": "Pending"},
    });
    let json = pod.to_string();
    let decoded = same_as_value(&json).unwrap();
    assert_eq!(decoded.name(), "web");
    assert_eq!(decoded.namespace.as_deref(), Some("shop"));
    assert_eq!(decoded.labels().unwrap().get("n"), Some(None));
    assert!(decoded.host_network);
    assert!(decoded.token_automount_off);
    assert!(decoded.init_containers.unwrap()[0].native_sidecar);
    assert_eq!(decoded.image_pull_secrets.unwrap(), ["regcred", ""]);
    assert_eq!(decoded.service_account_name, "web");
}

#[test]
fn a_field_of_the_wrong_type_is_the_error_the_whole_pod_gives() {
    for json in [
        r#"[{"":0},{"":0}]"#,
        r#""pod""#,
        r#"{"metadata":"web","spec":[1,2,3]}"#,
        r#"{"metadata":7,"spec":{"containers":{"a":1}}}"#,
        r#"{"spec":{"containers":[]},"metadata":{"labels":[1]}}"#,
        r#"{"spec":{"containers":[], "volumes": 3}}"#,
        r#"{"spec":{"containers":[], "imagePullSecrets": {}}}"#,
        r#"{"spec":{"containers":[1]}}"#,
        r#"{"spec":{"containers":[], "initContainers":["x",3,[1]]}}"#,
        r#"{"spec":null}"#,
        r#"{"spec":{}}"#,
        r#"{"metadata":{"annotations":"a","labels":"b"},"spec":{"containers":[]}}"#,
        r#"{"metadata":{"name":3,"generateName":"web-"},"spec":{"containers":[{"name":1,"env":{},"volumeMounts":[1]}],"volumes":[1,{"name":2,"projected":{"sources":{}}}],"hostNetwork":"true","automountServiceAccountToken":"false","serviceAccountName":""}}"#,
    ] {
        let decoded = same_as_value(json);
        assert!(
            !matches!(
                decoded,
                Err(PodJsonError::Invalid(_) | PodJsonError::TooComplex { .. })
            ),
            "{json}: {decoded:?}"
        );
    }
}

#[test]
fn named_items_are_kept_whole_only_when_a_template_adds_one_of_their_name() {
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
                    "volumeMounts": [
                        {"name": "d", "readOnly": true, "mountPath": "/d"},
                        {"name": "e", "mountPath": "/e"}
                    ]
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
    let wanted = |named: Named, name: &str| {
        matches!(
            (named, name),
            (Named::Container, "proxy")
                | (Named::Env, "B")
                | (Named::Volume, "logs")
                | (Named::Mount, "/d")
        )
    };
    let decoded = decode(pod, MIN_ALLOWANCE, Some(&wanted)).unwrap().pod;
    let value: Value = serde_json::from_str(pod).unwrap();
    let whole = Pod::from_value(&value).unwrap();

    let app = &decoded.containers[0];
    assert_eq!((app.name.as_ref(), app.whole.as_ref()), ("app", None));
    let app_value = &value["spec"]["containers"][0];
    let env = app.env.as_ref().unwrap();
    assert_eq!((env[0].name.as_ref(), env[0].whole.as_ref()), ("A", None));
    assert_eq!(env[1].name, "B");
    assert_eq!(env[1].whole.as_deref(), Some(&app_value["env"][1]));
    // No template adds envFrom sources: only that there is a list is kept.
    assert_eq!(app.env_from.as_deref(), Some(&Value::Array(Vec::new())));
    let mounts = app.volume_mounts.as_ref().unwrap();
    assert_eq!(mounts[0].path, "/d");
    assert_eq!(
        mounts[0].whole.as_deref(),
        Some(&app_value["volumeMounts"][0])
    );
    assert_eq!(
        (mounts[1].path.as_ref(), mounts[1].whole.as_ref()),
        ("/e", None)
    );
    assert_eq!(decoded.containers[1], whole.containers[1]);
    let init = &decoded.init_containers.as_ref().unwrap()[0];
    assert_eq!((init.name.as_ref(), init.native_sidecar), ("init", true));
    assert!(init.whole.is_none());

    let volumes = decoded.volumes.as_ref().unwrap();
    assert_eq!(volumes[0].name, "d");
    assert!(volumes[0].whole.is_none());
    assert_eq!(volumes[1], whole.volumes.as_ref().unwrap()[1]);
    assert_eq!(volumes[2].name, "token");
    assert!(volumes[2].holds_token && volumes[2].whole.is_none());
    assert_eq!(decoded.token_volumes(), ["token"]);
}

#[test]
fn env_from_sources_are_kept_only_when_a_template_adds_some() {
    let json = r#"{"spec":{"containers":[
        {"name":"app","envFrom":[{"configMapRef":{"name":"c"}}]},
        {"name":"other","envFrom":{"configMapRef":{"name":"c"}}},
        {"name":"none"}
    ]}}"#;
    let value: Value = serde_json::from_str(json).unwrap();
    let env_from = |pod: &Pod<'_>| -> Vec<Option<Value>> {
        pod.containers
            .iter()
            .map(|c| c.env_from.as_deref().cloned())
            .collect()
    };
    let adds = |named: Named, _: &str| named == Named::EnvFrom;
    let decoded = decode(json, MIN_ALLOWANCE, Some(&adds)).unwrap().pod;
    assert_eq!(
        env_from(&decoded),
        [
            Some(value["spec"]["containers"][0]["envFrom"].clone()),
            None,
            None
        ]
    );
    let decoded = decode(json, MIN_ALLOWANCE, Some(&|_, _| false))
        .unwrap()
        .pod;
    assert_eq!(
        env_from(&decoded),
        [Some(Value::Array(Vec::new())), None, None]
    );
}

#[test]
fn a_container_named_after_its_other_fields_is_decoded_again_whole() {
    let json = r#"{"spec":{"containers":[{"image":"envoy","name":"proxy"}]}}"#;
    let value: Value = serde_json::from_str(json).unwrap();
    let decoded = decode(json, MIN_ALLOWANCE, Some(&|_, n| n == "proxy")).unwrap();
    assert_eq!(decoded.pod, Pod::from_value(&value).unwrap());
    let decoded = decode(json, MIN_ALLOWANCE, Some(&|_, n| n == "other")).unwrap();
    assert_eq!(decoded.pod.containers[0].name, "proxy");
    assert!(decoded.pod.containers[0].whole.is_none());
}

#[test]
fn a_mount_kept_whole_with_a_field_of_another_kind_is_decoded_again_whole() {
    let json = r#"{"spec":{"containers":[{"name":"a","volumeMounts":[
        {"mountPath":"/d","x":{"y":1}},{"mountPath":"/e","n":1}
    ]}]}}"#;
    let value: Value = serde_json::from_str(json).unwrap();
    let wanted = |named: Named, name: &str| named == Named::Mount && name == "/d";
    let decoded = decode(json, MIN_ALLOWANCE, Some(&wanted)).unwrap();
    assert_eq!(decoded.pod, Pod::from_value(&value).unwrap());
    // Not kept whole: only the path is read.
    let wanted = |named: Named, name: &str| named == Named::Mount && name == "/f";
    let decoded = decode(json, MIN_ALLOWANCE, Some(&wanted)).unwrap();
    let mounts = decoded.pod.containers[0].volume_mounts.clone().unwrap();
    assert_eq!(mounts[0].path, "/d");
    assert!(mounts.iter().all(|m| m.whole.is_none()));
}

#[test]
fn an_item_named_twice_is_named_by_its_last_name_as_in_a_value() {
    let json = r#"{"spec":{"containers":[{"name":"app","env":[{"name":"X","value":"1","name":"Y"}]}],
        "volumes":[{"name":"v","emptyDir":{},"name":"w"}]}}"#;
    let wanted = |named: Named, name: &str| {
        matches!((named, name), (Named::Env, "X") | (Named::Volume, "v"))
    };
    let decoded = decode(json, MIN_ALLOWANCE, Some(&wanted)).unwrap().pod;
    let var = &decoded.containers[0].env.as_ref().unwrap()[0];
    assert_eq!(var.name, "Y");
    assert!(var.whole.is_some());
    assert_eq!(decoded.volumes.as_ref().unwrap()[0].name, "w");
    same_as_value(json).unwrap();
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
    let json =
        r#"{"meta\u0064ata":{"labels":{"a\"b":"c\u0064","a\"b":"d"}},"spec":{"containers":[]}}"#;
    let decoded = same_as_value(json).unwrap();
    assert_eq!(decoded.labels().unwrap().get("a\"b"), Some(Some("d")));
}

#[test]
fn a_real_pod_takes_a_fraction_of_its_allowance() {
    let allowance = allowance(TYPICAL_POD.len());
    // As the webhook decodes it when no template adds a container, volume or env var of the
    // Pod's names, nor envFrom sources.
    let decoded = decode(TYPICAL_POD, allowance, Some(&|_, _| false)).unwrap();
    assert!(
        decoded.charged * 10 < allowance,
        "{} of {allowance}",
        decoded.charged
    );
    // Everything whole: each container is copied out of its whole value too.
    let decoded = decode(TYPICAL_POD, allowance, None).unwrap();
    let whole: Value = serde_json::from_str(TYPICAL_POD).unwrap();
    assert_eq!(decoded.pod, Pod::from_value(&whole).unwrap());
    assert!(
        decoded.charged < allowance,
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
    let decoded = decode(&skipped, MIN_ALLOWANCE, None).unwrap();
    assert!(decoded.pod.containers.is_empty());
    assert!(decoded.charged < 4096, "{}", decoded.charged);
}

#[test]
fn labels_in_any_order_or_given_twice_read_as_the_last_given() {
    for labels in [
        r#"{"a":"1","b":"2","c":"3"}"#,
        r#"{"c":"3","a":"1","b":"2"}"#,
        r#"{"a":"0","b":"2","a":"1","c":"3"}"#,
        r#"{"a":"1","b":"2","c":"0","c":"3"}"#,
        r#"{"a":"1","a":"1","b":"2","c":"3"}"#,
    ] {
        let json = format!(r#"{{"metadata":{{"labels":{labels}}},"spec":{{"containers":[]}}}}"#);
        let pod = same_as_value(&json).unwrap();
        let read: Vec<_> = pod.labels().unwrap().iter().collect();
        assert_eq!(
            read,
            [("a", Some("1")), ("b", Some("2")), ("c", Some("3"))],
            "{labels}"
        );
    }
}
