#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

#[test]
fn metadata_is_kept_without_its_managed_fields() {
    let meta: ObjectMeta = serde_json::from_value(serde_json::json!({
        "name": "web-1",
        "namespace": "shop",
        "labels": {"app": "web"},
        "annotations": {"sidecar.dev/injected": "agent@1#0000000000000000"},
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
    }))
    .unwrap();
    let lean = lean(meta.clone());
    assert_eq!(lean.managed_fields, None);
    assert_eq!(
        lean,
        ObjectMeta {
            managed_fields: None,
            ..meta
        }
    );
}
