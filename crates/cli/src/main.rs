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
use injector_cli::serve::{ServeOptions, serve};
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
    /// Print the SidecarTemplate CustomResourceDefinition as YAML.
    Crd,
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
            listen,
            admin_listen,
            cert_reload_seconds,
            log,
        } => {
            log.init()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            runtime.block_on(async {
                let stop = CancellationToken::new();
                cancel_on_signals(stop.clone())?;
                let options = ServeOptions {
                    template_paths: templates,
                    tls_cert,
                    tls_key,
                    listen,
                    admin_listen,
                    cert_reload_interval: Duration::from_secs(cert_reload_seconds.max(1)),
                };
                serve(options, stop, |_| {}).await?;
                anyhow::Ok(())
            })?;
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
