//! [`DeviceStager::calibrate`]: measures the [`DeviceProfile`] (codec, staging and link rates,
//! shared and solo) on every rank at once.

use super::*;

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
    ///   [`codecs`](DeviceProfile::codecs), among which `Policy::Auto` chooses per message).
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
    /// * One-way link (`link_one_way`): rank 0 sends from its pinned send buffer to rank 1's
    ///   pinned receive buffer while the other ranks idle, then 1 → 0, at
    ///   [`CALIBRATION_LINK_MIB`] (up to the field's size), [`CALIBRATION_LINK_WARMUP`] +
    ///   median of [`CALIBRATION_LINK_REPS`], a barrier before each; the slower direction and
    ///   the slower of the two ranks' clocks (the receiver's) per size.
    /// * Exchange (`link_exchange`): ranks 0 and 1 send to each other at once between the same
    ///   pinned buffers, same sizes and schedule ([`time_exchange`](Self::time_exchange)).
    /// * Placement (`ranks_per_gpu`): the largest number of ranks on one host with the same
    ///   GPU PCI address (gathered from every rank; the device ordinal where the driver reports
    ///   no PCI address).
    ///
    /// Cost: the solo and one-way parts repeat every copy size per rank and direction, so they
    /// take about as long as the shared part again; calibrate once and keep the profile.
    pub fn calibrate(
        &mut self,
        comm: &Communicator,
        values: usize,
        codec: CodecKind,
    ) -> Result<DeviceProfile> {
        // every rank measures the same sizes
        let mut v = [values.max(CALIBRATION_MIN_VALUES) as f64];
        comm.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        let values = v[0] as usize;
        let ranks_per_gpu = self.ranks_per_gpu(comm)?;
        let s = self.stream();
        let (codec_times, tiny, kinds, lens) = {
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
            let tiny = CALIBRATION_TINY_VALUES.min(values);
            // the requested codec first (its lines become the profile's codec fields), then
            // every other GPU codec that works on every rank (`Policy::Auto` chooses among them)
            let mut kinds = vec![codec];
            for &c in CodecKind::WITH_GPU {
                if c != codec && self.codec_works_everywhere(comm, &dev, &mut out, tiny, c)? {
                    kinds.push(c);
                }
            }
            let mut times = Vec::with_capacity(CODEC_TIMES * kinds.len() + 3);
            // each codec's stream length on the field (for its ratio)
            let mut lens = Vec::with_capacity(kinds.len());
            for &c in &kinds {
                let (t, len) = self.time_codec(comm, &dev, &mut out, tiny, c)?;
                times.extend(t);
                lens.push(len);
            }
            // device-memory passes: a plain device copy (reported), and the device reductions'
            // value-range pass and the mean's division (by 1 here)
            let t_copy = Self::repeat(comm, || {
                s.memcpy_dtod(&dev, &mut out).map_err(gpu_err("dtod"))?;
                s.synchronize().map_err(gpu_err("sync"))
            })?;
            // the utility kernels need NVRTC: without it the device ring is not used either,
            // and their terms stay uncalibrated (0)
            // (every rank runs the timed calls or none: the repetitions hold barriers)
            let loaded = self.utils().map(|_| ());
            let mut all_ok = [f64::from(u8::from(loaded.is_ok()))];
            comm.transport().allreduce_f64(&mut all_ok, ReduceOp::Min)?;
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
                        let tr = Self::repeat(comm, || u.range(&s, &dev.slice(..)).map(|_| ()))?;
                        let ts = Self::repeat(comm, || {
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
            times.extend([t_copy, t_range, t_scale]);
            (times, tiny, kinds, lens)
        };
        let total = values * 4;
        let mut sizes: Vec<usize> = [1usize, 4, 16, 64, 256]
            .iter()
            .map(|m| m << 20)
            .filter(|&b| b < total)
            .collect();
        sizes.push(total);
        let nc = codec_times.len();
        let mut times = codec_times;
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
        // one-way transfers between ranks 0 and 1 from and into pinned memory, both directions
        let link_sizes: Vec<usize> = if comm.size() > 1 {
            let mut v: Vec<usize> = CALIBRATION_LINK_MIB
                .iter()
                .map(|m| m << 20)
                .filter(|&b| b <= total)
                .collect();
            if v.is_empty() {
                v.push(total);
            }
            v
        } else {
            Vec::new()
        };
        for &b in &link_sizes {
            let f = self.time_one_way(comm, 0, 1, b)?;
            let r = self.time_one_way(comm, 1, 0, b)?;
            let x = self.time_exchange(comm, b)?;
            times.extend([f, r, x]);
        }
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
        let (mut link_one_way, mut link_exchange) = (LinkCurve::default(), LinkCurve::default());
        for (i, &b) in link_sizes.iter().enumerate() {
            let k = nc + 4 * ns + 3 * i;
            link_one_way.insert(LinkPoint {
                bytes: b as f64,
                seconds: times[k].max(times[k + 1]),
            });
            link_exchange.insert(LinkPoint {
                bytes: b as f64,
                seconds: times[k + 2],
            });
        }
        let tb = (tiny * 4) as f64;
        let speeds: Vec<CodecSpeed> = kinds
            .iter()
            .zip(times.chunks_exact(CODEC_TIMES))
            .zip(&lens)
            .map(|((&c, t), &len)| codec_lines(c, t, tb, bytes, bytes / len.max(1) as f64))
            .collect();
        let passes = &times[CODEC_TIMES * kinds.len()..];
        let rate = |t: f64| if t > 0.0 { bytes / t } else { 0.0 };
        let p = DeviceProfile {
            staging: Link {
                bandwidth: last.bytes / last.d2h.max(last.h2d).max(1e-12),
                latency: 10e-6,
            },
            staging_curve: curve,
            // a copy moves `bytes` once (read + write)
            device_copy: rate(passes[0]),
            range_pass: rate(passes[1]),
            scale_pass: rate(passes[2]),
            ranks_per_gpu,
            staging_curve_solo: curve_solo,
            link_one_way,
            link_exchange,
            codecs: speeds,
            ..DeviceProfile::guess()
        }
        .with_codec(codec);
        tracing::info!(target: "zcomm::comm", "device profile: compress {} + {:.1} us, decompress {} + {:.1} us, decompress-add {} + {:.1} us, staging {} ({} sizes), device copy {}, range {}, scale {}",
            model::fmt_rate(p.compress), p.compress_overhead * 1e6,
            model::fmt_rate(p.decompress), p.decompress_overhead * 1e6,
            model::fmt_rate(p.decompress_add), p.decompress_add_overhead * 1e6,
            model::fmt_rate(p.staging.bandwidth), p.staging_curve.points.len(),
            model::fmt_rate(p.device_copy), model::fmt_rate(p.range_pass), model::fmt_rate(p.scale_pass));
        let last_rate = |c: &LinkCurve| {
            c.points
                .last()
                .map_or_else(|| "-".into(), |q| model::fmt_rate(q.bytes / q.seconds))
        };
        tracing::info!(target: "zcomm::comm", "device profile, one rank alone: compress {} + {:.1} us, decompress {} + {:.1} us, staging {} sizes; one-way link {}, exchange {} per direction ({} sizes); {} rank(s) per GPU",
            model::fmt_rate(p.compress_solo), p.compress_solo_overhead * 1e6,
            model::fmt_rate(p.decompress_solo), p.decompress_solo_overhead * 1e6,
            p.staging_curve_solo.points.len(),
            last_rate(&p.link_one_way), last_rate(&p.link_exchange),
            p.link_one_way.points.len(), p.ranks_per_gpu);
        for c in &p.codecs {
            tracing::info!(target: "zcomm::comm", "device profile, {}: compress {} + {:.1} us, decompress {} + {:.1} us, decompress-add {} + {:.1} us",
                c.codec, model::fmt_rate(c.compress), c.compress_overhead * 1e6,
                model::fmt_rate(c.decompress), c.decompress_overhead * 1e6,
                model::fmt_rate(c.decompress_add), c.decompress_add_overhead * 1e6);
        }
        self.profile = Some(p.clone());
        Ok(p)
    }

    /// One codec call on the calibration stream into the first `m` values of `out`: the first
    /// `len` bytes of the compression scratch decompressed, plain or fused with an addition.
    fn decode_scratch(
        &mut self,
        out: &mut CudaSlice<f32>,
        len: usize,
        m: usize,
        add: bool,
    ) -> Result<()> {
        let src = self.scratch_out.take().expect("grown");
        let r = {
            let v = src.slice(0..len);
            let mut o = out.slice_mut(..m);
            if add {
                self.gpu.decompress_add_device(&v, &mut o)
            } else {
                self.gpu.decompress_device(&v, &mut o)
            }
        };
        self.scratch_out = Some(src);
        r
    }

    /// Whether `codec` compresses, decompresses and decompresses-and-adds the tiny prefix of
    /// `field` on every rank (untimed; collective): a codec that fails anywhere is left out of
    /// the calibration on every rank, so that no rank leaves the timed, barrier-synchronized
    /// repetitions early.
    fn codec_works_everywhere(
        &mut self,
        comm: &Communicator,
        field: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        tiny: usize,
        codec: CodecKind,
    ) -> Result<bool> {
        let bound = ErrorBound::Noa(CALIBRATION_NOA);
        let ok = self
            .compress_to_scratch(&field.slice(..tiny), bound, codec)
            .and_then(|len| {
                self.decode_scratch(out, len, tiny, false)?;
                self.decode_scratch(out, len, tiny, true)
            });
        if let Err(e) = &ok {
            tracing::warn!(target: "zcomm::comm", "device profile: {codec} not calibrated ({e})");
        }
        let mut all = [f64::from(u8::from(ok.is_ok()))];
        comm.transport().allreduce_f64(&mut all, ReduceOp::Min)?;
        Ok(all[0] > 0.5)
    }

    /// The [`CODEC_TIMES`] median call times of `codec` (see [`codec_lines`] for their order)
    /// and the length of its stream of the whole field:
    /// on `field` and on its first `tiny` values, every rank at once, then rank 0 alone (the
    /// others wait in a barrier; 0 on them): what a call costs when no other rank uses the
    /// GPU (the broadcast's root, a rank whose upload finished after the others'; see the
    /// module docs' model section).
    fn time_codec(
        &mut self,
        comm: &Communicator,
        field: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        tiny: usize,
        codec: CodecKind,
    ) -> Result<([f64; CODEC_TIMES], usize)> {
        let bound = ErrorBound::Noa(CALIBRATION_NOA);
        let values = field.len();
        let mut len = 0;
        let tc = Self::repeat(comm, || {
            len = self.compress_to_scratch(&field.slice(..), bound, codec)?;
            Ok(())
        })?;
        let td = Self::repeat(comm, || self.decode_scratch(out, len, values, false))?;
        let tda = Self::repeat(comm, || self.decode_scratch(out, len, values, true))?;
        // fixed per-call cost: the same calls on a tiny buffer (the intercept of each call's
        // line, see `model::call_line`)
        let mut tlen = 0;
        let tc_tiny = Self::repeat(comm, || {
            tlen = self.compress_to_scratch(&field.slice(..tiny), bound, codec)?;
            Ok(())
        })?;
        let td_tiny = Self::repeat(comm, || self.decode_scratch(out, tlen, tiny, false))?;
        let tda_tiny = Self::repeat(comm, || self.decode_scratch(out, tlen, tiny, true))?;
        let solo = comm.rank() == 0;
        let tc_solo = Self::repeat_solo(comm, solo, || {
            len = self.compress_to_scratch(&field.slice(..), bound, codec)?;
            Ok(())
        })?;
        let td_solo =
            Self::repeat_solo(comm, solo, || self.decode_scratch(out, len, values, false))?;
        let tc_solo_tiny = Self::repeat_solo(comm, solo, || {
            tlen = self.compress_to_scratch(&field.slice(..tiny), bound, codec)?;
            Ok(())
        })?;
        let td_solo_tiny =
            Self::repeat_solo(comm, solo, || self.decode_scratch(out, tlen, tiny, false))?;
        Ok((
            [
                tc,
                td,
                tda,
                tc_tiny,
                td_tiny,
                tda_tiny,
                tc_solo,
                td_solo,
                tc_solo_tiny,
                td_solo_tiny,
            ],
            len,
        ))
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

    /// Warm-up calls, then the median of timed calls, a barrier before each.
    pub(super) fn repeat(comm: &Communicator, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let mut times = Vec::with_capacity(CALIBRATION_REPS);
        for k in 0..CALIBRATION_WARMUP + CALIBRATION_REPS {
            comm.barrier()?;
            let t = now();
            f()?;
            if k >= CALIBRATION_WARMUP {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        Ok(model::median(&times))
    }

    /// Like [`repeat`](Self::repeat), but only where `me` (one rank) runs the calls, without
    /// barriers between them, while the other ranks wait (a barrier before, one reduction of the
    /// error status after; they return 0). The solo rates of the profile.
    pub(super) fn repeat_solo(
        comm: &Communicator,
        me: bool,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        comm.barrier()?;
        let r = if me {
            let mut times = Vec::with_capacity(CALIBRATION_REPS);
            let mut res = Ok(());
            for k in 0..CALIBRATION_WARMUP + CALIBRATION_REPS {
                let t = now();
                if let Err(e) = f() {
                    res = Err(e);
                    break;
                }
                if k >= CALIBRATION_WARMUP {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            res.map(|()| model::median(&times))
        } else {
            Ok(0.0)
        };
        // every rank leaves together, and fails together when the calling rank failed
        let mut failed = [f64::from(u8::from(r.is_err()))];
        comm.transport().allreduce_f64(&mut failed, ReduceOp::Max)?;
        match r {
            Ok(_) if failed[0] > 0.5 => Err(Error::Comm(
                "device calibration: the solo calls failed on another rank".into(),
            )),
            r => r,
        }
    }

    /// Median seconds of a one-way transfer of `bytes` from rank `from`'s pinned send buffer
    /// into rank `to`'s pinned receive buffer (a barrier before each, the other ranks idle in
    /// it; [`CALIBRATION_LINK_WARMUP`] + [`CALIBRATION_LINK_REPS`] transfers): each of the two
    /// returns its own median (the receiver's is the complete transfer), the others 0.
    pub(super) fn time_one_way(
        &mut self,
        comm: &Communicator,
        from: usize,
        to: usize,
        bytes: usize,
    ) -> Result<f64> {
        self.time_pinned_link(comm, bytes, [from, to], |t, r, snd, rcv| {
            if r == from {
                t.send(to, crate::comm::TAG_PING, snd)
            } else if let Some(v) = t.recv_into(from, crate::comm::TAG_PING, rcv)? {
                Err(Error::Comm(format!(
                    "link calibration: expected {bytes} bytes from rank {from}, got {}",
                    v.len()
                )))
            } else {
                Ok(())
            }
        })
    }

    /// Median seconds of a simultaneous exchange of `bytes` each way between ranks 0 and 1
    /// (each sends from its pinned send buffer and receives into its pinned receive buffer, as
    /// a ring step or `sendrecv_device` does; same schedule as
    /// [`time_one_way`](Self::time_one_way)): each of the two returns its own median, the
    /// others 0. The buffers are the ones the operations stage through: a shared-memory
    /// transport moves page-locked memory faster than the freshly allocated pageable vectors
    /// of the host ping-pong.
    pub(super) fn time_exchange(&mut self, comm: &Communicator, bytes: usize) -> Result<f64> {
        self.time_pinned_link(comm, bytes, [0, 1], |t, r, snd, rcv| {
            t.sendrecv_sized(1 - r, snd, 1 - r, rcv, crate::comm::TAG_PING)
        })
    }

    /// The schedule of the link calibrations: `bytes` of the pinned send and receive buffers
    /// (grown as needed) handed to `transfer` on the two ranks of `pair` (the others idle), a
    /// barrier before each of [`CALIBRATION_LINK_WARMUP`] + [`CALIBRATION_LINK_REPS`]
    /// transfers; the median of the timed ones on the pair's ranks, 0 elsewhere.
    fn time_pinned_link(
        &mut self,
        comm: &Communicator,
        bytes: usize,
        pair: [usize; 2],
        transfer: impl Fn(&dyn crate::comm::transport::Transport, usize, &[u8], &mut [u8]) -> Result<()>,
    ) -> Result<f64> {
        let s = self.stream();
        let r = comm.rank();
        Self::grow_pinned(&mut self.pinned_send, &s, bytes)?;
        Self::grow_pinned(&mut self.pinned_recv, &s, bytes)?;
        let snd = self.pinned_send.as_ref().expect("grown");
        let snd = &snd.as_slice().map_err(gpu_err("pinned"))?[..bytes];
        let rcv = self.pinned_recv.as_mut().expect("grown");
        let rcv = &mut rcv.as_mut_slice().map_err(gpu_err("pinned"))?[..bytes];
        let mine = pair.contains(&r);
        let mut times = Vec::with_capacity(CALIBRATION_LINK_REPS);
        for k in 0..CALIBRATION_LINK_WARMUP + CALIBRATION_LINK_REPS {
            comm.barrier()?;
            let t0 = now();
            if mine {
                transfer(comm.transport(), r, snd, rcv)?;
            }
            if k >= CALIBRATION_LINK_WARMUP {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        Ok(if mine { model::median(&times) } else { 0.0 })
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
                Self::repeat_solo(comm, me, f)
            } else {
                Self::repeat(comm, f)
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

/// Call times per codec measured by [`DeviceStager::calibrate`].
const CODEC_TIMES: usize = 10;

/// The `noa` bound of the calibration's codec calls.
const CALIBRATION_NOA: f64 = 1e-3;

/// A codec's call lines ([`model::call_line`] through the tiny (`tb` bytes) and the full
/// (`bytes`) call) from its [`CODEC_TIMES`] times: compression, decompression and fused
/// decompress-and-add on the field, the same three on the tiny prefix, then compression and
/// decompression alone on the field and on the tiny prefix; `ratio` on the field.
fn codec_lines(codec: CodecKind, t: &[f64], tb: f64, bytes: f64, ratio: f64) -> CodecSpeed {
    let line = |tiny: f64, big: f64| model::call_line(tb, tiny, bytes, big);
    let (compress, compress_overhead) = line(t[3], t[0]);
    let (decompress, decompress_overhead) = line(t[4], t[1]);
    let (decompress_add, decompress_add_overhead) = line(t[5], t[2]);
    let (compress_solo, compress_solo_overhead) = line(t[8], t[6]);
    let (decompress_solo, decompress_solo_overhead) = line(t[9], t[7]);
    CodecSpeed {
        codec,
        // the calibration field is f32
        dtype: 1,
        ratio,
        compress,
        compress_overhead,
        decompress,
        decompress_overhead,
        decompress_add,
        decompress_add_overhead,
        compress_solo,
        compress_solo_overhead,
        decompress_solo,
        decompress_solo_overhead,
    }
}

/// Smallest calibration field of [`DeviceStager::calibrate`] (16 Mi f32 = 64 MiB).
pub const CALIBRATION_MIN_VALUES: usize = 1 << 24;
/// Values of the tiny buffer whose codec calls measure [`DeviceProfile::call_overhead`]
/// (64 Ki f32 = 256 KiB).
pub const CALIBRATION_TINY_VALUES: usize = 1 << 16;
/// Warm-up calls before each calibrated quantity.
pub const CALIBRATION_WARMUP: usize = 2;
/// Timed repetitions (median) of each calibrated quantity.
pub const CALIBRATION_REPS: usize = 9;
/// Sizes (MiB) of the one-way and exchange link calibrations (those up to the calibration
/// field's size; the field's size alone when it is smaller than all of them).
pub const CALIBRATION_LINK_MIB: [usize; 4] = [1, 16, 64, 256];
/// Warm-up transfers of each link calibration size and pattern.
pub const CALIBRATION_LINK_WARMUP: usize = 2;
/// Timed transfers (median) of each link calibration size and pattern (the shared-memory
/// transport of one node varies from call to call: nine keep the median steady).
pub const CALIBRATION_LINK_REPS: usize = 9;
