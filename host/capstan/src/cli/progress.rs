//! Progress on long work (an upload and the host's compile, a rewrap in chunks, a call that
//! takes a while), drawn on standard error only when it is a terminal: never into a pipe, a
//! file or a CI log, and cleared before the answer is printed.

use indicatif::{ProgressBar, ProgressStyle};
use std::borrow::Cow;
use std::io::IsTerminal;
use std::time::Duration;

/// A spinner saying what is under way; cleared when dropped.
pub struct Progress(ProgressBar);

impl Progress {
    /// Show `message` with a spinner and the time spent, if standard error is a terminal.
    pub fn spinner(message: impl Into<Cow<'static, str>>) -> Progress {
        Progress::drawn_if(std::io::stderr().is_terminal(), message)
    }

    fn drawn_if(terminal: bool, message: impl Into<Cow<'static, str>>) -> Progress {
        if !terminal {
            return Progress(ProgressBar::hidden());
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress(bar)
    }

    /// Say what is under way now.
    pub fn set_message(&self, message: impl Into<Cow<'static, str>>) {
        self.0.set_message(message);
    }

    /// Run `f` (printing to standard output, say) with the spinner taken off the screen.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.0.suspend(f)
    }

    /// Print a line above the spinner (or plainly, when none is drawn).
    pub fn println(&self, line: impl AsRef<str>) {
        if self.0.is_hidden() { eprintln!("{}", line.as_ref()) } else { self.0.println(line) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_drawn_off_a_terminal() {
        assert!(Progress::drawn_if(false, "uploading").0.is_hidden());
        let shown = Progress::drawn_if(true, "uploading");
        shown.set_message("compiling");
        assert_eq!(shown.0.message(), "compiling");
    }
}
