//! State shared by the operations of one communicator: the NCCL handle and streams
//! ([`Shared`]), the wire-size tally and the reused device buffers.

use super::*;

/// Compressed bytes of one operation: what this rank sent, and per exchange round the larger
/// (`critical`) and the smaller (`minor`) of the messages in its two directions (what it sends
/// and what it receives; allgather rounds: the largest and the smallest piece of any rank),
/// summed, in the same units as `sent` (times the peers). Equal when every rank compresses
/// alike; apart when one rank's data compress worse (its pieces keep one direction busy after
/// the other has finished).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Wire {
    pub(super) sent: usize,
    pub(super) critical: usize,
    pub(super) minor: usize,
}

impl std::ops::AddAssign for Wire {
    fn add_assign(&mut self, o: Wire) {
        self.sent += o.sent;
        self.critical += o.critical;
        self.minor += o.minor;
    }
}

impl Wire {
    /// The ratios of the two directions for `moved` uncompressed bytes.
    pub(super) fn ratios(&self, moved: f64) -> WireRatio {
        WireRatio {
            major: moved / self.critical.max(1) as f64,
            minor: moved / self.minor.max(1) as f64,
        }
    }
}

/// Split `n` elements into pipeline pieces of about `piece_elems`, on codec-chunk boundaries.
pub fn pieces(n: usize, piece_elems: usize) -> Vec<Range<usize>> {
    const CHUNK: usize = 1 << crate::codec::blocked::CHUNK_LOG2;
    let pe = piece_elems.max(CHUNK).div_ceil(CHUNK) * CHUNK;
    let k = n.div_ceil(pe).max(1);
    (0..k)
        .map(|i| (i * pe).min(n)..((i + 1) * pe).min(n))
        .collect()
}

pub(crate) struct Shared {
    pub(crate) boot: Box<dyn Transport>,
    pub(crate) ctx: Arc<CudaContext>,
    /// NCCL's stream.
    pub(crate) net: Arc<CudaStream>,
    /// Codec kernels' stream.
    pub(crate) work: Arc<CudaStream>,
    /// The NCCL communicator (owned; destroyed on drop).
    pub(crate) comm: nsys::ncclComm_t,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every operation is blocking, so nothing is normally in flight here. Abort (rather
        // than synchronize + finalize) so that a rank leaving on an error, with a peer gone or
        // an operation half-posted, never hangs its own teardown or waits for other ranks.
        // SAFETY: `comm` was created by ncclCommInitRank and is released exactly once.
        unsafe {
            let _ = nres::comm_abort(self.comm);
        }
    }
}

impl Shared {
    pub(super) fn net_stream(&self) -> nsys::cudaStream_t {
        self.net.cu_stream() as nsys::cudaStream_t
    }

    /// ncclGroupStart / ncclGroupEnd around `f` (the group is always closed).
    pub(super) fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        nres::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let r = f();
        let end = nres::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        let r = r?;
        end?;
        Ok(r)
    }

    /// Enqueue ncclSend of `count` elements at device address `ptr` (inside a group or not).
    ///
    /// # Safety
    /// `ptr` must address `count` valid elements of `dt` that stay alive until the net stream
    /// has passed this operation.
    pub(super) unsafe fn send_raw(
        &self,
        ptr: u64,
        count: usize,
        dt: nsys::ncclDataType_t,
        peer: usize,
    ) -> Result<()> {
        nres::send(
            ptr as *const _,
            count,
            dt,
            peer as i32,
            self.comm,
            self.net_stream(),
        )
        .map_err(|e| nccl_err("ncclSend", e))?;
        Ok(())
    }

    /// Enqueue ncclRecv.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw), for writable memory.
    pub(super) unsafe fn recv_raw(
        &self,
        ptr: u64,
        count: usize,
        dt: nsys::ncclDataType_t,
        peer: usize,
    ) -> Result<()> {
        nres::recv(
            ptr as *mut _,
            count,
            dt,
            peer as i32,
            self.comm,
            self.net_stream(),
        )
        .map_err(|e| nccl_err("ncclRecv", e))?;
        Ok(())
    }

    pub(super) fn sync(&self) -> Result<()> {
        self.net.synchronize().map_err(gpu_err)?;
        self.work.synchronize().map_err(gpu_err)
    }

    /// Raw ncclAllReduce (sum) of device buffers on the net stream.
    pub(super) fn allreduce_sum<T: NcclReal, S: DevicePtr<T>, D: DevicePtrMut<T>>(
        &self,
        input: &S,
        out: &mut D,
    ) -> Result<()> {
        if input.len() != out.len() {
            return Err(Error::invalid("allreduce: input and output lengths differ"));
        }
        self.enqueue_collective(input, out, "ncclAllReduce", |src, dst, n| {
            // SAFETY: both buffers hold n elements (checked above) and stay borrowed through the
            // enqueue (see `enqueue_collective`).
            unsafe {
                nres::all_reduce(
                    src,
                    dst,
                    n,
                    T::as_nccl_type(),
                    nsys::ncclRedOp_t::ncclSum,
                    self.comm,
                    self.net_stream(),
                )
            }
        })
    }

    /// Raw ncclAllGather: `out.len() == size * input.len()`.
    pub(super) fn allgather<T: NcclType, S: DevicePtr<T>, D: DevicePtrMut<T>>(
        &self,
        input: &S,
        out: &mut D,
    ) -> Result<()> {
        if out.len() != input.len() * self.size {
            return Err(Error::invalid(
                "allgather: output must hold size x input elements",
            ));
        }
        self.enqueue_collective(input, out, "ncclAllGather", |src, dst, n| {
            // SAFETY: sizes checked above; the buffers stay borrowed through the enqueue (see
            // `enqueue_collective`).
            unsafe {
                nres::all_gather(src, dst, n, T::as_nccl_type(), self.comm, self.net_stream())
            }
        })
    }

    /// Enqueue one NCCL collective from `input` into `out` on the net stream: `call(src, dst, n)`
    /// makes the NCCL call `what` on the buffers' device addresses, `n = input.len()` (the caller
    /// has checked `out`'s length against it). The buffers stay borrowed until their guards
    /// record their events on the net stream, after the enqueue.
    fn enqueue_collective<T, S: DevicePtr<T>, D: DevicePtrMut<T>>(
        &self,
        input: &S,
        out: &mut D,
        what: &str,
        call: impl FnOnce(
            *const std::ffi::c_void,
            *mut std::ffi::c_void,
            usize,
        ) -> std::result::Result<nres::NcclStatus, nres::NcclError>,
    ) -> Result<()> {
        let n = input.len();
        let (src, _g1) = input.device_ptr(&self.net);
        let (dst, _g2) = out.device_ptr_mut(&self.net);
        call(src as *const _, dst as *mut _, n).map_err(|e| nccl_err(what, e))?;
        Ok(())
    }
}

/// Reusable per-piece device buffers (each piece has its own allocation, so the CUDA events
/// cudarc records per buffer order exactly the streams that touch that piece).
#[derive(Default)]
pub(super) struct Pool {
    pub(super) bufs: Vec<CudaSlice<u8>>,
}

impl Pool {
    /// Make sure buffers `0..count` exist with at least `bytes` bytes each.
    pub(super) fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        count: usize,
        bytes: usize,
    ) -> Result<()> {
        let bytes = bytes.max(256).div_ceil(256) * 256;
        let mut grew = false;
        for i in 0..count {
            if i < self.bufs.len() && self.bufs[i].len() >= bytes {
                continue;
            }
            // SAFETY: u8 device memory; every byte read is written first (compressed streams
            // are read only up to their length).
            let b = unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| {
                Error::OutOfMemory(format!("{bytes} device bytes for NCCL pieces: {e:?}"))
            })?;
            grew = true;
            if i < self.bufs.len() {
                self.bufs[i] = b;
            } else {
                self.bufs.push(b);
            }
        }
        if grew {
            // stream-ordered allocations must be complete before other streams use them
            stream.synchronize().map_err(gpu_err)?;
        }
        Ok(())
    }
}
