// zcomm NCCL transport utility kernels (src/comm/nccl/kernels.rs): the shared range and scaling
// kernels of util.cu, the largest absolute difference of two buffers and a synthetic Gaussian
// random field for benchmarks.
#include "util.cu"

// out[0] = max over i of the f64 bits of |a_i - b_i| (inf when exactly one side is not finite).
template <typename T> __device__ void zn_maxdiff(const T* a, const T* b, u64 n, u64* out) {
    u64 m = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        T x = a[i], y = b[i];
        bool fx = zu_finite(x), fy = zu_finite(y);
        double d;
        if (fx && fy) { d = __dsub_rn((double)x, (double)y); d = d < 0.0 ? -d : d; }
        else if (fx != fy) d = __longlong_as_double(0x7ff0000000000000ll);
        else d = 0.0;
        u64 k = (u64)__double_as_longlong(d);
        m = k > m ? k : m;
    }
    m = zu_wmax(m);
    if ((threadIdx.x & 31) == 0 && m) atomicMax(out, m);
}
// Gaussian random field on an nx * ny * (n / (nx ny)) grid: sum of `m` random Fourier modes
// (wave vectors k[3j..3j+3], phases ph[j]) scaled by sqrt(2/m), plus `noise` times a hashed
// uniform variate in [-1, 1).
template <typename T> __device__ void zn_field(T* x, u64 n, u64 nx, u64 ny, const float* k, const float* ph, int m,
                                               float amp, float noise, u32 seed) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float px = (float)(i % nx), py = (float)((i / nx) % ny), pz = (float)(i / (nx * ny));
        float s = 0.0f;
        for (int j = 0; j < m; j++) s += cosf(k[3 * j] * px + k[3 * j + 1] * py + k[3 * j + 2] * pz + ph[j]);
        u32 h = (u32)i * 0x9E3779B9u ^ (u32)(i >> 32) * 0x85EBCA6Bu ^ seed;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
        float u = (float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
        x[i] = (T)(amp * s + noise * u);
    }
}
extern "C" __global__ void zn_maxdiff_f32(const float* a, const float* b, u64 n, u64* out) { zn_maxdiff<float>(a, b, n, out); }
extern "C" __global__ void zn_maxdiff_f64(const double* a, const double* b, u64 n, u64* out) { zn_maxdiff<double>(a, b, n, out); }
extern "C" __global__ void zn_field_f32(float* x, u64 n, u64 nx, u64 ny, const float* k, const float* ph, int m, float amp, float noise, u32 seed) { zn_field<float>(x, n, nx, ny, k, ph, m, amp, noise, seed); }
extern "C" __global__ void zn_field_f64(double* x, u64 n, u64 nx, u64 ny, const float* k, const float* ph, int m, float amp, float noise, u32 seed) { zn_field<double>(x, n, nx, ny, k, ph, m, amp, noise, seed); }
