//! The node's images, built on this machine with `oci-image` and imported into its containerd,
//! so that nothing is ever pulled: the pause image (`e2e/node/pause.c`, built static) and the
//! stand-ins for the images the examples name, made of Debian's static busybox.
//!
//! Every name starts with a `.invalid` host: containerd's CRI looks images up by their
//! normalized reference, and a host of our own keeps that lookup (and any pull it would try)
//! away from every real registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use oci_image::{Config, Image, Layer, add_users};

/// The pause image the node's sandboxes run.
pub const PAUSE_IMAGE: &str = "sidecar-injector.invalid/pause:1";

/// The host of every stand-in image.
pub const STAND_IN_HOST: &str = "stand-in.invalid";

/// Debian's `busybox-static`.
const BUSYBOX: &str = "/bin/busybox";

/// The examples' images and the stand-in each is replaced with, and what the stand-in does.
pub const STAND_INS: [(&str, &str, &str); 5] = [
    (
        "busybox:1.36",
        "stand-in.invalid/busybox:1.36",
        "busybox; runs `sh` unless told otherwise",
    ),
    (
        "httpd:2.4",
        "stand-in.invalid/httpd:2.4",
        "busybox httpd on port 80 serving /www (an index.html naming the stand-in)",
    ),
    (
        "nginx:1.27",
        "stand-in.invalid/nginx:1.27",
        "busybox httpd on port 8080 serving /etc/nginx/conf.d, where the nginx-sidecar example mounts its ConfigMap",
    ),
    (
        "fluent/fluent-bit:3.1",
        "stand-in.invalid/fluent-bit:3.1",
        "reads the `path=GLOB` of its arguments and prints every line of the matching files (tail -F) to stdout",
    ),
    (
        "envoyproxy/envoy:v1.31.2",
        "stand-in.invalid/envoy:v1.31.2",
        "ignores its arguments; busybox httpd on port 15000 answering /ready",
    ),
];

/// Serves a directory over HTTP and exits at once on SIGTERM, as PID 1 of a container would
/// otherwise ignore it and make every Pod deletion wait for its grace period.
const SERVE_SCRIPT: &str = r#"#!/bin/sh
# usage: serve PORT DIR
httpd -f -p "$1" -h "$2" &
trap 'kill $! 2>/dev/null; exit 0' TERM INT
wait
"#;

const FLUENT_BIT_SCRIPT: &str = r#"#!/bin/sh
# Stand-in for fluent-bit's tail input and stdout output: prints every line of the files that
# match the path=GLOB among the arguments, as they grow.
glob=/var/log/*.log
for arg in "$@"; do
  case "$arg" in path=*) glob="${arg#path=}" ;; esac
done
trap 'exit 0' TERM INT
while :; do
  for f in $glob; do
    if [ -e "$f" ]; then
      tail -n +1 -F $glob &
      trap 'kill $! 2>/dev/null; exit 0' TERM INT
      wait
      exit 0
    fi
  done
  sleep 1
done
"#;

const ENVOY_SCRIPT: &str = r#"#!/bin/sh
# Stand-in for envoy: its admin port answers /ready; the arguments are ignored.
exec /bin/serve 15000 /srv/envoy
"#;

/// The stand-in for `image` (as an example writes it), if there is one.
pub fn stand_in(image: &str) -> Option<&'static str> {
    STAND_INS
        .iter()
        .find(|(original, _, _)| *original == image)
        .map(|(_, stand_in, _)| *stand_in)
}

/// `yaml` (such as an example's file) with every `image: X` line whose image has a stand-in
/// pointing at the stand-in instead.
pub fn with_stand_ins(yaml: &str) -> String {
    yaml.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            let (prefix, rest) = match trimmed.strip_prefix("- ") {
                Some(rest) => ("- ", rest),
                None => ("", trimmed),
            };
            rest.strip_prefix("image:")
                .map(|image| image.trim().trim_matches('"'))
                .and_then(stand_in)
                .map_or_else(
                    || line.to_owned(),
                    |stand_in| format!("{indent}{prefix}image: {stand_in}"),
                )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes the pause image and every stand-in as archives into `dir`; returns their paths.
pub fn build_all(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut archives = vec![pause(dir)?];
    for (_, name, _) in STAND_INS {
        let image = stand_in_image(name)?;
        let path = dir.join(format!("{}.tar", archive_name(name)));
        image.write_archive(&path)?;
        archives.push(path);
    }
    Ok(archives)
}

fn archive_name(name: &str) -> String {
    name.rsplit('/')
        .next()
        .unwrap_or(name)
        .replace([':', '.'], "-")
}

fn pause(dir: &Path) -> anyhow::Result<PathBuf> {
    let source = crate::workspace_root().join("e2e/node/pause.c");
    let binary = dir.join("pause");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .with_context(|| format!("cannot run {} for the pause image", cc.to_string_lossy()))?;
    if !status.success() {
        bail!("building {} failed: {status}", source.display());
    }
    let mut layer = Layer::default();
    layer.copy(&binary, "pause")?;
    let image = Image {
        names: vec![PAUSE_IMAGE.to_owned()],
        layer,
        config: Config {
            entrypoint: vec!["/pause".to_owned()],
            user: Some("65535:65535".to_owned()),
            ..Config::default()
        },
    };
    let path = dir.join("pause.tar");
    image.write_archive(&path)?;
    Ok(path)
}

fn stand_in_image(name: &str) -> anyhow::Result<Image> {
    let mut layer = Layer::default();
    layer.busybox(Path::new(BUSYBOX))?;
    add_users(&mut layer);
    layer.dir("tmp", 0o1777);
    layer.file("bin/serve", SERVE_SCRIPT.as_bytes().to_vec(), 0o755);
    let tag = name.rsplit('/').next().unwrap_or(name);
    let mut config = Config::default();
    match tag.split(':').next().unwrap_or(tag) {
        "httpd" => {
            layer.file(
                "www/index.html",
                format!("stand-in {tag}\n").into_bytes(),
                0o644,
            );
            config.cmd = ["/bin/serve", "80", "/www"].map(str::to_owned).to_vec();
        }
        "nginx" => {
            layer.dir("etc/nginx/conf.d", 0o755);
            config.cmd = ["/bin/serve", "8080", "/etc/nginx/conf.d"]
                .map(str::to_owned)
                .to_vec();
        }
        "fluent-bit" => {
            layer.file(
                "bin/fluent-bit",
                FLUENT_BIT_SCRIPT.as_bytes().to_vec(),
                0o755,
            );
            config.entrypoint = vec!["/bin/fluent-bit".to_owned()];
        }
        "envoy" => {
            layer.file("bin/envoy", ENVOY_SCRIPT.as_bytes().to_vec(), 0o755);
            layer.file("srv/envoy/ready", b"LIVE\n".to_vec(), 0o644);
            config.entrypoint = vec!["/bin/envoy".to_owned()];
        }
        _ => config.cmd = vec!["sh".to_owned()],
    }
    config
        .labels
        .insert("dev.sidecar.stand-in".to_owned(), tag.to_owned());
    Ok(Image {
        names: vec![name.to_owned()],
        layer,
        config,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn examples_images_are_replaced() {
        let yaml = "spec:\n  containers:\n    - name: web\n      image: httpd:2.4\n    - image: \"nginx:1.27\"\n      name: x\n  other: busybox:1.36\n";
        let replaced = with_stand_ins(yaml);
        assert!(replaced.contains("      image: stand-in.invalid/httpd:2.4\n"));
        assert!(replaced.contains("    - image: stand-in.invalid/nginx:1.27\n"));
        assert!(replaced.contains("  other: busybox:1.36"));
        assert_eq!(stand_in("unknown:1"), None);
        assert_eq!(
            archive_name("stand-in.invalid/envoy:v1.31.2"),
            "envoy-v1-31-2"
        );
    }

    #[test]
    fn the_node_scenarios_examples_have_stand_ins() {
        for example in ["nginx-sidecar", "log-shipper", "native-proxy"] {
            let dir = crate::workspace_root().join("examples").join(example);
            for file in std::fs::read_dir(dir).unwrap() {
                let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
                for line in with_stand_ins(&text).lines() {
                    if let Some(image) = line.trim().trim_start_matches("- ").strip_prefix("image:")
                    {
                        assert!(image.trim().starts_with(STAND_IN_HOST), "{line}");
                    }
                }
            }
        }
    }
}
