//! The one calibration of the device codecs, shared by every device communicator (the staged
//! MPI [`DeviceStager`](crate::comm::device::DeviceStager) and, with the `nccl` feature, the
//! NCCL communicator): the same schedule ([`repeat`], [`repeat_solo`]: a barrier on the host
//! transport before every timed call, warm-ups, the median, the slowest rank's number adopted
//! by all) and the same measurement of each GPU codec's call lines ([`CodecBench`]) whatever
//! transport later carries the streams. The links between ranks have their one calibration
//! too (`comm::link_calibrate`, on this schedule); what else differs between transports — the
//! staging copies, the device passes — each communicator's calibration measures on top.
//!
//! A codec's calls follow the line `t(b) = overhead + b / rate` ([`model::call_line`] through a
//! call on a tiny prefix of the field and one on the whole field), for compression,
//! decompression and the fused decompress-and-add of the device ring, every rank at once
//! (*shared*), and on request by rank 0 alone while the others wait (*solo*: a rank whose peers
//! are not using the GPU, as a broadcast's root).

use cudarc::driver::{CudaSlice, CudaView};

pub(crate) use super::link_calibrate::{repeat, repeat_solo};
use super::transport::{ReduceOp, Transport};
use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::gpu::GpuCodec;
use crate::model::{self, CodecSpeed};
use crate::quant::ErrorBound;

/// What the codec calls of the calibration run on: a field in device memory, the buffer its
/// streams go to and the buffer the decodes write, on one GPU codec.
pub(crate) struct CodecBench<'a> {
    /// The codec (and its stream) that runs the calls.
    pub gpu: &'a mut GpuCodec,
    /// The f32 calibration field.
    pub field: CudaView<'a, f32>,
    /// Holds a stream of the whole field ([`crate::compress_bound`] bytes at least).
    pub streams: &'a mut CudaSlice<u8>,
    /// Holds the field's values (decodes land here).
    pub decoded: &'a mut CudaSlice<f32>,
    /// Values of the tiny prefix whose calls give the fixed per-call costs.
    pub tiny: usize,
    /// The bound of every compression (a `noa` bound includes the value-range pass in the
    /// compression call; an absolute one leaves it out).
    pub bound: ErrorBound,
}

/// Call times of one codec measured by [`CodecBench::lines`], in the order [`lines_of`] reads.
const CODEC_TIMES: usize = 10;

impl CodecBench<'_> {
    fn compress(&mut self, n: usize, codec: CodecKind) -> Result<usize> {
        let mut out = self.streams.slice_mut(..);
        self.gpu
            .compress_device(&self.field.slice(..n), self.bound, codec, &mut out)
    }

    fn decode(&mut self, len: usize, n: usize, add: bool) -> Result<()> {
        let s = self.streams.slice(..len);
        let mut o = self.decoded.slice_mut(..n);
        if add {
            self.gpu.decompress_add_device(&s, &mut o)
        } else {
            self.gpu.decompress_device(&s, &mut o)
        }
    }

    /// Whether `codec` compresses, decompresses and decompresses-and-adds the tiny prefix on
    /// every rank (untimed; collective over `t`): a codec that fails anywhere is left out on
    /// every rank, so that no rank leaves the barrier-synchronized repetitions early.
    pub(crate) fn works_everywhere(&mut self, t: &dyn Transport, codec: CodecKind) -> Result<bool> {
        let tiny = self.tiny;
        let ok = self.compress(tiny, codec).and_then(|len| {
            self.decode(len, tiny, false)?;
            self.decode(len, tiny, true)
        });
        if let Err(e) = &ok {
            tracing::warn!(target: "zcomm::comm", "device calibration: {codec} not calibrated ({e})");
        }
        let mut all = [f64::from(u8::from(ok.is_ok()))];
        t.allreduce_f64(&mut all, ReduceOp::Min)?;
        Ok(all[0] > 0.5)
    }

    /// The call lines of `codec` (every rank at once; with `solo` also rank 0 alone) and its
    /// ratio on the field, the slowest rank's on every rank. Collective over `t`.
    pub(crate) fn lines(
        &mut self,
        t: &dyn Transport,
        codec: CodecKind,
        solo: bool,
    ) -> Result<CodecSpeed> {
        let (n, tiny) = (self.field.len(), self.tiny);
        let (mut len, mut tlen) = (0, 0);
        let mut v = [0.0; CODEC_TIMES + 1];
        v[0] = repeat(t, || {
            len = self.compress(n, codec)?;
            Ok(())
        })?;
        v[1] = repeat(t, || self.decode(len, n, false))?;
        v[2] = repeat(t, || self.decode(len, n, true))?;
        v[3] = repeat(t, || {
            tlen = self.compress(tiny, codec)?;
            Ok(())
        })?;
        v[4] = repeat(t, || self.decode(tlen, tiny, false))?;
        v[5] = repeat(t, || self.decode(tlen, tiny, true))?;
        if solo {
            let me = t.rank() == 0;
            v[6] = repeat_solo(t, me, || {
                len = self.compress(n, codec)?;
                Ok(())
            })?;
            v[7] = repeat_solo(t, me, || self.decode(len, n, false))?;
            v[8] = repeat_solo(t, me, || {
                tlen = self.compress(tiny, codec)?;
                Ok(())
            })?;
            v[9] = repeat_solo(t, me, || self.decode(tlen, tiny, false))?;
        }
        // the slowest rank's times, and the largest stream (the smallest ratio)
        v[CODEC_TIMES] = len as f64;
        t.allreduce_f64(&mut v, ReduceOp::Max)?;
        let bytes = (n * 4) as f64;
        let ratio = bytes / v[CODEC_TIMES].max(1.0);
        Ok(lines_of(codec, &v, (tiny * 4) as f64, bytes, ratio))
    }

    /// The lines of every GPU codec ([`CodecKind::WITH_GPU`], and `first`) that works on every
    /// rank, `first` first when it does (its lines stand for codecs without their own); an
    /// error when none works everywhere. Collective over `t`.
    pub(crate) fn all_lines(
        &mut self,
        t: &dyn Transport,
        first: CodecKind,
        solo: bool,
    ) -> Result<Vec<CodecSpeed>> {
        let mut out = Vec::new();
        for c in std::iter::once(first).chain(CodecKind::WITH_GPU.iter().copied()) {
            if out.iter().any(|s: &CodecSpeed| s.codec == c) {
                continue;
            }
            if self.works_everywhere(t, c)? {
                out.push(self.lines(t, c, solo)?);
            }
        }
        if out.is_empty() {
            return Err(Error::Unavailable(
                "device calibration: no GPU codec works on every rank".into(),
            ));
        }
        Ok(out)
    }
}

/// A codec's call lines ([`model::call_line`] through the tiny (`tb` bytes) and the full
/// (`bytes`) call) from its [`CODEC_TIMES`] times: compression, decompression and fused
/// decompress-and-add on the field, the same three on the tiny prefix, then compression and
/// decompression alone on the field and on the tiny prefix (0: not measured, the solo lines
/// stay 0); `ratio` on the field.
fn lines_of(codec: CodecKind, t: &[f64], tb: f64, bytes: f64, ratio: f64) -> CodecSpeed {
    let line = |tiny: f64, big: f64| {
        if big > 0.0 {
            model::call_line(tb, tiny, bytes, big)
        } else {
            (0.0, 0.0)
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines go through the tiny and the full call; unmeasured solo calls give 0 (not
    /// calibrated) rather than a rate from a zero time.
    #[test]
    fn lines_through_both_calls_and_zero_when_not_measured() {
        let (tb, b) = (262_144.0, 67_108_864.0);
        // compress: 10 us fixed + 100 GB/s; decompress 5 us + 200 GB/s; add 6 us + 150 GB/s
        let at = |fixed: f64, rate: f64, bytes: f64| fixed + bytes / rate;
        let mut t = [0.0; CODEC_TIMES];
        t[0] = at(10e-6, 100e9, b);
        t[1] = at(5e-6, 200e9, b);
        t[2] = at(6e-6, 150e9, b);
        t[3] = at(10e-6, 100e9, tb);
        t[4] = at(5e-6, 200e9, tb);
        t[5] = at(6e-6, 150e9, tb);
        let s = lines_of(CodecKind::Aatrox, &t, tb, b, 8.0);
        let close = |a: f64, e: f64| ((a - e) / e).abs() < 1e-9;
        assert!(
            close(s.compress, 100e9) && close(s.compress_overhead, 10e-6),
            "{s:?}"
        );
        assert!(close(s.decompress, 200e9) && close(s.decompress_overhead, 5e-6));
        assert!(close(s.decompress_add, 150e9) && close(s.decompress_add_overhead, 6e-6));
        assert_eq!((s.compress_solo, s.compress_solo_overhead), (0.0, 0.0));
        assert_eq!((s.decompress_solo, s.decompress_solo_overhead), (0.0, 0.0));
        assert_eq!((s.codec, s.dtype, s.ratio), (CodecKind::Aatrox, 1, 8.0));
    }
}
