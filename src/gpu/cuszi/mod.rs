//! The `cuszi` codec on a CUDA device (`kernels/cuszi.cu`): [`CusziGpu::compress_device`]
//! writes the bytes of the CPU encoder ([`crate::compress_nd`] with [`CodecKind::Cuszi`]), and
//! [`CusziGpu::decompress_device`] decodes them to the bits of [`crate::decompress`] and rejects
//! the corrupt streams it rejects.
//!
//! Compression of a device buffer follows the block-parallel map of `src/codec/cuszi/mod.rs`:
//!
//! 1. `cz_range_*` (noa): the finite range, read back for the quantization step;
//! 2. `cz_anchor_*`: the anchor codes; lossless anchors take their Lorenzo prediction in tile
//!    order (one block), every other residual is computed in parallel;
//! 3. `cz_sample_*` (twice): the sampling's integer error sums, read back; the host chooses each
//!    level's passes and splines with the rules of `interp::choose_levels`;
//! 4. `cz_enc_tiles_*` (a grid-stride loop over the tiles, launched as one wave of the blocks
//!    that fit): one warp per tile loads its box of input values, predicts it level by level
//!    (IEEE f64, no FMA), quantizes the residuals and writes their symbols (2 bytes each; a big
//!    residual also as its 64-bit value); the walks' point counts are set up once per tile, a
//!    walk per lane, and the mean walks of one stage (which never read each other's points)
//!    share one loop over their points;
//! 5. the chunks of 32,768 residuals: when every tile is whole or the array 1-D (`whole_tiles`:
//!    the classes repeat the tile's pattern in symbol order), `cz_enc_prep_*` (a warp per
//!    chunk) writes each residual's step index (per class of the pattern), the lossless values
//!    and the varints, and counts the symbols of each class (`cz_enc_tiles_nh_*` before it
//!    counts none); the histogram is read back and the host builds the rANS tables and the
//!    metadata with the CPU's own code; then `cz_enc_whole_*` (a group of lanes per chunk, a
//!    lane per rANS state: coder 3) codes the chunks a warp step at a time. Otherwise
//!    `cz_enc_tiles_*` counts the symbols of each class, the host builds the tables, and
//!    `cz_enc_chunks_*` (a thread per chunk) codes the chunks. `cz_scan` sums their sizes (read back: a stream that does not compress
//!    is stored by the CPU twin), `cz_enc_write_*` places them with their table entries,
//!    `cz_hash` hashes table and metadata, and the host writes the header.
//!
//! So a compression reads back small results four times between kernels (range, two sampling
//! sums, histogram) besides the final size and hash; the tables are built on the host as in
//! cuSZ-i.
//!
//! Decompression of a device-resident stream:
//!
//! 1. the host reads the header, the chunk table and the metadata (a few kilobytes, in one read
//!    through pinned memory for streams of up to about 7,000 chunks), checks them with the CPU
//!    decoder's own parsers (header fields, table checksum, chunk sizes, predictor
//!    configuration, rANS frequencies), and uploads each table's per-symbol steps and ranked
//!    symbols with the geometry and the class pattern (one copy, queued from pinned memory, into
//!    device arrays kept across calls); `cz_rans_slots` (a block per table) fills the per-slot
//!    arrays (16,384 entries per table) from them on the device;
//! 2. the chunks of 32,768 residuals, each checked byte for byte as the CPU does: when every
//!    tile is whole or the array 1-D (`whole_tiles`) and the stream 4-aligned,
//!    `cz_rans_warp_*` (coder 3: a group of lanes per chunk, a lane per state) checks the
//!    chunk's `zhash`, runs its rANS state updates into 2-byte symbols (a slot of its table's
//!    most frequent symbol without a table load), places the lossless values and big residuals
//!    as it goes and checks the chunk's end; `cz_rans_whole_*` (coders 1 and 2: a thread per
//!    chunk) does the state updates and `cz_rans_post_*` (a warp per chunk) the rest;
//!    otherwise `cz_rans_*` (a thread per chunk) does all of it, with each residual's class
//!    from a walk over the tile coordinates, into 64-bit residuals;
//! 3. a pass per dimension: the anchors' Lorenzo inverse as an n-D prefix sum in wrapping
//!    integers, and their values; a line of at most 64 tiles (the lines of 2-D and 3-D arrays
//!    of usual sizes) by a warp's scan (`cz_anchor_lines_*`), a long line (a 1-D array is a
//!    single line) split into segments of 32 tiles, a thread each (`cz_anchors_*`), with a pass
//!    for the segments' sums and `cz_anchor_scan` (a block per line) for their prefixes;
//! 4. `cz_tiles_*`: one warp per tile reconstructs its box level by level in shared memory
//!    (IEEE f64, no FMA), walk by walk as the encoder, and writes its owned points straight to
//!    the array;
//! 5. one read back of the error words.
//!
//! What has no kernels here runs the CPU twin on a host copy (with the result copied back):
//! rel bounds, degenerate quantization steps and stored streams (both directions), and streams
//! of the first version 3 encoder (coder 0, Huffman).

use std::sync::Arc;

use cudarc::driver::{
    result as cu, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr,
    DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::compile::{self, Module};
use super::{raw_ptr, raw_ptr_mut, GpuElement};
use crate::codec::cuszi::grid::Grid;
use crate::codec::cuszi::interp::{self, Level, Walk};
use crate::codec::cuszi::rans;
use crate::codec::cuszi::{read_meta, write_meta, Coder, CHUNK};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::{
    u16_at, u32_at, zhash_bytes, BoundMode, Dims, Header, HEADER_LEN, HEADER_LEN_V3,
    TABLE_ENTRY_LEN, VERSION_SHAPED,
};
use crate::quant::{ErrorBound, QuantParams};

mod plan;
use plan::{geometry, plan, whole_tiles, Plan};

/// The launch of kernel `$f` on stream `$s` with its arguments in the kernel's order, one
/// line per launch rather than one per argument; the launch itself stays `unsafe` at each call
/// site, beside the reasons it is sound for that kernel.
macro_rules! launch_args {
    ($s:expr, $f:expr; $($a:expr),+ $(,)?) => {{
        let mut b = $s.launch_builder($f);
        $(b.arg($a);)+
        b
    }};
}

/// Geometry words (kernels/cuszi.cu `CZ_G_*`).
const G_BATCH: usize = 0;
const G_N: usize = 1;
const G_S: usize = 4;
const G_TILES: usize = 5;
const G_NTILES: usize = 8;
const G_VOL: usize = 9;
const G_COUNT: usize = 10;
const G_NWALKS: usize = 11;
const G_FULL: usize = 12;
const G_WALKS: usize = 16;
// the geometry words before the walks do not overlap
const _: () = assert!(G_N + 3 <= G_S && G_TILES + 3 <= G_NTILES && G_FULL + 3 <= G_WALKS);
/// Words per walk (kernels/cuszi.cu `CZ_WALK_WORDS`).
const WALK_WORDS: usize = 12;
/// Walks with points in one box that the tile kernels hold (kernels/cuszi.cu `CZ_MAXWALKS`).
#[cfg(test)]
const MAX_WALKS: usize = 24;
/// Tiles (warps) per block of `cz_tiles_*` (kernels/cuszi.cu `CZ_TILE_WARPS`).
const TILE_WARPS: usize = 4;
/// Slots per rANS table (rans.rs `PROB_SCALE`).
const SLOTS: usize = 1 << 14;
/// Symbols per rANS table (rans.rs `NSYM`).
const SYMBOLS: usize = 1025;
/// Ranks per table of the decoder's compact tables (kernels/cuszi.cu cz_rans).
const RANKS: usize = 256;
/// Bytes of the class map in the decoder's shared memory (at most 28 classes).
const MAP_BYTES: usize = 64;
/// Symbols per class counted in shared memory by `cz_enc_tiles_*` (kernels/cuszi.cu
/// `CZ_HIST_WIN`).
const HIST_WIN: usize = 256;
/// Largest box of a tile (kernels/cuszi.cu `CZ_MAXBOX`).
const MAX_BOX: usize = 729;
/// Bytes a decode reads after the header along with it (the chunk table and metadata of a
/// stream of up to about 7,000 chunks: 230 million values).
const FIRST_READ: usize = 64 << 10;
/// Threads per block of `cz_enc_chunks_*` (each codes one chunk).
const RANS_THREADS: usize = 32;
/// Chunks per block of `cz_rans_*` (kernels/cuszi.cu `CZ_RANS_CHUNKS`); its blocks of
/// [`RANS_STAGE_THREADS`] stage the tables together, then the first warp decodes.
const RANS_CHUNKS: usize = 32;
/// Threads per block of `cz_rans_*`.
const RANS_STAGE_THREADS: usize = 256;
/// Chunks each warp of `cz_rans_whole_*` decodes (coders 1 and 2; kernels/cuszi.cu
/// `CZ_RANS_LANES`); its blocks have `RANS_CHUNKS / RANS_LANES` warps.
const RANS_LANES: usize = 4;
/// Threads per block of the one-warp-per-chunk kernel `cz_rans_post_*`.
const CHUNK_WARP_THREADS: usize = 256;
/// Threads per block of `cz_enc_prep_*` (a chunk per warp; kernels/cuszi.cu
/// `CZ_PREP_THREADS`): large blocks, because each block zeroes and flushes a counter for every
/// symbol of every class it codes.
const PREP_THREADS: usize = 1024;
/// Threads per block of `cz_rans_slots` (kernels/cuszi.cu `CZ_SLOT_THREADS`).
const SLOT_THREADS: usize = 1024;
/// Threads per block of `cz_rans_whole_*`.
const WHOLE_THREADS: usize = RANS_CHUNKS / RANS_LANES * 32;
/// Threads per block of the coder-3 kernels `cz_rans_warp_*` and `cz_enc_whole_*`: a lane per
/// state of each of their `RANS_CHUNKS` chunks.
const WARP_THREADS: usize = RANS_CHUNKS * rans::WAYS;

/// The error bits of `cz_rans_*` (kernels/cuszi.cu `CZ_E_*`) and what they mean.
const ERRORS: [(u64, &str); 5] = [
    (1, "checksum mismatch"),
    (2, "invalid rANS bytes"),
    (4, "lossless values run past the chunk"),
    (8, "invalid big residual"),
    (16, "chunk longer than its contents"),
];

/// Names of every kernel of [`Module::Cuszi`].
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for k in [
        "cz_anchor_lossless",
        "cz_anchor_res",
        "cz_anchor_serial",
        "cz_anchor_scan",
        "cz_scan",
        "cz_hash",
        "cz_rans_slots",
    ] {
        v.push(k.to_string());
    }
    for t in ["f32", "f64"] {
        for k in [
            "cz_rans",
            "cz_rans_whole",
            "cz_rans_warp",
            "cz_rans_post",
            "cz_anchors",
            "cz_anchor_lines",
            "cz_tiles",
            "cz_range",
            "cz_anchor_codes",
            "cz_anchor_vals",
            "cz_sample",
            "cz_enc_tiles",
            "cz_enc_tiles_nh",
            "cz_enc_chunks",
            "cz_enc_prep",
            "cz_enc_whole",
            "cz_enc_write",
        ] {
            v.push(format!("{k}_{t}"));
        }
    }
    v
}

/// Compile `kernels/cuszi.cu` for `arch` (e.g. `sm_90`) without a device (tests).
pub fn compile_check(arch: &str) -> Result<Vec<u8>> {
    compile::compile_cubin_with(&Module::Cuszi.source(), arch, &Module::Cuszi.defines())
}

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("cuszi {what}: {e:?}"))
}

/// Device buffers sized by the value count, kept and grown from call to call.
struct Workspace {
    /// Values they hold.
    n: usize,
    /// Residuals in symbol order.
    res: CudaSlice<i64>,
    /// Lossless values' bytes at their symbol index (8 bytes per value: either dtype).
    raw: CudaSlice<u8>,
    /// Per chunk: the positions of its big residuals.
    bigs: CudaSlice<u32>,
    /// Symbols in symbol order (`cz_rans_whole_*`).
    syms: CudaSlice<u16>,
}

/// The `cuszi` decoder kernels loaded on one CUDA stream.
pub struct CusziGpu {
    stream: Arc<CudaStream>,
    funcs: crate::gpu::functions::Functions,
    name: String,
    ws: Option<Workspace>,
    /// Bytes of dynamic shared memory a block may opt in to.
    smem_optin: usize,
    /// Timing events after each step (`set_profile`).
    profile: super::step_timer::StepTimer,
    /// Blocks of the grid-stride kernels (8 per SM).
    grid: u32,
    /// Pinned host memory that small results are read into (`read_pinned`) and uploads are
    /// copied from (`put`), kept and grown.
    staging: Option<cudarc::driver::PinnedHostSlice<u8>>,
    /// Bytes of `staging` that copies queued since the last synchronization may still read
    /// (`put`: the next upload's bytes go after them).
    staged: usize,
    /// The device arrays besides the workspace, one per [`Buf`], kept and grown.
    kept: Vec<Option<CudaSlice<u8>>>,
}

/// The device arrays of both directions kept across calls (`CusziGpu::kept`; a fresh
/// allocation per call costs the host more than some kernels take): the uploads of host-built
/// arrays (`put`), the arrays the kernels count or accumulate into, zeroed before each use
/// (`zeroed`), and the ones each call writes before reading (`kept`).
#[derive(Clone, Copy)]
enum Buf {
    /// Decode: the packed plan (`Pack`).
    Plan,
    /// Decode: per table the symbol of every slot (2 bytes each), then per table the rank of
    /// every slot (`cz_rans_slots`).
    Slots,
    /// Decode: per tile its anchor's integer code (i64), then its value (f64).
    AnchorValues,
    /// Decode: the segment sums of the anchor passes.
    Segments,
    /// Decode: per chunk its status for `cz_rans_post_*`.
    Status,
    /// Encode: the per-chunk scratch regions of the chunk coders.
    Scratch,
    /// `cz_range_*`'s two words.
    Range,
    /// The geometry words without the level configuration.
    Geo0,
    /// Per tile: anchor codes, accumulated codes, anchor residuals (i64), anchor values (f64).
    Anchors,
    /// `cz_sample_*`'s error sums (two passes) and the configuration of the second.
    Sample,
    SampleCfg,
    /// The geometry words and class pattern of the configured levels.
    Geo,
    Pattern,
    /// Per class: its histogram (`cz_enc_tiles_*`, `cz_enc_prep_*`).
    Hist,
    /// Per tile position: its index among the pattern's classes (`cz_enc_prep_*`).
    ClassPattern,
    /// The encoder's steps (and, for `cz_enc_chunks_*`, the class map).
    Steps,
    Map,
    /// Per chunk: info words; then the sizes and their sum (`cz_scan`).
    Info,
    Sizes,
    /// `cz_hash`'s word.
    Hash,
}

/// Number of [`Buf`]s.
const BUFS: usize = Buf::Hash as usize + 1;

impl std::fmt::Debug for CusziGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CusziGpu")
            .field("device", &self.name)
            .finish()
    }
}

impl CusziGpu {
    /// Open device `ordinal` (its default stream) and compile or load the kernels.
    /// [`Error::Unavailable`] without a CUDA driver, device or NVRTC.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_stream(crate::gpu::util::default_stream(ordinal)?)
    }

    /// The kernels on `stream` (every operation is ordered on it).
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let (module, grid) = super::util::compile_and_load(&stream, Module::Cuszi)?;
        let name = stream.context().name().map_err(gpu_err("device name"))?;
        let smem_optin = stream
            .context()
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(gpu_err("attribute"))?
            .max(0) as usize;
        Ok(CusziGpu {
            stream,
            funcs: crate::gpu::functions::Functions::new(module, "cuszi"),
            name,
            ws: None,
            smem_optin,
            profile: Default::default(),
            staging: None,
            staged: 0,
            kept: (0..BUFS).map(|_| None).collect(),
            grid,
        })
    }

    /// Record a timing event after every step of the next operations (benchmarks); read them
    /// with [`CusziGpu::take_profile`].
    pub fn set_profile(&mut self, on: bool) {
        self.profile.set(on);
    }

    /// The milliseconds of each step recorded since the last call (`set_profile`): (step, ms),
    /// each step timed from the event before it (`setup`: from the call's start: the host's
    /// reading and checking of the header, table and metadata, and the uploads).
    pub fn take_profile(&mut self) -> Result<Vec<(&'static str, f32)>> {
        self.profile.take()
    }

    fn mark(&mut self, step: &'static str) -> Result<()> {
        self.profile.mark(&self.stream, step)
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The stream every operation is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn func(&mut self, name: &str) -> Result<CudaFunction> {
        self.funcs.get(name)
    }

    fn read(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: the callers read inside the stream's `len` bytes; synchronized before use.
        unsafe { cu::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(gpu_err("read"))?;
        self.stream.synchronize().map_err(gpu_err("sync"))
    }

    fn upload<X: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        v: &[X],
    ) -> Result<CudaSlice<X>> {
        if v.is_empty() {
            return self.stream.alloc_zeros::<X>(1).map_err(gpu_err("alloc"));
        }
        self.stream.clone_htod(v).map_err(gpu_err("upload"))
    }

    /// The pinned staging buffer, grown to at least `n` bytes.
    fn staging(&mut self, n: usize) -> Result<&mut cudarc::driver::PinnedHostSlice<u8>> {
        if !self.staging.as_ref().is_some_and(|p| p.len() >= n) {
            self.staging = None;
            let n = n.max(1).next_power_of_two();
            // SAFETY: page-locked host memory, written (by the host or a copy) before it is read.
            let p = unsafe { self.stream.context().alloc_pinned::<u8>(n) }
                .map_err(|e| Error::OutOfMemory(format!("pinned staging of {n} bytes: {e:?}")))?;
            self.staging = Some(p);
        }
        Ok(self.staging.as_mut().expect("allocated above"))
    }

    /// `n` bytes of device memory at `src`, read through the pinned staging buffer (a copy to
    /// pageable memory goes through the driver's own buffer, slower for these small reads).
    fn read_pinned(&mut self, src: u64, n: usize) -> Result<Vec<u8>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let cs = self.stream.cu_stream();
        let p = self.staging(n)?;
        let h = p.as_mut_slice().map_err(gpu_err("staging"))?;
        // SAFETY: the callers read inside the stream's bytes; the staging buffer holds `n`
        // bytes and is read only after the synchronization below.
        unsafe { cu::memcpy_dtoh_async(&mut h[..n], src, cs) }.map_err(gpu_err("read"))?;
        self.stream.synchronize().map_err(gpu_err("sync"))?;
        self.staged = 0;
        let p = self.staging.as_mut().expect("allocated above");
        Ok(p.as_mut_slice().map_err(gpu_err("staging"))?[..n].to_vec())
    }

    /// `v` uploaded into the kept device array `b` through the pinned staging buffer, after
    /// the bytes earlier copies may still read (when they do not fit, the stream is
    /// synchronized first): the copy is queued, the host does not wait. Returns its address.
    fn put<X: Plain>(&mut self, b: Buf, v: &[X]) -> Result<u64> {
        // SAFETY: `X` is a plain integer type: its `size_of_val(v)` bytes are initialized.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(v)) };
        let d = self.kept(b, bytes.len())?;
        self.copy_staged(d, bytes)?;
        Ok(d)
    }

    /// The address of the kept device array `b`, reallocated (its contents unspecified) when
    /// it holds fewer than `bytes` bytes.
    fn kept(&mut self, b: Buf, bytes: usize) -> Result<u64> {
        let s = self.stream.clone();
        let slot = &mut self.kept[b as usize];
        if !slot.as_ref().is_some_and(|d| d.len() >= bytes) {
            *slot = None;
            let n = bytes.max(1);
            // SAFETY (alloc): the callers write every byte before a kernel reads it, or zero it.
            let d = unsafe { s.alloc::<u8>(n) }
                .map_err(|e| Error::OutOfMemory(format!("cuszi array of {n} bytes: {e:?}")))?;
            *slot = Some(d);
        }
        Ok(raw_ptr_mut(slot.as_mut().expect("allocated above"), &s))
    }

    /// `bytes` copied to device address `dst` through the pinned staging buffer, after the
    /// bytes earlier copies may still read (when they do not fit, the stream is synchronized
    /// first): the copy is queued, the host does not wait.
    fn copy_staged(&mut self, dst: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let at = self.staged.next_multiple_of(16);
        if !self
            .staging
            .as_ref()
            .is_some_and(|p| at + bytes.len() <= p.len())
        {
            self.stream.synchronize().map_err(gpu_err("sync"))?;
            self.staged = 0;
        }
        let at = self.staged.next_multiple_of(16);
        let cs = self.stream.cu_stream();
        self.staged = at + bytes.len();
        let p = self.staging(at + bytes.len())?;
        let h = p.as_mut_slice().map_err(gpu_err("staging"))?;
        h[at..at + bytes.len()].copy_from_slice(bytes);
        // SAFETY: pinned bytes written above, which no later copy overwrites before a
        // synchronization, to `bytes.len()` bytes the callers own at `dst`, queued on the
        // stream before the kernels that read them.
        unsafe { cu::memcpy_htod_async(dst, &h[at..at + bytes.len()], cs) }
            .map_err(gpu_err("upload"))
    }

    /// The kept device array `b` with its first `bytes` bytes zeroed (queued): its address.
    fn zeroed(&mut self, b: Buf, bytes: usize) -> Result<u64> {
        let d = self.kept(b, bytes)?;
        // SAFETY: the array holds at least `bytes` bytes.
        unsafe { cu::memset_d8_async(d, 0, bytes, self.stream.cu_stream()) }
            .map_err(gpu_err("memset"))?;
        Ok(d)
    }

    /// `n` words of device memory at `src` (a synchronization).
    fn read_u64s(&mut self, src: u64, n: usize) -> Result<Vec<u64>> {
        let b = self.read_pinned(src, n * 8)?;
        Ok(b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }

    /// Decompress the `cuszi` stream `stream` (all of it, on the device) into `out`, which must
    /// hold exactly its values. The values are bit for bit those of [`crate::decompress`];
    /// corrupt streams give [`Error::Corrupt`] (exactly those the CPU decoder rejects; `out` is
    /// then unspecified). A stream of another codec is an [`Error::InvalidArgument`].
    pub fn decompress_device<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(gpu_err("bind"))?;
        self.mark("start")?;
        let len = stream.len();
        let sp = raw_ptr(stream, &self.stream);
        // the header and, in the same read, the chunk table and metadata of all but the longest
        // streams (one wait for the device instead of two)
        let head = self.read_pinned(sp, len.min(HEADER_LEN_V3 + FIRST_READ))?;
        if head.len() < HEADER_LEN
            || u16_at(&head, 4) != VERSION_SHAPED
            || head.len() < HEADER_LEN_V3
        {
            return self.on_host(stream, out);
        }
        let b: &[u8; HEADER_LEN_V3] = head[..HEADER_LEN_V3].try_into().expect("header length");
        let h = Header::parse_fields_v3(b, len)?;
        crate::codec::check_codec_fields(&h)?;
        if h.codec != CodecKind::Cuszi.tag() {
            return Err(Error::invalid(format!(
                "not a cuszi stream (codec {})",
                CodecKind::from_tag(h.codec)?
            )));
        }
        crate::codec::check_dtype::<T>(h.dtype)?;
        if h.count != out.len() as u64 {
            return Err(Error::Mismatch {
                what: "value count",
                expected: out.len().to_string(),
                found: h.count.to_string(),
            });
        }
        if h.is_stored() || h.mode == BoundMode::Rel {
            return self.on_host(stream, out);
        }
        let hl = h.header_len();
        let mut table = vec![0u8; h.table_len()];
        let have = head.len().saturating_sub(hl).min(table.len());
        table[..have].copy_from_slice(&head[hl..hl + have]);
        if have < table.len() {
            let rest = self.read_pinned(sp + (hl + have) as u64, table.len() - have)?;
            table[have..].copy_from_slice(&rest);
        }
        if zhash_bytes(&table) != h.payload_checksum {
            return Err(Error::corrupt("chunk table checksum mismatch"));
        }
        self.mark("read")?;
        let Some(plan) = plan(&h, &table, len)? else {
            return self.on_host(stream, out);
        };
        self.mark("plan")?;
        self.launch::<T>(&plan, sp, out)
    }

    /// The CPU twin's decoding of a stream copied to the host, with the values copied back.
    fn on_host<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let mut host = vec![0u8; stream.len()];
        self.read(raw_ptr(stream, &self.stream), &mut host)?;
        let h = crate::codec::inspect(&host)?;
        if h.codec != CodecKind::Cuszi.tag() {
            return Err(Error::invalid(format!(
                "not a cuszi stream (codec {})",
                CodecKind::from_tag(h.codec)?
            )));
        }
        let mut vals = vec![T::default(); out.len()];
        crate::codec::decompress_into(&host, &mut vals)?;
        if !vals.is_empty() {
            self.stream
                .memcpy_htod(&vals, out)
                .map_err(gpu_err("upload"))?;
        }
        self.stream.synchronize().map_err(gpu_err("sync"))
    }

    /// Grow the workspace to `n` values.
    fn workspace(&mut self, n: usize) -> Result<()> {
        if self.ws.as_ref().is_some_and(|w| w.n >= n) {
            return Ok(());
        }
        self.ws = None;
        let s = &self.stream;
        let n1 = n.max(1);
        let oom = |what: &'static str| {
            move |e: cudarc::driver::DriverError| {
                Error::OutOfMemory(format!("cuszi {what} of {n1} values: {e:?}"))
            }
        };
        // SAFETY (alloc): every kernel writes before it reads these.
        let res = unsafe { s.alloc::<i64>(n1) }.map_err(oom("residuals"))?;
        let raw = unsafe { s.alloc::<u8>(n1 * 8) }.map_err(oom("lossless values"))?;
        let bigs = unsafe { s.alloc::<u32>(n1) }.map_err(oom("big residual positions"))?;
        let syms = unsafe { s.alloc::<u16>(n1) }.map_err(oom("symbols"))?;
        self.ws = Some(Workspace {
            n,
            res,
            raw,
            bigs,
            syms,
        });
        Ok(())
    }

    fn launch<T: GpuElement>(
        &mut self,
        p: &Plan,
        sp: u64,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let n = out.len();
        if n == 0 {
            return Ok(());
        }
        self.workspace(n)?;
        let t = T::KERNEL_TAG;
        // the plan's arrays and the error words in one upload (each a driver call and a copy
        // from pageable memory, which the host waits on: a decode's fixed cost)
        let mut pack = Pack::default();
        let at = [
            pack.add(&p.geo),
            pack.add(&p.pattern),
            pack.add(&p.map),
            pack.add(&p.fc),
            pack.add(&p.rfc),
            pack.add(&p.rsym),
            pack.add(&p.ent),
            pack.add(&p.top),
            pack.add(&[0u64, u64::MAX]),
        ];
        // (the header was read through the staging buffer, with a synchronization: the plan's
        // copy starts it again)
        let base = self.put(Buf::Plan, &pack.bytes)?;
        let [geop, patp, mapp, stepp, rfcp, rsymp, entp, topp, errp] = at.map(|o| base + o as u64);
        let n_tiles = p.g.n_tiles();
        let ntab = p.fc.len() / SYMBOLS;
        let s = self.stream.clone();
        let slotp = self.kept(Buf::Slots, ntab * SLOTS * 3)?;
        let rankp = slotp + (ntab * SLOTS * 2) as u64;
        let nt = n_tiles.max(1);
        let accp = self.kept(Buf::AnchorValues, nt * 16)?;
        let valp = accp + 8 * nt as u64;
        let ws = self.ws.as_mut().expect("workspace");
        let resp = raw_ptr_mut(&mut ws.res, &s);
        let rawp = raw_ptr_mut(&mut ws.raw, &s);
        let bigp = raw_ptr_mut(&mut ws.bigs, &s);
        let symp = raw_ptr_mut(&mut ws.syms, &s);
        let outp = raw_ptr_mut(out, &s);
        {
            let f = self.func("cz_rans_slots")?;
            let mut b = launch_args!(s, &f; &stepp, &rfcp, &rsymp, &slotp, &rankp);
            let c = LaunchConfig {
                grid_dim: ((SLOTS / SLOT_THREADS) as u32, ntab as u32, 1),
                block_dim: (SLOT_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the blocks of table t read its SYMBOLS steps and RANKS ranked entries and
            // each writes its SLOT_THREADS entries of both slot arrays (ntab tables each).
            unsafe { b.launch(c) }.map_err(gpu_err("slots"))?;
        }
        let nchunks = (p.ent.len() / 2) as u64;
        let cfg = |items: usize, block: usize| LaunchConfig {
            grid_dim: (items.div_ceil(block).max(1) as u32, 1, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.mark("setup")?;
        // (the whole-tile kernel reads the chunks by 4-byte words); the later kernels read the
        // residuals from its symbols (null: from the residuals)
        let whole = p.whole && sp % 4 == 0;
        let syms_arg: u64 = if whole { symp } else { 0 };
        if whole {
            // coder 3: a lane per state; coders 1 and 2: a thread per chunk
            let warp = p.ways as usize == rans::WAYS;
            let (name, threads) = if warp {
                ("cz_rans_warp", WARP_THREADS)
            } else {
                ("cz_rans_whole", WHOLE_THREADS)
            };
            let f = self.func(&format!("{name}_{t}"))?;
            let ntab = ntab as u32;
            let want =
                (ntab as usize * SLOTS + p.rfc.len() * 4 + p.rsym.len() * 2 + p.top.len() * 4)
                    .next_multiple_of(16);
            let smem = if want <= self.smem_optin {
                set_smem(&f, want)?;
                want as u32
            } else {
                0
            };
            let (count, ts) = (n as u64, p.tabpat.len() as u32);
            let c = Self::launch_cfg(
                (nchunks as usize).div_ceil(RANS_CHUNKS),
                threads,
                smem as usize,
            );
            if warp {
                let mut b = launch_args!(s, &f;
                    &sp, &entp, &nchunks, &count, &ts, &topp, &slotp, &stepp, &rankp, &rfcp, &rsymp,
                    &ntab, &smem, &symp, &resp, &rawp, &bigp, &errp);
                // SAFETY: the chunk entries lie inside the stream (checked by `plan`), and so do
                // the words and bytes read of each (the stream is 4-aligned); each group of lanes
                // writes its chunk's symbols, lossless bytes, big positions and big residuals
                // (below `n` values of the workspace); `top` holds the `ts` local positions of
                // a tile, the tables `SLOTS` entries per table it names.
                unsafe { b.launch(c) }.map_err(gpu_err("rans"))?;
                self.mark("rans")?;
            } else {
                let statp = self.kept(Buf::Status, nchunks as usize * 4)?;
                let mut b = launch_args!(s, &f;
                    &sp, &entp, &nchunks, &count, &ts, &topp, &slotp, &stepp, &rankp, &rfcp, &rsymp,
                    &ntab, &smem, &p.ways, &symp, &statp, &errp);
                // SAFETY: as for the warp kernel; each thread writes its chunk's symbols (below
                // `n` of the workspace) and status word (`nchunks` of them).
                unsafe { b.launch(c) }.map_err(gpu_err("rans"))?;
                self.mark("rans")?;
                let f = self.func(&format!("cz_rans_post_{t}"))?;
                let mut b = launch_args!(s, &f;
                    &sp, &entp, &nchunks, &count, &symp, &statp, &resp, &rawp, &bigp, &errp);
                // SAFETY: one warp per chunk reads its symbols and its valid chunk's bytes, and
                // writes its residuals, lossless bytes and big positions (below `n` values).
                let c = Self::launch_cfg(
                    (nchunks as usize * 32).div_ceil(CHUNK_WARP_THREADS),
                    CHUNK_WARP_THREADS,
                    0,
                );
                unsafe { b.launch(c) }.map_err(gpu_err("rans"))?;
                self.mark("rans_post")?;
            }
        } else {
            let f = self.func(&format!("cz_rans_{t}"))?;
            let ntab = ntab as u32;
            let nclass = p.map.len() as u32;
            let want = (ntab as usize * SLOTS + p.rfc.len() * 4 + p.rsym.len() * 2 + MAP_BYTES)
                + p.pattern.len();
            let want = want.next_multiple_of(16);
            let smem = if want <= self.smem_optin {
                set_smem(&f, want)?;
                want as u32
            } else {
                0
            };
            let mut b = launch_args!(s, &f;
                &sp, &geop, &entp, &nchunks, &patp, &mapp, &slotp, &stepp, &rankp, &rfcp, &rsymp,
                &ntab, &nclass, &smem, &p.ways, &resp, &rawp, &bigp, &errp);
            // SAFETY: the chunk entries lie inside the stream (checked by `plan`); each thread
            // writes its chunk's residuals, lossless bytes and big positions, below `n` values
            // of the workspace; the tables hold `SLOTS` entries per table the map names.
            let c = LaunchConfig {
                shared_mem_bytes: smem,
                ..Self::launch_cfg(
                    (nchunks as usize).div_ceil(RANS_CHUNKS),
                    RANS_STAGE_THREADS,
                    0,
                )
            };
            unsafe { b.launch(c) }.map_err(gpu_err("rans"))?;
            self.mark("rans")?;
        }
        // the anchor passes, one per dimension (kernels/cuszi.cu cz_anchors): (dim, first,
        // last, tiles per segment, segments per line); a pass along a dimension of one tile
        // that neither reads the residuals nor writes the values changes nothing
        let passes: Vec<(i32, i32, i32, usize, usize)> = [(2i32, 1i32, 0i32), (1, 0, 0), (0, 0, 1)]
            .into_iter()
            .filter(|&(dim, first, last)| p.g.tiles[dim as usize] > 1 || first + last > 0)
            .map(|(dim, first, last)| {
                let len = p.g.tiles[dim as usize];
                let seg = anchor_segment(len);
                (dim, first, last, seg, len.div_ceil(seg))
            })
            .collect();
        let nparts = passes
            .iter()
            .filter(|q| q.4 > 1)
            .map(|q| n_tiles / p.g.tiles[q.0 as usize] * q.4)
            .max()
            .unwrap_or(0);
        // (each pass that reads `part` has its segment sums written before)
        let partp = self.kept(Buf::Segments, nparts * 8)?;
        let f = self.func(&format!("cz_anchors_{t}"))?;
        let fscan = self.func("cz_anchor_scan")?;
        let flines = self.func(&format!("cz_anchor_lines_{t}"))?;
        for &(dim, first, last, seg, nseg) in &passes {
            let len = p.g.tiles[dim as usize];
            let lines = n_tiles / len.max(1);
            // (a warp per line when its scan has lanes to fill: a pass along a dimension of a
            // few tiles, such as the value pass of a 1-D array's single-tile dimensions, keeps
            // a thread per line)
            if nseg == 1 && len > WARP_LINE_MIN {
                let mut b = launch_args!(s, &flines;
                    &geop, &resp, &syms_arg, &accp, &valp, &dim, &first, &last, &p.qstep);
                // SAFETY: one warp per line of tiles reads residuals at tile offsets (below n)
                // or the `acc` words of its tiles, and writes their `acc` and `vals` words
                // (n_tiles words each).
                unsafe { b.launch(cfg(lines * 32, 128)) }.map_err(gpu_err("anchors"))?;
                continue;
            }
            let (seg64, null) = (seg as i64, 0u64);
            if nseg == 1 {
                let mut b = launch_args!(s, &f;
                    &geop, &resp, &syms_arg, &accp, &valp, &dim, &first, &last, &p.qstep, &seg64,
                    &null, &null);
                // SAFETY: one thread per line of tiles reads residuals at tile offsets (below
                // n) or the `acc` words of its tiles, and writes their `acc` and `vals` words.
                unsafe { b.launch(cfg(lines, 128)) }.map_err(gpu_err("anchors"))?;
                continue;
            }
            // a long line: its segments' sums, their prefixes per line, then the segments
            let mut b = launch_args!(s, &f;
                &geop, &resp, &syms_arg, &accp, &valp, &dim, &first, &last, &p.qstep, &seg64,
                &null, &partp);
            // SAFETY: one thread per segment of a line of tiles reads residuals at tile offsets
            // (below n) or the `acc` words of its tiles, and writes its word of `part` (lines *
            // nseg <= nparts words).
            unsafe { b.launch(cfg(lines * nseg, 128)) }.map_err(gpu_err("anchors"))?;
            let nseg64 = nseg as i64;
            let mut b = launch_args!(s, &fscan; &partp, &nseg64);
            // SAFETY: block l rewrites the nseg words of line l of `part`.
            unsafe { b.launch(Self::launch_cfg(lines, 1024, 0)) }.map_err(gpu_err("anchors"))?;
            let mut b = launch_args!(s, &f;
                &geop, &resp, &syms_arg, &accp, &valp, &dim, &first, &last, &p.qstep, &seg64,
                &partp, &null);
            // SAFETY: one thread per segment of a line of tiles reads residuals at tile offsets
            // (below n) and its word of `part`, and writes the `acc` and `vals` words of its
            // tiles (n_tiles words each).
            unsafe { b.launch(cfg(lines * nseg, 128)) }.map_err(gpu_err("anchors"))?;
        }
        self.mark("anchors")?;
        {
            let f = self.func(&format!("cz_tiles_{t}"))?;
            let mut b = launch_args!(s, &f;
                &geop, &resp, &syms_arg, &rawp, &accp, &valp, &p.qstep, &outp);
            // SAFETY: one warp per tile reads residuals and lossless bytes at symbol indices of
            // its box (below n) and writes its owned points of `out` (n values).
            unsafe { b.launch(cfg(n_tiles * 32, TILE_WARPS * 32)) }.map_err(gpu_err("tiles"))?;
        }
        self.mark("tiles")?;
        let e = self.read_u64s(errp, 2)?;
        if e[0] != 0 {
            let what = ERRORS
                .iter()
                .find(|(bit, _)| e[0] & bit != 0)
                .map_or("invalid chunk", |(_, w)| *w);
            return Err(Error::corrupt(format!("chunk {}: {what}", e[1])));
        }
        Ok(())
    }

    /// Bytes of the largest stream of `n` values of `T`: what the output of
    /// [`CusziGpu::compress_device`] must hold.
    pub fn compress_bound<T: GpuElement>(n: usize) -> usize {
        crate::format::compress_bound(n, T::DTYPE)
    }

    fn launch_cfg(grid: usize, block: usize, smem: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (grid.max(1) as u32, 1, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        }
    }

    /// Copy `src` to `dst` and wait for the stream: the host decides on what the kernels
    /// before wrote.
    fn read_back<X: DeviceRepr, Src: DevicePtr<X>>(&self, src: &Src, dst: &mut [X]) -> Result<()> {
        self.stream.memcpy_dtoh(src, dst).map_err(gpu_err("dtoh"))?;
        self.stream.synchronize().map_err(gpu_err("sync"))
    }

    /// Compress `input` (values of shape `dims`, row-major) under `bound` into `out` (at least
    /// [`CusziGpu::compress_bound`] bytes); returns the stream's length. The bytes are those of
    /// [`crate::compress_nd`] with [`CodecKind::Cuszi`] on the same values.
    ///
    /// The device computes the range, the anchors, the sampling sums, the residuals with their
    /// per-class histogram, the chunks, their placement and the hashes. The host reads back the
    /// small results it decides on between those kernels, as the CPU twin decides them: the
    /// range (noa: the quantization step), the sampling sums (the level configuration, two
    /// reads), the histogram (the rANS tables and the metadata, with the CPU's own table
    /// builder) and the total size (a stream that does not compress is stored); then it writes
    /// the metadata and the header. Rel bounds, degenerate steps and stored streams are
    /// compressed by the CPU twin on a host copy.
    ///
    /// Errors: those of [`crate::compress_nd`] ([`Error::InvalidArgument`]), an output smaller
    /// than the bound, [`Error::Gpu`], [`Error::OutOfMemory`].
    pub fn compress_device<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        dims: &[usize],
        bound: ErrorBound,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        bound.validate()?;
        let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
        let shape = Dims::new(&d)?;
        let n = input.len();
        if shape.count() != n as u64 {
            return Err(Error::invalid(format!(
                "shape {shape} holds {} values, the data has {n}",
                shape.count()
            )));
        }
        let cap = Self::compress_bound::<T>(n);
        if out.len() < cap {
            return Err(Error::invalid(format!(
                "cuszi output of {} bytes is smaller than the bound {cap}",
                out.len()
            )));
        }
        self.stream
            .context()
            .bind_to_thread()
            .map_err(gpu_err("bind"))?;
        if n == 0 || matches!(bound, ErrorBound::Rel(_)) {
            return self.compress_on_host(input, dims, bound, out);
        }
        self.mark("start")?;
        let s = self.stream.clone();
        let t = T::KERNEL_TAG;
        let x = raw_ptr(input, &s);
        let n64 = n as u64;
        // 1. range (noa) and the quantization parameters
        let mut range = None;
        if matches!(bound, ErrorBound::Noa(_)) {
            let wsp = self.put(Buf::Range, &[u64::MAX, 0])?;
            let f = self.func(&format!("cz_range_{t}"))?;
            let mut b = launch_args!(s, &f; &x, &n64, &wsp);
            // SAFETY: reads the n values of the input, writes the two words of `ws`.
            unsafe { b.launch(Self::launch_cfg(self.grid as usize, 256, 0)) }
                .map_err(gpu_err("range"))?;
            let w = self.read_u64s(wsp, 2)?;
            let key = |k: u64| f64::from_bits(if k >> 63 == 1 { k & !(1u64 << 63) } else { !k });
            if w[0] <= w[1] {
                range = Some((key(w[0]) + 0.0, key(w[1]) + 0.0));
            }
        }
        self.mark("range")?;
        let mut degenerate = false;
        let params = QuantParams::derive_from_stats::<T>(
            bound,
            || range,
            || {
                degenerate = true;
                None
            },
        )?;
        if degenerate {
            return self.compress_on_host(input, dims, bound, out);
        }
        let g = Grid::new(&shape);
        let n_tiles = g.n_tiles();
        let eb = if params.abs_bound <= f64::MAX {
            params.abs_bound
        } else {
            0.0
        };
        let step = params.step;
        // 2. anchors
        let (geo0, _) = geometry(&g, &[]);
        let geo0p = self.put(Buf::Geo0, &geo0)?;
        // (codes, accumulated codes, residuals, values: a tile's word each; the flag; a
        // tile's u32 in the list of lossless anchors)
        let nt = n_tiles.max(1) as u64;
        let codp = self.zeroed(Buf::Anchors, (4 * nt as usize + 1) * 8 + nt as usize * 4)?;
        let (accp, aresp, valp) = (codp + 8 * nt, codp + 16 * nt, codp + 24 * nt);
        let (flagp, listp) = (codp + 32 * nt, codp + 32 * nt + 8);
        let per_tile = Self::launch_cfg(n_tiles.div_ceil(128), 128, 0);
        {
            let f = self.func(&format!("cz_anchor_codes_{t}"))?;
            let mut b = launch_args!(s, &f; &x, &geo0p, &step, &eb, &codp, &accp, &flagp);
            // SAFETY: one thread per tile reads its anchor's value and writes its code.
            unsafe { b.launch(per_tile) }.map_err(gpu_err("anchor codes"))?;
            let f = self.func("cz_anchor_lossless")?;
            let mut b = launch_args!(s, &f; &geo0p, &codp, &accp, &flagp, &listp);
            // SAFETY: one block reads the n_tiles codes, lists the lossless ones (n_tiles words
            // of `list`) and rewrites their words of `acc`.
            unsafe { b.launch(Self::launch_cfg(1, 1024, 0)) }
                .map_err(gpu_err("lossless anchors"))?;
            let f = self.func("cz_anchor_res")?;
            let mut b = launch_args!(s, &f; &geo0p, &codp, &accp, &aresp, &flagp);
            // SAFETY: one thread per tile reads anchors of tiles and writes its residual.
            unsafe { b.launch(per_tile) }.map_err(gpu_err("anchor residuals"))?;
            let f = self.func("cz_anchor_serial")?;
            let mut b = launch_args!(s, &f; &geo0p, &codp, &accp, &aresp, &flagp);
            // SAFETY: one thread rewrites the n_tiles codes and residuals (when flagged).
            unsafe { b.launch(Self::launch_cfg(1, 32, 0)) }.map_err(gpu_err("anchors"))?;
            let f = self.func(&format!("cz_anchor_vals_{t}"))?;
            let mut b = launch_args!(s, &f; &geo0p, &accp, &step, &valp);
            // SAFETY: one thread per tile.
            unsafe { b.launch(per_tile) }.map_err(gpu_err("anchor values"))?;
        }
        self.mark("anchors")?;
        // 3. level configuration by sampling (interp.rs choose_levels)
        let nl = g.levels();
        let k = (n_tiles / interp::SAMPLE_TILES).max(1) as i64;
        let nsample = n_tiles.div_ceil(k as usize);
        let scale = 1.0 / step;
        let sample = |me: &mut Self, cfg: u64| -> Result<Vec<u64>> {
            let words = nl.max(1) * 9;
            let errp = me.zeroed(Buf::Sample, words * 8)?;
            let f = me.func(&format!("cz_sample_{t}"))?;
            let mut b = launch_args!(s, &f; &x, &geo0p, &k, &scale, &cfg, &errp);
            // SAFETY: one block per sampled tile reads its box of the input; adds to `err`.
            unsafe { b.launch(Self::launch_cfg(nsample, 128, 0)) }.map_err(gpu_err("sample"))?;
            me.read_u64s(errp, words)
        };
        let e1 = sample(self, 0)?;
        let mut levels = Vec::with_capacity(nl);
        let mut cfg = Vec::with_capacity(nl * 6);
        for lv in 0..nl {
            let err = |d: usize, i: usize| e1[lv * 9 + d * 3 + i];
            let best: [(u64, usize); 3] = std::array::from_fn(|d| {
                let mut bi = 0;
                for i in 1..3 {
                    if err(d, i) < err(d, bi) {
                        bi = i;
                    }
                }
                (err(d, bi), bi)
            });
            let mut order = [0usize, 1, 2];
            order.sort_by(|&a, &b| best[b].0.cmp(&best[a].0).then(a.cmp(&b)));
            let spline = best.map(|b| interp::Spline::ALL[b.1]);
            levels.push(Level {
                order,
                spline,
                multi: false,
            });
            cfg.extend(order.iter().map(|&o| o as i64));
            cfg.extend(best.iter().map(|b| b.1 as i64));
        }
        let cfgp = self.put(Buf::SampleCfg, &cfg)?;
        let e2 = sample(self, cfgp)?;
        for (lv, level) in levels.iter_mut().enumerate() {
            level.multi = e2[lv * 9 + 1] < e2[lv * 9];
        }
        self.mark("sample")?;
        // 4. residuals (and, unless the chunks are coded by `cz_enc_prep_*`, which counts them
        // in symbol order, the per-class histogram)
        let (geo, pattern) = geometry(&g, &levels);
        let geop = self.put(Buf::Geo, &geo)?;
        let patp = self.put(Buf::Pattern, &pattern)?;
        let nclass = interp::n_classes(nl);
        // (the whole-tile chunk kernels count every class's symbols in one block's shared
        // memory: a GPU with less than that per block takes the other kernels)
        let whole = whole_tiles(&g) && nclass * SYMBOLS * 4 <= self.smem_optin;
        self.workspace(n)?;
        let ws = self.ws.as_mut().expect("workspace");
        let (resp, rawp) = (raw_ptr_mut(&mut ws.res, &s), raw_ptr_mut(&mut ws.raw, &s));
        let symp = raw_ptr_mut(&mut ws.syms, &s);
        // (grid-stride kernels: one wave of the blocks that fit, super::util::resident_blocks)
        let sms = self.grid / 8;
        let wave = |f: &CudaFunction, smem: usize| -> Result<usize> {
            let w = super::util::resident_blocks(f, (TILE_WARPS * 32) as u32, smem, sms)?;
            Ok(n_tiles.div_ceil(TILE_WARPS).min(w as usize))
        };
        let mut hist_d = None;
        let hist_words = nclass * SYMBOLS;
        if whole {
            let f = self.func(&format!("cz_enc_tiles_nh_{t}"))?;
            let smem = TILE_WARPS * MAX_BOX * 8;
            set_smem(&f, smem)?;
            let grid = wave(&f, smem)?;
            let mut b = launch_args!(s, &f;
                &x, &geop, &accp, &aresp, &valp, &step, &eb, &resp, &symp, &rawp);
            // SAFETY: warps read the boxes of their tiles (inside the input) and write their
            // owned residuals and lossless bytes (below n values of the workspace).
            unsafe { b.launch(Self::launch_cfg(grid, TILE_WARPS * 32, smem)) }
                .map_err(gpu_err("tiles"))?;
        } else {
            let histp = self.zeroed(Buf::Hist, hist_words * 8)?;
            let f = self.func(&format!("cz_enc_tiles_{t}"))?;
            let smem = TILE_WARPS * MAX_BOX * 8 + nclass * HIST_WIN * 4;
            set_smem(&f, smem)?;
            let grid = wave(&f, smem)?;
            let nclass32 = nclass as u32;
            let mut b = launch_args!(s, &f;
                &x, &geop, &accp, &aresp, &valp, &step, &eb, &patp, &nclass32, &resp, &symp,
                &rawp, &histp);
            // SAFETY: as above; the histogram has `nclass * SYMBOLS` counters.
            unsafe { b.launch(Self::launch_cfg(grid, TILE_WARPS * 32, smem)) }
                .map_err(gpu_err("tiles"))?;
            hist_d = Some(histp);
        }
        self.mark("residuals")?;
        let nc = n.div_ceil(CHUNK);
        let per = scratch_len::<T>();
        // (every chunk writes the parts of its region that are read back)
        let scp = self.kept(Buf::Scratch, nc * per)?;
        let infop = self.zeroed(Buf::Info, 3 * nc * 4)?;
        let sizep = self.zeroed(Buf::Sizes, (nc + 1) * 8)?;
        let nc64 = nc as u64;
        // the classes a tile's pattern holds (`kinds`, ascending) and each position's index
        // among them (`cpat`): cz_enc_prep's step indices and counters are per index
        let mut kinds: Vec<u8> = pattern.clone();
        kinds.sort_unstable();
        kinds.dedup();
        let hist: Vec<Vec<u64>> = if let Some(hd) = hist_d {
            let h = self.read_u64s(hd, hist_words)?;
            h.chunks(SYMBOLS).map(|c| c.to_vec()).collect()
        } else {
            let cpat: Vec<u8> = pattern
                .iter()
                .map(|k| kinds.binary_search(k).expect("a class of the pattern") as u8)
                .collect();
            let cpatp = self.put(Buf::ClassPattern, &cpat)?;
            let nk = kinds.len();
            let hkp = self.zeroed(Buf::Hist, nk * SYMBOLS * 8)?;
            let (ts, nk32) = (cpat.len() as u32, nk as u32);
            let f = self.func(&format!("cz_enc_prep_{t}"))?;
            let smem = nk * SYMBOLS * 4;
            set_smem(&f, smem)?;
            let mut b = launch_args!(s, &f;
                &resp, &symp, &rawp, &cpatp, &n64, &ts, &nc64, &scp, &infop, &nk32, &hkp);
            // SAFETY: one warp per chunk reads its residuals and lossless bytes (below n values)
            // and writes its scratch region (nc regions allocated) and info words; the step
            // indices are below `nk * SYMBOLS`, the counters (shared and `hk`) `nk * SYMBOLS`.
            let c = Self::launch_cfg((nc * 32).div_ceil(PREP_THREADS), PREP_THREADS, smem);
            unsafe { b.launch(c) }.map_err(gpu_err("chunks"))?;
            let h = self.read_u64s(hkp, nk * SYMBOLS)?;
            let mut hist = vec![vec![0u64; SYMBOLS]; nclass];
            for (&k, c) in kinds.iter().zip(h.chunks(SYMBOLS)) {
                hist[k as usize].copy_from_slice(c);
            }
            hist
        };
        self.mark("counts")?;
        // 5. tables (the CPU's builder) and the metadata
        let (map, freqs) = rans::group_classes(&hist);
        // (the encoder's steps alone: the device encodes, nothing here decodes)
        let words: Vec<Vec<[u32; 5]>> = freqs.iter().map(|f| rans::encoder_words(f)).collect();
        // (the encoder kernels write coder 3, rans::WAYS states per chunk)
        let meta = write_meta(&levels, &map, &freqs, rans::WAYS);
        self.mark("tables")?;
        // 6. chunks
        if whole {
            // the steps packed as kernels/cuszi.cu `cz_enc_step` reads them, for each class
            // of `kinds` (its table's)
            let enc4: Vec<u32> = kinds
                .iter()
                .flat_map(|&k| &words[map[k as usize] as usize])
                .flat_map(|&[x_max, rcp, shift, bias, cmpl]| [x_max, rcp, bias, cmpl | shift << 16])
                .collect();
            let enc4p = self.put(Buf::Steps, &enc4)?;
            let f = self.func(&format!("cz_enc_whole_{t}"))?;
            let ntab = kinds.len() as u32;
            let want = enc4.len() * 4;
            let smem = if want <= self.smem_optin {
                set_smem(&f, want)?;
                want as u32
            } else {
                0
            };
            let mut b =
                launch_args!(s, &f; &enc4p, &ntab, &smem, &n64, &nc64, &scp, &infop, &sizep);
            // SAFETY: a group of lanes per chunk reads its step indices, each below
            // `ntab * SYMBOLS` (the entries of `enc4`), and writes its scratch region and info
            // and size words.
            let c = Self::launch_cfg(nc.div_ceil(RANS_CHUNKS), WARP_THREADS, smem as usize);
            unsafe { b.launch(c) }.map_err(gpu_err("chunks"))?;
        } else {
            let enc: Vec<u32> = words.iter().flatten().flatten().copied().collect();
            let mapp = self.put(Buf::Map, &map)?;
            let encp = self.put(Buf::Steps, &enc)?;
            let f = self.func(&format!("cz_enc_chunks_{t}"))?;
            let mut b = launch_args!(s, &f;
                &geop, &resp, &symp, &rawp, &patp, &mapp, &encp, &nc64, &scp, &infop, &sizep);
            // SAFETY: one thread per chunk reads its residuals and writes its scratch region
            // (nc regions allocated) and its info and size words.
            unsafe { b.launch(Self::launch_cfg(nc.div_ceil(RANS_THREADS), RANS_THREADS, 0)) }
                .map_err(gpu_err("chunks"))?;
        }
        {
            let f = self.func("cz_scan")?;
            let mut b = launch_args!(s, &f; &sizep, &nc64);
            // SAFETY: one block rewrites the nc + 1 size words.
            unsafe { b.launch(Self::launch_cfg(1, 1024, 0)) }.map_err(gpu_err("scan"))?;
        }
        let total = self.read_u64s(sizep + 8 * nc as u64, 1)?;
        self.mark("chunks")?;
        let hl = HEADER_LEN_V3;
        let payload = nc * TABLE_ENTRY_LEN + meta.len() + total[0] as usize;
        if payload >= n * T::SIZE {
            return self.compress_on_host(input, dims, bound, out);
        }
        // 7. placement, hashes, metadata and header
        let outp = raw_ptr_mut(out, &s);
        let table_at = hl as u64;
        let data_at = (hl + nc * TABLE_ENTRY_LEN + meta.len()) as u64;
        {
            let f = self.func(&format!("cz_enc_write_{t}"))?;
            let mut b = launch_args!(s, &f; &scp, &infop, &sizep, &outp, &table_at, &data_at);
            // SAFETY: block i writes chunk i below data_at + total <= hl + payload < cap bytes
            // of `out`, and its table entry.
            unsafe { b.launch(Self::launch_cfg(nc, 256, 0)) }.map_err(gpu_err("write"))?;
        }
        self.copy_staged(outp + (hl + nc * TABLE_ENTRY_LEN) as u64, &meta)?;
        let hwp = self.zeroed(Buf::Hash, 8)?;
        let nwords = ((nc * TABLE_ENTRY_LEN + meta.len()) / 4) as u64;
        {
            let f = self.func("cz_hash")?;
            let tp = outp + table_at;
            let mut b = launch_args!(s, &f; &tp, &nwords, &hwp);
            // SAFETY: reads the table and metadata words of `out`.
            unsafe { b.launch(Self::launch_cfg(1, 1024, 0)) }.map_err(gpu_err("hash"))?;
        }
        let table_checksum = self.read_u64s(hwp, 1)?[0] as u32;
        let header = Header {
            payload_len: payload as u64,
            n_chunks: nc as u32,
            payload_checksum: table_checksum,
            data_checksum: 0,
            dims: Some(shape),
            meta_len: meta.len() as u32,
            ..crate::codec::params_header::<T>(CodecKind::Cuszi, n, &params)
        };
        self.copy_staged(outp, &header.to_vec())?;
        self.stream.synchronize().map_err(gpu_err("sync"))?;
        self.mark("write")?;
        Ok(hl + payload)
    }

    fn write_bytes(&self, dst: u64, bytes: &[u8]) -> Result<()> {
        // SAFETY: the callers write inside `out`; the copy from pageable memory is staged before
        // the call returns, and the stream is synchronized.
        unsafe { cu::memcpy_htod_async(dst, bytes, self.stream.cu_stream()) }
            .map_err(gpu_err("write"))?;
        self.stream.synchronize().map_err(gpu_err("sync"))
    }

    /// The CPU twin's compression of a host copy of `input`, written to `out`.
    fn compress_on_host<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        dims: &[usize],
        bound: ErrorBound,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        let mut host = vec![T::default(); input.len()];
        if !host.is_empty() {
            self.read_back(input, &mut host[..])?;
        }
        let v = crate::compress_nd(&host, dims, bound, CodecKind::Cuszi)?;
        if v.len() > out.len() {
            return Err(Error::invalid("cuszi output smaller than the stream"));
        }
        let outp = raw_ptr_mut(out, &self.stream);
        self.write_bytes(outp, &v)?;
        Ok(v.len())
    }

    /// [`CusziGpu::compress_device`] of host values.
    pub fn compress<T: GpuElement>(
        &mut self,
        data: &[T],
        dims: &[usize],
        bound: ErrorBound,
    ) -> Result<Vec<u8>> {
        let s = self.stream.clone();
        let d_in = self.upload(data)?;
        let cap = Self::compress_bound::<T>(data.len());
        let mut d_out = s.alloc_zeros::<u8>(cap).map_err(gpu_err("alloc"))?;
        let len = self.compress_device(
            &d_in.slice(0..data.len()),
            dims,
            bound,
            &mut d_out.slice_mut(..),
        )?;
        let mut v = vec![0u8; len];
        self.read_back(&d_out.slice(0..len), &mut v[..])?;
        Ok(v)
    }

    /// [`CusziGpu::decompress_device`] of a host stream.
    pub fn decompress<T: GpuElement>(&mut self, stream: &[u8]) -> Result<Vec<T>> {
        let h = crate::codec::inspect(stream)?;
        crate::codec::check_dtype::<T>(h.dtype)?;
        let n = usize::try_from(h.count)
            .map_err(|_| Error::corrupt(format!("{} values do not fit in memory", h.count)))?;
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(n)
            .map_err(|_| Error::OutOfMemory(format!("{n} values of {}", T::DTYPE)))?;
        v.resize(n, T::default());
        let s = self.stream.clone();
        let d_in = self.upload(stream)?;
        let mut d_out = s.alloc_zeros::<T>(n.max(1)).map_err(gpu_err("alloc"))?;
        self.decompress_device(&d_in.slice(0..stream.len()), &mut d_out.slice_mut(0..n))?;
        if n > 0 {
            s.memcpy_dtoh(&d_out.slice(0..n), &mut v[..])
                .map_err(gpu_err("dtoh"))?;
        }
        s.synchronize().map_err(gpu_err("sync"))?;
        Ok(v)
    }
}

/// Bytes of one chunk's scratch region of the encoder (kernels/cuszi.cu `cz_scratch`): the rANS
/// bytes (at most 2 per value, and the state, rounded up to 16 bytes), the lossless values, the
/// varints, the classes or step indices (2 bytes per value).
fn scratch_len<T: GpuElement>() -> usize {
    2 * CHUNK + 4 * rans::WAYS + CHUNK * (T::SIZE + 10 + 2)
}

/// Plain integers, viewed as the bytes they are in memory (no padding, every bit pattern valid).
trait Plain: Copy {}
impl Plain for u8 {}
impl Plain for u16 {}
impl Plain for u32 {}
impl Plain for u64 {}
impl Plain for i64 {}

/// Arrays packed into one byte buffer for one upload, each at a multiple of 16 bytes (the
/// device reads them as the host wrote them: both little-endian).
#[derive(Default)]
struct Pack {
    bytes: Vec<u8>,
}

impl Pack {
    /// Append `v` and return its offset.
    fn add<X: Plain>(&mut self, v: &[X]) -> usize {
        let at = self.bytes.len().next_multiple_of(16);
        self.bytes.resize(at, 0);
        // SAFETY: `X` is a plain integer type: its `size_of_val(v)` bytes are initialized and
        // any alignment suits bytes.
        let b = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(v)) };
        self.bytes.extend_from_slice(b);
        at
    }
}

/// Tiles of a line above which a pass over lines of one segment takes a warp per line
/// (`cz_anchor_lines_*`).
const WARP_LINE_MIN: usize = 8;

/// Tiles per segment of a line of `len` tiles in the decoder's anchor passes (kernels/cuszi.cu
/// `cz_anchors`): short lines (those of 2-D and 3-D arrays of usual sizes, many lines each) stay
/// one thread's loop; long ones (a 1-D array is one line) are split so that every segment has
/// its own thread.
fn anchor_segment(len: usize) -> usize {
    const SHORT_LINE: usize = 64;
    const SEGMENT: usize = 32;
    if len <= SHORT_LINE {
        len.max(1)
    } else {
        SEGMENT
    }
}

/// Let kernel `f` use `bytes` of dynamic shared memory.
fn set_smem(f: &CudaFunction, bytes: usize) -> Result<()> {
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(gpu_err("shared memory attribute"))
}

#[cfg(test)]
mod tests;
