//! The GPZ particle codec on a CUDA device (`kernels/gpz.cu`): writes, byte for byte, the
//! stream of the CPU encoder [`crate::codec::gpz::compress_particles`] and decodes exactly what
//! [`crate::codec::gpz::decompress_particles`] accepts, to the same bits.
//!
//! Compression of a device buffer of `N × d` AoS particles is a fixed sequence of kernels on one
//! stream with a single read back to the host at the end (the sizes, checksums and per-axis
//! parameters, from which the host writes the header):
//!
//! 1. `gz_init`: the control words and the look-back status words are cleared;
//! 2. `gz_range_*` (`noa`, or an `abs` bound whose step degenerates): per-axis finite range and
//!    first finite non-zero particle, by atomics on order keys;
//! 3. `gz_params_*` (one thread): the per-axis bound and step of
//!    [`QuantParams::derive_from_stats`](crate::quant::QuantParams::derive_from_stats);
//! 4. `gz_codes_*`: the per-axis smallest and largest code of the non-exception particles (the
//!    stream's frame `G_c`, `gw_c`). When the ranges were measured, `gz_params_*` predicts the
//!    frame from them instead (quantisation is monotone: the codes of the range's ends) and
//!    the encoder checks it: every block compares its smallest and largest codes with the
//!    frame's ends. A prediction that no block reaches (the end of a range is an exception) is
//!    redone with this pass: the whole encoding runs again;
//! 5. `gz_encode_*`: one warp per 32-particle block quantises, evaluates the levels (each
//!    level's run statistics gathered into one lane, every lane then sizes its level or bounds
//!    it, and a warp bitonic sort only for a level whose delta width is still open and whose
//!    bound could win, lowest level first), writes the block into shared memory; a thread block's `WARPS * ENC_BPW` blocks are
//!    one chunk of a decoupled look-back over the block sizes (one warp looks back while the
//!    others wait at a barrier), and every block is written once, straight into the final
//!    stream, with its table entry;
//! 6. `gz_hash`: the `zhash` sums of the table and the blocks (16-byte loads).
//!
//! A stream that does not compress (table and blocks not smaller than the raw values) is stored:
//! the input is copied after the header and hashed (a second, rare read back).
//!
//! Decompression reads the header to the host (validated by the CPU's own parser), then
//! `gz_init`, `gz_decode_*` (one warp per group of `DEC_GROUP` blocks: the group's offset from a
//! scan of its table sizes and a decoupled look-back over the groups before it, its part of the
//! table and data checksums, one lane per block parses the block headers, then the warp decodes
//! the blocks one after the other), and one read back of the error bits and checksums.
//!
//! `reorder` streams: the GPU encoder writes the same stream; the permutation that
//! [`compress_particles`] returns is not computed here
//! (decode the stream on the CPU, or keep per-particle arrays with the positions).

use std::sync::Arc;

use cudarc::driver::{
    result as cu, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig,
    PushKernelArg,
};

use super::compile::{self, Module};
use super::{raw_ptr, raw_ptr_mut, GpuElement};
use crate::codec::gpz::{compress_particles, particle_count, AxisRecord, GpzHeader, Order};
use crate::codec::DecodeLimits;
use crate::error::{Error, Result};
use crate::format::{zhash_final, BoundMode};
use crate::quant::{ErrorBound, QuantParams};

/// Control words of the workspace (kernels/gpz.cu `GZ_W_*`; checked by a test).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const W_RMIN: usize = 0;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const W_RMAX: usize = 4;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const W_FNZ: usize = 8;
pub(crate) const W_CMIN: usize = 12;
pub(crate) const W_CMAX: usize = 16;
pub(crate) const W_AXIS: usize = 20;
pub(crate) const W_HASH: usize = 36;
pub(crate) const W_TOTAL: usize = 38;
pub(crate) const W_ERR: usize = 39;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const W_TICKET: usize = 40;
/// The frame predicted from the ranges: `SPEC_ON`, with `SPEC_NONE` when it could not be.
pub(crate) const W_SPEC: usize = 41;
/// Which ends of the predicted frame the blocks reached (bit c: the smallest code of axis c,
/// bit 4 + c: its largest), `SPEC_OUT`: a code outside it.
pub(crate) const W_SPECHIT: usize = 42;
const SPEC_ON: u64 = 1;
#[cfg_attr(not(test), allow(dead_code))]
const SPEC_OUT: u64 = 256;
/// Control words before the look-back status words.
pub(crate) const CTRL: usize = 48;
/// Warps per thread block of the encoder (kernels/gpz.cu `GZ_WARPS`).
pub(crate) const WARPS: usize = 8;
/// Blocks each decoder warp decodes (kernels/gpz.cu `GZ_DEC_GROUP`).
pub(crate) const DEC_GROUP: usize = 32;
/// Warps per thread block of the decoder (kernels/gpz.cu `GZ_DEC_WARPS`).
pub(crate) const DEC_WARPS: usize = 4;
/// Blocks of 32 particles each encoder warp encodes (kernels/gpz.cu `GZ_ENC_BPW`): a thread
/// block's `WARPS * ENC_BPW` blocks are one look-back chunk.
pub(crate) const ENC_BPW: usize = 4;
// the control words do not overlap
const _: () = assert!(
    W_TICKET < W_SPEC && W_SPECHIT < CTRL && W_AXIS + 16 <= W_HASH && W_HASH + 2 <= W_TOTAL
);

/// Header bytes of the largest header (d = 4).
const MAX_HEADER: usize = 56 + 48 * 4;

/// Names of every kernel of [`Module::Gpz`].
pub fn kernel_names() -> Vec<String> {
    let mut v = vec![
        "gz_init_k".to_string(),
        "gz_hash_k".to_string(),
        "gz_iota_k".to_string(),
    ];
    for t in ["f32", "f64"] {
        v.push(format!("gz_params_{t}"));
        for d in 1..=4 {
            v.push(format!("gz_range_{t}_d{d}"));
            v.push(format!("gz_codes_{t}_d{d}"));
            for o in ["p", "r"] {
                v.push(format!("gz_encode_{t}_d{d}_{o}"));
                v.push(format!("gz_decode_{t}_d{d}_{o}"));
            }
        }
    }
    v
}

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("gpz {what}: {e:?}"))
}

fn header_len(d: usize) -> usize {
    crate::codec::gpz::layout::header_len(d)
}

/// `zhash` of `len` bytes from the sum of its word mixes.
fn zhash_of(sum: u64, len: u64) -> u32 {
    zhash_final(sum as u32, len.div_ceil(4) as u32)
}

/// The GPZ kernels loaded on one CUDA stream, with a reusable device workspace.
pub struct GpzGpu {
    stream: Arc<CudaStream>,
    funcs: crate::gpu::functions::Functions,
    ws: CudaSlice<u64>,
    /// Look-back status words `ws` holds after the control words.
    status_cap: usize,
    /// Blocks of the grid-stride kernels (8 per SM).
    grid: u32,
    name: String,
    /// Timing events after each step (`set_profile`).
    profile: super::step_timer::StepTimer,
}

impl std::fmt::Debug for GpzGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpzGpu")
            .field("device", &self.name)
            .finish()
    }
}

impl GpzGpu {
    /// Open device `ordinal` (its default stream) and compile or load the kernels.
    /// [`Error::Unavailable`] without a CUDA driver, device or NVRTC.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_stream(crate::gpu::util::default_stream(ordinal)?)
    }

    /// The kernels on `stream` (every operation is ordered on it).
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let (module, grid) = super::util::compile_and_load(&stream, Module::Gpz)?;
        let name = stream.context().name().map_err(gpu_err("device name"))?;
        let ws = stream
            .alloc_zeros::<u64>(CTRL + 1024)
            .map_err(gpu_err("alloc"))?;
        Ok(GpzGpu {
            stream,
            funcs: crate::gpu::functions::Functions::new(module, "gpz"),
            ws,
            status_cap: 1024,
            grid,
            name,
            profile: Default::default(),
        })
    }

    /// Record a timing event after every step of the next operations (benchmarks); read them
    /// with [`GpzGpu::take_profile`].
    pub fn set_profile(&mut self, on: bool) {
        self.profile.set(on);
    }

    /// The milliseconds of each step recorded since the last call (`set_profile`): (step, ms),
    /// each step timed from the event before it.
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

    /// Registers, local (spilled) bytes and static shared bytes of kernel `name`.
    pub fn kernel_resources(&mut self, name: &str) -> Result<(i32, i32, i32)> {
        super::resources(&self.func(name)?)
    }

    fn func(&mut self, name: &str) -> Result<CudaFunction> {
        self.funcs.get(name)
    }

    /// Grid of a grid-stride pass of kernel `name` over `items` particles: one wave of the
    /// blocks of 256 threads that fit on the device at once (no partial second wave).
    fn wave_grid(&mut self, name: &str, items: usize) -> Result<u32> {
        let f = self.func(name)?;
        let wave = super::util::resident_blocks(&f, 256, 0, self.grid / 8)?;
        Ok((items.div_ceil(256) as u64).clamp(1, wave as u64) as u32)
    }

    fn grid_for(&self, items: usize) -> u32 {
        (items.div_ceil(256) as u64).clamp(1, self.grid as u64) as u32
    }

    fn cfg(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Launch kernel `name` on `grid` blocks of `block` threads with the `u64` arguments `args`
    /// (in order), then record the profile event of `step`, which also names a launch error.
    ///
    /// # Safety
    /// What the kernel reads and writes through `args` must lie inside the buffers they point
    /// to; each caller says why it does.
    unsafe fn launch_u64(
        &mut self,
        name: &str,
        step: &'static str,
        (grid, block): (u32, u32),
        args: &[u64],
    ) -> Result<()> {
        let f = self.func(name)?;
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            b.arg(a);
        }
        // SAFETY: the caller's contract above.
        unsafe { b.launch(Self::cfg(grid, block)) }.map_err(gpu_err(step))?;
        self.mark(step)
    }

    /// Grow the workspace to `nstatus` status words and launch `gz_init`.
    fn init(&mut self, nstatus: usize) -> Result<u64> {
        if nstatus > self.status_cap {
            let cap = nstatus.next_power_of_two();
            self.ws = self
                .stream
                .alloc_zeros::<u64>(CTRL + cap)
                .map_err(gpu_err("alloc"))?;
            self.status_cap = cap;
        }
        let ws = raw_ptr_mut(&mut self.ws, &self.stream);
        let f = self.func("gz_init_k")?;
        let ns = nstatus as u64;
        let grid = self.grid_for(nstatus.max(CTRL));
        let mut b = self.stream.launch_builder(&f);
        b.arg(&ws).arg(&ns);
        // SAFETY: writes CTRL + nstatus words of the workspace, which holds that many.
        unsafe { b.launch(Self::cfg(grid, 256)) }.map_err(gpu_err("init"))?;
        Ok(ws)
    }

    fn read_ctrl(&mut self) -> Result<[u64; CTRL]> {
        let mut h = [0u64; CTRL];
        let ws = raw_ptr(&self.ws, &self.stream);
        // SAFETY: the workspace holds at least CTRL words; the stream is synchronized before
        // `h` is read.
        unsafe { cu::memcpy_dtoh_async(&mut h[..], ws, self.stream.cu_stream()) }
            .map_err(gpu_err("read ctrl"))?;
        self.stream.synchronize().map_err(gpu_err("sync"))?;
        Ok(h)
    }

    fn write_bytes(&self, dst: u64, bytes: &[u8]) -> Result<()> {
        // SAFETY: the callers pass a destination of at least `bytes.len()` bytes; the copy from
        // pageable memory is staged before the call returns.
        unsafe { cu::memcpy_htod_async(dst, bytes, self.stream.cu_stream()) }
            .map_err(gpu_err("write"))?;
        self.stream.synchronize().map_err(gpu_err("sync"))
    }

    fn hash(&mut self, out: u64, hdr: u64, nb: u64, data_len: u64, raw: u64) -> Result<()> {
        let ws = raw_ptr_mut(&mut self.ws, &self.stream);
        let f = self.func("gz_hash_k")?;
        let items = (nb as usize).max(data_len.min(raw) as usize / 4);
        let grid = self.grid_for(items);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&out)
            .arg(&hdr)
            .arg(&nb)
            .arg(&data_len)
            .arg(&raw)
            .arg(&ws);
        let cfg = LaunchConfig {
            grid_dim: (grid, 2, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads the table (2 nb bytes) and the data bytes after `hdr` of `out`, which
        // the callers allocated.
        unsafe { b.launch(cfg) }.map_err(gpu_err("hash"))?;
        Ok(())
    }

    /// The largest stream of `n` particles of `d` coordinates of `T` ([`compress_device`]'s
    /// output must hold this many bytes).
    ///
    /// [`compress_device`]: GpzGpu::compress_device
    pub fn compress_bound<T: GpuElement>(n: usize, d: usize) -> usize {
        crate::codec::gpz::compress_bound(n, d, T::DTYPE)
    }

    /// Compress the `N × d` particles of `input` (AoS) into `out` (at least
    /// [`GpzGpu::compress_bound`] bytes); returns the stream's length. The bytes are those of
    /// [`compress_particles`] on the same values.
    ///
    /// Errors: those of [`compress_particles`] ([`Error::InvalidArgument`]), an output too small,
    /// [`Error::Gpu`].
    pub fn compress_device<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        d: usize,
        bound: ErrorBound,
        order: Order,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<usize> {
        self.encode(input, d, bound, order, out, None)
    }

    /// [`GpzGpu::compress_device`] in [`Order::Reorder`], also writing the permutation:
    /// `perm[i]` is the original index of the stream's particle `i` (exactly the permutation
    /// [`compress_particles`] returns), so that other per-particle arrays (velocities, ids) can
    /// be permuted to match the decompressed particles. `perm` must hold one value per particle.
    ///
    /// Errors: those of [`GpzGpu::compress_device`], and a `perm` of another length.
    pub fn compress_device_reorder<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        d: usize,
        bound: ErrorBound,
        out: &mut CudaViewMut<'_, u8>,
        perm: &mut CudaViewMut<'_, u64>,
    ) -> Result<usize> {
        let n = particle_count(input.len(), d)?;
        if perm.len() != n {
            return Err(Error::invalid(format!(
                "gpz permutation of {} values for {n} particles",
                perm.len()
            )));
        }
        self.encode(input, d, bound, Order::Reorder, out, Some(perm))
    }

    /// The kernels of one encoding (range, parameters, code range unless `spec`, blocks,
    /// hashes) and the read back of the control words.
    #[allow(clippy::too_many_arguments)]
    fn encode_passes<T: GpuElement>(
        &mut self,
        x: u64,
        n: usize,
        d: usize,
        bound: ErrorBound,
        order: Order,
        outp: u64,
        permp: u64,
        needs_range: bool,
        spec: bool,
    ) -> Result<[u64; CTRL]> {
        let hl = header_len(d);
        let raw = (n * d * T::SIZE) as u64;
        let cap = Self::compress_bound::<T>(n, d);
        let nb = n.div_ceil(32);
        let nchunks = nb.div_ceil(WARPS * ENC_BPW);
        self.mark("start")?;
        // one look-back status word per chunk of the encoder
        let ws = self.init(nchunks)?;
        self.mark("init")?;
        let (t, n64, d64) = (T::KERNEL_TAG, n as u64, d as u64);
        let noa = matches!(bound, ErrorBound::Noa(_));
        if needs_range {
            let name = format!("gz_range_{t}_d{d}");
            let grid = self.wave_grid(&name, n)?;
            // SAFETY: reads n * d values of the input, writes control words.
            unsafe { self.launch_u64(&name, "range", (grid, 256), &[x, n64, ws]) }?;
        }
        {
            let f = self.func(&format!("gz_params_{t}"))?;
            let (noa_i, e, spec_i) = (noa as i32, bound.value(), spec as i32);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&x)
                .arg(&d64)
                .arg(&noa_i)
                .arg(&e)
                .arg(&spec_i)
                .arg(&ws);
            // SAFETY: one thread reads control words and at most d values of the input.
            unsafe { b.launch(Self::cfg(1, 32)) }.map_err(gpu_err("params"))?;
            self.mark("params")?;
        }
        if !spec {
            let name = format!("gz_codes_{t}_d{d}");
            let grid = self.wave_grid(&name, n)?;
            // SAFETY: reads n * d values of the input, writes control words.
            unsafe { self.launch_u64(&name, "codes", (grid, 256), &[x, n64, ws]) }?;
        }
        {
            let o = if order == Order::Preserve { "p" } else { "r" };
            let name = format!("gz_encode_{t}_d{d}_{o}");
            let (hl64, cap64) = (hl as u64, cap as u64);
            let warp_chunks = (nchunks as u32, (WARPS * 32) as u32);
            // the permutation's address goes last, to the reorder kernels only
            let args = [x, n64, ws, outp, hl64, cap64, permp];
            let args = if order == Order::Reorder {
                &args[..]
            } else {
                &args[..6]
            };
            // SAFETY: reads n * d values, writes below `cap` bytes of `out` (the caller checked
            // its length), the workspace (CTRL + nb words, grown by `init`) and, when given,
            // the n values of `perm`.
            unsafe { self.launch_u64(&name, "encode", warp_chunks, args) }?;
        }
        self.hash(outp, hl as u64, nb as u64, u64::MAX, raw)?;
        self.mark("hash")?;
        self.read_ctrl()
    }

    fn encode<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, T>,
        d: usize,
        bound: ErrorBound,
        order: Order,
        out: &mut CudaViewMut<'_, u8>,
        perm: Option<&mut CudaViewMut<'_, u64>>,
    ) -> Result<usize> {
        let n = particle_count(input.len(), d)?;
        bound.validate()?;
        if matches!(bound, ErrorBound::Rel(_)) {
            return Err(Error::invalid(format!(
                "gpz supports abs and noa bounds, not {bound}"
            )));
        }
        let hl = header_len(d);
        let raw = (input.len() * T::SIZE) as u64;
        let cap = Self::compress_bound::<T>(n, d);
        if out.len() < cap {
            return Err(Error::invalid(format!(
                "gpz output of {} bytes is smaller than the bound {cap}",
                out.len()
            )));
        }
        self.stream
            .context()
            .bind_to_thread()
            .map_err(gpu_err("bind"))?;
        let outp = raw_ptr_mut(out, &self.stream);
        // 0: the encoder writes no permutation
        let permp = perm.map_or(0, |p| raw_ptr_mut(p, &self.stream));
        if n == 0 {
            // nothing to run: the CPU writes the header-only stored stream
            let (s, _) = compress_particles::<T>(&[], d, bound, order)?;
            self.write_bytes(outp, &s)?;
            return Ok(s.len());
        }
        let x = raw_ptr(input, &self.stream);
        let nb = n.div_ceil(32);
        let noa = matches!(bound, ErrorBound::Noa(_));
        // noa needs each axis's range; an abs step that degenerates, its first non-zero value
        let needs_range = match bound {
            ErrorBound::Abs(eb) => QuantParams::derive_abs::<T>(eb)?.is_none(),
            _ => noa,
        };
        // With the ranges at hand the frame is predicted from them and checked by the encoder
        // (no pass over the codes); a failed prediction (an end of an axis's range that is an
        // exception, or that no non-exception particle's code reaches) encodes again after
        // gz_codes.
        let mut spec = needs_range;
        let c = loop {
            let c =
                self.encode_passes::<T>(x, n, d, bound, order, outp, permp, needs_range, spec)?;
            let reached = ((1u64 << d) - 1) * 17;
            if !spec || (c[W_SPEC] == SPEC_ON && c[W_SPECHIT] == reached) {
                break c;
            }
            spec = false;
        };
        let f64_at = |i: usize| f64::from_bits(c[i]);
        let any = (c[W_CMIN] as i64) <= (c[W_CMAX] as i64);
        let axes: Vec<AxisRecord> = (0..d)
            .map(|a| {
                let (lo, hi) = (c[W_CMIN + a] as i64, c[W_CMAX + a] as i64);
                AxisRecord {
                    abs_bound: f64_at(W_AXIS + 4 * a),
                    step: f64_at(W_AXIS + 4 * a + 1),
                    range: (f64_at(W_AXIS + 4 * a + 2), f64_at(W_AXIS + 4 * a + 3)),
                    base: if any { lo } else { 0 },
                    base_width: if any {
                        64 - (hi.wrapping_sub(lo) as u64).leading_zeros()
                    } else {
                        0
                    },
                }
            })
            .collect();
        let table = 2 * nb as u64;
        let total = c[W_TOTAL];
        let mut header = GpzHeader::compressed(T::DTYPE, (n, d), bound, order, axes);
        if table + total < raw {
            header.payload_len = table + total;
            header.table_checksum = zhash_of(c[W_HASH], table);
            header.data_checksum = zhash_of(c[W_HASH + 1], total);
        } else {
            // stored: the values verbatim after the header
            header.stored = true;
            header.payload_len = raw;
            // SAFETY: `out` holds hl + raw bytes (checked above), the input raw bytes.
            unsafe {
                cu::memcpy_dtod_async(outp + hl as u64, x, raw as usize, self.stream.cu_stream())
            }
            .map_err(gpu_err("stored copy"))?;
            self.hash(outp, hl as u64, 0, raw, raw)?;
            let c2 = self.read_ctrl()?;
            header.data_checksum = zhash_of(c2[W_HASH + 1], raw);
            if permp != 0 {
                // the stored particles keep their order
                let f = self.func("gz_iota_k")?;
                let grid = self.wave_grid("gz_iota_k", n)?;
                let mut b = self.stream.launch_builder(&f);
                let n64 = n as u64;
                b.arg(&permp).arg(&n64);
                // SAFETY: writes the n values of `perm` (its length checked by the caller).
                unsafe { b.launch(Self::cfg(grid, 256)) }.map_err(gpu_err("iota"))?;
            }
        }
        self.write_bytes(outp, &header.to_bytes())?;
        Ok(hl + header.payload_len as usize)
    }

    /// Decompress the GPZ stream `input` (all of it) into `out`, which must hold exactly its
    /// `N × d` values of `T`; returns the stream's header. Corrupt streams give
    /// [`Error::Corrupt`] (exactly those the CPU decoder rejects; `out` is then unspecified).
    pub fn decompress_device<T: GpuElement>(
        &mut self,
        input: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<GpzHeader> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(gpu_err("bind"))?;
        let len = input.len();
        let inp = raw_ptr(input, &self.stream);
        let mut head = vec![0u8; len.min(MAX_HEADER)];
        if !head.is_empty() {
            // SAFETY: `head` is at most the stream's length; synchronized below.
            unsafe { cu::memcpy_dtoh_async(&mut head[..], inp, self.stream.cu_stream()) }
                .map_err(gpu_err("read header"))?;
            self.stream.synchronize().map_err(gpu_err("sync"))?;
        }
        let h = GpzHeader::parse_with_len(&head, len)?;
        crate::codec::check_dtype::<T>(h.dtype)?;
        let values = h.check_limits(&DecodeLimits::default())?;
        if out.len() != values {
            return Err(Error::invalid(format!(
                "gpz stream holds {values} values, the output {}",
                out.len()
            )));
        }
        let d = h.d;
        let hl = header_len(d) as u64;
        let payload = len as u64 - hl;
        let outp = raw_ptr_mut(out, &self.stream);
        if h.stored {
            let raw = (values * T::SIZE) as u64;
            if payload != raw {
                return Err(Error::corrupt(format!(
                    "gpz stored stream holds {payload} bytes for {values} values"
                )));
            }
            self.init(0)?;
            self.hash(inp, hl, 0, raw, raw)?;
            if raw > 0 {
                // SAFETY: both buffers hold `raw` bytes there.
                unsafe {
                    cu::memcpy_dtod_async(outp, inp + hl, raw as usize, self.stream.cu_stream())
                }
                .map_err(gpu_err("stored copy"))?;
            }
            let c = self.read_ctrl()?;
            if zhash_of(c[W_HASH + 1], raw) != h.data_checksum {
                return Err(Error::corrupt("gpz stored data checksum mismatch"));
            }
            return Ok(h);
        }
        let nb = h.n_blocks() as usize;
        let table = 2 * nb as u64;
        if table > payload {
            return Err(Error::corrupt(
                "gpz stream truncated inside its block table",
            ));
        }
        let data_len = payload - table;
        let ngroups = nb.div_ceil(DEC_GROUP);
        let nchunks = ngroups.div_ceil(DEC_WARPS);
        self.mark("start")?;
        // a look-back status word per group of the decoder
        let ws = self.init(ngroups)?;
        self.mark("init")?;
        // the stream's parameters into the control words the decoder reads
        let mut words = [0u64; W_AXIS + 16 - W_CMIN];
        for (c, a) in h.axes.iter().enumerate() {
            words[c] = a.base as u64;
            words[W_CMAX - W_CMIN + c] = a.base_width as u64;
            let w = W_AXIS - W_CMIN + 4 * c;
            words[w] = a.abs_bound.to_bits();
            words[w + 1] = a.step.to_bits();
            words[w + 2] = a.range.0.to_bits();
            words[w + 3] = a.range.1.to_bits();
        }
        // SAFETY: the workspace holds CTRL words; the pageable copy is staged before return.
        unsafe {
            cu::memcpy_htod_async(
                ws + (W_CMIN * 8) as u64,
                &words[..],
                self.stream.cu_stream(),
            )
        }
        .map_err(gpu_err("write params"))?;
        self.mark("params")?;
        if nchunks > 0 {
            let o = if h.order == Order::Preserve { "p" } else { "r" };
            let name = format!("gz_decode_{}_d{d}_{o}", T::KERNEL_TAG);
            let warp_chunks = (nchunks as u32, (DEC_WARPS * 32) as u32);
            let args = [inp, hl, data_len, h.n, ws, outp];
            // SAFETY: reads the stream's `len` bytes (the table inside it: checked above; block
            // reads are checked against data_len), writes the n * d values of `out` and
            // `ngroups` look-back words of the workspace (grown by `init`).
            unsafe { self.launch_u64(&name, "decode", warp_chunks, &args) }?;
        }
        // (the decoder took the checksums' sums)
        let c = self.read_ctrl()?;
        if zhash_of(c[W_HASH], table) != h.table_checksum {
            return Err(Error::corrupt("gpz block table checksum mismatch"));
        }
        if nb == 0 && data_len != 0 {
            return Err(Error::corrupt(format!(
                "gpz blocks sum to 0 bytes but {data_len} follow the table"
            )));
        }
        let err = c[W_ERR];
        if err & 1 != 0 {
            return Err(Error::corrupt("gpz block of size 0 or past the data"));
        }
        if err & 4 != 0 {
            return Err(Error::corrupt(
                "gpz block sizes do not sum to the data length",
            ));
        }
        if zhash_of(c[W_HASH + 1], data_len) != h.data_checksum {
            return Err(Error::corrupt("gpz block data checksum mismatch"));
        }
        if err != 0 {
            return Err(Error::corrupt("gpz block does not decode"));
        }
        Ok(h)
    }

    /// [`GpzGpu::compress_device`] of host particles (copied to the device and back).
    pub fn compress<T: GpuElement>(
        &mut self,
        coords: &[T],
        d: usize,
        bound: ErrorBound,
        order: Order,
    ) -> Result<Vec<u8>> {
        self.compress_host(coords, d, bound, order, false)
            .map(|r| r.0)
    }

    /// [`compress_particles`] on the GPU: the stream (the same bytes) and, for
    /// [`Order::Reorder`], the permutation (`perm[i]` is the original index of the stream's
    /// particle `i`), from host particles copied to the device and back.
    pub fn compress_particles<T: GpuElement>(
        &mut self,
        coords: &[T],
        d: usize,
        bound: ErrorBound,
        order: Order,
    ) -> Result<(Vec<u8>, Option<Vec<u64>>)> {
        self.compress_host(coords, d, bound, order, order == Order::Reorder)
    }

    /// The host-memory compression of [`compress`](Self::compress) and
    /// [`compress_particles`](Self::compress_particles): the permutation written by the encoder
    /// and copied back only `with_perm`.
    fn compress_host<T: GpuElement>(
        &mut self,
        coords: &[T],
        d: usize,
        bound: ErrorBound,
        order: Order,
        with_perm: bool,
    ) -> Result<(Vec<u8>, Option<Vec<u64>>)> {
        if !(1..=4).contains(&d) || coords.len() % d != 0 {
            // the CPU's argument errors
            return compress_particles(coords, d, bound, order);
        }
        let n = coords.len() / d;
        let s = self.stream.clone();
        // (an empty input still needs a device allocation to point at)
        let x = if coords.is_empty() {
            s.alloc_zeros::<T>(1).map_err(gpu_err("alloc"))?
        } else {
            s.clone_htod(coords).map_err(gpu_err("htod"))?
        };
        let cap = Self::compress_bound::<T>(n, d);
        let mut out = s.alloc_zeros::<u8>(cap).map_err(gpu_err("alloc"))?;
        let mut perm = match with_perm {
            true => Some(s.alloc_zeros::<u64>(n.max(1)).map_err(gpu_err("alloc"))?),
            false => None,
        };
        let mut perm_view = perm.as_mut().map(|p| p.slice_mut(0..n));
        let len = self.encode(
            &x.slice(0..coords.len()),
            d,
            bound,
            order,
            &mut out.slice_mut(..),
            perm_view.as_mut(),
        )?;
        let mut v = vec![0u8; len];
        s.memcpy_dtoh(&out.slice(0..len), &mut v[..])
            .map_err(gpu_err("dtoh"))?;
        let p = match &perm {
            Some(dev) => {
                let mut host = vec![0u64; n];
                if n > 0 {
                    s.memcpy_dtoh(&dev.slice(0..n), &mut host[..])
                        .map_err(gpu_err("dtoh"))?;
                }
                Some(host)
            }
            None => None,
        };
        s.synchronize().map_err(gpu_err("sync"))?;
        Ok((v, p))
    }

    /// [`GpzGpu::decompress_device`] of a host stream: the `N * d` values (AoS) and `d`.
    pub fn decompress<T: GpuElement>(&mut self, stream: &[u8]) -> Result<(Vec<T>, usize)> {
        let h = GpzHeader::parse(stream)?;
        crate::codec::check_dtype::<T>(h.dtype)?;
        let values = h.check_limits(&DecodeLimits::default())?;
        let s = self.stream.clone();
        let inp = s.clone_htod(stream).map_err(gpu_err("htod"))?;
        let mut out = s
            .alloc_zeros::<T>(values.max(1))
            .map_err(gpu_err("alloc"))?;
        self.decompress_device(&inp.slice(..), &mut out.slice_mut(0..values))?;
        let mut v = vec![T::default(); values];
        if values > 0 {
            s.memcpy_dtoh(&out.slice(0..values), &mut v[..])
                .map_err(gpu_err("dtoh"))?;
        }
        s.synchronize().map_err(gpu_err("sync"))?;
        Ok((v, h.d))
    }
}

/// Whether `mode` is one GPZ accepts (for callers that pick a codec).
pub fn supports(mode: BoundMode) -> bool {
    matches!(mode, BoundMode::Abs | BoundMode::Noa)
}

/// NVRTC compile of [`Module::Gpz`] for `arch` (uncached), for tests on machines without a GPU.
pub fn compile_check(arch: &str) -> Result<Vec<u8>> {
    compile::compile_cubin_with(&Module::Gpz.source(), arch, &Module::Gpz.defines())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn define(name: &str) -> u64 {
        let text = compile::kernel_file("gpz.cu").expect("gpz.cu");
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if it.next() == Some("#define") && it.next() == Some(name) {
                return it.next().and_then(|v| v.parse().ok()).expect(name);
            }
        }
        panic!("gpz.cu does not define {name}")
    }

    #[test]
    fn gpz_constants_shared_with_the_kernels_agree() {
        for (name, v) in crate::codec::gpz::kernel_constants() {
            assert_eq!(define(name), v, "{name}");
        }
        let pairs = [
            ("GZ_W_RMIN", W_RMIN),
            ("GZ_W_RMAX", W_RMAX),
            ("GZ_W_FNZ", W_FNZ),
            ("GZ_W_CMIN", W_CMIN),
            ("GZ_W_CMAX", W_CMAX),
            ("GZ_W_AXIS", W_AXIS),
            ("GZ_W_HASH", W_HASH),
            ("GZ_W_TOTAL", W_TOTAL),
            ("GZ_W_ERR", W_ERR),
            ("GZ_W_TICKET", W_TICKET),
            ("GZ_W_SPEC", W_SPEC),
            ("GZ_W_SPECHIT", W_SPECHIT),
            ("GZ_SPEC_ON", SPEC_ON as usize),
            ("GZ_SPEC_OUT", SPEC_OUT as usize),
            ("GZ_CTRL", CTRL),
            ("GZ_WARPS", WARPS),
            ("GZ_DEC_GROUP", DEC_GROUP),
            ("GZ_DEC_WARPS", DEC_WARPS),
            ("GZ_ENC_BPW", ENC_BPW),
        ];
        for (name, v) in pairs {
            assert_eq!(define(name), v as u64, "{name}");
        }
        assert_eq!(MAX_HEADER, header_len(4));
    }
}
