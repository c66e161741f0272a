//! Shell completion, two ways.
//!
//! * **Scripts**: `sidecar-injector completion bash|zsh|fish` prints the script that completes
//!   `sidecar-injector`, and `kubectl sidecar completion bash|zsh|fish` the one that completes
//!   the plugin's file, `kubectl-sidecar`, run directly (both by `clap_complete`).
//! * **`kubectl sidecar <TAB>`**: kubectl (1.26+) completes a plugin's arguments by running an
//!   executable named `kubectl_complete-<plugin>` found on `PATH`, with the words typed after
//!   the plugin's name (the last one the word being completed, empty when none is started), and
//!   reads one candidate a line (`candidate<TAB>description`), then an optional last line
//!   `:<directive>` in Cobra's terms. Started as [`PLUGIN_COMPLETER_FILE_NAME`] (a link to the
//!   binary, which `just install-plugin` makes), the binary answers that way ([`complete`]):
//!   offline, from the plugin's own clap definitions, so it never waits on a cluster.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::Path;

use clap::builder::PossibleValue;
use clap::{Arg, ValueHint};

use crate::kubectl::explain::TargetKind;

/// The file name kubectl runs to complete `kubectl sidecar …`.
pub const PLUGIN_COMPLETER_FILE_NAME: &str = "kubectl_complete-sidecar";

/// Whether the program was started as the plugin's completer (`argv[0]` names
/// `kubectl_complete-sidecar`).
pub fn is_plugin_completer(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == PLUGIN_COMPLETER_FILE_NAME)
}

/// The shells a script is printed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// Bash (with the bash-completion package).
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

/// `completion SHELL`.
#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// The shell to print the script for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The completion script of `command` for `shell`, completing the program named `bin_name`.
pub fn script(shell: Shell, mut command: clap::Command, bin_name: &str) -> String {
    use clap_complete::aot::{Shell as Generator, generate};
    let generator = match shell {
        Shell::Bash => Generator::Bash,
        Shell::Zsh => Generator::Zsh,
        Shell::Fish => Generator::Fish,
    };
    let mut out = Vec::new();
    generate(generator, &mut command, bin_name, &mut out);
    let script = String::from_utf8_lossy(&out).into_owned();
    match shell {
        Shell::Bash => bash_hyphen_fix(script, bin_name),
        Shell::Zsh | Shell::Fish => script,
    }
}

/// clap_complete's bash script (4.6.11) completes nothing past the first subcommand when the
/// program's name has a hyphen, as both of ours do: its loop names the state of `a-b sub`
/// `a__b__subcmd__sub`, and the `case` arms that answer it `a__subcmd__b__subcmd__sub`, so no
/// arm matches (clap-rs/clap issue 6421, open). Spelling the arms as the loop does fixes it; a
/// script without the misspelling is left as it is.
fn bash_hyphen_fix(script: String, bin_name: &str) -> String {
    const CMD_SEP: &str = "__subcmd__";
    if !bin_name.contains('-') {
        return script;
    }
    let misspelt = format!("{}{CMD_SEP}", bin_name.replace('-', CMD_SEP));
    let as_the_loop = format!("{}{CMD_SEP}", bin_name.replace('-', "__"));
    script.replace(&misspelt, &as_the_loop)
}

/// Cobra's `ShellCompDirectiveNoSpace`: no space after the candidate.
const NO_SPACE: u32 = 2;
/// Cobra's `ShellCompDirectiveNoFileComp`: no file names when there is no candidate.
const NO_FILE_COMP: u32 = 4;
/// Cobra's `ShellCompDirectiveDefault`: the shell's own completion (file names) when there is
/// no candidate.
const DEFAULT: u32 = 0;

/// What the completer answers: candidates with their descriptions, and a Cobra directive.
#[derive(Debug, PartialEq, Eq)]
pub struct Completions {
    /// Each candidate and its description (empty for none).
    pub candidates: Vec<(String, String)>,
    /// The Cobra directive (a bit set).
    pub directive: u32,
}

impl Completions {
    fn none(directive: u32) -> Self {
        Completions {
            candidates: Vec::new(),
            directive,
        }
    }

    /// As kubectl reads it: `candidate\tdescription` lines, then `:directive`.
    pub fn to_cobra(&self) -> String {
        let mut out = String::new();
        for (candidate, description) in &self.candidates {
            let _ = if description.is_empty() {
                writeln!(out, "{candidate}")
            } else {
                writeln!(out, "{candidate}\t{description}")
            };
        }
        let _ = writeln!(out, ":{}", self.directive);
        out
    }
}

/// Completes `words` (the plugin's arguments typed so far, the last one the word being
/// completed) against `command`, the plugin's command line: a subcommand's name, a flag, a
/// flag's or a positional argument's value.
pub fn complete(command: &clap::Command, words: &[String]) -> Completions {
    let mut command = command.clone();
    // Global flags reach the subcommands only once built.
    command.build();
    let (current, typed) = match words.split_last() {
        Some((current, typed)) => (current.as_str(), typed),
        None => ("", words),
    };
    let mut line = Typed::new(&command);
    for word in typed {
        line.read(word);
    }
    line.complete(current)
}

/// Where the words typed before the one completed leave the command line.
struct Typed<'c, 'w> {
    /// The (sub)command they reached.
    at: &'c clap::Command,
    /// The flag whose value comes next.
    value_of: Option<&'c Arg>,
    /// How many positional arguments were typed.
    positionals: usize,
    /// Whether `--` was typed: only positional arguments follow.
    only_positionals: bool,
    /// The file `--kubeconfig` named.
    kubeconfig: Option<&'w str>,
}

impl<'c, 'w> Typed<'c, 'w> {
    /// Nothing typed yet after `command`'s name.
    fn new(command: &'c clap::Command) -> Self {
        Typed {
            at: command,
            value_of: None,
            positionals: 0,
            only_positionals: false,
            kubeconfig: None,
        }
    }

    /// Reads the next word typed: a flag's value, `--`, a long flag, short flags, a
    /// subcommand or a positional argument.
    fn read(&mut self, word: &'w str) {
        if let Some(arg) = self.value_of.take() {
            if arg.get_id() == "kubeconfig" {
                self.kubeconfig = Some(word);
            }
            return;
        }
        if !self.only_positionals && word == "--" {
            self.only_positionals = true;
        } else if let Some(long) = word.strip_prefix("--").filter(|_| !self.only_positionals) {
            self.read_long(long);
        } else if let Some(shorts) = word
            .strip_prefix('-')
            .filter(|shorts| !self.only_positionals && !shorts.is_empty())
        {
            self.read_shorts(shorts);
        } else if let Some(sub) = self
            .at
            .find_subcommand(word)
            .filter(|_| !self.only_positionals && self.positionals == 0)
        {
            self.at = sub;
        } else {
            self.positionals += 1;
        }
    }

    /// Reads `--long` or `--long=value`.
    fn read_long(&mut self, long: &'w str) {
        match long.split_once('=') {
            Some(("kubeconfig", file)) => self.kubeconfig = Some(file),
            Some(_) => {}
            None => {
                self.value_of = self
                    .at
                    .get_arguments()
                    .find(|arg| arg.get_long() == Some(long))
                    .filter(|arg| arg.get_action().takes_values());
            }
        }
    }

    /// Reads `-abc`: `-o json` or `-ojson`: the first letter that takes a value takes the rest
    /// of the word, or the next word when it is the last letter.
    fn read_shorts(&mut self, shorts: &str) {
        for (at_byte, letter) in shorts.char_indices() {
            let Some(arg) = self
                .at
                .get_arguments()
                .find(|arg| arg.get_short() == Some(letter))
            else {
                continue;
            };
            if arg.get_action().takes_values() {
                if at_byte + letter.len_utf8() == shorts.len() {
                    self.value_of = Some(arg);
                }
                break;
            }
        }
    }

    /// The candidates for `current`, the word being completed, where the line stands: a
    /// flag's value, a flag, a subcommand, or a positional argument's value.
    fn complete(self, current: &str) -> Completions {
        let at = self.at;
        if let Some(arg) = self.value_of {
            return values(arg, current, self.kubeconfig);
        }
        if current.starts_with('-') && !self.only_positionals {
            let flags = at
                .get_arguments()
                .filter(|arg| !arg.is_hide_set())
                .filter_map(|arg| {
                    Some((format!("--{}", arg.get_long()?), describe(arg.get_help())))
                });
            return starting_with(current, flags);
        }
        if at.has_subcommands() && self.positionals == 0 && !self.only_positionals {
            let subcommands = at
                .get_subcommands()
                .filter(|sub| !sub.is_hide_set())
                .map(|sub| (sub.get_name().to_owned(), describe(sub.get_about())));
            return starting_with(current, subcommands);
        }
        match at.get_positionals().nth(self.positionals) {
            Some(arg) => values(arg, current, self.kubeconfig),
            None => Completions::none(NO_FILE_COMP),
        }
    }
}

/// The candidates for `arg`'s value starting with `current` (`kubeconfig`: the file
/// `--kubeconfig` named).
fn values(arg: &Arg, current: &str, kubeconfig: Option<&str>) -> Completions {
    let possible: Vec<PossibleValue> = arg.get_possible_values();
    if !possible.is_empty() {
        let values = possible
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| (value.get_name().to_owned(), describe(value.get_help())));
        return starting_with(current, values);
    }
    match arg.get_id().as_str() {
        // `explain KIND/NAME`: the kinds; a name would need the cluster.
        "target" if !current.contains('/') => {
            let kinds = TargetKind::ALL
                .iter()
                .map(|kind| (format!("{}/", kind.as_str().to_lowercase()), String::new()));
            Completions {
                directive: NO_SPACE | NO_FILE_COMP,
                ..starting_with(current, kinds)
            }
        }
        "context" => {
            let contexts = contexts(kubeconfig)
                .into_iter()
                .map(|name| (name, String::new()));
            starting_with(current, contexts)
        }
        _ => match arg.get_value_hint() {
            ValueHint::AnyPath | ValueHint::FilePath | ValueHint::DirPath => {
                Completions::none(DEFAULT)
            }
            _ => Completions::none(NO_FILE_COMP),
        },
    }
}

/// The candidates starting with `current`, and no file names when there is none.
fn starting_with(current: &str, candidates: impl Iterator<Item = (String, String)>) -> Completions {
    Completions {
        candidates: candidates
            .filter(|(candidate, _)| candidate.starts_with(current))
            .collect(),
        directive: NO_FILE_COMP,
    }
}

/// The contexts of the kubeconfig (`file`, else `$KUBECONFIG`, else `~/.kube/config`); none
/// when it cannot be read.
fn contexts(file: Option<&str>) -> Vec<String> {
    let config = match file {
        Some(file) => kube::config::Kubeconfig::read_from(file),
        None => kube::config::Kubeconfig::read(),
    };
    config
        .map(|config| config.contexts.into_iter().map(|c| c.name).collect())
        .unwrap_or_default()
}

/// A help text on one line, for a description.
fn describe(help: Option<&clap::builder::StyledStr>) -> String {
    help.map(|help| {
        help.to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests;
