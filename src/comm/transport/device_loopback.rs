//! The in-process loopback transport for device buffers: the ranks of one group are threads of
//! one process on one GPU, and a message is a device-to-device copy into a buffer of the
//! receiver's.
//!
//! It lets the device-resident algorithms run and be measured on a single GPU: two ranks share
//! the device, every byte that would cross a link is copied once through device memory (at the
//! GPU's copy bandwidth, or slower with a [`LinkEmulation`]), and the small agreements travel
//! over a host [`LoopbackTransport`]. Messages between a pair of ranks arrive in order; sends
//! complete when the copy has been made (the sender synchronizes its stream first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};

use super::{
    DeviceBytes, DeviceTransport, LinkEmulation, LoopbackTransport, ReduceOp, SendHandle, Transport,
};
use crate::error::{Error, Result};

type Mailbox = HashMap<(usize, usize), VecDeque<DeviceBytes>>;

/// State shared by the ranks of one device group.
struct DeviceFabric {
    mail: Mutex<Mailbox>,
    /// Per receiving rank: buffers its received messages were copied into, given back for
    /// reuse (allocating device memory per message costs more than copying it).
    pool: Mutex<HashMap<usize, Vec<CudaSlice<u8>>>>,
    arrived: Condvar,
    link: LinkEmulation,
    epoch: Instant,
}

/// One rank of an in-process device group (see the [module docs](self)). `Send`: each rank runs
/// on its own thread.
pub struct DeviceLoopback {
    host: LoopbackTransport,
    fabric: Arc<DeviceFabric>,
    /// [`DeviceTransport::piece_bytes`].
    piece_bytes: usize,
    /// [`DeviceTransport::queue_decodes`].
    queue_decodes: bool,
}

impl std::fmt::Debug for DeviceLoopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceLoopback(rank {} of {})", self.rank(), self.size())
    }
}

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

impl DeviceLoopback {
    /// A group of `n` ranks; device messages travel over links of speed `link` (the default:
    /// as fast as the device copies).
    pub fn group(n: usize, link: LinkEmulation) -> Vec<Self> {
        let fabric = Arc::new(DeviceFabric {
            mail: Mutex::new(HashMap::new()),
            pool: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            link,
            epoch: Instant::now(),
        });
        LoopbackTransport::group(n)
            .into_iter()
            .map(|host| DeviceLoopback {
                host,
                fabric: fabric.clone(),
                piece_bytes: usize::MAX,
                queue_decodes: true,
            })
            .collect()
    }

    /// This rank with the device algorithms' buffers (ring segments, allgather buffers) cut
    /// into pieces of at most `bytes` uncompressed bytes (give every rank of the group the
    /// same). The loopback's copies complete before its transfers return, so pieces overlap
    /// nothing here; they run the pipelined schedule of a link that queues its transfers
    /// (NCCL) on one GPU.
    pub fn with_piece_bytes(mut self, bytes: usize) -> Self {
        self.piece_bytes = bytes.max(1);
        self
    }

    /// This rank with the device algorithms waiting for every decompression they launch
    /// (`false`; as over the staged MPI link) instead of queueing them (the default, as over
    /// NCCL): the two must give the same results, bit for bit.
    pub fn with_queued_decodes(mut self, queue: bool) -> Self {
        self.queue_decodes = queue;
        self
    }

    /// A buffer of at least `len` bytes for a message to `owner`: a recycled one if one fits.
    fn buffer_for(
        &self,
        owner: usize,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<CudaSlice<u8>> {
        {
            let mut pool = self.fabric.pool.lock().unwrap_or_else(|e| e.into_inner());
            let bufs = pool.entry(owner).or_default();
            if let Some(i) = bufs.iter().position(|b| b.len() >= len) {
                return Ok(bufs.swap_remove(i));
            }
        }
        // round up so that slightly longer messages later still fit
        let cap = len.max(1).next_multiple_of(1 << 20);
        // SAFETY: only the first `len` bytes of a message buffer are ever read, after the copy
        // below has written them.
        unsafe { stream.alloc::<u8>(cap) }.map_err(gpu_err("loopback buffer"))
    }

    /// Copy `bytes` into a buffer of `dest`'s on `stream` and post it to `dest`.
    fn post(&self, dest: usize, bytes: &CudaView<'_, u8>, stream: &Arc<CudaStream>) -> Result<()> {
        super::check_rank(dest, self.size())?;
        let t0 = self.fabric.epoch.elapsed().as_secs_f64();
        let copy = self.copy_for(dest, bytes, stream)?;
        if let Some(bw) = self.fabric.link.bandwidth {
            // the link is slower than the copy: hold the message until it would have arrived
            let due = t0 + self.fabric.link.latency + bytes.len() as f64 / bw;
            let wait = due - self.fabric.epoch.elapsed().as_secs_f64();
            if wait > 0.0 {
                std::thread::sleep(std::time::Duration::from_secs_f64(wait));
            }
        }
        let mut mail = self.fabric.mail.lock().unwrap_or_else(|e| e.into_inner());
        mail.entry((self.rank(), dest)).or_default().push_back(copy);
        drop(mail);
        self.fabric.arrived.notify_all();
        Ok(())
    }

    /// `bytes` copied (and synchronized) into a buffer owned by `owner`.
    fn copy_for(
        &self,
        owner: usize,
        bytes: &CudaView<'_, u8>,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceBytes> {
        let len = bytes.len();
        let mut buf = self.buffer_for(owner, len, stream)?;
        if len > 0 {
            stream
                .memcpy_dtod(bytes, &mut buf.slice_mut(..len))
                .map_err(gpu_err("loopback copy"))?;
        }
        stream.synchronize().map_err(gpu_err("loopback copy"))?;
        DeviceBytes::new(buf, len)
    }

    /// The next device message from `src`.
    fn take(&self, src: usize) -> Result<DeviceBytes> {
        super::check_rank(src, self.size())?;
        let key = (src, self.rank());
        let mut mail = self.fabric.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(m) = mail.get_mut(&key).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            let (m, timeout) = self
                .fabric
                .arrived
                .wait_timeout(mail, std::time::Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner());
            mail = m;
            if timeout.timed_out() && !self.host.peer_alive(src) {
                // a departed sender would otherwise leave us waiting forever
                return Err(Error::Comm(format!(
                    "device loopback: rank {src} left the group before sending the message \
                     rank {} waits for",
                    self.rank()
                )));
            }
        }
    }
}

impl Transport for DeviceLoopback {
    fn rank(&self) -> usize {
        self.host.rank()
    }
    fn size(&self) -> usize {
        self.host.size()
    }
    fn send(&self, dest: usize, tag: i32, bytes: &[u8]) -> Result<()> {
        self.host.send(dest, tag, bytes)
    }
    fn recv(&self, src: usize, tag: i32) -> Result<Vec<u8>> {
        self.host.recv(src, tag)
    }
    fn sendrecv(&self, dest: usize, bytes: &[u8], src: usize, tag: i32) -> Result<Vec<u8>> {
        self.host.sendrecv(dest, bytes, src, tag)
    }
    fn isend(&self, dest: usize, tag: i32, bytes: Vec<u8>) -> Result<Box<dyn SendHandle>> {
        self.host.isend(dest, tag, bytes)
    }
    fn iprobe(&self, src: usize, tag: i32) -> Result<bool> {
        self.host.iprobe(src, tag)
    }
    fn allgather_fixed(&self, mine: &[u8]) -> Result<Vec<u8>> {
        self.host.allgather_fixed(mine)
    }
    fn allgatherv(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.host.allgatherv(mine)
    }
    fn bcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.host.bcast(root, bytes)
    }
    fn allreduce_f64(&self, vals: &mut [f64], op: ReduceOp) -> Result<()> {
        self.host.allreduce_f64(vals, op)
    }
    fn allreduce_sum_f32(&self, input: &[f32], out: &mut [f32]) -> Result<()> {
        self.host.allreduce_sum_f32(input, out)
    }
    fn allreduce_sum_f64(&self, input: &[f64], out: &mut [f64]) -> Result<()> {
        self.host.allreduce_sum_f64(input, out)
    }
    fn barrier(&self) -> Result<()> {
        self.host.barrier()
    }
    fn wtime(&self) -> f64 {
        self.host.wtime()
    }
}

impl DeviceTransport for DeviceLoopback {
    fn piece_bytes(&self) -> usize {
        self.piece_bytes
    }

    fn queue_decodes(&self) -> bool {
        self.queue_decodes
    }

    fn host(&self) -> &dyn Transport {
        self
    }

    fn sendrecv_device(
        &self,
        dest: usize,
        bytes: &CudaView<'_, u8>,
        src: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceBytes> {
        self.post(dest, bytes, stream)?;
        self.take(src)
    }

    fn allgather_device(
        &self,
        mine: &CudaView<'_, u8>,
        stream: &Arc<CudaStream>,
    ) -> Result<Vec<Option<DeviceBytes>>> {
        let (r, p) = (self.rank(), self.size());
        for dest in (0..p).filter(|&d| d != r) {
            self.post(dest, mine, stream)?;
        }
        (0..p)
            .map(|src| (src != r).then(|| self.take(src)).transpose())
            .collect()
    }

    fn recycle(&self, bytes: DeviceBytes) {
        let mut pool = self.fabric.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.entry(self.rank())
            .or_default()
            .push(bytes.into_buffer());
    }
}
