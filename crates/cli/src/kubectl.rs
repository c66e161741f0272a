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

pub mod check;
pub mod cluster;
pub mod explain;
pub mod plumbing;
pub mod status;
mod table;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use injector_core::in_force::from_listing;

use self::cluster::{ClusterError, Connection};
use self::explain::{Namespace, Target};
use crate::completion::{self, CompletionArgs};

/// The file name that makes the binary the plugin: kubectl runs `kubectl-sidecar` for
/// `kubectl sidecar`.
pub const PLUGIN_FILE_NAME: &str = "kubectl-sidecar";

/// Whether the program was started as the plugin (`argv[0]` names `kubectl-sidecar`).
pub fn is_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == PLUGIN_FILE_NAME)
}

/// The plugin's command line: `kubectl sidecar [flags] COMMAND`.
#[derive(clap::Args, Debug)]
pub struct KubectlArgs {
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// The operator's namespace: its Pods are never injected, and count only for what they
    /// carry (as the operator counts them).
    /// The chart's release namespace, as `check` names it (`--release-namespace`).
    #[arg(
        long,
        global = true,
        default_value = "sidecar-injector",
        value_name = "NAMESPACE",
        visible_alias = "release-namespace"
    )]
    operator_namespace: String,
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(clap::Subcommand, Debug)]
enum PluginCommand {
    /// Where each SidecarTemplate's Pods stand (injected, current, stale, missing), its
    /// rollout, and the workloads behind its stale and missing Pods.
    Status(StatusArgs),
    /// Replay the injection decision for a live object: what it carries, what it would get
    /// now, and why each template applies or not.
    Explain(ExplainArgs),
    /// Check the live plumbing, link by link (operator, leader, webhook configuration,
    /// caBundle, endpoints, NetworkPolicy, policy backend, templates), and for a Pod or a
    /// namespace which templates select it and whether its Pods carry them.
    ///
    /// Exit status: 0 when no link is broken (warnings and unknown links included), 4 when a
    /// link is broken, 1 on an error (the Pod or namespace not found, the cluster not
    /// reachable), 2 on bad arguments.
    Check(CheckArgs),
    /// Print the shell completion script of kubectl-sidecar, run directly.
    ///
    /// `kubectl sidecar <TAB>` needs no script: kubectl 1.26+ completes it by running
    /// kubectl_complete-sidecar from PATH, a link to this binary under that name (`just
    /// install-plugin` makes it beside kubectl-sidecar).
    Completion(CompletionArgs),
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// One template (default: every one).
    template: Option<String>,
    /// `table` for people, `json` for scripts.
    #[arg(long, short = 'o', value_enum, default_value_t = StatusOutput::Table)]
    output: StatusOutput,
}

/// How `status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StatusOutput {
    Table,
    Json,
}

#[derive(clap::Args, Debug)]
struct ExplainArgs {
    /// KIND/NAME: pod, deployment, statefulset, daemonset, replicaset, job or cronjob.
    target: Target,
    /// The object's namespace (default: the context's).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// A Pod to check too (`NAME`, or `pod/NAME` in any form explain takes, such as
    /// `po/NAME`), in -n's namespace, else the context's.
    #[arg(value_parser = explain::pod_name)]
    pod: Option<String>,
    /// A namespace to check too (the Pod's, with a Pod).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// The chart's release name: its operator Deployment is found by it (named as the chart
    /// names it, else by its `app.kubernetes.io/instance` label), and the other objects' names
    /// are read from the Deployment's arguments; only when it cannot be read are they assumed
    /// from the release's name (`<release>-sidecar-injector`, or the release's name when it
    /// contains `sidecar-injector`).
    #[arg(long, default_value = "sidecar-injector", value_name = "NAME")]
    release: String,
    /// The chart's `fullnameOverride`, when it was set: the operator Deployment's name.
    #[arg(long, value_name = "NAME")]
    fullname: Option<String>,
    /// `table` for people, `json` for scripts.
    #[arg(long, short = 'o', value_enum, default_value_t = StatusOutput::Table)]
    output: StatusOutput,
}

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
        match self.command {
            PluginCommand::Status(args) => {
                let (client, _) = cluster::connect(&connection).await?;
                let templates = cluster::templates(&client, args.template.as_deref()).await?;
                let (in_force, observed) = from_listing(templates.iter().cloned());
                let pods = cluster::pods(&client).await?;
                let namespaces = cluster::namespaces(&client).await?;
                let live = status::count(&in_force, &pods, &namespaces, &self.operator_namespace);
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
            PluginCommand::Explain(args) => {
                let (client, default_namespace) = cluster::connect(&connection).await?;
                let namespace = args.namespace.unwrap_or(default_namespace);
                let object = cluster::object(&client, &args.target, &namespace).await?;
                let labels = cluster::namespace_labels(&client, &namespace).await?;
                let templates = cluster::templates(&client, None).await?;
                let (in_force, _) = from_listing(templates);
                let namespace = Namespace {
                    name: &namespace,
                    labels: (namespace != self.operator_namespace).then_some(&labels),
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
            PluginCommand::Check(args) => {
                let (client, default_namespace) = cluster::connect(&connection).await?;
                // Assumed until the operator's Deployment says what it runs with.
                let assumed = check::Names::of_release(
                    &self.operator_namespace,
                    &args.release,
                    args.fullname.as_deref(),
                );
                let scope = match (args.pod, args.namespace) {
                    (Some(name), namespace) => plumbing::Scope::Pod {
                        namespace: namespace.unwrap_or(default_namespace),
                        name,
                    },
                    (None, Some(namespace)) => plumbing::Scope::Namespace(namespace),
                    (None, None) => plumbing::Scope::Cluster,
                };
                let (names, observed) =
                    plumbing::observe(&client, &args.release, assumed, &scope).await;
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
            // No cluster: the script only.
            PluginCommand::Completion(args) => {
                Ok(
                    completion::script(args.shell, crate::args::plugin_command(), PLUGIN_FILE_NAME)
                        .into(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests;
