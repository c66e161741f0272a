#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

use super::*;

/// A template `name` at `generation` adding a container of `image` (none: invalid), required
/// or not, with `last_valid` (generation, image) in its status.
fn template(
    name: &str,
    generation: i64,
    image: Option<&str>,
    required: bool,
    last_valid: Option<(i64, &str)>,
) -> SidecarTemplate {
    let spec = |image: Option<&str>| {
        json!({
            "failurePolicy": if required { "Fail" } else { "Ignore" },
            "namespaceSelector": {"matchLabels": {"team": "shop"}},
            "containers": [{"name": "agent", "image": image.unwrap_or("")}],
        })
    };
    let status = last_valid.map(|(generation, image)| {
        json!({"lastValid": {"generation": generation, "spec": spec(Some(image))}})
    });
    serde_json::from_value(json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": generation},
        "spec": spec(image),
        "status": status,
    }))
    .unwrap()
}

fn in_force_generations(snapshot: &Snapshot) -> Vec<(&str, i64)> {
    snapshot
        .templates()
        .iter()
        .map(|t| (t.name.as_str(), t.generation))
        .collect()
}

#[test]
fn a_listing_puts_valid_templates_and_kept_generations_in_force() {
    let (snapshot, observed) = from_listing([
        template("valid", 3, Some("agent:3"), false, None),
        // Invalid and required: the generation its status records stays in force.
        template("kept", 5, None, true, Some((4, "agent:4"))),
        // Invalid and best-effort: nothing stays.
        template("dropped", 2, None, false, Some((1, "agent:1"))),
        // Invalid and required, but no valid generation ever recorded.
        template("never", 1, None, true, None),
    ]);
    assert_eq!(in_force_generations(&snapshot), [("kept", 4), ("valid", 3)]);
    let generations: Vec<(&str, Option<i64>)> = observed
        .iter()
        .map(|(name, o)| (name.as_str(), o.generation_in_force()))
        .collect();
    assert_eq!(
        generations,
        [
            ("dropped", None),
            ("kept", Some(4)),
            ("never", None),
            ("valid", Some(3))
        ]
    );
    let kept = observed["kept"].kept.as_ref().unwrap();
    assert_eq!(kept.generation, 4);
    assert_eq!(Some(&kept.group), snapshot.get("kept").map(|t| &t.group_id));
    assert!(observed["kept"].outcome.is_err());
}

#[test]
fn the_generation_in_force_is_kept_over_the_one_recorded() {
    let (first, _) = from_listing([template("kept", 4, Some("agent:4"), true, None)]);
    // Invalid now, with an older generation recorded: the one in force stays.
    let (compiled, observed) = listed(
        [template("kept", 5, None, true, Some((2, "agent:2")))],
        &first,
    );
    assert_eq!(compiled.len(), 1);
    assert_eq!(compiled[0].generation, 4);
    assert_eq!(observed["kept"].generation_in_force(), Some(4));
}

#[test]
fn a_valid_template_is_observed_as_itself() {
    let (in_force, observed) = observe(template("a", 7, Some("agent:7"), true, None), None);
    let in_force = in_force.unwrap();
    assert_eq!(in_force.generation, 7);
    assert_eq!(observed.outcome.as_ref().ok(), Some(&in_force.group_id));
    assert_eq!(observed.kept, None);
    assert_eq!(observed.generation_in_force(), Some(7));
}
