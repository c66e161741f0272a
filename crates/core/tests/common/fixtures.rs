//! Fixtures the engine's integration tests and its benchmarks share (`benches/plan.rs`
//! includes this file by path), so that both build templates and Pods the same way.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_core::{CompiledTemplate, compile};
use serde_json::Value;

/// A template from YAML (apiVersion and kind are filled in).
pub fn template(yaml: &str) -> Arc<CompiledTemplate> {
    Arc::new(compile(&parse_template(yaml)).unwrap_or_else(|e| panic!("{e}")))
}

/// A template from its JSON (apiVersion and kind are filled in), compiled.
pub fn compile_json(value: Value) -> CompiledTemplate {
    compile(&template_from_json(value)).unwrap_or_else(|e| panic!("{e}"))
}

pub fn parse_template(yaml: &str) -> SidecarTemplate {
    template_from_json(serde_saphyr::from_str(yaml).unwrap())
}

fn template_from_json(mut value: Value) -> SidecarTemplate {
    value["apiVersion"] = "sidecar.dev/v1alpha1".into();
    value["kind"] = "SidecarTemplate".into();
    serde_json::from_value(value).unwrap()
}

/// A one-container Pod labelled `app: web` in namespace `shop`.
pub const APP_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  labels: {app: web}
spec:
  containers:
  - name: app
    image: nginx
"#;
