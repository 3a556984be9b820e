//! The pipelined round of the compressed allgather: compress a piece, send it to every rank,
//! decode the pieces received. (The reductions run the device ring, `device_link`.)

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

    /// Decompress received piece `slot` into `buf[dst]` once the net stream has passed `ev`.
    pub(super) fn consume<T: NcclReal>(
        gpu: &mut crate::gpu::GpuCodec,
        pool: &Pool,
        (slot, len): (usize, usize),
        ev: &cudarc::driver::CudaEvent,
        buf: &mut CudaSlice<T>,
        dst: Range<usize>,
    ) -> Result<()> {
        gpu.stream().wait(ev).map_err(gpu_err)?;
        let sv = pool.bufs[slot].slice(0..len);
        let mut ov = buf.slice_mut(dst);
        gpu.decompress_device(&sv, &mut ov)
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
                        let slot = (k * peers.len() + jj, sizes[j]);
                        Self::consume(gpu, rpool, slot, ev, buf, d)?;
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
