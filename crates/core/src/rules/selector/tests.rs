use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn selector(json: serde_json::Value) -> Result<Selector, Vec<FieldError>> {
    let selector: LabelSelector = serde_json::from_value(json).unwrap();
    Selector::compile(Some(&selector), "spec.podSelector")
}

#[test]
fn selectors_asking_for_different_values_of_a_label_are_disjoint() {
    let team_a = selector(serde_json::json!({"matchLabels": {"team": "a"}})).unwrap();
    let disjoint = |json| team_a.disjoint(&selector(json).unwrap());
    assert!(disjoint(serde_json::json!({"matchLabels": {"team": "b"}})));
    assert!(disjoint(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["b", "c"]}]}
    )));
    assert!(disjoint(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}
    )));
    assert!(disjoint(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}
    )));
    assert!(!disjoint(
        serde_json::json!({"matchLabels": {"team": "a", "tier": "web"}})
    ));
    assert!(!disjoint(serde_json::json!({})));
    assert!(!disjoint(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}
    )));
    assert!(!disjoint(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "Exists"}]}
    )));
    // Both ways round, and with the terms on the other side.
    let exists = selector(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "Exists"}]}
    ))
    .unwrap();
    let absent = selector(serde_json::json!(
        {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}
    ))
    .unwrap();
    assert!(exists.disjoint(&absent) && absent.disjoint(&exists));
    assert!(!exists.disjoint(&exists));
}

#[test]
fn empty_selector_matches_everything() {
    let empty = Selector::compile(None, "x").unwrap();
    assert!(empty.is_empty());
    assert!(empty.matches(&labels(&[])));
    assert!(empty.matches(&labels(&[("a", "b")])));
    assert_eq!(selector(serde_json::json!({})).unwrap(), empty);
}

#[test]
fn match_labels_and_every_operator() {
    let s = selector(serde_json::json!({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "env", "operator": "NotIn", "values": ["prod"]},
            {"key": "team", "operator": "Exists"},
            {"key": "legacy", "operator": "DoesNotExist"},
        ]
    }))
    .unwrap();
    let good = labels(&[("app", "web"), ("tier", "a"), ("team", "x")]);
    assert!(s.matches(&good));
    let mut wrong_app = good.clone();
    wrong_app.insert("app".into(), "db".into());
    assert!(!s.matches(&wrong_app));
    let mut wrong_tier = good.clone();
    wrong_tier.insert("tier".into(), "c".into());
    assert!(!s.matches(&wrong_tier));
    let mut prod = good.clone();
    prod.insert("env".into(), "prod".into());
    assert!(!s.matches(&prod));
    let mut no_team = good.clone();
    no_team.remove("team");
    assert!(!s.matches(&no_team));
    let mut legacy = good.clone();
    legacy.insert("legacy".into(), "".into());
    assert!(!s.matches(&legacy));
    assert_eq!(
        s.to_string(),
        "app=web,env notin (prod),!legacy,team,tier in (a,b)"
    );
}

#[test]
fn canonical_form_ignores_order() {
    let a = selector(serde_json::json!({"matchExpressions": [
        {"key": "b", "operator": "In", "values": ["2", "1"]},
        {"key": "a", "operator": "Exists"}]}))
    .unwrap();
    let b = selector(serde_json::json!({"matchExpressions": [
        {"key": "a", "operator": "Exists"},
        {"key": "b", "operator": "In", "values": ["1", "2"]}]}))
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_label_selector(), b.to_label_selector());
}

#[test]
fn round_trips_through_api_form() {
    let s = selector(serde_json::json!({"matchLabels": {"a": "b"},
        "matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["d"]}]}))
    .unwrap();
    assert_eq!(
        Selector::compile(Some(&s.to_label_selector()), "x").unwrap(),
        s
    );
}

#[test]
fn every_error_is_reported_with_its_path() {
    let errors = selector(serde_json::json!({
        "matchLabels": {"bad key!": "ok", "ok": "bad value!"},
        "matchExpressions": [
            {"key": "a", "operator": "Near", "values": ["x"]},
            {"key": "b", "operator": "In"},
            {"key": "c", "operator": "Exists", "values": ["x"]},
        ]
    }))
    .unwrap_err();
    let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.podSelector.matchLabels[\"bad key!\"]",
            "spec.podSelector.matchLabels[\"ok\"]",
            "spec.podSelector.matchExpressions[0].operator",
            "spec.podSelector.matchExpressions[1].values",
            "spec.podSelector.matchExpressions[2].values",
        ]
    );
}
