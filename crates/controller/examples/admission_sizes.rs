//! The size of every admission object the operator writes, for N realistic templates in G
//! namespace groups (half of them required): the MutatingWebhookConfiguration (with the skip
//! conditions of `auto`), the MutatingAdmissionPolicy, the guard and the warnings policy of the
//! `policy` backend, and the after-admission policy. The API server takes a request body of up
//! to 3 MiB and etcd an object of up to 1.5 MiB.
//!
//! The proof Pods are made here, not by an API server: each template's items as written, with
//! the defaults every container gets. The presence conditions, and so the skip conditions and
//! the guard, are as long as from a real proof, give or take those defaults.
//!
//! `cargo run --release -p injector-controller --example admission_sizes -- [N G]...`
//! (default: 200 64 and 500 64); figures go in BENCHMARKS.md.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_controller::webhook_config::{
    Endpoint, WebhookConfigOptions, desired_configuration_with_policy,
};
use injector_core::policy::{
    PolicyOptions, compile_after_admission, compile_guard, compile_policy, compile_warnings,
    guard_rules, longest_expression, presence_conditions, proof_round_pod,
};
use injector_core::registry::Registry;
use injector_core::{CompiledTemplate, compile};
use serde_json::{Value, json};

/// One template: a sidecar with ten env vars, probes, resources and a port, in group `group`.
fn template(index: usize, group: usize) -> Value {
    let name = format!("sidecar-{index}");
    let env: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-{index}-{i}")}))
        .collect();
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "priority": index % 7,
            "failurePolicy": if index.is_multiple_of(2) { "Fail" } else { "Ignore" },
            "namespaceSelector": {"matchLabels": {"team": format!("team-{group}")}},
            "podSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["system"]}]},
            "containers": [{
                "name": format!("{name}-agent"),
                "image": format!("registry.invalid/agents/{name}:1.2.{index}"),
                "args": ["--pod", "{{ pod.name }}", "--namespace", "{{ pod.namespace }}"],
                "env": env,
                "ports": [{"containerPort": 9100, "name": "metrics"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 9100}, "periodSeconds": 5},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9100}},
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "10m", "memory": "32Mi"}},
            }],
        },
    })
}

/// A proof Pod of round `round`: its templates' containers as written, with the defaults every
/// container gets (placeholders rendered as anything: presence keeps them expressions).
fn proven(
    compiled: &injector_core::policy::CompiledPolicy,
    sources: &BTreeMap<String, Value>,
) -> Vec<Value> {
    (0..compiled.proof_round_count())
        .map(|round| {
            let mut pod = proof_round_pod(compiled, round);
            let containers: Vec<Value> = compiled
                .served
                .iter()
                .zip(&compiled.proof_rounds)
                .filter(|(_, r)| **r == round)
                .flat_map(|(t, _)| {
                    sources
                        .get(&t.name)
                        .and_then(|s| s["spec"]["containers"].as_array().cloned())
                        .unwrap_or_default()
                })
                .map(|mut c| {
                    c["terminationMessagePath"] = json!("/dev/termination-log");
                    c["terminationMessagePolicy"] = json!("File");
                    c["imagePullPolicy"] = json!("IfNotPresent");
                    c["args"] = json!(["--pod", "proof", "--namespace", "operator"]);
                    c
                })
                .collect();
            pod["spec"]["containers"] = Value::Array(containers);
            pod
        })
        .collect()
}

/// The size of `value` as JSON, and its longest CEL expression in code points (the API server
/// compiles none over 100,000).
fn kib(value: &Value) -> String {
    format!(
        "{:.0} KiB (longest expression {})",
        value.to_string().len() as f64 / 1024.0,
        longest_expression(value)
    )
}

fn measure(count: usize, groups: usize) -> Result<(), Box<dyn Error>> {
    let mut sources = BTreeMap::new();
    let mut registry = Registry::new();
    for index in 0..count {
        let source = template(index, index % groups);
        let parsed: SidecarTemplate = serde_json::from_value(source.clone())?;
        let compiled = compile(&parsed).map_err(|e| e.to_string())?;
        sources.insert(compiled.name.clone(), source);
        registry.apply(compiled);
    }
    let snapshot = registry.snapshot();
    let templates: &[Arc<CompiledTemplate>] = snapshot.templates();
    let options = |webhook_behind| PolicyOptions {
        name: "sidecar-injector".into(),
        operator_namespace: "sidecar-injector".into(),
        webhook_behind,
    };
    let auto = compile_policy(templates, &options(true));
    let present = presence_conditions(&auto, &proven(&auto, &sources));
    let webhook = WebhookConfigOptions::new(
        "sidecar-injector",
        Endpoint::Service {
            namespace: "sidecar-injector".into(),
            name: "sidecar-injector-webhook".into(),
            port: 8443,
        },
        "sidecar-injector",
    );
    let configuration = desired_configuration_with_policy(&snapshot, &webhook, b"ca", &present);
    let alone = compile_policy(templates, &options(false));
    let alone_present = presence_conditions(&alone, &proven(&alone, &sources));
    let rules = guard_rules(templates, Some(&alone), &alone_present);
    let guard = compile_guard(&options(false), &rules, None).map(|g| g.policy);
    let warnings = compile_warnings(&options(false), &alone, &alone_present, false).map(|(p, _)| p);
    let after = compile_after_admission(templates, &options(false)).map(|a| a.policy);
    println!(
        "{count} templates in {groups} groups: webhook configuration (auto) {}, {} entries; policy {} (auto, {} served) / {} (policy); guard {}; warnings policy {}; after-admission policy {}",
        kib(&serde_json::to_value(&configuration)?),
        configuration.webhooks.as_ref().map_or(0, Vec::len),
        auto.policy.as_ref().map_or("none".into(), kib),
        auto.served.len(),
        alone.policy.as_ref().map_or("none".into(), kib),
        guard.as_ref().map_or("none".into(), kib),
        warnings.as_ref().map_or("none".into(), kib),
        after.as_ref().map_or("none".into(), kib),
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let pairs: Vec<(usize, usize)> = if args.is_empty() {
        vec![(200, 64), (500, 64)]
    } else {
        args.chunks(2)
            .map(|c| (c[0], c.get(1).copied().unwrap_or(64)))
            .collect()
    };
    for (count, groups) in pairs {
        measure(count, groups)?;
    }
    Ok(())
}
