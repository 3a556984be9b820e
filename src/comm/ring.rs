//! The compressed ring reduction, written once for every place a buffer can live.
//!
//! A [`RingPlace`] says how to compress, move and accumulate segments where the data is (host
//! slices with the CPU codec, device buffers with the GPU codec, ...); [`reduce`] is the schedule:
//!
//! 1. **reduce-scatter**, `p - 1` steps: rank `r` compresses its partial sum of one segment,
//!    sends it to `r + 1`, receives `r - 1`'s and adds it, decoded, to its own input for the
//!    next segment. After the last step rank `r` holds the sum of segment `r`. Each step's
//!    compression is under the per-step bound of [`super::reduction_step_bound`];
//! 2. the mean divides this rank's segment by `p` (IEEE division, as the uncompressed path);
//! 3. for an allreduce, **allgather**: the final segment is compressed once under the final
//!    bound and every rank decodes every segment, its own too, so all ranks hold bit-identical
//!    results.
//!
//! Each received segment goes through one [`RingPlace::reduce_step`]: accumulate, divide (the
//! mean's last step), compress for the next message (the last step of an allreduce: the final
//! segment). A place may do them its own way; the device ring compresses the final segment with
//! a kernel that leaves its reconstruction in place of a decode of its own message.
//!
//! The order of operations is fixed by the schedule, so every place gives the same values for
//! the same codec (a GPU run reproduces a CPU run bit for bit).
//!
//! **Failures never leave a rank waiting.** A rank whose compression or accumulation fails
//! keeps to the schedule and sends empty messages (a compressed segment is never empty); its
//! neighbours see them and do the same. An allreduce's allgather then shows every rank whether
//! any message was empty; a reduce-scatter ends with one agreement
//! ([`RingPlace::all_succeeded`]). Every rank returns an error together, or none does (an
//! error decoding the gathered segments is this rank's own: every rank has returned by then).

use crate::codec::CodecKind;
use crate::error::{Error, Result};
use crate::quant::ErrorBound;

/// Where the ring's buffers live and how segments are compressed, exchanged and accumulated.
pub(crate) trait RingPlace {
    /// A compressed segment in flight (host bytes, a device buffer, ...).
    type Msg;
    /// Bytes `m` puts on the wire.
    fn wire_len(&self, m: &Self::Msg) -> usize;
    /// Compress this rank's current partial sum of segment `seg` (before any step: its input).
    fn encode(&mut self, seg: usize, bound: ErrorBound, codec: CodecKind) -> Result<Self::Msg>;
    /// Send `m` to rank `to` and receive one message from rank `from`.
    fn exchange(&mut self, m: Self::Msg, to: usize, from: usize) -> Result<Self::Msg>;
    /// Partial sum of segment `seg` = this rank's input there + `m` decoded.
    fn accumulate(&mut self, seg: usize, m: &Self::Msg) -> Result<()>;
    /// Divide the partial sum of segment `seg` by `d`.
    fn scale(&mut self, seg: usize, d: f64) -> Result<()>;
    /// One reduce step: [`accumulate`](RingPlace::accumulate) `m` into segment `seg`,
    /// [`scale`](RingPlace::scale) it by `divisor` unless that is 1, and, with `next`, compress
    /// the result for the next message. The default makes the three calls
    /// ([`step_in_parts`]); a place may fuse them.
    fn reduce_step(
        &mut self,
        seg: usize,
        m: &Self::Msg,
        divisor: f64,
        next: Option<NextMsg>,
    ) -> Result<Option<Self::Msg>> {
        step_in_parts(self, seg, m, divisor, next)
    }
    /// Gather every rank's final message, in rank order (this rank's `m` at its own index).
    fn allgather(&mut self, m: Self::Msg) -> Result<Vec<Self::Msg>>;
    /// Output segment `seg` = `m` decoded.
    fn decode_into_output(&mut self, seg: usize, m: &Self::Msg) -> Result<()>;
    /// A received message is no longer needed (its buffer may be reused). Default: drop it.
    fn release(&mut self, m: Self::Msg) {
        drop(m);
    }
    /// The message a rank sends in place of a segment after a failure: empty.
    fn failed_msg(&mut self) -> Self::Msg;
    /// Whether `ok` holds on every rank (collective; the end of a reduce-scatter).
    fn all_succeeded(&mut self, ok: bool) -> Result<bool>;
}

/// What a reduce step compresses its partial sum for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NextMsg {
    /// The compression's bound.
    pub bound: ErrorBound,
    /// The codec.
    pub codec: CodecKind,
    /// The message is this rank's final segment (an allreduce's last step): its decoded values
    /// are this rank's result (the device ring then compresses it leaving its reconstruction).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub is_final: bool,
}

/// [`RingPlace::reduce_step`] as three calls: accumulate, scale, encode.
pub(crate) fn step_in_parts<P: RingPlace + ?Sized>(
    place: &mut P,
    seg: usize,
    m: &P::Msg,
    divisor: f64,
    next: Option<NextMsg>,
) -> Result<Option<P::Msg>> {
    place.accumulate(seg, m)?;
    if divisor != 1.0 {
        place.scale(seg, divisor)?;
    }
    next.map(|n| place.encode(seg, n.bound, n.codec))
        .transpose()
}

/// The end-to-end bound of a ring reduction split over the requantisations it performs: the one
/// bound split of every reduction (host ring, device ring, staged device ring).
///
/// The result bound `E` (abs, or noa of the inputs' global range `[lo, hi]`) covers `p`
/// quantisations for an allreduce (`p - 1` partial sums and the final segment) and `p - 1` for a
/// reduce-scatter, plus the float rounding of the `p - 1` additions at the largest magnitude the
/// partial sums can reach ([`super::reduction_step_bound`]). Partial sums are quantised at
/// `step · divisor` (they are divided by the divisor afterwards), the final segment at `step`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoundSplit {
    /// The guaranteed bound on every value of the result.
    pub result: f64,
    /// The bound of each quantisation; `None` when rounding leaves no room for one.
    pub step: Option<f64>,
    /// `p` for a mean, else 1.
    pub divisor: f64,
}

impl BoundSplit {
    /// The split for `p` ranks whose inputs' global finite range is `[lo, hi]` (`lo > hi`:
    /// none), for values of unit roundoff `unit_roundoff`.
    pub fn new(
        bound: ErrorBound,
        (lo, hi): (f64, f64),
        p: usize,
        unit_roundoff: f64,
        mean: bool,
        full: bool,
    ) -> Self {
        let m = lo.abs().max(hi.abs());
        let max_abs = if m.is_finite() { m } else { 0.0 };
        let divisor = if mean { p as f64 } else { 1.0 };
        let quantisations = if full { p } else { p.saturating_sub(1).max(1) };
        let result = super::reduction_result_bound(bound, lo, hi);
        let step =
            super::reduction_step_bound(result, max_abs, p, unit_roundoff, divisor, quantisations);
        BoundSplit {
            result,
            step,
            divisor,
        }
    }
}

/// What [`reduce`] needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingPlan {
    /// This rank and the number of ranks.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Absolute bound of each partial sum's compression.
    pub step_bound: f64,
    /// Absolute bound of the final segment's compression (allreduce).
    pub final_bound: f64,
    /// Divisor of the result (`p` for the mean, else 1).
    pub divisor: f64,
    /// Allreduce (`true`: every rank gets every segment) or reduce-scatter.
    pub full: bool,
    /// The codec.
    pub codec: CodecKind,
}

impl RingPlan {
    /// The plan of rank `rank` of `size` quantising at `step` (the final segment; the partial
    /// sums at `step * divisor`, as they are divided by `divisor` afterwards: see
    /// [`BoundSplit`]).
    pub fn new(
        (rank, size): (usize, usize),
        step: f64,
        divisor: f64,
        full: bool,
        codec: CodecKind,
    ) -> Self {
        RingPlan {
            rank,
            size,
            step_bound: step * divisor,
            final_bound: step,
            divisor,
            full,
            codec,
        }
    }
}

/// Bytes a ring put on the wire.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RingBytes {
    /// Sent by this rank during the reduce-scatter.
    pub reduce_scatter: usize,
    /// Length of this rank's final compressed segment (allreduce; sent to `p - 1` ranks).
    pub final_stream: usize,
}

impl RingBytes {
    /// Everything this rank sent.
    pub fn total(&self, p: usize) -> usize {
        self.reduce_scatter + self.final_stream * p.saturating_sub(1)
    }
}

/// Run the ring on `place`. The result is in the place's output (allreduce) or its partial sum
/// of segment `rank` (reduce-scatter). Errors of the transport itself end the ring at once;
/// errors of the place's own work travel as empty messages (see the [module docs](self)).
pub(crate) fn reduce<P: RingPlace>(place: &mut P, plan: RingPlan) -> Result<RingBytes> {
    let (p, r) = (plan.size, plan.rank);
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let step = ErrorBound::Abs(plan.step_bound);
    let mut bytes = RingBytes::default();
    let mut failed: Option<Error> = None;
    // this rank's message of `seg`, or the empty one after a failure
    let encode = |place: &mut P, failed: &mut Option<Error>, seg: usize, bound: ErrorBound| {
        if failed.is_none() {
            match place.encode(seg, bound, plan.codec) {
                Ok(m) => return m,
                Err(e) => *failed = Some(e),
            }
        }
        place.failed_msg()
    };
    let final_bound = ErrorBound::Abs(plan.final_bound);
    // the final segment's message, when the last reduce step compressed it
    let mut fin = None;
    if p > 1 {
        let mut msg = encode(place, &mut failed, left, step);
        for s in 0..p - 1 {
            bytes.reduce_scatter += place.wire_len(&msg);
            let got = place.exchange(msg, right, left)?;
            let seg = (r + 2 * p - s - 2) % p;
            // the last step reduces this rank's own segment: the mean divides it, and an
            // allreduce compresses it as its final segment
            let last = s + 2 == p;
            let next = match (last, plan.full) {
                (false, _) => Some((step, false)),
                (true, true) => Some((final_bound, true)),
                (true, false) => None,
            }
            .map(|(bound, is_final)| NextMsg {
                bound,
                codec: plan.codec,
                is_final,
            });
            let divisor = if last { plan.divisor } else { 1.0 };
            let mut sent = None;
            if failed.is_none() {
                if place.wire_len(&got) == 0 {
                    failed = Some(Error::Comm(format!(
                        "ring: rank {left} (or a rank before it) failed"
                    )));
                } else {
                    match place.reduce_step(seg, &got, divisor, next) {
                        Ok(m) => sent = m,
                        Err(e) => failed = Some(e),
                    }
                }
            }
            place.release(got);
            if last {
                fin = sent;
                break;
            }
            msg = sent.unwrap_or_else(|| place.failed_msg());
        }
    } else if plan.divisor != 1.0 {
        if let Err(e) = place.scale(r, plan.divisor) {
            failed = Some(e);
        }
    }
    if !plan.full {
        let ok = place.all_succeeded(failed.is_none())?;
        return match failed {
            Some(e) => Err(e),
            None if !ok => Err(Error::Comm("ring: another rank failed".into())),
            None => Ok(bytes),
        };
    }
    let fin = match fin {
        Some(m) => m,
        None => encode(place, &mut failed, r, final_bound),
    };
    bytes.final_stream = place.wire_len(&fin);
    let all = place.allgather(fin)?;
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(k) = all.iter().position(|m| place.wire_len(m) == 0) {
        return Err(Error::Comm(format!("ring: rank {k} failed")));
    }
    for (k, m) in all.into_iter().enumerate() {
        place.decode_into_output(k, &m)?;
        place.release(m);
    }
    Ok(bytes)
}
