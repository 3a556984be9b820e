//! `zcomm info`: dump a stream's header.

use std::path::PathBuf;

use zcomm::format::{BoundMode, Header};
use zcomm::{CodecKind, Result};

use crate::array::read_file;
use crate::out::outln;

/// Arguments of `zcomm info`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  zcomm info -i field.zc
  zcomm info -i field.zc --json
  zcomm info -i field.zc --json | jq .count
  zcomm info -i pos.zc --json | jq .gpz   (gpz: particles, d, order)")]
pub struct Args {
    /// Compressed stream.
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Print the header as one JSON object (numbers at full precision).
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
    // gpz: particles and coordinates from the shape (also for stored streams), the order and
    // the per-axis bounds from the GPZ header of a compressed stream
    let gpz = (h.codec == CodecKind::Gpz.tag())
        .then(|| -> Result<_> {
            let d = zcomm::format::gpz_coords(&h.shape())?;
            let g = if h.is_stored() {
                None
            } else {
                Some(zcomm::codec::gpz_payload_header(&stream, &h)?)
            };
            Ok((d, g))
        })
        .transpose()?;
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
            // the shape, slowest first (format version 3); null in 1-D version 2 streams
            "dims": h.dims.map(|d| d.as_slice().to_vec()),
            "version": h.version(),
            "bound_value": h.bound_value,
            "abs_bound": h.abs_bound,
            "step": h.step,
            "range_min": h.range_min,
            "range_max": h.range_max,
            // null when the stream has none
            "fill_value": h.fill_value,
            "payload_len": h.payload_len,
            "n_chunks": h.n_chunks,
            "payload_checksum": format!("{:#010x}", h.payload_checksum),
            "ratio": ratio,
            // gpz streams: null for the other codecs; order and axes null when stored
            "gpz": gpz.as_ref().map(|(d, g)| serde_json::json!({
                "particles": h.count / *d as u64,
                "d": d,
                "order": g.as_ref().map(|g| g.order.name()),
                "axis_abs_bounds": g.as_ref().map(|g| g.axes.iter().map(|x| x.abs_bound).collect::<Vec<_>>()),
            })),
        });
        let json = serde_json::to_string_pretty(&v)
            .map_err(|e| zcomm::Error::invalid(format!("cannot print JSON: {e}")))?;
        return outln!("{json}");
    }
    outln!(
        "stream           {} ({} bytes)",
        a.input.display(),
        stream.len()
    )?;
    outln!("codec            {}", codec_name(&h))?;
    outln!("dtype            {}", h.dtype)?;
    outln!("count            {}", h.count)?;
    if let Some(d) = h.dims {
        outln!("dims             {d} (format version 3)")?;
    }
    if let Some((d, g)) = &gpz {
        outln!("particles        {} x {d} coordinates", h.count / *d as u64)?;
        match g {
            Some(g) => {
                outln!(
                    "order            {}",
                    match g.order {
                        zcomm::codec::gpz::Order::Preserve =>
                            "preserve (decodes in the original order)",
                        zcomm::codec::gpz::Order::Reorder =>
                            "reorder (decodes in stored order; the stream has no permutation)",
                    }
                )?;
                let b: Vec<String> = g.axes.iter().map(|x| num(x.abs_bound)).collect();
                outln!("axis abs bounds  {}", b.join(", "))?;
            }
            None => outln!("order            input order (stored)")?,
        }
    }
    outln!(
        "bound            {}:{}",
        mode_name(h.mode),
        num(h.bound_value)
    )?;
    let abs_what = match h.mode {
        BoundMode::Abs => "",
        BoundMode::Noa => " (bound x value range)",
        BoundMode::Rel => " (point-wise relative bound)",
    };
    outln!("abs bound        {}{abs_what}", num(h.abs_bound))?;
    outln!("step             {}", num(h.step))?;
    if h.mode == BoundMode::Noa {
        outln!(
            "range            [{}, {}]{}",
            num(h.range_min),
            num(h.range_max),
            if h.fill_value.is_some() {
                " (fill points excluded)"
            } else {
                ""
            }
        )?;
    }
    if let Some(f) = h.fill_value {
        // exact, in the stream's dtype: the value to pass to --fill-value again
        let shown = match h.dtype {
            zcomm::Dtype::F32 => format!("{:e}", f as f32),
            zcomm::Dtype::F64 => format!("{f:e}"),
        };
        outln!("fill value       {shown} (kept exactly)")?;
    }
    outln!(
        "stored           {}",
        if h.is_stored() {
            "yes: the values are kept raw (encoding would not have been smaller), decoded exactly"
        } else {
            "no: the values are quantized and encoded within the bound"
        }
    )?;
    outln!(
        "chunk_log2       {} ({} values per chunk)",
        h.chunk_log2,
        1u64 << h.chunk_log2
    )?;
    outln!("chunks           {}", h.n_chunks)?;
    outln!(
        "layout           header {} B + table {} B + chunks {} B",
        h.header_len(),
        h.table_len(),
        h.payload_len - h.table_len() as u64
    )?;
    outln!("payload checksum {:#010x}", h.payload_checksum)?;
    if h.data_checksum != 0 {
        outln!("data checksum    {:#010x}", h.data_checksum)?;
    }
    if h.count == 0 {
        return outln!("ratio            - (empty array)");
    }
    outln!("ratio            {ratio:.3}")
}

/// A number for people: as given when it is short (`1e-2`), else 4 significant digits
/// (`1.319e-1`, not `1.3188195800781247e-1`); `--json` keeps full precision.
fn num(x: f64) -> String {
    let full = format!("{x:e}");
    let mantissa = full.split('e').next().unwrap_or("");
    if mantissa.trim_start_matches('-').len() <= 5 {
        full
    } else {
        format!("{x:.3e}")
    }
}
