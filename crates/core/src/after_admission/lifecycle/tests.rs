#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use injector_api::SidecarTemplate;
use serde_json::{Value, json};

use super::*;
use crate::fingerprint::Fingerprint;
use crate::template::compile;

fn template(name: &str, spec: Value) -> CompiledTemplate {
    let template: SidecarTemplate = serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    }))
    .unwrap();
    compile(&template).unwrap()
}

fn mesh() -> CompiledTemplate {
    template(
        "mesh",
        json!({
            "podSelector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": "proxy", "image": "envoy:1.30"}],
        }),
    )
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const ANY_NAMESPACE: NamespaceInfo<'static> = NamespaceInfo {
    name: "shop",
    labels: None,
};

fn state_of(
    template: &CompiledTemplate,
    labels: &[(&str, &str)],
    record: Option<String>,
) -> Option<PodState> {
    let labels = map(labels);
    let mut annotations = BTreeMap::new();
    if let Some(record) = record {
        annotations.insert(INJECTED_ANNOTATION.to_owned(), record);
    }
    let pod = PodMeta {
        namespace: "shop",
        labels: &labels,
        annotations: &annotations,
    };
    state(template, &pod, &ANY_NAMESPACE)
}

#[test]
fn current_stale_and_missing() {
    let mesh = mesh();
    let web = [("app", "web")];
    let current = format!("other@2,mesh@1#{}", mesh.fingerprint);
    assert_eq!(
        state_of(&mesh, &web, Some(current)),
        Some(PodState::Current)
    );
    assert_eq!(state_of(&mesh, &web, None), Some(PodState::Missing));
    assert_eq!(state_of(&mesh, &[("app", "db")], None), None);

    // Injected before an image change: stale, in place; before any other change: stale.
    let old_image = template(
        "mesh",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "containers": [{"name": "proxy", "image": "envoy:1.29"}]}),
    );
    let record = format!("mesh@1#{}", old_image.fingerprint);
    assert_eq!(
        state_of(&mesh, &web, Some(record)),
        Some(PodState::Stale { in_place: true })
    );
    let old_args = template(
        "mesh",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "containers": [{"name": "proxy", "image": "envoy:1.30", "args": ["-v"]}]}),
    );
    let record = format!("mesh@1#{}", old_args.fingerprint);
    assert_eq!(
        state_of(&mesh, &web, Some(record)),
        Some(PodState::Stale { in_place: false })
    );
    // A record from before fingerprints: what it carries is unknown.
    assert_eq!(
        state_of(&mesh, &web, Some("mesh@1".into())),
        Some(PodState::Stale { in_place: false })
    );
    // Carried but no longer selected: still carried, and current.
    let current = format!("mesh@1#{}", mesh.fingerprint);
    assert_eq!(
        state_of(&mesh, &[("app", "db")], Some(current)),
        Some(PodState::Current)
    );
}

#[test]
fn selection_follows_admissions_rules() {
    let mesh = mesh();
    let labels = map(&[("app", "web")]);
    let none = BTreeMap::new();
    let pod = |namespace| PodMeta {
        namespace,
        labels: &labels,
        annotations: &none,
    };
    assert!(selects(&mesh, &pod("shop"), &ANY_NAMESPACE));
    assert!(!selects(&mesh, &pod("kube-system"), &ANY_NAMESPACE));
    let disabled = map(&[("sidecar.dev/injection", "disabled")]);
    let opted_out_namespace = NamespaceInfo {
        name: "shop",
        labels: Some(&disabled),
    };
    assert!(!selects(&mesh, &pod("shop"), &opted_out_namespace));

    let opt_out = map(&[("sidecar.dev/inject", "false")]);
    let opted_out = PodMeta {
        namespace: "shop",
        labels: &labels,
        annotations: &opt_out,
    };
    assert!(
        selects(&mesh, &opted_out, &ANY_NAMESPACE),
        "required: applies anyway"
    );
    let best_effort = template(
        "mesh",
        json!({"failurePolicy": "Ignore", "containers": [{"name": "proxy", "image": "envoy"}]}),
    );
    assert!(!selects(&best_effort, &opted_out, &ANY_NAMESPACE));

    let on_request = template(
        "agent",
        json!({"injection": "OnRequest", "containers": [{"name": "agent", "image": "agent"}]}),
    );
    assert!(!selects(&on_request, &pod("shop"), &ANY_NAMESPACE));
    let asks = map(&[("sidecar.dev/templates", "mesh, agent")]);
    let asking = PodMeta {
        namespace: "shop",
        labels: &labels,
        annotations: &asks,
    };
    assert!(selects(&on_request, &asking, &ANY_NAMESPACE));
}

/// Labels or annotations kept as pairs, not a map: a form of the caller's own.
struct Pairs<'a>(&'a [(&'a str, &'a str)]);

impl Labels for Pairs<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

#[test]
fn a_pod_is_read_the_same_through_any_form_of_its_labels_and_annotations() {
    let mesh = mesh();
    let on_request = template(
        "agent",
        json!({"injection": "OnRequest", "failurePolicy": "Ignore", "containers": [{"name": "agent", "image": "agent"}]}),
    );
    let current = format!("mesh@1#{}", mesh.fingerprint);
    let cases: [&[(&str, &str)]; 4] = [
        &[],
        &[(INJECTED_ANNOTATION, &current)],
        &[(TEMPLATES_ANNOTATION, "agent")],
        &[
            (TEMPLATES_ANNOTATION, "agent"),
            (INJECT_ANNOTATION, "false"),
        ],
    ];
    for labels in [&[("app", "web")][..], &[("app", "db")]] {
        for annotations in cases {
            let (label_map, annotation_map) = (map(labels), map(annotations));
            let as_maps = PodMeta {
                namespace: "shop",
                labels: &label_map,
                annotations: &annotation_map,
            };
            let as_pairs = PodMeta {
                namespace: "shop",
                labels: &Pairs(labels),
                annotations: &Pairs(annotations),
            };
            for template in [&mesh, &on_request] {
                assert_eq!(
                    state(template, &as_maps, &ANY_NAMESPACE),
                    state(template, &as_pairs, &ANY_NAMESPACE),
                    "{labels:?} {annotations:?}"
                );
            }
            assert_eq!(
                recorded(&annotation_map).collect::<Vec<_>>(),
                recorded(&Pairs(annotations)).collect::<Vec<_>>()
            );
        }
    }
    let asking = PodMeta {
        namespace: "shop",
        labels: &Pairs(&[("app", "web")]),
        annotations: &Pairs(&[(TEMPLATES_ANNOTATION, "agent")]),
    };
    assert_eq!(
        state(&on_request, &asking, &ANY_NAMESPACE),
        Some(PodState::Missing)
    );
    assert!(format!("{asking:?}").contains("sidecar.dev/templates"));
}

#[test]
fn record_entries_are_read_whatever_their_age() {
    assert_eq!(
        Recorded::parse("mesh@3#0123456789abcdef"),
        Recorded {
            name: "mesh",
            generation: Some(3),
            fingerprint: Fingerprint::parse("0123456789abcdef"),
        }
    );
    assert_eq!(
        Recorded::parse("mesh@3"),
        Recorded {
            name: "mesh",
            generation: Some(3),
            fingerprint: None
        }
    );
    assert_eq!(
        Recorded::parse("mesh"),
        Recorded {
            name: "mesh",
            generation: None,
            fingerprint: None
        }
    );
}

#[test]
fn census_counts_every_template_over_every_pod() {
    let mesh = Arc::new(mesh());
    let logger = Arc::new(template(
        "logger",
        json!({"namespaceSelector": {"matchLabels": {"logs": "on"}}, "failurePolicy": "Ignore", "containers": [{"name": "logger", "image": "fluent:1"}]}),
    ));
    let old_mesh = template(
        "mesh",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "containers": [{"name": "proxy", "image": "envoy:1.29"}]}),
    );
    let web = map(&[("app", "web")]);
    let db = map(&[("app", "db")]);
    let record = |entries: &[String]| map(&[(INJECTED_ANNOTATION, &entries.join(","))]);
    let current = record(&[format!("mesh@1#{}", mesh.fingerprint)]);
    let stale = record(&[
        format!("mesh@1#{}", old_mesh.fingerprint),
        format!("logger@1#{}", logger.fingerprint),
    ]);
    let nothing = BTreeMap::new();
    let logs_on = map(&[("logs", "on")]);
    let plain = BTreeMap::new();
    let pods = [
        // shop (logs on): one current, one stale (and carrying the logger), one missing both.
        ("shop", &web, &current),
        ("shop", &web, &stale),
        ("shop", &web, &nothing),
        // A Pod neither template selects.
        ("shop", &db, &nothing),
        // plain: the logger does not select it; the mesh misses it.
        ("plain", &web, &nothing),
        // A namespace not seen yet (or the operator's): only what it carries counts.
        ("unknown", &web, &nothing),
        ("unknown", &web, &current),
    ];
    let namespaces = BTreeMap::from([("shop", &logs_on), ("plain", &plain)]);
    let tallies = census(
        &[Arc::clone(&mesh), Arc::clone(&logger)],
        pods.iter().map(|(namespace, labels, annotations)| PodMeta {
            namespace,
            labels: *labels,
            annotations: *annotations,
        }),
        |name| namespaces.get(name).copied(),
    );
    assert_eq!(
        tallies["mesh"],
        Tally {
            current: 2,
            stale: 1,
            stale_in_place: 1,
            missing: 2,
        }
    );
    assert_eq!(tallies["mesh"].injected(), 3);
    assert_eq!(
        tallies["logger"],
        Tally {
            current: 1,
            stale: 0,
            stale_in_place: 0,
            missing: 3,
        }
    );
    assert_eq!(
        PodCounts::from(tallies["logger"]),
        PodCounts {
            injected: 1,
            current: 1,
            stale: 0,
            missing: 3,
        }
    );
}

#[test]
fn the_census_by_owner_counts_the_pods_behind() {
    let mesh = Arc::new(mesh());
    let web = map(&[("app", "web")]);
    let current = map(&[(INJECTED_ANNOTATION, &format!("mesh@1#{}", mesh.fingerprint))]);
    let stale = map(&[(INJECTED_ANNOTATION, "mesh@1")]);
    let nothing = BTreeMap::new();
    let shop = BTreeMap::new();
    let pods = [
        (&current, Some("web-rs")),
        (&stale, Some("web-rs")),
        (&nothing, Some("web-rs")),
        (&nothing, None),
    ];
    let found = census_by_owner(
        &[Arc::clone(&mesh)],
        pods.iter().map(|(annotations, owner)| {
            (
                PodMeta {
                    namespace: "shop",
                    labels: &web,
                    annotations: *annotations,
                },
                *owner,
            )
        }),
        |_| Some(&shop),
    );
    let mesh = &found["mesh"];
    assert_eq!(
        (mesh.tally.current, mesh.tally.stale, mesh.tally.missing),
        (1, 1, 2)
    );
    assert_eq!(
        mesh.behind,
        BTreeMap::from([(Some("web-rs"), 2), (None, 1)])
    );
}

#[test]
fn every_namespace_but_the_operators_is_selectable_and_deleted_pods_do_not_count() {
    let named = |name: &str, labels: Option<&[(&str, &str)]>| ObjectMeta {
        name: Some(name.to_owned()),
        labels: labels.map(|l| {
            l.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
        ..ObjectMeta::default()
    };
    let namespaces = [
        named("shop", Some(&[("team", "shop")])),
        named("bare", None),
        named("sidecar-injector", Some(&[("team", "shop")])),
    ];
    let selectable = selectable_namespaces(&namespaces, "sidecar-injector");
    let names: Vec<(&str, usize)> = selectable.iter().map(|(n, l)| (*n, l.len())).collect();
    assert_eq!(names, [("bare", 0), ("shop", 1)]);

    let mut pod = named("p", None);
    assert!(counts(&pod));
    pod.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Default::default(),
    ));
    assert!(!counts(&pod));
}
