//! Benchmarks of the injection engine's hot path: what the webhook does per admission request.
//!
//! - `plan/*`: [`injector_core::plan`] on an already-parsed Pod (`serde_json::Value`): a tiny
//!   Pod, a realistic ~8 KB Deployment Pod with three templates, and Pods with one container
//!   holding 1,500 and 3,000 env vars (the planner must stay linear in the Pod's size).
//!   `plan/typical_8k_pod_with_parse` adds `serde_json::from_slice` of the Pod's bytes, the
//!   webhook's other per-request cost before it decoded only what the planner reads;
//!   `plan/typical_8k_pod_with_decode` decodes the typed Pod with `pod_json::decode_pod_among`
//!   instead and plans it, what the webhook does now.
//! - `registry/group_lookup/N`: `Snapshot::group(id)` and iterating that group's templates,
//!   with N other templates in N other groups; it must not grow with N.
//! - `registry/matching/N`: `Snapshot::matching` (selection by labels, used outside the
//!   webhook's per-group path); linear in the number of groups, reported for reference.
//!
//! Run with `just bench` or `cargo bench -p injector-core --bench plan`; results are written
//! under `target/criterion/`. See BENCHMARKS.md for the figures and the targets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use injector_core::pod::json as pod_json;
use injector_core::{CompiledTemplate, NamespaceInfo, Plan, Registry, Snapshot, plan, plan_among};
use serde_json::{Map, Value, json};

// The templates and the small Pod are built as the integration tests build theirs.
#[path = "../tests/common/fixtures.rs"]
mod fixtures;

use fixtures::{APP_POD, compile_json, template};

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

/// Namespace "shop", already selected by the API server (as for a webhook entry).
const NAMESPACE: NamespaceInfo<'static> = NamespaceInfo {
    name: "shop",
    labels: None,
};

fn run<'t>(pod: &Value, templates: &'t [Arc<CompiledTemplate>]) -> Plan<'t> {
    plan(pod, &NAMESPACE, templates).unwrap()
}

/// Checks, once in the setup, that the fixture exercises what the benchmark claims to.
fn check_plan(label: &str, plan: &Plan, applied: usize, warnings: usize) {
    assert_eq!(plan.applied.len(), applied, "{label}: {plan:#?}");
    assert_eq!(
        plan.warnings.len(),
        warnings,
        "{label}: {:?}",
        plan.warnings
    );
    assert!(plan.denials.is_empty(), "{label}: {:?}", plan.denials);
    assert!(!plan.patch.is_empty(), "{label}: empty patch");
}

const SMALL_TEMPLATE: &str = r#"
metadata: {name: logger, generation: 3}
spec:
  podSelector: {matchLabels: {app: web}}
  containers:
  - name: logger
    image: fluent-bit:3
    volumeMounts: [{name: logs, mountPath: /var/log/app}]
  volumes:
  - name: logs
    emptyDir: {}
"#;

/// The typical Pod and its three templates are shared with `just bench-webhook`: a log
/// shipper (a container and an emptyDir), a native sidecar proxy using placeholders, and env,
/// mounts and metadata for the Pod's own containers.
const TYPICAL_POD: &str = include_str!("../../../bench/fixtures/typical-pod.json");
const LOG_SHIPPER: &str = include_str!("../../../bench/fixtures/templates/log-shipper.yaml");
const PROXY: &str = include_str!("../../../bench/fixtures/templates/mesh-proxy.yaml");
const APP_ENV: &str = include_str!("../../../bench/fixtures/templates/app-telemetry.yaml");

/// A Pod as a Deployment's ReplicaSet creates it, after the API server's defaulting: what the
/// webhook receives for a typical workload.
fn typical_pod() -> Value {
    serde_json::from_str(TYPICAL_POD).unwrap()
}

/// A Pod with one container holding `count` env vars.
fn env_pod(count: usize) -> Value {
    let env: Vec<Value> = (0..count)
        .map(|i| json!({"name": format!("SETTING_{i:05}"), "value": format!("value-{i}")}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "config-heavy-0", "namespace": "shop", "labels": {"app": "config-heavy"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/config-heavy:1", "env": env}]}
    })
}

/// Adds 64 env vars to the app containers (8 colliding with the Pod's, 4 of them with another
/// value, which gives a warning each) and a container.
fn env_template() -> Arc<CompiledTemplate> {
    let mut env: Vec<Value> = (0..56)
        .map(|i| json!({"name": format!("INJECTED_{i:03}"), "value": format!("injected-{i}")}))
        .collect();
    for i in 0..8 {
        let value = if i % 2 == 0 {
            format!("value-{i}")
        } else {
            format!("other-{i}")
        };
        env.push(json!({"name": format!("SETTING_{i:05}"), "value": value}));
    }
    Arc::new(compile_json(json!({
        "metadata": {"name": "env-injector", "generation": 1},
        "spec": {
            "podSelector": {"matchLabels": {"app": "config-heavy"}},
            "containers": [{"name": "agent", "image": "registry.example.com/agent:1"}],
            "appContainers": {"env": env}
        }
    })))
}

// ---------------------------------------------------------------------------------------------
// plan/*
// ---------------------------------------------------------------------------------------------

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");

    let small = serde_saphyr::from_str::<Value>(APP_POD).unwrap();
    let small_templates = [template(SMALL_TEMPLATE)];
    check_plan("small_pod", &run(&small, &small_templates), 1, 0);
    group.bench_function("small_pod", |b| {
        b.iter(|| run(black_box(&small), black_box(&small_templates)))
    });

    let typical = typical_pod();
    let typical_bytes = serde_json::to_vec(&typical).unwrap();
    println!(
        "plan/typical_8k_pod: the pod is {} bytes of JSON",
        typical_bytes.len()
    );
    assert!(
        (7 * 1024..=9 * 1024).contains(&typical_bytes.len()),
        "the typical pod should be 7-9 KB, is {} bytes",
        typical_bytes.len()
    );
    let typical_templates = [template(LOG_SHIPPER), template(PROXY), template(APP_ENV)];
    let typical_plan = run(&typical, &typical_templates);
    check_plan("typical_8k_pod", &typical_plan, 3, 0);
    group.bench_function("typical_8k_pod", |b| {
        b.iter(|| run(black_box(&typical), black_box(&typical_templates)))
    });
    group.bench_function("typical_8k_pod_with_parse", |b| {
        b.iter(|| {
            let pod: Value = serde_json::from_slice(black_box(&typical_bytes)).unwrap();
            run(&pod, black_box(&typical_templates))
        })
    });

    // What the webhook does instead of a full parse: only the fields the planner reads, within
    // the request's allowance.
    let allowance = pod_json::allowance(typical_bytes.len());
    let typical_json = std::str::from_utf8(&typical_bytes).unwrap();
    group.bench_function("typical_8k_pod_with_decode", |b| {
        b.iter(|| {
            let templates = black_box(&typical_templates[..]);
            let pod =
                pod_json::decode_pod_among(black_box(typical_json), allowance, templates).unwrap();
            plan_among(&pod, &NAMESPACE, templates, templates)
        })
    });

    // The large pods: fewer samples, so that each stays within the time budget.
    group.sample_size(50);
    let env_templates = [env_template()];
    for count in [1_500, 3_000] {
        let pod = env_pod(count);
        check_plan(&format!("env_{count}"), &run(&pod, &env_templates), 1, 4);
        group.bench_function(format!("env_{count}"), |b| {
            b.iter(|| run(black_box(&pod), black_box(&env_templates)))
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// registry/*
// ---------------------------------------------------------------------------------------------

/// Templates in the target group: selected by `tier: target`, the same in every registry.
const TARGET_TEMPLATES: usize = 3;

/// A registry of `fillers` templates, each with its own pod selector (so each in its own
/// group) and its own namespace selector (so that past the 64-group bound they are still not
/// merged: `group::merge_past_bound`), plus [`TARGET_TEMPLATES`] templates sharing one group;
/// and that group's id.
fn registry(fillers: usize) -> (Arc<Snapshot>, String) {
    let mut registry = Registry::new();
    for i in 0..fillers {
        registry.apply(compile_json(json!({
            "metadata": {"name": format!("filler-{i:05}"), "generation": 1},
            "spec": {
                "priority": i % 1000,
                "podSelector": {"matchLabels": {"app": format!("service-{i:05}")}},
                "namespaceSelector": {"matchExpressions": [{"key": format!("filler-{i:05}"), "operator": "DoesNotExist"}]},
                "containers": [{"name": format!("agent-{i:05}"), "image": "registry.example.com/agent:1"}]
            }
        })));
    }
    let mut target_id = None;
    for i in 0..TARGET_TEMPLATES {
        let compiled = compile_json(json!({
            "metadata": {"name": format!("target-{i}"), "generation": 1},
            "spec": {
                "podSelector": {"matchLabels": {"tier": "target"}},
                "containers": [{"name": format!("target-{i}"), "image": "registry.example.com/target:1"}]
            }
        }));
        target_id = Some(compiled.group.id().as_str().to_owned());
        registry.apply(compiled);
    }
    let snapshot = registry.snapshot();
    let target_id = target_id.unwrap();
    assert_eq!(snapshot.len(), fillers + TARGET_TEMPLATES);
    assert_eq!(snapshot.groups().len(), fillers + 1);
    assert_eq!(
        snapshot.group(&target_id).unwrap().templates.len(),
        TARGET_TEMPLATES
    );
    (snapshot, target_id)
}

/// What the webhook does per request before planning: find the group of the path's id, and
/// walk its templates.
fn lookup(snapshot: &Snapshot, id: &str) -> usize {
    let group = snapshot.group(id).unwrap();
    group
        .templates
        .iter()
        .map(|t| t.name.len() + t.priority as usize)
        .sum()
}

fn bench_registry(c: &mut Criterion) {
    let mut group = c.benchmark_group("registry/group_lookup");
    for n in [1usize, 10, 100, 10_000] {
        let (snapshot, id) = registry(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| lookup(black_box(&snapshot), black_box(&id)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("registry/matching");
    let pod_labels: Map<String, Value> = [
        ("app", "service-00000"),
        ("tier", "target"),
        ("pod-template-hash", "7d9c5b8f6d"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Value::from(v)))
    .collect();
    let ns_labels: BTreeMap<String, String> =
        [("kubernetes.io/metadata.name".to_owned(), "shop".to_owned())].into();
    for n in [1usize, 100, 10_000] {
        let (snapshot, _) = registry(n);
        // The target group, and filler 0 (whose selector the labels also match).
        let found = snapshot.matching(&pod_labels, Some(&ns_labels));
        assert_eq!(found.len(), TARGET_TEMPLATES + 1);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| black_box(&snapshot).matching(black_box(&pod_labels), Some(&ns_labels)))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_plan, bench_registry
}
criterion_main!(benches);
