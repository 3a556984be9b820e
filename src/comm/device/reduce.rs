//! The reductions of device buffers: the device-resident compressed ring and the staged host
//! fallback.

use super::*;

/// Which host reduction a device reduction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reduction {
    Sum,
    Mean,
    Scatter,
}

impl Reduction {
    pub(super) fn op(self) -> u8 {
        match self {
            Reduction::Sum => crate::comm::OP_ALLREDUCE,
            Reduction::Mean => crate::comm::OP_ALLREDUCE_MEAN,
            Reduction::Scatter => crate::comm::OP_REDUCE_SCATTER,
        }
    }
}

/// The noa bound of a staged stream (its header's range), else the bound's value.
pub(super) fn stream_bound(bound: ErrorBound, stream: &[u8]) -> Result<f64> {
    Ok(match bound {
        ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
        ErrorBound::Noa(e) => {
            let h = crate::inspect(stream)?;
            e * (h.range_max - h.range_min)
        }
    })
}

/// Pinned host bytes as values (little-endian host checked by the caller). Pinned allocations
/// are page-aligned and the callers slice them from offset 0 in whole values.
pub(super) fn pinned_values<T: Real>(b: &[u8]) -> &[T] {
    // SAFETY: T is f32 or f64 (`Real`): plain data, every bit pattern valid.
    let (pre, v, post) = unsafe { b.align_to::<T>() };
    assert!(pre.is_empty() && post.is_empty(), "pinned buffer alignment");
    v
}

/// Mutable [`pinned_values`].
pub(super) fn pinned_values_mut<T: Real>(b: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `pinned_values`.
    let (pre, v, post) = unsafe { b.align_to_mut::<T>() };
    assert!(pre.is_empty() && post.is_empty(), "pinned buffer alignment");
    v
}

/// D2H of a device buffer into a host vector (the raw staging of the composed operations).
pub(super) fn stage_values<T: GpuElement + Real>(
    dev: &mut DeviceStager,
    input: &CudaView<'_, T>,
) -> Result<Vec<T>> {
    let mut host = vec![T::default(); input.len()];
    match crate::comm::element::scalar_bytes_mut(&mut host) {
        Some(b) => dev.copy_to_host(input, b)?,
        None => {
            return Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            ))
        }
    }
    Ok(host)
}

impl Communicator {
    /// Sum of device buffers over all ranks with the end-to-end bound of the host
    /// [`allreduce`](Communicator::allreduce); compressed, a device-resident ring (see the
    /// [module docs](super)). Collective.
    pub fn allreduce_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, Reduction::Sum)
    }

    /// Mean of device buffers over all ranks (gradient averaging; the bound applies to the
    /// mean). Collective.
    pub fn allreduce_mean_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, Reduction::Mean)
    }

    /// Reduce-scatter (sum) of device buffers: rank `r` receives segment `r` of
    /// [`partition`](crate::comm::partition)`(input.len(), size)` (of the scalars: complex data is
    /// passed interleaved) in `out`, with the end-to-end bound of the host
    /// [`reduce_scatter`](Communicator::reduce_scatter) (`p-1` quantizations). Collective.
    pub fn reduce_scatter_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        self.reduce_device(dev, input, out, Reduction::Scatter)
    }

    /// Fail every rank of a collective reduction together: this rank's descriptor is marked bad
    /// (the other ranks are in the host algorithm's agreement).
    pub(super) fn fail_reduction<T: Real>(&mut self, op: u8, n: usize, e: Error) -> Error {
        let d = Desc {
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(op, n)
        };
        match self.agree(d, Err(e)) {
            Err(e) => e,
            Ok(_) => Error::Comm("device reduction: staging failed".into()),
        }
    }

    pub(super) fn reduce_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        kind: Reduction,
    ) -> Result<OpStats> {
        // the device-resident compressed ring where it applies and the decision is to
        // compress; otherwise the staged host algorithm below
        if let Some(st) = self.reduce_device_ring(dev, input, out, kind)? {
            return Ok(st);
        }
        let t0 = self.wtime();
        let n = input.len();
        let want = match kind {
            Reduction::Scatter => crate::comm::partition(n, self.size())[self.rank()].len(),
            _ => n,
        };
        dev.last = StageTimes::default();
        let (in_bytes, out_bytes) = (n * T::SIZE, want * T::SIZE);
        // the values move through the stager's pinned buffers (grown once, then reused): D2H
        // into the send buffer, the host algorithm from it into the receive buffer, H2D from
        // there (no per-call host allocation, no zero-filling, no pageable copies)
        let staged = if out.len() != want {
            Err(Error::invalid(format!(
                "{}: output has {} values, expected {want}",
                crate::comm::op_name(kind.op()),
                out.len()
            )))
        } else if cfg!(target_endian = "big") {
            Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            ))
        } else {
            let s = dev.stream();
            dev.values_to_pinned_send(input)
                .and_then(|_| DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, out_bytes))
        };
        if let Err(e) = staged {
            return Err(self.fail_reduction::<T>(kind.op(), n, e));
        }
        let t = now();
        let (ps, mut pr) = (dev.pinned_send.take(), dev.pinned_recv.take());
        let r = match (&ps, &mut pr) {
            (Some(a), Some(b)) => (|| {
                let x = pinned_values::<T>(&a.as_slice().map_err(gpu_err("pinned"))?[..in_bytes]);
                let y = pinned_values_mut::<T>(
                    &mut b.as_mut_slice().map_err(gpu_err("pinned"))?[..out_bytes],
                );
                match kind {
                    Reduction::Sum => self.allreduce(x, y),
                    Reduction::Mean => self.allreduce_mean(x, y),
                    Reduction::Scatter => self.reduce_scatter(x, y),
                }
            })(),
            _ => Err(Error::Comm("device staging: no pinned buffer".into())),
        };
        dev.pinned_send = ps;
        dev.pinned_recv = pr;
        let st = r?;
        dev.last.network = t.elapsed().as_secs_f64();
        dev.upload_pinned(false, 0..out_bytes, out, false)?;
        {
            let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
            dev.last_predicted = Terms {
                d2h: dp.d2h_s(in_bytes as f64),
                link: st.predicted_s,
                h2d: dp.h2d_s(out_bytes as f64),
                ..Terms::default()
            };
        }
        let st = self.add_staging(dev, st, in_bytes, out_bytes);
        Ok(self.finish(st, t0))
    }

    /// The compressed device ring of the blocking device reductions (see the
    /// [module docs](super)). Returns `Ok(None)` (nothing done, every rank alike) where it does
    /// not apply or the decision is raw: the caller then runs the staged host path.
    ///
    /// Applies with a policy other than `Never`, more than one rank, an abs or noa bound and at
    /// least one value per rank. Collective order: the agreement (with the device value range),
    /// under `Auto` a sum of the ratio estimates, the `p-1` ring steps (every rank runs all of
    /// them, failed or not: a failure travels as a header flag instead of a stream), a second
    /// agreement (every rank fails together), then (allreduce) the lengths and the allgather
    /// of the final streams.
    pub(super) fn reduce_device_ring<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        kind: Reduction,
    ) -> Result<Option<OpStats>> {
        let (p, r, n) = (self.size(), self.rank(), input.len());
        if matches!(self.config.policy, Policy::Never)
            || matches!(self.config.bound, ErrorBound::Rel(_))
            || p < 2
        {
            return Ok(None);
        }
        let t0 = self.wtime();
        let op = kind.op();
        let full = kind != Reduction::Scatter;
        let want = if full {
            n
        } else {
            crate::comm::partition(n, p)[r].len()
        };
        dev.last = StageTimes::default();
        // 1. agreement with the global value range (device range pass on every rank)
        let local = if out.len() != want {
            Err(Error::invalid(format!(
                "{}: output has {} values, expected {want}",
                crate::comm::op_name(op),
                out.len()
            )))
        } else if cfg!(target_endian = "big") {
            Err(Error::Unavailable(
                "device staging needs a little-endian host".into(),
            ))
        } else {
            let s = dev.stream();
            dev.utils().and_then(|u| u.range(&s, input))
        };
        let (lo, hi) = match &local {
            Ok(Some(v)) => *v,
            _ => (f64::INFINITY, f64::NEG_INFINITY),
        };
        let desc = Desc {
            count: n as u64,
            dtype: elem_tag::<T>(),
            lo,
            hi,
            ..self.local_desc::<f32>(op, n)
        };
        let all = self.agree(desc, local.map(|_| ()))?;
        if n < p {
            return Ok(None);
        }
        // 2. the per-quantization bound (exactly the host path's)
        let glo = all.iter().map(|d| d.lo).fold(f64::INFINITY, f64::min);
        let ghi = all.iter().map(|d| d.hi).fold(f64::NEG_INFINITY, f64::max);
        let pf = p as f64;
        let split = crate::comm::ring::BoundSplit::new(
            self.config.bound,
            (glo, ghi),
            p,
            T::UNIT_ROUNDOFF,
            kind == Reduction::Mean,
            full,
        );
        let (e, d) = (split.result, split.divisor);
        let Some(eb) = split.step else {
            return Ok(None);
        };
        // 3. decision (identical on every rank: agreed profile and summed estimates)
        let codec = self.config.policy.codec().unwrap_or_default();
        let dp = dev.profile.clone().unwrap_or_else(DeviceProfile::guess);
        let link = self.profile.link;
        let (bytes, out_bytes) = (n * T::SIZE, want * T::SIZE);
        let (host_raw, _) =
            self.reduce_times::<T>(n, full, 1.0, self.config.policy.codec().unwrap_or_default());
        let raw_t = host_raw + dp.d2h_s(bytes as f64) + dp.h2d_s(out_bytes as f64);
        let key = crate::comm::coll_key(n, self.config.bound);
        // the ring's per-step ratio and (allreduces) the final streams' ratio, remembered
        // separately: the final segment is a sum of `p` fields compressed at a bound of its own
        let (opk, opf) = (op | 0x80, op | 0xC0);
        let est = self.ratios.get(opk, key);
        let est_f = self.ratios.get(opf, key).or(est);
        let mean = kind == Reduction::Mean;
        let fin = |r: f64| full.then_some(r);
        let (compress, ratio, ratio_f) = match self.config.policy {
            Policy::Never => (false, 1.0, 1.0),
            Policy::Always(_) => (true, est.unwrap_or(1.0), est_f.unwrap_or(1.0)),
            Policy::Auto(_) => {
                // never when even an infinite ratio cannot pay; without an estimate on every
                // rank yet, compress once to learn the ratio. The inputs are summed and the
                // verdict is the minimum over the ranks, so every rank takes the same path
                // even with differing profiles.
                let inf = f64::INFINITY;
                let best = dp
                    .reduce_terms(link, p, bytes as f64, inf, fin(inf), mean)
                    .total();
                let mut v = [
                    1.0 / est.unwrap_or(1.0).max(1e-9),
                    f64::from(u8::from(est.is_some())),
                    f64::from(u8::from(crate::model::choice::compressed_wins(best, raw_t))),
                    1.0 / est_f.unwrap_or(1.0).max(1e-9),
                ];
                self.transport().allreduce_f64(&mut v, ReduceOp::Sum)?;
                let (ratio, ratio_f) = (pf / v[0], pf / v[3]);
                let (known, can) = (v[1] >= pf - 0.5, v[2] >= pf - 0.5);
                let cmp = dp
                    .reduce_terms(link, p, bytes as f64, ratio, fin(ratio_f), mean)
                    .total();
                let mut w = [f64::from(u8::from(
                    can && (!known || crate::model::choice::compressed_wins(cmp, raw_t)),
                ))];
                self.transport().allreduce_f64(&mut w, ReduceOp::Min)?;
                (w[0] > 0.5, ratio, ratio_f)
            }
        };
        if !compress {
            return Ok(None);
        }
        let mut st = OpStats::raw(op);
        st.bytes = bytes as u64;
        st.ratio_estimate = ratio;
        st.predicted_raw_s = raw_t;
        st.predicted_compressed_s = dp
            .reduce_terms(link, p, bytes as f64, ratio, fin(ratio_f), mean)
            .total();
        st.predicted_s = st.predicted_compressed_s;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = e;
        // 4. the ring reduce-scatter on device segments
        let segs = crate::comm::partition(n, p);
        let cap = crate::compress_bound(segs[0].len(), T::DTYPE);
        let s = dev.stream();
        let step_bound = ErrorBound::Abs(eb * d);
        let (to, from) = ((r + 1) % p, (r + p - 1) % p);
        let mut failed: Option<Error> = None;
        // buffers: pinned send (one stream), pinned receive (every final stream of the
        // allgather, else one stream), the device accumulator: `out` itself for the
        // allreduces (a device copy of the input), a segment scratch for reduce-scatter with
        // more than two ranks (the last step adds straight into `out`)
        let setup = (|| -> Result<Option<CudaSlice<T>>> {
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, cap)?;
            DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, if full { p * cap } else { cap })?;
            DeviceStager::grow_dev(&mut dev.scratch_in, &s, cap)?;
            if full {
                s.memcpy_dtod(input, out).map_err(gpu_err("dtod"))?;
                Ok(None)
            } else if p > 2 {
                // SAFETY: each use is written (a device copy of the input segment) before read.
                let b = unsafe { s.alloc::<T>(segs[0].len()) }.map_err(|e| {
                    Error::OutOfMemory(format!("{} device values: {e:?}", segs[0].len()))
                })?;
                Ok(Some(b))
            } else {
                Ok(None)
            }
        })();
        let mut tmp = match setup {
            Ok(t) => t,
            Err(e) => {
                failed = Some(e);
                None
            }
        };
        let mut wire = 0usize;
        for step in 0..p - 1 {
            let send_seg = segs[(r + 2 * p - step - 1) % p].clone();
            let recv_seg = segs[(r + 2 * p - step - 2) % p].clone();
            // compress the outgoing partial sum, D2H of its stream
            let mine = if failed.is_some() {
                None
            } else {
                let l = if full {
                    let v = out.slice(send_seg.clone());
                    dev.compress_to_pinned_send(&v, step_bound, codec)
                } else if step == 0 {
                    let v = input.slice(send_seg.clone());
                    dev.compress_to_pinned_send(&v, step_bound, codec)
                } else {
                    match &tmp {
                        Some(b) => {
                            let v = b.slice(0..send_seg.len());
                            dev.compress_to_pinned_send(&v, step_bound, codec)
                        }
                        None => Err(Error::Comm("device ring: no accumulator".into())),
                    }
                };
                match l {
                    Ok(l) => Some(l),
                    Err(e) => {
                        failed = Some(e);
                        None
                    }
                }
            };
            wire += mine.unwrap_or(0);
            let t = now();
            let got = self.ring_exchange(dev, mine, to, from)?;
            dev.last.network += t.elapsed().as_secs_f64();
            // H2D of the received stream, decompress-and-add into the accumulator
            match got {
                Ok(m) if failed.is_none() => {
                    let res = if full {
                        let mut v = out.slice_mut(recv_seg.clone());
                        dev.upload_add(m, &mut v)
                    } else if step == p - 2 {
                        // recv_seg is this rank's segment: accumulate in `out`
                        let x = input.slice(recv_seg.clone());
                        s.memcpy_dtod(&x, out)
                            .map_err(gpu_err("dtod"))
                            .and_then(|()| dev.upload_add(m, out))
                    } else {
                        match tmp.as_mut() {
                            Some(b) => {
                                let x = input.slice(recv_seg.clone());
                                let mut v = b.slice_mut(0..recv_seg.len());
                                s.memcpy_dtod(&x, &mut v)
                                    .map_err(gpu_err("dtod"))
                                    .and_then(|()| dev.upload_add(m, &mut v))
                            }
                            None => Err(Error::Comm("device ring: no accumulator".into())),
                        }
                    };
                    if let Err(e) = res {
                        failed = Some(e);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        drop(tmp.take());
        // 5. (allreduce) the mean's division, then the final segment compressed once with eb
        let mut mine_len = 0;
        if full && failed.is_none() {
            let res = (|| -> Result<usize> {
                if d != 1.0 {
                    let mut v = out.slice_mut(segs[r].clone());
                    let u = dev.utils()?;
                    u.scale(&s, &mut v, T::from_f64(d))?;
                    s.synchronize().map_err(gpu_err("sync"))?;
                }
                let v = out.slice(segs[r].clone());
                dev.compress_to_pinned_send(&v, ErrorBound::Abs(eb), codec)
            })();
            match res {
                Ok(l) => mine_len = l,
                Err(e) => failed = Some(e),
            }
        }
        // every rank fails together (a failure only reached the ring neighbours so far)
        let desc = Desc {
            count: n as u64,
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(op, n)
        };
        self.agree(desc, failed.map_or(Ok(()), Err))?;
        let ring_wire = wire;
        let mut final_total = 0usize;
        if full {
            // 6. allgather of the final streams (pinned, as allgather_device), then H2D +
            // GPU decompression of every stream (this rank's own too: identical results)
            let lens = self.transport().allgather_lens(mine_len)?;
            let total: usize = lens.iter().sum();
            final_total = total;
            if total > p * cap {
                return Err(Error::Comm(format!(
                    "device allreduce: {total} bytes of final streams exceed {}",
                    p * cap
                )));
            }
            let t = now();
            let (ps, mut pr) = (dev.pinned_send.take(), dev.pinned_recv.take());
            let g = gather_pinned(self.transport(), &ps, &mut pr, mine_len, &lens, total);
            dev.pinned_send = ps;
            dev.pinned_recv = pr;
            g?;
            dev.last.network += t.elapsed().as_secs_f64();
            let mut off = 0;
            for (k, &l) in lens.iter().enumerate() {
                let mut view = out.slice_mut(segs[k].clone());
                if k == r {
                    dev.upload_pinned(true, 0..mine_len, &mut view, true)?;
                } else {
                    dev.upload_pinned(false, off..off + l, &mut view, true)?;
                }
                off += l;
            }
            wire += mine_len * (p - 1);
            st.ratio = (2.0 * bytes as f64 * (pf - 1.0) / pf) / wire.max(1) as f64;
        } else {
            st.ratio = (bytes as f64 * (pf - 1.0) / pf) / wire.max(1) as f64;
        }
        st.wire_bytes = wire as u64;
        // the ring's per-step ratio: the prediction at the ratio met, and the estimate of the
        // next Auto decision of this size and bound
        let rr = ((bytes as f64 / pf) * (pf - 1.0) / ring_wire.max(1) as f64).max(1.0);
        // the final streams: every segment once (`bytes` in all)
        let rf = (bytes as f64 / final_total.max(1) as f64).max(1.0);
        let terms = dp.reduce_terms(link, p, bytes as f64, rr, fin(rf), mean);
        st.predicted_compressed_s = terms.total();
        st.predicted_s = st.predicted_compressed_s;
        dev.last_predicted = terms;
        self.ratios.put(opk, key, rr);
        if full {
            self.ratios.put(opf, key, rf);
        }
        tracing::debug!(target: "zcomm::comm", stages = ?dev.last, "{} device ring", crate::comm::op_name(op));
        Ok(Some(self.finish(st, t0)))
    }

    /// One ring step's exchange: this rank's stream (`mine`: the first bytes of the pinned
    /// send buffer; `None` after a failure, sent as a flagged empty message) to `to`, the
    /// neighbour's into the pinned receive buffer from `from` (a length header first, then the
    /// sized payload). Returns the received length, or (inner error) the neighbour's failure or
    /// an oversized stream (received and dropped, so both sides stay matched). MPI errors are
    /// returned as the outer error.
    pub(super) fn ring_exchange(
        &self,
        dev: &mut DeviceStager,
        mine: Option<usize>,
        to: usize,
        from: usize,
    ) -> Result<Result<usize>> {
        let t = self.transport();
        let mut hdr = [0u8; 16];
        hdr[..8].copy_from_slice(&(mine.unwrap_or(0) as u64).to_le_bytes());
        hdr[8] = u8::from(mine.is_none());
        let theirs = t.sendrecv(to, &hdr, from, crate::comm::TAG_RING)?;
        if theirs.len() != 16 {
            return Err(Error::Comm(format!(
                "device ring: {}-byte step header",
                theirs.len()
            )));
        }
        let bad = theirs[8] != 0;
        let m = u64::from_le_bytes(theirs[..8].try_into().expect("8 bytes"));
        let m = usize::try_from(m)
            .map_err(|_| Error::Comm(format!("device ring: {m}-byte stream announced")))?;
        let payload: &[u8] = match (mine, &dev.pinned_send) {
            (Some(l), Some(b)) => &b.as_slice().map_err(gpu_err("pinned"))?[..l],
            _ => &[],
        };
        let buf: &mut [u8] = match &mut dev.pinned_recv {
            Some(b) => b.as_mut_slice().map_err(gpu_err("pinned"))?,
            None => &mut [],
        };
        if m > buf.len() {
            // drain the oversized message (fallibly: `m` came over the wire)
            let mut v = Vec::new();
            v.try_reserve_exact(m).map_err(|_| {
                Error::OutOfMemory(format!("device ring: {m}-byte stream announced"))
            })?;
            v.resize(m, 0u8);
            t.sendrecv_sized(to, payload, from, &mut v, crate::comm::TAG_RING)?;
            return Ok(Err(Error::Comm(format!(
                "device ring: {m}-byte stream exceeds the receive buffer"
            ))));
        }
        t.sendrecv_sized(to, payload, from, &mut buf[..m], crate::comm::TAG_RING)?;
        if bad {
            return Ok(Err(Error::Comm(
                "device ring: a neighbouring rank failed".into(),
            )));
        }
        Ok(Ok(m))
    }
}
