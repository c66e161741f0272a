//! The end-to-end harness of sidecar-injector: a real local control plane (etcd,
//! kube-apiserver and kube-controller-manager, built by `e2e/control-plane/build.sh`) started
//! on 127.0.0.1 with generated certificates, driven with the real `kubectl`, and the operator
//! (`sidecar-injector run`) started against it in url mode.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use injector_e2e::{ControlPlane, Operator, OperatorOptions};
//! let cp = ControlPlane::start()?;
//! cp.apply_file(&injector_e2e::workspace_root().join("crds"))?;
//! let operator = Operator::start(&cp, OperatorOptions::default())?;
//! let ns = cp.namespace("demo", &[("sidecar.dev/example", "nginx-sidecar")])?;
//! cp.kubectl_ok(&["run", "web", "--image=httpd:2.4", "--labels=app=web", "-n", &ns])?;
//! let pod = cp.get_json("pod", Some(&ns), "web")?;
//! # drop((operator, pod)); Ok(()) }
//! ```
//!
//! Everything a [`ControlPlane`] or an [`Operator`] starts is killed, and the control plane's
//! temporary directory removed, when they are dropped, also while a test panics.

pub mod bench;
mod binaries;
mod certs;
mod control_plane;
pub mod harness;
pub mod host;
pub mod images;
pub mod node;
mod operator;
pub mod pod;
mod process;
pub mod prometheus;
pub mod release;
pub mod schemas;
mod service;
pub mod steps;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use binaries::{ControlPlaneBinaries, NodeBinaries, node_binaries, operator_binary, tool};
pub use control_plane::{ControlPlane, ControlPlaneOptions};
pub use node::Cluster;
pub use operator::{Backend, Operator, OperatorOptions, READY_POLL};
pub use process::http_get_at;
pub use service::LocalService;

/// The environment variable that turns the end-to-end scenarios on (`1`).
pub const ENABLE_VAR: &str = "SIDECAR_INJECTOR_E2E";

/// The variable that picks the Kubernetes version of the control plane (one of `KUBE_VERSIONS`
/// in `e2e/control-plane/versions.env`; unset: its `KUBE_VERSION`). The node runs only the
/// default version: node scenarios are skipped when it is set.
pub const KUBE_VERSION_VAR: &str = "SIDECAR_INJECTOR_KUBE_VERSION";

/// The Kubernetes version asked for with [`KUBE_VERSION_VAR`], if any.
pub fn kube_version() -> Option<String> {
    std::env::var(KUBE_VERSION_VAR)
        .ok()
        .filter(|v| !v.is_empty())
}

/// The environment variable that keeps the control plane's temporary directory (`1`), with
/// its logs, certificates and etcd data, instead of removing it at the end.
pub const KEEP_VAR: &str = "SIDECAR_INJECTOR_E2E_KEEP";

/// Whether the end-to-end scenarios were asked for: [`ENABLE_VAR`] is `1`.
pub fn enabled() -> bool {
    std::env::var(ENABLE_VAR).is_ok_and(|v| v == "1")
}

/// The root of the workspace (the directory holding `crds/`, `examples/` and `e2e/`).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), PathBuf::from)
}

/// Calls `check` every `interval` until it returns `Ok(Some(value))`, for at most `timeout`.
///
/// `Ok(None)` and `Err` both mean "not yet"; on timeout the error names `what` and carries the
/// last error `check` returned, if any.
pub fn poll_every<T>(
    timeout: Duration,
    interval: Duration,
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    let mut last_error = None;
    loop {
        match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if start.elapsed() >= timeout {
            return Err(match last_error {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow::anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        std::thread::sleep(interval);
    }
}

/// [`poll_every`] with a 200 ms interval.
pub fn poll<T>(
    timeout: Duration,
    what: &str,
    check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    poll_every(timeout, Duration::from_millis(200), what, check)
}

/// Runs the scenario `name`: announces it, turns a panic into an error like any other, and
/// reports PASS or FAIL with its duration. The error is the message the test runner shows.
pub fn run_scenario(
    name: &str,
    scenario: impl FnOnce() -> anyhow::Result<()>,
) -> Result<(), String> {
    eprintln!("\n[e2e] ===== {name}");
    let started = Instant::now();
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(scenario)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panicked".to_owned())),
    };
    let elapsed = started.elapsed();
    match &outcome {
        Ok(()) => eprintln!("[e2e] PASS {name} ({elapsed:.1?})"),
        Err(e) => eprintln!("[e2e] FAIL {name} ({elapsed:.1?}): {e}"),
    }
    outcome
}
