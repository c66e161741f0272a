use serde_json::json;

use super::*;
use crate::rules::defaulted::{ItemKind, Surroundings, difference};

/// What a real API server (v1.34 and v1.37) stored for each volume, beside the volume written.
fn cases() -> Vec<(Value, Value)> {
    vec![
        (json!({"name": "a"}), json!({"name": "a", "emptyDir": {}})),
        (
            json!({"name": "a", "emptyDir": {"medium": ""}}),
            json!({"name": "a", "emptyDir": {}}),
        ),
        (
            json!({"name": "a", "emptyDir": {"medium": "Memory"}}),
            json!({"name": "a", "emptyDir": {"medium": "Memory"}}),
        ),
        (
            json!({"name": "c", "configMap": {"name": "mesh", "items": []}}),
            json!({"name": "c", "configMap": {"name": "mesh", "defaultMode": 420}}),
        ),
        (
            json!({"name": "s", "secret": {"secretName": "certs", "defaultMode": 256, "optional": false}}),
            json!({"name": "s", "secret": {"secretName": "certs", "defaultMode": 256, "optional": false}}),
        ),
        (
            json!({"name": "h", "hostPath": {"path": "/var/log"}}),
            json!({"name": "h", "hostPath": {"path": "/var/log", "type": ""}}),
        ),
        (
            json!({"name": "d", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}),
            json!({"name": "d", "downwardAPI": {"defaultMode": 420, "items": [{"path": "labels", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels"}}]}}),
        ),
        (
            json!({"name": "p", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "audience": "mesh"}},
                {"configMap": {"name": "ca"}},
            ]}}),
            json!({"name": "p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"path": "token", "audience": "mesh", "expirationSeconds": 3600}},
                {"configMap": {"name": "ca"}},
            ]}}),
        ),
        (
            json!({"name": "v", "persistentVolumeClaim": {"claimName": "data", "readOnly": false}}),
            json!({"name": "v", "persistentVolumeClaim": {"claimName": "data"}}),
        ),
        (
            json!({"name": "i", "image": {"reference": "tools.invalid/tools:1"}}),
            json!({"name": "i", "image": {"reference": "tools.invalid/tools:1", "pullPolicy": "IfNotPresent"}}),
        ),
    ]
}

#[test]
fn a_volume_is_predicted_as_the_api_server_stores_it() {
    for (written, stored) in cases() {
        assert_eq!(stored_volume(&written), Some(stored), "{written}");
    }
}

/// The prediction and the webhook's comparison agree: `plan` takes the predicted volume for
/// the template's own.
#[test]
fn the_prediction_is_the_same_volume_for_the_webhook() {
    for (written, _) in cases() {
        let predicted = stored_volume(&written).unwrap();
        assert_eq!(
            difference(
                &written,
                &predicted,
                ItemKind::Volume,
                &Surroundings::default()
            ),
            None,
            "{written} as {predicted}"
        );
    }
}

#[test]
fn what_may_be_rewritten_or_is_not_known_has_no_prediction() {
    for volume in [
        json!({"name": "a", "emptyDir": {"sizeLimit": "1024Mi"}}),
        json!({"name": "d", "downwardAPI": {"items": [{"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}}]}}),
        json!({"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}),
        json!({"name": "p", "projected": {"sources": [{"clusterTrustBundle": {"path": "ca"}}]}}),
        json!({"name": "two", "emptyDir": {}, "hostPath": {"path": "/"}}),
    ] {
        assert_eq!(stored_volume(&volume), None, "{volume}");
    }
}
