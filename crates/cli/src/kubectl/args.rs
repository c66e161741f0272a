//! The plugin's command line (`kubectl sidecar [flags] COMMAND`), apart from what runs it, so
//! that the binary's own parser (`crate::args`) takes it without depending on the commands.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::explain::{self, Target};
use crate::completion::CompletionArgs;

/// The file name that makes the binary the plugin: kubectl runs `kubectl-sidecar` for
/// `kubectl sidecar`.
pub const PLUGIN_FILE_NAME: &str = "kubectl-sidecar";

/// Whether the program was started as the plugin (`argv[0]` names `kubectl-sidecar`).
pub fn is_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == PLUGIN_FILE_NAME)
}

/// The command line of the binary started as `kubectl-sidecar`: the plugin's commands alone,
/// with kubectl's name for them in help and errors.
#[derive(clap::Parser)]
#[command(
    name = "kubectl-sidecar",
    bin_name = "kubectl sidecar",
    version,
    about = "The sidecar-injector kubectl plugin: template status, live explanations and plumbing checks"
)]
pub(crate) struct PluginCli {
    #[command(flatten)]
    pub(crate) args: KubectlArgs,
}

/// The command line of `kubectl sidecar`, for completion.
pub(crate) fn plugin_command() -> clap::Command {
    <PluginCli as clap::CommandFactory>::command()
}

/// The plugin's command line: `kubectl sidecar [flags] COMMAND`.
#[derive(clap::Args, Debug)]
pub struct KubectlArgs {
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) context: Option<String>,
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
    pub(crate) operator_namespace: String,
    #[command(subcommand)]
    pub(crate) command: PluginCommand,
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum PluginCommand {
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
pub(crate) struct StatusArgs {
    /// One template (default: every one).
    pub(crate) template: Option<String>,
    /// `table` for people, `json` for scripts.
    #[arg(long, short = 'o', value_enum, default_value_t = StatusOutput::Table)]
    pub(crate) output: StatusOutput,
}

/// How `status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StatusOutput {
    Table,
    Json,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ExplainArgs {
    /// KIND/NAME: pod, deployment, statefulset, daemonset, replicaset, job or cronjob.
    pub(crate) target: Target,
    /// The object's namespace (default: the context's).
    #[arg(long, short = 'n')]
    pub(crate) namespace: Option<String>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct CheckArgs {
    /// A Pod to check too (`NAME`, or `pod/NAME` in any form explain takes, such as
    /// `po/NAME`), in -n's namespace, else the context's.
    #[arg(value_parser = explain::pod_name)]
    pub(crate) pod: Option<String>,
    /// A namespace to check too (the Pod's, with a Pod).
    #[arg(long, short = 'n')]
    pub(crate) namespace: Option<String>,
    /// The chart's release name: its operator Deployment is found by it (named as the chart
    /// names it, else by its `app.kubernetes.io/instance` label), and the other objects' names
    /// are read from the Deployment's arguments; only when it cannot be read are they assumed
    /// from the release's name (`<release>-sidecar-injector`, or the release's name when it
    /// contains `sidecar-injector`).
    #[arg(long, default_value = "sidecar-injector", value_name = "NAME")]
    pub(crate) release: String,
    /// The chart's `fullnameOverride`, when it was set: the operator Deployment's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) fullname: Option<String>,
    /// `table` for people, `json` for scripts.
    #[arg(long, short = 'o', value_enum, default_value_t = StatusOutput::Table)]
    pub(crate) output: StatusOutput,
}
