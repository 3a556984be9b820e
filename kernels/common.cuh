// zcomm shared device helpers (compiled by NVRTC with --fmad=false; no standard headers).
//
// Everything here mirrors a Rust function bit for bit:
//   zhash_mix           <-> src/format/mod.rs zhash_mix
//   zlog2 / zexp2 / Q*  <-> src/quant/mod.rs (IEEE + - * / only, explicit _rn intrinsics)
// plus warp scans, a 32x32 warp bit transpose (bit planes) and a decoupled look-back prefix sum.
#pragma once

typedef unsigned char u8;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define ZC_FULL 0xffffffffu
// Bytes of a stream header (src/format HEADER_LEN).
#define ZC_HEADER_LEN 96ull

// ---------------------------------------------------------------------------------------------
// zhash (FORMAT.md): sum_i mix(w_i, i) xor (n * 0x27D4EB2F), all mod 2^32.
__device__ __forceinline__ u32 zhash_mix(u32 w, u32 i) {
    u32 h = w ^ (i * 0x9E3779B9u);  // MurmurHash3 fmix32 of the index-salted word
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}
__device__ __forceinline__ u32 zhash_final(u32 sum, u32 nwords) { return sum ^ (nwords * 0x27D4EB2Fu); }

// ---------------------------------------------------------------------------------------------
// Warp helpers.
__device__ __forceinline__ u32 warp_sum_u32(u32 v) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) v += __shfl_xor_sync(ZC_FULL, v, s);
    return v;
}
__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) v += __shfl_xor_sync(ZC_FULL, v, s);
    return v;
}
__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) {
        u64 o = __shfl_xor_sync(ZC_FULL, v, s);
        v = o > v ? o : v;
    }
    return v;
}
// Inclusive scans over the 32 lanes.
__device__ __forceinline__ u32 warp_incl_u32(u32 v, int lane) {
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        u32 o = __shfl_up_sync(ZC_FULL, v, s);
        if (lane >= s) v += o;
    }
    return v;
}
// Each step adds under the predicate the shuffle itself returns (source lane in range): two
// instructions a step instead of shuffle, select and add, for the same sums.
__device__ __forceinline__ i32 warp_incl_i32(i32 v, int lane) {
#pragma unroll
    for (int s = 1; s < 32; s <<= 1)
        asm("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\t"
            "shfl.sync.up.b32 t|p, %0, %1, 0, 0xffffffff;\n\t"
            "@p add.s32 %0, %0, t;\n\t}"
            : "+r"(v)
            : "r"(s));
    (void)lane;
    return v;
}
__device__ __forceinline__ i64 warp_incl_i64(i64 v, int lane) {
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        i64 o = __shfl_up_sync(ZC_FULL, v, s);
        if (lane >= s) v = (i64)((u64)v + (u64)o);
    }
    return v;
}
__device__ __forceinline__ u64 warp_incl_u64(u64 v, int lane) {
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        u64 o = __shfl_up_sync(ZC_FULL, v, s);
        if (lane >= s) v += o;
    }
    return v;
}

// 32x32 bit-matrix transpose across a warp: on entry lane r holds row r; on exit lane c holds
// column c (bit r of the result = bit c of row r). Turns 32 magnitudes into bit planes and back.
// Five butterfly stages; in the half-word and byte stages every moved group is whole bytes, so
// one byte permute with a per-lane selector does the select, shifts and masks.
__device__ __forceinline__ u32 warp_transpose32(u32 x, int lane) {
    u32 y = __shfl_xor_sync(ZC_FULL, x, 16);
    x = __byte_perm(x, y, (lane & 16) ? 0x3276u : 0x5410u);  // upper: (y >> 16) | x.hi; lower: x.lo | (y << 16)
    y = __shfl_xor_sync(ZC_FULL, x, 8);
    x = __byte_perm(x, y, (lane & 8) ? 0x3715u : 0x6240u);  // the same for the odd / even bytes
    const u32 masks[3] = {0x0F0F0F0Fu, 0x33333333u, 0x55555555u};
#pragma unroll
    for (int i = 0; i < 3; i++) {
        const int s = 4 >> i;
        const u32 m = masks[i];
        y = __shfl_xor_sync(ZC_FULL, x, s);
        x = (lane & s) ? (((y >> s) & m) | (x & ~m)) : ((x & m) | ((y << s) & ~m));
    }
    return x;
}

// ---------------------------------------------------------------------------------------------
// Decoupled look-back over per-chunk sizes. status[c] = (value << 2) | flag,
// flag 1 = aggregate of chunk c only, 2 = inclusive prefix through c. Called by one whole warp;
// returns the exclusive prefix (sum of the values of chunks 0..c-1) in every lane. PAUSE_NS > 0:
// the warp sleeps that long between polls of a window that is not ready, so that a chunk waiting
// on predecessors still at work does not take issue slots from them (gpz's encoder).
__device__ __forceinline__ void lb_publish(u64* status, u32 c, u64 value, u64 flag) {
    atomicExch(status + c, (value << 2) | flag);
}
template <u32 PAUSE_NS = 0>
__device__ u64 lookback_exclusive(u64* status, u32 c, u64 aggregate, int lane) {
    if (c == 0) {
        if (lane == 0) lb_publish(status, 0, aggregate, 2);
        return 0;
    }
    if (lane == 0) lb_publish(status, c, aggregate, 1);
    u64 excl = 0;
    long long end = (long long)c;  // look at chunks [end-32, end)
    while (true) {
        long long i = end - 32 + lane;
        u64 v = (i < 0) ? 2ull : 0ull;  // chunks before 0: inclusive 0
        while (true) {
            if ((v & 3ull) == 0ull) v = *((volatile u64*)(status + i));
            if (__all_sync(ZC_FULL, (v & 3ull) != 0ull)) break;
            if constexpr (PAUSE_NS > 0) __nanosleep(PAUSE_NS);
        }
        u32 incl = __ballot_sync(ZC_FULL, (v & 3ull) == 2ull);
        if (incl) {
            int hi = 31 - __clz(incl);
            u64 mine = lane >= hi ? (v >> 2) : 0ull;
            excl += warp_sum_u64(mine);
            break;
        }
        excl += warp_sum_u64(v >> 2);
        end -= 32;
    }
    if (lane == 0) lb_publish(status, c, excl + aggregate, 2);
    return excl;
}

// ---------------------------------------------------------------------------------------------
// Verified quantization (src/quant/mod.rs). Constants as bit patterns so that they are exact.
__device__ __forceinline__ double zc_bits_f64(u64 b) { return __longlong_as_double((long long)b); }
#define ZC_SQRT2 zc_bits_f64(0x3ff6a09e667f3bcdull)
#define ZC_LOG2E zc_bits_f64(0x3ff71547652b82feull)
#define ZC_LN2 zc_bits_f64(0x3fe62e42fefa39efull)

__device__ __forceinline__ bool zc_isfinite(double v) {
    return (((u64)__double_as_longlong(v) >> 52) & 0x7ffull) != 0x7ffull;
}
__device__ __forceinline__ bool zc_isfinite(float v) {
    return ((__float_as_uint(v) >> 23) & 0xffu) != 0xffu;
}
// One ulp down for a positive finite v, else v (quant::pred).
__device__ __forceinline__ double zc_pred(double v) {
    if (v > 0.0 && zc_isfinite(v)) return zc_bits_f64((u64)__double_as_longlong(v) - 1ull);
    return v;
}

__device__ double zlog2(double x) {
    u64 bits = (u64)__double_as_longlong(x);
    i64 e = (i64)((bits >> 52) & 0x7ffull);
    if (e == 0) {
        double y = __dmul_rn(x, 18446744073709551616.0);
        bits = (u64)__double_as_longlong(y);
        e = (i64)((bits >> 52) & 0x7ffull) - 64;
    }
    e -= 1023;
    double m = zc_bits_f64((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m > ZC_SQRT2) {
        m = __dmul_rn(m, 0.5);
        e += 1;
    }
    double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
    double s2 = __dmul_rn(s, s);
    double acc = __ddiv_rn(1.0, 25.0);
    double k = 23.0;
    while (k >= 1.0) {
        acc = __dadd_rn(__dmul_rn(acc, s2), __ddiv_rn(1.0, k));
        k = __dsub_rn(k, 2.0);
    }
    double ln_m = __dmul_rn(__dmul_rn(2.0, s), acc);
    return __dadd_rn(__dmul_rn(ln_m, ZC_LOG2E), (double)e);
}

__device__ __forceinline__ double zc_pow2i(i64 k) { return zc_bits_f64(((u64)(k + 1023)) << 52); }

__device__ double zexp2(double y) {
    if (y != y) return __longlong_as_double(0x7ff8000000000000ll);
    if (y > 1100.0) return __longlong_as_double(0x7ff0000000000000ll);
    if (y < -1100.0) return 0.0;
    double k = rint(y);
    double f = __dmul_rn(__dsub_rn(y, k), ZC_LN2);
    double p = 1.0;
    double i = 14.0;
    while (i >= 1.0) {
        p = __dadd_rn(__ddiv_rn(__dmul_rn(p, f), i), 1.0);
        i = __dsub_rn(i, 1.0);
    }
    i64 ki = (i64)k;
    i64 k1 = ki / 2;
    i64 k2 = ki - k1;
    return __dmul_rn(__dmul_rn(p, zc_pow2i(k1)), zc_pow2i(k2));
}

// Per-dtype traits: code type (i32 for f32 codes, |q| < 2^29; i64 for f64), limits, conversions.
template <typename T> struct ZT;
template <> struct ZT<float> {
    typedef i32 code_t;
    typedef u32 bits_t;
    static const int SIZE = 4;
    static const int MAX_RATE = 30;
    __device__ static double qmax() { return 536870912.0; }
    __device__ static float mul(float a, float b) { return __fmul_rn(a, b); }
    __device__ static float rnd(float a) { return rintf(a); }
    __device__ static float absv(float a) { return fabsf(a); }
    __device__ static code_t to_code(float a) { return (i32)a; }
    __device__ static float from_code(i64 q) {
        // same rounding either way; the 32-bit conversion is the fast one
        return q == (i64)(i32)q ? __int2float_rn((i32)q) : __ll2float_rn(q);
    }
    __device__ static float from_f64(double v) { return __double2float_rn(v); }
    __device__ static bits_t bits(float v) { return __float_as_uint(v); }
    __device__ static float from_bits(bits_t b) { return __uint_as_float(b); }
};
template <> struct ZT<double> {
    typedef i64 code_t;
    typedef u64 bits_t;
    static const int SIZE = 8;
    static const int MAX_RATE = 62;
    __device__ static double qmax() { return 2305843009213693952.0; }
    __device__ static double mul(double a, double b) { return __dmul_rn(a, b); }
    __device__ static double rnd(double a) { return rint(a); }
    __device__ static double absv(double a) { return fabs(a); }
    __device__ static code_t to_code(double a) { return (i64)a; }
    __device__ static double from_code(i64 q) { return __ll2double_rn(q); }
    __device__ static double from_f64(double v) { return v; }
    __device__ static bits_t bits(double v) { return (u64)__double_as_longlong(v); }
    __device__ static double from_bits(bits_t b) { return __longlong_as_double((i64)b); }
};

// Quantizer parameters (QuantParams::quantizer).
template <typename T> struct ZQ {
    T step;
    T inv;
    double step64;
    double eb;
};
// The quantizer of a kernel's parameters (every codec kernel takes these four).
template <typename T> __device__ __forceinline__ ZQ<T> zq_make(T step, T inv, double step64, double eb) {
    ZQ<T> q;
    q.step = step;
    q.inv = inv;
    q.step64 = step64;
    q.eb = eb;
    return q;
}

template <typename T, bool REL> __device__ __forceinline__ T zq_decode(const ZQ<T>& q, i64 c) {
    if (REL) {
        if (c == 0) return ZT<T>::from_f64(0.0);
        // |c| - QHALF in integers, then one rounding conversion (quant::Quantizer::decode)
        u64 a = c < 0 ? (0ull - (u64)c) : (u64)c;
        const i64 l = (i64)(a - (u64)(ZT<T>::qmax() * 0.5));
        double m = __dmul_rn(__ll2double_rn(l), q.step64);
        double mag = zexp2(m);
        return ZT<T>::from_f64(c < 0 ? -mag : mag);
    } else {
        return ZT<T>::mul(ZT<T>::from_code(c), q.step);
    }
}

template <typename T, bool REL> __device__ __forceinline__ bool zq_within(const ZQ<T>& q, T x, T r) {
    double xv = (double)x;
    double rv = (double)r;
    if (!zc_isfinite(rv)) return false;
    double d = fabs(__dsub_rn(xv, rv));
    bool exact = true;
    if (ZT<T>::SIZE == 8) {
        double a = fabs(xv), b = fabs(rv);
        exact = rv == 0.0 || xv == rv ||
                (((xv < 0.0) == (rv < 0.0)) && __dmul_rn(b, 0.5) <= a && a <= __dmul_rn(b, 2.0));
    }
    double limit = REL ? zc_pred(__dmul_rn(q.eb, fabs(xv))) : q.eb;
    return exact && d <= limit;
}

// f32 abs/noa fast path of Quantizer::encode (same answers): the f32 difference d32 = fl(|x - r|)
// is a monotone rounding of the exact difference d, so d32 < fl(eb) proves d <= eb and
// d32 > fl(eb) proves d > eb; only d32 == fl(eb) needs the exact f64 comparison. Non-finite x
// fails the range test like the full path.
__device__ __forceinline__ bool zq_encode_f32_abs(const ZQ<float>& q, float eb32, float x, i32& code) {
    float p = __fmul_rn(x, q.inv);
    if (!(fabsf(p) < 536870912.0f)) return false;
    i32 c = (i32)rintf(p);
    code = c;
    float r = __fmul_rn(__int2float_rn(c), q.step);
    float d32 = fabsf(__fsub_rn(x, r));
    if (d32 < eb32) return true;
    if (d32 > eb32) return false;
    return zq_within<float, false>(q, x, r);
}

// The code of a value already known to be representable (the encoder's second pass).
template <typename T, bool REL> __device__ __forceinline__ typename ZT<T>::code_t zq_code(const ZQ<T>& q, T x) {
    typedef typename ZT<T>::code_t C;
    if (REL) {
        double v = (double)x;
        if (v == 0.0) return 0;
        const double qh = ZT<T>::qmax() * 0.5;
        double l = rint(__ddiv_rn(zlog2(fabs(v)), q.step64));
        // the offset is added in integers: l + 2^60 in f64 would round l (zq_encode)
        C m = (C)((i64)l + (i64)qh);
        return v < 0.0 ? -m : m;
    } else {
        return ZT<T>::to_code(ZT<T>::rnd(ZT<T>::mul(x, q.inv)));
    }
}

// Quantizer::encode: returns false when x must be stored losslessly.
template <typename T, bool REL>
__device__ __forceinline__ bool zq_encode(const ZQ<T>& q, T x, typename ZT<T>::code_t& code) {
    typedef typename ZT<T>::code_t C;
    if (!zc_isfinite(x)) return false;
    C c;
    if (REL) {
        double v = (double)x;
        if (v == 0.0) {
            code = 0;
            return ZT<T>::bits(x) == 0;
        }
        const double qh = ZT<T>::qmax() * 0.5;
        double l = rint(__ddiv_rn(zlog2(fabs(v)), q.step64));
        // |l| < QHALF (false for NaN; exact, QHALF is a power of two): l converts to i64
        // exactly and the offset is added in integers (quant::Quantizer::encode)
        if (!(fabs(l) < qh)) return false;
        C m = (C)((i64)l + (i64)qh);
        c = v < 0.0 ? -m : m;
    } else {
        T p = ZT<T>::mul(x, q.inv);
        if (!((double)ZT<T>::absv(p) < ZT<T>::qmax())) return false;
        c = ZT<T>::to_code(ZT<T>::rnd(p));
    }
    code = c;
    T r = zq_decode<T, REL>(q, (i64)c);
    return zq_within<T, REL>(q, x, r);
}

// Order-preserving integer key of a float (for min/max atomics).
__device__ __forceinline__ u64 zc_key(float v) {
    u32 b = __float_as_uint(v);
    return (u64)((b & 0x80000000u) ? ~b : (b | 0x80000000u));
}
__device__ __forceinline__ u64 zc_key(double v) {
    u64 b = (u64)__double_as_longlong(v);
    return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}
