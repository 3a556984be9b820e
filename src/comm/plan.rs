//! Per-operation planning shared by the host operations: the local descriptor, agreement,
//! ratio estimates, the model's predictions and the statistics.

use super::*;

impl Communicator {
    pub(super) fn local_desc<E: CommElement>(&self, op: u8, count: usize) -> Desc {
        Desc {
            op,
            dtype: E::TAG,
            policy: self.config.policy.tag(),
            mode: self.config.bound.mode().tag(),
            bound: self.config.bound.value(),
            count: count as u64,
            seq: self.seq,
            flags: u8::from(self.config.verify),
            ..Desc::EMPTY
        }
    }

    /// Allgather the descriptors and check them. `local` is this rank's own argument check: when
    /// it failed, every rank fails (this one with its own error).
    pub(super) fn agree(&mut self, mut d: Desc, local: Result<()>) -> Result<Vec<Desc>> {
        self.seq += 1;
        d.bad = u8::from(local.is_err());
        let raw = self.transport.allgather_fixed(&d.to_bytes())?;
        local?;
        let all = raw
            .chunks_exact(DESC_LEN)
            .map(Desc::parse)
            .collect::<Result<Vec<_>>>()?;
        check_table(&all)?;
        Ok(all)
    }

    /// Ratio estimate of a message: previous same-tag message, else a sample.
    pub(super) fn estimate<S: Real>(
        &mut self,
        data: &[S],
        bound: ErrorBound,
        codec: CodecKind,
        op: u8,
        tag: i64,
    ) -> Result<(f64, Option<Vec<u8>>)> {
        if let Some(r) = self.ratios.get_fresh(op, tag) {
            return Ok((r, None));
        }
        if data.is_empty() {
            return Ok((1.0, None));
        }
        const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
        let k = self.config.sample_chunks.max(1);
        let (r, s) = if data.len() <= k * CHUNK {
            let s = S::compress_with(&*self.compressor, data, bound, codec)?;
            ((data.len() * S::SIZE) as f64 / s.len() as f64, Some(s))
        } else {
            (model::estimate_ratio(data, bound, codec, k)?.0, None)
        };
        // remembered for the next messages with this tag (refreshed after a few uses)
        self.ratios.put(op, tag, r);
        Ok((r, s))
    }

    pub(super) fn p2p_times<S: Real>(&self, n: usize, ratio: f64, codec: CodecKind) -> (f64, f64) {
        let (tc, td) = self.speeds::<S>(codec);
        let p = model::predict(&Scenario::new(
            (n * S::SIZE) as f64,
            ratio,
            self.profile.link,
            tc,
            td,
        ));
        (p.raw_serial, p.compressed_serial)
    }

    /// Encode one point-to-point payload: decides, compresses or passes through raw. With
    /// `lanes` (scalars per element) a large compressed message is left to the chunk pipeline
    /// ([`Payload::Chunked`]); `None` never chunks.
    pub(super) fn encode_p2p<'a, S: Real>(
        &mut self,
        data: &'a [S],
        op: u8,
        tag: i32,
        lanes: Option<usize>,
    ) -> Result<(Payload<'a>, OpStats)> {
        let mut st = OpStats::raw(op);
        st.bytes = (data.len() * S::SIZE) as u64;
        let bound = self.config.bound;
        let (compress, codec, est, stream) = match self.config.policy {
            Policy::Never => (false, None, 1.0, None),
            // a codec that refuses the bound (gpz under rel) sends raw, like a message that
            // does not pay: every rank decides alike, and no peer waits on a failed sender
            Policy::Always(c) => (c.supports_bound(bound), Some(c), 1.0, None),
            Policy::Auto(preferred) => {
                let mut cands = Vec::new();
                let mut streams = Vec::new();
                let mut raw_t = 0.0;
                for c in self.candidates::<S>(preferred) {
                    // even an infinite ratio cannot pay: skip the estimate
                    let (tr, best) = self.p2p_times::<S>(data.len(), f64::INFINITY, c);
                    raw_t = tr;
                    if choice::choose(tr, [cand(c, f64::INFINITY, best)])
                        .codec
                        .is_none()
                    {
                        continue;
                    }
                    let (r, s) = self.estimate(data, bound, c, op, codec_key(tag as i64, c))?;
                    let (_, tcmp) = self.p2p_times::<S>(data.len(), r, c);
                    cands.push(cand(c, r, tcmp));
                    streams.push((c, s));
                }
                let ch = choice::choose(raw_t, cands);
                let est = ch.best.map_or(1.0, |b| b.ratio);
                match ch.codec {
                    Some(c) => {
                        let s = streams.into_iter().find(|(k, _)| *k == c).and_then(|x| x.1);
                        (true, Some(c), est, s)
                    }
                    None => (
                        false,
                        Some(ch.best.map_or(preferred, |b| b.codec)),
                        est,
                        None,
                    ),
                }
            }
        };
        st.ratio_estimate = est;
        let (tr, tcmp) = self.p2p_times::<S>(data.len(), est, codec.unwrap_or_default());
        st.predicted_raw_s = tr;
        st.predicted_compressed_s = tcmp;
        st.predicted_s = tr;
        if !compress || data.is_empty() {
            st.wire_bytes = st.bytes;
            return Ok((Payload::Bytes(scalar_bytes(data)), st));
        }
        let codec = codec.unwrap_or_default();
        if let Some(lanes) = lanes {
            let chunk = pipeline::chunk_scalars(self.config.chunk_bytes, S::SIZE, lanes);
            if st.bytes > self.config.pipeline_min_bytes as u64 && data.len() > chunk {
                st.decision = Decision::Compressed;
                st.codec = Some(codec);
                // the model's pipelined form with this chunk count
                let (sc, sd) = self.speeds::<S>(codec);
                let pr = model::predict(
                    &Scenario::new(st.bytes as f64, est, self.profile.link, sc, sd)
                        .with_chunks(pipeline::chunk_count(data.len(), chunk)),
                );
                st.predicted_compressed_s = pr.compressed_pipelined;
                st.predicted_s = pr.compressed_pipelined;
                st.bound = self.bound_of(data);
                return Ok((Payload::Chunked { chunk, codec }, st));
            }
        }
        let s = match stream {
            Some(s) => s,
            None => S::compress_with(&*self.compressor, data, bound, codec)?,
        };
        st.decision = Decision::Compressed;
        st.codec = Some(codec);
        st.predicted_s = tcmp;
        st.wire_bytes = s.len() as u64;
        st.ratio = st.bytes as f64 / s.len() as f64;
        st.bound = self.bound_of(data);
        self.ratios.put(op, codec_key(tag as i64, codec), st.ratio);
        if self.config.verify {
            let mut back = vec![S::default(); data.len()];
            S::decompress_with(&*self.compressor, &s, &mut back)?;
            st.max_error = Some(max_abs_diff(data, &back));
        }
        Ok((Payload::Bytes(std::borrow::Cow::Owned(s)), st))
    }

    /// Guaranteed abs bound for one compression of `data` (rel: E).
    pub(super) fn bound_of<S: Real>(&self, data: &[S]) -> f64 {
        match self.config.bound {
            ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
            ErrorBound::Noa(e) => {
                let (lo, hi) = crate::quant::finite_range(data).unwrap_or((0.0, 0.0));
                e * (hi - lo)
            }
        }
    }

    pub(super) fn decode_payload<S: Real>(
        &self,
        compressed: bool,
        payload: &[u8],
        out: &mut [S],
    ) -> Result<()> {
        if compressed {
            S::decompress_with(&*self.compressor, payload, out)
        } else {
            scalars_from_bytes(payload, out)
        }
    }

    pub(super) fn finish(&self, mut st: OpStats, t0: f64) -> OpStats {
        st.measured_s = self.wtime() - t0;
        tracing::debug!(target: "zcomm::comm", rank = self.rank(), "{st}");
        st
    }

    pub(super) fn check_tag(tag: i32) -> Result<()> {
        if !(0..MAX_USER_TAG).contains(&tag) {
            return Err(Error::invalid(format!(
                "tag {tag} outside 0..{MAX_USER_TAG}"
            )));
        }
        Ok(())
    }
}

/// Counts the bytes a [`pipeline::ChunkCodec`] receives.
pub(super) struct CountingCodec<'a> {
    pub(super) inner: &'a mut dyn pipeline::ChunkCodec,
    pub(super) bytes: &'a mut usize,
}

impl pipeline::ChunkCodec for CountingCodec<'_> {
    fn encode(&mut self, k: usize) -> Result<Vec<u8>> {
        self.inner.encode(k)
    }
    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()> {
        *self.bytes += bytes.len();
        self.inner.decode(k, bytes)
    }
}

/// Ratio-cache key of one codec's estimate for the message stream `key`.
pub(super) fn codec_key(key: i64, codec: CodecKind) -> i64 {
    key ^ (i64::from(codec.tag()) << 52)
}

/// A model candidate (shorthand).
pub(super) fn cand(codec: CodecKind, ratio: f64, predicted_s: f64) -> choice::Candidate {
    choice::Candidate {
        codec,
        ratio,
        predicted_s,
    }
}

/// Ratio-cache key of a collective: its size and bound (collectives have no tag).
pub(super) fn coll_key(n: usize, bound: ErrorBound) -> i64 {
    let h = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ bound.value().to_bits().rotate_left(17)
        ^ u64::from(bound.mode().tag());
    (h >> 1) as i64 | i64::MIN // negative: never a user tag
}

pub(super) fn harmonic(all: &[Desc]) -> f64 {
    let inv: f64 = all.iter().map(|d| 1.0 / d.ratio.max(1e-9)).sum::<f64>() / all.len() as f64;
    1.0 / inv
}
