//! The one compile path of every CUDA kernel of zcomm: the sources under `kernels/` (embedded
//! with `include_str!`, each `#include "…"` resolved here, as NVRTC has no file system), compiled
//! by NVRTC with the same options for the device's own architecture to a CUBIN, with an on-disk
//! cache keyed by a hash of the source, the options, the NVRTC version and the architecture.
//!
//! Each [`Module`] is one NVRTC program: the codecs ([`GpuCodec`](super::GpuCodec)), the
//! utility kernels of the device reductions, and those of the NCCL transport.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{Error, Result};

/// Every CUDA file under `kernels/`, by the name `#include` uses.
const FILES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    ("blocked.cu", include_str!("../../kernels/blocked.cu")),
    ("pfpl.cu", include_str!("../../kernels/pfpl.cu")),
    ("util.cu", include_str!("../../kernels/util.cu")),
    ("nccl_util.cu", include_str!("../../kernels/nccl_util.cu")),
    ("gpz.cu", include_str!("../../kernels/gpz.cu")),
    ("cuszi.cu", include_str!("../../kernels/cuszi.cu")),
];

/// The text of `kernels/<name>` (for tests that check it against the Rust side).
pub fn kernel_file(name: &str) -> Option<&'static str> {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// A kernel module: one NVRTC program built from files of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    /// The blocked codecs and pfpl (`blocked.cu`, `pfpl.cu`), compiled with
    /// `-DZC_WARPS=`[`blocked_warps`].
    Codecs,
    /// Value range and scaling of device buffers (`util.cu`), for the device reductions.
    Util,
    /// `util.cu` plus the NCCL transport's own kernels (`nccl_util.cu`).
    NcclUtil,
    /// The GPZ particle codec (`gpz.cu`, [`GpzGpu`](super::gpz::GpzGpu)).
    Gpz,
    /// The cuszi decoder (`cuszi.cu`, [`CusziGpu`](super::cuszi::CusziGpu)).
    Cuszi,
}

impl Module {
    /// Every module.
    pub const ALL: [Module; 5] = [
        Module::Codecs,
        Module::Util,
        Module::NcclUtil,
        Module::Gpz,
        Module::Cuszi,
    ];

    /// Short name (cache files, errors).
    pub fn name(self) -> &'static str {
        match self {
            Module::Codecs => "codecs",
            Module::Util => "util",
            Module::NcclUtil => "nccl_util",
            Module::Gpz => "gpz",
            Module::Cuszi => "cuszi",
        }
    }

    fn roots(self) -> &'static [&'static str] {
        match self {
            Module::Codecs => &["blocked.cu", "pfpl.cu"],
            Module::Util => &["util.cu"],
            Module::NcclUtil => &["nccl_util.cu"],
            Module::Gpz => &["gpz.cu"],
            Module::Cuszi => &["cuszi.cu"],
        }
    }

    /// The full source: the root files in order, each `#include "…"` replaced by that file the
    /// first time it is included and dropped after that.
    pub fn source(self) -> String {
        let mut out = String::new();
        let mut seen = Vec::new();
        for root in self.roots() {
            expand(root, &mut seen, &mut out);
        }
        out
    }

    /// The preprocessor definitions this module is compiled with.
    pub fn defines(self) -> Vec<String> {
        match self {
            Module::Codecs => vec![format!("-DZC_WARPS={}", blocked_warps())],
            Module::Util | Module::NcclUtil | Module::Gpz | Module::Cuszi => Vec::new(),
        }
    }

    /// Names of every kernel entry point of the module.
    pub fn kernel_names(self) -> Vec<String> {
        const UTIL: [&str; 4] = [
            "zu_range_f32",
            "zu_range_f64",
            "zu_scale_f32",
            "zu_scale_f64",
        ];
        const NCCL: [&str; 4] = [
            "zn_maxdiff_f32",
            "zn_maxdiff_f64",
            "zn_field_f32",
            "zn_field_f64",
        ];
        match self {
            Module::Codecs => kernel_names(),
            Module::Util => UTIL.iter().map(|s| s.to_string()).collect(),
            Module::NcclUtil => UTIL.iter().chain(&NCCL).map(|s| s.to_string()).collect(),
            Module::Gpz => super::gpz::kernel_names(),
            Module::Cuszi => super::cuszi::kernel_names(),
        }
    }
}

fn expand(name: &str, seen: &mut Vec<String>, out: &mut String) {
    if seen.iter().any(|s| s == name) {
        return;
    }
    seen.push(name.to_string());
    let text = kernel_file(name).unwrap_or_else(|| panic!("kernels/{name} is not in FILES"));
    out.push_str(&format!("// ---- kernels/{name}\n"));
    for line in text.lines() {
        let inc = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'));
        match inc {
            Some(inc) => expand(inc, seen, out),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
}

/// Warps per thread block of the blocked kernels (each owns 32 / warps iteration layers of its
/// chunk): `$ZCOMM_GPU_WARPS` (8, 16 or 32), default 16 (with launch bounds for 4 blocks per SM
/// for f32 and 3 for f64).
pub fn blocked_warps() -> u32 {
    std::env::var("ZCOMM_GPU_WARPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|w| matches!(w, 8 | 16 | 32))
        .unwrap_or(DEFAULT_WARPS)
}

/// The default of [`blocked_warps`] (also kernels/blocked.cu's default `ZC_WARPS`).
pub const DEFAULT_WARPS: u32 = 16;

/// NVRTC options besides `-arch` and the defines: no fused multiply-add anywhere (FORMAT.md),
/// IEEE division.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--prec-div=true", "--std=c++17"];

/// The full CUDA source of the codecs ([`Module::Codecs`]).
pub fn blocked_source() -> String {
    Module::Codecs.source()
}

/// Names of every kernel instantiation of the codecs.
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for t in ["f32", "f64"] {
        for c in ["aatrox", "plain", "outlier", "pfpl"] {
            for m in ["abs", "rel"] {
                v.push(format!("zc_compress_{t}_{c}_{m}"));
                v.push(format!("zc_decompress_{t}_{c}_{m}"));
                if c != "pfpl" {
                    v.push(format!("zc_decompress_hdr_{t}_{c}_{m}"));
                    v.push(format!("zc_decompress_add_hdr_{t}_{c}_{m}"));
                    if m == "abs" {
                        v.push(format!("zc_compress_recon_{t}_{c}_{m}"));
                        v.push(format!("zc_decompress_add_track_hdr_{t}_{c}_{m}"));
                    }
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
    let name = CString::new("zcomm.cu").expect("no NUL");
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

/// The CUBIN of `module` for `arch` compiled with the preprocessor definitions `defines`: from
/// the cache when present, else compiled with NVRTC and stored (cache errors only log a warning).
pub fn module_cubin(module: Module, arch: &str, defines: &[String]) -> Result<Vec<u8>> {
    let src = module.source();
    let (maj, min) = nvrtc_version()?;
    let ver = format!("{maj}.{min}");
    let opts = format!("{} {}", NVRTC_OPTIONS.join(" "), defines.join(" "));
    let key = fnv1a(&[
        src.as_bytes(),
        opts.as_bytes(),
        ver.as_bytes(),
        arch.as_bytes(),
    ]);
    let path = cache_dir().map(|d| d.join(format!("{}-{key:016x}-{arch}.cubin", module.name())));
    if let Some(p) = &path {
        if let Ok(b) = std::fs::read(p) {
            if !b.is_empty() {
                tracing::debug!(path = %p.display(), "kernel cache hit");
                return Ok(b);
            }
        }
    }
    let t = std::time::Instant::now();
    let cubin = compile_cubin_with(&src, arch, defines)?;
    tracing::info!(
        arch,
        module = module.name(),
        ms = t.elapsed().as_millis() as u64,
        "compiled kernels with NVRTC"
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

/// The CUBIN of the codecs for `arch` with `warps` warps per block ([`module_cubin`]).
pub fn blocked_cubin(arch: &str, warps: u32) -> Result<Vec<u8>> {
    module_cubin(Module::Codecs, arch, &[format!("-DZC_WARPS={warps}")])
}

/// `sm_XY` of `ctx`'s device: kernels are compiled for the device's own architecture.
pub fn arch_of(ctx: &CudaContext) -> Result<String> {
    let (maj, min) = ctx
        .compute_capability()
        .map_err(|e| Error::Gpu(format!("compute capability: {e:?}")))?;
    Ok(format!("sm_{maj}{min}"))
}

/// `module` (with its [`Module::defines`]) taken from the cache or compiled for `ctx`'s device,
/// and loaded into `ctx`.
pub fn load(ctx: &Arc<CudaContext>, module: Module) -> Result<Arc<CudaModule>> {
    let cubin = module_cubin(module, &arch_of(ctx)?, &module.defines())?;
    ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
        .map_err(|e| Error::Gpu(format!("cuModuleLoadData ({}): {e:?}", module.name())))
}

#[cfg(test)]
mod tests {
    use super::{kernel_file, Module};

    /// The integer value of `#define NAME VALUE` in `kernels/<file>` (decimal or hex, with an
    /// optional `u` / `ull` suffix; the first definition when there are several).
    fn define(file: &str, name: &str) -> u64 {
        let text = kernel_file(file).unwrap_or_else(|| panic!("no kernels/{file}"));
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if it.next() == Some("#define") && it.next() == Some(name) {
                let v = it
                    .next()
                    .unwrap_or_else(|| panic!("{file}: {name} has no value"));
                let v = v.trim_end_matches(['u', 'l', 'U', 'L']);
                let parsed = match v.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => v.parse(),
                };
                return parsed.unwrap_or_else(|_| panic!("{file}: {name} = {v} is not an integer"));
            }
        }
        panic!("{file} does not define {name}")
    }

    /// Every constant that the Rust side and the kernels both know, defined once on each side:
    /// the values must agree.
    #[test]
    fn constants_shared_with_the_kernels_agree() {
        use crate::gpu as g;
        let (b, p, c) = ("blocked.cu", "pfpl.cu", "common.cuh");
        let pairs: &[(&str, &str, u64)] = &[
            (b, "ZC_WARPS", super::DEFAULT_WARPS as u64),
            (b, "ZC_CHUNK", crate::codec::blocked::CHUNK as u64),
            (c, "ZC_HEADER_LEN", crate::format::HEADER_LEN as u64),
            (b, "ZC_HASH", g::C_HASH as u64),
            (b, "ZC_PAYLOAD", g::C_PAYLOAD as u64),
            (b, "ZC_ERR", g::C_ERR as u64),
            (b, "ZC_MIN", g::C_MIN as u64),
            (b, "ZC_MAX", g::C_MAX as u64),
            (b, "ZC_FIRST", g::C_FIRST as u64),
            (b, "ZC_RES_ERR", g::R_ERR as u64),
            (b, "ZC_RES_SEQ", g::R_SEQ as u64),
            (b, "ZC_RES_HDR", g::R_HDR as u64),
            (b, "ZC_E_SIZE", g::E_SIZE),
            (b, "ZC_E_RANGE", g::E_RANGE),
            (b, "ZC_E_CHECKSUM", g::E_CHECKSUM),
            (b, "ZC_E_META", g::E_META),
            (b, "ZC_E_TOTAL", g::E_TOTAL),
            (b, "ZC_E_TABLE", g::E_TABLE),
            (p, "PF_THREADS", g::PFPL_THREADS as u64),
            (p, "PF_BYTES", crate::codec::pfpl::CHUNK_BYTES as u64),
            (p, "PF_HASH", g::C_HASH as u64),
            (p, "PF_PAYLOAD", g::C_PAYLOAD as u64),
            (p, "PF_ERR", g::C_ERR as u64),
            (p, "PF_DHASH", g::C_DHASH as u64),
            (p, "PF_E_RANGE", g::E_RANGE),
            (p, "PF_E_META", g::E_META),
            (p, "PF_E_TOTAL", g::E_TOTAL),
            (p, "PF_E_TABLE", g::E_TABLE),
        ];
        for &(file, name, rust) in pairs {
            assert_eq!(
                define(file, name),
                rust,
                "kernels/{file} {name} vs the Rust side"
            );
        }
        // the ctrl words the kernels use fit the host's ctrl buffer
        for name in [
            "ZC_TICKET",
            "ZC_DONE",
            "ZC_HASH",
            "ZC_PAYLOAD",
            "ZC_ERR",
            "ZC_MIN",
            "ZC_MAX",
            "ZC_FIRST",
        ] {
            assert!(define(b, name) < g::CTRL_WORDS as u64, "{name}");
        }
        for name in [
            "PF_TICKET",
            "PF_DONE",
            "PF_HASH",
            "PF_PAYLOAD",
            "PF_ERR",
            "PF_DHASH",
        ] {
            assert!(define(p, name) < g::CTRL_WORDS as u64, "{name}");
        }
    }

    #[test]
    fn every_module_source_resolves_its_includes_once() {
        for m in Module::ALL {
            let src = m.source();
            assert!(!src.contains("#include"), "{m:?} keeps an #include");
            // the codecs', gpz's and cuszi's entry points are made by macros (their CUBIN tests
            // check the names)
            if !matches!(m, Module::Codecs | Module::Gpz | Module::Cuszi) {
                for k in m.kernel_names() {
                    assert!(src.contains(&k), "{m:?}: {k} not in the source");
                }
            }
        }
        assert_eq!(
            Module::Codecs
                .source()
                .matches("// ---- kernels/common.cuh")
                .count(),
            1
        );
    }
}
