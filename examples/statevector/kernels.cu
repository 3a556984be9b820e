// The state-vector simulator's device kernels (NVRTC-compiled at run time by `gpu.rs`).
//
// Amplitudes are interleaved (re, im) of T = float (c64) or double (c128). Every product and sum
// is done in double with explicit round-to-nearest intrinsics, in the order of the CPU kernels
// (`sim.rs`: (m00*x + m01*y) with the complex product (a.re*b.re - a.im*b.im,
// a.re*b.im + a.im*b.re)), so that no multiply-add is contracted and the GPU writes the CPU's
// values bit for bit.

typedef unsigned long long u64;

struct cd {
    double re, im;
};

__device__ __forceinline__ cd cmul(cd a, cd b) {
    return {__dsub_rn(__dmul_rn(a.re, b.re), __dmul_rn(a.im, b.im)),
            __dadd_rn(__dmul_rn(a.re, b.im), __dmul_rn(a.im, b.re))};
}
__device__ __forceinline__ cd cadd(cd a, cd b) { return {__dadd_rn(a.re, b.re), __dadd_rn(a.im, b.im)}; }

template <typename T> __device__ __forceinline__ cd load(const T* v, u64 i) {
    return {(double)v[2 * i], (double)v[2 * i + 1]};
}
__device__ __forceinline__ void store(float* v, u64 i, cd c) {
    v[2 * i] = __double2float_rn(c.re);
    v[2 * i + 1] = __double2float_rn(c.im);
}
__device__ __forceinline__ void store(double* v, u64 i, cd c) {
    v[2 * i] = c.re;
    v[2 * i + 1] = c.im;
}

// A 2x2 gate on local target bit `t` where the local control bits `cmask` are all 1: one thread
// per pair (i0, i0 | 1 << t).
template <typename T>
__device__ void sv_apply(T* v, u64 pairs, unsigned t, u64 cmask, cd m00, cd m01, cd m10, cd m11) {
    const u64 low = (1ull << t) - 1ull;
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < pairs; k += (u64)gridDim.x * blockDim.x) {
        const u64 i0 = ((k & ~low) << 1) | (k & low);
        if ((i0 & cmask) != cmask) continue;
        const u64 i1 = i0 | (1ull << t);
        const cd x = load(v, i0), y = load(v, i1);
        store(v, i0, cadd(cmul(m00, x), cmul(m01, y)));
        store(v, i1, cadd(cmul(m10, x), cmul(m11, y)));
    }
}

// A diagonal gate: amplitude i with (i & mask) == want is multiplied by d1 when bit t of i is 1
// (t < 64) and by d0 otherwise (t = 64: always d0).
template <typename T>
__device__ void sv_scale(T* v, u64 n, u64 mask, u64 want, unsigned t, cd d0, cd d1) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        if ((i & mask) != want) continue;
        const cd d = (t < 64u && ((i >> t) & 1ull)) ? d1 : d0;
        store(v, i, cmul(d, load(v, i)));
    }
}

// Index-bit swap halves: the amplitudes whose local bit b is s, in order (pack), and back.
template <typename A>
__device__ void sv_pack(const A* v, A* out, u64 n_out, unsigned b, u64 s) {
    const u64 half = 1ull << b;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n_out; j += (u64)gridDim.x * blockDim.x)
        out[j] = v[((j >> b) << (b + 1)) + s * half + (j & (half - 1ull))];
}
template <typename A>
__device__ void sv_unpack(A* v, const A* in, u64 n_in, unsigned b, u64 s) {
    const u64 half = 1ull << b;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n_in; j += (u64)gridDim.x * blockDim.x)
        v[((j >> b) << (b + 1)) + s * half + (j & (half - 1ull))] = in[j];
}

#define SV_INST(T, A, N)                                                                                    \
    extern "C" __global__ void sv_apply_##N(T* v, u64 pairs, unsigned t, u64 cmask, double a, double b,    \
                                            double c, double d, double e, double f, double g, double h) {  \
        sv_apply<T>(v, pairs, t, cmask, {a, b}, {c, d}, {e, f}, {g, h});                                    \
    }                                                                                                       \
    extern "C" __global__ void sv_scale_##N(T* v, u64 n, u64 mask, u64 want, unsigned t, double a,         \
                                            double b, double c, double d) {                                 \
        sv_scale<T>(v, n, mask, want, t, {a, b}, {c, d});                                                   \
    }                                                                                                       \
    extern "C" __global__ void sv_pack_##N(const A* v, A* out, u64 n, unsigned b, u64 s) {                  \
        sv_pack<A>(v, out, n, b, s);                                                                        \
    }                                                                                                       \
    extern "C" __global__ void sv_unpack_##N(A* v, const A* in, u64 n, unsigned b, u64 s) {                 \
        sv_unpack<A>(v, in, n, b, s);                                                                       \
    }

SV_INST(float, float2, c64)
SV_INST(double, double2, c128)
