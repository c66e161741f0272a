//! Loading SidecarTemplates from files and directories (for `render` and `serve`).

use std::path::{Path, PathBuf};

use injector_api::SidecarTemplate;
use injector_core::{CompiledTemplate, compile};
use serde::Deserialize;

use crate::documents::{Document, DocumentError, found_kinds, read_documents};

/// A template file that cannot be used. Each names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum TemplateFileError {
    /// The file cannot be read or parsed.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// A directory cannot be listed.
    #[error("{path}: cannot list the directory: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A document of kind SidecarTemplate does not have the shape of one.
    #[error("{path}: document {index}: not a valid SidecarTemplate: {message}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// The document's position in the file, from 1.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A template failed validation.
    #[error("{path}: {errors}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        errors: injector_core::ValidationErrors,
    },
    /// A template file holds no SidecarTemplate.
    #[error("{path}: no SidecarTemplate found{}", found_kinds(.kinds))]
    NoTemplate {
        /// The file.
        path: PathBuf,
        /// The kinds it does hold.
        kinds: Vec<String>,
    },
    /// Two files define a template of the same name.
    #[error("{path}: SidecarTemplate {name:?} is also defined in {first}")]
    Duplicate {
        /// The second file.
        path: PathBuf,
        /// The template's name.
        name: String,
        /// The first file.
        first: PathBuf,
    },
}

/// The YAML and JSON files under `dir`, recursively (as `kubectl apply -R`), sorted by path.
fn manifests_in(dir: &Path) -> Result<Vec<PathBuf>, TemplateFileError> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let listing =
            std::fs::read_dir(&current).map_err(|source| TemplateFileError::Directory {
                path: current.clone(),
                source,
            })?;
        for path in listing.filter_map(Result::ok).map(|entry| entry.path()) {
            if path.is_dir() {
                pending.push(path);
            } else if has_manifest_extension(&path) {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

fn has_manifest_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
}

/// Loads, validates and compiles every SidecarTemplate in `paths`. A directory contributes
/// the templates of the YAML and JSON files under it (files holding none are
/// skipped); a file named explicitly must hold at least one.
pub fn load_templates(paths: &[PathBuf]) -> Result<Vec<CompiledTemplate>, TemplateFileError> {
    let mut loaded = Loaded::default();
    for path in paths {
        if path.is_dir() {
            for file in manifests_in(path)? {
                loaded.load_file(&file, false)?;
            }
        } else {
            loaded.load_file(path, true)?;
        }
    }
    Ok(loaded.templates)
}

#[derive(Default)]
struct Loaded {
    templates: Vec<CompiledTemplate>,
    origins: Vec<(String, PathBuf)>,
}

impl Loaded {
    fn load_file(&mut self, path: &Path, required: bool) -> Result<(), TemplateFileError> {
        let documents = read_documents(path)?;
        let kinds: Vec<String> = documents.iter().map(Document::describe).collect();
        let before = self.templates.len();
        for document in documents
            .into_iter()
            .filter(|d| d.kind() == "SidecarTemplate")
        {
            let template = SidecarTemplate::deserialize(&document.value).map_err(|e| {
                TemplateFileError::Shape {
                    path: path.to_path_buf(),
                    index: document.index,
                    message: e.to_string(),
                }
            })?;
            let compiled = compile(&template).map_err(|errors| TemplateFileError::Invalid {
                path: path.to_path_buf(),
                errors,
            })?;
            if let Some((_, first)) = self.origins.iter().find(|(name, _)| name == &compiled.name) {
                return Err(TemplateFileError::Duplicate {
                    path: path.to_path_buf(),
                    name: compiled.name,
                    first: first.clone(),
                });
            }
            self.origins
                .push((compiled.name.clone(), path.to_path_buf()));
            self.templates.push(compiled);
        }
        if required && self.templates.len() == before {
            return Err(TemplateFileError::NoTemplate {
                path: path.to_path_buf(),
                kinds,
            });
        }
        Ok(())
    }
}
