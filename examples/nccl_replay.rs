//! Replays the NCCL cost model on recorded `nccl_bench` runs: for every compressed (`always`)
//! record, the model's prediction from the calibration profile the run wrote beside its records
//! (`FILE.json.profile.json`) and the ratios it measured, against the measured time. Use it to
//! check a change of the model on measurements already made, without a GPU.
//!
//! ```text
//! cargo run --release --example nccl_replay -- --records bench/results/RUN.json
//! cargo run --release --example nccl_replay -- --records RUN.json --profile P.json --json
//! ```

use std::process::ExitCode;

use clap::Parser;
use zcomm::model::{CodecSpeed, Curve, Profile, WireRatio};
use zcomm::CodecKind;

#[derive(Parser, Debug)]
#[command(
    about = "Replay the NCCL cost model on recorded nccl_bench runs (no GPU needed)",
    after_help = "Examples:\n  nccl_replay --records bench/results/2026-11-27-h100x4-nvlink-n4.json \\\n      --profile bench/results/2026-11-27-h100x4-nvlink-n4.profile.json\n  nccl_replay --records run.json --json > replay.jsonl"
)]
struct Args {
    /// The records `nccl_bench --out` wrote.
    #[arg(long)]
    records: String,
    /// The calibration profile of that run (default: `RECORDS.profile.json`).
    #[arg(long)]
    profile: Option<String>,
    /// JSON lines instead of a Markdown table.
    #[arg(long)]
    json: bool,
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn num(r: &serde_json::Value, key: &str) -> Result<f64, String> {
    r[key]
        .as_f64()
        .ok_or_else(|| format!("record without a number `{key}`: {r}"))
}

/// A profile file: the current format ([`Profile::from_json`]), or the NCCL-only profile that
/// `nccl_bench` wrote before the engine had one profile (the records in `bench/results/` from
/// 2026-11-27 and earlier), converted field by field: `p2p` is the exchange curve, `p2p_one`
/// the one-way curve, `codecs` the GPU codecs (records without their own fixed costs take the
/// file's `compress_fixed` / `decompress_fixed`), `range_rate` the range pass, `copy_rate` the
/// device copy.
fn load_profile(text: &str) -> Result<Profile, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if v.get("p2p").is_none() {
        return Profile::from_json(text).map_err(|e| e.to_string());
    }
    let curve = |k: &str| -> Result<Option<Curve>, String> {
        match v.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(c) => serde_json::from_value(c.clone())
                .map(Some)
                .map_err(|e| format!("{k}: {e}")),
        }
    };
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let mut p = Profile::direct_guess(v["transport"].as_str().unwrap_or("nvlink"));
    p.allreduce = curve("allreduce")?;
    p.allgather = curve("allgather")?;
    p.link_exchange = curve("p2p")?.ok_or("no p2p curve")?;
    p.link_one_way = curve("p2p_one")?.unwrap_or_default();
    let mut codecs: Vec<CodecSpeed> =
        serde_json::from_value(v["codecs"].clone()).map_err(|e| format!("codecs: {e}"))?;
    for c in &mut codecs {
        if c.compress_overhead == 0.0 {
            c.compress_overhead = f("compress_fixed");
        }
        if c.decompress_overhead == 0.0 {
            c.decompress_overhead = f("decompress_fixed");
        }
    }
    p.gpu_codecs = codecs;
    p.piece_overhead = f("piece_overhead");
    p.range_pass = f("range_rate");
    p.range_fixed = f("range_fixed");
    p.device_copy = f("copy_rate");
    Ok(p)
}

fn run(a: &Args) -> Result<(), String> {
    let profile_path = a
        .profile
        .clone()
        .unwrap_or_else(|| format!("{}.profile.json", a.records));
    let prof = load_profile(&read(&profile_path)?).map_err(|e| format!("{profile_path}: {e}"))?;
    let recs: Vec<serde_json::Value> =
        serde_json::from_str(&read(&a.records)?).map_err(|e| format!("{}: {e}", a.records))?;
    if !a.json {
        println!("| op | ranks | MiB/rank | bound | measured ms | recorded prediction ms | replayed ms | replayed err |");
        println!("|---|---:|---:|---|---:|---:|---:|---:|");
    }
    for r in recs.iter().filter(|r| r["policy"] == "always") {
        let (bytes, ranks) = (num(r, "bytes")?, num(r, "ranks")? as usize);
        let codec: CodecKind = r["codec"]
            .as_str()
            .unwrap_or("aatrox")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let ratio = WireRatio {
            major: num(r, "ratio_major")?,
            minor: num(r, "ratio_minor")?,
        };
        let op = r["op"].as_str().unwrap_or("");
        // the operations' piece counts: one stream per rank, whole ring segments
        let predicted = match op {
            "allgather" => prof.predict_allgather(bytes, ranks, ratio, 1, codec, 1).1,
            "allreduce" => {
                prof.predict_allreduce(bytes, ranks, ratio, 1, codec, 1, false)
                    .1
            }
            other => return Err(format!("unknown operation `{other}`")),
        } * 1e3;
        let measured = num(r, "compressed_ms")?;
        let err = (measured - predicted) / predicted * 100.0;
        let bound = r["error_bound"].as_str().unwrap_or("");
        if a.json {
            let line = serde_json::json!({
                "op": op, "ranks": ranks, "bytes": bytes, "error_bound": bound,
                "measured_ms": measured, "recorded_predicted_ms": r["predicted_compressed_ms"],
                "replayed_ms": predicted, "replayed_err_pct": err,
            });
            println!("{line}");
        } else {
            println!(
                "| {op} | {ranks} | {:.0} | {bound} | {measured:.3} | {:.3} | {predicted:.3} | {err:+.0} % |",
                bytes / 1048576.0,
                num(r, "predicted_compressed_ms")?
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
