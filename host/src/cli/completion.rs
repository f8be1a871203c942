//! `podstamp completion bash|zsh|fish`: the shell's completion script for
//! every command and flag, written by clap's own generator from the same
//! definition the command line is parsed with, so it cannot drift from it.
//! Also the name podstamp answers to when kubectl runs it as its plugin.

use clap::{Args, ValueEnum};
use clap_complete::Shell;

/// What kubectl runs for `kubectl podstamp …` (krew's convention: an
/// executable `kubectl-NAME` on PATH). podstamp behaves the same under that
/// name; only its usage and help say `kubectl podstamp`.
pub const KUBECTL_PLUGIN: &str = "kubectl-podstamp";

#[derive(Args)]
#[command(after_help = "\
Examples:
  podstamp completion bash > /etc/bash_completion.d/podstamp
  podstamp completion zsh > \"${fpath[1]}/_podstamp\"
  podstamp completion fish > ~/.config/fish/completions/podstamp.fish")]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: CompletionShell,
}

#[derive(Clone, Copy, ValueEnum)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// The name to show in usage: `kubectl podstamp` when run as kubectl's
/// plugin (by `argv[0]`, as kubectl starts it), else `podstamp`.
pub fn bin_name(argv0: Option<&std::ffi::OsStr>) -> &'static str {
    let invoked = argv0
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str());
    if invoked == Some(KUBECTL_PLUGIN) {
        "kubectl podstamp"
    } else {
        "podstamp"
    }
}

/// The completion script for `command` (the whole command line). Made in
/// memory: clap's generator panics when its writer fails (a closed pipe).
pub fn script(args: &CompletionArgs, command: &mut clap::Command) -> Vec<u8> {
    let shell = match args.shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    let mut out = Vec::new();
    // Completions are for the `podstamp` command; kubectl completes its
    // plugins' arguments through its own `kubectl_complete-*` hook.
    clap_complete::generate(shell, command, "podstamp", &mut out);
    out
}
