//! `libzcomm_mpi.so`: compressed MPI communication for unmodified MPI programs, through the MPI
//! profiling interface (PMPI).
//!
//! ```sh
//! cargo build --release --workspace
//! ZCOMM_ERROR_BOUND=noa:1e-4 mpirun -n 4 -x LD_PRELOAD=$PWD/target/release/libzcomm_mpi.so ./app
//! srun --export=ALL,LD_PRELOAD=$PWD/target/release/libzcomm_mpi.so,ZCOMM_ERROR_BOUND=abs:1e-3 ./app
//! ```
//!
//! The library defines `MPI_Allreduce`, `MPI_Send`, ... ahead of the MPI library (`LD_PRELOAD`),
//! decides per call whether zcomm handles it, and otherwise calls the `PMPI_` entry point with the
//! caller's arguments unchanged (bit for bit the same result as without the library).
//!
//! # What is intercepted
//!
//! | MPI function | zcomm operation | eligible when |
//! |---|---|---|
//! | `MPI_Allreduce` (also `MPI_IN_PLACE`) | `allreduce` (ring, end-to-end bound) | `MPI_SUM`, bound not `rel` |
//! | `MPI_Iallreduce` (also `MPI_IN_PLACE`) | `allreduce` on a progress thread | as `MPI_Allreduce`, and `MPI_THREAD_MULTIPLE` (see below) |
//! | `MPI_Reduce_scatter_block` (also in place) | `reduce_scatter` | `MPI_SUM`, bound not `rel` |
//! | `MPI_Allgather` (also in place) | `allgather` | same type and count on both sides |
//! | `MPI_Bcast` | `bcast` | |
//! | `MPI_Send`, `MPI_Recv`, `MPI_Sendrecv` | `isend` / `recv_vec` | tag in `0..4096`, not to self |
//! | `MPI_Isend`, `MPI_Irecv` + `MPI_Wait`, `MPI_Waitall`, `MPI_Test`, ... | as above | as above |
//!
//! for the datatypes `MPI_FLOAT`, `MPI_DOUBLE`, `MPI_C_FLOAT_COMPLEX` (= `MPI_C_COMPLEX`),
//! `MPI_C_DOUBLE_COMPLEX` and their Fortran twins (`MPI_REAL`, `MPI_DOUBLE_PRECISION`,
//! `MPI_REAL4`, `MPI_REAL8`, `MPI_COMPLEX`, `MPI_DOUBLE_COMPLEX`, `MPI_COMPLEX8`,
//! `MPI_COMPLEX16`), on buffers of at least `ZCOMM_MIN_BYTES` bytes per rank, on
//! intra-communicators that are not opted out. Everything else (other datatypes, derived
//! datatypes, other operations, small messages, inter-communicators) goes to PMPI unchanged.
//! Every decision is counted in the report.
//!
//! CUDA device (and managed) buffers of the blocking collectives are compressed on their GPU
//! and staged through host memory ([`gpu`]; `ZCOMM_DEVICE=pass` hands them to a CUDA-aware MPI
//! instead); every rank agrees on the placement first, and a host/device mix across ranks
//! passes through. Point-to-point device buffers are staged through a host copy (the host
//! path then compresses it; see [`gpu::Shadow`]); `MPI_Iallreduce` passes device buffers
//! through.
//!
//! # Point-to-point: the marker
//!
//! A compressed message travels on zcomm's private duplicate of the communicator, but its place
//! in MPI's matching order is kept on the application's communicator: the sender first sends a
//! one-byte *marker* with the same tag there. A receiver posts its receive (or `MPI_Irecv`) as
//! usual with PMPI; when what arrives is one byte (no message of the eligible datatypes is one
//! byte long) it is a marker, and the receiver fetches the compressed message from the marker's
//! source and tag through zcomm, then fixes the status (source, tag, element count). So
//! wildcards (`MPI_ANY_SOURCE`, `MPI_ANY_TAG`), message order and mixing compressed and raw
//! messages work. Known gaps: `MPI_Probe`/`MPI_Iprobe`/`MPI_Mprobe` see the marker (a program
//! that sizes its buffer with `MPI_Probe` + `MPI_Get_count` must run with `ZCOMM_P2P=off`), and
//! persistent requests (`MPI_Send_init`, `MPI_Recv_init`) and `MPI_Sendrecv_replace` are passed
//! through (their receives must not be the target of compressed sends: `ZCOMM_P2P=off`).
//!
//! zcomm's send completes after the receiver's verdict (a small message back), so a compressed
//! `MPI_Send`/`MPI_Isend` completion waits for the receiver; while it waits, the library
//! completes this rank's pending compressed receives (posted with `MPI_Irecv`) whose markers
//! have arrived, so the usual exchange patterns (`Isend`/`Irecv`/`Waitall`, `Irecv`/`Send`/
//! `Wait`) do not deadlock. `MPI_Isend` compresses and posts eagerly; `MPI_Irecv` posts the
//! PMPI receive at once and fetches a compressed payload when the request completes (in
//! `MPI_Wait*`/`MPI_Test*`).
//!
//! # Non-blocking collectives
//!
//! A compressed `MPI_Iallreduce` runs the blocking zcomm allreduce on a progress thread of the
//! library's own, one per communicator, over a second private duplicate of the communicator;
//! the thread runs the communicator's operations in the order they were issued (the same on
//! every rank). The input is copied at the call; the result is written into the receive buffer
//! by the thread. The program gets an MPI *generalized request* (`MPI_Grequest_start`) that the
//! thread completes after the result is in place, so `MPI_Wait`, repeated `MPI_Test`,
//! `MPI_Waitall`/`MPI_Testall`/`MPI_Waitany`/... and any mix with other requests behave as with
//! the MPI library's own requests (the status is empty, as for a collective). The thread calls
//! MPI while the program does, so with `ZCOMM_NONBLOCKING=on` (the default) `MPI_Init` and
//! `MPI_Init_thread` ask the MPI library for `MPI_THREAD_MULTIPLE` (`MPI_Init_thread` tells the
//! program the level it asked for, or less when MPI provides less, and so does
//! `MPI_Query_thread`); when a rank does not get it,
//! or with `ZCOMM_NONBLOCKING=off` (which leaves `MPI_Init` alone), `MPI_Iallreduce` passes
//! through. A failure on the thread ends the job (`MPI_Abort`) at once.
//!
//! # Fortran and mpi4py
//!
//! Open MPI's Fortran bindings call the C `PMPI_` functions directly, so the library also
//! defines the Fortran symbols (`mpi_init_`, `mpi_init_thread_`, `mpi_finalize_`,
//! `mpi_comm_free_`, `mpi_comm_set_info_`, `mpi_allreduce_`, `mpi_iallreduce_`,
//! `mpi_reduce_scatter_block_`, `mpi_allgather_`, `mpi_bcast_`; gfortran/Intel mangling) for
//! `mpif.h` and `use mpi` programs: they convert the handles and the `MPI_IN_PLACE`/`MPI_BOTTOM`
//! sentinels and call the C wrappers. Fortran point-to-point calls and all of `use mpi_f08`
//! use the MPI library's own bindings (not compressed). mpi4py's buffer methods (`Allreduce`,
//! `Iallreduce`, `Allgather`, `Bcast`, `Reduce_scatter_block`, `Send`/`Recv`/`Sendrecv`,
//! `Isend`/`Irecv` on numpy arrays) call the C symbols and are covered; its lower-case pickle
//! methods move bytes and pass through.
//!
//! # Collectives and communicators
//!
//! Each communicator gets its zcomm `Communicator` (over `MpiTransport`, a private duplicate) at
//! the first eligible collective on it, which every rank calls at the same point;
//! `MPI_COMM_WORLD`'s is made in `MPI_Init` (point-to-point messages need it on both ends). It
//! is freed in `MPI_Comm_free` and `MPI_Finalize`. The settings are checked to be identical on
//! every rank in `MPI_Init` (so every rank takes the same path in every collective).
//!
//! Opt a communicator in or out with the info key `zcomm` (`on`/`off`) through
//! `MPI_Comm_set_info` (collective, before the first collective on it), or all but
//! `MPI_COMM_WORLD` with `ZCOMM_COMMS=world`.
//!
//! # Errors
//!
//! Invalid settings: every rank prints one line naming the variable and the job ends with
//! `MPI_Abort`. A failure inside zcomm (a corrupt stream, ranks that disagree on an operation)
//! prints the error and calls `MPI_Abort` on `MPI_COMM_WORLD`: the job ends, it never continues
//! with wrong data. Panics never cross the C boundary (caught, reported, `MPI_Abort`).
//!
//! The test suite damages a compressed message on the wire with a test hook
//! (`ZCOMM_TEST_CORRUPT`, only in builds with the `test-hooks` feature, see [`hooks`]) and checks
//! that the receiver's checksum error ends the job.
//!
//! # Threads
//!
//! zcomm's own MPI calls (made while an intercepted call runs) are recognized with a
//! thread-local flag and go straight to PMPI (the progress threads set it for their lifetime).
//! Intercepted calls of several application threads (`MPI_THREAD_MULTIPLE`) are serialized by
//! one lock; the progress threads never take it.

#![warn(missing_docs)]

pub mod device;
mod ffi;
mod fortran;
pub mod gpu;
pub mod hooks;
mod progress;
pub mod report;
pub mod settings;
mod state;
mod wrappers;

pub use wrappers::*;
