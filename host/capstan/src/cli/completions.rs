//! `capstan completions bash|zsh|fish`: the shell completion script for every command and
//! flag, printed on standard output (clap_complete), to be sourced or installed where the shell
//! looks for completions.

use clap::{Args, ValueEnum};
use std::process::ExitCode;

/// The shells a script is generated for.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    /// GNU Bash (`source <(capstan completions bash)`).
    Bash,
    /// Zsh (write it as `_capstan` in a directory of `$fpath`).
    Zsh,
    /// fish (write it as `~/.config/fish/completions/capstan.fish`).
    Fish,
}

/// Print the completion script of a shell.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: Shell,
}

/// Write the script for `command` (the whole `capstan` command line) to standard output.
pub fn run(args: CompletionsArgs, mut command: clap::Command) -> ExitCode {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut command, "capstan", &mut std::io::stdout());
    ExitCode::SUCCESS
}
