//! [`Operator`]: `sidecar-injector run` against a [`ControlPlane`], out of cluster in url mode.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use crate::binaries::operator_binary;
use crate::control_plane::ControlPlane;
use crate::poll_every;
use crate::process::{Process, free_ports, http_get, tail};

/// How long the operator gets to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How often `/readyz` is polled while the operator starts.
pub const READY_POLL: Duration = Duration::from_millis(10);

/// How long the operator gets to exit after SIGTERM (it finishes requests in flight for up to
/// 25 s; no drain period out of cluster).
const STOP_TIMEOUT: Duration = Duration::from_secs(35);

/// How to run the operator.
#[derive(Debug, Clone)]
pub struct OperatorOptions {
    /// `--namespace`: where its Secret and Lease live (created when missing).
    pub namespace: String,
    /// `--leader-election`.
    pub leader_election: bool,
    /// `--serving-lifetime` (such as `9m`), the operator's default when `None`.
    pub serving_lifetime: Option<String>,
    /// `--ca-lifetime` (such as `30m`), the operator's default when `None`.
    pub ca_lifetime: Option<String>,
    /// Further arguments, appended last.
    pub extra_args: Vec<String>,
    /// The kubeconfig the operator uses; the control plane's admin kubeconfig when `None`.
    pub kubeconfig: Option<PathBuf>,
    /// `--webhook-url`, when the API server is to reach this replica through something in front
    /// of several (a [`crate::LocalService`], as a Service is in a cluster); this replica's own
    /// address when `None`.
    pub service_url: Option<String>,
}

impl Default for OperatorOptions {
    fn default() -> Self {
        Self {
            namespace: "sidecar-injector".to_owned(),
            leader_election: true,
            serving_lifetime: None,
            ca_lifetime: None,
            extra_args: Vec::new(),
            kubeconfig: None,
            service_url: None,
        }
    }
}

/// A `sidecar-injector run` process in url mode (`--webhook-url https://127.0.0.1:PORT`), on
/// free ports of 127.0.0.1, with `KUBECONFIG` set to the control plane's admin kubeconfig (or
/// the one [`OperatorOptions::kubeconfig`] names).
///
/// It keeps its ports across [`Operator::stop`] and [`Operator::restart`], so the webhook
/// configuration it wrote stays pointed at it. Dropping it kills the process (printing the end
/// of its log when the thread panics).
#[derive(Debug)]
pub struct Operator {
    options: OperatorOptions,
    binary: PathBuf,
    kubeconfig: PathBuf,
    cwd: PathBuf,
    log_prefix: PathBuf,
    listen_port: u16,
    admin_port: u16,
    starts: u32,
    process: Option<Process>,
    /// From the latest spawn to the first `/readyz` 200.
    ready_after: Option<Duration>,
}

impl Operator {
    /// Builds the binary (`cargo build -p injector-cli`, once per test process), creates the
    /// operator's namespace when missing, starts the operator and waits for its `/readyz`.
    ///
    /// The SidecarTemplate CRD must be installed (`kubectl apply -f crds/`): the operator is
    /// not ready before it has listed the templates.
    pub fn start(plane: &ControlPlane, options: OperatorOptions) -> anyhow::Result<Self> {
        let binary = operator_binary()?;
        let namespace = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": options.namespace},
        });
        plane.apply_yaml(&namespace.to_string())?;
        let [listen_port, admin_port] = free_ports::<2>()?;
        let kubeconfig = options
            .kubeconfig
            .clone()
            .unwrap_or_else(|| plane.kubeconfig_path().to_path_buf());
        let mut operator = Self {
            options,
            binary,
            kubeconfig,
            cwd: plane.dir().to_path_buf(),
            log_prefix: plane.next_operator_log_prefix(),
            listen_port,
            admin_port,
            starts: 0,
            process: None,
            ready_after: None,
        };
        operator.restart()?;
        Ok(operator)
    }

    /// Starts the operator again (after [`Operator::stop`]) on the same ports, and waits for
    /// its `/readyz`. Each start logs to a new file.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if self.process.is_some() {
            bail!("the operator is running");
        }
        self.starts += 1;
        let log = PathBuf::from(format!(
            "{}-start{}.log",
            self.log_prefix.display(),
            self.starts
        ));
        let mut args = vec![
            "run".to_owned(),
            "--namespace".to_owned(),
            self.options.namespace.clone(),
            "--webhook-url".to_owned(),
            self.webhook_url(),
            "--listen".to_owned(),
            format!("127.0.0.1:{}", self.listen_port),
            "--admin-listen".to_owned(),
            format!("127.0.0.1:{}", self.admin_port),
            "--leader-election".to_owned(),
            self.options.leader_election.to_string(),
            "--identity".to_owned(),
            // Unique per Operator (its port) and per start, so replicas never share one.
            format!(
                "e2e-{}-{}-{}",
                std::process::id(),
                self.listen_port,
                self.starts
            ),
            "--log-format".to_owned(),
            "text".to_owned(),
            // Out of cluster, in url mode: no Service routes to it, so nothing to drain from.
            "--drain-period".to_owned(),
            "0s".to_owned(),
        ];
        if let Some(lifetime) = &self.options.serving_lifetime {
            args.extend(["--serving-lifetime".to_owned(), lifetime.clone()]);
        }
        if let Some(lifetime) = &self.options.ca_lifetime {
            args.extend(["--ca-lifetime".to_owned(), lifetime.clone()]);
        }
        args.extend(self.options.extra_args.iter().cloned());
        let started = Instant::now();
        self.process = Some(Process::spawn(
            "sidecar-injector",
            &self.binary,
            &args,
            &self.cwd,
            log,
            &[("KUBECONFIG", self.kubeconfig.as_os_str())],
        )?);
        // Polled often: the time to ready is one of the benchmarks' figures.
        let waited = poll_every(READY_TIMEOUT, READY_POLL, "the operator's /readyz", || {
            self.check_running()?;
            Ok(self.readyz().ok().filter(|(status, _)| *status == 200))
        });
        if let Err(e) = waited {
            eprintln!("{}", self.log_tail(40));
            return Err(e);
        }
        self.ready_after = Some(started.elapsed());
        eprintln!(
            "[e2e] sidecar-injector ready after {:.1?} (pid {}, webhook {}, admin port {})",
            started.elapsed(),
            self.pid().unwrap_or_default(),
            self.webhook_url(),
            self.admin_port
        );
        Ok(())
    }

    /// Sends SIGTERM and waits for the operator to exit (killing it after 35 s).
    pub fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let mut process = self.process.take().context("the operator is not running")?;
        process.terminate(STOP_TIMEOUT)
    }

    /// An error, with the end of its log, when the operator has exited or was stopped.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.process
            .as_mut()
            .context("the operator is not running")?
            .check_running()
    }

    /// How long the latest start took, from spawning the process to the first `/readyz` 200
    /// (to within [`READY_POLL`]).
    pub fn ready_after(&self) -> Option<Duration> {
        self.ready_after
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Process::pid)
    }

    /// `--webhook-url`: [`OperatorOptions::service_url`], else `https://127.0.0.1:PORT`, this
    /// replica's own.
    pub fn webhook_url(&self) -> String {
        self.options
            .service_url
            .clone()
            .unwrap_or_else(|| format!("https://127.0.0.1:{}", self.listen_port))
    }

    /// The port this replica serves the webhook on (127.0.0.1).
    pub fn listen_port(&self) -> u16 {
        self.listen_port
    }

    /// Whether this replica says it leads (its `sidecar_injector_leader` gauge).
    pub fn leads(&self) -> bool {
        self.metrics()
            .is_ok_and(|m| m.lines().any(|l| l.trim() == "sidecar_injector_leader 1"))
    }

    /// Kills the process (SIGKILL): no drain, no lease released, in-flight calls cut.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// The admin (plain HTTP) port: `/healthz`, `/readyz`, `/metrics`.
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// `GET /readyz` on the admin port: status code and body.
    pub fn readyz(&self) -> anyhow::Result<(u16, String)> {
        http_get(self.admin_port, "/readyz", Duration::from_secs(2))
    }

    /// `GET /metrics` on the admin port: the body (an error unless 200).
    pub fn metrics(&self) -> anyhow::Result<String> {
        let (status, body) = http_get(self.admin_port, "/metrics", Duration::from_secs(5))?;
        if status != 200 {
            bail!("/metrics answered {status}: {body}");
        }
        Ok(body)
    }

    /// The log file of the latest start.
    pub fn log_path(&self) -> Option<&Path> {
        self.process.as_ref().map(Process::log)
    }

    /// The last `lines` lines of every start's log.
    pub fn log_tail(&self, lines: usize) -> String {
        (1..=self.starts)
            .map(|n| {
                let log = PathBuf::from(format!("{}-start{n}.log", self.log_prefix.display()));
                format!(
                    "----- sidecar-injector start {n} ({}) -----\n{}\n",
                    log.display(),
                    tail(&log, lines)
                )
            })
            .collect()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail(40));
        }
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}

/// The operator's `--injection-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The webhook alone.
    Webhook,
    /// The MutatingAdmissionPolicy where the API server serves one, the webhook behind it.
    Auto,
    /// The MutatingAdmissionPolicy and its guard, no webhook.
    Policy,
}

impl Backend {
    /// `--injection-backend` with this value, for [`OperatorOptions::extra_args`].
    pub fn args(self) -> Vec<String> {
        vec!["--injection-backend".to_owned(), self.arg().to_owned()]
    }

    /// The flag's value.
    pub fn arg(self) -> &'static str {
        match self {
            Backend::Webhook => "webhook",
            Backend::Auto => "auto",
            Backend::Policy => "policy",
        }
    }
}
