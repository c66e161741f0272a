//! Fuzzes the engine's two entry points that take untrusted input.
//!
//! The input bytes are read as JSON. When they are a JSON value, `plan` runs on it with three
//! fixed templates (compiled once), in a namespace whose labels are unknown and in one whose
//! labels are known; when it returns a plan, the patch must apply to the value and planning the
//! patched value again must add nothing, and the Pod as the webhook decodes it
//! (`pod_json::decode_pod_among`) must plan the same, or be malformed alike. When the bytes are
//! a `SidecarTemplate`, `compile` runs on it. Nothing may panic.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use injector_api::SidecarTemplate;
use injector_core::pod::json as pod_json;
use injector_core::{CompiledTemplate, NamespaceInfo, compile, plan, plan_among};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// A sidecar with a volume and placeholders, a native sidecar with selectors and metadata, and
/// an `OnRequest`, best-effort template changing the app containers.
const TEMPLATES: [&str; 3] = [
    r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: log-shipper, generation: 2}
spec:
  priority: 200
  containers:
  - name: log-shipper
    image: fluent/fluent-bit:3.1
    args: ["--pod={{ pod.namespace }}/{{ pod.name }}", "--app={{ pod.labels['app'] }}"]
    volumeMounts: [{name: app-logs, mountPath: /var/log/app, readOnly: true}]
  volumes:
  - name: app-logs
    emptyDir: {sizeLimit: 256Mi}
  appContainers:
    volumeMounts: [{name: app-logs, mountPath: /var/log/app}]
  metadata:
    annotations: {logging.sidecar.dev/path: /var/log/app}
"#,
    r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: mesh}
spec:
  priority: 10
  namespaceSelector:
    matchExpressions: [{key: env, operator: NotIn, values: [prod]}]
  podSelector:
    matchExpressions: [{key: mesh.example.com/inject, operator: NotIn, values: ["false"]}]
  initContainers:
  - name: mesh-proxy
    image: envoyproxy/envoy:v1.30
    restartPolicy: Always
    env: [{name: SERVICE_ACCOUNT, value: "{{ pod.serviceAccountName }}"}]
  imagePullSecrets: [{name: mesh-registry}]
  metadata:
    labels: {mesh.example.com/member: "true", mesh.example.com/app: "{{ pod.labels['app'] }}"}
    annotations: {mesh.example.com/team: "{{ pod.annotations['team'] }}"}
"#,
    r#"
apiVersion: sidecar.dev/v1alpha1
kind: SidecarTemplate
metadata: {name: app-env}
spec:
  injection: OnRequest
  failurePolicy: Ignore
  appContainers:
    names: [app, worker]
    env:
    - {name: POD_NAME, value: "{{ pod.name }}"}
    - name: NODE_IP
      valueFrom: {fieldRef: {fieldPath: status.hostIP}}
    envFrom: [{configMapRef: {name: otel-defaults, optional: true}}]
"#,
];

fn templates() -> &'static [Arc<CompiledTemplate>] {
    static COMPILED: OnceLock<Vec<Arc<CompiledTemplate>>> = OnceLock::new();
    COMPILED.get_or_init(|| {
        TEMPLATES
            .iter()
            .map(|yaml| {
                let template: SidecarTemplate =
                    serde_saphyr::from_str(yaml).expect("the fuzz target's templates parse");
                Arc::new(compile(&template).expect("the fuzz target's templates are valid"))
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(template) = serde_json::from_slice::<SidecarTemplate>(data) {
        let _ = compile(&template);
    }
    let Ok(pod) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // The webhook decodes only what the planner reads: it must plan the same.
    let text = std::str::from_utf8(data).unwrap_or_default();
    let decoded = pod_json::decode_pod_among(text, pod_json::allowance(text.len()), templates());
    let labels = BTreeMap::from([("env".to_owned(), "dev".to_owned())]);
    for labels in [None, Some(&labels)] {
        let namespace = NamespaceInfo {
            name: "shop",
            labels,
        };
        let whole = plan(&pod, &namespace, templates());
        match &decoded {
            Ok(decoded) => assert_eq!(
                Some(plan_among(decoded, &namespace, templates(), templates())),
                whole.clone().ok(),
                "the decoded pod plans differently"
            ),
            Err(pod_json::PodJsonError::Malformed(malformed)) => {
                assert_eq!(whole.as_ref().err(), Some(malformed), "malformed otherwise")
            }
            Err(_) => {}
        }
        let Ok(first) = whole else {
            continue;
        };
        let mut patched = pod.clone();
        if let Err(e) = json_patch::patch(&mut patched, &first.patch.to_json_patch()) {
            panic!("the patch does not apply: {e}\npatch: {:?}", first.patch);
        }
        let again = plan(&patched, &namespace, templates())
            .unwrap_or_else(|e| panic!("the patched pod is malformed: {e}"));
        assert!(
            again.patch.is_empty(),
            "planning the patched pod again adds {:?}",
            again.patch
        );
    }
});
