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
        // the raw path's prediction on the staged buffers (the host operation predicted it on
        // the host ping-pong's link)
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let (d2h, h2d) = (dp.d2h_s(in_bytes as f64), dp.h2d_s(out_bytes as f64));
        let raw = self.staged_raw_reduce_s::<T>(
            &dp,
            n,
            kind != Reduction::Scatter,
            kind == Reduction::Mean,
        );
        let compressed = st.decision == Decision::Compressed;
        dev.last_predicted = Terms {
            d2h,
            link: if compressed {
                st.predicted_s
            } else {
                raw - d2h - h2d
            },
            h2d,
            ..Terms::default()
        };
        let mut st = self.add_staging(dev, st, in_bytes, out_bytes);
        st.predicted_raw_s = raw;
        if !compressed {
            st.predicted_s = raw;
        }
        Ok(self.finish(st, t0))
    }

    /// Model seconds of the raw staged reduction of `n` values per rank (`full`: allreduce,
    /// else reduce-scatter): D2H of the input, the host algorithm on the pinned buffers, H2D
    /// of the result. The allreduce is the native MPI one (its calibrated line); the
    /// reduce-scatter is the raw ring: `p-1` exchanges of a segment between the pinned buffers
    /// ([`StagedModel::pair_s`]) and the host addition of each received segment. `mean`: the
    /// host algorithm also divides the result (one more host pass).
    pub(super) fn staged_raw_reduce_s<T: GpuElement + Real>(
        &self,
        dp: &Profile,
        n: usize,
        full: bool,
        mean: bool,
    ) -> f64 {
        let p = self.size();
        let bytes = (n * T::SIZE) as f64;
        let out_bytes = if full { bytes } else { bytes / p as f64 };
        let host = if full || p < 2 {
            let preferred = self.config.policy.codec().unwrap_or_default();
            self.reduce_times::<T>(n, full, mean, 1.0, preferred).0
        } else {
            let seg = bytes / p as f64;
            (p - 1) as f64
                * (self.profile.link.latency
                    + dp.pair_s(self.profile.link, seg)
                    + self.host_add_s(seg))
        };
        dp.d2h_s(bytes) + host + dp.h2d_s(out_bytes)
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
        // 1. agreement with the global value range (an allreduce's sampled, the exact one
        //    measured by its ring: `ring::FinalBound`; a reduce-scatter's by a range pass)
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
            dev.utils().and_then(|u| {
                if full {
                    u.sampled(&s, input)
                } else {
                    u.range(&s, input)
                }
            })
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
        let rule = crate::comm::ring::SplitRule {
            bound: self.config.bound,
            p,
            unit_roundoff: T::UNIT_ROUNDOFF,
            mean: kind == Reduction::Mean,
            full,
        };
        let bounds = crate::comm::ring::RingBounds::agree(
            rule,
            (glo <= ghi).then_some((glo, ghi)),
            full,
            self.transport(),
            || {
                let s = dev.stream();
                dev.utils().and_then(|u| u.range(&s, input))
            },
        )?;
        let split = bounds.split;
        let (e, d) = (split.result, split.divisor);
        let Some(eb) = split.step else {
            return Ok(None);
        };
        // 3. decision (identical on every rank: agreed profile and summed estimates)
        let preferred = self.config.policy.codec().unwrap_or_default();
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let link = self.profile.link;
        let bytes = n * T::SIZE;
        let raw_t = self.staged_raw_reduce_s::<T>(&dp, n, full, kind == Reduction::Mean);
        let key = crate::comm::coll_key(n, self.config.bound);
        // the ring's per-step ratio and (allreduces) the final streams' ratio, remembered
        // separately per codec: the final segment is a sum of `p` fields compressed at a bound
        // of its own
        let (opk, opf) = (op | 0x80, op | 0xC0);
        let mean = kind == Reduction::Mean;
        let fin = |r: f64| full.then_some(r);
        let (codec, ratio, ratio_f) = match self.config.policy {
            Policy::Never => return Ok(None),
            Policy::Always(c) => {
                let k = crate::comm::codec_key(key, c);
                let est = self.ratios.get(opk, k);
                let est_f = self.ratios.get(opf, k).or(est);
                (c, est.unwrap_or(1.0), est_f.unwrap_or(1.0))
            }
            Policy::Auto(_) => {
                let seg0 = input.slice(..n.div_ceil(p));
                match self.ring_choice(
                    dev,
                    &seg0,
                    &dp,
                    preferred,
                    ErrorBound::Abs(eb * d),
                    (opk, opf, key),
                    |d, r, rf| {
                        d.reduce_terms(link, p, bytes as f64, r, fin(rf), mean)
                            .total()
                    },
                    raw_t,
                )? {
                    Some(x) => x,
                    None => return Ok(None),
                }
            }
        };
        let dp = dp.staged(codec);
        let cmp_t = dp
            .reduce_terms(link, p, bytes as f64, ratio, fin(ratio_f), mean)
            .total();
        let mut st = OpStats::decided(op, bytes as f64, ratio, (raw_t, cmp_t), true);
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = e;
        // 4. the device-resident ring (`comm::device_ring`, the loopback benchmark's algorithm)
        //    over this transport, each message staged through the pinned buffers: GPU
        //    compression, D2H, the transport, H2D into a pooled device buffer, the fused
        //    decompress-and-add; the input is read in place. Every rank fails together.
        let plan = crate::comm::ring::RingPlan::with_bounds((r, p), &bounds, codec)?;
        let run = dev.over_staged_link(self.transport(), |link, gpu, scratch| {
            crate::comm::device_ring::ring(link, gpu, input, out, scratch, plan)
        })?;
        st.bound = run.bytes.result_bound.unwrap_or(e);
        let ring_wire = run.bytes.reduce_scatter;
        let wire = run.bytes.total(p);
        let moved = if full { 2.0 } else { 1.0 } * bytes as f64 * (pf - 1.0) / pf;
        st.ratio = moved / wire.max(1) as f64;
        st.wire_bytes = wire as u64;
        // the ring's per-step ratio: the prediction at the ratio met, and the estimate of the
        // next Auto decision of this size and bound
        let rr = ((bytes as f64 / pf) * (pf - 1.0) / ring_wire.max(1) as f64).max(1.0);
        // this rank's final stream: its segment once
        let seg_bytes = (crate::comm::partition(n, p)[r].len() * T::SIZE) as f64;
        let rf = (seg_bytes / run.bytes.final_stream.max(1) as f64).max(1.0);
        let terms = dp.reduce_terms(link, p, bytes as f64, rr, fin(rf), mean);
        st.predicted_compressed_s = terms.total();
        st.predicted_s = st.predicted_compressed_s;
        dev.last_predicted = terms;
        let k = crate::comm::codec_key(key, codec);
        self.ratios.put(opk, k, rr);
        if full {
            self.ratios.put(opf, k, rf);
        }
        tracing::debug!(target: "zcomm::comm", stages = ?dev.last, "{} device ring", crate::comm::op_name(op));
        Ok(Some(self.finish(st, t0)))
    }
}
