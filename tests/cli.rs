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

/// Built without the `cuda` feature, `--device gpu` is a clear error (with the feature, the GPU
/// CLI path is tested by tests/cli_gpu.rs, ignored on machines without a CUDA device).
#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_device_without_cuda_feature_is_a_clear_error() {
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
    assert_clean_failure(
        &o,
        "--device gpu without cuda",
        "without the `cuda` feature",
    );
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

fn compress_args<'a>(input: &'a Path, output: &'a Path, dtype: &'a str) -> Vec<&'a str> {
    vec![
        "compress",
        "-i",
        p(input),
        "-o",
        p(output),
        "--dtype",
        dtype,
        "--error-bound",
        "noa:1e-3",
    ]
}

fn assert_clean_failure(o: &Output, what: &str, msg: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{what}: {e}");
    assert!(!e.contains("panicked"), "{what} panicked: {e}");
    assert!(e.contains(msg), "{what}: expected `{msg}` in: {e}");
}

fn smooth_f32(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 1e-3).sin() * 100.0).collect()
}

/// Issue 15, item 5: an output that is the input (directly, through a symlink or a hard link) is
/// refused and the input survives; outputs are written through a temporary file that is renamed
/// (none is left behind), and a failed decompress leaves the previous output untouched.
#[test]
fn output_never_overwrites_the_input_and_is_atomic() {
    let d = tmpdir("inplace");
    let (raw, zc) = (d.join("x.f32"), d.join("x.zc"));
    write_f32(&raw, &smooth_f32(10_000));
    let before = std::fs::read(&raw).unwrap();
    let o = zcomm(&compress_args(&raw, &raw, "f32"));
    assert_clean_failure(&o, "compress -i x -o x", "is the input");
    assert_eq!(
        std::fs::read(&raw).unwrap(),
        before,
        "the input was changed"
    );
    let link = d.join("link.f32");
    std::os::unix::fs::symlink(&raw, &link).unwrap();
    let o = zcomm(&compress_args(&raw, &link, "f32"));
    assert_clean_failure(&o, "compress through a symlink", "is the input");
    assert_eq!(std::fs::read(&raw).unwrap(), before);
    let hard = d.join("hard.f32");
    std::fs::hard_link(&raw, &hard).unwrap();
    let o = zcomm(&compress_args(&hard, &raw, "f32"));
    assert_clean_failure(&o, "compress over a hard link", "is the input");
    assert_eq!(std::fs::read(&raw).unwrap(), before);

    assert!(zcomm(&compress_args(&raw, &zc, "f32")).status.success());
    let stream = std::fs::read(&zc).unwrap();
    let o = zcomm(&["decompress", "-i", p(&zc), "-o", p(&zc)]);
    assert_clean_failure(&o, "decompress -i s.zc -o s.zc", "is the input");
    assert_eq!(std::fs::read(&zc).unwrap(), stream);

    // a failed decompress keeps the previous output as it was, and leaves no temporary file
    let out = d.join("out.f32");
    std::fs::write(&out, b"previous").unwrap();
    let bad = d.join("bad.zc");
    let mut s = stream.clone();
    let last = s.len() - 1;
    s[last] ^= 0xff;
    std::fs::write(&bad, &s).unwrap();
    let o = zcomm(&["decompress", "-i", p(&bad), "-o", p(&out)]);
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"previous");
    // writing through a symlink replaces the link's target, the link stays
    let target = d.join("target.f32");
    std::fs::write(&target, b"old").unwrap();
    let out_link = d.join("out-link.f32");
    std::os::unix::fs::symlink(&target, &out_link).unwrap();
    let o = zcomm(&["decompress", "-i", p(&zc), "-o", p(&out_link)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&out_link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&target).unwrap().len(), 40_000);
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.ends_with(".tmp")),
        "temporary files left: {names:?}"
    );
    // /dev/null is written in place, not replaced
    let o = zcomm(&["decompress", "-i", p(&zc), "-o", "/dev/null"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 15, item 6: the decoded size the header claims is checked against
/// `--max-output-bytes` before decoding.
#[test]
fn decompress_respects_max_output_bytes() {
    let d = tmpdir("maxout");
    let (raw, zc, out) = (d.join("x.f32"), d.join("x.zc"), d.join("out.f32"));
    write_f32(&raw, &smooth_f32(10_000));
    assert!(zcomm(&compress_args(&raw, &zc, "f32")).status.success());
    let o = zcomm(&[
        "decompress",
        "-i",
        p(&zc),
        "-o",
        p(&out),
        "--max-output-bytes",
        "39999",
    ]);
    assert_clean_failure(&o, "over the limit", "--max-output-bytes");
    assert!(!out.exists());
    for limit in ["40000", "1MiB", "1GB"] {
        let o = zcomm(&[
            "decompress",
            "-i",
            p(&zc),
            "-o",
            p(&out),
            "--max-output-bytes",
            limit,
        ]);
        assert!(o.status.success(), "{limit}: {}", stderr(&o));
        assert_eq!(std::fs::read(&out).unwrap().len(), 40_000);
    }
    let o = zcomm(&[
        "decompress",
        "-i",
        p(&zc),
        "-o",
        p(&out),
        "--max-output-bytes",
        "lots",
    ]);
    assert!(!o.status.success() && stderr(&o).contains("not a byte count"));
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 15, item 7: a full or closed stdout is an error (or a quiet exit), never a panic.
#[test]
fn full_or_closed_stdout_is_not_a_panic() {
    let d = tmpdir("stdout");
    let (raw, zc) = (d.join("x.f32"), d.join("x.zc"));
    write_f32(&raw, &smooth_f32(10_000));
    assert!(zcomm(&compress_args(&raw, &zc, "f32")).status.success());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_zcomm"))
        .args(["info", "-i", p(&zc)])
        .stdout(full)
        .output()
        .unwrap();
    assert_clean_failure(&o, "info > /dev/full", "No space left");
    // a reader that closes the pipe at once (`| head -0`)
    for args in [
        vec!["info", "-i", p(&zc)],
        vec![
            "model",
            "--bandwidth",
            "10GB/s",
            "--ratio",
            "8",
            "--throughput",
            "100GB/s",
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_zcomm"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let e = stderr(&o);
        assert!(!e.contains("panicked"), "{args:?}: {e}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {e}");
    }
    // the examples too (built by `cargo test` with the mpi feature; skipped otherwise)
    if let Some(sv) = example("statevector") {
        let mut child = Command::new(sv)
            .args(["--circuit", "qft:10", "--fidelity", "0.999"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let e = stderr(&o);
        assert!(!e.contains("panicked"), "statevector | head: {e}");
        assert_eq!(o.status.code(), Some(0), "{e}");
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(example("statevector").unwrap())
            .args(["--circuit", "qft:10", "--fidelity", "0.999"])
            .stdout(full)
            .output()
            .unwrap();
        assert_clean_failure(&o, "statevector > /dev/full", "No space left");
    }
    std::fs::remove_dir_all(&d).ok();
}

/// An example binary next to the zcomm binary (`target/<profile>/examples/<name>`), if built.
fn example(name: &str) -> Option<PathBuf> {
    let bin = Path::new(env!("CARGO_BIN_EXE_zcomm"));
    let e = bin.parent()?.join("examples").join(name);
    if e.exists() {
        Some(e)
    } else {
        eprintln!("skipped: example `{name}` not built (needs feature `mpi`)");
        None
    }
}

/// Issue 15, item 8: resource knobs and endless inputs are refused at once.
#[test]
fn threads_and_endless_inputs_are_refused() {
    let d = tmpdir("knobs");
    let raw = d.join("x.f32");
    write_f32(&raw, &smooth_f32(1000));
    let t = std::time::Instant::now();
    let o = zcomm(&[
        "bench",
        "-i",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "abs:1e-3",
        "--threads",
        "100000",
    ]);
    assert_clean_failure(&o, "--threads 100000", "--threads 100000: at most");
    assert!(t.elapsed().as_secs() < 10);
    for input in ["/dev/zero", "/dev/null"] {
        let o = zcomm(&compress_args(Path::new(input), &d.join("z"), "f32"));
        assert_clean_failure(&o, input, "not a regular file");
        let o = zcomm(&["info", "-i", input]);
        assert_clean_failure(&o, input, "not a regular file");
    }
    let o = zcomm(&compress_args(&d, &d.join("z"), "f32"));
    assert_clean_failure(&o, "a directory", "not a regular file");
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 15, item 11: the no-default-features test run builds in its own target directory, so
/// that it does not replace `target/release/zcomm` (the CUDA build) with a build without CUDA.
#[test]
fn test_script_builds_no_default_features_apart() {
    let script =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test.sh")).unwrap();
    let cmd: String = script
        .split("\ncheck ")
        .find(|c| c.contains("cargo test --release --no-default-features --no-fail-fast"))
        .expect("the no-default-features test step")
        .split("\n\n")
        .next()
        .unwrap()
        .to_string();
    assert!(
        cmd.contains("--target-dir") && cmd.contains("no-default"),
        "the no-default-features step shares the target directory: {cmd}"
    );
}

/// Issue 15, item 12: output for people (short numbers, `stored` explained, the relative error
/// column under a rel bound, usage examples in every `--help`, the plot's default throughput).
#[test]
fn output_explains_itself() {
    let d = tmpdir("explain");
    let (raw, zc) = (d.join("x.f32"), d.join("x.zc"));
    write_f32(&raw, &smooth_f32(10_000));
    // noa: the abs bound is bound x range, a long decimal
    assert!(zcomm(&compress_args(&raw, &zc, "f32")).status.success());
    let o = zcomm(&["info", "-i", p(&zc)]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let abs = out
        .lines()
        .find(|l| l.starts_with("abs bound"))
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();
    assert!(
        abs.split('e').next().unwrap().len() <= 5,
        "abs bound not rounded: {out}"
    );
    assert!(out.contains("stored           no: "), "{out}");
    let o = zcomm(&["info", "-i", p(&zc), "--json"]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(h["abs_bound"].as_f64().unwrap() > 0.0);
    // bench under a rel bound shows the relative error
    let o = zcomm(&[
        "bench",
        "-i",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "rel:1e-2",
        "--runs",
        "1",
        "--codec",
        "aatrox",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        out.contains("| max rel error |") && out.contains("point-wise relative"),
        "{out}"
    );
    for cmd in ["compress", "decompress", "bench", "info", "model"] {
        let o = zcomm(&[cmd, "--help"]);
        let h = String::from_utf8_lossy(&o.stdout).into_owned();
        let n = h.matches(&format!("  zcomm {cmd} ")).count();
        assert!(h.contains("Examples:") && n >= 2, "{cmd} --help: {h}");
    }
    let svg = d.join("plot.svg");
    let o = zcomm(&["model", "--plot", p(&svg)]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success() && svg.exists());
    assert!(
        out.contains("372.60 GB/s") && out.contains("default"),
        "{out}"
    );
    let o = zcomm(&[
        "model",
        "--bandwidth",
        "10GB/s",
        "--ratio",
        "8",
        "--throughput",
        "100GB/s",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(out.contains("for 1 GiB (1073741824 bytes)"), "{out}");
    if let Some(ar) = example("allreduce") {
        let o = Command::new(&ar).arg("--help").output().unwrap();
        let h = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(h.contains("[default: 2097152"), "{h}");
        let o = Command::new(&ar)
            .args(["--n", "2000", "--iters", "1"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(out.matches("legend:").count(), 1, "{out}");
        assert!(
            out.trim_end().ends_with("verdict: every error bound held"),
            "{out}"
        );
    }
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 15, item 13: `bench` on a large input shows a progress line when stderr is a terminal
/// (run under `script`, which gives it one), and none in `--json` mode or without a terminal.
#[test]
fn bench_shows_progress_on_a_terminal_only() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` to run zcomm on a terminal");
        return;
    }
    let d = tmpdir("progress");
    let raw = d.join("big.f32");
    // 64 MiB: the size from which bench shows progress
    let v: Vec<u8> = (0..16usize << 20)
        .flat_map(|i| ((i % 4096) as f32).to_le_bytes())
        .collect();
    std::fs::write(&raw, v).unwrap();
    let bench = |json: &str| {
        let cmd = format!(
            "{} bench -i {} --dtype f32 --error-bound abs:1 --codec aatrox --runs 1 {json} >/dev/null",
            env!("CARGO_BIN_EXE_zcomm"),
            p(&raw)
        );
        let o = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let tty = bench("");
    assert!(
        tty.contains("bench ") && tty.contains("aatrox: "),
        "{tty:?}"
    );
    assert!(!bench("--json").contains("aatrox: "));
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 15, item 15: `compress` prints the value count and warns about an f32 file compressed as
/// f64 (and the reverse).
#[test]
fn reinterpreted_dtype_is_warned_about() {
    let d = tmpdir("dtype");
    let (raw, zc) = (d.join("x.f32"), d.join("x.zc"));
    write_f32(&raw, &smooth_f32(10_000));
    let o = zcomm(&compress_args(&raw, &zc, "f32"));
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("10000 f32 values"));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    let o = zcomm(&compress_args(&raw, &zc, "f64"));
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("5000 f64 values"));
    assert!(
        stderr(&o).contains("warning") && stderr(&o).contains("--dtype f32"),
        "{}",
        stderr(&o)
    );
    let raw64 = d.join("x.f64");
    let v: Vec<u8> = (0..10_000)
        .flat_map(|i| ((i as f64) * 1.37e-3).sin().to_le_bytes())
        .collect();
    std::fs::write(&raw64, v).unwrap();
    let o = zcomm(&compress_args(&raw64, &zc, "f64"));
    assert!(o.status.success() && !stderr(&o).contains("warning"));
    let o = zcomm(&compress_args(&raw64, &zc, "f32"));
    assert!(
        stderr(&o).contains("warning") && stderr(&o).contains("--dtype f64"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 15, item 16: an empty input says so, with no ratio, PSNR or throughput.
#[test]
fn empty_input_says_so() {
    let d = tmpdir("empty");
    let (raw, zc, back) = (d.join("e.f32"), d.join("e.zc"), d.join("back.f32"));
    std::fs::write(&raw, b"").unwrap();
    let o = zcomm(&compress_args(&raw, &zc, "f32"));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        out.contains("empty input") && !out.contains("ratio"),
        "{out}"
    );
    let o = zcomm(&[
        "bench",
        "-i",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "abs:1",
        "--runs",
        "1",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        out.contains("empty input") && !out.contains("GB/s") && !out.contains("inf"),
        "{out}"
    );
    let o = zcomm(&["decompress", "-i", p(&zc), "-o", p(&back)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&back).unwrap().len(), 0);
    std::fs::remove_dir_all(&d).ok();
}

/// A Levitus-like field: a smooth ocean (values within [5, 25]) with `-1e10` on land, 30 % of the
/// points, in runs of 300 out of every 1000 (land is contiguous, as on a real grid).
fn levitus_like(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            if i % 1000 < 300 {
                -1e10
            } else {
                15.0 + 10.0 * ((i as f32 * 7e-4).sin() * (i as f32 * 3e-5).cos())
            }
        })
        .collect()
}

/// Issue 15, item 14: without `--fill-value`, compress and bench warn about a value that spans
/// most of the range, naming it and the option; with it, the fill points come back exactly and
/// the other values are within E * (their own max - min), in compress/decompress and in every
/// codec of bench (whose bound check excludes the fill points and checks them exact). On the GPU
/// a fill value is a clear error, not a silent fallback.
#[test]
fn fill_value_is_kept_exactly_and_warned_about() {
    let d = tmpdir("fill");
    let (raw, zc, back) = (d.join("ocean.f32"), d.join("ocean.zc"), d.join("back.f32"));
    let data = levitus_like(200_000);
    write_f32(&raw, &data);
    let fill = -1e10f32;
    let nfill = data.iter().filter(|&&x| x == fill).count();
    assert_eq!(nfill, 60_000);
    let real = data.iter().filter(|&&x| x != fill).map(|&x| x as f64);
    let (lo, hi) = real.fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(x), h.max(x)));
    let e = 1e-3;

    // without the flag: a warning naming the value and the option; the bound is then taken over
    // the fill value's range (1e7 here, not 2e-2)
    let o = zcomm(&compress_args(&raw, &zc, "f32"));
    assert!(o.status.success(), "{}", stderr(&o));
    let w = stderr(&o);
    assert!(
        w.contains("warning")
            && w.contains("likely a fill value")
            && w.contains("--fill-value -1e10"),
        "{w}"
    );
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-i",
            p(&raw),
            "--dtype",
            "f32",
            "--error-bound",
            "noa:1e-3",
            "--runs",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        zcomm(&args)
    };
    let o = bench(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("--fill-value -1e10"), "{}", stderr(&o));

    // with the flag: no warning, the header records the fill value, fill points exact
    let mut args = compress_args(&raw, &zc, "f32");
    args.extend_from_slice(&["--fill-value", "-1e10"]);
    for codec in ["aatrox", "cuszp-plain", "cuszp-outlier", "pfpl"] {
        let mut a = args.clone();
        a.extend_from_slice(&["--codec", codec]);
        let o = zcomm(&a);
        assert!(o.status.success(), "{codec}: {}", stderr(&o));
        assert!(!stderr(&o).contains("fill value"), "{}", stderr(&o));
        let o = zcomm(&["info", "-i", p(&zc), "--json"]);
        let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(h["fill_value"].as_f64(), Some(fill as f64), "{codec}");
        let o = zcomm(&["info", "-i", p(&zc)]);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(text.contains("fill value       -1e10"), "{text}");
        let o = zcomm(&["decompress", "-i", p(&zc), "-o", p(&back)]);
        assert!(o.status.success(), "{}", stderr(&o));
        let b = std::fs::read(&back).unwrap();
        assert_eq!(b.len(), data.len() * 4);
        for (i, (x, c)) in data.iter().zip(b.chunks_exact(4)).enumerate() {
            let y = f32::from_le_bytes(c.try_into().unwrap());
            if *x == fill {
                assert_eq!(y.to_bits(), x.to_bits(), "{codec}: fill point {i} -> {y}");
            } else {
                let err = (*x as f64 - y as f64).abs();
                assert!(err <= e * (hi - lo), "{codec}: value {i}: {x} -> {y}");
            }
        }
    }
    let o = zcomm(&["info", "-i", p(&zc), "--json"]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(h["abs_bound"].as_f64().unwrap() <= e * (hi - lo) * (1.0 + 1e-9));

    // bench: every codec honours the fill value, and says how many points it excluded
    let o = bench(&["--fill-value", "-1e10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("likely a fill value"),
        "{}",
        stderr(&o)
    );
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let recs = recs.as_array().unwrap();
    // (all but gpz, which takes no fill value and says so)
    assert_eq!(recs.len(), zcomm::CodecKind::ALL.len() - 1);
    assert!(stderr(&o).contains("gpz left out"), "{}", stderr(&o));
    for r in recs {
        assert_eq!(r["bound_ok"], true, "{r}");
        assert_eq!(r["fill_exact"], true, "{r}");
        assert_eq!(r["fill_count"], nfill, "{r}");
        assert!(r["max_error"].as_f64().unwrap() <= e * (hi - lo), "{r}");
    }
    // without a fill value the JSON records keep their old shape
    let o = bench(&["--codec", "pfpl"]);
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(recs[0].get("fill_value").is_none(), "{recs}");

    // the GPU codecs have no fill values: an error, never a silent fallback or a dropped fill
    let mut a = args.clone();
    a.extend_from_slice(&["--device", "gpu"]);
    let o = zcomm(&a);
    assert_clean_failure(
        &o,
        "compress --fill-value --device gpu",
        "not supported by the GPU",
    );
    let o = bench(&["--fill-value", "-1e10", "--device", "gpu"]);
    assert_clean_failure(
        &o,
        "bench --fill-value --device gpu",
        "not supported by the GPU",
    );
    // a fill value that is not finite in the dtype is refused
    let mut a = compress_args(&raw, &zc, "f32");
    a.extend_from_slice(&["--fill-value", "1e300"]);
    let o = zcomm(&a);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    std::fs::remove_dir_all(&d).ok();
}

/// A valid aatrox stream of `chunks` copies of one 32768-value f32 chunk (built by replicating a
/// compressed chunk and resealing: cheap to make however large the decoded array).
fn replicated_f32_stream(chunks: usize) -> Vec<u8> {
    let vals: Vec<f32> = (0..32_768).map(|i| (i as f32 * 1e-3).sin()).collect();
    let one = zcomm::compress(
        &vals,
        zcomm::ErrorBound::Abs(1e-2),
        zcomm::CodecKind::Aatrox,
    )
    .unwrap();
    let h = zcomm::inspect(&one).unwrap();
    assert_eq!((h.n_chunks, h.chunk_log2), (1, 15));
    let chunk = &one[96 + 8..];
    let mut s = one[..96].to_vec();
    s[16..24].copy_from_slice(&((chunks as u64) << 15).to_le_bytes());
    s[64..72].copy_from_slice(&((chunks * (8 + chunk.len())) as u64).to_le_bytes());
    s[72..76].copy_from_slice(&(chunks as u32).to_le_bytes());
    for _ in 0..chunks {
        s.extend_from_slice(&one[96..104]);
    }
    for _ in 0..chunks {
        s.extend_from_slice(chunk);
    }
    common::reseal(&mut s);
    s
}

/// Issue 15, item 6: `decompress` streams the decoded array to the output batch by batch: a
/// 200 MB output is written with the peak memory of the stream and one batch (64 MiB of f32),
/// not of the whole array; its bytes are those of the in-memory decoder; and
/// `--max-output-bytes` below the decoded size refuses it before anything is written.
#[test]
fn decompress_streams_large_outputs_in_batches() {
    let chunks = 1526; // 50 M values, 200 MB
    let s = replicated_f32_stream(chunks);
    let size = (chunks << 15) * 4;
    let d = tmpdir("stream");
    let (zc, out) = (d.join("big.zc"), d.join("big.f32"));
    std::fs::write(&zc, &s).unwrap();

    let o = zcomm(&[
        "decompress",
        "-i",
        p(&zc),
        "-o",
        p(&out),
        "--max-output-bytes",
        &(size - 1).to_string(),
    ]);
    assert_clean_failure(&o, "one byte over the limit", "--max-output-bytes");
    assert!(!out.exists());

    // peak memory (maximum resident set size) of the child, where GNU time can measure it
    let time = Path::new("/usr/bin/time");
    let o = if time.exists() {
        Command::new(time)
            .arg("-v")
            .arg(env!("CARGO_BIN_EXE_zcomm"))
            .args(["decompress", "-i", p(&zc), "-o", p(&out)])
            .output()
            .unwrap()
    } else {
        zcomm(&["decompress", "-i", p(&zc), "-o", p(&out)])
    };
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    if time.exists() {
        let kib: u64 = e
            .lines()
            .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no peak memory in: {e}"));
        // the stream, one batch of 2^24 f32, and the binary itself with its buffers
        let limit = s.len() as u64 + (64 << 20) + (48 << 20);
        assert!(
            limit < size as u64,
            "the test must tell the two decoders apart"
        );
        eprintln!(
            "peak memory {} MiB (stream {} MiB, output {} MiB)",
            kib >> 10,
            s.len() >> 20,
            size >> 20
        );
        assert!(
            kib * 1024 <= limit,
            "peak memory {} MiB for a {} MiB output (limit {} MiB)",
            kib >> 10,
            size >> 20,
            limit >> 20
        );
    } else {
        eprintln!("note: /usr/bin/time not found: peak memory not measured");
    }
    let got = std::fs::read(&out).unwrap();
    assert_eq!(got.len(), size);
    let want: Vec<f32> = zcomm::decompress(&s).unwrap();
    assert!(
        got.chunks_exact(4)
            .zip(&want)
            .all(|(b, w)| b == w.to_le_bytes()),
        "streamed output differs from the in-memory decoder's"
    );
    std::fs::remove_dir_all(&d).ok();
}

/// `--dims`: cuszi records the shape (`info` shows it) and decodes within the bound; a shape
/// that does not match the input, or a malformed one, is a clear error; `--device gpu` refuses
/// a shape (it compresses 1-D) and decodes the shaped stream as the CPU; the other codecs ignore
/// the shape.
#[test]
fn dims_and_cuszi() {
    let d = tmpdir("dims");
    let (raw, zc, back) = (d.join("x.f32"), d.join("x.zc"), d.join("back.f32"));
    let v = smooth_f32(24 * 20 * 16);
    write_f32(&raw, &v);
    let mut args = compress_args(&raw, &zc, "f32");
    args.extend(["--codec", "cuszi", "--dims", "24x20x16"]);
    let o = zcomm(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = zcomm(&["info", "-i", p(&zc), "--json"]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(h["dims"], serde_json::json!([24, 20, 16]));
    assert_eq!(
        (h["codec"].as_str(), h["version"].as_u64()),
        (Some("cuszi"), Some(3))
    );
    let o = zcomm(&["info", "-i", p(&zc)]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("24x20x16"));
    let o = zcomm(&["decompress", "-i", p(&zc), "-o", p(&back)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let eb = h["abs_bound"].as_f64().unwrap();
    let b = std::fs::read(&back).unwrap();
    for (x, c) in v.iter().zip(b.chunks_exact(4)) {
        let y = f32::from_le_bytes(c.try_into().unwrap());
        assert!(((x - y).abs() as f64) <= eb);
    }
    for (dims, msg) in [
        ("24x20", "holds 480 values"),
        ("24x0x16", "zero dimension"),
        ("2x2x2x2x2", "1 to 4 dimensions"),
        ("24xx16", "not a whole number"),
    ] {
        let mut args = compress_args(&raw, &zc, "f32");
        args.extend(["--codec", "cuszi", "--dims", dims]);
        // (a malformed shape is a usage error of the argument parser: status 2)
        let o = zcomm(&args);
        let e = stderr(&o);
        assert!(matches!(o.status.code(), Some(1 | 2)), "--dims {dims}: {e}");
        assert!(
            !e.contains("panicked") && e.contains(msg),
            "--dims {dims}: {e}"
        );
    }
    // the GPU codec compresses 1-D values: a shape is refused before any device is opened
    let mut args = compress_args(&raw, &zc, "f32");
    args.extend(["--codec", "cuszi", "--dims", "24x20x16", "--device", "gpu"]);
    assert_clean_failure(
        &zcomm(&args),
        "cuszi --dims --device gpu",
        "not supported on the GPU",
    );
    // decoding a shaped stream on the GPU gives the CPU's values, or (no device, no `cuda`
    // feature) a clean failure
    let gback = d.join("gback.f32");
    let o = zcomm(&[
        "decompress",
        "-i",
        p(&zc),
        "-o",
        p(&gback),
        "--device",
        "gpu",
    ]);
    if o.status.success() {
        assert_eq!(
            std::fs::read(&gback).unwrap(),
            std::fs::read(&back).unwrap()
        );
    } else {
        let e = stderr(&o);
        assert_eq!(
            o.status.code(),
            Some(1),
            "decompress cuszi --device gpu: {e}"
        );
        assert!(
            !e.contains("panicked"),
            "decompress cuszi --device gpu: {e}"
        );
    }
    // other codecs: the same stream with and without the shape
    let (a, b2) = (d.join("a.zc"), d.join("b.zc"));
    let mut args = compress_args(&raw, &a, "f32");
    args.extend(["--codec", "pfpl", "--dims", "24x20x16"]);
    assert!(zcomm(&args).status.success());
    let mut args = compress_args(&raw, &b2, "f32");
    args.extend(["--codec", "pfpl"]);
    assert!(zcomm(&args).status.success());
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b2).unwrap());
    // bench with a shape: every codec within its bound
    let o = zcomm(&[
        "bench",
        "-i",
        p(&raw),
        "--dtype",
        "f32",
        "--error-bound",
        "noa:1e-3",
        "--dims",
        "24x20x16",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let recs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // (all but gpz: 24x20x16 is not particles of 1 to 4 coordinates)
    assert_eq!(
        recs.as_array().unwrap().len(),
        zcomm::CodecKind::ALL.len() - 1
    );
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Clustered particle positions, `n` particles of 3 coordinates (AoS).
fn particles_f32(n: usize) -> Vec<f32> {
    (0..n * 3)
        .map(|i| ((i / 3 * 7919) % 1000) as f32 * 0.01 + (i % 3) as f32 * 3.0)
        .collect()
}

/// gpz: `--dims Nx3` round trips within the bound in both orders, `info` shows the particles and
/// the order, and `--permutation` writes the API's permutation (u32 LE) for a reorder stream.
#[test]
fn gpz_particles_and_permutation() {
    let d = tmpdir("gpz");
    let n = 5000;
    let (raw, zc, back, perm) = (
        d.join("pos.f32"),
        d.join("pos.zc"),
        d.join("back.f32"),
        d.join("pos.perm"),
    );
    let v = particles_f32(n);
    write_f32(&raw, &v);
    let dims = format!("{n}x3");
    for order in ["preserve", "reorder"] {
        let mut args = compress_args(&raw, &zc, "f32");
        args.extend(["--codec", "gpz", "--dims", &dims, "--particle-order", order]);
        if order == "reorder" {
            args.extend(["--permutation", p(&perm)]);
        }
        let o = zcomm(&args);
        assert!(o.status.success(), "{order}: {}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("5000 particles x 3") && out.contains(order),
            "{out}"
        );
        let o = zcomm(&["info", "-i", p(&zc), "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(h["codec"], "gpz");
        assert_eq!(h["dims"], serde_json::json!([n, 3]));
        assert_eq!(h["gpz"]["particles"], n);
        assert_eq!(h["gpz"]["d"], 3);
        assert_eq!(h["gpz"]["order"], order);
        let o = zcomm(&["info", "-i", p(&zc)]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("particles        5000 x 3"), "{text}");
        assert!(
            text.contains(&format!("order            {order}")),
            "{text}"
        );
        let o = zcomm(&["decompress", "-i", p(&zc), "-o", p(&back)]);
        assert!(o.status.success(), "{}", stderr(&o));
        let eb = h["abs_bound"].as_f64().unwrap();
        let b = read_f32(&back);
        assert_eq!(b.len(), v.len());
        if order == "preserve" {
            for (x, y) in v.iter().zip(&b) {
                assert!(((x - y).abs() as f64) <= eb);
            }
            assert!(!perm.exists());
        } else {
            // the permutation file: u32 LE, the same as the library's
            let bytes = std::fs::read(&perm).unwrap();
            let got: Vec<u64> = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64)
                .collect();
            let (s, want) = zcomm::codec::compress_particles_nd(
                &v,
                &[n, 3],
                zcomm::ErrorBound::Noa(1e-3),
                zcomm::codec::gpz::Order::Reorder,
            )
            .unwrap();
            assert_eq!(std::fs::read(&zc).unwrap(), s);
            assert_eq!(got, want.unwrap());
            assert!(got.iter().enumerate().any(|(i, &k)| k != i as u64));
            for (i, &k) in got.iter().enumerate() {
                for c in 0..3 {
                    let (x, y) = (v[3 * k as usize + c], b[3 * i + c]);
                    assert!(((x - y).abs() as f64) <= eb, "particle {i} <- {k}");
                }
            }
        }
    }
    // 1-D input: N x 1
    let mut args = compress_args(&raw, &zc, "f32");
    args.extend(["--codec", "gpz"]);
    assert!(zcomm(&args).status.success());
    let o = zcomm(&["info", "-i", p(&zc), "--json"]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (h["gpz"]["particles"].as_u64(), h["gpz"]["d"].as_u64()),
        (Some(15_000), Some(1))
    );
    std::fs::remove_dir_all(&d).ok();
}

/// gpz option errors: clear messages, exit status 1 or 2, nothing written.
#[test]
fn gpz_option_errors() {
    let d = tmpdir("gpz-err");
    let (raw, zc, perm) = (d.join("pos.f32"), d.join("pos.zc"), d.join("pos.perm"));
    write_f32(&raw, &particles_f32(1000));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--codec", "gpz", "--dims", "600x5"],
            "last extent of shape 600x5 is 5",
        ),
        (
            vec!["--codec", "gpz", "--dims", "300x10"],
            "1 to 4 coordinates",
        ),
        (
            vec!["--codec", "aatrox", "--particle-order", "reorder"],
            "--codec gpz only",
        ),
        (
            vec!["--codec", "gpz", "--particle-order", "sideways"],
            "unknown particle order",
        ),
        (
            vec!["--codec", "pfpl", "--permutation", p(&perm)],
            "--permutation applies",
        ),
        (
            vec![
                "--codec",
                "gpz",
                "--dims",
                "1000x3",
                "--permutation",
                p(&perm),
            ],
            "needs --particle-order reorder",
        ),
        (
            vec![
                "--codec",
                "gpz",
                "--particle-order",
                "preserve",
                "--permutation",
                p(&perm),
            ],
            "needs --particle-order reorder",
        ),
        (
            vec!["--codec", "gpz", "--fill-value", "-1e10"],
            "fill value",
        ),
        // (the GPU codec compresses 1-D particles: a shape is refused before any device opens)
        (
            vec!["--codec", "gpz", "--dims", "1000x3", "--device", "gpu"],
            "not supported on the GPU",
        ),
        (
            vec![
                "--codec",
                "gpz",
                "--dims",
                "1000x3",
                "--particle-order",
                "reorder",
                "--permutation",
                p(&raw),
            ],
            "",
        ),
    ];
    for (extra, msg) in cases {
        let mut args = compress_args(&raw, &zc, "f32");
        args.extend(extra.iter().copied());
        let o = zcomm(&args);
        let e = stderr(&o);
        assert!(matches!(o.status.code(), Some(1 | 2)), "{extra:?}: {e}");
        assert!(!e.contains("panicked") && e.contains(msg), "{extra:?}: {e}");
        assert!(!zc.exists() && !perm.exists(), "{extra:?}: output written");
    }
    // the input given as --permutation survives
    assert_eq!(read_f32(&raw), particles_f32(1000));
    // rel bounds
    let o = zcomm(&[
        "compress",
        "-i",
        p(&raw),
        "-o",
        p(&zc),
        "--dtype",
        "f32",
        "--error-bound",
        "rel:1e-3",
        "--codec",
        "gpz",
    ]);
    assert_clean_failure(&o, "gpz rel", "rel");
    std::fs::remove_dir_all(&d).ok();
}
