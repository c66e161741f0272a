//! `just demo`: a local cluster demo. Starts the control plane (etcd, kube-apiserver,
//! kube-controller-manager) and the operator, applies examples/nginx-sidecar, creates one Pod
//! in a namespace the template selects and one in a namespace it does not, prints the
//! containers each Pod ended up with, and leaves everything running: the process ids go to a
//! state file that `just down` reads to stop it all.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use injector_e2e::pod::containers;
use injector_e2e::steps::wait_crd_established;
use injector_e2e::{ControlPlane, Operator, OperatorOptions, poll, workspace_root};
use serde_json::Value;

/// Where the process ids and the directory of a running demo are written (read by `just down`).
fn state_file() -> PathBuf {
    workspace_root()
        .join("target")
        .join("sidecar-injector-demo.state")
}

fn main() -> anyhow::Result<()> {
    let state = state_file();
    if state.exists() {
        bail!(
            "a demo seems to be running already ({} exists): run `just down` first",
            state.display()
        );
    }
    let cp = ControlPlane::start()?;
    cp.apply_file(&workspace_root().join("crds"))?;
    wait_crd_established(&cp)?;
    let operator = Operator::start(&cp, OperatorOptions::default())?;

    let template = workspace_root().join("examples/nginx-sidecar/sidecartemplate.yaml");
    cp.apply_file(&template)?;
    poll(Duration::from_secs(30), "nginx-sidecar Ready=True", || {
        let t = cp.get_json("sidecartemplate", None, "nginx-sidecar")?;
        let ready = t["status"]["observedGeneration"] == t["metadata"]["generation"]
            && t["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
        Ok(ready.then_some(()))
    })?;
    let selected = "demo-selected";
    let unselected = "demo-unselected";
    cp.kubectl_ok(&["create", "namespace", selected])?;
    cp.kubectl_ok(&[
        "label",
        "namespace",
        selected,
        "sidecar.dev/example=nginx-sidecar",
    ])?;
    cp.kubectl_ok(&["create", "namespace", unselected])?;
    for ns in [selected, unselected] {
        cp.wait_for_service_account(ns)?;
    }
    // The API server picks the webhook configuration up asynchronously: probe with a server
    // side dry run until it injects, so the real Pod cannot race it.
    poll(
        Duration::from_secs(30),
        "the webhook to inject in demo-selected",
        || {
            let out = cp.kubectl_ok(&[
                "run",
                "probe",
                "--image=httpd:2.4",
                "--labels=app=web",
                "--restart=Never",
                "--dry-run=server",
                "-o",
                "json",
                "-n",
                selected,
            ])?;
            let pod: Value = serde_json::from_str(&out)?;
            Ok((containers(&pod).len() > 1).then_some(()))
        },
    )?;

    println!();
    println!(
        "Applied examples/nginx-sidecar (selects namespaces labelled sidecar.dev/example=nginx-sidecar, Pods labelled app=web)."
    );
    println!();
    for ns in [selected, unselected] {
        cp.kubectl_ok(&[
            "run",
            "web",
            "--image=httpd:2.4",
            "--labels=app=web",
            "--restart=Never",
            "-n",
            ns,
        ])?;
        let pod = cp.get_json("pod", Some(ns), "web")?;
        println!("{}", describe(&pod));
    }

    let pids = cp
        .pids()
        .into_iter()
        .chain(
            operator
                .pid()
                .map(|pid| ("sidecar-injector".to_owned(), pid)),
        )
        .collect::<Vec<_>>();
    let mut contents = format!("dir\t{}\n", cp.dir().display());
    for (name, pid) in &pids {
        writeln!(contents, "{pid}\t{name}")?;
    }
    if let Some(parent) = state.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&state, contents)
        .with_context(|| format!("cannot write {}", state.display()))?;

    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let kubectl = cp.kubectl_path().display().to_string();
    println!();
    println!("Everything keeps running:");
    for (name, pid) in &pids {
        println!("  {name:<24} pid {pid}");
    }
    println!();
    println!("Use it:");
    println!("  export KUBECONFIG={kubeconfig}");
    println!("  alias kubectl={kubectl}   # or your own kubectl");
    println!("  kubectl get sidecartemplates");
    println!("  kubectl get pods -A -o wide");
    println!("  kubectl run web2 --image=httpd:2.4 --labels=app=web -n {selected}");
    println!(
        "  kubectl get pod web2 -n {selected} -o jsonpath='{{.spec.containers[*].name}}{{\"\\n\"}}'"
    );
    println!();
    println!("Logs: {}", cp.dir().display());
    println!("State: {}", state.display());
    println!("Stop it all: just down");

    // Leave every process running: dropping these would kill them and remove the directory.
    std::mem::forget(operator);
    std::mem::forget(cp);
    Ok(())
}

/// `namespace/name`, then its init containers, containers (with images) and injection record.
fn describe(pod: &Value) -> String {
    let mut out = format!(
        "Pod {}/{}:\n",
        pod["metadata"]["namespace"].as_str().unwrap_or("?"),
        pod["metadata"]["name"].as_str().unwrap_or("?")
    );
    for (kind, key) in [
        ("init container", "initContainers"),
        ("container", "containers"),
    ] {
        for c in pod["spec"][key].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  {kind:<15} {:<16} {}",
                c["name"].as_str().unwrap_or("?"),
                c["image"].as_str().unwrap_or("?")
            );
        }
    }
    let injected = pod["metadata"]["annotations"]["sidecar.dev/injected"]
        .as_str()
        .unwrap_or("(nothing injected)");
    let _ = writeln!(out, "  sidecar.dev/injected: {injected}");
    out
}
