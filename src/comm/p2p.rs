//! Point-to-point operations on host buffers: send / recv (blocking and not), sendrecv, and the
//! chunk pipeline of large messages.

use super::*;

impl Communicator {
    /// Send `data` to `dest` (matched by [`recv`](Self::recv) / [`recv_vec`](Self::recv_vec)).
    /// Returns after the receiver has checked the message; a mismatch is an error on both ranks.
    pub fn send<E: CommElement>(&mut self, data: &[E], dest: usize, tag: i32) -> Result<OpStats> {
        let req = self.isend(data, dest, tag)?;
        self.wait_send(req)
    }

    /// Non-blocking send: compresses now, posts the descriptor and the payload, and returns;
    /// [`wait_send`](Self::wait_send) completes it and collects the receiver's verdict.
    pub fn isend<E: CommElement>(
        &mut self,
        data: &[E],
        dest: usize,
        tag: i32,
    ) -> Result<SendRequest> {
        Self::check_tag(tag)?;
        if dest >= self.size() {
            return Err(Error::invalid(format!("rank {dest} out of range")));
        }
        let t0 = self.wtime();
        let sc = E::scalars(data);
        let (payload, mut st) = self.encode_p2p(sc, OP_SEND, tag, Some(E::LANES))?;
        let mut d = self.local_desc::<E>(OP_SEND, data.len());
        d.decision = u8::from(st.decision == Decision::Compressed);
        d.ratio = st.ratio_estimate;
        // the first failure of a pipelined send (reported by wait_send after the verdict)
        let mut failed: Result<()> = Ok(());
        let handles = match payload {
            Payload::Bytes(payload) => {
                d.payload = payload.len() as u64;
                let h1 = self
                    .transport
                    .isend(dest, TAG_DESC + tag, d.to_bytes().to_vec())?;
                // a raw payload borrows the caller's data: copied into a recycled buffer
                let owned = match payload {
                    std::borrow::Cow::Borrowed(b) => transport::pool::copy_of(b),
                    std::borrow::Cow::Owned(v) => v,
                };
                let h2 = self.transport.isend(dest, tag, owned)?;
                vec![h1, h2]
            }
            Payload::Chunked { chunk, codec } => {
                // descriptor first, then chunk k is compressed while chunks < k are in flight
                d.chunk = chunk as u64;
                let mut hs =
                    vec![self
                        .transport
                        .isend(dest, TAG_DESC + tag, d.to_bytes().to_vec())?];
                let mut hc = pipeline::HostChunks {
                    compressor: &*self.compressor,
                    out: pipeline::Outgoing::Chunks {
                        data: sc,
                        chunk,
                        bound: self.config.bound,
                        codec,
                    },
                    inc: pipeline::Incoming::Discard,
                    verify: self.config.verify.then_some(0.0),
                };
                let mut wire = 0usize;
                for k in 0..pipeline::chunk_count(sc.len(), chunk) {
                    let b = hc.encode_unless_failed(k, &mut failed);
                    wire += b.len();
                    hs.push(self.transport.isend(dest, tag, b)?);
                }
                st.wire_bytes = wire as u64;
                st.ratio = st.bytes as f64 / wire.max(1) as f64;
                st.max_error = hc.verify;
                self.chunks += pipeline::chunk_count(sc.len(), chunk) as u64;
                if failed.is_ok() {
                    self.ratios.put(OP_SEND, tag as i64, st.ratio);
                }
                hs
            }
        };
        Ok(SendRequest {
            handles,
            desc: d,
            dest,
            tag,
            stats: st,
            t0,
            error: failed.err(),
        })
    }

    /// Complete a non-blocking send.
    pub fn wait_send(&mut self, req: SendRequest) -> Result<OpStats> {
        let _watchdog = watchdog::arm("send");
        for h in req.handles {
            h.wait()?;
        }
        let v = Desc::parse(&self.transport.recv(req.dest, TAG_VERDICT + req.tag)?)?;
        check_pair(&req.desc, &v)?;
        if let Some(e) = req.error {
            return Err(e);
        }
        Ok(self.finish(req.stats, req.t0))
    }

    /// Receive exactly `out.len()` elements from `src`.
    pub fn recv<E: CommElement>(&mut self, out: &mut [E], src: usize, tag: i32) -> Result<OpStats> {
        let _watchdog = watchdog::arm("recv");
        let n = out.len() as u64;
        self.recv_impl::<E>(src, tag, n, move |_| Ok(E::scalars_mut(out)))
    }

    /// Receive a message of any length from `src`.
    pub fn recv_vec<E: CommElement>(&mut self, src: usize, tag: i32) -> Result<(Vec<E>, OpStats)> {
        let _watchdog = watchdog::arm("recv_vec");
        let mut out = Vec::new();
        let slot = &mut out;
        let st = self.recv_impl::<E>(src, tag, ANY_COUNT, move |sd| {
            let n = usize::try_from(sd.count)
                .ok()
                .filter(|&n| {
                    n.checked_mul(E::LANES * <E::Scalar as crate::Element>::SIZE)
                        .is_some()
                })
                .ok_or_else(|| Error::Comm(format!("peer announced {} elements", sd.count)))?;
            *slot = vec![E::default(); n];
            Ok(E::scalars_mut(slot))
        })?;
        Ok((out, st))
    }

    /// Receive a message of at most `out.len()` elements from `src` into the front of `out`
    /// (MPI's receive semantics: the rest of `out` is left as it was; a longer message is an
    /// error). Returns the number of elements received.
    ///
    /// ```no_run
    /// # fn f(comm: &mut zcomm::comm::Communicator) -> zcomm::Result<()> {
    /// let mut buf = vec![0f32; 1 << 20];
    /// let (n, _stats) = comm.recv_upto(&mut buf, 0, 7)?;
    /// let message = &buf[..n];
    /// # Ok(()) }
    /// ```
    pub fn recv_upto<E: CommElement>(
        &mut self,
        out: &mut [E],
        src: usize,
        tag: i32,
    ) -> Result<(usize, OpStats)> {
        let _watchdog = watchdog::arm("recv_upto");
        let mut got = 0usize;
        let slot = &mut got;
        let cap = out.len();
        let st = self.recv_impl::<E>(src, tag, ANY_COUNT, move |sd| {
            let n = usize::try_from(sd.count)
                .ok()
                .filter(|&n| n <= cap)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "message truncated: {} elements sent, room for {cap}",
                        sd.count
                    ))
                })?;
            *slot = n;
            Ok(E::scalars_mut(&mut out[..n]))
        })?;
        Ok((got, st))
    }

    /// Start a receive (see [`RecvRequest`]).
    pub fn irecv(&self, src: usize, tag: i32) -> Result<RecvRequest> {
        Self::check_tag(tag)?;
        if src >= self.size() {
            return Err(Error::invalid(format!("rank {src} out of range")));
        }
        Ok(RecvRequest { src, tag })
    }

    /// The receiving side: descriptor, payload (one message or pipelined chunks, always
    /// drained), verdict. `target` gives the output scalars once the sender's descriptor is
    /// known and matches (it must have `count * lanes` scalars).
    pub(super) fn recv_impl<'a, E: CommElement>(
        &mut self,
        src: usize,
        tag: i32,
        count: u64,
        target: impl FnOnce(&Desc) -> Result<&'a mut [E::Scalar]>,
    ) -> Result<OpStats> {
        Self::check_tag(tag)?;
        if src >= self.size() {
            return Err(Error::invalid(format!("rank {src} out of range")));
        }
        let t0 = self.wtime();
        let sd_raw = self.transport.recv(src, TAG_DESC + tag)?;
        let mine = self.local_desc::<E>(OP_RECV, 0);
        let mine = Desc { count, ..mine };
        let parsed = Desc::parse(&sd_raw);
        let chunked = parsed.as_ref().map_or(0, |d| d.chunk);
        let wire;
        let sd;
        if chunked == 0 {
            // the output is known before the payload arrives: a raw payload of the expected
            // length lands in it directly (no intermediate buffer to allocate, fault in and
            // copy); anything else (compressed, a length mismatch, a failed check) is received
            // whole first, so the sender's payload is always consumed and the verdict sent
            let checked = parsed.and_then(|d| check_pair(&d, &mine).map(|()| d));
            let (checked, out) = match checked {
                Ok(d) => match target(&d) {
                    Ok(o) => (Ok(d), Some(o)),
                    Err(e) => (Err(e), None),
                },
                Err(e) => (Err(e), None),
            };
            let direct = match (&checked, out) {
                (Ok(d), Some(o)) if d.decision == 0 && cfg!(target_endian = "little") => {
                    Ok(element::scalar_bytes_mut(o).expect("little-endian"))
                }
                (_, o) => Err(o),
            };
            let (payload, out) = match direct {
                Ok(bytes) => {
                    let n = bytes.len();
                    match self.transport.recv_into(src, tag, bytes)? {
                        None => (Received::Direct(n), None),
                        Some(v) => (Received::Whole(v), None),
                    }
                }
                Err(o) => (Received::Whole(self.transport.recv(src, tag)?), o),
            };
            self.transport
                .send(src, TAG_VERDICT + tag, &mine.to_bytes())?;
            sd = checked?;
            wire = match (payload, out) {
                (Received::Direct(n), _) => n,
                (Received::Whole(v), Some(out)) => {
                    let r = self.decode_payload(sd.decision == 1, &v, out);
                    let n = v.len();
                    transport::pool::give(v);
                    r?;
                    n
                }
                // a raw payload whose length is not the announced count's
                (Received::Whole(v), None) => {
                    return Err(Error::Mismatch {
                        what: "raw payload bytes",
                        expected: (sd.count as usize)
                            .saturating_mul(E::LANES * <E::Scalar as crate::Element>::SIZE)
                            .to_string(),
                        found: v.len().to_string(),
                    })
                }
            };
        } else {
            sd = parsed?;
            self.transport
                .send(src, TAG_VERDICT + tag, &mine.to_bytes())?;
            let lanes = E::LANES as u64;
            let total = sd
                .count
                .checked_mul(lanes)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| Error::Comm(format!("peer announced {} elements", sd.count)))?;
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let nchunks = pipeline::chunk_count(total, chunk);
            let checked = check_pair(&sd, &mine).and_then(|()| target(&sd));
            let (inc, bad) = match checked {
                Ok(out) if out.len() == total => (pipeline::Incoming::Chunks(out, chunk), None),
                Ok(_) => (
                    pipeline::Incoming::Discard,
                    Some(Error::invalid("receive buffer length")),
                ),
                Err(e) => (pipeline::Incoming::Discard, Some(e)),
            };
            let mut hc = pipeline::HostChunks::<E::Scalar> {
                compressor: &*self.compressor,
                out: pipeline::Outgoing::None,
                inc,
                verify: None,
            };
            let mut got = 0usize;
            let mut counting = CountingCodec {
                inner: &mut hc,
                bytes: &mut got,
            };
            let (_, r) = pipeline::exchange_chunks(
                &*self.transport,
                &mut counting,
                src,
                0,
                src,
                nchunks,
                tag,
            )?;
            self.chunks += nchunks as u64;
            if let Some(e) = bad {
                return Err(e);
            }
            r?;
            wire = got;
        }
        let mut st = OpStats::raw(OP_RECV);
        st.bytes = sd
            .count
            .saturating_mul((E::LANES * <E::Scalar as crate::Element>::SIZE) as u64);
        st.wire_bytes = wire as u64;
        st.ratio = if wire == 0 {
            1.0
        } else {
            st.bytes as f64 / wire as f64
        };
        st.ratio_estimate = sd.ratio;
        if sd.decision == 1 {
            st.decision = Decision::Compressed;
            st.codec = self.config.policy.codec();
        }
        let (tr, tc) = self.p2p_times::<E::Scalar>(
            sd.count as usize * E::LANES,
            sd.ratio,
            self.config.policy.codec().unwrap_or_default(),
        );
        st.predicted_raw_s = tr;
        st.predicted_compressed_s = tc;
        st.predicted_s = if sd.decision == 1 { tc } else { tr };
        Ok(self.finish(st, t0))
    }

    /// Send `send` to `dest` and receive `recv.len()` elements from `src` (the pairwise swap of
    /// state-vector halves when `dest == src`). A mismatch is an error on both ends of each pair.
    pub fn sendrecv<E: CommElement>(
        &mut self,
        send: &[E],
        dest: usize,
        recv: &mut [E],
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let _watchdog = watchdog::arm("sendrecv");
        Self::check_tag(tag)?;
        for r in [dest, src] {
            if r >= self.size() {
                return Err(Error::invalid(format!("rank {r} out of range")));
            }
        }
        let t0 = self.wtime();
        let sc = E::scalars(send);
        let (payload, mut st) = self.encode_p2p(sc, OP_SENDRECV, tag, Some(E::LANES))?;
        let compressed = st.decision == Decision::Compressed;
        let mut d = Desc {
            decision: u8::from(compressed),
            ratio: st.ratio_estimate,
            ..self.local_desc::<E>(OP_SENDRECV, send.len())
        };
        let expect = Desc {
            count: recv.len() as u64,
            ..self.local_desc::<E>(OP_SENDRECV, 0)
        };
        let out = E::scalars_mut(recv);
        match &payload {
            Payload::Bytes(b) => d.payload = b.len() as u64,
            Payload::Chunked { chunk, .. } => d.chunk = *chunk as u64,
        }
        let x = Swapped::exchange(&*self.transport, d, expect, (dest, src), tag)?;
        let (outgoing, nsend) = match payload {
            Payload::Bytes(b) if x.theirs.chunk == 0 => {
                let got = self.exchange_after_desc(&x, &b, element::scalar_bytes_mut(out))?;
                if let Some((sd, bytes)) = got {
                    self.decode_payload(sd.decision == 1, &bytes, out)?;
                }
                return Ok(self.finish(st, t0));
            }
            // the peer pipelines: our payload travels as its single "chunk"
            Payload::Bytes(b) => (pipeline::Outgoing::Whole(b.into_owned()), 1),
            Payload::Chunked { chunk, codec } => {
                st.decision = Decision::Compressed;
                let out_c = pipeline::Outgoing::Chunks {
                    data: sc,
                    chunk,
                    bound: self.config.bound,
                    codec,
                };
                (out_c, pipeline::chunk_count(sc.len(), chunk))
            }
        };
        self.sendrecv_chunked(x, outgoing, nsend, out, E::LANES, (st, t0))
    }

    /// The pipelined sendrecv after the descriptor exchange (one side or both chunked): chunks
    /// both ways (see [`pipeline`]), then the verdicts.
    pub(super) fn sendrecv_chunked<S: Real>(
        &mut self,
        x: Swapped,
        outgoing: pipeline::Outgoing<'_, S>,
        nsend: usize,
        out: &mut [S],
        lanes: usize,
        (mut st, t0): (OpStats, f64),
    ) -> Result<OpStats> {
        let (d, sd) = (x.mine, x.theirs);
        let pair = x.pair();
        let (inc, nrecv) = if sd.chunk > 0 {
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let n = sd
                .count
                .checked_mul(lanes as u64)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| Error::Comm(format!("peer announced {} elements", sd.count)))?;
            let k = pipeline::chunk_count(n, chunk);
            if pair.is_ok() {
                (pipeline::Incoming::Chunks(out, chunk), k)
            } else {
                (pipeline::Incoming::Discard, k)
            }
        } else if pair.is_ok() {
            (pipeline::Incoming::Whole(out, sd.decision == 1), 1)
        } else {
            (pipeline::Incoming::Discard, 1)
        };
        let mut hc = pipeline::HostChunks {
            compressor: &*self.compressor,
            out: outgoing,
            inc,
            verify: (self.config.verify && d.chunk > 0).then_some(0.0),
        };
        let (sent, r) = x.exchange_chunks(&*self.transport, &mut hc, nsend, nrecv)?;
        let verify = hc.verify;
        if d.chunk > 0 {
            self.chunks += nsend as u64;
        }
        if sd.chunk > 0 {
            self.chunks += nrecv as u64;
        }
        x.verdicts(&*self.transport)?;
        r?;
        if d.chunk > 0 {
            st.wire_bytes = sent as u64;
            st.ratio = st.bytes as f64 / sent.max(1) as f64;
            st.max_error = verify;
            self.ratios.put(OP_SENDRECV, x.tag as i64, st.ratio);
        }
        Ok(self.finish(st, t0))
    }

    /// The sendrecv protocol on bytes once the descriptors are swapped: payloads (sized from
    /// the descriptors) and verdicts. A raw incoming payload of exactly `direct.len()` bytes
    /// lands in `direct` (returns `None`); anything else is returned with the sender's
    /// descriptor.
    pub(super) fn exchange_after_desc(
        &self,
        x: &Swapped,
        payload: &[u8],
        direct: Option<&mut [u8]>,
    ) -> Result<Option<(Desc, Vec<u8>)>> {
        let t = &*self.transport;
        let n = x.payload_len()?;
        let fits = x.theirs.decision == 0 && x.pair().is_ok();
        let result = match direct {
            Some(buf) if fits && buf.len() == n => {
                t.sendrecv_sized(x.dest, payload, x.src, buf, x.tag)?;
                None
            }
            _ => {
                let mut v = vec![0u8; n];
                t.sendrecv_sized(x.dest, payload, x.src, &mut v, x.tag)?;
                Some((x.theirs, v))
            }
        };
        x.verdicts(t)?;
        Ok(result)
    }
}

/// One sendrecv once the descriptors are swapped: what the payload exchange and the verdict
/// round after it need, on the host and the device paths alike.
#[derive(Debug, Clone, Copy)]
pub(super) struct Swapped {
    /// This rank's descriptor (of what it sends).
    pub(super) mine: Desc,
    /// The peer's descriptor (of what it sends to this rank).
    pub(super) theirs: Desc,
    /// What this rank expects to receive.
    pub(super) expect: Desc,
    /// The rank this one sends to.
    pub(super) dest: usize,
    /// The rank this one receives from.
    pub(super) src: usize,
    /// The user tag.
    pub(super) tag: i32,
}

impl Swapped {
    /// The descriptor swap of a sendrecv over `t`: `mine` (of what this rank sends) goes to
    /// `dest`, the descriptor of what `src` sends comes back (the descriptor message of user
    /// tag `tag`); `expect` is what this rank expects from `src`.
    pub(super) fn exchange(
        t: &dyn Transport,
        mine: Desc,
        expect: Desc,
        (dest, src): (usize, usize),
        tag: i32,
    ) -> Result<Self> {
        let theirs = t.sendrecv(dest, &mine.to_bytes(), src, TAG_DESC + tag)?;
        Ok(Swapped {
            mine,
            theirs: Desc::parse(&theirs)?,
            expect,
            dest,
            src,
            tag,
        })
    }

    /// Whether the peer's message is the one this rank expects (checked before the payloads
    /// move, so a mismatched one is drained, not decoded; [`verdicts`](Self::verdicts) reports
    /// it to both ends).
    pub(super) fn pair(&self) -> Result<()> {
        check_pair(&self.theirs, &self.expect)
    }

    /// The byte length of the peer's whole payload, as its descriptor announces it.
    pub(super) fn payload_len(&self) -> Result<usize> {
        let p = self.theirs.payload;
        usize::try_from(p).map_err(|_| Error::Comm(format!("peer announced a {p}-byte payload")))
    }

    /// The chunk schedule of [`pipeline::exchange_chunks`] between this pair's peers: `nsend`
    /// chunks out to `dest`, `nrecv` in from `src`.
    pub(super) fn exchange_chunks(
        &self,
        t: &dyn Transport,
        codec: &mut dyn ChunkCodec,
        nsend: usize,
        nrecv: usize,
    ) -> Result<(usize, Result<()>)> {
        pipeline::exchange_chunks(t, codec, self.dest, nsend, self.src, nrecv, self.tag)
    }

    /// The verdict round after the payloads: every rank sends its source the descriptor it
    /// expected and gets its destination's, so a mismatch fails both ends of the pair (this
    /// rank's own check first).
    pub(super) fn verdicts(&self, t: &dyn Transport) -> Result<()> {
        let verdict = t.sendrecv(
            self.src,
            &self.expect.to_bytes(),
            self.dest,
            TAG_VERDICT + self.tag,
        )?;
        self.pair()?;
        check_pair(&self.mine, &Desc::parse(&verdict)?)
    }
}

/// How a point-to-point payload arrived.
enum Received {
    /// Straight into the output (this many bytes).
    Direct(usize),
    /// As a whole message, decoded afterwards.
    Whole(Vec<u8>),
}
