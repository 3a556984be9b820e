//! The decoding half of [`GpuCodec`]: header checks on the host or the device, the launch of
//! the decompression kernels (blocked codecs and pfpl), their error words, and the speculative
//! launch that does not wait for the header.

use std::ffi::c_void;

use cudarc::driver::{sys as cu_sys, CudaFunction, CudaView, CudaViewMut};

use super::*;

impl GpuCodec {
    /// Launch a decompression kernel on `g.n_chunks` blocks: the parameters all of them take
    /// first (the stream and output of `g`, this codec's status and ctrl words, the chunk
    /// count), then the kernel's own (`tail`).
    pub(super) fn launch_decoder(
        &mut self,
        f: &CudaFunction,
        threads: u32,
        g: DecodeGeometry,
        tail: &[*mut c_void],
    ) -> Result<()> {
        const HEAD: usize = 7;
        let mut args = [std::ptr::null_mut(); HEAD + 10];
        if tail.len() > args.len() - HEAD {
            return Err(Error::invalid("too many decoder kernel parameters"));
        }
        let (status, ctrl) = (self.status_ptr(), self.ctrl_ptr());
        args[..HEAD].copy_from_slice(&[
            arg(&g.stream),
            arg(&g.stream_len),
            arg(&g.out),
            arg(&g.count),
            arg(&status),
            arg(&ctrl),
            arg(&g.n_chunks),
        ]);
        args[HEAD..HEAD + tail.len()].copy_from_slice(tail);
        self.launch(f, g.n_chunks, threads, &mut args[..HEAD + tail.len()])
    }

    /// Launch the decoder `f` of `codec` for the stream `g` (its first kernel parameters; `tail`
    /// the kernel's own) and wait for it. Returns the kernel's error bits (kernels/blocked.cu
    /// `ZC_E_*`); the ctrl words stay in `host_ctrl`.
    pub(super) fn run_decoder(
        &mut self,
        f: &CudaFunction,
        codec: CodecKind,
        g: DecodeGeometry,
        tail: &[*mut c_void],
    ) -> Result<u64> {
        if codec != CodecKind::Pfpl {
            return self.run_blocked_decoder(f, g, tail)?.ok_or_else(|| {
                Error::Gpu("a decompression kernel did not record its result".into())
            });
        }
        self.zero_ctrl(g.n_chunks as usize)?;
        self.record(2)?;
        self.launch_decoder(f, PFPL_THREADS, g, tail)?;
        self.record(3)?;
        self.read_ctrl()?;
        self.last_times.main_ms = self.elapsed(2, 3)?;
        Ok(self.host_ctrl[C_ERR])
    }

    /// [`GpuCodec::run_decoder`] for a blocked codec (aatrox, cuszp): the launch of
    /// [`GpuCodec::queue_blocked_decoder`] into result slot 0, waited for; the kernel's result
    /// (error bits, header copy) is then read from the host-mapped result words, with no copy.
    /// `None` when the launch did not decode (a `decompress_hdr` launch whose guess failed:
    /// every block returned at once).
    pub(super) fn run_blocked_decoder(
        &mut self,
        f: &CudaFunction,
        g: DecodeGeometry,
        tail: &[*mut c_void],
    ) -> Result<Option<u64>> {
        let res = self.waited(|gpu| gpu.queue_blocked_decoder(f, g, tail, 0).map(Some))?;
        Ok(res.filter(|r| r[R_ERR] & E_GUESS == 0).map(|r| r[R_ERR]))
    }

    /// Run `launch` (a blocked decoder launch into result slot 0, `None` when it launched
    /// nothing), timed between events 2 and 3, and wait for it: the slot's result words, or
    /// `None` when nothing ran or the launch's last block did not record its `seq`.
    fn waited(
        &mut self,
        launch: impl FnOnce(&mut Self) -> Result<Option<u64>>,
    ) -> Result<Option<[u64; RES_WORDS]>> {
        self.record(2)?;
        let Some(seq) = launch(self)? else {
            return Ok(None);
        };
        self.record(3)?;
        self.stream.synchronize().map_err(gpu_err("sync"))?;
        self.last_times.main_ms = self.elapsed(2, 3)?;
        let res = self.result_words(0);
        Ok((res[R_SEQ] == seq).then_some(res))
    }

    /// Queue a blocked-codec decoder launch (`f`, the stream `g`, the kernel's own parameters
    /// `tail`) whose last block writes its result into result slot `slot`; returns the launch's
    /// `seq`, which the slot's words hold once the kernel has ended. The workspace is cleared
    /// first only when the previous launch did not leave it clean; the decoder's last block
    /// leaves it clean (and a failed guess never touches it), so decoders queued back to back
    /// need no memset between them.
    pub(super) fn queue_blocked_decoder(
        &mut self,
        f: &CudaFunction,
        g: DecodeGeometry,
        tail: &[*mut c_void],
        slot: usize,
    ) -> Result<u64> {
        let res_dev = self.mapped_result_words()? + (slot * RES_WORDS * 8) as u64;
        let nc = g.n_chunks as usize;
        let keep = if self.clean_status >= nc {
            self.clean_status
        } else {
            self.zero_ctrl(nc)?;
            nc
        };
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut args = [std::ptr::null_mut(); 10];
        if tail.len() + 2 > args.len() {
            return Err(Error::invalid("too many decoder kernel parameters"));
        }
        args[..tail.len()].copy_from_slice(tail);
        args[tail.len()] = arg(&seq);
        args[tail.len() + 1] = arg(&res_dev);
        self.launch_decoder(f, self.threads, g, &args[..tail.len() + 2])?;
        self.clean_status = keep;
        Ok(seq)
    }

    /// The result words of slot `slot`, read from host-mapped memory (after the kernel that
    /// writes them has ended: the caller has synchronized the stream).
    pub(super) fn result_words(&self, slot: usize) -> [u64; RES_WORDS] {
        let mut w = [0u64; RES_WORDS];
        let Some((_, host, _)) = &self.mapped else {
            return w;
        };
        let host = *host as *const u64;
        for (i, x) in w.iter_mut().enumerate() {
            // SAFETY: `host` is the mapped allocation of RES_WORDS * RESULT_SLOTS words and
            // slot < RESULT_SLOTS; the kernel that wrote it has ended, nothing else writes it.
            *x = unsafe { std::ptr::read_volatile(host.add(slot * RES_WORDS + i)) };
        }
        w
    }

    /// Device address of the host-mapped result words ([`RESULT_SLOTS`] slots of
    /// [`RES_WORDS`]), allocated at first use.
    pub(super) fn mapped_result_words(&mut self) -> Result<u64> {
        if let Some((_, _, dev)) = &self.mapped {
            return Ok(*dev);
        }
        let flags = cu_sys::CU_MEMHOSTALLOC_DEVICEMAP;
        let words = RES_WORDS * RESULT_SLOTS;
        // SAFETY: page-locked host memory mapped into the device's address space; zeroed below
        // before any kernel can see it.
        let mut p = unsafe { self.ctx.alloc_pinned_with_flags::<u64>(words, flags) }
            .map_err(|e| Error::OutOfMemory(format!("mapped host words: {e:?}")))?;
        let host = p.as_mut_ptr().map_err(gpu_err("mapped"))?;
        let mut dev: cu_sys::CUdeviceptr = 0;
        // SAFETY: `host` is a live allocation made with CU_MEMHOSTALLOC_DEVICEMAP, `words` long.
        unsafe {
            std::ptr::write_bytes(host, 0, words);
            cu_sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0)
                .result()
                .map_err(gpu_err("cuMemHostGetDevicePointer"))?;
        }
        self.mapped = Some((p, host as usize, dev));
        Ok(dev)
    }

    /// Read and validate the header of a device-resident stream of `len` bytes (the checks of
    /// `Header::parse` and `zcomm::inspect` that do not need the payload).
    pub fn inspect_device(&mut self, stream: &CudaView<'_, u8>) -> Result<Header> {
        let len = stream.len();
        if len < HEADER_LEN {
            return Err(Error::corrupt(format!(
                "stream of {len} bytes is shorter than the {HEADER_LEN}-byte header"
            )));
        }
        // (a version 3 header is longer: read as much of one as the stream holds, in one copy)
        let mut b = [0u8; HEADER_LEN_V3];
        let m = len.min(HEADER_LEN_V3);
        let p = raw_ptr(stream, &self.stream.clone());
        // the view holds at least m bytes
        self.read_small(p, &mut b[..m])?;
        parse_header_fields(&b[..m], len)
    }

    /// Decompress the device-resident `stream` into `out` (device memory; its length must equal
    /// the stream's count). Accepts and rejects the same streams as [`crate::decompress_into`].
    ///
    /// After a blocked-codec stream of the same dtype, the call launches the decoder for that
    /// codec and bound mode before the header has come back to the host (the kernel reads its
    /// parameters from the header on the device and does nothing when they differ); the header is
    /// then checked as always, and any difference takes the ordinary path. One synchronization
    /// per call in the common case. When an error is returned the contents of `out` are
    /// unspecified.
    pub fn decompress_device<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        if let Some((dtype, codec, mode)) = self.decode_guess {
            // not the assumed header (or a stream to judge the ordinary way): start over below
            if dtype == T::DTYPE
                && self.decompress_speculative::<T>(stream, out, (codec, mode), Onto::Nothing)?
            {
                return Ok(());
            }
        }
        let h = self.inspect_device(stream)?;
        check_header_for::<T>(&h, out.len())?;
        let s = self.stream.clone();
        let sp = raw_ptr(stream, &s);
        let op = raw_ptr_mut(out, &s);
        if sp % 4 != 0 || op % (T::SIZE as u64) != 0 {
            return Err(Error::invalid(
                "device buffers must be 4-byte / element aligned",
            ));
        }
        self.last_times = KernelTimes::default();
        if h.is_stored() {
            let payload = sp + h.header_len() as u64;
            let got = self.copy_hash(payload, h.payload_len as usize, Some(op))?;
            if got != h.payload_checksum {
                return Err(Error::corrupt("stored payload checksum mismatch"));
            }
            return Ok(());
        }
        let codec = CodecKind::from_tag(h.codec)?;
        match codec {
            CodecKind::Cuszi => return self.decompress_cuszi(stream, out),
            CodecKind::Gpz => return self.decompress_gpz(stream, &h, out),
            _ => {}
        }
        let e = self.decode_with_header::<T>("decompress", &h, sp, stream.len(), op, op, None)?;
        if e != 0 {
            return Err(decode_error(e));
        }
        if codec != CodecKind::Pfpl {
            self.decode_guess = Some((T::DTYPE, codec, h.mode));
        }
        Ok(())
    }

    /// Decode the compressed (not stored) stream at `sp` (`len` bytes, header `h`, already
    /// checked against the output) with the `op` kernel family ("decompress" or
    /// "decompress_add": `out = base + decoded`, `base` a device address of `out.len()` values,
    /// `out` itself to add in place) into `out`; returns the kernel's error bits (0: decoded),
    /// with a pfpl data-checksum mismatch as bit 4. `track` (with "decompress_add", a blocked
    /// codec and an abs/noa stream: the caller checks): a [`DeviceRange`]'s device words, into
    /// which the `decompress_add_track` kernel folds the finite range of the base.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_with_header<T: GpuElement>(
        &mut self,
        op: &str,
        h: &Header,
        sp: u64,
        len: usize,
        out: u64,
        base: u64,
        track: Option<u64>,
    ) -> Result<u64> {
        let codec = CodecKind::from_tag(h.codec)?;
        let kop = match track {
            Some(_) if op == "decompress_add" && codec != CodecKind::Pfpl => "decompress_add_track",
            Some(_) => return Err(Error::invalid("no range-tracking kernel for this stream")),
            None => op,
        };
        let f = self.func(&kernel_name::<T>(kop, codec, h.mode)?)?;
        let nc = h.n_chunks;
        if nc == 0 {
            // no chunks: the table is empty, and so must the payload be (a pfpl data checksum
            // over no chunks is zhash_final(0, 0) = 0; the other codecs' field is always 0)
            let empty = h.payload_checksum == zhash_bytes(&[])
                && h.payload_len == 0
                && h.data_checksum == 0;
            return Ok(if empty { 0 } else { E_TABLE });
        }
        let step = T::from_f64(h.step);
        let inv = T::from_f64(1.0 / step.to_f64());
        let g = DecodeGeometry {
            stream: sp,
            stream_len: len as u64,
            out,
            count: h.count,
            n_chunks: nc,
        };
        let tc = h.payload_checksum;
        let (step64, eb) = (h.step, h.abs_bound);
        // the blocked codecs' accumulating kernels take the base of `out = base + x`; pfpl's add
        // in place (the caller copies the base into `out` first)
        let with_base = op == "decompress_add" && codec != CodecKind::Pfpl;
        if op == "decompress_add" && !with_base && base != out {
            return Err(Error::invalid(
                "pfpl adds in place: base and out must be the same",
            ));
        }
        let tail = [arg(&tc), arg(&step), arg(&inv), arg(&step64), arg(&eb)];
        let tail_base = [arg(&base), tail[0], tail[1], tail[2], tail[3], tail[4]];
        let range = track.unwrap_or(0);
        let tail_track = [
            arg(&base),
            arg(&range),
            tail[0],
            tail[1],
            tail[2],
            tail[3],
            tail[4],
        ];
        let mut e = if with_base && track.is_some() {
            self.run_decoder(&f, codec, g, &tail_track)?
        } else if with_base {
            self.run_decoder(&f, codec, g, &tail_base)?
        } else {
            self.run_decoder(&f, codec, g, &tail)?
        };
        if codec == CodecKind::Pfpl && pfpl_data_mismatch(h, &self.host_ctrl) {
            e |= E_CHECKSUM;
        }
        Ok(e)
    }

    /// The launch of [`GpuCodec::decompress_device`] (and, `onto` a base, of the
    /// decompress-and-add calls) that does not wait for the header: the `zc_decompress_hdr`
    /// (`zc_decompress_add_hdr`, `zc_decompress_add_track_hdr`) kernel of the guessed (blocked)
    /// codec and bound mode reads its parameters from the stream's header on the device and does
    /// nothing unless that header has those tags, `out.len()` values and their chunk count; the
    /// kernel's last block copies the header into the host-mapped result words (one
    /// synchronization, no copy), and it is then checked as the ordinary path checks it.
    /// Returns `Ok(true)` when `out` holds the decoded values (or the sums), `Ok(false)` when
    /// the ordinary path must decide (another codec or mode, a stored stream; nothing was
    /// written), or an error: the ordinary path's for the header itself, or the kernel's for the
    /// stream (then `out` may be partly written, and an accumulation is not repeated).
    pub(super) fn decompress_speculative<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
        guess: (CodecKind, BoundMode),
        onto: Onto,
    ) -> Result<bool> {
        let (len, n) = (stream.len(), out.len());
        match self.waited(|gpu| gpu.launch_guessing::<T>(stream, out, guess, onto, 0))? {
            Some(res) => judge_guessed::<T>(&res, len, n),
            None => Ok(false),
        }
    }

    /// Launch the guessing decoder of the codec and bound mode `guess` (reading its parameters from the
    /// stream's header on the device; `onto`: what it adds its values to) for `stream` into
    /// `out`, its result into result slot `slot`; returns the launch's `seq`, or `None`
    /// (nothing launched) where no guessing kernel applies: pfpl, range tracking of a `rel`
    /// stream, a stream shorter than a header, no values, misaligned buffers.
    pub(super) fn launch_guessing<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
        (codec, mode): (CodecKind, BoundMode),
        onto: Onto,
        slot: usize,
    ) -> Result<Option<u64>> {
        let s = self.stream.clone();
        let (len, n) = (stream.len(), out.len());
        let sp = raw_ptr(stream, &s);
        let op = raw_ptr_mut(out, &s);
        if len < HEADER_LEN || n == 0 || sp % 4 != 0 || op % (T::SIZE as u64) != 0 {
            return Ok(None);
        }
        if codec == CodecKind::Pfpl
            || (matches!(onto, Onto::Tracking(..)) && mode == BoundMode::Rel)
        {
            return Ok(None);
        }
        let Ok(nc) = u32::try_from(n.div_ceil(1usize << codec.chunk_log2(T::DTYPE))) else {
            return Ok(None);
        };
        let kop = match onto {
            Onto::Nothing => "decompress_hdr",
            Onto::Base(_) => "decompress_add_hdr",
            Onto::Tracking(..) => "decompress_add_track_hdr",
        };
        let f = self.func(&kernel_name::<T>(kop, codec, mode)?)?;
        // header bytes 6..9: codec, dtype, mode, flags (0: not stored)
        let expect =
            u32::from(codec.tag()) | u32::from(T::DTYPE.tag()) << 8 | u32::from(mode.tag()) << 16;
        self.last_times = KernelTimes::default();
        let g = DecodeGeometry {
            stream: sp,
            stream_len: len as u64,
            out: op,
            count: n as u64,
            n_chunks: nc,
        };
        let seq = match onto {
            Onto::Nothing => self.queue_blocked_decoder(&f, g, &[arg(&expect)], slot)?,
            Onto::Base(b) => self.queue_blocked_decoder(&f, g, &[arg(&b), arg(&expect)], slot)?,
            Onto::Tracking(b, r) => {
                self.queue_blocked_decoder(&f, g, &[arg(&b), arg(&r), arg(&expect)], slot)?
            }
        };
        Ok(Some(seq))
    }
}

/// The result words `res` of a guessing launch that ran (its `seq` recorded) for a stream of
/// `stream_len` bytes into `n` values of `T`, judged as the ordinary path judges: `Ok(true)`
/// decoded, `Ok(false)` the guess was wrong (nothing written), or the error of the header or
/// of the stream.
pub(super) fn judge_guessed<T: GpuElement>(
    res: &[u64; RES_WORDS],
    stream_len: usize,
    n: usize,
) -> Result<bool> {
    if res[R_ERR] & E_GUESS != 0 {
        return Ok(false);
    }
    let h = parse_header_fields(&header_in(res), stream_len)?;
    check_header_for::<T>(&h, n)?;
    match res[R_ERR] {
        0 => Ok(true),
        e => Err(decode_error(e)),
    }
}

/// The header copy in a blocked decoder's result words `res`.
pub(super) fn header_in(res: &[u64; RES_WORDS]) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    for (d, w) in b.chunks_exact_mut(8).zip(&res[R_HDR..]) {
        d.copy_from_slice(&w.to_ne_bytes());
    }
    b
}

/// What a speculative decoder launch ([`GpuCodec::decompress_speculative`]) does with the
/// values it decodes: store them, or add them to a base (a device address of `out.len()`
/// values; `out` itself to add in place), also folding the base's finite range into a
/// [`DeviceRange`]'s device words (`Tracking(base, words)`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Onto {
    Nothing,
    Base(u64),
    Tracking(u64, u64),
}

/// Whether the chunk hashes a pfpl decode kernel accumulated (`ctrl[C_DHASH]`) miss the header's
/// data checksum (FORMAT.md, "pfpl chunks"). Output contents are unspecified when they do.
pub(super) fn pfpl_data_mismatch(h: &Header, ctrl: &[u64]) -> bool {
    zhash_final(ctrl[C_DHASH] as u32, h.n_chunks) != h.data_checksum
}

/// The stream and output of one decompression launch: with this codec's look-back status and
/// ctrl words, the leading parameters of every decompression kernel (kernels/blocked.cu,
/// kernels/pfpl.cu): stream address and length, output address, value count, status, ctrl,
/// chunk count (= the grid).
#[derive(Clone, Copy)]
pub(super) struct DecodeGeometry {
    stream: u64,
    stream_len: u64,
    out: u64,
    count: u64,
    n_chunks: u32,
}

/// The error for the non-zero error bits `e` of a decompression kernel (kernels/blocked.cu
/// `ZC_E_*`; pfpl's are the same).
pub(super) fn decode_error(e: u64) -> Error {
    let mut what = Vec::new();
    for (bit, name) in [
        (E_SIZE, "chunk size not a multiple of 4"),
        (E_RANGE, "chunk runs past the end of the stream"),
        (E_CHECKSUM, "chunk (pfpl: data) checksum mismatch"),
        (E_META, "invalid chunk metadata"),
        (E_TOTAL, "chunk sizes do not add up to the payload length"),
        (E_TABLE, "chunk table checksum mismatch"),
    ] {
        if e & bit != 0 {
            what.push(name);
        }
    }
    if what.is_empty() {
        what.push("unknown device error");
    }
    Error::corrupt(what.join(", "))
}

/// The checks of a header against the buffer it is decompressed into (dtype and value count).
pub(super) fn check_header_for<T: GpuElement>(h: &Header, n: usize) -> Result<()> {
    crate::codec::check_dtype::<T>(h.dtype)?;
    if h.count != n as u64 {
        return Err(Error::Mismatch {
            what: "value count",
            expected: n.to_string(),
            found: h.count.to_string(),
        });
    }
    Ok(())
}

/// The header checks of `Header::parse` + `zcomm::inspect` that need no payload bytes (the
/// table and stored-payload checksums are verified on the device) of the header at the start of
/// `b` (the stream's first bytes: at least [`HEADER_LEN`], [`HEADER_LEN_V3`] for a version 3
/// header, as far as the stream has them), for a stream of `stream_len` bytes.
pub(super) fn parse_header_fields(b: &[u8], stream_len: usize) -> Result<Header> {
    let short = |need: usize| {
        Error::corrupt(format!(
            "stream of {stream_len} bytes is shorter than the {need}-byte header"
        ))
    };
    let shaped = b.len() >= 6
        && b[0..4] == crate::format::MAGIC
        && crate::format::u16_at(b, 4) == crate::format::VERSION_SHAPED;
    let h = if shaped {
        let b3: &[u8; HEADER_LEN_V3] = b
            .get(..HEADER_LEN_V3)
            .and_then(|x| x.try_into().ok())
            .ok_or_else(|| short(HEADER_LEN_V3))?;
        Header::parse_fields_v3(b3, stream_len)?
    } else {
        let b2: &[u8; HEADER_LEN] = b
            .get(..HEADER_LEN)
            .and_then(|x| x.try_into().ok())
            .ok_or_else(|| short(HEADER_LEN))?;
        Header::parse_fields(b2, stream_len)?
    };
    crate::codec::check_codec_fields(&h)?;
    Ok(h)
}
