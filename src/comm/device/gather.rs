//! Allgather and broadcast of device buffers, blocking and non-blocking, through the stager's
//! pinned buffers.

use super::*;

/// A device allgather after its local staging and agreement (this rank's record is the first
/// `mine_len` bytes of the stager's pinned send buffer).
pub(super) struct GatherPrep {
    pub(super) compressed: bool,
    pub(super) n: usize,
    pub(super) mine_len: usize,
    pub(super) lens: Vec<usize>,
    pub(super) st: OpStats,
    pub(super) t0: f64,
}

/// Tag of the pairwise exchanges of [`gather_pinned`].
pub(super) const TAG_GATHER: i32 = 32002;

/// The blocking allgather of the records between the stager's pinned buffers (`ps`: this
/// rank's record, `pr`: every record, `total` bytes; this rank's range of `pr` is not written:
/// callers read their own record from `ps`). `p-1` pairwise exchanges of known sizes (step `s`:
/// send to `r+s`, receive from `r-s`) straight into the pinned buffer, not `MPI_Allgatherv`,
/// which also copies this rank's record into its place in the receive buffer (a host memcpy of
/// the whole stream per call, outside the link's time).
pub(super) fn gather_pinned(
    t: &dyn crate::comm::transport::Transport,
    ps: &Option<PinnedHostSlice<u8>>,
    pr: &mut Option<PinnedHostSlice<u8>>,
    mine_len: usize,
    lens: &[usize],
    total: usize,
) -> Result<()> {
    let mine: &[u8] = match ps {
        Some(b) => &b.as_slice().map_err(gpu_err("pinned"))?[..mine_len],
        None => &[],
    };
    let out: &mut [u8] = match pr {
        Some(b) => &mut b.as_mut_slice().map_err(gpu_err("pinned"))?[..total],
        None => &mut [],
    };
    gather_into(t, mine, lens, out)
}

/// The pairwise allgather of [`gather_pinned`] from `mine` into `out` (any host memory; this
/// rank's range of `out` is not written).
pub(super) fn gather_into(
    t: &dyn crate::comm::transport::Transport,
    mine: &[u8],
    lens: &[usize],
    out: &mut [u8],
) -> Result<()> {
    let (p, r) = (t.size(), t.rank());
    if lens.len() != p || lens[r] != mine.len() || lens.iter().sum::<usize>() != out.len() {
        return Err(Error::invalid(
            "device allgather: lengths disagree with the records or the output",
        ));
    }
    let mut offs = Vec::with_capacity(p);
    let mut off = 0;
    for &l in lens {
        offs.push(off);
        off += l;
    }
    for s in 1..p {
        let (dest, src) = ((r + s) % p, (r + p - s) % p);
        let dst = &mut out[offs[src]..offs[src] + lens[src]];
        t.sendrecv_sized(dest, mine, src, dst, TAG_GATHER)?;
    }
    Ok(())
}

/// A pending [`Communicator::iallgather_device`]: the compressed (or raw) streams are in flight
/// (`MPI_Iallgatherv` from the stager's pinned send buffer into its pinned receive buffer, both
/// lent to the request); [`Communicator::wait_allgather_device`] uploads and decompresses them
/// and hands the buffers back to the stager.
pub struct DeviceAllgatherRequest {
    pub(super) pending: Box<dyn PendingBuf>,
    /// What the staging and the agreement left for the wait.
    pub(super) prep: GatherPrep,
}

impl DeviceAllgatherRequest {
    /// Whether the transfer has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test()
    }
}

impl std::fmt::Debug for DeviceAllgatherRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceAllgatherRequest({} values per rank)", self.prep.n)
    }
}

/// A device broadcast after the root's staging and the agreement (the root's stream is the
/// first `len` bytes of its stager's pinned send buffer).
pub(super) struct BcastPrep {
    pub(super) compressed: bool,
    pub(super) n: usize,
    pub(super) len: usize,
    pub(super) st: OpStats,
    pub(super) t0: f64,
}

/// A pending [`Communicator::ibcast_device`]: the root's stream is in flight (`MPI_Ibcast`
/// straight from the root's pinned send buffer into the other ranks' pinned receive buffers,
/// lent to the request); [`Communicator::wait_bcast_device`] uploads and decompresses it on
/// every rank and hands the buffer back to the stager.
pub struct DeviceBcastRequest {
    pub(super) pending: Box<dyn PendingBuf>,
    /// What the root's staging and the agreement left for the wait.
    pub(super) prep: BcastPrep,
    /// The lent buffer is the stager's send buffer (the root) or its receive buffer.
    pub(super) from_send: bool,
}

impl DeviceBcastRequest {
    /// Whether the transfer has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test()
    }
}

impl std::fmt::Debug for DeviceBcastRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBcastRequest({} values)", self.prep.n)
    }
}

impl Communicator {
    /// Allgather of device buffers (see the [module docs](super)): `out.len() == size *
    /// send.len()`, rank order; every rank ends with identical values. Collective.
    pub fn allgather_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let (p, n) = (self.size(), send.len());
        let local = if out.len() != n * p {
            Err(Error::invalid(format!(
                "allgather_device: output has {} values, expected {p} x {n}",
                out.len()
            )))
        } else {
            Ok(())
        };
        if !matches!(self.config.policy, Policy::Never) && n > 0 && p > 1 {
            return self.allgather_device_compressed(dev, send, out, local);
        }
        let prep = self.allgather_device_prepare(dev, send, local)?;
        let GatherPrep {
            compressed,
            n,
            mine_len,
            lens,
            st,
            t0,
        } = prep;
        // the records land in the stager's pinned receive buffer (grown once, then reused; this
        // rank's own record stays in the pinned send buffer)
        let total: usize = lens.iter().sum();
        let t = now();
        let s = dev.stream();
        DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, total)?;
        let (ps, mut pr) = (dev.pinned_send.take(), dev.pinned_recv.take());
        let r = gather_pinned(self.transport(), &ps, &mut pr, mine_len, &lens, total);
        dev.pinned_send = ps;
        dev.pinned_recv = pr;
        r?;
        dev.last.network = t.elapsed().as_secs_f64();
        dev.last.h2d = 0.0;
        dev.last.decompress = 0.0;
        let (me, mut off) = (self.rank(), 0);
        for (k, &l) in lens.iter().enumerate() {
            let mut view = out.slice_mut(k * n..(k + 1) * n);
            if k == me {
                dev.upload_pinned(true, 0..mine_len, &mut view, compressed)?;
            } else {
                dev.upload_pinned(false, off..off + l, &mut view, compressed)?;
            }
            off += l;
        }
        Ok(self.finish(st, t0))
    }

    /// The compressed blocking allgather: the engine's device allgather
    /// ([`device_gather`](crate::comm::device_gather), the algorithm of NCCL and of the
    /// in-process loopback) over the staged link, so each stream goes D2H once, over the
    /// transport, and H2D into a pooled device buffer, and every rank decodes every stream (its
    /// own from the device, never staged back). Agreement first (the codec `Auto` chose, the
    /// sizes); a rank that fails later sends an empty stream and every rank returns an error.
    fn allgather_device_compressed<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        local: Result<()>,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let (p, n, bound) = (self.size(), send.len(), self.config.bound);
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let codec = self.allgather_codec(dev, send, &dp)?;
        dev.last = StageTimes::default();
        let d = Desc {
            dtype: elem_tag::<T>(),
            decision: 1,
            ..self.local_desc::<f32>(crate::comm::OP_ALLGATHER, n)
        };
        self.agree(d, local)?;
        let g = dev.over_staged_link(self.transport(), |link, gpu, _| {
            crate::comm::device_gather::allgather(link, gpu, send, out, bound, codec)
        })?;
        let mut st = OpStats::raw(crate::comm::OP_ALLGATHER);
        st.bytes = (n * T::SIZE) as u64;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        // (the link staged this rank's stream into the pinned send buffer)
        st.bound = stream_bound(bound, dev.pinned_bytes(true, g.stream_len)?)?;
        st.wire_bytes = g.stream_len as u64;
        st.ratio = st.bytes as f64 / g.stream_len.max(1) as f64;
        let key = crate::comm::codec_key(crate::comm::coll_key(n, bound), codec);
        self.ratios
            .put(crate::comm::OP_ALLGATHER | 0x80, key, st.ratio);
        let terms =
            dp.staged(codec)
                .allgather_terms(self.profile.link, p, st.bytes as f64, st.ratio);
        dev.last_predicted = record_prediction(&mut st, terms, true);
        Ok(self.finish(st, t0))
    }

    /// Non-blocking [`allgather_device`](Self::allgather_device): GPU compression and the D2H
    /// of the stream happen now, the agreement too; the transfer (`MPI_Iallgatherv`) is started
    /// and the call returns. Finish with [`wait_allgather_device`](Self::wait_allgather_device).
    /// Collective.
    pub fn iallgather_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
    ) -> Result<DeviceAllgatherRequest> {
        let prep = self.allgather_device_prepare(dev, send, Ok(()))?;
        // the transfer borrows the stager's pinned buffers (this rank's record in the send
        // buffer, the receive buffer grown once, then reused) until the wait hands them back:
        // no per-call allocation, no copy of the streams
        let total: usize = prep.lens.iter().sum();
        let mine = dev.lend_pinned(true, prep.mine_len);
        let out = dev.lend_pinned(false, total);
        let pending = self.transport().iallgatherv_into(mine, &prep.lens, out)?;
        Ok(DeviceAllgatherRequest { pending, prep })
    }

    /// The part of the device allgather before the transfer: GPU compression (or not) and the
    /// D2H of this rank's record into the stager's pinned send buffer, the agreement, the
    /// record lengths and the model's predictions.
    pub(super) fn allgather_device_prepare<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        local: Result<()>,
    ) -> Result<GatherPrep> {
        let t0 = self.wtime();
        let (p, n) = (self.size(), send.len());
        let bound = self.config.bound;
        // Auto compresses like Always (every rank must take the same path; the descriptor table
        // checks the shared policy), with the codec predicted fastest at the ranks' agreed ratios
        let compress = !matches!(self.config.policy, Policy::Never) && n > 0 && p > 1;
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let codec = self.allgather_codec(dev, send, &dp)?;
        let mut st = OpStats::raw(crate::comm::OP_ALLGATHER);
        st.bytes = (n * T::SIZE) as u64;
        dev.last = StageTimes::default();
        // stage before the agreement, so a device failure on one rank fails every rank
        // (into the stager's pinned send buffer: no per-call host allocation, no copy)
        let staged: Result<usize> = local.and_then(|()| {
            if compress {
                let len = dev.compress_timed(send, bound, codec)?;
                dev.last.d2h = dev.scratch_to_pinned_send(len)?;
                st.decision = Decision::Compressed;
                st.codec = Some(codec);
                st.bound = stream_bound(bound, dev.pinned_bytes(true, len)?)?;
                Ok(len)
            } else {
                dev.values_to_pinned_send(send)
            }
        });
        let d = Desc {
            dtype: elem_tag::<T>(),
            decision: u8::from(compress),
            ..self.local_desc::<f32>(crate::comm::OP_ALLGATHER, n)
        };
        let (mine_len, local) = match staged {
            Ok(l) => (l, Ok(())),
            Err(e) => (0, Err(e)),
        };
        self.agree(d, local)?;
        st.wire_bytes = mine_len as u64;
        st.ratio = st.bytes as f64 / mine_len.max(1) as f64;
        let lens = if compress {
            self.transport().allgather_lens(mine_len)?
        } else {
            vec![n * T::SIZE; p]
        };
        let ratio = if compress {
            let key = crate::comm::codec_key(crate::comm::coll_key(n, bound), codec);
            self.ratios
                .put(crate::comm::OP_ALLGATHER | 0x80, key, st.ratio);
            st.ratio
        } else {
            1.0
        };
        let terms = dp
            .staged(codec)
            .allgather_terms(self.profile.link, p, st.bytes as f64, ratio);
        dev.last_predicted = record_prediction(&mut st, terms, compress);
        Ok(GatherPrep {
            compressed: compress,
            n,
            mine_len,
            lens,
            st,
            t0,
        })
    }

    /// Complete a non-blocking device allgather into `out` (`size * count` values): H2D of
    /// every rank's stream and GPU decompression into its slice.
    pub fn wait_allgather_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        req: DeviceAllgatherRequest,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let DeviceAllgatherRequest {
            pending,
            prep:
                GatherPrep {
                    compressed,
                    n,
                    mine_len,
                    lens,
                    st,
                    t0,
                },
        } = req;
        let t = now();
        let mut bufs = pending.wait()?.into_iter();
        dev.last.network = t.elapsed().as_secs_f64();
        let (Some(mut mine), Some(mut recv)) = (bufs.next(), bufs.next()) else {
            return Err(Error::Comm(
                "allgather_device: the transfer lost its buffers".into(),
            ));
        };
        let me = self.rank();
        let mut upload = || -> Result<()> {
            if out.len() != n * self.size() {
                return Err(Error::invalid(format!(
                    "allgather_device: output has {} values, expected {} x {n}",
                    out.len(),
                    self.size()
                )));
            }
            let total: usize = lens.iter().sum();
            let mine: &[u8] = &mine.bytes()?[..mine_len];
            let recv: &[u8] = &recv.bytes()?[..total];
            let (mut h2d, mut dec, mut off) = (0.0, 0.0, 0);
            for (k, &l) in lens.iter().enumerate() {
                let mut view = out.slice_mut(k * n..(k + 1) * n);
                // this rank's record from its send buffer (MPI may not have written its range)
                let part = if k == me { mine } else { &recv[off..off + l] };
                dev.upload_bytes(part, &mut view, compressed)?;
                h2d += dev.last.h2d;
                dec += dev.last.decompress;
                off += l;
            }
            dev.last.h2d = h2d;
            dev.last.decompress = dec;
            Ok(())
        };
        let r = upload();
        dev.reclaim_pinned(true, mine);
        dev.reclaim_pinned(false, recv);
        r?;
        Ok(self.finish(st, t0))
    }

    /// Broadcast a device buffer from `root`: the root compresses on the GPU (or, by the
    /// policy, stages the raw values), the stream is broadcast through pinned host memory, and
    /// every rank (the root included, so all end with identical values) uploads and decompresses
    /// it into `buf`. `Policy::Auto` is decided on the root by the model with the ratio of the
    /// previous broadcast of this size and bound (the first one compresses to learn it).
    /// Collective.
    pub fn bcast_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        buf: &mut CudaViewMut<'_, T>,
        root: usize,
    ) -> Result<OpStats> {
        let BcastPrep {
            compressed,
            n,
            len,
            mut st,
            t0,
        } = self.bcast_device_prepare(dev, &buf.as_view(), root)?;
        // the root broadcasts from its pinned send buffer, the others receive into their pinned
        // receive buffer (grown once, then reused), then everyone uploads from there
        let t = now();
        let from_send = self.rank() == root;
        if !from_send {
            let s = dev.stream();
            DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, len)?;
        }
        let mut slot = if from_send {
            dev.pinned_send.take()
        } else {
            dev.pinned_recv.take()
        };
        let r = match &mut slot {
            Some(b) => b
                .as_mut_slice()
                .map_err(gpu_err("pinned"))
                .and_then(|b| self.transport().bcast_into(root, &mut b[..len])),
            None if len == 0 => Ok(()),
            None => Err(Error::Comm("device staging: no pinned buffer".into())),
        };
        if from_send {
            dev.pinned_send = slot;
        } else {
            dev.pinned_recv = slot;
        }
        r?;
        dev.last.network = t.elapsed().as_secs_f64();
        if buf.len() != n {
            return Err(Error::invalid("bcast_device: buffer length changed"));
        }
        dev.last.h2d = 0.0;
        dev.last.decompress = 0.0;
        dev.upload_pinned(from_send, 0..len, buf, compressed)?;
        if compressed && st.bound == 0.0 {
            st.bound = stream_bound(self.config.bound, dev.pinned_bytes(from_send, len)?)?;
        }
        Ok(self.finish(st, t0))
    }

    /// Non-blocking [`bcast_device`](Self::bcast_device): the root compresses and stages now,
    /// every rank agrees and the transfer (`MPI_Ibcast`) starts. `buf` holds the data on the
    /// root; elsewhere only its length matters. Finish with
    /// [`wait_bcast_device`](Self::wait_bcast_device). Collective.
    pub fn ibcast_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        buf: &CudaView<'_, T>,
        root: usize,
    ) -> Result<DeviceBcastRequest> {
        let prep = self.bcast_device_prepare(dev, buf, root)?;
        // the transfer borrows the root's pinned send buffer (the staged stream) or the others'
        // pinned receive buffer (grown once, then reused) until the wait hands it back: no
        // per-call allocation, no copy of the stream
        let from_send = self.rank() == root;
        let b = dev.lend_pinned(from_send, prep.len);
        let pending = self.transport().ibcast_into(root, b, prep.len)?;
        Ok(DeviceBcastRequest {
            pending,
            prep,
            from_send,
        })
    }

    /// The part of the device broadcast before the transfer: the root's decision, GPU
    /// compression (or not) and D2H into its pinned send buffer, the agreement, the
    /// predictions.
    pub(super) fn bcast_device_prepare<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        buf: &CudaView<'_, T>,
        root: usize,
    ) -> Result<BcastPrep> {
        let t0 = self.wtime();
        let (p, r, n) = (self.size(), self.rank(), buf.len());
        let bytes = (n * T::SIZE) as f64;
        let mut local = Ok(());
        if root >= p {
            local = Err(Error::invalid(format!("bcast root {root} out of range")));
        }
        let bound = self.config.bound;
        let preferred = self.config.policy.codec().unwrap_or_default();
        let (op_r, key) = (
            crate::comm::OP_BCAST | 0x80,
            crate::comm::coll_key(n, bound),
        );
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let link = self.profile.link;
        let mut st = OpStats::raw(crate::comm::OP_BCAST);
        st.bytes = bytes as u64;
        dev.last = StageTimes::default();
        let mut d = Desc {
            dtype: elem_tag::<T>(),
            root: root as u32,
            ..self.local_desc::<f32>(crate::comm::OP_BCAST, n)
        };
        if r == root && local.is_ok() {
            // the root decides alone (`Auto`: the codec too, from its own data) and tells the
            // others in its descriptor
            let terms = |d: &StagedModel<'_>, r: f64| d.bcast_terms(link, p, bytes, r);
            let (compress, codec) = match self.config.policy {
                Policy::Never => (false, preferred),
                Policy::Always(c) => (true, c),
                Policy::Auto(_) => {
                    let raw_s = terms(&dp.staged(preferred), 1.0).0.total();
                    let ch =
                        self.device_choice(dev, buf, &dp, preferred, (op_r, key), raw_s, |d, r| {
                            terms(d, r).1.total()
                        });
                    st.ratio_estimate = ch.best.map_or(1.0, |b| b.ratio);
                    (ch.codec.is_some(), ch.codec.unwrap_or(preferred))
                }
            };
            let compress = compress && n > 0 && p > 1;
            // into the stager's pinned send buffer: no per-call host allocation, no copy
            let staged: Result<usize> = if compress {
                dev.compress_timed(buf, bound, codec).and_then(|len| {
                    dev.last.d2h = dev.scratch_to_pinned_send(len)?;
                    st.bound = stream_bound(bound, dev.pinned_bytes(true, len)?)?;
                    Ok(len)
                })
            } else {
                dev.values_to_pinned_send(buf)
            };
            match staged {
                Ok(len) => {
                    d.decision = u8::from(compress);
                    d.codec = if compress { codec.tag() } else { 0 };
                    d.payload = len as u64;
                }
                Err(e) => local = Err(e),
            }
        }
        let all = self.agree(d, local)?;
        let rd = all[root];
        let len = usize::try_from(rd.payload)
            .map_err(|_| Error::Comm(format!("root announced a {}-byte payload", rd.payload)))?;
        let compressed = rd.decision == 1;
        let codec = CodecKind::from_tag(rd.codec).unwrap_or(preferred);
        if compressed {
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.ratio = bytes / len.max(1) as f64;
            if r == root {
                self.ratios
                    .put(op_r, crate::comm::codec_key(key, codec), st.ratio);
            }
        }
        st.wire_bytes = len as u64;
        let ratio = if compressed { st.ratio } else { 1.0 };
        let terms = dp.staged(codec).bcast_terms(link, p, bytes, ratio);
        dev.last_predicted = record_prediction(&mut st, terms, compressed);
        Ok(BcastPrep {
            compressed,
            n,
            len,
            st,
            t0,
        })
    }

    /// Complete a non-blocking device broadcast into `buf` (same length as given to
    /// [`ibcast_device`](Self::ibcast_device); written on the root too).
    pub fn wait_bcast_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        req: DeviceBcastRequest,
        buf: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let DeviceBcastRequest {
            pending,
            prep:
                BcastPrep {
                    compressed,
                    n,
                    len,
                    mut st,
                    t0,
                },
            from_send,
        } = req;
        let t = now();
        let Some(mut b) = pending.wait()?.pop() else {
            return Err(Error::Comm(
                "bcast_device: the transfer lost its buffer".into(),
            ));
        };
        dev.last.network = t.elapsed().as_secs_f64();
        let bound = self.config.bound;
        let mut upload = || -> Result<()> {
            if buf.len() != n {
                return Err(Error::invalid(format!(
                    "bcast_device: buffer has {} values, ibcast_device was given {n}",
                    buf.len()
                )));
            }
            let payload: &[u8] = &b.bytes()?[..len];
            dev.upload_bytes(payload, buf, compressed)?;
            if compressed && st.bound == 0.0 {
                st.bound = stream_bound(bound, payload)?;
            }
            Ok(())
        };
        let r = upload();
        dev.reclaim_pinned(from_send, b);
        r?;
        Ok(self.finish(st, t0))
    }
}

/// Record a `(raw, compressed)` model prediction in `st` (both totals, and the one of the path
/// taken as `predicted_s`); returns the terms of the path taken.
fn record_prediction(st: &mut OpStats, (raw, cmp): (Terms, Terms), compressed: bool) -> Terms {
    st.predicted_raw_s = raw.total();
    st.predicted_compressed_s = cmp.total();
    let taken = if compressed { cmp } else { raw };
    st.predicted_s = taken.total();
    taken
}
