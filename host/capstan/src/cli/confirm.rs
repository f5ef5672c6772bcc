//! The one confirmation every deleting command asks for (delete, revoke, retire, uninstall):
//! on a terminal the question and `[y/N]`, where only `y` or `yes` goes on; when standard input
//! is not a terminal (a script, a pipe) there is no one to ask, so the command is refused
//! `confirmation-required` before anything is sent — unless `--yes` says so beforehand.

use crate::refusal::{Refusal, Result};
use std::io::{BufRead, IsTerminal, Write};

/// `--yes`, flattened into every deleting command.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Confirm {
    /// Do it without asking. Needed when standard input is not a terminal (a script, a
    /// pipe): without it the command is refused `confirmation-required` and sends nothing
    #[arg(long)]
    pub yes: bool,
}

/// Whether the operator can be asked at all: `--yes`, or a terminal on standard input; else
/// `confirmation-required`. Call it before anything is sent.
pub fn can_confirm(confirm: &Confirm) -> Result<()> {
    if confirm.yes || std::io::stdin().is_terminal() {
        return Ok(());
    }
    Err(Refusal::new(
        "confirmation-required",
        "standard input is not a terminal, so there is no one to ask: pass --yes to do it without asking",
    ))
}

/// Go on only if the operator says so: `--yes`, else `y` or `yes` typed on the terminal after
/// `question` and `[y/N]`; anything else (an empty line included) is `not-confirmed`.
/// `question` runs only when there is someone to ask (it may read what it describes).
pub fn ask(confirm: &Confirm, question: impl FnOnce() -> Result<String>) -> Result<()> {
    can_confirm(confirm)?;
    if confirm.yes {
        return Ok(());
    }
    let question = question()?;
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Refusal::new("input-unreadable", format!("reading the answer failed: {}", e.kind())))?;
    if confirmed(&line) {
        return Ok(());
    }
    Err(Refusal::new("not-confirmed", "not confirmed; nothing was done"))
}

/// Whether an answer says yes.
fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_yes_goes_on() {
        for yes in ["y\n", "Y", " yes \n", "YES"] {
            assert!(confirmed(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yess", "sure"] {
            assert!(!confirmed(no), "{no:?}");
        }
        assert!(ask(&Confirm { yes: true }, || unreachable!("--yes asks nothing")).is_ok());
    }
}
