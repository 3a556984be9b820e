//! Per-operation planning shared by every NCCL operation: agreement, ratio sampling, the
//! model's decision and the statistics.

use super::*;

impl NcclComm {
    pub(super) fn gpu(&mut self) -> Result<&mut crate::gpu::GpuCodec> {
        let why = &self.gpu_error;
        self.gpu
            .as_mut()
            .ok_or_else(|| Error::Unavailable(format!("GPU codec: {why}")))
    }

    pub(super) fn piece_elems<T: NcclReal>(&self) -> usize {
        (self.config.piece_bytes / T::SIZE).max(1)
    }

    /// Exchange and check descriptors (every rank gets the same verdict); returns every rank's
    /// descriptor in rank order.
    pub(super) fn agree(&mut self, d: Desc) -> Result<Vec<Desc>> {
        let d = Desc { seq: self.seq, ..d };
        self.seq += 1;
        let raw = self.sh.boot.allgather_fixed(&d.to_bytes())?;
        let all = raw
            .chunks_exact(DESC_LEN)
            .map(Desc::parse)
            .collect::<Result<Vec<_>>>()?;
        if all.len() != self.size() {
            return Err(Error::Comm(format!(
                "{} NCCL descriptors from {} ranks",
                all.len(),
                self.size()
            )));
        }
        check_table(&all)?;
        Ok(all)
    }

    /// The one control round of a collective, done exactly once per call: the descriptor check
    /// (when [`NcclConfig::check`]) carrying this rank's `Auto` estimate `est` (when given), or,
    /// with checks off, an 8-byte allgather of `est` (nothing at all without an estimate).
    /// Returns every rank's estimate (rank order) when `est` was given. `est` must be `Some` on
    /// all ranks or on none (it is: it depends only on agreed state).
    pub(super) fn exchange(&mut self, mut d: Desc, est: Option<f64>) -> Result<Option<Vec<f64>>> {
        if let Some(e) = est {
            d.ratio = e;
        }
        if self.config.check {
            let all = self.agree(d)?;
            return Ok(est.map(|_| all.iter().map(|x| x.ratio).collect()));
        }
        match est {
            None => Ok(None),
            Some(e) => Ok(Some(f64s(&self.sh.boot.allgather_fixed(&e.to_le_bytes())?))),
        }
    }

    /// Plan a collective (identical outcome on every rank): runs the control round
    /// ([`exchange`](Self::exchange)) and returns `None` for raw NCCL, or `Some(ratio)` when
    /// compression is wanted and possible: under `Auto` the agreed ratio estimate (cached, or
    /// `estimate`d locally now and agreed), under `Always` `1e12`. `want`: the policy allows
    /// compression at all (`Auto`: it could win at an infinite ratio), from agreed inputs only.
    /// `Always` with a rank lacking the codec is [`Error::Unavailable`] on every rank.
    pub(super) fn plan<T: NcclReal>(
        &mut self,
        op: u8,
        n: usize,
        want: bool,
        estimate: impl FnOnce(&mut Self) -> Result<f64>,
    ) -> Result<Option<WireRatio>> {
        let auto = matches!(self.config.policy, Policy::Auto(_));
        let avail = self.codec_on_all_ranks();
        let key = RatioKey {
            op,
            dtype: T::DTYPE.tag(),
            count: n as u64,
        };
        let mut cached = None;
        let mut local = None;
        if want && avail && auto {
            cached = self.ratios.lookup(key);
            if cached.is_none() {
                local = Some(estimate(self).unwrap_or_else(|e| {
                    tracing::warn!(target: "zcomm::nccl", rank = self.rank(), "{} ratio estimate failed, running raw: {e}", op_name(op));
                    -1.0 // tells every rank to run raw
                }));
            }
        }
        let all = self.exchange(self.desc::<T>(op, n), local)?;
        if !want {
            return Ok(None);
        }
        if !avail {
            if auto {
                return Ok(None);
            }
            let ranks: Vec<usize> = (0..self.size()).collect();
            return Err(Error::Unavailable(self.codec_missing_msg(&ranks)));
        }
        if !auto {
            return Ok(Some(WireRatio::from(1e12)));
        }
        if cached.is_some() {
            return Ok(cached);
        }
        match all.as_deref().and_then(Agreed::from_all) {
            Some(a) => {
                self.ratios.put(key, a);
                Ok(Some(a.value()))
            }
            None => Ok(None), // some rank could not estimate: raw everywhere, nothing cached
        }
    }

    /// After a compressed `Auto` collective: all ranks agree on the measured ratios (16-byte
    /// allgather; the slowest rank's, [`Agreed::from_measured`]) and cache them for the next
    /// calls of this shape.
    pub(super) fn agree_measured<T: NcclReal>(
        &mut self,
        op: u8,
        n: usize,
        wr: WireRatio,
    ) -> Result<()> {
        if !matches!(self.config.policy, Policy::Auto(_)) {
            return Ok(());
        }
        let mut mine = [0u8; 16];
        mine[..8].copy_from_slice(&wr.major.to_le_bytes());
        mine[8..].copy_from_slice(&wr.minor.to_le_bytes());
        let all = f64s(&self.sh.boot.allgather_fixed(&mine)?);
        let majors: Vec<f64> = all.iter().copied().step_by(2).collect();
        let minors: Vec<f64> = all.iter().copied().skip(1).step_by(2).collect();
        if let Some(a) = Agreed::from_measured(&majors, &minors) {
            let key = RatioKey {
                op,
                dtype: T::DTYPE.tag(),
                count: n as u64,
            };
            self.ratios.put(key, a);
        }
        Ok(())
    }

    pub(super) fn desc<T: NcclReal>(&self, op: u8, count: usize) -> Desc {
        Desc {
            op,
            dtype: T::DTYPE.tag(),
            policy: self.config.policy.tag(),
            mode: self.config.bound.mode().tag(),
            bound: self.config.bound.value(),
            count: count as u64,
            ..Desc::EMPTY
        }
    }

    /// The bound one compression of `x` gets for the configured bound: `abs:E` as is, `noa:E`
    /// as the absolute bound `E·(max-min)` of the whole buffer (rounded down, so each piece
    /// keeps the whole buffer's guarantee), `rel` as is.
    pub(super) fn piece_bound<T: NcclReal>(&self, x: &CudaView<'_, T>) -> Result<ErrorBound> {
        Ok(match self.config.bound {
            ErrorBound::Noa(e) => match self.utils.range(&self.sh.work, x)? {
                Some((lo, hi)) => {
                    let w = crate::quant::pred(crate::quant::pred(e * (hi - lo)));
                    if w.is_finite() && w > 0.0 {
                        ErrorBound::Abs(w)
                    } else {
                        ErrorBound::Noa(e)
                    }
                }
                None => ErrorBound::Noa(e),
            },
            b => b,
        })
    }

    /// Local ratio estimate from up to 8 codec chunks spread over `x`, compressed on the device
    /// under a bound derived from the sample alone (no pass over the whole buffer):
    /// `reduction = None`: the configured bound (`noa` then uses the sample's own range, at most
    /// the buffer's, so the estimate is conservative); `Some((p, divisor, quantizations))`: the
    /// per-step bound of [`reduction_step_bound`] from the sample's range and magnitude (a
    /// heuristic for the global values); `1.0` when no positive step bound is left.
    pub(super) fn sample_ratio<T: NcclReal>(
        &mut self,
        x: &CudaView<'_, T>,
        codec: CodecKind,
        reduction: Option<(usize, f64, usize)>,
    ) -> Result<f64> {
        const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
        let n = x.len();
        if n == 0 {
            return Ok(1.0);
        }
        let nch = n.div_ceil(CHUNK);
        let k = nch.min(8);
        let work = self.sh.work.clone();
        // SAFETY: the first m elements are written by the copies below, only they are read.
        let mut sample = unsafe { work.alloc::<T>(k * CHUNK) }.map_err(gpu_err)?;
        // SAFETY: u8 scratch; only the stream's bytes are read.
        let mut out =
            unsafe { work.alloc::<u8>(crate::format::HEADER_LEN + k * CHUNK * T::SIZE + 256) }
                .map_err(gpu_err)?;
        let mut m = 0usize;
        for i in 0..k {
            let c = i * nch / k;
            let lo = c * CHUNK;
            let hi = (lo + CHUNK).min(n);
            let src = x.slice(lo..hi);
            let mut dst = sample.slice_mut(m..m + (hi - lo));
            work.memcpy_dtod(&src, &mut dst).map_err(gpu_err)?;
            m += hi - lo;
        }
        let sv = sample.slice(0..m);
        let bound = match reduction {
            None => {
                // allocations and copies complete before the codec stream uses them
                work.synchronize().map_err(gpu_err)?;
                self.config.bound
            }
            Some((p, d, nq)) => {
                // synchronizes `work`
                let Some((lo, hi)) = self.utils.range(&work, &sv)? else {
                    return Ok(1.0);
                };
                let e = match self.config.bound {
                    ErrorBound::Abs(e) => e,
                    ErrorBound::Noa(e) => e * (hi - lo),
                    ErrorBound::Rel(_) => return Ok(1.0),
                };
                let mag = lo.abs().max(hi.abs());
                match reduction_step_bound(e, mag, p, T::UNIT_ROUNDOFF, d, nq) {
                    Some(eb) => ErrorBound::Abs(eb * d),
                    None => return Ok(1.0),
                }
            }
        };
        let mut ov = out.slice_mut(..);
        let len = self.gpu()?.compress_device(&sv, bound, codec, &mut ov)?;
        Ok((m * T::SIZE) as f64 / len.max(1) as f64)
    }

    /// The compress decision of a collective from its agreed `plan` (`None`: raw): `Auto`
    /// compresses when `predict(ratio)` beats the raw prediction in `st` by 5 %, `Always` does;
    /// records the estimate and the compressed prediction (`best_t` for `Always`) in `st`.
    pub(super) fn decide(
        &self,
        plan: Option<WireRatio>,
        st: &mut OpStats,
        best_t: f64,
        predict: impl Fn(WireRatio) -> f64,
    ) -> bool {
        let Some(ratio) = plan else {
            return false;
        };
        st.ratio_estimate = ratio.major.min(1e6);
        if let Policy::Auto(_) = self.config.policy {
            st.predicted_compressed_s = predict(ratio);
            crate::model::choice::compressed_wins(st.predicted_compressed_s, st.predicted_raw_s)
        } else {
            st.predicted_compressed_s = best_t;
            true
        }
    }

    pub(super) fn finish(&self, mut st: OpStats, t0: f64) -> Result<OpStats> {
        if st.decision == Decision::Raw {
            // raw paths only used (and already drained, except allgather) the NCCL stream
            self.sh.net.synchronize().map_err(gpu_err)?;
        } else {
            self.synchronize()?;
        }
        st.measured_s = self.wtime() - t0;
        tracing::debug!(target: "zcomm::nccl", rank = self.rank(), "{st}");
        Ok(st)
    }
}
