#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::args::{Cli, Command};
use std::ffi::OsStr;
use std::path::PathBuf;

fn plugin_args(argv: &[&str]) -> Result<KubectlArgs, clap::Error> {
    match Cli::try_parse_argv(argv)?.command {
        Command::Kubectl(args) => Ok(args),
        _ => panic!("{argv:?}: not the plugin's command"),
    }
}

#[test]
fn the_plugins_file_name_makes_argv_the_plugins() {
    let args = plugin_args(&[
        "/home/me/.local/bin/kubectl-sidecar",
        "status",
        "-o",
        "json",
    ])
    .unwrap();
    match args.command {
        PluginCommand::Status(status) => {
            assert_eq!(status.template, None);
            assert_eq!(status.output, StatusOutput::Json);
        }
        _ => panic!("not status"),
    }
    assert_eq!(args.operator_namespace, "sidecar-injector");
    // The binary's own commands are not the plugin's.
    assert!(Cli::try_parse_argv(["kubectl-sidecar", "render"]).is_err());
    assert!(Cli::try_parse_argv(["kubectl-sidecar", "kubectl", "status"]).is_err());
}

#[test]
fn the_same_commands_are_under_sidecar_injector_kubectl() {
    let args = plugin_args(&[
        "sidecar-injector",
        "kubectl",
        "explain",
        "deploy/web",
        "-n",
        "shop",
        "--context",
        "kind-a",
        "--kubeconfig",
        "/tmp/config",
        "--operator-namespace",
        "injector",
    ])
    .unwrap();
    assert_eq!(args.context.as_deref(), Some("kind-a"));
    assert_eq!(args.kubeconfig, Some(PathBuf::from("/tmp/config")));
    assert_eq!(args.operator_namespace, "injector");
    match args.command {
        PluginCommand::Explain(explain) => {
            assert_eq!(explain.target.kind, explain::TargetKind::Deployment);
            assert_eq!(explain.target.name, "web");
            assert_eq!(explain.namespace.as_deref(), Some("shop"));
        }
        _ => panic!("not explain"),
    }
    // Not under another name: only the exact file name is the plugin.
    assert!(Cli::try_parse_argv(["/usr/bin/sidecar-injector", "status"]).is_err());
    assert!(!is_plugin(OsStr::new("kubectl-sidecar-old")));
    assert!(is_plugin(OsStr::new("./kubectl-sidecar")));
}

#[test]
fn help_names_the_plugin_as_kubectl_does() {
    let error = Cli::try_parse_argv(["kubectl-sidecar", "--help"])
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("Usage: kubectl sidecar"),
        "{error}"
    );
}

#[test]
fn check_takes_a_pod_or_a_namespace_and_the_releases_names() {
    let args = plugin_args(&[
        "kubectl-sidecar",
        "check",
        "pod/web-1",
        "-n",
        "shop",
        "--release",
        "prod",
        "--release-namespace",
        "infra",
        "-o",
        "json",
    ])
    .unwrap();
    assert_eq!(args.operator_namespace, "infra");
    match args.command {
        PluginCommand::Check(check) => {
            assert_eq!(check.pod.as_deref(), Some("web-1"));
            assert_eq!(check.namespace.as_deref(), Some("shop"));
            assert_eq!(check.release, "prod");
            assert_eq!(check.fullname, None);
            assert_eq!(check.output, StatusOutput::Json);
        }
        _ => panic!("not check"),
    }
    // The chart's defaults.
    let args = plugin_args(&["kubectl-sidecar", "check"]).unwrap();
    assert_eq!(args.operator_namespace, "sidecar-injector");
    match args.command {
        PluginCommand::Check(check) => {
            assert_eq!(check.release, "sidecar-injector");
            assert_eq!(check.output, StatusOutput::Table);
        }
        _ => panic!("not check"),
    }
}

#[test]
fn check_takes_a_pod_in_the_forms_explain_takes() {
    let pod_of = |target: &str| match plugin_args(&["kubectl-sidecar", "check", target]) {
        Ok(KubectlArgs {
            command: PluginCommand::Check(check),
            ..
        }) => Ok(check.pod.unwrap()),
        Ok(_) => panic!("not check"),
        Err(error) => Err(error.to_string()),
    };
    for target in ["web-1", "pod/web-1", "po/web-1", "pods/web-1", "Pod/web-1"] {
        assert_eq!(pod_of(target).as_deref(), Ok("web-1"), "{target}");
    }
    let workload = pod_of("deployment/web").unwrap_err();
    assert!(
        workload.contains("check takes a Pod") && workload.contains("kubectl sidecar explain"),
        "{workload}"
    );
    assert!(pod_of("pod/").unwrap_err().contains("expected KIND/NAME"));
    assert!(pod_of("service/web").unwrap_err().contains("not a kind"));
}

#[test]
fn checks_help_gives_its_exit_statuses() {
    let plugin = crate::kubectl::plugin_command();
    let check = plugin
        .get_subcommands()
        .find(|c| c.get_name() == "check")
        .unwrap();
    let help = check.get_long_about().unwrap().to_string();
    assert!(help.contains("4 when a link is broken"), "{help}");
    assert!(
        help.contains("1 on an error (the Pod or namespace not found"),
        "{help}"
    );
}
