// zcomm utility kernels shared by the communication layers (comm::device, comm::nccl), compiled
// by NVRTC like every kernel here (--fmad=false, IEEE division; src/gpu/compile.rs).
//
// Entry points: zu_range_f32/f64(x, n, out) (out[0] = max order-preserving key, out[1] = max of
// the complemented key, over finite values; both 0 when there is none; src/gpu/mod.rs from_key
// decodes them; the words are raised with atomicMax, never cleared, so one pair accumulates the
// range of several buffers: gpu::DeviceRange), zu_range_sampled_f32/f64(x, n, stride, m, out)
// (the same over x[k * stride] for k < m and x[n - 1]: quant::sampled_range's positions) and
// zu_scale_f32/f64(x, n, d) (x[i] = x[i] / d, rounded to nearest like the host's v / d). Device
// helpers for kernels that include this file: zu_key, zu_finite, zu_wmax.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
__device__ __forceinline__ u64 zu_key(float x) {
    u32 b = __float_as_uint(x);
    return (u64)((b & 0x80000000u) ? ~b : (b | 0x80000000u));
}
__device__ __forceinline__ u64 zu_key(double x) {
    u64 b = (u64)__double_as_longlong(x);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ bool zu_finite(float x) { return ((__float_as_uint(x) >> 23) & 0xffu) != 0xffu; }
__device__ __forceinline__ bool zu_finite(double x) {
    return ((((u64)__double_as_longlong(x)) >> 52) & 0x7ffull) != 0x7ffull;
}
__device__ __forceinline__ u64 zu_wmax(u64 v) {
    for (int s = 16; s >= 1; s >>= 1) { u64 o = __shfl_xor_sync(0xffffffffu, v, s); v = o > v ? o : v; }
    return v;
}
// A thread's running keys hi (max key) and lo (max ~key) raised by v when it is finite.
template <typename T> __device__ __forceinline__ void zu_visit(T v, u64& hi, u64& lo) {
    if (zu_finite(v)) { u64 k = zu_key(v); hi = k > hi ? k : hi; lo = ~k > lo ? ~k : lo; }
}
// The warp's keys into out (out[0] = max key, out[1] = max ~key (min)); the whole warp calls it.
__device__ __forceinline__ void zu_fold(u64 hi, u64 lo, u64* out) {
    hi = zu_wmax(hi); lo = zu_wmax(lo);
    if ((threadIdx.x & 31) == 0) { if (hi) atomicMax(out, hi); if (lo) atomicMax(out + 1, lo); }
}
// out[0] = max key, out[1] = max ~key (min), over finite values.
template <typename T> __device__ void zu_range(const T* x, u64 n, u64* out) {
    u64 hi = 0, lo = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) zu_visit(x[i], hi, lo);
    zu_fold(hi, lo, out);
}
// zu_range over the m + 1 values x[k * stride] (k < m) and x[n - 1] (quant::sampled_range: a
// range for the first quantisations of a reduction without a pass over all of x; strided reads,
// one per thread, latency-bound and short).
template <typename T> __device__ void zu_range_sampled(const T* x, u64 n, u64 stride, u64 m, u64* out) {
    u64 hi = 0, lo = 0;
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k <= m; k += (u64)gridDim.x * blockDim.x)
        zu_visit(x[k < m ? k * stride : n - 1], hi, lo);
    zu_fold(hi, lo, out);
}
__device__ __forceinline__ float zu_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double zu_div(double a, double b) { return __ddiv_rn(a, b); }
template <typename T> __device__ void zu_scale(T* x, u64 n, T d) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) x[i] = zu_div(x[i], d);
}
extern "C" __global__ void zu_range_f32(const float* x, u64 n, u64* out) { zu_range<float>(x, n, out); }
extern "C" __global__ void zu_range_f64(const double* x, u64 n, u64* out) { zu_range<double>(x, n, out); }
extern "C" __global__ void zu_range_sampled_f32(const float* x, u64 n, u64 stride, u64 m, u64* out) {
    zu_range_sampled<float>(x, n, stride, m, out);
}
extern "C" __global__ void zu_range_sampled_f64(const double* x, u64 n, u64 stride, u64 m, u64* out) {
    zu_range_sampled<double>(x, n, stride, m, out);
}
extern "C" __global__ void zu_scale_f32(float* x, u64 n, float d) { zu_scale<float>(x, n, d); }
extern "C" __global__ void zu_scale_f64(double* x, u64 n, double d) { zu_scale<double>(x, n, d); }
