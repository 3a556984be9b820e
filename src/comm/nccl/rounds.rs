//! The pipelined rounds the collectives are made of: compress a piece, one ring step, one
//! gather step.

use super::*;

impl NcclComm {
    /// Compress piece `src` into `send_pool` buffer `slot`; returns the stream length.
    pub(super) fn compress_piece<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &mut Pool,
        slot: usize,
        src: &CudaView<'_, T>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<usize> {
        let mut ov = pool.bufs[slot].slice_mut(..);
        gpu.compress_device(src, bound, codec, &mut ov)
    }

    /// One pipelined ring round: compress `buf[send]` piece by piece and send to `to`, receive
    /// the pieces of `buf[recv]` from `from` and decompress-and-add them into `buf[recv]`
    /// (`accumulate`) or decompress them there. Returns the bytes this rank sent and the
    /// critical bytes (per piece the larger of the sent and the received message).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ring_round<T: NcclReal>(
        &mut self,
        buf: &mut CudaSlice<T>,
        send: Range<usize>,
        recv: Range<usize>,
        to: usize,
        from: usize,
        bound: ErrorBound,
        codec: CodecKind,
        accumulate: bool,
    ) -> Result<Wire> {
        let pe = self.piece_elems::<T>();
        let sp = pieces(send.len(), pe);
        let rp = pieces(recv.len(), pe);
        let cap = crate::format::HEADER_LEN + pe * T::SIZE;
        let sh = self.sh.clone();
        let mut spool = std::mem::take(&mut self.send_pool);
        let mut rpool = std::mem::take(&mut self.recv_pool);
        let r = (|| {
            spool.ensure(&sh.work, sp.len(), cap)?;
            rpool.ensure(&sh.work, rp.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable(format!("GPU codec: {}", self.gpu_error)))?;
            let mut wire = Wire::default();
            let mut pending: Option<(usize, usize, cudarc::driver::CudaEvent)> = None;
            // where received piece `j` lands in `buf`
            let at = |j: usize| recv.start + rp[j].start..recv.start + rp[j].end;
            for k in 0..sp.len().max(rp.len()) {
                let slen = if k < sp.len() {
                    let v = buf.slice(send.start + sp[k].start..send.start + sp[k].end);
                    Self::compress_piece(gpu, &mut spool, k, &v, bound, codec)?
                } else {
                    0
                };
                let got = sh
                    .boot
                    .sendrecv(to, &(slen as u64).to_le_bytes(), from, TAG_SIZES)?;
                let rlen = size_msg(&got)?;
                if (k < rp.len()) != (rlen > 0) || rlen > cap {
                    return Err(Error::Comm(format!(
                        "ring piece {k}: peer {from} announced {rlen} bytes (expected a piece: {})",
                        k < rp.len()
                    )));
                }
                {
                    let sb = spool.bufs.get(k).filter(|_| k < sp.len());
                    let (sptr, g1) = match sb {
                        Some(b) => {
                            let (p, g) = b.device_ptr(&sh.net);
                            (p, Some(g))
                        }
                        None => (0, None),
                    };
                    let rb = if k < rp.len() {
                        rpool.bufs.get_mut(k)
                    } else {
                        None
                    };
                    let (rptr, g2) = match rb {
                        Some(b) => {
                            let (p, g) = b.device_ptr_mut(&sh.net);
                            (p, Some(g))
                        }
                        None => (0, None),
                    };
                    sh.group(|| {
                        // SAFETY: the piece buffers hold at least slen / rlen bytes and stay
                        // borrowed until the guards record on the net stream after the group.
                        unsafe {
                            if slen > 0 {
                                sh.send_raw(sptr, slen, nsys::ncclDataType_t::ncclUint8, to)?;
                            }
                            if rlen > 0 {
                                sh.recv_raw(rptr, rlen, nsys::ncclDataType_t::ncclUint8, from)?;
                            }
                        }
                        Ok(())
                    })?;
                    drop((g1, g2));
                }
                wire.sent += slen;
                wire.critical += slen.max(rlen);
                wire.minor += slen.min(rlen);
                let ev = sh.net.record_event(None).map_err(gpu_err)?;
                if let Some((j, len, ev)) = pending.take() {
                    Self::consume(gpu, &rpool, j, len, &ev, buf, at(j), accumulate)?;
                }
                if rlen > 0 {
                    pending = Some((k, rlen, ev));
                }
            }
            if let Some((j, len, ev)) = pending.take() {
                Self::consume(gpu, &rpool, j, len, &ev, buf, at(j), accumulate)?;
            }
            Ok(wire)
        })();
        self.send_pool = spool;
        self.recv_pool = rpool;
        r
    }

    /// Decompress (or decompress-and-add) received piece `slot` into `buf[dst]` once the net
    /// stream has passed `ev`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn consume<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &Pool,
        slot: usize,
        len: usize,
        ev: &cudarc::driver::CudaEvent,
        buf: &mut CudaSlice<T>,
        dst: Range<usize>,
        accumulate: bool,
    ) -> Result<()> {
        gpu.stream().wait(ev).map_err(gpu_err)?;
        let sv = pool.bufs[slot].slice(0..len);
        let mut ov = buf.slice_mut(dst);
        if accumulate {
            gpu.decompress_add_device(&sv, &mut ov)
        } else {
            gpu.decompress_device(&sv, &mut ov)
        }
    }

    /// Pipelined compressed allgather round: rank `j`'s data is `buf[segs[j]]`; this rank's own
    /// segment comes from `src` when given (else from `buf[segs[rank]]`). Every rank ends with
    /// the decompressed values of every segment, its own included. Returns the bytes this rank
    /// sent and the critical bytes (per piece the largest rank's piece, times the peers).
    pub(super) fn gather_round<T: NcclReal>(
        &mut self,
        buf: &mut CudaSlice<T>,
        segs: &[Range<usize>],
        src: Option<&CudaSlice<T>>,
        bound: ErrorBound,
        codec: CodecKind,
    ) -> Result<Wire> {
        let (p, r) = (self.size(), self.rank());
        let pe = self.piece_elems::<T>();
        let pcs: Vec<Vec<Range<usize>>> = segs.iter().map(|s| pieces(s.len(), pe)).collect();
        let kmax = pcs.iter().map(|v| v.len()).max().unwrap_or(0);
        let cap = crate::format::HEADER_LEN + pe * T::SIZE;
        let peers: Vec<usize> = (0..p).filter(|&j| j != r).collect();
        let sh = self.sh.clone();
        let mut spool = std::mem::take(&mut self.send_pool);
        let mut rpool = std::mem::take(&mut self.recv_pool);
        let res = (|| -> Result<Wire> {
            spool.ensure(&sh.work, pcs[r].len(), cap)?;
            rpool.ensure(&sh.work, kmax * peers.len(), cap)?;
            let gpu = self
                .gpu
                .as_mut()
                .ok_or_else(|| Error::Unavailable(format!("GPU codec: {}", self.gpu_error)))?;
            let mut wire = Wire::default();
            // (k, sizes of every rank, event)
            let mut pending: Option<(usize, Vec<usize>, cudarc::driver::CudaEvent)> = None;
            let consume_all = |gpu: &mut crate::gpu::GpuCodec,
                               spool: &Pool,
                               rpool: &Pool,
                               buf: &mut CudaSlice<T>,
                               k: usize,
                               sizes: &[usize],
                               ev: &cudarc::driver::CudaEvent|
             -> Result<()> {
                for (jj, &j) in peers.iter().enumerate() {
                    if k < pcs[j].len() {
                        let d = segs[j].start + pcs[j][k].start..segs[j].start + pcs[j][k].end;
                        Self::consume(
                            gpu,
                            rpool,
                            k * peers.len() + jj,
                            sizes[j],
                            ev,
                            buf,
                            d,
                            false,
                        )?;
                    }
                }
                if k < pcs[r].len() {
                    let d = segs[r].start + pcs[r][k].start..segs[r].start + pcs[r][k].end;
                    let sv = spool.bufs[k].slice(0..sizes[r]);
                    let mut ov = buf.slice_mut(d);
                    gpu.decompress_device(&sv, &mut ov)?;
                }
                Ok(())
            };
            for k in 0..kmax {
                let slen = if k < pcs[r].len() {
                    let rg = pcs[r][k].clone();
                    match src {
                        Some(s) => {
                            let v = s.slice(rg);
                            Self::compress_piece(gpu, &mut spool, k, &v, bound, codec)?
                        }
                        None => {
                            let v = buf.slice(segs[r].start + rg.start..segs[r].start + rg.end);
                            Self::compress_piece(gpu, &mut spool, k, &v, bound, codec)?
                        }
                    }
                } else {
                    0
                };
                let all = sh.boot.allgather_fixed(&(slen as u64).to_le_bytes())?;
                let sizes = all
                    .chunks_exact(8)
                    .map(size_msg)
                    .collect::<Result<Vec<_>>>()?;
                for j in 0..p {
                    if (k < pcs[j].len()) != (sizes[j] > 0) || sizes[j] > cap {
                        return Err(Error::Comm(format!(
                            "allgather piece {k}: rank {j} announced {} bytes",
                            sizes[j]
                        )));
                    }
                }
                {
                    let mut guards = Vec::new();
                    let sptr = if slen > 0 {
                        let (pp, g) = spool.bufs[k].device_ptr(&sh.net);
                        guards.push(g);
                        pp
                    } else {
                        0
                    };
                    let mut rptrs = Vec::with_capacity(peers.len());
                    let base = k * peers.len();
                    for (jj, b) in rpool.bufs[base..base + peers.len()].iter_mut().enumerate() {
                        let j = peers[jj];
                        if sizes[j] > 0 {
                            let (pp, g) = b.device_ptr_mut(&sh.net);
                            guards.push(g);
                            rptrs.push((j, pp));
                        }
                    }
                    sh.group(|| {
                        // SAFETY: piece buffers hold the announced sizes (checked against cap)
                        // and stay borrowed until the guards record after the group.
                        unsafe {
                            if slen > 0 {
                                for &j in &peers {
                                    sh.send_raw(sptr, slen, nsys::ncclDataType_t::ncclUint8, j)?;
                                }
                            }
                            for &(j, pp) in &rptrs {
                                sh.recv_raw(pp, sizes[j], nsys::ncclDataType_t::ncclUint8, j)?;
                            }
                        }
                        Ok(())
                    })?;
                    drop(guards);
                }
                wire.sent += slen * peers.len();
                wire.critical += sizes.iter().copied().max().unwrap_or(0) * peers.len();
                wire.minor += sizes.iter().copied().min().unwrap_or(0) * peers.len();
                let ev = sh.net.record_event(None).map_err(gpu_err)?;
                if let Some((j, sz, e)) = pending.take() {
                    consume_all(gpu, &spool, &rpool, buf, j, &sz, &e)?;
                }
                pending = Some((k, sizes, ev));
            }
            if let Some((j, sz, e)) = pending.take() {
                consume_all(gpu, &spool, &rpool, buf, j, &sz, &e)?;
            }
            Ok(wire)
        })();
        self.send_pool = spool;
        self.recv_pool = rpool;
        res
    }
}

pub(super) fn to_of(r: usize, p: usize) -> usize {
    (r + 1) % p
}
pub(super) fn from_of(r: usize, p: usize) -> usize {
    (r + p - 1) % p
}
