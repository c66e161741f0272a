//! Shell completion as a shell gets it: `completion bash|zsh|fish` of `sidecar-injector` and
//! of the plugin, the scripts run by bash (and by zsh and fish where they are installed), and
//! `kubectl_complete-sidecar`, which kubectl runs for `kubectl sidecar <TAB>`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_sidecar-injector");

/// What `program args…` prints on standard output; it must succeed.
fn stdout(program: &Path, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{} {args:?}: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The binary under `name` in `dir` (a symbolic link, as a user makes it).
fn linked(dir: &Path, name: &str) -> PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(BINARY, &link).unwrap();
    link
}

/// How each shell's script names a subcommand it completes.
fn names_subcommand(shell: &str, script: &str, name: &str) -> bool {
    match shell {
        "bash" => script.contains(&format!(",{name})")),
        "zsh" => script.contains(&format!("'{name}:")),
        "fish" => script.contains(&format!("-a \"{name}\"")),
        _ => unreachable!(),
    }
}

#[test]
fn each_shells_script_names_every_subcommand() {
    let binary = Path::new(BINARY);
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(binary, &["completion", shell]);
        for name in [
            "render",
            "serve",
            "run",
            "policy",
            "crd",
            "kubectl",
            "completion",
            // The plugin's, under `kubectl`.
            "status",
            "explain",
        ] {
            assert!(
                names_subcommand(shell, &script, name),
                "{shell}: no {name} in\n{script}"
            );
        }
        assert!(script.contains("sidecar-injector"), "{shell}");
    }
}

#[test]
fn the_plugins_script_completes_kubectl_sidecar() {
    let dir = common::scratch();
    let plugin = linked(&dir, "kubectl-sidecar");
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&plugin, &["completion", shell]);
        // The same under `sidecar-injector kubectl`.
        assert_eq!(
            script,
            stdout(Path::new(BINARY), &["kubectl", "completion", shell])
        );
        for name in ["status", "explain", "completion"] {
            assert!(
                names_subcommand(shell, &script, name),
                "{shell}: no {name} in\n{script}"
            );
        }
        for other in ["render", "serve"] {
            assert!(!names_subcommand(shell, &script, other), "{shell}: {other}");
        }
        let registered = match shell {
            "bash" => script.contains("-o default kubectl-sidecar\n"),
            "zsh" => script.starts_with("#compdef kubectl-sidecar\n"),
            _ => script.contains("complete -c kubectl-sidecar "),
        };
        assert!(registered, "{shell}: not for kubectl-sidecar\n{script}");
    }
}

/// What bash completes for `words` (the last one being typed) with `script` loaded, through
/// the function the script registers.
fn bash_completes(script: &str, function: &str, words: &[&str]) -> String {
    let dir = common::scratch();
    std::fs::write(dir.join("script"), script).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let last = words.len() - 1;
    let test = format!(
        "source {script}\nCOMP_WORDS=({words})\nCOMP_CWORD={last}\n\
         {function} {program} '{current}' '{previous}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script = dir.join("script").display(),
        words = quoted.join(" "),
        program = words[0],
        current = words[last],
        previous = words[last - 1],
    );
    stdout(Path::new("bash"), &["--norc", "-c", &test])
}

#[test]
fn bash_completes_past_the_first_subcommand() {
    // clap_complete's script alone completes nothing there for a name with a hyphen.
    let script = stdout(Path::new(BINARY), &["completion", "bash"]);
    let complete = |words: &[&str]| bash_completes(&script, "_sidecar__injector", words);
    assert_eq!(complete(&["sidecar-injector", "ren"]), "render\n");
    assert_eq!(complete(&["sidecar-injector", "kubectl", "st"]), "status\n");
    assert_eq!(
        complete(&["sidecar-injector", "run", "--injection-backend", ""]),
        "auto\nwebhook\npolicy\n"
    );
    assert_eq!(
        complete(&["sidecar-injector", "kubectl", "status", "-o", ""]),
        "table\njson\n"
    );

    let plugin = stdout(Path::new(BINARY), &["kubectl", "completion", "bash"]);
    let complete = |words: &[&str]| bash_completes(&plugin, "_kubectl__sidecar", words);
    assert_eq!(complete(&["kubectl-sidecar", "ex"]), "explain\n");
    assert_eq!(
        complete(&["kubectl-sidecar", "status", "-o", "j"]),
        "json\n"
    );
}

#[test]
fn zsh_and_fish_read_the_scripts_where_installed() {
    let dir = common::scratch();
    let plugin = linked(&dir, "kubectl-sidecar");
    for (shell, check) in [("zsh", "-n"), ("fish", "--no-execute")] {
        let Ok(found) = Command::new(shell).args(["-c", "exit 0"]).status() else {
            eprintln!("{shell} is not installed: its scripts are not run");
            continue;
        };
        assert!(found.success());
        for program in [Path::new(BINARY), plugin.as_path()] {
            let file = dir.join(format!("{shell}-script"));
            std::fs::write(&file, stdout(program, &["completion", shell])).unwrap();
            let status = Command::new(shell).arg(check).arg(&file).status().unwrap();
            assert!(status.success(), "{shell} {check} {}", program.display());
        }
    }
}

#[test]
fn kubectl_complete_sidecar_answers_as_kubectl_asks() {
    let dir = common::scratch();
    let completer = linked(&dir, "kubectl_complete-sidecar");
    // kubectl passes the words after `kubectl sidecar`, the one being typed last.
    let status = stdout(&completer, &["st"]);
    assert!(
        status.starts_with("status\tWhere each SidecarTemplate's Pods stand"),
        "{status}"
    );
    assert!(status.ends_with("\n:4\n"), "{status}");
    assert_eq!(stdout(&completer, &["explain", "cr"]), "cronjob/\n:6\n");
    assert_eq!(
        stdout(&completer, &["status", "-o", ""]),
        "table\njson\n:4\n"
    );
    // A flag it does not know, or words that do not parse, are no error: no candidate.
    assert_eq!(stdout(&completer, &["--no-such-flag", "x", ""]), ":4\n");
    assert_eq!(stdout(&completer, &[]), stdout(&completer, &[""]));
}
