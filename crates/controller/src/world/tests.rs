//! The world's outputs derived from observations alone: what the configuration leaves out is
//! what the statuses call `NotServed`, and each observation moves the outputs it should.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_core::Registry;
use injector_core::registry::in_force::{Observed, observe};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";

fn options() -> WebhookConfigOptions {
    crate::webhook_config::tests::service_options()
}

/// A template called `name` at `generation` with this failure policy and spec fields.
fn template(name: &str, generation: i64, failure_policy: &str, spec: Value) -> SidecarTemplate {
    let mut spec_value = json!({
        "failurePolicy": failure_policy,
        "containers": [{"name": name, "image": "registry.invalid/agent:1"}],
    });
    if let (Value::Object(base), Value::Object(extra)) = (&mut spec_value, spec) {
        base.extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1", "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": spec_value,
    }))
    .unwrap()
}

/// The world of these templates (each observed with nothing in force before it), synced, with
/// a CA and nothing else observed yet.
fn world_of<'o>(options: &'o WebhookConfigOptions, templates: &[SidecarTemplate]) -> World<'o> {
    let mut registry = Registry::new();
    let mut observed = Vec::new();
    for template in templates {
        let (in_force, seen) = observe(template.clone(), None);
        if let Some(compiled) = in_force {
            registry.apply(compiled);
        }
        observed.push(seen);
    }
    World {
        webhook: options,
        backend: Backend::Webhook,
        templates: observed,
        snapshot: registry.snapshot(),
        synced: true,
        ca: Some(CA.to_owned()),
        census: None,
        rollouts: None,
        policy: None,
        skip_refused: None,
    }
}

fn now() -> Time {
    Time(Timestamp::from_second(1_800_000_000).unwrap())
}

fn ready(status: &TemplateStatus) -> (&str, &str) {
    let ready = status
        .desired
        .conditions
        .iter()
        .find(|c| c.type_ == status::READY)
        .unwrap();
    (ready.reason.as_str(), ready.message.as_str())
}

fn entry_names(configuration: &Configuration) -> BTreeSet<String> {
    configuration
        .configuration
        .webhooks
        .iter()
        .flatten()
        .map(|entry| entry.name.clone())
        .collect()
}

#[test]
fn the_statuses_call_not_served_exactly_the_templates_the_configuration_leaves_out() {
    let options = options();
    let templates = crate::webhook_config::tests::templates_with_large_selectors(120, 250);
    let world = world_of(&options, &templates);
    let configuration = world.configuration().unwrap();
    assert!(!configuration.left_out.is_empty(), "some must be left out");
    let entries = entry_names(&configuration);

    let statuses = world.statuses(&now());
    assert_eq!(statuses.len(), 120);
    let mut not_served = BTreeSet::new();
    for status in &statuses {
        let (reason, message) = ready(status);
        match reason {
            status::REASON_NOT_SERVED => {
                assert!(status.unserved);
                assert_eq!(status.problem(), Some(Problem::NotServed));
                not_served.insert(status.name.clone());
            }
            status::REASON_VALID => {
                // Its status names the entry that serves it, one the configuration has.
                let entry = message.rsplit(' ').next().unwrap();
                assert!(entries.contains(entry), "{}: {message}", status.name);
                assert_eq!(status.problem(), None);
            }
            other => panic!("{}: {other}", status.name),
        }
    }
    assert_eq!(not_served, configuration.left_out);
}

#[test]
fn nothing_is_configured_before_a_ca_or_before_every_template_was_listed() {
    let options = options();
    let templates = crate::webhook_config::tests::templates_with_large_selectors(120, 250);
    let mut world = world_of(&options, &templates);
    world.ca = None;
    assert!(world.configuration().is_none());
    // Nothing configured: no template is called not served.
    assert!(world.statuses(&now()).iter().all(|s| !s.unserved));

    world.ca = Some(CA.to_owned());
    world.synced = false;
    assert!(world.configuration().is_none());
}

#[test]
fn entries_skip_the_pods_the_policy_served_unless_the_api_server_refused_those_conditions() {
    let options = options();
    let world_templates = [template("agent", 1, "Fail", json!({}))];
    let mut world = world_of(&options, &world_templates);
    assert!(world.configuration().unwrap().skips.is_empty());

    let present = BTreeMap::from([("agent".to_owned(), "true".to_owned())]);
    world.policy = Some(Arc::new(PolicyState {
        policy: "sidecar-injector".into(),
        available: true,
        served: BTreeSet::from(["agent".to_owned()]),
        present: present.clone(),
        ..PolicyState::default()
    }));
    assert_eq!(world.configuration().unwrap().skips, present);

    // Refused: the entries go without them.
    world.skip_refused = Some(present.clone());
    assert!(world.configuration().unwrap().skips.is_empty());

    // A later policy's conditions are tried again.
    world.skip_refused = Some(BTreeMap::from([("agent".to_owned(), "false".to_owned())]));
    assert_eq!(world.configuration().unwrap().skips, present);
}

#[test]
fn the_policy_backend_configures_no_entry_and_names_the_policy_in_use() {
    let options = options();
    let templates = [template("agent", 1, "Fail", json!({}))];
    let mut world = world_of(&options, &templates);
    world.backend = Backend::Policy;
    let configuration = world.configuration().unwrap();
    assert!(entry_names(&configuration).is_empty());
    // Nothing is left out for want of room: there is no entry to make room for.
    assert!(configuration.left_out.is_empty());

    world.policy = Some(Arc::new(PolicyState {
        policy: "sidecar-injector".into(),
        available: true,
        served: BTreeSet::from(["agent".to_owned()]),
        ..PolicyState::default()
    }));
    let statuses = world.statuses(&now());
    let (reason, message) = ready(&statuses[0]);
    assert_eq!(reason, status::REASON_VALID);
    assert!(message.contains("sidecar-injector"), "{message}");
    assert!(
        statuses[0]
            .desired
            .conditions
            .iter()
            .any(|c| { c.type_ == status::POLICY_SERVED && c.status == "True" })
    );
}

#[test]
fn an_invalid_template_is_a_problem_and_a_required_one_keeps_its_last_valid_generation() {
    let options = options();
    let invalid_spec = json!({"containers": [{"name": "bad name!", "image": "x"}]});
    let mut world = world_of(
        &options,
        &[template("loose", 2, "Ignore", invalid_spec.clone())],
    );

    // A required template that was valid, then edited into an invalid one.
    let valid = template("strict", 1, "Fail", json!({}));
    let (in_force, _) = observe(valid, None);
    let in_force = Arc::new(in_force.unwrap());
    let (kept, observed): (_, Observed) =
        observe(template("strict", 2, "Fail", invalid_spec), Some(&in_force));
    assert!(kept.is_some());
    let mut registry = Registry::new();
    registry.apply(in_force.as_ref().clone());
    world.snapshot = registry.snapshot();
    world.templates.push(observed);

    let statuses = world.statuses(&now());
    let problems: Vec<(&str, &str)> = statuses
        .iter()
        .map(|s| {
            let kind = match s.problem() {
                Some(Problem::Invalid(_)) => "invalid",
                Some(Problem::InvalidKept(_, kept)) => {
                    assert_eq!(kept.generation, 1);
                    "kept"
                }
                Some(Problem::NotServed) => "not served",
                None => "none",
            };
            (s.name.as_str(), kind)
        })
        .collect();
    assert_eq!(problems, [("loose", "invalid"), ("strict", "kept")]);
    // Events are published once per generation: the generation observed, not the kept one.
    assert_eq!(statuses[1].generation(), 2);
    // Counts are for the generation in force; no census yet.
    assert_eq!(statuses[1].counts, Counts::Pending);
    assert_eq!(statuses[0].counts, Counts::NotInForce);
}
