//! `zcomm`: compress, decompress, benchmark and inspect error-bounded lossy streams.
//!
//! Every subcommand lives in its own module with a clap `Args` struct and a
//! `pub fn run(args: Args) -> zcomm::Result<()>`. Adding a subcommand takes one `mod` line and one
//! [`Command`] variant (plus its arm in [`main`]). The CPU/GPU choice of `--device` is made in one
//! place only: [`device`].
//!
//! Shared pieces: [`output`] (atomic output files, never over an input), [`out`] (stdout writes
//! that fail with an error instead of a panic), [`progress`] (a progress line on a terminal).

mod array;
mod bench;
mod compress;
mod decompress;
mod device;
mod info;
mod model;
mod out;
mod output;
mod progress;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Error-bounded lossy compression of f32/f64 arrays (AATROX, cuSZp2 codecs).
#[derive(Parser, Debug)]
#[command(name = "zcomm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compress a raw little-endian array into a zcomm stream.
    Compress(compress::Args),
    /// Decompress a zcomm stream into a raw little-endian array (same dtype).
    Decompress(decompress::Args),
    /// Measure ratio, error and throughput of one or all codecs on a raw array.
    Bench(bench::Args),
    /// Print the header of a zcomm stream.
    Info(info::Args),
    /// Predict the speedup of compressed communication (AATROX §5.6 model).
    Model(model::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZCOMM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compress(a) => compress::run(a),
        Command::Decompress(a) => decompress::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Info(a) => info::run(a),
        Command::Model(a) => model::run(a),
    };
    // stdout is line-buffered: the last bytes (and their errors) only reach it here
    match result.and_then(|()| out::flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // the reader closed the pipe (`zcomm info ... | head -1`): it has what it wanted
        Err(e) if out::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            out::error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Parsers shared by the subcommands' clap definitions.
pub(crate) mod parse {
    use zcomm::{CodecKind, Dims, Dtype, ErrorBound};

    /// `f32` | `f64`.
    pub fn dtype(s: &str) -> Result<Dtype, String> {
        s.parse().map_err(|e: zcomm::Error| e.to_string())
    }
    /// `abs:E` | `noa:E` | `rel:E` with `E` finite and positive.
    pub fn bound(s: &str) -> Result<ErrorBound, String> {
        s.parse().map_err(|e: zcomm::Error| e.to_string())
    }
    /// A shape, slowest dimension first: `512x512x512` (1 to 4 extents, none zero).
    pub fn dims(s: &str) -> Result<Dims, String> {
        s.parse().map_err(|e: zcomm::Error| e.to_string())
    }
    /// A byte count: `1000`, `500MB`, `8GiB`, `1.5e9` (decimal and binary units).
    pub fn bytes(s: &str) -> Result<u64, String> {
        let t = s.trim();
        let units: [(&str, f64); 9] = [
            ("KiB", 1024.0),
            ("MiB", 1048576.0),
            ("GiB", 1073741824.0),
            ("TiB", 1099511627776.0),
            ("KB", 1e3),
            ("MB", 1e6),
            ("GB", 1e9),
            ("TB", 1e12),
            ("B", 1.0),
        ];
        let (num, mult) = units
            .iter()
            .find_map(|&(u, m)| t.strip_suffix(u).map(|n| (n, m)))
            .unwrap_or((t, 1.0));
        let v: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a byte count (e.g. 1000, 500MB, 8GiB)"))?;
        let b = v * mult;
        if !(b.is_finite() && b >= 0.0 && b < u64::MAX as f64) {
            return Err(format!(
                "`{s}` is not a byte count (e.g. 1000, 500MB, 8GiB)"
            ));
        }
        Ok(b.round() as u64)
    }
    /// A codec name (`--help` lists them all, from the registry).
    pub fn codec() -> impl clap::builder::TypedValueParser<Value = CodecKind> {
        use clap::builder::TypedValueParser;
        clap::builder::PossibleValuesParser::new(CodecKind::ALL.iter().map(|c| c.name()))
            .try_map(|s| s.parse::<CodecKind>().map_err(|e| e.to_string()))
    }
}
