//! Device messages over a host transport, staged through a stager's pinned buffers: the
//! [`DeviceTransport`] that lets the device-resident ring (`comm::device_ring`) run on an MPI
//! that cannot read device memory. A message goes D2H into the pinned send buffer, its length
//! and then its bytes over the transport into the pinned receive buffer, and H2D into a device
//! buffer of the stager's receive pool (reused across messages and operations).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::*;
use crate::comm::transport::{DeviceBytes, DeviceTransport, Transport};

/// One staged device link (see the [module docs](self)); built per operation from the
/// stager's buffers and the communicator's transport.
pub(super) struct StagedLink<'a> {
    host: &'a dyn Transport,
    send: RefCell<&'a mut Option<PinnedHostSlice<u8>>>,
    recv: RefCell<&'a mut Option<PinnedHostSlice<u8>>>,
    pool: RefCell<&'a mut Vec<CudaSlice<u8>>>,
    /// D2H, transport (`network`) and H2D seconds so far.
    times: Cell<StageTimes>,
    /// The first local failure (a copy, a pinned or device allocation). The link then sends
    /// empty messages and hands the ring empty ones, which the ring carries to every rank as a
    /// failure, so no rank is left waiting; the caller reports this error.
    failure: RefCell<Option<Error>>,
}

/// The stages a staged link times.
#[derive(Clone, Copy)]
enum Stage {
    D2h,
    Network,
    H2d,
}

impl DeviceStager {
    /// Run `f` (a collective of the engine) over a [`StagedLink`] built on `host` from this
    /// stager's pinned buffers and receive pool, with its GPU codec and compression scratch.
    /// Returns `f`'s result, with the stage times of the operation in `self.last` (the link's
    /// D2H / transport / H2D, the codec seconds `f` timed itself), or this rank's own failure
    /// on the link, which explains a failed collective better than the empty message every
    /// rank then saw.
    pub(super) fn over_staged_link<R: CodecSeconds>(
        &mut self,
        host: &dyn Transport,
        f: impl FnOnce(&StagedLink<'_>, &mut GpuCodec, &mut Option<CudaSlice<u8>>) -> Result<R>,
    ) -> Result<R> {
        let DeviceStager {
            gpu,
            scratch_out,
            pinned_send,
            pinned_recv,
            recv_pool,
            ..
        } = self;
        let link = StagedLink::new(host, pinned_send, pinned_recv, recv_pool);
        let run = f(&link, gpu, scratch_out);
        let (r, times) = match (run, link.take_failure()) {
            (Ok(r), None) => (r, link.times()),
            (_, Some(e)) | (Err(e), None) => return Err(e),
        };
        let (compress, decompress) = r.codec_seconds();
        self.last = StageTimes {
            compress,
            decompress,
            ..times
        };
        Ok(r)
    }
}

/// The seconds of its own codec calls a collective run over a [`StagedLink`] reports
/// `(compress, decompress)`: the link times only its copies and transfers.
pub(super) trait CodecSeconds {
    fn codec_seconds(&self) -> (f64, f64);
}

impl CodecSeconds for crate::comm::device_gather::Gathered {
    fn codec_seconds(&self) -> (f64, f64) {
        (self.compress_s, self.decompress_s)
    }
}

impl CodecSeconds for crate::comm::device_ring::RingRun {
    fn codec_seconds(&self) -> (f64, f64) {
        (self.compress_s, self.decompress_s)
    }
}

impl<'a> StagedLink<'a> {
    pub(super) fn new(
        host: &'a dyn Transport,
        send: &'a mut Option<PinnedHostSlice<u8>>,
        recv: &'a mut Option<PinnedHostSlice<u8>>,
        pool: &'a mut Vec<CudaSlice<u8>>,
    ) -> Self {
        StagedLink {
            host,
            send: RefCell::new(send),
            recv: RefCell::new(recv),
            pool: RefCell::new(pool),
            times: Cell::new(StageTimes::default()),
            failure: RefCell::new(None),
        }
    }

    /// The D2H, transport (`network`) and H2D seconds of the messages so far (the codec stages
    /// are zero: the ring times its own codec calls).
    fn times(&self) -> StageTimes {
        self.times.get()
    }

    /// This rank's own failure on the link, if any (see the field).
    fn take_failure(&self) -> Option<Error> {
        self.failure.borrow_mut().take()
    }

    /// Record a local failure; `Ok` of an empty message for the ring.
    fn fail(&self, e: Error, stream: &Arc<CudaStream>) -> Result<DeviceBytes> {
        self.failure.borrow_mut().get_or_insert(e);
        let buf = match self.pool.borrow_mut().pop() {
            Some(b) => b,
            None => stream
                .alloc_zeros::<u8>(16)
                .map_err(|e| Error::OutOfMemory(format!("16 device bytes: {e:?}")))?,
        };
        DeviceBytes::new(buf, 0)
    }

    /// An empty message for the ring after a failure already recorded.
    fn empty_after_failure(&self, stream: &Arc<CudaStream>) -> Result<DeviceBytes> {
        let e = Error::Comm("staged link: an earlier failure".into());
        self.fail(e, stream)
    }

    /// D2H of `bytes` into the pinned send buffer; the length staged (0 after a failure,
    /// recorded: the rank then sends an empty message).
    fn stage_out_or_fail(&self, bytes: &CudaView<'_, u8>, stream: &Arc<CudaStream>) -> usize {
        if self.failure.borrow().is_some() {
            return 0;
        }
        match self.stage_out(bytes, stream) {
            Ok(()) => bytes.len(),
            Err(e) => {
                self.failure.borrow_mut().get_or_insert(e);
                0
            }
        }
    }

    fn add_time(&self, stage: Stage, since: std::time::Instant) {
        let mut t = self.times.get();
        let dt = since.elapsed().as_secs_f64();
        match stage {
            Stage::D2h => t.d2h += dt,
            Stage::Network => t.network += dt,
            Stage::H2d => t.h2d += dt,
        }
        self.times.set(t);
    }

    /// D2H of `bytes` into the front of the pinned send buffer.
    fn stage_out(&self, bytes: &CudaView<'_, u8>, stream: &Arc<CudaStream>) -> Result<()> {
        let t = now();
        let mut send = self.send.borrow_mut();
        DeviceStager::grow_pinned(&mut send, stream, bytes.len())?;
        let dst = send.as_mut().expect("grown");
        let (p, _g) = bytes.device_ptr(stream);
        DeviceStager::d2h(
            stream,
            p,
            &mut dst.as_mut_slice().map_err(gpu_err("pinned"))?[..bytes.len()],
        )?;
        self.add_time(Stage::D2h, t);
        Ok(())
    }

    /// H2D of `len` bytes at `at` of the pinned receive buffer into a pooled device buffer.
    fn stage_in(&self, at: usize, len: usize, stream: &Arc<CudaStream>) -> Result<DeviceBytes> {
        let t = now();
        let found = {
            let mut pool = self.pool.borrow_mut();
            let i = pool.iter().position(|b| b.len() >= len);
            i.map(|i| pool.swap_remove(i))
        };
        let mut buf = match found {
            Some(b) => b,
            None => {
                // rounded up so that slightly longer messages later still fit
                let cap = len.max(1).next_multiple_of(1 << 20);
                // SAFETY: only the first `len` bytes are ever read, after the copy below.
                unsafe { stream.alloc::<u8>(cap) }
                    .map_err(|e| Error::OutOfMemory(format!("{cap} device bytes: {e:?}")))?
            }
        };
        {
            let recv = self.recv.borrow();
            let src = match recv.as_ref() {
                Some(b) => &b.as_slice().map_err(gpu_err("pinned"))?[at..at + len],
                None => &[][..],
            };
            let (p, _g) = buf.device_ptr_mut(stream);
            DeviceStager::h2d(stream, src, p)?;
        }
        self.add_time(Stage::H2d, t);
        DeviceBytes::new(buf, len)
    }

    /// The pinned receive buffer grown to `len` bytes; `false` when it cannot be (the caller
    /// then drains the message into host memory, so both sides stay matched).
    fn recv_room(&self, len: usize, stream: &Arc<CudaStream>) -> bool {
        DeviceStager::grow_pinned(&mut self.recv.borrow_mut(), stream, len).is_ok()
    }

    /// `f` of the first `len` bytes of the pinned send buffer.
    fn with_payload<R>(&self, len: usize, f: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        let send = self.send.borrow();
        let payload = match send.as_ref() {
            Some(b) => &b.as_slice().map_err(gpu_err("pinned"))?[..len],
            None if len == 0 => &[][..],
            None => return Err(Error::Comm("staged link: nothing staged".into())),
        };
        f(payload)
    }

    /// `f` of the first `len` bytes of the pinned receive buffer (grown by `recv_room`).
    fn with_landing<R>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        let mut recv = self.recv.borrow_mut();
        let buf = match recv.as_mut() {
            Some(b) => &mut b.as_mut_slice().map_err(gpu_err("pinned"))?[..len],
            None => &mut [][..],
        };
        f(buf)
    }
}

impl DeviceTransport for StagedLink<'_> {
    fn host(&self) -> &dyn Transport {
        self.host
    }

    fn sendrecv_device(
        &self,
        dest: usize,
        bytes: &CudaView<'_, u8>,
        src: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceBytes> {
        let n = self.stage_out_or_fail(bytes, stream);
        let t = now();
        let tag = crate::comm::TAG_RING;
        let theirs = self
            .host
            .sendrecv(dest, &(n as u64).to_le_bytes(), src, tag)?;
        let m = <[u8; 8]>::try_from(theirs.as_slice())
            .map(u64::from_le_bytes)
            .map_err(|_| Error::Comm(format!("staged link: {}-byte length", theirs.len())))?;
        let m = usize::try_from(m)
            .map_err(|_| Error::Comm(format!("staged link: {m}-byte message announced")))?;
        if !self.recv_room(m, stream) {
            // received into host memory, so that both sides stay matched, then dropped
            let mut v = Vec::new();
            v.try_reserve_exact(m)
                .map_err(|_| Error::OutOfMemory(format!("staged link: {m}-byte message")))?;
            v.resize(m, 0u8);
            self.with_payload(n, |b| self.host.sendrecv_sized(dest, b, src, &mut v, tag))?;
            let e = Error::OutOfMemory(format!("staged link: no pinned memory for {m} bytes"));
            return self.fail(e, stream);
        }
        self.with_payload(n, |b| {
            self.with_landing(m, |buf| self.host.sendrecv_sized(dest, b, src, buf, tag))
        })?;
        self.add_time(Stage::Network, t);
        match self.stage_in(0, m, stream) {
            Ok(b) => Ok(b),
            Err(e) => self.fail(e, stream),
        }
    }

    fn allgather_device(
        &self,
        mine: &CudaView<'_, u8>,
        stream: &Arc<CudaStream>,
    ) -> Result<Vec<Option<DeviceBytes>>> {
        let n = self.stage_out_or_fail(mine, stream);
        let t = now();
        let lens = self.host.allgather_lens(n)?;
        let total: usize = lens.iter().sum();
        let me = self.host.rank();
        if !self.recv_room(total, stream) {
            // the same pairwise exchanges into host memory (every rank takes part), dropped
            let mut v = Vec::new();
            v.try_reserve_exact(total)
                .map_err(|_| Error::OutOfMemory(format!("staged link: {total} bytes")))?;
            v.resize(total, 0u8);
            self.with_payload(n, |b| {
                super::gather::gather_into(self.host, b, &lens, &mut v)
            })?;
            let e = Error::OutOfMemory(format!("staged link: no pinned memory for {total} bytes"));
            self.failure.borrow_mut().get_or_insert(e);
            return (0..lens.len())
                .map(|k| {
                    (k != me)
                        .then(|| self.empty_after_failure(stream))
                        .transpose()
                })
                .collect();
        }
        // pairwise exchanges into the pinned buffer (see `gather_pinned`: no copy of this
        // rank's own record, which `MPI_Allgatherv` would make)
        super::gather::gather_pinned(
            self.host,
            &self.send.borrow(),
            &mut self.recv.borrow_mut(),
            n,
            &lens,
            total,
        )?;
        self.add_time(Stage::Network, t);
        let mut at = 0;
        let mut out = Vec::with_capacity(lens.len());
        for (k, &l) in lens.iter().enumerate() {
            out.push(if k == me {
                None
            } else {
                Some(match self.stage_in(at, l, stream) {
                    Ok(b) => b,
                    Err(e) => self.fail(e, stream)?,
                })
            });
            at += l;
        }
        Ok(out)
    }

    fn recycle(&self, bytes: DeviceBytes) {
        self.pool.borrow_mut().push(bytes.into_buffer());
    }
}
