//! The non-blocking device reductions and exchange: staged to the host, run on the progress
//! thread, completed by [`Communicator::wait_device`].

use super::*;

/// A pending non-blocking device reduction or exchange run on the progress thread
/// ([`Communicator::iallreduce_device`], [`Communicator::iallreduce_mean_device`],
/// [`Communicator::ireduce_scatter_device`], [`Communicator::isendrecv_device`]): the input was
/// staged to the host when the call returned; finish with [`Communicator::wait_device`], which
/// copies the result to the device.
pub struct DeviceRequest<T> {
    pub(super) inner: OpRequest<Vec<T>>,
    pub(super) in_bytes: usize,
    pub(super) t0: f64,
    pub(super) d2h: f64,
}

impl<T> DeviceRequest<T> {
    /// Whether the operation has completed (never blocks).
    pub fn test(&mut self) -> Result<bool> {
        self.inner.test()
    }
}

impl<T> std::fmt::Debug for DeviceRequest<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceRequest({:?})", self.inner)
    }
}

impl Communicator {
    /// The model's staging hops of a composed operation added to the host operation's
    /// prediction: a D2H of `in_bytes` before and an H2D of `out_bytes` after.
    pub(super) fn add_staging(
        &self,
        dev: &DeviceStager,
        mut st: OpStats,
        in_bytes: usize,
        out_bytes: usize,
    ) -> OpStats {
        let dp = dev.profile.clone().unwrap_or_else(Profile::staged_guess);
        let extra = dp.d2h_s(in_bytes as f64) + dp.h2d_s(out_bytes as f64);
        st.predicted_raw_s += extra;
        st.predicted_compressed_s += extra;
        st.predicted_s += extra;
        st
    }

    /// Stage `input` to the host and queue `f` on the progress thread (see the
    /// [`DeviceRequest`] docs). A staging failure fails the queued collective on every rank.
    pub(super) fn submit_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        what: &'static str,
        op: u8,
        f: impl FnOnce(&mut Communicator, Vec<T>) -> Result<(Vec<T>, OpStats)> + Send + 'static,
    ) -> Result<DeviceRequest<T>> {
        if !self.has_progress_thread() {
            return Err(Error::Unavailable(format!(
                "{what}: needs the progress thread (MPI_THREAD_MULTIPLE and Communicator::init)"
            )));
        }
        let t0 = self.wtime();
        let n = input.len();
        let t = now();
        let staged = stage_values(dev, input);
        let d2h = t.elapsed().as_secs_f64();
        let inner = match staged {
            Ok(host) => self.submit(what, move |c| f(c, host))?,
            Err(e) => {
                let msg = e.to_string();
                self.submit(what, move |c| {
                    let e = Error::Gpu(format!("{what}: staging failed: {msg}"));
                    Err(c.fail_reduction::<T>(op, n, e))
                })?
            }
        };
        Ok(DeviceRequest {
            inner,
            in_bytes: n * T::SIZE,
            t0,
            d2h,
        })
    }

    /// Non-blocking [`allreduce_device`](Self::allreduce_device): D2H of `input` now, the host
    /// [`iallreduce`](Self::iallreduce) algorithm on the progress thread (same bound), H2D in
    /// [`wait_device`](Self::wait_device). Collective, in issue order; [`Error::Unavailable`]
    /// without the progress thread. This (and the other non-blocking reductions) keeps the
    /// staged host path, not the blocking form's device ring.
    pub fn iallreduce_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
    ) -> Result<DeviceRequest<T>> {
        self.submit_allreduce_device(dev, input, false)
    }

    /// Non-blocking [`allreduce_mean_device`](Self::allreduce_mean_device) (see
    /// [`iallreduce_device`](Self::iallreduce_device)).
    pub fn iallreduce_mean_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
    ) -> Result<DeviceRequest<T>> {
        self.submit_allreduce_device(dev, input, true)
    }

    /// The host allreduce (sum, or `mean`) of [`iallreduce_device`](Self::iallreduce_device) /
    /// [`iallreduce_mean_device`](Self::iallreduce_mean_device) on the progress thread.
    pub(super) fn submit_allreduce_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
        mean: bool,
    ) -> Result<DeviceRequest<T>> {
        let (name, op) = if mean {
            ("iallreduce_mean_device", crate::comm::OP_ALLREDUCE_MEAN)
        } else {
            ("iallreduce_device", crate::comm::OP_ALLREDUCE)
        };
        let host_op: IntoOp<T> = if mean {
            Communicator::allreduce_mean
        } else {
            Communicator::allreduce
        };
        self.submit_device(dev, input, name, op, move |c, x| {
            run_into(c, host_op, &x, x.len())
        })
    }

    /// Non-blocking [`reduce_scatter_device`](Self::reduce_scatter_device) (see
    /// [`iallreduce_device`](Self::iallreduce_device)); `wait_device` writes this rank's
    /// segment.
    pub fn ireduce_scatter_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        input: &CudaView<'_, T>,
    ) -> Result<DeviceRequest<T>> {
        let seg = crate::comm::partition(input.len(), self.size())[self.rank()].len();
        self.submit_device(
            dev,
            input,
            "ireduce_scatter_device",
            crate::comm::OP_REDUCE_SCATTER,
            move |c, x| run_into(c, Communicator::reduce_scatter, &x, seg),
        )
    }

    /// Non-blocking exchange of device buffers: D2H of `send` now, the host
    /// [`isendrecv`](Self::isendrecv) on the progress thread (compressed on the wire with the
    /// communicator's [`Compressor`], e.g. a [`GpuCompressor`]; not the device chunk pipeline of
    /// [`sendrecv_device`](Self::sendrecv_device)), H2D of the `recv_len` received values in
    /// [`wait_device`](Self::wait_device). The peer must use `isendrecv_device` or
    /// `isendrecv`, in the same order relative to its other non-blocking operations.
    #[allow(clippy::too_many_arguments)]
    pub fn isendrecv_device<T: GpuElement + Real + crate::comm::CommElement>(
        &mut self,
        dev: &mut DeviceStager,
        send: &CudaView<'_, T>,
        dest: usize,
        recv_len: usize,
        src: usize,
        tag: i32,
    ) -> Result<DeviceRequest<T>> {
        Self::check_tag(tag)?;
        for r in [dest, src] {
            if r >= self.size() {
                return Err(Error::invalid(format!("rank {r} out of range")));
            }
        }
        if !self.has_progress_thread() {
            return Err(Error::Unavailable(
                "isendrecv_device: needs the progress thread (MPI_THREAD_MULTIPLE and Communicator::init)"
                    .into(),
            ));
        }
        let t0 = self.wtime();
        let t = now();
        // a staging failure sends nothing: the peer sees a count mismatch, both requests fail
        let (host, err) = match stage_values(dev, send) {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        let d2h = t.elapsed().as_secs_f64();
        let inner = self.submit("isendrecv_device", move |c| {
            let mut out = vec![T::default(); recv_len];
            let st = c.sendrecv(&host, dest, &mut out, src, tag)?;
            match err {
                Some(m) => Err(Error::Gpu(format!("isendrecv_device: staging failed: {m}"))),
                None => Ok((out, st)),
            }
        })?;
        Ok(DeviceRequest {
            inner,
            in_bytes: send.len() * T::SIZE,
            t0,
            d2h,
        })
    }

    /// Complete a [`DeviceRequest`]: wait for the host operation, then H2D of its result into
    /// `out` (which must have the result's length: the input's for the allreduces, this rank's
    /// segment for reduce-scatter, `recv_len` for `isendrecv_device`). The stats' predictions
    /// include the two staging copies; `measured_s` runs from the non-blocking call.
    pub fn wait_device<T: GpuElement + Real>(
        &mut self,
        dev: &mut DeviceStager,
        req: DeviceRequest<T>,
        out: &mut CudaViewMut<'_, T>,
    ) -> Result<OpStats> {
        let DeviceRequest {
            inner,
            in_bytes,
            t0,
            d2h,
        } = req;
        dev.last = StageTimes {
            d2h,
            ..Default::default()
        };
        let t = now();
        let (v, st) = inner.wait()?;
        dev.last.network = t.elapsed().as_secs_f64();
        if out.len() != v.len() {
            return Err(Error::invalid(format!(
                "wait_device: output has {} values, the result {}",
                out.len(),
                v.len()
            )));
        }
        let t = now();
        dev.copy_to_device(&crate::comm::element::scalar_bytes(&v), out)?;
        dev.last.h2d = t.elapsed().as_secs_f64();
        let st = self.add_staging(dev, st, in_bytes, v.len() * T::SIZE);
        Ok(self.finish(st, t0))
    }
}
