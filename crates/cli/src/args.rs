//! The command line: every flag, its environment variable, default and help text, and how
//! each command's flags become the options its module takes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory as _, Parser, Subcommand};
use injector_controller::certs::Lifetimes;
use injector_controller::policy_backend::Backend;

use crate::completion::{CompletionArgs, is_plugin_completer};
use crate::kubectl::args::{KubectlArgs, PluginCli, is_plugin};
use crate::policy::PolicyRequest;
use crate::render::{OutputFormat, RenderRequest, parse_labels};
use crate::run::RunOptions;
use crate::serve::ServeOptions;

/// The parsed command line of `sidecar-injector`.
#[derive(Parser)]
#[command(
    name = "sidecar-injector",
    version,
    about = "Injects sidecars into Pods from SidecarTemplate custom resources"
)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Dry-run the injection offline: print a Pod or workload as the injector would mutate it.
    Render(RenderArgs),
    /// Serve the webhook from template files, with no cluster (POST /mutate, /mutate/<group>).
    Serve(ServeArgs),
    /// Run the controller and the webhook against a cluster (in-cluster, or from a kubeconfig).
    Run(Box<RunArgs>),
    /// Print the MutatingAdmissionPolicy (Kubernetes 1.36+) and binding that template files
    /// compile to; standard error says which templates stay on the webhook and why.
    Policy(PolicyArgs),
    /// Print the SidecarTemplate CustomResourceDefinition as YAML.
    Crd,
    /// The kubectl plugin's commands (`kubectl sidecar …` when installed as kubectl-sidecar).
    Kubectl(KubectlArgs),
    /// Print the shell completion script of sidecar-injector, such as `source
    /// <(sidecar-injector completion bash)`.
    Completion(CompletionArgs),
    /// Started as `kubectl_complete-sidecar`: complete these arguments of `kubectl sidecar`.
    #[command(skip)]
    CompletePlugin(Vec<String>),
}

impl Cli {
    /// Parses `argv`: as the kubectl plugin when its first item (the program) is named
    /// `kubectl-sidecar`, else as `sidecar-injector`. The error prints clap's message and exit
    /// status (help and version too).
    pub fn try_parse_argv<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        if argv.first().is_some_and(|argv0| is_plugin_completer(argv0)) {
            // kubectl's words, not flags of ours: never an error.
            let words = argv.iter().skip(1);
            return Ok(Cli {
                command: Command::CompletePlugin(
                    words.map(|w| w.to_string_lossy().into_owned()).collect(),
                ),
            });
        }
        if argv.first().is_some_and(|argv0| is_plugin(argv0)) {
            let plugin = PluginCli::try_parse_from(argv)?;
            return Ok(Cli {
                command: Command::Kubectl(plugin.args),
            });
        }
        Cli::try_parse_from(argv)
    }
}

/// The command line of `sidecar-injector`, for completion.
pub(crate) fn command() -> clap::Command {
    Cli::command()
}

#[derive(clap::Args)]
pub(crate) struct RenderArgs {
    /// A file of SidecarTemplates (YAML or JSON; other kinds in it are ignored). Repeatable.
    #[arg(long = "template", short = 't', required = true, value_name = "FILE")]
    templates: Vec<PathBuf>,
    /// A file holding a Pod, or a Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob.
    #[arg(long, short = 'p', value_name = "FILE")]
    pod: PathBuf,
    /// The namespace for objects that name none.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// The namespace's labels, as k=v,k2=v2 (kubernetes.io/metadata.name is always set).
    #[arg(long, value_name = "LABELS", value_parser = parse_labels)]
    namespace_labels: Option<BTreeMap<String, String>>,
    /// Print the mutated object as YAML (pod) or the JSON patch (patch).
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Pod)]
    output: OutputFormat,
    /// Explain, per template, why it applied or was skipped (on standard error).
    #[arg(long)]
    explain: bool,
}

impl RenderArgs {
    pub(crate) fn into_request(self) -> RenderRequest {
        RenderRequest {
            template_files: self.templates,
            pod_file: self.pod,
            namespace: Some(self.namespace),
            namespace_labels: self.namespace_labels.unwrap_or_default(),
            output: self.output,
            explain: self.explain,
        }
    }
}

/// `--injection-backend`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum InjectionBackend {
    /// A MutatingAdmissionPolicy where one can serve a template, the webhook otherwise.
    Auto,
    /// The webhook only.
    Webhook,
    /// The MutatingAdmissionPolicy only: no webhook call; a ValidatingAdmissionPolicy refuses
    /// Pods a required template selects and the policy did not inject.
    Policy,
}

#[derive(clap::Args)]
pub(crate) struct PolicyArgs {
    /// Template files or directories of them. Repeatable.
    #[arg(long = "template", short = 't', required = true, value_name = "PATH")]
    templates: Vec<PathBuf>,
    /// The name of the policy and of its binding.
    #[arg(long, default_value = "sidecar-injector")]
    name: String,
    /// The operator's namespace, never injected (like kube-system).
    #[arg(long, default_value = "sidecar-injector")]
    operator_namespace: String,
    /// The policy alone, as `--injection-backend policy` compiles it: no webhook behind it, so
    /// a template after one left to the webhook stays in the policy.
    #[arg(long)]
    no_webhook: bool,
}

impl PolicyArgs {
    pub(crate) fn into_request(self) -> PolicyRequest {
        PolicyRequest {
            template_files: self.templates,
            options: injector_core::policy::PolicyOptions {
                name: self.name,
                operator_namespace: self.operator_namespace,
                webhook_behind: !self.no_webhook,
            },
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Template files or directories of them. Repeatable.
    #[arg(
        long = "templates",
        short = 't',
        required = true,
        value_name = "PATH",
        env = "SIDECAR_INJECTOR_TEMPLATES",
        value_delimiter = ','
    )]
    templates: Vec<PathBuf>,
    /// The serving certificate chain (PEM); reloaded when the file changes.
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_TLS_CERT")]
    tls_cert: PathBuf,
    /// The serving certificate's private key (PEM); reloaded when the file changes.
    #[arg(long, value_name = "FILE", env = "SIDECAR_INJECTOR_TLS_KEY")]
    tls_key: PathBuf,
    #[command(flatten)]
    addresses: Addresses,
    /// Seconds between checks of the certificate files.
    #[arg(
        long,
        default_value_t = 5,
        env = "SIDECAR_INJECTOR_CERT_RELOAD_SECONDS"
    )]
    cert_reload_seconds: u64,
    #[command(flatten)]
    shutdown: ShutdownOptions,
    #[command(flatten)]
    pub(crate) log: LogOptions,
}

impl ServeArgs {
    pub(crate) fn into_options(self) -> ServeOptions {
        ServeOptions {
            template_paths: self.templates,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            listen: self.addresses.listen,
            admin_listen: self.addresses.admin_listen,
            // A zero interval would spin on the files.
            cert_reload_interval: Duration::from_secs(self.cert_reload_seconds.max(1)),
            drain_period: self.shutdown.drain_period,
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The operator's namespace (its Secret and Lease live there). Default: the service
    /// account's namespace in a cluster, else `sidecar-injector`.
    #[arg(long, env = "SIDECAR_INJECTOR_NAMESPACE")]
    namespace: Option<String>,
    /// The Service in front of the webhook (in-cluster mode).
    #[arg(
        long,
        default_value = "sidecar-injector",
        env = "SIDECAR_INJECTOR_SERVICE"
    )]
    service_name: String,
    /// The Service's port.
    #[arg(long, default_value_t = 443, env = "SIDECAR_INJECTOR_SERVICE_PORT")]
    service_port: i32,
    /// Out-of-cluster mode: the URL the API server calls the webhook at, such as
    /// https://127.0.0.1:8443 (the certificate then also covers 127.0.0.1).
    #[arg(long, env = "SIDECAR_INJECTOR_WEBHOOK_URL")]
    webhook_url: Option<String>,
    #[command(flatten)]
    addresses: Addresses,
    /// The MutatingWebhookConfiguration the operator owns.
    #[arg(
        long,
        default_value = "sidecar-injector",
        env = "SIDECAR_INJECTOR_WEBHOOK_CONFIG"
    )]
    webhook_config_name: String,
    /// The Secret holding the CA and the serving certificate.
    #[arg(
        long,
        default_value = "sidecar-injector-tls",
        env = "SIDECAR_INJECTOR_SECRET"
    )]
    secret_name: String,
    /// The CA's lifetime (rotated at two thirds), such as 365d or 30m.
    #[arg(long, default_value = "365d", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_CA_LIFETIME")]
    ca_lifetime: Duration,
    /// The serving certificate's lifetime (rotated at two thirds), such as 90d or 9m.
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_SERVING_LIFETIME")]
    serving_lifetime: Duration,
    /// Elect a leader among replicas (only the leader writes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "SIDECAR_INJECTOR_LEADER_ELECTION")]
    leader_election: bool,
    /// The Lease used for leader election.
    #[arg(
        long,
        default_value = "sidecar-injector-leader",
        env = "SIDECAR_INJECTOR_LEASE"
    )]
    lease_name: String,
    /// This replica's identity in the Lease. Default: $POD_NAME, else the host name and pid.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long the SidecarTemplate watch may keep failing before this replica reports not
    /// ready (so the Service sends Pods to replicas that are in sync), such as 60s.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_TEMPLATE_WATCH_GRACE")]
    template_watch_grace: Duration,
    /// The webhook entries' timeoutSeconds (1 to 30).
    #[arg(long, default_value_t = 10, env = "SIDECAR_INJECTOR_TIMEOUT_SECONDS")]
    timeout_seconds: i32,
    /// A ClusterRole that owns the webhook configuration, the certificate Secret and the
    /// Lease: deleting it (uninstalling the chart) garbage-collects all three.
    #[arg(long, env = "SIDECAR_INJECTOR_OWNER_CLUSTER_ROLE")]
    owner_cluster_role: Option<String>,
    /// How templates are injected: `auto` also compiles the templates a policy can express
    /// into one MutatingAdmissionPolicy where the API server serves them (Kubernetes 1.36+),
    /// the webhook serving the rest and staying the safety net; `webhook` serves every
    /// template through the webhook (and removes a policy applied before).
    #[arg(long, value_enum, default_value_t = InjectionBackend::Auto, env = "SIDECAR_INJECTOR_INJECTION_BACKEND")]
    injection_backend: InjectionBackend,
    /// The MutatingAdmissionPolicy (and binding) the operator owns.
    #[arg(
        long,
        default_value = "sidecar-injector",
        env = "SIDECAR_INJECTOR_POLICY_NAME"
    )]
    policy_name: String,
    /// Development: apply the CRD at start.
    #[arg(long)]
    install_crd: bool,
    #[command(flatten)]
    shutdown: ShutdownOptions,
    #[command(flatten)]
    pub(crate) log: LogOptions,
}

impl RunArgs {
    /// The options another process runs `run` with: `argv` (its arguments after `run`) and
    /// `env` (the literal values of its environment), parsed by this very parser, so that the
    /// defaults and the flags' environment variables are the operator's own. `namespace` is
    /// the default `--namespace` there (the service account's, so the Pod's). Never this
    /// process's environment: the variables are read from `env` only.
    pub(crate) fn of_process(
        argv: &[String],
        env: &BTreeMap<String, String>,
        namespace: &str,
    ) -> Result<RunOptions, clap::Error> {
        use clap::{Args as _, FromArgMatches as _};
        let declared = RunArgs::augment_args(clap::Command::new("run").no_binary_name(true));
        // A flag's variable, as the flag given first: given again, the flag wins.
        let from_env: Vec<String> = declared
            .get_arguments()
            .filter_map(|arg| {
                let value = env.get(arg.get_env()?.to_str()?)?;
                Some(format!("--{}={value}", arg.get_long()?))
            })
            .collect();
        let command = declared
            .args_override_self(true)
            .mut_args(|arg| arg.env(None::<&str>));
        let matches = command.try_get_matches_from(from_env.iter().chain(argv))?;
        let mut args = RunArgs::from_arg_matches(&matches)?;
        args.namespace.get_or_insert_with(|| namespace.to_owned());
        // Not this host's name: the identity is not asked for.
        args.identity.get_or_insert_with(String::new);
        Ok(args.into_options())
    }

    /// The options, with the defaults that depend on where the process runs filled in.
    pub(crate) fn into_options(self) -> RunOptions {
        let namespace = self.namespace.unwrap_or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .map(|ns| ns.trim().to_owned())
                .unwrap_or_else(|_| "sidecar-injector".to_owned())
        });
        let identity = self.identity.unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        });
        RunOptions {
            namespace,
            service_name: self.service_name,
            service_port: self.service_port,
            webhook_url: self.webhook_url,
            listen: self.addresses.listen,
            admin_listen: self.addresses.admin_listen,
            webhook_config_name: self.webhook_config_name,
            secret_name: self.secret_name,
            lifetimes: Lifetimes {
                ca: self.ca_lifetime,
                serving: self.serving_lifetime,
            },
            leader_election: self.leader_election,
            lease_name: self.lease_name,
            identity,
            timeout_seconds: self.timeout_seconds,
            template_watch_grace: self.template_watch_grace,
            owner_cluster_role: self.owner_cluster_role,
            backend: match self.injection_backend {
                InjectionBackend::Auto => Backend::Auto,
                InjectionBackend::Webhook => Backend::Webhook,
                InjectionBackend::Policy => Backend::Policy,
            },
            policy_name: self.policy_name,
            install_crd: self.install_crd,
            drain_period: self.shutdown.drain_period,
        }
    }
}

/// Where the two servers listen (`serve` and `run`).
#[derive(clap::Args)]
struct Addresses {
    /// The HTTPS admission address.
    #[arg(long, default_value = "0.0.0.0:8443", env = "SIDECAR_INJECTOR_LISTEN")]
    listen: SocketAddr,
    /// The plain-HTTP admin address: /healthz, /readyz, /metrics.
    #[arg(
        long,
        default_value = "0.0.0.0:8080",
        env = "SIDECAR_INJECTOR_ADMIN_LISTEN"
    )]
    admin_listen: SocketAddr,
}

/// How the long-running commands (`serve` and `run`) stop.
#[derive(clap::Args)]
struct ShutdownOptions {
    /// After SIGTERM, how long the webhook reports not ready while it still serves (so the
    /// Service stops routing to this replica first), before it stops accepting and finishes
    /// the requests in flight (up to 25 s more); such as 10s, or 0s out of a cluster. A second
    /// signal exits at once.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIDECAR_INJECTOR_DRAIN_PERIOD")]
    drain_period: Duration,
}

// How the long-running commands (`serve` and `run`) log.
#[derive(clap::Args)]
pub(crate) struct LogOptions {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "SIDECAR_INJECTOR_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,
    /// Log filter, in the RUST_LOG syntax (for example `info,injector_webhook=debug`).
    #[arg(long, default_value = "info", env = "SIDECAR_INJECTOR_LOG")]
    pub(crate) log: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}
