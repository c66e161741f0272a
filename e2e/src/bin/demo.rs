//! `just demo`: a local cluster with a real node. Starts the control plane, the node
//! (containerd, kubelet, kube-scheduler, kube-proxy; see `injector_e2e::node`) and the operator,
//! applies examples/nginx-sidecar (its images replaced by local stand-ins), waits until the
//! Deployment's Pods are 2/2 Ready, shows `kubectl get pods` and the sidecar answering, and
//! leaves everything running.
//!
//! The node must put the machine back when it stops, so one process owns it all: `demo`
//! starts `demo --serve` in its own session, waits for it to be ready, prints what it saw, and
//! returns. `just down` sends it SIGTERM (its pid is in the state file); it then stops
//! everything and puts the machine back.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use injector_e2e::images::with_stand_ins;
use injector_e2e::pod::containers;
use injector_e2e::steps::{CONFIGURATION, wait_crd_established, wait_injected, wait_served};
use injector_e2e::{Cluster, Operator, OperatorOptions, http_get_at, poll, workspace_root};

/// The directory of the demo's files: the checkout's `target/`, where `just down` looks, also
/// when `CARGO_TARGET_DIR` puts the build elsewhere (then nothing else creates it: [`main`]
/// does).
fn demo_dir() -> PathBuf {
    workspace_root().join("target")
}

/// Where the demo's process id and directory are written (read by `just down`).
fn state_file() -> PathBuf {
    demo_dir().join("sidecar-injector-demo.state")
}

/// What the demo saw, printed by the foreground `demo` once the background one is ready.
fn summary_file() -> PathBuf {
    demo_dir().join("sidecar-injector-demo.summary")
}

/// The background process's output.
fn log_file() -> PathBuf {
    demo_dir().join("sidecar-injector-demo.log")
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("--serve") {
        return serve();
    }
    let state = state_file();
    if state.exists() {
        bail!(
            "a demo seems to be running already ({} exists): run `just down` first",
            state.display()
        );
    }
    std::fs::create_dir_all(demo_dir())
        .with_context(|| format!("cannot create {}", demo_dir().display()))?;
    let _ = std::fs::remove_file(summary_file());
    let log = std::fs::File::create(log_file())
        .with_context(|| format!("cannot create {}", log_file().display()))?;
    // Its own session: a Ctrl-C in this terminal must not kill it half-way, without cleanup.
    let mut child = Command::new("setsid")
        .arg(std::env::current_exe()?)
        .arg("--serve")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start the demo in the background (setsid)")?;
    eprintln!(
        "[demo] starting the cluster, its node and the operator (log: {})",
        log_file().display()
    );
    let started = Instant::now();
    loop {
        if let Ok(summary) = std::fs::read_to_string(summary_file()) {
            print!("{summary}");
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(log_file()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("the demo stopped ({status}):\n{}", tail.join("\n"));
        }
        if started.elapsed() > Duration::from_secs(30 * 60) {
            bail!(
                "the demo was not ready after 30 minutes (see {})",
                log_file().display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The background process: starts everything, writes the summary and the state file, then
/// waits for SIGTERM (`just down`) or SIGINT, and stops it all.
fn serve() -> anyhow::Result<()> {
    let cluster = Cluster::start()?;
    cluster.apply_file(&workspace_root().join("crds"))?;
    wait_crd_established(&cluster)?;
    let operator = Operator::start(&cluster, OperatorOptions::default())?;
    let result = show(&cluster, &operator);
    if let Err(e) = &result {
        eprintln!("[demo] failed: {e:#}");
        return result;
    }
    wait_for_stop()?;
    eprintln!("[demo] stopping");
    drop(operator);
    drop(cluster);
    let _ = std::fs::remove_file(state_file());
    let _ = std::fs::remove_file(summary_file());
    Ok(())
}

fn show(cluster: &Cluster, operator: &Operator) -> anyhow::Result<()> {
    let example = |file: &str| -> anyhow::Result<String> {
        let path = workspace_root().join("examples/nginx-sidecar").join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(with_stand_ins(&text))
    };
    cluster.apply_yaml(&example("sidecartemplate.yaml")?)?;
    wait_served(cluster, "nginx-sidecar", CONFIGURATION)?;
    let probe = cluster.namespace("probe", &[("sidecar.dev/example", "nginx-sidecar")])?;
    wait_injected(cluster, &probe, &["app=web"], "nginx-sidecar")?;
    cluster.kubectl_ok(&["delete", "namespace", &probe, "--wait=false"])?;

    cluster.apply_yaml(&example("workload.yaml")?)?;
    cluster.kubectl_ok(&[
        "scale",
        "deployment/web",
        "-n",
        "nginx-demo",
        "--replicas=2",
    ])?;
    let unselected = "demo-unselected";
    cluster.kubectl_ok(&["create", "namespace", unselected])?;
    cluster.wait_for_service_account(unselected)?;
    cluster.kubectl_ok(&[
        "create",
        "deployment",
        "web",
        "--image=stand-in.invalid/httpd:2.4",
        "-n",
        unselected,
    ])?;
    let pods = poll(Duration::from_secs(120), "the web Pods 2/2 Ready", || {
        let pods = cluster.list_json("pods", Some("nginx-demo"), Some("app=web"))?;
        let ready = pods.len() == 2
            && pods.iter().all(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| s.len() == 2 && s.iter().all(|c| c["ready"] == true))
            });
        Ok(ready.then_some(pods))
    })?;
    poll(Duration::from_secs(60), "the unselected Pod Ready", || {
        let pods = cluster.list_json("pods", Some(unselected), Some("app=web"))?;
        Ok(pods
            .iter()
            .any(|p| p["status"]["containerStatuses"][0]["ready"] == true)
            .then_some(()))
    })?;

    let mut out = String::new();
    writeln!(
        out,
        "\nApplied examples/nginx-sidecar (images replaced by local stand-ins): namespace \
         nginx-demo is selected, {unselected} is not.\n"
    )?;
    writeln!(out, "$ kubectl get pods -A -l app=web -o wide")?;
    out.push_str(&cluster.kubectl_ok(&["get", "pods", "-A", "-l", "app=web", "-o", "wide"])?);
    writeln!(out)?;
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let ip = pod["status"]["podIP"].as_str().unwrap_or("?");
        writeln!(
            out,
            "Pod nginx-demo/{name}: containers {:?}",
            containers(pod)
        )?;
        let answer = ip
            .parse::<IpAddr>()
            .map_err(anyhow::Error::from)
            .and_then(|ip| {
                http_get_at(
                    SocketAddr::new(ip, 8080),
                    "/default.conf",
                    Duration::from_secs(5),
                )
            });
        match answer {
            Ok((status, body)) => {
                writeln!(
                    out,
                    "  GET http://{ip}:8080/default.conf (the sidecar) -> {status}, its ConfigMap:"
                )?;
                for line in body.lines() {
                    writeln!(out, "    {line}")?;
                }
            }
            Err(e) => writeln!(out, "  GET http://{ip}:8080/ failed: {e:#}")?,
        }
    }

    let pid = std::process::id();
    let state = state_file();
    std::fs::write(
        &state,
        format!("dir\t{}\n{pid}\tdemo\n", cluster.dir().display()),
    )
    .with_context(|| format!("cannot write {}", state.display()))?;
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let kubectl = cluster.kubectl_path().display().to_string();
    writeln!(
        out,
        "\nEverything keeps running (one process, pid {pid}; the operator's webhook is {}).",
        operator.webhook_url()
    )?;
    writeln!(out, "\nUse it:")?;
    writeln!(out, "  export KUBECONFIG={kubeconfig}")?;
    writeln!(out, "  alias kubectl={kubectl}   # or your own kubectl")?;
    writeln!(out, "  kubectl get sidecartemplates")?;
    writeln!(out, "  kubectl get pods -A -o wide")?;
    writeln!(
        out,
        "  kubectl logs -n nginx-demo deploy/web -c nginx-sidecar"
    )?;
    writeln!(
        out,
        "\nLogs: {} (and {})",
        cluster.dir().display(),
        log_file().display()
    )?;
    writeln!(out, "Stop it all and put the machine back: just down")?;
    std::fs::write(summary_file(), out)
        .with_context(|| format!("cannot write {}", summary_file().display()))?;
    Ok(())
}

/// Blocks until SIGTERM or SIGINT.
fn wait_for_stop() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    })
}
