//! `zcomm`: compress, decompress, benchmark and inspect error-bounded lossy streams.
//!
//! Every subcommand lives in its own module with a clap `Args` struct and a
//! `pub fn run(args: Args) -> zcomm::Result<()>`. Adding a subcommand takes one `mod` line and one
//! [`Command`] variant (plus its arm in [`main`]). The CPU/GPU choice of `--device` is made in one
//! place only: [`device`].

mod array;
mod bench;
mod compress;
mod decompress;
mod device;
mod info;
mod model;

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
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zcomm: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parsers shared by the subcommands' clap definitions.
pub(crate) mod parse {
    use zcomm::{CodecKind, Dtype, ErrorBound};

    /// `f32` | `f64`.
    pub fn dtype(s: &str) -> Result<Dtype, String> {
        s.parse().map_err(|e: zcomm::Error| e.to_string())
    }
    /// `abs:E` | `noa:E` | `rel:E` with `E` finite and positive.
    pub fn bound(s: &str) -> Result<ErrorBound, String> {
        s.parse().map_err(|e: zcomm::Error| e.to_string())
    }
    /// A codec name (`--help` lists them all, from the registry).
    pub fn codec() -> impl clap::builder::TypedValueParser<Value = CodecKind> {
        use clap::builder::TypedValueParser;
        clap::builder::PossibleValuesParser::new(CodecKind::ALL.iter().map(|c| c.name()))
            .try_map(|s| s.parse::<CodecKind>().map_err(|e| e.to_string()))
    }
}
