#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_core::pod_json::{PodJsonError, allowance, decode_pod_among};
use injector_core::{MalformedPod, Pod, Registry, compile};
use serde_json::{Value, json};

use super::*;

const TYPICAL: &str = include_str!("../../../../../bench/fixtures/typical-pod-review.json");
const TEMPLATES: [&str; 3] = [
    include_str!("../../../../../bench/fixtures/templates/log-shipper.yaml"),
    include_str!("../../../../../bench/fixtures/templates/mesh-proxy.yaml"),
    include_str!("../../../../../bench/fixtures/templates/app-telemetry.yaml"),
];

fn snapshot() -> std::sync::Arc<Snapshot> {
    let mut registry = Registry::new();
    registry.reset(
        TEMPLATES
            .iter()
            .map(|yaml| compile(&serde_saphyr::from_str(yaml).unwrap()).unwrap()),
    );
    registry.snapshot()
}

/// What `decide` reads of a review, whichever way it was read: the Pod decoded.
#[derive(Debug, PartialEq)]
struct Read<'a> {
    api_version: String,
    kind: String,
    uid: String,
    group: String,
    object_kind: String,
    sub_resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    operation: String,
    pod: Option<std::result::Result<Pod<'a>, MalformedPod>>,
}

fn seen<'a>(review: ReviewIn<'a>, snapshot: &Snapshot, allowance: usize) -> (Read<'a>, bool) {
    let request = review.request.unwrap();
    let decoded_as_read = request.pod.is_some();
    let pod = request.pod.map(Ok).or_else(|| {
        request.object.map(
            |raw| match decode_pod_among(raw.get(), allowance, snapshot) {
                Ok(pod) => Ok(pod),
                Err(PodJsonError::Malformed(malformed)) => Err(malformed),
                Err(error) => panic!("{error}"),
            },
        )
    });
    let owned = |text: Option<Cow<'_, str>>| text.map(Cow::into_owned);
    let read = Read {
        api_version: review.api_version.into_owned(),
        kind: review.kind.into_owned(),
        uid: request.uid.into_owned(),
        group: request.kind.group.into_owned(),
        object_kind: request.kind.kind.into_owned(),
        sub_resource: owned(request.sub_resource),
        namespace: owned(request.namespace),
        name: owned(request.name),
        operation: request.operation.into_owned(),
        pod,
    };
    (read, decoded_as_read)
}

/// Reads `body` both ways; whether the Pod was decoded as it was read.
fn both_ways(body: &str) -> bool {
    let snapshot = snapshot();
    let allowance = allowance(body.len());
    let context = PodContext {
        allowance,
        known: &snapshot,
    };
    let one_pass = read(body.as_bytes(), Some(context)).unwrap();
    let derived = serde_json::from_str::<ReviewIn>(body).unwrap();
    let (one_pass, decoded_as_read) = seen(one_pass, &snapshot, allowance);
    let derived = seen(derived, &snapshot, allowance).0;
    assert_eq!(one_pass, derived, "{body}");
    decoded_as_read
}

fn review(request: Value) -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        .to_string()
}

#[test]
fn a_review_as_the_api_server_writes_it_is_read_in_one_pass_as_the_other_way() {
    assert!(both_ways(TYPICAL));
    let escaped = TYPICAL.replacen(r#""uid":"0d9e"#, r#""uid":"a\"b\u00e9-0d9e"#, 1);
    assert_ne!(escaped, TYPICAL);
    assert!(both_ways(&escaped));
}

#[test]
fn a_pod_is_decoded_as_it_is_read_only_for_a_pod_create_known_so_far() {
    let pod =
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let pod_kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    // Keys in `Value`'s order (alphabetical): kind before object, operation after it.
    let create =
        review(json!({"uid": "u", "kind": pod_kind, "operation": "CREATE", "object": pod}));
    assert!(!both_ways(&create));
    // In the API server's order.
    let ordered = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{pod_kind},"namespace":"ns","operation":"CREATE","object":{pod}}}}}"#
    );
    assert!(both_ways(&ordered));
    let update = ordered.replace("CREATE", "UPDATE");
    assert!(!both_ways(&update));
    let status = ordered.replace(r#""namespace""#, r#""subResource":"status","namespace""#);
    assert!(!both_ways(&status));
    let subresource_after = ordered.replace(r#""object""#, r#""subResource":"status","object""#);
    assert!(!both_ways(&subresource_after));
    let deployment = ordered.replace(r#""kind":"Pod""#, r#""kind":"Deployment""#);
    assert!(!both_ways(&deployment));
    let null = ordered.replace(&pod.to_string(), "null");
    assert!(!both_ways(&null));

    // Not known to be decoded: kept raw.
    let raw = read(ordered.as_bytes(), None).unwrap().request.unwrap();
    assert!(raw.pod.is_none() && raw.object.is_some());
}

#[test]
fn what_the_api_server_does_not_write_is_left_to_the_other_way() {
    let snapshot = snapshot();
    let context = Some(PodContext {
        allowance: allowance(TYPICAL.len()),
        known: &snapshot,
    });
    let duplicate_uid = TYPICAL.replacen(r#""uid":"#, r#""uid":"x","uid":"#, 1);
    let duplicate_object = TYPICAL.replacen(r#""object":"#, r#""object":null,"object":"#, 1);
    let escaped_key = TYPICAL.replacen(r#""uid":"#, r#""u\u0069d":"#, 1);
    let as_a_list = r#"["admission.k8s.io/v1", "AdmissionReview", null]"#.to_owned();
    let trailing = format!("{TYPICAL} x");
    // A lone surrogate in a key of a map the decoder reads: serde_json refuses it (found by
    // review: the quick reader once skipped it unchecked, and planned a Pod denied otherwise).
    let surrogate_key =
        TYPICAL.replacen(r#""spec":{"#, r#""spec":{"hostNetwork":{"\ud800":0},"#, 1);
    // A float the Pod decoder reads (a label's value).
    let float = TYPICAL.replacen(r#""labels":{"#, r#""labels":{"x":1.5,"#, 1);
    // A container named after its other fields, for a template's container: decoded again.
    let proxy_late = TYPICAL.replacen(
        r#""containers":["#,
        r#""containers":[{"image":"x","name":"mesh-proxy"},"#,
        1,
    );
    for body in [
        duplicate_uid,
        duplicate_object,
        escaped_key,
        as_a_list,
        trailing,
        surrogate_key,
        float,
        proxy_late,
    ] {
        assert_ne!(body, TYPICAL);
        assert_eq!(
            read(body.as_bytes(), context).err(),
            Some(Refused),
            "{body}"
        );
    }
}
