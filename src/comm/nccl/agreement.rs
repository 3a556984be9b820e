//! The agreement before data over NCCL: the communicator's one descriptor format and checks
//! ([`crate::comm`]'s 80-byte "ZCD1" record, gathered over the bootstrap transport), with the
//! point-to-point pairing NCCL's `send`/`recv` need.

pub(super) use crate::comm::agreement::{check_table, Desc, DESC_LEN};
pub(super) use crate::comm::{
    op_name, OP_ALLGATHER, OP_ALLREDUCE, OP_ALLREDUCE_MEAN, OP_RECV, OP_REDUCE_SCATTER, OP_SEND,
};
use crate::error::Result;

/// Check a send's descriptor against its receive's, given in either order (same verdict on both
/// ends): the one pairing rule of every transport.
pub(super) fn check_pair(a: &Desc, b: &Desc) -> Result<()> {
    let (s, r) = if a.op == OP_SEND { (a, b) } else { (b, a) };
    crate::comm::agreement::check_pair(s, r)
}
