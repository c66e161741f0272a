//! How every e2e test binary runs its tests (libtest-mimic, `harness = false` in
//! `e2e/Cargo.toml`): one at a time, each one reported `ignored`, with one line saying why,
//! when the e2e tests are off (so `cargo test --workspace` says what it skipped the same way in
//! every binary); and, for the binaries whose scenarios share one fixture (a control plane and
//! an operator, or a node), that fixture started by the first scenario that runs and torn down
//! once after the last, also when one fails.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use libtest_mimic::{Arguments, Failed, Trial};

/// A test of its own: it panics to fail.
pub type Test = (&'static str, fn());

/// Runs `tests` of the binary `binary`, one after the other (each starts what it needs).
pub fn run_tests(binary: &str, tests: &[Test]) -> ExitCode {
    let enabled = announce(binary, None);
    let trials = tests
        .iter()
        .map(|&(name, test)| {
            Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(!enabled)
        })
        .collect();
    libtest_mimic::run(&one_at_a_time(), trials).exit_code()
}

/// What a binary's scenarios share, and how each one runs on it.
pub struct Shared<F, S> {
    /// The binary's name, for what it prints.
    pub binary: &'static str,
    /// Why every scenario is ignored although the e2e tests are on (the node at another
    /// Kubernetes version than its own), if so.
    pub ignored_because: Option<String>,
    /// The scenarios, each with whether it is ignored even when the binary's tests run.
    pub scenarios: Vec<(&'static str, S, bool)>,
    /// Starts the fixture.
    pub start: fn() -> anyhow::Result<F>,
    /// Runs one scenario on the fixture (after readying the fixture for it).
    pub run: fn(&mut F, &'static str, S) -> Result<(), String>,
    /// After the last scenario, given whether one failed: tears the fixture down (dropping
    /// it), and says whether anything failed, its own checks included.
    pub finish: fn(F, bool) -> bool,
}

/// Runs a binary's scenarios on one fixture, started by the first that runs.
pub fn run_shared<F, S>(shared: Shared<F, S>) -> ExitCode
where
    F: Send + 'static,
    S: Copy + Send + 'static,
{
    let enabled = announce(shared.binary, shared.ignored_because.as_deref());
    let fixture: Arc<Mutex<Option<F>>> = Arc::default();
    let (start, run) = (shared.start, shared.run);
    let trials = shared
        .scenarios
        .into_iter()
        .map(|(name, scenario, ignored)| {
            let fixture = Arc::clone(&fixture);
            Trial::test(name, move || {
                let mut slot = fixture.lock().unwrap_or_else(PoisonError::into_inner);
                if slot.is_none() {
                    let started =
                        start().map_err(|e| format!("the fixture does not start: {e:#}"))?;
                    *slot = Some(started);
                }
                let Some(fixture) = slot.as_mut() else {
                    return Err(Failed::from("the fixture is gone"));
                };
                run(fixture, name, scenario).map_err(Failed::from)
            })
            .with_ignored_flag(!enabled || ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&one_at_a_time(), trials);
    let fixture = fixture
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let failed = match fixture {
        Some(fixture) => (shared.finish)(fixture, conclusion.has_failed()),
        None => conclusion.has_failed(),
    };
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The command line's arguments, tests one at a time: they share the machine's ports, its
/// node, and two cores.
fn one_at_a_time() -> Arguments {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    args
}

/// Whether `binary`'s tests run; when not, one line says why.
fn announce(binary: &str, ignored_because: Option<&str>) -> bool {
    if !crate::enabled() {
        eprintln!(
            "[e2e] {binary}: ignored: set {}=1 (or run `just e2e`) to run against a local control plane",
            crate::ENABLE_VAR
        );
        return false;
    }
    if let Some(reason) = ignored_because {
        eprintln!("[e2e] {binary}: ignored: {reason}");
        return false;
    }
    true
}
