//! What a node changes on the machine, and putting it back: a snapshot taken before the node
//! starts (iptables and ip6tables rules and chains, the sysctls the kubelet, kube-proxy and the
//! CNI plugins may set, the top-level cgroups, the directories they may create), and
//! [`HostSnapshot::restore`], which removes or resets whatever differs afterwards.
//!
//! Also the pod network's bridge and its fence, and the machine-wide lock that keeps this to
//! one node per machine.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The pod network's bridge.
pub const BRIDGE: &str = "cni0";
/// The bridge's address: the Pods' gateway, the kubelet's node IP and the API server's address.
pub const BRIDGE_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 244, 0, 1);
/// The Pods' addresses.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The Services' ClusterIPs.
pub const SERVICE_CIDR: &str = "10.96.0.0/24";

/// The chain, first in FORWARD, that drops pod traffic leaving by another interface than the
/// bridge, and traffic for Pods arriving by another one.
pub const FENCE_FORWARD: &str = "SIDECAR-INJECTOR-FENCE";
/// The chain, first in INPUT, that drops traffic for the pod range (the bridge address) that
/// arrives by another interface than the bridge or loopback.
pub const FENCE_INPUT: &str = "SIDECAR-INJECTOR-FENCE-IN";

const IPTABLES: [&str; 2] = ["iptables", "ip6tables"];
const TABLES: [&str; 4] = ["filter", "nat", "mangle", "raw"];

/// Sysctls the node may change: the CNI bridge plugin turns forwarding on; a kubelet without
/// `protectKernelDefaults` sets the panic and overcommit ones; kube-proxy the conntrack and
/// localnet ones. Those that do not exist are skipped.
const SYSCTLS: [&str; 14] = [
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
];

/// Directories containerd, the kubelet and the CNI plugins create at fixed places whatever
/// their configuration says (the shims' sockets under /run/containerd, libcni's cache, …);
/// removed afterwards when they did not exist before.
const FIXED_PATHS: [&str; 12] = [
    "/run/containerd",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/cni",
    "/etc/kubernetes",
    "/run/netns",
    "/var/run/kubernetes",
    "/usr/libexec/kubernetes",
    "/opt/cni",
];

/// The machine as it was before the node started.
#[derive(Debug)]
pub(crate) struct HostSnapshot {
    /// `-S` of each (binary, table).
    iptables: Vec<(&'static str, &'static str, Vec<String>)>,
    /// `nft list tables`: iptables-nft creates a table on first use, and leaves it empty.
    nft_tables: Vec<String>,
    sysctls: Vec<(&'static str, String)>,
    /// The top-level directories of each cgroup hierarchy.
    cgroups: Vec<(PathBuf, Vec<PathBuf>)>,
    missing_paths: Vec<&'static str>,
    bridge_existed: bool,
}

impl HostSnapshot {
    pub(crate) fn take() -> anyhow::Result<Self> {
        let mut iptables = Vec::new();
        for binary in IPTABLES {
            for table in TABLES {
                iptables.push((binary, table, rules(binary, table)?));
            }
        }
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|name| Some((*name, read_sysctl(name)?)))
            .collect();
        let cgroups = cgroup_hierarchies()
            .into_iter()
            .map(|h| {
                let children = subdirectories(&h);
                (h, children)
            })
            .collect();
        let missing_paths = FIXED_PATHS
            .into_iter()
            .filter(|p| !Path::new(p).exists())
            .collect();
        Ok(Self {
            iptables,
            nft_tables: nft_tables()?,
            sysctls,
            cgroups,
            missing_paths,
            bridge_existed: Path::new("/sys/class/net").join(BRIDGE).exists(),
        })
    }

    /// Puts back what differs from the snapshot; returns what could not be put back. Every
    /// process of the node must have exited (or kube-proxy would restore its rules).
    pub(crate) fn restore(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (binary, table, before) in &self.iptables {
            if let Err(e) = restore_table(binary, table, before) {
                problems.push(format!("{binary} -t {table}: {e:#}"));
            }
        }
        match nft_tables() {
            Ok(now) => {
                for table in now.iter().filter(|t| !self.nft_tables.contains(t)) {
                    let words: Vec<&str> = table.split_whitespace().collect();
                    if let ["table", family, name] = words[..]
                        && let Err(e) = run("nft", &["delete", "table", family, name])
                    {
                        problems.push(format!("{e:#}"));
                    }
                }
            }
            Err(e) => problems.push(format!("{e:#}")),
        }
        if !self.bridge_existed && Path::new("/sys/class/net").join(BRIDGE).exists() {
            // Its address and the ClusterIP route go with it.
            if let Err(e) = run("ip", &["link", "del", BRIDGE]) {
                problems.push(format!("{e:#}"));
            }
        }
        for (name, value) in &self.sysctls {
            if read_sysctl(name).as_ref() != Some(value)
                && let Err(e) = std::fs::write(Path::new("/proc/sys").join(name), value)
            {
                problems.push(format!("cannot reset {name} to {value}: {e}"));
            }
        }
        for (hierarchy, before) in &self.cgroups {
            for child in subdirectories(hierarchy) {
                if !before.contains(&child)
                    && let Err(e) = remove_cgroup(&child)
                {
                    problems.push(format!("{e:#}"));
                }
            }
        }
        for path in &self.missing_paths {
            if Path::new(path).exists()
                && let Err(e) = std::fs::remove_dir_all(path)
            {
                problems.push(format!("cannot remove {path}: {e}"));
            }
        }
        problems
    }
}

/// Creates the bridge with its address, routes the ClusterIP range to it (so that a Service
/// without endpoints never sends to the default route), and puts the fence first in FORWARD
/// and INPUT.
pub(crate) fn create_network() -> anyhow::Result<()> {
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        bail!(
            "{BRIDGE} already exists: another node runs on this machine, or one was left \
             behind (remove it with `ip link del {BRIDGE}`)"
        );
    }
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{BRIDGE_ADDRESS}/24"),
            "dev",
            BRIDGE,
        ],
    )?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    run(
        "ip",
        &[
            "route",
            "add",
            SERVICE_CIDR,
            "dev",
            BRIDGE,
            "src",
            &BRIDGE_ADDRESS.to_string(),
        ],
    )?;
    for chain in [FENCE_FORWARD, FENCE_INPUT] {
        run("iptables", &["-N", chain])?;
    }
    let forward: [&[&str]; 2] = [
        &["-s", POD_CIDR, "!", "-o", BRIDGE, "-j", "DROP"],
        &["-d", POD_CIDR, "!", "-i", BRIDGE, "-j", "DROP"],
    ];
    for rule in forward {
        run("iptables", &[&["-A", FENCE_FORWARD][..], rule].concat())?;
    }
    let input: [&[&str]; 3] = [
        &["-i", "lo", "-j", "RETURN"],
        &["-i", BRIDGE, "-j", "RETURN"],
        &["-d", POD_CIDR, "-j", "DROP"],
    ];
    for rule in input {
        run("iptables", &[&["-A", FENCE_INPUT][..], rule].concat())?;
    }
    fence_on_top()
}

/// Moves the fence's jumps back to the top of FORWARD and INPUT (kube-proxy and the kubelet
/// insert their own jumps first when they start).
pub(crate) fn fence_on_top() -> anyhow::Result<()> {
    for (chain, fence) in [("FORWARD", FENCE_FORWARD), ("INPUT", FENCE_INPUT)] {
        if first_rule(chain)?.as_deref() == Some(&format!("-A {chain} -j {fence}")) {
            continue;
        }
        // Insert before deleting, so that there is no moment without the fence.
        run("iptables", &["-I", chain, "1", "-j", fence])?;
        let rules = rules("iptables", "filter")?;
        let jumps = rules
            .iter()
            .filter(|r| **r == format!("-A {chain} -j {fence}"))
            .count();
        for _ in 1..jumps {
            // -D removes the first match, which is the new one at the top: delete the last
            // instead, by its position.
            let position = chain_rules(&rules, chain)
                .iter()
                .rposition(|r| *r == format!("-A {chain} -j {fence}"))
                .map(|i| i + 1)
                .context("the fence's jump disappeared")?;
            run("iptables", &["-D", chain, &position.to_string()])?;
        }
    }
    Ok(())
}

/// Checks that the fence is in place: its jumps first in FORWARD and INPUT, and its rules as
/// [`create_network`] wrote them.
pub fn check_fence() -> anyhow::Result<()> {
    let rules = rules("iptables", "filter")?;
    for (chain, fence) in [("FORWARD", FENCE_FORWARD), ("INPUT", FENCE_INPUT)] {
        let first = chain_rules(&rules, chain).first().cloned();
        if first.as_deref() != Some(&format!("-A {chain} -j {fence}")) {
            bail!("the first rule of {chain} is {first:?}, not the jump to {fence}");
        }
    }
    let expected = [
        format!("-A {FENCE_FORWARD} -s {POD_CIDR} ! -o {BRIDGE} -j DROP"),
        format!("-A {FENCE_FORWARD} -d {POD_CIDR} ! -i {BRIDGE} -j DROP"),
        format!("-A {FENCE_INPUT} -i lo -j RETURN"),
        format!("-A {FENCE_INPUT} -i {BRIDGE} -j RETURN"),
        format!("-A {FENCE_INPUT} -d {POD_CIDR} -j DROP"),
    ];
    for rule in expected {
        if !rules.contains(&rule) {
            bail!(
                "the fence lacks `{rule}`; filter table:\n{}",
                rules.join("\n")
            );
        }
    }
    Ok(())
}

fn first_rule(chain: &str) -> anyhow::Result<Option<String>> {
    let rules = rules("iptables", "filter")?;
    Ok(chain_rules(&rules, chain).first().cloned())
}

fn chain_rules(rules: &[String], chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    rules
        .iter()
        .filter(|r| r.starts_with(&prefix))
        .cloned()
        .collect()
}

/// The machine-wide lock: one node per machine (the bridge, port 10250, the `/kubepods`
/// cgroups and iptables are shared). Blocks until the lock is free; released when the file is
/// closed, also when the process dies.
pub(crate) fn lock() -> anyhow::Result<File> {
    let path = std::env::temp_dir().join("sidecar-injector-node.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!(
            "[e2e] another node runs on this machine; waiting for {}",
            path.display()
        );
        file.lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
    }
    Ok(file)
}

/// `binary -t table -S`, one rule (or chain, or policy) per line.
fn rules(binary: &str, table: &str) -> anyhow::Result<Vec<String>> {
    let out = Command::new(binary)
        .args(["-w", "-t", table, "-S"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {binary}"))?;
    if !out.status.success() {
        bail!(
            "{binary} -t {table} -S failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// `nft list tables`, one `table FAMILY NAME` per line.
fn nft_tables() -> anyhow::Result<Vec<String>> {
    let out = Command::new("nft")
        .args(["list", "tables"])
        .stdin(Stdio::null())
        .output()
        .context("cannot run nft")?;
    if !out.status.success() {
        bail!(
            "nft list tables failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Deletes the rules and chains `table` has now and did not have in `before`, and resets the
/// built-in chains' policies.
fn restore_table(binary: &str, table: &str, before: &[String]) -> anyhow::Result<()> {
    let now = rules(binary, table)?;
    let mut remaining: HashMap<&str, usize> = HashMap::new();
    for line in before {
        *remaining.entry(line.as_str()).or_default() += 1;
    }
    let mut new_chains = Vec::new();
    let mut new_rules = Vec::new();
    for line in &now {
        match remaining.get_mut(line.as_str()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                if let Some(chain) = line.strip_prefix("-N ") {
                    new_chains.push(chain.to_owned());
                } else if line.starts_with("-A ") {
                    new_rules.push(line.clone());
                }
            }
        }
    }
    let iptables = |args: &[&str]| -> anyhow::Result<()> {
        run(binary, &[&["-w", "-t", table][..], args].concat())
    };
    // Rules in chains that were there before (the jumps into the new chains among them); the
    // new chains' own rules go with -F.
    for rule in &new_rules {
        let words = split_words(rule);
        let Some(chain) = words.get(1) else { continue };
        if new_chains.contains(chain) {
            continue;
        }
        let mut args: Vec<&str> = vec!["-D"];
        args.extend(words[1..].iter().map(String::as_str));
        iptables(&args)?;
    }
    for chain in &new_chains {
        iptables(&["-F", chain])?;
    }
    for chain in &new_chains {
        iptables(&["-X", chain])?;
    }
    for line in before {
        if let Some(policy) = line.strip_prefix("-P ") {
            let words: Vec<&str> = policy.split_whitespace().collect();
            if let [chain, target] = words[..] {
                iptables(&["-P", chain, target])?;
            }
        }
    }
    Ok(())
}

/// Splits a line of `iptables -S` into its words (double-quoted words, such as comments,
/// unquoted).
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn read_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()
        .map(|v| v.trim().to_owned())
}

/// The mounted cgroup hierarchies (v1: one per controller; v2: the one root).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    subdirectories(root)
        .into_iter()
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

/// The pids in cgroup `dir` and every cgroup below it.
pub(crate) fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for child in subdirectories(dir) {
        pids.extend(cgroup_pids(&child));
    }
    pids
}

/// The cgroups named `name` directly under each hierarchy (such as `kubepods`).
pub(crate) fn top_cgroups(name: &str) -> Vec<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .map(|h| h.join(name))
        .filter(|p| p.is_dir())
        .collect()
}

/// Removes cgroup `dir`, deepest first (a cgroup is removed with rmdir, once empty).
fn remove_cgroup(dir: &Path) -> anyhow::Result<()> {
    for child in subdirectories(dir) {
        remove_cgroup(&child)?;
    }
    std::fs::remove_dir(dir).with_context(|| format!("cannot remove cgroup {}", dir.display()))
}

/// The mount points under `dir` (from /proc/self/mountinfo), deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let prefix = format!("{}/", dir.display());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount)
        .filter(|m| m.starts_with(&prefix))
        .map(PathBuf::from)
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    mounts.dedup();
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.by_ref().take(3).collect();
            if let Ok(code) = u8::from_str_radix(&digits, 8) {
                out.push(char::from(code));
                continue;
            }
            out.push('\\');
            out.push_str(&digits);
        } else {
            out.push(c);
        }
    }
    out
}

/// Unmounts every mount point under `dir`, deepest first (lazily when busy).
pub(crate) fn unmount_all(dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for mount in mounts_under(dir) {
        let mount = mount.display().to_string();
        if run("umount", &[&mount]).is_err()
            && let Err(e) = run("umount", &["-l", &mount])
        {
            problems.push(format!("{e:#}"));
        }
    }
    problems
}

/// Runs `program args`; an error with its standard error when it fails.
pub(crate) fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Sends SIGKILL to `pids` (those already gone are ignored).
pub(crate) fn kill_all(pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg("-KILL")
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The pids of the processes whose command line contains `needle` (such as a containerd
/// socket path, which its shims are started with).
pub(crate) fn pids_with_argument(program_prefix: &str, needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let program = args
                .first()
                .and_then(|a| Path::new(a).file_name()?.to_str().map(str::to_owned))
                .unwrap_or_default();
            program.starts_with(program_prefix) && args.iter().any(|a| a.contains(needle))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn splits_iptables_lines() {
        assert_eq!(
            split_words(
                r#"-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD"#
            ),
            [
                "-A",
                "FORWARD",
                "-m",
                "comment",
                "--comment",
                "kubernetes forwarding rules",
                "-j",
                "KUBE-FORWARD"
            ]
        );
        assert_eq!(split_words("-N KUBE-X"), ["-N", "KUBE-X"]);
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape_mount(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount("/run/x"), "/run/x");
    }
}
