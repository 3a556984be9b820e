//! The exported `MPI_*` functions.
//!
//! Every wrapper first checks the re-entrancy flag (zcomm's own MPI calls go straight to PMPI),
//! then decides whether the call is eligible; ineligible calls go to PMPI with the caller's
//! arguments unchanged. Eligible calls run zcomm under the state lock, with panics caught.

//! The exported functions have the MPI standard's signatures and semantics (documented there).

#![allow(
    non_snake_case,
    missing_docs,
    clippy::missing_safety_doc,
    clippy::too_many_arguments
)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};

use mpi::ffi::*;
use zcomm::comm::{Communicator, OpStats, SendRequest, MAX_USER_TAG};

use crate::device;
use crate::ffi::{self, Elem, Handle, IN_PLACE};
use crate::progress;
use crate::state::{self, fatal, fatal_error, guarded, inside, Inside, State};

/// zcomm's tag offset of a point-to-point verdict (the receiver's answer), used to test whether
/// a compressed send can complete without blocking. Mirrors `TAG_VERDICT` in `zcomm::comm`
/// (a private constant there: a public `SendRequest::test` in zcomm would replace this probe).
const TAG_VERDICT: i32 = 12288;

/// Run `$body` with `$T` the Rust element type of `$elem`.
macro_rules! dispatch {
    ($elem:expr, $T:ident => $body:expr) => {
        match $elem {
            Elem::F32 => {
                type $T = f32;
                $body
            }
            Elem::F64 => {
                type $T = f64;
                $body
            }
            Elem::C32 => {
                type $T = [f32; 2];
                $body
            }
            Elem::C64 => {
                type $T = [f64; 2];
                $body
            }
        }
    };
}

/// A mutable slice over a caller's buffer.
///
/// # Safety
/// `p` must point to `n` valid, initialized, exclusively borrowed elements of `T` (the MPI
/// call's contract for a receive buffer of `n` elements of the matching datatype).
unsafe fn slice_mut<'a, T>(p: *mut c_void, n: usize) -> &'a mut [T] {
    if n == 0 {
        return &mut [];
    }
    std::slice::from_raw_parts_mut(p.cast::<T>(), n)
}

/// A shared slice over a caller's buffer.
///
/// # Safety
/// `p` must point to `n` valid, initialized elements of `T` (a send buffer's contract).
unsafe fn slice<'a, T>(p: *const c_void, n: usize) -> &'a [T] {
    if n == 0 {
        return &[];
    }
    std::slice::from_raw_parts(p.cast::<T>(), n)
}

fn comm_rank_size(comm: MPI_Comm) -> (c_int, c_int) {
    let (mut r, mut s) = (0, 0);
    // SAFETY: the communicator was passed to an MPI call by the application; both write an int.
    unsafe {
        PMPI_Comm_rank(comm, &mut r);
        PMPI_Comm_size(comm, &mut s);
    }
    (r, s)
}

/// Common eligibility of a message of `count` elements of `dt` (the datatype, its size): the
/// element kind, or the reason to pass through.
fn eligible_data(st: &State, dt: MPI_Datatype, count: c_int) -> Result<Elem, &'static str> {
    let elem = ffi::classify(dt).ok_or("datatype")?;
    if count <= 0 {
        return Err("empty");
    }
    if (count as usize).saturating_mul(elem.size()) < st.settings.min_bytes {
        return Err("below ZCOMM_MIN_BYTES");
    }
    Ok(elem)
}

/// [`eligible_data`] for point-to-point, whose device buffers pass through (one rank's
/// buffers decide alone there: no agreement is possible).
fn eligible(
    st: &State,
    dt: MPI_Datatype,
    count: c_int,
    bufs: &[*const c_void],
) -> Result<Elem, &'static str> {
    let elem = eligible_data(st, dt, count)?;
    if bufs.iter().any(|&b| b != IN_PLACE && device::is_device(b)) {
        return Err("device buffer");
    }
    Ok(elem)
}

fn note_device(st: &mut State, reason: &str) {
    if reason == "device buffer" {
        st.report.note(
            "CUDA device buffers of point-to-point calls were passed to PMPI unchanged (ZCOMM_DEVICE=pass or ZCOMM_P2P=off, or no usable GPU: the MPI library must be CUDA-aware there)",
        );
    }
}

/// Where a collective's buffers live, the same on every rank of the communicator.
#[derive(Clone, Copy)]
enum Place {
    Host,
    /// CUDA device memory; this rank's device ordinal.
    Device(usize),
}

/// This rank's buffers: host, device memory on one usable GPU, or a reason they cannot go
/// through zcomm.
fn local_place(st: &mut State, bufs: &[*const c_void]) -> Result<Place, &'static str> {
    let bufs: Vec<*const c_void> = bufs.iter().copied().filter(|&b| b != IN_PLACE).collect();
    let devs: Vec<Option<usize>> = bufs.iter().map(|&b| device::ordinal(b)).collect();
    if devs.iter().all(Option::is_none) {
        // (a managed buffer whose ordinal the driver cannot tell counts as device memory)
        if bufs.iter().any(|&b| device::is_device(b)) {
            return Err("device buffer on no single device");
        }
        return Ok(Place::Host);
    }
    let ord = match devs[0] {
        Some(o) if devs.iter().all(|d| *d == Some(o)) => o,
        _ => return Err("host and device buffers (or two devices) in one call"),
    };
    if st.settings.device == crate::settings::DeviceMode::Pass {
        return Err("device buffer (ZCOMM_DEVICE=pass)");
    }
    if let Some(c) = st.settings.policy.codec() {
        if !c.has_gpu() {
            return Err("device buffer: the codec has no GPU kernels");
        }
    }
    if !st.gpus.usable(ord) {
        let why = st.gpus.failure(ord).unwrap_or("unknown").to_string();
        st.report.note(&format!(
            "CUDA device {ord}: no GPU codec ({why}); device buffers passed to PMPI unchanged"
        ));
        return Err("device buffer: GPU codec unavailable");
    }
    Ok(Place::Device(ord))
}

/// [`local_place`] agreed by every rank of `comm` (one small allreduce on zcomm's duplicate):
/// zcomm runs only where every rank has host buffers or every rank has usable device buffers,
/// since the host and device paths exchange different messages. Otherwise every rank passes
/// the call to PMPI (which then needs to be CUDA-aware).
fn agree_place(
    st: &mut State,
    comm: MPI_Comm,
    bufs: &[*const c_void],
) -> Result<Place, &'static str> {
    let local = local_place(st, bufs);
    let flags = match local {
        Ok(Place::Host) => [1.0, 0.0],
        Ok(Place::Device(_)) => [0.0, 1.0],
        Err(_) => [0.0, 0.0],
    };
    let mut all = flags;
    let zc = collective_zc(st, comm)?;
    let agreed = {
        let _inside = Inside::enter();
        zc.transport()
            .allreduce_f64(&mut all, zcomm::comm::ReduceOp::Min)
    };
    if let Err(e) = agreed {
        fatal(&format!("buffer placement agreement: {e}"));
    }
    match (local, all) {
        (Ok(p), [h, d]) if h == 1.0 || d == 1.0 => Ok(p),
        (Err(r), _) => Err(r),
        _ => Err("host buffers on some ranks, device buffers on others"),
    }
}

/// zcomm's communicator of `comm` (an existing entry) and the stager of device `ord`.
fn zc_and_stager(
    st: &mut State,
    comm: MPI_Comm,
    ord: usize,
) -> zcomm::Result<(&mut Communicator, &mut zcomm::comm::DeviceStager)> {
    let State { entries, gpus, .. } = st;
    let zc = entries
        .iter_mut()
        .find(|e| e.comm == ffi::key(comm))
        .and_then(|e| e.zc.as_mut())
        .map(|z| &mut z.0)
        .ok_or_else(|| zcomm::Error::Comm("communicator entry vanished".into()))?;
    Ok((zc, gpus.stager(ord)?))
}

/// Run `$body` with `$S` the scalar type of `$elem` and `$lanes` its scalars per element
/// (complex values go to the GPU codec as interleaved scalars).
macro_rules! dispatch_scalar {
    ($elem:expr, $S:ident, $lanes:ident => $body:expr) => {
        match $elem {
            Elem::F32 | Elem::C32 => {
                type $S = f32;
                let $lanes: usize = if $elem == Elem::C32 { 2 } else { 1 };
                $body
            }
            Elem::F64 | Elem::C64 => {
                type $S = f64;
                let $lanes: usize = if $elem == Elem::C64 { 2 } else { 1 };
                $body
            }
        }
    };
}

/// Run a device collective and count it.
fn record_device(
    st: &mut State,
    op: &str,
    comm: MPI_Comm,
    ord: usize,
    run: impl FnOnce(&mut Communicator, &mut zcomm::comm::DeviceStager) -> zcomm::Result<OpStats>,
) {
    let r = {
        let _inside = Inside::enter();
        zc_and_stager(st, comm, ord).and_then(|(zc, dev)| run(zc, dev))
    };
    st.report.note(
        "CUDA device buffers of the collectives are compressed on the GPU and staged through host memory (ZCOMM_DEVICE=stage)",
    );
    st.report.op(op).device += 1;
    record(st, op, r);
}

/// The zcomm communicator of `comm` for a collective (created now if needed), or the reason to
/// pass through.
fn collective_zc(st: &mut State, comm: MPI_Comm) -> Result<&mut Communicator, &'static str> {
    let e = st.entry(comm);
    if e.disabled {
        return Err("communicator opted out");
    }
    match e.zc.as_mut() {
        Some(z) => Ok(&mut z.0),
        None => Err(e.off_reason),
    }
}

/// The zcomm communicator of `comm` for point-to-point (never created here).
fn p2p_zc(st: &mut State, comm: MPI_Comm) -> Option<&mut Communicator> {
    let e = st.find(comm)?;
    if e.disabled {
        return None;
    }
    e.zc.as_mut().map(|z| &mut z.0)
}

fn record(st: &mut State, op: &str, r: zcomm::Result<OpStats>) {
    match r {
        Ok(s) => st.report.op(op).record(&s),
        Err(e) => fatal_error(op, &e),
    }
}

// ------------------------------------------------------------------------------ init / finalize

/// Whether `ZCOMM_NONBLOCKING` asks for progress threads (anything but an explicit off; a wrong
/// value is reported by the settings check right after initialization).
fn wants_thread_multiple() -> bool {
    !matches!(
        std::env::var("ZCOMM_NONBLOCKING")
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
            .as_str(),
        "0" | "off" | "no" | "false"
    )
}

/// The thread level the program was told when the library asked MPI for more (`MPI_Init`:
/// `MPI_THREAD_SINGLE`; `MPI_Init_thread`: what it asked for), for `MPI_Query_thread`; -1: none.
static TOLD_LEVEL: AtomicI32 = AtomicI32::new(-1);

/// With `ZCOMM_NONBLOCKING=on` (the default) MPI is initialized with `MPI_THREAD_MULTIPLE` (the
/// progress threads of `MPI_Iallreduce` call MPI concurrently with the program).
#[no_mangle]
pub unsafe extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    if inside() {
        return PMPI_Init(argc, argv);
    }
    let rc = if wants_thread_multiple() {
        let mut provided: c_int = 0;
        let rc = PMPI_Init_thread(argc, argv, RSMPI_THREAD_MULTIPLE, &mut provided);
        TOLD_LEVEL.store(provided.min(RSMPI_THREAD_SINGLE), Ordering::Relaxed);
        rc
    } else {
        PMPI_Init(argc, argv)
    };
    if rc == 0 {
        guarded("MPI_Init", state::setup);
    }
    rc
}

/// As [`MPI_Init`]: asks for `MPI_THREAD_MULTIPLE` and tells the program the level it asked for
/// (or less, when MPI provides less); everything the program may do at its level is allowed at a
/// higher one.
#[no_mangle]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    if inside() || !wants_thread_multiple() {
        let rc = PMPI_Init_thread(argc, argv, required, provided);
        if rc == 0 && !inside() {
            guarded("MPI_Init_thread", state::setup);
        }
        return rc;
    }
    let mut actual: c_int = 0;
    let rc = PMPI_Init_thread(argc, argv, required.max(RSMPI_THREAD_MULTIPLE), &mut actual);
    let told = actual.min(required);
    TOLD_LEVEL.store(told, Ordering::Relaxed);
    if !provided.is_null() {
        *provided = told;
    }
    if rc == 0 {
        guarded("MPI_Init_thread", state::setup);
    }
    rc
}

/// The level the program was told at initialization (see [`MPI_Init_thread`]); the library's
/// own calls see the real level.
#[no_mangle]
pub unsafe extern "C" fn MPI_Query_thread(provided: *mut c_int) -> c_int {
    let told = TOLD_LEVEL.load(Ordering::Relaxed);
    if inside() || told < 0 || provided.is_null() {
        return PMPI_Query_thread(provided);
    }
    let rc = PMPI_Query_thread(provided);
    if rc == 0 {
        *provided = (*provided).min(told);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    if !inside() {
        guarded("MPI_Finalize", state::teardown);
    }
    PMPI_Finalize()
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_free(comm: *mut MPI_Comm) -> c_int {
    if !inside() && !comm.is_null() {
        let c = *comm;
        guarded("MPI_Comm_free", || {
            let mut g = state::lock();
            if let Some(st) = g.as_mut() {
                if let Some(i) = st.entries.iter().position(|e| e.comm == ffi::key(c)) {
                    let e = st.entries.remove(i);
                    let _inside = Inside::enter();
                    drop(e);
                }
                st.overrides.remove(&(ffi::key(c)));
            }
        });
    }
    PMPI_Comm_free(comm)
}

/// `MPI_Comm_set_info` with the key `zcomm` = `on`/`off` opts the communicator in or out.
#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_set_info(comm: MPI_Comm, info: MPI_Info) -> c_int {
    if !inside() {
        let mut buf = [0 as c_char; 16];
        let mut flag: c_int = 0;
        if info != RSMPI_INFO_NULL {
            PMPI_Info_get(
                info,
                c"zcomm".as_ptr(),
                (buf.len() - 1) as c_int,
                buf.as_mut_ptr(),
                &mut flag,
            );
        }
        if flag != 0 {
            let v = std::ffi::CStr::from_ptr(buf.as_ptr())
                .to_string_lossy()
                .trim()
                .to_ascii_lowercase();
            let on = match v.as_str() {
                "on" | "1" | "true" | "yes" => true,
                "off" | "0" | "false" | "no" => false,
                _ => fatal(&format!(
                    "MPI_Comm_set_info: info key zcomm=`{v}`: expected on or off"
                )),
            };
            guarded("MPI_Comm_set_info", || {
                let mut g = state::lock();
                if let Some(st) = g.as_mut() {
                    if let Some(e) = st.find(comm) {
                        e.disabled = !on;
                    } else {
                        st.overrides.insert(ffi::key(comm), on);
                    }
                }
            });
        }
    }
    PMPI_Comm_set_info(comm, info)
}

// ------------------------------------------------------------------------------ collectives

#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    if inside() {
        return PMPI_Allreduce(sendbuf, recvbuf, count, dt, op, comm);
    }
    guarded("MPI_Allreduce", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Allreduce(sendbuf, recvbuf, count, dt, op, comm);
        };
        let name = "MPI_Allreduce";
        let why = (|| {
            if op != ffi::op_sum() {
                return Err("op is not MPI_SUM");
            }
            if matches!(st.settings.bound, zcomm::ErrorBound::Rel(_)) {
                return Err("rel bound (reductions need abs or noa)");
            }
            let elem = eligible_data(st, dt, count)?;
            collective_zc(st, comm)?;
            Ok((elem, agree_place(st, comm, &[sendbuf, recvbuf])?))
        })();
        let (elem, place) = match why {
            Ok(e) => e,
            Err(r) => {
                st.report.op(name).pass(r);
                drop(g);
                return PMPI_Allreduce(sendbuf, recvbuf, count, dt, op, comm);
            }
        };
        let n = count as usize;
        if let Place::Device(ord) = place {
            let send = (sendbuf != IN_PLACE).then_some(sendbuf);
            record_device(st, name, comm, ord, |zc, dev| {
                dispatch_scalar!(elem, S, lanes => {
                    // SAFETY: MPI_Allreduce's contract (device memory of `count` elements of
                    // `dt` = `count * lanes` scalars of S on this device, checked above)
                    crate::gpu::allreduce::<S>(zc, dev, send, recvbuf, n * lanes)
                })
            });
            return 0;
        }
        let zc = collective_zc(st, comm).expect("checked above");
        let _inside = Inside::enter();
        let r = dispatch!(elem, T => {
            // SAFETY: MPI_Allreduce's contract: recvbuf holds `count` elements of `dt` (T), and
            // sendbuf too unless it is MPI_IN_PLACE; the two do not overlap.
            let out = slice_mut::<T>(recvbuf, n);
            if sendbuf == IN_PLACE {
                zc.allreduce_in_place(out)
            } else {
                zc.allreduce(slice::<T>(sendbuf, n), out)
            }
        });
        record(st, name, r);
        0
    })
}

/// Compressed `MPI_Iallreduce`: a generalized request completed by the communicator's progress
/// thread (see the `progress` module).
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    if inside() {
        return PMPI_Iallreduce(sendbuf, recvbuf, count, dt, op, comm, request);
    }
    guarded("MPI_Iallreduce", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Iallreduce(sendbuf, recvbuf, count, dt, op, comm, request);
        };
        let name = "MPI_Iallreduce";
        st.drain_finished();
        let why = (|| {
            if op != ffi::op_sum() {
                return Err("op is not MPI_SUM");
            }
            if matches!(st.settings.bound, zcomm::ErrorBound::Rel(_)) {
                return Err("rel bound (reductions need abs or noa)");
            }
            let elem = eligible_data(st, dt, count)?;
            if !st.settings.nonblocking {
                return Err("ZCOMM_NONBLOCKING=off");
            }
            if !st.multiple {
                return Err("MPI_THREAD_MULTIPLE not provided (no progress thread)");
            }
            collective_zc(st, comm)?;
            // (agreed, so that no rank runs zcomm's allreduce while another passes through)
            match agree_place(st, comm, &[sendbuf, recvbuf])? {
                Place::Host => Ok(elem),
                Place::Device(_) => Err("device buffer (MPI_Iallreduce: not compressed)"),
            }
        })();
        let elem = match why {
            Ok(e) => e,
            Err(r) => {
                st.report.op(name).pass(r);
                drop(g);
                return PMPI_Iallreduce(sendbuf, recvbuf, count, dt, op, comm, request);
            }
        };
        let req = match progress::new_request() {
            Ok(r) => r,
            Err(rc) => fatal(&format!("{name}: MPI_Grequest_start failed (error {rc})")),
        };
        let (recv, key, n) = (recvbuf as usize, ffi::key(req), count as usize);
        let job: progress::Job = dispatch!(elem, T => {
            // The input is copied now (as MPI libraries that start with a copy do): programs that
            // drop the send buffer before completion (mpi4py with a temporary array) stay safe.
            // SAFETY: MPI_Iallreduce's contract: sendbuf (unless MPI_IN_PLACE) holds `count`
            // elements of `dt` (T)
            let input: Option<Vec<T>> =
                (sendbuf != IN_PLACE).then(|| slice::<T>(sendbuf, n).to_vec());
            Box::new(move |zc: &mut Communicator| {
                // SAFETY: until the request completes, recvbuf holds `count` elements of `dt` (T)
                // that only this operation touches (MPI_Iallreduce's contract)
                let out = slice_mut::<T>(recv as *mut c_void, n);
                let r = match &input {
                    Some(x) => zc.allreduce(x, out),
                    None => zc.allreduce_in_place(out),
                };
                match r {
                    Ok(s) => progress::finished(name, s),
                    Err(e) => fatal_error(name, &e),
                }
                // SAFETY: the request was made by new_request for this operation, completed once
                let rc = progress::complete(MPI_Request::from_addr(key));
                if rc != 0 {
                    fatal(&format!("{name}: MPI_Grequest_complete failed (error {rc})"));
                }
            })
        });
        let queued = st
            .find(comm)
            .and_then(|e| e.progress.as_ref())
            .is_some_and(|p| p.submit(job));
        if !queued {
            fatal(&format!(
                "{name}: the communicator's progress thread has stopped"
            ));
        }
        *request = req;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_block(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    if inside() {
        return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, dt, op, comm);
    }
    guarded("MPI_Reduce_scatter_block", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, dt, op, comm);
        };
        let name = "MPI_Reduce_scatter_block";
        let (_, size) = comm_rank_size(comm);
        let why = (|| {
            if op != ffi::op_sum() {
                return Err("op is not MPI_SUM");
            }
            if matches!(st.settings.bound, zcomm::ErrorBound::Rel(_)) {
                return Err("rel bound (reductions need abs or noa)");
            }
            let elem = eligible_data(st, dt, recvcount)?;
            collective_zc(st, comm)?;
            Ok((elem, agree_place(st, comm, &[sendbuf, recvbuf])?))
        })();
        let (elem, place) = match why {
            Ok(e) => e,
            Err(r) => {
                st.report.op(name).pass(r);
                drop(g);
                return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, dt, op, comm);
            }
        };
        let n = recvcount as usize;
        if let Place::Device(ord) = place {
            let send = (sendbuf != IN_PLACE).then_some(sendbuf);
            record_device(st, name, comm, ord, |zc, dev| {
                dispatch_scalar!(elem, S, lanes => {
                    // SAFETY: MPI_Reduce_scatter_block's contract: `recvcount * size` elements
                    // in (sendbuf or, in place, recvbuf), `recvcount` out; device memory here
                    crate::gpu::reduce_scatter::<S>(zc, dev, send, recvbuf, n * lanes)
                })
            });
            return 0;
        }
        let total = n * size as usize;
        let zc = collective_zc(st, comm).expect("checked above");
        let _inside = Inside::enter();
        let r = dispatch!(elem, T => {
            if sendbuf == IN_PLACE {
                // SAFETY: in place, recvbuf holds the whole input (`recvcount * size` elements)
                let all = slice_mut::<T>(recvbuf, total);
                let input = all.to_vec();
                zc.reduce_scatter(&input, &mut all[..n])
            } else {
                // SAFETY: sendbuf holds `recvcount * size` elements, recvbuf `recvcount`
                zc.reduce_scatter(slice::<T>(sendbuf, total), slice_mut::<T>(recvbuf, n))
            }
        });
        record(st, name, r);
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    macro_rules! pass {
        () => {
            PMPI_Allgather(
                sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
            )
        };
    }
    if inside() {
        return pass!();
    }
    guarded("MPI_Allgather", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return pass!();
        };
        let name = "MPI_Allgather";
        let (rank, size) = comm_rank_size(comm);
        let why = (|| {
            if sendbuf != IN_PLACE && (sendtype != recvtype || sendcount != recvcount) {
                return Err("send and receive types or counts differ");
            }
            let elem = eligible_data(st, recvtype, recvcount)?;
            collective_zc(st, comm)?;
            Ok((elem, agree_place(st, comm, &[sendbuf, recvbuf])?))
        })();
        let (elem, place) = match why {
            Ok(e) => e,
            Err(r) => {
                st.report.op(name).pass(r);
                drop(g);
                return pass!();
            }
        };
        let n = recvcount as usize;
        if let Place::Device(ord) = place {
            let send = (sendbuf != IN_PLACE).then_some(sendbuf);
            record_device(st, name, comm, ord, |zc, dev| {
                dispatch_scalar!(elem, S, lanes => {
                    // SAFETY: MPI_Allgather's contract: `recvcount * size` elements in recvbuf,
                    // `recvcount` in sendbuf unless in place; device memory here
                    crate::gpu::allgather::<S>(zc, dev, send, recvbuf, n * lanes)
                })
            });
            return 0;
        }
        let zc = collective_zc(st, comm).expect("checked above");
        let _inside = Inside::enter();
        let r = dispatch!(elem, T => {
            // SAFETY: recvbuf holds `recvcount * size` elements; sendbuf `sendcount` (=
            // recvcount) unless in place, where this rank's block is inside recvbuf
            let out = slice_mut::<T>(recvbuf, n * size as usize);
            if sendbuf == IN_PLACE {
                let r0 = rank as usize * n;
                let mine = out[r0..r0 + n].to_vec();
                zc.allgather(&mine, out)
            } else {
                zc.allgather(slice::<T>(sendbuf, n), out)
            }
        });
        record(st, name, r);
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Bcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    if inside() {
        return PMPI_Bcast(buf, count, dt, root, comm);
    }
    guarded("MPI_Bcast", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Bcast(buf, count, dt, root, comm);
        };
        let name = "MPI_Bcast";
        let (_, size) = comm_rank_size(comm);
        let why = (|| {
            if root < 0 || root >= size {
                return Err("root out of range (MPI reports it)");
            }
            let elem = eligible_data(st, dt, count)?;
            collective_zc(st, comm)?;
            Ok((elem, agree_place(st, comm, &[buf])?))
        })();
        let (elem, place) = match why {
            Ok(e) => e,
            Err(r) => {
                st.report.op(name).pass(r);
                drop(g);
                return PMPI_Bcast(buf, count, dt, root, comm);
            }
        };
        if let Place::Device(ord) = place {
            record_device(st, name, comm, ord, |zc, dev| {
                dispatch_scalar!(elem, S, lanes => {
                    // SAFETY: MPI_Bcast's contract: `count` elements on every rank; device
                    // memory here
                    crate::gpu::bcast::<S>(zc, dev, buf, count as usize * lanes, root as usize)
                })
            });
            return 0;
        }
        let zc = collective_zc(st, comm).expect("checked above");
        let _inside = Inside::enter();
        let r = dispatch!(elem, T => {
            // SAFETY: buf holds `count` elements of the datatype on every rank
            zc.bcast(slice_mut::<T>(buf, count as usize), root as usize)
        });
        record(st, name, r);
        0
    })
}

// ------------------------------------------------------------------------------ point to point

/// The one-byte marker that holds a compressed message's place on the application's
/// communicator.
static MARKER: u8 = 0x5a;

/// Pending point-to-point requests the library must finish.
#[derive(Default)]
pub struct Pending {
    recvs: Vec<PRecv>,
    sends: Vec<PSend>,
    staged: Vec<PStaged>,
}

/// An uncompressed `MPI_Isend` of a device buffer, posted with PMPI from a host copy that must
/// live until the request completes.
struct PStaged {
    req: usize,
    _copy: crate::gpu::Shadow,
}

/// A receive of an eligible datatype posted with `MPI_Irecv` (it may match a marker).
struct PRecv {
    req: usize,
    buf: usize,
    count: c_int,
    elem: Elem,
    dt: usize,
    comm: usize,
    /// The compressed message was fetched early (while a send waited); its final status.
    done: Option<MPI_Status>,
    /// A device receive buffer's host copy (`buf` is its address): copied to the device when
    /// the receive completes.
    shadow: Option<crate::gpu::Shadow>,
}

/// A compressed `MPI_Isend`: the application holds the marker's request.
struct PSend {
    req: usize,
    comm: usize,
    zreq: SendRequest,
    dest: usize,
    tag: i32,
}

// SAFETY: the pending zcomm send requests hold MPI request handles and leaked send buffers;
// they are only touched under the `STATE` lock (see `state::Zc`).
unsafe impl Send for Pending {}

impl Pending {
    fn is_empty(&self) -> bool {
        self.recvs.is_empty() && self.sends.is_empty() && self.staged.is_empty()
    }
    fn tracked(&self, r: MPI_Request) -> bool {
        let r = ffi::key(r);
        self.recvs.iter().any(|p| p.req == r)
            || self.sends.iter().any(|p| p.req == r)
            || self.staged.iter().any(|p| p.req == r)
    }
}

/// The device ordinal of a point-to-point buffer that is staged through host memory: device
/// memory of a predefined datatype zcomm knows, `ZCOMM_P2P=on`, `ZCOMM_DEVICE=stage`, a usable
/// GPU. `None`: a host buffer, or a device buffer passed through.
fn p2p_stage(
    st: &mut State,
    buf: *const c_void,
    dt: MPI_Datatype,
    count: c_int,
) -> Option<(usize, usize)> {
    if !st.settings.p2p || st.settings.device != crate::settings::DeviceMode::Stage || count <= 0 {
        return None;
    }
    let elem = ffi::classify(dt)?;
    let ord = device::ordinal(buf)?;
    st.gpus
        .usable(ord)
        .then_some((ord, count as usize * elem.size()))
}

/// A host copy of a device buffer that [`p2p_stage`] stages (`None` otherwise): with the
/// device contents for a send (`download`), zeroed for a receive.
unsafe fn stage(
    st: &mut State,
    op: &str,
    buf: *const c_void,
    dt: MPI_Datatype,
    count: c_int,
    download: bool,
) -> Option<crate::gpu::Shadow> {
    let (ord, bytes) = p2p_stage(st, buf, dt, count)?;
    match crate::gpu::Shadow::new(&mut st.gpus, ord, buf, bytes, download) {
        Ok(sh) => Some(sh),
        Err(e) => fatal(&format!("{op}: staging a device buffer: {e}")),
    }
}

/// Copy what a staged receive delivered (the status's byte count) to the device.
unsafe fn unstage_recv(st: &mut State, op: &str, sh: &crate::gpu::Shadow, status: &MPI_Status) {
    let mut n: c_int = 0;
    PMPI_Get_count(status, ffi::byte(), &mut n);
    if n > 0 {
        if let Err(e) = sh.upload(&mut st.gpus, n as usize) {
            fatal(&format!(
                "{op}: copying a staged receive to the device: {e}"
            ));
        }
    }
}

/// Whether a send of `count` elements to `dest` with `tag` is compressed; the element kind.
fn p2p_send_eligible(
    st: &mut State,
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> Result<Elem, &'static str> {
    if !st.settings.p2p {
        return Err("ZCOMM_P2P=off");
    }
    // a message that is never compressed gains nothing from zcomm's protocol (descriptor,
    // verdict, copies): MPI moves it directly
    if st.settings.policy == zcomm::model::Policy::Never {
        return Err("ZCOMM_POLICY=never");
    }
    if dest == ffi::proc_null() {
        return Err("MPI_PROC_NULL");
    }
    if !(0..MAX_USER_TAG).contains(&tag) {
        return Err("tag outside 0..4096");
    }
    let elem = eligible(st, dt, count, &[buf])?;
    let (rank, size) = comm_rank_size(comm);
    if dest == rank || dest < 0 || dest >= size {
        return Err("send to self");
    }
    if p2p_zc(st, comm).is_none() {
        return Err("no zcomm communicator yet (no collective on it)");
    }
    Ok(elem)
}

/// Start a compressed send: the marker (its request returned) and zcomm's isend.
unsafe fn start_send(
    st: &mut State,
    elem: Elem,
    buf: *const c_void,
    count: c_int,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> (MPI_Request, SendRequest) {
    let mut mreq = ffi::request_null();
    let _inside = Inside::enter();
    PMPI_Isend(
        (&MARKER as *const u8).cast(),
        1,
        ffi::byte(),
        dest,
        tag,
        comm,
        &mut mreq,
    );
    let zc = p2p_zc(st, comm).expect("checked by p2p_send_eligible");
    let r = dispatch!(elem, T => {
        // SAFETY: the send buffer holds `count` elements of the datatype
        zc.isend(slice::<T>(buf, count as usize), dest as usize, tag)
    });
    match r {
        Ok(z) => (mreq, z),
        Err(e) => fatal(&format!("MPI_Send/MPI_Isend: {e}")),
    }
}

/// Complete a compressed send: wait for the receiver's verdict (completing this rank's pending
/// receives meanwhile, so that two ranks waiting for each other's verdicts both progress), then
/// the marker.
unsafe fn finish_send(
    st: &mut State,
    op: &str,
    comm: usize,
    zreq: SendRequest,
    dest: usize,
    tag: i32,
    mut mreq: MPI_Request,
) {
    let _inside = Inside::enter();
    loop {
        let arrived = {
            let zc =
                p2p_zc(st, MPI_Comm::from_addr(comm)).expect("entry lives while a send is pending");
            zc.transport().iprobe(dest, TAG_VERDICT + tag)
        };
        match arrived {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => fatal_error(op, &e),
        }
        progress_recvs(st);
        std::thread::yield_now();
    }
    let zc = p2p_zc(st, MPI_Comm::from_addr(comm)).expect("entry lives while a send is pending");
    let r = zc.wait_send(zreq);
    PMPI_Wait(&mut mreq, ffi::status_ignore());
    record(st, op, r);
}

/// Fetch the compressed message a marker announced (source and tag in `status`) into the
/// receive buffer and fix the status. Earlier pending receives are fetched first (MPI's order).
unsafe fn fetch(
    st: &mut State,
    op: &str,
    comm: MPI_Comm,
    elem: Elem,
    dt: MPI_Datatype,
    buf: *mut c_void,
    count: c_int,
    status: &mut MPI_Status,
) {
    let _inside = Inside::enter();
    let (src, tag) = (status.MPI_SOURCE as usize, status.MPI_TAG);
    let Some(zc) = p2p_zc(st, comm) else {
        fatal(&format!(
            "{op}: a compressed message arrived on a communicator this rank has no zcomm state for (or opted out): the ranks disagree on ZCOMM_P2P or the communicator's zcomm setting"
        ));
    };
    let r = dispatch!(elem, T => {
        // SAFETY: the receive buffer holds `count` elements of the datatype; the message lands
        // in its front (a longer one is an error)
        match zc.recv_upto::<T>(slice_mut::<T>(buf, count.max(0) as usize), src, tag) {
            Ok((n, s)) => {
                PMPI_Status_set_elements(status, dt, n as c_int);
                Ok(s)
            }
            Err(e) => Err(e),
        }
    });
    status.MPI_ERROR = 0;
    record(st, op, r);
}

/// Whether a completed receive's status describes a marker.
unsafe fn is_marker(status: &MPI_Status) -> bool {
    let mut n: c_int = 0;
    PMPI_Get_count(status, ffi::byte(), &mut n);
    n == 1
}

/// Fetch the compressed messages of every pending receive whose marker has arrived (in posting
/// order, which is MPI's matching order).
unsafe fn progress_recvs(st: &mut State) {
    let mut recvs = std::mem::take(&mut st.pending.recvs);
    for p in recvs.iter_mut().filter(|p| p.done.is_none()) {
        let mut flag: c_int = 0;
        let mut s = ffi::empty_status();
        PMPI_Request_get_status(MPI_Request::from_addr(p.req), &mut flag, &mut s);
        if flag != 0 && is_marker(&s) {
            fetch(
                st,
                "MPI_Irecv",
                MPI_Comm::from_addr(p.comm),
                p.elem,
                MPI_Datatype::from_addr(p.dt),
                p.buf as *mut c_void,
                p.count,
                &mut s,
            );
            p.done = Some(s);
        }
    }
    // receives posted meanwhile (none: the lock is held) would go after these
    recvs.append(&mut st.pending.recvs);
    st.pending.recvs = recvs;
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Send(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    if inside() {
        return PMPI_Send(buf, count, dt, dest, tag, comm);
    }
    guarded("MPI_Send", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Send(buf, count, dt, dest, tag, comm);
        };
        // a staged device buffer is sent from its host copy (compressed or not)
        let shadow = stage(st, "MPI_Send", buf, dt, count, true);
        let buf = shadow.as_ref().map_or(buf, |sh| sh.as_ptr());
        match p2p_send_eligible(st, buf, count, dt, dest, tag, comm) {
            Err(r) => {
                note_device(st, r);
                st.report.op("MPI_Send").pass(r);
                drop(g);
                PMPI_Send(buf, count, dt, dest, tag, comm)
            }
            Ok(elem) => {
                let (m, z) = start_send(st, elem, buf, count, dest, tag, comm);
                finish_send(st, "MPI_Send", ffi::key(comm), z, dest as usize, tag, m);
                0
            }
        }
    })
}

/// Receive-side eligibility: an eligible datatype with point-to-point compression on (the size
/// does not matter: the sender decides; a marker is recognized by its length), in host memory
/// or in a device buffer staged through host memory (then its host copy is returned too).
unsafe fn p2p_recv_eligible(
    st: &mut State,
    op: &str,
    dt: MPI_Datatype,
    buf: *const c_void,
    count: c_int,
) -> Option<(Elem, Option<crate::gpu::Shadow>)> {
    if !st.settings.p2p {
        return None;
    }
    let e = ffi::classify(dt)?;
    if !device::is_device(buf) {
        return Some((e, None));
    }
    let sh = stage(st, op, buf, dt, count, false)?;
    Some((e, Some(sh)))
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    if inside() {
        return PMPI_Recv(buf, count, dt, src, tag, comm, status);
    }
    guarded("MPI_Recv", || {
        let (elem, mut shadow) = {
            let mut g = state::lock();
            match g
                .as_mut()
                .and_then(|st| p2p_recv_eligible(st, "MPI_Recv", dt, buf, count))
            {
                Some(e) => e,
                None => {
                    drop(g);
                    return PMPI_Recv(buf, count, dt, src, tag, comm, status);
                }
            }
        };
        let buf = shadow.as_mut().map_or(buf, |sh| sh.ptr());
        // the receive itself runs without the lock (another thread may be the sender)
        let mut s = ffi::empty_status();
        let rc = PMPI_Recv(buf, count, dt, src, tag, comm, &mut s);
        if rc == 0 && s.MPI_SOURCE != ffi::proc_null() && is_marker(&s) {
            let mut g = state::lock();
            let st = g.as_mut().expect("initialized");
            progress_recvs(st);
            fetch(st, "MPI_Recv", comm, elem, dt, buf, count, &mut s);
        } else if rc == 0 {
            let mut g = state::lock();
            if let Some(st) = g.as_mut() {
                st.report
                    .op("MPI_Recv")
                    .pass("not compressed by the sender");
            }
        }
        if let (Some(sh), 0) = (&shadow, rc) {
            let mut g = state::lock();
            let st = g.as_mut().expect("initialized");
            unstage_recv(st, "MPI_Recv", sh, &s);
        }
        if status != ffi::status_ignore() && !status.is_null() {
            *status = s;
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    macro_rules! pass {
        () => {
            PMPI_Sendrecv(
                sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source,
                recvtag, comm, status,
            )
        };
    }
    if inside() {
        return pass!();
    }
    guarded("MPI_Sendrecv", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return pass!();
        };
        let sshadow = stage(st, "MPI_Sendrecv", sendbuf, sendtype, sendcount, true);
        let sendbuf = sshadow.as_ref().map_or(sendbuf, |sh| sh.as_ptr());
        let send = p2p_send_eligible(st, sendbuf, sendcount, sendtype, dest, sendtag, comm);
        let (recv, mut rshadow) =
            match p2p_recv_eligible(st, "MPI_Sendrecv", recvtype, recvbuf, recvcount) {
                Some((e, sh)) => (Some(e), sh),
                None => (None, None),
            };
        let recvbuf = rshadow.as_mut().map_or(recvbuf, |sh| sh.ptr());
        if send.is_err() && recv.is_none() && sshadow.is_none() {
            let r = send.err().unwrap_or("datatype");
            note_device(st, r);
            st.report.op("MPI_Sendrecv").pass(r);
            drop(g);
            return pass!();
        }
        // send side: compressed (marker + zcomm) or a plain PMPI_Isend
        let mut sreq = ffi::request_null();
        let zsend = match send {
            Ok(elem) => {
                let (m, z) = start_send(st, elem, sendbuf, sendcount, dest, sendtag, comm);
                sreq = m;
                Some(z)
            }
            Err(r) => {
                st.report.op("MPI_Sendrecv").pass(r);
                let rc = PMPI_Isend(sendbuf, sendcount, sendtype, dest, sendtag, comm, &mut sreq);
                if rc != 0 {
                    return rc;
                }
                None
            }
        };
        // receive side
        let mut s = ffi::empty_status();
        let rc = PMPI_Recv(recvbuf, recvcount, recvtype, source, recvtag, comm, &mut s);
        if rc != 0 {
            return rc;
        }
        if let Some(elem) = recv {
            if s.MPI_SOURCE != ffi::proc_null() && is_marker(&s) {
                progress_recvs(st);
                fetch(
                    st,
                    "MPI_Sendrecv",
                    comm,
                    elem,
                    recvtype,
                    recvbuf,
                    recvcount,
                    &mut s,
                );
            }
        }
        if let Some(sh) = &rshadow {
            unstage_recv(st, "MPI_Sendrecv", sh, &s);
        }
        match zsend {
            Some(z) => finish_send(
                st,
                "MPI_Sendrecv",
                ffi::key(comm),
                z,
                dest as usize,
                sendtag,
                sreq,
            ),
            None => {
                drop(g);
                PMPI_Wait(&mut sreq, ffi::status_ignore());
            }
        }
        if status != ffi::status_ignore() && !status.is_null() {
            *status = s;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Isend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    if inside() {
        return PMPI_Isend(buf, count, dt, dest, tag, comm, request);
    }
    guarded("MPI_Isend", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Isend(buf, count, dt, dest, tag, comm, request);
        };
        // a staged device buffer is sent from its host copy: a compressed send compresses it
        // now (the copy is not needed afterwards), an uncompressed one keeps it until completion
        let shadow = stage(st, "MPI_Isend", buf, dt, count, true);
        let buf = shadow.as_ref().map_or(buf, |sh| sh.as_ptr());
        match p2p_send_eligible(st, buf, count, dt, dest, tag, comm) {
            Err(r) => {
                st.report.op("MPI_Isend").pass(r);
                note_device(st, r);
                let rc = PMPI_Isend(buf, count, dt, dest, tag, comm, request);
                if let (Some(copy), 0) = (shadow, rc) {
                    st.pending.staged.push(PStaged {
                        req: ffi::key(*request),
                        _copy: copy,
                    });
                }
                rc
            }
            Ok(elem) => {
                let (m, z) = start_send(st, elem, buf, count, dest, tag, comm);
                st.pending.sends.push(PSend {
                    req: ffi::key(m),
                    comm: ffi::key(comm),
                    zreq: z,
                    dest: dest as usize,
                    tag,
                });
                *request = m;
                0
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    src: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    if inside() {
        return PMPI_Irecv(buf, count, dt, src, tag, comm, request);
    }
    guarded("MPI_Irecv", || {
        let mut g = state::lock();
        let Some(st) = g.as_mut() else {
            drop(g);
            return PMPI_Irecv(buf, count, dt, src, tag, comm, request);
        };
        if src == ffi::proc_null() {
            return PMPI_Irecv(buf, count, dt, src, tag, comm, request);
        }
        let Some((elem, mut shadow)) = p2p_recv_eligible(st, "MPI_Irecv", dt, buf, count) else {
            return PMPI_Irecv(buf, count, dt, src, tag, comm, request);
        };
        let buf = shadow.as_mut().map_or(buf, |sh| sh.ptr());
        let rc = PMPI_Irecv(buf, count, dt, src, tag, comm, request);
        if rc == 0 {
            st.pending.recvs.push(PRecv {
                req: ffi::key(*request),
                buf: buf as usize,
                count,
                elem,
                dt: ffi::key(dt),
                comm: ffi::key(comm),
                done: None,
                shadow,
            });
        }
        rc
    })
}

/// Finish a tracked request that PMPI has completed (receive: fetch if it was a marker) or is
/// about to complete (compressed send). `status` receives the final status.
unsafe fn complete_tracked(st: &mut State, req: MPI_Request, status: &mut MPI_Status) -> c_int {
    let key = ffi::key(req);
    if let Some(i) = st.pending.staged.iter().position(|p| p.req == key) {
        let mut r = req;
        let rc = PMPI_Wait(&mut r, status);
        // the host copy is freed only now that MPI is done with it
        st.pending.staged.remove(i);
        return rc;
    }
    if let Some(i) = st.pending.sends.iter().position(|p| p.req == key) {
        let p = st.pending.sends.remove(i);
        finish_send(st, "MPI_Isend", p.comm, p.zreq, p.dest, p.tag, req);
        *status = ffi::empty_status();
        return 0;
    }
    let Some(i) = st.pending.recvs.iter().position(|p| p.req == key) else {
        return 0;
    };
    // the receives posted before this one are fetched first (MPI's matching order)
    progress_recvs(st);
    let p = st.pending.recvs.remove(i);
    let mut r = req;
    let rc = PMPI_Wait(&mut r, status);
    if let Some(s) = p.done {
        *status = s;
    } else if rc == 0 && status.MPI_SOURCE != ffi::proc_null() && is_marker(status) {
        fetch(
            st,
            "MPI_Irecv",
            MPI_Comm::from_addr(p.comm),
            p.elem,
            MPI_Datatype::from_addr(p.dt),
            p.buf as *mut c_void,
            p.count,
            status,
        );
    } else {
        st.report
            .op("MPI_Irecv")
            .pass("not compressed by the sender");
    }
    if let (Some(sh), 0) = (&p.shadow, rc) {
        unstage_recv(st, "MPI_Irecv", sh, status);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Wait(request: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
    if inside() || request.is_null() {
        return PMPI_Wait(request, status);
    }
    guarded("MPI_Wait", || {
        let mut g = state::lock();
        let tracked = g.as_ref().is_some_and(|st| st.pending.tracked(*request));
        if !tracked {
            drop(g);
            return PMPI_Wait(request, status);
        }
        let st = g.as_mut().expect("tracked implies initialized");
        let mut s = ffi::empty_status();
        let rc = complete_tracked(st, *request, &mut s);
        *request = ffi::request_null();
        if status != ffi::status_ignore() && !status.is_null() {
            *status = s;
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitall(
    count: c_int,
    requests: *mut MPI_Request,
    statuses: *mut MPI_Status,
) -> c_int {
    if inside() || count <= 0 {
        return PMPI_Waitall(count, requests, statuses);
    }
    guarded("MPI_Waitall", || {
        let mut g = state::lock();
        let any = g.as_ref().is_some_and(|st| {
            !st.pending.is_empty()
                && (0..count as usize).any(|i| st.pending.tracked(*requests.add(i)))
        });
        if !any {
            drop(g);
            return PMPI_Waitall(count, requests, statuses);
        }
        let st = g.as_mut().expect("initialized");
        let n = count as usize;
        // SAFETY: MPI_Waitall's contract: `count` requests and (unless ignored) statuses
        let reqs = std::slice::from_raw_parts_mut(requests, n);
        let ignore = statuses == RSMPI_STATUSES_IGNORE || statuses.is_null();
        let mut stats: Vec<MPI_Status> = (0..n).map(|_| ffi::empty_status()).collect();
        // 1. receives (tracked and untracked) and untracked sends, 2. compressed sends
        let mut rc = 0;
        for i in 0..n {
            let r = reqs[i];
            if r == ffi::request_null() {
                continue;
            }
            let is_send = st.pending.sends.iter().any(|p| p.req == ffi::key(r));
            if is_send {
                continue;
            }
            let c = if st.pending.tracked(r) {
                complete_tracked(st, r, &mut stats[i])
            } else {
                let mut rr = r;
                PMPI_Wait(&mut rr, &mut stats[i])
            };
            reqs[i] = ffi::request_null();
            if c != 0 {
                rc = c;
            }
        }
        for i in 0..n {
            let r = reqs[i];
            if r != ffi::request_null() {
                complete_tracked(st, r, &mut stats[i]);
                reqs[i] = ffi::request_null();
            }
        }
        if !ignore {
            std::ptr::copy_nonoverlapping(stats.as_ptr(), statuses, n);
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Test(
    request: *mut MPI_Request,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if inside() || request.is_null() {
        return PMPI_Test(request, flag, status);
    }
    guarded("MPI_Test", || {
        let mut g = state::lock();
        let tracked = g.as_ref().is_some_and(|st| st.pending.tracked(*request));
        if !tracked {
            drop(g);
            return PMPI_Test(request, flag, status);
        }
        let st = g.as_mut().expect("tracked implies initialized");
        let key = ffi::key(*request);
        // ready: a send whose verdict is there, a receive whose PMPI request completed
        let ready = if let Some(p) = st.pending.sends.iter().find(|p| p.req == key) {
            let (dest, tag, comm) = (p.dest, p.tag, p.comm);
            let _inside = Inside::enter();
            p2p_zc(st, MPI_Comm::from_addr(comm))
                .map(|zc| {
                    zc.transport()
                        .iprobe(dest, TAG_VERDICT + tag)
                        .unwrap_or(true)
                })
                .unwrap_or(true)
        } else {
            let mut f: c_int = 0;
            let mut s = ffi::empty_status();
            PMPI_Request_get_status(*request, &mut f, &mut s);
            f != 0
        };
        if !ready {
            progress_recvs(st);
            *flag = 0;
            return 0;
        }
        let mut s = ffi::empty_status();
        let rc = complete_tracked(st, *request, &mut s);
        *request = ffi::request_null();
        *flag = 1;
        if status != ffi::status_ignore() && !status.is_null() {
            *status = s;
        }
        rc
    })
}

/// Complete every tracked request of `requests` (blocking), so that the PMPI call that follows
/// sees only requests it can finish on its own (used by the `Waitany`/`Waitsome`/`Testall`/
/// `Testany`/`Testsome` wrappers: documented as completing tracked requests eagerly).
unsafe fn settle_tracked(
    count: c_int,
    requests: *mut MPI_Request,
    statuses: Option<*mut MPI_Status>,
) -> bool {
    if count <= 0 || requests.is_null() {
        return false;
    }
    let mut g = state::lock();
    let Some(st) = g.as_mut() else {
        return false;
    };
    if st.pending.is_empty() {
        return false;
    }
    let mut any = false;
    for i in 0..count as usize {
        let r = *requests.add(i);
        if st.pending.tracked(r) {
            let mut s = ffi::empty_status();
            complete_tracked(st, r, &mut s);
            *requests.add(i) = ffi::request_null();
            if let Some(p) = statuses {
                if p != RSMPI_STATUSES_IGNORE && !p.is_null() {
                    *p.add(i) = s;
                }
            }
            any = true;
        }
    }
    any
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitany(
    count: c_int,
    requests: *mut MPI_Request,
    index: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if inside() {
        return PMPI_Waitany(count, requests, index, status);
    }
    guarded("MPI_Waitany", || {
        // the first tracked request is completed and reported
        let first = {
            let g = state::lock();
            g.as_ref().and_then(|st| {
                (0..count.max(0) as usize).find(|&i| st.pending.tracked(*requests.add(i)))
            })
        };
        let Some(i) = first else {
            return PMPI_Waitany(count, requests, index, status);
        };
        let mut g = state::lock();
        let st = g.as_mut().expect("initialized");
        let mut s = ffi::empty_status();
        let rc = complete_tracked(st, *requests.add(i), &mut s);
        *requests.add(i) = ffi::request_null();
        *index = i as c_int;
        if status != ffi::status_ignore() && !status.is_null() {
            *status = s;
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitsome(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    if inside() {
        return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
    }
    guarded("MPI_Waitsome", || {
        // tracked requests first (all of them, reported as the completed ones)
        let tracked: Vec<usize> = {
            let g = state::lock();
            g.as_ref().map_or(Vec::new(), |st| {
                (0..incount.max(0) as usize)
                    .filter(|&i| st.pending.tracked(*requests.add(i)))
                    .collect()
            })
        };
        if tracked.is_empty() {
            return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
        }
        let mut g = state::lock();
        let st = g.as_mut().expect("initialized");
        for (k, &i) in tracked.iter().enumerate() {
            let mut s = ffi::empty_status();
            complete_tracked(st, *requests.add(i), &mut s);
            *requests.add(i) = ffi::request_null();
            *indices.add(k) = i as c_int;
            if statuses != RSMPI_STATUSES_IGNORE && !statuses.is_null() {
                *statuses.add(k) = s;
            }
        }
        *outcount = tracked.len() as c_int;
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testall(
    count: c_int,
    requests: *mut MPI_Request,
    flag: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    if inside() {
        return PMPI_Testall(count, requests, flag, statuses);
    }
    guarded("MPI_Testall", || {
        settle_tracked(count, requests, Some(statuses));
        // settled requests are MPI_REQUEST_NULL now: PMPI reports them complete with an empty
        // status, so save and restore their statuses
        let saved: Vec<MPI_Status> = if statuses != RSMPI_STATUSES_IGNORE && !statuses.is_null() {
            (0..count.max(0) as usize)
                .map(|i| *statuses.add(i))
                .collect()
        } else {
            Vec::new()
        };
        let nulls: Vec<bool> = (0..count.max(0) as usize)
            .map(|i| *requests.add(i) == ffi::request_null())
            .collect();
        let rc = PMPI_Testall(count, requests, flag, statuses);
        if !saved.is_empty() && *flag != 0 {
            for (i, null) in nulls.iter().enumerate() {
                if *null {
                    *statuses.add(i) = saved[i];
                }
            }
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testany(
    count: c_int,
    requests: *mut MPI_Request,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if inside() {
        return PMPI_Testany(count, requests, index, flag, status);
    }
    guarded("MPI_Testany", || {
        let first = {
            let g = state::lock();
            g.as_ref().and_then(|st| {
                (0..count.max(0) as usize).find(|&i| st.pending.tracked(*requests.add(i)))
            })
        };
        let Some(i) = first else {
            return PMPI_Testany(count, requests, index, flag, status);
        };
        let mut g = state::lock();
        let st = g.as_mut().expect("initialized");
        let mut s = ffi::empty_status();
        let rc = complete_tracked(st, *requests.add(i), &mut s);
        *requests.add(i) = ffi::request_null();
        *index = i as c_int;
        *flag = 1;
        if status != ffi::status_ignore() && !status.is_null() {
            *status = s;
        }
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testsome(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    if inside() {
        return PMPI_Testsome(incount, requests, outcount, indices, statuses);
    }
    // tracked requests complete (eagerly) like in MPI_Waitsome
    testsome_impl(incount, requests, outcount, indices, statuses)
}

/// `MPI_Testsome`: tracked requests are completed and reported; without any, PMPI_Testsome.
unsafe fn testsome_impl(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    let has = {
        let g = state::lock();
        g.as_ref().is_some_and(|st| {
            (0..incount.max(0) as usize).any(|i| st.pending.tracked(*requests.add(i)))
        })
    };
    if has {
        MPI_Waitsome(incount, requests, outcount, indices, statuses)
    } else {
        PMPI_Testsome(incount, requests, outcount, indices, statuses)
    }
}
