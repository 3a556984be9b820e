//! `zcomm info`: dump a stream's header.

use std::path::PathBuf;

use zcomm::format::{BoundMode, Header, HEADER_LEN};
use zcomm::{CodecKind, Result};

use crate::array::read_file;

/// Arguments of `zcomm info`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compressed stream.
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Print the header as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn mode_name(m: BoundMode) -> &'static str {
    match m {
        BoundMode::Abs => "abs",
        BoundMode::Noa => "noa",
        BoundMode::Rel => "rel",
    }
}

fn codec_name(h: &Header) -> String {
    CodecKind::from_tag(h.codec)
        .map(|c| c.name().to_string())
        .unwrap_or_else(|_| format!("unknown (tag {})", h.codec))
}

/// Run `zcomm info`.
pub fn run(a: Args) -> Result<()> {
    let stream = read_file(&a.input)?;
    let h = zcomm::inspect(&stream)?;
    let raw = h.count as f64 * h.dtype.size() as f64;
    let ratio = raw / stream.len() as f64;
    if a.json {
        let v = serde_json::json!({
            "input": a.input.display().to_string(),
            "stream_bytes": stream.len(),
            "codec": codec_name(&h),
            "dtype": h.dtype,
            "mode": mode_name(h.mode),
            "stored": h.is_stored(),
            "chunk_log2": h.chunk_log2,
            "count": h.count,
            "bound_value": h.bound_value,
            "abs_bound": h.abs_bound,
            "step": h.step,
            "range_min": h.range_min,
            "range_max": h.range_max,
            "payload_len": h.payload_len,
            "n_chunks": h.n_chunks,
            "payload_checksum": format!("{:#010x}", h.payload_checksum),
            "ratio": ratio,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("JSON of plain values")
        );
        return Ok(());
    }
    println!(
        "stream           {} ({} bytes)",
        a.input.display(),
        stream.len()
    );
    println!("codec            {}", codec_name(&h));
    println!("dtype            {}", h.dtype);
    println!("count            {}", h.count);
    println!("bound            {}:{:e}", mode_name(h.mode), h.bound_value);
    println!("abs bound        {:e}", h.abs_bound);
    println!("step             {:e}", h.step);
    if h.mode == BoundMode::Noa {
        println!("range            [{:e}, {:e}]", h.range_min, h.range_max);
    }
    println!(
        "stored           {}",
        if h.is_stored() {
            "yes (raw values)"
        } else {
            "no"
        }
    );
    println!(
        "chunk_log2       {} ({} values per chunk)",
        h.chunk_log2,
        1u64 << h.chunk_log2
    );
    println!("chunks           {}", h.n_chunks);
    println!(
        "layout           header {HEADER_LEN} B + table {} B + chunks {} B",
        h.table_len(),
        h.payload_len - h.table_len() as u64
    );
    println!("payload checksum {:#010x}", h.payload_checksum);
    if h.data_checksum != 0 {
        println!("data checksum    {:#010x}", h.data_checksum);
    }
    println!("ratio            {ratio:.3}");
    Ok(())
}
