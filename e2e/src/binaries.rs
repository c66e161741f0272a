//! Locating the binaries: the control plane's (built and cached by
//! `e2e/control-plane/build.sh`) and the operator's (`cargo build -p injector-cli`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, bail};

use crate::workspace_root;

/// The paths of the control plane's binaries.
#[derive(Debug, Clone)]
pub struct ControlPlaneBinaries {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// kubectl, of the same version as the API server.
    pub kubectl: PathBuf,
}

/// The names `build.sh` knows the binaries by, in the order of its output.
const NAMES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
];

impl ControlPlaneBinaries {
    /// Runs `bash e2e/control-plane/build.sh etcd kube-apiserver kube-controller-manager
    /// kubectl`, which builds what is missing from the cache (the first build takes about 15
    /// minutes; later runs are instant) and prints one path per line.
    pub fn locate() -> anyhow::Result<Self> {
        Self::parse(&build_sh(&NAMES)?)
    }

    /// Reads `build.sh`'s output: one path per line, `<dir>/<name>-<version>`.
    fn parse(stdout: &str) -> anyhow::Result<Self> {
        let find = |name: &str| find_in_output(stdout, name);
        Ok(Self {
            etcd: find("etcd")?,
            kube_apiserver: find("kube-apiserver")?,
            kube_controller_manager: find("kube-controller-manager")?,
            kubectl: find("kubectl")?,
        })
    }
}

/// The paths of the node's Kubernetes binaries (of the API server's version).
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    /// kubelet.
    pub kubelet: PathBuf,
    /// kube-scheduler.
    pub kube_scheduler: PathBuf,
    /// kube-proxy.
    pub kube_proxy: PathBuf,
}

/// Runs `build.sh kubelet kube-scheduler kube-proxy` (built once, like the control plane's).
pub fn node_binaries() -> anyhow::Result<NodeBinaries> {
    let out = build_sh(&["kubelet", "kube-scheduler", "kube-proxy"])?;
    Ok(NodeBinaries {
        kubelet: find_in_output(&out, "kubelet")?,
        kube_scheduler: find_in_output(&out, "kube-scheduler")?,
        kube_proxy: find_in_output(&out, "kube-proxy")?,
    })
}

/// Runs `bash e2e/control-plane/build.sh NAMES...`, which builds what is missing from the cache
/// (the first build of the control plane takes about 15 minutes; later runs are instant), and
/// returns what it prints: one path per line.
fn build_sh(names: &[&str]) -> anyhow::Result<String> {
    let root = workspace_root();
    let script = root.join("e2e/control-plane/build.sh");
    eprintln!(
        "[e2e] locating {} with {} (built once, then cached)",
        names.join(", "),
        script.display()
    );
    let output = Command::new("bash")
        .arg(&script)
        .args(names)
        .current_dir(&root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run bash {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed: {}", script.display(), output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The line of `build.sh`'s output that is `<dir>/<name>-v<version>`.
fn find_in_output(stdout: &str, name: &str) -> anyhow::Result<PathBuf> {
    stdout
        .lines()
        .map(Path::new)
        .find(|path| {
            path.file_name()
                .and_then(|f| f.to_str())
                .and_then(|f| f.strip_prefix(name))
                .and_then(|rest| rest.strip_prefix("-v"))
                .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(Path::to_path_buf)
        .with_context(|| format!("build.sh printed no path for {name}: {stdout:?}"))
}

/// Another tool `build.sh` builds and caches at its pinned version: `helm` or `kubeconform`.
pub fn tool(name: &str) -> anyhow::Result<PathBuf> {
    find_in_output(&build_sh(&[name])?, name)
}

/// The `sidecar-injector` binary, built once per process with `cargo build -p injector-cli`
/// (the path is read from cargo's JSON messages, so any target directory works).
///
/// `SIDECAR_INJECTOR_BIN`, when set, names a binary to use instead, and nothing is built.
pub fn operator_binary() -> anyhow::Result<PathBuf> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| build_operator().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_operator() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SIDECAR_INJECTOR_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("[e2e] cargo build -p injector-cli");
    let mut command = Command::new(cargo);
    // Cargo runs tests with the variables it sets for the package under test; handed on, they
    // would change the fingerprints of build scripts that watch them (ring's watches
    // CARGO_MANIFEST_DIR) and make this build and the next `cargo test` rebuild each other.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if is_package_variable(key) {
            command.env_remove(key);
        }
    }
    let output = command
        .args([
            "build",
            "-p",
            "injector-cli",
            "--bin",
            "sidecar-injector",
            "--quiet",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo build -p injector-cli")?;
    if !output.status.success() {
        bail!("cargo build -p injector-cli failed: {}", output.status);
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| message["target"]["name"] == "sidecar-injector")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo build reported no sidecar-injector executable")
}

/// Whether `key` is one of the variables cargo sets for a package's build or tests (as opposed
/// to configuration such as `CARGO_HOME` or `CARGO_TARGET_DIR`).
fn is_package_variable(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_EXE_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_build_sh_output() {
        let out = "/c/bin/etcd-v3.6.16\n/c/bin/kube-apiserver-v1.34.4\n\
                   /c/bin/kube-controller-manager-v1.34.4\n/c/bin/kubectl-v1.34.4\n";
        let bins = ControlPlaneBinaries::parse(out).unwrap();
        assert_eq!(bins.etcd, Path::new("/c/bin/etcd-v3.6.16"));
        assert_eq!(
            bins.kube_apiserver,
            Path::new("/c/bin/kube-apiserver-v1.34.4")
        );
        assert_eq!(
            bins.kube_controller_manager,
            Path::new("/c/bin/kube-controller-manager-v1.34.4")
        );
        assert_eq!(bins.kubectl, Path::new("/c/bin/kubectl-v1.34.4"));
        assert!(ControlPlaneBinaries::parse("/c/bin/etcd-v3.6.16\n").is_err());
    }

    #[test]
    fn package_variables_are_not_handed_on() {
        assert!(is_package_variable("CARGO_MANIFEST_DIR"));
        assert!(is_package_variable("CARGO_PKG_NAME"));
        assert!(!is_package_variable("CARGO_TARGET_DIR"));
        assert!(!is_package_variable("CARGO_HOME"));
        assert!(!is_package_variable("CARGO"));
    }
}
