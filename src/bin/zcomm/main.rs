//! `zcomm` command-line tool (placeholder; the CLI lands with the codec-core issue).
fn main() {
    eprintln!("zcomm: CLI not built yet");
    std::process::exit(2);
}
