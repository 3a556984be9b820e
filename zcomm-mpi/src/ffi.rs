//! MPI handles and the datatypes the library compresses (Open MPI's ABI: handles are pointers,
//! `MPI_IN_PLACE` is `(void *)1`).

use std::ffi::{c_int, c_void};

pub use mpi::ffi::{MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request, MPI_Status};

/// `MPI_IN_PLACE` (Open MPI).
pub const IN_PLACE: *const c_void = 1 as *const c_void;

/// The element kinds zcomm moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// `float`
    F32,
    /// `double`
    F64,
    /// `float _Complex`
    C32,
    /// `double _Complex`
    C64,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F64 | Elem::C32 => 8,
            Elem::C64 => 16,
        }
    }
}

/// The element kind of a predefined datatype, `None` for every other datatype (derived types
/// included: they are different handles).
pub fn classify(dt: MPI_Datatype) -> Option<Elem> {
    // SAFETY: only the addresses of the MPI library's predefined datatype objects are taken
    // (never read or written); the RSMPI_* constants are initialized statics of mpi-sys's shim.
    unsafe {
        use mpi::ffi::*;
        use std::ptr::addr_of_mut;
        let is = |p: *mut ompi_predefined_datatype_t| dt.0 == p.cast();
        if dt == RSMPI_FLOAT || is(addr_of_mut!(ompi_mpi_real)) || is(addr_of_mut!(ompi_mpi_real4))
        {
            Some(Elem::F32)
        } else if dt == RSMPI_DOUBLE
            || is(addr_of_mut!(ompi_mpi_dblprec))
            || is(addr_of_mut!(ompi_mpi_real8))
        {
            Some(Elem::F64)
        } else if dt == RSMPI_FLOAT_COMPLEX
            || is(addr_of_mut!(ompi_mpi_cplex))
            || is(addr_of_mut!(ompi_mpi_complex8))
        {
            Some(Elem::C32)
        } else if dt == RSMPI_DOUBLE_COMPLEX
            || is(addr_of_mut!(ompi_mpi_dblcplex))
            || is(addr_of_mut!(ompi_mpi_complex16))
        {
            Some(Elem::C64)
        } else {
            None
        }
    }
}

/// `MPI_COMM_WORLD`.
pub fn world() -> MPI_Comm {
    // SAFETY: reading an initialized constant of mpi-sys's shim.
    unsafe { mpi::ffi::RSMPI_COMM_WORLD }
}

/// `MPI_SUM`.
pub fn op_sum() -> MPI_Op {
    // SAFETY: as in `world`.
    unsafe { mpi::ffi::RSMPI_SUM }
}

/// `MPI_BYTE`-like one-byte type of the marker (`MPI_UINT8_T`).
pub fn byte() -> MPI_Datatype {
    // SAFETY: as in `world`.
    unsafe { mpi::ffi::RSMPI_UINT8_T }
}

/// `MPI_STATUS_IGNORE`.
pub fn status_ignore() -> *mut MPI_Status {
    // SAFETY: as in `world`.
    unsafe { mpi::ffi::RSMPI_STATUS_IGNORE }
}

/// `MPI_REQUEST_NULL`.
pub fn request_null() -> MPI_Request {
    // SAFETY: as in `world`.
    unsafe { mpi::ffi::RSMPI_REQUEST_NULL }
}

/// `MPI_PROC_NULL`.
pub fn proc_null() -> c_int {
    // SAFETY: as in `world`.
    unsafe { mpi::ffi::RSMPI_PROC_NULL }
}

/// A zeroed status.
pub fn empty_status() -> MPI_Status {
    MPI_Status {
        MPI_SOURCE: 0,
        MPI_TAG: 0,
        MPI_ERROR: 0,
        _cancelled: 0,
        _ucount: 0,
    }
}

/// A handle as a map key.
pub fn key<T: Handle>(h: T) -> usize {
    h.addr()
}

/// MPI handles (pointer newtypes in Open MPI) ↔ addresses.
pub trait Handle: Copy {
    /// The address.
    fn addr(self) -> usize;
    /// The handle at an address.
    fn from_addr(a: usize) -> Self;
}

macro_rules! handle {
    ($t:ty) => {
        impl Handle for $t {
            fn addr(self) -> usize {
                self.0 as usize
            }
            fn from_addr(a: usize) -> Self {
                Self(a as _)
            }
        }
    };
}
handle!(MPI_Comm);
handle!(MPI_Datatype);
handle!(MPI_Request);
