// zcomm pfpl codec (FORMAT.md "pfpl chunks"), the GPU side of src/codec/pfpl.rs: same bytes.
//
// One thread block (8 warps) per 16 KiB chunk (4,096 f32 / 2,048 f64 values), all four stages
// fused in shared memory:
//   compress:   quantize to words -> differences in negabinary -> warp bit transposes (planes)
//               -> zero-byte elimination (four bitmap levels, block scans for the kept bytes)
//               -> u16 table entry + chunk offset by decoupled look-back -> byte-aligned copy-out
//               (aligned 32-bit stores with funnel shifts, byte stores at the ends) with the zhash.
//   decompress: offset by look-back over the u16 table sizes -> byte-aligned load (aligned words
//               + funnel shift) + chunk hash -> rebuild the bitmaps top-down with prefix popcounts
//               -> planes -> transposes -> block-wide prefix sum of the differences -> values.
// The shuffled bytes D are plane-major over the chunk (plane p of group g is D word p G + g); both
// directions keep them in shared memory in a padded group-major layout (pf_slot) and address the
// zero-byte stages through it.
// Format version 2 (FORMAT.md): the table is n_chunks u16 sizes at offset 96, payloads follow
// byte-aligned and unpadded; the header's data checksum is the zhash of the chunk hashes, which
// both directions accumulate as sum_i mix(c_i, i) in ctrl[PF_DHASH] (the host finishes and, on
// decompression, compares it: a mismatch is reported after the kernel, whose output is then
// unspecified). Every structural check of the CPU decoder is made; failures set ctrl[4] bits,
// never a bad access. The other ctrl words and error bits have their kernels/blocked.cu meaning.
#include "common.cuh"

#define PF_THREADS 256  // 256 or 512 (host: PFPL_THREADS in src/gpu/mod.rs)
#define PF_WARPS (PF_THREADS / 32)
#define PF_MINB (1536 / PF_THREADS)  // blocks per SM the register budget must allow (75 % occupancy)
#define PF_BYTES 16384u
#define PF_WPT (2048 / PF_THREADS)  // shuffled u64 words (= B1 bytes) per thread: 8 / 4

#define PF_TICKET 0
#define PF_DONE 1
#define PF_HASH 2
#define PF_PAYLOAD 3
#define PF_ERR 4
#define PF_DHASH 5  // sum over chunks of zhash_mix(chunk hash c_i, i) (host: C_DHASH)

typedef unsigned short pf_u16;  // chunk-table entries

#define PF_E_RANGE 2ull
#define PF_E_META 8ull
#define PF_E_TOTAL 16ull
#define PF_E_TABLE 32ull

template <typename T> struct PF;
template <> struct PF<float> {
    typedef u32 U;
    static const int W = 32;  // bits per word = values per shuffle group
    static const int M = 23;  // bin words are the words below 2^M
    __device__ static U flip() { return 0xFF800000u; }
    __device__ static U nbm() { return 0xAAAAAAAAu; }
    __device__ static i64 qhalf() { return 268435456ll; }  // 2^28
};
template <> struct PF<double> {
    typedef u64 U;
    static const int W = 64;
    static const int M = 52;
    __device__ static U flip() { return 0xFFF0000000000000ull; }
    __device__ static U nbm() { return 0xAAAAAAAAAAAAAAAAull; }
    __device__ static i64 qhalf() { return 1152921504606846976ll; }  // 2^60
};

__device__ __forceinline__ u64 pf_zigzag(i64 v) { return ((u64)v << 1) ^ (u64)(v >> 63); }
__device__ __forceinline__ i64 pf_unzigzag(u64 z) { return (i64)(z >> 1) ^ -(i64)(z & 1ull); }

// zq_encode, with a cheaper but identical f32 abs path: |code| < 2^29 fits 32 bits, and the
// int -> float conversion rounds the same integer to nearest either way. The bound check is
// made in f32 (zq_encode_f32_abs; f64 only on a tie with fl(eb)) instead of three f32 -> f64
// conversions per value.
template <typename T, bool REL> struct PQ {
    __device__ static __forceinline__ bool enc(const ZQ<T>& q, float, T x, typename ZT<T>::code_t& code) {
        return zq_encode<T, REL>(q, x, code);
    }
};
template <> struct PQ<float, false> {
    __device__ static __forceinline__ bool enc(const ZQ<float>& q, float eb32, float x, i32& code) {
        return zq_encode_f32_abs(q, eb32, x, code);
    }
};

// Value -> word (Mapper::word). Sets `collide` when a lossless value has a bin-range pattern.
template <typename T, bool REL>
__device__ __forceinline__ typename PF<T>::U pf_word(const ZQ<T>& q, float eb32, T x, bool& collide) {
    typedef typename PF<T>::U U;
    typedef typename ZT<T>::code_t C;
    const u64 lim = 1ull << PF<T>::M;
    C code = 0;
    if (PQ<T, REL>::enc(q, eb32, x, code)) {
        const i64 c = (i64)code;
        if (REL) {
            if (c == 0) return (U)0;
            const u64 a = c < 0 ? 0ull - (u64)c : (u64)c;
            const u64 z = pf_zigzag((i64)a - PF<T>::qhalf());
            if (z < (lim >> 1) - 1ull) return (U)(1ull + ((z << 1) | (c < 0 ? 1ull : 0ull)));
        } else {
            const u64 z = pf_zigzag(c);
            if (z < lim) return (U)z;
        }
    }
    const U b = ZT<T>::bits(x);
    const U w = REL ? (U)(b ^ PF<T>::flip()) : b;
    if ((u64)w < lim) collide = true;
    return w;
}

// Word -> value (Mapper::value).
template <typename T, bool REL> __device__ __forceinline__ T pf_value(const ZQ<T>& q, typename PF<T>::U w) {
    const u64 lim = 1ull << PF<T>::M;
    if ((u64)w < lim) {
        i64 c;
        if (REL) {
            if (w == 0) {
                c = 0;
            } else {
                const u64 v = (u64)w - 1ull;
                const i64 m = pf_unzigzag(v >> 1) + PF<T>::qhalf();
                c = (v & 1ull) ? -m : m;
            }
        } else {
            // bins are below 2^(M-1) in magnitude: a 32-bit (f32) or biased (f64) conversion
            // is exact, so this equals zq_decode's q * step bit for bit
            c = pf_unzigzag((u64)w);
            T qf;
            if (sizeof(T) == 4) {
                qf = (T)__int2float_rn((int)c);
            } else {
                qf = (T)__dsub_rn(__longlong_as_double((long long)(0x4338000000000000ull + (u64)c)),
                                  6755399441055744.0);
            }
            return ZT<T>::mul(qf, q.step);
        }
        return zq_decode<T, REL>(q, c);
    }
    return ZT<T>::from_bits(REL ? (typename PF<T>::U)(w ^ PF<T>::flip()) : w);
}

template <typename U> __device__ __forceinline__ U pf_to_nb(U d, U m) { return (U)((U)(d + m) ^ m); }
template <typename U> __device__ __forceinline__ U pf_from_nb(U v, U m) { return (U)((U)(v ^ m) - m); }

// One map byte of 8 bytes: bit j set iff byte j of x is non-zero.
__device__ __forceinline__ u32 pf_nzbits(u64 x) {
    const u64 lo7 = 0x7F7F7F7F7F7F7F7Full;
    const u64 nz = (((x & lo7) + lo7) | x) & 0x8080808080808080ull;
    return (u32)((nz >> 7) * 0x0102040810204080ull >> 56);
}

// Exclusive block scan (PF_THREADS threads); every thread gets the total. s_tmp: >= 9 words.
__device__ __forceinline__ u32 pf_block_excl(u32 v, u32* s_tmp, u32& total, int w, int lane) {
    static_assert(PF_WARPS <= 32, "one warp scans the warp totals");
    const u32 inc = warp_incl_u32(v, lane);
    if (lane == 31) s_tmp[w] = inc;
    __syncthreads();
    if (w == 0) {
        const u32 t = lane < PF_WARPS ? s_tmp[lane] : 0u;
        const u32 ti = warp_incl_u32(t, lane);
        if (lane < PF_WARPS) s_tmp[lane] = ti - t;
        if (lane == PF_WARPS - 1) s_tmp[PF_WARPS] = ti;
    }
    __syncthreads();
    const u32 r = s_tmp[w] + inc - v;
    total = s_tmp[PF_WARPS];
    __syncthreads();
    return r;
}

// Block sum into *s_acc, which must hold 0 (one use per launch); one barrier.
__device__ __forceinline__ u32 pf_block_sum(u32 v, u32* s_acc, int lane) {
    v = warp_sum_u32(v);
    if (lane == 0) atomicAdd(s_acc, v);
    __syncthreads();
    return *s_acc;
}

// Warp 0 of a compress block, once the chunk's stored size is known: writes its u16 table entry,
// publishes the size to the decoupled look-back, and adds the table word it completes to
// ctrl[PF_HASH] (odd chunk c: word c/2 = size[c-1] | size[c] << 16; the last chunk when it is
// even: word c/2 = size[c]). Chunk c-1 writes its entry before it publishes (with a fence), and
// the look-back of chunk c returns only once it has seen that publication, so the entry is
// visible. Returns the chunk's payload offset in the stream (every lane).
__device__ __forceinline__ u64 pf_place(u8* out, u64 out_cap, u64* status, u64* ctrl, u32 c, u32 n_chunks,
                                        u32 size, int lane) {
    pf_u16* tbl = (pf_u16*)(out + 96);
    const bool fits = ZC_HEADER_LEN + 2ull * n_chunks <= out_cap;
    if (lane == 0) {
        if (fits) tbl[c] = (pf_u16)size;
        __threadfence();
    }
    __syncwarp();
    const u64 excl = lookback_exclusive(status, c, (u64)size, lane);
    if (lane == 0) {
        if (c & 1u) {
            // this thread observes chunk c-1's publication itself before reading its entry
            while ((*((volatile u64*)(status + c - 1)) & 3ull) == 0ull) {
            }
            __threadfence();
            const u32 prev = fits ? (u32)(*((volatile pf_u16*)(tbl + c - 1))) : 0u;
            atomicAdd(ctrl + PF_HASH, (u64)zhash_mix(prev | (size << 16), c >> 1));
        } else if (c == n_chunks - 1u) {
            atomicAdd(ctrl + PF_HASH, (u64)zhash_mix(size, c >> 1));
        }
    }
    return ZC_HEADER_LEN + 2ull * n_chunks + excl;
}

// FORMAT.md "Bit shuffle": D is plane-major, its plane word j = p G + g (G = groups) holds plane p
// of group g. Shared memory keeps the planes group-major with one spare slot per group, slot
// g (W + 1) + p, so that both a warp's transpose stores (one g, lane = p) and reads of consecutive
// plane words of D (one p, consecutive g) spread over all banks. PF_SLOTS: slots of a full chunk.
#define PF_SLOTS(W) ((PF_BYTES * 8 / ((W) * (W))) * ((W) + 1))  // 4,224 (f32) / 2,080 (f64)
template <int W> __device__ __forceinline__ u32 pf_slot(u32 j, u32 groups) {
    const u32 NG = PF_BYTES * 8u / (u32)(W * W);  // groups of a full chunk: 128 / 32
    u32 p;
    if (groups == NG) p = j / NG;  // block-uniform: shifts for every chunk but a short last one
    else p = j / groups;
    return (j - p * groups) * (u32)(W + 1) + p;
}
// 8-byte unit wi of D (bytes 8 wi .. 8 wi + 7, little-endian) in / out of the padded layout.
template <typename U> __device__ __forceinline__ u64 pf_dld(const U* s, u32 wi, u32 groups) {
    if (sizeof(U) == 4)
        return (u64)s[pf_slot<32>(2u * wi, groups)] | ((u64)s[pf_slot<32>(2u * wi + 1u, groups)] << 32);
    return (u64)s[pf_slot<64>(wi, groups)];
}
template <typename U> __device__ __forceinline__ void pf_dst(U* s, u32 wi, u32 groups, u64 v) {
    if (sizeof(U) == 4) {
        s[pf_slot<32>(2u * wi, groups)] = (U)v;
        s[pf_slot<32>(2u * wi + 1u, groups)] = (U)(v >> 32);
    } else {
        s[pf_slot<64>(wi, groups)] = (U)v;
    }
}
// Start of thread t's rotation over its WPT consecutive D units (unit t WPT + (j + rot) mod WPT at
// step j): with a full chunk every step of a warp is free of bank conflicts (f32: lanes differ in
// g or p; f64's 64-bit accesses need no rotation).
template <int W, int WPT> __device__ __forceinline__ u32 pf_rot(int t) {
    if (W == 64) return 0u;
    return WPT == 8 ? 2u * (((u32)t >> 1) & 3u) : ((u32)t >> 2) & 3u;
}

// Aligned word at byte offset a (a multiple of 4) of a stream of len bytes; bytes past the end
// read as 0 (only the stream's last word can straddle its end).
__device__ __forceinline__ u32 pf_ldw(const u8* __restrict__ stream, u64 a, u64 len) {
    if (a + 4ull <= len) return *(const u32*)(stream + a);
    u32 v = 0;
    for (u32 k = 0; k < 4u; k++)
        if (a + k < len) v |= (u32)stream[a + k] << (8 * k);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Compression
template <typename T, bool REL>
__device__ __forceinline__ void pf_compress(const T* __restrict__ in, u64 count, u8* __restrict__ out, u64 out_cap,
                                            u64* status, u64* ctrl, u32 n_chunks, ZQ<T> q) {
    typedef typename PF<T>::U U;
    const int SIZE = (int)sizeof(T);
    const int W = PF<T>::W;
    const u32 CHUNK = PF_BYTES / SIZE;
    const int NV = (int)(CHUNK / PF_THREADS);  // values per thread: 16 / 8
    const int GPW = (int)(CHUNK / W) / PF_WARPS;  // groups per warp: 16 / 4

    __shared__ __align__(16) U s_w[PF_SLOTS(PF<T>::W)];  // words, then D (padded, see pf_slot)
    __shared__ __align__(16) u8 s_out[PF_BYTES];
    __shared__ __align__(16) u8 s_b1[2048];
    __shared__ __align__(16) u8 s_b2[256];
    __shared__ __align__(16) u8 s_b3[32];
    __shared__ __align__(16) u8 s_b4[8];
    __shared__ u32 s_tmp[PF_WARPS + 1];
    __shared__ u32 s_chunk, s_k2, s_k3, s_o2, s_o3, s_acc;
    __shared__ u64 s_base;

    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        s_chunk = (u32)atomicAdd(ctrl + PF_TICKET, 1ull);
        s_acc = 0;
    }
    __syncthreads();
    const u32 c = s_chunk;
    const u64 cbase = (u64)c * CHUNK;
    const u32 n = (u32)((count - cbase) < (u64)CHUNK ? (count - cbase) : (u64)CHUNK);
    const u32 groups = (n + W - 1) / W;
    const T* cin = in + cbase;
    const U nbm = PF<T>::nbm();

    // 1. words (+0 is word 0 in every mode: code 0, exact, so the quantizer is skipped)
    bool coll = false;
    const float eb32 = __double2float_rn(q.eb);
    const int VEC = 16 / SIZE;  // values per 16-byte load: 4 / 2
    // 16-byte input loads when the chunk is full and the input 16-byte aligned
    if (n == CHUNK && ((size_t)in & 15u) == 0) {
#pragma unroll
        for (int i = 0; i < NV / VEC; i++) {
            const u32 k = (u32)(i * PF_THREADS + tid) * (u32)VEC;
            const uint4 v = *(const uint4*)(cin + k);
            const T* xs = (const T*)&v;
            __align__(16) U wd[16 / sizeof(U)];
#pragma unroll
            for (int u = 0; u < VEC; u++)
                wd[u] = ZT<T>::bits(xs[u]) == 0 ? (U)0 : pf_word<T, REL>(q, eb32, xs[u], coll);
            *(uint4*)(s_w + k) = *(const uint4*)wd;
        }
    } else {
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const u32 k = (u32)(i * PF_THREADS + tid);
            U wd = 0;
            if (k < n) {
                const T x = cin[k];
                wd = ZT<T>::bits(x) == 0 ? (U)0 : pf_word<T, REL>(q, eb32, x, coll);
            }
            s_w[k] = wd;
        }
    }
    const bool raw_forced = __syncthreads_or(coll) != 0;

    u32 csize = 0;
    bool raw = raw_forced;
    if (!raw_forced) {
        // 2. differences in negabinary, group-major: warp w owns groups w, w + 8, ...
        U u[NV];
#pragma unroll
        for (int i = 0; i < GPW; i++) {
            const u32 g = (u32)(w + i * PF_WARPS);
#pragma unroll
            for (int h = 0; h < W / 32; h++) {
                const u32 k = g * W + h * 32 + lane;
                U d = 0;
                if (k < n) d = (U)(s_w[k] - (k ? s_w[k - 1] : (U)0));
                u[i * (W / 32) + h] = k < n ? pf_to_nb<U>(d, nbm) : (U)0;
            }
        }
        __syncthreads();
        // 3. bit shuffle: plane j of group g at slot g*(W+1) + j (D word j*G + g)
#pragma unroll
        for (int i = 0; i < GPW; i++) {
            const u32 g = (u32)(w + i * PF_WARPS);
            if (W == 32) {
                const u32 p = warp_transpose32((u32)u[i], lane);
                if (g < groups) s_w[g * 33 + lane] = (U)p;
            } else {
                const u64 a = (u64)u[2 * i], b = (u64)u[2 * i + 1];
                const u32 p0 = warp_transpose32((u32)a, lane);
                const u32 p1 = warp_transpose32((u32)b, lane);
                const u32 p2 = warp_transpose32((u32)(a >> 32), lane);
                const u32 p3 = warp_transpose32((u32)(b >> 32), lane);
                if (g < groups) {
                    s_w[g * 65 + lane] = (U)((u64)p0 | ((u64)p1 << 32));
                    s_w[g * 65 + 32 + lane] = (U)((u64)p2 | ((u64)p3 << 32));
                }
            }
        }
        __syncthreads();

        // 4. zero-byte elimination
        const u32 L0 = groups * (u32)W * (u32)SIZE;
        const u32 L1 = L0 / 8, L2 = (L1 + 7) / 8, L3 = (L2 + 7) / 8, L4 = (L3 + 7) / 8;
        const u32 rot = pf_rot<W, PF_WPT>(tid);
        // level 0: thread t maps D words WPT*t.. (8 bytes each) into B1 bytes WPT*t..
        u64 m1 = 0;
        u32 cnt0 = 0;
        const u32 n0 = L0 / 8;
#pragma unroll
        for (int j = 0; j < PF_WPT; j++) {
            const u32 jj = ((u32)j + rot) & (PF_WPT - 1u);  // rotated: no bank conflicts
            const u32 wi = (u32)tid * PF_WPT + jj;
            if (wi < n0) {
                const u32 bits = pf_nzbits(pf_dld<U>(s_w, wi, groups));
                m1 |= (u64)bits << (8 * jj);
                cnt0 += __popc(bits);
            }
        }
        if (PF_WPT == 8) ((u64*)s_b1)[tid] = m1;
        else ((u32*)s_b1)[tid] = (u32)m1;
        u32 k0;
        const u32 off0 = pf_block_excl(cnt0, s_tmp, k0, w, lane);  // syncs: s_b1 visible
        // level 1: thread t maps B1 bytes 8t..8t+7 into B2 byte t (L1 is a multiple of 16)
        u32 bits1 = 0;
        if ((u32)tid < L1 / 8) {
            const u64 v = ((const u64*)s_b1)[tid];
            const u64 prev = tid ? (u64)s_b1[8 * tid - 1] : 0ull;
            bits1 = pf_nzbits(v ^ ((v << 8) | prev));
        }
        if (tid < 256) s_b2[tid] = (u8)bits1;
        u32 k1;
        const u32 off1 = pf_block_excl(__popc(bits1), s_tmp, k1, w, lane);
        // levels 2 and 3 (at most 32 / 4 map bytes): warp 0
        if (w == 0) {
            u32 bits2 = 0;
            if ((u32)lane < L3) {
                const u64 v = ((const u64*)s_b2)[lane];
                const u64 prev = lane ? (u64)s_b2[8 * lane - 1] : 0ull;
                u64 x = v ^ ((v << 8) | prev);
                const u32 valid = L2 - 8u * (u32)lane;
                if (valid < 8) x &= (1ull << (8 * valid)) - 1ull;
                bits2 = pf_nzbits(x);
            }
            s_b3[lane] = (u8)bits2;
            const u32 i2 = warp_incl_u32(__popc(bits2), lane);
            const u32 k2 = __shfl_sync(ZC_FULL, i2, 31);
            __syncwarp();
            u32 bits3 = 0;
            if ((u32)lane < L4) {
                u64 v = ((const u64*)s_b3)[lane];
                const u64 prev = lane ? (u64)s_b3[8 * lane - 1] : 0ull;
                u64 x = v ^ ((v << 8) | prev);
                const u32 valid = L3 - 8u * (u32)lane;
                if (valid < 8) x &= (1ull << (8 * valid)) - 1ull;
                bits3 = pf_nzbits(x);
            }
            if (lane < 8) s_b4[lane] = (u8)bits3;
            const u32 i3 = warp_incl_u32(__popc(bits3), lane);
            const u32 k3 = __shfl_sync(ZC_FULL, i3, 31);
            // all four totals are known: size, raw/empty decision, scatter of B4, kept3, kept2
            const u32 total = L4 + k3 + k2 + k1 + k0;  // unpadded: payloads are byte-aligned
            const u32 cs = k0 == 0 ? 0u : total;
            const bool rawc = cs >= n * (u32)SIZE && k0 != 0;
            if (!rawc && k0 != 0) {
                // B4
                if ((u32)lane < L4) s_out[lane] = (u8)bits3;
                // kept3: bytes of B3 whose bit is set in B4
                u32 pos3 = L4 + (i3 - __popc(bits3));
                if ((u32)lane < L4) {
                    u32 b = bits3;
                    while (b) {
                        const int j = __ffs(b) - 1;
                        s_out[pos3++] = s_b3[8 * lane + j];
                        b &= b - 1;
                    }
                }
                // kept2: bytes of B2 whose bit is set in B3
                u32 pos2 = L4 + k3 + (i2 - __popc(bits2));
                if ((u32)lane < L3) {
                    u32 b = bits2;
                    while (b) {
                        const int j = __ffs(b) - 1;
                        s_out[pos2++] = s_b2[8 * lane + j];
                        b &= b - 1;
                    }
                }
            }
            if (lane == 0) {
                s_k2 = k2;
                s_k3 = k3;
                s_o2 = cs;
                s_o3 = rawc ? 1u : 0u;
            }
        }
        __syncthreads();
        csize = s_o2;
        raw = s_o3 != 0;
        // warp 0: table entry and decoupled look-back for the chunk offset, overlapped with the
        // other warps' scatter of the kept bytes (warp 0 does its share afterwards)
        if (w == 0) {
            const u64 b = pf_place(out, out_cap, status, ctrl, c, n_chunks, raw ? n * (u32)SIZE : csize, lane);
            if (lane == 0) s_base = b;
        }
        if (!raw && csize != 0) {
            const u32 base1 = L4 + s_k3 + s_k2;
            // kept1: bytes of B1 whose bit is set in B2
            if ((u32)tid < L1 / 8) {
                u32 b = bits1;
                u32 pos = base1 + off1;
                while (b) {
                    const int j = __ffs(b) - 1;
                    s_out[pos++] = s_b1[8 * tid + j];
                    b &= b - 1;
                }
            }
            // kept0: the non-zero bytes of D
            const u32 base0 = base1 + k1;
#pragma unroll 1
            for (int j = 0; j < PF_WPT; j++) {
                const u32 jj = ((u32)j + pf_rot<W, PF_WPT>(tid)) & (PF_WPT - 1u);  // as above
                u32 b = (u32)(m1 >> (8 * jj)) & 0xFFu;
                if (!b) continue;
                const u64 v = pf_dld<U>(s_w, (u32)tid * PF_WPT + jj, groups);
                u32 pos = base0 + off0 + (u32)__popcll(m1 & ((1ull << (8 * jj)) - 1ull));
                while (b) {
                    const int bj = __ffs(b) - 1;
                    s_out[pos++] = (u8)(v >> (8 * bj));
                    b &= b - 1;
                }
            }
        }
    }
    if (raw) csize = n * (u32)SIZE;
    if (raw_forced && w == 0) {
        const u64 b = pf_place(out, out_cap, status, ctrl, c, n_chunks, csize, lane);
        if (lane == 0) s_base = b;
    }

    // 5. copy-out to the byte offset from the look-back, and the chunk hash (of the payload in
    // its own word order, zero-padded). Destination word j (aligned) holds payload bytes
    // sh + 4j .. sh + 4j + 3, a funnel shift of source words j and j + 1; the sh head bytes and
    // the at most 3 tail bytes are byte stores, so every stream byte has exactly one writer.
    __syncthreads();
    const u64 base = s_base;
    const u32 nsw = (csize + 3u) / 4u;
    u32 hsum = 0;
    if (base + csize <= out_cap) {
        const u32* src = raw ? (const u32*)cin : (const u32*)s_out;
        const u8* srcb = (const u8*)src;
        const u32 sh = (4u - (u32)(base & 3ull)) & 3u;
        const u32 nfull = csize >= sh ? (csize - sh) / 4u : 0u;
        u32* dw = (u32*)(out + base + sh);
        // block-uniform trip count: source word i + 1 comes from the next lane (one load each)
        for (u32 i0 = 0; i0 < nsw; i0 += PF_THREADS) {
            const u32 i = i0 + (u32)tid;
            u32 v = i < nsw ? src[i] : 0u;
            u32 nx = __shfl_down_sync(ZC_FULL, v, 1);
            if (lane == 31 && sh && i < nfull) nx = src[i + 1];
            if (i < nsw) {
                if (4u * i + 4u > csize) v &= (1u << (8u * (csize & 3u))) - 1u;  // past the payload: 0
                hsum += zhash_mix(v, i);
                if (i < nfull) dw[i] = sh ? __funnelshift_r(v, nx, 8u * sh) : v;
            }
        }
        const u32 nhead = sh < csize ? sh : csize;
        if ((u32)tid < nhead) out[base + tid] = srcb[tid];
        if (tid >= 32 && tid < 35) {
            const u32 p = sh + 4u * nfull + (u32)(tid - 32);
            if (p < csize && p >= nhead) out[base + p] = srcb[p];
        }
    }
    const u32 tot = pf_block_sum(hsum, &s_acc, lane);
    if (tid == 0) {
        atomicAdd(ctrl + PF_DHASH, (u64)zhash_mix(zhash_final(tot, nsw), c));
        __threadfence();
        if (atomicAdd(ctrl + PF_DONE, 1ull) == (u64)n_chunks - 1ull) {
            const u64 last = *((volatile u64*)(status + n_chunks - 1)) >> 2;
            ctrl[PF_PAYLOAD] = 2ull * n_chunks + last;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decompression. ACC (fused decompress-and-accumulate for NCCL reductions, as in blocked.cu):
// out = out + x with one IEEE rounding instead of out = x.
__device__ __forceinline__ float pf_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double pf_add_rn(double a, double b) { return __dadd_rn(a, b); }
template <typename T, bool ACC> __device__ __forceinline__ void pf_store(T* p, T x) { *p = ACC ? pf_add_rn(*p, x) : x; }

template <typename T, bool REL, bool ACC>
__device__ __forceinline__ void pf_decompress(const u8* __restrict__ stream, u64 stream_len, T* __restrict__ out,
                                              u64 count, u64* status, u64* ctrl, u32 n_chunks, u32 table_checksum,
                                              ZQ<T> q) {
    typedef typename PF<T>::U U;
    const int SIZE = (int)sizeof(T);
    const int W = PF<T>::W;
    const u32 CHUNK = PF_BYTES / SIZE;
    const int GPW = (int)(CHUNK / W) / PF_WARPS;
    const int NG = (int)(CHUNK / W);  // groups per full chunk: 128 / 32

    __shared__ __align__(16) u32 s_c[PF_BYTES / 4];         // the chunk's bytes
    __shared__ __align__(16) U s_d[PF_SLOTS(PF<T>::W)];      // shuffled bytes D (padded, see pf_slot)
    __shared__ __align__(16) u8 s_b1[2048];
    __shared__ __align__(16) u8 s_b2[256];
    __shared__ __align__(16) u8 s_b3[32];
    __shared__ u32 s_p3[33];
    __shared__ U s_gsum[128];
    __shared__ u32 s_tmp[PF_WARPS + 1];
    __shared__ u32 s_chunk, s_size, s_k3, s_k2, s_acc;
    __shared__ u64 s_err, s_base;

    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        s_chunk = (u32)atomicAdd(ctrl + PF_TICKET, 1ull);
        s_err = 0;
        s_acc = 0;
    }
    __syncthreads();
    const u32 c = s_chunk;
    const u64 cbase = (u64)c * CHUNK;
    const u32 n = (u32)((count - cbase) < (u64)CHUNK ? (count - cbase) : (u64)CHUNK);
    const u32 groups = (n + W - 1) / W;
    const u32 rawsize = n * (u32)SIZE;
    const pf_u16* tbl = (const pf_u16*)(stream + 96);  // the host checked 96 + 2 n_chunks <= stream_len
    const U nbm = PF<T>::nbm();

    if (w == 0) {
        const u32 size = tbl[c];
        const u64 excl = lookback_exclusive(status, c, (u64)size, lane);
        if (lane == 0) {
            const u64 base = ZC_HEADER_LEN + 2ull * n_chunks + excl;
            u64 err = 0;
            if (base + size > stream_len) err |= PF_E_RANGE;
            if (size > rawsize) err |= PF_E_META;
            s_err = err;
            s_base = base;
            s_size = size;
            // table word c/2 (sizes c, c+1; zero-padded past the last chunk): even chunks add it
            if (!(c & 1u)) {
                const u32 hi = c + 1u < n_chunks ? (u32)tbl[c + 1] : 0u;
                atomicAdd(ctrl + PF_HASH, (u64)zhash_mix(size | (hi << 16), c >> 1));
            }
        }
    }
    __syncthreads();
    // Errors: each thread accumulates its own `err`; every stop decision is a block-wide
    // __syncthreads_or, so all threads leave the stage loop together.
    u64 err = s_err;  // size / range checks of warp 0 (same value in every thread)
    do {
        if (err) break;
        const u32 size = s_size;
        const bool raw = size == rawsize;
        // byte-aligned payload -> s_c word i = payload bytes 4i..4i+3 (zero past the end): a
        // funnel shift of aligned stream words i and i + 1 (from the next lane); chunk hash
        {
            const u64 base = s_base;
            const u32 r = (u32)(base & 3ull);
            const u64 a0 = base - r;  // >= 96
            const u32 nw = (size + 3u) / 4u;
            const u32 ngw = (r + size + 3u) / 4u;  // aligned stream words holding payload bytes
            u32 h = 0;
            for (u32 i0 = 0; i0 < nw; i0 += PF_THREADS) {  // block-uniform trip count
                const u32 i = i0 + (u32)tid;
                const u32 lo = i < ngw ? pf_ldw(stream, a0 + 4ull * i, stream_len) : 0u;
                u32 hi = __shfl_down_sync(ZC_FULL, lo, 1);
                if (lane == 31) hi = i + 1u < ngw ? pf_ldw(stream, a0 + 4ull * (i + 1u), stream_len) : 0u;
                if (i < nw) {
                    u32 v = r ? __funnelshift_r(lo, hi, 8u * r) : lo;
                    if (4u * i + 4u > size) v &= (1u << (8u * (size & 3u))) - 1u;
                    h += zhash_mix(v, i);
                    s_c[i] = v;
                }
            }
            const u32 tot = pf_block_sum(h, &s_acc, lane);
            if (tid == 0) atomicAdd(ctrl + PF_DHASH, (u64)zhash_mix(zhash_final(tot, nw), c));
        }
        T* cout = out + cbase;
        if (raw) {
            const typename ZT<T>::bits_t* rv = (const typename ZT<T>::bits_t*)s_c;
            for (u32 k = (u32)tid; k < n; k += PF_THREADS) pf_store<T, ACC>(cout + k, ZT<T>::from_bits(rv[k]));
            break;
        }
        if (size == 0) {
            const T v0 = pf_value<T, REL>(q, (U)0);
            for (u32 k = (u32)tid; k < n; k += PF_THREADS) pf_store<T, ACC>(cout + k, v0);
            break;
        }
        const u8* cp = (const u8*)s_c;
        const u32 L0 = groups * (u32)W * (u32)SIZE;
        const u32 L1 = L0 / 8, L2 = (L1 + 7) / 8, L3 = (L2 + 7) / 8, L4 = (L3 + 7) / 8;
        // B4 -> B3 (warp 0)
        if (w == 0) {
            u32 top = 0;
            for (u32 j = 0; j < L4; j++) top |= (u32)cp[j] << (8 * j);
            if (top == 0) err |= PF_E_META;
            if (L3 < 32 && (top >> L3) != 0) err |= PF_E_META;
            const u32 k3 = __popc(top);
            if (L4 + k3 > size) err |= PF_E_META;
            u32 b3 = 0;
            if (!err && (u32)lane < L3) {
                const u32 inc = __popc(top & (lane == 31 ? 0xFFFFFFFFu : ((2u << lane) - 1u)));
                b3 = inc ? cp[L4 + inc - 1] : 0u;
            }
            if (!err && (u32)lane < k3) {
                const u32 prev = lane ? cp[L4 + lane - 1] : 0u;
                if (cp[L4 + lane] == prev) err |= PF_E_META;
            }
            s_b3[lane] = (u8)b3;
            // tail bits of B3 past L2
            if ((u32)lane == (L2 >> 3) && (L2 & 7u) && (b3 >> (L2 & 7u))) err |= PF_E_META;
            const u32 pc = __popc(b3);
            const u32 inc = warp_incl_u32(pc, lane);
            s_p3[lane] = inc - pc;
            const u32 k2 = __shfl_sync(ZC_FULL, inc, 31);
            if (lane == 0) {
                if (L4 + k3 + k2 > size) err |= PF_E_META;
                s_k3 = k3;
                s_k2 = k2;
            }
        }
        if (__syncthreads_or(err != 0)) break;
        // B3 -> B2 (thread k = byte k of B2)
        const u32 o2 = L4 + s_k3;
        const u32 k2 = s_k2;
        u32 b2 = 0;
        {
            if ((u32)tid < L2) {
                const u32 byte = s_b3[tid >> 3];
                const u32 inc = s_p3[tid >> 3] + __popc(byte & ((2u << (tid & 7)) - 1u));
                b2 = inc ? cp[o2 + inc - 1] : 0u;
            }
            if ((u32)tid < k2) {
                const u32 prev = tid ? cp[o2 + tid - 1] : 0u;
                if (cp[o2 + tid] == prev) err |= PF_E_META;
            }
            if (tid < 256) s_b2[tid] = (u8)b2;
        }
        u32 k1;
        const u32 e1 = pf_block_excl(__popc(b2), s_tmp, k1, w, lane);
        const u32 o1 = o2 + k2;
        if (tid == 0 && o1 + k1 > size) err |= PF_E_META;
        if (__syncthreads_or(err != 0)) break;
        // B2 -> B1 (thread t = B1 bytes 8t..8t+7)
        u64 b1 = 0;
        {
            if ((u32)tid < L2) {
                u32 inc = e1;
                for (int j = 0; j < 8; j++) {
                    if ((b2 >> j) & 1u) inc++;
                    const u64 v = inc ? (u64)cp[o1 + inc - 1] : 0ull;
                    b1 |= v << (8 * j);
                }
            }
            for (u32 j = (u32)tid; j < k1; j += PF_THREADS) {
                const u32 prev = j ? cp[o1 + j - 1] : 0u;
                if (cp[o1 + j] == prev) err |= PF_E_META;
            }
            if (tid < 256) ((u64*)s_b1)[tid] = b1;
        }
        u32 k0;
        const u32 e0 = pf_block_excl((u32)__popcll(b1), s_tmp, k0, w, lane);
        const u32 o0 = o1 + k1;
        if (tid == 0 && o0 + k0 != size) err |= PF_E_META;  // metadata must account for every byte
        if (__syncthreads_or(err != 0)) break;
        // B1 -> D (thread t = D units 8t..8t+7, into the padded layout), kept data bytes must be
        // non-zero
        {
            if ((u32)tid < L2) {
                for (int j = 0; j < 8; j++) {
                    const u32 jj = ((u32)j + pf_rot<W, 8>(tid)) & 7u;  // rotated: no bank conflicts
                    u32 pos = o0 + e0 + (u32)__popcll(b1 & ((1ull << (8 * jj)) - 1ull));
                    u32 b = (u32)(b1 >> (8 * jj)) & 0xFFu;
                    u64 word = 0;
                    while (b) {
                        const int bj = __ffs(b) - 1;
                        const u32 v = cp[pos++];
                        if (v == 0) err |= PF_E_META;
                        word |= (u64)v << (8 * bj);
                        b &= b - 1;
                    }
                    pf_dst<U>(s_d, (u32)tid * 8u + jj, groups, word);
                }
            }
        }
        if (__syncthreads_or(err != 0)) break;
        // planes -> differences -> in-group inclusive sums
        U inc[2 * GPW];
        {
#pragma unroll
            for (int i = 0; i < GPW; i++) {
                const u32 g = (u32)(w + i * PF_WARPS);
                U tot = 0;
                if (g < groups) {  // warp-uniform
                    if (W == 32) {
                        const u32 uu = warp_transpose32((u32)s_d[g * 33 + lane], lane);
                        const u32 k = g * 32 + lane;
                        if (k >= n && uu != 0) err |= PF_E_META;
                        const u32 d = pf_from_nb<u32>(uu, (u32)nbm);
                        const u32 ic = warp_incl_u32(d, lane);
                        inc[2 * i] = (U)ic;
                        tot = (U)__shfl_sync(ZC_FULL, ic, 31);
                    } else {
                        const u64 pa = (u64)s_d[g * 65 + lane], pb = (u64)s_d[g * 65 + 32 + lane];
                        const u32 lo_a = warp_transpose32((u32)pa, lane);
                        const u32 lo_b = warp_transpose32((u32)(pa >> 32), lane);
                        const u32 hi_a = warp_transpose32((u32)pb, lane);
                        const u32 hi_b = warp_transpose32((u32)(pb >> 32), lane);
                        const u64 ua = (u64)lo_a | ((u64)hi_a << 32);
                        const u64 ub = (u64)lo_b | ((u64)hi_b << 32);
                        const u32 ka = g * 64 + lane, kb = ka + 32;
                        if ((ka >= n && ua != 0) || (kb >= n && ub != 0)) err |= PF_E_META;
                        const u64 da = pf_from_nb<u64>(ua, (u64)nbm), db = pf_from_nb<u64>(ub, (u64)nbm);
                        const u64 ia = warp_incl_u64(da, lane);
                        const u64 ta = __shfl_sync(ZC_FULL, ia, 31);
                        const u64 ib = warp_incl_u64(db, lane) + ta;
                        inc[2 * i] = (U)ia;
                        inc[2 * i + 1] = (U)ib;
                        tot = (U)__shfl_sync(ZC_FULL, ib, 31);
                    }
                    if (lane == 0) s_gsum[g] = tot;
                }
            }
        }
        if (__syncthreads_or(err != 0)) break;
        // exclusive prefix of the group sums (at most 128): warp 0, NG / 32 per lane
        if (w == 0) {
            const int per = NG / 32;  // 4 (f32) / 1 (f64)
            U loc[4];
            U run = 0;
            for (int j = 0; j < per; j++) {
                const u32 g = (u32)(lane * per + j);
                loc[j] = g < groups ? s_gsum[g] : (U)0;
                run += loc[j];
            }
            U ex;
            if (W == 32) ex = (U)(warp_incl_u32((u32)run, lane) - (u32)run);
            else ex = (U)(warp_incl_u64((u64)run, lane) - (u64)run);
            for (int j = 0; j < per; j++) {
                const u32 g = (u32)(lane * per + j);
                if (g < groups) s_gsum[g] = ex;
                ex += loc[j];
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < GPW; i++) {
            const u32 g = (u32)(w + i * PF_WARPS);
            if (g >= groups) continue;
            const U pre = s_gsum[g];
#pragma unroll
            for (int hh = 0; hh < W / 32; hh++) {
                const u32 k = g * W + hh * 32 + lane;
                if (k < n) pf_store<T, ACC>(cout + k, pf_value<T, REL>(q, (U)(pre + inc[2 * i + hh])));
            }
        }
    } while (0);
    __syncthreads();
    if (err) atomicOr(ctrl + PF_ERR, err);
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(ctrl + PF_DONE, 1ull) == (u64)n_chunks - 1ull) {
            const u64 last = *((volatile u64*)(status + n_chunks - 1)) >> 2;
            if (ZC_HEADER_LEN + 2ull * n_chunks + last != stream_len) atomicOr(ctrl + PF_ERR, PF_E_TOTAL);
            __threadfence();
            const u32 th = (u32)(*((volatile u64*)(ctrl + PF_HASH)));
            if (zhash_final(th, (n_chunks + 1u) / 2u) != table_checksum) atomicOr(ctrl + PF_ERR, PF_E_TABLE);
        }
    }
}

#define PF_INST(TY, TN, REL, RN)                                                                               \
    extern "C" __global__ void __launch_bounds__(PF_THREADS, PF_MINB) zc_compress_##TN##_pfpl_##RN(                     \
        const TY* in, u64 count, u8* out, u64 out_cap, u64* status, u64* ctrl, u32 n_chunks, TY step, TY inv, \
        double step64, double eb) {                                                                            \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        pf_compress<TY, REL>(in, count, out, out_cap, status, ctrl, n_chunks, q);                              \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(PF_THREADS, PF_MINB) zc_decompress_##TN##_pfpl_##RN(                   \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        u32 table_checksum, TY step, TY inv, double step64, double eb) {                                       \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        pf_decompress<TY, REL, false>(stream, stream_len, out, count, status, ctrl, n_chunks, table_checksum, q); \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(PF_THREADS, PF_MINB) zc_decompress_add_##TN##_pfpl_##RN(      \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        u32 table_checksum, TY step, TY inv, double step64, double eb) {                                       \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        pf_decompress<TY, REL, true>(stream, stream_len, out, count, status, ctrl, n_chunks, table_checksum, q); \
    }

PF_INST(float, f32, false, abs)
PF_INST(float, f32, true, rel)
PF_INST(double, f64, false, abs)
PF_INST(double, f64, true, rel)
