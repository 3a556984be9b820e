//! The `zcomm` binary end to end: compress → info → decompress round trips, bench output, and
//! clear errors (non-zero exit, no panic) for bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn zcomm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zcomm"))
        .args(args)
        .output()
        .expect("run zcomm")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zcomm-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(
        path,
        v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
}

#[test]
fn compress_info_decompress_round_trip() {
    let d = tmpdir("rt");
    let (raw, zc, back) = (d.join("in.f32"), d.join("in.zc"), d.join("back.f32"));
    let data: Vec<f32> = (0..50_000)
        .map(|i| (i as f32 * 1e-3).sin() * 100.0)
        .collect();
    write_f32(&raw, &data);
    for codec in ["aatrox", "cuszp-plain", "cuszp-outlier"] {
        let o = zcomm(&[
            "compress",
            "--input",
            p(&raw),
            "--output",
            p(&zc),
            "--dtype",
            "f32",
            "--error-bound",
            "abs:1e-2",
            "--codec",
            codec,
        ]);
        assert!(o.status.success(), "{codec}: {}", stderr(&o));
        let o = zcomm(&["info", "--input", p(&zc), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(h["codec"], codec);
        assert_eq!(h["count"], 50_000);
        assert_eq!(h["dtype"], "f32");
        assert_eq!(h["mode"], "abs");
        let o = zcomm(&["info", "--input", p(&zc)]);
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("abs:1e-2"));
        let o = zcomm(&["decompress", "--input", p(&zc), "--output", p(&back)]);
        assert!(o.status.success(), "{}", stderr(&o));
        let b = std::fs::read(&back).unwrap();
        assert_eq!(b.len(), data.len() * 4);
        for (x, c) in data.iter().zip(b.chunks_exact(4)) {
            let y = f32::from_le_bytes(c.try_into().unwrap());
            assert!((*x as f64 - y as f64).abs() <= 1e-2);
        }
    }
    // f64, rel bound
    let raw64 = d.join("in.f64");
    let v: Vec<u8> = (0..3000)
        .flat_map(|i| (1.0 + i as f64).ln().to_le_bytes())
        .collect();
    std::fs::write(&raw64, &v).unwrap();
    let o = zcomm(&[
        "compress",
        "--input",
        p(&raw64),
        "--output",
        p(&zc),
        "--dtype",
        "f64",
        "--error-bound",
        "rel:1e-4",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = zcomm(&["decompress", "--input", p(&zc), "--output", p(&back)]);
    assert!(o.status.success());
    assert_eq!(std::fs::read(&back).unwrap().len(), v.len());
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn bench_prints_table_and_json() {
    let d = tmpdir("bench");
    let raw = d.join("in.f32");
    write_f32(
        &raw,
        &(0..40_000)
            .map(|i| (i as f32 * 3e-3).cos())
            .collect::<Vec<_>>(),
    );
    let o = zcomm(&[
        "bench",
        "--input",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "noa:1e-3",
        "--runs",
        "2",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let recs: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(recs.len(), zcomm::CodecKind::ALL.len());
    for r in &recs {
        assert!(r["ratio"].as_f64().unwrap() > 1.0);
        assert!(r["max_error"].as_f64().unwrap() <= r["abs_bound"].as_f64().unwrap());
        assert!(r["compress_gbps"].as_f64().unwrap() > 0.0);
        assert!(r["decompress_gbps"].as_f64().unwrap() > 0.0);
        assert_eq!(r["bound_ok"], true);
        assert_eq!(r["threads"], 1);
        assert_eq!(r["bytes"], 160_000);
    }
    let o = zcomm(&[
        "bench",
        "--input",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "abs:1e-4",
        "--runs",
        "1",
        "--codec",
        "aatrox",
    ]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("| codec | ratio |") && out.contains("| aatrox |"),
        "{out}"
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn bad_input_is_a_clear_error() {
    let d = tmpdir("bad");
    let odd = d.join("odd.raw");
    std::fs::write(&odd, [1u8, 2, 3, 4, 5]).unwrap();
    let missing = d.join("missing.f32");
    let out = d.join("out");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "compress",
                "--input",
                p(&missing),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:1",
            ],
            "cannot read input",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:1",
            ],
            "not a whole number of f32 values",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f64",
                "--error-bound",
                "abs:1",
            ],
            "not a whole number of f64 values",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:0",
            ],
            "must be finite and > 0",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "noa:-1",
            ],
            "must be finite and > 0",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "rel:nan",
            ],
            "must be finite and > 0",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "xyz:1",
            ],
            "unknown mode",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f16",
                "--error-bound",
                "abs:1",
            ],
            "unknown dtype",
        ),
        (
            vec![
                "compress",
                "--input",
                p(&odd),
                "--output",
                p(&out),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:1",
                "--codec",
                "zstd",
            ],
            "possible values",
        ),
        (
            vec!["decompress", "--input", p(&odd), "--output", p(&out)],
            "corrupt stream",
        ),
        (
            vec!["decompress", "--input", p(&missing), "--output", p(&out)],
            "cannot read input",
        ),
        (vec!["info", "--input", p(&odd)], "corrupt stream"),
        (
            vec![
                "bench",
                "--input",
                p(&odd),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:1",
                "--codec",
                "nope",
            ],
            "unknown codec",
        ),
        (
            vec![
                "bench",
                "--input",
                p(&odd),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:1",
            ],
            "not a whole number",
        ),
        (
            vec![
                "bench",
                "--input",
                p(&odd),
                "--dtype",
                "f32",
                "--error-bound",
                "abs:1",
                "--runs",
                "0",
            ],
            "--runs",
        ),
    ];
    for (args, msg) in cases {
        let o = zcomm(&args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(o.status.code().is_some(), "{args:?} was killed by a signal");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
        assert!(e.contains(msg), "{args:?}: expected `{msg}` in: {e}");
    }
    assert!(!out.exists(), "a failed command wrote its output");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn gpu_device_without_gpu_is_an_error_not_a_panic() {
    let d = tmpdir("gpu");
    let raw = d.join("in.f32");
    write_f32(&raw, &[1.0, 2.0, 3.0]);
    let o = zcomm(&[
        "compress",
        "--input",
        p(&raw),
        "--output",
        p(&d.join("o")),
        "--dtype",
        "f32",
        "--error-bound",
        "abs:1e-3",
        "--device",
        "gpu",
    ]);
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
    if !o.status.success() {
        assert!(e.contains("unavailable") || e.contains("gpu"), "{e}");
        eprintln!("skipped: no CUDA device ({})", e.trim());
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A well-formed (all checksums valid) stream that claims 2^36 f64 values (512 GiB) in 40 MiB:
/// `decompress` must refuse to allocate with an error instead of aborting. Only where the kernel
/// refuses such an allocation (heuristic overcommit, less than 512 GiB of memory).
#[test]
fn huge_claimed_count_is_an_error_not_an_abort() {
    let overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next()?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(u64::MAX);
    if overcommit.trim() != "0" || mem_kb > 256 << 20 {
        eprintln!("skipped: this machine might grant a 512 GiB allocation");
        return;
    }
    let one = zcomm::compress(
        &vec![0f64; 32_768],
        zcomm::ErrorBound::Abs(1.0),
        zcomm::CodecKind::Aatrox,
    )
    .unwrap();
    let h = zcomm::inspect(&one).unwrap();
    assert_eq!(h.n_chunks, 1);
    let chunk = &one[96 + 8..];
    let n: usize = 1 << 21;
    let mut s = one[..96].to_vec();
    s[16..24].copy_from_slice(&(1u64 << 36).to_le_bytes());
    s[64..72].copy_from_slice(&((n * (8 + chunk.len())) as u64).to_le_bytes());
    s[72..76].copy_from_slice(&(n as u32).to_le_bytes());
    for _ in 0..n {
        s.extend_from_slice(&one[96..104]);
    }
    for _ in 0..n {
        s.extend_from_slice(chunk);
    }
    common::reseal(&mut s);
    assert_eq!(zcomm::inspect(&s).unwrap().count, 1 << 36);
    let d = tmpdir("huge");
    let (zc, out) = (d.join("huge.zc"), d.join("out.f64"));
    std::fs::write(&zc, &s).unwrap();
    let o = zcomm(&["decompress", "--input", p(&zc), "--output", p(&out)]);
    let e = stderr(&o);
    eprintln!("{}", e.trim());
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("out of memory") || e.contains("limit"), "{e}");
    std::fs::remove_dir_all(&d).ok();
}
