// zcomm blocked codecs (FORMAT.md "aatrox / cuszp chunks"): aatrox, cuszp-plain, cuszp-outlier.
// One templated source for all three codecs and both dtypes. One thread block (ZC_WARPS warps,
// default 16) per 32,768-value chunk; warp w owns iteration layers w, w + ZC_WARPS, ...; lane k is
// value k of the thread layer being processed, so a thread layer is one coalesced load and its bit
// planes one warp transpose.
//
// Compression is one kernel: pass 1 quantizes every thread layer (full f32 aatrox/plain chunks:
// and stages its encoding in shared memory, see "One-pass compression" below), the block scans
// the layer sizes, gets its output offset by decoupled look-back over chunk sizes, and pass 2
// writes the chunk (one-pass: copies the staged runs; two-pass: re-quantizes, the input mostly
// still in L2), its table entry, and its share of the table checksum. Decompression is one
// kernel: offsets by decoupled look-back over the table sizes, checksum + metadata validation,
// then AATROX's dual-level prefix sum (layer sums from bit-plane popcounts, block scan, in-layer
// warp scans over several layers at once: "DEC2" and "Group decoding" below); zc_decompress_hdr is
// the same kernel taking its parameters from the stream header. The *_track variants of the
// compression and of the decompress-and-add also fold the finite range of the input (resp. the
// base) into two device words from the loads they make anyway ("Range tracking" below).
// Errors go to a device flag, never out of bounds.
#include "common.cuh"

#ifndef ZC_WARPS
#define ZC_WARPS 16  // warps per block (1, 2, 4, 8, 16 or 32); each owns 32 / ZC_WARPS iteration layers
#endif
#define ZC_THREADS (ZC_WARPS * 32)
// Blocks per SM the register budget must allow, per element size and mode. 16 warps: 4 for f32
// abs/noa (fits 32 registers without spills, and more resident blocks hide the look-back and
// barrier waits), 3 for f64 and REL (whose kernels spill at 32).
#define ZC_MINB_OF(SIZE, REL) (ZC_WARPS == 16 ? ((SIZE) == 4 && !(REL) ? 4 : 3) : 32 / ZC_WARPS)
#define ZC_CHUNK 32768u  // values per chunk (src/codec/blocked.rs CHUNK)

// ---- One-pass compression (full chunks of f32 aatrox / cuszp-plain, both modes;
// f64, cuszp-outlier and a stream's partial last chunk take the two-pass path below).
//
// The two-pass kernel reads every value twice from global memory (pass 2 mostly misses L2) and
// quantizes it twice. The one-pass variant encodes each thread layer during pass 1 into a per-warp
// shared-memory staging arena, so that pass 2 is mostly a copy from shared to global memory:
//
// * A layer's first delta d0 = q0 - prev needs prev, the last code of the previous non-raw layer
//   (plain: prev = 0). The layers of one iteration are consecutive in the stream and one warp
//   encodes them in order, so prev is known for every non-raw layer of an iteration except the
//   first one (its "pending" layer), whose prev lies in an earlier iteration (another warp's).
//   The shuffle that gives lane k the code of lane k - 1 wraps around: lane 0 gets lane 31's
//   register, which holds the last code of the previous non-raw layer. So pass 1 stages every
//   other layer exactly as the stream holds it: sign word, then b bit planes (b = width of the
//   OR of the 32 magnitudes; none at all when b = 0).
// * The pending layer is staged with d0 = 0: brest = width(OR of lanes 1..31) planes. After pass 1
//   the block resolves d0 from the iterations' last codes, its width is b = max(brest, width(|d0|)),
//   and pass 2 rebuilds it: sign word | (d0 < 0), plane k = (k < brest ? staged plane k : 0) |
//   bit k of |d0|.
// * Four layers with b <= 8 share one warp transpose (lane 8g + k gets plane k of layer g); two
//   with b <= 16 share one as low/high halves; wider layers take one each.
// * Each warp appends to its own arena slice (ZC_STAGE_WORDS / ZC_WARPS words, at most 2047), in
//   layer order; s_sinfo[layer] = (word offset << 5) | staged width, or 0xFFFF when the layer is
//   raw or did not fit (then pass 2 re-reads and re-quantizes that one layer from global memory,
//   exactly as the two-pass kernel; so any chunk is correct, a poorly compressible one is slower).
// * s_prev holds d0 (not prev) per layer in this mode.
// * Pass 2 walks each iteration: a run of consecutive staged non-pending layers is one contiguous
//   copy (their arena words are the stream's words), lane-parallel, each word hashed as it is
//   stored; the pending layer is rebuilt; raw and unstaged layers are re-encoded.
// Shared memory per block (f32, one-pass): 4 KiB offsets + 1 KiB rates + 4 KiB d0 + 2 KiB stage
// info + 36 KiB arena (ZC_STAGE_WORDS = 9216) + ~0.8 KiB = ~47.8 KiB (static limit 48 KiB):
// 4 blocks/SM of 8 warps or 3 of 16 still fit the 228 KiB of an H100 SM.
#define ZC_STAGE_WORDS 9216  // one-pass staging arena per block, u32 words
#define ZC_SW ((ZC_STAGE_WORDS / ZC_WARPS) < 2047 ? (ZC_STAGE_WORDS / ZC_WARPS) : 2047)  // per warp
#define ZC_NOSTAGE 0xFFFFu

#define ZC_AATROX 1
#define ZC_PLAIN 2
#define ZC_OUTLIER 3

// ctrl[] words (u64). The host zeroes them (and the look-back status words) before a launch,
// except before a decompression launch into a workspace the previous decompression left clean:
// the last block of zc_decompress records its result (ZC_RES_*, in host-mapped memory) and
// zeroes the words that kernel uses (ticket, done, hash, error, its status words), so
// back-to-back decompressions need no memset (src/gpu/mod.rs `run_blocked_decoder`).
#define ZC_TICKET 0
#define ZC_DONE 1
#define ZC_HASH 2
#define ZC_PAYLOAD 3
#define ZC_ERR 4
#define ZC_MIN 6
#define ZC_MAX 7
#define ZC_FIRST 8
// The result words of a blocked decompression, written by its last block into host-mapped
// memory (`res`), so the host reads them after its synchronization with no copy: the error bits,
// the launch's `seq` argument (the host's proof that this launch ran to its end) and a copy of
// the stream's 96-byte header (words 2..13).
#define ZC_RES_ERR 0
#define ZC_RES_SEQ 1
#define ZC_RES_HDR 2

__device__ __forceinline__ u32 zc_width32(u32 m) { return 32 - __clz(m); }
__device__ __forceinline__ u32 zc_width64(u64 m) { return 64 - __clzll((long long)m); }
__device__ __forceinline__ u32 zc_obytes(u32 o) { return o == 0 ? 0u : (o == 1 ? 1u : (o == 2 ? 2u : 4u)); }
// Words of a packed (non-raw) layer of width b: its sign word and b planes, none when b = 0.
__device__ __forceinline__ u32 zc_layer_words(u32 b) { return b ? b + 1u : 0u; }
__device__ __forceinline__ u32 zc_packed(u32 b) { return 4u * zc_layer_words(b); }

template <typename T> struct ZU;
template <> struct ZU<float> {
    typedef u32 U;
    __device__ static u32 width(u32 m) { return zc_width32(m); }
    __device__ static u32 reduce_or(u32 m) { return __reduce_or_sync(ZC_FULL, m); }
};
template <> struct ZU<double> {
    typedef u64 U;
    __device__ static u32 width(u64 m) { return zc_width64(m); }
    __device__ static u64 reduce_or(u64 m) {
        u32 lo = __reduce_or_sync(ZC_FULL, (u32)m);
        u32 hi = __reduce_or_sync(ZC_FULL, (u32)(m >> 32));
        return ((u64)hi << 32) | lo;
    }
};

template <typename C> __device__ __forceinline__ C zc_shfl(C v, int src) { return __shfl_sync(ZC_FULL, v, src); }
template <typename C> __device__ __forceinline__ C zc_shfl_up(C v, int d) { return __shfl_up_sync(ZC_FULL, v, d); }

// Stores a 32-bit word at a 4-aligned or unaligned byte offset (bytes one by one when unaligned).
__device__ __forceinline__ void zc_put_any(u8* p, u64 off, u32 v) {
    if ((off & 3ull) == 0ull) {
        *(u32*)(p + off) = v;
    } else {
        p[off] = (u8)v;
        p[off + 1] = (u8)(v >> 8);
        p[off + 2] = (u8)(v >> 16);
        p[off + 3] = (u8)(v >> 24);
    }
}
// Stores one thread layer at word `w` of the chunk (4-aligned): the sign word from lane `first`,
// then its `b` bit planes from lanes `first .. first + b - 1` (lane `first + k` holds plane k), and
// adds their zhash terms to the lane's `hsum`.
__device__ __forceinline__ void zc_put_layer(u32* cw, u32 w, u32 sign, u32 plane, u32 b, int lane, int first,
                                             u32& hsum) {
    if (lane == first) {
        cw[w] = sign;
        hsum += zhash_mix(sign, w);
    }
    const u32 k = (u32)(lane - first);
    if (lane >= first && k < b) {
        cw[w + 1u + k] = plane;
        hsum += zhash_mix(plane, w + 1u + k);
    }
}
// Loads a 32-bit word at any byte offset; the 4-aligned words touched must lie in the buffer.
__device__ __forceinline__ u32 zc_get_any(const u8* p, u64 off) {
    const u32* w = (const u32*)p;
    u64 i = off >> 2;
    u32 a = (u32)(off & 3ull);
    if (a == 0) return w[i];
    return __funnelshift_r(w[i], w[i + 1], 8 * a);
}

// Quantizer::encode, with the f32 abs/noa fast path.
template <typename T, bool REL>
__device__ __forceinline__ bool zc_encode(const ZQ<T>& q, float eb32, T x, typename ZT<T>::code_t& code) {
    if (!REL && ZT<T>::SIZE == 4) return zq_encode_f32_abs((const ZQ<float>&)q, eb32, (float)x, (i32&)code);
    return zq_encode<T, REL>(q, x, code);
}

template <int CODEC> __device__ __forceinline__ bool zc_aligned() { return CODEC != ZC_OUTLIER; }

// Block-wide sum of one u32 per thread; result valid in warp 0.
__device__ __forceinline__ u32 zc_block_sum(u32 v, u32* s_tmp, int w, int lane) {
    v = warp_sum_u32(v);
    __syncthreads();
    if (lane == 0) s_tmp[w] = v;
    __syncthreads();
    u32 r = 0;
    if (w == 0) r = warp_sum_u32(lane < ZC_WARPS ? s_tmp[lane] : 0u);
    return r;
}

// One-pass staging: appends one thread layer (sign word s, then b bit planes of the
// magnitudes m) to the warp's arena st at word cur. Returns the layer's stage info
// ((offset << 5) | b), or ZC_NOSTAGE (raw: b > 30, or full). Called by the whole warp with
// warp-uniform b and cur.
__device__ __forceinline__ u32 zc_stage1(u32* st, u32& cur, u32 b, u32 m, u32 s, int lane) {
    if (b > 30u) return ZC_NOSTAGE;
    if (b == 0u) return cur << 5;  // nothing to store: all deltas after the first are 0
    if (cur + 1u + b > (u32)ZC_SW) return ZC_NOSTAGE;
    const u32 pl = warp_transpose32(m, lane);
    if (lane == 0) st[cur] = s;
    if ((u32)lane < b) st[cur + 1u + (u32)lane] = pl;
    const u32 info = (cur << 5) | b;
    cur += 1u + b;
    return info;
}
// Two consecutive layers: one shared transpose when both have brest <= 16 (and both store planes).
__device__ __forceinline__ void zc_stage2(u32* st, u32& cur, u32 bA, u32 mA, u32 sA, u32 bB, u32 mB, u32 sB,
                                          int lane, u32& iA, u32& iB) {
    if (bA != 0u && bB != 0u && bA <= 16u && bB <= 16u && cur + 2u + bA + bB <= (u32)ZC_SW) {
        const u32 oA = cur, oB = cur + 1u + bA;
        const u32 pl = warp_transpose32(mA | (mB << 16), lane);  // lane k < 16: plane k of A; else of B
        if (lane == 0) st[oA] = sA;
        if ((u32)lane < bA) st[oA + 1u + (u32)lane] = pl;
        if (lane == 16) st[oB] = sB;
        if (lane >= 16 && (u32)lane - 16u < bB) st[oB + 1u + ((u32)lane - 16u)] = pl;
        iA = (oA << 5) | bA;
        iB = (oB << 5) | bB;
        cur = oB + 1u + bB;
        return;
    }
    iA = zc_stage1(st, cur, bA, mA, sA, lane);
    iB = zc_stage1(st, cur, bB, mB, sB, lane);
}

// Four consecutive layers: one shared transpose when all four have b <= 8 (after it, lane 8g + k
// holds plane k of layer g), else two zc_stage2 pairs. info[g] receives layer g's stage info.
__device__ __forceinline__ void zc_stage4(u32* st, u32& cur, const u32 (&b)[4], const u32 (&m)[4], const u32 (&s)[4],
                                          int lane, unsigned short* info) {
    if (b[0] <= 8u && b[1] <= 8u && b[2] <= 8u && b[3] <= 8u) {
        const u32 w0 = zc_layer_words(b[0]), w1 = zc_layer_words(b[1]), w2 = zc_layer_words(b[2]);
        const u32 w3 = zc_layer_words(b[3]);
        const u32 o1 = w0, o2 = o1 + w1, o3 = o2 + w2;  // relative to cur
        if (cur + o3 + w3 <= (u32)ZC_SW) {
            if ((b[0] | b[1] | b[2] | b[3]) != 0u) {
                const u32 pl = warp_transpose32(m[0] | (m[1] << 8) | (m[2] << 16) | (m[3] << 24), lane);
                // byte g of the packed widths / offsets is layer g's (all fit a byte here)
                const u32 sel = 0x4440u | ((u32)lane >> 3);
                const u32 bg = __byte_perm(b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24), 0u, sel);
                const u32 og = cur + __byte_perm((o1 << 8) | (o2 << 16) | (o3 << 24), 0u, sel);
                const u32 k = (u32)lane & 7u;
                if (k < bg) st[og + 1u + k] = pl;
                if (lane == 0) {
                    if (b[0]) st[cur] = s[0];
                    if (b[1]) st[cur + o1] = s[1];
                    if (b[2]) st[cur + o2] = s[2];
                    if (b[3]) st[cur + o3] = s[3];
                }
            }
            if (lane == 0) {
                info[0] = (unsigned short)((cur << 5) | b[0]);
                info[1] = (unsigned short)(((cur + o1) << 5) | b[1]);
                info[2] = (unsigned short)(((cur + o2) << 5) | b[2]);
                info[3] = (unsigned short)(((cur + o3) << 5) | b[3]);
            }
            cur += o3 + w3;
            return;
        }
    }
    u32 i0, i1, i2, i3;
    zc_stage2(st, cur, b[0], m[0], s[0], b[1], m[1], s[1], lane, i0, i1);
    zc_stage2(st, cur, b[2], m[2], s[2], b[3], m[3], s[3], lane, i2, i3);
    if (lane == 0) {
        info[0] = (unsigned short)i0;
        info[1] = (unsigned short)i1;
        info[2] = (unsigned short)i2;
        info[3] = (unsigned short)i3;
    }
}

// Quantizes one thread layer (lane k: value k) and returns whether every value is representable
// (false: the layer is raw). f32 abs/noa: the same operations as zq_encode_f32_abs without its
// branches; the rare tie |x - r| == eb32 takes zq_within as that function does.
template <typename T, bool REL>
__device__ __forceinline__ bool zc_encode_layer(const ZQ<T>& q, float eb32, T x, typename ZT<T>::code_t& code) {
    if constexpr (!REL && ZT<T>::SIZE == 4) {
        const ZQ<float>& qf = (const ZQ<float>&)q;
        const float p = __fmul_rn((float)x, qf.inv);
        const bool inr = fabsf(p) < 536870912.0f;
        const i32 c = __float2int_rn(p);  // = (i32)rintf(p) wherever inr holds
        const float r = __fmul_rn(__int2float_rn(c), qf.step);
        const float d32 = fabsf(__fsub_rn((float)x, r));
        code = c;
        bool ok = inr && d32 < eb32;
        if (__all_sync(ZC_FULL, ok)) return true;
        if (inr && d32 == eb32) ok = zq_within<float, false>(qf, (float)x, r);
        return __all_sync(ZC_FULL, ok);
    } else {
        const bool ok = zc_encode<T, REL>(q, eb32, x, code);
        return __all_sync(ZC_FULL, ok);
    }
}

// One layer of zc_quantize_quad once its codes are known: deltas (lane 0's predecessor is lane 31's
// register, the previous non-raw layer's last code), width b (0xFF: raw), magnitudes, sign word,
// lane 0's delta; the pending-layer bookkeeping when PENDING. MAYBE_RAW = false: `raw` is false.
template <int CODEC, bool PENDING, bool MAYBE_RAW>
__device__ __forceinline__ void zc_layer_body(i32 code, bool raw, int lane, u32 t, int it, bool& have, i32& prev31,
                                              u32& b_out, u32& m_out, u32& s_out, i32& d_out, i32* first,
                                              u32* pend) {
    if (!MAYBE_RAW) raw = false;
    i32 qp = __shfl_sync(ZC_FULL, lane == 31 ? prev31 : code, (lane + 31) & 31);
    if (CODEC != ZC_AATROX) {
        if (lane == 0) qp = 0;
    } else if (PENDING) {
        if (lane == 0 && !have) qp = code;
    }
    const i32 d = (i32)((u32)code - (u32)qp);
    const u32 m = d < 0 ? 0u - (u32)d : (u32)d;
    s_out = __ballot_sync(ZC_FULL, d < 0);
    u32 b = zc_width32(__reduce_or_sync(ZC_FULL, m));
    if (raw) {
        b = 0xFFu;
    } else {
        if (PENDING && !have) {
            if (lane == 0) {
                first[it] = code;
                pend[it] = t;
            }
            have = true;
        }
        if (lane == 31) prev31 = code;
    }
    b_out = b;
    m_out = m;
    d_out = raw ? 0 : d;
}

// Quantizes the four layers t0 + h .. t0 + h + 3 of iteration `it` (values xs[h .. h + 3]) for
// zc_stage_chunk: width b (0xFF: raw), magnitudes m, sign word s, lane 0's delta d0 of each.
// PENDING (aatrox only): the iteration has had no non-raw layer yet, so the first non-raw one
// here becomes its pending layer (staged with d0 = 0; first[it], pend[it] recorded). Without
// PENDING lane 0's predecessor is always lane 31's register, which keeps the common path short.
template <typename T, int CODEC, bool REL, bool PENDING>
__device__ __forceinline__ void zc_quantize_quad(const ZQ<T>& q, float eb32, const T (&xs)[8], int h, u32 t0, int it,
                                                 int lane, bool& have, i32& prev31, u32 (&bq)[4], u32 (&mq)[4],
                                                 u32 (&sq)[4], i32 (&dq)[4], T (&rq)[4], i32* first, u32* pend) {
#pragma unroll
    for (int g = 0; g < 4; g++) {
        i32 code = 0;
        if constexpr (!REL && ZT<T>::SIZE == 4) {
            // zc_encode_layer's f32 abs/noa test, with the common outcome (every value strictly
            // inside the bound) taking a layer body in which the layer is known not to be raw
            const ZQ<float>& qf = (const ZQ<float>&)q;
            const float x = (float)xs[h + g];
            const float p = __fmul_rn(x, qf.inv);
            const bool inr = fabsf(p) < 536870912.0f;
            code = __float2int_rn(p);  // = (i32)rintf(p) wherever inr holds
            const float r = __fmul_rn(__int2float_rn(code), qf.step);
            rq[g] = (T)r;  // the decoder's value of a non-raw layer (zq_decode)
            const float d32 = fabsf(__fsub_rn(x, r));
            bool ok = inr && d32 < eb32;
            if (__all_sync(ZC_FULL, ok)) {
                zc_layer_body<CODEC, PENDING, false>(code, false, lane, t0 + (u32)(h + g), it, have, prev31, bq[g],
                                                     mq[g], sq[g], dq[g], first, pend);
                continue;
            }
            if (inr && d32 == eb32) ok = zq_within<float, false>(qf, x, r);
            const bool raw = !__all_sync(ZC_FULL, ok);
            zc_layer_body<CODEC, PENDING, true>(code, raw, lane, t0 + (u32)(h + g), it, have, prev31, bq[g], mq[g],
                                                sq[g], dq[g], first, pend);
        } else {
            const bool raw = !zc_encode_layer<T, REL>(q, eb32, xs[h + g], code);
            rq[g] = zq_decode<T, REL>(q, (i64)code);
            zc_layer_body<CODEC, PENDING, true>(code, raw, lane, t0 + (u32)(h + g), it, have, prev31, bq[g], mq[g],
                                                sq[g], dq[g], first, pend);
        }
    }
}

// ---- Range tracking (the *_track kernels: GpuCodec::compress_device_tracking and
// decompress_add_to_device_tracking). A reduction that needs the exact finite range of a buffer
// that a kernel reads anyway folds it in there instead of running a pass of its own. Keys are
// kernels/util.cu's zu_key in T's width (order-preserving: the sign bit flipped for non-negative
// values, every bit for negative ones; never 0 for a finite value). Each block keeps two of them
// in shared memory, `sk[0]` = max key, `sk[1]` = max complemented key (0 = none), which warps
// raise with shared atomics; thread 0 folds them into the caller's two device words (zu_range's
// u64 convention) with a global atomicMax only where they grow them (one read per block: no
// queue of same-address atomics from the 32k blocks of a 1 GiB buffer). With ON = false every
// call compiles to nothing, so the kernels without tracking are the code they were. A zero may
// be kept as -0.0 or +0.0 (min / max of equal zeros); the host decodes the keys with the
// canonical +0.0 of quant::finite_range.
template <typename T> __device__ __forceinline__ typename ZT<T>::bits_t zc_range_key(T x) {
    typedef typename ZT<T>::bits_t K;
    const K b = ZT<T>::bits(x);
    const K sign = (K)1 << (8 * sizeof(K) - 1);
    return (b & sign) ? (K)~b : (K)(b | sign);
}
// Warp-wide max of a key: REDUX (f64 keys in two steps, high words then low words).
template <typename K> __device__ __forceinline__ K zc_range_wmax(K v) {
    if constexpr (sizeof(K) == 4) {
        return __reduce_max_sync(ZC_FULL, v);
    } else {
        const u32 h = __reduce_max_sync(ZC_FULL, (u32)(v >> 32));
        const u32 l = __reduce_max_sync(ZC_FULL, (u32)(v >> 32) == h ? (u32)v : 0u);
        return ((u64)h << 32) | l;
    }
}
// A thread's finite min / max. A value costs three instructions and no predicate: fma(x, 0, x)
// is x for a finite x (x * 0 is a zero of x's sign, exact) and NaN for +-Inf and NaN, which
// fmin / fmax ignore. Empty (lo = +Inf, hi = -Inf), both of its keys (zc_range_key of hi, the
// complemented key of lo) are the key of -Inf, below the key of every finite value.
template <typename T> struct ZcMinMax {
    T lo, hi;
    __device__ __forceinline__ ZcMinMax() : lo((T)__int_as_float(0x7f800000)), hi(-(T)__int_as_float(0x7f800000)) {}
    __device__ __forceinline__ void add(T x) {
        const T f = fma(x, (T)0, x);
        lo = fmin(lo, f);
        hi = fmax(hi, f);
    }
};
// The tracker of a kernel. Values come in one by one (`add`) into a per-thread ZcMinMax, which
// `flush` (whole warp, at a point where the warp is converged) merges into the warp's slot in
// shared memory (zc_rng_warp[w], max key and max complemented key; lane 0 alone reads and
// writes it) with a warp-wide max (REDUX) of each key. The kernels flush once per iteration
// (1,024 values of a warp; the two-pass compression's pass 1 every eight values, having no
// register to spare across its steps), so the per-thread minimum and maximum live only within an
// iteration's loop: kept through a whole kernel, they made the decode loops spill. `fold`
// (whole warp, after everything) raises the block's keys sk with one shared atomic per warp and
// key. `add8`: eight values of a compression step, then a flush; value u counts when
// e0 + 32 u < n, as the two-pass loader pads a partial chunk with zeros.
template <typename T, bool ON> struct ZcRange {
    typedef typename ZT<T>::bits_t K;
    __device__ __forceinline__ void add(T) {}
    __device__ __forceinline__ void add8(const T (&)[8], u32, u32) {}
    __device__ __forceinline__ void flush() {}
    __device__ __forceinline__ void fold(K*) {}
};
__shared__ u64 zc_rng_warp[ZC_WARPS][2];  // ZcRange: per warp, max key and max complemented key
template <typename T> struct ZcRange<T, true> {
    typedef typename ZT<T>::bits_t K;
    ZcMinMax<T> m;  // the thread's values since the last flush
    __device__ __forceinline__ ZcRange() {
        if ((threadIdx.x & 31u) == 0u) {
            K* slot = (K*)zc_rng_warp[threadIdx.x >> 5];
            slot[0] = 0;
            slot[1] = 0;
        }
    }
    __device__ __forceinline__ void add(T x) { m.add(x); }
    __device__ __forceinline__ void add8(const T (&xs)[8], u32 e0, u32 n) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            if (e0 + 32u * (u32)u < n) m.add(xs[u]);
        }
        flush();
    }
    __device__ __forceinline__ void flush() {
        const K h = zc_range_wmax<K>(zc_range_key(m.hi));
        const K l = zc_range_wmax<K>((K)~zc_range_key(m.lo));
        m = ZcMinMax<T>();
        if ((threadIdx.x & 31u) == 0u) {
            K* slot = (K*)zc_rng_warp[threadIdx.x >> 5];
            slot[0] = h > slot[0] ? h : slot[0];
            slot[1] = l > slot[1] ? l : slot[1];
        }
    }
    __device__ __forceinline__ void fold(K* sk) {
        flush();
        const K none = zc_range_key(-(T)__int_as_float(0x7f800000));
        if ((threadIdx.x & 31u) == 0u) {
            const K* slot = (const K*)zc_rng_warp[threadIdx.x >> 5];
            if (slot[0] > none) atomicMax(sk, slot[0]);
            if (slot[1] > none) atomicMax(sk + 1, slot[1]);
        }
    }
};
// Thread 0, after a barrier that follows every fold of the block: the block's keys into `out`
// (zu_range's convention: out[0] = max key, out[1] = max of ~(u64)key).
template <typename K> __device__ __forceinline__ void zc_range_publish(const K* sk, u64* out) {
    const u64 h = (u64)sk[0], l = sk[1] ? ~(u64)(K)~sk[1] : 0ull;
    if (h && h > *(volatile u64*)out) atomicMax(out, h);
    if (l && l > *(volatile u64*)(out + 1)) atomicMax(out + 1, l);
}
// The finite values of the n < ZC_CHUNK values at cin (a partial chunk) folded into sk by the
// whole block, in a loop of its own (so that the two-pass loop of the one-pass codecs, which
// takes only this chunk, keeps its registers).
// Its tracker reuses the warp's slot: the kernel's own tracker has flushed nothing yet, and
// folding that slot again at the end is harmless (a maximum).
template <typename T> __device__ __forceinline__ void zc_range_chunk(const T* __restrict__ cin, u32 n,
                                                                     typename ZT<T>::bits_t* sk) {
    ZcRange<T, true> r;
    for (u32 i = threadIdx.x; i < n; i += ZC_THREADS) r.add(cin[i]);
    r.fold(sk);
}

// Pass 1 of a full chunk in one-pass mode (see the top of the file): quantizes and stages every
// layer of the warp's iterations; writes rate[l] (0xFF raw; the pending layer: its brest), d0s[l]
// (lane 0's delta; 0 for the pending and raw layers), sinfo[l]; per iteration with a non-raw
// layer (aatrox) first[it] = its pending layer's first code, pend[it] = that layer's index t,
// last[it] = the last code of its last non-raw layer, and bit it of *has. RECON: rc (the chunk's
// values, in place) receives the reconstruction of every staged non-raw layer, whose values are
// never read again (pass 2 re-reads only raw and unstaged layers, and writes theirs). tr
// (ZcRange, flushed once per iteration) sees every value of the chunk (range tracking; a no-op
// without it).
template <typename T, int CODEC, bool REL, bool RECON, typename R>
__device__ __forceinline__ void zc_stage_chunk(const T* __restrict__ cin, const ZQ<T>& q, float eb32, int w, int lane,
                                               u32* st, u8* rate, i32* d0s, unsigned short* sinfo, i32* first,
                                               i32* last, u32* pend, u32* has, T* rc, R& tr) {
    const int W = ZC_WARPS;
    const int J = 32 / ZC_WARPS;
    u32 cur = 0;
#pragma unroll 1
    for (int j = 0; j < J; j++) {
        const int it = w + j * W;
        bool have = false;  // aatrox: this iteration has had a non-raw layer (warp-uniform)
        i32 prev31 = 0;     // lane 31: the last code of that layer
#pragma unroll 1
        for (int t0 = 0; t0 < 32; t0 += 8) {
            const T* p = cin + ((u32)(it * 32 + t0) << 5) + (u32)lane;
            T xs[8];
#pragma unroll
            for (int u = 0; u < 8; u++) xs[u] = p[u * 32];
#pragma unroll
            for (int u = 0; u < 8; u++) tr.add(xs[u]);  // a full chunk: every value is present
#pragma unroll
            for (int h = 0; h < 8; h += 4) {
                u32 bq[4], mq[4], sq[4];
                i32 dq[4];  // lane 0: the layers' first deltas
                T rq[4];    // the layers' reconstructions (non-raw layers)
                if (CODEC == ZC_AATROX && !have) {  // warp-uniform; mostly the first quad only
                    zc_quantize_quad<T, CODEC, REL, true>(q, eb32, xs, h, (u32)t0, it, lane, have, prev31, bq, mq, sq,
                                                          dq, rq, first, pend);
                } else {
                    zc_quantize_quad<T, CODEC, REL, false>(q, eb32, xs, h, (u32)t0, it, lane, have, prev31, bq, mq,
                                                           sq, dq, rq, first, pend);
                }
                const u32 lq = (u32)it * 32u + (u32)(t0 + h);  // a multiple of 4
                if (lane == 0) {
                    *(u32*)(rate + lq) = bq[0] | (bq[1] << 8) | (bq[2] << 16) | (bq[3] << 24);
                    *(int4*)(d0s + lq) = make_int4(dq[0], dq[1], dq[2], dq[3]);
                }
                zc_stage4(st, cur, bq, mq, sq, lane, sinfo + lq);
                if constexpr (RECON) {
                    __syncwarp();  // lane 0 wrote the stage infos
#pragma unroll
                    for (int g = 0; g < 4; g++) {
                        if (bq[g] != 0xFFu && sinfo[lq + g] != ZC_NOSTAGE) rc[((lq + (u32)g) << 5) + (u32)lane] = rq[g];
                    }
                }
            }
        }
        tr.flush();
        if (CODEC == ZC_AATROX && have) {
            if (lane == 31) last[it] = prev31;
            if (lane == 0) atomicOr(has, 1u << it);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Compression. Warp w owns iteration layers w, w + W, w + 2W, ... (J = 32 / W of them).
// Lane `lane`'s values of thread steps t0 .. t0+7 of iteration layer `it` (value t of a layer is
// at (it * 32 + t) * 32 + lane of the chunk; 0 past the end).
template <typename T>
__device__ __forceinline__ void zc_load_steps(const T* __restrict__ cin, u32 n, int it, int t0, int lane, T (&xs)[8]) {
#pragma unroll
    for (int u = 0; u < 8; u++) {
        u32 e = (u32)(it * 32 + t0 + u) * 32u + lane;
        xs[u] = e < n ? cin[e] : (T)0;
    }
}

// The stream header as the host prepares it for a compression launch (FORMAT.md "Header"): every
// field but payload_len, the payload checksum and the header checksum, which the last block of
// zc_compress fills in before it writes the header (the host rewrites it for a stored stream).
struct ZHeader {
    u32 w[24];
};
__device__ __forceinline__ void zc_write_header(u8* out, const ZHeader& hdr, u64 payload_len, u32 payload_checksum) {
    u32 w[24];
#pragma unroll
    for (int i = 0; i < 24; i++) w[i] = hdr.w[i];
    w[16] = (u32)payload_len;  // bytes 64..71
    w[17] = (u32)(payload_len >> 32);
    w[19] = payload_checksum;  // bytes 76..79
    u32 sum = 0;
#pragma unroll
    for (int i = 0; i < 23; i++) sum += zhash_mix(w[i], (u32)i);
    w[23] = zhash_final(sum, 23u);  // bytes 92..95: zhash of bytes 0..92
    uint4* o = (uint4*)out;  // the host launches only for a 16-aligned output
#pragma unroll
    for (int i = 0; i < 6; i++) o[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
}

// RECON: `recon` is the input itself, and every value of a non-raw layer is overwritten with what
// the stream decodes it to, right after its last read (a raw layer's values are decoded as they
// are): the caller keeps what every receiver of the stream holds without decoding the stream.
// A chunk that does not fit `out_cap` (the stream is then stored) may be left partly rewritten.
// TRACK: the finite range of the input is folded into range[0..2] (ZcRange): pass 1 reads every
// value once in both variants, whether or not the chunk then fits `out_cap`.
template <typename T, int CODEC, bool REL, bool RECON = false, bool TRACK = false>
__device__ __forceinline__ void zc_compress(const T* __restrict__ in, u64 count, u8* __restrict__ out,
                                            u64 out_cap, u64* status, u64* ctrl, u32 n_chunks, ZQ<T> q,
                                            const ZHeader& hdr, T* recon = nullptr, u64* range = nullptr) {
    typedef typename ZT<T>::code_t C;
    typedef typename ZU<T>::U U;
    const int SIZE = ZT<T>::SIZE;
    const int W = ZC_WARPS;
    const int J = 32 / ZC_WARPS;
    // one-pass variant (see the top of the file): f32, word-aligned codecs
    constexpr bool ONE = ZT<T>::SIZE == 4 && CODEC != ZC_OUTLIER;

    __shared__ u32 s_off[1024];
    __shared__ __align__(16) u32 s_rate[256];
    __shared__ __align__(16) C s_prev[(CODEC == ZC_AATROX || ONE) ? 1024 : 1];  // one-pass: d0; two-pass: prev
    __shared__ u32 s_stage[ONE ? ZC_STAGE_WORDS : 1];
    __shared__ unsigned short s_sinfo[ONE ? 1024 : 1];
    __shared__ C s_first[32];
    __shared__ C s_last[32];
    __shared__ u32 s_pend[32];  // one-pass: index t of each iteration's pending layer
    __shared__ u32 s_wtot[32];
    __shared__ u32 s_tmp[32];
    __shared__ u32 s_has, s_mask, s_chunk, s_size, s_usize;
    __shared__ u64 s_base;
    __shared__ U s_rng[TRACK ? 2 : 1];  // TRACK: the block's range keys (ZcRange)

    // warp-uniform values go through REDUX (a uniform register) so that the compiler knows the
    // branches on them are uniform and emits no collective fix-ups around shuffles and votes
    const int tid = threadIdx.x, lane = tid & 31;
    const int w = (int)__reduce_max_sync(ZC_FULL, (u32)tid >> 5);
    if (tid == 0) {
        s_chunk = (u32)atomicAdd(ctrl + ZC_TICKET, 1ull);
        s_has = 0;
        s_mask = 0;
        if (TRACK) {
            s_rng[0] = 0;
            s_rng[TRACK ? 1 : 0] = 0;
        }
    }
    __syncthreads();
    const u32 c = __reduce_max_sync(ZC_FULL, s_chunk);
    const u64 cbase = (u64)c << 15;
    const u32 n = (u32)((count - cbase) < (u64)ZC_CHUNK ? (count - cbase) : (u64)ZC_CHUNK);
    const u32 n_layers = (n + 31) >> 5;
    const T* cin = in + cbase;
    T* const rc = RECON ? recon + cbase : nullptr;
    const float eb32 = __double2float_rn(q.eb);
    ZcRange<T, TRACK> tr;

    C init = 0;
    // one-pass staging for full chunks (block-uniform); the partial last chunk takes two passes
    const bool staged = ONE && n == ZC_CHUNK;
    u32* const st_w = s_stage + (ONE ? w * ZC_SW : 0);  // ONE: this warp's arena slice
    if (staged) {
        if constexpr (ONE) {
            zc_stage_chunk<T, CODEC, REL, RECON>(cin, q, eb32, w, lane, st_w, (u8*)s_rate, s_prev, s_sinfo, s_first,
                                                 s_last, s_pend, &s_has, rc, tr);
        }
        tr.fold(s_rng);
        __syncthreads();
        if (CODEC == ZC_AATROX) {
            // the first delta of each iteration's pending layer: prev is the last code of the
            // latest earlier iteration with a non-raw layer, or init (the chunk's first code)
            const u32 has = s_has;
            init = has ? s_first[__ffs(has) - 1] : (C)0;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int it = w + j * W;
                if (((has >> it) & 1u) && (u32)lane == s_pend[it]) {
                    const u32 before = has & ((1u << it) - 1u);
                    const C incoming = before ? s_last[31 - __clz(before)] : init;
                    const C d0 = (C)((U)s_first[it] - (U)incoming);
                    const U a0 = d0 < 0 ? (U)0 - (U)d0 : (U)d0;
                    const u32 l = (u32)(it * 32 + lane);
                    const u32 br = ((const u8*)s_rate)[l];
                    const u32 bw = ZU<T>::width(a0);
                    ((u8*)s_rate)[l] = (u8)(bw > br ? bw : br);
                    s_prev[l] = d0;
                }
            }
            __syncwarp();
        }
    } else {
        // one-pass codecs take this path for a partial last chunk only: its range in a loop of its
        // own (folded in pass 1 below, the tracking spilled registers of the one-pass path)
        if constexpr (ONE && TRACK) zc_range_chunk<T>(cin, n, s_rng);
        // ---- pass 1: quantize, raw flags, in-layer delta magnitudes; lane t keeps layer (it, t)
        bool my_exists[J], my_raw[J];
        U my_rest[J];
        C my_q0[J], my_q31[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            my_exists[j] = false;
            my_raw[j] = false;
            my_rest[j] = 0;
            my_q0[j] = 0;
            my_q31[j] = 0;
            const int it = w + j * W;
#pragma unroll 1
            for (int t0 = 0; t0 < 32; t0 += 8) {
                T xs[8];
                zc_load_steps(cin, n, it, t0, lane, xs);
                if constexpr (!ONE) tr.add8(xs, (u32)(it * 32 + t0) * 32u + (u32)lane, n);  // not the padding
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int t = t0 + u;
                    const u32 l = (u32)(it * 32 + t);
                    if (l < n_layers) {
                        const u32 nt = min(32u, n - l * 32u);
                        const bool present = (u32)lane < nt;
                        C code = 0;
                        bool ok = true;
                        if (present) ok = zc_encode<T, REL>(q, eb32, xs[u], code);
                        bool raw = __any_sync(ZC_FULL, !ok);
                        C qlast = zc_shfl(code, nt - 1);
                        if (!present) code = qlast;
                        C qp = zc_shfl_up(code, 1);
                        C d = (C)((U)code - (U)qp);
                        U m = lane > 0 ? (d < 0 ? (U)0 - (U)d : (U)d) : (U)0;
                        U rest = ZU<T>::reduce_or(m);
                        C q0 = zc_shfl(code, 0);
                        if (lane == t) {
                            my_exists[j] = true;
                            my_raw[j] = raw;
                            my_rest[j] = rest;
                            my_q0[j] = q0;
                            my_q31[j] = qlast;
                        }
                    }
                }
            }
        }

        tr.fold(s_rng);
        // ---- chain: init = first code of the first non-raw layer; prev = last code before
        u32 nonraw[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int it = w + j * W;
            nonraw[j] = __ballot_sync(ZC_FULL, my_exists[j] && !my_raw[j]);
            if (CODEC == ZC_AATROX) {
                int fl = nonraw[j] ? __ffs(nonraw[j]) - 1 : 0;
                int ll = nonraw[j] ? 31 - __clz(nonraw[j]) : 0;
                C f = zc_shfl(my_q0[j], fl);
                C L = zc_shfl(my_q31[j], ll);
                if (lane == 0) {
                    s_first[it] = f;
                    s_last[it] = L;
                    if (nonraw[j]) atomicOr(&s_has, 1u << it);
                }
            }
        }
        __syncthreads();
        const u32 has = s_has;
        if (CODEC == ZC_AATROX) init = has ? s_first[__ffs(has) - 1] : (C)0;

        // ---- rate byte of layer (it, lane)
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int it = w + j * W;
            C prev = 0;
            if (CODEC == ZC_AATROX) {
                const u32 before = has & ((1u << it) - 1u);
                C incoming = before ? s_last[31 - __clz(before)] : init;
                const u32 mb = nonraw[j] & ((1u << lane) - 1u);
                C pl = zc_shfl(my_q31[j], mb ? 31 - __clz(mb) : 0);
                prev = mb ? pl : incoming;
            }
            u32 rate = 0;
            if (my_exists[j]) {
                const u32 l = (u32)(it * 32 + lane);
                const u32 nt = min(32u, n - l * 32u);
                if (my_raw[j]) {
                    rate = 0xFF;
                } else {
                    C d0 = (C)((U)my_q0[j] - (U)prev);
                    U a0 = d0 < 0 ? (U)0 - (U)d0 : (U)d0;
                    u32 b_all = ZU<T>::width(my_rest[j] | a0);
                    rate = b_all;
                    if (CODEC == ZC_OUTLIER) {
                        i64 d64 = (i64)d0;
                        u64 z = ((u64)d64 << 1) ^ (u64)(d64 >> 63);
                        if (z <= 0xFFFFFFFFull) {
                            u32 o = z <= 0xFFull ? 1u : (z <= 0xFFFFull ? 2u : 3u);
                            u32 ow = zc_obytes(o);
                            u32 b_rest = ZU<T>::width(my_rest[j]);
                            if (ow + zc_packed(b_rest) < zc_packed(b_all)) rate = (o << 6) | b_rest;
                        }
                    }
                }
            }
            ((u8*)s_rate)[it * 32 + lane] = (u8)rate;
            if (CODEC == ZC_AATROX) s_prev[it * 32 + lane] = prev;
        }
    }
    // ---- layer sizes, offsets within each iteration, iterations with a non-zero rate
    u32 incl[J], lsize[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int it = w + j * W;
        const u32 l = (u32)(it * 32 + lane);
        const u32 rate = ((const u8*)s_rate)[l];
        const u32 nt = l < n_layers ? min(32u, n - l * 32u) : 0u;
        const u32 ls = rate == 0xFFu ? nt * SIZE : zc_obytes(rate >> 6) + zc_packed(rate & 63u);
        lsize[j] = ls;
        incl[j] = warp_incl_u32(ls, lane);
        const bool itnz = __any_sync(ZC_FULL, rate != 0);
        if (lane == 31) s_wtot[it] = incl[j];
        if (lane == 0 && itnz) atomicOr(&s_mask, 1u << it);
    }
    __syncthreads();
    if (w == 0) {
        u32 v = s_wtot[lane];
        u32 inc = warp_incl_u32(v, lane);
        s_wtot[lane] = inc - v;
        const u32 mask = s_mask;
        const u32 pstart = SIZE + 4 + 32u * __popc(mask);
        const u32 total = __shfl_sync(ZC_FULL, inc, 31);
        const u32 usize = pstart + total;
        const u32 csize = (usize + 3u) & ~3u;
        u64 excl = lookback_exclusive(status, c, (u64)csize, lane);
        if (lane == 0) {
            s_base = ZC_HEADER_LEN + 8ull * n_chunks + excl;
            s_size = csize;
            s_usize = usize;
        }
    }
    __syncthreads();
    const u32 mask = s_mask;
    const u32 pstart = SIZE + 4 + 32u * __popc(mask);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int it = w + j * W;
        s_off[it * 32 + lane] = pstart + s_wtot[it] + (incl[j] - lsize[j]);
    }
    __syncthreads();

    const u64 base = s_base;
    const u32 csize = s_size;
    const bool write = base + csize <= out_cap;
    u8* co = out + base;
    u32* cw = (u32*)co;
    u32 hsum = 0;
    if (write) {
        // head: init, mask
        if (tid == 0) {
            u32 w0 = (u32)(u64)(i64)init;
            cw[0] = w0;
            hsum += zhash_mix(w0, 0);
            if (SIZE == 8) {
                u32 w1 = (u32)((u64)(i64)init >> 32);
                cw[1] = w1;
                hsum += zhash_mix(w1, 1);
            }
            cw[SIZE / 4] = mask;
            hsum += zhash_mix(mask, SIZE / 4);
        }
        // rate bytes of the iterations this warp owns
        for (int j = lane >> 3; j < J; j += 4) {
            const int k = lane & 7;
            const int it = w + j * W;
            if ((mask >> it) & 1u) {
                u32 ro = (SIZE + 4 + 32u * __popc(mask & ((1u << it) - 1u))) >> 2;
                u32 v = s_rate[it * 8 + k];
                cw[ro + k] = v;
                hsum += zhash_mix(v, ro + k);
            }
        }
        if (staged) {
            // ---- one-pass: copy the staged layers out (see the top of the file)
            const u32 has = CODEC == ZC_AATROX ? s_has : 0u;
#pragma unroll 1
            for (int j = 0; j < J; j++) {
                const int it = w + j * W;
                if (!((mask >> it) & 1u)) continue;  // every rate byte of this iteration is 0
                const u32 l0 = (u32)it * 32u;
                // lane t describes layer l0 + t (o = 0 for these codecs: the rate byte is b)
                const u32 r = ((const u8*)s_rate)[l0 + lane];
                const u32 si = s_sinfo[l0 + lane];
                const u32 myoff = s_off[l0 + lane];
                const u32 myend = myoff + (r == 0xFFu ? 32u * SIZE : zc_packed(r));
                const u32 pend = ((has >> it) & 1u) ? s_pend[it] : 32u;
                // staged exactly as the stream holds it: one contiguous copy per run of such layers
                const u32 cm = __ballot_sync(ZC_FULL, r != 0xFFu && si != ZC_NOSTAGE && (u32)lane != pend);
#pragma unroll 1
                for (u32 t = 0; t < 32u;) {
                    const u32 run = cm >> t;
                    if (run & 1u) {
                        const u32 e = ~run == 0u ? 32u : t + (u32)(__ffs(~run) - 1);
                        const u32 wo = __shfl_sync(ZC_FULL, myoff, t) >> 2;
                        const u32 nw = (__shfl_sync(ZC_FULL, myend, e - 1u) >> 2) - wo;
                        const u32* src = st_w + (__shfl_sync(ZC_FULL, si, t) >> 5);
                        for (u32 i = (u32)lane; i < nw; i += 32u) {
                            const u32 v = src[i];
                            cw[wo + i] = v;
                            hsum += zhash_mix(v, wo + i);
                        }
                        t = e;
                        continue;
                    }
                    const u32 l = l0 + t;
                    const u32 rr = __shfl_sync(ZC_FULL, r, t);
                    const u32 off = __shfl_sync(ZC_FULL, myoff, t);
                    const u32 info = __shfl_sync(ZC_FULL, si, t);
                    if (rr != 0u && rr != 0xFFu && info != ZC_NOSTAGE) {
                        // the pending layer, staged without its first delta: word k of the layer
                        // (0: sign word, k >= 1: plane k - 1) from lane k
                        const u32 br = info & 31u, so = info >> 5;
                        const C d0 = s_prev[l];
                        const u32 a0 = d0 < 0 ? 0u - (u32)d0 : (u32)d0;
                        const u32 k = (u32)lane;
                        if (k <= rr) {
                            u32 v;
                            if (k == 0u) v = (br != 0u ? st_w[so] : 0u) | (d0 < 0 ? 1u : 0u);
                            else v = (k <= br ? st_w[so + k] : 0u) | ((a0 >> (k - 1u)) & 1u);
                            const u32 wi = (off >> 2) + k;
                            cw[wi] = v;
                            hsum += zhash_mix(v, wi);
                        }
                    } else if (rr != 0u) {
                        // raw, or did not fit the arena: re-read and re-quantize (a full chunk)
                        const T x = cin[l * 32u + (u32)lane];
                        if (rr == 0xFFu) {
                            const u32 bits = (u32)ZT<T>::bits(x);
                            const u32 wi = (off >> 2) + (u32)lane;
                            cw[wi] = bits;
                            hsum += zhash_mix(bits, wi);
                        } else {
                            const C code = zq_code<T, REL>(q, x);
                            if (RECON) rc[l * 32u + (u32)lane] = zq_decode<T, REL>(q, (i64)code);
                            const C qp = zc_shfl_up(code, 1);
                            C d = (C)((U)code - (U)qp);
                            if (lane == 0) d = s_prev[l];  // d0
                            const u32 sign = __ballot_sync(ZC_FULL, d < 0);
                            const u32 pl = warp_transpose32((u32)(d < 0 ? (U)0 - (U)d : (U)d), lane);
                            zc_put_layer(cw, off >> 2, sign, pl, rr, lane, 0, hsum);
                        }
                    }
                    t += 1u;
                }
            }
        } else {
            // ---- pass 2: layer payloads
            const bool CPAIRS = SIZE == 4 && CODEC != ZC_OUTLIER;
    #pragma unroll 1
            for (int j = 0; j < J; j++) {
                const int it = w + j * W;
    #pragma unroll 1
                for (int t0 = 0; t0 < 32; t0 += 8) {
                    T xs[8];
                    zc_load_steps(cin, n, it, t0, lane, xs);
                    bool skip = false;  // the previous step wrote this layer as the second of a pair
    #pragma unroll
                    for (int u = 0; u < 8; u++) {
                        if (skip) {
                            skip = false;
                            continue;
                        }
                        const u32 l = (u32)(it * 32 + t0 + u);
                        if (l >= n_layers) continue;
                        const u32 r = __reduce_max_sync(ZC_FULL, (u32)((const u8*)s_rate)[l]);
                        if (CPAIRS && (u & 1) == 0 && l + 1 < n_layers) {
                            // f32, word-aligned codecs: two non-raw layers with deltas of <= 16 bits
                            // share one transpose (A = l is full: it is not the last layer)
                            const u32 rB = __reduce_max_sync(ZC_FULL, (u32)((const u8*)s_rate)[l + 1]);
                            if (r != 0xFFu && rB != 0xFFu && (r & 63u) <= 16u && (rB & 63u) <= 16u && (r | rB) != 0u) {
                                const u32 bA = r & 63u, bB = rB & 63u;
                                const u32 ntB = min(32u, n - (l + 1) * 32u);
                                C cA = zq_code<T, REL>(q, xs[u]);
                                C cB = (u32)lane < ntB ? zq_code<T, REL>(q, xs[u + 1]) : (C)0;
                                if (RECON) {
                                    rc[l * 32u + (u32)lane] = zq_decode<T, REL>(q, (i64)cA);
                                    if ((u32)lane < ntB) rc[(l + 1) * 32u + (u32)lane] = zq_decode<T, REL>(q, (i64)cB);
                                }
                                if (ntB < 32u) {
                                    C ql = zc_shfl(cB, ntB - 1);
                                    if ((u32)lane >= ntB) cB = ql;
                                }
                                C pA = zc_shfl_up(cA, 1), pB = zc_shfl_up(cB, 1);
                                if (lane == 0) {
                                    pA = CODEC == ZC_AATROX ? s_prev[l] : (C)0;
                                    pB = CODEC == ZC_AATROX ? s_prev[l + 1] : (C)0;
                                }
                                const C dA = (C)((U)cA - (U)pA), dB = (C)((U)cB - (U)pB);
                                const u32 sA = __ballot_sync(ZC_FULL, dA < 0), sB = __ballot_sync(ZC_FULL, dB < 0);
                                const u32 mA = (u32)(dA < 0 ? (U)0 - (U)dA : (U)dA);
                                const u32 mB = (u32)(dB < 0 ? (U)0 - (U)dB : (U)dB);
                                const u32 pl = warp_transpose32(mA | (mB << 16), lane);
                                const u32 wA = s_off[l] >> 2, wB = s_off[l + 1] >> 2;
                                if (bA > 0) zc_put_layer(cw, wA, sA, pl, bA, lane, 0, hsum);
                                if (bB > 0) zc_put_layer(cw, wB, sB, pl, bB, lane, 16, hsum);
                                skip = true;
                                continue;
                            }
                        }
                        const u32 nt = min(32u, n - l * 32u);
                        const bool present = (u32)lane < nt;
                        if (RECON && r != 0xFF && present) rc[l * 32u + (u32)lane] = zq_decode<T, REL>(q, (i64)zq_code<T, REL>(q, xs[u]));
                        if (r == 0) continue;
                        const u32 off = s_off[l];
                        if (r == 0xFF) {
                            if (present) {
                                typename ZT<T>::bits_t bits = ZT<T>::bits(xs[u]);
                                u32 o = off + (u32)lane * SIZE;
                                if (zc_aligned<CODEC>()) {
                                    cw[o >> 2] = (u32)bits;
                                    hsum += zhash_mix((u32)bits, o >> 2);
                                    if (SIZE == 8) {
                                        cw[(o >> 2) + 1] = (u32)((u64)bits >> 32);
                                        hsum += zhash_mix((u32)((u64)bits >> 32), (o >> 2) + 1);
                                    }
                                } else {
                                    zc_put_any(co, o, (u32)bits);
                                    if (SIZE == 8) zc_put_any(co, o + 4, (u32)((u64)bits >> 32));
                                }
                            }
                            continue;
                        }
                        C code = present ? zq_code<T, REL>(q, xs[u]) : (C)0;
                        C qlast = zc_shfl(code, nt - 1);
                        if (!present) code = qlast;
                        C qp = zc_shfl_up(code, 1);
                        if (lane == 0) {
                            if (CODEC == ZC_AATROX) qp = s_prev[l];
                            else qp = 0;
                        }
                        C d = (C)((U)code - (U)qp);
                        const u32 o = r >> 6, b = r & 63u;
                        u32 pos = off;
                        if (o != 0) {
                            const u32 ow = zc_obytes(o);
                            if (lane == 0) {
                                i64 d64 = (i64)d;
                                u64 z = ((u64)d64 << 1) ^ (u64)(d64 >> 63);
                                for (u32 k = 0; k < ow; k++) co[off + k] = (u8)(z >> (8 * k));
                                d = 0;
                            }
                            pos += ow;
                        }
                        if (b > 0) {
                            const u32 sign = __ballot_sync(ZC_FULL, d < 0);
                            U m = d < 0 ? (U)0 - (U)d : (U)d;
                            u32 plo = warp_transpose32((u32)m, lane);
                            if (zc_aligned<CODEC>()) {
                                zc_put_layer(cw, pos >> 2, sign, plo, b, lane, 0, hsum);
                            } else {
                                if (lane == 0) zc_put_any(co, pos, sign);
                                if ((u32)lane < b) zc_put_any(co, pos + 4 + 4 * lane, plo);
                            }
                            if (SIZE == 8 && b > 32) {
                                u32 phi = warp_transpose32((u32)((u64)m >> 32), lane);
                                if ((u32)lane + 32 < b) {
                                    if (zc_aligned<CODEC>()) {
                                        u32 wi = (pos >> 2) + 33 + lane;
                                        cw[wi] = phi;
                                        hsum += zhash_mix(phi, wi);
                                    } else {
                                        zc_put_any(co, pos + 4 + 4 * (32 + lane), phi);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        if (!zc_aligned<CODEC>()) {
            if (tid == 0) {
                for (u32 k = s_usize; k < csize; k++) co[k] = 0;
            }
            __syncthreads();
            hsum = 0;  // the head and rates are hashed again from memory with everything else
            for (u32 i = tid; i < csize / 4; i += ZC_WARPS * 32) hsum += zhash_mix(__ldcg(cw + i), i);
        }
    }
    u32 tot = zc_block_sum(hsum, s_tmp, w, lane);
    if (tid == 0) {
        u32 hash = zhash_final(tot, csize / 4);
        u32* tbl = (u32*)(out + 96);
        tbl[2 * c] = csize;
        tbl[2 * c + 1] = hash;
        atomicAdd(ctrl + ZC_HASH, (u64)zhash_mix(csize, 2 * c) + (u64)zhash_mix(hash, 2 * c + 1));
        if (TRACK) zc_range_publish(s_rng, range);
        __threadfence();
        if (atomicAdd(ctrl + ZC_DONE, 1ull) == (u64)n_chunks - 1ull) {
            __threadfence();
            const u64 last = *((volatile u64*)(status + n_chunks - 1)) >> 2;
            const u64 payload = 8ull * n_chunks + last;
            ctrl[ZC_PAYLOAD] = payload;
            const u32 th = (u32)atomicAdd(ctrl + ZC_HASH, 0ull);
            zc_write_header(out, hdr, payload, zhash_final(th, 2u * n_chunks));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decompression
// ACC (fused decompress-and-accumulate, NCCL reductions): out = out + x, one IEEE rounding.
__device__ __forceinline__ float zc_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double zc_add_rn(double a, double b) { return __dadd_rn(a, b); }
// Decoded values are stored with the streaming (evict-first) hint: the 4-5x larger output then
// no longer pushes the stream, which each block reads three times (checksum, level 1, level 2),
// out of L2.
// The accumulating kernels add to a base that may live elsewhere (`out = base + x`, so a ring
// step needs no copy of its input): the byte distance from `out` to `base`, set once per block
// by the kernel's entry (0 when adding in place).
// tr (ZcRange) sees every base value the accumulating kernels load (range tracking).
__shared__ long long zc_acc_base_off;
template <typename T, bool ACC, typename R> __device__ __forceinline__ void zc_store(T* p, T x, R& tr) {
    if (ACC) {
        const T b = *(const T*)((const char*)p + zc_acc_base_off);
        tr.add(b);
        *p = zc_add_rn(b, x);
    } else {
        __stcs(p, x);
    }
}
// Accumulate a stored stream's raw values: dst[i] += src[i].
template <typename T> __device__ __forceinline__ void zc_add_raw(const T* __restrict__ src, u64 n, T* __restrict__ dst) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) dst[i] = zc_add_rn(dst[i], src[i]);
}
#define ZC_E_SIZE 1ull
#define ZC_E_RANGE 2ull
#define ZC_E_CHECKSUM 4ull
#define ZC_E_META 8ull
#define ZC_E_TOTAL 16ull
#define ZC_E_TABLE 32ull
#define ZC_E_GUESS 64ull  // zc_decompress_hdr: the header is not the one the launch assumed

// ---- DEC2 decompression (f32 aatrox / cuszp-plain in abs/noa mode, with and without ACC; f64,
// REL and cuszp-outlier take the per-layer path). Level 2 (the in-layer decode) is where
// the instructions go: per two layers the default path issues rate/offset loads, a 5-stage warp
// transpose, two sign selects, two 5-stage warp scans, i64 code arithmetic and conversions:
// ~150-175 SASS instructions per pair (64 values). A DEC2 quad (128 values) is ~160 on its
// common path (small starts, not all zero): about half per value. Same registers (40, the
// 512 x 3 launch-bound cap, no spills in abs) and the same shared memory (no new arrays).
// * Quads: four consecutive layers of one iteration with b <= 7 (no raw layer; the typical layer
//   at ratio 5 has b ~ 5-6) are decoded with ONE transpose: lane 8g + k loads plane k of layer
//   ll + g (k < b) or its sign word (k = 7; none when b = 0), one coalesced load of <= 32 words.
//   After the transpose byte g of lane c is sign << 7 | magnitude of value c of layer ll + g.
// * Two layers per scan: the deltas of layers g and g + 2 are packed as p = d_g + d_{g+2} * 2^16
//   (exact as an i32, built without per-value selects: positive and negative byte magnitudes are
//   split with masks and subtracted), so two warp scans serve four layers. |d| <= 127 bounds every
//   in-layer prefix sum by 32 * 127 = 4064 < 2^15, so both halves are recovered exactly by a sign
//   extension of the low half and an exact arithmetic shift of the rest.
// * i32 codes: the block learns in the barrier before level 2 (__syncthreads_and) whether every
//   layer start lies within +-2^30 (always for plain: starts are 0). Then the code of a quad or
//   pair value (|in-layer sum| < 2^21) fits i32 and decode is int2float + fmul; otherwise the
//   i64 code goes through zq_decode as before. ZT<float>::from_code takes the same 32-bit
//   conversion for a code that fits, so the values are bit-identical. The branch on small32 is
//   block-uniform and taken once per quad / pair (the starts are then read as 32-bit low words).
// * An all-zero quad (four b = 0 layers, e.g. an empty iteration) skips the load, transpose and
//   scans: its codes are the layer starts.
// Everything before level 2 (table, checksum, metadata, rate and size validation, level 1) is
// unchanged, so the errors and rejections are identical; quads read only words of their layers'
// packed payloads (k < b or the sign word of a b > 0 layer), which the size check has bounded.
// Pairs (b <= 16) and single layers take the default code, only with the i32 codes of pairs. A
// pair of b <= 15 is read like a quad with 16-lane groups (planes and sign word in one load, the
// sign at bit 15 of each half after the transpose); when both have b <= 10 its two deltas are
// packed into one i32 (d_A + d_B * 2^16) for one warp scan (32 * 1023 < 2^15 keeps both halves
// exact).
// Not done: 16-byte output stores (a warp's store of one layer is already 128 contiguous bytes;
// vectorizing would need a 4x4 lane transpose costing more shuffles than the stores it saves).
#define ZC_D2_SMALL (1ll << 30)
// A value of a DEC2 quad or pair: code = st + s with |s| < 2^21; small32: |st| <= 2^30.
template <typename T, bool REL>
__device__ __forceinline__ T zc_d2_value(const ZQ<T>& q, i64 st, i32 s, bool small32) {
    if (!REL && ZT<T>::SIZE == 4 && small32) return (T)__fmul_rn(__int2float_rn((i32)st + s), (float)q.step);
    return zq_decode<T, REL>(q, (i64)((u64)st + (u64)(i64)s));
}

// ---- Group decoding: an iteration (32 layers) of a full chunk whose
// layers are all non-raw with b <= 15, in a block with small32 (f32 abs/noa, aatrox / plain), is
// decoded by a loop without per-layer decisions: groups of G consecutive layers share one load and
// one warp transpose. The group size follows the iteration's widest layer: G = 4 (b <= 7, field
// width F = 8), G = 3 (b <= 9, F = 10, lanes 30 and 31 idle) or G = 2 (b <= 15, F = 16). Lane F g + k
// loads word zc_group_kw of layer t + g, so after the transpose field g of lane c is
// (sign << (F - 1)) | magnitude of value c of layer t + g (zc_group_prefix; the per-layer loop's
// quads and pairs load and sum the same way). Codes are start + in-layer prefix as i32
// (small32) and decode as zc_d2_value does, so the values are those of the per-layer loop. What
// it saves: the per-layer quad / pair / zero tests, rate and
// offset loads, and the pair path's set-up (uniform noise at noa 1e-3 has b = 9 and took pairs).
// The word of its group's layer g = lane / F that lane F g + k loads: plane k (word k + 1) for
// k < F - 1, the sign word (word 0) for k = F - 1; 0xFF for the idle lanes 30, 31 of G = 3. The
// lane loads it when kw < the layer's word count (b + 1, or 0 when b = 0).
template <int G> __device__ __forceinline__ u32 zc_group_kw(int lane) {
    constexpr int F = G == 3 ? 10 : 32 / G;
    const int g = lane / F, k = lane - g * F;
    return g >= G ? 0xFFu : (k == F - 1 ? 0u : (u32)k + 1u);
}

// In-layer prefix sums s[g] of the G layers of a group from their transposed words mm (field g of
// lane c = (sign << (F - 1)) | magnitude of value c). Deltas are scanned two per i32 (d_a +
// d_b * 2^16): exact while 32 * max|d| < 2^15, i.e. b <= 10; PACK = false (G = 2 with a wider
// layer) scans each layer alone.
template <int G, bool PACK> __device__ __forceinline__ void zc_group_prefix(u32 mm, int lane, i32 (&s)[G]) {
    if constexpr (G == 4) {
        // byte g = sign << 7 | magnitude; P02 = d0 + d2 * 2^16, P13 = d1 + d3 * 2^16
        const u32 neg = ((mm >> 7) & 0x01010101u) * 0x7Fu;
        const u32 mag = mm & 0x7F7F7F7Fu;
        const u32 pos = mag & ~neg, ngv = mag & neg;
        const i32 c02 = warp_incl_i32((i32)(pos & 0x00FF00FFu) - (i32)(ngv & 0x00FF00FFu), lane);
        const i32 c13 = warp_incl_i32((i32)((pos >> 8) & 0x00FF00FFu) - (i32)((ngv >> 8) & 0x00FF00FFu), lane);
        s[0] = (i32)((u32)c02 << 16) >> 16;
        s[2] = (c02 - s[0]) >> 16;
        s[1] = (i32)((u32)c13 << 16) >> 16;
        s[3] = (c13 - s[1]) >> 16;
    } else if constexpr (G == 3) {
        // fields of 10 bits (sign at bit 9); 0 and 1 moved to the two half-words: d0 + d1 * 2^16
        const u32 x01 = (mm & 0x3FFu) | ((mm << 6) & 0x03FF0000u);
        const u32 neg = ((x01 >> 9) & 0x00010001u) * 0x1FFu;
        const u32 mag = x01 & 0x01FF01FFu;
        const i32 c01 = warp_incl_i32((i32)(mag & ~neg) - (i32)(mag & neg), lane);
        const i32 m2 = (i32)((mm >> 20) & 0x1FFu);
        s[2] = warp_incl_i32(((mm >> 29) & 1u) ? -m2 : m2, lane);
        s[0] = (i32)((u32)c01 << 16) >> 16;
        s[1] = (c01 - s[0]) >> 16;
    } else {
        // half h = sign << 15 | magnitude, two's complement deltas without selects
        const u32 neg = ((mm >> 15) & 0x00010001u) * 0x7FFFu;
        const u32 mag = mm & 0x7FFF7FFFu;
        const u32 pos = mag & ~neg, ngv = mag & neg;
        if (PACK) {
            const i32 c = warp_incl_i32((i32)pos - (i32)ngv, lane);
            s[0] = (i32)((u32)c << 16) >> 16;
            s[1] = (c - s[0]) >> 16;
        } else {
            s[0] = warp_incl_i32((i32)(pos & 0xFFFFu) - (i32)(ngv & 0xFFFFu), lane);
            s[1] = warp_incl_i32((i32)(pos >> 16) - (i32)(ngv >> 16), lane);
        }
    }
}

// Stores layers t .. t + G - 1 of the iteration at `po` (lane's value of its layer 0): start
// s32[2 (t + e)] (low word; 0 for plain) + in-layer prefix s[e].
template <typename T, int CODEC, bool REL, bool ACC, int G, typename R>
__device__ __forceinline__ void zc_store_group(const i32 (&s)[G], const i32* s32, T* po, const ZQ<T>& q, int t, R& tr) {
#pragma unroll
    for (int e = 0; e < G; e++) {
        const i32 st = CODEC == ZC_AATROX ? s32[2 * (t + e)] : 0;
        zc_store<T, ACC>(po + (t + e) * 32, zc_d2_value<T, REL>(q, (i64)st, s[e], true), tr);
    }
}
// ACC: the group's base values, loaded before its words are decoded so that their memory latency
// overlaps the transpose and the scans instead of stalling the stores (the decode is otherwise
// issue-bound, the accumulation latency-bound).
// The group's address is formed once and its layers are constant offsets from it, so that the
// loads and stores take immediate offsets instead of an address computation each.
template <typename T, int G> __device__ __forceinline__ void zc_load_base(const T* po, int t, T (&bv)[G]) {
    const T* pb = (const T*)((const char*)(po + t * 32) + zc_acc_base_off);
#pragma unroll
    for (int e = 0; e < G; e++) bv[e] = __ldcs(pb + e * 32);
}
template <typename T, int CODEC, bool REL, int G, typename R>
__device__ __forceinline__ void zc_add_group(const i32 (&s)[G], const T (&bv)[G], const i32* s32, T* po, const ZQ<T>& q,
                                             int t, R& tr) {
    T* pg = po + t * 32;
#pragma unroll
    for (int e = 0; e < G; e++) {
        const i32 st = CODEC == ZC_AATROX ? s32[2 * (t + e)] : 0;
        tr.add(bv[e]);
        pg[e * 32] = zc_add_rn(bv[e], zc_d2_value<T, REL>(q, (i64)st, s[e], true));
    }
}

// One group of layers t .. t + G - 1 of the iteration at `po` (lane's value of its layer 0) with
// starts s32[2 t], s32[2 t + 2], ... (low words); `info` = the lane's own layer's word offset << 5
// | word count, fetched by the group's lanes with one shuffle.
template <typename T, int CODEC, bool REL, bool ACC, int G, bool PACK, typename R>
__device__ __forceinline__ void zc_dec_group(const u32* __restrict__ cw, u32 info, const i32* s32, T* po, const ZQ<T>& q,
                                             int t, int lane, R& tr) {
    constexpr int F = G == 3 ? 10 : 32 / G;
    const int g = lane / F;
    const u32 kw = zc_group_kw<G>(lane);
    const u32 inf = __shfl_sync(ZC_FULL, info, t + (g < G ? g : G - 1));
    T bv[G];
    if constexpr (ACC) zc_load_base<T, G>(po, t, bv);
    const u32 x = kw < (inf & 31u) ? cw[(inf >> 5) + kw] : 0u;
    i32 s[G];
    zc_group_prefix<G, PACK>(warp_transpose32(x, lane), lane, s);
    if constexpr (ACC) zc_add_group<T, CODEC, REL, G>(s, bv, s32, po, q, t, tr);
    else zc_store_group<T, CODEC, REL, ACC, G>(s, s32, po, q, t, tr);
}

// Decodes iteration layers 0..31 at `po` in groups of G (see above); groups of all-zero layers
// (bit t of `zero`: b = 0) are their starts.
template <typename T, int CODEC, bool REL, bool ACC, int G, bool PACK, typename R>
__device__ __forceinline__ void zc_dec_groups(const u32* __restrict__ cw, u32 info, u32 zero, const i32* s32, T* po,
                                              const ZQ<T>& q, int lane, R& tr) {
    constexpr u32 GM = (1u << G) - 1u;
    // keeps the lane constants of zc_group_kw (per G) from being hoisted above the caller's
    // loop, where those of the three group sizes together would exceed the 32 registers
    asm volatile("" : "+r"(lane));
#pragma unroll 1
    for (int t = 0; t + G <= 32; t += G) {
        if (((zero >> t) & GM) == GM) {
            const i32 none[G] = {};
            if constexpr (ACC) {
                T bv[G];
                zc_load_base<T, G>(po, t, bv);
                zc_add_group<T, CODEC, REL, G>(none, bv, s32, po, q, t, tr);
            } else {
                zc_store_group<T, CODEC, REL, ACC, G>(none, s32, po, q, t, tr);
            }
        } else {
            zc_dec_group<T, CODEC, REL, ACC, G, PACK>(cw, info, s32, po, q, t, lane, tr);
        }
    }
    if constexpr (G == 3) zc_dec_group<T, CODEC, REL, ACC, 2, true>(cw, info, s32, po, q, 30, lane, tr);  // b <= 9
}

// The last block of a decompression (every other block has counted itself done, so every
// look-back and every error report is in): the whole-stream checks, the call's result
// (the result words in `res`) and the clean-up that lets the next decompression skip the host's
// memset. No barrier: thread 0 alone reads the last status word and the accumulated words, and
// zeroes them.
__device__ __noinline__ void zc_decode_finish(const u8* __restrict__ stream, u64 stream_len, u64* status, u64* ctrl,
                                              u32 n_chunks, u32 table_checksum, u64 seq, volatile u64* res) {
    const u32 tid = threadIdx.x;
    if (tid == 0) {
        __threadfence();
        const u64 last = *((volatile u64*)(status + n_chunks - 1)) >> 2;
        u64 err = atomicExch(ctrl + ZC_ERR, 0ull);
        const u32 th = (u32)atomicExch(ctrl + ZC_HASH, 0ull);
        if (ZC_HEADER_LEN + 8ull * n_chunks + last != stream_len) err |= ZC_E_TOTAL;
        if (zhash_final(th, 2u * n_chunks) != table_checksum) err |= ZC_E_TABLE;
        status[n_chunks - 1] = 0;
        ctrl[ZC_TICKET] = 0;
        ctrl[ZC_DONE] = 0;
        res[ZC_RES_ERR] = err;
        res[ZC_RES_SEQ] = seq;  // the host reads every word after the kernel has ended
    } else if (tid <= 12u) {
        // the stream holds at least the 96-byte header (both launch paths check)
        res[ZC_RES_HDR + tid - 1] = ((const u64*)stream)[tid - 1];
    }
    for (u32 i = tid; i + 1u < n_chunks; i += blockDim.x) status[i] = 0;
}

// TRACK (with ACC): the finite range of the base is folded into range[0..2] (ZcRange), from the
// loads the accumulation makes anyway (valid when the call succeeds).
template <typename T, int CODEC, bool REL, bool ACC = false, bool TRACK = false>
__device__ __forceinline__ void zc_decompress(const u8* __restrict__ stream, u64 stream_len, T* __restrict__ out,
                                              u64 count, u64* status, u64* ctrl, u32 n_chunks,
                                              u32 table_checksum, ZQ<T> q, u64 seq, u64* res, u64* range = nullptr) {
    const int SIZE = ZT<T>::SIZE;
    __shared__ u32 s_off[1024];
    __shared__ u32 s_rate[256];
    __shared__ i64 s_start[1024];
    __shared__ u32 s_wtot[32];
    __shared__ i64 s_wsum[32];
    __shared__ u32 s_tmp[32];
    __shared__ u32 s_chunk, s_size, s_cs, s_mask;
    __shared__ u64 s_err, s_base;
    __shared__ i64 s_init;
    __shared__ bool s_last;
    __shared__ typename ZT<T>::bits_t s_rng[TRACK ? 2 : 1];  // TRACK: the block's range keys (ZcRange)
    static_assert(ACC || !TRACK, "range tracking reads the base of an accumulation");
    ZcRange<T, TRACK> tr;

    const int tid = threadIdx.x, lane = tid & 31;
    const int w = (int)__reduce_max_sync(ZC_FULL, (u32)tid >> 5);
    if (tid == 0) {
        s_chunk = (u32)atomicAdd(ctrl + ZC_TICKET, 1ull);
        s_err = 0;
        if (TRACK) {
            s_rng[0] = 0;
            s_rng[TRACK ? 1 : 0] = 0;
        }
    }
    __syncthreads();
    const u32 c = __reduce_max_sync(ZC_FULL, s_chunk);
    const u64 cbase = (u64)c << 15;
    const u32 n = (u32)((count - cbase) < (u64)ZC_CHUNK ? (count - cbase) : (u64)ZC_CHUNK);
    const u32 n_layers = (n + 31) >> 5;
    const u32 n_iters = (n_layers + 31) >> 5;
    const u32* tbl = (const u32*)(stream + 96);

    if (w == 0) {
        const u32 size = tbl[2 * c];
        const u32 cs = tbl[2 * c + 1];
        u64 excl = lookback_exclusive(status, c, (u64)size, lane);
        if (lane == 0) {
            const u64 base = ZC_HEADER_LEN + 8ull * n_chunks + excl;
            u64 err = 0;
            if (size & 3u) err |= ZC_E_SIZE;
            if (base & 3ull) err |= ZC_E_SIZE;
            if (base + size > stream_len) err |= ZC_E_RANGE;
            s_err = err;
            s_base = base;
            s_size = size;
            s_cs = cs;
            atomicAdd(ctrl + ZC_HASH, (u64)zhash_mix(size, 2 * c) + (u64)zhash_mix(cs, 2 * c + 1));
        }
    }
    __syncthreads();
    do {
        if (s_err) break;
        const u64 base = s_base;
        const u32 size = __reduce_max_sync(ZC_FULL, s_size);
        const u8* cp = stream + base;
        const u32* cw = (const u32*)cp;
        // checksum of the whole chunk before trusting a bit of it
        u32 h = 0;
        // 16-byte loads from the chunk's first 16-byte boundary on (the chunk is 4-aligned);
        // the words before it and after the last whole vector one by one
        const u32 nw = size / 4;
        const u32 mis = (u32)(((size_t)cw >> 2) & 3u);
        const u32 hw = mis ? min(4u - mis, nw) : 0u;
        const u32 nv = (nw - hw) / 4, tail = hw + 4 * nv;
        if ((u32)tid < hw) h += zhash_mix(cw[tid], tid);
        if ((u32)tid < nw - tail) h += zhash_mix(cw[tail + tid], tail + tid);
        const uint4* cv = (const uint4*)(cw + hw);
        for (u32 i = tid; i < nv; i += ZC_THREADS) {
            const uint4 x = cv[i];
            const u32 k = hw + 4 * i;
            h += zhash_mix(x.x, k) + zhash_mix(x.y, k + 1) + zhash_mix(x.z, k + 2) + zhash_mix(x.w, k + 3);
        }
        u32 tot = zc_block_sum(h, s_tmp, w, lane);
        if (tid == 0) {
            u64 err = 0;
            if (zhash_final(tot, size / 4) != s_cs) err |= ZC_E_CHECKSUM;
            const u32 head = SIZE + 4;
            if (size < head) err |= ZC_E_META;
            s_err = err;
        }
        __syncthreads();
        const bool stop = s_err != 0;
        __syncthreads();  // everyone has read s_err before anyone sets it again
        if (stop) break;
        const u32 head = SIZE + 4;
        i64 init;
        if (SIZE == 4) init = (i64)(i32)cw[0];
        else init = (i64)((u64)cw[0] | ((u64)cw[1] << 32));
        const u32 mask = __reduce_max_sync(ZC_FULL, cw[SIZE / 4]);
        u64 err = 0;
        if (n_iters < 32 && (mask >> n_iters) != 0) err |= ZC_E_META;
        if (CODEC != ZC_AATROX && init != 0) err |= ZC_E_META;
        // rate bytes of the iterations this warp owns, lane = thread layer
        const int W = ZC_WARPS;
        const int J = 32 / ZC_WARPS;
        u32 rj[J], incl[J], lsize[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int it = w + j * W;
            u32 r = 0;
            if ((mask >> it) & 1u) {
                const u32 ro = head + 32u * __popc(mask & ((1u << it) - 1u));
                if (ro + 32u > size) err |= ZC_E_META;
                else r = cp[ro + lane];
                if (!__any_sync(ZC_FULL, r != 0)) err |= ZC_E_META;
            }
            const u32 l = (u32)(it * 32 + lane);
            if (l >= n_layers && r != 0) err |= ZC_E_META;
            u32 ls = 0;
            if (r == 0xFF) {
                const u32 nt = l < n_layers ? min(32u, n - l * 32u) : 0u;
                ls = nt * SIZE;
            } else {
                const u32 b = r & 63u, o = r >> 6;
                if (b > (u32)ZT<T>::MAX_RATE || (o != 0 && CODEC != ZC_OUTLIER)) err |= ZC_E_META;
                ls = zc_obytes(o) + zc_packed(b);
            }
            ((u8*)s_rate)[l] = (u8)r;
            rj[j] = r;
            lsize[j] = ls;
            incl[j] = warp_incl_u32(ls, lane);
            if (lane == 31) s_wtot[it] = incl[j];
        }
        if (err) atomicOr(&s_err, err);
        __syncthreads();
        if (w == 0) {
            u32 v = s_wtot[lane];
            u32 inc = warp_incl_u32(v, lane);
            s_wtot[lane] = inc - v;
            const u32 total = __shfl_sync(ZC_FULL, inc, 31);
            const u32 implied = head + 32u * __popc(mask) + total;
            if (lane == 0) {
                if (((implied + 3u) & ~3u) != size) atomicOr(&s_err, ZC_E_META);
                s_mask = mask;
                s_init = init;
            }
        }
        __syncthreads();
        if (s_err) break;
        const u32 pstart = head + 32u * __popc(mask);
        u32 loff[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int it = w + j * W;
            loff[j] = pstart + s_wtot[it] + (incl[j] - lsize[j]);
            s_off[it * 32 + lane] = loff[j];
        }
        // DEC2 (see the comment block above zc_decompress): f32 word-aligned codecs, abs/noa only
        // (a REL value costs a zexp2, hundreds of instructions: nothing to win, only spills)
        constexpr bool D2 = SIZE == 4 && CODEC != ZC_OUTLIER && !REL;
        bool small_ok = true;
        if (CODEC == ZC_AATROX) {
            // level 1: sum of the 32 deltas of every layer from its bit planes (raw layers: 0)
            u64 sum[J];
            i64 sincl[J];
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int it = w + j * W;
                const u32 r = rj[j];
                const u32 b = r & 63u;
                u64 sm = 0;
                if (r != 0xFF && b > 0) {
                    const u32* pw = cw + (loff[j] >> 2);
                    const u32 sign = pw[0];
#pragma unroll 1
                    for (u32 k = 0; k < b; k++) {
                        const u32 p = pw[1 + k];
                        const int cnt = __popc(p & ~sign) - __popc(p & sign);
                        sm += (u64)(i64)cnt << k;
                    }
                }
                sum[j] = sm;
                sincl[j] = warp_incl_i64((i64)sm, lane);
                if (lane == 31) s_wsum[it] = sincl[j];
            }
            __syncthreads();
            if (w == 0) {
                i64 v = s_wsum[lane];
                i64 inc = warp_incl_i64(v, lane);
                s_wsum[lane] = (i64)((u64)inc - (u64)v);
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int it = w + j * W;
                const i64 st = (i64)((u64)init + (u64)s_wsum[it] + (u64)sincl[j] - sum[j]);
                s_start[it * 32 + lane] = st;
                small_ok = small_ok && st >= -(i64)ZC_D2_SMALL && st <= (i64)ZC_D2_SMALL;
            }
        }
        // DEC2: every layer start within +-2^30 (plain: all 0), so narrow layers' codes fit i32
        const bool small32 = D2 ? (__syncthreads_and(small_ok ? 1 : 0) != 0) : false;
        if (!D2) __syncthreads();
        // level 2: per thread layer, lane k = value k
        T* cout = out + cbase;
        // f32, word-aligned codecs: two thread layers whose deltas fit 16 bits share one transpose
        const bool PAIRS = SIZE == 4 && CODEC != ZC_OUTLIER;
        // DEC2 quads: lane 8 g + k loads word qkw of layer ll + g (zc_group_kw)
        const u32 qkw = zc_group_kw<4>(lane);
#pragma unroll 1
        for (int j = 0; j < J; j++) {
            const int it = w + j * W;
            if constexpr (D2) {
                // group decoding (see zc_dec_group) when the iteration is full, none of its layers
                // is raw and every b <= 15
                if (small32 && (u32)(it + 1) * 1024u <= n) {
                    const u32 myr = ((const u8*)s_rate)[it * 32 + lane];
                    const u32 mb = myr == 0xFFu ? 0xFFu : (myr & 63u);
                    const u32 maxb = __reduce_max_sync(ZC_FULL, mb);
                    if (maxb <= 15u) {
                        const u32 info = ((s_off[it * 32 + lane] >> 2) << 5) | zc_layer_words(mb);
                        const u32 zero = __ballot_sync(ZC_FULL, mb == 0u);
                        const i32* s32 = (const i32*)(s_start + it * 32);
                        T* po = cout + (u32)it * 1024u + lane;
                        if (maxb <= 7u) zc_dec_groups<T, CODEC, REL, ACC, 4, false>(cw, info, zero, s32, po, q, lane, tr);
                        else if (maxb <= 9u) zc_dec_groups<T, CODEC, REL, ACC, 3, false>(cw, info, zero, s32, po, q, lane, tr);
                        else if (maxb <= 10u) zc_dec_groups<T, CODEC, REL, ACC, 2, true>(cw, info, zero, s32, po, q, lane, tr);
                        else zc_dec_groups<T, CODEC, REL, ACC, 2, false>(cw, info, zero, s32, po, q, lane, tr);
                        tr.flush();
                        continue;
                    }
                }
            }
            u32 pairable = 0, quad = 0, zero = 0;
            if (PAIRS) {
                const u32 myr = ((const u8*)s_rate)[it * 32 + lane];
                pairable = __reduce_or_sync(ZC_FULL, (myr != 0xFFu && (myr & 63u) <= 16u) ? (1u << lane) : 0u);
                if (D2) {
                    quad = __ballot_sync(ZC_FULL, myr != 0xFFu && (myr & 63u) <= 7u);
                    zero = __ballot_sync(ZC_FULL, myr == 0u);
                }
            }
#pragma unroll 1
            for (int t = 0; t < 32; t++) {
                const u32 ll = (u32)(it * 32 + t);
                if (ll >= n_layers) break;
                if (D2 && t <= 28 && ((quad >> t) & 15u) == 15u && ll + 3u < n_layers) {
                    // four layers ll..ll+3 of b <= 7 (o = 0): lane 8g + k holds plane k (k < 7) or
                    // the sign word (k = 7) of layer ll + g, so that after one transpose byte g of
                    // lane c is (sign << 7) | magnitude of value c of layer ll + g
                    i32 sq[4] = {0, 0, 0, 0};
                    if (((zero >> t) & 15u) != 15u) {
                        const u32 bg = ((const u8*)s_rate)[ll + ((u32)lane >> 3)] & 63u;
                        const u32 wg = s_off[ll + ((u32)lane >> 3)] >> 2;
                        const u32 x = qkw < zc_layer_words(bg) ? cw[wg + qkw] : 0u;
                        zc_group_prefix<4, true>(warp_transpose32(x, lane), lane, sq);
                    }
                    const i32 s0 = sq[0], s1 = sq[1], s2 = sq[2], s3 = sq[3];
                    T* po = cout + ll * 32u + lane;
                    const u32 nt3 = min(32u, n - (ll + 3u) * 32u);  // only the last layer may be partial
                    T v0, v1, v2, v3;
                    if (small32) {  // block-uniform: one branch per quad, not one per value
                        const i32* s32 = (const i32*)s_start;  // low words (little-endian)
                        const i32 c0 = CODEC == ZC_AATROX ? s32[2 * ll] : 0;
                        const i32 c1 = CODEC == ZC_AATROX ? s32[2 * ll + 2] : 0;
                        const i32 c2 = CODEC == ZC_AATROX ? s32[2 * ll + 4] : 0;
                        const i32 c3 = CODEC == ZC_AATROX ? s32[2 * ll + 6] : 0;
                        v0 = zc_d2_value<T, REL>(q, (i64)c0, s0, true);
                        v1 = zc_d2_value<T, REL>(q, (i64)c1, s1, true);
                        v2 = zc_d2_value<T, REL>(q, (i64)c2, s2, true);
                        v3 = zc_d2_value<T, REL>(q, (i64)c3, s3, true);
                    } else {
                        const i64 st0 = CODEC == ZC_AATROX ? s_start[ll] : 0;
                        const i64 st1 = CODEC == ZC_AATROX ? s_start[ll + 1] : 0;
                        const i64 st2 = CODEC == ZC_AATROX ? s_start[ll + 2] : 0;
                        const i64 st3 = CODEC == ZC_AATROX ? s_start[ll + 3] : 0;
                        v0 = zc_d2_value<T, REL>(q, st0, s0, false);
                        v1 = zc_d2_value<T, REL>(q, st1, s1, false);
                        v2 = zc_d2_value<T, REL>(q, st2, s2, false);
                        v3 = zc_d2_value<T, REL>(q, st3, s3, false);
                    }
                    zc_store<T, ACC>(po, v0, tr);
                    zc_store<T, ACC>(po + 32, v1, tr);
                    zc_store<T, ACC>(po + 64, v2, tr);
                    if ((u32)lane < nt3) zc_store<T, ACC>(po + 96, v3, tr);
                    t += 3;
                    continue;
                }
                if (PAIRS && t < 31 && ((pairable >> t) & 3u) == 3u && ll + 1 < n_layers) {
                    // layers A = ll (full: it is not the last) and B = ll + 1; o = 0 for these codecs
                    const u32 bA = ((const u8*)s_rate)[ll] & 63u, bB = ((const u8*)s_rate)[ll + 1] & 63u;
                    const i64 stA = CODEC == ZC_AATROX ? s_start[ll] : 0;
                    const i64 stB = CODEC == ZC_AATROX ? s_start[ll + 1] : 0;
                    const u32 ntB = min(32u, n - (ll + 1) * 32u);
                    i32 sA = 0, sB = 0;  // D2: in-layer prefix sums of the deltas
                    bool summed = false;
                    if (D2 && bA <= 15u && bB <= 15u) {
                        // as a quad with 16-lane groups: lane 16h + k loads plane k (k < 15) or the
                        // sign word (k = 15) of layer ll + h, so that after one transpose half h of
                        // lane c is (sign << 15) | magnitude of value c of layer ll + h
                        u32 mm = 0;
                        if (__reduce_or_sync(ZC_FULL, bA | bB) != 0) {
                            const u32 h = (u32)lane >> 4, kw = zc_group_kw<2>(lane);
                            const u32 wh = s_off[ll + h] >> 2;
                            const u32 x = kw < zc_layer_words(h ? bB : bA) ? cw[wh + kw] : 0u;
                            mm = warp_transpose32(x, lane);
                        }
                        i32 sp[2];
                        if (bA <= 10u && bB <= 10u) zc_group_prefix<2, true>(mm, lane, sp);
                        else zc_group_prefix<2, false>(mm, lane, sp);
                        sA = sp[0];
                        sB = sp[1];
                        summed = true;
                    }
                    if (!summed) {
                        const u32 wA = s_off[ll] >> 2, wB = s_off[ll + 1] >> 2;
                        u32 signA = 0, signB = 0, mm = 0;
                        if (__reduce_or_sync(ZC_FULL, bA | bB) != 0) {
                            if (bA) signA = cw[wA];
                            if (bB) signB = cw[wB];
                            u32 pl = 0;
                            if (lane < 16) {
                                if ((u32)lane < bA) pl = cw[wA + 1 + lane];
                            } else {
                                if ((u32)lane - 16 < bB) pl = cw[wB + 1 + (lane - 16)];
                            }
                            mm = warp_transpose32(pl, lane);
                        }
                        const i32 mA = (i32)(mm & 0xFFFFu), mB = (i32)(mm >> 16);
                        const i32 dA = ((signA >> lane) & 1u) ? -mA : mA;
                        const i32 dB = ((signB >> lane) & 1u) ? -mB : mB;
                        sA = warp_incl_i32(dA, lane);
                        sB = warp_incl_i32(dB, lane);
                    }
                    if (D2) {
                        // |in-layer sum| < 2^21: i32 codes when every start is small
                        T vA, vB;
                        if (small32) {
                            vA = zc_d2_value<T, REL>(q, stA, sA, true);
                            vB = zc_d2_value<T, REL>(q, stB, sB, true);
                        } else {
                            vA = zc_d2_value<T, REL>(q, stA, sA, false);
                            vB = zc_d2_value<T, REL>(q, stB, sB, false);
                        }
                        zc_store<T, ACC>(cout + ll * 32u + lane, vA, tr);
                        if ((u32)lane < ntB) zc_store<T, ACC>(cout + (ll + 1) * 32u + lane, vB, tr);
                    } else {
                        const i64 cA = (i64)((u64)stA + (u64)(i64)sA);
                        const i64 cB = (i64)((u64)stB + (u64)(i64)sB);
                        zc_store<T, ACC>(cout + ll * 32u + lane, zq_decode<T, REL>(q, cA), tr);
                        if ((u32)lane < ntB) zc_store<T, ACC>(cout + (ll + 1) * 32u + lane, zq_decode<T, REL>(q, cB), tr);
                    }
                    t++;
                    continue;
                }
                const u32 rr = __reduce_max_sync(ZC_FULL, (u32)((const u8*)s_rate)[ll]);
                const u32 off = s_off[ll];
                const u32 nt = min(32u, n - ll * 32u);
                const bool present = (u32)lane < nt;
                if (rr == 0xFF) {
                    if (present) {
                        const u32 o = off + (u32)lane * SIZE;
                        typename ZT<T>::bits_t bits;
                        if (SIZE == 4) bits = (typename ZT<T>::bits_t)zc_get_any(cp, o);
                        else bits = (typename ZT<T>::bits_t)((u64)zc_get_any(cp, o) | ((u64)zc_get_any(cp, o + 4) << 32));
                        zc_store<T, ACC>(cout + ll * 32u + lane, ZT<T>::from_bits(bits), tr);
                    }
                    continue;
                }
                const u32 o = rr >> 6, b = rr & 63u;
                const u32 ow = zc_obytes(o);
                const i64 start = CODEC == ZC_AATROX ? s_start[ll] : 0;
                i64 code;
                if (SIZE == 4 && o == 0 && b <= 26) {
                    // |delta| < 2^26: the in-layer prefix sums fit 32 bits
                    i32 d = 0;
                    if (b > 0) {
                        const u32 sign = zc_get_any(cp, off);
                        u32 pl = (u32)lane < b ? zc_get_any(cp, off + 4 + 4 * lane) : 0u;
                        i32 m = (i32)warp_transpose32(pl, lane);
                        d = ((sign >> lane) & 1u) ? -m : m;
                    }
                    code = (i64)((u64)start + (u64)(i64)warp_incl_i32(d, lane));
                } else {
                    i64 d = 0;
                    if (b > 0) {
                        const u32 pos = off + ow;
                        const u32 sign = zc_get_any(cp, pos);
                        u32 pl = (u32)lane < b ? zc_get_any(cp, pos + 4 + 4 * lane) : 0u;
                        u64 m = warp_transpose32(pl, lane);
                        if (SIZE == 8 && b > 32) {
                            u32 ph = (u32)lane + 32 < b ? zc_get_any(cp, pos + 4 + 4 * (32 + lane)) : 0u;
                            m |= (u64)warp_transpose32(ph, lane) << 32;
                        }
                        d = ((sign >> lane) & 1u) ? (i64)(0ull - m) : (i64)m;
                    }
                    if (o != 0 && lane == 0) {
                        u64 z = 0;
                        for (u32 k = 0; k < ow; k++) z |= (u64)cp[off + k] << (8 * k);
                        i64 d0 = (i64)(z >> 1) ^ -(i64)(z & 1ull);
                        d = (i64)((u64)d + (u64)d0);
                    }
                    code = (i64)((u64)start + (u64)warp_incl_i64(d, lane));
                }
                if (present) zc_store<T, ACC>(cout + ll * 32u + lane, zq_decode<T, REL>(q, code), tr);
            }
            tr.flush();  // the per-layer stores' values (add): no per-thread range across iterations
        }
    } while (0);
    tr.fold(s_rng);
    __syncthreads();
    if (tid == 0) {
        if (TRACK) zc_range_publish(s_rng, range);
        if (s_err) atomicOr(ctrl + ZC_ERR, s_err);
        __threadfence();
        s_last = atomicAdd(ctrl + ZC_DONE, 1ull) == (u64)n_chunks - 1ull;
    }
    __syncthreads();
    if (s_last) zc_decode_finish(stream, stream_len, status, ctrl, n_chunks, table_checksum, seq, res);
}

// Decompression with the parameters read from the stream's own header on the device, so that the
// host can launch without waiting for the header's round trip (GpuCodec::decompress_device guesses
// the codec and mode of the previous call and checks the header afterwards). `expect` is the u32
// at header bytes 6..9 the launch assumes (codec, dtype, mode tags; flags 0 = not stored); with
// another header, another count or another chunk count every block returns at once and block 0
// records ZC_E_GUESS as the call's result: the host then takes the ordinary path. step, inv, step64 and eb are derived
// from the header's step and absolute bound with the host's operations (FORMAT.md header).
// ACC / TRACK: the accumulating decoders (`zc_decompress_add_hdr_*`, `zc_decompress_add_track_hdr_*`:
// out = base + decoded, as `zc_decompress_add_*`), so that a ring's accumulation of a received
// piece does not wait for its header either.
template <typename T, int CODEC, bool REL, bool ACC = false, bool TRACK = false>
__device__ __forceinline__ void zc_decompress_hdr(const u8* __restrict__ stream, u64 stream_len, T* __restrict__ out,
                                                  u64 count, u64* status, u64* ctrl, u32 n_chunks, u32 expect,
                                                  u64 seq, u64* res, u64* range = nullptr) {
    const u32* h = (const u32*)stream;  // the host launches only for a 4-aligned stream
    bool same = stream_len >= ZC_HEADER_LEN;
    if (same) {
        const u32 tags = (h[1] >> 16) | (h[2] << 16);
        const u64 hcount = (u64)h[4] | ((u64)h[5] << 32);
        same = tags == expect && hcount == count && h[18] == n_chunks;
    }
    if (!same) {
        // recorded in the result words only: the workspace stays as clean as it was, so that
        // decodes queued behind this launch need no memset
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            res[ZC_RES_ERR] = ZC_E_GUESS;
            res[ZC_RES_SEQ] = seq;
        }
        return;
    }
    ZQ<T> q;
    q.eb = __hiloint2double((int)h[9], (int)h[8]);       // bytes 32..39: absolute bound
    q.step64 = __hiloint2double((int)h[11], (int)h[10]);  // bytes 40..47: step
    q.step = (T)q.step64;                                  // T::from_f64
    q.inv = (T)__ddiv_rn(1.0, (double)q.step);             // T::from_f64(1.0 / step)
    zc_decompress<T, CODEC, REL, ACC, TRACK>(stream, stream_len, out, count, status, ctrl, n_chunks, h[19], q, seq, res,
                                             range);
}

// ---------------------------------------------------------------------------------------------
// Range / first finite non-zero value (NOA parameters and the degenerate-step rule).
// Memory-bound by design: 16-byte loads (two in flight per thread) when the input is aligned,
// keys in the element's own width (u32 for f32), and the first non-zero index tracked with a
// flag (each thread visits its indices in increasing order, the vector part before the tail).
template <typename T> struct ZcStats {
    typedef typename ZT<T>::bits_t K;
    K kmin, kmax;  // order-preserving keys (zc_key); kmax == 0: no finite value seen
    u64 first;     // smallest index of a finite non-zero value (valid when found)
    bool found;
    __device__ __forceinline__ ZcStats() : kmin((K)~(K)0), kmax(0), first(0), found(false) {}
    __device__ __forceinline__ void visit(T x, u64 j) {
        if (zc_isfinite(x)) {
            const K b = ZT<T>::bits(x);
            const K k = (K)(b ^ ((K)((typename ZT<T>::code_t)b >> (8 * sizeof(K) - 1)) | ((K)1 << (8 * sizeof(K) - 1))));
            kmin = k < kmin ? k : kmin;
            kmax = k > kmax ? k : kmax;
            if (!found && x != (T)0) {
                found = true;
                first = j;
            }
        }
    }
};

template <typename T> __device__ __forceinline__ void zc_stats(const T* __restrict__ in, u64 n, u64* ctrl) {
    const int VEC = 16 / (int)sizeof(T);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    ZcStats<T> st;
    const u64 nv = ((size_t)in & 15u) == 0 ? n / VEC : 0;  // whole 16-byte vectors
    const uint4* vin = (const uint4*)in;
    u64 v = t;
    for (; v + stride < nv; v += 2 * stride) {
        const uint4 a = vin[v], c = vin[v + stride];
        const T* xa = (const T*)&a;
        const T* xc = (const T*)&c;
#pragma unroll
        for (int u = 0; u < VEC; u++) st.visit(xa[u], v * VEC + u);
#pragma unroll
        for (int u = 0; u < VEC; u++) st.visit(xc[u], (v + stride) * VEC + u);
    }
    if (v < nv) {
        const uint4 a = vin[v];
        const T* xa = (const T*)&a;
#pragma unroll
        for (int u = 0; u < VEC; u++) st.visit(xa[u], v * VEC + u);
    }
    for (u64 j = nv * VEC + t; j < n; j += stride) st.visit(in[j], j);
    // ctrl words hold maxima: ~min key (as u64, like zc_key), max key, ~first index
    u64 mn = st.kmax ? ~(u64)st.kmin : 0ull;
    u64 mx = (u64)st.kmax;
    u64 first = st.found ? ~st.first : 0ull;
    mn = warp_max_u64(mn);
    mx = warp_max_u64(mx);
    first = warp_max_u64(first);
    if ((threadIdx.x & 31) == 0) {
        if (mn) atomicMax(ctrl + ZC_MIN, mn);
        if (mx) atomicMax(ctrl + ZC_MAX, mx);
        if (first) atomicMax(ctrl + ZC_FIRST, first);
    }
}

// Holds the stream for `ns` nanoseconds (one thread; benchmarks only): work queued behind it
// starts back to back, so CUDA events around a kernel launched while it runs time the kernel and
// not the host's launch latency (the "blocking kernel" of NVIDIA's nvbench, with a timeout).
extern "C" __global__ void zc_spin(u64 ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// Copies (when dst != 0) and hashes 32-bit words: ctrl[ZC_HASH] += sum of mix(w_i, i).
extern "C" __global__ void zc_copy_hash(const u32* __restrict__ src, u64 nwords, u32* __restrict__ dst, u64* ctrl) {
    u32 h = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += stride) {
        u32 v = src[i];
        if (dst) dst[i] = v;
        h += zhash_mix(v, (u32)i);
    }
    h = warp_sum_u32(h);
    if ((threadIdx.x & 31) == 0) atomicAdd(ctrl + ZC_HASH, (u64)h);
}

#define ZC_INST(TY, TN, CID, CN, REL, RN)                                                                      \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), REL)) zc_compress_##TN##_##CN##_##RN(                         \
        const TY* in, u64 count, u8* out, u64 out_cap, u64* status, u64* ctrl, u32 n_chunks, TY step, TY inv, \
        double step64, double eb, ZHeader hdr) {                                                               \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        zc_compress<TY, CID, REL>(in, count, out, out_cap, status, ctrl, n_chunks, q, hdr);                    \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), REL)) zc_decompress_##TN##_##CN##_##RN(                       \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        u32 table_checksum, TY step, TY inv, double step64, double eb, u64 seq, u64* res) {                    \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        zc_decompress<TY, CID, REL>(stream, stream_len, out, count, status, ctrl, n_chunks, table_checksum, q, seq, res); \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), REL)) zc_decompress_add_##TN##_##CN##_##RN(                   \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        const TY* base, u32 table_checksum, TY step, TY inv, double step64, double eb, u64 seq, u64* res) {    \
        if (threadIdx.x == 0) zc_acc_base_off = (long long)((const char*)base - (const char*)out);            \
        __syncthreads();                                                                                       \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        zc_decompress<TY, CID, REL, true>(stream, stream_len, out, count, status, ctrl, n_chunks, table_checksum, q, seq, res); \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), REL)) zc_decompress_hdr_##TN##_##CN##_##RN(                   \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks, u32 expect, \
        u64 seq, u64* res) {                                                                                   \
        zc_decompress_hdr<TY, CID, REL>(stream, stream_len, out, count, status, ctrl, n_chunks, expect, seq, res); \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), REL)) zc_decompress_add_hdr_##TN##_##CN##_##RN(               \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        const TY* base, u32 expect, u64 seq, u64* res) {                                                       \
        if (threadIdx.x == 0) zc_acc_base_off = (long long)((const char*)base - (const char*)out);            \
        __syncthreads();                                                                                       \
        zc_decompress_hdr<TY, CID, REL, true>(stream, stream_len, out, count, status, ctrl, n_chunks, expect, seq, res); \
    }

#define ZC_INST_MODES(TY, TN, CID, CN) \
    ZC_INST(TY, TN, CID, CN, false, abs) \
    ZC_INST(TY, TN, CID, CN, true, rel)

// Compression that leaves the data's reconstruction in place of the data (abs/noa: the ring's
// final segments are quantised under absolute bounds).
#define ZC_INST_RECON(TY, TN, CID, CN)                                                                         \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), false)) zc_compress_recon_##TN##_##CN##_abs( \
        TY* data, u64 count, u8* out, u64 out_cap, u64* status, u64* ctrl, u32 n_chunks, TY step, TY inv,     \
        double step64, double eb, ZHeader hdr) {                                                               \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        zc_compress<TY, CID, false, true>(data, count, out, out_cap, status, ctrl, n_chunks, q, hdr, data);     \
    }

// Compression and decompress-and-add that also fold a finite value range into `range` (two u64
// keys, kernels/util.cu's zu_range convention; ZcRange): the input's and the base's. abs/noa
// only (the device ring's bounds are absolute); the parameters are those of the kernels above
// with `range` last (compression) or after `base` (decompress-and-add).
#define ZC_INST_TRACK(TY, TN, CID, CN)                                                                         \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), false)) zc_compress_track_##TN##_##CN##_abs( \
        const TY* in, u64 count, u8* out, u64 out_cap, u64* status, u64* ctrl, u32 n_chunks, TY step, TY inv, \
        double step64, double eb, ZHeader hdr, u64* range) {                                                   \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        zc_compress<TY, CID, false, false, true>(in, count, out, out_cap, status, ctrl, n_chunks, q, hdr, nullptr, range); \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), false)) zc_decompress_add_track_##TN##_##CN##_abs( \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        const TY* base, u64* range, u32 table_checksum, TY step, TY inv, double step64, double eb, u64 seq,    \
        u64* res) {                                                                                            \
        if (threadIdx.x == 0) zc_acc_base_off = (long long)((const char*)base - (const char*)out);            \
        __syncthreads();                                                                                       \
        const ZQ<TY> q = zq_make<TY>(step, inv, step64, eb);                                                   \
        zc_decompress<TY, CID, false, true, true>(stream, stream_len, out, count, status, ctrl, n_chunks, table_checksum, q, seq, \
                                                  res, range);                                                 \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ZC_THREADS, ZC_MINB_OF(sizeof(TY), false)) zc_decompress_add_track_hdr_##TN##_##CN##_abs( \
        const u8* stream, u64 stream_len, TY* out, u64 count, u64* status, u64* ctrl, u32 n_chunks,            \
        const TY* base, u64* range, u32 expect, u64 seq, u64* res) {                                           \
        if (threadIdx.x == 0) zc_acc_base_off = (long long)((const char*)base - (const char*)out);            \
        __syncthreads();                                                                                       \
        zc_decompress_hdr<TY, CID, false, true, true>(stream, stream_len, out, count, status, ctrl, n_chunks, expect, seq, \
                                                      res, range);                                             \
    }

#define ZC_INST_CODECS(TY, TN)                \
    ZC_INST_MODES(TY, TN, ZC_AATROX, aatrox)  \
    ZC_INST_MODES(TY, TN, ZC_PLAIN, plain)    \
    ZC_INST_MODES(TY, TN, ZC_OUTLIER, outlier) \
    ZC_INST_RECON(TY, TN, ZC_AATROX, aatrox)  \
    ZC_INST_RECON(TY, TN, ZC_PLAIN, plain)    \
    ZC_INST_RECON(TY, TN, ZC_OUTLIER, outlier) \
    ZC_INST_TRACK(TY, TN, ZC_AATROX, aatrox)  \
    ZC_INST_TRACK(TY, TN, ZC_PLAIN, plain)    \
    ZC_INST_TRACK(TY, TN, ZC_OUTLIER, outlier) \
    extern "C" __global__ void zc_stats_##TN(const TY* in, u64 n, u64* ctrl) { zc_stats<TY>(in, n, ctrl); } \
    extern "C" __global__ void zc_add_raw_##TN(const TY* src, u64 n, TY* dst) { zc_add_raw<TY>(src, n, dst); }

ZC_INST_CODECS(float, f32)
ZC_INST_CODECS(double, f64)
