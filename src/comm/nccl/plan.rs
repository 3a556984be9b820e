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
    /// (when [`NcclConfig::check`]) carrying this rank's `Auto` estimate when it has one
    /// (`est`, one per candidate codec), or, with checks off or several estimates, an allgather
    /// of `est` (nothing at all without estimates). Returns every rank's estimates (rank order)
    /// when `est` was given. `est` must be `Some` with the same length on all ranks or `None`
    /// on all (it is: it depends only on agreed state).
    pub(super) fn exchange(
        &mut self,
        mut d: Desc,
        est: Option<&[f64]>,
    ) -> Result<Option<Vec<Vec<f64>>>> {
        if let Some(e) = est {
            d.ratio = e.first().copied().unwrap_or(1.0);
        }
        if self.config.check {
            let all = self.agree(d)?;
            match est {
                None => return Ok(None),
                Some(e) if e.len() == 1 => {
                    return Ok(Some(all.iter().map(|x| vec![x.ratio]).collect()))
                }
                Some(_) => {}
            }
        }
        match est {
            None => Ok(None),
            Some(e) => {
                let mine: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
                let all = f64s(&self.sh.boot.allgather_fixed(&mine)?);
                Ok(Some(
                    all.chunks(e.len().max(1)).map(<[f64]>::to_vec).collect(),
                ))
            }
        }
    }

    /// The codecs an operation may compress with, from agreed inputs only (the same list on
    /// every rank): none when compression is not `possible` (no values, one rank) or under
    /// `Never`; the policy's under `Always`; under `Auto(preferred)` `preferred` first (it wins
    /// ties), then every other codec the profile calibrated, each kept only where it accepts
    /// the configured bound and its compressed path at an infinite ratio (`best_s(codec)`)
    /// could beat the raw path's `raw_s`.
    pub(super) fn candidates(
        &self,
        possible: bool,
        raw_s: f64,
        best_s: impl Fn(CodecKind) -> f64,
    ) -> Vec<CodecKind> {
        match self.config.policy {
            _ if !possible => Vec::new(),
            Policy::Never => Vec::new(),
            Policy::Always(c) => vec![c],
            Policy::Auto(preferred) => {
                let mut v = vec![preferred];
                for c in &self.profile.codecs {
                    if !v.contains(&c.codec) {
                        v.push(c.codec);
                    }
                }
                v.retain(|&c| {
                    c.has_gpu()
                        && c.supports_bound(self.config.bound)
                        && crate::model::choice::compressed_wins(best_s(c), raw_s)
                });
                v
            }
        }
    }

    /// Plan a collective (identical outcome on every rank): runs the control round
    /// ([`exchange`](Self::exchange)) and returns the candidate codecs (`cands`, from
    /// [`candidates`](Self::candidates)) with their agreed ratios, empty for raw NCCL: under
    /// `Auto` each candidate's ratio cached for this shape, or, when any is missing, every
    /// candidate `estimate`d locally now and agreed; under `Always` `1e12`. `Always` with a rank
    /// lacking the codec is [`Error::Unavailable`] on every rank.
    pub(super) fn plan<T: NcclReal>(
        &mut self,
        op: u8,
        n: usize,
        cands: &[CodecKind],
        mut estimate: impl FnMut(&mut Self, CodecKind) -> Result<f64>,
    ) -> Result<Vec<(CodecKind, WireRatio)>> {
        let auto = matches!(self.config.policy, Policy::Auto(_));
        let avail = self.codec_on_all_ranks();
        let want = !cands.is_empty();
        let key = |c: CodecKind| RatioKey::of(op, T::DTYPE.tag(), n, c);
        let mut cached = Vec::new();
        let mut local = None;
        if want && avail && auto {
            cached = cands.iter().map(|&c| self.ratios.lookup(key(c))).collect();
            if cached.iter().any(Option::is_none) {
                let mut v = Vec::with_capacity(cands.len());
                for &c in cands {
                    v.push(estimate(self, c).unwrap_or_else(|e| {
                        tracing::warn!(target: "zcomm::nccl", rank = self.rank(), "{} {c} ratio estimate failed, running raw: {e}", op_name(op));
                        -1.0 // tells every rank to run raw
                    }));
                }
                local = Some(v);
            }
        }
        let all = self.exchange(self.desc::<T>(op, n), local.as_deref())?;
        if !want {
            return Ok(Vec::new());
        }
        if !avail {
            if auto {
                return Ok(Vec::new());
            }
            let ranks: Vec<usize> = (0..self.size()).collect();
            return Err(Error::Unavailable(self.codec_missing_msg(&ranks)));
        }
        if !auto {
            return Ok(cands.iter().map(|&c| (c, WireRatio::from(1e12))).collect());
        }
        let Some(all) = all else {
            return Ok(cands
                .iter()
                .copied()
                .zip(cached.into_iter().flatten())
                .collect());
        };
        let agreed: Option<Vec<Agreed>> = (0..cands.len())
            .map(|i| Agreed::from_all(&all.iter().map(|v| v[i]).collect::<Vec<_>>()))
            .collect();
        // some rank could not estimate: raw everywhere, nothing cached
        let Some(agreed) = agreed else {
            return Ok(Vec::new());
        };
        Ok(cands
            .iter()
            .zip(agreed)
            .map(|(&c, a)| {
                self.ratios.put(key(c), a);
                (c, a.value())
            })
            .collect())
    }

    /// After a compressed `Auto` collective with `codec`: all ranks agree on the measured
    /// ratios (16-byte allgather; the slowest rank's, [`Agreed::from_measured`]) and cache them
    /// for the next calls of this shape.
    pub(super) fn agree_measured<T: NcclReal>(
        &mut self,
        op: u8,
        n: usize,
        codec: CodecKind,
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
            self.ratios
                .put(RatioKey::of(op, T::DTYPE.tag(), n, codec), a);
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
        if x.is_empty() {
            return Ok(1.0);
        }
        let work = self.sh.work.clone();
        let sample = crate::comm::device::device_sample(&work, x, 8)?;
        let m = sample.len();
        // SAFETY: u8 scratch; only the stream's bytes are read.
        let mut out =
            unsafe { work.alloc::<u8>(crate::compress_bound(m, T::DTYPE)) }.map_err(gpu_err)?;
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

    /// The compress decision of a collective from its agreed `plan` (empty: raw): the codec
    /// and ratios to compress with, or `None` for raw. `Auto` takes the candidate the one rule
    /// ([`choice::choose`](crate::model::choice::choose)) picks with `predict(codec, ratios)`
    /// against the raw prediction in `st`; `Always` its codec. Records the estimate and the
    /// compressed prediction (under `Always` at the plan's ratio) in `st`.
    pub(super) fn decide(
        &self,
        plan: &[(CodecKind, WireRatio)],
        st: &mut OpStats,
        predict: impl Fn(CodecKind, WireRatio) -> f64,
    ) -> Option<(CodecKind, WireRatio)> {
        let &first = plan.first()?;
        let Policy::Auto(_) = self.config.policy else {
            st.ratio_estimate = first.1.major.min(1e6);
            st.predicted_compressed_s = predict(first.0, first.1);
            return Some(first);
        };
        let ch = crate::model::choice::choose(
            st.predicted_raw_s,
            plan.iter()
                .map(|&(codec, r)| crate::model::choice::Candidate {
                    codec,
                    ratio: r.major,
                    predicted_s: predict(codec, r),
                }),
        );
        let best = ch.best?;
        st.ratio_estimate = best.ratio.min(1e6);
        st.predicted_compressed_s = best.predicted_s;
        ch.codec
            .and_then(|c| plan.iter().copied().find(|x| x.0 == c))
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
