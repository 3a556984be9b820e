//! The state on a GPU (`--device gpu`): the gates as CUDA kernels (`kernels.cu`, bit-identical
//! to the CPU kernels of `sim.rs`), and the index-bit swaps as device pack → staged
//! [`Communicator::sendrecv_device`] (GPU compression, pinned staging, MPI) → device unpack.
//! Only the final state comes back to the host (for the fidelity and `--dump-state`).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use zcomm::comm::{CommElement, Communicator, DeviceStager, OpStats};
use zcomm::gpu::{compile, GpuCodec, GpuElement};
use zcomm::Element;
use zcomm::{Error, Result};

use crate::gates::{is_diagonal, C};
use crate::sim::{Amp, Kernel};

fn gpu_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e:?}"))
}

/// An amplitude type the device kernels handle (c64, c128): its scalar has a GPU codec, and its
/// name (`CommElement::NAME`) is the kernels' suffix.
pub trait DeviceAmp: Amp + CommElement<Scalar: GpuElement + CommElement> {}
impl DeviceAmp for [f32; 2] {}
impl DeviceAmp for [f64; 2] {}

/// One rank's sub-vector on its GPU, with the exchange buffers and the stager.
pub struct DeviceState<E: DeviceAmp> {
    stream: Arc<CudaStream>,
    apply: CudaFunction,
    scale: CudaFunction,
    pack: CudaFunction,
    unpack: CudaFunction,
    /// `2^local` amplitudes as interleaved scalars.
    v: CudaSlice<E::Scalar>,
    send: CudaSlice<E::Scalar>,
    recv: CudaSlice<E::Scalar>,
    /// GPU codec, pinned buffers and the device profile of the exchanges.
    pub stager: DeviceStager,
    /// The device's name (for the report).
    pub name: String,
}

impl<E: DeviceAmp> DeviceState<E> {
    /// Compile the kernels for GPU `ordinal` and allocate `2^local` amplitudes (plus two halves
    /// for the exchanges).
    pub fn new(ordinal: usize, local: usize) -> Result<Self> {
        let gpu = GpuCodec::new(ordinal)?;
        let name = gpu.device_name().to_string();
        let ctx = gpu.context().clone();
        let stream = gpu.stream().clone();
        let cubin = compile::compile_cubin(include_str!("kernels.cu"), &compile::arch_of(&ctx)?)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(gpu_err("load the simulator's kernels"))?;
        let f = |k: &str| {
            module
                .load_function(&format!("sv_{k}_{}", E::NAME))
                .map_err(gpu_err("kernel"))
        };
        let n = 2usize << local;
        let mut state = DeviceState {
            apply: f("apply")?,
            scale: f("scale")?,
            pack: f("pack")?,
            unpack: f("unpack")?,
            v: stream
                .alloc_zeros(n)
                .map_err(gpu_err("allocate the state"))?,
            send: stream
                .alloc_zeros(n / 2)
                .map_err(gpu_err("allocate the send half"))?,
            recv: stream
                .alloc_zeros(n / 2)
                .map_err(gpu_err("allocate the receive half"))?,
            stream,
            stager: DeviceStager::new(gpu),
            name,
        };
        // the exchange buffers (pinned host memory: slow to allocate) before the first swap
        state.stager.reserve::<E::Scalar>(n / 2)?;
        Ok(state)
    }

    fn grid(&self, n: u64) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, 132 * 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// |0…0⟩ on rank 0, zeros elsewhere.
    pub fn reset(&mut self, rank: usize) -> Result<()> {
        self.stream
            .memset_zeros(&mut self.v)
            .map_err(gpu_err("clear"))?;
        if rank == 0 {
            let one = [<E::Scalar as Element>::from_f64(1.0)];
            self.stream
                .memcpy_htod(&one, &mut self.v.slice_mut(0..1))
                .map_err(gpu_err("set |0>"))?;
        }
        Ok(())
    }

    /// Apply `k` on `rank` (the device twin of `sim::apply`).
    pub fn apply(&mut self, k: &Kernel, rank: usize, local: usize) -> Result<()> {
        let mut cmask = 0u64;
        for &c in &k.controls {
            if c >= local {
                if (rank >> (c - local)) & 1 == 0 {
                    return Ok(());
                }
            } else {
                cmask |= 1 << c;
            }
        }
        let n = 1u64 << local;
        if is_diagonal(&k.m) {
            let (d0, d1) = (k.m[0][0], k.m[1][1]);
            let (mask, want, t, d0, d1) = if k.target >= local {
                let d = if (rank >> (k.target - local)) & 1 == 1 {
                    d1
                } else {
                    d0
                };
                (cmask, cmask, 64u32, d, d)
            } else if d0 == C::ONE {
                let m = cmask | 1 << k.target;
                (m, m, k.target as u32, d0, d1)
            } else {
                (cmask, cmask, k.target as u32, d0, d1)
            };
            let cfg = self.grid(n);
            let mut b = self.stream.launch_builder(&self.scale);
            b.arg(&mut self.v)
                .arg(&n)
                .arg(&mask)
                .arg(&want)
                .arg(&t)
                .arg(&d0.re)
                .arg(&d0.im)
                .arg(&d1.re)
                .arg(&d1.im);
            // SAFETY: the arguments match `sv_scale_*` and `v` holds 2^local amplitudes
            unsafe { b.launch(cfg) }.map_err(gpu_err("sv_scale"))?;
            return Ok(());
        }
        let m = k.m;
        let (pairs, t) = (n / 2, k.target as u32);
        let cfg = self.grid(pairs);
        let mut b = self.stream.launch_builder(&self.apply);
        b.arg(&mut self.v).arg(&pairs).arg(&t).arg(&cmask);
        for row in &m {
            for e in row {
                b.arg(&e.re).arg(&e.im);
            }
        }
        // SAFETY: the arguments match `sv_apply_*` and `v` holds 2^local amplitudes
        unsafe { b.launch(cfg) }.map_err(gpu_err("sv_apply"))?;
        Ok(())
    }

    /// The index-bit swap of local bit `local_bit` (half `s` goes) with `partner`: pack, the
    /// staged exchange (compressed by the communicator's policy), unpack.
    pub fn swap(
        &mut self,
        c: &mut Communicator,
        local_bit: usize,
        s: usize,
        partner: usize,
        tag: i32,
    ) -> Result<OpStats> {
        let n_half = self.send.len() as u64 / 2;
        let (b, s) = (local_bit as u32, s as u64);
        let cfg = self.grid(n_half);
        let mut l = self.stream.launch_builder(&self.pack);
        l.arg(&self.v)
            .arg(&mut self.send)
            .arg(&n_half)
            .arg(&b)
            .arg(&s);
        // SAFETY: `sv_pack_*` over complex elements: `send` holds half of `v`
        unsafe { l.launch(cfg) }.map_err(gpu_err("sv_pack"))?;
        let stats = c.sendrecv_device(
            &mut self.stager,
            &self.send.as_view(),
            partner,
            &mut self.recv.as_view_mut(),
            partner,
            tag,
        )?;
        let mut l = self.stream.launch_builder(&self.unpack);
        l.arg(&mut self.v)
            .arg(&self.recv)
            .arg(&n_half)
            .arg(&b)
            .arg(&s);
        // SAFETY: as for the pack
        unsafe { l.launch(cfg) }.map_err(gpu_err("sv_unpack"))?;
        Ok(stats)
    }

    /// Σ|a|² of the half just sent (for `rel` bounds' error norm).
    pub fn sent_norm_sqr(&self) -> Result<f64> {
        let h = self
            .stream
            .clone_dtoh(&self.send)
            .map_err(gpu_err("copy the sent half"))?;
        Ok(h.iter().map(|x| Element::to_f64(*x).powi(2)).sum())
    }

    /// Wait for the queued kernels.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(gpu_err("synchronize"))
    }

    /// Copy the state into `out` (`2^local` amplitudes).
    pub fn download(&self, out: &mut [E]) -> Result<()> {
        self.stream
            .memcpy_dtoh(&self.v, E::scalars_mut(out))
            .map_err(gpu_err("copy the state to the host"))?;
        self.synchronize()
    }
}
