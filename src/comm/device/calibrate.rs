//! [`DeviceStager::calibrate`]: measures the [`Profile`] (codec, staging and link rates,
//! shared and solo) on every rank at once.

use super::*;
use crate::comm::device_calibrate::{repeat, repeat_solo, CodecBench};
use crate::comm::link_calibrate::{self, LinkCurves, LinkPattern, PairLink};

impl DeviceStager {
    /// Measure GPU codec throughput and pinned copy times, every rank at once (ranks sharing a
    /// GPU see their share, as in the real collective operations); all ranks adopt the slowest
    /// rank's numbers. Collective over `comm`.
    ///
    /// * Codec: a smooth f32 field of `values` values (at least [`CALIBRATION_MIN_VALUES`],
    ///   64 MiB; pass the size of the operations to predict, large enough that one call is not
    ///   lost in another process's time slice), `noa:1e-3`; a barrier before every repetition,
    ///   [`CALIBRATION_WARMUP`] warm-up calls, then the median of [`CALIBRATION_REPS`]. Every
    ///   codec call below is measured for `codec` (the profile's codec fields) and for every
    ///   other GPU codec ([`CodecKind::WITH_GPU`]) that works on every rank (the profile's
    ///   [`gpu_codecs`](Profile::gpu_codecs), among which `Policy::Auto` chooses per message).
    /// * Staging: pinned D2H and H2D copies at 1, 4, 16, 64, 256 MiB and the field's size (the
    ///   sizes up to it), same schedule, stored as the profile's [`StagingCurve`]; the
    ///   compressed streams (ratio times smaller) are predicted at their own size. Add exact
    ///   sizes with [`calibrate_staging`](Self::calibrate_staging).
    /// * Codec calls (compression, decompression, the fused decompress-and-add of the device
    ///   ring) on the field and on a tiny prefix of [`CALIBRATION_TINY_VALUES`]: the line
    ///   through both ([`model::call_line`]) gives each call's throughput and fixed cost.
    /// * Device-memory passes of the device reductions, same schedule: a device-to-device copy
    ///   of the field, the value-range pass over it and the in-place division kernel (the last
    ///   two need the NVRTC-compiled utility kernels; without them on every rank they stay 0,
    ///   i.e. not charged).
    /// * Solo rates (the profile's `*_solo` fields): the compression and decompression lines
    ///   (field + tiny prefix) and the pinned D2H/H2D copies at the same sizes, run by rank 0
    ///   alone while the other ranks wait in a barrier (warm-up + median, no barrier between
    ///   the calls). One rank suffices when every rank drives the same kind of GPU; all ranks
    ///   adopt rank 0's numbers (the maximum of the gathered times, 0 elsewhere).
    /// * Link (`link_exchange`, `link_one_way`): the one link calibration of the communicators
    ///   (`comm::link_calibrate`, the codec calibration's schedule) on the pinned staging
    ///   buffers of ranks 0 and 1 while the other ranks idle: both sending at once (the
    ///   exchange of a ring step or `sendrecv_device`) and rank 0 alone sending to rank 1
    ///   (one way), at the sizes of [`CALIBRATION_LINK_MIB`] below the field's and at the
    ///   field's size (the operations' size, so the curves are measured where they predict);
    ///   the receiver's time, the slower rank's, per size. These buffers are the ones the
    ///   operations stage through: a shared-memory transport moves page-locked memory faster
    ///   than the freshly allocated pageable vectors of the host ping-pong.
    /// * Placement (`ranks_per_gpu`): the largest number of ranks on one host with the same
    ///   GPU PCI address (gathered from every rank; the device ordinal where the driver reports
    ///   no PCI address).
    ///
    /// Cost: the solo part repeats every copy size, so it takes about as long as the shared
    /// part again; calibrate once and keep the profile.
    pub fn calibrate(
        &mut self,
        comm: &Communicator,
        values: usize,
        codec: CodecKind,
    ) -> Result<Profile> {
        // every rank measures the same sizes
        let mut v = [values.max(CALIBRATION_MIN_VALUES) as f64];
        comm.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        let values = v[0] as usize;
        let ranks_per_gpu = self.ranks_per_gpu(comm)?;
        let s = self.stream();
        let (speeds, passes) = {
            use rayon::prelude::*;
            let host: Vec<f32> = (0..values)
                .into_par_iter()
                .map(|i| {
                    let x = i as f64 * 1e-4;
                    ((x.sin() * 3.0 + (x * 7.3).cos()) * 100.0) as f32
                })
                .collect();
            let dev = s.clone_htod(&host).map_err(gpu_err("htod"))?;
            drop(host);
            let mut out = s.alloc_zeros::<f32>(values).map_err(gpu_err("alloc"))?;
            // the streams go to the stager's compression scratch (grown once here, then reused
            // by the operations of this size)
            let bound_bytes = crate::compress_bound(values, crate::format::Dtype::F32);
            Self::grow_dev(&mut self.scratch_out, &s, bound_bytes)?;
            // the requested codec first (its lines stand for codecs without their own), then
            // every other GPU codec that works on every rank (`Policy::Auto` chooses among them)
            let speeds = CodecBench {
                gpu: &mut self.gpu,
                field: dev.slice(..),
                streams: self.scratch_out.as_mut().expect("grown"),
                decoded: &mut out,
                tiny: CALIBRATION_TINY_VALUES.min(values),
                bound: ErrorBound::Noa(CALIBRATION_NOA),
            }
            .all_lines(comm.transport(), codec, true)?;
            let t = comm.transport();
            // device-memory passes: a plain device copy (reported), and the device reductions'
            // value-range pass and the mean's division (by 1 here)
            let t_copy = repeat(t, || {
                s.memcpy_dtod(&dev, &mut out).map_err(gpu_err("dtod"))?;
                s.synchronize().map_err(gpu_err("sync"))
            })?;
            // the utility kernels need NVRTC: without it the device ring is not used either,
            // and their terms stay uncalibrated (0)
            // (every rank runs the timed calls or none: the repetitions hold barriers)
            let loaded = self.utils().map(|_| ());
            let mut all_ok = [f64::from(u8::from(loaded.is_ok()))];
            t.allreduce_f64(&mut all_ok, ReduceOp::Min)?;
            let loaded = match loaded {
                Ok(()) if all_ok[0] < 0.5 => Err(Error::Unavailable(
                    "another rank has no utility kernels".into(),
                )),
                r => r,
            };
            let (t_range, t_scale) = match loaded {
                Ok(()) => {
                    let u = self.utils.take().expect("loaded");
                    let r = (|| -> Result<(f64, f64)> {
                        let tr = repeat(t, || u.range(&s, &dev.slice(..)).map(|_| ()))?;
                        let ts = repeat(t, || {
                            u.scale(&s, &mut out.slice_mut(..), 1.0f32)?;
                            s.synchronize().map_err(gpu_err("sync"))
                        })?;
                        Ok((tr, ts))
                    })();
                    self.utils = Some(u);
                    r?
                }
                Err(e) => {
                    tracing::warn!(target: "zcomm::comm", "device profile: no utility kernels ({e}): range and scale passes not calibrated");
                    (0.0, 0.0)
                }
            };
            (speeds, [t_copy, t_range, t_scale])
        };
        let total = values * 4;
        let mut sizes: Vec<usize> = [1usize, 4, 16, 64, 256]
            .iter()
            .map(|m| m << 20)
            .filter(|&b| b < total)
            .collect();
        sizes.push(total);
        // the passes first, then the staging and link times (one reduction over ranks)
        let nc = passes.len();
        let mut times = passes.to_vec();
        let mut buf = s.alloc_zeros::<u8>(total).map_err(gpu_err("alloc"))?;
        for &b in &sizes {
            let (d, h) = self.time_staging(comm, &mut buf, b, false)?;
            times.extend([d, h]);
        }
        // the same copies by rank 0 alone (0 on the others: the maximum below keeps rank 0's)
        for &b in &sizes {
            let (d, h) = self.time_staging(comm, &mut buf, b, true)?;
            times.extend([d, h]);
        }
        drop(buf);
        // the link between ranks 0 and 1, pinned buffer to pinned buffer, at the sizes up to
        // the field's and the field's own (the operations' size: the curve is measured where it
        // predicts, not extrapolated)
        let links = if comm.size() > 1 {
            let mut link_sizes: Vec<usize> = CALIBRATION_LINK_MIB
                .iter()
                .map(|m| m << 20)
                .filter(|&b| b < total)
                .collect();
            link_sizes.push(total);
            Self::grow_pinned(&mut self.pinned_send, &s, total)?;
            Self::grow_pinned(&mut self.pinned_recv, &s, total)?;
            let snd = self.pinned_send.as_ref().expect("grown");
            let rcv = self.pinned_recv.as_mut().expect("grown");
            let mut probe = PairLink {
                t: comm.transport(),
                rank: comm.rank(),
                snd: &snd.as_slice().map_err(gpu_err("pinned"))?[..total],
                rcv: &mut rcv.as_mut_slice().map_err(gpu_err("pinned"))?[..total],
            };
            link_calibrate::measure(
                comm.transport(),
                &mut probe,
                &link_sizes,
                &[LinkPattern::Exchange, LinkPattern::OneWay],
            )?
        } else {
            LinkCurves::default()
        };
        // every rank must have run the same calls (a rank without the utility kernels sent 0:
        // the maximum keeps the others' measurement)
        comm.transport().allreduce_f64(&mut times, ReduceOp::Max)?;
        let bytes = total as f64;
        let mut curve = StagingCurve::default();
        for (i, &b) in sizes.iter().enumerate() {
            curve.insert(StagingPoint {
                bytes: b as f64,
                d2h: times[nc + 2 * i],
                h2d: times[nc + 1 + 2 * i],
            });
        }
        let last = curve.points.last().copied().expect("one size at least");
        let ns = sizes.len();
        let mut curve_solo = StagingCurve::default();
        for (i, &b) in sizes.iter().enumerate() {
            curve_solo.insert(StagingPoint {
                bytes: b as f64,
                d2h: times[nc + 2 * ns + 2 * i],
                h2d: times[nc + 2 * ns + 1 + 2 * i],
            });
        }
        let passes = &times[..nc];
        let rate = |t: f64| if t > 0.0 { bytes / t } else { 0.0 };
        let host = comm.profile();
        let p = Profile {
            transport: "staged".into(),
            host: host.host.clone(),
            ranks: comm.size(),
            staging: Some(Link {
                bandwidth: last.bytes / last.d2h.max(last.h2d).max(1e-12),
                latency: 10e-6,
            }),
            staging_curve: curve,
            staging_curve_solo: curve_solo,
            link_one_way: links.one_way.unwrap_or_default(),
            link_exchange: links.exchange.unwrap_or_default(),
            gpu_codecs: speeds,
            // a copy moves `bytes` once (read + write)
            device_copy: rate(passes[0]),
            range_pass: rate(passes[1]),
            scale_pass: rate(passes[2]),
            ranks_per_gpu,
            // the host parts: the communicator's (its ping-pong is the exchanges' fallback)
            ..host.clone()
        };
        let m = p.staged(codec);
        tracing::info!(target: "zcomm::comm", "device profile: compress {} + {:.1} us, decompress {} + {:.1} us, decompress-add {} + {:.1} us, staging {} ({} sizes), device copy {}, range {}, scale {}",
            model::fmt_rate(m.c.compress), m.c.compress_overhead * 1e6,
            model::fmt_rate(m.c.decompress), m.c.decompress_overhead * 1e6,
            model::fmt_rate(m.c.decompress_add), m.c.decompress_add_overhead * 1e6,
            model::fmt_rate(p.staging_line().bandwidth), p.staging_curve.points.len(),
            model::fmt_rate(p.device_copy), model::fmt_rate(p.range_pass), model::fmt_rate(p.scale_pass));
        let last_rate = |c: &Curve| {
            c.points
                .last()
                .map_or_else(|| "-".into(), |&(b, t)| model::fmt_rate(b / t))
        };
        tracing::info!(target: "zcomm::comm", "device profile, one rank alone: compress {} + {:.1} us, decompress {} + {:.1} us, staging {} sizes; one-way link {}, exchange {} per direction ({} sizes); {} rank(s) per GPU",
            model::fmt_rate(m.c.compress_solo), m.c.compress_solo_overhead * 1e6,
            model::fmt_rate(m.c.decompress_solo), m.c.decompress_solo_overhead * 1e6,
            p.staging_curve_solo.points.len(),
            last_rate(&p.link_one_way), last_rate(&p.link_exchange),
            p.link_one_way.points.len(), p.ranks_per_gpu);
        for c in &p.gpu_codecs {
            tracing::info!(target: "zcomm::comm", "device profile, {}: compress {} + {:.1} us, decompress {} + {:.1} us, decompress-add {} + {:.1} us",
                c.codec, model::fmt_rate(c.compress), c.compress_overhead * 1e6,
                model::fmt_rate(c.decompress), c.decompress_overhead * 1e6,
                model::fmt_rate(c.decompress_add), c.decompress_add_overhead * 1e6);
        }
        self.profile = Some(p.clone());
        Ok(p)
    }

    /// Measure pinned D2H/H2D copies of exactly `bytes` (every rank at once, warm-up + median,
    /// slowest rank) and add the point to the profile's staging curve (calibrating the profile
    /// first with the default size if there is none). Collective over `comm`.
    pub fn calibrate_staging(&mut self, comm: &Communicator, bytes: usize) -> Result<StagingPoint> {
        if self.profile.is_none() {
            self.calibrate(comm, CALIBRATION_MIN_VALUES, CodecKind::default())?;
        }
        let mut v = [bytes.max(1) as f64];
        comm.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        let bytes = v[0] as usize;
        let s = self.stream();
        let mut buf = s.alloc_zeros::<u8>(bytes).map_err(gpu_err("alloc"))?;
        let (d, h) = self.time_staging(comm, &mut buf, bytes, false)?;
        drop(buf);
        let mut t = [d, h];
        comm.transport().allreduce_f64(&mut t, ReduceOp::Max)?;
        let pt = StagingPoint {
            bytes: bytes as f64,
            d2h: t[0],
            h2d: t[1],
        };
        if let Some(p) = self.profile.as_mut() {
            p.staging_curve.insert(pt);
        }
        Ok(pt)
    }

    /// The most ranks sharing one GPU: every rank's (host name, PCI domain / bus / device id of
    /// its GPU) gathered, the largest group of equal records (the device ordinal stands in for
    /// the PCI address where the driver does not report it). Collective.
    pub(super) fn ranks_per_gpu(&self, comm: &Communicator) -> Result<usize> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let ctx = self.gpu.context();
        let attr = |a: A| ctx.attribute(a).ok();
        let pci = match (
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
        ) {
            (Some(d), Some(b), Some(v)) => [d, b, v],
            _ => [-1, -1, ctx.ordinal() as i32],
        };
        // FNV-1a of the host name
        let host = crate::comm::hostname()
            .bytes()
            .fold(0xcbf29ce484222325u64, |h, c| {
                (h ^ u64::from(c)).wrapping_mul(0x100000001b3)
            });
        let mut mine = host.to_le_bytes().to_vec();
        for x in pci {
            mine.extend(x.to_le_bytes());
        }
        let all = comm.transport().allgather_fixed(&mine)?;
        Ok(all
            .chunks(mine.len())
            .map(|a| all.chunks(mine.len()).filter(|b| a == *b).count())
            .max()
            .unwrap_or(1)
            .max(1))
    }

    /// Median D2H and H2D seconds of `bytes` between `buf` and the pinned send buffer, copied
    /// by every rank at once, or with `solo` by rank 0 alone (0 on the other ranks).
    pub(super) fn time_staging(
        &mut self,
        comm: &Communicator,
        buf: &mut CudaSlice<u8>,
        bytes: usize,
        solo: bool,
    ) -> Result<(f64, f64)> {
        let s = self.stream();
        Self::grow_pinned(&mut self.pinned_send, &s, bytes)?;
        let pinned = self.pinned_send.as_mut().expect("grown");
        let pinned = pinned.as_mut_slice().map_err(gpu_err("pinned"))?;
        let me = comm.rank() == 0;
        let timed = |f: &mut dyn FnMut() -> Result<()>| {
            if solo {
                repeat_solo(comm.transport(), me, f)
            } else {
                repeat(comm.transport(), f)
            }
        };
        let td = timed(&mut || {
            let (p, _g) = buf.device_ptr(&s);
            Self::d2h(&s, p, &mut pinned[..bytes])
        })?;
        let th = timed(&mut || {
            let (p, _g) = buf.device_ptr_mut(&s);
            Self::h2d(&s, &pinned[..bytes], p)
        })?;
        Ok((td, th))
    }
}

/// The `noa` bound of the calibration's codec calls.
const CALIBRATION_NOA: f64 = 1e-3;

/// Smallest calibration field of [`DeviceStager::calibrate`] (16 Mi f32 = 64 MiB).
pub const CALIBRATION_MIN_VALUES: usize = 1 << 24;
/// Values of the tiny buffer whose codec calls measure [`StagedModel::call_overhead`]
/// (64 Ki f32 = 256 KiB).
pub const CALIBRATION_TINY_VALUES: usize = 1 << 16;
/// Sizes (MiB) of the one-way and exchange link calibrations (those below the calibration
/// field's size, which is measured too).
pub const CALIBRATION_LINK_MIB: [usize; 4] = [1, 16, 64, 256];
