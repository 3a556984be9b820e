//! NVRTC compilation of `kernels/` for the device's own architecture, with an on-disk cache of
//! the CUBIN keyed by a hash of the source, the options, the NVRTC version and the architecture.

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{Error, Result};

const COMMON: &str = include_str!("../../kernels/common.cuh");
const BLOCKED: &str = include_str!("../../kernels/blocked.cu");
const PFPL: &str = include_str!("../../kernels/pfpl.cu");

/// Warps per thread block of the blocked kernels (each owns 32 / warps iteration layers of its
/// chunk): `$ZCOMM_GPU_WARPS` (8, 16 or 32), default 16 (with launch bounds for 4 blocks per SM
/// for f32 and 3 for f64: the fastest of the H100 sweeps in bench/gpu/NOTES.md).
pub fn blocked_warps() -> u32 {
    std::env::var("ZCOMM_GPU_WARPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|w| matches!(w, 8 | 16 | 32))
        .unwrap_or(16)
}

/// Extra preprocessor definitions for tuning experiments: `$ZCOMM_GPU_DEFINES`, a space-separated
/// list of `NAME=VALUE` with `NAME` in `[A-Z0-9_]` starting with `ZC_` or `PF_` and `VALUE` a
/// non-negative integer (for example `PF_FASTQ=0 ZC_MINB=3`). Anything else is ignored with a
/// warning. The definitions are part of the kernel cache key.
pub fn tuning_defines() -> Vec<String> {
    let Ok(v) = std::env::var("ZCOMM_GPU_DEFINES") else {
        return Vec::new();
    };
    parse_defines(&v)
}

fn parse_defines(v: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in v.split_whitespace() {
        let ok = item.split_once('=').is_some_and(|(name, value)| {
            (name.starts_with("ZC_") || name.starts_with("PF_"))
                && name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                && !value.is_empty()
                && value.bytes().all(|b| b.is_ascii_digit())
        });
        if ok {
            out.push(format!("-D{item}"));
        } else {
            tracing::warn!(
                item,
                "ZCOMM_GPU_DEFINES: ignored (expected ZC_*/PF_* NAME=INTEGER)"
            );
        }
    }
    out
}

/// NVRTC options besides `-arch`: no fused multiply-add anywhere (FORMAT.md), IEEE division.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--prec-div=true", "--std=c++17"];

/// The full CUDA source of the blocked codecs (common.cuh inlined, as NVRTC has no file system).
pub fn blocked_source() -> String {
    let body = BLOCKED.replace("#include \"common.cuh\"", "");
    let pfpl = PFPL.replace("#include \"common.cuh\"", "");
    format!("{COMMON}\n// ---- blocked.cu\n{body}\n// ---- pfpl.cu\n{pfpl}")
}

/// Names of every kernel instantiation in the blocked source.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for t in ["f32", "f64"] {
        for c in ["aatrox", "plain", "outlier", "pfpl"] {
            for m in ["abs", "rel"] {
                v.push(format!("zc_compress_{t}_{c}_{m}"));
                v.push(format!("zc_decompress_{t}_{c}_{m}"));
                if c != "pfpl" {
                    v.push(format!("zc_decompress_hdr_{t}_{c}_{m}"));
                }
            }
        }
        v.push(format!("zc_stats_{t}"));
    }
    v.push("zc_copy_hash".into());
    v.push("zc_spin".into());
    v
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc_sys::is_culib_present() }
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) }
        .result()
        .map_err(|e| Error::Gpu(format!("nvrtcVersion: {e:?}")))?;
    Ok((a, b))
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Compile `src` to a CUBIN for `arch` (e.g. `sm_90`).
pub fn compile_cubin(src: &str, arch: &str) -> Result<Vec<u8>> {
    compile_cubin_with(src, arch, &[])
}

/// [`compile_cubin`] with extra NVRTC options (e.g. `-DZC_WARPS=16`).
pub fn compile_cubin_with(src: &str, arch: &str, extra: &[String]) -> Result<Vec<u8>> {
    if !nvrtc_available() {
        return Err(Error::Unavailable("libnvrtc not found".into()));
    }
    let csrc = CString::new(src).map_err(|_| Error::invalid("kernel source has a NUL byte"))?;
    let name = CString::new("zcomm_blocked.cu").expect("no NUL");
    let prog = nvrtc::create_program(&csrc, Some(&name))
        .map_err(|e| Error::Gpu(format!("nvrtcCreateProgram: {e:?}")))?;
    let mut opts: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    opts.extend(extra.iter().cloned());
    // SAFETY: prog is a live program; destroyed below on every path.
    let res = unsafe { nvrtc::compile_program(prog, &opts) };
    let out = (|| {
        if let Err(e) = res {
            // SAFETY: live program.
            let log = unsafe { nvrtc::get_program_log(prog) }.unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .map(|&c| c as u8)
                .take_while(|&c| c != 0)
                .collect();
            return Err(Error::Gpu(format!(
                "NVRTC failed ({e:?}):\n{}",
                String::from_utf8_lossy(&log)
            )));
        }
        let mut size = 0usize;
        // SAFETY: live, compiled program; buffer sized by NVRTC.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
            .result()
            .map_err(|e| Error::Gpu(format!("nvrtcGetCUBINSize: {e:?}")))?;
        let mut buf = vec![0u8; size];
        unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _) }
            .result()
            .map_err(|e| Error::Gpu(format!("nvrtcGetCUBIN: {e:?}")))?;
        Ok(buf)
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    out
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ZCOMM_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("zcomm"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("zcomm"))
}

/// The CUBIN of the blocked kernels for `arch`: from the cache when present, else compiled with
/// NVRTC and stored (cache errors only log a warning).
pub fn blocked_cubin(arch: &str, warps: u32) -> Result<Vec<u8>> {
    let src = blocked_source();
    let (maj, min) = nvrtc_version()?;
    let ver = format!("{maj}.{min}");
    let mut extra = vec![format!("-DZC_WARPS={warps}")];
    // tuning knob: blocks per SM the register budget must allow (kernels/blocked.cu ZC_MINB)
    if let Some(b) = std::env::var("ZCOMM_GPU_MINB")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        if (1..=16).contains(&b) {
            extra.push(format!("-DZC_MINB={b}"));
        }
    }
    extra.extend(tuning_defines());
    let opts = format!("{} {}", NVRTC_OPTIONS.join(" "), extra.join(" "));
    let key = fnv1a(&[
        src.as_bytes(),
        opts.as_bytes(),
        ver.as_bytes(),
        arch.as_bytes(),
    ]);
    let path = cache_dir().map(|d| d.join(format!("blocked-{key:016x}-{arch}.cubin")));
    if let Some(p) = &path {
        if let Ok(b) = std::fs::read(p) {
            if !b.is_empty() {
                tracing::debug!(path = %p.display(), "kernel cache hit");
                return Ok(b);
            }
        }
    }
    let t = std::time::Instant::now();
    let cubin = compile_cubin_with(&src, arch, &extra)?;
    tracing::info!(
        arch,
        ms = t.elapsed().as_millis() as u64,
        "compiled blocked kernels with NVRTC"
    );
    if let Some(p) = &path {
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let r = p
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&tmp, &cubin))
            .and_then(|_| std::fs::rename(&tmp, p));
        if let Err(e) = r {
            tracing::warn!(path = %p.display(), error = %e, "could not write kernel cache");
        }
    }
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::parse_defines;

    #[test]
    fn tuning_defines_accept_only_integer_zc_pf_names() {
        assert_eq!(
            parse_defines(" PF_FASTQ=0  ZC_MINB=3 "),
            vec!["-DPF_FASTQ=0".to_string(), "-DZC_MINB=3".to_string()]
        );
        assert!(parse_defines("FOO=1 ZC_X=-1 ZC_Y= ZC_Z=1;rm PF_a=1 ZC_W").is_empty());
    }
}
