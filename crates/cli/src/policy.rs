//! `sidecar-injector policy`: the MutatingAdmissionPolicy and binding the templates in some
//! files compile to, as YAML, and on standard error the templates a policy cannot serve.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use injector_core::policy::{PolicyOptions, compile_policy};

use crate::templates::{TemplateFileError, load_templates};

/// What to compile.
#[derive(Debug)]
pub struct PolicyRequest {
    /// Template files or directories.
    pub template_files: Vec<PathBuf>,
    /// The name of the policy and its binding, and the operator's namespace (never injected).
    pub options: PolicyOptions,
}

/// The YAML (empty when no template can be served by a policy) and the report.
#[derive(Debug)]
pub struct PolicyOutput {
    /// The policy and its binding, two YAML documents.
    pub stdout: String,
    /// One line per template: which backend serves it and why.
    pub stderr: String,
}

/// Why `policy` failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A template file cannot be used.
    #[error(transparent)]
    Templates(#[from] TemplateFileError),
    /// The YAML cannot be written.
    #[error("cannot write the policy as YAML: {0}")]
    Yaml(#[from] injector_api::yaml::YamlError),
}

/// Compiles the templates of `request` into one policy.
pub fn policy(request: &PolicyRequest) -> Result<PolicyOutput, PolicyError> {
    let templates: Vec<Arc<_>> = load_templates(&request.template_files)?
        .into_iter()
        .map(Arc::new)
        .collect();
    let compiled = compile_policy(&templates, &request.options);
    let mut stdout = String::new();
    if let Some(policy) = &compiled.policy {
        stdout.push_str(&injector_api::yaml::to_string(policy)?);
        for binding in &compiled.bindings {
            stdout.push_str("---\n");
            stdout.push_str(&injector_api::yaml::to_string(binding)?);
        }
    }
    let mut stderr = String::new();
    for template in &compiled.served {
        writeln!(stderr, "{}: served by the policy", template.name).ok();
    }
    for (template, why) in &compiled.webhook_only {
        writeln!(stderr, "{}: webhook only: {why}", template.name).ok();
    }
    Ok(PolicyOutput { stdout, stderr })
}
