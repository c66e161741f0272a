//! [`ControlPlane`]: etcd, kube-apiserver and kube-controller-manager on 127.0.0.1, started
//! with the flags `e2e/control-plane/NOTES.md` documents, and `kubectl` helpers against it.

use std::ffi::OsStr;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::binaries::ControlPlaneBinaries;
use crate::process::{Process, free_ports, http_get, tail};
use crate::{KEEP_VAR, certs, poll};

/// How long each component gets to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The `--request-timeout` of every kubectl call, so that none can hang.
const KUBECTL_REQUEST_TIMEOUT: &str = "--request-timeout=30s";

/// A running local control plane: etcd, kube-apiserver (RBAC, the default admission plugins,
/// ServiceAccount included, plus OwnerReferencesPermissionEnforcement) and kube-controller-manager (every default controller: Pods of
/// Deployments and Jobs are created, namespaces get their `default` ServiceAccount, garbage
/// collection runs). There is no scheduler and no kubelet: Pods stay Pending.
///
/// Dropping it kills every process and removes its temporary directory (kept when
/// `SIDECAR_INJECTOR_E2E_KEEP=1`); while the thread panics, the tails of the logs are printed
/// first.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    address: Ipv4Addr,
    binaries: ControlPlaneBinaries,
    kubeconfig: PathBuf,
    api_port: u16,
    /// In start order; stopped in reverse.
    processes: Mutex<Vec<Process>>,
    namespaces: AtomicU32,
    operators: AtomicU32,
    static_policies: bool,
    controller_manager_args: Vec<String>,
}

/// Where a [`ControlPlane`] serves.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// The API server's bind and advertise address: 127.0.0.1, or the node's bridge address
    /// so that Pods reach it through the `kubernetes` Service.
    pub address: Ipv4Addr,
    /// Load static ValidatingAdmissionPolicies from [`ControlPlane::static_policy_dir`] (the
    /// `staticManifestsDir` of the plugin's configuration; Kubernetes 1.37+, where the
    /// `ManifestBasedAdmissionControlConfig` feature is on by default). The API server reads
    /// the directory again every minute, so a test may write its manifests once the plane runs.
    pub static_policies: bool,
    /// More kube-controller-manager flags, appended last (a benchmark raises its client
    /// limits, `--kube-api-qps`, so that admission, not the controller, is the bottleneck).
    pub controller_manager_args: Vec<String>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            address: Ipv4Addr::LOCALHOST,
            static_policies: false,
            controller_manager_args: Vec::new(),
        }
    }
}

impl ControlPlane {
    /// Builds (when not cached) or finds the binaries, generates certificates, starts etcd,
    /// kube-apiserver and kube-controller-manager on free ports, and waits until the API server
    /// is ready and the controller manager has created the `default` ServiceAccount.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(ControlPlaneOptions::default())
    }

    /// [`ControlPlane::start`] with the API server on `options.address`.
    pub fn start_with(options: ControlPlaneOptions) -> anyhow::Result<Self> {
        let binaries = ControlPlaneBinaries::locate()?;
        let started = Instant::now();
        let dir = temp_dir()?;
        let mut plane = Self {
            kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            address: options.address,
            binaries,
            api_port: 0,
            processes: Mutex::new(Vec::new()),
            namespaces: AtomicU32::new(0),
            operators: AtomicU32::new(0),
            static_policies: options.static_policies,
            controller_manager_args: options.controller_manager_args,
        };
        if let Err(e) = plane.boot() {
            plane.print_logs(40);
            return Err(e.context("the control plane did not start"));
        }
        let version = plane.kubectl_ok(&["version", "-o", "json"]).ok();
        let version = version
            .and_then(|json| serde_json::from_str::<serde_json::Value>(&json).ok())
            .and_then(|v| v["serverVersion"]["gitVersion"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "of unknown version".to_owned());
        eprintln!(
            "[e2e] control plane {version} ready in {:.1?} at {} (dir {})",
            started.elapsed(),
            plane.server_url(),
            plane.dir.display()
        );
        Ok(plane)
    }

    fn boot(&mut self) -> anyhow::Result<()> {
        let certs = certs::write(&self.dir, self.address)?;
        let [etcd_port, peer_port, api_port, kcm_port] = free_ports::<4>()?;
        self.api_port = api_port;
        let path = |p: &Path| p.display().to_string();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_data = self.dir.join("etcd");
        self.spawn(
            "etcd",
            &self.binaries.etcd.clone(),
            vec![
                "--name".to_owned(),
                "e2e".to_owned(),
                "--data-dir".to_owned(),
                path(&etcd_data),
                "--listen-client-urls".to_owned(),
                etcd_url.clone(),
                "--advertise-client-urls".to_owned(),
                etcd_url.clone(),
                "--listen-peer-urls".to_owned(),
                peer_url.clone(),
                "--initial-advertise-peer-urls".to_owned(),
                peer_url.clone(),
                "--initial-cluster".to_owned(),
                format!("e2e={peer_url}"),
                "--unsafe-no-fsync".to_owned(),
            ],
        )?;
        self.wait("etcd /health", || {
            Ok(http_get(etcd_port, "/health", Duration::from_secs(2))
                .ok()
                .filter(|(status, body)| *status == 200 && body.contains("true"))
                .map(|_| ()))
        })?;

        let address = self.address;
        let mut apiserver_args = vec![
            format!("--bind-address={address}"),
            format!("--secure-port={api_port}"),
            format!("--advertise-address={address}"),
        ];
        if address.is_loopback() {
            // The `kubernetes` Service may not have a loopback endpoint: without Pods, it needs
            // none. On the node's bridge address, the default reconciler publishes it.
            apiserver_args.push("--endpoint-reconciler-type=none".to_owned());
        }
        apiserver_args.extend([
            format!("--etcd-servers={etcd_url}"),
            format!("--client-ca-file={}", path(&certs.ca_cert)),
            format!("--tls-cert-file={}", path(&certs.apiserver_cert)),
            format!("--tls-private-key-file={}", path(&certs.apiserver_key)),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", path(&certs.sa_public)),
            format!(
                "--service-account-signing-key-file={}",
                path(&certs.sa_private)
            ),
            "--service-cluster-ip-range=10.96.0.0/24".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            // As in OpenShift: changing an object's owner references needs the right to
            // delete it, which the chart's RBAC must allow for the operator's adoptions.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".to_owned(),
            "--allow-privileged=true".to_owned(),
            // Reach a kubelet by its Node's InternalIP, never by resolving its host name,
            // and authenticate to it with the admin's certificate.
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            format!("--kubelet-client-certificate={}", path(&certs.admin_cert)),
            format!("--kubelet-client-key={}", path(&certs.admin_key)),
        ]);
        if self.static_policies {
            let policies = self.dir.join("static-policies");
            std::fs::create_dir_all(&policies)?;
            let config = self.dir.join("admission-configuration.yaml");
            std::fs::write(
                &config,
                format!(
                    "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
                     \x20 - name: ValidatingAdmissionPolicy\n    configuration:\n\
                     \x20     apiVersion: apiserver.config.k8s.io/v1\n\
                     \x20     kind: ValidatingAdmissionPolicyConfiguration\n\
                     \x20     staticManifestsDir: {}\n",
                    path(&policies)
                ),
            )?;
            apiserver_args.push(format!("--admission-control-config-file={}", path(&config)));
        }
        self.spawn(
            "kube-apiserver",
            &self.binaries.kube_apiserver.clone(),
            apiserver_args,
        )?;
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.server_url(),
                "certificate-authority": path(&certs.ca_cert),
            }}],
            "users": [{"name": "admin", "user": {
                "client-certificate": path(&certs.admin_cert),
                "client-key": path(&certs.admin_key),
            }}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        });
        // JSON is YAML: kubectl and kube-rs both read it.
        std::fs::write(&self.kubeconfig, serde_json::to_vec_pretty(&kubeconfig)?)
            .with_context(|| format!("cannot write {}", self.kubeconfig.display()))?;
        self.wait("kube-apiserver /readyz", || {
            let out = self.kubectl(&["get", "--raw", "/readyz"])?;
            Ok(
                (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
                    .then_some(()),
            )
        })?;

        let kubeconfig = path(&self.kubeconfig);
        self.spawn(
            "kube-controller-manager",
            &self.binaries.kube_controller_manager.clone(),
            vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--authentication-skip-lookup=true".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={kcm_port}"),
                format!(
                    "--service-account-private-key-file={}",
                    path(&certs.sa_private)
                ),
                format!("--root-ca-file={}", path(&certs.ca_cert)),
                "--use-service-account-credentials=true".to_owned(),
                "--leader-elect=false".to_owned(),
                "--controllers=*".to_owned(),
            ]
            .into_iter()
            .chain(self.controller_manager_args.iter().cloned())
            .collect(),
        )?;
        self.wait("the default ServiceAccount of namespace default", || {
            Ok(self
                .try_get_json("serviceaccount", Some("default"), "default")?
                .map(|_| ()))
        })?;
        Ok(())
    }

    fn spawn(&self, name: &str, program: &Path, args: Vec<String>) -> anyhow::Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let process = Process::spawn(name, program, args, &self.dir, log, &[])?;
        self.lock_processes().push(process);
        Ok(())
    }

    /// Polls `check` for up to [`START_TIMEOUT`], failing at once when a process has exited.
    fn wait(
        &self,
        what: &str,
        mut check: impl FnMut() -> anyhow::Result<Option<()>>,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        poll(START_TIMEOUT, what, || {
            self.check_running()?;
            check()
        })?;
        eprintln!("[e2e] {what}: ready after {:.1?}", started.elapsed());
        Ok(())
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Vec<Process>> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An error, with the end of its log, when a control plane process has exited.
    pub fn check_running(&self) -> anyhow::Result<()> {
        self.lock_processes()
            .iter_mut()
            .try_for_each(Process::check_running)
    }

    /// The temporary directory: certificates, the kubeconfig, etcd's data and every log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory the API server loads static ValidatingAdmissionPolicies from, when
    /// started with [`ControlPlaneOptions::static_policies`].
    pub fn static_policy_dir(&self) -> Option<PathBuf> {
        self.static_policies
            .then(|| self.dir.join("static-policies"))
    }

    /// The admin kubeconfig (`O=system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes, at `path`, a kubeconfig for this API server that authenticates with `token`
    /// (such as a ServiceAccount token from `kubectl create token`) instead of the admin's
    /// client certificate.
    pub fn write_token_kubeconfig(&self, token: &str, path: &Path) -> anyhow::Result<()> {
        let admin: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&self.kubeconfig)
                .with_context(|| format!("cannot read {}", self.kubeconfig.display()))?,
        )?;
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": "token", "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "token"}}],
            "current-context": "e2e",
        });
        std::fs::write(path, serde_json::to_vec_pretty(&kubeconfig)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Writes, at `path`, the admin kubeconfig impersonating `user` in `groups` (`as`,
    /// `as-groups`): what that user may do, through the admin's credentials.
    pub fn write_impersonating_kubeconfig(
        &self,
        user: &str,
        groups: &[&str],
        path: &Path,
    ) -> anyhow::Result<()> {
        let mut config: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&self.kubeconfig)
                .with_context(|| format!("cannot read {}", self.kubeconfig.display()))?,
        )?;
        let users = config["users"]
            .as_array_mut()
            .context("no users in the kubeconfig")?;
        for entry in users {
            entry["user"]["as"] = json!(user);
            entry["user"]["as-groups"] = json!(groups);
        }
        std::fs::write(path, serde_json::to_vec(&config)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// The kubectl binary (of the API server's version).
    pub fn kubectl_path(&self) -> &Path {
        &self.binaries.kubectl
    }

    /// The API server's URL.
    pub fn server_url(&self) -> String {
        format!("https://{}:{}", self.address, self.api_port)
    }

    /// The cluster's CA certificate (it signed the API server's and the admin's).
    pub fn ca_cert_path(&self) -> PathBuf {
        self.dir.join(certs::CA_CERT)
    }

    /// A `kubectl` command with `KUBECONFIG` set to the admin kubeconfig and a request
    /// timeout, ready for more arguments.
    pub fn kubectl_command(&self) -> Command {
        let mut command = Command::new(&self.binaries.kubectl);
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .arg(KUBECTL_REQUEST_TIMEOUT)
            .stdin(Stdio::null());
        command
    }

    /// Runs `kubectl ARGS` and returns its output, whatever its exit status.
    pub fn kubectl<S: AsRef<OsStr>>(&self, args: &[S]) -> anyhow::Result<Output> {
        self.kubectl_command()
            .args(args)
            .output()
            .context("cannot run kubectl")
    }

    /// Runs `kubectl ARGS` with `stdin` as its standard input, whatever its exit status.
    pub fn kubectl_with_stdin<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        stdin: &str,
    ) -> anyhow::Result<Output> {
        let mut child = self
            .kubectl_command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run kubectl")?;
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    /// Runs `kubectl ARGS` and returns its standard output; an error, with the arguments and
    /// standard error, when it fails.
    pub fn kubectl_ok<S: AsRef<OsStr>>(&self, args: &[S]) -> anyhow::Result<String> {
        checked(args, self.kubectl(args)?)
    }

    /// Whether the API server serves MutatingAdmissionPolicies (`admissionregistration.k8s.io/v1`,
    /// Kubernetes 1.36+).
    pub fn serves_mutating_admission_policies(&self) -> anyhow::Result<bool> {
        Ok(self
            .kubectl_ok(&[
                "api-resources",
                "--api-group=admissionregistration.k8s.io",
                "-o",
                "name",
            ])?
            .lines()
            .any(|l| l == "mutatingadmissionpolicies.admissionregistration.k8s.io"))
    }

    /// `kubectl apply -f PATH` (a file or a directory).
    pub fn apply_file(&self, path: &Path) -> anyhow::Result<String> {
        self.kubectl_ok(&[OsStr::new("apply"), OsStr::new("-f"), path.as_os_str()])
    }

    /// `kubectl apply -f -` with `yaml` (YAML or JSON, several documents allowed).
    pub fn apply_yaml(&self, yaml: &str) -> anyhow::Result<String> {
        let args = ["apply", "-f", "-"];
        checked(&args, self.kubectl_with_stdin(&args, yaml)?)
    }

    /// `kubectl get KIND NAME [-n NS] -o json`.
    pub fn get_json(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<Value> {
        self.try_get_json(kind, namespace, name)?
            .with_context(|| match namespace {
                Some(ns) => format!("{kind} {ns}/{name} not found"),
                None => format!("{kind} {name} not found"),
            })
    }

    /// Like [`ControlPlane::get_json`], `None` when the object does not exist.
    pub fn try_get_json(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<Option<Value>> {
        let mut args = vec!["get", kind, name, "-o", "json", "--ignore-not-found"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let out = self.kubectl_ok(&args)?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&out).with_context(|| {
            format!("kubectl get {kind} {name}: not JSON: {out}")
        })?))
    }

    /// `kubectl get KIND [-n NS] [-l SELECTOR] -o json`: the items.
    pub fn list_json(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: Option<&str>,
    ) -> anyhow::Result<Vec<Value>> {
        let mut args = vec!["get", kind, "-o", "json"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        if let Some(selector) = selector {
            args.extend(["-l", selector]);
        }
        let list: Value = serde_json::from_str(&self.kubectl_ok(&args)?)?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Creates a fresh namespace named `PREFIX-N` with `labels`, waits for its `default`
    /// ServiceAccount (which Pods need to be admitted), and returns its name.
    pub fn namespace(&self, prefix: &str, labels: &[(&str, &str)]) -> anyhow::Result<String> {
        let n = self.namespaces.fetch_add(1, Ordering::Relaxed) + 1;
        let name = format!("{prefix}-{n}");
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        let manifest = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        });
        self.apply_yaml(&manifest.to_string())?;
        self.wait_for_service_account(&name)?;
        Ok(name)
    }

    /// Waits (up to 30 s) until namespace `namespace` has its `default` ServiceAccount.
    pub fn wait_for_service_account(&self, namespace: &str) -> anyhow::Result<()> {
        poll(
            Duration::from_secs(30),
            &format!("the default ServiceAccount of namespace {namespace}"),
            || {
                Ok(self
                    .try_get_json("serviceaccount", Some(namespace), "default")?
                    .map(|_| ()))
            },
        )
    }

    /// A new path prefix for an operator's log files, in the control plane's directory.
    pub(crate) fn next_operator_log_prefix(&self) -> PathBuf {
        let n = self.operators.fetch_add(1, Ordering::Relaxed) + 1;
        self.dir.join(format!("sidecar-injector-{n}"))
    }

    /// The last `lines` lines of each process's log.
    pub fn log_tails(&self, lines: usize) -> String {
        self.lock_processes()
            .iter()
            .map(|p| {
                format!(
                    "----- {} ({}) -----\n{}\n",
                    p.name(),
                    p.log().display(),
                    tail(p.log(), lines)
                )
            })
            .collect()
    }

    /// Prints [`ControlPlane::log_tails`] on standard error.
    pub fn print_logs(&self, lines: usize) {
        eprintln!("{}", self.log_tails(lines));
    }

    /// The pids of the running processes, by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.lock_processes()
            .iter()
            .filter_map(|p| p.pid().map(|pid| (p.name().to_owned(), pid)))
            .collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs(40);
        }
        let mut processes = self.lock_processes();
        while let Some(mut process) = processes.pop() {
            process.kill();
        }
        drop(processes);
        if std::env::var(KEEP_VAR).is_ok_and(|v| v == "1") {
            eprintln!("[e2e] kept {}", self.dir.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("[e2e] cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// A new directory under the system's temporary directory.
fn temp_dir() -> anyhow::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "sidecar-injector-e2e-{}-{nanos:09}",
        std::process::id()
    ));
    std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// The standard output of a successful command, or an error with its standard error.
fn checked<S: AsRef<OsStr>>(args: &[S], out: Output) -> anyhow::Result<String> {
    if !out.status.success() {
        let args: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        bail!(
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
