//! CUDA device buffers: the collectives compress them on the GPU and stage the streams through
//! pinned host memory; point-to-point calls move a host copy ([`Shadow`]).
//!
//! A collective whose buffers are device memory on every rank runs zcomm's staged device
//! operations (`allreduce_device`, `reduce_scatter_device`, `allgather_device`,
//! `bcast_device`): the GPU codec compresses in device memory, only the compressed stream is
//! copied to the host and sent with host MPI, and the receiver decompresses on its GPU. MPI
//! itself never sees a device pointer, so this works with MPI libraries that are not
//! CUDA-aware. The staged raw path (the policy's choice for a message that would not gain) is a
//! plain device → host copy, host MPI, host → device copy.
//!
//! The caller's memory is borrowed, never owned: its device address becomes a `cudarc` slice
//! for the duration of the call and is released without freeing it. The codec works on the
//! context's default stream, which (legacy default-stream semantics) orders it after the work
//! the program queued on that device's default stream; as with any CUDA-aware MPI, work on
//! other streams must be complete (synchronized) before the MPI call. Every call returns with
//! the results in place (the stream synchronized).
//!
//! One [`DeviceStager`] (kernels, scratch, pinned buffers) per device ordinal is created on the
//! first device collective that uses that device and kept until `MPI_Finalize`. The device
//! profile of `Policy::Auto` is the library's H100-class guess (no collective calibration: a
//! stager is per process, while the ranks of a communicator may have created theirs in
//! different calls).

use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr};
use zcomm::comm::{CommElement, Communicator, DeviceStager, OpStats, Real};
use zcomm::gpu::{GpuCodec, GpuElement};
use zcomm::{Error, Result};

/// The process's device stagers, one per device ordinal (or why that device is unusable).
#[derive(Default)]
pub struct Gpus {
    stagers: HashMap<usize, std::result::Result<Stager, String>>,
}

/// A stager moved between threads only under the state lock.
struct Stager(DeviceStager);

// SAFETY: the stager holds CUDA handles (context, stream, device and pinned allocations) that
// are process-wide driver objects usable from any thread; it is only touched under the
// library's state mutex, so never by two threads at once.
unsafe impl Send for Stager {}

impl Gpus {
    /// Whether device `ordinal` has a working stager (created now if needed: compiles or loads
    /// the GPU kernels). Local, never collective.
    pub fn usable(&mut self, ordinal: usize) -> bool {
        self.stagers
            .entry(ordinal)
            .or_insert_with(|| match GpuCodec::new(ordinal) {
                Ok(g) => Ok(Stager(DeviceStager::new(g))),
                Err(e) => Err(e.to_string()),
            })
            .is_ok()
    }

    /// Why device `ordinal` is unusable (after [`usable`](Self::usable) said so).
    pub fn failure(&self, ordinal: usize) -> Option<&str> {
        match self.stagers.get(&ordinal) {
            Some(Err(e)) => Some(e),
            _ => None,
        }
    }

    /// The stager of a usable device.
    pub fn stager(&mut self, ordinal: usize) -> Result<&mut DeviceStager> {
        match self.stagers.get_mut(&ordinal) {
            Some(Ok(s)) => Ok(&mut s.0),
            Some(Err(e)) => Err(Error::Unavailable(e.clone())),
            None => Err(Error::Unavailable(format!(
                "device {ordinal} was not prepared"
            ))),
        }
    }
}

/// Borrow `count` values at device address `ptr` for the duration of `f`, without taking
/// ownership.
///
/// # Safety
/// `ptr` is a live device allocation of at least `count` values of `T`, in the primary context
/// of the stream's device, not freed during the call.
unsafe fn borrowed<T: DeviceRepr, R>(
    stream: &Arc<CudaStream>,
    ptr: *const c_void,
    count: usize,
    f: impl FnOnce(&mut CudaSlice<T>) -> Result<R>,
) -> Result<R> {
    if ptr.is_null() || (ptr as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Error::invalid(
            "device buffer address is null or not aligned to its datatype",
        ));
    }
    let mut s = stream.upgrade_device_ptr::<T>(ptr as u64, count);
    let r = f(&mut s);
    // the program owns the memory: release the slice without freeing it
    let _ = s.leak();
    r
}

fn finish(dev: &mut DeviceStager, r: Result<OpStats>) -> Result<OpStats> {
    let s = dev.gpu().stream().clone();
    let sync = s
        .synchronize()
        .map_err(|e| Error::Gpu(format!("stream synchronize: {e:?}")));
    let st = r?;
    sync?;
    Ok(st)
}

/// Borrow a collective's input and output and run `op` on them. Not in place: `n_in` values at
/// `send`, `n_out` at `recv`. In place (`send == None`): `recv` holds `max(n_in, n_out)` values,
/// the input is a device copy of `recv[in_place_input]` (the operation overwrites it) and the
/// output is `recv[..n_out]`.
///
/// # Safety
/// The pointers are device allocations of the stated lengths on the stager's device, valid and
/// not otherwise accessed for the duration of the call.
unsafe fn in_out<T: DeviceRepr>(
    dev: &mut DeviceStager,
    send: Option<*const c_void>,
    recv: *mut c_void,
    (n_in, n_out): (usize, usize),
    in_place_input: Range<usize>,
    op: impl FnOnce(&mut DeviceStager, &CudaView<'_, T>, &mut CudaViewMut<'_, T>) -> Result<OpStats>,
) -> Result<OpStats> {
    let s = dev.gpu().stream().clone();
    let r = match send {
        None => borrowed::<T, _>(&s, recv, n_in.max(n_out), |all| {
            let input = s
                .clone_dtod(&all.slice(in_place_input))
                .map_err(|e| Error::Gpu(format!("device copy of an in-place input: {e:?}")))?;
            op(dev, &input.as_view(), &mut all.slice_mut(..n_out))
        }),
        Some(p) => borrowed::<T, _>(&s, p, n_in, |x| {
            borrowed::<T, _>(&s, recv, n_out, |out| {
                op(dev, &x.as_view(), &mut out.as_view_mut())
            })
        }),
    };
    finish(dev, r)
}

/// `MPI_Allreduce` (sum) of `n` scalars of `T` on device buffers (`send == None`: in place).
///
/// # Safety
/// `recv` (and `send` unless in place) are device allocations of `n` values of `T` on the
/// stager's device, valid and not otherwise accessed for the duration of the call.
pub unsafe fn allreduce<T: GpuElement + CommElement + Real>(
    zc: &mut Communicator,
    dev: &mut DeviceStager,
    send: Option<*const c_void>,
    recv: *mut c_void,
    n: usize,
) -> Result<OpStats> {
    in_out::<T>(dev, send, recv, (n, n), 0..n, |d, x, o| {
        zc.allreduce_device(d, x, o)
    })
}

/// `MPI_Reduce_scatter_block` (sum): `n` scalars of `T` per rank (`send == None`: in place, the
/// input in `recv`, `n * size` scalars).
///
/// # Safety
/// As [`allreduce`], with `send` (or `recv` in place) holding `n * size` values.
pub unsafe fn reduce_scatter<T: GpuElement + CommElement + Real>(
    zc: &mut Communicator,
    dev: &mut DeviceStager,
    send: Option<*const c_void>,
    recv: *mut c_void,
    n: usize,
) -> Result<OpStats> {
    let total = n * zc.size();
    in_out::<T>(dev, send, recv, (total, n), 0..total, |d, x, o| {
        zc.reduce_scatter_device(d, x, o)
    })
}

/// `MPI_Allgather` of `n` scalars of `T` per rank (`send == None`: in place, this rank's block
/// already in `recv`).
///
/// # Safety
/// `recv` holds `n * size` values of `T`, `send` (unless in place) `n`; device allocations on
/// the stager's device, valid for the call.
pub unsafe fn allgather<T: GpuElement + CommElement + Real>(
    zc: &mut Communicator,
    dev: &mut DeviceStager,
    send: Option<*const c_void>,
    recv: *mut c_void,
    n: usize,
) -> Result<OpStats> {
    let (p, me) = (zc.size(), zc.rank());
    in_out::<T>(
        dev,
        send,
        recv,
        (n, n * p),
        me * n..(me + 1) * n,
        |d, x, o| zc.allgather_device(d, x, o),
    )
}

/// `MPI_Bcast` of `n` scalars of `T` from `root`.
///
/// # Safety
/// `buf` holds `n` values of `T` in device memory of the stager's device, valid for the call.
pub unsafe fn bcast<T: GpuElement + CommElement + Real>(
    zc: &mut Communicator,
    dev: &mut DeviceStager,
    buf: *mut c_void,
    n: usize,
    root: usize,
) -> Result<OpStats> {
    let s = dev.gpu().stream().clone();
    let r = borrowed::<T, _>(&s, buf, n, |b| {
        zc.bcast_device(dev, &mut b.as_view_mut(), root)
    });
    finish(dev, r)
}

/// A device buffer of a point-to-point call, staged through host memory: MPI moves the host
/// copy, so device messages work with an MPI that is not CUDA-aware, and the compressed path
/// is the host one (the CPU codec on the staged copy: the stream bytes are the GPU codec's).
pub struct Shadow {
    /// The host copy, in 8-byte words so that every datatype's values are aligned in it.
    host: Vec<u64>,
    /// Its length in bytes.
    bytes: usize,
    /// The device address.
    dev: usize,
    /// The device ordinal.
    ord: usize,
}

impl Shadow {
    /// A host copy of `bytes` bytes at device address `dev` on device `ord`; `download`: with
    /// the device contents (a send), else zeroed (a receive).
    ///
    /// # Safety
    /// `dev` is a device allocation of at least `bytes` bytes on device `ord`, valid for the
    /// call.
    pub unsafe fn new(
        gpus: &mut Gpus,
        ord: usize,
        dev: *const c_void,
        bytes: usize,
        download: bool,
    ) -> Result<Shadow> {
        let words = bytes.div_ceil(8);
        let mut host: Vec<u64> = Vec::new();
        host.try_reserve_exact(words).map_err(|_| {
            Error::invalid(format!("cannot allocate {bytes} bytes of host staging"))
        })?;
        host.resize(words, 0);
        let mut sh = Shadow {
            host,
            bytes,
            dev: dev as usize,
            ord,
        };
        if download && bytes > 0 {
            let s = gpus.stager(ord)?.gpu().stream().clone();
            let h = sh.bytes_mut();
            borrowed::<u8, _>(&s, dev, bytes, |d| {
                s.memcpy_dtoh(&*d, h)
                    .and_then(|_| s.synchronize())
                    .map_err(|e| Error::Gpu(format!("device to host copy: {e:?}")))
            })?;
        }
        Ok(sh)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the words hold at least `bytes` initialized bytes; u8 has no alignment
        unsafe { std::slice::from_raw_parts_mut(self.host.as_mut_ptr().cast(), self.bytes) }
    }

    /// The host copy's address (8-byte aligned).
    pub fn ptr(&mut self) -> *mut c_void {
        self.host.as_mut_ptr().cast()
    }

    /// The host copy's address, read-only.
    pub fn as_ptr(&self) -> *const c_void {
        self.host.as_ptr().cast()
    }

    /// Copy the first `bytes` bytes of the host copy (what a receive delivered) to the device.
    ///
    /// # Safety
    /// The device buffer given to [`new`](Self::new) is still valid.
    pub unsafe fn upload(&self, gpus: &mut Gpus, bytes: usize) -> Result<()> {
        let bytes = bytes.min(self.bytes);
        if bytes == 0 {
            return Ok(());
        }
        let s = gpus.stager(self.ord)?.gpu().stream().clone();
        // SAFETY: as in `bytes_mut`
        let h = std::slice::from_raw_parts(self.host.as_ptr().cast::<u8>(), bytes);
        borrowed::<u8, _>(&s, self.dev as *const c_void, bytes, |d| {
            s.memcpy_htod(h, d)
                .and_then(|_| s.synchronize())
                .map_err(|e| Error::Gpu(format!("host to device copy: {e:?}")))
        })
    }
}
