//! `sidecar-injector`: injects sidecars into Pods from SidecarTemplate custom resources.
//!
//! Thin on purpose: parses flags and hands over to the library crates.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use injector_cli::render::{OutputFormat, RenderRequest, parse_labels, render};
use injector_cli::run::RunOptions;
use injector_cli::serve::{ServeOptions, serve};
use injector_controller::certs::Lifetimes;
use tokio_util::sync::CancellationToken;

// The webhook's hot path parses and builds JSON: many small allocations, which mimalloc
// serves markedly faster than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status when a required template cannot be applied (the Pod would be denied).
const EXIT_DENIED: u8 = 3;

#[derive(Parser)]
#[command(
    name = "sidecar-injector",
    version,
    about = "Injects sidecars into Pods from SidecarTemplate custom resources"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Dry-run the injection offline: print a Pod or workload as the injector would mutate it.
    Render {
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
        namespace_labels: Option<std::collections::BTreeMap<String, String>>,
        /// Print the mutated object as YAML (pod) or the JSON patch (patch).
        #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Pod)]
        output: OutputFormat,
        /// Explain, per template, why it applied or was skipped (on standard error).
        #[arg(long)]
        explain: bool,
    },
    /// Serve the webhook from template files, with no cluster (POST /mutate, /mutate/<group>).
    Serve {
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
        log: LogOptions,
    },
    /// Run the controller and the webhook against a cluster (in-cluster, or from a kubeconfig).
    Run(Box<RunArgs>),
    /// Print the SidecarTemplate CustomResourceDefinition as YAML.
    Crd,
}

#[derive(clap::Args)]
struct RunArgs {
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
    /// Development: apply the CRD at start.
    #[arg(long)]
    install_crd: bool,
    #[command(flatten)]
    log: LogOptions,
}

impl RunArgs {
    fn into_options(self) -> RunOptions {
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
            install_crd: self.install_crd,
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

#[derive(clap::Args)]
struct LogOptions {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "SIDECAR_INJECTOR_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter, in the RUST_LOG syntax (for example `info,injector_webhook=debug`).
    #[arg(long, default_value = "info", env = "SIDECAR_INJECTOR_LOG")]
    log: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

impl LogOptions {
    fn init(&self) -> anyhow::Result<()> {
        let filter = tracing_subscriber::EnvFilter::try_new(&self.log)
            .with_context(|| format!("invalid --log filter {:?}", self.log))?;
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr);
        let result = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
        };
        result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
    }
}

/// Runs `work` on a multi-threaded runtime; SIGTERM or SIGINT cancels the token it gets.
fn until_signalled<F, Fut>(work: F) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let stop = CancellationToken::new();
        cancel_on_signals(stop.clone())?;
        work(stop).await
    })
}

/// Cancels `stop` on SIGTERM or SIGINT.
fn cancel_on_signals(stop: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: finishing requests in flight, then stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: finishing requests in flight, then stopping"),
        }
        stop.cancel();
    });
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Render {
            templates,
            pod,
            namespace,
            namespace_labels,
            output,
            explain,
        } => {
            let rendered = render(&RenderRequest {
                template_files: templates,
                pod_file: pod,
                namespace: Some(namespace),
                namespace_labels: namespace_labels.unwrap_or_default(),
                output,
                explain,
            })?;
            eprint!("{}", rendered.stderr);
            print!("{}", rendered.stdout);
            if let Some(denied) = rendered.denied {
                eprintln!("denied: {denied}");
                return Ok(ExitCode::from(EXIT_DENIED));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            templates,
            tls_cert,
            tls_key,
            addresses,
            cert_reload_seconds,
            log,
        } => {
            log.init()?;
            let options = ServeOptions {
                template_paths: templates,
                tls_cert,
                tls_key,
                listen: addresses.listen,
                admin_listen: addresses.admin_listen,
                cert_reload_interval: Duration::from_secs(cert_reload_seconds.max(1)),
            };
            until_signalled(|stop| async move { Ok(serve(options, stop, |_| {}).await?) })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            args.log.init()?;
            let options = args.into_options();
            until_signalled(
                |stop| async move { Ok(injector_cli::run::run(options, stop).await?) },
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Crd => {
            print!(
                "{}",
                injector_api::crd_yaml().context("cannot print the CRD")?
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
