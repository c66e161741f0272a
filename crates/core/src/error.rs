//! Validation errors, each tied to the field it is about.

use std::fmt;

/// One problem with one field of a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Where, in the dotted form `kubectl explain` uses: `spec.containers[0].name`.
    pub path: String,
    /// What is wrong, in words a template author can act on.
    pub message: String,
}

impl FieldError {
    /// An error about the field at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in one template. Never empty.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("template {template:?} is invalid: {}", join(.errors))]
pub struct ValidationErrors {
    /// The template's name (may be empty when the name itself is missing).
    pub template: String,
    /// The problems, in the order the fields appear.
    pub errors: Vec<FieldError>,
}

impl ValidationErrors {
    /// The messages one per line, as a status condition or an event shows them.
    pub fn messages(&self) -> Vec<String> {
        self.errors.iter().map(ToString::to_string).collect()
    }
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
