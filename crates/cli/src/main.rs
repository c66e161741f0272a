//! `sidecar-injector`: injects sidecars into Pods from SidecarTemplate custom resources.
//!
//! Thin on purpose: parses flags and hands over to the library crate ([`injector_cli::args`]
//! defines the flags, [`injector_cli::process`] runs the command). Installed as
//! `kubectl-sidecar`, it is the kubectl plugin ([`injector_cli::kubectl`]).

use std::process::ExitCode;

use injector_cli::args::Cli;

// The webhook's hot path parses and builds JSON: many small allocations, which mimalloc
// serves markedly faster than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Started as `kubectl-sidecar`, the arguments are the kubectl plugin's.
    let cli = Cli::try_parse_argv(std::env::args_os()).unwrap_or_else(|error| error.exit());
    match cli.execute() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
