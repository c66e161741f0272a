//! Label selectors, validated once and matched many times: in Rust ([`Selector::matches`]) by
//! `plan` and the census, and as CEL (`Selector::cel`) by the compiled policy and its guard.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::cel::{cel_list, cel_string};
use crate::error::FieldError;
use crate::labels::Labels;
use crate::syntax::{is_label_value, is_qualified_name};

/// A set-based requirement's operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Operator {
    fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Requirement {
    key: String,
    operator: Operator,
    values: BTreeSet<String>,
}

impl Requirement {
    fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        let value = labels.label(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A validated label selector in canonical form: equal selectors compare equal however their
/// terms were ordered, which is what lets templates share a webhook entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    match_labels: BTreeMap<String, String>,
    requirements: BTreeSet<Requirement>,
}

impl Selector {
    /// Validates `selector` (at field `path`), collecting every problem.
    pub fn compile(selector: Option<&LabelSelector>, path: &str) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut compiled = Selector::default();
        let Some(selector) = selector else {
            return Ok(compiled);
        };
        for (key, value) in selector.match_labels.iter().flatten() {
            let at = format!("{path}.matchLabels[{key:?}]");
            check_key(key, &at, &mut errors);
            if !is_label_value(value) {
                errors.push(FieldError::new(
                    at,
                    format!("{value:?} is not a valid label value"),
                ));
            }
            compiled.match_labels.insert(key.clone(), value.clone());
        }
        for (index, requirement) in selector.match_expressions.iter().flatten().enumerate() {
            let at = format!("{path}.matchExpressions[{index}]");
            if let Some(requirement) = compile_requirement(requirement, &at, &mut errors) {
                compiled.requirements.insert(requirement);
            }
        }
        if errors.is_empty() {
            Ok(compiled)
        } else {
            Err(errors)
        }
    }

    /// Whether the labels satisfy every term. The empty selector matches everything.
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.label(key) == Some(value.as_str()))
            && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// [`Selector::matches`] as a CEL condition over `labels` (a map expression); `true` when
    /// empty. Terms in canonical order, each the API server's reading of a selector term.
    pub(crate) fn cel(&self, labels: &str) -> String {
        let mut terms = Vec::new();
        for (key, value) in &self.match_labels {
            let key = cel_string(key);
            terms.push(format!(
                "({key} in {labels} && {labels}[{key}] == {})",
                cel_string(value)
            ));
        }
        for requirement in &self.requirements {
            let key = cel_string(&requirement.key);
            let values = cel_list(requirement.values.iter().map(String::as_str));
            terms.push(match requirement.operator {
                Operator::In => format!("({key} in {labels} && {labels}[{key}] in {values})"),
                Operator::NotIn => format!("!({key} in {labels} && {labels}[{key}] in {values})"),
                Operator::Exists => format!("{key} in {labels}"),
                Operator::DoesNotExist => format!("!({key} in {labels})"),
            });
        }
        if terms.is_empty() {
            "true".to_owned()
        } else {
            terms.join(" && ")
        }
    }

    /// Whether the selector has no terms (and so selects everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.requirements.is_empty()
    }

    /// The label keys its terms read.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.match_labels
            .keys()
            .chain(self.requirements.iter().map(|r| &r.key))
            .map(String::as_str)
    }

    /// Whether no set of labels matches both selectors, as far as the terms on one label tell:
    /// they ask for different values of it, or one for it and the other for its absence.
    pub fn disjoint(&self, other: &Selector) -> bool {
        self.keys()
            .chain(other.keys())
            .any(|key| self.on(key).excludes(&other.on(key)))
    }

    /// What the terms on `key` ask of it.
    fn on<'s>(&'s self, key: &str) -> OnKey<'s> {
        let mut on = OnKey::default();
        let mut narrow = |set: BTreeSet<&'s str>| {
            on.values = Some(match on.values.take() {
                Some(current) => current.intersection(&set).copied().collect(),
                None => set,
            });
        };
        if let Some(value) = self.match_labels.get(key) {
            narrow(BTreeSet::from([value.as_str()]));
        }
        for requirement in self.requirements.iter().filter(|r| r.key == key) {
            let values = requirement.values.iter().map(String::as_str);
            match requirement.operator {
                Operator::In => narrow(values.collect()),
                Operator::NotIn => on.excluded.extend(values),
                Operator::Exists => on.present = true,
                Operator::DoesNotExist => on.absent = true,
            }
        }
        on.present |= on.values.is_some();
        on
    }

    /// The selector in API form, terms in canonical order.
    pub fn to_label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: (!self.match_labels.is_empty()).then(|| self.match_labels.clone()),
            match_expressions: (!self.requirements.is_empty()).then(|| {
                self.requirements
                    .iter()
                    .map(|r| LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: r.operator.as_str().to_owned(),
                        values: match r.operator {
                            Operator::In | Operator::NotIn => {
                                Some(r.values.iter().cloned().collect())
                            }
                            Operator::Exists | Operator::DoesNotExist => None,
                        },
                    })
                    .collect()
            }),
        }
    }
}

/// What a selector's terms ask of one label.
#[derive(Default)]
struct OnKey<'a> {
    /// The values it may have (`None`: any).
    values: Option<BTreeSet<&'a str>>,
    /// The values it may not have.
    excluded: BTreeSet<&'a str>,
    /// Whether it must be there.
    present: bool,
    /// Whether it must not be there.
    absent: bool,
}

impl OnKey<'_> {
    /// Whether no value (or absence) of the label satisfies both.
    fn excludes(&self, other: &OnKey<'_>) -> bool {
        if (self.absent && other.present) || (other.absent && self.present) {
            return true;
        }
        match (&self.values, &other.values) {
            (Some(ours), Some(theirs)) => !ours.iter().any(|v| {
                theirs.contains(v) && !self.excluded.contains(v) && !other.excluded.contains(v)
            }),
            (Some(ours), None) => ours.iter().all(|v| other.excluded.contains(v)),
            (None, Some(theirs)) => theirs.iter().all(|v| self.excluded.contains(v)),
            (None, None) => false,
        }
    }
}

impl std::fmt::Display for Selector {
    /// The `kubectl get -l` form: `app=web,tier in (a,b),!legacy`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("<everything>");
        }
        let mut terms: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for r in &self.requirements {
            let values = r.values.iter().cloned().collect::<Vec<_>>().join(",");
            terms.push(match r.operator {
                Operator::In => format!("{} in ({values})", r.key),
                Operator::NotIn => format!("{} notin ({values})", r.key),
                Operator::Exists => r.key.clone(),
                Operator::DoesNotExist => format!("!{}", r.key),
            });
        }
        f.write_str(&terms.join(","))
    }
}

fn check_key(key: &str, path: &str, errors: &mut Vec<FieldError>) {
    if !is_qualified_name(key) {
        errors.push(FieldError::new(
            path,
            format!("{key:?} is not a valid label key"),
        ));
    }
}

fn compile_requirement(
    requirement: &LabelSelectorRequirement,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<Requirement> {
    let before = errors.len();
    check_key(&requirement.key, &format!("{path}.key"), errors);
    let operator = match requirement.operator.as_str() {
        "In" => Some(Operator::In),
        "NotIn" => Some(Operator::NotIn),
        "Exists" => Some(Operator::Exists),
        "DoesNotExist" => Some(Operator::DoesNotExist),
        other => {
            errors.push(FieldError::new(
                format!("{path}.operator"),
                format!("unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"),
            ));
            None
        }
    };
    let values: BTreeSet<String> = requirement.values.iter().flatten().cloned().collect();
    for value in &values {
        if !is_label_value(value) {
            errors.push(FieldError::new(
                format!("{path}.values"),
                format!("{value:?} is not a valid label value"),
            ));
        }
    }
    match operator {
        Some(Operator::In | Operator::NotIn) if values.is_empty() => errors.push(FieldError::new(
            format!("{path}.values"),
            format!("must not be empty for operator {}", requirement.operator),
        )),
        Some(Operator::Exists | Operator::DoesNotExist) if !values.is_empty() => {
            errors.push(FieldError::new(
                format!("{path}.values"),
                format!("must be empty for operator {}", requirement.operator),
            ))
        }
        _ => {}
    }
    let operator = operator?;
    (errors.len() == before).then(|| Requirement {
        key: requirement.key.clone(),
        operator,
        values,
    })
}

#[cfg(test)]
mod tests;
