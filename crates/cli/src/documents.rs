//! Reading Kubernetes objects from files: multi-document YAML, JSON, and `List`s.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// One object read from a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// Its position among the file's non-empty documents, from 1 (items of a `List` share the
    /// List's).
    pub index: usize,
    /// The object.
    pub value: Value,
}

impl Document {
    /// `kind`, or empty.
    pub fn kind(&self) -> &str {
        self.value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `Kind/name` (or `Kind/generateName…`) for messages.
    pub fn describe(&self) -> String {
        let metadata = self.value.get("metadata");
        let field = |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str);
        let kind = match self.kind() {
            "" => "<no kind>",
            kind => kind,
        };
        match (field("name"), field("generateName")) {
            (Some(name), _) => format!("{kind}/{name}"),
            (None, Some(prefix)) => format!("{kind}/{prefix}…"),
            (None, None) => kind.to_owned(),
        }
    }
}

/// The tail of a "found nothing usable" message: the objects (`Document::describe`) a file
/// does hold, so the reader sees what was there instead.
pub(crate) fn found_kinds(kinds: &[String]) -> String {
    if kinds.is_empty() {
        " (the file holds no object)".to_owned()
    } else {
        format!(" (found {})", kinds.join(", "))
    }
}

/// A file that cannot be read as Kubernetes objects.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The file cannot be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid YAML or JSON.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said, with the position.
        message: String,
    },
    /// A document is not an object (a mapping) with a kind.
    #[error(
        "{path}: document {index} is not a Kubernetes object (a mapping with apiVersion and kind)"
    )]
    NotAnObject {
        /// The file.
        path: PathBuf,
        /// The document's position, from 1.
        index: usize,
    },
}

/// How kubectl reads YAML (go-yaml, YAML 1.1 scalars), as far as the library goes: a bare
/// `yes`/`no`/`on`/`off` is a boolean and `0755` an octal number, so a file that kubectl
/// would send with a boolean where a string belongs is refused here too, not rendered as if
/// it were fine.
fn kubectl_yaml() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: false,
        legacy_octal_numbers: true,
    }
}

/// Reads every object in `path`: YAML (any number of `---`-separated documents) or JSON; a
/// `kind: List` contributes its items. Empty documents are skipped (and not counted).
pub fn read_documents(path: &Path) -> Result<Vec<Document>, DocumentError> {
    let text = std::fs::read_to_string(path).map_err(|source| DocumentError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse_error = |message: String| DocumentError::Parse {
        path: path.to_path_buf(),
        message,
    };
    let values: Vec<Value> = if text.trim_start().starts_with(['{', '[']) {
        let value: Value =
            serde_json::from_str(&text).map_err(|e| parse_error(format!("invalid JSON: {e}")))?;
        match value {
            Value::Array(items) => items,
            value => vec![value],
        }
    } else {
        serde_saphyr::from_multiple_with_options(&text, kubectl_yaml())
            .map_err(|e| parse_error(format!("invalid YAML: {e}")))?
    };
    let mut documents = Vec::new();
    for (position, value) in values.into_iter().enumerate() {
        let index = position + 1;
        match value {
            Value::Null => {}
            Value::Object(ref object)
                if object.get("kind").and_then(Value::as_str) == Some("List") =>
            {
                let items = object
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for item in items {
                    if !item.is_object() {
                        return Err(DocumentError::NotAnObject {
                            path: path.to_path_buf(),
                            index,
                        });
                    }
                    documents.push(Document { index, value: item });
                }
            }
            Value::Object(_) => documents.push(Document { index, value }),
            _ => {
                return Err(DocumentError::NotAnObject {
                    path: path.to_path_buf(),
                    index,
                });
            }
        }
    }
    Ok(documents)
}
