//! [`Transport`] over NCCL for host byte messages (staged through device memory).

use std::rc::Rc;

use super::Shared;

/// Host byte messages over an [`NcclComm`](super::NcclComm)'s NCCL communicator.
pub struct NcclTransport {
    sh: Rc<Shared>,
}

impl NcclTransport {
    pub(crate) fn new(sh: Rc<Shared>) -> Self {
        NcclTransport { sh }
    }
}
