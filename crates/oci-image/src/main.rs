//! `oci-image`: writes a one-layer OCI image archive from files of this machine (what
//! `just image` uses to build the operator's image without a container engine).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use oci_image::{Config, Image, Layer, add_users};

/// Write a one-layer OCI image archive (for `ctr images import`) from local files.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The archive to write.
    #[arg(long)]
    out: PathBuf,
    /// A full image reference (`host/path:tag`); repeat for more names.
    #[arg(long = "name", required = true)]
    names: Vec<String>,
    /// `SOURCE:PATH`: the file SOURCE of this machine as PATH in the image (mode kept).
    #[arg(long = "file")]
    files: Vec<String>,
    /// Add /etc/passwd and /etc/group with root, nobody and nonroot (65532).
    #[arg(long)]
    users: bool,
    /// An entrypoint argument; repeat for each.
    #[arg(long = "entrypoint")]
    entrypoint: Vec<String>,
    /// A command argument; repeat for each.
    #[arg(long = "cmd")]
    cmd: Vec<String>,
    /// The user, such as 65532:65532.
    #[arg(long)]
    user: Option<String>,
    /// An exposed port, such as 8443/tcp; repeat for each.
    #[arg(long = "expose")]
    exposed_ports: Vec<String>,
    /// A label, `KEY=VALUE`; repeat for each.
    #[arg(long = "label")]
    labels: Vec<String>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oci-image: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let mut layer = Layer::default();
    if args.users {
        add_users(&mut layer);
    }
    for spec in &args.files {
        let (source, path) = spec
            .split_once(':')
            .with_context(|| format!("--file {spec}: expected SOURCE:PATH"))?;
        layer.copy(source.as_ref(), path)?;
    }
    let labels = args
        .labels
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--label {l}: expected KEY=VALUE"))
        })
        .collect::<anyhow::Result<_>>()?;
    let image = Image {
        names: args.names,
        layer,
        config: Config {
            entrypoint: args.entrypoint,
            cmd: args.cmd,
            user: args.user,
            exposed_ports: args.exposed_ports,
            labels,
            ..Config::default()
        },
    };
    let written = image.write_archive(&args.out)?;
    println!(
        "{} {} ({} bytes uncompressed) {}",
        args.out.display(),
        written.manifest_digest,
        written.layer_size,
        image.names.join(",")
    );
    Ok(())
}
