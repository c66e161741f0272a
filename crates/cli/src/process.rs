//! The process around a command: logging, the async runtime, the signals that stop it, and
//! the exit status.

use std::process::ExitCode;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::args::{Cli, Command, LogFormat, LogOptions};
use crate::render::render;
use crate::serve::serve;

/// Exit status when a required template cannot be applied (the Pod would be denied).
const EXIT_DENIED: u8 = 3;

/// Exit status when `kubectl sidecar check` finds a broken link: a verdict of its own, apart
/// from 1 (an error: it could not check), 2 (clap's, bad arguments) and `render`'s 3, so that
/// a script tells a broken installation from a failed command.
const EXIT_BROKEN: u8 = 4;

impl Cli {
    /// Runs the command; an error is for `main` to print.
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Render(args) => {
                let rendered = render(&args.into_request())?;
                eprint!("{}", rendered.stderr);
                print_out(&rendered.stdout)?;
                if let Some(denied) = rendered.denied {
                    eprintln!("denied: {denied}");
                    return Ok(ExitCode::from(EXIT_DENIED));
                }
                Ok(ExitCode::SUCCESS)
            }
            Command::Serve(args) => {
                init_logging(&args.log)?;
                let options = args.into_options();
                until_signalled(|stop| async move { Ok(serve(options, stop, |_| {}).await?) })?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Run(args) => {
                init_logging(&args.log)?;
                let options = args.into_options();
                until_signalled(|stop| async move { Ok(crate::run::run(options, stop).await?) })?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Kubectl(args) => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("cannot start the async runtime")?;
                let output = runtime.block_on(args.execute())?;
                print_out(&output.text)?;
                Ok(if output.broken {
                    ExitCode::from(EXIT_BROKEN)
                } else {
                    ExitCode::SUCCESS
                })
            }
            Command::Policy(args) => {
                let output = crate::policy::policy(&args.into_request())?;
                eprint!("{}", output.stderr);
                print_out(&output.stdout)?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Completion(args) => {
                print_out(&crate::completion::script(
                    args.shell,
                    crate::args::command(),
                    "sidecar-injector",
                ))?;
                Ok(ExitCode::SUCCESS)
            }
            Command::CompletePlugin(words) => {
                let completions =
                    crate::completion::complete(&crate::kubectl::plugin_command(), &words);
                print_out(&completions.to_cobra())?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Crd => {
                print_out(&injector_api::crd_yaml().context("cannot print the CRD")?)?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

/// Writes `text` to standard output. A reader that went away (`sidecar-injector crd | head`)
/// is no error: the rest is not wanted (`print!` would panic).
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.context("cannot write to standard output"),
    }
}

/// Logs to stderr, a line per event, in `tracing_subscriber`'s text or JSON format.
fn init_logging(options: &LogOptions) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&options.log)
        .with_context(|| format!("invalid --log filter {:?}", options.log))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let result = match options.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
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

/// Exit status when a second signal cuts the shutdown short (128 + SIGTERM, as if killed).
const EXIT_SIGNALLED_TWICE: i32 = 143;

/// Cancels `stop` on the first SIGTERM or SIGINT (the server then drains and finishes what is
/// in flight); a second one exits at once, for a person who will not wait.
fn cancel_on_signals(stop: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(
            "{name}: draining, then finishing the requests in flight (a second signal exits at once)"
        );
        stop.cancel();
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::warn!("second signal ({name}): exiting now");
        std::process::exit(EXIT_SIGNALLED_TWICE);
    });
    Ok(())
}
