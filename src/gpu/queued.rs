//! Decompressions queued on the codec's stream without waiting for their result, for callers
//! that synchronize anyway soon after (the device ring: a piece's accumulation is followed by
//! its compression, whose stream length the host must read): the host then waits once per
//! piece instead of once per kernel. Only the guessing launch can be queued (the decoder reads
//! its parameters from the stream's header on the device, `zc_decompress_hdr` and the
//! accumulating `zc_decompress_add_hdr` / `zc_decompress_add_track_hdr`, for the codec and
//! bound mode the caller expects), so nothing waits for the header either; each queued launch
//! writes its result into its own slot of the host-mapped result words, and
//! [`GpuCodec::settle`] judges it exactly as the waiting call would have.
//!
//! A caller must not read what a queued decode writes before settling it, except on the
//! codec's stream (where the kernels are ordered), and must settle it before the stream it
//! reads may change; a decode the caller drops without settling keeps its slot until
//! [`GpuCodec::settle_all`].

use cudarc::driver::{CudaView, CudaViewMut};

use super::*;

/// Decodes that may be queued at once (each holds one slot of the result words until it is
/// settled; beyond that, decodes run the waiting way).
pub(super) const QUEUE_DEPTH: usize = 16;

/// The result slot of the queued launch `seq` (slot 0 belongs to the waiting calls).
fn slot_of(seq: u64) -> usize {
    1 + (seq % QUEUE_DEPTH as u64) as usize
}

/// How a decode asked for with [`GpuCodec::decompress_add_to_device_queued`] or
/// [`GpuCodec::decompress_device_queued`] went.
#[derive(Debug)]
pub(crate) enum Decode {
    /// It ran the waiting way and succeeded (a codec without a guessing kernel, no free
    /// slot, or buffers the guessing kernels do not take); `tracked` as
    /// [`GpuCodec::decompress_add_to_device_tracking`] returns it.
    Done { tracked: bool },
    /// It is queued: [`GpuCodec::settle`] tells how it went.
    Queued(QueuedDecode),
}

/// A decode queued on the codec's stream and not yet judged.
#[derive(Debug)]
#[must_use = "a queued decode is judged by GpuCodec::settle"]
pub(crate) struct QueuedDecode {
    seq: u64,
    stream_len: usize,
    count: usize,
    tracked: bool,
}

impl GpuCodec {
    /// [`GpuCodec::decompress_add_to_device_tracking`] (`track` given) or
    /// [`GpuCodec::decompress_add_to_device`], queued without waiting for a stream the caller
    /// expects to be a compressed stream of the codec and bound mode `expected` (aatrox,
    /// cuszp-plain or cuszp-outlier); otherwise run the waiting way. `out` and (tracking) `track`
    /// hold their results only once the queued decode is settled.
    pub(crate) fn decompress_add_to_device_queued<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        base: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        mut track: Option<&mut DeviceRange>,
        expected: (CodecKind, BoundMode),
    ) -> Result<Decode> {
        if base.len() == out.len() {
            let s = self.stream.clone();
            let bp = raw_ptr(base, &s);
            let onto = match track.as_deref_mut() {
                Some(acc) => Onto::Tracking(bp, acc.words_for::<T>(&s)?),
                None => Onto::Base(bp),
            };
            if bp % (T::SIZE as u64) == 0 {
                if let Some(q) = self.queue_decode::<T>(stream, out, expected, onto)? {
                    return Ok(Decode::Queued(q));
                }
            }
        }
        let tracked = match track {
            Some(acc) => self.decompress_add_to_device_tracking(stream, base, out, acc)?,
            None => {
                self.decompress_add_to_device(stream, base, out)?;
                false
            }
        };
        Ok(Decode::Done { tracked })
    }

    /// [`GpuCodec::decompress_device`], queued without waiting as
    /// [`GpuCodec::decompress_add_to_device_queued`] is.
    pub(crate) fn decompress_device_queued<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
        expected: (CodecKind, BoundMode),
    ) -> Result<Decode> {
        if let Some(q) = self.queue_decode::<T>(stream, out, expected, Onto::Nothing)? {
            return Ok(Decode::Queued(q));
        }
        self.decompress_device(stream, out)?;
        Ok(Decode::Done { tracked: false })
    }

    /// Queue the guessing decoder of the expected codec and mode for `stream` into `out`
    /// (`onto`: what it adds to); `None` when it cannot be queued (no guessing kernel, no free
    /// result slot).
    fn queue_decode<T: GpuElement>(
        &mut self,
        stream: &CudaView<'_, u8>,
        out: &mut CudaViewMut<'_, T>,
        (codec, mode): (CodecKind, BoundMode),
        onto: Onto,
    ) -> Result<Option<QueuedDecode>> {
        let tracking = matches!(onto, Onto::Tracking(..));
        if !matches!(
            codec,
            CodecKind::Aatrox | CodecKind::CuszpPlain | CodecKind::CuszpOutlier
        ) {
            return Ok(None);
        }
        let next = self.seq.wrapping_add(1);
        if self.queued.iter().any(|&q| slot_of(q) == slot_of(next)) {
            return Ok(None); // every slot is taken
        }
        let Some(seq) =
            self.launch_guessing::<T>(stream, out, (codec, mode), onto, slot_of(next))?
        else {
            return Ok(None);
        };
        debug_assert_eq!(seq, next);
        self.queued.push(seq);
        Ok(Some(QueuedDecode {
            seq,
            stream_len: stream.len(),
            count: out.len(),
            tracked: tracking,
        }))
    }

    /// Wait for the queued decode `q` and judge it as the waiting call would have:
    /// `Ok(Some(tracked))` when its output holds the decoded values (or the sums; `tracked`:
    /// the base's range was folded in), `Ok(None)` when the stream was not the one guessed (a
    /// stored stream, another header: nothing was written, and the caller decodes it the
    /// waiting way), or the error of the stream or its header.
    pub(crate) fn settle<T: GpuElement>(&mut self, q: QueuedDecode) -> Result<Option<bool>> {
        self.stream.synchronize().map_err(gpu_err("sync"))?;
        self.queued.retain(|&s| s != q.seq);
        let res = self.result_words(slot_of(q.seq));
        if res[R_SEQ] != q.seq {
            return Err(Error::Gpu(
                "a queued decompression did not record its result".into(),
            ));
        }
        Ok(judge_guessed::<T>(&res, q.stream_len, q.count)?.then_some(q.tracked))
    }

    /// Wait for every queued decode and forget them (their results unread): for a caller that
    /// gives up after an error.
    pub(crate) fn settle_all(&mut self) -> Result<()> {
        self.queued.clear();
        self.stream.synchronize().map_err(gpu_err("sync"))
    }
}
