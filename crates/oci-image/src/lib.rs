//! Writes single-layer OCI image archives (an OCI image layout in a tar, what
//! `ctr images import` reads) from files on this machine, so that images are built here and
//! never pulled, and without a container engine.
//!
//! The archives are reproducible: entries are sorted, owned by root and dated 1970-01-01, so the
//! same inputs always give the same digests.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use oci_image::{Config, Image, Layer};
//! let mut layer = Layer::default();
//! layer.file("hello.txt", b"hello\n".to_vec(), 0o644);
//! let image = Image {
//!     names: vec!["example.invalid/hello:1".to_owned()],
//!     layer,
//!     config: Config { cmd: vec!["/hello".to_owned()], ..Config::default() },
//! };
//! image.write_archive(std::path::Path::new("hello.tar"))?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Every file time in an archive: the epoch, so that rebuilding gives the same digests.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// One entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// The files of the image's one layer, by path inside the image (without the leading `/`).
/// Parent directories are added (mode 0755) when missing.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    entries: BTreeMap<String, Entry>,
}

impl Layer {
    /// Adds directory `path` with `mode` (such as `0o1777` for `/tmp`).
    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        let path = clean(path);
        self.parents(&path);
        self.entries.insert(path, Entry::Dir { mode });
        self
    }

    /// Adds regular file `path` with `data` and `mode`.
    pub fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) -> &mut Self {
        let path = clean(path);
        self.parents(&path);
        self.entries.insert(path, Entry::File { data, mode });
        self
    }

    /// Adds the file `source` of this machine as `path`, keeping its permission bits.
    pub fn copy(&mut self, source: &Path, path: &str) -> anyhow::Result<&mut Self> {
        let data =
            std::fs::read(source).with_context(|| format!("cannot read {}", source.display()))?;
        let mode = mode_of(source)?;
        Ok(self.file(path, data, mode))
    }

    /// Adds symbolic link `path` pointing at `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        let path = clean(path);
        self.parents(&path);
        self.entries.insert(
            path,
            Entry::Symlink {
                target: target.to_owned(),
            },
        );
        self
    }

    /// Adds a static busybox (`busybox`, such as Debian's `busybox-static` `/bin/busybox`) as
    /// `/bin/busybox`, with a link in `/bin` for each applet it lists.
    pub fn busybox(&mut self, busybox: &Path) -> anyhow::Result<&mut Self> {
        let output = Command::new(busybox)
            .arg("--list")
            .output()
            .with_context(|| format!("cannot run {} --list", busybox.display()))?;
        if !output.status.success() {
            bail!("{} --list failed: {}", busybox.display(), output.status);
        }
        self.copy(busybox, "bin/busybox")?;
        for applet in String::from_utf8_lossy(&output.stdout).split_whitespace() {
            if applet != "busybox" && !applet.contains('/') {
                self.symlink(&format!("bin/{applet}"), "busybox");
            }
        }
        Ok(self)
    }

    /// The paths in the layer, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    fn parents(&mut self, path: &str) {
        let mut prefix = String::new();
        let mut parts: Vec<&str> = path.split('/').collect();
        parts.pop();
        for part in parts {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            self.entries
                .entry(prefix.clone())
                .or_insert(Entry::Dir { mode: 0o755 });
        }
    }

    /// The layer as an uncompressed tar.
    fn tar(&self) -> anyhow::Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_ustar();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(builder.into_inner()?)
    }
}

/// The image configuration's runtime part (`config` in the OCI image configuration).
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`: the entrypoint's arguments, or the command when there is no entrypoint.
    pub cmd: Vec<String>,
    /// `Env`, `KEY=value` each; `PATH=/bin:/usr/bin:/usr/local/bin` when empty.
    pub env: Vec<String>,
    /// `User`, such as `65532:65532`; root when `None`.
    pub user: Option<String>,
    /// `WorkingDir`; `/` when `None`.
    pub working_dir: Option<String>,
    /// `ExposedPorts`, such as `8443/tcp`.
    pub exposed_ports: Vec<String>,
    /// `Labels`.
    pub labels: BTreeMap<String, String>,
}

impl Config {
    fn to_json(&self) -> Value {
        let env = if self.env.is_empty() {
            vec!["PATH=/bin:/usr/bin:/usr/local/bin".to_owned()]
        } else {
            self.env.clone()
        };
        let mut config = json!({
            "Env": env,
            "WorkingDir": self.working_dir.as_deref().unwrap_or("/"),
        });
        if !self.entrypoint.is_empty() {
            config["Entrypoint"] = json!(self.entrypoint);
        }
        if !self.cmd.is_empty() {
            config["Cmd"] = json!(self.cmd);
        }
        if let Some(user) = &self.user {
            config["User"] = json!(user);
        }
        if !self.exposed_ports.is_empty() {
            let ports: serde_json::Map<String, Value> = self
                .exposed_ports
                .iter()
                .map(|p| (p.clone(), json!({})))
                .collect();
            config["ExposedPorts"] = Value::Object(ports);
        }
        if !self.labels.is_empty() {
            config["Labels"] = json!(self.labels);
        }
        config
    }
}

/// A one-layer image and the names it is imported under.
#[derive(Debug, Clone)]
pub struct Image {
    /// Full references (`host/path:tag`): containerd's CRI looks images up by their normalized
    /// reference, so a short name such as `app:1` would never be found.
    pub names: Vec<String>,
    /// The files.
    pub layer: Layer,
    /// How the container runs.
    pub config: Config,
}

/// What [`Image::write_archive`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The manifest's digest (`sha256:…`), which containerd shows as the image's digest.
    pub manifest_digest: String,
    /// The uncompressed layer's size in bytes.
    pub layer_size: usize,
}

impl Image {
    /// Writes the image as an OCI image layout in a tar at `out`.
    pub fn write_archive(&self, out: &Path) -> anyhow::Result<Written> {
        if self.names.is_empty() {
            bail!("an image needs at least one name");
        }
        for name in &self.names {
            validate_name(name)?;
        }
        let layer = self.layer.tar()?;
        let config = serde_json::to_vec(&json!({
            "created": EPOCH,
            "architecture": architecture(),
            "os": "linux",
            "config": self.config.to_json(),
            "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
            "history": [{"created": EPOCH, "created_by": "oci-image"}],
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": sha256(&layer),
                "size": layer.len(),
            }],
        }))?;
        let manifest_digest = sha256(&manifest);
        let manifests: Vec<Value> = self
            .names
            .iter()
            .map(|name| {
                json!({
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": manifest.len(),
                    "annotations": {
                        // ctr import names the image after this annotation.
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag_of(name),
                    },
                })
            })
            .collect();
        let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests}))?;

        let mut archive = Layer::default();
        archive.file(
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            0o644,
        );
        archive.file("index.json", index, 0o644);
        for blob in [&layer, &config, &manifest] {
            let digest = sha256(blob);
            let hex = digest.trim_start_matches("sha256:");
            archive.file(&format!("blobs/sha256/{hex}"), blob.clone(), 0o644);
        }
        let bytes = archive.tar()?;
        let mut file = std::fs::File::create(out)
            .with_context(|| format!("cannot create {}", out.display()))?;
        file.write_all(&bytes)
            .with_context(|| format!("cannot write {}", out.display()))?;
        Ok(Written {
            manifest_digest,
            layer_size: layer.len(),
        })
    }
}

/// `/etc/passwd` and `/etc/group` with root, `nobody` and `nonroot` (65532, as distroless
/// images have).
pub fn add_users(layer: &mut Layer) -> &mut Layer {
    layer.file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/sbin/nologin\n\
          nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
          nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"
            .to_vec(),
        0o644,
    );
    layer.file(
        "etc/group",
        b"root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n".to_vec(),
        0o644,
    )
}

fn clean(path: &str) -> String {
    path.trim_matches('/').to_owned()
}

fn mode_of(path: &Path) -> anyhow::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The tag of `host/path:tag` (`latest` when there is none).
fn tag_of(name: &str) -> &str {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.rsplit_once(':').map_or("latest", |(_, tag)| tag)
}

/// A name must start with a host (a first component with a dot, a colon or `localhost`), so
/// that normalizing it cannot send it to a default registry.
fn validate_name(name: &str) -> anyhow::Result<()> {
    let Some((host, rest)) = name.split_once('/') else {
        bail!("image name {name:?} has no host part (such as example.invalid/{name})");
    };
    if rest.is_empty() || !(host.contains('.') || host.contains(':') || host == "localhost") {
        bail!("image name {name:?} must start with a host (such as example.invalid/…)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
