//! The reductions of host buffers: the compressed ring (reduce-scatter + allgather of
//! compressed segments) with the end-to-end bound, and the raw fallback.

use super::*;

impl Communicator {
    /// Model times (raw, compressed) of an allgather of `n` scalars per rank.
    pub(super) fn allgather_times<S: Real>(&self, n: usize, ratio: f64) -> (f64, f64) {
        let bytes = (n * S::SIZE) as f64;
        let codec = self.config.policy.codec().unwrap_or_default();
        let (tc, td) = self.speeds::<S>(codec);
        let l = self.profile.link;
        let pf = self.size() as f64;
        let raw_t = (pf - 1.0) * (l.latency + bytes / l.bandwidth);
        let cmp_t =
            bytes / tc + pf * bytes / td + (pf - 1.0) * (l.latency + bytes / (ratio * l.bandwidth));
        (raw_t, cmp_t)
    }

    /// Model times (raw, compressed) of an allreduce (`full`) or reduce-scatter of `n` scalars;
    /// `mean` (an allreduce's mean): plus the division by the rank count, one host pass over
    /// the result (raw) or over this rank's final segment (compressed: the ring divides it
    /// before compressing it).
    pub(super) fn reduce_times<S: Real>(
        &self,
        n: usize,
        full: bool,
        mean: bool,
        ratio: f64,
        codec: CodecKind,
    ) -> (f64, f64) {
        let pf = self.size() as f64;
        let seg_b = (n * S::SIZE) as f64 / pf;
        let (tc, td) = self.speeds::<S>(codec);
        let l = self.profile.link;
        let steps = pf - 1.0;
        let rs = steps * (seg_b / tc + seg_b / td + l.latency + seg_b / (ratio * l.bandwidth));
        if full {
            let bytes = (n * S::SIZE) as f64;
            let raw = match &self.profile.allreduce {
                Some(a) => a.time(bytes),
                None => 2.0 * steps * (l.latency + seg_b / l.bandwidth),
            };
            let (div_raw, div_seg) = if mean {
                (self.host_add_s(bytes), self.host_add_s(seg_b))
            } else {
                (0.0, 0.0)
            };
            (
                raw + div_raw,
                rs + div_seg
                    + seg_b / tc
                    + pf * seg_b / td
                    + steps * (l.latency + seg_b / (ratio * l.bandwidth)),
            )
        } else {
            (
                steps * (l.latency + seg_b / l.bandwidth + self.host_add_s(seg_b)),
                rs,
            )
        }
    }

    /// Seconds of one element-wise host pass over `bytes` (the raw ring's addition onto partial
    /// sums, a mean's division), at the calibrated addition rate (0 where the profile has none).
    pub(super) fn host_add_s(&self, bytes: f64) -> f64 {
        crate::model::seconds_at(bytes, self.profile.host_add)
    }

    pub(super) fn decide(&self, raw_t: f64, cmp_t: f64) -> bool {
        self.policy_codec_usable()
            && crate::model::choice::policy_compresses(self.config.policy, raw_t, cmp_t)
    }

    /// Whether the policy's codec accepts the configured bound ([`CodecKind::supports_bound`]:
    /// gpz refuses rel). When it does not, messages go raw, as when compression does not pay.
    pub(super) fn policy_codec_usable(&self) -> bool {
        self.config
            .policy
            .codec()
            .map_or(true, |c| c.supports_bound(self.config.bound))
    }

    /// Sum over all ranks into `out` with the end-to-end bound of the [module docs](super).
    pub fn allreduce<E: CommElement>(&mut self, input: &[E], out: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allreduce");
        self.reduce_impl(
            OP_ALLREDUCE,
            E::scalars(input),
            E::scalars_mut(out),
            E::TAG,
            input.len(),
            E::LANES,
        )
    }

    /// Mean over all ranks (gradient averaging); the bound applies to the mean.
    pub fn allreduce_mean<E: CommElement>(
        &mut self,
        input: &[E],
        out: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allreduce_mean");
        self.reduce_impl(
            OP_ALLREDUCE_MEAN,
            E::scalars(input),
            E::scalars_mut(out),
            E::TAG,
            input.len(),
            E::LANES,
        )
    }

    /// In-place sum (copies the input once).
    pub fn allreduce_in_place<E: CommElement>(&mut self, buf: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allreduce_in_place");
        let input = buf.to_vec();
        self.allreduce(&input, buf)
    }

    /// Reduce-scatter (sum): rank `r` receives segment `r` of [`partition`]`(input.len(), size)`
    /// in `out`. Every element passes `p-1` quantizations; the bound holds on the result.
    pub fn reduce_scatter<E: CommElement>(
        &mut self,
        input: &[E],
        out: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("reduce_scatter");
        let seg = partition(input.len(), self.size())[self.rank()].clone();
        if out.len() != seg.len() {
            return Err(Error::invalid(format!(
                "reduce_scatter: output has {} elements, this rank's segment has {}",
                out.len(),
                seg.len()
            )));
        }
        self.reduce_impl(
            OP_REDUCE_SCATTER,
            E::scalars(input),
            E::scalars_mut(out),
            E::TAG,
            input.len(),
            E::LANES,
        )
    }
}

impl Communicator {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_impl<S: Real>(
        &mut self,
        op: u8,
        x: &[S],
        out: &mut [S],
        dtype: u8,
        count: usize,
        lanes: usize,
    ) -> Result<OpStats> {
        let t0 = self.wtime();
        let (p, r) = (self.size(), self.rank());
        let full = op != OP_REDUCE_SCATTER;
        let mean = op == OP_ALLREDUCE_MEAN;
        let mut local = Ok(());
        if full && out.len() != x.len() {
            local = Err(Error::invalid(format!(
                "{}: output has {} scalars, input {}",
                op_name(op),
                out.len(),
                x.len()
            )));
        }
        // 1. agreement, global range and magnitude (from the descriptor table); only the bound
        //    split of a compressed ring needs the range: an allreduce's ring starts from a
        //    sampled range and measures the exact one on the way (`ring::FinalBound`)
        let none = (f64::INFINITY, f64::NEG_INFINITY);
        let (lo, hi) = if matches!(self.config.policy, Policy::Never) {
            none
        } else if full {
            crate::quant::sampled_range(x).unwrap_or(none)
        } else {
            crate::quant::finite_range(x).unwrap_or(none)
        };
        let desc = Desc {
            count: count as u64,
            dtype,
            lo,
            hi,
            ..self.local_desc::<f32>(op, count)
        };
        let all = self.agree(desc, local)?;
        if matches!(self.config.bound, ErrorBound::Rel(_)) {
            return Err(Error::invalid(format!(
                "{}: rel bounds are not supported for reductions (use abs or noa)",
                op_name(op)
            )));
        }
        let glo = all.iter().map(|d| d.lo).fold(f64::INFINITY, f64::min);
        let ghi = all.iter().map(|d| d.hi).fold(f64::NEG_INFINITY, f64::max);
        // 2. the per-quantization bound
        let rule = ring::SplitRule {
            bound: self.config.bound,
            p,
            unit_roundoff: S::UNIT_ROUNDOFF,
            mean,
            full,
        };
        let sampled = full && !matches!(self.config.policy, Policy::Never);
        let bounds = ring::RingBounds::agree(
            rule,
            (glo <= ghi).then_some((glo, ghi)),
            sampled,
            &*self.transport,
            || Ok(crate::quant::finite_range(x)),
        )?;
        let split = bounds.split;
        let (e, d) = (split.result, split.divisor);
        let pf = p as f64;
        let usable = split.step.is_some();
        let eb = split.step.unwrap_or(f64::NAN);
        // 3. ratio estimate at the per-step bound, per candidate codec (mean over ranks of
        //    1/ratio: every rank then sees the same numbers and makes the same choice)
        let mut ratio_of = 1.0;
        let preferred = self.config.policy.codec().unwrap_or_default();
        let mut cands = vec![preferred];
        if let (Policy::Auto(c), true, true) = (self.config.policy, usable, p > 1) {
            cands = self
                .candidates::<S>(c)
                .into_iter()
                .filter(|&k| {
                    let (raw_t, best) =
                        self.reduce_times::<S>(x.len(), full, mean, f64::INFINITY, k);
                    choice::choose(raw_t, [cand(k, f64::INFINITY, best)])
                        .codec
                        .is_some()
                })
                .collect();
            let seg0 = &x[..x.len().div_ceil(p).min(x.len())];
            let mut inv = Vec::with_capacity(cands.len());
            for &k in &cands {
                let key = codec_key(coll_key(x.len(), self.config.bound), k);
                inv.push(
                    match self.estimate(seg0, ErrorBound::Abs(eb * d), k, op, key) {
                        Ok((er, _)) => 1.0 / er.max(1e-9),
                        Err(_) => 1.0, // (cannot happen for a valid abs bound) assume no gain
                    },
                );
            }
            // every rank filtered the same candidates (same profile, same sizes)
            self.transport.allreduce_f64(&mut inv, ReduceOp::Sum)?;
            let ratios: Vec<f64> = inv.iter().map(|v| pf / v).collect();
            let (raw_t, _) = self.reduce_times::<S>(x.len(), full, mean, 1.0, preferred);
            let ch = choice::choose(
                raw_t,
                cands.iter().zip(&ratios).map(|(&k, &r)| {
                    cand(k, r, self.reduce_times::<S>(x.len(), full, mean, r, k).1)
                }),
            );
            cands = match (ch.codec, ch.best) {
                (Some(k), _) => vec![k],
                (None, Some(b)) => vec![b.codec],
                (None, None) => vec![preferred],
            };
            ratio_of = ch.best.map_or(1.0, |b| b.ratio);
        }
        let codec = cands[0];
        let ratio = ratio_of;
        // 4. model
        let bytes = (x.len() * S::SIZE) as f64;
        let seg_b = bytes / pf;
        let steps = pf - 1.0;
        let (raw_t, cmp_t) = self.reduce_times::<S>(x.len(), full, mean, ratio, codec);
        let compress = usable && p > 1 && !x.is_empty() && self.decide(raw_t, cmp_t);
        let mut st = OpStats::decided(op, bytes, ratio, (raw_t, cmp_t), compress);
        let segs = partition(count, p)
            .into_iter()
            .map(|s| s.start * lanes..s.end * lanes)
            .collect::<Vec<_>>();
        if !compress {
            st.wire_bytes = st.bytes;
            if full {
                S::native_sum(&*self.transport, x, out)?;
                if d != 1.0 {
                    use rayon::prelude::*;
                    let dd = S::from_f64(d);
                    out.par_iter_mut()
                        .with_min_len(HOST_PASS_MIN)
                        .for_each(|v| *v = *v / dd);
                }
            } else {
                raw_reduce_scatter(&*self.transport, x, out, &segs)?;
            }
            return Ok(self.finish(st, t0));
        }
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.bound = e;
        // 5. the ring (reduce-scatter, then for the allreduces the allgather)
        let plan = ring::RingPlan::with_bounds((r, p), &bounds, codec)?;
        let left = (r + p - 1) % p;
        let mut place = HostRing {
            transport: &*self.transport,
            compressor: &*self.compressor,
            acc: x[segs[left].clone()].to_vec(),
            acc_seg: left,
            x,
            out: &mut *out,
            segs: &segs,
        };
        let sent = ring::reduce(&mut place, plan)?;
        if !full {
            let acc = std::mem::take(&mut place.acc);
            out.copy_from_slice(&acc);
        }
        st.bound = sent.result_bound.unwrap_or(e);
        st.wire_bytes = sent.total(p) as u64;
        let moved = if full { 2.0 } else { 1.0 } * bytes * steps / pf;
        st.ratio = moved / st.wire_bytes.max(1) as f64;
        if self.config.verify {
            let range = if full { 0..x.len() } else { segs[r].clone() };
            st.max_error = Some(self.reduce_error(x, out, range, d)?);
        }
        if full {
            self.ratios.put(
                op,
                codec_key(coll_key(x.len(), self.config.bound), codec),
                (seg_b / sent.final_stream.max(1) as f64).max(1.0),
            );
        }
        Ok(self.finish(st, t0))
    }
}

/// The ring's buffers on the host: the CPU (or any [`Compressor`]) codec over a [`Transport`].
pub(super) struct HostRing<'a, S: Real> {
    pub(super) transport: &'a dyn Transport,
    pub(super) compressor: &'a dyn Compressor,
    /// This rank's input.
    pub(super) x: &'a [S],
    /// The allreduce's output.
    pub(super) out: &'a mut [S],
    /// Scalar range of each rank's segment.
    pub(super) segs: &'a [Range<usize>],
    /// The partial sum of segment `acc_seg` (before the first step: the input there).
    pub(super) acc: Vec<S>,
    pub(super) acc_seg: usize,
}

impl<S: Real> ring::RingPlace for HostRing<'_, S> {
    type Msg = Vec<u8>;
    fn wire_len(&self, m: &Vec<u8>) -> usize {
        m.len()
    }
    fn encode(&mut self, seg: usize, bound: ErrorBound, codec: CodecKind) -> Result<Vec<u8>> {
        debug_assert_eq!(
            seg, self.acc_seg,
            "the ring compresses the segment it holds"
        );
        S::compress_with(self.compressor, &self.acc, bound, codec)
    }
    fn exchange(&mut self, m: Vec<u8>, to: usize, from: usize) -> Result<Vec<u8>> {
        self.transport.sendrecv(to, &m, from, TAG_RING)
    }
    fn accumulate(&mut self, seg: usize, m: &Vec<u8>) -> Result<()> {
        let range = self.segs[seg].clone();
        let mut part = vec![S::default(); range.len()];
        S::decompress_with(self.compressor, m, &mut part)?;
        for (a, &v) in part.iter_mut().zip(&self.x[range]) {
            *a = *a + v;
        }
        self.acc = part;
        self.acc_seg = seg;
        Ok(())
    }
    fn scale(&mut self, seg: usize, d: f64) -> Result<()> {
        debug_assert_eq!(seg, self.acc_seg);
        let d = S::from_f64(d);
        self.acc.iter_mut().for_each(|v| *v = *v / d);
        Ok(())
    }
    fn allgather(&mut self, m: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.transport.allgatherv(&m)
    }
    fn decode_into_output(&mut self, seg: usize, m: &Vec<u8>) -> Result<()> {
        S::decompress_with(self.compressor, m, &mut self.out[self.segs[seg].clone()])
    }
    fn failed_msg(&mut self) -> Vec<u8> {
        Vec::new()
    }
    fn all_succeeded(&mut self, ok: bool) -> Result<bool> {
        all_ranks(self.transport, ok)
    }
    fn global_range(&mut self, ok: bool) -> Result<(Option<(f64, f64)>, bool)> {
        ring::agree_range(self.transport, crate::quant::finite_range(self.x), ok)
    }
    fn reset(&mut self) {
        let p = self.segs.len();
        self.acc_seg = (self.transport.rank() + p - 1) % p;
        self.acc = self.x[self.segs[self.acc_seg].clone()].to_vec();
    }
}

/// The uncompressed reduce-scatter: the ring's `p - 1` steps with raw segments (what the raw
/// prediction of [`Communicator::reduce_times`] describes); this rank's segment of the sum ends in
/// `out`. Every step receives straight into its destination and adds the input there: the first
/// step sends the input's own segment (no copy), the last one receives into `out`, and the
/// partial sums in between (`p > 2`) alternate between two segment buffers. Fresh full-size
/// buffers per call would fault in as much memory as the message on every call, which on large
/// buffers costs more than the exchange itself.
fn raw_reduce_scatter<S: Real>(
    t: &dyn Transport,
    x: &[S],
    out: &mut [S],
    segs: &[Range<usize>],
) -> Result<()> {
    let (p, r) = (t.size(), t.rank());
    if p == 1 {
        out.copy_from_slice(&x[segs[0].clone()]);
        return Ok(());
    }
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let mid = if p > 2 {
        segs.iter().map(|s| s.len()).max().unwrap_or(0)
    } else {
        0
    };
    let mut bufs = [vec![S::default(); mid], vec![S::default(); mid]];
    // which buffer holds the partial sum to send next (None: the input's segment `left`)
    let mut held: Option<(usize, usize)> = None;
    for s in 0..p - 1 {
        // as the compressed ring: received partial sum + this rank's input
        let seg = (r + 2 * p - s - 2) % p;
        let range = segs[seg].clone();
        let last = s == p - 2;
        let next = held.map_or(0, |(i, _)| 1 - i);
        let (a, b) = bufs.split_at_mut(1);
        let (b0, b1) = (&mut a[0], &mut b[0]);
        let (send, recv): (&[S], &mut [S]) = match (held, last) {
            (None, true) => (&x[segs[left].clone()], &mut *out),
            (None, false) => (&x[segs[left].clone()], &mut b0[..range.len()]),
            (Some((0, n)), true) => (&b0[..n], &mut *out),
            (Some((_, n)), true) => (&b1[..n], &mut *out),
            (Some((0, n)), false) => (&b0[..n], &mut b1[..range.len()]),
            (Some((_, n)), false) => (&b1[..n], &mut b0[..range.len()]),
        };
        exchange_scalars(t, right, send, left, recv)?;
        add_assign(recv, &x[range.clone()]);
        held = Some((next, range.len()));
    }
    Ok(())
}

/// Values per task of the host's element-wise passes over a raw reduction's buffers: such a
/// pass is memory-bound, and one thread uses a fraction of the host's bandwidth (on a large
/// message it took as long as the exchange).
const HOST_PASS_MIN: usize = 1 << 16;

/// `acc[i] = acc[i] + x[i]` on every core (in chunks of [`HOST_PASS_MIN`]); the same sums in
/// any order of the elements.
pub(super) fn add_assign<S: Real>(acc: &mut [S], x: &[S]) {
    use rayon::prelude::*;
    acc.par_iter_mut()
        .with_min_len(HOST_PASS_MIN)
        .zip(x.par_iter())
        .for_each(|(a, &v)| *a = *a + v);
}

/// Sends `send` to `dest` and receives exactly `recv.len()` scalars from `src` into `recv` (the
/// ring's tag; no intermediate buffer on little-endian hosts).
fn exchange_scalars<S: Real>(
    t: &dyn Transport,
    dest: usize,
    send: &[S],
    src: usize,
    recv: &mut [S],
) -> Result<()> {
    let bytes = scalar_bytes(send);
    match scalar_bytes_mut(recv) {
        Some(b) => t.sendrecv_sized(dest, &bytes, src, b, TAG_RING),
        None => {
            let v = t.sendrecv(dest, &bytes, src, TAG_RING)?;
            scalars_from_bytes(&v, recv)
        }
    }
}

/// Whether `ok` holds on every rank of `t` (one small allreduce).
pub(super) fn all_ranks(t: &dyn Transport, ok: bool) -> Result<bool> {
    let mut v = [f64::from(u8::from(ok))];
    t.allreduce_f64(&mut v, ReduceOp::Min)?;
    Ok(v[0] > 0.5)
}

impl Communicator {
    /// Verification of a reduction: max |result - exact| where exact is the f64 sum of every
    /// rank's input (native allreduce in f64, collective), divided by `d`; `got` holds the
    /// scalars `range` of the result.
    pub(super) fn reduce_error<S: Real>(
        &self,
        x: &[S],
        got: &[S],
        range: Range<usize>,
        d: f64,
    ) -> Result<f64> {
        let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let mut exact = vec![0.0f64; x64.len()];
        self.transport.allreduce_sum_f64(&x64, &mut exact)?;
        Ok(got
            .iter()
            .zip(&exact[range])
            .map(|(g, e)| (g.to_f64() - e / d).abs())
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max))
    }
}
