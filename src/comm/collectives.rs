//! [`Collectives`]: one call shape for every communicator and every place a buffer lives.

use super::{CommElement, Communicator, OpStats};
use crate::error::Result;

/// One call shape for every communicator and every place a buffer lives.
///
/// `Collectives<B>` is the set of collectives that all zcomm communicators offer on buffers of
/// type `B`, with one signature:
///
/// | communicator | buffer `B` | carried by |
/// |---|---|---|
/// | [`Communicator`] | host slices `[E]` (`f32`, `f64`, `[f32; 2]`, `[f64; 2]`) | its transport (MPI or loopback) |
/// | [`StagedDevice`] (`comm.staged(&mut stager)`, feature `cuda`) | `CudaSlice<T>` (`f32`, `f64`) | the same transport, staged through pinned memory |
/// | [`NcclComm`](super::nccl::NcclComm) (feature `nccl`) | `CudaSlice<T>` (`f32`, `f64`) | NCCL |
///
/// Code written against the trait runs unchanged on all of them:
///
/// ```
/// use zcomm::comm::{Collectives, OpStats};
/// use zcomm::Result;
///
/// /// Averages a gradient in place over all ranks, whatever the communicator and buffer.
/// fn average<C, B>(comm: &mut C, grad: &B, scratch: &mut B) -> Result<OpStats>
/// where
///     C: Collectives<B>,
///     B: ?Sized,
/// {
///     comm.allreduce_mean(grad, scratch)
/// }
/// # use zcomm::comm::{transport::LoopbackTransport, Communicator, Config, CpuCompressor};
/// # use zcomm::ErrorBound;
/// # let t = LoopbackTransport::group(1).pop().unwrap();
/// # let mut c = Communicator::with_transport(
/// #     Box::new(t), Box::new(CpuCompressor), Config::new(ErrorBound::Noa(1e-3))).unwrap();
/// # let g = vec![1.0f32; 8];
/// # let mut out = vec![0.0f32; 8];
/// # average(&mut c, &g[..], &mut out[..]).unwrap();
/// # assert_eq!(out, g);
/// ```
///
/// Every implementation keeps the semantics of the communicator's own methods: the same
/// agreement before data (a mismatch is an error on every rank), the same end-to-end bound of
/// the reductions, identical results on every rank, and an [`OpStats`] per call. Operations that
/// only some communicators have (broadcast, point-to-point, the non-blocking forms) stay
/// inherent methods.
///
/// Collective: every rank calls the same operation in the same order.
pub trait Collectives<B: ?Sized> {
    /// Element-wise sum over all ranks into `out` (same length as `input`), within the
    /// communicator's end-to-end bound.
    fn allreduce(&mut self, input: &B, out: &mut B) -> Result<OpStats>;

    /// Element-wise mean over all ranks into `out` (same length as `input`), within the
    /// communicator's end-to-end bound.
    fn allreduce_mean(&mut self, input: &B, out: &mut B) -> Result<OpStats>;

    /// The sum of this rank's segment ([`partition`](super::partition)`(input.len(), size)`)
    /// into `out` (that segment's length).
    fn reduce_scatter(&mut self, input: &B, out: &mut B) -> Result<OpStats>;

    /// Every rank's `send` (the same length on all ranks) into `out`, in rank order
    /// (`out.len() == size * send.len()`).
    fn allgather(&mut self, send: &B, out: &mut B) -> Result<OpStats>;
}

impl<E: CommElement> Collectives<[E]> for Communicator {
    fn allreduce(&mut self, input: &[E], out: &mut [E]) -> Result<OpStats> {
        Communicator::allreduce(self, input, out)
    }
    fn allreduce_mean(&mut self, input: &[E], out: &mut [E]) -> Result<OpStats> {
        Communicator::allreduce_mean(self, input, out)
    }
    fn reduce_scatter(&mut self, input: &[E], out: &mut [E]) -> Result<OpStats> {
        Communicator::reduce_scatter(self, input, out)
    }
    fn allgather(&mut self, send: &[E], out: &mut [E]) -> Result<OpStats> {
        Communicator::allgather(self, send, out)
    }
}

#[cfg(feature = "cuda")]
pub use staged::StagedDevice;

#[cfg(feature = "cuda")]
mod staged {
    use cudarc::driver::CudaSlice;

    use super::Collectives;
    use crate::comm::{CommElement, Communicator, DeviceStager, OpStats, Real};
    use crate::error::Result;
    use crate::gpu::GpuElement;

    /// A [`Communicator`] with the [`DeviceStager`] that moves its device buffers
    /// ([`Communicator::staged`]): the host communicator's transport carries them, staged
    /// through pinned memory, with the GPU codec (see the `device` module docs).
    #[derive(Debug)]
    pub struct StagedDevice<'a> {
        comm: &'a mut Communicator,
        stager: &'a mut DeviceStager,
    }

    impl Communicator {
        /// This communicator over device buffers, staged by `stager`: the value implements
        /// [`Collectives`] on `CudaSlice<T>` with the same calls as on host slices.
        pub fn staged<'a>(&'a mut self, stager: &'a mut DeviceStager) -> StagedDevice<'a> {
            StagedDevice { comm: self, stager }
        }
    }

    impl StagedDevice<'_> {
        /// The host communicator underneath (rank, size, settings, host operations).
        pub fn comm(&mut self) -> &mut Communicator {
            self.comm
        }
        /// The stager (GPU codec, last stage times, profile).
        pub fn stager(&mut self) -> &mut DeviceStager {
            self.stager
        }
    }

    impl<T: GpuElement + Real + CommElement> Collectives<CudaSlice<T>> for StagedDevice<'_> {
        fn allreduce(&mut self, input: &CudaSlice<T>, out: &mut CudaSlice<T>) -> Result<OpStats> {
            let (x, mut y) = (input.as_view(), out.as_view_mut());
            self.comm.allreduce_device(self.stager, &x, &mut y)
        }
        fn allreduce_mean(
            &mut self,
            input: &CudaSlice<T>,
            out: &mut CudaSlice<T>,
        ) -> Result<OpStats> {
            let (x, mut y) = (input.as_view(), out.as_view_mut());
            self.comm.allreduce_mean_device(self.stager, &x, &mut y)
        }
        fn reduce_scatter(
            &mut self,
            input: &CudaSlice<T>,
            out: &mut CudaSlice<T>,
        ) -> Result<OpStats> {
            let (x, mut y) = (input.as_view(), out.as_view_mut());
            self.comm.reduce_scatter_device(self.stager, &x, &mut y)
        }
        fn allgather(&mut self, send: &CudaSlice<T>, out: &mut CudaSlice<T>) -> Result<OpStats> {
            let (x, mut y) = (send.as_view(), out.as_view_mut());
            self.comm.allgather_device(self.stager, &x, &mut y)
        }
    }
}

#[cfg(feature = "nccl")]
mod nccl {
    use cudarc::driver::CudaSlice;

    use super::Collectives;
    use crate::comm::nccl::{NcclComm, NcclReal};
    use crate::comm::OpStats;
    use crate::error::Result;

    impl<T: NcclReal> Collectives<CudaSlice<T>> for NcclComm {
        fn allreduce(&mut self, input: &CudaSlice<T>, out: &mut CudaSlice<T>) -> Result<OpStats> {
            NcclComm::allreduce(self, input, out)
        }
        fn allreduce_mean(
            &mut self,
            input: &CudaSlice<T>,
            out: &mut CudaSlice<T>,
        ) -> Result<OpStats> {
            NcclComm::allreduce_mean(self, input, out)
        }
        fn reduce_scatter(
            &mut self,
            input: &CudaSlice<T>,
            out: &mut CudaSlice<T>,
        ) -> Result<OpStats> {
            NcclComm::reduce_scatter(self, input, out)
        }
        fn allgather(&mut self, send: &CudaSlice<T>, out: &mut CudaSlice<T>) -> Result<OpStats> {
            NcclComm::allgather(self, send, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::transport::{run_ranks, LoopbackTransport};
    use crate::comm::{partition, Config, CpuCompressor};
    use crate::model::Policy;
    use crate::{CodecKind, ErrorBound};

    /// Runs every collective through the trait, generically, as user code would.
    fn all_four<C: Collectives<[f32]>>(c: &mut C, x: &[f32], p: usize, r: usize) -> Vec<Vec<f32>> {
        let n = x.len();
        let mut sum = vec![0.0; n];
        let mut mean = vec![0.0; n];
        let mut seg = vec![0.0; partition(n, p)[r].len()];
        let mut all = vec![0.0; n * p];
        c.allreduce(x, &mut sum).unwrap();
        c.allreduce_mean(x, &mut mean).unwrap();
        c.reduce_scatter(x, &mut seg).unwrap();
        c.allgather(x, &mut all).unwrap();
        vec![sum, mean, seg, all]
    }

    #[test]
    fn the_trait_gives_the_inherent_results_bit_for_bit() {
        let p = 3;
        let n = 1000;
        let cfg = Config::new(ErrorBound::Noa(1e-3)).with_policy(Policy::Always(CodecKind::Aatrox));
        /// The four results through the trait, and through the inherent methods.
        type Both = (Vec<Vec<f32>>, Vec<Vec<f32>>);
        let outs: Vec<Both> = run_ranks(LoopbackTransport::group(p), |t| {
            let mut c =
                Communicator::with_transport(Box::new(t), Box::new(CpuCompressor), cfg.clone())
                    .unwrap();
            let r = c.rank();
            let x: Vec<f32> = (0..n).map(|i| ((i + 7 * r) as f32 * 0.01).sin()).collect();
            let via_trait = all_four(&mut c, &x, p, r);
            let mut sum = vec![0.0; n];
            let mut mean = vec![0.0; n];
            let mut seg = vec![0.0; partition(n, p)[r].len()];
            let mut all = vec![0.0; n * p];
            c.allreduce(&x, &mut sum).unwrap();
            c.allreduce_mean(&x, &mut mean).unwrap();
            c.reduce_scatter(&x, &mut seg).unwrap();
            c.allgather(&x, &mut all).unwrap();
            (via_trait, vec![sum, mean, seg, all])
        })
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        for (via_trait, inherent) in &outs {
            for (a, b) in via_trait.iter().zip(inherent) {
                assert_eq!(a.len(), b.len());
                assert!(a.iter().zip(b).all(|(u, v)| u.to_bits() == v.to_bits()));
            }
        }
        // every rank holds the same values
        assert!(outs.windows(2).all(|w| w[0].0[0] == w[1].0[0]));
    }
}
