//! Allgather, allreduce, allreduce_mean and reduce_scatter of device buffers over NCCL.

use super::auto::RatioKey;
use super::*;
use crate::comm::{device_gather, device_ring};

impl NcclComm {
    /// Gather `send` from every rank into `out` (`out.len() == size * send.len()`, rank order),
    /// compressed per the policy (every rank ends with identical values, its own segment
    /// included). Bound: `abs:E`, `noa:E` of each rank's own range, or `rel:E`, per value.
    ///
    /// `Auto` decides from the agreed ratio cache or a sample (see the [module docs](super));
    /// only a compressing call reads the whole buffer for its value range. If any rank lacks the
    /// device codec, `Auto` runs raw NCCL and `Always` returns [`Error::Unavailable`], on every
    /// rank alike.
    pub fn allgather<T: NcclReal>(
        &mut self,
        send: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let p = self.size();
        let n = send.len();
        if out.len() != n * p {
            return Err(Error::invalid(format!(
                "allgather: output has {} elements, expected {p} x {n}",
                out.len()
            )));
        }
        let bytes = n * T::SIZE;
        let dt = T::DTYPE.tag();
        // the device allgather (`comm::device_gather`) in the pieces the model chooses
        let pieces = |prof: &Profile, codec, ratio: WireRatio| {
            prof.gather_pieces(bytes as f64, p, ratio, codec, dt)
        };
        let predict = |prof: &Profile, codec, ratio: WireRatio| {
            let k = pieces(prof, codec, ratio);
            prof.predict_allgather(bytes as f64, p, ratio, k, codec, dt)
        };
        let preferred = self.config.policy.codec().unwrap_or_default();
        let raw_t = predict(&self.profile, preferred, WireRatio::from(1.0)).0;
        let cands = self.candidates(n > 0 && p > 1, raw_t, |c| {
            predict(&self.profile, c, WireRatio::from(1e12)).1
        });
        let plan = self.plan::<T>(OP_ALLGATHER, n, &cands, |c, codec| {
            c.sample_ratio(&send.as_view(), codec, None)
        })?;
        let mut st = OpStats::raw_bytes(OP_ALLGATHER, bytes);
        st.predicted_raw_s = raw_t;
        st.predicted_s = raw_t;
        let chosen = self.decide(&plan, &mut st, |c, r| predict(&self.profile, c, r).1);
        let Some((codec, planned)) = chosen else {
            self.sh.allgather(send, out)?;
            return self.finish(st, t0);
        };
        let bound = self.piece_bound(&send.as_view())?;
        // the pieces: the model's count at the planned ratio (without an estimate, `Always`:
        // this shape's last measured one), the largest any rank chose; buffers too small to
        // cut skip the agreement round (every rank knows the size)
        let n_pieces = match self.config.pieces {
            Some(k) => k,
            None if bytes as f64 >= 2.0 * crate::model::direct::PIECE_MIN_BYTES => {
                let wr = self.piece_ratio(OP_ALLGATHER, dt, n, codec, planned);
                let mut k = [pieces(&self.profile, codec, wr) as f64];
                self.sh.boot.allreduce_f64(&mut k, ReduceOp::Max)?;
                k[0] as usize
            }
            None => 1,
        };
        // the device allgather of every transport (`comm::device_gather`) over NCCL
        let (g, wire) = self.over_link(|link, gpu| {
            let (x, mut o) = (send.as_view(), out.as_view_mut());
            device_gather::allgather_in_pieces(link, gpu, &x, &mut o, (bound, codec), n_pieces)
        })?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.pieces = g.pieces as u32;
        st.bound = match bound {
            ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
            ErrorBound::Noa(e) => e,
        };
        st.wire_bytes = wire.sent as u64;
        let moved = (bytes * (p - 1)) as f64;
        st.ratio = moved / wire.sent.max(1) as f64;
        // the time follows the larger and the smaller piece of every round: predict (and
        // remember for `Auto`) the ratios of both directions
        let wr = wire.ratios(moved);
        self.last_ratios = Some(wr);
        self.measured_ratios
            .insert(RatioKey::of(OP_ALLGATHER, dt, n, codec), wr);
        let cmp_t = self
            .profile
            .predict_allgather(bytes as f64, p, wr, g.pieces, codec, dt)
            .1;
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = cmp_t;
        self.agree_measured::<T>(OP_ALLGATHER, n, codec, wr)?;
        self.finish(st, t0)
    }

    /// Sum over all ranks into `out` (same length) with the end-to-end bound of the
    /// [module docs](super); identical results on every rank.
    ///
    /// `Auto` decides from the agreed ratio cache or a sample (see the [module docs](super)); the
    /// global value range (a pass over the buffer and a small MPI allreduce) is only computed
    /// when the call compresses. If any rank lacks the device codec, `Auto` runs raw NCCL and
    /// `Always` returns [`Error::Unavailable`], on every rank alike (the same holds for
    /// [`allreduce_mean`](Self::allreduce_mean) and [`reduce_scatter`](Self::reduce_scatter)).
    pub fn allreduce<T: NcclReal>(
        &mut self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        self.reduce_impl(OP_ALLREDUCE, input, out)
    }

    /// Mean over all ranks (gradient averaging); the bound applies to the mean.
    pub fn allreduce_mean<T: NcclReal>(
        &mut self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        self.reduce_impl(OP_ALLREDUCE_MEAN, input, out)
    }

    /// Reduce-scatter (sum): rank `r` receives segment `r` of
    /// [`partition`]`(input.len(), size)` in `out`.
    pub fn reduce_scatter<T: NcclReal>(
        &mut self,
        input: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        self.reduce_impl(OP_REDUCE_SCATTER, input, out)
    }

    pub(super) fn reduce_impl<T: NcclReal>(
        &mut self,
        op: u8,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let (p, r) = (self.size(), self.rank());
        let n = x.len();
        let full = op != OP_REDUCE_SCATTER;
        let segs = partition(n, p);
        let want_len = if full { n } else { segs[r].len() };
        if out.len() != want_len {
            return Err(Error::invalid(format!(
                "{}: output has {} elements, expected {want_len}",
                op_name(op),
                out.len()
            )));
        }
        if matches!(self.config.bound, ErrorBound::Rel(_)) {
            return Err(Error::invalid(format!(
                "{}: rel bounds are not supported for reductions (use abs or noa)",
                op_name(op)
            )));
        }
        let bytes = n * T::SIZE;
        let dt = T::DTYPE.tag();
        // the device ring cuts its segments into the pieces the model chooses
        let pieces = |prof: &Profile, codec, ratio: WireRatio| {
            prof.ring_pieces(bytes as f64, p, ratio, codec, dt, !full)
        };
        let predict = |prof: &Profile, codec, ratio: WireRatio| {
            let k = pieces(prof, codec, ratio);
            prof.predict_allreduce(bytes as f64, p, ratio, k, codec, dt, !full)
        };
        let preferred = self.config.policy.codec().unwrap_or_default();
        let raw_t = predict(&self.profile, preferred, WireRatio::from(1.0)).0;
        let cands = self.candidates(n > 0 && p > 1, raw_t, |c| {
            predict(&self.profile, c, WireRatio::from(1e12)).1
        });
        let d = if op == OP_ALLREDUCE_MEAN {
            p as f64
        } else {
            1.0
        };
        let nq = if full { p } else { (p - 1).max(1) };
        let plan = self.plan::<T>(op, n, &cands, |c, codec| {
            c.sample_ratio(&x.as_view(), codec, Some((p, d, nq)))
        })?;
        let mut st = OpStats::raw_bytes(op, bytes);
        st.predicted_raw_s = raw_t;
        st.predicted_s = raw_t;
        let chosen = self.decide(&plan, &mut st, |c, r| predict(&self.profile, c, r).1);
        let mut compress = chosen.is_some();
        let codec = chosen.map_or(preferred, |x| x.0);
        let mut bounds = None;
        let mut ring_pieces = 1;
        if compress {
            // compressing (same decision on all ranks): the global range and magnitude, then
            // the per-quantization bound (identical on all ranks); an allreduce starts from a
            // sampled range and measures the exact one in its ring (`ring::FinalBound`). The
            // ring's pieces are agreed in the same round (the largest count any rank's model
            // chose), since every rank must cut its segments alike.
            let local = if full {
                self.utils.sampled_range(&self.sh.work, &x.as_view())?
            } else {
                self.utils.range(&self.sh.work, &x.as_view())?
            };
            let (lo, hi) = local.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
            // (without an estimate, `Always`: the ratio this shape had last time, if any)
            let (c, planned) = chosen.unwrap_or((codec, WireRatio::from(1.0)));
            let wr = self.piece_ratio(op, dt, n, c, planned);
            let k = self
                .config
                .pieces
                .unwrap_or_else(|| pieces(&self.profile, c, wr)) as f64;
            let mut mm = [-lo, hi, k];
            self.sh.boot.allreduce_f64(&mut mm, ReduceOp::Max)?;
            let (glo, ghi) = (-mm[0], mm[1]);
            ring_pieces = mm[2] as usize;
            let rule = crate::comm::ring::SplitRule {
                bound: self.config.bound,
                p,
                unit_roundoff: T::UNIT_ROUNDOFF,
                mean: op == OP_ALLREDUCE_MEAN,
                full,
            };
            let b = crate::comm::ring::RingBounds::agree(
                rule,
                (glo <= ghi).then_some((glo, ghi)),
                full,
                &*self.sh.boot,
                || self.utils.range(&self.sh.work, &x.as_view()),
            )?;
            compress = b.split.step.is_some();
            bounds = Some(b);
        }
        let bounds = match bounds {
            Some(b) if compress => b,
            _ => {
                self.raw_reduce(op, x, out, &segs)?;
                return self.finish(st, t0);
            }
        };
        // compressed: the device ring of every transport (`comm::device_ring`) with NCCL
        // carrying its messages; the input is read in place, the partial sums accumulate in
        // `out` (reduce-scatter: this rank's segment only)
        let plan = crate::comm::ring::RingPlan::with_bounds((r, p), &bounds, codec)?
            .with_pieces(ring_pieces);
        let (run, wire) = self.over_link(|link, gpu| {
            let (x, mut o) = (x.as_view(), out.as_view_mut());
            let mut scratch = gpu.ring_scratch.take();
            let r = device_ring::ring(link, gpu, &x, &mut o, &mut scratch, plan);
            gpu.ring_scratch = scratch;
            r
        })?;
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.pieces = run.pieces as u32;
        st.bound = run.bytes.result_bound.unwrap_or(bounds.split.result);
        st.wire_bytes = wire.sent as u64;
        let moved = if full {
            2 * (p - 1) * bytes / p
        } else {
            (p - 1) * bytes / p
        };
        st.ratio = moved as f64 / wire.sent.max(1) as f64;
        // every ring step ends when the larger of the pieces sent and received has arrived (a
        // rank whose segment compresses worse holds up its neighbours), the smaller one sharing
        // the link meanwhile: predict, and remember for `Auto`, the ratios of both directions
        let wr = wire.ratios(moved as f64);
        self.last_ratios = Some(wr);
        self.measured_ratios
            .insert(RatioKey::of(op, dt, n, codec), wr);
        let cmp_t = self
            .profile
            .predict_allreduce(bytes as f64, p, wr, ring_pieces, codec, dt, !full)
            .1;
        st.predicted_compressed_s = cmp_t;
        st.predicted_s = cmp_t;
        self.agree_measured::<T>(op, n, codec, wr)?;
        self.finish(st, t0)
    }

    /// The ratio a collective's piece count is chosen from: the `planned` one, or where the
    /// policy made no estimate (`Always`, a ratio of 1e12) this shape's last measured one.
    fn piece_ratio(
        &self,
        op: u8,
        dtype: u8,
        n: usize,
        codec: CodecKind,
        planned: WireRatio,
    ) -> WireRatio {
        if planned.major < 1e12 {
            return planned;
        }
        self.measured_ratios
            .get(&RatioKey::of(op, dtype, n, codec))
            .copied()
            .unwrap_or(planned)
    }

    /// Run `f` with this rank's NCCL device link and its GPU codec (what the device algorithms
    /// of every transport, `comm::device_ring` and `comm::device_gather`, run on); returns
    /// `f`'s result and the bytes the link moved.
    fn over_link<R>(
        &mut self,
        f: impl FnOnce(&device_link::NcclLink<'_>, &mut crate::gpu::GpuCodec) -> Result<R>,
    ) -> Result<(R, Wire)> {
        let NcclComm {
            sh,
            gpu,
            gpu_error,
            ring_pool,
            ..
        } = self;
        let gpu = gpu
            .as_mut()
            .ok_or_else(|| Error::Unavailable(format!("GPU codec: {gpu_error}")))?;
        let link = device_link::NcclLink::new(sh, ring_pool);
        let r = f(&link, gpu)?;
        Ok((r, link.wire()))
    }

    pub(super) fn raw_reduce<T: NcclReal>(
        &mut self,
        op: u8,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (p, r) = (self.size(), self.rank());
        if op == OP_REDUCE_SCATTER {
            let n = x.len();
            if n % p == 0 {
                let (src, _g1) = x.device_ptr(&self.sh.net);
                let (dst, _g2) = out.device_ptr_mut(&self.sh.net);
                // SAFETY: x holds p * out.len() elements; guards outlive the enqueue.
                unsafe {
                    nres::reduce_scatter(
                        src as *const _,
                        dst as *mut _,
                        n / p,
                        T::as_nccl_type(),
                        nsys::ncclRedOp_t::ncclSum,
                        self.sh.comm,
                        self.sh.net_stream(),
                    )
                }
                .map_err(|e| nccl_err("ncclReduceScatter", e))?;
            } else {
                // SAFETY: fully written by the allreduce.
                let mut tmp = unsafe { self.sh.net.alloc::<T>(n) }
                    .map_err(|e| Error::OutOfMemory(format!("{e:?}")))?;
                self.sh.allreduce_sum(x, &mut tmp)?;
                let v = tmp.slice(segs[r].clone());
                self.sh.net.memcpy_dtod(&v, out).map_err(gpu_err)?;
            }
            return self.sh.net.synchronize().map_err(gpu_err);
        }
        self.sh.allreduce_sum(x, out)?;
        self.sh.net.synchronize().map_err(gpu_err)?;
        if op == OP_ALLREDUCE_MEAN {
            let mut v = out.slice_mut(..);
            self.utils
                .scale(&self.sh.work, &mut v, T::from_f64(p as f64))?;
            self.sh.work.synchronize().map_err(gpu_err)?;
        }
        Ok(())
    }
}
