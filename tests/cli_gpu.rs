//! `zcomm ... --device gpu` end to end: the CLI's GPU path compresses, decompresses and
//! benchmarks within the bound, and without a CUDA device it fails with a clear error.
//!
//! A custom harness (`harness = false`, libtest-mimic, as tests/gpu.rs): a check that needs a
//! CUDA device is reported *ignored* ("no CUDA device") on a machine without one, instead of
//! passing without having run; the no-device check is ignored where a device is present.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

fn zcomm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zcomm"))
        .args(args)
        .output()
        .expect("run zcomm")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zcomm-cli-gpu-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn write_f32(path: &Path, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

/// `Ok` when `o` succeeded, else the command's stderr as the failure.
fn ok(o: &Output, what: &str) -> Result<(), Failed> {
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{what}: {}", String::from_utf8_lossy(&o.stderr)).into())
    }
}

/// compress, decompress and bench with `--device gpu`; every codec within its bound.
fn gpu_round_trip() -> Result<(), Failed> {
    let d = tmpdir("rt");
    let (raw, zc, back) = (d.join("in.f32"), d.join("in.zc"), d.join("back.f32"));
    let data: Vec<f32> = (0..300_000)
        .map(|i| (i as f32 * 1e-3).sin() * 100.0)
        .collect();
    write_f32(&raw, &data);
    for codec in ["aatrox", "cuszp-plain", "cuszp-outlier", "pfpl"] {
        let o = zcomm(&[
            "compress",
            "-i",
            p(&raw),
            "-o",
            p(&zc),
            "--dtype",
            "f32",
            "--error-bound",
            "abs:1e-2",
            "--codec",
            codec,
            "--device",
            "gpu",
        ]);
        ok(&o, &format!("compress --codec {codec} --device gpu"))?;
        let o = zcomm(&[
            "decompress",
            "-i",
            p(&zc),
            "-o",
            p(&back),
            "--device",
            "gpu",
        ]);
        ok(&o, &format!("decompress ({codec}) --device gpu"))?;
        let b = std::fs::read(&back)?;
        if b.len() != data.len() * 4 {
            return Err(format!("{codec}: {} bytes decoded", b.len()).into());
        }
        for (i, (x, c)) in data.iter().zip(b.chunks_exact(4)).enumerate() {
            let y = f32::from_le_bytes(c.try_into().unwrap());
            if (*x as f64 - y as f64).abs() > 1e-2 {
                return Err(format!("{codec}: value {i}: {x} -> {y}").into());
            }
        }
    }
    let o = zcomm(&[
        "bench",
        "-i",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "noa:1e-3",
        "--runs",
        "1",
        "--device",
        "gpu",
        "--json",
    ]);
    ok(&o, "bench --device gpu")?;
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    for r in recs.as_array().ok_or("bench --json: not an array")? {
        if r["bound_ok"] != true || r["bit_identical_to_cpu"] != true {
            return Err(format!("bench --device gpu: {r}").into());
        }
    }
    std::fs::remove_dir_all(&d).ok();
    Ok(())
}

/// Without a CUDA device, `--device gpu` is an error (exit 1, no panic) that says why.
fn no_device_is_a_clear_error() -> Result<(), Failed> {
    let d = tmpdir("nodev");
    let raw = d.join("in.f32");
    write_f32(&raw, &[1.0, 2.0, 3.0]);
    let o = zcomm(&[
        "compress",
        "-i",
        p(&raw),
        "-o",
        p(&d.join("o")),
        "--dtype",
        "f32",
        "--error-bound",
        "abs:1e-3",
        "--device",
        "gpu",
    ]);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    std::fs::remove_dir_all(&d).ok();
    if o.status.code() != Some(1) || e.contains("panicked") || !e.contains("zcomm: error:") {
        return Err(format!("expected a clean error, got {:?}: {e}", o.status.code()).into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let present = zcomm::gpu::device_available;
    let trials = vec![
        Trial::ignorable_test("cli_gpu_round_trip", move || {
            if !present() {
                return Ok(Completion::ignored_with("skipped: no CUDA device"));
            }
            gpu_round_trip().map(|()| Completion::Completed)
        }),
        Trial::ignorable_test("cli_gpu_without_device_is_a_clear_error", move || {
            if present() {
                return Ok(Completion::ignored_with(
                    "skipped: a CUDA device is present",
                ));
            }
            no_device_is_a_clear_error().map(|()| Completion::Completed)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
