#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use injector_api::names::INJECTED_ANNOTATION;
use injector_core::registry::in_force::from_listing;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use serde_json::{Value, json};

use super::*;
use crate::census;

fn template(name: &str, failure_policy: &str) -> SidecarTemplate {
    serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 3},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "failurePolicy": failure_policy,
            "containers": [{"name": name, "image": "agent:1"}],
        },
    }))
    .unwrap()
}

fn snapshot() -> Arc<Snapshot> {
    from_listing([template("agent", "Ignore"), template("guard", "Fail")]).0
}

fn pod(name: &str, owner: Option<&str>, record: Option<String>) -> Arc<PodRecord> {
    let owner = owner.map(|owner| {
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
            "uid": format!("uid-{owner}"), "controller": true,
        })
    });
    owned_pod(name, owner, record)
}

/// A Pod of `shop` labelled `app: web`, controlled by the owner `reference` names.
fn owned_pod(name: &str, reference: Option<Value>, record: Option<String>) -> Arc<PodRecord> {
    let mut meta: Value = json!({
        "name": name,
        "namespace": "shop",
        "labels": {"app": "web"},
    });
    if let Some(reference) = reference {
        meta["ownerReferences"] = json!([reference]);
    }
    if let Some(record) = record {
        meta["annotations"] = json!({INJECTED_ANNOTATION: record});
    }
    Arc::new(PodRecord::of(serde_json::from_value(meta).unwrap()).unwrap())
}

fn shop() -> Vec<Arc<PartialObjectMeta<Namespace>>> {
    vec![Arc::new(PartialObjectMeta {
        types: None,
        metadata: serde_json::from_value(
            json!({"name": "shop", "labels": {"kubernetes.io/metadata.name": "shop"}}),
        )
        .unwrap(),
        _phantom: std::marker::PhantomData,
    })]
}

fn record(snapshot: &Snapshot, name: &str) -> String {
    let t = snapshot.get(name).unwrap();
    format!("{name}@{}#{}", t.generation, t.fingerprint)
}

fn key(owner: &str, template: &str) -> SkipKey {
    SkipKey {
        owner: WorkloadRef {
            kind: "ReplicaSet".to_owned(),
            namespace: "shop".to_owned(),
            name: owner.to_owned(),
        },
        owner_uid: format!("uid-{owner}"),
        template: template.to_owned(),
        generation: 3,
    }
}

fn missing_of(pods: &[Arc<PodRecord>]) -> BTreeMap<SkipKey, Missing> {
    let snapshot = snapshot();
    let census = census::count(&snapshot, pods, &shop(), "sidecar-injector");
    missing(&snapshot, &census, pods)
}

#[test]
fn the_pods_missing_a_best_effort_template_are_counted_by_owner() {
    let snapshot = snapshot();
    let both = format!(
        "{},{}",
        record(&snapshot, "agent"),
        record(&snapshot, "guard")
    );
    let guard = record(&snapshot, "guard");
    let pods = vec![
        pod("web-abc-1", Some("web-abc"), Some(guard.clone())),
        pod("web-abc-2", Some("web-abc"), Some(guard)),
        pod("web-abc-3", Some("web-abc"), Some(both.clone())),
        pod("api-def-1", Some("api-def"), Some(both)),
        // Bare: whoever created it read the warnings.
        pod("bare", None, None),
    ];
    let found = missing_of(&pods);
    // The required template is never skipped: a Pod missing it was created before it.
    assert_eq!(
        found,
        BTreeMap::from([(
            key("web-abc", "agent"),
            Missing {
                pods: 2,
                sample: "web-abc-1".to_owned(),
                api_version: "apps/v1".to_owned(),
            }
        )])
    );
}

#[test]
fn a_scale_up_is_planned_again_once_and_told_once_with_its_count() {
    let mut log = SkipLog::default();
    let pods: Vec<_> = (0..1000)
        .map(|i| pod(&format!("web-abc-{i}"), Some("web-abc"), None))
        .collect();
    let missing = missing_of(&pods);
    let web = key("web-abc", "agent");
    assert_eq!(missing[&web].pods, 1000);
    assert_eq!(
        log.to_plan(&missing, LOOKUPS_PER_ROUND),
        std::slice::from_ref(&web)
    );
    log.learn(
        web.clone(),
        Some("conflict: container \"agent\" exists".to_owned()),
    );
    // Learned: never planned again.
    assert!(log.to_plan(&missing, LOOKUPS_PER_ROUND).is_empty());
    let at = Duration::from_secs(100);
    let told = log.due(&missing, at);
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].pods, 1000);
    assert!(log.due(&missing, at + Duration::from_secs(1)).is_empty());
    // Nothing new after a while: nothing told.
    assert!(log.due(&missing, at + RETELL_AFTER * 2).is_empty());

    let event = event(
        &told[0],
        "sidecar-injector",
        "replica-1",
        Timestamp::UNIX_EPOCH,
    );
    assert_eq!(event.series.as_ref().unwrap().count, 1000);
    assert_eq!(event.reason.as_deref(), Some(REASON_SKIPPED));
    let regarding = event.regarding.unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("ReplicaSet"));
    assert_eq!(regarding.api_version.as_deref(), Some("apps/v1"));
    assert_eq!(regarding.uid.as_deref(), Some("uid-web-abc"));
    assert_eq!(event.related.unwrap().name.as_deref(), Some("agent"));
    let note = event.note.unwrap();
    assert!(
        note.contains("SidecarTemplate agent (generation 3)"),
        "{note}"
    );
    assert!(
        note.contains("conflict: container \"agent\" exists"),
        "{note}"
    );
    assert!(note.contains("explain pod/web-abc-0 -n shop"), "{note}");
    assert_eq!(event.metadata.namespace.as_deref(), Some("shop"));
}

#[test]
fn more_missing_pods_are_told_again_after_a_while_only() {
    let mut log = SkipLog::default();
    let web = key("web-abc", "agent");
    let with = |pods: u32| {
        BTreeMap::from([(
            web.clone(),
            Missing {
                pods,
                sample: "web-abc-1".to_owned(),
                api_version: "apps/v1".to_owned(),
            },
        )])
    };
    log.learn(web.clone(), Some("conflict: x".to_owned()));
    let start = Duration::from_secs(10);
    assert_eq!(log.due(&with(1), start).len(), 1);
    assert!(
        log.due(&with(5), start + Duration::from_secs(30))
            .is_empty()
    );
    let again = log.due(&with(5), start + RETELL_AFTER);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].pods, 5);
    assert_eq!(
        series_patch(&again[0], Timestamp::UNIX_EPOCH, Some("41"))["series"]["count"],
        5
    );
    // Only to the Event read: one changed or made again since is refused.
    assert_eq!(
        series_patch(&again[0], Timestamp::UNIX_EPOCH, Some("41"))["metadata"]["resourceVersion"],
        "41"
    );

    // Its Event could not be written: told again next round.
    log.untold(&web);
    assert_eq!(log.due(&with(5), start + RETELL_AFTER).len(), 1);

    // Gone (the owner scaled to zero, or its Pods got the template): forgotten, then planned
    // again should they miss it again.
    assert!(
        log.due(&BTreeMap::new(), start + RETELL_AFTER * 2)
            .is_empty()
    );
    assert_eq!(log.to_plan(&with(1), LOOKUPS_PER_ROUND), [web]);
}

#[test]
fn an_owner_whose_pods_would_get_the_template_now_is_told_nothing() {
    let mut log = SkipLog::default();
    let web = key("web-abc", "agent");
    let missing = BTreeMap::from([(
        web.clone(),
        Missing {
            pods: 3,
            sample: "web-abc-1".to_owned(),
            api_version: "apps/v1".to_owned(),
        },
    )]);
    log.learn(web, None);
    assert!(log.due(&missing, Duration::from_secs(5)).is_empty());
    assert!(log.to_plan(&missing, LOOKUPS_PER_ROUND).is_empty());
}

/// A Pod of `shop` labelled `app: web`, as stored, with the containers `containers` names.
fn stored(name: &str, containers: &[&str]) -> Pod {
    let containers: Vec<Value> = containers
        .iter()
        .map(|c| json!({"name": c, "image": format!("{c}:mine")}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"containers": containers},
    }))
    .unwrap()
}

/// The best-effort template `name`, adding a container `container`, at `priority`, in the
/// namespaces labelled `env: <env>` (every one for `None`).
fn selective(name: &str, container: &str, priority: i32, env: Option<&str>) -> SidecarTemplate {
    let mut spec = json!({
        "podSelector": {"matchLabels": {"app": "web"}},
        "failurePolicy": "Ignore",
        "priority": priority,
        "containers": [{"name": container, "image": format!("{name}:1")}],
    });
    if let Some(env) = env {
        spec["namespaceSelector"] = json!({"matchLabels": {"env": env}});
    }
    serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    }))
    .unwrap()
}

fn labels(env: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("env".to_owned(), env.to_owned())])
}

#[test]
fn planning_the_stored_pod_again_gives_the_conflict() {
    let snapshot = snapshot();
    let clashing = stored("web-abc-1", &["web", "agent"]);
    let found = conflicts(&clashing, &labels("prod"), &snapshot);
    let reason = &found["agent"];
    assert!(reason.starts_with("conflict: "), "{reason}");
    assert!(reason.contains("agent"), "{reason}");
    // A Pod the template would apply to now (created before it): no reason.
    let plain = stored("web-abc-2", &["web"]);
    assert!(conflicts(&plain, &labels("prod"), &snapshot).is_empty());
}

#[test]
fn a_template_that_does_not_select_the_namespace_never_yields_a_skip() {
    let (snapshot, _) = from_listing([selective("agent", "agent", 100, Some("prod"))]);
    let clashing = stored("web-abc-1", &["web", "agent"]);
    assert!(conflicts(&clashing, &labels("dev"), &snapshot).is_empty());
    // Where it selects the namespace, the same Pod conflicts with it.
    let found = conflicts(&clashing, &labels("prod"), &snapshot);
    assert!(found["agent"].starts_with("conflict: "), "{found:?}");
}

#[test]
fn a_template_that_does_not_select_the_namespace_makes_no_other_skip() {
    // `first` applies before `agent` and adds the same container: where both apply, `agent`
    // conflicts; where `first` does not select the namespace, nothing does.
    let (snapshot, _) = from_listing([
        selective("first", "agent", 10, Some("prod")),
        selective("agent", "agent", 100, None),
    ]);
    let plain = stored("web-abc-1", &["web"]);
    assert!(conflicts(&plain, &labels("dev"), &snapshot).is_empty());
    assert!(conflicts(&plain, &labels("prod"), &snapshot).contains_key("agent"));
}

#[test]
fn the_event_name_is_stable_per_owner_template_and_generation() {
    let one = event_name(&key("web-abc", "agent"));
    assert_eq!(one, event_name(&key("web-abc", "agent")));
    assert!(one.starts_with("web-abc."), "{one}");
    assert_eq!(one.len(), "web-abc.".len() + 16);
    let mut other = key("web-abc", "agent");
    other.generation = 4;
    assert_ne!(one, event_name(&other));
    assert_ne!(one, event_name(&key("web-abc", "other")));
    // A single Pod: no series (the API server wants a count of 2 at least).
    let tell = Tell {
        key: key("web-abc", "agent"),
        reason: "conflict: x".to_owned(),
        pods: 1,
        sample: "web-abc-1".to_owned(),
        api_version: "apps/v1".to_owned(),
    };
    assert!(
        event(&tell, "c", "i", Timestamp::UNIX_EPOCH)
            .series
            .is_none()
    );
}

#[test]
fn owners_of_two_kinds_or_two_lives_with_one_name_get_events_of_their_own() {
    let replica_set = key("web", "agent");
    let mut stateful_set = replica_set.clone();
    stateful_set.owner.kind = "StatefulSet".to_owned();
    let mut created_again = replica_set.clone();
    created_again.owner_uid = "uid-web-2".to_owned();
    let names = BTreeSet::from([
        event_name(&replica_set),
        event_name(&stateful_set),
        event_name(&created_again),
    ]);
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn only_an_event_of_the_same_owner_and_template_is_added_to() {
    let web = key("web-abc", "agent");
    let tell = Tell {
        key: web.clone(),
        reason: "conflict: x".to_owned(),
        pods: 3,
        sample: "web-abc-1".to_owned(),
        api_version: "apps/v1".to_owned(),
    };
    let ours = event(&tell, "c", "i", Timestamp::UNIX_EPOCH);
    assert!(tells_of(&ours, &web));
    // The owner deleted and created again: the old one's series is not this one's.
    let mut again = web.clone();
    again.owner_uid = "uid-web-abc-2".to_owned();
    assert!(!tells_of(&ours, &again));
    let mut other_kind = web.clone();
    other_kind.owner.kind = "StatefulSet".to_owned();
    assert!(!tells_of(&ours, &other_kind));
    let mut other_template = web.clone();
    other_template.template = "other".to_owned();
    assert!(!tells_of(&ours, &other_template));
    let mut someone_elses = ours;
    someone_elses.reason = Some("Scheduled".to_owned());
    assert!(!tells_of(&someone_elses, &web));
}

#[test]
fn a_custom_owner_is_referenced_with_its_own_api_version() {
    let clone_set = json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet", "name": "web",
        "uid": "uid-clone", "controller": true,
    });
    let pods = vec![
        owned_pod("web-1", Some(clone_set.clone()), None),
        owned_pod("web-2", Some(clone_set), None),
    ];
    let missing = missing_of(&pods);
    let (key, found) = missing.iter().next().unwrap();
    assert_eq!(key.owner.kind, "CloneSet");
    assert_eq!(key.owner_uid, "uid-clone");
    assert_eq!(found.api_version, "apps.kruise.io/v1alpha1");
    let mut log = SkipLog::default();
    log.learn(key.clone(), Some("conflict: x".to_owned()));
    let told = log.due(&missing, Duration::ZERO);
    let event = event(&told[0], "c", "i", Timestamp::UNIX_EPOCH);
    let regarding = event.regarding.unwrap();
    assert_eq!(
        regarding.api_version.as_deref(),
        Some("apps.kruise.io/v1alpha1")
    );
    assert_eq!(regarding.kind.as_deref(), Some("CloneSet"));
    assert_eq!(regarding.uid.as_deref(), Some("uid-clone"));
}

#[test]
fn the_pods_of_an_owner_created_again_are_another_key() {
    let reference = |uid: &str| {
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
            "uid": uid, "controller": true,
        })
    };
    let pods = vec![
        owned_pod("web-abc-1", Some(reference("uid-old")), None),
        owned_pod("web-abc-2", Some(reference("uid-new")), None),
        owned_pod("web-abc-3", Some(reference("uid-new")), None),
    ];
    let found: BTreeMap<String, u32> = missing_of(&pods)
        .into_iter()
        .map(|(key, missing)| (key.owner_uid, missing.pods))
        .collect();
    assert_eq!(
        found,
        BTreeMap::from([("uid-new".to_owned(), 2), ("uid-old".to_owned(), 1)])
    );
}

#[test]
fn without_a_best_effort_template_nothing_is_missing() {
    let (required, _) = from_listing([template("guard", "Fail")]);
    assert!(!has_best_effort(&required));
    assert!(has_best_effort(&snapshot()));
    let pods = vec![pod("web-abc-1", Some("web-abc"), None)];
    let census = census::count(&required, &pods, &shop(), "sidecar-injector");
    assert!(missing(&required, &census, &pods).is_empty());
}
