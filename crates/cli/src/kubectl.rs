//! `kubectl sidecar`: the binary as a kubectl plugin. Installed as `kubectl-sidecar` on the
//! `PATH` (a copy or a symbolic link), kubectl runs it for `kubectl sidecar …`, and its
//! arguments are the plugin's; `sidecar-injector kubectl …` takes the same commands.
//!
//! `status` shows where each template's Pods stand and the workloads behind the stale and
//! missing ones; `explain` replays the decision for a live object; `check` judges each link of
//! the live plumbing (operator, leader, webhook configuration, caBundle, endpoints,
//! NetworkPolicy, policy backend, templates, and a namespace's or Pod's selection). They read
//! the cluster through the usual kubeconfig ([`cluster`], [`plumbing`]) and decide with the
//! operator's own code ([`status`], [`explain`], [`check`]); none writes anything.

pub mod args;
pub mod check;
pub mod cluster;
pub mod explain;
pub mod plumbing;
pub mod status;
mod table;

use injector_core::registry::in_force::from_listing;

pub(crate) use self::args::plugin_command;
use self::args::{CheckArgs, ExplainArgs, PluginCommand, StatusArgs, StatusOutput};
pub use self::args::{KubectlArgs, PLUGIN_FILE_NAME, is_plugin};
use self::cluster::{ClusterError, Connection};
use self::explain::Namespace;
use crate::completion;

/// What a plugin command prints, and whether it found something broken (exit status 4).
#[derive(Debug)]
pub struct PluginOutput {
    /// Standard output.
    pub text: String,
    /// A link `check` judged is broken.
    pub broken: bool,
}

impl From<String> for PluginOutput {
    fn from(text: String) -> Self {
        PluginOutput {
            text,
            broken: false,
        }
    }
}

/// Why a plugin command failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// Talking to the cluster failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The object cannot be planned.
    #[error("{object}: {message}")]
    Plan {
        /// `kind/name`.
        object: String,
        /// What is wrong.
        message: String,
    },
    /// The JSON output cannot be written.
    #[error("cannot print JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl KubectlArgs {
    /// Runs the command; returns what to print.
    pub async fn execute(self) -> Result<PluginOutput, PluginError> {
        let connection = Connection {
            kubeconfig: self.kubeconfig,
            context: self.context,
        };
        let operator_namespace = &self.operator_namespace;
        match self.command {
            PluginCommand::Status(args) => run_status(&connection, args, operator_namespace).await,
            PluginCommand::Explain(args) => {
                run_explain(&connection, args, operator_namespace).await
            }
            PluginCommand::Check(args) => run_check(&connection, args, operator_namespace).await,
            // No cluster: the script only.
            PluginCommand::Completion(args) => {
                Ok(completion::script(args.shell, plugin_command(), PLUGIN_FILE_NAME).into())
            }
        }
    }
}

/// `status`: where the Pods stand with each template (or `args.template`), and the
/// workloads behind the stale and missing ones.
async fn run_status(
    connection: &Connection,
    args: StatusArgs,
    operator_namespace: &str,
) -> Result<PluginOutput, PluginError> {
    let (client, _) = cluster::connect(connection).await?;
    let templates = cluster::templates(&client, args.template.as_deref()).await?;
    let (in_force, observed) = from_listing(templates.iter().cloned());
    let pods = cluster::pods(&client).await?;
    let namespaces = cluster::namespaces(&client).await?;
    let live = status::count(&in_force, &pods, &namespaces, operator_namespace);
    let owners = cluster::owners(&client, status::owner_lookups(&live)).await?;
    let workloads = status::workload_lookups(&live, &owners);
    let verdicts = cluster::verdicts(&client, workloads).await?;
    let lookups = status::Lookups { owners, verdicts };
    let report = status::report(&templates, &observed, &live, &lookups);
    Ok(match args.output {
        StatusOutput::Table => status::to_table(&report),
        StatusOutput::Json => status::to_json(&report)?,
    }
    .into())
}

/// `explain`: the decision replayed for a live object, with the templates in force.
async fn run_explain(
    connection: &Connection,
    args: ExplainArgs,
    operator_namespace: &str,
) -> Result<PluginOutput, PluginError> {
    let (client, default_namespace) = cluster::connect(connection).await?;
    let namespace = args.namespace.unwrap_or(default_namespace);
    let object = cluster::object(&client, &args.target, &namespace).await?;
    let labels = cluster::namespace_labels(&client, &namespace).await?;
    let templates = cluster::templates(&client, None).await?;
    let (in_force, _) = from_listing(templates);
    let namespace = Namespace {
        name: &namespace,
        labels: (namespace != operator_namespace).then_some(&labels),
    };
    explain::explain(object, &namespace, in_force.templates())
        .map(PluginOutput::from)
        .map_err(|message| PluginError::Plan {
            object: format!(
                "{}/{}",
                args.target.kind.as_str().to_lowercase(),
                args.target.name
            ),
            message,
        })
}

/// `check`: each link of the live plumbing judged, for the cluster, a namespace or a Pod.
async fn run_check(
    connection: &Connection,
    args: CheckArgs,
    operator_namespace: &str,
) -> Result<PluginOutput, PluginError> {
    let (client, default_namespace) = cluster::connect(connection).await?;
    // Assumed until the operator's Deployment says what it runs with.
    let assumed =
        check::Names::of_release(operator_namespace, &args.release, args.fullname.as_deref());
    let scope = match (args.pod, args.namespace) {
        (Some(name), namespace) => plumbing::Scope::Pod {
            namespace: namespace.unwrap_or(default_namespace),
            name,
        },
        (None, Some(namespace)) => plumbing::Scope::Namespace(namespace),
        (None, None) => plumbing::Scope::Cluster,
    };
    let (names, observed) = plumbing::observe(&client, &args.release, assumed, &scope).await;
    if let Some(what) = check::absent_target(&observed) {
        return Err(ClusterError::NotFound(what).into());
    }
    let report = check::judge(&observed, &names, k8s_openapi::jiff::Timestamp::now());
    let text = match args.output {
        StatusOutput::Table => check::to_table(&report),
        StatusOutput::Json => check::to_json(&report)?,
    };
    Ok(PluginOutput {
        text,
        broken: report.broken,
    })
}

#[cfg(test)]
mod tests;
