//! [`Cluster`]: the local control plane plus a real node, so that Pods run: containerd (with
//! runc and the CNI bridge plugin) and the kubelet, kube-scheduler and kube-proxy (iptables
//! mode), on a bridge `cni0` (10.244.0.1/24) that the harness creates, with images built here
//! (`images`) and never pulled.
//!
//! Everything stays on the machine: the API server and the kubelet serve on the bridge address
//! (127.0.0.1 for everything else), the API server reaches the kubelet by its InternalIP, Pods
//! get no nameserver, every registry host is mirrored to a closed local port, and the pod range
//! is fenced to its bridge (see `host`). Dropping the cluster, also while a test panics, stops
//! everything and puts the machine back as it was.

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use crate::binaries::{NodeBinaries, node_binaries};
use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::host::{self, BRIDGE, BRIDGE_ADDRESS, HostSnapshot, POD_CIDR};
use crate::images;
use crate::poll;
use crate::process::{Process, free_ports, tail};
use std::sync::Mutex;

/// The Node's name (the kubelet's `--hostname-override`, never resolved).
pub const NODE_NAME: &str = "sidecar-injector-node";

/// Where every registry host is sent: a closed port on loopback, so that a pull can only fail,
/// and only here.
const NO_REGISTRY: &str = "http://127.0.0.1:1";

/// How long the node gets to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The local control plane with a real node. Derefs to its [`ControlPlane`].
///
/// Needs root and the host packages (`e2e/node/host-packages.sh`). One per machine: a second
/// waits for the first (a file lock).
#[derive(Debug)]
pub struct Cluster {
    // Dropped in this order: the node (its processes, containers and mounts), the control
    // plane (and its directory), then the machine's snapshot is restored, then the lock freed.
    node: Node,
    plane: ControlPlane,
    _restore: Restore,
    _lock: File,
}

/// The node's processes, in start order. Dropping it stops them and their containers, and
/// unmounts what they mounted.
#[derive(Debug)]
struct Node {
    dir: PathBuf,
    containerd_socket: PathBuf,
    processes: Mutex<Vec<Process>>,
}

/// Puts the machine back as its snapshot says when dropped.
#[derive(Debug)]
struct Restore(HostSnapshot);

impl Drop for Restore {
    fn drop(&mut self) {
        let problems = self.0.restore();
        if !problems.is_empty() {
            eprintln!(
                "[e2e] these could not be put back as they were:\n  {}",
                problems.join("\n  ")
            );
        }
    }
}

impl Cluster {
    /// Takes the machine's lock and a snapshot of what the node may change, creates the bridge
    /// and its fence, starts the control plane on the bridge address, then containerd (and
    /// imports the images), kube-scheduler, the kubelet and kube-proxy, and waits until the
    /// node is Ready and a first Pod ran.
    pub fn start() -> anyhow::Result<Self> {
        preflight()?;
        let binaries = node_binaries()?;
        let started = Instant::now();
        // On an early return, the locals drop in reverse order: the node, the control plane,
        // then the snapshot is restored and the lock freed.
        let lock = host::lock()?;
        // Taken after the lock, so it never records another node's changes.
        let restore = Restore(HostSnapshot::take()?);
        host::create_network()?;
        let plane = ControlPlane::start_with(ControlPlaneOptions {
            address: BRIDGE_ADDRESS,
            ..ControlPlaneOptions::default()
        })?;
        let dir = plane.dir().join("node");
        std::fs::create_dir_all(&dir)?;
        let node = Node {
            containerd_socket: dir.join("containerd/containerd.sock"),
            dir,
            processes: Mutex::new(Vec::new()),
        };
        if let Err(e) = node.boot(&plane, &binaries) {
            eprintln!("{}", node.log_tails(40));
            return Err(e.context("the node did not start"));
        }
        let cluster = Self {
            node,
            plane,
            _restore: restore,
            _lock: lock,
        };
        cluster.first_pod()?;
        eprintln!(
            "[e2e] node {NODE_NAME} Ready and a first Pod ran, {:.1?} after start",
            started.elapsed()
        );
        Ok(cluster)
    }

    /// Runs a Pod to completion in `default`: proves sandboxes, the network and logs work.
    fn first_pod(&self) -> anyhow::Result<()> {
        let plane = &self.plane;
        let started = Instant::now();
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "node-probe", "namespace": "default"},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "probe",
                    "image": images::stand_in("busybox:1.36"),
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "echo node-probe-ok"],
                }],
            },
        });
        plane.apply_yaml(&pod.to_string())?;
        poll(Duration::from_secs(60), "the first Pod to succeed", || {
            self.check_running()?;
            let pod = plane.get_json("pod", Some("default"), "node-probe")?;
            match pod["status"]["phase"].as_str() {
                Some("Succeeded") => Ok(Some(())),
                Some("Failed") => bail!("the first Pod failed: {}", pod["status"]),
                _ => Ok(None),
            }
        })?;
        let logs = plane.kubectl_ok(&["logs", "-n", "default", "node-probe"])?;
        if logs.trim() != "node-probe-ok" {
            bail!("the first Pod's log is {logs:?}");
        }
        plane.kubectl_ok(&[
            "delete",
            "pod",
            "-n",
            "default",
            "node-probe",
            "--wait=false",
        ])?;
        eprintln!(
            "[e2e] first Pod created, ran and logged in {:.1?}",
            started.elapsed()
        );
        Ok(())
    }

    /// The control plane.
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// An error, with the end of its log, when a process of the node or the control plane
    /// has exited.
    pub fn check_running(&self) -> anyhow::Result<()> {
        self.node.check_running()?;
        self.plane.check_running()
    }

    /// The last `lines` lines of every log of the node and the control plane.
    pub fn log_tails(&self, lines: usize) -> String {
        format!(
            "{}{}",
            self.node.log_tails(lines),
            self.plane.log_tails(lines)
        )
    }

    /// Imports the OCI archive `archive` (such as `just image`'s) into the node's containerd.
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        self.node.import(archive)
    }

    /// The node's directory (containerd's root and state, the kubelet's, the node's logs).
    pub fn node_dir(&self) -> &Path {
        &self.node.dir
    }
}

impl Deref for Cluster {
    type Target = ControlPlane;

    fn deref(&self) -> &ControlPlane {
        &self.plane
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let started = Instant::now();
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails(40));
        }
        let problems = self.stop();
        if problems.is_empty() {
            eprintln!(
                "[e2e] node stopped (processes, containers, mounts) in {:.1?}",
                started.elapsed()
            );
        } else {
            eprintln!(
                "[e2e] node stopped, with problems:\n  {}",
                problems.join("\n  ")
            );
        }
    }
}

impl Node {
    /// Starts containerd (and imports the images), kube-scheduler, the kubelet and kube-proxy,
    /// waits until the node is Ready and kube-proxy has synced, then puts the fence back on top.
    fn boot(&self, plane: &ControlPlane, binaries: &NodeBinaries) -> anyhow::Result<()> {
        let started = Instant::now();
        self.start_containerd()?;
        self.import_images()?;
        eprintln!(
            "[e2e] containerd up and images imported in {:.1?}",
            started.elapsed()
        );
        self.start_kubernetes(plane, binaries)?;
        let started = Instant::now();
        poll(READY_TIMEOUT, "the node to be Ready", || {
            self.check_running()?;
            let ready = plane
                .try_get_json("node", None, NODE_NAME)?
                .and_then(|n| {
                    n["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .find(|c| c["type"] == "Ready")
                        .map(|c| c["status"] == "True")
                })
                .unwrap_or(false);
            Ok(ready.then_some(()))
        })?;
        eprintln!("[e2e] node Ready after {:.1?}", started.elapsed());
        // kube-proxy puts its jumps first in INPUT and FORWARD once it has synced, one after
        // the other, and never moves them again: the fence goes on top after the last one
        // (the load balancer firewall's in FORWARD, which follows KUBE-FORWARD), or it would
        // stay second.
        poll(Duration::from_secs(30), "kube-proxy's first sync", || {
            self.check_running()?;
            let out = Command::new("iptables")
                .args(["-w", "-S", "FORWARD"])
                .output()?;
            let rules = String::from_utf8_lossy(&out.stdout);
            Ok(
                (rules.contains("-j KUBE-FORWARD") && rules.contains("-j KUBE-PROXY-FIREWALL"))
                    .then_some(()),
            )
        })?;
        host::fence_on_top()
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Vec<Process>> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn spawn(&self, name: &str, program: &Path, args: Vec<String>) -> anyhow::Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let process = Process::spawn(name, program, args, &self.dir, log, &[])?;
        self.lock_processes().push(process);
        Ok(())
    }

    fn check_running(&self) -> anyhow::Result<()> {
        self.lock_processes()
            .iter_mut()
            .try_for_each(Process::check_running)
    }

    fn log_tails(&self, lines: usize) -> String {
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

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    fn start_containerd(&self) -> anyhow::Result<()> {
        let p = |relative: &str| self.path(relative).display().to_string();
        for dir in [
            "containerd",
            "cni/net.d",
            "cni/bin",
            "images",
            "hosts/_default",
        ] {
            std::fs::create_dir_all(self.path(dir))?;
        }
        // Every registry host, ours and any other (`_default`), is sent to a closed local port.
        // containerd 1.6 ignores `server` alone and then falls back to the registry's own host;
        // with a [host] entry, that entry is the only one it tries (checked with ctr).
        let hosts_toml = format!(
            "server = \"{NO_REGISTRY}\"\n[host.\"{NO_REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        for registry in [
            "_default",
            images::STAND_IN_HOST,
            "sidecar-injector.invalid",
        ] {
            let dir = self.path(&format!("hosts/{registry}"));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("hosts.toml"), &hosts_toml)?;
        }
        for plugin in ["bridge", "host-local", "portmap", "loopback"] {
            let target = self.path(&format!("cni/bin/{plugin}"));
            std::fs::copy(Path::new("/usr/lib/cni").join(plugin), &target)
                .with_context(|| format!("cannot copy the CNI plugin {plugin}"))?;
        }
        let network = json!({
            "cniVersion": "1.0.0",
            "name": "sidecar-injector-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    // No masquerading: pod traffic never leaves the machine anyway.
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": BRIDGE_ADDRESS.to_string()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": p("cni/ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        std::fs::write(
            self.path("cni/net.d/10-sidecar-injector-e2e.conflist"),
            serde_json::to_vec_pretty(&network)?,
        )?;
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
# Plugins that would write outside the node's directory, or that this node has no use for.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This machine refuses a negative oom_score_adj, which runc would otherwise set.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
"#,
            root = p("containerd/root"),
            state = p("containerd/state"),
            socket = self.containerd_socket.display(),
            pause = images::PAUSE_IMAGE,
            runc = p("containerd/runc"),
            cni_bin = p("cni/bin"),
            cni_conf = p("cni/net.d"),
            hosts = p("hosts"),
        );
        let config_path = self.path("containerd/config.toml");
        std::fs::write(&config_path, config)?;
        self.spawn(
            "containerd",
            Path::new("/usr/bin/containerd"),
            vec!["--config".to_owned(), config_path.display().to_string()],
        )?;
        poll(Duration::from_secs(30), "containerd to answer", || {
            self.check_running()?;
            Ok(self
                .ctr(&["version"])
                .ok()
                .filter(|o| o.status.success())
                .map(|_| ()))
        })
    }

    fn ctr(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.containerd_socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run ctr")
    }

    fn import_images(&self) -> anyhow::Result<()> {
        for archive in images::build_all(&self.path("images"))? {
            self.import(&archive)?;
        }
        Ok(())
    }

    fn import(&self, archive: &Path) -> anyhow::Result<()> {
        let archive = archive.display().to_string();
        let out = self.ctr(&["images", "import", &archive])?;
        if !out.status.success() {
            bail!(
                "ctr images import {archive} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn start_kubernetes(
        &self,
        plane: &ControlPlane,
        binaries: &NodeBinaries,
    ) -> anyhow::Result<()> {
        let p = |relative: &str| self.path(relative).display().to_string();
        let kubeconfig = plane.kubeconfig_path().display().to_string();
        let [
            scheduler_port,
            kubelet_healthz,
            proxy_healthz,
            proxy_metrics,
        ] = free_ports::<4>()?;

        self.spawn(
            "kube-scheduler",
            &binaries.kube_scheduler,
            vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--authentication-skip-lookup=true".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={scheduler_port}"),
                "--leader-elect=false".to_owned(),
            ],
        )?;

        // No nameserver: nothing in a Pod resolves a name through the machine's resolver.
        std::fs::write(self.path("resolv.conf"), "options ndots:1\n")?;
        let kubelet_config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": BRIDGE_ADDRESS.to_string(),
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": kubelet_healthz,
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": false},
                "x509": {"clientCAFile": plane.ca_cert_path().display().to_string()},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            // Kubernetes 1.34 still runs on cgroup v1 (this machine's) when told to.
            "failCgroupV1": false,
            "failSwapOn": false,
            // The kubelet may not change kernel settings... but it checks them when true, so
            // false, and the harness puts back what it changed.
            "protectKernelDefaults": false,
            "enforceNodeAllocatable": [],
            // runc cannot set a negative oom_score_adj on this machine.
            "oomScoreAdj": 0,
            "containerRuntimeEndpoint": format!("unix://{}", self.containerd_socket.display()),
            "podLogsDir": p("pod-logs"),
            "volumePluginDir": p("volume-plugins"),
            "resolvConf": p("resolv.conf"),
            "clusterDomain": "cluster.local",
            "serializeImagePulls": false,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
        });
        let kubelet_config_path = self.path("kubelet.json");
        std::fs::write(
            &kubelet_config_path,
            serde_json::to_vec_pretty(&kubelet_config)?,
        )?;
        self.spawn(
            "kubelet",
            &binaries.kubelet,
            vec![
                format!("--config={}", kubelet_config_path.display()),
                format!("--kubeconfig={kubeconfig}"),
                format!("--root-dir={}", p("kubelet")),
                format!("--cert-dir={}", p("kubelet/pki")),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={BRIDGE_ADDRESS}"),
            ],
        )?;

        let proxy_config = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": NODE_NAME,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": format!("127.0.0.1:{proxy_healthz}"),
            "metricsBindAddress": format!("127.0.0.1:{proxy_metrics}"),
            // NodePorts only on the bridge address, never on the machine's other interfaces
            // nor on loopback (which would need route_localnet).
            "nodePortAddresses": [format!("{BRIDGE_ADDRESS}/32")],
            "iptables": {"localhostNodePorts": false},
            // Zero: leave the machine's conntrack settings as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        });
        let proxy_config_path = self.path("kube-proxy.json");
        std::fs::write(
            &proxy_config_path,
            serde_json::to_vec_pretty(&proxy_config)?,
        )?;
        self.spawn(
            "kube-proxy",
            &binaries.kube_proxy,
            vec![format!("--config={}", proxy_config_path.display())],
        )
    }

    /// Stops everything and unmounts what the node mounted; returns what went wrong.
    fn stop(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut processes = std::mem::take(&mut *self.lock_processes());
        // Newest first; containerd last, after its containers.
        let containerd = if processes.first().is_some_and(|p| p.name() == "containerd") {
            Some(processes.remove(0))
        } else {
            None
        };
        while let Some(mut process) = processes.pop() {
            process.kill();
        }
        // The containers outlive the kubelet and even containerd (their shims keep them): kill
        // every process in the Pods' cgroups, then the shims of this containerd.
        let stopped = poll(
            Duration::from_secs(20),
            "the Pods' processes to exit",
            || {
                let pids: Vec<u32> = host::top_cgroups("kubepods")
                    .iter()
                    .flat_map(|c| host::cgroup_pids(c))
                    .collect();
                host::kill_all(&pids);
                Ok(pids.is_empty().then_some(()))
            },
        );
        if let Err(e) = stopped {
            problems.push(format!("{e:#}"));
        }
        let socket = self.containerd_socket.display().to_string();
        host::kill_all(&host::pids_with_argument("containerd-shim", &socket));
        if let Some(mut containerd) = containerd
            && let Err(e) = containerd.terminate(Duration::from_secs(10))
        {
            problems.push(format!("{e:#}"));
        }
        let shims = poll(Duration::from_secs(10), "the shims to exit", || {
            let pids = host::pids_with_argument("containerd-shim", &socket);
            host::kill_all(&pids);
            Ok(pids.is_empty().then_some(()))
        });
        if let Err(e) = shims {
            problems.push(format!("{e:#}"));
        }
        problems.extend(host::unmount_all(&self.dir));
        problems
    }
}

/// Root, and the host packages, or a clear error saying what to do.
fn preflight() -> anyhow::Result<()> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_owned))
        });
    if uid.as_deref() != Some("0") {
        bail!("the node needs root (it creates a bridge, iptables rules, mounts and cgroups)");
    }
    let script = crate::workspace_root().join("e2e/node/host-packages.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg("--check")
        .status()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !status.success() {
        bail!(
            "the node's host packages are missing: run `just node-packages` (bash {})",
            script.display()
        );
    }
    Ok(())
}
