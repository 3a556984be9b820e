//! `zcomm model`: the overall-speedup model (AATROX §5.6, extended; see `zcomm::model`).
//!
//! * `zcomm model --bandwidth 25GB/s --ratio 20 --throughput 400GB/s` prints the predicted
//!   speedup (AATROX's formula, then the extended serial and pipelined forms for `--bytes`).
//! * `zcomm model --plot out.svg` draws a Fig. 14-style speedup map over compression ratio ×
//!   bandwidth (hand-written SVG).

use std::fmt::Write as _;
use std::path::PathBuf;

use zcomm::model::{aatrox_speedup, parse_rate, predict, Link, Profile, Scenario};
use zcomm::{Error, Result};

use crate::out::outln;

/// The compression throughput `--plot` assumes without `--throughput` or `--profile`: AATROX's
/// measured compression throughput on an A100 (GB/s = 1e9 bytes/s).
const DEFAULT_PLOT_THROUGHPUT: f64 = 372.6e9;

/// Arguments of `zcomm model`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  zcomm model --bandwidth 25GB/s --ratio 20 --throughput 400GB/s
  zcomm model --bandwidth 12GiB/s --ratio 8 --throughput 150GB/s --latency 5us --bytes 256MiB
  zcomm model --plot speedup.svg --throughput 200GB/s

Units: GB, MB are decimal (1e9, 1e6 bytes), GiB, MiB binary (2^30, 2^20 bytes).")]
pub struct Args {
    /// Link bandwidth (e.g. `25GB/s`, `12GiB/s`).
    #[arg(long, value_parser = rate)]
    pub bandwidth: Option<f64>,
    /// Compression ratio.
    #[arg(long)]
    pub ratio: Option<f64>,
    /// Compression throughput (e.g. `400GB/s`; with --plot, default 372.6 GB/s, AATROX on an A100).
    #[arg(long, value_parser = rate)]
    pub throughput: Option<f64>,
    /// Decompression throughput (default: ignored, as in AATROX's formula).
    #[arg(long, value_parser = rate)]
    pub decompress_throughput: Option<f64>,
    /// Per-message latency (e.g. `2us`, `0.5ms`; default 0).
    #[arg(long, value_parser = seconds)]
    pub latency: Option<f64>,
    /// Staging link crossed before and after the network (device→host, host→device).
    #[arg(long, value_parser = rate)]
    pub staging_bandwidth: Option<f64>,
    /// Message size for the extended model (e.g. `1GiB` = 2^30 bytes, `1GB` = 1e9 bytes).
    #[arg(long, value_parser = rate, default_value = "1GiB")]
    pub bytes: f64,
    /// Pipeline chunks for the pipelined form.
    #[arg(long, default_value_t = 16)]
    pub chunks: usize,
    /// Take bandwidth, latency, staging and throughputs from a calibration profile (JSON).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Draw the speedup map over ratio × bandwidth into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

fn rate(s: &str) -> std::result::Result<f64, String> {
    parse_rate(s).map_err(|e| e.to_string())
}

fn seconds(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim();
    let (num, mult) = if let Some(v) = t.strip_suffix("us") {
        (v, 1e-6)
    } else if let Some(v) = t.strip_suffix("ns") {
        (v, 1e-9)
    } else if let Some(v) = t.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("`{s}` must be >= 0"));
    }
    Ok(v * mult)
}

/// Run `zcomm model`.
pub fn run(a: Args) -> Result<()> {
    let prof = a.profile.as_deref().map(Profile::load).transpose()?;
    let sp = prof.as_ref().and_then(|p| p.codecs.first().copied());
    let bw = a.bandwidth.or(prof.as_ref().map(|p| p.link.bandwidth));
    let tc = a.throughput.or(sp.map(|s| s.compress));
    let td = a
        .decompress_throughput
        .or(sp.map(|s| s.decompress))
        .unwrap_or(f64::INFINITY);
    let lat = a
        .latency
        .or(prof.as_ref().map(|p| p.link.latency))
        .unwrap_or(0.0);
    let staging = a
        .staging_bandwidth
        .map(|b| Link {
            bandwidth: b,
            latency: 0.0,
        })
        .or(prof.as_ref().and_then(|p| p.staging));
    if let Some(path) = &a.plot {
        let (tc, whence) = match tc {
            Some(t) => (t, ""),
            None => (
                DEFAULT_PLOT_THROUGHPUT,
                ", the default: set it with --throughput",
            ),
        };
        let svg = surface_svg(tc, td, lat, staging, a.bytes);
        let inputs: Vec<&std::path::Path> = a.profile.iter().map(|p| p.as_path()).collect();
        crate::output::write_all(path, svg.as_bytes(), &inputs)?;
        outln!(
            "wrote {} (speedup over ratio 1-100 x bandwidth 1-100 GB/s, compression throughput {}{whence})",
            path.display(),
            zcomm::model::fmt_rate(tc)
        )?;
        if a.ratio.is_none() {
            return Ok(());
        }
    }
    let (Some(bw), Some(cr), Some(tc)) = (bw, a.ratio, tc) else {
        return Err(Error::invalid(
            "zcomm model needs --bandwidth, --ratio and --throughput (or --profile), or --plot FILE",
        ));
    };
    if !(cr.is_finite() && cr > 0.0) {
        return Err(Error::invalid("--ratio must be > 0"));
    }
    let s = aatrox_speedup(bw, cr, tc);
    outln!(
        "AATROX overall speedup: 1/((1/(BW*CR) + 1/T_compr)*BW) = {s:.2}x  (BW {}, CR {cr}, T_compr {})",
        zcomm::model::fmt_rate(bw),
        zcomm::model::fmt_rate(tc)
    )?;
    let sc = scenario(a.bytes, cr, bw, lat, tc, td, staging).with_chunks(a.chunks);
    let p = predict(&sc);
    outln!(
        "extended model for {} (T_decompr {}, latency {:.1} us, staging {}):",
        fmt_bytes(a.bytes),
        if td.is_finite() {
            zcomm::model::fmt_rate(td)
        } else {
            "ignored".into()
        },
        lat * 1e6,
        staging
            .map(|l| zcomm::model::fmt_rate(l.bandwidth))
            .unwrap_or_else(|| "none".into())
    )?;
    outln!(
        "  serial:    raw {:.3} ms, compressed {:.3} ms, speedup {:.2}x",
        p.raw_serial * 1e3,
        p.compressed_serial * 1e3,
        p.speedup_serial()
    )?;
    outln!(
        "  pipelined ({} chunks): raw {:.3} ms, compressed {:.3} ms, speedup {:.2}x",
        a.chunks,
        p.raw_pipelined * 1e3,
        p.compressed_pipelined * 1e3,
        p.speedup_pipelined()
    )
}

/// A message size in the unit family it was most likely given in: binary (`1 GiB`) when it is a
/// whole number of MiB, decimal (`1.5 GB`) otherwise; exact bytes too.
/// The modelled transfer of `bytes` at ratio `cr` over a link of bandwidth `bw` and latency
/// `lat`, with compression and decompression throughputs `tc` and `td` and optional staging:
/// the one scenario that both the printed prediction and the speedup map evaluate.
fn scenario(
    bytes: f64,
    cr: f64,
    bw: f64,
    lat: f64,
    tc: f64,
    td: f64,
    staging: Option<Link>,
) -> Scenario {
    Scenario::new(
        bytes,
        cr,
        Link {
            bandwidth: bw,
            latency: lat,
        },
        tc,
        td,
    )
    .with_staging(staging)
}

fn fmt_bytes(b: f64) -> String {
    let (gib, mib) = (1073741824.0, 1048576.0);
    let unit = if b >= gib && (b % mib) == 0.0 {
        format!("{} GiB", b / gib)
    } else if b >= mib && (b % mib) == 0.0 {
        format!("{} MiB", b / mib)
    } else if b >= 1e9 {
        format!("{} GB", b / 1e9)
    } else {
        format!("{} MB", b / 1e6)
    };
    format!("{unit} ({b} bytes)")
}

/// Colour for a speedup (log scale, <1 red, 1 white-ish, high blue).
fn colour(s: f64) -> String {
    if s < 1.0 {
        let t = (1.0 - s).clamp(0.0, 1.0);
        let c = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
        format!(
            "#{:02x}{:02x}{:02x}",
            c(250.0, 200.0),
            c(240.0, 40.0),
            c(230.0, 40.0)
        )
    } else {
        let t = (s.log10() / 2.0).clamp(0.0, 1.0);
        let c = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
        format!(
            "#{:02x}{:02x}{:02x}",
            c(255.0, 8.0),
            c(247.0, 48.0),
            c(188.0, 107.0)
        )
    }
}

/// Speedup map over ratio (x, log) × bandwidth (y, log), AATROX Fig. 14 style.
fn surface_svg(tc: f64, td: f64, lat: f64, staging: Option<Link>, bytes: f64) -> String {
    let (nx, ny) = (40usize, 30usize);
    let (x0, y0, w, h) = (80.0, 50.0, 640.0, 420.0);
    let (cr_lo, cr_hi) = (1.0f64, 100.0f64);
    let (bw_lo, bw_hi) = (1e9f64, 100e9f64);
    let speed = |cr: f64, bw: f64| {
        if td.is_infinite() && lat == 0.0 && staging.is_none() {
            aatrox_speedup(bw, cr, tc)
        } else {
            predict(&scenario(bytes, cr, bw, lat, tc, td, staging)).speedup_serial()
        }
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="820" height="540" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="820" height="540" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="400" y="25" text-anchor="middle" font-size="15">Predicted speedup of compressed transfer (T_compr = {})</text>"#,
        zcomm::model::fmt_rate(tc)
    );
    let cw = w / nx as f64;
    let ch = h / ny as f64;
    for j in 0..ny {
        for i in 0..nx {
            let cr = cr_lo * (cr_hi / cr_lo).powf((i as f64 + 0.5) / nx as f64);
            let bw = bw_lo * (bw_hi / bw_lo).powf((j as f64 + 0.5) / ny as f64);
            let s = speed(cr, bw);
            let _ = writeln!(
                o,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.2}" height="{:.2}" fill="{}"><title>CR {cr:.1}, BW {:.1} GB/s: {s:.2}x</title></rect>"#,
                x0 + i as f64 * cw,
                y0 + h - (j + 1) as f64 * ch,
                cw + 0.3,
                ch + 0.3,
                colour(s),
                bw / 1e9
            );
        }
    }
    // labelled grid points
    for &cr in &[2.0, 5.0, 10.0, 20.0, 50.0, 100.0] {
        for &bw in &[1e9, 4e9, 12e9, 32e9, 100e9] {
            let x = x0 + w * (cr / cr_lo).log10() / (cr_hi / cr_lo).log10();
            let y = y0 + h - h * (bw / bw_lo).log10() / (bw_hi / bw_lo).log10();
            let s = speed(cr, bw);
            let fill = if s > 10.0 { "white" } else { "black" };
            let _ = writeln!(
                o,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="2" fill="{fill}"/><text x="{:.1}" y="{:.1}" fill="{fill}" font-size="10" text-anchor="end">{s:.1}x</text>"#,
                x - 3.0,
                y - 3.0
            );
        }
    }
    // axes
    let _ = writeln!(
        o,
        r#"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="black"/>"#
    );
    for &cr in &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0] {
        let x = x0 + w * (cr / cr_lo).log10() / (cr_hi / cr_lo).log10();
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{cr}</text>"#,
            y0 + h,
            y0 + h + 5.0,
            y0 + h + 18.0
        );
    }
    for &bw in &[1.0f64, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0] {
        let y = y0 + h - h * bw.log10() / 2.0;
        let _ = writeln!(
            o,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{x0}" y2="{y:.1}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="end">{bw}</text>"#,
            x0 - 5.0,
            x0 - 8.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">compression ratio</text>"#,
        x0 + w / 2.0,
        y0 + h + 38.0
    );
    let _ = writeln!(
        o,
        r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">link bandwidth (GB/s)</text>"#,
        y0 + h / 2.0,
        y0 + h / 2.0
    );
    // colour bar
    for k in 0..50 {
        let s = 10f64.powf(-0.5 + 2.5 * k as f64 / 49.0);
        let _ = writeln!(
            o,
            r#"<rect x="740" y="{:.1}" width="20" height="9" fill="{}"/>"#,
            y0 + h - (k + 1) as f64 * h / 50.0,
            colour(s)
        );
    }
    for &s in &[0.5f64, 1.0, 3.0, 10.0, 30.0, 100.0] {
        let y = y0 + h - h * (s.log10() + 0.5) / 2.5;
        let _ = writeln!(o, r#"<text x="765" y="{:.1}">{s}x</text>"#, y + 4.0);
    }
    let _ = writeln!(o, "</svg>");
    o
}
