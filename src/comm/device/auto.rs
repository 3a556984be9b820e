//! `Policy::Auto`'s per-message codec choice for the staged device operations: the candidate
//! codecs (the device profile's calibrated ones), their ratio estimates (remembered per message
//! stream and codec, else sampled on the GPU) and the one decision rule
//! ([`Profile::choose_staged`], i.e. [`model::choice::choose`]).

use super::*;
use crate::model::choice::{compressed_wins, Choice};

impl Communicator {
    /// The codecs `Auto(preferred)` chooses among for a device message: `preferred` first (it
    /// wins ties), then every other codec the device profile calibrated (`dp.gpu_codecs`; none in
    /// profiles written before, so `preferred` alone), leaving out codecs without GPU kernels
    /// and those that refuse the configured bound.
    pub(super) fn device_candidates(&self, preferred: CodecKind, dp: &Profile) -> Vec<CodecKind> {
        let mut v = vec![preferred];
        v.extend(
            dp.gpu_codecs
                .iter()
                .map(|c| c.codec)
                .filter(|&c| c != preferred),
        );
        v.retain(|c| c.has_gpu() && c.supports_bound(self.config.bound));
        v
    }

    /// This rank's ratio estimate of `x` under `bound` with `codec`, for the message stream
    /// `(op, key)`: the one remembered for it ([`RatioCache::get_fresh`](model::RatioCache),
    /// refreshed after a few uses), else sampled on the GPU
    /// ([`DeviceStager::sample_ratio`]) and remembered. A failed sample counts as ratio 1 (no
    /// gain), so that the ranks of a collective still take part in its agreement.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn device_ratio<T: GpuElement>(
        &mut self,
        dev: &mut DeviceStager,
        x: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
        op: u8,
        key: i64,
    ) -> f64 {
        let key = crate::comm::codec_key(key, codec);
        if let Some(r) = self.ratios.get_fresh(op, key) {
            return r;
        }
        match dev.sample_ratio(x, bound, codec, self.config.sample_chunks) {
            Ok(r) => {
                self.ratios.put(op, key, r);
                r
            }
            Err(e) => {
                tracing::warn!(target: "zcomm::comm", rank = self.rank(), "{codec} ratio sample failed, assuming no gain: {e}");
                1.0
            }
        }
    }

    /// `Auto`'s choice for a device message decided by one rank (a `sendrecv_device` side for
    /// its outgoing message, the `bcast_device` root): among the candidates that could beat
    /// `raw_s` at an infinite ratio (the others are not sampled), each at this rank's estimate
    /// ([`device_ratio`](Self::device_ratio)) and predicted by `cmp(profile of the codec,
    /// ratio)`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn device_choice<T: GpuElement>(
        &mut self,
        dev: &mut DeviceStager,
        x: &CudaView<'_, T>,
        dp: &Profile,
        preferred: CodecKind,
        (op, key): (u8, i64),
        raw_s: f64,
        cmp: impl Fn(&StagedModel<'_>, f64) -> f64,
    ) -> Choice {
        let mut cands = Vec::new();
        for c in self.device_candidates(preferred, dp) {
            if compressed_wins(cmp(&dp.staged(c), f64::INFINITY), raw_s) {
                let r = self.device_ratio(dev, x, self.config.bound, c, op, key);
                cands.push((c, r));
            }
        }
        dp.choose_staged(raw_s, &cands, |d, _, r| cmp(d, r))
    }

    /// Every rank's ratio estimates (one per candidate, the same candidates on every rank)
    /// made one list all ranks hold: per candidate the harmonic mean over the ranks (the mean
    /// wire size), by one sum of the inverses.
    pub(super) fn agree_ratios(&self, local: &[f64]) -> Result<Vec<f64>> {
        let mut inv: Vec<f64> = local.iter().map(|r| 1.0 / r.max(1e-9)).collect();
        self.transport().allreduce_f64(&mut inv, ReduceOp::Sum)?;
        let pf = self.size() as f64;
        Ok(inv.iter().map(|v| pf / v).collect())
    }

    /// The choice every rank takes: this rank's `mine` (a candidate's index, `None` for raw)
    /// if every rank chose the same, else raw (`None`) everywhere (ranks with differing
    /// profiles may predict differently). One small reduction.
    pub(super) fn agree_choice(&self, mine: Option<usize>) -> Result<Option<usize>> {
        let x = mine.map_or(-1.0, |i| i as f64);
        let mut v = [x, -x];
        self.transport().allreduce_f64(&mut v, ReduceOp::Max)?;
        Ok((v[0] == -v[1] && v[0] >= 0.0).then_some(v[0] as usize))
    }

    /// The codec of a device allgather: the policy's, or under `Auto` (more than one rank and
    /// candidate) the one [`Profile::choose_staged`] predicts fastest at every candidate's
    /// agreed ratio ([`agree_ratios`](Self::agree_ratios) of each rank's
    /// [`device_ratio`](Self::device_ratio)), identical on every rank with the same profile.
    /// `Auto` compresses the allgather whatever the prediction (every rank must take the same
    /// path), so the best candidate is taken even when raw is predicted faster.
    pub(super) fn allgather_codec<T: GpuElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        dp: &Profile,
    ) -> Result<CodecKind> {
        let preferred = self.config.policy.codec().unwrap_or_default();
        let cands = self.device_candidates(preferred, dp);
        let (p, bytes) = (self.size(), (send.len() * T::SIZE) as f64);
        if !matches!(self.config.policy, Policy::Auto(_)) || p < 2 || cands.len() < 2 {
            return Ok(preferred);
        }
        let (op, key) = (
            crate::comm::OP_ALLGATHER | 0x80,
            crate::comm::coll_key(send.len(), self.config.bound),
        );
        let local: Vec<f64> = cands
            .iter()
            .map(|&c| self.device_ratio(dev, send, self.config.bound, c, op, key))
            .collect();
        let ratios = self.agree_ratios(&local)?;
        let link = self.profile.link;
        let terms = |d: &StagedModel<'_>, r: f64| d.allgather_terms(link, p, bytes, r);
        let cands: Vec<(CodecKind, f64)> = cands.into_iter().zip(ratios).collect();
        let ch = dp.choose_staged(
            terms(&dp.staged(preferred), 1.0).0.total(),
            &cands,
            |d, _, r| terms(d, r).1.total(),
        );
        Ok(ch.best.map_or(preferred, |b| b.codec))
    }

    /// `Auto`'s decision for the compressed device ring: `(codec, ring ratio, final ratio)`,
    /// or `None` for the staged host path, identical on every rank. Per candidate that could
    /// beat `raw_s` at an infinite ratio (the same candidates everywhere with the same
    /// profile): this rank's ring ratio ([`device_ratio`](Self::device_ratio) of `seg0` at the
    /// ring's `step` bound, stream `(op_ring, key)`) and final-stream ratio (the one
    /// remembered for `(op_final, key)`, else the ring's), both agreed over the ranks
    /// ([`agree_ratios`](Self::agree_ratios)); then the one rule ([`Profile::choose_staged`],
    /// `cmp(profile, ring ratio, final ratio)`) and [`agree_choice`](Self::agree_choice).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ring_choice<T: GpuElement>(
        &mut self,
        dev: &mut DeviceStager,
        seg0: &CudaView<'_, T>,
        dp: &Profile,
        preferred: CodecKind,
        step: ErrorBound,
        (op_ring, op_final, key): (u8, u8, i64),
        cmp: impl Fn(&StagedModel<'_>, f64, f64) -> f64,
        raw_s: f64,
    ) -> Result<Option<(CodecKind, f64, f64)>> {
        let inf = f64::INFINITY;
        let cands: Vec<CodecKind> = self
            .device_candidates(preferred, dp)
            .into_iter()
            .filter(|&c| compressed_wins(cmp(&dp.staged(c), inf, inf), raw_s))
            .collect();
        if cands.is_empty() {
            return Ok(self.agree_choice(None)?.map(|_| (preferred, 1.0, 1.0)));
        }
        let mut local = Vec::with_capacity(2 * cands.len());
        for &c in &cands {
            local.push(self.device_ratio(dev, seg0, step, c, op_ring, key));
        }
        for (i, &c) in cands.iter().enumerate() {
            let f = self.ratios.get(op_final, crate::comm::codec_key(key, c));
            local.push(f.unwrap_or(local[i]));
        }
        let agreed = self.agree_ratios(&local)?;
        let (ring, fin) = agreed.split_at(cands.len());
        let pairs: Vec<(CodecKind, f64)> =
            cands.iter().copied().zip(ring.iter().copied()).collect();
        let ch = dp.choose_staged(raw_s, &pairs, |d, c, r| {
            let i = cands.iter().position(|&k| k == c).expect("a candidate");
            cmp(d, r, fin[i])
        });
        let mine = ch.codec.and_then(|c| cands.iter().position(|&k| k == c));
        Ok(self
            .agree_choice(mine)?
            .map(|i| (cands[i], ring[i], fin[i])))
    }
}
