//! Compressed communication over MPI (and NCCL).
