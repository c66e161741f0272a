use injector_api::FailurePolicy;
use injector_core::registry::in_force::Kept;

use super::*;

fn template(name: &str, generation: i64, image: &str) -> SidecarTemplate {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": {"containers": [{"name": name, "image": image}]},
    }))
    .unwrap()
}

fn invalid(name: &str) -> SidecarTemplate {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 2},
        "spec": {"containers": [{"name": "Bad Name"}]},
    }))
    .unwrap()
}

/// `template` made best-effort.
fn best_effort(mut template: SidecarTemplate) -> SidecarTemplate {
    template.spec.failure_policy = FailurePolicy::Ignore;
    template
}

fn kept(observed: &ObservedTemplates, name: &str) -> Option<Kept> {
    observed.lock().unwrap()[name].kept.clone()
}

fn names(webhook: &Templates) -> Vec<String> {
    webhook
        .snapshot()
        .templates()
        .iter()
        .map(|t| t.name.clone())
        .collect()
}

#[test]
fn readiness_waits_for_the_first_complete_list() {
    let webhook = Templates::new();
    let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(template("a", 1, "x")));
    assert!(!webhook.is_synced());
    assert!(
        names(&webhook).is_empty(),
        "nothing is served from a partial list"
    );
    assert!(sync.handle(Event::InitDone));
    assert!(webhook.is_synced());
    assert_eq!(names(&webhook), ["a"]);
}

#[test]
fn applies_updates_and_deletes() {
    let webhook = Templates::new();
    let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
    sync.handle(Event::Init);
    sync.handle(Event::InitDone);
    assert!(sync.handle(Event::Apply(template("a", 1, "x"))));
    assert!(
        !sync.handle(Event::Apply(template("a", 1, "x"))),
        "an identical template changes nothing"
    );
    assert!(sync.handle(Event::Apply(template("a", 2, "y"))));
    assert_eq!(webhook.snapshot().get("a").unwrap().generation, 2);
    assert!(sync.handle(Event::Delete(template("a", 2, "y"))));
    assert!(names(&webhook).is_empty());
    assert!(!sync.handle(Event::Delete(template("a", 2, "y"))));
}

#[test]
fn an_invalid_template_never_enters_and_a_template_that_becomes_invalid_leaves() {
    let webhook = Templates::new();
    let observed = ObservedTemplates::default();
    let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(template("good", 1, "x")));
    sync.handle(Event::InitApply(invalid("bad")));
    sync.handle(Event::InitDone);
    assert_eq!(names(&webhook), ["good"]);
    assert_eq!(
        sync.counts(),
        TemplateCounts {
            valid: 1,
            invalid: 1
        }
    );
    let bad = observed.lock().unwrap()["bad"].outcome.clone().unwrap_err();
    assert!(
        bad.messages()
            .iter()
            .any(|m| m.starts_with("spec.containers[0].name"))
    );

    sync.handle(Event::Apply(best_effort(template("good", 2, "x"))));
    assert!(sync.handle(Event::Apply(best_effort(invalid("good")))));
    assert!(names(&webhook).is_empty(), "a best-effort template leaves");
    assert_eq!(kept(&observed, "good"), None);
    assert_eq!(
        sync.counts(),
        TemplateCounts {
            valid: 0,
            invalid: 2
        }
    );
}

#[test]
fn a_relist_after_a_watch_gap_replaces_the_registry() {
    let webhook = Templates::new();
    let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(template("a", 1, "x")));
    sync.handle(Event::InitApply(template("b", 1, "x")));
    sync.handle(Event::InitDone);
    // The watch broke; "a" was deleted and "c" created meanwhile.
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(template("b", 1, "x")));
    sync.handle(Event::InitApply(template("c", 1, "x")));
    assert_eq!(
        names(&webhook),
        ["a", "b"],
        "the old snapshot serves until the list is complete"
    );
    sync.handle(Event::InitDone);
    assert_eq!(names(&webhook), ["b", "c"]);
}

#[test]
fn a_required_template_made_invalid_keeps_its_last_valid_generation_until_fixed() {
    let webhook = Templates::new();
    let observed = ObservedTemplates::default();
    let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
    sync.handle(Event::Init);
    sync.handle(Event::InitDone);
    sync.handle(Event::Apply(template("agent", 1, "agent:1")));
    let group = webhook.snapshot().get("agent").unwrap().group_id.clone();

    assert!(
        !sync.handle(Event::Apply(invalid("agent"))),
        "the registry does not change"
    );
    let in_force = webhook.snapshot().get("agent").cloned().unwrap();
    assert_eq!(in_force.generation, 1);
    assert_eq!(
        kept(&observed, "agent"),
        Some(Kept {
            generation: 1,
            group: group.clone()
        })
    );
    assert!(observed.lock().unwrap()["agent"].outcome.is_err());
    assert_eq!(
        sync.counts(),
        TemplateCounts {
            valid: 1,
            invalid: 1
        }
    );

    // A relist keeps it too.
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(invalid("agent")));
    sync.handle(Event::InitDone);
    assert_eq!(webhook.snapshot().get("agent").unwrap().generation, 1);
    assert_eq!(kept(&observed, "agent").unwrap().generation, 1);

    // Fixed: the new generation replaces it and nothing is kept any more.
    assert!(sync.handle(Event::Apply(template("agent", 3, "agent:3"))));
    assert_eq!(webhook.snapshot().get("agent").unwrap().generation, 3);
    assert_eq!(kept(&observed, "agent"), None);
}

/// `invalid(name)` whose status records generation 1 of `template(name, 1, image)`.
fn invalid_with_last_valid(name: &str, image: &str) -> SidecarTemplate {
    let mut template = invalid(name);
    template.status = Some(injector_api::SidecarTemplateStatus {
        last_valid: Some(injector_api::LastValid {
            generation: 1,
            spec: serde_json::to_value(self::template(name, 1, image).spec).unwrap(),
        }),
        ..Default::default()
    });
    template
}

#[test]
fn a_replica_started_while_a_required_template_is_invalid_keeps_what_its_status_records() {
    for listed in [true, false] {
        let webhook = Templates::new();
        let observed = ObservedTemplates::default();
        let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
        sync.handle(Event::Init);
        if listed {
            sync.handle(Event::InitApply(invalid_with_last_valid(
                "agent", "agent:1",
            )));
            sync.handle(Event::InitDone);
        } else {
            sync.handle(Event::InitDone);
            assert!(sync.handle(Event::Apply(invalid_with_last_valid("agent", "agent:1"))));
        }
        let in_force = webhook.snapshot().get("agent").cloned().unwrap();
        assert_eq!(in_force.generation, 1);
        assert_eq!(
            in_force.containers[0].body.render(&facts())["image"],
            "agent:1"
        );
        assert_eq!(kept(&observed, "agent").unwrap().generation, 1);
    }

    // Not for a best-effort template, nor without a record.
    let webhook = Templates::new();
    let mut sync = TemplateSync::new(webhook.clone(), ObservedTemplates::default());
    sync.handle(Event::Init);
    let mut best_effort_record = invalid_with_last_valid("logs", "logs:1");
    if let Some(status) = &mut best_effort_record.status {
        let spec = best_effort(template("logs", 1, "logs:1")).spec;
        status.last_valid.as_mut().unwrap().spec = serde_json::to_value(spec).unwrap();
    }
    sync.handle(Event::InitApply(best_effort_record));
    sync.handle(Event::InitApply(invalid("plain")));
    sync.handle(Event::InitDone);
    assert!(names(&webhook).is_empty(), "{:?}", names(&webhook));
}

fn facts() -> injector_core::PodFacts<'static> {
    injector_core::PodFacts {
        name: "p",
        namespace: "n",
        service_account_name: "default",
        labels: None,
        annotations: None,
    }
}

#[test]
fn a_kept_required_template_leaves_when_deleted() {
    let webhook = Templates::new();
    let observed = ObservedTemplates::default();
    let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(template("agent", 1, "agent:1")));
    sync.handle(Event::InitDone);
    sync.handle(Event::Apply(invalid("agent")));
    assert_eq!(names(&webhook), ["agent"]);
    assert!(sync.handle(Event::Delete(invalid("agent"))));
    assert!(names(&webhook).is_empty());
    assert!(observed.lock().unwrap().is_empty());
    // Deleted during a watch gap: the relist drops it as well.
    sync.handle(Event::Apply(template("agent", 1, "agent:1")));
    sync.handle(Event::Apply(invalid("agent")));
    sync.handle(Event::Init);
    sync.handle(Event::InitDone);
    assert!(names(&webhook).is_empty());
}

#[test]
fn a_required_template_invalid_from_the_start_has_nothing_to_keep() {
    let webhook = Templates::new();
    let observed = ObservedTemplates::default();
    let mut sync = TemplateSync::new(webhook.clone(), observed.clone());
    sync.handle(Event::Init);
    sync.handle(Event::InitApply(invalid("agent")));
    sync.handle(Event::InitDone);
    assert!(names(&webhook).is_empty());
    assert_eq!(kept(&observed, "agent"), None);
}
