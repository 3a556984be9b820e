//! [`NcclComm::calibrate`]: times the raw links and the codecs on every rank and fills the
//! device-direct parts of the [`Profile`].

use super::*;
use crate::comm::device_calibrate::{repeat, CodecBench};

impl NcclComm {
    /// Time `f` on every rank (barrier, run, drain streams), `reps` times after one warm-up;
    /// returns the median over repetitions of the slowest rank (identical on all ranks).
    pub(super) fn time_collective(
        &mut self,
        reps: usize,
        mut f: impl FnMut(&mut Self) -> Result<()>,
    ) -> Result<f64> {
        let mut ts = Vec::with_capacity(reps);
        for i in 0..=reps.max(1) {
            self.barrier()?;
            let t0 = self.wtime();
            f(self)?;
            self.synchronize()?;
            let mut t = [self.wtime() - t0];
            self.sh.boot.allreduce_f64(&mut t, ReduceOp::Max)?;
            if i > 0 {
                ts.push(t[0]);
            }
        }
        Ok(median(&mut ts))
    }

    /// Measure raw NCCL allreduce, allgather and pairwise exchange at [`CALIBRATION_SIZES`]
    /// (median of 5 to 9 runs after a warm-up each; the [`Curve`]s of the profile), the device
    /// codecs on a Gaussian random field (`noa:1e-3`, 64 MiB f32: the policy's codec, whose
    /// fixed per-call costs the profile keeps, and every other GPU codec that works on every
    /// rank, [`Profile::gpu_codecs`], among which `Policy::Auto` chooses per message) and the
    /// per-piece host overhead; every rank adopts rank 0's numbers. Collective.
    ///
    /// Each of the three operations runs about 630 MiB (per rank) of buffers in total, the
    /// 16 and 64 MiB runs most of it: roughly 0.6 s over NCCL's socket transport at 3.5 GB/s
    /// (twice the former two-size calibration), a few ms over NVLink.
    pub fn calibrate(&mut self) -> Result<&Profile> {
        let (p, r) = (self.size(), self.rank());
        let big = CALIBRATION_SIZES[CALIBRATION_SIZES.len() - 1] / 4; // f32 values: 64 MiB
        let mut prof = Profile::direct_guess(&self.profile.transport);
        prof.host = crate::comm::hostname();
        prof.ranks = p;
        if p > 1 {
            let w = self.sh.work.clone();
            let xs = w.alloc_zeros::<f32>(big).map_err(gpu_err)?;
            let mut ys = w.alloc_zeros::<f32>(big).map_err(gpu_err)?;
            let mut gs = w.alloc_zeros::<f32>(big * p).map_err(gpu_err)?;
            w.synchronize().map_err(gpu_err)?;
            let (mut ar, mut ag, mut pp, mut one) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            // Warm the transport up with the largest size first (untimed): on the socket
            // transport the first large transfers of a fresh communicator can run much slower
            // than later ones, which would make the whole calibration, and every prediction
            // from it, too slow; one warm-up per size is not enough to get past that.
            {
                let xv = xs.slice(0..big);
                let mut yv = ys.slice_mut(0..big);
                for _ in 0..3 {
                    self.sh.allreduce_sum(&xv, &mut yv)?;
                }
                let mut gv = gs.slice_mut(0..big * p);
                self.sh.allgather(&xv, &mut gv)?;
                self.synchronize()?;
                self.barrier()?;
            }
            for &sz in CALIBRATION_SIZES {
                let n = sz / 4;
                // large messages are slow on sockets and steady: fewer repetitions
                let reps = if sz >= 16 << 20 { 5 } else { 9 };
                let xv = xs.slice(0..n);
                let mut yv = ys.slice_mut(0..n);
                let t = self.time_collective(reps, |c| c.sh.allreduce_sum(&xv, &mut yv))?;
                ar.push((sz as f64, t));
                let mut gv = gs.slice_mut(0..n * p);
                let t = self.time_collective(reps, |c| c.sh.allgather(&xv, &mut gv))?;
                ag.push(((sz * p) as f64, t));
                // a send to `to` and/or a receive from `from` of n f32, in one group
                let mut exchange = |c: &mut Self, to: Option<usize>, from: Option<usize>| {
                    let sh = c.sh.clone();
                    let (sp, _g1) = xs.device_ptr(&sh.net);
                    let (rp, _g2) = ys.device_ptr_mut(&sh.net);
                    sh.group(|| {
                        // SAFETY: both buffers hold at least n f32; guards outlive the enqueue.
                        unsafe {
                            if let Some(to) = to {
                                sh.send_raw(sp, n, nsys::ncclDataType_t::ncclFloat32, to)?;
                            }
                            if let Some(from) = from {
                                sh.recv_raw(rp, n, nsys::ncclDataType_t::ncclFloat32, from)?;
                            }
                            Ok(())
                        }
                    })
                };
                let (to, from) = ((r + 1) % p, (r + p - 1) % p);
                let t = self.time_collective(reps, |c| exchange(c, Some(to), Some(from)))?;
                pp.push((sz as f64, t));
                // one way: even ranks send to the next rank, which only receives
                let to = (r % 2 == 0 && r + 1 < p).then_some(r + 1);
                let from = (r % 2 == 1).then(|| r - 1);
                let t = self.time_collective(reps, |c| exchange(c, to, from))?;
                one.push((sz as f64, t));
            }
            let guess = prof.link_exchange.clone();
            prof.allreduce = Some(Curve::from_points(ar, &guess));
            prof.allgather = Some(Curve::from_points(ag, &guess));
            prof.link_exchange = Curve::from_points(pp, &guess);
            // a message alone is never slower than with traffic coming back
            let one: Vec<(f64, f64)> = one
                .into_iter()
                .map(|(b, t)| (b, t.min(prof.link_exchange.time(b))))
                .collect();
            prof.link_one_way = Curve::from_points(one, &prof.link_exchange);
            // per-piece host overhead: a size message round on the bootstrap transport plus a
            // codec launch-and-readback
            let t1 = self.wtime();
            let reps = 20;
            for _ in 0..reps {
                self.sh
                    .boot
                    .sendrecv(to_of(r, p), &[0u8; 8], from_of(r, p), TAG_SIZES)?;
            }
            prof.piece_overhead = (self.wtime() - t1) / reps as f64;
        }
        if self.codec_on_all_ranks() {
            let field = self.gaussian_field::<f32>(big, 32.0, 0.0, 7 + r as u64)?;
            let bound = self.piece_bound(&field.as_view())?;
            let preferred = self.config.policy.codec().unwrap_or_default();
            let mut streams = unsafe {
                self.sh
                    .work
                    .alloc::<u8>(crate::format::HEADER_LEN + big * 4 + 256)
            }
            .map_err(gpu_err)?;
            let mut acc = self.sh.work.alloc_zeros::<f32>(big).map_err(gpu_err)?;
            self.sh.work.synchronize().map_err(gpu_err)?;
            let sh = self.sh.clone();
            let t: &dyn Transport = &*sh.boot;
            // the engine's one codec calibration (every rank at once; no solo lines: NCCL runs
            // one rank per GPU): the policy's codec first (its fixed costs are the profile's),
            // then every other GPU codec that works on every rank (`Policy::Auto` chooses among
            // them per message); the bound is the absolute one the pieces get, so the
            // compression lines leave out the value-range pass, timed on its own below
            let codecs = CodecBench {
                gpu: self.gpu()?,
                field: field.slice(..),
                streams: &mut streams,
                decoded: &mut acc,
                tiny: 1 << 15,
                bound,
            }
            .all_lines(t, preferred, false)
            .map_err(|e| Error::Unavailable(format!("NCCL calibration: {e}")))?;
            // the preparation of a compressing call: the value-range pass (with its read-back)
            // on one codec chunk and on the whole field (the line through them), and a device
            // copy of the whole buffer (reported)
            let work = &sh.work;
            let range =
                |n: usize| repeat(t, || self.utils.range(work, &field.slice(0..n)).map(|_| ()));
            let mut v = [range(1 << 15)?, range(big)?, 0.0];
            v[2] = repeat(t, || {
                work.memcpy_dtod(&field, &mut acc).map_err(gpu_err)?;
                work.synchronize().map_err(gpu_err)
            })?;
            t.allreduce_f64(&mut v, ReduceOp::Max)?; // slowest rank
            let (b1, b2) = (((1usize << 15) * 4) as f64, (big * 4) as f64);
            (prof.range_pass, prof.range_fixed) = crate::model::call_line(b1, v[0], b2, v[1]);
            prof.device_copy = b2 / v[2].max(1e-9);
            // (the policy's codec first: its lines stand for codecs without their own)
            prof.gpu_codecs = codecs;
        }
        let mut bytes = if r == 0 {
            serde_json::to_vec(&prof).map_err(|e| Error::invalid(format!("profile: {e}")))?
        } else {
            Vec::new()
        };
        self.sh.boot.bcast(0, &mut bytes)?;
        self.profile = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Comm(format!("profile from rank 0: {e}")))?;
        let pr = &self.profile;
        let rate = |c: &Option<Curve>| {
            c.as_ref()
                .map_or_else(|| "-".into(), |c| crate::model::fmt_rate(c.bandwidth))
        };
        let first = pr.gpu_codecs.first().copied();
        tracing::info!(target: "zcomm::nccl", "calibrated NCCL ({}): allreduce {} allgather {} exchange {} (at 4 MiB {}, one way {}); codec {:?}; fixed per call: compress {:.1} us, decompress {:.1} us, size message {:.1} us; range pass {} + {:.1} us, copy {}",
            pr.transport, rate(&pr.allreduce), rate(&pr.allgather),
            crate::model::fmt_rate(pr.link_exchange.bandwidth),
            crate::model::fmt_rate(pr.link_exchange.rate((4u64 << 20) as f64)),
            crate::model::fmt_rate(pr.one_way().rate((4u64 << 20) as f64)),
            first.map(|c| (crate::model::fmt_rate(c.compress), crate::model::fmt_rate(c.decompress))),
            first.map_or(0.0, |c| c.compress_overhead) * 1e6, first.map_or(0.0, |c| c.decompress_overhead) * 1e6, pr.piece_overhead * 1e6,
            crate::model::fmt_rate(pr.range_pass), pr.range_fixed * 1e6, crate::model::fmt_rate(pr.device_copy));
        Ok(&self.profile)
    }
}

/// Message sizes (bytes per rank) at which [`NcclComm::calibrate`] times the raw NCCL links.
pub const CALIBRATION_SIZES: &[usize] = &[
    256 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
    64 << 20,
];

/// Median of `ts` (sorted in place; the mean of the middle two for an even count, NaN if empty).
pub(super) fn median(ts: &mut [f64]) -> f64 {
    ts.sort_by(f64::total_cmp);
    match ts.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => ts[n / 2],
        n => 0.5 * (ts[n / 2 - 1] + ts[n / 2]),
    }
}
