// GPZ particle codec (GPZ-FORMAT.md), the CUDA twin of src/codec/gpz: writes the CPU encoder's
// bytes and decodes exactly what the CPU decoder accepts. One warp per 32-particle block (lane j
// holds particle j); each block's place in the stream comes from a decoupled look-back over the
// block sizes (common.cuh, one chunk per thread block of GZ_WARPS * GZ_ENC_BPW blocks), so every
// block is written once, straight into the final stream.
//
// Compression (src/gpu/gpz.rs launches, in order, without a host round trip):
//   gz_init        ctrl words and look-back status cleared
//   gz_range_*     (noa, or abs with a degenerate step) per-axis finite range, first non-zero
//   gz_params_*    one thread: QuantParams::derive_from_stats of every axis
//   gz_codes_*     per-axis smallest / largest code over the non-exception particles; skipped
//                  when the ranges predict them (gz_params_*), a prediction the encoder checks
//   gz_encode_*    quantise, evaluate every level, sort, encode, look-back, write block + table
//   gz_hash        zhash sums of the table and of the blocks
// then the host reads the ctrl words once (sizes, checksums, parameters) and writes the header.
// Decompression: gz_init, gz_decode_* (one warp per group of GZ_DEC_GROUP blocks: the group's
// offset by a decoupled look-back over the table sizes, the group's part of the checksums, one
// lane per block parses the headers, then the warp decodes each block), one read of the ctrl
// words.
#include "common.cuh"

// Warps per encoder thread block.
#define GZ_WARPS 8
// Blocks each encoder warp encodes: a thread block's GZ_WARPS * GZ_ENC_BPW blocks are one
// look-back chunk.
#ifndef GZ_ENC_BPW
#define GZ_ENC_BPW 4
#endif
// Pause (ns) of the encoder's look-back between polls of a window that is not ready.
#ifndef GZ_POLL_NS
#define GZ_POLL_NS 50
#endif
// Thread blocks per SM the encoder / decoder are compiled for (register budget).
// f32 encoders: 64 warps per SM (32 registers, a few bytes spilled), as the level search's chains
// of warp collectives need more warps to hide their latency; f64 keeps 48 registers for its
// 64-bit codes.
#ifndef GZ_ENC_MINB_F32
#define GZ_ENC_MINB_F32 8
#endif
#ifndef GZ_ENC_MINB_F64
#define GZ_ENC_MINB_F64 5
#endif
#ifndef GZ_DEC_MINB
#define GZ_DEC_MINB 10
#endif
// Decoder: blocks per warp (one group, parsed by one lane each; even: a group's table entries
// are whole checksum words) and warps per thread block.
#ifndef GZ_DEC_GROUP
#define GZ_DEC_GROUP 32
#endif
#ifndef GZ_DEC_WARPS
#define GZ_DEC_WARPS 4
#endif
// Ctrl words of the workspace (src/gpu/gpz.rs W_*; checked by a test).
#define GZ_W_RMIN 0
#define GZ_W_RMAX 4
#define GZ_W_FNZ 8
#define GZ_W_CMIN 12
#define GZ_W_CMAX 16
#define GZ_W_AXIS 20
#define GZ_W_HASH 36
#define GZ_W_TOTAL 38
#define GZ_W_ERR 39
#define GZ_W_TICKET 40
#define GZ_W_SPEC 41
#define GZ_W_SPECHIT 42
#define GZ_CTRL 48
// Format constants (src/codec/gpz kernel_constants(); checked by a test).
#define GZ_WIDTH_BITS 6
#define GZ_LEVEL_BITS 4
#define GZ_BLOCK 32
#define GZ_LMAX_CAP 10
#define GZ_TABLE_ENTRY 2
// GZ_W_SPEC: the frame was predicted from the ranges (1), the prediction was impossible (2).
// GZ_W_SPECHIT: some block's smallest code of axis c is the predicted one (bit c), its largest
// (bit 4 + c), a block's code lies outside the predicted frame (GZ_SPEC_OUT).
#define GZ_SPEC_ON 1
#define GZ_SPEC_NONE 2
#define GZ_SPEC_OUT 256
// Decoder error bits.
#define GZ_E_SIZE 1ull
#define GZ_E_BLOCK 2ull
#define GZ_E_TOTAL 4ull

__device__ __forceinline__ u32 gz_bw64(u64 v) { return 64u - (u32)__clzll((long long)v); }
__device__ __forceinline__ u32 gz_bw32(u32 v) { return 32u - (u32)__clz((int)v); }
__device__ __forceinline__ u32 gz_bwu(u32 v) { return gz_bw32(v); }
__device__ __forceinline__ u32 gz_bwu(u64 v) { return gz_bw64(v); }
__device__ __forceinline__ u32 gz_clog2(u32 k) { return k <= 1u ? 0u : 32u - (u32)__clz((int)(k - 1u)); }
// sum_{k=1..x} ceil(log2 k) (sort.rs lehmer_bits)
__device__ __forceinline__ u32 gz_lehmer_bits(u32 x) {
    const u32 c = gz_clog2(x);
    return x * c - (1u << c) + 1u;
}
__device__ __forceinline__ u32 gz_lanemask_lt(int lane) { return (1u << lane) - 1u; }
// bits 0..=i set (i < 32)
__device__ __forceinline__ u32 gz_upto(int i) { return i >= 31 ? 0xffffffffu : ((2u << i) - 1u); }
__device__ __forceinline__ u32 gz_low(u32 w) { return w >= 32u ? 0xffffffffu : ((1u << w) - 1u); }
__device__ __forceinline__ u64 gz_low64(u32 w) { return w >= 64u ? ~0ull : ((1ull << w) - 1ull); }

// Unsigned code offsets of a dtype: f32 widths are at most 30 bits, so 32-bit words (one
// shift per field instead of a 64-bit shift pair).
template <typename T> struct GzU;
template <> struct GzU<float> {
    typedef u32 U;
    __device__ static u32 low(u32 w) { return gz_low(w); }
};
template <> struct GzU<double> {
    typedef u64 U;
    __device__ static u64 low(u32 w) { return gz_low64(w); }
};

__device__ __forceinline__ u32 gz_wmax(u32 v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(ZC_FULL, v);
#else
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        u32 o = __shfl_xor_sync(ZC_FULL, v, s);
        v = o > v ? o : v;
    }
    return v;
#endif
}
__device__ __forceinline__ u32 gz_wmin(u32 v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_min_sync(ZC_FULL, v);
#else
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        u32 o = __shfl_xor_sync(ZC_FULL, v, s);
        v = o < v ? o : v;
    }
    return v;
#endif
}
__device__ __forceinline__ u32 gz_wor(u32 v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_or_sync(ZC_FULL, v);
#else
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) v |= __shfl_xor_sync(ZC_FULL, v, s);
    return v;
#endif
}
__device__ __forceinline__ i64 gz_wmin_i64(i64 v) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        i64 o = __shfl_xor_sync(ZC_FULL, v, s);
        v = o < v ? o : v;
    }
    return v;
}
__device__ __forceinline__ i64 gz_wmax_i64(i64 v) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        i64 o = __shfl_xor_sync(ZC_FULL, v, s);
        v = o > v ? o : v;
    }
    return v;
}
// Warp min / max of a code (32-bit codes in one reduction).
__device__ __forceinline__ i64 gz_cmin(i64 v) { return gz_wmin_i64(v); }
__device__ __forceinline__ i64 gz_cmax(i64 v) { return gz_wmax_i64(v); }
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ i64 gz_cmin(i32 v) { return (i64)__reduce_min_sync(ZC_FULL, v); }
__device__ __forceinline__ i64 gz_cmax(i32 v) { return (i64)__reduce_max_sync(ZC_FULL, v); }
#else
__device__ __forceinline__ i64 gz_cmin(i32 v) { return gz_wmin_i64((i64)v); }
__device__ __forceinline__ i64 gz_cmax(i32 v) { return gz_wmax_i64((i64)v); }
#endif
__device__ __forceinline__ u64 gz_wmin_u64(u64 v) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        u64 o = __shfl_xor_sync(ZC_FULL, v, s);
        v = o < v ? o : v;
    }
    return v;
}

// ---------------------------------------------------------------------------------------------
// Quantizer of an axis from the params words (QuantParams::quantizer).
template <typename T> __device__ __forceinline__ ZQ<T> gz_quantizer(const u64* ws, int c) {
    const double ab = zc_bits_f64(ws[GZ_W_AXIS + 4 * c]);
    const double st = zc_bits_f64(ws[GZ_W_AXIS + 4 * c + 1]);
    ZQ<T> q;
    q.step = ZT<T>::from_f64(st);
    q.inv = ZT<T>::from_f64(__ddiv_rn(1.0, (double)q.step));
    q.step64 = st;
    q.eb = ab <= 1.7976931348623157e308 ? ab : 0.0;
    return q;
}
// Quantizer::encode (false: an exception); f32: the answers of the other codecs' f32 fast path
// (zq_encode_f32_abs) with selects instead of early returns, so that the common case (the f32
// difference settles it) has no branch; only a difference equal to fl(eb) takes the exact
// f64 comparison. Codes of values outside the range test are 0 (callers read a code only where
// the value is coded).
__device__ __forceinline__ bool gz_quant(const ZQ<float>& q, float x, i32& code) {
    const float eb32 = __double2float_rn(q.eb);
    const float p = __fmul_rn(x, q.inv);
    const bool in = fabsf(p) < 536870912.0f;  // false for NaN
    // |p| < 2^29: round-to-nearest-even to int is rintf then the exact conversion
    const i32 c = __float2int_rn(in ? p : 0.0f);
    const float r = __fmul_rn(__int2float_rn(c), q.step);
    const float d32 = fabsf(__fsub_rn(x, r));
    code = c;
    bool ok = in && d32 < eb32;
    if (in && d32 == eb32) ok = zq_within<float, false>(q, x, r);
    return ok;
}
__device__ __forceinline__ bool gz_quant(const ZQ<double>& q, double x, i64& code) { return zq_encode<double, false>(q, x, code); }
// Reconstruction (quant::Quantizer::decode; f32 codes go through i32 as the CPU's `q as i32`).
__device__ __forceinline__ float gz_dec_step(float step, i64 c) { return __fmul_rn(__int2float_rn((i32)c), step); }
__device__ __forceinline__ double gz_dec_step(double step, i64 c) { return __dmul_rn(__ll2double_rn(c), step); }

// ---------------------------------------------------------------------------------------------
__device__ void gz_init(u64* ws, u64 nstatus) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    if (i < GZ_CTRL) {
        u64 v = 0;
        if (i >= GZ_W_RMIN && i < GZ_W_RMIN + 4) v = ~0ull;
        if (i >= GZ_W_FNZ && i < GZ_W_FNZ + 4) v = ~0ull;
        if (i >= GZ_W_CMIN && i < GZ_W_CMIN + 4) v = 0x7fffffffffffffffull;
        if (i >= GZ_W_CMAX && i < GZ_W_CMAX + 4) v = 0x8000000000000000ull;
        ws[i] = v;
    }
    for (u64 k = i; k < nstatus; k += stride) ws[GZ_CTRL + k] = 0;
}

// Every particle i < n of x (AoS, D values) through f(i, values), grid-stride: groups of
// 16 / sizeof(T) particles in D 16-byte loads when x is 16-byte aligned, the rest one by one.
template <typename T, int D, typename F> __device__ __forceinline__ void gz_each(const T* x, u64 n, F f) {
    const int G = 16 / (int)sizeof(T);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 ng = (((u64)x) & 15ull) ? 0ull : n / G;
    for (u64 g = tid; g < ng; g += stride) {
        union {
            uint4 q[D];
            T v[G * D];
        } u;
        const uint4* src = (const uint4*)x + g * D;
#pragma unroll
        for (int k = 0; k < D; k++) u.q[k] = __ldg(src + k);
#pragma unroll
        for (int p = 0; p < G; p++) f(g * G + p, &u.v[p * D]);
    }
    for (u64 i = ng * G + tid; i < n; i += stride) {
        T v[D];
#pragma unroll
        for (int c = 0; c < D; c++) v[c] = x[i * D + c];
        f(i, v);
    }
}

// Per-axis finite range (order keys) and the first particle with a finite non-zero value.
template <typename T, int D> __device__ void gz_range(const T* x, u64 n, u64* ws) {
    u64 lo[D], hi[D], fnz[D];
#pragma unroll
    for (int c = 0; c < D; c++) {
        lo[c] = ~0ull;
        hi[c] = 0;
        fnz[c] = ~0ull;
    }
    gz_each<T, D>(x, n, [&](u64 i, const T* p) {
#pragma unroll
        for (int c = 0; c < D; c++) {
            const T v = p[c];
            if (zc_isfinite(v)) {
                const u64 k = zc_key(v);
                lo[c] = k < lo[c] ? k : lo[c];
                hi[c] = k > hi[c] ? k : hi[c];
                if ((double)v != 0.0 && i < fnz[c]) fnz[c] = i;
            }
        }
    });
#pragma unroll
    for (int c = 0; c < D; c++) {
        const u64 l = gz_wmin_u64(lo[c]);
        const u64 h = warp_max_u64(hi[c]);
        const u64 f = gz_wmin_u64(fnz[c]);
        if ((threadIdx.x & 31) == 0) {
            if (l != ~0ull) atomicMin((unsigned long long*)&ws[GZ_W_RMIN + c], l);
            if (h != 0) atomicMax((unsigned long long*)&ws[GZ_W_RMAX + c], h);
            if (f != ~0ull) atomicMin((unsigned long long*)&ws[GZ_W_FNZ + c], f);
        }
    }
}

// The value of an order key of T as f64.
__device__ __forceinline__ double gz_unkey(u64 k, float) {
    const u32 b = (u32)k;
    return (double)__uint_as_float((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}
__device__ __forceinline__ double gz_unkey(u64 k, double) {
    return zc_bits_f64((k & 0x8000000000000000ull) ? (k & 0x7fffffffffffffffull) : ~k);
}

// quant::sub_down: b - a rounded down.
__device__ double gz_sub_down(double b, double a) {
    const double s = __dsub_rn(b, a);
    const double bb = __dsub_rn(s, b);
    const double err = __dadd_rn(__dsub_rn(b, __dsub_rn(s, bb)), __dsub_rn(-a, bb));
    if (err < 0.0) return zc_bits_f64((u64)__double_as_longlong(s) - 1ull);
    return s;
}
// quant::noa_abs_bound
__device__ double gz_noa_abs_bound(double e, double lo, double hi) {
    if (!(e >= 0.0 && lo <= hi && zc_isfinite(lo) && zc_isfinite(hi))) return 0.0;
    double eb;
    if (zc_isfinite(__dsub_rn(hi, lo))) {
        eb = zc_pred(__dmul_rn(e, gz_sub_down(hi, lo)));
    } else {
        eb = __dmul_rn(2.0, zc_pred(__dmul_rn(e, gz_sub_down(__dmul_rn(hi, 0.5), __dmul_rn(lo, 0.5)))));
    }
    if (eb <= 1.7976931348623157e308) return eb < 0.0 ? 0.0 : eb;
    return 1.7976931348623157e308;
}
// Element::round_down_from_f64, widened back to f64.
__device__ __forceinline__ double gz_round_down(double v, float) {
    float r = __double2float_rn(v);
    if ((double)r > v) r = __uint_as_float(__float_as_uint(r) - 1u);
    return (zc_isfinite(r) && r > 0.0f) ? (double)r : 0.0;
}
__device__ __forceinline__ double gz_round_down(double v, double) {
    return (zc_isfinite(v) && v > 0.0) ? v : 0.0;
}
__device__ __forceinline__ bool gz_is_normal(double v) {
    const u64 e = ((u64)__double_as_longlong(v) >> 52) & 0x7ffull;
    return e != 0 && e != 0x7ffull;
}
__device__ __forceinline__ bool gz_inv_finite(double step, float) { return zc_isfinite(__double2float_rn(__ddiv_rn(1.0, step))); }
__device__ __forceinline__ bool gz_inv_finite(double step, double) { return zc_isfinite(__ddiv_rn(1.0, step)); }

// QuantParams::derive_from_stats (abs / noa) of every axis, by one thread. noa != 0: the range
// words hold the axis ranges (no finite value: the range (0, 0)).
template <typename T> __device__ void gz_params(const T* x, u64 d, int noa, double e, int spec, u64* ws) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (int c = 0; c < (int)d; c++) {
        double lo = 0.0, hi = 0.0, ab = e;
        if (noa) {
            const u64 kl = ws[GZ_W_RMIN + c], kh = ws[GZ_W_RMAX + c];
            if (kl != ~0ull) {
                // `+ 0.0`: -0.0 is recorded as +0.0
                lo = __dadd_rn(gz_unkey(kl, (T)0), 0.0);
                hi = __dadd_rn(gz_unkey(kh, (T)0), 0.0);
            }
            ab = gz_noa_abs_bound(e, lo, hi);
        }
        double two = __dmul_rn(2.0, ab);
        if (!(two <= 1.7976931348623157e308)) two = 1.7976931348623157e308;
        double step = gz_round_down(two, (T)0);
        if (!(gz_is_normal(step) && gz_inv_finite(step, (T)0))) {
            const u64 f = ws[GZ_W_FNZ + c];
            step = f != ~0ull ? fabs((double)x[f * d + c]) : 1.0;
            if (!gz_inv_finite(step, (T)0)) step = 1.0;
        }
        ws[GZ_W_AXIS + 4 * c] = (u64)__double_as_longlong(ab);
        ws[GZ_W_AXIS + 4 * c + 1] = (u64)__double_as_longlong(step);
        ws[GZ_W_AXIS + 4 * c + 2] = (u64)__double_as_longlong(lo);
        ws[GZ_W_AXIS + 4 * c + 3] = (u64)__double_as_longlong(hi);
    }
    if (spec) {
        // The frame predicted from the ranges: quantisation is monotone, so no non-exception
        // particle has a code outside [code(min), code(max)]; the encoder checks that some
        // block reaches both ends (else the host runs gz_codes and encodes again).
        u64 mode = GZ_SPEC_ON;
        for (int c = 0; c < (int)d; c++) {
            const u64 kl = ws[GZ_W_RMIN + c], kh = ws[GZ_W_RMAX + c];
            typename ZT<T>::code_t a = 0, b = 0;
            const ZQ<T> q = gz_quantizer<T>(ws, c);
            if (kl == ~0ull || !gz_quant(q, (T)gz_unkey(kl, (T)0), a) || !gz_quant(q, (T)gz_unkey(kh, (T)0), b)) {
                mode |= GZ_SPEC_NONE;
                continue;
            }
            ws[GZ_W_CMIN + c] = (u64)(i64)a;
            ws[GZ_W_CMAX + c] = (u64)(i64)b;
        }
        ws[GZ_W_SPEC] = mode;
    }
}

// Per-axis smallest and largest code over the particles that are not exceptions.
template <typename T, int D> __device__ void gz_codes(const T* x, u64 n, u64* ws) {
    typedef typename ZT<T>::code_t C;
    ZQ<T> qz[D];
#pragma unroll
    for (int c = 0; c < D; c++) qz[c] = gz_quantizer<T>(ws, c);
    i64 lo[D], hi[D];
#pragma unroll
    for (int c = 0; c < D; c++) {
        lo[c] = 0x7fffffffffffffffll;
        hi[c] = (i64)0x8000000000000000ull;
    }
    gz_each<T, D>(x, n, [&](u64, const T* p) {
        C q[D];
        bool ok = true;
#pragma unroll
        for (int c = 0; c < D; c++) ok &= gz_quant(qz[c], p[c], q[c]);
        if (ok) {
#pragma unroll
            for (int c = 0; c < D; c++) {
                lo[c] = (i64)q[c] < lo[c] ? (i64)q[c] : lo[c];
                hi[c] = (i64)q[c] > hi[c] ? (i64)q[c] : hi[c];
            }
        }
    });
#pragma unroll
    for (int c = 0; c < D; c++) {
        const i64 l = gz_wmin_i64(lo[c]);
        const i64 h = gz_wmax_i64(hi[c]);
        if ((threadIdx.x & 31) == 0 && l <= h) {
            atomicMin((long long*)&ws[GZ_W_CMIN + c], (long long)l);
            atomicMax((long long*)&ws[GZ_W_CMAX + c], (long long)h);
        }
    }
}

// The stream's frame of every axis: base G_c and width gw_c (0, 0 when every particle is an
// exception).
template <int D> __device__ __forceinline__ void gz_frame(const u64* ws, i64 (&gmin)[D], u32 (&gw)[D]) {
    const bool any = (i64)ws[GZ_W_CMIN] <= (i64)ws[GZ_W_CMAX];
#pragma unroll
    for (int c = 0; c < D; c++) {
        const i64 l = (i64)ws[GZ_W_CMIN + c], h = (i64)ws[GZ_W_CMAX + c];
        gmin[c] = any ? l : 0;
        gw[c] = any ? gz_bw64((u64)h - (u64)l) : 0u;
    }
}

// ---------------------------------------------------------------------------------------------
// Bit writer into a warp's shared words (fields of different lanes may share a word).
__device__ __forceinline__ void gz_put(u32* buf, u32 pos, u32 v, u32 w) {
    if (w == 0u) return;
    v &= gz_low(w);
    const u32 i = pos >> 5, sh = pos & 31u;
    atomicOr(&buf[i], v << sh);
    if (sh + w > 32u) atomicOr(&buf[i + 1], v >> (32u - sh));
}
__device__ __forceinline__ void gz_put64(u32* buf, u32 pos, u64 v, u32 w) {
    if (w > 32u) {
        gz_put(buf, pos, (u32)v, 32u);
        gz_put(buf, pos + 32u, (u32)(v >> 32), w - 32u);
    } else {
        gz_put(buf, pos, (u32)v, w);
    }
}
template <typename T> __device__ __forceinline__ void gz_put_value(u32* buf, u32 pos, T v);
template <> __device__ __forceinline__ void gz_put_value<float>(u32* buf, u32 pos, float v) {
    gz_put(buf, pos, __float_as_uint(v), 32u);
}
template <> __device__ __forceinline__ void gz_put_value<double>(u32* buf, u32 pos, double v) {
    gz_put64(buf, pos, (u64)__double_as_longlong(v), 64u);
}

// Transpose of the 32 x 32 bit matrix whose row j is lane j's word: returns column `lane` (bit j
// = bit `lane` of lane j's word). Five butterfly stages, each swapping the off-diagonal blocks of
// half the previous size between lanes `lane` and `lane ^ s`.
__device__ __forceinline__ u32 gz_transpose32(u32 x, int lane) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        const u32 m = s == 16 ? 0x0000ffffu : s == 8 ? 0x00ff00ffu : s == 4 ? 0x0f0f0f0fu : s == 2 ? 0x33333333u : 0x55555555u;
        const u32 o = __shfl_xor_sync(ZC_FULL, x, s);
        x = (lane & s) ? ((x & ~m) | ((o & ~m) >> s)) : ((x & m) | ((o & m) << s));
    }
    return x;
}

// Ascending bitonic sort of one key per lane.
template <typename K> __device__ __forceinline__ K gz_sort(K key, int lane) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const K o = __shfl_xor_sync(ZC_FULL, key, j);
            const bool up = (lane & k) == 0;
            const bool low = (lane & j) == 0;
            key = (low == up) ? (o < key ? o : key) : (o > key ? o : key);
        }
    }
    return key;
}

// Slot bytes of an encoded block (a raw block is the largest: 1 + 32 d size).
template <typename T, int D> struct GzSlot {
    static const int BYTES = 1 + 32 * D * ZT<T>::SIZE;
    static const int WORDS = (BYTES + 3) / 4 + 2;
};

// Encode one block of n particles (x: its first value) into buf (zeroed here); returns its size
// in bytes (block.rs encode_block).
template <typename T, int D, bool PRESERVE>
__device__ u32 gz_encode_block(const T* x, int n, const ZQ<T> (&qz)[D], const i64 (&gmin)[D], const u32 (&gw)[D],
                               u32 lmax, u32* buf, int lane, u64* perm, u64 first, u64* spec) {
    typedef typename ZT<T>::code_t C;
    typedef typename GzU<T>::U U;
    // (the slot's size is a constant: unrolled, no loop)
#pragma unroll
    for (int i = 0; i < GzSlot<T, D>::WORDS; i += 32)
        if (i + 32 <= GzSlot<T, D>::WORDS || i + lane < GzSlot<T, D>::WORDS) buf[i + lane] = 0u;
    const bool valid = lane < n;
    T xv[D];
#pragma unroll
    for (int c = 0; c < D; c++) xv[c] = valid ? x[lane * D + c] : (T)0;
    bool ok = valid;
    C q[D];
#pragma unroll
    for (int c = 0; c < D; c++) {
        q[c] = 0;
        // (f32: no branch; an invalid lane quantises 0 and stays not ok)
        if (sizeof(T) == 4 || valid) ok &= gz_quant(qz[c], xv[c], q[c]);
    }
    const u32 vmask = __ballot_sync(ZC_FULL, valid);
    const u32 cmask = __ballot_sync(ZC_FULL, ok);
    const u32 exc = vmask & ~cmask;
    const u32 m = __popc(cmask);
    const u32 nexc = (u32)n - m;
    __syncwarp();
    const u32 raw_bytes = (u32)n * D * ZT<T>::SIZE;
    bool raw = m == 0u;
    // per-axis frame
    // (in the code type: 32-bit arithmetic for f32, whose codes and spans fit 30 bits)
    U u[D];
    u32 w[D];
    bool glob[D];
    C base[D];
    u32 sflag = 0;
    if (!raw) {
#pragma unroll
        for (int c = 0; c < D; c++) {
            const C l = (C)gz_cmin(ok ? q[c] : (C)(sizeof(C) == 4 ? 0x7fffffffll : 0x7fffffffffffffffll));
            const C h = (C)gz_cmax(ok ? q[c] : (C)(sizeof(C) == 4 ? -0x80000000ll : (long long)0x8000000000000000ull));
            w[c] = gz_bwu((U)h - (U)l);
            glob[c] = w[c] == gw[c];
            // (a global base is a code, so it fits C)
            base[c] = glob[c] ? (C)gmin[c] : l;
            u[c] = ok ? (U)q[c] - (U)base[c] : (U)0;
            if (spec) {
                const i64 pmax = (i64)spec[GZ_W_CMAX + c - GZ_W_SPECHIT];
                sflag |= (l < gmin[c] || h > pmax) ? GZ_SPEC_OUT : 0u;
                sflag |= (l == gmin[c] ? 1u : 0u) << c;
                sflag |= (h == pmax ? 16u : 0u) << c;
            }
        }
        // (warp-uniform: one atomic per block that reaches an end of the frame)
        if (spec && lane == 0 && sflag) {
            const u64 cur = *((volatile u64*)spec);
            if ((cur | sflag) != cur) atomicOr((unsigned long long*)spec, (unsigned long long)sflag);
        }
    }
    u32 fixed = 2u + (nexc > 0u ? (u32)n : 0u) + GZ_LEVEL_BITS + (PRESERVE ? 1u : 0u);
    u32 maxw = 0;
    if (!raw) {
#pragma unroll
        for (int c = 0; c < D; c++) {
            fixed += 1u + (glob[c] ? 0u : gw[c] + GZ_WIDTH_BITS);
            maxw = w[c] > maxw ? w[c] : maxw;
        }
    }
    // Level search: the smallest size, ties to the lower level (block.rs). A level's size needs
    // no sort: R, the run-count width and the identity of the stable sort follow from the ids'
    // multiset (match_any) and their order in the block, and the delta width is bracketed by the
    // id span. (1) The warp gathers these per level, level L's into lane L. (2) Lane L evaluates
    // level L: its exact size, or, with the bracket open, a lower bound. (3) Only levels whose
    // lower bound could still win against the best exact size sort their ids, lowest first, each
    // sort tightening the bound for the next. The per-level arithmetic thus runs once per block
    // in parallel lanes rather than once per level in every lane.
    u32 best_bits = 0xffffffffu, best_l = 0;
    const u32 ltop = raw ? 0u : (lmax < maxw ? lmax : maxw);
    const int prevc = 31 - __clz((int)(cmask & gz_lanemask_lt(lane)));  // previous coded lane, -1
    const bool hasprev = ok && prevc >= 0;
    if (!raw) {
        // lane L: level L's size without runs beyond their first key (a lower bound)
        u32 K = 0, S = 0;
#pragma unroll
        for (int c = 0; c < D; c++) {
            const u32 kc = w[c] < (u32)lane ? w[c] : (u32)lane;
            K += kc;
            S += w[c] - kc;
        }
        u32 lo = fixed + (K > 0u ? 5u + K : 0u) + m * S, rbase = 0;
        const bool act = (u32)lane <= ltop;
        // (1) level L >= 1 (K > 0 there, as ltop <= max w) whose lower bound could beat level 0
        // (exact: one id): runs R, id span, count width, identity. A level left out keeps R = 1,
        // its lower bound standing for its size, which level 0 already beats.
        u32 sR = 1, sspan = 0, swc = 0;
        bool sident = true;
        const u32 key0 = __shfl_sync(ZC_FULL, lo, 0) << 4;
        for (u32 lv = __ballot_sync(ZC_FULL, act && lane > 0 && (lo << 4 | (u32)lane) < key0); lv; lv &= lv - 1u) {
            const int L = __ffs(lv) - 1;
            u32 id = 0;
#pragma unroll
            for (int c = 0; c < D; c++) {
                const u32 kc = w[c] < (u32)L ? w[c] : (u32)L;
                id = (kc ? (id << kc) : id) | (u32)(u[c] >> (w[c] - kc));
            }
            const u32 grp = __match_any_sync(ZC_FULL, id) & cmask;
            const bool leader = ok && (grp & gz_lanemask_lt(lane)) == 0u;
            const u32 R = __popc(__ballot_sync(ZC_FULL, leader));
            const u32 idmax = gz_wmax(ok ? id : 0u);
            const u32 idmin = gz_wmin(ok ? id : 0xffffffffu);
            const u32 wc = gz_wmax((leader && id != idmax) ? gz_bw32((u32)__popc(grp) - 1u) : 0u);
            bool ident = true;
            if (PRESERVE) {
                // the stable sort is the identity when the coded ids never decrease in block
                // order (only then is no permutation written)
                const u32 pid = __shfl_sync(ZC_FULL, id, prevc & 31);
                ident = __ballot_sync(ZC_FULL, hasprev && pid > id) == 0u;
            }
            if (lane == L) {
                sR = R;
                sspan = idmax - idmin;
                swc = wc;
                sident = ident;
            }
        }
        // (2) lane L: level L's size (exact) or its lower bound (bracket open)
        bool exact = true;
        if (K > 0u && sR > 1u) {
            const u32 R = sR;
            u32 pb = 0;
            if (PRESERVE && !sident) {
                const u32 lb2 = gz_lehmer_bits(m), rb = m * gz_clog2(R);
                pb = 1u + (lb2 < rb ? lb2 : rb);
            }
            // the R - 1 gaps sum to `total`: the widest is at least their mean, whose width is
            // at least bw(total) - bw(R - 1) (total >= 2^(a-1), R - 1 < 2^b)
            const u32 total = sspan - (R - 1u);
            const u32 wd_hi = gz_bw32(total), bq = gz_bw32(R - 1u);
            const u32 wd = R == 2u ? wd_hi : (wd_hi > bq ? wd_hi - bq : 0u);
            exact = wd == wd_hi;
            rbase = lo + 9u + pb;
            lo = rbase + (R - 1u) * (wd + swc);
        }
        // (size, level) keys: the smallest wins, ties to the lower level
        const u32 key = lo << 4 | (u32)lane;
        u32 best = gz_wmin(act && exact ? key : 0xffffffffu);
        // (3) open brackets that could still win, lowest level first
        u32 cand = __ballot_sync(ZC_FULL, act && !exact && key < best);
        while (cand) {
            const int L = __ffs(cand) - 1;
            cand &= cand - 1u;
            if (__shfl_sync(ZC_FULL, key, L) >= best) continue;
            u32 id = 0;
#pragma unroll
            for (int c = 0; c < D; c++) {
                const u32 kc = w[c] < (u32)L ? w[c] : (u32)L;
                id = (kc ? (id << kc) : id) | (u32)(u[c] >> (w[c] - kc));
            }
            const u32 sid = gz_sort<u32>(ok ? id : 0xffffffffu, lane);
            const u32 prev = __shfl_up_sync(ZC_FULL, sid, 1);
            const bool start = lane > 0 && (u32)lane < m && sid != prev;
            const u32 wd = gz_wmax(start ? gz_bw32(sid - prev - 1u) : 0u);
            const u32 bits = __shfl_sync(ZC_FULL, rbase + (sR - 1u) * (wd + swc), L);
            const u32 k2 = bits << 4 | (u32)L;
            best = k2 < best ? k2 : best;
        }
        best_bits = best >> 4;
        best_l = best & 15u;
        const u32 coded = (best_bits + 7u) / 8u + nexc * D * ZT<T>::SIZE;
        raw = coded > raw_bytes;
    }
    if (raw) {
        // a raw block keeps its particles in place
        if (!PRESERVE && perm && valid) perm[lane] = first + (u64)lane;
        if (lane == 0) gz_put(buf, 0, 1u, 8u);
        __syncwarp();
        if (valid) {
#pragma unroll
            for (int c = 0; c < D; c++) gz_put_value<T>(buf, 8u + (u32)((lane * D + c) * ZT<T>::SIZE * 8), xv[c]);
        }
        __syncwarp();
        return 1u + raw_bytes;
    }
    // ---- the chosen level's stable sort
    u32 b_sid, b_src;
    const u32 b_k = [&] {
        u32 K = 0;
#pragma unroll
        for (int c = 0; c < D; c++) K += w[c] < best_l ? w[c] : best_l;
        return K;
    }();
    {
        u32 id = 0;
#pragma unroll
        for (int c = 0; c < D; c++) {
            const u32 kc = w[c] < best_l ? w[c] : best_l;
            id = (kc ? (id << kc) : id) | (u32)(u[c] >> (w[c] - kc));
        }
        if (cmask == 0xffffffffu && gz_wmin(id) == gz_wmax(id)) {
            // one id over a full block without exceptions (most blocks at their chosen level):
            // the stable sort is the identity
            b_sid = id;
            b_src = (u32)lane;
        } else if (b_k <= 26u) {
            const u32 key = ok ? (id << 5 | (u32)lane) : 0xffffffffu;
            const u32 sk = gz_sort<u32>(key, lane);
            b_sid = sk >> 5;
            b_src = sk & 31u;
        } else {
            const u64 key = ok ? ((u64)id << 5 | (u64)lane) : ~0ull;
            const u64 sk = gz_sort<u64>(key, lane);
            b_sid = (u32)(sk >> 5);
            b_src = (u32)(sk & 31ull);
        }
    }
    u32 b_starts, b_wd = 0, b_wc = 0;
    bool b_ident;
    {
        const bool inr = (u32)lane < m;
        const u32 prev = __shfl_up_sync(ZC_FULL, b_sid, 1);
        const bool start = inr && (lane == 0 || b_sid != prev);
        b_starts = __ballot_sync(ZC_FULL, start);
        const u32 ci = __popc(cmask & gz_lanemask_lt((int)b_src));
        b_ident = __ballot_sync(ZC_FULL, inr && ci != (u32)lane) == 0u;
        if (b_k > 0u && __popc(b_starts) > 1) {
            const u32 gap = (start && lane > 0) ? gz_bw32(b_sid - prev - 1u) : 0u;
            const u32 next = b_starts & ~gz_upto(lane);
            const u32 cw = (start && next) ? gz_bw32((u32)(__ffs(next) - 1) - (u32)lane - 1u) : 0u;
            b_wd = gz_wmax(gap);
            b_wc = gz_wmax(cw);
        }
    }
    const u32 b_r = __popc(b_starts);
    // ---- write the chosen coding
    // The single fields (their places are the same in every lane) go to lane i for field i (by
    // selects) and are written by one gz_put in all lanes at the end: one put's instructions for
    // the warp rather than one per field.
    u32 fp = 0, fv = 0, fw = 0;
    auto field = [&](int i, u32 pos, u32 v, u32 width) {
        if (lane == i) {
            fp = pos;
            fv = v;
            fw = width;
        }
    };
    u32 p = 1;
    field(0, p, nexc > 0u ? 1u : 0u, 1u);
    p += 1;
    if (nexc > 0u) {
        field(1, p, exc, (u32)n);
        p += (u32)n;
    }
#pragma unroll
    for (int c = 0; c < D; c++) {
        field(2 + 4 * c, p, glob[c] ? 1u : 0u, 1u);
        p += 1;
        if (!glob[c]) {
            const u64 v = (u64)(i64)base[c] - (u64)gmin[c];
            field(3 + 4 * c, p, (u32)v, gw[c] < 32u ? gw[c] : 32u);
            field(4 + 4 * c, p + 32u, (u32)(v >> 32), gw[c] > 32u ? gw[c] - 32u : 0u);
            field(5 + 4 * c, p + gw[c], w[c], GZ_WIDTH_BITS);
            p += gw[c] + GZ_WIDTH_BITS;
        }
    }
    field(18, p, best_l, GZ_LEVEL_BITS);
    p += GZ_LEVEL_BITS;
    const bool inr = (u32)lane < m;
    if (!PRESERVE && perm) {
        // reorder: sorted position `lane` holds block particle `b_src`; the exceptions follow
        // the coded particles in block order (block.rs: the stream's output slots)
        if (inr) perm[lane] = first + (u64)b_src;
        if ((exc >> lane) & 1u) perm[m + __popc(exc & gz_lanemask_lt(lane))] = first + (u64)lane;
    }
    const bool start = (b_starts >> lane) & 1u;
    const u32 run_of = __popc(b_starts & gz_upto(lane)) - 1u;  // this sorted position's run
    const u32 R = b_r;
    if (b_k > 0u) {
        field(19, p, R - 1u, 5u);
        field(20, p + 5u, __shfl_sync(ZC_FULL, b_sid, 0), b_k);
        p += 5u + b_k;
        if (R > 1u) {
            const u32 prev = __shfl_up_sync(ZC_FULL, b_sid, 1);
            field(21, p, b_wd, 6u);
            p += 6u;
            if (start && lane > 0) gz_put(buf, p + (run_of - 1u) * b_wd, b_sid - prev - 1u, b_wd);
            p += (R - 1u) * b_wd;
            field(22, p, b_wc, 3u);
            p += 3u;
            const u32 next = b_starts & ~gz_upto(lane);
            if (start && next) gz_put(buf, p + run_of * b_wc, (u32)(__ffs(next) - 1) - (u32)lane - 1u, b_wc);
            p += (R - 1u) * b_wc;
        }
    }
    const u32 ci = __popc(cmask & gz_lanemask_lt((int)b_src));  // coded index at this position
    if (PRESERVE) {
        field(23, p, b_ident ? 0u : 1u, 1u);
        p += 1;
        if (!b_ident) {
            const u32 lb2 = gz_lehmer_bits(m), width = gz_clog2(R);
            const bool by_runs = m * width < lb2;
            field(24, p, by_runs ? 1u : 0u, 1u);
            p += 1;
            if (by_runs) {
                if (inr) gz_put(buf, p + ci * width, run_of, width);
                p += m * width;
            } else {
                // digit i: later positions holding a smaller index (a suffix OR of one-hot masks)
                u32 v = inr ? (1u << ci) : 0u;
#pragma unroll
                for (int s = 1; s < 32; s <<= 1) {
                    const u32 o = __shfl_down_sync(ZC_FULL, v, s);
                    if (lane + s < 32) v |= o;
                }
                u32 later = __shfl_down_sync(ZC_FULL, v, 1);
                if (lane == 31) later = 0u;
                const u32 digit = __popc(later & gz_lanemask_lt((int)ci));
                if (inr) {
                    const u32 at = lb2 - gz_lehmer_bits(m - (u32)lane);
                    gz_put(buf, p + at, digit, gz_clog2(m - (u32)lane));
                }
                p += lb2;
            }
        }
    }
    // offset planes of the sorted particles
    u32 kk[D], ss[D];
#pragma unroll
    for (int c = 0; c < D; c++) {
        kk[c] = w[c] < best_l ? w[c] : best_l;
        ss[c] = w[c] - kk[c];
    }
    // planes in groups of 32: sorted position i gathers its bits of the group's planes (plane
    // g + k at bit 31 - k, so an axis' planes form one field, most significant first), a bit
    // transpose hands lane k plane g + k, and every lane writes its plane
    U off[D];
    u32 nplanes = 0;
#pragma unroll
    for (int c = 0; c < D; c++) {
        const U o = __shfl_sync(ZC_FULL, u[c], (int)b_src) & GzU<T>::low(ss[c]);
        off[c] = inr ? o : (U)0;
        nplanes += ss[c];
    }
    for (u32 g = 0; g < nplanes; g += 32u) {
        u32 t = 0, pc = 0;
#pragma unroll
        for (int c = 0; c < D; c++) {
            // this axis' planes [pc, pc + ss) overlap the group's [g, g + 32) in [a, b)
            const u32 a = pc > g ? pc : g, e = pc + ss[c], bb = e < g + 32u ? e : g + 32u;
            if (a < bb) t |= ((u32)(off[c] >> (e - bb)) & gz_low(bb - a)) << (32u - (bb - g));
            pc = e;
        }
        const u32 word = gz_transpose32(__brev(t), lane);
        if (g + (u32)lane < nplanes) gz_put(buf, p + (g + (u32)lane) * m, word, m);
    }
    p += nplanes * m;
    gz_put(buf, fp, fv, fw);
    const u32 bytes = (p + 7u) / 8u;
    // exceptions verbatim, in block order
    if ((exc >> lane) & 1u) {
        const u32 e = __popc(exc & gz_lanemask_lt(lane));
#pragma unroll
        for (int c = 0; c < D; c++) gz_put_value<T>(buf, 8u * (bytes + (e * D + c) * ZT<T>::SIZE), xv[c]);
    }
    __syncwarp();
    return bytes + nexc * D * ZT<T>::SIZE;
}

// Copy `size` bytes of buf to dst (any alignment), writing only below `cap`.
__device__ __forceinline__ void gz_store(u8* out, u64 at, u64 cap, const u32* buf, u32 size, int lane) {
    const u64 a0 = (u64)out + at, a1 = a0 + size;
    const u64 capa = (u64)out + cap;
    u64 w0 = (a0 + 3ull) & ~3ull;
    const u64 w1 = a1 & ~3ull;
    if (w0 > a1) w0 = a1;
    // head bytes
    const u32 head = (u32)(w0 - a0);
    if ((u32)lane < head && a0 + lane < capa) *((u8*)(a0 + lane)) = (u8)(buf[lane >> 2] >> ((lane & 3) * 8));
    // interior words
    if (w1 > w0) {
        const u32 nw = (u32)((w1 - w0) >> 2);
        for (u32 k = lane; k < nw; k += 32) {
            const u32 o = head + 4u * k;
            const u32 sh = (o & 3u) * 8u;
            const u32 lo = buf[o >> 2], hi = buf[(o >> 2) + 1];
            const u32 v = __funnelshift_r(lo, hi, sh);
            const u64 a = w0 + 4ull * k;
            if (a + 4ull <= capa) *((u32*)a) = v;
        }
    }
    // tail bytes
    if (w1 >= w0) {
        const u32 tail = (u32)(a1 - w1);
        if ((u32)lane < tail) {
            const u32 o = (u32)(w1 - a0) + (u32)lane;
            if (w1 + lane < capa) *((u8*)(w1 + lane)) = (u8)(buf[o >> 2] >> ((o & 3) * 8));
        }
    }
}

// GZ_WARPS * GZ_ENC_BPW consecutive blocks per thread block, GZ_ENC_BPW per warp, form one
// look-back chunk: the warps encode their blocks into shared memory, warp 0 scans the chunk's
// sizes and runs the one decoupled look-back (the other warps wait at the barrier, issuing
// nothing) and writes the chunk's table entries, then every warp writes its blocks. One chunk per
// warp-block would make every warp poll its predecessors. hdr: header bytes; cap: capacity of out.
template <typename T, int D, bool PRESERVE>
__device__ void gz_encode(const T* x, u64 n, u64* ws, u8* out, u64 hdr, u64 cap, u64* perm) {
    constexpr int NB = GZ_WARPS * GZ_ENC_BPW;
    static_assert(NB <= 32, "one warp scans a chunk's sizes");
    __shared__ u32 s_buf[NB][GzSlot<T, D>::WORDS];
    __shared__ u32 s_size[NB];
    __shared__ u64 s_at[NB];
    __shared__ u32 s_chunk;
    __shared__ ZQ<T> s_qz[D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 nb = (n + 31ull) >> 5;
    if (threadIdx.x == 0) s_chunk = atomicAdd((unsigned int*)&ws[GZ_W_TICKET], 1u);
    // the quantizers once per thread block
    if (threadIdx.x >= 32 && threadIdx.x < 32 + D) s_qz[threadIdx.x - 32] = gz_quantizer<T>(ws, (int)threadIdx.x - 32);
    __syncthreads();
    const u32 chunk = s_chunk;
    const u64 b0 = (u64)chunk * NB;
    {
        ZQ<T> qz[D];
#pragma unroll
        for (int c = 0; c < D; c++) qz[c] = s_qz[c];
        i64 gmin[D];
        u32 gw[D];
        gz_frame<D>(ws, gmin, gw);
        const u32 lmax = (32u / D) < GZ_LMAX_CAP ? (32u / D) : GZ_LMAX_CAP;
        // a predicted frame is checked by every block (GZ_W_SPECHIT); not one that failed
        u64* spec = ws[GZ_W_SPEC] == GZ_SPEC_ON ? ws + GZ_W_SPECHIT : nullptr;
        for (int j = 0; j < GZ_ENC_BPW; j++) {
            const int slot = warp * GZ_ENC_BPW + j;
            const u64 b = b0 + (u64)slot;
            u32 size = 0;
            if (b < nb) {
                const u64 first = b << 5;
                const int cnt = (int)((n - first) < 32ull ? (n - first) : 32ull);
                size = gz_encode_block<T, D, PRESERVE>(x + first * D, cnt, qz, gmin, gw, lmax, s_buf[slot], lane,
                                                       perm ? perm + first : perm, first, spec);
            }
            if (lane == 0) s_size[slot] = size;
        }
    }
    __syncthreads();
    if (warp == 0) {
        const u32 sz = lane < NB ? s_size[lane] : 0u;
        const u32 incl = warp_incl_u32(sz, lane);
        const u32 agg = __shfl_sync(ZC_FULL, incl, 31);
        const u64 ex = lookback_exclusive<GZ_POLL_NS>(ws + GZ_CTRL, chunk, (u64)agg, lane);
        const u64 b = b0 + (u64)lane;
        if (lane < NB) s_at[lane] = ex + incl - sz;
        if (lane == 0 && b0 + NB >= nb) ws[GZ_W_TOTAL] = ex + agg;
        // byte stores: the stream may start at any byte of its buffer
        const u64 tab = hdr + 2ull * b;
        if (lane < NB && b < nb && tab + 2ull <= cap) {
            out[tab] = (u8)sz;
            out[tab + 1ull] = (u8)(sz >> 8);
        }
    }
    __syncthreads();
    for (int j = 0; j < GZ_ENC_BPW; j++) {
        const int slot = warp * GZ_ENC_BPW + j;
        if (b0 + (u64)slot < nb) gz_store(out, hdr + 2ull * nb + s_at[slot], cap, s_buf[slot], s_size[slot], lane);
    }
}

// zhash sums (before the final step) of the table (blockIdx.y 0) and of the block data
// (blockIdx.y 1) of a stream at `out`; the data length is ws[GZ_W_TOTAL] unless `data_len` is
// given (not ~0). Nothing is hashed when table + data would not be smaller than `raw`.
__device__ void gz_hash(const u8* out, u64 hdr, u64 nb, u64 data_len, u64 raw, u64* ws) {
    const u64 dl = data_len != ~0ull ? data_len : ws[GZ_W_TOTAL];
    if (data_len == ~0ull && 2ull * nb + dl >= raw) return;
    const u8* p = out + hdr + (blockIdx.y ? 2ull * nb : 0ull);
    const u64 len = blockIdx.y ? dl : 2ull * nb;
    const u64 nw = (len + 3ull) >> 2;
    u32 sum = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // Groups of 4 words (16 bytes at p + 16 g) from two aligned 16-byte loads and funnel shifts
    // (the table and the blocks start at any byte). A group's 32 aligned bytes start at or
    // after the header (hdr >= 16 bytes before p) and end inside the data: no byte outside the
    // stream is read.
    const u64 pa = (u64)p, a0 = pa & ~15ull, a1 = (pa + len) & ~15ull;
    const u64 ng = a1 >= a0 + 32ull ? (a1 - a0) / 16ull - 1ull : 0ull;
    const u32 q = (u32)(pa & 15ull) >> 2, sh = (u32)(pa & 3ull) * 8u;
    for (u64 g = tid; g < ng; g += stride) {
        const uint4 lo = *((const uint4*)(a0 + 16ull * g));
        const uint4 hi = *((const uint4*)(a0 + 16ull * g + 16ull));
        const u32 w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        u32 v[5];
#pragma unroll
        for (int k = 0; k < 5; k++) v[k] = q == 0u ? w[k] : q == 1u ? w[k + 1] : q == 2u ? w[k + 2] : w[k + 3];
#pragma unroll
        for (int k = 0; k < 4; k++) sum += zhash_mix(__funnelshift_r(v[k], v[k + 1], sh), (u32)(4ull * g + (u64)k));
    }
    // the words after the groups
    const bool a4 = (((u64)p) & 3ull) == 0ull, a2 = (((u64)p) & 1ull) == 0ull;
    for (u64 i = 4ull * ng + tid; i < nw; i += stride) {
        u32 v;
        if (4ull * i + 4ull <= len) {
            if (a4) {
                v = *((const u32*)(p + 4ull * i));
            } else if (a2) {
                const unsigned short* h = (const unsigned short*)(p + 4ull * i);
                v = (u32)h[0] | ((u32)h[1] << 16);
            } else {
                v = (u32)p[4 * i] | ((u32)p[4 * i + 1] << 8) | ((u32)p[4 * i + 2] << 16) | ((u32)p[4 * i + 3] << 24);
            }
        } else {
            v = 0;
            for (u64 k = 4ull * i; k < len; k++) v |= (u32)p[k] << (8 * (k - 4ull * i));
        }
        sum += zhash_mix(v, (u32)i);
    }
    sum = warp_sum_u32(sum);
    if ((threadIdx.x & 31) == 0 && sum) atomicAdd((unsigned int*)&ws[GZ_W_HASH + blockIdx.y], sum);
}

// ---------------------------------------------------------------------------------------------
// Decoder: one warp per group of GZ_DEC_GROUP consecutive blocks, in two phases.
//   A. Lane j parses block j of the group: the block's serial fields (flags, exception mask,
//      frames, level, run header, permutation header), the positions of its lane-parallel
//      fields and every check that needs none of them, into a shared record. The serial header
//      costs each warp instruction once per 32 blocks instead of once per block.
//   B. The warp decodes the group's blocks in turn from their records: run keys and counts,
//      permutation, offset planes, reconstruction into a shared staging buffer, then coalesced
//      stores of the block's values.
// Fields are read straight from the stream (read-only path): two aligned words and a funnel
// shift. No read is checked on its own: every field lies before the position phase A ends at,
// and a block passes only when that position (padded, plus its exceptions) is exactly its size,
// so a block that reads past its end fails (the CPU decoder's "read past the block"). Such reads
// are clamped to the block's last word.
//
// Bound on the bytes of a block any decoder can consume (every field at its largest).
template <typename T, int D> struct GzDec {
    static const int MR = ZT<T>::MAX_RATE;
    static const int BITS = 2 + 32 + D * (1 + MR + GZ_WIDTH_BITS) + GZ_LEVEL_BITS + (5 + 32 + 6 + 31 * 32 + 3 + 31 * 5) +
                            2 + 160 + D * MR * 32;
    static const int BYTES = (BITS + 7) / 8 + 32 * D * ZT<T>::SIZE;
};

// Shifts by 0 ..= 32 (PTX clamps the amount: a shift by 32 gives 0).
__device__ __forceinline__ u32 gz_shl(u32 v, u32 n) {
    u32 r;
    asm("shl.b32 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(n));
    return r;
}
__device__ __forceinline__ u32 gz_shr(u32 v, u32 n) {
    u32 r;
    asm("shr.b32 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(n));
    return r;
}

// Bit-matrix transpose as gz_transpose32, with fewer instructions a stage: byte permutes for the
// half-word and byte stages, and for the others a rotate of the partner's word by s (left in
// the lower lane, right in the upper one) merged under the lane's mask by one bitwise select:
// the bits a rotate wraps around fall outside the mask. The per-lane selectors and masks are
// computed once per warp (GzTp), not once per block.
struct GzTp {
    u32 p16, p8, keep[3], rot[3];
    __device__ explicit GzTp(int lane) {
        p16 = (lane & 16) ? 0x3276u : 0x5410u;
        p8 = (lane & 8) ? 0x3715u : 0x6240u;
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const int s = 4 >> i;
            const u32 m = i == 0 ? 0x0f0f0f0fu : i == 1 ? 0x33333333u : 0x55555555u;
            const bool up = (lane & s) != 0;
            keep[i] = up ? ~m : m;
            rot[i] = up ? 32u - (u32)s : (u32)s;
        }
        // (opaque: kept in registers rather than recomputed from the lane in every block)
        asm("" : "+r"(p16), "+r"(p8), "+r"(keep[0]), "+r"(keep[1]), "+r"(keep[2]));
        asm("" : "+r"(rot[0]), "+r"(rot[1]), "+r"(rot[2]));
    }
};
__device__ __forceinline__ u32 gz_transpose32f(u32 x, const GzTp& tp) {
    u32 y = __shfl_xor_sync(ZC_FULL, x, 16);
    x = __byte_perm(x, y, tp.p16);
    y = __shfl_xor_sync(ZC_FULL, x, 8);
    x = __byte_perm(x, y, tp.p8);
#pragma unroll
    for (int i = 0; i < 3; i++) {
        y = __shfl_xor_sync(ZC_FULL, x, 4 >> i);
        const u32 r = __funnelshift_l(y, y, tp.rot[i]);
        x = (x & tp.keep[i]) | (r & ~tp.keep[i]);
    }
    return x;
}

// A block's bits in the stream: the aligned word holding its first byte, the bit of that word
// where it starts, the index of the word holding its last byte (reads clamp to it).
struct GzSrc {
    const u32* w;
    u32 sh, last;
    __device__ __forceinline__ u32 word(u32 i) const { return __ldg(w + (i < last ? i : last)); }
    // bits pos .. pos + len of the block (len <= 32)
    __device__ __forceinline__ u32 get(u32 pos, u32 len) const {
        const u32 q = pos + sh, i = q >> 5;
        return __funnelshift_r(word(i), word(i + 1u), q) & gz_low(len);
    }
    __device__ __forceinline__ u64 get64(u32 pos, u32 len) const {
        if (len > 32u) return (u64)get(pos, 32u) | ((u64)get(pos + 32u, len - 32u) << 32);
        return get(pos, len);
    }
};
template <typename U> __device__ __forceinline__ U gz_get_u(const GzSrc& s, u32 pos, u32 len);
template <> __device__ __forceinline__ u32 gz_get_u<u32>(const GzSrc& s, u32 pos, u32 len) { return s.get(pos, len); }
template <> __device__ __forceinline__ u64 gz_get_u<u64>(const GzSrc& s, u32 pos, u32 len) { return s.get64(pos, len); }
template <typename T> __device__ __forceinline__ T gz_get_value(const GzSrc& s, u32 pos);
template <> __device__ __forceinline__ float gz_get_value<float>(const GzSrc& s, u32 pos) { return __uint_as_float(s.get(pos, 32u)); }
template <> __device__ __forceinline__ double gz_get_value<double>(const GzSrc& s, u32 pos) {
    return __longlong_as_double((long long)s.get64(pos, 64u));
}

// A block's record (u32 words), written by phase A.
#define GZ_R_FLAGS 0   // GZ_F_*
#define GZ_R_EXC 1     // exception mask
#define GZ_R_SHAPE 2   // n | m << 8 | K << 16 | R << 24
#define GZ_R_RUNW 3    // wd | wc << 8 | S << 16 (S: offset planes)
#define GZ_R_K 4       // k_c in byte c
#define GZ_R_S 5       // s_c in byte c
#define GZ_R_KEY0 6    // the first run's key (every id when R = 1)
#define GZ_R_PD 7      // position of the key deltas
#define GZ_R_PP 8      // position of the permutation
#define GZ_R_PL 9      // position of the offset planes
#define GZ_R_BYTES 10  // byte of the first exception value
#define GZ_R_PC 11     // position of the run counts
#define GZ_R_SRC 12    // GzSrc: sh, last, word address low, high
#define GZ_R_LO 16     // lo_c, one word (f32) or two (f64) per axis
#define GZ_F_SKIP 1u   // not decoded (no block, or an error found in phase A)
#define GZ_F_RAW 2u
#define GZ_F_PERM 4u
#define GZ_F_FORM 8u   // run indices (else a Lehmer code)
template <typename T> struct GzRec {
    static const int WORDS = GZ_R_LO + 4 * (ZT<T>::SIZE / 4);
};

// gz_hash's sums of the table and of the data, taken by the decoder (the bytes are read here
// anyway): the table words of the group's sizes, and the data words whose first byte lies in
// the group's bytes [ex, ex + agg) (zero-padded past data_len), one atomic per warp each.
__device__ __forceinline__ void gz_group_hash(const u8* in, u64 hdr, u64 nb, u64 data_len, u64 g0, u32 size, bool valid,
                                              u64 ex, u32 agg, int lane, u64* ws) {
    // table word j: entries 2j (low half) and 2j + 1 (the group starts at an even entry)
    const u32 nsize = __shfl_down_sync(ZC_FULL, size, 1);
    u32 th = ((lane & 1) == 0 && valid) ? zhash_mix(size | (nsize << 16), (u32)((g0 + (u64)lane) >> 1)) : 0u;
    const u8* data = in + hdr + 2ull * nb;
    const u64 dend = (u64)data + data_len;
    u32 dh = 0;
    const u64 end = ex + agg < data_len ? ex + agg : data_len;
    // (unrolled: the group's first reads of its bytes, issued together)
#pragma unroll 4
    for (u64 i = ((ex + 3ull) >> 2) + (u64)lane; 4ull * i < end; i += 32ull) {
        const u64 a = (u64)data + 4ull * i, wa = a & ~3ull;
        const u32 lo = __ldg((const u32*)wa);
        const u32 hi = wa + 4ull < dend ? __ldg((const u32*)(wa + 4ull)) : 0u;
        u32 v = __funnelshift_r(lo, hi, (u32)(a & 3ull) * 8u);
        if (4ull * i + 4ull > data_len) v &= gz_low((u32)(data_len - 4ull * i) * 8u);
        dh += zhash_mix(v, (u32)i);
    }
    th = warp_sum_u32(th);
    dh = warp_sum_u32(dh);
    if (lane == 0) {
        if (th) atomicAdd((unsigned int*)&ws[GZ_W_HASH], th);
        if (dh) atomicAdd((unsigned int*)&ws[GZ_W_HASH + 1], dh);
    }
}

template <typename T, int D, bool PRESERVE>
__device__ void gz_decode(const u8* in, u64 hdr, u64 data_len, u64 n, u64* ws, T* y) {
    typedef typename GzU<T>::U U;
    typedef typename ZT<T>::code_t C;
    constexpr int RW = GzRec<T>::WORDS;
    constexpr u32 SZ = (u32)ZT<T>::SIZE;
    static_assert(GZ_DEC_GROUP % 2 == 0 && GZ_DEC_GROUP <= 32, "one lane per block, whole table words");
    __shared__ __align__(16) u32 s_rec[GZ_DEC_WARPS][GZ_DEC_GROUP * RW];
    __shared__ __align__(16) T s_out[GZ_DEC_WARPS][32 * D];
    __shared__ u32 s_map[GZ_DEC_WARPS][64];
    __shared__ T s_step[D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 nb = (n + 31ull) >> 5;
    if (threadIdx.x < D) s_step[threadIdx.x] = gz_quantizer<T>(ws, (int)threadIdx.x).step;
    __syncthreads();
    // the warps take their groups in the order they start (a ticket), so that a group's
    // predecessors are running or done when its look-back waits on them
    u32 ticket = 0;
    if (lane == 0) ticket = atomicAdd((unsigned int*)&ws[GZ_W_TICKET], 1u);
    ticket = __shfl_sync(ZC_FULL, ticket, 0);
    const u64 g0 = (u64)ticket * GZ_DEC_GROUP;
    if (g0 >= nb) return;
    u32* rec = s_rec[warp];
    // ---- phase A: lane j parses block g0 + j
    {
        const u64 b = g0 + (u64)lane;
        const bool valid = lane < GZ_DEC_GROUP && b < nb;
        const u32 size = valid ? ((u32)in[hdr + 2ull * b] | ((u32)in[hdr + 2ull * b + 1ull] << 8)) : 0u;
        // the block's offset: the group's sizes scanned, the groups before it by a decoupled
        // look-back (status word per group in ws[GZ_CTRL ..]); the last group checks the total
        const u32 incl = (u32)warp_incl_i32((i32)size, lane);
        const u32 agg = __shfl_sync(ZC_FULL, incl, 31);
        const u64 ex = lookback_exclusive(ws + GZ_CTRL, ticket, (u64)agg, lane);
        const u64 at = ex + (u64)(incl - size);
        if (lane == 0 && g0 + GZ_DEC_GROUP >= nb && ex + agg != data_len)
            atomicOr((unsigned long long*)&ws[GZ_W_ERR], GZ_E_TOTAL);
        gz_group_hash(in, hdr, nb, data_len, g0, size, valid, ex, agg, lane, ws);
        const bool esize = valid && (size == 0u || size > (u32)GzDec<T, D>::BYTES || at + size > data_len);
        if (__any_sync(ZC_FULL, esize) && lane == 0) atomicOr((unsigned long long*)&ws[GZ_W_ERR], GZ_E_SIZE);
        const bool skip = !valid || esize;
        const u32 cnt = valid ? (u32)((n - (b << 5)) < 32ull ? (n - (b << 5)) : 32ull) : 0u;
        // (a skipped lane reads the stream's first word)
        const u64 a0 = skip ? (u64)in : (u64)(in + hdr + 2ull * nb + at);
        GzSrc src;
        src.w = (const u32*)(a0 & ~3ull);
        src.sh = (u32)(a0 & 3ull) * 8u;
        src.last = skip ? 0u : (u32)(((a0 & 3ull) + (u64)size - 1ull) >> 2);
        i64 gmin[D];
        u32 gw[D];
#pragma unroll
        for (int c = 0; c < D; c++) {
            gmin[c] = (i64)ws[GZ_W_CMIN + c];
            gw[c] = (u32)ws[GZ_W_CMAX + c];
        }
        const u32 lmax = (32u / D) < GZ_LMAX_CAP ? (32u / D) : GZ_LMAX_CAP;
        const bool raw = src.get(0, 1u);
        const bool hx = src.get(1, 1u);
        const u32 exc = hx ? src.get(2, cnt) : 0u;
        u32 p = 2u + (hx ? cnt : 0u);
        bool bad = hx && exc == 0u;
        const u32 m = cnt - (u32)__popc(exc);
        bad |= m == 0u;
        U lo[D];
        u32 kp = 0, sp = 0, K = 0, S = 0;
        u32 w[D];
#pragma unroll
        for (int c = 0; c < D; c++) {
            const bool g = src.get(p, 1u);
            const U v = gz_get_u<U>(src, p + 1u, gw[c]);
            const u32 wv = src.get(p + 1u + gw[c], GZ_WIDTH_BITS);
            lo[c] = (U)gmin[c] + (g ? (U)0 : v);
            w[c] = g ? gw[c] : wv;
            p += g ? 1u : 1u + gw[c] + GZ_WIDTH_BITS;
            bad |= w[c] > (u32)ZT<T>::MAX_RATE;
            if (w[c] > (u32)ZT<T>::MAX_RATE) w[c] = 0;
        }
        const u32 level = src.get(p, GZ_LEVEL_BITS);
        p += GZ_LEVEL_BITS;
        bad |= level > lmax;
#pragma unroll
        for (int c = 0; c < D; c++) {
            const u32 k = w[c] < level ? w[c] : level;
            kp |= k << (8 * c);
            sp |= (w[c] - k) << (8 * c);
            K += k;
            S += w[c] - k;
        }
        u32 R = 1, key0 = 0, wd = 0, wc = 0, pd = 0, pc = 0;
        if (K > 0u) {
            R = src.get(p, 5u) + 1u;
            p += 5u;
            bad |= R > m;
            key0 = src.get(p, K);
            p += K;
            if (R > 1u) {
                wd = src.get(p, 6u);
                p += 6u;
                bad |= wd > K;
                pd = p;
                p += (R - 1u) * wd;
                wc = src.get(p, 3u);
                p += 3u;
                bad |= wc > 5u;
                pc = p;
                p += (R - 1u) * wc;
            }
        }
        u32 flags = 0, pp = 0;
        if (PRESERVE && src.get(p, 1u)) {
            const bool form = src.get(p + 1u, 1u);
            p += 2u;
            pp = p;
            p += form ? m * gz_clog2(R) : gz_lehmer_bits(m);
            flags |= GZ_F_PERM | (form ? GZ_F_FORM : 0u);
        } else if (PRESERVE) {
            p += 1u;
        }
        const u32 pl = p;
        p += S * m;
        const u32 p8 = (p + 7u) & ~7u;
        bad |= src.get(p, p8 - p) != 0u;
        const u32 bytes = p8 >> 3;
        bad |= bytes + (cnt - m) * D * SZ != size;
        if (raw) {
            // zero padding, then the values
            bad = src.get(1, 7u) != 0u || size != 1u + cnt * D * SZ;
            flags = GZ_F_RAW;
        }
        bad &= !skip;
        if (__any_sync(ZC_FULL, bad) && lane == 0) atomicOr((unsigned long long*)&ws[GZ_W_ERR], GZ_E_BLOCK);
        if (skip || bad) flags = GZ_F_SKIP;
        if (lane < GZ_DEC_GROUP) {
            uint4* r = (uint4*)(rec + lane * RW);
            r[0] = make_uint4(flags, exc, cnt | m << 8 | K << 16 | R << 24, wd | wc << 8 | S << 16);
            r[1] = make_uint4(kp, sp, key0, pd);
            r[2] = make_uint4(pp, pl, bytes, pc);
            r[3] = make_uint4(src.sh, src.last, (u32)(u64)src.w, (u32)((u64)src.w >> 32));
            u32* l = rec + lane * RW + GZ_R_LO;
#pragma unroll
            for (int c = 0; c < D; c++) {
                if (SZ == 8) {
                    l[2 * c] = (u32)(u64)lo[c];
                    l[2 * c + 1] = (u32)((u64)lo[c] >> 32);
                } else {
                    l[c] = (u32)lo[c];
                }
            }
        }
    }
    __syncwarp();
    // ---- phase B: the warp on each block
    T step[D];
#pragma unroll
    for (int c = 0; c < D; c++) step[c] = s_step[c];
    T* stage = s_out[warp];
    u32* smap = s_map[warp];
    const bool al16 = (((u64)y) & 15ull) == 0ull;
    const GzTp tp(lane);
    for (int j = 0; j < GZ_DEC_GROUP; j++) {
        const u64 b = g0 + (u64)j;
        if (b >= nb) break;
        const u32* rj = rec + j * RW;
        const uint4 r0 = *(const uint4*)rj;
        if (r0.x & GZ_F_SKIP) continue;
        const uint4 r3 = *(const uint4*)(rj + GZ_R_SRC);
        GzSrc src;
        src.w = (const u32*)(((u64)r3.w << 32) | (u64)r3.z);
        src.sh = r3.x;
        src.last = r3.y;
        const u32 exc = r0.y, nn = r0.z & 0xffu, m = (r0.z >> 8) & 0xffu, K = (r0.z >> 16) & 0xffu, R = r0.z >> 24;
        T* yb = y + (b << 5) * (u64)D;
        if (r0.x & GZ_F_RAW) {
            for (u32 i = (u32)lane; i < nn * D; i += 32u) yb[i] = gz_get_value<T>(src, 8u + i * SZ * 8u);
            continue;
        }
        const uint4 r1 = *(const uint4*)(rj + 4);
        const uint4 r2 = *(const uint4*)(rj + 8);
        const u32 wd = r0.w & 0xffu, wc = (r0.w >> 8) & 0xffu, S = r0.w >> 16;
        const u32 kp = r1.x, sp = r1.y, key0 = r1.z, pd = r1.w;
        const u32 pp = r2.x, pl = r2.y, bytes = r2.z, pc = r2.w;
        const bool inr = (u32)lane < m;
        // the run of every sorted position and its id (one run: every id is the first key)
        u32 id = key0, rcnt = lane == 0 ? m : 0u, rstart = 0;
        if (R > 1u) {
            const u32 stp = (lane >= 1 && (u32)lane < R) ? src.get(pd + ((u32)lane - 1u) * wd, wd) + 1u : 0u;
            u32 key;
            bool ok;
            if (K <= 26u) {
                // (no key can wrap: K <= 26 bounds the first key and every step by 2^26)
                key = key0 + (u32)warp_incl_i32((i32)stp, lane);
                ok = (__shfl_sync(ZC_FULL, key, (int)R - 1) >> K) == 0u;
            } else {
                const u64 k64 = (u64)key0 + warp_incl_u64((u64)stp, lane);
                ok = (__shfl_sync(ZC_FULL, k64, (int)R - 1) >> K) == 0ull;
                key = (u32)k64;
            }
            // counts of the first R - 1 runs: their scan gives every run's start (the last
            // run's too) and their sum
            rcnt = (u32)lane < R - 1u ? src.get(pc + (u32)lane * wc, wc) + 1u : 0u;
            const u32 cincl = (u32)warp_incl_i32((i32)rcnt, lane);
            const u32 used = __shfl_sync(ZC_FULL, cincl, 31);
            if (!ok || used >= m) {
                if (lane == 0) atomicOr((unsigned long long*)&ws[GZ_W_ERR], GZ_E_BLOCK);
                continue;
            }
            rstart = cincl - rcnt;
            if ((u32)lane == R - 1u) rcnt = m - used;
            const u32 startmask = gz_wor((u32)lane < R ? (1u << (rstart & 31u)) : 0u);
            const u32 run_of = (u32)__popc(startmask & gz_upto(lane)) - 1u;
            id = __shfl_sync(ZC_FULL, key, (int)(run_of & 31u));
        }
        // permutation: sorted position -> coded index
        u32 perm = (u32)lane;
        if (PRESERVE && (r0.x & GZ_F_PERM)) {
            if (r0.x & GZ_F_FORM) {
                const u32 width = gz_clog2(R);
                const u32 ri = inr ? src.get(pp + (u32)lane * width, width) : 0xffffffffu;
                const u32 grp = __match_any_sync(ZC_FULL, ri);
                const u32 rc = __shfl_sync(ZC_FULL, rcnt, (int)(ri & 31u));
                const u32 rs = __shfl_sync(ZC_FULL, rstart, (int)(ri & 31u));
                if (__any_sync(ZC_FULL, inr && (ri >= R || (u32)__popc(grp) != rc))) {
                    if (lane == 0) atomicOr((unsigned long long*)&ws[GZ_W_ERR], GZ_E_BLOCK);
                    continue;
                }
                if (inr) smap[32 + rs + __popc(grp & gz_lanemask_lt(lane))] = (u32)lane;
                __syncwarp();
                perm = inr ? smap[32 + lane] : (u32)lane;
            } else {
                const u32 lb2 = gz_lehmer_bits(m);
                u32 digit = 0;
                if (inr) digit = src.get(pp + lb2 - gz_lehmer_bits(m - (u32)lane), gz_clog2(m - (u32)lane));
                if (__any_sync(ZC_FULL, inr && digit >= m - (u32)lane)) {
                    if (lane == 0) atomicOr((unsigned long long*)&ws[GZ_W_ERR], GZ_E_BLOCK);
                    continue;
                }
                // digit i is the rank of perm[i] among perm[i..m]; adding the earlier positions j
                // (from i - 1 down) raises it by one whenever perm[j] ranks below it
                u32 rk = digit;
                for (int q = (int)m - 2; q >= 0; q--) {
                    const u32 dq = __shfl_sync(ZC_FULL, digit, q);
                    rk += (q < lane && dq <= rk) ? 1u : 0u;
                }
                if (inr) perm = rk;
            }
        }
        // offset planes: lane k reads plane g + k, the transpose gives sorted position i bit i of
        // every plane (plane g + k at bit 31 - k after the reversal: an axis' planes form one
        // field, most significant first)
        U off[D];
#pragma unroll
        for (int c = 0; c < D; c++) off[c] = 0;
        if (S <= 32u) {
            const u32 pw = (u32)lane < S ? src.get(pl + (u32)lane * m, m) : 0u;
            const u32 t = __brev(gz_transpose32f(pw, tp));
            // axis c's planes [pc, pc + s) are bits 31 - pc down to 32 - pc - s of t
            u32 pc = 0;
#pragma unroll
            for (int c = 0; c < D; c++) {
                const u32 s = (sp >> (8 * c)) & 0xffu;
                off[c] = (U)gz_shr(gz_shl(t, pc), 32u - s);
                pc += s;
            }
        } else {
            for (u32 g = 0; g < S; g += 32u) {
                const u32 pw = g + (u32)lane < S ? src.get(pl + (g + (u32)lane) * m, m) : 0u;
                const u32 t = __brev(gz_transpose32f(pw, tp));
                u32 pcum = 0;
#pragma unroll
                for (int c = 0; c < D; c++) {
                    const u32 s = (sp >> (8 * c)) & 0xffu;
                    const u32 a = pcum > g ? pcum : g, e = pcum + s, bb = e < g + 32u ? e : g + 32u;
                    if (a < bb) off[c] |= (U)((t >> (32u - (bb - g))) & gz_low(bb - a)) << (e - bb);
                    pcum = e;
                }
            }
        }
        // block positions of the coded particles (preserve, with exceptions)
        if (PRESERVE && exc) {
            if ((u32)lane < nn && !((exc >> lane) & 1u)) smap[__popc(~exc & gz_lanemask_lt(lane))] = (u32)lane;
            __syncwarp();
        }
        if (inr) {
            const u32 at = PRESERVE ? (exc ? smap[perm] : perm) : (u32)lane;
            // axis c's segment: the k bits of the id after those of the axes before it (its
            // first bit moved to bit 31, then down to bit 0)
            u32 lsh = 32u - K;
#pragma unroll
            for (int c = 0; c < D; c++) {
                const u32 k = (kp >> (8 * c)) & 0xffu, s = (sp >> (8 * c)) & 0xffu;
                const u32 seg = gz_shr(gz_shl(id, lsh), 32u - k);
                lsh += k;
                U lo;
                if (SZ == 8)
                    lo = (U)(((u64)rj[GZ_R_LO + 2 * c + 1] << 32) | (u64)rj[GZ_R_LO + 2 * c]);
                else
                    lo = (U)rj[GZ_R_LO + c];
                const U uu = ((U)seg << s) | off[c];
                // the code's low bits are all its decoding reads (f32 codes are i32)
                stage[at * D + c] = gz_dec_step(step[c], (i64)(C)(lo + uu));
            }
        }
        if (exc && ((exc >> lane) & 1u)) {
            const u32 e = (u32)__popc(exc & gz_lanemask_lt(lane));
            const u32 at = PRESERVE ? (u32)lane : m + e;
#pragma unroll
            for (int c = 0; c < D; c++) stage[at * D + c] = gz_get_value<T>(src, 8u * (bytes + (e * D + c) * SZ));
        }
        __syncwarp();
        if (al16 && nn == 32u) {
            constexpr int V = 32 * D * ZT<T>::SIZE / 16;
            const uint4* s4 = (const uint4*)stage;
            uint4* y4 = (uint4*)yb;
#pragma unroll
            for (int i = lane; i < V; i += 32) y4[i] = s4[i];
        } else {
            for (u32 i = (u32)lane; i < nn * D; i += 32u) yb[i] = stage[i];
        }
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points. Decoding takes the stream's parameters in the ctrl words (the host writes the
// axis words, CMIN = G_c and CMAX = gw_c from the header).
#define GZ_RANGE(TN, T, D, ENCB)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256) gz_range_##TN##_d##D(const T* x, u64 n, u64* ws) {     \
        gz_range<T, D>(x, n, ws);                                                                            \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) gz_codes_##TN##_d##D(const T* x, u64 n, u64* ws) {     \
        gz_codes<T, D>(x, n, ws);                                                                            \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(GZ_WARPS * 32, ENCB)                                        \
        gz_encode_##TN##_d##D##_p(const T* x, u64 n, u64* ws, u8* out, u64 hdr, u64 cap) {                   \
        gz_encode<T, D, true>(x, n, ws, out, hdr, cap, nullptr);                                             \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(GZ_WARPS * 32, ENCB)                                        \
        gz_encode_##TN##_d##D##_r(const T* x, u64 n, u64* ws, u8* out, u64 hdr, u64 cap, u64* perm) {        \
        gz_encode<T, D, false>(x, n, ws, out, hdr, cap, perm);                                               \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(GZ_DEC_WARPS * 32, GZ_DEC_MINB)                             \
        gz_decode_##TN##_d##D##_p(const u8* in, u64 hdr, u64 data_len, u64 n, u64* ws, T* y) {              \
        gz_decode<T, D, true>(in, hdr, data_len, n, ws, y);                                                  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(GZ_DEC_WARPS * 32, GZ_DEC_MINB)                             \
        gz_decode_##TN##_d##D##_r(const u8* in, u64 hdr, u64 data_len, u64 n, u64* ws, T* y) {              \
        gz_decode<T, D, false>(in, hdr, data_len, n, ws, y);                                                 \
    }

GZ_RANGE(f32, float, 1, GZ_ENC_MINB_F32)
GZ_RANGE(f32, float, 2, GZ_ENC_MINB_F32)
GZ_RANGE(f32, float, 3, GZ_ENC_MINB_F32)
GZ_RANGE(f32, float, 4, GZ_ENC_MINB_F32)
GZ_RANGE(f64, double, 1, GZ_ENC_MINB_F64)
GZ_RANGE(f64, double, 2, GZ_ENC_MINB_F64)
GZ_RANGE(f64, double, 3, GZ_ENC_MINB_F64)
GZ_RANGE(f64, double, 4, GZ_ENC_MINB_F64)

extern "C" __global__ void gz_params_f32(const float* x, u64 d, int noa, double e, int spec, u64* ws) {
    gz_params<float>(x, d, noa, e, spec, ws);
}
extern "C" __global__ void gz_params_f64(const double* x, u64 d, int noa, double e, int spec, u64* ws) {
    gz_params<double>(x, d, noa, e, spec, ws);
}
extern "C" __global__ void gz_init_k(u64* ws, u64 nstatus) { gz_init(ws, nstatus); }
// the identity permutation: a reorder stream that fell back to storing its particles verbatim
extern "C" __global__ void __launch_bounds__(256) gz_iota_k(u64* perm, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) perm[i] = i;
}
extern "C" __global__ void gz_hash_k(const u8* out, u64 hdr, u64 nb, u64 data_len, u64 raw, u64* ws) {
    gz_hash(out, hdr, nb, data_len, raw, ws);
}
