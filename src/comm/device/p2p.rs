//! The staged pairwise exchange of device buffers ([`Communicator::sendrecv_device`]) and its
//! device chunk codec for the chunk pipeline.

use super::*;

impl Communicator {
    /// Staged pairwise exchange of device buffers (see the [module docs](super)): send `send` to
    /// `dest`, receive `recv.len()` values from `src` into `recv`. Raw path: D2H, MPI, H2D.
    /// Compressed path: GPU compress, D2H of the stream, MPI, H2D, GPU decompress. Mismatches
    /// fail on both ends, as for [`Communicator::sendrecv`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        dest: usize,
        recv: &mut CudaViewMut<'_, T>,
        src: usize,
        tag: i32,
    ) -> Result<OpStats> {
        Self::check_tag(tag)?;
        let t0 = self.wtime();
        let n = send.len();
        let bytes = n * T::SIZE;
        let bound = self.config.bound;
        let preferred = self.config.policy.codec().unwrap_or_default();
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let link = self.profile.link;
        // the ratios of this message stream, per codec (`crate::comm::codec_key`)
        let (op_r, key) = (OP_SENDRECV | 0x80, tag as i64);
        let serial =
            |d: &StagedModel<'_>, r: f64| model::predict(&d.scenario(link, bytes as f64, r, 1));
        // this side decides for its own outgoing message (the descriptor tells the peer, the
        // stream's header the codec); `Auto` chooses the codec too
        let (compress, codec, est) = match self.config.policy {
            Policy::Never => (false, preferred, None),
            Policy::Always(c) => (
                true,
                c,
                self.ratios.get(op_r, crate::comm::codec_key(key, c)),
            ),
            Policy::Auto(_) => {
                let raw_s = serial(&dp.staged(preferred), 1.0).raw_serial;
                let ch =
                    self.device_choice(dev, send, &dp, preferred, (op_r, key), raw_s, |d, r| {
                        serial(d, r).compressed_serial
                    });
                let best = ch.best.map_or(preferred, |b| b.codec);
                (ch.codec.is_some(), best, ch.best.map(|b| b.ratio))
            }
        };
        let compress = compress && n > 0;
        // the chosen codec's speeds from here on
        let dp = dp.staged(codec);
        let sc = |ratio: f64, k: usize| dp.scenario(link, bytes as f64, ratio, k);
        let pr = model::predict(&sc(est.unwrap_or(1.0), 1));
        let mut st = OpStats::raw(OP_SENDRECV);
        st.bytes = bytes as u64;
        st.ratio_estimate = est.unwrap_or(1.0);
        st.predicted_raw_s = pr.raw_serial;
        st.predicted_compressed_s = pr.compressed_serial;
        dev.last = StageTimes::default();
        let s = dev.stream();
        let expect = Desc {
            count: recv.len() as u64,
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(OP_SENDRECV, 0)
        };
        let mut d = Desc {
            dtype: elem_tag::<T>(),
            ..self.local_desc::<f32>(OP_SENDRECV, n)
        };
        let len;
        let chunk_dev = crate::comm::pipeline::chunk_scalars(self.config.chunk_bytes, T::SIZE, 1);
        // Pipeline only where the model (per-chunk codec overhead included) predicts it faster
        // than the whole message, with a known ratio (the first call goes whole and learns it).
        // Each side decides for its own outgoing message; the descriptor tells the peer.
        // `Config::device_pipeline` (or `ZCOMM_DEVICE_PIPELINE=always|never`) overrides the
        // model (measurements, tests).
        let chunk_dev = if compress && bytes > self.config.pipeline_min_bytes && n > chunk_dev {
            let k = crate::comm::pipeline::chunk_count(n, chunk_dev);
            let forced = self.config.device_pipeline.or_else(|| {
                match std::env::var("ZCOMM_DEVICE_PIPELINE").as_deref() {
                    Ok("always") => Some(true),
                    Ok("never") => Some(false),
                    _ => None,
                }
            });
            let pays = forced
                .unwrap_or_else(|| est.is_some_and(|r| dp.pipeline_pays(link, bytes as f64, r, k)));
            if pays {
                chunk_dev
            } else {
                0
            }
        } else {
            0
        };
        if chunk_dev > 0 {
            // compressed chunk by chunk inside the pipeline
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.bound = match bound {
                ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                // per chunk E·(chunk range), from the chunk headers (filled in below)
                ErrorBound::Noa(_) => 0.0,
            };
            d.decision = 1;
            len = 0;
            // every chunk's stream fits: no pinned (re)allocation inside the pipeline (a failure
            // here is not fatal: the chunk's encode grows it again and reports through the
            // schedule, so both ranks still match their messages)
            let _ = DeviceStager::grow_pinned(
                &mut dev.pinned_send,
                &s,
                crate::compress_bound(chunk_dev, T::DTYPE),
            );
        } else if compress {
            let t = now();
            len = dev.compress_to_scratch(send, bound, codec)?;
            dev.last.compress = t.elapsed().as_secs_f64();
            dev.last.d2h = dev.scratch_to_pinned_send(len)?;
            st.decision = Decision::Compressed;
            st.codec = Some(codec);
            st.wire_bytes = len as u64;
            st.ratio = bytes as f64 / len.max(1) as f64;
            st.bound = match bound {
                ErrorBound::Abs(e) | ErrorBound::Rel(e) => e,
                ErrorBound::Noa(e) => {
                    let h = crate::inspect(
                        &dev.pinned_send
                            .as_ref()
                            .expect("grown")
                            .as_slice()
                            .map_err(gpu_err("pinned"))?[..len],
                    )?;
                    e * (h.range_max - h.range_min)
                }
            };
            self.ratios
                .put(op_r, crate::comm::codec_key(key, codec), st.ratio);
            d.decision = 1;
        } else {
            DeviceStager::grow_pinned(&mut dev.pinned_send, &s, bytes)?;
            let t = now();
            {
                let (p, _g) = send.device_ptr(&s);
                let pin = dev
                    .pinned_send
                    .as_mut()
                    .expect("grown")
                    .as_mut_slice()
                    .map_err(gpu_err("pinned"))?;
                DeviceStager::d2h(&s, p, &mut pin[..bytes])?;
            }
            dev.last.d2h = t.elapsed().as_secs_f64();
            len = bytes;
            st.wire_bytes = bytes as u64;
        }
        d.payload = len as u64;
        d.ratio = st.ratio;
        // network: the incoming payload (raw or compressed) lands in pinned memory
        let rbytes = recv.len() * T::SIZE;
        let cap = crate::compress_bound(recv.len(), T::DTYPE);
        DeviceStager::grow_pinned(&mut dev.pinned_recv, &s, cap)?;
        // a chunked send announces its chunk length instead of a payload length (the swapped
        // descriptor is what was sent: the chunk schedule and its counts read it)
        if chunk_dev > 0 {
            d.chunk = chunk_dev as u64;
            d.payload = 0;
        }
        let x = Swapped::exchange(self.transport(), d, expect, (dest, src), tag)?;
        if chunk_dev > 0 || x.theirs.chunk > 0 {
            let t = now();
            let r = self.sendrecv_device_chunked(
                dev,
                DevOut {
                    send,
                    chunk: chunk_dev,
                    bound,
                    codec,
                    len,
                },
                x,
                recv,
            );
            dev.last.network = t.elapsed().as_secs_f64();
            let (sent, chunks, noa_bound) = r?;
            if matches!(bound, ErrorBound::Noa(_)) && chunk_dev > 0 {
                st.bound = noa_bound;
            }
            if chunk_dev > 0 {
                st.wire_bytes = sent as u64;
                st.ratio = bytes as f64 / sent.max(1) as f64;
                self.ratios
                    .put(op_r, crate::comm::codec_key(key, codec), st.ratio);
            }
            self.chunks += chunks;
            st.predicted_s = if chunk_dev > 0 {
                // the model's pipelined form with this chunk count
                let k = crate::comm::pipeline::chunk_count(n, chunk_dev);
                let ratio = st.ratio.max(1e-9);
                let pk = model::predict(&sc(ratio, k));
                st.predicted_compressed_s = pk.compressed_pipelined;
                // the stages' serial sums over the k chunks (the pipeline overlaps them)
                let c = dp.sendrecv_terms(link, bytes as f64 / k as f64, ratio).1;
                dev.last_predicted = c.times(k as f64);
                pk.compressed_pipelined
            } else if compress {
                pr.compressed_serial
            } else {
                pr.raw_serial
            };
            return Ok(self.finish(st, t0));
        }
        let t = now();
        let (sd, n) = {
            let pin_s = dev
                .pinned_send
                .as_ref()
                .expect("grown")
                .as_slice()
                .map_err(gpu_err("pinned"))?;
            let pin_r = dev
                .pinned_recv
                .as_mut()
                .expect("grown")
                .as_mut_slice()
                .map_err(gpu_err("pinned"))?;
            self.exchange_into_after(&x, &pin_s[..len], &mut pin_r[..cap])?
        };
        dev.last.network = t.elapsed().as_secs_f64();
        let pin = dev
            .pinned_recv
            .as_ref()
            .expect("grown")
            .as_slice()
            .map_err(gpu_err("pinned"))?;
        if sd.decision == 1 {
            dev_upload(dev, n, recv)?;
        } else {
            if n != rbytes {
                return Err(Error::Comm("raw device payload of unexpected size".into()));
            }
            let t = now();
            let (p, _g) = recv.device_ptr_mut(&s);
            DeviceStager::h2d(&s, &pin[..rbytes], p)?;
            dev.last.h2d = t.elapsed().as_secs_f64();
        }
        let ratio_for_model = if compress {
            st.ratio
        } else {
            est.unwrap_or(1.0)
        };
        let pr = model::predict(&sc(ratio_for_model, 1));
        st.predicted_raw_s = pr.raw_serial;
        st.predicted_compressed_s = pr.compressed_serial;
        // What happened, modelled with both messages' sizes: the peer's may differ from this
        // rank's (another ratio, or not compressed), and the exchange takes both.
        let terms = dp.exchange_terms(
            link,
            bytes as f64,
            len as f64,
            n as f64,
            (compress, sd.decision == 1),
        );
        if compress {
            st.predicted_compressed_s = terms.total();
        }
        st.predicted_s = terms.total();
        dev.last_predicted = terms;
        tracing::debug!(target: "zcomm::comm", stages = ?dev.last, predicted = ?dev.last_predicted, "sendrecv_device");
        Ok(self.finish(st, t0))
    }
}

/// Upload the first `n` bytes of the pinned receive buffer and decompress them into `out`.
pub(super) fn dev_upload<T: GpuElement>(
    dev: &mut DeviceStager,
    n: usize,
    out: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    let pinned = dev.pinned_recv.take().expect("grown");
    let r = pinned
        .as_slice()
        .map_err(gpu_err("pinned"))
        .and_then(|b| dev.upload_and_decompress(&b[..n], out));
    dev.pinned_recv = Some(pinned);
    r
}

impl Communicator {
    /// The sendrecv protocol after the descriptor swap, receiving any payload into `buf[..n]`
    /// (returns the sender's descriptor and `n`). A payload larger than `buf` is drained and
    /// reported as an error.
    pub(super) fn exchange_into_after(
        &self,
        x: &Swapped,
        payload: &[u8],
        buf: &mut [u8],
    ) -> Result<(Desc, usize)> {
        let t = self.transport();
        let n = x.payload_len()?;
        let fits = n <= buf.len();
        if fits {
            t.sendrecv_sized(x.dest, payload, x.src, &mut buf[..n], x.tag)?;
        } else {
            let mut v = vec![0u8; n];
            t.sendrecv_sized(x.dest, payload, x.src, &mut v, x.tag)?;
        }
        x.verdicts(t)?;
        if !fits {
            return Err(Error::Comm(format!(
                "{n}-byte payload exceeds the receive buffer"
            )));
        }
        Ok((x.theirs, n))
    }

    /// The pipelined device exchange (either side chunked): chunk schedule of
    /// `comm::pipeline` with a [`DeviceChunks`] codec, then the verdicts. Returns the bytes sent,
    /// the chunks moved and (noa) the largest per-chunk absolute bound sent.
    pub(super) fn sendrecv_device_chunked<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        out: DevOut<'_, '_, T>,
        x: Swapped,
        recv: &mut CudaViewMut<'_, T>,
    ) -> Result<(usize, u64, f64)> {
        use crate::comm::pipeline::chunk_count;
        let (d, sd) = (x.mine, x.theirs);
        let pair = x.pair();
        let nrecv = if sd.chunk > 0 {
            let chunk =
                usize::try_from(sd.chunk).map_err(|_| Error::Comm("bad chunk length".into()))?;
            let total = usize::try_from(sd.count)
                .map_err(|_| Error::Comm(format!("peer announced {} values", sd.count)))?;
            if pair.is_ok() {
                // the upload scratch fits every incoming chunk: no device (re)allocation (whose
                // free synchronizes the device) inside the pipeline; a failure is reported by the
                // chunk's decode instead (never return before the schedule: the peer is in it)
                let s = dev.stream();
                let _ = DeviceStager::grow_dev(
                    &mut dev.scratch_in,
                    &s,
                    crate::compress_bound(chunk.min(total), T::DTYPE),
                );
            }
            chunk_count(total, chunk)
        } else {
            1
        };
        let nsend = if out.chunk > 0 {
            chunk_count(out.send.len(), out.chunk)
        } else {
            1
        };
        let mut dc = DeviceChunks {
            dev,
            out,
            recv: pair.is_ok().then_some(recv),
            peer: sd,
            noa_bound: 0.0,
        };
        let (sent, r) = x.exchange_chunks(&*self.transport, &mut dc, nsend, nrecv)?;
        let noa_bound = dc.noa_bound;
        x.verdicts(&*self.transport)?;
        r?;
        let moved = if d.chunk > 0 { nsend as u64 } else { 0 }
            + if sd.chunk > 0 { nrecv as u64 } else { 0 };
        Ok((sent, moved, noa_bound))
    }
}

/// What the device side sends: chunked (`chunk > 0`, compressed on the GPU per chunk), or the
/// already staged whole payload (`len` bytes in the stager's pinned send buffer).
pub(super) struct DevOut<'a, 'b, T> {
    pub(super) send: &'a CudaView<'b, T>,
    pub(super) chunk: usize,
    pub(super) bound: ErrorBound,
    pub(super) codec: CodecKind,
    pub(super) len: usize,
}

/// The device [`ChunkCodec`](crate::comm::pipeline::ChunkCodec): a thin composition of the stager's
/// tested pieces (GPU compression into scratch, D2H into pinned memory; H2D + GPU
/// decompression).
pub(super) struct DeviceChunks<'a, 'b, 'c, T> {
    pub(super) dev: &'a mut DeviceStager,
    pub(super) out: DevOut<'a, 'b, T>,
    /// `None`: a mismatch is known, drain and discard.
    pub(super) recv: Option<&'a mut CudaViewMut<'c, T>>,
    pub(super) peer: Desc,
    pub(super) noa_bound: f64,
}

impl<T: GpuElement + Real> crate::comm::pipeline::ChunkCodec for DeviceChunks<'_, '_, '_, T> {
    fn encode(&mut self, k: usize) -> Result<Vec<u8>> {
        let dev = &mut *self.dev;
        if self.out.chunk == 0 {
            // the whole payload, staged before the exchange
            return Ok(dev.pinned_bytes(true, self.out.len)?.to_vec());
        }
        let r = crate::comm::pipeline::chunk_range(self.out.send.len(), self.out.chunk, k);
        let view = self.out.send.slice(r);
        let t = now();
        let len = dev.compress_to_scratch(&view, self.out.bound, self.out.codec)?;
        dev.last.compress += t.elapsed().as_secs_f64();
        dev.last.d2h += dev.scratch_to_pinned_send(len)?;
        let pin = dev.pinned_bytes(true, len)?;
        if let ErrorBound::Noa(e) = self.out.bound {
            let h = crate::inspect(&pin[..len])?;
            self.noa_bound = self.noa_bound.max(e * (h.range_max - h.range_min));
        }
        Ok(pin[..len].to_vec())
    }

    fn decode(&mut self, k: usize, bytes: Vec<u8>) -> Result<()> {
        let Some(recv) = self.recv.as_mut() else {
            return Ok(());
        };
        let dev = &mut *self.dev;
        if self.peer.chunk == 0 {
            if self.peer.decision == 1 {
                return dev.upload_and_decompress(&bytes, recv);
            }
            if bytes.len() != recv.len() * T::SIZE {
                return Err(Error::Comm("raw device payload of unexpected size".into()));
            }
            let s = dev.stream();
            let t = now();
            let (p, _g) = recv.device_ptr_mut(&s);
            DeviceStager::h2d(&s, &bytes, p)?;
            dev.last.h2d += t.elapsed().as_secs_f64();
            return Ok(());
        }
        let chunk = self.peer.chunk as usize;
        let r = crate::comm::pipeline::chunk_range(recv.len(), chunk, k);
        let mut view = recv.slice_mut(r);
        let h2d = dev.last.h2d;
        let dec = dev.last.decompress;
        let res = dev.upload_and_decompress(&bytes, &mut view);
        // upload_and_decompress overwrites the stage times: accumulate over the chunks
        dev.last.h2d += h2d;
        dev.last.decompress += dec;
        res
    }
}
