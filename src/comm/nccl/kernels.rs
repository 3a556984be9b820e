//! Small utility kernels of the NCCL transport (value range, max error, scaling, a synthetic
//! Gaussian random field): `kernels/nccl_util.cu`, compiled through [`crate::gpu::compile`].
//!
//! The codec kernels themselves (compression, decompression and the fused
//! decompress-and-accumulate) live in `kernels/blocked.cu` and are launched through
//! [`crate::gpu`].

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};

use crate::error::{Error, Result};

use super::{gpu_err, NcclReal};

/// The loaded utility kernels.
pub(crate) struct Utils {
    rs: crate::gpu::util::RangeScale,
    maxdiff: [CudaFunction; 2],
    field: [CudaFunction; 2],
}

fn idx<T: NcclReal>() -> usize {
    usize::from(T::SIZE == 8)
}

impl Utils {
    /// Compile (or take from the cache) and load the kernels on `stream`'s context.
    pub(crate) fn load(stream: &Arc<CudaStream>) -> Result<Self> {
        let (m, blocks) =
            crate::gpu::util::compile_and_load(stream, crate::gpu::compile::Module::NcclUtil)?;
        let f = |n: &str| m.load_function(n).map_err(gpu_err);
        Ok(Utils {
            rs: crate::gpu::util::RangeScale::from_module(&m, blocks)?,
            maxdiff: [f("zn_maxdiff_f32")?, f("zn_maxdiff_f64")?],
            field: [f("zn_field_f32")?, f("zn_field_f64")?],
        })
    }

    fn cfg(&self, n: usize) -> LaunchConfig {
        self.rs.cfg(n)
    }

    /// Smallest and largest finite values (None when there is none). Synchronizes `stream`.
    pub(crate) fn range<T: NcclReal>(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        self.rs.range(stream, x)
    }

    /// [`range`](Utils::range) of a deterministic sample ([`crate::quant::sampled_range`]).
    /// Synchronizes `stream`.
    pub(crate) fn sampled_range<T: NcclReal>(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, T>,
    ) -> Result<Option<(f64, f64)>> {
        self.rs.sampled(stream, x)
    }

    /// `max |a_i - b_i|` (computed in f64; infinite when exactly one side is not finite).
    pub(crate) fn max_abs_diff<T: NcclReal>(
        &self,
        stream: &Arc<CudaStream>,
        a: &CudaView<'_, T>,
        b: &CudaView<'_, T>,
    ) -> Result<f64> {
        if a.len() != b.len() {
            return Err(Error::invalid(format!(
                "max_abs_diff: lengths {} and {} differ",
                a.len(),
                b.len()
            )));
        }
        let n = a.len();
        if n == 0 {
            return Ok(0.0);
        }
        let mut out = stream.alloc_zeros::<u64>(1).map_err(gpu_err)?;
        let n64 = n as u64;
        let mut l = stream.launch_builder(&self.maxdiff[idx::<T>()]);
        l.arg(a).arg(b).arg(&n64).arg(&mut out);
        // SAFETY: reads n values of a and b, writes one u64.
        unsafe { l.launch(self.cfg(n)) }.map_err(gpu_err)?;
        let h = stream.clone_dtoh(&out).map_err(gpu_err)?;
        Ok(f64::from_bits(h[0]))
    }

    /// `x_i = x_i / d` (IEEE division, rounded to nearest).
    pub(crate) fn scale<T: NcclReal>(
        &self,
        stream: &Arc<CudaStream>,
        x: &mut CudaViewMut<'_, T>,
        d: T,
    ) -> Result<()> {
        self.rs.scale(stream, x, d)
    }

    /// Fill `x` with a Gaussian random field (see [`super::NcclComm::gaussian_field`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn field<T: NcclReal>(
        &self,
        stream: &Arc<CudaStream>,
        x: &mut CudaSlice<T>,
        nx: u64,
        ny: u64,
        corr_len: f64,
        noise: f32,
        seed: u64,
    ) -> Result<()> {
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        const M: usize = 24;
        let mut rng = SplitMix(seed ^ 0x5EED_F1E1D);
        let mut k = Vec::with_capacity(3 * M);
        let mut ph = Vec::with_capacity(M);
        for _ in 0..M {
            for _ in 0..3 {
                k.push((rng.normal() / corr_len) as f32);
            }
            ph.push((rng.uniform() * std::f64::consts::TAU) as f32);
        }
        let kd = stream.clone_htod(&k).map_err(gpu_err)?;
        let pd = stream.clone_htod(&ph).map_err(gpu_err)?;
        let (n64, m) = (n as u64, M as i32);
        let amp = (2.0f32 / M as f32).sqrt();
        let s32 = (seed ^ (seed >> 32)) as u32;
        let mut l = stream.launch_builder(&self.field[idx::<T>()]);
        l.arg(x)
            .arg(&n64)
            .arg(&nx)
            .arg(&ny)
            .arg(&kd)
            .arg(&pd)
            .arg(&m)
            .arg(&amp)
            .arg(&noise)
            .arg(&s32);
        // SAFETY: writes n values of x; reads 3M + M floats.
        unsafe { l.launch(self.cfg(n)) }.map_err(gpu_err)?;
        stream.synchronize().map_err(gpu_err)?;
        Ok(())
    }
}

/// SplitMix64 with Box–Muller normals (host side, for field parameters).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}
