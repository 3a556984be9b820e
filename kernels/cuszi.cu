// cuszi decoder kernels (src/gpu/cuszi.rs): the stages of src/codec/cuszi decode, bit for bit.
//
// Compiled by NVRTC with --fmad=false --prec-div=true, so every f64 expression below is the
// same sequence of IEEE roundings as the Rust one it mirrors (named beside each function).
//
// Geometry words `geo` (written by src/gpu/cuszi.rs `geometry`, CZ_G_*): the grid of
// src/codec/cuszi/grid.rs, the walks of interp.rs `walks` (CZ_WALK_WORDS each) and the class
// pattern's extents.
#include "common.cuh"

// src/codec/cuszi/mod.rs CHUNK
#define CZ_CHUNK 32768ll
// src/codec/cuszi/rans.rs PROB_BITS, RANS_L, SYM_LOSSLESS, SYM_BIG; entropy.rs RADIUS
#define CZ_PROB_BITS 14
#define CZ_PROB_SCALE (1u << CZ_PROB_BITS)
#define CZ_RANS_L (1u << 23)
#define CZ_RADIUS 511ll
#define CZ_SYM_LOSSLESS 1023u
#define CZ_SYM_BIG 1024u
// entropy.rs LOSSLESS
#define CZ_LOSSLESS ((i64)0x8000000000000000ull)

// geometry word indices
#define CZ_G_BATCH 0
#define CZ_G_N 1
#define CZ_G_S 4
#define CZ_G_TILES 5
#define CZ_G_NTILES 8
#define CZ_G_VOL 9
#define CZ_G_COUNT 10
#define CZ_G_NWALKS 11
#define CZ_G_FULL 12
#define CZ_G_WALKS 16
// per walk: s, start[3], step[3], multi, dim-or-mask, spline[3]
#define CZ_WALK_WORDS 12

// error bits (src/gpu/cuszi.rs ERR_*)
#define CZ_E_CHECKSUM 1ull
#define CZ_E_RANS 2ull
#define CZ_E_RAW 4ull
#define CZ_E_BIG 8ull
#define CZ_E_PAD 16ull

// Largest box: 9^3 (3-D), 17^2 (2-D), 513 (1-D).
#define CZ_MAXBOX 729
// Warps (tiles) per block of the tile kernel.
#define CZ_TILE_WARPS 4

struct CzGeo {
    i64 batch, n[3], S, tiles[3], ntiles, vol;
};

__device__ __forceinline__ CzGeo cz_geo(const i64* g) {
    CzGeo r;
    r.batch = g[CZ_G_BATCH];
    for (int d = 0; d < 3; d++) {
        r.n[d] = g[CZ_G_N + d];
        r.tiles[d] = g[CZ_G_TILES + d];
    }
    r.S = g[CZ_G_S];
    r.ntiles = g[CZ_G_NTILES];
    r.vol = g[CZ_G_VOL];
    return r;
}

// grid.rs Grid::owned / boxed (one dimension)
__device__ __forceinline__ i64 cz_owned(const CzGeo& g, int d, i64 c) {
    i64 r = g.n[d] - c * g.S;
    return r < g.S ? r : g.S;
}
__device__ __forceinline__ i64 cz_boxed(const CzGeo& g, int d, i64 c) {
    i64 r = g.n[d] - 1 - c * g.S;
    return (r < g.S ? r : g.S) + 1;
}
// grid.rs Grid::tile_offset
__device__ __forceinline__ i64 cz_tile_offset(const CzGeo& g, i64 b, const i64 c[3]) {
    i64 e0 = cz_owned(g, 0, c[0]), e1 = cz_owned(g, 1, c[1]);
    return b * g.vol + c[0] * g.S * g.n[1] * g.n[2] + e0 * c[1] * g.S * g.n[2] + e0 * e1 * c[2] * g.S;
}
// grid.rs Grid::tile_coords
__device__ __forceinline__ i64 cz_tile_coords(const CzGeo& g, i64 t, i64 c[3]) {
    i64 per = g.tiles[0] * g.tiles[1] * g.tiles[2];
    i64 b = t / per, r = t % per;
    for (int d = 2; d >= 0; d--) {
        c[d] = r % g.tiles[d];
        r /= g.tiles[d];
    }
    return b;
}
__device__ __forceinline__ i64 cz_tile_index(const CzGeo& g, i64 b, const i64 c[3]) {
    return ((b * g.tiles[0] + c[0]) * g.tiles[1] + c[1]) * g.tiles[2] + c[2];
}
// grid.rs Grid::symbol_index (x in volume coordinates)
__device__ __forceinline__ i64 cz_symbol_index(const CzGeo& g, i64 b, const i64 x[3]) {
    i64 c[3], l[3], e[3];
    for (int d = 0; d < 3; d++) {
        c[d] = x[d] / g.S;
        l[d] = x[d] - c[d] * g.S;
        e[d] = cz_owned(g, d, c[d]);
    }
    return cz_tile_offset(g, b, c) + (l[0] * e[1] + l[1]) * e[2] + l[2];
}

// ---------------------------------------------------------------------------------------------
// rANS chunks (rans.rs read_chunk + entropy.rs read_chunk_tail), one thread per chunk.
//
// `ent[2i]` = chunk i's offset in the stream, `ent[2i+1]` = size | checksum << 32 (sizes
// checked by the host: multiples of 4 inside the stream). Writes every residual of the chunk
// to `res` (symbol order; LOSSLESS for lossless values), a lossless value's bits to `raw` at
// its index, and uses `bigs` (at the chunk's own indices) for the positions of big residuals.
//
// The tables: per table `sym` (the symbol of each of the 2^14 slots) and `fc` (per symbol
// `freq << 16 | cum`). Each thread's state update waits on two dependent loads, so they are
// staged in shared memory when all of them fit (`smem` = their bytes, else 0: read from global
// memory), with the class pattern.
extern __shared__ __align__(16) u8 cz_dyn[];

template <typename T>
__device__ void cz_rans(const u8* stream, const i64* geo, const u64* ent, u64 nchunks, const u8* g_pattern,
                        const u8* map, const unsigned short* g_sym, const u32* g_fc, u32 ntab, u32 smem, i64* res,
                        u8* raw, u32* bigs, u64* err) {
    const unsigned short* slot = g_sym;
    const u32* fcs = g_fc;
    const u8* pattern = g_pattern;
    if (smem) {
        // layout: fc (ntab * 1025 u32), sym (ntab * 2^14 u16), pattern
        u32* s_fc = (u32*)cz_dyn;
        unsigned short* s_sym = (unsigned short*)(s_fc + ntab * 1025);
        u8* s_pat = (u8*)(s_sym + ntab * CZ_PROB_SCALE);
        u32 npat = (u32)(geo[CZ_G_FULL] * geo[CZ_G_FULL + 1] * geo[CZ_G_FULL + 2]);
        for (u32 i = threadIdx.x; i < ntab * 1025; i += blockDim.x) s_fc[i] = g_fc[i];
        const u32* gs = (const u32*)g_sym;
        u32* ss = (u32*)s_sym;
        for (u32 i = threadIdx.x; i < ntab * CZ_PROB_SCALE / 2; i += blockDim.x) ss[i] = gs[i];
        for (u32 i = threadIdx.x; i < npat; i += blockDim.x) s_pat[i] = g_pattern[i];
        __syncthreads();
        slot = s_sym;
        fcs = s_fc;
        pattern = s_pat;
    }
    u64 ci = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= nchunks) return;
    const CzGeo g = cz_geo(geo);
    const u8* c = stream + ent[2 * ci];
    u32 size = (u32)ent[2 * ci + 1];
    u32 sum_w = (u32)(ent[2 * ci + 1] >> 32);
    u64 fail = 0;
    {
        const u32* w = (const u32*)c;
        u32 sum = 0;
        for (u32 i = 0; i < size / 4; i++) sum += zhash_mix(w[i], i);
        if (zhash_final(sum, size / 4) != sum_w) fail = CZ_E_CHECKSUM;
    }
    i64 i0 = (i64)ci * CZ_CHUNK;
    i64 cnt = g.batch * g.vol - i0;
    if (cnt > CZ_CHUNK) cnt = CZ_CHUNK;
    u32 nb = 0;
    if (!fail) {
        if (size < 8) {
            fail = CZ_E_RANS;
        } else {
            nb = *(const u32*)c;
            if (nb < 4 || (u64)nb + 4 > size) fail = CZ_E_RANS;
        }
    }
    if (fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
        return;
    }
    const u8* bytes = c + 4;
    u32 x = ((u32)bytes[0] << 24) | ((u32)bytes[1] << 16) | ((u32)bytes[2] << 8) | (u32)bytes[3];
    u32 pos = 4;
    // where the chunk starts among the tiles: the tile (inverse of tile_offset) and the local
    // coordinates in it
    i64 tc[3], b, l[3], own[3];
    {
        b = i0 / g.vol;
        i64 r = i0 - b * g.vol;
        i64 slab = g.S * g.n[1] * g.n[2];
        tc[0] = r / slab;
        r -= tc[0] * slab;
        own[0] = cz_owned(g, 0, tc[0]);
        i64 row = own[0] * g.S * g.n[2];
        tc[1] = r / row;
        r -= tc[1] * row;
        own[1] = cz_owned(g, 1, tc[1]);
        i64 tl = own[0] * own[1] * g.S;
        tc[2] = r / tl;
        r -= tc[2] * tl;
        own[2] = cz_owned(g, 2, tc[2]);
        l[0] = r / (own[1] * own[2]);
        l[1] = (r / own[2]) % own[1];
        l[2] = r % own[2];
    }
    const i64 f1 = geo[CZ_G_FULL + 1], f2 = geo[CZ_G_FULL + 2];
    u32 nraw = 0, nbig = 0;
    const u32 raw_at = 4 + nb;
    const u32 mask = CZ_PROB_SCALE - 1;
    for (i64 j = 0; j < cnt; j++) {
        u32 k = pattern[(l[0] * f1 + l[1]) * f2 + l[2]];
        u32 tb = map[k];
        u32 sl = x & mask;
        u32 s = slot[(tb << CZ_PROB_BITS) + sl];
        u32 fc = fcs[tb * 1025 + s];
        // (x = f (x >> 14) + sl - cum < 2^32: no overflow)
        x = (fc >> 16) * (x >> CZ_PROB_BITS) + sl - (fc & 0xFFFF);
        while (x < CZ_RANS_L) {
            if (pos >= nb) {
                fail = CZ_E_RANS;
                break;
            }
            x = (x << 8) | bytes[pos++];
        }
        if (fail) break;
        i64 r;
        if (s == CZ_SYM_LOSSLESS) {
            u64 at = (u64)raw_at + (u64)(nraw + 1) * sizeof(T);
            if (at > size) {
                fail = CZ_E_RAW;
                break;
            }
            const u8* p = c + raw_at + nraw * sizeof(T);
            for (int q = 0; q < (int)sizeof(T); q++) raw[(i0 + j) * sizeof(T) + q] = p[q];
            nraw++;
            r = CZ_LOSSLESS;
        } else if (s == CZ_SYM_BIG) {
            bigs[i0 + nbig] = (u32)j;
            nbig++;
            r = 0;
        } else {
            r = (i64)s - CZ_RADIUS;
        }
        res[i0 + j] = r;
        // next point in symbol order: raster within the tile, then the next tile
        if (++l[2] == own[2]) {
            l[2] = 0;
            if (++l[1] == own[1]) {
                l[1] = 0;
                if (++l[0] == own[0]) {
                    l[0] = 0;
                    if (++tc[2] == g.tiles[2]) {
                        tc[2] = 0;
                        if (++tc[1] == g.tiles[1]) {
                            tc[1] = 0;
                            if (++tc[0] == g.tiles[0]) {
                                tc[0] = 0;
                                b++;
                            }
                        }
                    }
                    for (int d = 0; d < 3; d++) own[d] = cz_owned(g, d, tc[d]);
                }
            }
        }
    }
    if (!fail && (x != CZ_RANS_L || pos != nb)) fail = CZ_E_RANS;
    u32 p = raw_at + nraw * (u32)sizeof(T);
    for (u32 q = 0; q < nbig && !fail; q++) {
        u64 z = 0;
        int shift = 0;
        for (;;) {
            if (p >= size) {
                fail = CZ_E_BIG;
                break;
            }
            u32 bb = c[p++];
            if ((shift == 63 && bb > 1) || (shift > 0 && bb == 0)) {
                fail = CZ_E_BIG;
                break;
            }
            z |= (u64)(bb & 0x7F) << shift;
            if (!(bb & 0x80)) break;
            shift += 7;
        }
        if (fail) break;
        i64 v = (i64)(z >> 1) ^ -(i64)(z & 1);
        if ((v >= -CZ_RADIUS && v <= CZ_RADIUS) || v == CZ_LOSSLESS) {
            fail = CZ_E_BIG;
            break;
        }
        res[i0 + bigs[i0 + q]] = v;
    }
    if (!fail) {
        if (size - p >= 4) {
            fail = CZ_E_PAD;
        } else {
            for (u32 q = p; q < size; q++)
                if (c[q]) fail = CZ_E_PAD;
        }
    }
    if (fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
    }
}

// ---------------------------------------------------------------------------------------------
// Anchors (mod.rs decode, "anchors"): the Lorenzo inverse over the anchor grid is the n-D
// prefix sum of the anchor residuals (a lossless anchor adds 0), in wrapping integers; one
// launch per dimension, one thread per line of tiles along it. The first launch (dim 2) reads
// the residuals, the last (dim 0) also writes the anchors' values (mod.rs anchor_values).
template <typename T>
__device__ void cz_anchors(const i64* geo, const i64* res, i64* acc, double* vals, int dim, int first, int last,
                           double step) {
    const CzGeo g = cz_geo(geo);
    i64 len = g.tiles[dim];
    i64 lines = g.ntiles / (len > 0 ? len : 1);
    i64 li = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (li >= lines || len == 0) return;
    // the line's coordinates in the other dimensions
    i64 c[3];
    i64 r = li;
    for (int d = 2; d >= 0; d--) {
        if (d == dim) continue;
        c[d] = r % g.tiles[d];
        r /= g.tiles[d];
    }
    i64 b = r;
    i64 s = 0;
    for (i64 k = 0; k < len; k++) {
        c[dim] = k;
        i64 t = cz_tile_index(g, b, c);
        i64 v;
        if (first) {
            i64 rr = res[cz_tile_offset(g, b, c)];
            v = rr == CZ_LOSSLESS ? 0 : rr;
        } else {
            v = acc[t];
        }
        s = (i64)((u64)s + (u64)v);
        acc[t] = s;
        if (last) {
            double a;
            if (sizeof(T) == 4) {
                a = (double)((float)(i32)s * (float)step);
            } else {
                a = (double)s * step;
            }
            vals[t] = zc_isfinite(a) ? a : 0.0;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Interpolation (interp.rs predict / multi_prediction, f64 domain).
__device__ __forceinline__ double cz_predict(const double* buf, int idx, int c, int len, int s, int st, int sp) {
    double b = buf[idx - s * st];
    if (c + s >= len) return b;
    double cc = buf[idx + s * st];
    bool hl = c >= 3 * s, hr = c + 3 * s < len;
    if (sp == 0 || (!hl && !hr)) return (b + cc) * 0.5;
    if (hl && !hr) {
        double a = buf[idx - 3 * s * st];
        return ((b * 6.0 + cc * 3.0) - a) * 0.125;
    }
    if (!hl) {
        double d = buf[idx + 3 * s * st];
        return ((b * 3.0 + cc * 6.0) - d) * 0.125;
    }
    double a = buf[idx - 3 * s * st], d = buf[idx + 3 * s * st];
    if (sp == 1) return ((b + cc) * 9.0 - (a + d)) * 0.0625;
    return ((b + cc) * 23.0 - (a + d) * 3.0) / 40.0;
}

__device__ __forceinline__ double cz_multi(const double* buf, int idx, const int x[3], const int e[3], const int st[3],
                                           int s, int mask, const int sp[3]) {
    double ps[3];
    int n = 0;
    for (int a = 0; a < 3; a++) {
        if ((mask >> a & 1) && x[a] + s < e[a]) ps[n++] = cz_predict(buf, idx, x[a], e[a], s, st[a], sp[a]);
    }
    if (n == 0) {
        int a = __ffs(mask) - 1;
        return cz_predict(buf, idx, x[a], e[a], s, st[a], sp[a]);
    }
    if (n == 1) return ps[0];
    if (n == 2) return (ps[0] + ps[1]) * 0.5;
    return (ps[0] + ps[1] + ps[2]) / 3.0;
}

template <typename T> __device__ __forceinline__ T cz_from_bits(const u8* p);
template <> __device__ __forceinline__ float cz_from_bits<float>(const u8* p) {
    return __uint_as_float((u32)p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24);
}
template <> __device__ __forceinline__ double cz_from_bits<double>(const u8* p) {
    u64 v = 0;
    for (int q = 7; q >= 0; q--) v = v << 8 | p[q];
    return __longlong_as_double((long long)v);
}

// Tiles (mod.rs Tiles::decode, abs / noa): one warp per tile, its box of reconstructed values
// in shared memory; the points of one walk are independent, so the lanes share each walk and
// meet at a warp barrier between walks. Owned points are written straight to the array.
template <typename T>
__device__ void cz_tiles(const i64* geo, const i64* res, const u8* raw, const i64* acc, const double* vals,
                         double step, T* out) {
    __shared__ double sbuf[CZ_TILE_WARPS][CZ_MAXBOX];
    const CzGeo g = cz_geo(geo);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 t = (i64)blockIdx.x * CZ_TILE_WARPS + warp;
    if (t >= g.ntiles) return;
    double* buf = sbuf[warp];
    i64 c[3];
    i64 b = cz_tile_coords(g, t, c);
    int e[3], own[3];
    i64 o[3];
    for (int d = 0; d < 3; d++) {
        e[d] = (int)cz_boxed(g, d, c[d]);
        own[d] = (int)cz_owned(g, d, c[d]);
        o[d] = c[d] * g.S;
    }
    const int st[3] = {e[1] * e[2], e[2], 1};
    const int S = (int)g.S;
    const i64 base = cz_tile_offset(g, b, c);
    const i64 origin = b * g.vol + (o[0] * g.n[1] + o[1]) * g.n[2] + o[2];
    int nbox = e[0] * e[1] * e[2];
    for (int i = lane; i < nbox; i += 32) buf[i] = 0.0;
    __syncwarp();
    if (lane < 8) {
        // interp.rs place_anchors
        int k = lane, idx = 0;
        i64 tt[3] = {c[0], c[1], c[2]};
        bool inside = true;
        for (int d = 0; d < 3; d++) {
            if (k >> d & 1) {
                if (e[d] <= S) inside = false;
                idx += S * st[d];
                tt[d] += 1;
            }
        }
        if (inside) buf[idx] = vals[cz_tile_index(g, b, tt)];
    }
    __syncwarp();
    int nw = (int)geo[CZ_G_NWALKS];
    for (int w = 0; w < nw; w++) {
        const i64* wk = geo + CZ_G_WALKS + CZ_WALK_WORDS * w;
        int s = (int)wk[0];
        int start[3] = {(int)wk[1], (int)wk[2], (int)wk[3]};
        int stp[3] = {(int)wk[4], (int)wk[5], (int)wk[6]};
        int multi = (int)wk[7], am = (int)wk[8];
        int sp[3] = {(int)wk[9], (int)wk[10], (int)wk[11]};
        int cnt[3];
        for (int d = 0; d < 3; d++) cnt[d] = start[d] < e[d] ? (e[d] - 1 - start[d]) / stp[d] + 1 : 0;
        int total = cnt[0] * cnt[1] * cnt[2];
        for (int k = lane; k < total; k += 32) {
            int x[3];
            x[2] = start[2] + (k % cnt[2]) * stp[2];
            x[1] = start[1] + ((k / cnt[2]) % cnt[1]) * stp[1];
            x[0] = start[0] + (k / (cnt[2] * cnt[1])) * stp[0];
            int idx = x[0] * st[0] + x[1] * st[1] + x[2];
            double p = multi ? cz_multi(buf, idx, x, e, st, s, am, sp)
                             : cz_predict(buf, idx, x[am], e[am], s, st[am], sp[am]);
            bool owned = x[0] < own[0] && x[1] < own[1] && x[2] < own[2];
            i64 si;
            if (owned) {
                si = base + (x[0] * own[1] + x[1]) * own[2] + x[2];
            } else {
                i64 gx[3] = {o[0] + x[0], o[1] + x[1], o[2] + x[2]};
                si = cz_symbol_index(g, b, gx);
            }
            i64 r = res[si];
            double v;
            T val;
            if (r == CZ_LOSSLESS) {
                v = zc_isfinite(p) ? p : 0.0;
                if (owned) val = cz_from_bits<T>(raw + si * sizeof(T));
            } else {
                // quant.rs ResidualQuantizer::decode
                val = (T)(p + (double)r * step);
                v = (double)val;
            }
            if (owned) out[origin + (x[0] * g.n[1] + x[1]) * g.n[2] + x[2]] = val;
            buf[idx] = v;
        }
        __syncwarp();
    }
    if (lane == 0) {
        T val;
        if (res[base] == CZ_LOSSLESS) {
            val = cz_from_bits<T>(raw + base * sizeof(T));
        } else if (sizeof(T) == 4) {
            val = (T)((float)(i32)acc[t] * (float)step);
        } else {
            val = (T)((double)acc[t] * step);
        }
        out[origin] = val;
    }
}

#define CZ_INST(T, N)                                                                                               \
    extern "C" __global__ void cz_rans_##N(const u8* stream, const i64* geo, const u64* ent, u64 nchunks,            \
                                           const u8* pattern, const u8* map, const unsigned short* sym,            \
                                           const u32* fc, u32 ntab, u32 smem, i64* res, u8* raw, u32* bigs,       \
                                           u64* err) {                                                             \
        cz_rans<T>(stream, geo, ent, nchunks, pattern, map, sym, fc, ntab, smem, res, raw, bigs, err);            \
    }                                                                                                               \
    extern "C" __global__ void cz_anchors_##N(const i64* geo, const i64* res, i64* acc, double* vals, int dim,     \
                                              int first, int last, double step) {                                  \
        cz_anchors<T>(geo, res, acc, vals, dim, first, last, step);                                                \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_TILE_WARPS * 32)                                                \
        cz_tiles_##N(const i64* geo, const i64* res, const u8* raw, const i64* acc, const double* vals,            \
                     double step, T* out) {                                                                        \
        cz_tiles<T>(geo, res, raw, acc, vals, step, out);                                                          \
    }

CZ_INST(float, f32)
CZ_INST(double, f64)
