#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::kubectl::plugin_command;

/// What the completer answers for `kubectl sidecar WORDS…`: the candidates alone, and the
/// directive.
fn plugin(words: &[&str]) -> (Vec<String>, u32) {
    let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
    let completions = complete(&plugin_command(), &words);
    let names = completions.candidates.into_iter().map(|(c, _)| c).collect();
    (names, completions.directive)
}

#[test]
fn the_plugins_subcommands_complete_with_their_descriptions() {
    let completions = complete(&plugin_command(), &[String::new()]);
    let names: Vec<&str> = completions
        .candidates
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(names, ["status", "explain", "check", "completion", "help"]);
    assert_eq!(completions.directive, NO_FILE_COMP);
    let (_, status) = &completions.candidates[0];
    assert!(
        status.starts_with("Where each SidecarTemplate's Pods stand"),
        "{status}"
    );
    assert!(!status.contains('\n'), "{status}");
    // The subcommand being typed, and a prefix nothing starts with.
    assert_eq!(plugin(&["st"]), (vec!["status".to_owned()], NO_FILE_COMP));
    assert_eq!(plugin(&["x"]), (vec![], NO_FILE_COMP));
}

#[test]
fn flags_complete_with_the_globals_under_a_subcommand() {
    let (flags, directive) = plugin(&["status", "--"]);
    assert_eq!(directive, NO_FILE_COMP);
    for flag in [
        "--output",
        "--kubeconfig",
        "--context",
        "--operator-namespace",
    ] {
        assert!(
            flags.contains(&flag.to_owned()),
            "{flag} missing from {flags:?}"
        );
    }
    assert_eq!(plugin(&["--con"]).0, ["--context"]);
    // `--` ends the flags: what follows is a positional argument.
    assert_eq!(plugin(&["status", "--", "--"]), (vec![], NO_FILE_COMP));
}

#[test]
fn a_flags_value_completes_from_its_possible_values() {
    assert_eq!(
        plugin(&["status", "-o", ""]),
        (vec!["table".to_owned(), "json".to_owned()], NO_FILE_COMP)
    );
    assert_eq!(plugin(&["status", "--output", "j"]).0, ["json"]);
    // The value given, the next word is the template's name again: nothing offline.
    assert_eq!(
        plugin(&["status", "-o", "json", ""]),
        (vec![], NO_FILE_COMP)
    );
    assert_eq!(plugin(&["status", "-ojson", ""]), (vec![], NO_FILE_COMP));
    assert_eq!(
        plugin(&["status", "--output=json", ""]),
        (vec![], NO_FILE_COMP)
    );
    // A file: the shell's own completion of file names.
    assert_eq!(plugin(&["--kubeconfig", ""]), (vec![], DEFAULT));
    // A flag's value that looks like a subcommand is no subcommand.
    assert_eq!(
        plugin(&["--operator-namespace", "status", "ex"]).0,
        ["explain"]
    );
}

#[test]
fn explain_completes_kinds_then_stops_at_the_name() {
    let (kinds, directive) = plugin(&["explain", ""]);
    assert_eq!(
        kinds,
        [
            "pod/",
            "deployment/",
            "statefulset/",
            "daemonset/",
            "replicaset/",
            "job/",
            "cronjob/"
        ]
    );
    // No space after `kind/`: the name follows.
    assert_eq!(directive, NO_SPACE | NO_FILE_COMP);
    assert_eq!(
        plugin(&["explain", "-n", "shop", "d"]).0,
        ["deployment/", "daemonset/"]
    );
    // Every kind offered is one explain takes.
    for kind in kinds {
        assert!(
            format!("{kind}web")
                .parse::<crate::kubectl::explain::Target>()
                .is_ok()
        );
    }
    assert_eq!(plugin(&["explain", "deployment/w"]), (vec![], NO_FILE_COMP));
    assert_eq!(plugin(&["explain", "pod/a", ""]), (vec![], NO_FILE_COMP));
}

#[test]
fn contexts_come_from_the_kubeconfig_named() {
    let file = std::env::temp_dir().join(format!(
        "sidecar-injector-completion-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts:\n\
         - {name: kind-a, context: {cluster: c, user: u}}\n\
         - {name: prod, context: {cluster: c, user: u}}\n",
    )
    .unwrap();
    let path = file.to_str().unwrap().to_owned();
    assert_eq!(
        plugin(&["--kubeconfig", &path, "status", "--context", ""]).0,
        ["kind-a", "prod"]
    );
    assert_eq!(
        plugin(&[&format!("--kubeconfig={path}"), "--context", "p"]).0,
        ["prod"]
    );
    // A kubeconfig that cannot be read gives no candidate, and no error.
    assert_eq!(
        plugin(&["--kubeconfig", "/nonexistent/config", "--context", ""]),
        (vec![], NO_FILE_COMP)
    );
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn the_answer_is_in_cobras_format() {
    let completions = Completions {
        candidates: vec![
            ("status".into(), "Where they stand".into()),
            ("pod/".into(), String::new()),
        ],
        directive: NO_SPACE | NO_FILE_COMP,
    };
    assert_eq!(
        completions.to_cobra(),
        "status\tWhere they stand\npod/\n:6\n"
    );
    assert_eq!(Completions::none(DEFAULT).to_cobra(), ":0\n");
}

#[test]
fn only_the_completers_file_name_makes_the_completer() {
    assert!(is_plugin_completer(OsStr::new(
        "/usr/local/bin/kubectl_complete-sidecar"
    )));
    assert!(!is_plugin_completer(OsStr::new("kubectl-sidecar")));
    assert!(!is_plugin_completer(OsStr::new(
        "kubectl_complete-sidecar-old"
    )));
}
