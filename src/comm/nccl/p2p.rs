//! Point-to-point `send` / `recv` of device buffers over NCCL, with the decision made alike on
//! both ends.

use super::*;

impl NcclComm {
    /// Send `data` to `dest` (matched by [`recv`](Self::recv) with the same length), compressed
    /// per the policy (the sender decides). A mismatch is an error on both ends.
    ///
    /// `Auto` decides from this rank's ratio cache for sends or a sample (only a compressing
    /// call reads the whole buffer for its value range). When the sender or the receiver has
    /// no device codec, `Auto` sends raw and `Always` fails with [`Error::Unavailable`] on both
    /// ends (the descriptor round tells the receiver; the receiver's reply also says whether it
    /// can decompress, so a compressed message is never sent to a rank that cannot read it).
    pub fn send<T: NcclReal>(
        &mut self,
        data: &CudaSlice<T>,
        dest: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        self.check_peer(dest)?;
        check_tag(tag)?;
        let n = data.len();
        let bytes = n * T::SIZE;
        let k = pieces(n, self.piece_elems::<T>()).len();
        let dt = T::DTYPE.tag();
        let predict =
            |prof: &Profile, codec, ratio: f64| prof.predict_p2p(bytes as f64, ratio, k, codec, dt);
        let preferred = self.config.policy.codec().unwrap_or_default();
        let raw_t = predict(&self.profile, preferred, 1.0).0;
        let cands = self.candidates(n > 0, raw_t, |c| predict(&self.profile, c, 1e12).1);
        let want = !cands.is_empty();
        let avail = self.gpu.is_some() && self.codec_ranks.get(dest).copied().unwrap_or(false);
        let always = matches!(self.config.policy, Policy::Always(_));
        let mut compress = want && avail;
        let mut codec = preferred;
        let mut st = OpStats::raw_bytes(OP_SEND, bytes);
        st.predicted_raw_s = raw_t;
        st.predicted_s = raw_t;
        if compress {
            // the sender alone decides: its own cache per codec, no agreement needed
            let mut plan = Vec::with_capacity(cands.len());
            for &c in &cands {
                let r = match self.config.policy {
                    Policy::Auto(_) => self.p2p_estimate(data, c),
                    _ => Some(1e12),
                };
                plan.extend(r.map(|r| (c, WireRatio::from(r))));
            }
            match self.decide(&plan, &mut st, |c, r| predict(&self.profile, c, r.major).1) {
                Some((c, _)) => codec = c,
                None => compress = false,
            }
        }
        // compressing: now the real (whole-buffer) bound
        let bound = if compress {
            self.piece_bound(&data.as_view())?
        } else {
            self.config.bound
        };
        let mut d = self.desc::<T>(OP_SEND, n);
        d.decision = if want && !avail && always {
            DEC_UNAVAILABLE
        } else {
            u8::from(compress)
        };
        d.ratio = st.ratio_estimate;
        // the codec, for the receiver's statistics (the stream's header tells its decoder)
        d.codec = if compress { codec.tag() } else { 0 };
        self.sh.boot.send(dest, TAG_P2P + tag, &d.to_bytes())?;
        let verdict = Desc::parse(&self.sh.boot.recv(dest, TAG_P2P + tag)?)?;
        check_pair(&d, &verdict)?;
        if d.decision == DEC_UNAVAILABLE {
            return Err(Error::Unavailable(format!(
                "send to rank {dest} under {}: {}",
                self.config.policy,
                self.codec_missing_msg(&[self.rank(), dest])
            )));
        }
        // the receiver's reply says whether it can decompress (it resolves the same way)
        match p2p_outcome(d.decision, verdict.decision, always) {
            P2p::Raw => compress = false,
            P2p::Compressed => {}
            P2p::Unavailable => {
                return Err(Error::Unavailable(format!(
                    "send to rank {dest} under {}: the receiver has no GPU codec",
                    self.config.policy
                )))
            }
        }
        if !compress {
            self.raw_send(data, dest)?;
            return self.finish(st, t0);
        }
        let wire = self.with_piece_pool::<T, _>(n, PoolSide::Send, |sh, gpu, spool, pcs, _| {
            let mut wire = 0usize;
            for (kk, rg) in pcs.iter().enumerate() {
                let v = data.slice(rg.clone());
                let len = Self::compress_piece(gpu, spool, kk, &v, bound, codec)?;
                sh.boot
                    .send(dest, TAG_P2P + tag, &(len as u64).to_le_bytes())?;
                let (pp, g) = spool.bufs[kk].device_ptr(&sh.net);
                // SAFETY: the piece buffer holds len bytes and is borrowed until the guard
                // records on the net stream.
                unsafe { sh.send_raw(pp, len, nsys::ncclDataType_t::ncclUint8, dest)? };
                drop(g);
                wire += len;
            }
            Ok(wire)
        })?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.wire_bytes = wire as u64;
        st.ratio = bytes as f64 / wire.max(1) as f64;
        st.bound = bound.value();
        let cmp_t = predict(&self.profile, codec, st.ratio).1;
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = cmp_t;
        if let (Policy::Auto(_), Some(a)) = (self.config.policy, Agreed::from_all(&[st.ratio])) {
            self.p2p_ratios.put(send_key::<T>(n, codec), a);
        }
        self.finish(st, t0)
    }

    /// Receive exactly `out.len()` elements from `src` (matched by [`send`](Self::send)).
    ///
    /// The reply to the sender's descriptor says whether this rank can decompress: without a
    /// device codec a message the sender wanted compressed arrives raw under `Auto`, and under
    /// `Always` both ends fail with [`Error::Unavailable`] (no hang).
    pub fn recv<T: NcclReal>(
        &mut self,
        out: &mut CudaSlice<T>,
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        self.check_peer(src)?;
        check_tag(tag)?;
        let n = out.len();
        let bytes = n * T::SIZE;
        let sd = Desc::parse(&self.sh.boot.recv(src, TAG_P2P + tag)?)?;
        let mut mine = self.desc::<T>(OP_RECV, n);
        mine.decision = u8::from(self.gpu.is_some());
        self.sh.boot.send(src, TAG_P2P + tag, &mine.to_bytes())?;
        check_pair(&sd, &mine)?;
        let mut st = OpStats::raw_bytes(OP_RECV, bytes);
        st.ratio_estimate = sd.ratio;
        let always = matches!(self.config.policy, Policy::Always(_));
        let outcome = if sd.decision == DEC_UNAVAILABLE {
            P2p::Unavailable
        } else {
            p2p_outcome(sd.decision, mine.decision, always)
        };
        match outcome {
            P2p::Raw => {
                self.raw_recv(out, src)?;
                return self.finish(st, t0);
            }
            P2p::Unavailable => {
                return Err(Error::Unavailable(format!(
                    "recv from rank {src} under {}: {}",
                    self.config.policy,
                    self.codec_missing_msg(&[src, self.rank()])
                )))
            }
            P2p::Compressed => {}
        }
        let codec = CodecKind::from_tag(sd.codec)
            .unwrap_or_else(|_| self.config.policy.codec().unwrap_or_default());
        let wire =
            self.with_piece_pool::<T, _>(n, PoolSide::Recv, |sh, gpu, rpool, pcs, cap| {
                let mut wire = 0usize;
                let mut pending: Option<(usize, usize, cudarc::driver::CudaEvent)> = None;
                for kk in 0..pcs.len() {
                    let len = size_msg(&sh.boot.recv(src, TAG_P2P + tag)?)?;
                    if len == 0 || len > cap {
                        return Err(Error::Comm(format!(
                            "peer {src} announced a piece of {len} bytes"
                        )));
                    }
                    let (pp, g) = rpool.bufs[kk].device_ptr_mut(&sh.net);
                    // SAFETY: the buffer holds cap >= len bytes, borrowed until the guard
                    // records.
                    unsafe { sh.recv_raw(pp, len, nsys::ncclDataType_t::ncclUint8, src)? };
                    drop(g);
                    let ev = sh.net.record_event(None).map_err(gpu_err)?;
                    if let Some((j, l, e)) = pending.take() {
                        Self::consume(gpu, rpool, (j, l), &e, out, pcs[j].clone())?;
                    }
                    pending = Some((kk, len, ev));
                    wire += len;
                }
                if let Some((j, l, e)) = pending.take() {
                    Self::consume(gpu, rpool, (j, l), &e, out, pcs[j].clone())?;
                }
                Ok(wire)
            })?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.wire_bytes = wire as u64;
        st.ratio = bytes as f64 / wire.max(1) as f64;
        self.finish(st, t0)
    }
}

/// `Desc::decision` of a send that cannot compress under `Always` (a codec is missing): both
/// ends return [`Error::Unavailable`].
pub(super) const DEC_UNAVAILABLE: u8 = 2;

/// How a point-to-point message travels, decided alike on both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum P2p {
    Raw,
    Compressed,
    Unavailable,
}

/// The outcome from the sender's decision (`1`: compress) and the receiver's reply (`1`: it has
/// a codec): a compressed message to a receiver without codec is raw under `Auto`, an error
/// under `Always` (policies are checked equal on both ends).
pub(super) fn p2p_outcome(sender: u8, receiver_can: u8, always: bool) -> P2p {
    match (sender == 1, receiver_can == 1) {
        (false, _) => P2p::Raw,
        (true, true) => P2p::Compressed,
        (true, false) if always => P2p::Unavailable,
        (true, false) => P2p::Raw,
    }
}

/// Tags of the bootstrap transport's control messages (its own duplicated communicator).
pub(super) const TAG_SIZES: i32 = 30000;
pub(super) const TAG_P2P: i32 = 20000;

pub(super) fn check_tag(tag: i32) -> Result<()> {
    if !(0..crate::comm::MAX_USER_TAG).contains(&tag) {
        return Err(Error::invalid(format!(
            "tag {tag} outside 0..{}",
            crate::comm::MAX_USER_TAG
        )));
    }
    Ok(())
}

pub(super) fn size_msg(b: &[u8]) -> Result<usize> {
    let a: [u8; 8] = b
        .try_into()
        .map_err(|_| Error::Comm(format!("malformed size message ({} bytes)", b.len())))?;
    usize::try_from(u64::from_le_bytes(a)).map_err(|_| Error::Comm("size out of range".into()))
}

/// The sender's ratio-cache key of a send of `n` values of `T` with `codec`.
fn send_key<T: NcclReal>(n: usize, codec: CodecKind) -> RatioKey {
    RatioKey::of(OP_SEND, T::DTYPE.tag(), n, codec)
}

impl NcclComm {
    /// The sender's ratio estimate of `data` with `codec`: cached for this shape, else sampled
    /// and cached; `None` (send raw) when the sample fails.
    fn p2p_estimate<T: NcclReal>(&mut self, data: &CudaSlice<T>, codec: CodecKind) -> Option<f64> {
        let key = send_key::<T>(data.len(), codec);
        if let Some(r) = self.p2p_ratios.lookup(key) {
            return Some(r.major);
        }
        match self.sample_ratio(&data.as_view(), codec, None) {
            Ok(r) => Agreed::from_all(&[r]).map(|a| {
                self.p2p_ratios.put(key, a);
                a.value().major
            }),
            Err(e) => {
                tracing::warn!(target: "zcomm::nccl", rank = self.rank(), "send {codec} ratio estimate failed, sending raw: {e}");
                None
            }
        }
    }
}

/// Which of the communicator's piece pools a pipelined message uses.
#[derive(Debug, Clone, Copy)]
enum PoolSide {
    Send,
    Recv,
}

/// The pieces of a pipelined point-to-point message.
impl NcclComm {
    /// `f(shared, gpu, pool, pieces, cap)` for an `n`-value message of `T`: its [`pieces`], the
    /// send or receive piece pool grown to hold each piece's stream of at most `cap` bytes, and
    /// the GPU codec. The pool is taken from `self` for the call and put back whatever `f`
    /// returns, so its buffers are reused by the next message.
    fn with_piece_pool<T: NcclReal, R>(
        &mut self,
        n: usize,
        side: PoolSide,
        f: impl FnOnce(
            &Shared,
            &mut crate::gpu::GpuCodec,
            &mut Pool,
            &[Range<usize>],
            usize,
        ) -> Result<R>,
    ) -> Result<R> {
        let sh = self.sh.clone();
        let pcs = pieces(n, self.piece_elems::<T>());
        let cap = crate::format::compress_bound(self.piece_elems::<T>(), T::DTYPE);
        let slot = match side {
            PoolSide::Send => &mut self.send_pool,
            PoolSide::Recv => &mut self.recv_pool,
        };
        let mut pool = std::mem::take(slot);
        let res = (|| {
            pool.ensure(&sh.work, pcs.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable("GPU codec".into()))?;
            f(&sh, gpu, &mut pool, &pcs, cap)
        })();
        match side {
            PoolSide::Send => self.send_pool = pool,
            PoolSide::Recv => self.recv_pool = pool,
        }
        res
    }

    /// Compress piece `src` into `send_pool` buffer `slot`; returns the stream length.
    pub(super) fn compress_piece<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &mut Pool,
        slot: usize,
        src: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let mut ov = pool.bufs[slot].slice_mut(..);
        gpu.compress_device(src, bound, codec, &mut ov)
    }

    /// Decompress received piece `slot` into `buf[dst]` once the net stream has passed `ev`.
    pub(super) fn consume<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &Pool,
        (slot, len): (usize, usize),
        ev: &cudarc::driver::CudaEvent,
        buf: &mut CudaSlice<T>,
        dst: Range<usize>,
    ) -> Result<()> {
        gpu.stream().wait(ev).map_err(gpu_err)?;
        let sv = pool.bufs[slot].slice(0..len);
        let mut ov = buf.slice_mut(dst);
        gpu.decompress_device(&sv, &mut ov)
    }
}

/// The rank that rank `r` of `p` sends to in a ring.
pub(super) fn to_of(r: usize, p: usize) -> usize {
    (r + 1) % p
}

/// The rank that rank `r` of `p` receives from in a ring.
pub(super) fn from_of(r: usize, p: usize) -> usize {
    (r + p - 1) % p
}
