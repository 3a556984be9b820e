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
//! **Bounds.** The end-to-end bound is split over the quantisations of a segment's chain
//! ([`BoundSplit`]); a `noa` bound needs the inputs' global value range for that, and the
//! rounding of the additions their largest magnitude. An allreduce does not wait for a pass over
//! its input: its ranks agree on a *sampled* range ([`crate::quant::sampled_range`], inside the
//! exact one), which bounds every quantisation but the last; by the last reduce step every rank
//! has read all of its input, so the places measure the exact range in the kernels (or loops)
//! that read it, the ranks agree on it ([`RingPlace::global_range`]) and the final segment gets
//! what the exact bound leaves ([`SplitRule::final_after`], [`FinalBound::Deferred`]). If a
//! magnitude the sample missed leaves too little, every rank starts the ring again with the
//! exact split (the input is never written). A reduce-scatter has no final segment to absorb the
//! difference and measures the exact range first.
//!
//! **Pieces.** A plan may cut every segment into [`RingPlan::pieces`] parts ([`cut`], at
//! [`PIECE_ALIGN`] boundaries so that the per-value codecs decode a part as they would the whole
//! segment): each step then compresses, sends and accumulates part by part, and the final
//! parts are gathered as they are compressed, so a place whose exchanges only queue the
//! transfer (the NCCL link) has one part on the wire while it works on the next.
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
///
/// The index a method takes is a *part*: piece `c` of segment `seg` is part
/// `seg * pieces + c` of the plan's [`pieces`](RingPlan::pieces) ([`parts`]); with one piece a
/// part is a segment.
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
    /// Finish what [`accumulate`](RingPlace::accumulate) or
    /// [`decode_into_output`](RingPlace::decode_into_output) of part `seg` from `m` left
    /// queued (a device place queues its kernels without waiting for their result, so that a
    /// piece costs the host one wait, not one per kernel): returns its error, if any. The ring
    /// settles a part before anything but the place's own queued work reads what that call
    /// wrote, and before it releases `m`. Default: nothing is ever queued.
    fn settle(&mut self, seg: usize, m: &Self::Msg) -> Result<()> {
        let _ = (seg, m);
        Ok(())
    }
    /// A received message is no longer needed (its buffer may be reused). Default: drop it.
    fn release(&mut self, m: Self::Msg) {
        drop(m);
    }
    /// The message a rank sends in place of a segment after a failure: empty.
    fn failed_msg(&mut self) -> Self::Msg;
    /// Whether `ok` holds on every rank (collective; the end of a reduce-scatter).
    fn all_succeeded(&mut self, ok: bool) -> Result<bool>;
    /// The exact finite range of every rank's input (collective; `None`: no finite value) and
    /// whether `ok` holds on every rank. Called once, before the final compression of a ring
    /// whose final bound waits for it ([`FinalBound::Deferred`]); by then this rank has read
    /// every segment of its input, so a place can have measured the range inside the kernels
    /// that read them.
    fn global_range(&mut self, ok: bool) -> Result<(Option<(f64, f64)>, bool)>;
    /// Compress this rank's final segment `seg` (its sum after the last reduce step, which
    /// added `m` and divided by `divisor`) for the allgather. Default:
    /// [`encode`](RingPlace::encode); the device ring leaves the segment's reconstruction in
    /// place of the sum (and forms the sum again from `m` where it has to).
    fn encode_final(
        &mut self,
        seg: usize,
        m: &Self::Msg,
        divisor: f64,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Self::Msg> {
        let _ = (m, divisor);
        self.encode(seg, bound, codec)
    }
    /// Forget every partial sum: a restarted ring reads its input again.
    fn reset(&mut self);
}

/// The exact finite range over every rank of `t` (`local`: this rank's, `None` when it has
/// no finite value) and whether `ok` holds on every rank: one small allreduce.
pub(crate) fn agree_range(
    t: &dyn crate::comm::transport::Transport,
    local: Option<(f64, f64)>,
    ok: bool,
) -> Result<(Option<(f64, f64)>, bool)> {
    let (lo, hi) = local.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
    let mut v = [lo, -hi, f64::from(u8::from(ok))];
    t.allreduce_f64(&mut v, crate::comm::transport::ReduceOp::Min)?;
    let (lo, hi) = (v[0], -v[1]);
    Ok(((lo <= hi).then_some((lo, hi)), v[2] > 0.5))
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

/// Everything of a reduction's [`BoundSplit`] but the value range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SplitRule {
    /// The end-to-end bound asked for (abs or noa).
    pub bound: ErrorBound,
    /// Number of ranks.
    pub p: usize,
    /// Unit roundoff of the values.
    pub unit_roundoff: f64,
    /// A mean (divided by `p`).
    pub mean: bool,
    /// An allreduce (`p` quantisations) or a reduce-scatter (`p - 1`).
    pub full: bool,
}

impl SplitRule {
    /// The split for the global finite range `range` (`None`: no finite value).
    pub fn split(&self, range: Option<(f64, f64)>) -> BoundSplit {
        let r = range.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
        BoundSplit::new(
            self.bound,
            r,
            self.p,
            self.unit_roundoff,
            self.mean,
            self.full,
        )
    }

    /// The final segment's bound of an allreduce whose partial sums were quantised at
    /// `step` (times the divisor) from a *sampled* range, now that the exact global range is
    /// known: what the exact result bound leaves after the additions' rounding and the `p - 1`
    /// earlier quantisations of the segment's chain. A sampled range lies inside the exact one
    /// and so gives a step no larger than the exact split's, except through the rounding term
    /// (a magnitude the sample missed); `None` when less than half a step is left (then the
    /// ring starts again with the exact split).
    pub fn final_after(&self, step: f64, range: Option<(f64, f64)>) -> Option<f64> {
        let (lo, hi) = range.unwrap_or((f64::INFINITY, f64::NEG_INFINITY));
        let m = lo.abs().max(hi.abs());
        let max_abs = if m.is_finite() { m } else { 0.0 };
        let divisor = if self.mean { self.p as f64 } else { 1.0 };
        let e = super::reduction_result_bound(self.bound, lo, hi);
        let r = super::reduction_rounding(e, max_abs, self.p, self.unit_roundoff, divisor)?;
        let f = e - r - (self.p as f64 - 1.0) * step;
        (f.is_finite() && f >= 0.5 * step).then_some(f)
    }
}

/// How a ring's final segment gets its bound.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FinalBound {
    /// Known before the ring starts (the exact range was agreed first).
    Known(f64),
    /// Set from the exact global range right before the final compression
    /// ([`SplitRule::final_after`]): the ring's earlier steps were bounded with a sampled range,
    /// so no pass over the input had to run before the first compression.
    Deferred(SplitRule),
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
    /// The bound of each partial sum's quantisation in units of the result (`step_bound /
    /// divisor`).
    pub step: f64,
    /// Bound of the final segment's compression (allreduce).
    pub final_bound: FinalBound,
    /// Divisor of the result (`p` for the mean, else 1).
    pub divisor: f64,
    /// Allreduce (`true`: every rank gets every segment) or reduce-scatter.
    pub full: bool,
    /// The codec.
    pub codec: CodecKind,
    /// Pieces each segment is cut into ([`cut`]); 1: whole segments. With more, a piece's
    /// message is on the wire while the next piece is compressed or the previous one
    /// accumulated (a place whose exchange only queues the transfer overlaps them).
    pub pieces: usize,
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
            step,
            final_bound: FinalBound::Known(step),
            divisor,
            full,
            codec,
            pieces: 1,
        }
    }

    /// The plan cutting each segment into `pieces` (at least 1).
    pub fn with_pieces(mut self, pieces: usize) -> Self {
        self.pieces = pieces.max(1);
        self
    }

    /// [`RingPlan::new`] for the split of `bounds`, the final bound deferred when the split
    /// came from a sampled range. `Err` when the split leaves no room for quantisation.
    pub fn with_bounds(
        (rank, size): (usize, usize),
        bounds: &RingBounds,
        codec: CodecKind,
    ) -> Result<Self> {
        let mut plan = RingPlan::new(
            (rank, size),
            bounds.step()?,
            bounds.split.divisor,
            bounds.rule.full,
            codec,
        );
        if bounds.deferred {
            plan.final_bound = FinalBound::Deferred(bounds.rule);
        }
        Ok(plan)
    }
}

/// A reduction's bounds before its ring: the split from the range its ranks agreed on, and
/// whether that range was sampled (the final bound then waits for the exact range).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingBounds {
    /// The rule the split follows.
    pub rule: SplitRule,
    /// The split (its `result` is the exact one only when the range was exact).
    pub split: BoundSplit,
    /// The range the split is of.
    pub range: Option<(f64, f64)>,
    /// The range was a sample of the inputs ([`crate::quant::sampled_range`]).
    pub deferred: bool,
}

impl RingBounds {
    /// The bounds from the global range the ranks agreed on: sampled (`sampled`, an allreduce)
    /// or exact. A sampled range whose split leaves no room (no finite value sampled, or a
    /// range too narrow) is replaced by the exact one: `exact()` measures this rank's, agreed
    /// over `t` here (collective: every rank has the same agreed range, so all take this branch
    /// together). One rank is always measured exactly (it has no ring to measure it on).
    pub fn agree(
        rule: SplitRule,
        agreed: Option<(f64, f64)>,
        sampled: bool,
        t: &dyn crate::comm::transport::Transport,
        exact: impl FnOnce() -> Result<Option<(f64, f64)>>,
    ) -> Result<RingBounds> {
        let mut b = RingBounds {
            rule,
            split: rule.split(agreed),
            range: agreed,
            deferred: false,
        };
        if !sampled {
            return Ok(b);
        }
        if rule.full && rule.p > 1 && b.split.step.is_some() {
            b.deferred = true;
            return Ok(b);
        }
        let local = exact();
        let (range, ok) = agree_range(t, local.as_ref().ok().copied().flatten(), local.is_ok())?;
        local?;
        if !ok {
            return Err(Error::PeerFailed(
                "another rank could not measure its value range".into(),
            ));
        }
        b.range = range;
        b.split = rule.split(range);
        Ok(b)
    }

    /// The bound of each quantisation; `Err` when the split leaves no room for one.
    pub fn step(&self) -> Result<f64> {
        self.split.step.ok_or_else(|| {
            let (lo, hi) = self.range.unwrap_or((f64::NAN, f64::NAN));
            Error::invalid(format!(
                "the bound {:e} leaves no room for quantisation at these values' magnitude \
                 ({lo:e} .. {hi:e})",
                self.split.result
            ))
        })
    }
}

/// Bytes a ring put on the wire.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RingBytes {
    /// Sent by this rank during the reduce-scatter.
    pub reduce_scatter: usize,
    /// Length of this rank's final compressed segment (allreduce; sent to `p - 1` ranks).
    pub final_stream: usize,
    /// The exact result bound, when the ring learnt the exact range itself
    /// ([`FinalBound::Deferred`]).
    pub result_bound: Option<f64>,
    /// The ring started again with the exact split (a sampled range was far off).
    pub restarted: bool,
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
///
/// With a [deferred](FinalBound::Deferred) final bound, the last reduce step accumulates, the
/// ranks agree on the exact range ([`RingPlace::global_range`]), and the final segment is
/// compressed under what the exact result bound leaves. When a sampled range was so far off
/// that too little is left, every rank (they agreed on the same numbers) starts the ring again
/// from its input with the exact split.
pub(crate) fn reduce<P: RingPlace>(place: &mut P, plan: RingPlan) -> Result<RingBytes> {
    match run(place, plan)? {
        Outcome::Done(bytes) => Ok(bytes),
        Outcome::Restart(range, sent) => {
            let FinalBound::Deferred(rule) = plan.final_bound else {
                unreachable!("only a deferred final bound restarts")
            };
            let split = rule.split(range);
            let step = split.step.ok_or_else(|| {
                Error::invalid(format!(
                    "the bound {:e} leaves no room for quantisation at these values' magnitude",
                    split.result
                ))
            })?;
            place.reset();
            let exact = RingPlan::new(
                (plan.rank, plan.size),
                step,
                plan.divisor,
                plan.full,
                plan.codec,
            )
            .with_pieces(plan.pieces);
            match run(place, exact)? {
                Outcome::Done(mut bytes) => {
                    bytes.reduce_scatter += sent.reduce_scatter;
                    bytes.result_bound = Some(split.result);
                    bytes.restarted = true;
                    Ok(bytes)
                }
                Outcome::Restart(..) => unreachable!("a known final bound never restarts"),
            }
        }
    }
}

/// How one run of the ring ended.
enum Outcome {
    Done(RingBytes),
    /// The deferred final bound left too little: start again with the exact split of this
    /// range (the bytes sent so far).
    Restart(Option<(f64, f64)>, RingBytes),
}

/// Piece alignment in values: pieces start at multiples of it within their segment, so that
/// every codec's chunks and layers fall as they would in the whole segment (the decoded values
/// of the per-value codecs do not depend on the cut).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const PIECE_ALIGN: usize = 1 << 16;

/// Pieces of `pieces` per segment that every segment of `segs` can have without an empty one
/// (at least 1): all ranks compute it from the same segments.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn usable_pieces(segs: &[std::ops::Range<usize>], pieces: usize) -> usize {
    let shortest = segs.iter().map(|s| s.len()).min().unwrap_or(0);
    pieces.min(shortest.div_ceil(PIECE_ALIGN)).max(1)
}

/// Segment `seg` cut into `pieces` contiguous parts starting at multiples of [`PIECE_ALIGN`]
/// values from its start (the last part takes the rest); every part is non-empty when
/// `pieces` is [`usable_pieces`] of the segments.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn cut(seg: std::ops::Range<usize>, pieces: usize) -> Vec<std::ops::Range<usize>> {
    let blocks = seg.len().div_ceil(PIECE_ALIGN);
    let pieces = pieces.max(1);
    (0..pieces)
        .map(|c| {
            let lo = (seg.start + blocks * c / pieces * PIECE_ALIGN).min(seg.end);
            let hi = if c + 1 == pieces {
                seg.end
            } else {
                (seg.start + blocks * (c + 1) / pieces * PIECE_ALIGN).min(seg.end)
            };
            lo..hi
        })
        .collect()
}

/// Every segment of `segs` cut into `pieces` ([`cut`]), in order: part `seg * pieces + c` is
/// piece `c` of segment `seg` (the index a [`RingPlace`] is called with).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn parts(segs: &[std::ops::Range<usize>], pieces: usize) -> Vec<std::ops::Range<usize>> {
    segs.iter().flat_map(|s| cut(s.clone(), pieces)).collect()
}

fn run<P: RingPlace>(place: &mut P, plan: RingPlan) -> Result<Outcome> {
    let (p, r) = (plan.size, plan.rank);
    let pieces = plan.pieces.max(1);
    // the index of piece `c` of segment `seg` in the place's parts
    let part = |seg: usize, c: usize| seg * pieces + c;
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let step = ErrorBound::Abs(plan.step_bound);
    let mut bytes = RingBytes::default();
    let mut failed: Option<Error> = None;
    // this rank's message of part `j`, or the empty one after a failure
    let encode = |place: &mut P, failed: &mut Option<Error>, j: usize, bound: ErrorBound| {
        if failed.is_none() {
            match place.encode(j, bound, plan.codec) {
                Ok(m) => return m,
                Err(e) => *failed = Some(e),
            }
        }
        place.failed_msg()
    };
    // Every piece's final message is gathered as soon as it exists, so that its transfer
    // overlaps the next piece's compression; all ranks make the same calls in the same order.
    let mut gathered: Vec<Vec<P::Msg>> = Vec::with_capacity(pieces);
    fn gather<P: RingPlace>(
        place: &mut P,
        bytes: &mut RingBytes,
        gathered: &mut Vec<Vec<P::Msg>>,
        m: P::Msg,
    ) -> Result<()> {
        bytes.final_stream += place.wire_len(&m);
        gathered.push(place.allgather(m)?);
        Ok(())
    }
    if p > 1 {
        // the messages on the wire, one per piece of the segment the step receives
        let mut inflight = Vec::with_capacity(pieces);
        for c in 0..pieces {
            let msg = encode(place, &mut failed, part(left, c), step);
            bytes.reduce_scatter += place.wire_len(&msg);
            inflight.push(place.exchange(msg, right, left)?);
        }
        for s in 0..p - 1 {
            let seg = (r + 2 * p - s - 2) % p;
            // the last step reduces this rank's own segment: the mean divides it, and an
            // allreduce compresses it as its final segment
            let last = s + 2 == p;
            let divisor = if last { plan.divisor } else { 1.0 };
            let got = std::mem::take(&mut inflight);
            let peer_failed = |failed: &mut Option<Error>, m: &P::Msg, place: &P| {
                if failed.is_none() && place.wire_len(m) == 0 {
                    *failed = Some(Error::PeerFailed(format!(
                        "ring: rank {left} (or a rank before it) failed"
                    )));
                }
            };
            if let (true, true, FinalBound::Deferred(rule)) = (last, plan.full, plan.final_bound) {
                for (c, m) in got.iter().enumerate() {
                    peer_failed(&mut failed, m, place);
                    if failed.is_none() {
                        if let Err(e) = step_in_parts(place, part(seg, c), m, divisor, None) {
                            failed = Some(e);
                        }
                    }
                }
                // the range is complete only once every accumulation has run
                for (c, m) in got.iter().enumerate() {
                    if let Err(e) = place.settle(part(seg, c), m) {
                        failed.get_or_insert(e);
                    }
                }
                let (range, all_ok) = match place.global_range(failed.is_none()) {
                    Ok(v) => v,
                    Err(e) => {
                        got.into_iter().for_each(|m| place.release(m));
                        return Err(e);
                    }
                };
                if !all_ok {
                    // every rank sees it: all send empty final messages and fail together
                    failed.get_or_insert(Error::PeerFailed("ring: another rank failed".into()));
                } else if let Some(f) = rule.final_after(plan.step, range) {
                    bytes.result_bound = Some(rule.split(range).result);
                    let bound = ErrorBound::Abs(f);
                    for (c, m) in got.iter().enumerate() {
                        let fin = if failed.is_none() {
                            match place.encode_final(part(seg, c), m, divisor, bound, plan.codec) {
                                Ok(m) => m,
                                Err(e) => {
                                    failed = Some(e);
                                    place.failed_msg()
                                }
                            }
                        } else {
                            place.failed_msg()
                        };
                        if let Err(e) = gather(place, &mut bytes, &mut gathered, fin) {
                            got.into_iter().for_each(|m| place.release(m));
                            return Err(e);
                        }
                    }
                } else {
                    tracing::debug!(?range, "ring: the sampled range left too little for the final step; restarting with the exact split");
                    got.into_iter().for_each(|m| place.release(m));
                    return Ok(Outcome::Restart(range, bytes));
                }
                got.into_iter().for_each(|m| place.release(m));
                break;
            }
            let next = match (last, plan.full, plan.final_bound) {
                (false, _, _) => Some((step, false)),
                (true, true, FinalBound::Known(b)) => Some((ErrorBound::Abs(b), true)),
                (true, _, _) => None,
            }
            .map(|(bound, is_final)| NextMsg {
                bound,
                codec: plan.codec,
                is_final,
            });
            for (c, m) in got.into_iter().enumerate() {
                peer_failed(&mut failed, &m, place);
                let mut sent = None;
                if failed.is_none() {
                    match place.reduce_step(part(seg, c), &m, divisor, next) {
                        Ok(m) => sent = m,
                        Err(e) => failed = Some(e),
                    }
                }
                place.release(m);
                match (last, plan.full) {
                    (false, _) => {
                        let msg = sent.unwrap_or_else(|| place.failed_msg());
                        bytes.reduce_scatter += place.wire_len(&msg);
                        inflight.push(place.exchange(msg, right, left)?);
                    }
                    (true, true) => {
                        let fin = sent.unwrap_or_else(|| place.failed_msg());
                        gather(place, &mut bytes, &mut gathered, fin)?;
                    }
                    (true, false) => {}
                }
            }
            if last {
                break;
            }
        }
    } else if plan.divisor != 1.0 {
        for c in 0..pieces {
            if failed.is_none() {
                if let Err(e) = place.scale(part(r, c), plan.divisor) {
                    failed = Some(e);
                }
            }
        }
    }
    if !plan.full {
        let ok = place.all_succeeded(failed.is_none())?;
        return match failed {
            Some(e) => Err(e),
            None if !ok => Err(Error::PeerFailed("ring: another rank failed".into())),
            None => Ok(Outcome::Done(bytes)),
        };
    }
    // one rank: the final segment under the known final bound
    for c in gathered.len()..pieces {
        let fin = if failed.is_some() {
            place.failed_msg()
        } else {
            let FinalBound::Known(b) = plan.final_bound else {
                unreachable!("a deferred final bound is set in the last reduce step")
            };
            encode(place, &mut failed, part(r, c), ErrorBound::Abs(b))
        };
        gather(place, &mut bytes, &mut gathered, fin)?;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    for all in &gathered {
        if let Some(k) = all.iter().position(|m| place.wire_len(m) == 0) {
            return Err(Error::PeerFailed(format!("ring: rank {k} failed")));
        }
    }
    // every decode is queued first, then each settled (and only then its message released)
    let mut decoded = Vec::with_capacity(gathered.len() * p);
    let mut first_err = None;
    for (c, all) in gathered.into_iter().enumerate() {
        for (k, m) in all.into_iter().enumerate() {
            if first_err.is_none() {
                first_err = place.decode_into_output(part(k, c), &m).err();
            }
            decoded.push((part(k, c), m));
        }
    }
    for (j, m) in &decoded {
        if let Err(e) = place.settle(*j, m) {
            first_err.get_or_insert(e);
        }
    }
    decoded.into_iter().for_each(|(_, m)| place.release(m));
    match first_err {
        Some(e) => Err(e),
        None => Ok(Outcome::Done(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(bound: ErrorBound, p: usize) -> SplitRule {
        SplitRule {
            bound,
            p,
            unit_roundoff: f32::EPSILON as f64 / 2.0,
            mean: false,
            full: true,
        }
    }

    #[test]
    fn the_final_bound_takes_what_the_exact_range_leaves() {
        let r = rule(ErrorBound::Noa(1e-3), 2);
        // a sample equal to the range: the final step is the exact split's step
        let exact = Some((-1.0, 1.0));
        let s = r.split(exact).step.unwrap();
        let f = r.final_after(s, exact).unwrap();
        assert!((f - s).abs() <= 1e-18, "{f} vs {s}");
        // a sample inside the range: a smaller first step, a larger final one, the sum the same
        let s_sampled = r.split(Some((-0.5, 0.5))).step.unwrap();
        assert!(s_sampled < s);
        let f = r.final_after(s_sampled, exact).unwrap();
        assert!(f > s);
        assert!((f + s_sampled - 2.0 * s).abs() <= 1e-15);
    }

    #[test]
    fn a_magnitude_the_sample_missed_restarts_the_ring() {
        // abs bound: the range only enters through the additions' rounding
        let r = rule(ErrorBound::Abs(1e-2), 2);
        let s_sampled = r.split(Some((-100.0, 100.0))).step.unwrap();
        let exact = Some((-100.0, 15_000.0));
        assert!(r.final_after(s_sampled, exact).is_none());
        // the exact split still has room
        assert!(r.split(exact).step.is_some());
        // no finite value at all: nothing is left for the final step
        assert!(rule(ErrorBound::Noa(1e-3), 2)
            .final_after(1e-3, None)
            .is_none());
    }

    /// A ring place over in-process channels whose "codec" rounds to multiples of twice the
    /// bound (a quantiser without coding), so the schedule itself is what is tested.
    struct ChannelPlace {
        r: usize,
        p: usize,
        input: Vec<f64>,
        out: Vec<f64>,
        parts: Vec<std::ops::Range<usize>>,
        touched: Vec<bool>,
        tx: Vec<std::sync::mpsc::Sender<Vec<f64>>>,
        rx: Vec<std::sync::mpsc::Receiver<Vec<f64>>>,
        /// Fail the compression of this part (a place's own error).
        fail_part: Option<usize>,
    }

    fn quantise(v: &[f64], b: f64) -> Vec<f64> {
        // a leading marker keeps a real message non-empty even for an empty part
        std::iter::once(1.0)
            .chain(v.iter().map(|x| (x / (2.0 * b)).round() * 2.0 * b))
            .collect()
    }

    impl RingPlace for ChannelPlace {
        type Msg = Vec<f64>;
        fn wire_len(&self, m: &Vec<f64>) -> usize {
            m.len() * 8
        }
        fn encode(&mut self, j: usize, bound: ErrorBound, _: CodecKind) -> Result<Vec<f64>> {
            if self.fail_part == Some(j) {
                return Err(Error::invalid("injected"));
            }
            let ErrorBound::Abs(b) = bound else {
                unreachable!()
            };
            let src = if self.touched[j] {
                &self.out
            } else {
                &self.input
            };
            Ok(quantise(&src[self.parts[j].clone()], b))
        }
        fn exchange(&mut self, m: Vec<f64>, to: usize, from: usize) -> Result<Vec<f64>> {
            self.tx[to].send(m).unwrap();
            Ok(self.rx[from].recv().unwrap())
        }
        fn accumulate(&mut self, j: usize, m: &Vec<f64>) -> Result<()> {
            let range = self.parts[j].clone();
            for (k, i) in range.enumerate() {
                let base = if self.touched[j] {
                    self.out[i]
                } else {
                    self.input[i]
                };
                self.out[i] = base + m[k + 1];
            }
            self.touched[j] = true;
            Ok(())
        }
        fn scale(&mut self, j: usize, d: f64) -> Result<()> {
            for i in self.parts[j].clone() {
                self.out[i] /= d;
            }
            Ok(())
        }
        fn allgather(&mut self, m: Vec<f64>) -> Result<Vec<Vec<f64>>> {
            for k in (0..self.p).filter(|&k| k != self.r) {
                self.tx[k].send(m.clone()).unwrap();
            }
            Ok((0..self.p)
                .map(|k| {
                    if k == self.r {
                        m.clone()
                    } else {
                        self.rx[k].recv().unwrap()
                    }
                })
                .collect())
        }
        fn decode_into_output(&mut self, j: usize, m: &Vec<f64>) -> Result<()> {
            let range = self.parts[j].clone();
            self.out[range].copy_from_slice(&m[1..]);
            Ok(())
        }
        fn failed_msg(&mut self) -> Vec<f64> {
            Vec::new()
        }
        fn all_succeeded(&mut self, ok: bool) -> Result<bool> {
            let all = self.allgather(vec![f64::from(u8::from(ok))])?;
            Ok(all.iter().all(|v| v[0] > 0.5))
        }
        fn global_range(&mut self, ok: bool) -> Result<(Option<(f64, f64)>, bool)> {
            let lo = self.input.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = self.input.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let all = self.allgather(vec![lo, hi, f64::from(u8::from(ok))])?;
            let lo = all.iter().map(|v| v[0]).fold(f64::INFINITY, f64::min);
            let hi = all.iter().map(|v| v[1]).fold(f64::NEG_INFINITY, f64::max);
            Ok((Some((lo, hi)), all.iter().all(|v| v[2] > 0.5)))
        }
        fn reset(&mut self) {
            self.touched.iter_mut().for_each(|t| *t = false);
        }
    }

    /// Every rank's result of a ring over `p` channel places, `pieces` per segment.
    fn channel_ring(
        p: usize,
        n: usize,
        pieces: usize,
        full: bool,
        deferred: bool,
        fail: Option<(usize, usize)>,
    ) -> Vec<Result<Vec<f64>>> {
        let (mut txs, mut rxs): (Vec<Vec<_>>, Vec<Vec<_>>) = (0..p)
            .map(|_| (0..p).map(|_| std::sync::mpsc::channel()).unzip())
            .unzip();
        // rank k sends to `to` on txs[to][k]; rank `to` receives from k on rxs[to][k]
        let segs = super::super::partition(n, p);
        let pieces = usable_pieces(&segs, pieces);
        let all_parts = parts(&segs, pieces);
        let mut handles = Vec::new();
        let senders: Vec<Vec<_>> = (0..p)
            .map(|k| (0..p).map(|to| txs[to][k].clone()).collect())
            .collect();
        txs.clear();
        for (r, tx) in senders.into_iter().enumerate() {
            let rx = std::mem::take(&mut rxs[r]);
            let parts = all_parts.clone();
            let segs = segs.clone();
            handles.push(std::thread::spawn(move || {
                let input: Vec<f64> = (0..n)
                    .map(|i| ((i as f64) * 0.001 + r as f64).sin() * 10.0)
                    .collect();
                let mut place = ChannelPlace {
                    r,
                    p,
                    input,
                    out: vec![0.0; n],
                    touched: vec![false; parts.len()],
                    parts,
                    tx,
                    rx,
                    fail_part: fail.filter(|f| f.0 == r).map(|f| f.1),
                };
                let rule = rule(ErrorBound::Abs(1e-2), p);
                let mut plan = RingPlan::new((r, p), 1e-2 / p as f64, 1.0, full, CodecKind::Aatrox)
                    .with_pieces(pieces);
                if deferred {
                    plan.final_bound = FinalBound::Deferred(SplitRule { full, ..rule });
                }
                reduce(&mut place, plan).map(|_| {
                    if full {
                        place.out
                    } else {
                        place.out[segs[r].clone()].to_vec()
                    }
                })
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn pieces_start_aligned_and_cover_the_segment() {
        let seg = 1000..1000 + 5 * PIECE_ALIGN + 17;
        for k in 1..=6 {
            let c = cut(seg.clone(), k);
            assert_eq!(c.len(), k);
            assert_eq!(c[0].start, seg.start);
            assert_eq!(c[k - 1].end, seg.end);
            for w in c.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_eq!((w[1].start - seg.start) % PIECE_ALIGN, 0);
                assert!(!w[0].is_empty());
            }
        }
        // no more pieces than a segment has aligned blocks
        let segs = [
            0..2 * PIECE_ALIGN + 1,
            2 * PIECE_ALIGN + 1..4 * PIECE_ALIGN + 1,
        ];
        assert_eq!(usable_pieces(&segs, 8), 2);
        assert_eq!(usable_pieces(&[0..10, 10..20], 8), 1);
        assert_eq!(usable_pieces(&segs, 0), 1);
    }

    #[test]
    fn a_ring_in_pieces_gives_the_result_of_whole_segments() {
        let n = 3 * 3 * PIECE_ALIGN + 1234;
        for p in [2, 3] {
            for (full, deferred) in [(true, false), (true, true), (false, false)] {
                let whole = channel_ring(p, n, 1, full, deferred, None);
                let cut = channel_ring(p, n, 3, full, deferred, None);
                for (r, (a, b)) in whole.iter().zip(&cut).enumerate() {
                    let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
                    assert_eq!(a, b, "p {p} full {full} deferred {deferred} rank {r}");
                }
                if full {
                    // every rank holds the same result, within the bound of the exact sum
                    let exact: Vec<f64> = (0..n)
                        .map(|i| {
                            (0..p)
                                .map(|r| ((i as f64) * 0.001 + r as f64).sin() * 10.0)
                                .sum()
                        })
                        .collect();
                    let a = cut[0].as_ref().unwrap();
                    assert!(cut.iter().all(|b| b.as_ref().unwrap() == a));
                    let worst = a
                        .iter()
                        .zip(&exact)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    assert!(worst <= 1e-2 + 1e-9, "p {p}: error {worst}");
                }
            }
        }
    }

    #[test]
    fn a_piece_that_fails_fails_every_rank() {
        let n = 3 * 3 * PIECE_ALIGN;
        for p in [2, 3] {
            for full in [true, false] {
                // the second piece of a segment this rank compresses in the first step
                let r = p - 1;
                let first = (r + p - 1) % p;
                let res = channel_ring(p, n, 3, full, false, Some((r, first * 3 + 1)));
                for (k, x) in res.iter().enumerate() {
                    let e = x.as_ref().expect_err("every rank fails");
                    if k == r {
                        assert!(e.to_string().contains("injected"), "rank {k}: {e}");
                    } else {
                        assert!(matches!(e, Error::PeerFailed(_)), "rank {k}: {e:?}");
                    }
                }
            }
        }
    }
}
