//! [`NcclComm::calibrate`]: times the raw links and the codecs on every rank and fills the
//! device-direct parts of the [`Profile`].

use super::*;
use crate::comm::device_calibrate::{repeat, CodecBench};
use crate::comm::link_calibrate::{self, LinkPattern, LinkProbe};

impl NcclComm {
    /// Measure raw NCCL allreduce, allgather, pairwise exchange and one-way transfers at
    /// [`CALIBRATION_SIZES`] (the communicators' one link calibration, `comm::link_calibrate`:
    /// a barrier before every transfer, warm-ups, the median, the slowest rank; the [`Curve`]s
    /// of the profile), the device codecs on a Gaussian random field (`noa:1e-3`, 256 MiB f32
    /// ([`CODEC_FIELD_VALUES`]):
    /// the policy's codec, whose fixed per-call costs the profile keeps, and every other GPU
    /// codec that works on every rank, [`Profile::gpu_codecs`], among which `Policy::Auto`
    /// chooses per message) and the per-piece host overhead; every rank adopts rank 0's
    /// numbers. Collective.
    ///
    /// Each pattern moves about 1 GiB per rank in total (every size eleven times, the 16 and
    /// 64 MiB sizes most of it): seconds over NCCL's socket transport, milliseconds over NVLink.
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
            // Warm the transport up with the largest size first (untimed): on the socket
            // transport the first large transfers of a fresh communicator can run much slower
            // than later ones, which would make the whole calibration, and every prediction
            // from it, too slow; the schedule's warm-ups per size are not enough to get past that.
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
            let sh = self.sh.clone();
            let mut probe = NcclLinkProbe {
                sh: &sh,
                rank: r,
                size: p,
                xs: &xs,
                ys: &mut ys,
                gs: &mut gs,
            };
            let links = link_calibrate::measure(
                &*sh.boot,
                &mut probe,
                CALIBRATION_SIZES,
                &[
                    LinkPattern::Allreduce,
                    LinkPattern::Allgather,
                    LinkPattern::Exchange,
                    LinkPattern::OneWay,
                ],
            )?;
            prof.allreduce = links.allreduce;
            prof.allgather = links.allgather;
            if let Some(x) = links.exchange {
                prof.link_exchange = x;
            }
            if let Some(o) = links.one_way {
                prof.link_one_way = o;
            }
            let (to, from) = (to_of(r, p), from_of(r, p));
            // per-piece host overhead: a size message round on the bootstrap transport plus a
            // codec launch-and-readback
            let t1 = self.wtime();
            let reps = 20;
            for _ in 0..reps {
                self.sh.boot.sendrecv(to, &[0u8; 8], from, TAG_SIZES)?;
            }
            prof.piece_overhead = (self.wtime() - t1) / reps as f64;
        }
        if self.codec_on_all_ranks() {
            let big = CODEC_FIELD_VALUES;
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

/// Values of the f32 field the codec calls are calibrated on (256 MiB): several times any
/// GPU's L2 cache (50 MB on an H100, 60 MB on an H200), so that repeated calls read it from
/// DRAM as the large messages they predict do (a field that stays in L2 between calls times
/// them faster than such messages run).
pub const CODEC_FIELD_VALUES: usize = 64 << 20;

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

/// NCCL's side of the link calibration: its own allreduce and allgather (the raw paths) and the
/// pairwise transfers of the compressed operations, between device buffers, every rank at once;
/// a transfer returns when this rank's NCCL work has finished.
struct NcclLinkProbe<'a> {
    sh: &'a Shared,
    rank: usize,
    size: usize,
    xs: &'a CudaSlice<f32>,
    ys: &'a mut CudaSlice<f32>,
    gs: &'a mut CudaSlice<f32>,
}

impl NcclLinkProbe<'_> {
    /// A send of `n` f32 to `to` and/or a receive of `n` from `from`, in one NCCL group.
    fn send_recv(&mut self, n: usize, to: Option<usize>, from: Option<usize>) -> Result<()> {
        let sh = self.sh;
        let (sp, _g1) = self.xs.device_ptr(&sh.net);
        let (rp, _g2) = self.ys.device_ptr_mut(&sh.net);
        sh.group(|| {
            // SAFETY: both buffers hold at least n f32 (the largest calibration size); the
            // guards outlive the enqueue.
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
    }
}

impl LinkProbe for NcclLinkProbe<'_> {
    fn transfer(&mut self, pattern: LinkPattern, bytes: usize) -> Result<()> {
        let (n, r, p) = (bytes / 4, self.rank, self.size);
        match pattern {
            LinkPattern::Allreduce => self
                .sh
                .allreduce_sum(&self.xs.slice(0..n), &mut self.ys.slice_mut(0..n))?,
            LinkPattern::Allgather => self
                .sh
                .allgather(&self.xs.slice(0..n), &mut self.gs.slice_mut(0..n * p))?,
            // every rank sends to the next and receives from the previous (a ring step)
            LinkPattern::Exchange => self.send_recv(n, Some(to_of(r, p)), Some(from_of(r, p)))?,
            // even ranks send to the next rank, which only receives
            LinkPattern::OneWay => {
                let to = (r % 2 == 0 && r + 1 < p).then_some(r + 1);
                let from = (r % 2 == 1).then(|| r - 1);
                self.send_recv(n, to, from)?;
            }
        }
        self.sh.sync()
    }

    fn curve_bytes(&self, pattern: LinkPattern, bytes: usize) -> f64 {
        if pattern == LinkPattern::Allgather {
            (bytes * self.size) as f64
        } else {
            bytes as f64
        }
    }
}
