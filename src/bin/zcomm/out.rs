//! Checked standard output.
//!
//! `println!` panics when stdout is closed (`zcomm info | head -1`) or full (`> /dev/full`), which
//! ends the process with exit code 101 and a backtrace. Every line the CLI prints goes through
//! [`outln!`] instead, which returns the write error as a [`zcomm::Error::Io`] that keeps the
//! error's kind: `main` exits quietly on a broken pipe (the reader has all it wanted) and with a
//! message on any other error (a full disk must not look like success).

use std::io::Write;

/// Write formatted text to stdout; the error names stdout and keeps the original error's kind.
pub fn write_fmt(args: std::fmt::Arguments<'_>) -> zcomm::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args).map_err(stdout_error)
}

/// Flush stdout (its buffer only reaches the file or pipe here, so errors can show up only now).
pub fn flush() -> zcomm::Result<()> {
    std::io::stdout().lock().flush().map_err(stdout_error)
}

fn stdout_error(e: std::io::Error) -> zcomm::Error {
    zcomm::Error::Io(std::io::Error::new(
        e.kind(),
        format!("cannot write to stdout: {e}"),
    ))
}

/// Whether `e` is a write to a closed pipe: the reader stopped reading, not a failure of ours.
pub fn is_broken_pipe(e: &zcomm::Error) -> bool {
    matches!(e, zcomm::Error::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `println!` that returns a [`zcomm::Result`] instead of panicking: `outln!("x {y}")?`.
macro_rules! outln {
    () => {
        $crate::out::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// Print `zcomm: warning: ...` on stderr. Errors are ignored: with stderr gone there is no one to
/// tell, and a warning must not turn into a failure (`eprintln!` would panic).
pub fn warn(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "zcomm: warning: {args}");
}

/// Print `zcomm: error: ...` on stderr (errors ignored, as in [`warn`]).
pub fn error(e: &zcomm::Error) {
    let _ = writeln!(std::io::stderr().lock(), "zcomm: error: {e}");
}
