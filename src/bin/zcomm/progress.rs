//! A one-line progress indicator on stderr.
//!
//! Shown only when stderr is a terminal (never in files, pipes or CI logs) and never in `--json`
//! mode: the line is redrawn in place with `\r` and erased by [`Progress::finish`] (and on drop),
//! so nothing of it is left between the lines of the table that stdout prints afterwards.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Progress of `total` steps of work (or of unknown length when `total` is 0).
pub struct Progress {
    what: String,
    total: u64,
    done: u64,
    start: Instant,
    last: Option<Instant>,
    enabled: bool,
}

impl Progress {
    /// A progress line for `what`; disabled when `quiet` is set or stderr is not a terminal.
    pub fn new(what: impl Into<String>, total: u64, quiet: bool) -> Self {
        Progress {
            what: what.into(),
            total,
            done: 0,
            start: Instant::now(),
            last: None,
            enabled: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Advance by one step and name what runs now; redraws at most 10 times a second.
    pub fn step(&mut self, now_doing: &str) {
        self.done += 1;
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now - t < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        let count = if self.total > 0 {
            format!(" {}/{}", self.done.min(self.total), self.total)
        } else {
            String::new()
        };
        // errors on stderr are ignored: the progress line is a courtesy, never the result
        let _ = write!(
            std::io::stderr().lock(),
            "\r\x1b[2K{}{count} ({:.1} s) {now_doing}",
            self.what,
            self.start.elapsed().as_secs_f64()
        );
    }

    /// Erase the line (before the results are printed).
    pub fn finish(&mut self) {
        if self.enabled && self.last.is_some() {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
        self.last = None;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
