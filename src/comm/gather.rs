//! Allgather and broadcast of host buffers, blocking and non-blocking.

use super::*;

impl Communicator {
    /// Gather `send` from every rank into `out` (`out.len() == size * send.len()`, rank order).
    /// Every rank ends with identical values.
    pub fn allgather<E: CommElement>(&mut self, send: &[E], out: &mut [E]) -> Result<OpStats> {
        let _watchdog = watchdog::arm("allgather");
        let p = self.size();
        let local = if out.len() != send.len() * p {
            Err(Error::invalid(format!(
                "allgather: output has {} elements, expected {} x {}",
                out.len(),
                p,
                send.len()
            )))
        } else {
            Ok(())
        };
        let req = self.iallgather_impl(send, local)?;
        self.wait_allgather(req, out)
    }

    /// Non-blocking [`allgather`](Self::allgather): agrees and compresses now, starts the
    /// transfer (`MPI_Iallgatherv` of the streams) and returns; finish with
    /// [`wait_allgather`](Self::wait_allgather). Collective.
    pub fn iallgather<E: CommElement>(&mut self, send: &[E]) -> Result<AllgatherRequest<E>> {
        self.iallgather_impl(send, Ok(()))
    }

    pub(super) fn iallgather_impl<E: CommElement>(
        &mut self,
        send: &[E],
        mut local: Result<()>,
    ) -> Result<AllgatherRequest<E>> {
        let t0 = self.wtime();
        let p = self.size();
        let sc = E::scalars(send);
        let bound = self.config.bound;
        let mut d = self.local_desc::<E>(OP_ALLGATHER, send.len());
        let mut stream = None;
        let pays = {
            let (raw_t, best) = self.allgather_times::<E::Scalar>(sc.len(), f64::INFINITY);
            crate::model::choice::compressed_wins(best, raw_t)
        };
        let usable = self.policy_codec_usable();
        if let (Policy::Auto(c), true, true, true) =
            (self.config.policy, local.is_ok(), pays, usable)
        {
            match self.estimate(sc, bound, c, OP_ALLGATHER, coll_key(sc.len(), bound)) {
                Ok((r, s)) => {
                    d.ratio = r;
                    stream = s;
                }
                Err(e) => local = Err(e),
            }
        }
        let all = self.agree(d, local)?;
        let ratio = harmonic(&all);
        let n = sc.len();
        let bytes = (n * <E::Scalar as crate::Element>::SIZE) as f64;
        let codec = self.config.policy.codec().unwrap_or_default();
        let (raw_t, cmp_t) = self.allgather_times::<E::Scalar>(n, ratio);
        // one rank sends nothing: its own values come back exact, as on every transport
        let compress = self.decide(raw_t, cmp_t) && n > 0 && p > 1;
        let mut st = OpStats::decided(OP_ALLGATHER, bytes, ratio, (raw_t, cmp_t), compress);
        let (payload, lens) = if compress {
            let s = match stream {
                Some(s) => s,
                None => E::Scalar::compress_with(&*self.compressor, sc, bound, codec)?,
            };
            st.wire_bytes = s.len() as u64;
            st.ratio = bytes / s.len() as f64;
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.bound = self.bound_of(sc);
            self.ratios
                .put(OP_ALLGATHER, coll_key(sc.len(), bound), st.ratio);
            let lens = self.transport.allgather_lens(s.len())?;
            (s, lens)
        } else {
            st.wire_bytes = bytes as u64;
            (scalar_bytes(sc).into_owned(), vec![bytes as usize; p])
        };
        let pending = self.transport.iallgatherv(payload, &lens)?;
        let verify = (self.config.verify && compress).then(|| sc.to_vec());
        Ok(AllgatherRequest {
            pending,
            compressed: compress,
            n: send.len(),
            st,
            t0,
            verify,
        })
    }

    /// Complete a non-blocking allgather into `out` (`size * count` elements).
    pub fn wait_allgather<E: CommElement>(
        &mut self,
        req: AllgatherRequest<E>,
        out: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("iallgather wait");
        let AllgatherRequest {
            pending,
            compressed,
            n,
            mut st,
            t0,
            verify,
        } = req;
        let parts = pending.wait()?;
        if out.len() != n * self.size() {
            return Err(Error::invalid(format!(
                "allgather: output has {} elements, expected {} x {}",
                out.len(),
                self.size(),
                n
            )));
        }
        let ns = n * E::LANES;
        let outs = E::scalars_mut(out);
        for (k, part) in parts.iter().enumerate() {
            self.decode_payload(compressed, part, &mut outs[k * ns..(k + 1) * ns])?;
        }
        if let Some(orig) = verify {
            let r = self.rank();
            st.max_error = Some(max_abs_diff(&orig, &outs[r * ns..(r + 1) * ns]));
        }
        Ok(self.finish(st, t0))
    }

    /// Broadcast `buf` from `root`; every rank (root included) ends with identical values.
    pub fn bcast<E: CommElement>(&mut self, buf: &mut [E], root: usize) -> Result<OpStats> {
        let _watchdog = watchdog::arm("bcast");
        let req = self.ibcast(buf, root)?;
        self.wait_bcast(req, buf)
    }

    /// Non-blocking [`bcast`](Self::bcast): the root compresses now; every rank agrees and the
    /// transfer (`MPI_Ibcast`) starts. `buf` is the data on the root; elsewhere only its length
    /// matters. Finish with [`wait_bcast`](Self::wait_bcast) (which writes the values, on the
    /// root too). Collective.
    pub fn ibcast<E: CommElement>(&mut self, buf: &[E], root: usize) -> Result<BcastRequest<E>> {
        let t0 = self.wtime();
        let mut local = Ok(());
        if root >= self.size() {
            local = Err(Error::invalid(format!("bcast root {root} out of range")));
        }
        let r = self.rank();
        let mut d = self.local_desc::<E>(OP_BCAST, buf.len());
        d.root = root as u32;
        let mut payload = Vec::new();
        let mut st = OpStats::raw(OP_BCAST);
        if r == root && local.is_ok() {
            match self.encode_p2p(E::scalars(buf), OP_BCAST, 0, None) {
                Ok((Payload::Chunked { .. }, _)) => {
                    local = Err(Error::Comm("bcast payload cannot be chunked".into()))
                }
                Ok((Payload::Bytes(pl), s)) => {
                    payload = pl.into_owned();
                    d.decision = u8::from(s.decision == Decision::Compressed);
                    d.ratio = s.ratio_estimate;
                    d.payload = payload.len() as u64;
                    st = s;
                }
                Err(e) => local = Err(e),
            }
        }
        let all = self.agree(d, local)?;
        let rd = all[root];
        let len = usize::try_from(rd.payload)
            .map_err(|_| Error::Comm(format!("root announced a {}-byte payload", rd.payload)))?;
        let pending = self.transport.ibcast(root, payload, len)?;
        let verify =
            (r == root && self.config.verify && rd.decision == 1).then(|| E::scalars(buf).to_vec());
        if r != root {
            st.decision = if rd.decision == 1 {
                Decision::Compressed
            } else {
                Decision::Raw
            };
            st.ratio_estimate = rd.ratio;
            st.wire_bytes = len as u64;
            st.bytes = (buf.len() * E::LANES * <E::Scalar as crate::Element>::SIZE) as u64;
            st.ratio = if len == 0 {
                1.0
            } else {
                st.bytes as f64 / len as f64
            };
        }
        Ok(BcastRequest {
            pending,
            compressed: rd.decision == 1,
            n: buf.len(),
            root,
            st,
            t0,
            verify,
        })
    }

    /// Complete a non-blocking broadcast into `buf` (same length as given to `ibcast`).
    pub fn wait_bcast<E: CommElement>(
        &mut self,
        req: BcastRequest<E>,
        buf: &mut [E],
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("ibcast wait");
        let BcastRequest {
            pending,
            compressed,
            n,
            root,
            mut st,
            t0,
            verify,
        } = req;
        let mut parts = pending.wait()?;
        if buf.len() != n {
            return Err(Error::invalid(format!(
                "bcast: buffer has {} elements, ibcast was given {n}",
                buf.len()
            )));
        }
        let payload = parts.pop().unwrap_or_default();
        // every rank, the root included, takes the values from the payload (identical everywhere)
        let _ = root;
        self.decode_payload(compressed, &payload, E::scalars_mut(buf))?;
        if let Some(o) = verify {
            st.max_error = Some(max_abs_diff(&o, E::scalars(buf)));
        }
        Ok(self.finish(st, t0))
    }
}
