//! Fortran entry points (`mpif.h` and `use mpi`).
//!
//! Open MPI's Fortran bindings (`libmpi_mpifh`, also behind `use mpi`) call the C `PMPI_`
//! functions directly (checked for Open MPI 4.1: `mpi_allreduce_` calls `PMPI_Allreduce`,
//! `mpi_init_` calls `PMPI_Init`), so the C wrappers never see a Fortran call. This module
//! defines the Fortran symbols of the collectives the library compresses, with gfortran's (and
//! Intel Fortran's) name mangling (`mpi_allreduce_`): each converts the Fortran handles
//! (`MPI_*_f2c`) and the `MPI_IN_PLACE`/`MPI_BOTTOM` sentinels and calls the C wrapper, so the
//! same eligibility rules, bound and report apply.
//!
//! | Fortran routine | covered |
//! |---|---|
//! | `MPI_Init`, `MPI_Init_thread`, `MPI_Finalize`, `MPI_Comm_free`, `MPI_Comm_set_info` | set-up, clean-up, opt in/out |
//! | `MPI_Allreduce`, `MPI_Iallreduce`, `MPI_Reduce_scatter_block`, `MPI_Allgather`, `MPI_Bcast` | compressed as from C |
//! | everything else (point-to-point included), and all of `use mpi_f08` | the MPI library's own bindings (not compressed) |
//!
//! Fortran point-to-point calls are not wrapped: a message sent from C (compressed) and received
//! in Fortran would arrive as the one-byte marker, so a mixed-language program that does that
//! needs `ZCOMM_P2P=off`. `MPI_Wait`/`MPI_Test` on a Fortran `MPI_Iallreduce` request need no
//! wrapper (the request is a generalized request that completes by itself, see `progress`).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_void};
use std::ptr::addr_of;

use mpi::ffi::*;

use crate::wrappers as w;

/// Fortran `INTEGER` (a handle, a count, an error code).
type Fint = c_int;

extern "C" {
    /// The common block whose address is Fortran's `MPI_IN_PLACE` (Open MPI, gfortran mangling).
    static mpi_fortran_in_place_: c_int;
    /// The common block whose address is Fortran's `MPI_BOTTOM`.
    static mpi_fortran_bottom_: c_int;
}

/// A Fortran buffer argument as the C API wants it (the sentinels mapped).
fn buf(p: *const c_void) -> *const c_void {
    // only the addresses of the MPI library's sentinel objects are taken (never read)
    let (in_place, bottom) = (
        addr_of!(mpi_fortran_in_place_).cast::<c_void>(),
        addr_of!(mpi_fortran_bottom_).cast::<c_void>(),
    );
    if p == in_place {
        crate::ffi::IN_PLACE
    } else if p == bottom {
        std::ptr::null()
    } else {
        p
    }
}

unsafe fn set(ierr: *mut Fint, rc: c_int) {
    if !ierr.is_null() {
        *ierr = rc;
    }
}

#[no_mangle]
pub unsafe extern "C" fn mpi_init_(ierr: *mut Fint) {
    let mut argc: c_int = 0;
    let mut argv: *mut *mut c_char = std::ptr::null_mut();
    set(ierr, w::MPI_Init(&mut argc, &mut argv));
}

#[no_mangle]
pub unsafe extern "C" fn mpi_init_thread_(
    required: *const Fint,
    provided: *mut Fint,
    ierr: *mut Fint,
) {
    let mut argc: c_int = 0;
    let mut argv: *mut *mut c_char = std::ptr::null_mut();
    set(
        ierr,
        w::MPI_Init_thread(&mut argc, &mut argv, *required, provided),
    );
}

#[no_mangle]
pub unsafe extern "C" fn mpi_finalize_(ierr: *mut Fint) {
    set(ierr, w::MPI_Finalize());
}

#[no_mangle]
pub unsafe extern "C" fn mpi_comm_free_(comm: *mut Fint, ierr: *mut Fint) {
    let mut c = PMPI_Comm_f2c(*comm);
    let rc = w::MPI_Comm_free(&mut c);
    if rc == 0 {
        *comm = PMPI_Comm_c2f(c);
    }
    set(ierr, rc);
}

#[no_mangle]
pub unsafe extern "C" fn mpi_comm_set_info_(comm: *const Fint, info: *const Fint, ierr: *mut Fint) {
    set(
        ierr,
        w::MPI_Comm_set_info(PMPI_Comm_f2c(*comm), PMPI_Info_f2c(*info)),
    );
}

#[no_mangle]
pub unsafe extern "C" fn mpi_allreduce_(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: *const Fint,
    dt: *const Fint,
    op: *const Fint,
    comm: *const Fint,
    ierr: *mut Fint,
) {
    set(
        ierr,
        w::MPI_Allreduce(
            buf(sendbuf),
            buf(recvbuf).cast_mut(),
            *count,
            PMPI_Type_f2c(*dt),
            PMPI_Op_f2c(*op),
            PMPI_Comm_f2c(*comm),
        ),
    );
}

#[no_mangle]
pub unsafe extern "C" fn mpi_iallreduce_(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: *const Fint,
    dt: *const Fint,
    op: *const Fint,
    comm: *const Fint,
    request: *mut Fint,
    ierr: *mut Fint,
) {
    let mut r = crate::ffi::request_null();
    let rc = w::MPI_Iallreduce(
        buf(sendbuf),
        buf(recvbuf).cast_mut(),
        *count,
        PMPI_Type_f2c(*dt),
        PMPI_Op_f2c(*op),
        PMPI_Comm_f2c(*comm),
        &mut r,
    );
    if rc == 0 {
        *request = PMPI_Request_c2f(r);
    }
    set(ierr, rc);
}

#[no_mangle]
pub unsafe extern "C" fn mpi_reduce_scatter_block_(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: *const Fint,
    dt: *const Fint,
    op: *const Fint,
    comm: *const Fint,
    ierr: *mut Fint,
) {
    set(
        ierr,
        w::MPI_Reduce_scatter_block(
            buf(sendbuf),
            buf(recvbuf).cast_mut(),
            *recvcount,
            PMPI_Type_f2c(*dt),
            PMPI_Op_f2c(*op),
            PMPI_Comm_f2c(*comm),
        ),
    );
}

#[no_mangle]
pub unsafe extern "C" fn mpi_allgather_(
    sendbuf: *const c_void,
    sendcount: *const Fint,
    sendtype: *const Fint,
    recvbuf: *mut c_void,
    recvcount: *const Fint,
    recvtype: *const Fint,
    comm: *const Fint,
    ierr: *mut Fint,
) {
    set(
        ierr,
        w::MPI_Allgather(
            buf(sendbuf),
            *sendcount,
            PMPI_Type_f2c(*sendtype),
            buf(recvbuf).cast_mut(),
            *recvcount,
            PMPI_Type_f2c(*recvtype),
            PMPI_Comm_f2c(*comm),
        ),
    );
}

#[no_mangle]
pub unsafe extern "C" fn mpi_bcast_(
    buffer: *mut c_void,
    count: *const Fint,
    dt: *const Fint,
    root: *const Fint,
    comm: *const Fint,
    ierr: *mut Fint,
) {
    set(
        ierr,
        w::MPI_Bcast(
            buf(buffer).cast_mut(),
            *count,
            PMPI_Type_f2c(*dt),
            *root,
            PMPI_Comm_f2c(*comm),
        ),
    );
}
