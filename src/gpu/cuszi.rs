//! The `cuszi` decoder on a CUDA device (`kernels/cuszi.cu`): decodes the streams of the CPU
//! encoder ([`crate::compress_nd`] with [`CodecKind::Cuszi`](crate::CodecKind::Cuszi)) to the
//! bits of [`crate::decompress`], and rejects the corrupt streams it rejects.
//!
//! Decompression of a device-resident stream follows the block-parallel map of
//! `src/codec/cuszi/mod.rs`:
//!
//! 1. the host reads the header, the chunk table and the metadata (a few kilobytes), checks them
//!    with the CPU decoder's own parsers (header fields, table checksum, chunk sizes, predictor
//!    configuration, rANS tables) and uploads the geometry, the class pattern and the decoder
//!    tables;
//! 2. `cz_rans_*`: one thread per chunk of 32,768 residuals checks the chunk's `zhash`, decodes
//!    its rANS stream (the class of each residual follows from its position in its tile), its
//!    lossless values and big residuals, and checks every byte as the CPU does;
//! 3. `cz_anchors_*` (three launches, one per dimension): the anchors' Lorenzo inverse as an
//!    n-D prefix sum in wrapping integers, and their values;
//! 4. `cz_tiles_*`: one warp per tile reconstructs its box level by level in shared memory
//!    (IEEE f64, no FMA) and writes its owned points straight to the array;
//! 5. one read back of the error words.
//!
//! Streams this decoder has no kernels for are decoded by the CPU twin on a host copy (and the
//! values copied back): stored streams, rel-bound streams, and streams of the first version 3
//! encoder (coder 0, Huffman). The encoder is the CPU's ([`crate::compress_nd`]).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{
    result as cu, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView,
    CudaViewMut, LaunchConfig, PushKernelArg,
};

use super::compile::{self, Module};
use super::{raw_ptr, raw_ptr_mut, GpuElement};
use crate::codec::cuszi::grid::Grid;
use crate::codec::cuszi::interp::{self, Walk};
use crate::codec::cuszi::{read_meta, Coder, CHUNK};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::format::{
    u16_at, u32_at, zhash_bytes, BoundMode, Header, HEADER_LEN, HEADER_LEN_V3, TABLE_ENTRY_LEN,
    VERSION_SHAPED,
};

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
/// Words per walk (kernels/cuszi.cu `CZ_WALK_WORDS`).
const WALK_WORDS: usize = 12;
/// Tiles (warps) per block of `cz_tiles_*` (kernels/cuszi.cu `CZ_TILE_WARPS`).
const TILE_WARPS: usize = 4;
/// Slots per rANS table (rans.rs `PROB_SCALE`).
const SLOTS: usize = 1 << 14;
/// Symbols per rANS table (rans.rs `NSYM`).
const SYMBOLS: usize = 1025;
/// Threads per block of `cz_rans_*` (each decodes one chunk; a block stages the tables).
const RANS_THREADS: usize = 32;

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
    for t in ["f32", "f64"] {
        for k in ["cz_rans", "cz_anchors", "cz_tiles"] {
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
}

/// The `cuszi` decoder kernels loaded on one CUDA stream.
pub struct CusziGpu {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    funcs: HashMap<String, CudaFunction>,
    name: String,
    ws: Option<Workspace>,
    /// Bytes of dynamic shared memory a block may opt in to.
    smem_optin: usize,
    /// Timing events after each step (`set_profile`), labelled by the step they end.
    profile: Option<Vec<(&'static str, cudarc::driver::CudaEvent)>>,
}

impl std::fmt::Debug for CusziGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CusziGpu")
            .field("device", &self.name)
            .finish()
    }
}

/// What the host learned from a stream's header, table and metadata, ready to launch.
struct Plan {
    g: Grid,
    /// Geometry and walk words.
    geo: Vec<i64>,
    /// Class of every local position of a whole tile.
    pattern: Vec<u8>,
    /// Class-to-table map.
    map: Vec<u8>,
    /// Per table: the symbol of every slot.
    sym: Vec<u16>,
    /// Per table and symbol: `freq << 16 | cum`.
    fc: Vec<u32>,
    /// Per chunk: offset, then size | checksum << 32.
    ent: Vec<u64>,
    /// The quantization step.
    qstep: f64,
}

impl CusziGpu {
    /// Open device `ordinal` (its default stream) and compile or load the kernels.
    /// [`Error::Unavailable`] without a CUDA driver, device or NVRTC.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !super::device_available() {
            return Err(Error::Unavailable("no CUDA device".into()));
        }
        let ctx = CudaContext::new(ordinal).map_err(gpu_err("context"))?;
        Self::with_stream(ctx.default_stream())
    }

    /// The kernels on `stream` (every operation is ordered on it).
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let (module, _) = super::util::compile_and_load(&stream, Module::Cuszi)?;
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
            module,
            funcs: HashMap::new(),
            name,
            ws: None,
            smem_optin,
            profile: None,
        })
    }

    /// Record a timing event after every step of the next operations (benchmarks); read them
    /// with [`CusziGpu::take_profile`].
    pub fn set_profile(&mut self, on: bool) {
        self.profile = on.then(Vec::new);
    }

    /// The milliseconds of each step recorded since the last call (`set_profile`): (step, ms),
    /// each step timed from the event before it (`setup`: from the call's start: the host's
    /// reading and checking of the header, table and metadata, and the uploads).
    pub fn take_profile(&mut self) -> Result<Vec<(&'static str, f32)>> {
        let Some(v) = self.profile.as_mut() else {
            return Ok(Vec::new());
        };
        let ev = std::mem::take(v);
        let mut out = Vec::new();
        for w in ev.windows(2) {
            if w[1].0 == "start" {
                continue;
            }
            out.push((
                w[1].0,
                w[0].1.elapsed_ms(&w[1].1).map_err(gpu_err("event"))?,
            ));
        }
        Ok(out)
    }

    fn mark(&mut self, step: &'static str) -> Result<()> {
        if let Some(v) = self.profile.as_mut() {
            let e = self
                .stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(gpu_err("event"))?;
            v.push((step, e));
        }
        Ok(())
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
        if let Some(f) = self.funcs.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module
            .load_function(name)
            .map_err(|e| Error::Gpu(format!("cuszi kernel {name}: {e:?}")))?;
        self.funcs.insert(name.to_string(), f.clone());
        Ok(f)
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
        let mut head = vec![0u8; len.min(HEADER_LEN_V3)];
        self.read(sp, &mut head)?;
        if head.len() < HEADER_LEN
            || u16_at(&head, 4) != VERSION_SHAPED
            || head.len() < HEADER_LEN_V3
        {
            return self.on_host(stream, out);
        }
        let b: &[u8; HEADER_LEN_V3] = head[..].try_into().expect("header length");
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
        self.read(sp + hl as u64, &mut table)?;
        if zhash_bytes(&table) != h.payload_checksum {
            return Err(Error::corrupt("chunk table checksum mismatch"));
        }
        let Some(plan) = plan::<T>(&h, &table, len)? else {
            return self.on_host(stream, out);
        };
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
        self.ws = Some(Workspace { n, res, raw, bigs });
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
        let geo = self.upload(&p.geo)?;
        let pattern = self.upload(&p.pattern)?;
        let map = self.upload(&p.map)?;
        let slot = self.upload(&p.sym)?;
        let step = self.upload(&p.fc)?;
        let ent = self.upload(&p.ent)?;
        let n_tiles = p.g.n_tiles();
        let mut acc = self
            .stream
            .alloc_zeros::<i64>(n_tiles.max(1))
            .map_err(gpu_err("alloc"))?;
        let mut vals = self
            .stream
            .alloc_zeros::<f64>(n_tiles.max(1))
            .map_err(gpu_err("alloc"))?;
        let mut err = self
            .stream
            .clone_htod(&[0u64, u64::MAX])
            .map_err(gpu_err("alloc"))?;
        let s = self.stream.clone();
        let ws = self.ws.as_mut().expect("workspace");
        let (geop, patp, mapp) = (raw_ptr(&geo, &s), raw_ptr(&pattern, &s), raw_ptr(&map, &s));
        let (slotp, stepp, entp) = (raw_ptr(&slot, &s), raw_ptr(&step, &s), raw_ptr(&ent, &s));
        let resp = raw_ptr_mut(&mut ws.res, &s);
        let rawp = raw_ptr_mut(&mut ws.raw, &s);
        let bigp = raw_ptr_mut(&mut ws.bigs, &s);
        let accp = raw_ptr_mut(&mut acc, &s);
        let valp = raw_ptr_mut(&mut vals, &s);
        let errp = raw_ptr_mut(&mut err, &s);
        let outp = raw_ptr_mut(out, &s);
        let nchunks = (p.ent.len() / 2) as u64;
        let cfg = |items: usize, block: usize| LaunchConfig {
            grid_dim: (items.div_ceil(block).max(1) as u32, 1, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        self.mark("setup")?;
        {
            let f = self.func(&format!("cz_rans_{t}"))?;
            let ntab = (p.fc.len() / SYMBOLS) as u32;
            let want = (p.fc.len() * 4 + p.sym.len() * 2 + p.pattern.len()).next_multiple_of(16);
            let smem = if want <= self.smem_optin {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    want as i32,
                )
                .map_err(gpu_err("smem attribute"))?;
                want as u32
            } else {
                0
            };
            let mut b = s.launch_builder(&f);
            b.arg(&sp)
                .arg(&geop)
                .arg(&entp)
                .arg(&nchunks)
                .arg(&patp)
                .arg(&mapp)
                .arg(&slotp)
                .arg(&stepp)
                .arg(&ntab)
                .arg(&smem)
                .arg(&resp)
                .arg(&rawp)
                .arg(&bigp)
                .arg(&errp);
            // SAFETY: the chunk entries lie inside the stream (checked by `plan`); each thread
            // writes its chunk's residuals, lossless bytes and big positions, below `n` values
            // of the workspace; the tables hold `SLOTS` entries per table the map names.
            let c = LaunchConfig {
                shared_mem_bytes: smem,
                ..cfg(nchunks as usize, RANS_THREADS)
            };
            unsafe { b.launch(c) }.map_err(gpu_err("rans"))?;
        }
        self.mark("rans")?;
        for (dim, first, last) in [(2i32, 1i32, 0i32), (1, 0, 0), (0, 0, 1)] {
            let lines = n_tiles / p.g.tiles[dim as usize].max(1);
            let f = self.func(&format!("cz_anchors_{t}"))?;
            let mut b = s.launch_builder(&f);
            b.arg(&geop)
                .arg(&resp)
                .arg(&accp)
                .arg(&valp)
                .arg(&dim)
                .arg(&first)
                .arg(&last)
                .arg(&p.qstep);
            // SAFETY: one thread per line of tiles reads residuals at tile offsets (below n) and
            // writes the n_tiles words of `acc` and `vals`.
            unsafe { b.launch(cfg(lines, 128)) }.map_err(gpu_err("anchors"))?;
        }
        self.mark("anchors")?;
        {
            let f = self.func(&format!("cz_tiles_{t}"))?;
            let mut b = s.launch_builder(&f);
            b.arg(&geop)
                .arg(&resp)
                .arg(&rawp)
                .arg(&accp)
                .arg(&valp)
                .arg(&p.qstep)
                .arg(&outp);
            // SAFETY: one warp per tile reads residuals and lossless bytes at symbol indices of
            // its box (below n) and writes its owned points of `out` (n values).
            unsafe { b.launch(cfg(n_tiles * 32, TILE_WARPS * 32)) }.map_err(gpu_err("tiles"))?;
        }
        self.mark("tiles")?;
        let mut e = [0u64; 2];
        s.memcpy_dtoh(&err, &mut e[..]).map_err(gpu_err("dtoh"))?;
        s.synchronize().map_err(gpu_err("sync"))?;
        if e[0] != 0 {
            let what = ERRORS
                .iter()
                .find(|(bit, _)| e[0] & bit != 0)
                .map_or("invalid chunk", |(_, w)| *w);
            return Err(Error::corrupt(format!("chunk {}: {what}", e[1])));
        }
        Ok(())
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

/// The launch plan of a compressed abs/noa `cuszi` stream of `len` bytes with header `h` and
/// chunk table plus metadata `table` (checksum verified): every check of the CPU decoder that
/// needs no chunk bytes. `None` for a stream of coder 0 (no kernels).
fn plan<T: GpuElement>(h: &Header, table: &[u8], len: usize) -> Result<Option<Plan>> {
    let dims = h
        .dims
        .ok_or_else(|| Error::corrupt("cuszi stream without a shape"))?;
    let count = h.count as usize;
    if dims.count() != h.count {
        return Err(Error::corrupt("shape does not match the value count"));
    }
    let nc = h.n_chunks as usize;
    if nc != count.div_ceil(CHUNK) {
        return Err(Error::corrupt("chunk count does not match the value count"));
    }
    let mut ent = Vec::with_capacity(2 * nc);
    let mut off = (h.header_len() + h.table_len()) as u64;
    for i in 0..nc {
        let size = u32_at(table, i * TABLE_ENTRY_LEN);
        let sum = u32_at(table, i * TABLE_ENTRY_LEN + 4);
        if size % 4 != 0 {
            return Err(Error::corrupt(format!(
                "chunk {i} size {size} not a multiple of 4"
            )));
        }
        ent.push(off);
        ent.push(size as u64 | (sum as u64) << 32);
        off += size as u64;
    }
    if off != len as u64 {
        return Err(Error::corrupt(
            "chunk sizes do not add up to the payload length",
        ));
    }
    let g = Grid::new(&dims);
    let (levels, coder) = read_meta(&table[nc * TABLE_ENTRY_LEN..], &g)?;
    let (map, tables) = match coder {
        Coder::Rans(map, tables) => (map, tables),
        Coder::Huffman(_) => return Ok(None),
    };
    // per table: the symbol of every slot, and per symbol `freq << 16 | cum`
    let mut sym = Vec::with_capacity(tables.len() * SLOTS);
    let mut fc = vec![0u32; tables.len() * SYMBOLS];
    for (i, t) in tables.iter().enumerate() {
        let (slots, steps) = t.decoder_arrays();
        sym.extend_from_slice(slots);
        for (sl, (&s, &st)) in slots.iter().zip(steps).enumerate() {
            fc[i * SYMBOLS + s as usize] = (st >> 16) << 16 | (sl as u32 - (st & 0xFFFF));
        }
    }
    let walks = interp::walks(g.stride, &levels);
    let mut geo = vec![0i64; G_WALKS + WALK_WORDS * walks.len()];
    geo[G_BATCH] = g.batch as i64;
    for d in 0..3 {
        geo[G_N + d] = g.n[d] as i64;
        geo[G_TILES + d] = g.tiles[d] as i64;
    }
    geo[G_S] = g.stride as i64;
    geo[G_NTILES] = g.n_tiles() as i64;
    geo[G_VOL] = g.volume() as i64;
    geo[G_COUNT] = count as i64;
    geo[G_NWALKS] = walks.len() as i64;
    let full = g.owned([0; 3]);
    for d in 0..3 {
        geo[G_FULL + d] = full[d] as i64;
    }
    for (w, (s, start, stp, walk)) in walks.iter().enumerate() {
        let at = G_WALKS + WALK_WORDS * w;
        let (multi, am, sp) = match *walk {
            Walk::Pass(a, sp) => (0, a, [sp; 3]),
            Walk::Multi(mask, sp) => (1, mask, sp),
        };
        let words = [
            *s as i64,
            start[0] as i64,
            start[1] as i64,
            start[2] as i64,
            stp[0] as i64,
            stp[1] as i64,
            stp[2] as i64,
            multi,
            am as i64,
            sp[0] as i64,
            sp[1] as i64,
            sp[2] as i64,
        ];
        geo[at..at + WALK_WORDS].copy_from_slice(&words);
    }
    let log2s = g.stride.trailing_zeros();
    let mut pattern = Vec::with_capacity(full.iter().product());
    for l0 in 0..full[0] {
        for l1 in 0..full[1] {
            for l2 in 0..full[2] {
                pattern.push(interp::point_class([l0, l1, l2], log2s, &levels));
            }
        }
    }
    let _ = T::SIZE;
    Ok(Some(Plan {
        g,
        geo,
        pattern,
        map,
        sym,
        fc,
        ent,
        qstep: h.step,
    }))
}
