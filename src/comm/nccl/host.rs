//! [`Transport`] over NCCL for host byte messages, so the host-buffer
//! [`Communicator`](crate::comm::Communicator) runs unchanged over NCCL: every message is staged
//! into device memory and moved with ncclSend/ncclRecv (a 16-byte header `{len, tag}` first, so
//! receivers learn lengths and mismatched tags become errors), collectives map to ncclAllGather,
//! ncclBroadcast and ncclAllReduce. NCCL delivers the messages between two ranks in the order
//! they were posted; `iprobe` is not available (NCCL has no probe).

use std::rc::Rc;

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nres, sys as nsys};

use super::{gpu_err, nccl_err, Shared};
use crate::comm::transport::{ReduceOp, SendHandle, Transport};
use crate::error::{Error, Result};

const U8: nsys::ncclDataType_t = nsys::ncclDataType_t::ncclUint8;

/// Host byte messages over an [`NcclComm`](super::NcclComm)'s NCCL communicator (see the
/// [module docs](super)). Obtained from [`NcclComm::host_transport`](super::NcclComm::host_transport).
pub struct NcclTransport {
    sh: Rc<Shared>,
}

impl std::fmt::Debug for NcclTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclTransport(rank {} of {})",
            self.sh.rank, self.sh.size
        )
    }
}

struct NcclSend {
    _bufs: Vec<CudaSlice<u8>>,
    done: Option<CudaEvent>,
}

impl SendHandle for NcclSend {
    fn wait(self: Box<Self>) -> Result<()> {
        if let Some(e) = &self.done {
            e.synchronize().map_err(gpu_err)?;
        }
        Ok(())
    }
    fn test(&mut self) -> Result<bool> {
        Ok(self.done.as_ref().map(|e| e.is_complete()).unwrap_or(true))
    }
}

impl Drop for NcclSend {
    fn drop(&mut self) {
        if let Some(e) = &self.done {
            let _ = e.synchronize();
        }
    }
}

fn header(len: usize, tag: i32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&(len as u64).to_le_bytes());
    h[8..].copy_from_slice(&(tag as i64).to_le_bytes());
    h
}

impl NcclTransport {
    pub(crate) fn new(sh: Rc<Shared>) -> Self {
        NcclTransport { sh }
    }

    fn check_rank(&self, r: usize) -> Result<()> {
        crate::comm::transport::check_rank(r, self.sh.size)
    }

    /// A device copy of `bytes` (at least one byte long), ordered on the net stream.
    fn stage(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        let net = &self.sh.net;
        if bytes.is_empty() {
            return net.alloc_zeros::<u8>(1).map_err(gpu_err);
        }
        net.clone_htod(bytes).map_err(gpu_err)
    }

    fn alloc(&self, n: usize) -> Result<CudaSlice<u8>> {
        self.sh.net.alloc_zeros::<u8>(n.max(1)).map_err(gpu_err)
    }

    fn post_send(&self, buf: &CudaSlice<u8>, len: usize, dest: usize) -> Result<()> {
        let (p, _g) = buf.device_ptr(&self.sh.net);
        // SAFETY: buf holds at least len bytes; the caller keeps it alive until the net stream
        // has passed the send.
        unsafe { self.sh.send_raw(p, len, U8, dest) }
    }

    fn post_recv(&self, buf: &mut CudaSlice<u8>, len: usize, src: usize) -> Result<()> {
        let (p, _g) = buf.device_ptr_mut(&self.sh.net);
        // SAFETY: as post_send.
        unsafe { self.sh.recv_raw(p, len, U8, src) }
    }

    fn fetch(&self, buf: &CudaSlice<u8>, len: usize) -> Result<Vec<u8>> {
        if len == 0 {
            self.sh.net.synchronize().map_err(gpu_err)?;
            return Ok(Vec::new());
        }
        let v = buf.slice(0..len);
        self.sh.net.clone_dtoh(&v).map_err(gpu_err)
    }

    fn parse_header(h: &[u8], tag: i32, src: usize) -> Result<usize> {
        let len = u64::from_le_bytes(h[..8].try_into().expect("16-byte header"));
        let t = i64::from_le_bytes(h[8..16].try_into().expect("16-byte header"));
        if t != tag as i64 {
            return Err(Error::Comm(format!(
                "NCCL message from rank {src} has tag {t}, expected {tag} (out-of-order send/recv)"
            )));
        }
        usize::try_from(len).map_err(|_| Error::Comm("message length out of range".into()))
    }

    fn allreduce_raw(
        &self,
        ptr_in: u64,
        ptr_out: u64,
        n: usize,
        dt: nsys::ncclDataType_t,
        op: nsys::ncclRedOp_t,
    ) -> Result<()> {
        // SAFETY: callers pass device buffers of n elements of dt that outlive the sync below.
        unsafe {
            nres::all_reduce(
                ptr_in as *const _,
                ptr_out as *mut _,
                n,
                dt,
                op,
                self.sh.comm,
                self.sh.net_stream(),
            )
        }
        .map_err(|e| nccl_err("ncclAllReduce", e))?;
        self.sh.net.synchronize().map_err(gpu_err)
    }

    fn allreduce_host<T: cudarc::driver::DeviceRepr + cudarc::nccl::NcclType + Copy>(
        &self,
        input: &[T],
        out: &mut [T],
        op: nsys::ncclRedOp_t,
    ) -> Result<()> {
        if input.len() != out.len() {
            return Err(Error::invalid("allreduce: input and output lengths differ"));
        }
        if input.is_empty() {
            return Ok(());
        }
        let net = &self.sh.net;
        let din = net.clone_htod(input).map_err(gpu_err)?;
        // SAFETY: fully written by the allreduce.
        let mut dout = unsafe { net.alloc::<T>(input.len()) }.map_err(gpu_err)?;
        {
            let (a, _g1) = din.device_ptr(net);
            let (b, _g2) = dout.device_ptr_mut(net);
            self.allreduce_raw(a, b, input.len(), T::as_nccl_type(), op)?;
        }
        net.memcpy_dtoh(&dout, out).map_err(gpu_err)
    }
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.sh.rank
    }
    fn size(&self) -> usize {
        self.sh.size
    }
    fn send(&self, dest: usize, tag: i32, bytes: &[u8]) -> Result<()> {
        self.isend(dest, tag, bytes.to_vec())?.wait()
    }
    fn recv(&self, src: usize, tag: i32) -> Result<Vec<u8>> {
        self.check_rank(src)?;
        let mut h = self.alloc(16)?;
        self.post_recv(&mut h, 16, src)?;
        let hb = self.fetch(&h, 16)?;
        let len = Self::parse_header(&hb, tag, src)?;
        let mut b = self.alloc(len)?;
        if len > 0 {
            self.post_recv(&mut b, len, src)?;
        }
        self.fetch(&b, len)
    }
    fn sendrecv(&self, dest: usize, bytes: &[u8], src: usize, tag: i32) -> Result<Vec<u8>> {
        self.check_rank(dest)?;
        self.check_rank(src)?;
        let hs = self.stage(&header(bytes.len(), tag))?;
        let mut hr = self.alloc(16)?;
        self.sh.group(|| {
            self.post_send(&hs, 16, dest)?;
            self.post_recv(&mut hr, 16, src)
        })?;
        let hb = self.fetch(&hr, 16)?;
        let len = Self::parse_header(&hb, tag, src)?;
        let ps = self.stage(bytes)?;
        let mut pr = self.alloc(len)?;
        self.sh.group(|| {
            if !bytes.is_empty() {
                self.post_send(&ps, bytes.len(), dest)?;
            }
            if len > 0 {
                self.post_recv(&mut pr, len, src)?;
            }
            Ok(())
        })?;
        self.fetch(&pr, len)
    }
    fn isend(&self, dest: usize, tag: i32, bytes: Vec<u8>) -> Result<Box<dyn SendHandle>> {
        self.check_rank(dest)?;
        let h = self.stage(&header(bytes.len(), tag))?;
        let p = self.stage(&bytes)?;
        self.post_send(&h, 16, dest)?;
        if !bytes.is_empty() {
            self.post_send(&p, bytes.len(), dest)?;
        }
        let done = self.sh.net.record_event(None).map_err(gpu_err)?;
        Ok(Box::new(NcclSend {
            _bufs: vec![h, p],
            done: Some(done),
        }))
    }
    fn iprobe(&self, _src: usize, _tag: i32) -> Result<bool> {
        Err(Error::Unavailable(
            "iprobe: NCCL has no message probe".into(),
        ))
    }
    fn allgather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let p = self.sh.size;
        if mine.is_empty() {
            return Ok(Vec::new());
        }
        let din = self.stage(mine)?;
        let mut dout = self.alloc(mine.len() * p)?;
        {
            let dv = din.slice(0..mine.len());
            let mut ov = dout.slice_mut(0..mine.len() * p);
            self.sh.allgather(&dv, &mut ov)?;
        }
        self.fetch(&dout, mine.len() * p)
    }
    fn allgatherv(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lens = self.allgather_lens(mine.len())?;
        let max = lens.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return Ok(vec![Vec::new(); self.sh.size]);
        }
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let all = self.allgather_fixed(&padded)?;
        Ok(lens
            .iter()
            .enumerate()
            .map(|(j, &l)| all[j * max..j * max + l].to_vec())
            .collect())
    }
    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.check_rank(root)?;
        let net = &self.sh.net;
        let bc = |buf: &mut CudaSlice<u8>, n: usize| -> Result<()> {
            let (p, _g) = buf.device_ptr_mut(net);
            // SAFETY: buf holds at least n bytes and is synchronized below.
            unsafe {
                nres::broadcast(
                    p as *const _,
                    p as *mut _,
                    n,
                    U8,
                    root as i32,
                    self.sh.comm,
                    self.sh.net_stream(),
                )
            }
            .map_err(|e| nccl_err("ncclBroadcast", e))?;
            Ok(())
        };
        let mut lb = self.stage(&(bytes.len() as u64).to_le_bytes())?;
        bc(&mut lb, 8)?;
        let l = self.fetch(&lb, 8)?;
        let len = u64::from_le_bytes(l[..8].try_into().expect("8 bytes")) as usize;
        if len == 0 {
            bytes.clear();
            return Ok(());
        }
        let mut b = if self.sh.rank == root {
            self.stage(bytes)?
        } else {
            self.alloc(len)?
        };
        bc(&mut b, len)?;
        *bytes = self.fetch(&b, len)?;
        Ok(())
    }
    fn allreduce_f64(&self, vals: &mut [f64], op: ReduceOp) -> Result<()> {
        let o = match op {
            ReduceOp::Sum => nsys::ncclRedOp_t::ncclSum,
            ReduceOp::Min => nsys::ncclRedOp_t::ncclMin,
            ReduceOp::Max => nsys::ncclRedOp_t::ncclMax,
        };
        let inp = vals.to_vec();
        self.allreduce_host(&inp, vals, o)
    }
    fn allreduce_sum_f32(&self, input: &[f32], out: &mut [f32]) -> Result<()> {
        self.allreduce_host(input, out, nsys::ncclRedOp_t::ncclSum)
    }
    fn allreduce_sum_f64(&self, input: &[f64], out: &mut [f64]) -> Result<()> {
        self.allreduce_host(input, out, nsys::ncclRedOp_t::ncclSum)
    }
    fn barrier(&self) -> Result<()> {
        self.sh.net.synchronize().map_err(gpu_err)?;
        self.sh.boot.barrier()
    }
    fn wtime(&self) -> f64 {
        self.sh.boot.wtime()
    }
}
