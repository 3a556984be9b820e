// cuszi kernels (src/gpu/cuszi/): the stages of src/codec/cuszi encode and decode, bit for bit.
//
// Compiled by NVRTC with --fmad=false --prec-div=true, so every f64 expression below is the
// same sequence of IEEE roundings as the Rust one it mirrors (named beside each function).
//
// Geometry words `geo` (written by src/gpu/cuszi/plan.rs `geometry`, CZ_G_*): the grid of
// src/codec/cuszi/grid.rs, the walks of interp.rs `walks` (CZ_WALK_WORDS each) and the class
// pattern's extents.
#include "common.cuh"

// src/codec/cuszi/mod.rs CHUNK
#define CZ_CHUNK 32768ll
// src/codec/cuszi/rans.rs PROB_BITS, RANS_L, SYM_LOSSLESS, SYM_BIG; entropy.rs RADIUS
#define CZ_PROB_BITS 14
#define CZ_PROB_SCALE (1u << CZ_PROB_BITS)
#define CZ_RANS_L (1u << 23)
// Interleaved rANS states per chunk: residual i of a chunk is coded with state i mod ways, its
// `4 ways` state bytes first in the chunk's stream. Coder 3 (rans.rs `WAYS`): one state per lane
// of the warp coders (cz_rans_warp, cz_enc_whole); coder 2 (rans.rs `WAYS_CODER_2`); coder 1
// has one.
#define CZ_RANS_WAYS 32
#define CZ_RANS_WAYS2 4
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

// error bits (src/gpu/cuszi/mod.rs ERRORS)
#define CZ_E_CHECKSUM 1ull
#define CZ_E_RANS 2ull
#define CZ_E_RAW 4ull
#define CZ_E_BIG 8ull
#define CZ_E_PAD 16ull

// Chunks per block of cz_rans (one per thread of its first warp) and of the whole-tile chain
// kernels (cz_rans_whole, cz_enc_whole).
#define CZ_RANS_CHUNKS 32
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
    if (g.ntiles <= 0x7FFFFFFF && t >= 0 && t < g.ntiles) {
        // (the same quotients in 32 bits: a 64-bit division is a long software routine)
        u32 p = (u32)per, t0 = (u32)g.tiles[0], t1 = (u32)g.tiles[1], t2 = (u32)g.tiles[2];
        u32 b = (u32)t / p, r = (u32)t - b * p;
        u32 q2 = r / t2, q1 = q2 / t1;
        c[2] = r - q2 * t2;
        c[1] = q2 - q1 * t1;
        c[0] = q1 % t0;
        return b;
    }
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

// The point at symbol index `i0` (a chunk's first): its batch `b`, its tile `tc` (the inverse of
// tile_offset), the tile's owned extents `own` and its local coordinates `l` in the tile.
// Shared by the decoder (cz_rans) and the encoder (cz_enc_chunks), which must walk the same
// positions.
__device__ __forceinline__ void cz_chunk_start(const CzGeo& g, i64 i0, i64 tc[3], i64& b, i64 l[3], i64 own[3]) {
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
// The next point in symbol order after (b, tc, l): raster within the tile, then the next tile
// (own follows tc).
__device__ __forceinline__ void cz_next_point(const CzGeo& g, i64 tc[3], i64& b, i64 l[3], i64 own[3]) {
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

// ---------------------------------------------------------------------------------------------
// rANS chunks (rans.rs read_chunk + entropy.rs read_chunk_tail), one thread per chunk.
//
// `ent[2i]` = chunk i's offset in the stream, `ent[2i+1]` = size | checksum << 32 (sizes
// checked by the host: multiples of 4 inside the stream). Writes every residual of the chunk
// to `res` (symbol order; LOSSLESS for lossless values), a lossless value's bits to `raw` at
// its index, and uses `bigs` (at the chunk's own indices) for the positions of big residuals.
//
// The symbol of slot `sl` of table `tb` and its `freq << 16 | cum`: from the ranked arrays for
// the table's 255 most frequent symbols, else from the global slot and step arrays.
__device__ __forceinline__ void cz_slot_symbol(u32 tb, u32 sl, const u8* rank, const u32* rfc,
                                               const unsigned short* rsym, const unsigned short* g_sym,
                                               const u32* g_fc, u32& s, u32& fc) {
    const u32 at = (tb << CZ_PROB_BITS) + sl;
    const u32 rk = rank[at];
    if (rk != 255) {
        s = rsym[tb * 256 + rk];
        fc = rfc[tb * 256 + rk];
    } else {
        s = g_sym[at];
        fc = g_fc[tb * 1025 + s];
    }
}

// The tables, per table: `rank` (per slot: the rank of its symbol among the table's 255 most
// frequent ones, 255 for the others), `rfc` and `rsym` (per rank: `freq << 16 | cum` and the
// symbol), and for the other symbols `sym` (per slot) and `fc` (per symbol). Each thread's state
// update waits on these loads, so rank, rfc, rsym, the class map and the class pattern are
// staged in shared memory when they fit (`smem` = their bytes, else 0: all read from global
// memory).
extern __shared__ __align__(16) u8 cz_dyn[];

// A chunk's checksum against its table entry's `sum_w`, and its rANS byte count `nb` (at least
// the state bytes of its `ways` states, inside the chunk): the error bit, 0 when both hold.
__device__ __forceinline__ u64 cz_chunk_check(const u8* c, u32 size, u32 sum_w, u32 ways, u32& nb) {
    const u32* w = (const u32*)c;
    u32 sum = 0;
    for (u32 i = 0; i < size / 4; i++) sum += zhash_mix(w[i], i);
    if (zhash_final(sum, size / 4) != sum_w) return CZ_E_CHECKSUM;
    if (size < 8) return CZ_E_RANS;
    nb = *(const u32*)c;
    if (nb < 4 * ways || (u64)nb + 4 > size) return CZ_E_RANS;
    return 0;
}

// The end of a chunk after its rANS symbols (rans.rs read_chunk's final checks, entropy.rs
// read_chunk_tail): every final state is the encoder's initial one (`states_ok`) and the `nb`
// rANS bytes were consumed exactly (`pos`); then the `nbig` big residuals after the `nraw` lossless values
// (their positions in the chunk `bg`, their values into the chunk's residuals `rc`), then fewer
// than 4 zero bytes of padding. Returns the error bit, 0 for a valid chunk.
template <typename T>
__device__ __forceinline__ u64 cz_rans_bigs(const u8* c, u32 size, u32 nb, u32 nraw, u32 nbig, const u32* bg,
                                            i64* rc);
template <typename T>
__device__ __forceinline__ u64 cz_rans_tail(const u8* c, u32 size, u32 nb, bool states_ok, u32 pos, u32 nraw,
                                            u32 nbig, const u32* bg, i64* rc) {
    if (!states_ok || pos != nb) return CZ_E_RANS;
    return cz_rans_bigs<T>(c, size, nb, nraw, nbig, bg, rc);
}
// cz_rans_tail after the state's checks: the big residuals and the padding.
template <typename T>
__device__ __forceinline__ u64 cz_rans_bigs(const u8* c, u32 size, u32 nb, u32 nraw, u32 nbig, const u32* bg,
                                            i64* rc) {
    u32 p = 4 + nb + nraw * (u32)sizeof(T);
    for (u32 q = 0; q < nbig; q++) {
        u64 z = 0;
        int shift = 0;
        for (;;) {
            if (p >= size) return CZ_E_BIG;
            u32 bb = c[p++];
            if ((shift == 63 && bb > 1) || (shift > 0 && bb == 0)) return CZ_E_BIG;
            z |= (u64)(bb & 0x7F) << shift;
            if (!(bb & 0x80)) break;
            shift += 7;
        }
        i64 v = (i64)(z >> 1) ^ -(i64)(z & 1);
        if ((v >= -CZ_RADIUS && v <= CZ_RADIUS) || v == CZ_LOSSLESS) return CZ_E_BIG;
        rc[bg[q]] = v;
    }
    if (size - p >= 4) return CZ_E_PAD;
    for (u32 q = p; q < size; q++)
        if (c[q]) return CZ_E_PAD;
    return 0;
}

template <typename T>
__device__ void cz_rans(const u8* stream, const i64* geo, const u64* ent, u64 nchunks, const u8* g_pattern,
                        const u8* g_map, const unsigned short* g_sym, const u32* g_fc, const u8* g_rank,
                        const u32* g_rfc, const unsigned short* g_rsym, u32 ntab, u32 nclass, u32 smem, u32 ways,
                        i64* res, u8* raw, u32* bigs, u64* err) {
    const u8* rank = g_rank;
    const u32* rfc = g_rfc;
    const unsigned short* rsym = g_rsym;
    const u8* pattern = g_pattern;
    const u8* map = g_map;
    if (smem) {
        u8* s_rank = cz_dyn;
        u32* s_rfc = (u32*)(s_rank + ntab * CZ_PROB_SCALE);
        unsigned short* s_rsym = (unsigned short*)(s_rfc + ntab * 256);
        u8* s_map = (u8*)(s_rsym + ntab * 256);
        u8* s_pat = s_map + 64;
        u32 npat = (u32)(geo[CZ_G_FULL] * geo[CZ_G_FULL + 1] * geo[CZ_G_FULL + 2]);
        const u32* gr = (const u32*)g_rank;
        for (u32 i = threadIdx.x; i < ntab * CZ_PROB_SCALE / 4; i += blockDim.x) ((u32*)s_rank)[i] = gr[i];
        for (u32 i = threadIdx.x; i < ntab * 256; i += blockDim.x) {
            s_rfc[i] = g_rfc[i];
            s_rsym[i] = g_rsym[i];
        }
        for (u32 i = threadIdx.x; i < nclass; i += blockDim.x) s_map[i] = g_map[i];
        for (u32 i = threadIdx.x; i < npat; i += blockDim.x) s_pat[i] = g_pattern[i];
        __syncthreads();
        rank = s_rank;
        rfc = s_rfc;
        rsym = s_rsym;
        pattern = s_pat;
        map = s_map;
    }
    // (the whole block stages the tables; its first CZ_RANS_CHUNKS threads decode a chunk each)
    if (threadIdx.x >= CZ_RANS_CHUNKS) return;
    u64 ci = (u64)blockIdx.x * CZ_RANS_CHUNKS + threadIdx.x;
    if (ci >= nchunks) return;
    const CzGeo g = cz_geo(geo);
    const u8* c = stream + ent[2 * ci];
    u32 size = (u32)ent[2 * ci + 1];
    u32 sum_w = (u32)(ent[2 * ci + 1] >> 32);
    i64 i0 = (i64)ci * CZ_CHUNK;
    i64 cnt = g.batch * g.vol - i0;
    if (cnt > CZ_CHUNK) cnt = CZ_CHUNK;
    u32 nb = 0;
    u64 fail = cz_chunk_check(c, size, sum_w, ways, nb);
    if (fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
        return;
    }
    const u8* bytes = c + 4;
    // the states (residual j takes state j mod ways: a local array, this path being the rare
    // shapes' one; cz_rans_chain4 keeps its states in registers)
    u32 xs[CZ_RANS_WAYS];
    for (u32 q = 0; q < ways; q++)
        xs[q] = ((u32)bytes[4 * q] << 24) | ((u32)bytes[4 * q + 1] << 16) | ((u32)bytes[4 * q + 2] << 8) |
                (u32)bytes[4 * q + 3];
    u32 pos = 4 * ways;
    // where the chunk starts among the tiles: the tile (inverse of tile_offset) and the local
    // coordinates in it
    i64 tc[3], b, l[3], own[3];
    cz_chunk_start(g, i0, tc, b, l, own);
    const i64 f1 = geo[CZ_G_FULL + 1], f2 = geo[CZ_G_FULL + 2];
    u32 nraw = 0, nbig = 0;
    const u32 raw_at = 4 + nb;
    const u32 mask = CZ_PROB_SCALE - 1;
    // the table of the next residual, looked up ahead of the state's dependency chain
    u32 tb = map[pattern[(l[0] * f1 + l[1]) * f2 + l[2]]];
    for (i64 j = 0; j < cnt; j++) {
        u32& x = xs[j & (ways - 1)];
        u32 sl = x & mask;
        u32 s, fc;
        cz_slot_symbol(tb, sl, rank, rfc, rsym, g_sym, g_fc, s, fc);
        // (x = f (x >> 14) + sl - cum < 2^32: the wrapping sum is exact)
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
        cz_next_point(g, tc, b, l, own);
        if (j + 1 < cnt) tb = map[pattern[(l[0] * f1 + l[1]) * f2 + l[2]]];
    }
    bool states_ok = true;
    for (u32 q = 0; q < ways; q++) states_ok &= xs[q] == CZ_RANS_L;
    if (!fail) fail = cz_rans_tail<T>(c, size, nb, states_ok, pos, nraw, nbig, bigs + i0, res + i0);
    if (fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
    }
}

// The symbol `s` of state `x` and the state's update, without its renormalization: `tp` is the
// `top` entry of the residual's position ({freq << 16 | cum, symbol | table << 16} of its
// table's most frequent symbol), which settles most symbols without cz_slot_symbol's lookups.
// Shared by the coder 2 and coder 3 decoders.
__device__ __forceinline__ void cz_rans_symbol(u32& x, uint2 tp, const u8* rank, const u32* rfc,
                                               const unsigned short* rsym, const unsigned short* g_sym,
                                               const u32* g_fc, u32& s) {
    const u32 sl = x & (CZ_PROB_SCALE - 1);
    const u32 f0 = tp.x >> 16;
    const u32 d = sl - (tp.x & 0xFFFF);
    if (d < f0) {
        s = tp.y & 0xFFFF;
        x = f0 * (x >> CZ_PROB_BITS) + d;
    } else {
        u32 fc;
        cz_slot_symbol(tp.y >> 16, sl, rank, rfc, rsym, g_sym, g_fc, s, fc);
        x = (fc >> 16) * (x >> CZ_PROB_BITS) + sl - (fc & 0xFFFF);
    }
}

// Chunks of a stream whose tiles are all whole (every extent a multiple of S or below it,
// src/gpu/cuszi/plan.rs `whole_tiles`), decoded as cz_rans does, with its every check, in two
// kernels. A chunk's symbols form one serial chain of state updates, so cz_rans_whole keeps
// only that chain in its loop, one thread per chunk: the residual at symbol index i is at local
// index i mod ts of its tile (ts points per tile), so its table is that of local index i mod ts
// (the class map applied to the class pattern), found by a counter rather than by a walk over
// tile coordinates; the rANS bytes are read a 4-byte word at a time, the next word loaded ahead (the
// host checks that the stream, whose chunks start at multiples of 4, is 4-aligned); each symbol
// is stored (`syms`) and the chunk's state checked (`stat`: 0 when valid). cz_rans_post then
// places a valid chunk's lossless values and big residuals, one warp per chunk, numbering them
// by ballots, and lane 0 checks the chunk's end (cz_rans_bigs); the later kernels read the other
// residuals from the symbols (cz_res).
//
// Blocks of CZ_RANS_CHUNKS chunks stage the tables (when `smem`), then each of their warps
// decodes CZ_RANS_LANES chunks, one per lane: a warp's lanes step together, so the fewer chunks
// a warp holds the less often one waits on another's rare symbol or renormalization.
#define CZ_RANS_LANES 4
// The symbols of one valid-looking chunk (cz_rans_whole): its `cnt` symbols into `sy`, `c` its
// bytes (`size`, `nb` of them rANS bytes), `l` the local index of its first residual in its
// tile. Returns the error bit. The tables are passed in (shared memory, where the compiler then
// emits shared loads, or global memory).
//
// `top[l]` holds, for local index l, its table's most frequent symbol: {freq << 16 | cum,
// symbol | table << 16}. Smooth data code most residuals with that symbol, so a slot among its
// slots takes its step from `top`, loaded ahead of the chain, and only the others wait on the
// two dependent table loads (rank, then its step) in the chain.
//
// Renormalization, where a valid stream's state (at least 2^9 after a step) needs at most 2
// bytes, takes them without a loop: the count k = 1 + [x < L / 2^8], both bytes from the 8
// bytes of `cur` and `nxt`; a smaller state (only from a corrupt initial state) takes the
// byte-by-byte loop. Either way it fails exactly when cz_rans would run out of bytes.
// One decoder step of state `x` past the fast path below (any slot): its symbol `s` (`tp` the
// top symbol of its position, else the tables), the state's update, then its renormalization from
// the stream words (`w`, `nw` of them; `cur` the word of rANS byte `pos`, `nxt` the next).
// Returns the error bit.
__device__ __forceinline__ u64 cz_rans_step(u32& x, uint2 tp, const u8* rank, const u32* rfc,
                                            const unsigned short* rsym, const unsigned short* g_sym, const u32* g_fc,
                                            const u32* w, u32 nw, u32 nb, u32& pos, u32& cur, u32& nxt, u32& s) {
    cz_rans_symbol(x, tp, rank, rfc, rsym, g_sym, g_fc, s);
    if (x >= CZ_RANS_L) {
        // (most symbols: no renormalization)
    } else if (x >= (CZ_RANS_L >> 16)) {
        u32 k = 1 + (x < (CZ_RANS_L >> 8));
        if (pos + k > nb) return CZ_E_RANS;
        u32 win = __funnelshift_r(cur, nxt, 8 * (pos & 3));
        u32 two = (win & 0xFF) << 8 | ((win >> 8) & 0xFF);
        x = k == 1 ? (x << 8) | (win & 0xFF) : (x << 16) | two;
        u32 p2 = pos + k;
        if ((p2 >> 2) != (pos >> 2)) {
            cur = nxt;
            u32 q = 2 + p2 / 4;
            nxt = q < nw ? w[q] : 0;
        }
        pos = p2;
    } else {
        while (x < CZ_RANS_L) {
            if (pos >= nb) return CZ_E_RANS;
            x = (x << 8) | ((cur >> (8 * (pos & 3))) & 0xFF);
            pos++;
            if ((pos & 3) == 0) {
                cur = nxt;
                u32 q = 2 + pos / 4;
                nxt = q < nw ? w[q] : 0;
            }
        }
    }
    return 0;
}

// A chunk of coder 1 (one state): one serial chain.
__device__ __forceinline__ u64 cz_rans_chain1(const u8* c, u32 size, u32 nb, u32 cnt, u32 l, u32 ts, const uint2* top,
                                              const u8* rank, const u32* rfc, const unsigned short* rsym,
                                              const unsigned short* g_sym, const u32* g_fc, unsigned short* sy) {
    // chunk word k holds chunk bytes 4k..4k+3 (the first in its low byte); rANS byte p is chunk
    // byte 4 + p: `cur` is the word of byte `pos`, `nxt` the one after it (0 past the chunk)
    const u32* w = (const u32*)c;
    const u32 nw = size / 4;
    u32 x = __byte_perm(w[1], 0, 0x0123);
    u32 pos = 4;
    u32 cur = 2 < nw ? w[2] : 0;
    u32 nxt = 3 < nw ? w[3] : 0;
    const u32 mask = CZ_PROB_SCALE - 1;
    uint2 tp = top[l];
    for (u32 j = 0; j < cnt; j++) {
        u32 sl = x & mask;
        // the next residual's table and top symbol, off the chain
        l = l + 1 == ts ? 0 : l + 1;
        uint2 tn = top[l];
        // the slot lies in the top symbol's slots [cum, cum + f) when sl - cum (wrapping) < f:
        // then its step is known without a table load; its state is computed at once, and
        // when it needs no renormalization either (most symbols of smooth data) that is all
        // (x = f (x >> 14) + sl - cum < 2^32: the wrapping sums are exact)
        const u32 f0 = tp.x >> 16;
        u32 d = sl - (tp.x & 0xFFFF);
        u32 xf = f0 * (x >> CZ_PROB_BITS) + d;
        if (__builtin_expect(d < f0 && xf >= CZ_RANS_L, 1)) {
            x = xf;
            sy[j] = (unsigned short)(tp.y & 0xFFFF);
            tp = tn;
            continue;
        }
        u32 s;
        if (u64 f = cz_rans_step(x, tp, rank, rfc, rsym, g_sym, g_fc, w, nw, nb, pos, cur, nxt, s)) return f;
        sy[j] = (unsigned short)s;
        tp = tn;
    }
    return x != CZ_RANS_L || pos != nb ? CZ_E_RANS : 0;
}

// A chunk of coder 2 (CZ_RANS_WAYS2 = 4 interleaved states): four residuals at a time, one per
// state, so the four state updates are independent. When all four take the fast path (top
// symbol, no renormalization: no byte read) they are computed side by side and stored as one
// 8-byte word; otherwise the four steps run in order (renormalizations read the bytes in
// residual order). TOP4: the tile pattern's length `ts` is a multiple of 4 (so is `l`, a chunk
// starting at a multiple of 32,768), so a step's four `top` entries are two aligned 16-byte
// words and one wrap test serves the four positions.
template <bool TOP4>
__device__ __forceinline__ u64 cz_rans_chain4(const u8* c, u32 size, u32 nb, u32 cnt, u32 l, u32 ts, const uint2* top,
                                              const u8* rank, const u32* rfc, const unsigned short* rsym,
                                              const unsigned short* g_sym, const u32* g_fc, unsigned short* sy) {
    const u32* w = (const u32*)c;
    const u32 nw = size / 4;
    u32 x[4];
#pragma unroll
    for (int q = 0; q < 4; q++) x[q] = __byte_perm(w[1 + q], 0, 0x0123);
    // (as cz_rans_chain1, past the 16 state bytes)
    u32 pos = 16;
    u32 cur = 5 < nw ? w[5] : 0;
    u32 nxt = 6 < nw ? w[6] : 0;
    const u32 mask = CZ_PROB_SCALE - 1;
    uint2 tp[4];
    // the tops of the four positions from `l` on, and `l` moved past them
    auto tops = [&](uint2 (&t)[4]) {
        if (TOP4) {
            const uint4 a = ((const uint4*)top)[l >> 1], b = ((const uint4*)top)[(l >> 1) + 1];
            t[0] = make_uint2(a.x, a.y);
            t[1] = make_uint2(a.z, a.w);
            t[2] = make_uint2(b.x, b.y);
            t[3] = make_uint2(b.z, b.w);
            l = l + 4 == ts ? 0 : l + 4;
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                t[q] = top[l];
                l = l + 1 == ts ? 0 : l + 1;
            }
        }
    };
    tops(tp);
    u32 j = 0;
    for (; j + 4 <= cnt; j += 4) {
        uint2 tn[4];
        tops(tn);
        u32 xf[4];
        bool fast = true;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const u32 f0 = tp[q].x >> 16;
            const u32 d = (x[q] & mask) - (tp[q].x & 0xFFFF);
            xf[q] = f0 * (x[q] >> CZ_PROB_BITS) + d;
            fast &= d < f0 && xf[q] >= CZ_RANS_L;
        }
        if (__builtin_expect(fast, 1)) {
#pragma unroll
            for (int q = 0; q < 4; q++) x[q] = xf[q];
            *(uint2*)(sy + j) = make_uint2((tp[0].y & 0xFFFF) | tp[1].y << 16, (tp[2].y & 0xFFFF) | tp[3].y << 16);
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                u32 s;
                if (u64 f = cz_rans_step(x[q], tp[q], rank, rfc, rsym, g_sym, g_fc, w, nw, nb, pos, cur, nxt, s))
                    return f;
                sy[j + q] = (unsigned short)s;
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++) tp[q] = tn[q];
    }
    // the last cnt mod 4 residuals
#pragma unroll
    for (int q = 0; q < 3; q++) {
        if (j + q < cnt) {
            u32 s;
            if (u64 f = cz_rans_step(x[q], tp[q], rank, rfc, rsym, g_sym, g_fc, w, nw, nb, pos, cur, nxt, s)) return f;
            sy[j + q] = (unsigned short)s;
        }
    }
    const bool ok = x[0] == CZ_RANS_L && x[1] == CZ_RANS_L && x[2] == CZ_RANS_L && x[3] == CZ_RANS_L;
    return !ok || pos != nb ? CZ_E_RANS : 0;
}

// The per-slot arrays of table `blockIdx.y`, CZ_SLOT_THREADS slots per block (one a thread,
// from slot blockIdx.x * CZ_SLOT_THREADS): `sym` (the symbol whose slots cover the slot) and
// `rank` (that symbol's rank among the table's 255 most frequent, 255 for the others), from `fc`
// (per symbol freq << 16 | cum, 0 when unused) and the ranked symbols `rsym` (`rfc` 0 past the
// last rank). The host checked the frequencies (they sum to CZ_PROB_SCALE), so the used
// symbols' slot ranges tile the slots in symbol order: the symbol of a slot is the largest
// symbol starting at or before it, a running maximum over the block's slots (each used symbol
// marked at its first slot) from the symbol covering the block's first slot.
#define CZ_SLOT_THREADS 1024
extern "C" __global__ void __launch_bounds__(CZ_SLOT_THREADS)
    cz_rans_slots(const u32* fc, const u32* rfc, const unsigned short* rsym, unsigned short* sym, u8* rank) {
    __shared__ u32 first[CZ_SLOT_THREADS];
    __shared__ u8 rank_of[1025];
    __shared__ u32 warp_max[CZ_SLOT_THREADS / 32];
    __shared__ u32 cover;
    const u32 t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 start = blockIdx.x * CZ_SLOT_THREADS;
    first[tid] = 0;
    if (tid == 0) cover = 0;
    for (u32 i = tid; i < 1025; i += CZ_SLOT_THREADS) rank_of[i] = 255;
    __syncthreads();
    for (u32 sy = tid; sy < 1025; sy += CZ_SLOT_THREADS) {
        const u32 v = fc[t * 1025 + sy], c = v & 0xFFFF;
        if (v >> 16) {
            if (c <= start) atomicMax(&cover, sy);
            if (c >= start && c < start + CZ_SLOT_THREADS) first[c - start] = sy;
        }
    }
    for (u32 r = tid; r < 255; r += CZ_SLOT_THREADS)
        if (rfc[t * 256 + r] >> 16) rank_of[rsym[t * 256 + r]] = (u8)r;
    __syncthreads();
    u32 inc = first[tid];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(ZC_FULL, inc, o);
        if (lane >= (u32)o) inc = max(inc, v);
    }
    if (lane == 31) warp_max[warp] = inc;
    __syncthreads();
    u32 run = max(inc, cover);
    for (u32 w = 0; w < warp; w++) run = max(run, warp_max[w]);
    const u64 at = (u64)t * CZ_PROB_SCALE + start + tid;
    sym[at] = (unsigned short)run;
    rank[at] = rank_of[run];
}

// The whole-tile decoders' tables in dynamic shared memory (rank, rfc, rsym and top, staged
// from global memory by the whole block when `smem`, else unused): their addresses there.
struct CzTables {
    u8* rank;
    u32* rfc;
    unsigned short* rsym;
    uint2* top;
};
__device__ __forceinline__ CzTables cz_stage_tables(const uint2* g_top, const u8* g_rank, const u32* g_rfc,
                                                    const unsigned short* g_rsym, u32 ntab, u32 ts, u32 smem) {
    CzTables t;
    t.rank = cz_dyn;
    t.rfc = (u32*)(t.rank + ntab * CZ_PROB_SCALE);
    t.rsym = (unsigned short*)(t.rfc + ntab * 256);
    // (ntab * 17,920 bytes before it: 8-aligned)
    t.top = (uint2*)(t.rsym + ntab * 256);
    if (smem) {
        const u32* gr = (const u32*)g_rank;
        for (u32 i = threadIdx.x; i < ntab * CZ_PROB_SCALE / 4; i += blockDim.x) ((u32*)t.rank)[i] = gr[i];
        for (u32 i = threadIdx.x; i < ntab * 256; i += blockDim.x) {
            t.rfc[i] = g_rfc[i];
            t.rsym[i] = g_rsym[i];
        }
        for (u32 i = threadIdx.x; i < ts; i += blockDim.x) t.top[i] = g_top[i];
        __syncthreads();
    }
    return t;
}

template <typename T>
__device__ void cz_rans_whole(const u8* stream, const u64* ent, u64 nchunks, u64 count, u32 ts, const uint2* g_top,
                              const unsigned short* g_sym, const u32* g_fc, const u8* g_rank, const u32* g_rfc,
                              const unsigned short* g_rsym, u32 ntab, u32 smem, u32 ways, unsigned short* syms,
                              u32* stat, u64* err) {
    const CzTables st = cz_stage_tables(g_top, g_rank, g_rfc, g_rsym, ntab, ts, smem);
    u8* s_rank = st.rank;
    u32* s_rfc = st.rfc;
    unsigned short* s_rsym = st.rsym;
    uint2* s_top = st.top;
    u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane >= CZ_RANS_LANES) return;
    u64 ci = (u64)blockIdx.x * CZ_RANS_CHUNKS + warp * CZ_RANS_LANES + lane;
    if (ci >= nchunks) return;
    const u8* c = stream + ent[2 * ci];
    u32 size = (u32)ent[2 * ci + 1];
    u32 sum_w = (u32)(ent[2 * ci + 1] >> 32);
    u64 i0 = ci * CZ_CHUNK;
    u32 cnt = (u32)(count - i0 < (u64)CZ_CHUNK ? count - i0 : (u64)CZ_CHUNK);
    u32 nb = 0;
    u64 fail = cz_chunk_check(c, size, sum_w, ways, nb);
    if (!fail) {
        u32 l = (u32)(i0 % ts);
        if (ways == CZ_RANS_WAYS2 && smem && ts % 4 == 0) {
            fail = cz_rans_chain4<true>(c, size, nb, cnt, l, ts, s_top, s_rank, s_rfc, s_rsym, g_sym, g_fc, syms + i0);
        } else if (ways == CZ_RANS_WAYS2 && smem) {
            fail = cz_rans_chain4<false>(c, size, nb, cnt, l, ts, s_top, s_rank, s_rfc, s_rsym, g_sym, g_fc, syms + i0);
        } else if (ways == CZ_RANS_WAYS2) {
            fail = cz_rans_chain4<false>(c, size, nb, cnt, l, ts, g_top, g_rank, g_rfc, g_rsym, g_sym, g_fc,
                                         syms + i0);
        } else if (smem) {
            fail = cz_rans_chain1(c, size, nb, cnt, l, ts, s_top, s_rank, s_rfc, s_rsym, g_sym, g_fc, syms + i0);
        } else {
            fail = cz_rans_chain1(c, size, nb, cnt, l, ts, g_top, g_rank, g_rfc, g_rsym, g_sym, g_fc, syms + i0);
        }
    }
    stat[ci] = fail ? 1u : 0u;
    if (fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
    }
}

// ---- Coder 3: a chunk per group of CZ_RANS_WAYS lanes (the warp coders).
// Lane li of a group holds state li, which codes residuals li, li + G, li + 2G, ... (G =
// CZ_RANS_WAYS), so a warp step decodes G consecutive residuals with independent state updates
// and stores their symbols as one coalesced run. The renormalization bytes of a step follow in
// residual order (lane order): a lane's bytes start after those of the lanes before it, counted
// from two ballots (lanes taking at least one byte, lanes taking two). A state below 2^7 after
// its update (only from a corrupt stream) takes the byte-by-byte loop, lane after lane. Every
// failure is the group's, as the serial decoder's (rans.rs read_chunk) is the chunk's.

// The lane mask of the group whose first lane is `first`.
__device__ __forceinline__ u32 cz_group_mask(u32 first) {
    return CZ_RANS_WAYS == 32 ? 0xFFFFFFFFu : (((1u << (CZ_RANS_WAYS & 31)) - 1u) << first);
}

// A chunk's checksum (cz_chunk_check's, its words summed by the group's lanes) and rANS byte
// count.
__device__ __forceinline__ u64 cz_group_check(const u8* c, u32 size, u32 sum_w, u32 li, u32 gm, u32& nb) {
    const u32* w = (const u32*)c;
    const u32 nw = size / 4;
    u32 sum = 0;
    for (u32 i = li; i < nw; i += CZ_RANS_WAYS) sum += zhash_mix(w[i], i);
#pragma unroll
    for (u32 o = CZ_RANS_WAYS / 2; o; o >>= 1) sum += __shfl_xor_sync(gm, sum, o);
    if (zhash_final(sum, nw) != sum_w) return CZ_E_CHECKSUM;
    if (size < 8) return CZ_E_RANS;
    nb = w[0];
    if (nb < 4 * CZ_RANS_WAYS || (u64)nb + 4 > size) return CZ_E_RANS;
    return 0;
}

// Residual `i` of a chunk with symbol `s` placed as the decoders' second pass does: a lossless
// value's bytes into `rawc` at its index (the chunk's lossless value numbered by `ml`, the lanes'
// lossless ballot, among the lanes `before` this one, after the `nraw` of earlier steps; a chunk
// too short for its lossless values is rejected at its end), a big residual's index into `bg`
// (numbered likewise by `mb` after `nbig`).
template <typename T>
__device__ __forceinline__ void cz_place(u32 s, u32 i, u32 ml, u32 mb, u32 before, u32 nraw, u32 nbig, const u8* c,
                                         u32 size, u32 raw_at, u8* rawc, u32* bg) {
    if (s == CZ_SYM_LOSSLESS) {
        const u64 k = nraw + __popc(ml & before);
        if ((u64)raw_at + (k + 1) * sizeof(T) <= size) {
            const u8* p = c + raw_at + k * sizeof(T);
            for (int q = 0; q < (int)sizeof(T); q++) rawc[(u64)i * sizeof(T) + q] = p[q];
        }
    } else if (s == CZ_SYM_BIG) {
        bg[nbig + __popc(mb & before)] = i;
    }
}

// One warp step of a coder-3 chunk (cz_rans_lanes): lane li's state `x` decodes residual `i` (when
// `act`), `tp` the `top` entry of its local position; the symbol into `s`, then the step's
// renormalization bytes, and the lossless values (to `rawc`) and big residual positions (`bg`)
// numbered by ballots in residual order. `act` is a literal true in the steps where every lane
// decodes, so those carry no per-lane test. Returns the error bit (the same in every lane).
template <typename T>
__device__ __forceinline__ u32 cz_lanes_step(bool act, u32 i, u32& x, uint2 tp, const u8* rank, const u32* rfc,
                                             const unsigned short* rsym, const unsigned short* g_sym,
                                             const u32* g_fc, const u8* b, u32 nb, u32& pos, const u8* c,
                                             u32 size, u32 raw_at, u8* rawc, u32* bg, u32& nraw, u32& nbig,
                                             u32& s, u32 li, u32 first, u32 gm, u32 before) {
    s = 0;
    if (act) cz_rans_symbol(x, tp, rank, rfc, rsym, g_sym, g_fc, s);
    // (one vote settles most steps: no lane renormalizes or decoded a lossless or big symbol)
    if (!__any_sync(gm, act && (x < CZ_RANS_L || s >= CZ_SYM_LOSSLESS))) return 0;
    const u32 b1 = __ballot_sync(gm, act && x < CZ_RANS_L) >> first;
    if (b1) {
        if (__any_sync(gm, act && x < (CZ_RANS_L >> 16))) {
            // a corrupt state: the serial decoder's loop, one lane after the other
            for (u32 q = 0; q < CZ_RANS_WAYS; q++) {
                u32 f = 0;
                if (li == q && act) {
                    while (x < CZ_RANS_L) {
                        if (pos >= nb) {
                            f = 1;
                            break;
                        }
                        x = (x << 8) | b[pos++];
                    }
                }
                pos = __shfl_sync(gm, pos, first + q);
                if (__any_sync(gm, f)) return CZ_E_RANS;
            }
        } else {
            const u32 b2 = __ballot_sync(gm, act && x < (CZ_RANS_L >> 8)) >> first;
            const u32 tot = __popc(b1) + __popc(b2);
            if (pos + tot > nb) return CZ_E_RANS;
            if (act && x < CZ_RANS_L) {
                const u32 o = pos + __popc(b1 & before) + __popc(b2 & before);
                x = (x << 8) | b[o];
                if (x < CZ_RANS_L) x = (x << 8) | b[o + 1];
            }
            pos += tot;
        }
    }
    const u32 ms = __ballot_sync(gm, act && s >= CZ_SYM_LOSSLESS) >> first;
    if (ms) {
        // (rare: cz_rans_post's numbering; a chunk too short for its lossless values is
        // rejected at its end)
        const u32 ml = __ballot_sync(gm, act && s == CZ_SYM_LOSSLESS) >> first;
        const u32 mb = ms & ~ml;
        if (act) cz_place<T>(s, i, ml, mb, before, nraw, nbig, c, size, raw_at, rawc, bg);
        nraw += __popc(ml);
        nbig += __popc(mb);
    }
    return 0;
}

// The symbols of one coder-3 chunk that passed cz_group_check into `sy` (the group's lanes;
// arguments as cz_rans_chain4's), with what cz_rans_post does for the other whole-tile decoder in
// the same pass: the lossless values' bits into `rawc` and the big residuals' positions into
// `bg`, then lane 0 checks the chunk's end and reads its big residuals into `rc`
// (cz_rans_bigs). Returns the error bit (the group's for the rANS bytes, lane 0's for the end).
//
// The steps where every lane decodes (all but a short last chunk's last) run without per-lane
// tests, and when a tile has at least CZ_RANS_WAYS points (`WIDE`) a step's local index wraps
// at most once: an issue-bound loop of a few dozen instructions per step, most of them
// settled by the `top` symbol with no renormalization (one ballot each for both).
template <typename T, bool WIDE>
__device__ __forceinline__ u64 cz_rans_lanes(const u8* c, u32 size, u32 nb, u32 cnt, u32 l, u32 ts,
                                             const uint2* top, const u8* rank, const u32* rfc,
                                             const unsigned short* rsym, const unsigned short* g_sym,
                                             const u32* g_fc, unsigned short* sy, u8* rawc, u32* bg, i64* rc,
                                             u32 li, u32 first, u32 gm) {
    const u8* b = c + 4;
    u32 x = ((u32)b[4 * li] << 24) | ((u32)b[4 * li + 1] << 16) | ((u32)b[4 * li + 2] << 8) | (u32)b[4 * li + 3];
    u32 pos = 4 * CZ_RANS_WAYS;
    const u32 before = (1u << li) - 1u;
    const u32 raw_at = 4 + nb;
    u32 nraw = 0, nbig = 0;
    l += li;
    while (l >= ts) l -= ts;
    const u32 full = cnt - cnt % CZ_RANS_WAYS;
    unsigned short* o = sy + li;
    u32 j0 = 0;
    for (; j0 < full; j0 += CZ_RANS_WAYS) {
        u32 s;
        const u32 e = cz_lanes_step<T>(true, j0 + li, x, top[l], rank, rfc, rsym, g_sym, g_fc, b, nb, pos, c,
                                       size, raw_at, rawc, bg, nraw, nbig, s, li, first, gm, before);
        if (e) return e;
        *o = (unsigned short)s;
        o += CZ_RANS_WAYS;
        l += CZ_RANS_WAYS;
        if (WIDE) {
            if (l >= ts) l -= ts;
        } else {
            while (l >= ts) l -= ts;
        }
    }
    if (j0 < cnt) {
        const u32 i = j0 + li;
        const bool act = i < cnt;
        u32 s;
        const u32 e = cz_lanes_step<T>(act, i, x, act ? top[l] : make_uint2(0, 0), rank, rfc, rsym, g_sym, g_fc,
                                       b, nb, pos, c, size, raw_at, rawc, bg, nraw, nbig, s, li, first, gm, before);
        if (e) return e;
        if (act) sy[i] = (unsigned short)s;
    }
    if (!(__all_sync(gm, x == CZ_RANS_L) && pos == nb)) return CZ_E_RANS;
    // (lane 0 reads the positions the other lanes wrote)
    __syncwarp(gm);
    if (li) return 0;
    return (u64)raw_at + (u64)nraw * sizeof(T) > size ? CZ_E_RAW : cz_rans_bigs<T>(c, size, nb, nraw, nbig, bg, rc);
}

// cz_rans_whole for coder 3, with cz_rans_post's work in the same pass (cz_rans_lanes): blocks
// of CZ_RANS_CHUNKS chunks, a group of CZ_RANS_WAYS lanes per chunk, the tables staged as there.
template <typename T>
__device__ void cz_rans_warp(const u8* stream, const u64* ent, u64 nchunks, u64 count, u32 ts, const uint2* g_top,
                             const unsigned short* g_sym, const u32* g_fc, const u8* g_rank, const u32* g_rfc,
                             const unsigned short* g_rsym, u32 ntab, u32 smem, unsigned short* syms, i64* res,
                             u8* raw, u32* bigs, u64* err) {
    const CzTables st = cz_stage_tables(g_top, g_rank, g_rfc, g_rsym, ntab, ts, smem);
    const u32 lane = threadIdx.x & 31, li = lane % CZ_RANS_WAYS, first = lane - li;
    const u32 gm = cz_group_mask(first);
    const u64 ci = (u64)blockIdx.x * CZ_RANS_CHUNKS + threadIdx.x / CZ_RANS_WAYS;
    if (ci >= nchunks) return;
    const u8* c = stream + ent[2 * ci];
    const u32 size = (u32)ent[2 * ci + 1];
    const u32 sum_w = (u32)(ent[2 * ci + 1] >> 32);
    const u64 i0 = ci * CZ_CHUNK;
    const u32 cnt = (u32)(count - i0 < (u64)CZ_CHUNK ? count - i0 : (u64)CZ_CHUNK);
    u32 nb = 0;
    u64 fail = cz_group_check(c, size, sum_w, li, gm, nb);
    if (!fail) {
        const u32 l = (u32)(i0 % ts);
        unsigned short* sy = syms + i0;
        u8* rawc = raw + i0 * sizeof(T);
        u32* bg = bigs + i0;
        i64* rc = res + i0;
        if (smem && ts >= CZ_RANS_WAYS)
            fail = cz_rans_lanes<T, true>(c, size, nb, cnt, l, ts, st.top, st.rank, st.rfc, st.rsym, g_sym, g_fc, sy,
                                          rawc, bg, rc, li, first, gm);
        else if (smem)
            fail = cz_rans_lanes<T, false>(c, size, nb, cnt, l, ts, st.top, st.rank, st.rfc, st.rsym, g_sym, g_fc,
                                           sy, rawc, bg, rc, li, first, gm);
        else
            fail = cz_rans_lanes<T, false>(c, size, nb, cnt, l, ts, g_top, g_rank, g_rfc, g_rsym, g_sym, g_fc, sy,
                                           rawc, bg, rc, li, first, gm);
    }
    if (li == 0 && fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
    }
}

// The rest of the chunks cz_rans_whole decoded (`stat` 0), one warp per chunk: a lossless
// value's bits to `raw` at its index and the positions of the big residuals in `bigs`, then
// lane 0 reads the big residuals into `res` (the other residuals are read from the symbols,
// cz_res) and checks the padding.
template <typename T>
__device__ void cz_rans_post(const u8* stream, const u64* ent, u64 nchunks, u64 count, const unsigned short* syms,
                             const u32* stat, i64* res, u8* raw, u32* bigs, u64* err) {
    u32 lane = threadIdx.x & 31;
    u64 ci = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (ci >= nchunks || stat[ci]) return;
    const u8* c = stream + ent[2 * ci];
    u32 size = (u32)ent[2 * ci + 1];
    u32 nb = *(const u32*)c;
    u64 i0 = ci * CZ_CHUNK;
    u32 cnt = (u32)(count - i0 < (u64)CZ_CHUNK ? count - i0 : (u64)CZ_CHUNK);
    const unsigned short* sy = syms + i0;
    i64* rc = res + i0;
    u8* rawc = raw + i0 * sizeof(T);
    u32* bg = bigs + i0;
    const u32 raw_at = 4 + nb;
    const u32 below = (1u << lane) - 1;
    u32 nraw = 0, nbig = 0;
    // 4 x 32 symbols a step, loaded before any is used
    for (u32 base = 0; base < cnt; base += 128) {
        u32 sv[4];
#pragma unroll
        for (int q = 0; q < 4; q++) sv[q] = base + 32 * q + lane < cnt ? sy[base + 32 * q + lane] : 0u;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            u32 j = base + 32 * q + lane;
            bool v = j < cnt;
            u32 s = sv[q];
            u32 ml = __ballot_sync(ZC_FULL, v && s == CZ_SYM_LOSSLESS);
            u32 mb = __ballot_sync(ZC_FULL, v && s == CZ_SYM_BIG);
            if (v) cz_place<T>(s, j, ml, mb, below, nraw, nbig, c, size, raw_at, rawc, bg);
            nraw += __popc(ml);
            nbig += __popc(mb);
        }
    }
    // (lane 0 reads the positions the other lanes wrote)
    __syncwarp();
    if (lane) return;
    u64 fail = (u64)raw_at + (u64)nraw * sizeof(T) > size ? CZ_E_RAW : cz_rans_bigs<T>(c, size, nb, nraw, nbig, bg, rc);
    if (fail) {
        atomicOr(&err[0], fail);
        atomicMin(&err[1], ci);
    }
}

// The residual at symbol index `si` after the chunk decoding: from `res` (cz_rans), or, when
// `syms` is given (cz_rans_whole, cz_rans_post), from the symbol there, `res` holding only the
// big residuals; 2 bytes per value read instead of 8.
__device__ __forceinline__ i64 cz_res(const i64* res, const unsigned short* syms, i64 si) {
    if (!syms) return res[si];
    u32 s = syms[si];
    return s < CZ_SYM_LOSSLESS ? (i64)s - CZ_RADIUS : s == CZ_SYM_LOSSLESS ? CZ_LOSSLESS : res[si];
}

// ---------------------------------------------------------------------------------------------
// Anchors (mod.rs decode, "anchors"): the Lorenzo inverse over the anchor grid is the n-D
// prefix sum of the anchor residuals (a lossless anchor adds 0), in wrapping integers, one
// dimension after the other. The first dimension's pass (dim 2) reads the residuals, the last
// (dim 0) also writes the anchors' values (mod.rs anchor_values).
//
// A pass splits each line of tiles along `dim` into segments of `seg` tiles, one thread per
// segment, so that a long line (a 1-D array has a single line of n / 512 tiles) is not one
// thread's serial chain: with `part_out`, each thread writes its segment's sum there (nothing
// else); cz_anchor_scan turns those sums into exclusive prefixes per line; then each thread
// adds its segment's prefix (`part_in`; null: 0, a line of one segment) to its own running sum.
// Wrapping addition is associative, so the sums are those of the CPU's one loop per line.
//
// The input of tile `t` of the pass: the residual at its anchor (first pass) or `acc[t]`.
__device__ __forceinline__ i64 cz_anchor_in(const CzGeo& g, const i64* res, const unsigned short* syms,
                                            const i64* acc, int first, i64 b, const i64 c[3], i64 t) {
    if (!first) return acc[t];
    i64 rr = cz_res(res, syms, cz_tile_offset(g, b, c));
    return rr == CZ_LOSSLESS ? 0 : rr;
}
// Line `li` of the tiles along `dim`: its volume `b`, its coordinates in the other dimensions
// (`c[dim]` 0), the tile index step along it and the index of its first tile.
struct CzLine {
    i64 b, c[3], tstep, t0;
};
__device__ __forceinline__ CzLine cz_line(const CzGeo& g, int dim, i64 li) {
    CzLine ln;
    i64 r = li;
    ln.c[0] = ln.c[1] = ln.c[2] = 0;
    if (dim != 2) {
        ln.c[2] = r % g.tiles[2];
        r /= g.tiles[2];
    }
    if (dim != 1) {
        ln.c[1] = r % g.tiles[1];
        r /= g.tiles[1];
    }
    if (dim != 0) {
        ln.c[0] = r % g.tiles[0];
        r /= g.tiles[0];
    }
    ln.b = r;
    ln.tstep = dim == 2 ? 1 : dim == 1 ? g.tiles[2] : g.tiles[1] * g.tiles[2];
    ln.t0 = cz_tile_index(g, ln.b, ln.c);
    return ln;
}
// An anchor's value from its accumulated code (mod.rs anchor_values).
template <typename T> __device__ __forceinline__ double cz_anchor_value(i64 s, double step) {
    const double a = sizeof(T) == 4 ? (double)((float)(i32)s * (float)step) : (double)s * step;
    return zc_isfinite(a) ? a : 0.0;
}
template <typename T>
__device__ void cz_anchors(const i64* geo, const i64* res, const unsigned short* syms, i64* acc, double* vals, int dim,
                           int first, int last, double step, i64 seg, const i64* part_in, i64* part_out) {
    const CzGeo g = cz_geo(geo);
    i64 len = g.tiles[dim];
    if (len == 0 || seg <= 0) return;
    i64 nseg = (len + seg - 1) / seg;
    i64 lines = g.ntiles / len;
    i64 id = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= lines * nseg) return;
    i64 li = id / nseg;
    i64 k0 = (id - li * nseg) * seg;
    i64 k1 = k0 + seg < len ? k0 + seg : len;
    const CzLine ln = cz_line(g, dim, li);
    const i64 b = ln.b, c0 = ln.c[0], c1 = ln.c[1], c2 = ln.c[2], tstep = ln.tstep, t0 = ln.t0;
    i64 s = part_in ? part_in[id] : 0;
    // 8 inputs loaded before any is added, so that the loads of a segment overlap
    for (i64 k = k0; k < k1; k += 8) {
        i64 v[8];
#pragma unroll
        for (int q = 0; q < 8; q++) {
            i64 kk = k + q;
            i64 c[3] = {dim == 0 ? kk : c0, dim == 1 ? kk : c1, dim == 2 ? kk : c2};
            v[q] = kk < k1 ? cz_anchor_in(g, res, syms, acc, first, b, c, t0 + kk * tstep) : 0;
        }
        if (part_out) {
#pragma unroll
            for (int q = 0; q < 8; q++) s = (i64)((u64)s + (u64)v[q]);
            continue;
        }
#pragma unroll
        for (int q = 0; q < 8; q++) {
            i64 kk = k + q;
            if (kk >= k1) break;
            i64 t = t0 + kk * tstep;
            s = (i64)((u64)s + (u64)v[q]);
            acc[t] = s;
            if (last) vals[t] = cz_anchor_value<T>(s, step);
        }
    }
    if (part_out) part_out[id] = s;
}
// A pass of cz_anchors over lines of one segment (every line of a 2-D or 3-D array of usual
// sizes: at most 64 tiles), a warp per line rather than a thread: each lane takes a position
// of 32 consecutive ones and the warp's inclusive scan gives their sums, so the line's inputs
// are loaded at once instead of one thread's chain of loads. Wrapping addition is associative:
// the sums are cz_anchors' (and the CPU's).
template <typename T>
__device__ void cz_anchor_lines(const i64* geo, const i64* res, const unsigned short* syms, i64* acc, double* vals,
                                int dim, int first, int last, double step) {
    const CzGeo g = cz_geo(geo);
    const i64 len = g.tiles[dim];
    if (len == 0) return;
    const i64 li = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    // (a whole warp leaves together: the shuffles below need every lane)
    if (li >= g.ntiles / len) return;
    const CzLine ln = cz_line(g, dim, li);
    i64 carry = 0;
    for (i64 k0 = 0; k0 < len; k0 += 32) {
        const i64 kk = k0 + lane;
        const i64 t = ln.t0 + kk * ln.tstep;
        i64 c[3] = {dim == 0 ? kk : ln.c[0], dim == 1 ? kk : ln.c[1], dim == 2 ? kk : ln.c[2]};
        i64 v = kk < len ? cz_anchor_in(g, res, syms, acc, first, ln.b, c, t) : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const i64 u = __shfl_up_sync(ZC_FULL, v, o);
            if (lane >= o) v = (i64)((u64)v + (u64)u);
        }
        v = (i64)((u64)v + (u64)carry);
        if (kk < len) {
            acc[t] = v;
            if (last) vals[t] = cz_anchor_value<T>(v, step);
        }
        carry = __shfl_sync(ZC_FULL, v, 31);
    }
}

// ---------------------------------------------------------------------------------------------
// A warp's array of 64-bit words in shared memory (its box of values, its tile offsets), by its
// address in the shared window, read and written by explicit shared loads and stores. Through a plain pointer into a __shared__ array
// the compiler recomputes the array's window address (the block's cluster rank, a shift, the
// warp's offset) at each access of a walk's points, a few instructions each time; the address
// held in a register costs nothing after the first. The accesses are ordered (volatile, with a
// memory clobber) as the pointer accesses they replace.
struct CzBox {
    u32 at;
    __device__ __forceinline__ explicit CzBox(const void* p) {
        at = (u32)__cvta_generic_to_shared(p);
        asm volatile("" : "+r"(at));
    }
    __device__ __forceinline__ double operator[](int i) const {
        double v;
        asm volatile("ld.shared.f64 %0, [%1];" : "=d"(v) : "r"(at + 8u * (u32)i) : "memory");
        return v;
    }
    // Word `i`'s bits (cz_box_load's input values, a tile offset).
    __device__ __forceinline__ u64 bits(int i) const {
        u64 v;
        asm volatile("ld.shared.u64 %0, [%1];" : "=l"(v) : "r"(at + 8u * (u32)i) : "memory");
        return v;
    }
    __device__ __forceinline__ void set(int i, double v) const {
        asm volatile("st.shared.f64 [%0], %1;" ::"r"(at + 8u * (u32)i), "d"(v) : "memory");
    }
};

// ---------------------------------------------------------------------------------------------
// Interpolation (interp.rs predict / multi_prediction, f64 domain).
template <typename B>
__device__ __forceinline__ double cz_predict(const B& buf, int idx, int c, int len, int s, int st, int sp) {
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

// v[i] of a three-element array, by selection: a runtime index into a local array would put
// the array in local memory.
__device__ __forceinline__ int cz_pick(const int v[3], int i) { return i == 0 ? v[0] : i == 1 ? v[1] : v[2]; }

// The prediction along dimension `a` (a runtime value) of the point at `idx`.
template <typename B>
__device__ __forceinline__ double cz_predict_along(const B& buf, int idx, const int x[3], const int e[3],
                                                   const int st[3], int s, int a, const int sp[3]) {
    return cz_predict(buf, idx, cz_pick(x, a), cz_pick(e, a), s, cz_pick(st, a), cz_pick(sp, a));
}

template <typename B>
__device__ __forceinline__ double cz_multi(const B& buf, int idx, const int x[3], const int e[3], const int st[3],
                                           int s, int mask, const int sp[3]) {
    double p0 = 0.0, p1 = 0.0, p2 = 0.0;
    int n = 0;
#pragma unroll
    for (int a = 0; a < 3; a++) {
        if ((mask >> a & 1) && x[a] + s < e[a]) {
            double p = cz_predict(buf, idx, x[a], e[a], s, st[a], sp[a]);
            if (n == 0) p0 = p;
            else if (n == 1) p1 = p;
            else p2 = p;
            n++;
        }
    }
    if (n == 0) return cz_predict_along(buf, idx, x, e, st, s, __ffs(mask) - 1, sp);
    if (n == 1) return p0;
    if (n == 2) return (p0 + p1) * 0.5;
    return (p0 + p1 + p2) / 3.0;
}

// The box of tile (b, c) (mod.rs Tiles): its extents `e`, owned extents `own`, strides `st`
// in the box, its first symbol index `base` and its origin's index in the array `origin`.
__device__ __forceinline__ void cz_tile_box(const CzGeo& g, i64 b, const i64 c[3], int e[3], int own[3], int st[3],
                                            i64& base, i64& origin) {
    i64 o[3];
    for (int d = 0; d < 3; d++) {
        e[d] = (int)cz_boxed(g, d, c[d]);
        own[d] = (int)cz_owned(g, d, c[d]);
        o[d] = c[d] * g.S;
    }
    st[0] = e[1] * e[2];
    st[1] = e[2];
    st[2] = 1;
    base = cz_tile_offset(g, b, c);
    origin = b * g.vol + (o[0] * g.n[1] + o[1]) * g.n[2] + o[2];
}

// Whether every point of a box of extents `e` lies within 2^32 - 1 elements of the box's origin
// in the array ((e0 - 1) n1 n2 + (e1 - 1) n2 + e2 - 1), so that its offset from there is
// computed in 32 bits.
__device__ __forceinline__ bool cz_box_offsets_fit(const CzGeo& g, const int e[3]) {
    const i64 last = ((i64)(e[0] - 1) * g.n[1] + (e[1] - 1)) * g.n[2] + (e[2] - 1);
    return last <= (i64)0xFFFFFFFFll;
}
// The tile's anchors in the warp's box `buf` (interp.rs place_anchors, lanes 0..8, one corner
// each); a warp barrier after it.
__device__ __forceinline__ void cz_box_anchors(const CzGeo& g, i64 b, const i64 c[3], const int e[3], const int st[3],
                                               const double* vals, int lane, double* buf) {
    const int S = (int)g.S;
    if (lane < 8) {
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
}

// Walk `w` of the geometry words (interp.rs walks: CZ_WALK_WORDS each) in a box of extents `e`:
// its stride `s`, first point, steps, kind (`multi`, `am` the dimension or mask), splines and
// point counts.
struct CzWalk {
    int s, start[3], stp[3], multi, am, sp[3], cnt[3], total;
    // cz_div's multipliers for cnt[2] and cnt[1]
    u32 m2, m1;
};
// The multiplier of cz_div for divisor c >= 1: ceil(2^32 / c) (unused, 0, for c = 1).
__device__ __forceinline__ u32 cz_magic(int c) { return c > 1 ? 0xFFFFFFFFu / (u32)c + 1u : 0u; }
// k / c for k < 2^16 and 1 <= c < 2^16 by a multiplication: with m = ceil(2^32 / c) =
// (2^32 + e) / c, e < c, k m / 2^32 = k / c + k e / (c 2^32) exceeds k / c by less than 1 / c (as
// k e < 2^32), so its floor is k / c's. A walk has at most 729 points (a 3-D box), far below 2^16, and one
// multiplication replaces the about 20 instructions of a runtime division.
__device__ __forceinline__ int cz_div(int k, int c, u32 m) { return c > 1 ? (int)__umulhi((u32)k, m) : k; }
__device__ __forceinline__ void cz_walk(const i64* geo, int w, const int e[3], CzWalk& r) {
    const i64* wk = geo + CZ_G_WALKS + CZ_WALK_WORDS * w;
    r.s = (int)wk[0];
    for (int d = 0; d < 3; d++) r.start[d] = (int)wk[1 + d];
    for (int d = 0; d < 3; d++) r.stp[d] = (int)wk[4 + d];
    r.multi = (int)wk[7];
    r.am = (int)wk[8];
    for (int d = 0; d < 3; d++) r.sp[d] = (int)wk[9 + d];
    // (the steps are s or 2 s, powers of two as the anchor stride: a shift divides by them)
    for (int d = 0; d < 3; d++)
        r.cnt[d] = r.start[d] < e[d] ? ((e[d] - 1 - r.start[d]) >> (__ffs(r.stp[d]) - 1)) + 1 : 0;
    r.total = r.cnt[0] * r.cnt[1] * r.cnt[2];
    r.m2 = cz_magic(r.cnt[2]);
    r.m1 = cz_magic(r.cnt[1]);
}
// Point `k` of the walk: its coordinates `x` in the box; returns its index in the box.
__device__ __forceinline__ int cz_walk_point(const CzWalk& w, const int st[3], int k, int x[3]) {
    // (k / (c2 c1) = (k / c2) / c1)
    int q2 = cz_div(k, w.cnt[2], w.m2);
    int q1 = cz_div(q2, w.cnt[1], w.m1);
    x[2] = w.start[2] + (k - q2 * w.cnt[2]) * w.stp[2];
    x[1] = w.start[1] + (q2 - q1 * w.cnt[1]) * w.stp[1];
    x[0] = w.start[0] + q1 * w.stp[0];
    return x[0] * st[0] + x[1] * st[1] + x[2];
}
// Walks with points in one box, at most: 3-D 3 levels x 7, 2-D 4 x 3, 1-D 9 x 1 (a walk along
// an extent of 1 has none; a test of src/gpu/cuszi/ checks the bound).
#define CZ_MAXWALKS 24
// The walks of a box of extents `e` that have points, in order, into the warp's `sw` (two words
// of 16 bytes per walk, cz_walks reads them); returns their number. Each lane sets up one walk
// (its point counts take runtime divisions), so a tile pays for its walks once and in parallel
// rather than once per walk in the warp's serial loop. A warp barrier after it.
__device__ __forceinline__ int cz_walks_prep(const i64* geo, int nw, const int e[3], int lane, uint4* sw) {
    int n = 0;
    for (int base = 0; base < nw; base += 32) {
        int w = base + lane;
        CzWalk wk;
        bool live = false;
        if (w < nw) {
            cz_walk(geo, w, e, wk);
            live = wk.total > 0;
        }
        u32 bal = __ballot_sync(ZC_FULL, live);
        if (live) {
            int at = n + __popc(bal & ((1u << lane) - 1));
            // (s <= 256, starts and steps <= 512, counts <= 729: 16 bits each)
            sw[2 * at] = make_uint4((u32)wk.s | (u32)wk.multi << 16 | (u32)wk.am << 17 | (u32)wk.sp[0] << 20 |
                                        (u32)wk.sp[1] << 22 | (u32)wk.sp[2] << 24,
                                    (u32)wk.start[0] | (u32)wk.start[1] << 16, (u32)wk.start[2] | (u32)wk.stp[0] << 16,
                                    (u32)wk.stp[1] | (u32)wk.stp[2] << 16);
            sw[2 * at + 1] = make_uint4((u32)wk.cnt[0] | (u32)wk.cnt[1] << 16, (u32)wk.cnt[2] | (u32)wk.total << 16,
                                        wk.m2, wk.m1);
        }
        n += __popc(bal);
    }
    __syncwarp();
    return n;
}
// Walk `w` of cz_walks_prep's `sw`.
__device__ __forceinline__ void cz_walk_load(const uint4* sw, int w, CzWalk& r) {
    uint4 a = sw[2 * w], b = sw[2 * w + 1];
    r.s = (int)(a.x & 0xFFFF);
    r.multi = (int)(a.x >> 16 & 1);
    r.am = (int)(a.x >> 17 & 7);
    r.sp[0] = (int)(a.x >> 20 & 3);
    r.sp[1] = (int)(a.x >> 22 & 3);
    r.sp[2] = (int)(a.x >> 24 & 3);
    r.start[0] = (int)(a.y & 0xFFFF);
    r.start[1] = (int)(a.y >> 16);
    r.start[2] = (int)(a.z & 0xFFFF);
    r.stp[0] = (int)(a.z >> 16);
    r.stp[1] = (int)(a.w & 0xFFFF);
    r.stp[2] = (int)(a.w >> 16);
    r.cnt[0] = (int)(b.x & 0xFFFF);
    r.cnt[1] = (int)(b.x >> 16);
    r.cnt[2] = (int)(b.y & 0xFFFF);
    r.total = (int)(b.y >> 16);
    r.m2 = b.z;
    r.m1 = b.w;
}

// The points of walk `wk` shared by the warp's lanes: `point(idx, x)` with each point's index in
// the box and its coordinates.
template <typename F>
__device__ __forceinline__ void cz_walk_points(const CzWalk& wk, const int st[3], int lane, F point) {
    for (int k = lane; k < wk.total; k += 32) {
        int x[3];
        int idx = cz_walk_point(wk, st, k, x);
        point(idx, x);
    }
}

// Whether walk words `a` and `b` (cz_walks_prep's first words of two walks) are mean walks of
// one level and one stage (as many odd dimensions): such walks read only points of coarser
// levels and of earlier stages (a neighbour along an odd dimension has that dimension even),
// never each other's, so their points can be coded in any order.
__device__ __forceinline__ bool cz_same_stage(u32 a, u32 b) {
    return (a & 0x1FFFFu) == (b & 0x1FFFFu) && (a >> 16 & 1) && __popc(a >> 17 & 7) == __popc(b >> 17 & 7);
}

// The walks of a tile's box (interp.rs walks, the `nw` of cz_walks_prep's `sw` that have
// points, in order), the warp's lanes sharing each walk's points (independent of each other):
// `pre(idx, x)` runs first at each point (given its index in the box and its coordinates: the
// caller's global loads of the point, issued before the prediction so that their latency
// overlaps its shared loads and arithmetic), then `point(idx, x, p, got)` with its prediction
// `p` and what `pre` returned; a
// warp barrier after each walk, whose points the next walks read. The point loop is written
// once per kind of walk (a mean over dimensions, or a pass along dimension 0, 1 or 2, each the
// same for all of a walk's points): the pass's dimension is then a constant inside its loop,
// where a runtime dimension would cost a selection per coordinate, extent and stride at every
// point. The mean walks of one stage (cz_same_stage; up to 3) share one loop over all their
// points, each lane finding its point's walk: the coarse levels' walks have a few points each
// (4, 2 and 1 in a 9^3 box at stride 4), and one loop over a stage's points leaves fewer lanes
// idle than a loop per walk.
template <typename P, typename F>
__device__ __forceinline__ void cz_walks(const uint4* sw, int nw, const CzBox& buf, const int e[3], const int st[3],
                                         int lane, P pre, F point) {
    for (int w = 0; w < nw;) {
        CzWalk wk;
        cz_walk_load(sw, w, wk);
        int n = 1;
        if (wk.multi) {
            // the stage's walks: w .. w + n - 1, with t0, t1 points in the first two
            const u32 head = sw[2 * w].x;
            int t0 = wk.total, t1 = 0, t2 = 0;
            if (w + 1 < nw && cz_same_stage(head, sw[2 * (w + 1)].x)) {
                n = 2;
                t1 = (int)(sw[2 * (w + 1) + 1].y >> 16);
                if (w + 2 < nw && cz_same_stage(head, sw[2 * (w + 2)].x)) {
                    n = 3;
                    t2 = (int)(sw[2 * (w + 2) + 1].y >> 16);
                }
            }
            const int total = t0 + t1 + t2;
            for (int k = lane; k < total; k += 32) {
                int j = k, v = w;
                if (j >= t0) {
                    j -= t0;
                    v++;
                    if (j >= t1) {
                        j -= t1;
                        v++;
                    }
                }
                CzWalk sub;
                cz_walk_load(sw, v, sub);
                int x[3];
                int idx = cz_walk_point(sub, st, j, x);
                const auto got = pre(idx, x);
                point(idx, x, cz_multi(buf, idx, x, e, st, sub.s, sub.am, sub.sp), got);
            }
        } else if (wk.am == 0) {
            cz_walk_points(wk, st, lane, [&](int idx, const int x[3]) {
                const auto got = pre(idx, x);
                point(idx, x, cz_predict(buf, idx, x[0], e[0], wk.s, st[0], wk.sp[0]), got);
            });
        } else if (wk.am == 1) {
            cz_walk_points(wk, st, lane, [&](int idx, const int x[3]) {
                const auto got = pre(idx, x);
                point(idx, x, cz_predict(buf, idx, x[1], e[1], wk.s, st[1], wk.sp[1]), got);
            });
        } else {
            cz_walk_points(wk, st, lane, [&](int idx, const int x[3]) {
                const auto got = pre(idx, x);
                point(idx, x, cz_predict(buf, idx, x[2], e[2], wk.s, st[2], wk.sp[2]), got);
            });
        }
        w += n;
        __syncwarp();
    }
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

// A point of a decoded tile found before its prediction (cz_tiles): its symbol index, its
// symbol and whether the tile owns it.
struct CzAt {
    i64 si;
    u32 sym;
    bool owned;
};
// Tiles (mod.rs Tiles::decode, abs / noa): one warp per tile, its box of reconstructed values
// in shared memory; the points of one walk are independent, so the lanes share each walk and
// meet at a warp barrier between walks. Owned points are written straight to the array.
template <typename T>
__device__ void cz_tiles(const i64* geo, const i64* res, const unsigned short* syms, const u8* raw, const i64* acc,
                         const double* vals,
                         double step, T* out) {
    __shared__ double sbuf[CZ_TILE_WARPS][CZ_MAXBOX];
    __shared__ i64 sbase[CZ_TILE_WARPS][8];
    __shared__ uint4 swalk[CZ_TILE_WARPS][2 * CZ_MAXWALKS];
    const CzGeo g = cz_geo(geo);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    i64 t = (i64)blockIdx.x * CZ_TILE_WARPS + warp;
    if (t >= g.ntiles) return;
    double* buf = sbuf[warp];
    i64 c[3];
    i64 b = cz_tile_coords(g, t, c);
    int e[3], own[3], st[3];
    i64 base, origin;
    cz_tile_box(g, b, c, e, own, st, base, origin);
    // A halo point is local coordinate 0 of the next tile along its halo dimensions: the first
    // symbol index of this tile and of its next tiles along each set of dimensions (bit d of
    // the set for dimension d; a tile past the volume is never looked up), and the owned
    // extents of the next tiles, found once per tile rather than per halo point.
    if (lane < 8) {
        i64 cn[3];
        for (int d = 0; d < 3; d++) cn[d] = c[d] + (lane >> d & 1);
        sbase[warp][lane] = cz_tile_offset(g, b, cn);
    }
    int onx[3];
    for (int d = 0; d < 3; d++) onx[d] = (int)cz_owned(g, d, c[d] + 1);
    // (the box is not cleared first: a prediction reads only points that the anchors and the
    // earlier walks have written, as in cz_box_load)
    cz_box_anchors(g, b, c, e, st, vals, lane, buf);
    int nw = cz_walks_prep(geo, (int)geo[CZ_G_NWALKS], e, lane, swalk[warp]);
    // The tile's values in the array, at offsets (x0 n1 + x1) n2 + x2 from its origin: in 32
    // bits when every offset of the box fits (3-D: n1 n2 below 2^29; 2-D: rows below 2^28
    // values; 1-D: always), as 64-bit products cost several instructions per point.
    T* const tout = out + origin;
    const bool narrow = cz_box_offsets_fit(g, e);
    const u32 row = (u32)g.n[2], plane = (u32)(g.n[1] * g.n[2]);
    const CzBox box(buf), bases(sbase[warp]);
    // (before the prediction: the point's symbol index, its symbol, whether the tile owns it)
    auto at = [&](int, const int x[3]) {
        int hm = (x[0] >= own[0]) | (x[1] >= own[1]) << 1 | (x[2] >= own[2]) << 2;
        int l0 = hm & 1 ? 0 : x[0], l1 = hm & 2 ? 0 : x[1], l2 = hm & 4 ? 0 : x[2];
        int on1 = hm & 2 ? onx[1] : own[1], on2 = hm & 4 ? onx[2] : own[2];
        CzAt a;
        // (a local index below the box's 729 points: unsigned, so that its addition to the
        // tile's 64-bit offset needs no sign extension)
        a.si = (i64)bases.bits(hm) + (u32)((l0 * on1 + l1) * on2 + l2);
        a.sym = syms ? (u32)syms[a.si] : CZ_SYM_BIG;
        a.owned = hm == 0;
        return a;
    };
    cz_walks(swalk[warp], nw, box, e, st, lane, at, [&](int idx, const int x[3], double p, const CzAt& a) {
        const i64 si = a.si;
        const u32 sym = a.sym;
        const bool owned = a.owned;
        // The residual (cz_res): a small one, nearly every point's, straight from its symbol in
        // 32-bit arithmetic; a big or lossless one through `res`.
        bool lossless = false;
        double rd;
        if (sym < CZ_SYM_LOSSLESS) {
            rd = (double)((int)sym - (int)CZ_RADIUS);
        } else {
            const i64 r = sym == CZ_SYM_LOSSLESS ? CZ_LOSSLESS : res[si];
            lossless = r == CZ_LOSSLESS;
            rd = (double)r;
        }
        double v;
        T val;
        if (lossless) {
            v = zc_isfinite(p) ? p : 0.0;
            if (owned) val = cz_from_bits<T>(raw + si * sizeof(T));
        } else {
            // quant.rs ResidualQuantizer::decode
            val = (T)(p + rd * step);
            v = (double)val;
        }
        if (owned) {
            if (narrow) {
                tout[(u32)x[0] * plane + (u32)x[1] * row + (u32)x[2]] = val;
            } else {
                tout[(x[0] * g.n[1] + x[1]) * g.n[2] + x[2]] = val;
            }
        }
        box.set(idx, v);
    });
    if (lane == 0) {
        T val;
        if (cz_res(res, syms, base) == CZ_LOSSLESS) {
            val = cz_from_bits<T>(raw + base * sizeof(T));
        } else if (sizeof(T) == 4) {
            val = (T)((float)(i32)acc[t] * (float)step);
        } else {
            val = (T)((double)acc[t] * step);
        }
        out[origin] = val;
    }
}

// =============================================================================================
// Encoder (mod.rs encode): range, anchors, sampling sums, tile residuals with the per-class
// histogram, chunk coding, placement and hashes.

// Per element type: QMAX (element.rs), and the order key of a finite value (min/max by atomics).
template <typename T> struct CzT;
template <> struct CzT<float> {
    static constexpr double QMAX = 536870912.0;  // 2^29
    typedef u32 Bits;
};
template <> struct CzT<double> {
    static constexpr double QMAX = 2305843009213693952.0;  // 2^61
    typedef u64 Bits;
};
__device__ __forceinline__ u64 cz_key(double v) {
    u64 b = (u64)__double_as_longlong(v);
    return (b >> 63) ? ~b : (b | (1ull << 63));
}
template <typename T> __device__ __forceinline__ u64 cz_bits(T v);
template <> __device__ __forceinline__ u64 cz_bits<float>(float v) { return __float_as_uint(v); }
template <> __device__ __forceinline__ u64 cz_bits<double>(double v) { return (u64)__double_as_longlong(v); }
template <typename T> __device__ __forceinline__ T cz_rint(T v);
template <> __device__ __forceinline__ float cz_rint<float>(float v) { return rintf(v); }
template <> __device__ __forceinline__ double cz_rint<double>(double v) { return rint(v); }
// element.rs from_code: f32 codes go through i32
template <typename T> __device__ __forceinline__ T cz_from_code(i64 q);
template <> __device__ __forceinline__ float cz_from_code<float>(i64 q) { return (float)(i32)q; }
template <> __device__ __forceinline__ double cz_from_code<double>(i64 q) { return (double)q; }

// Value `x` folded into the running key range [lo, hi] (when finite).
template <typename T> __device__ __forceinline__ void cz_range_add(T x, u64& lo, u64& hi) {
    double v = (double)x;
    if (zc_isfinite(v)) {
        u64 k = cz_key(v);
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
}
// Finite range of the input (quant.rs finite_range): ws[0] min key, ws[1] max key. 16-byte
// loads where the input is 16-byte aligned: fewer load and index instructions per value in a
// pass bound by them (the order of the values does not change a minimum).
template <typename T> __device__ void cz_range(const T* x, u64 n, u64* ws) {
    u64 lo = ~0ull, hi = 0;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (u64)gridDim.x * blockDim.x;
    constexpr u64 per = 16 / sizeof(T);
    u64 head = 0;
    if (((u64)x & 15) == 0) {
        head = n / per * per;
        const uint4* v4 = (const uint4*)x;
        for (u64 i = tid; i < n / per; i += nt) {
            const uint4 w = v4[i];
            const T* t = (const T*)&w;
#pragma unroll
            for (u64 q = 0; q < per; q++) cz_range_add<T>(t[q], lo, hi);
        }
    }
    for (u64 i = head + tid; i < n; i += nt) cz_range_add<T>(x[i], lo, hi);
    for (int s = 16; s >= 1; s >>= 1) {
        u64 a = __shfl_xor_sync(ZC_FULL, lo, s), b = __shfl_xor_sync(ZC_FULL, hi, s);
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&ws[0], lo);
        atomicMax(&ws[1], hi);
    }
}

// quant.rs Quantizer::encode (abs / noa, no fill value): the code of x, or LOSSLESS.
template <typename T> __device__ __forceinline__ i64 cz_qencode(T x, double step64, double eb) {
    if (!zc_isfinite(x)) return CZ_LOSSLESS;
    T step = (T)step64;
    T inv = (T)(1.0 / (double)step);
    T p = x * inv;
    if (!((double)fabs((double)p) < CzT<T>::QMAX)) return CZ_LOSSLESS;
    i64 q = (i64)cz_rint<T>(p);
    T r = cz_from_code<T>(q) * step;
    double xv = (double)x, rv = (double)r;
    double d = fabs(xv - rv);
    if (sizeof(T) == 4) return d <= eb ? q : CZ_LOSSLESS;
    double a = fabs(xv), b = fabs(rv);
    bool exact = rv == 0.0 || ((xv < 0.0) == (rv < 0.0) && b * 0.5 <= a && a <= b * 2.0);
    return (exact && d <= eb) ? q : CZ_LOSSLESS;
}

// Anchor codes and their Lorenzo residuals (mod.rs predict, "anchors"). A lossless anchor
// stands for its prediction in the anchor buffer `acc`; every other anchor for its code `cod`.
// cz_anchor_codes writes both (flag bit 1: some anchor is lossless); cz_anchor_lossless gives
// the lossless ones their predictions in tile order (each depends on earlier tiles only);
// cz_anchor_res computes every residual in parallel from `acc`. A residual equal to LOSSLESS
// (which makes that anchor lossless too: flag bit 2) sends the whole sequence to
// cz_anchor_serial, the CPU's loop on one thread.
template <typename T>
__device__ void cz_anchor_codes(const T* x, const i64* geo, double step, double eb, i64* cod, i64* acc, u64* flag) {
    const CzGeo g = cz_geo(geo);
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= g.ntiles) return;
    i64 c[3];
    i64 b = cz_tile_coords(g, t, c);
    i64 gi = b * g.vol + (c[0] * g.S * g.n[1] + c[1] * g.S) * g.n[2] + c[2] * g.S;
    i64 v = cz_qencode<T>(x[gi], step, eb);
    cod[t] = v;
    acc[t] = v;
    if (v == CZ_LOSSLESS) atomicOr(flag, 1ull);
}
__device__ __forceinline__ i64 cz_lorenzo(const CzGeo& g, i64 b, const i64 c[3], const i64* a) {
    // interp.rs anchor_prediction
    i64 p = 0;
    for (int m = 1; m < 8; m++) {
        bool out = false;
        i64 t[3];
        for (int d = 0; d < 3; d++) {
            if ((m >> d & 1) && c[d] == 0) out = true;
            t[d] = c[d] - (m >> d & 1);
        }
        if (out) continue;
        u64 v = (u64)a[cz_tile_index(g, b, t)];
        p = (__popc(m) & 1) ? (i64)((u64)p + v) : (i64)((u64)p - v);
    }
    return p;
}
// One block of 1024 threads: the lossless anchors in tile order (a lossless anchor's code is
// its Lorenzo prediction from the codes before it, so they chain). Each thread counts those of
// its run of consecutive tiles, a block scan places the runs, each thread lists its own in
// `list` (`ntiles` words), then thread 0 visits the list. The block reads every code once or
// twice rather than stepping through the tiles 1,024 at a time with three barriers each.
extern "C" __global__ void __launch_bounds__(1024)
    cz_anchor_lossless(const i64* geo, const i64* cod, i64* acc, const u64* flag, u32* list) {
    __shared__ u32 wsum[32];
    __shared__ u32 total;
    if (!(flag[0] & 1)) return;
    const CzGeo g = cz_geo(geo);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 per = (g.ntiles + 1023) / 1024;
    const i64 lo = min(g.ntiles, per * (i64)threadIdx.x), hi = min(g.ntiles, lo + per);
    u32 n = 0;
    for (i64 t = lo; t < hi; t++) n += cod[t] == CZ_LOSSLESS;
    const u32 inc = warp_incl_u32(n, lane);
    if (lane == 31) wsum[warp] = inc;
    __syncthreads();
    u32 at = inc - n;
    for (int w = 0; w < warp; w++) at += wsum[w];
    if (threadIdx.x == 1023) total = at + n;
    for (i64 t = lo; t < hi && n; t++)
        if (cod[t] == CZ_LOSSLESS) list[at++] = (u32)t;
    __syncthreads();
    if (threadIdx.x) return;
    for (u32 k = 0; k < total; k++) {
        const i64 tt = list[k];
        i64 c[3];
        const i64 b = cz_tile_coords(g, tt, c);
        acc[tt] = cz_lorenzo(g, b, c, acc);
    }
}
extern "C" __global__ void cz_anchor_res(const i64* geo, const i64* cod, const i64* acc, i64* ares, u64* flag) {
    const CzGeo g = cz_geo(geo);
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= g.ntiles) return;
    i64 v = cod[t];
    if (v == CZ_LOSSLESS) {
        ares[t] = CZ_LOSSLESS;
        return;
    }
    i64 c[3];
    i64 b = cz_tile_coords(g, t, c);
    i64 r = (i64)((u64)v - (u64)cz_lorenzo(g, b, c, acc));
    ares[t] = r;
    if (r == CZ_LOSSLESS) atomicOr(flag, 2ull);
}
// One thread, in tile order, as the CPU (only under flag bit 2).
extern "C" __global__ void cz_anchor_serial(const i64* geo, const i64* cod, i64* acc, i64* ares, const u64* flag) {
    if (!(flag[0] & 2) || threadIdx.x || blockIdx.x) return;
    const CzGeo g = cz_geo(geo);
    for (i64 t = 0; t < g.ntiles; t++) {
        i64 c[3];
        i64 b = cz_tile_coords(g, t, c);
        i64 v = cod[t];
        i64 p = cz_lorenzo(g, b, c, acc);
        i64 r = (i64)((u64)v - (u64)p);
        if (v == CZ_LOSSLESS || r == CZ_LOSSLESS) {
            acc[t] = p;
            ares[t] = CZ_LOSSLESS;
        } else {
            acc[t] = v;
            ares[t] = r;
        }
    }
}
// mod.rs anchor_values
template <typename T> __device__ void cz_anchor_vals(const i64* geo, const i64* acc, double step, double* vals) {
    const CzGeo g = cz_geo(geo);
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= g.ntiles) return;
    double a = (double)(cz_from_code<T>(acc[t]) * (T)step);
    vals[t] = zc_isfinite(a) ? a : 0.0;
}

// interp.rs err_units
__device__ __forceinline__ u64 cz_err_units(double v, double p, double scale) {
    double e = fmin(fabs(v - p) * scale * 16.0, 1099511627776.0);
    return (u64)e;
}

// Sampling (interp.rs choose_levels): block j fills the box of tile j * k with the values (NaN
// where not finite) and adds, per level, the error sums. Phase 1 (`cfg` null): err[lv][a][sp]
// of every spline along every dimension; phase 2: with cfg[lv] = order[0..3], spline[0..3],
// err[lv][0] by passes and err[lv][1] by means.
template <typename T>
__device__ void cz_sample(const T* x, const i64* geo, i64 k, double scale, const i64* cfg, u64* err) {
    __shared__ double buf[CZ_MAXBOX];
    __shared__ unsigned long long sums[16][9];
    const CzGeo g = cz_geo(geo);
    i64 t = (i64)blockIdx.x * k;
    if (t >= g.ntiles) return;
    i64 c[3];
    i64 b = cz_tile_coords(g, t, c);
    int e[3];
    i64 o[3];
    for (int d = 0; d < 3; d++) {
        e[d] = (int)cz_boxed(g, d, c[d]);
        o[d] = c[d] * g.S;
    }
    const int st[3] = {e[1] * e[2], e[2], 1};
    int nbox = e[0] * e[1] * e[2];
    for (int i = threadIdx.x; i < nbox; i += blockDim.x) {
        int x0 = i / st[0], x1 = (i / st[1]) % e[1], x2 = i % e[2];
        double v = (double)x[b * g.vol + ((o[0] + x0) * g.n[1] + o[1] + x1) * g.n[2] + o[2] + x2];
        buf[i] = zc_isfinite(v) ? v : __longlong_as_double(0x7ff8000000000000ll);
    }
    for (int i = threadIdx.x; i < 16 * 9; i += blockDim.x) sums[i / 9][i % 9] = 0;
    __syncthreads();
    int lv = 0;
    for (int s = (int)g.S / 2; s >= 1; s /= 2, lv++) {
        for (int mask = 1; mask < 8; mask++) {
            int cnt[3], start[3];
            for (int d = 0; d < 3; d++) {
                start[d] = (mask >> d & 1) * s;
                cnt[d] = start[d] < e[d] ? (e[d] - 1 - start[d]) / (2 * s) + 1 : 0;
            }
            int total = cnt[0] * cnt[1] * cnt[2];
            int last = 0, sp[3] = {0, 0, 0};
            if (cfg) {
                for (int j = 2; j >= 0; j--) {
                    int a = (int)cfg[lv * 6 + j];
                    if (mask >> a & 1) {
                        last = a;
                        break;
                    }
                }
                for (int d = 0; d < 3; d++) sp[d] = (int)cfg[lv * 6 + 3 + d];
            }
            for (int kk = threadIdx.x; kk < total; kk += blockDim.x) {
                int xx[3];
                xx[2] = start[2] + (kk % cnt[2]) * 2 * s;
                xx[1] = start[1] + ((kk / cnt[2]) % cnt[1]) * 2 * s;
                xx[0] = start[0] + (kk / (cnt[2] * cnt[1])) * 2 * s;
                int idx = xx[0] * st[0] + xx[1] * st[1] + xx[2];
                double v = buf[idx];
                if (!cfg) {
                    for (int a = 0; a < 3; a++) {
                        if (!(mask >> a & 1)) continue;
                        double p0 = cz_predict(buf, idx, xx[a], e[a], s, st[a], 0);
                        double p1 = cz_predict(buf, idx, xx[a], e[a], s, st[a], 1);
                        double p2 = cz_predict(buf, idx, xx[a], e[a], s, st[a], 2);
                        if (zc_isfinite(v) && zc_isfinite(p0) && zc_isfinite(p1) && zc_isfinite(p2)) {
                            atomicAdd(&sums[lv][a * 3 + 0], cz_err_units(v, p0, scale));
                            atomicAdd(&sums[lv][a * 3 + 1], cz_err_units(v, p1, scale));
                            atomicAdd(&sums[lv][a * 3 + 2], cz_err_units(v, p2, scale));
                        }
                    }
                } else {
                    double p = cz_predict_along(buf, idx, xx, e, st, s, last, sp);
                    double m = cz_multi(buf, idx, xx, e, st, s, mask, sp);
                    if (zc_isfinite(v) && zc_isfinite(p) && zc_isfinite(m)) {
                        atomicAdd(&sums[lv][0], cz_err_units(v, p, scale));
                        atomicAdd(&sums[lv][1], cz_err_units(v, m, scale));
                    }
                }
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < lv * 9; i += blockDim.x) {
        u64 v = sums[i / 9][i % 9];
        if (v) atomicAdd(&err[i], v);
    }
}

// rans.rs symbol
__device__ __forceinline__ u32 cz_symbol(i64 r) {
    if (r == CZ_LOSSLESS) return CZ_SYM_LOSSLESS;
    if (r >= -CZ_RADIUS && r <= CZ_RADIUS) return (u32)(r + CZ_RADIUS);
    return CZ_SYM_BIG;
}

// Tile residuals (mod.rs Tiles::encode, abs / noa): as cz_tiles, but each point's residual is
// quantized (quant.rs ResidualQuantizer::encode) and written in symbol order, as its symbol
// (`syms`, 2 bytes per value; the later kernels read it with cz_res), a big residual also to
// `res`, a lossless value's bits to `raw`; the owned points' symbols are counted per class
// (cz_hist_add) and the block's counts added to `hist` at the end (with HIST). Blocks loop over
// the tiles, warp by warp; a tile's input values are loaded into its box first (cz_box_load).
//
// Symbols CZ_HIST_LO .. CZ_HIST_LO + CZ_HIST_WIN (residuals -128..127, where nearly all of a
// smooth field's are) are counted in shared memory (dynamic: CZ_TILE_WARPS boxes, then
// nclass * CZ_HIST_WIN counters), the others straight in `hist`: a shared counter for every
// symbol would take 41 KB (3-D) to 115 KB (1-D) per block and leave few blocks per SM.
#define CZ_HIST_LO 383
#define CZ_HIST_WIN 256
// Threads per block of cz_enc_prep (src/gpu/cuszi/mod.rs PREP_THREADS).
#define CZ_PREP_THREADS 1024
__device__ __forceinline__ void cz_hist_add(u32* shist, u64* hist, u32 cls, u32 sym, u32 n) {
    u32 w = sym - CZ_HIST_LO;
    if (w < CZ_HIST_WIN) {
        atomicAdd(&shist[cls * CZ_HIST_WIN + w], n);
    } else {
        atomicAdd(&hist[cls * 1025u + sym], (u64)n);
    }
}
// The input values of a tile's box (origin `origin`, extents `e`) into the warp's box `buf`,
// as their bits (a value's slot holds its input until the walk that codes the point replaces
// it with the reconstruction: a prediction reads only points coded before it, so the CPU's
// zeros there are never read). All of a lane's loads are issued together, 4 at a time, instead
// of one global load per point in the walks' serial order. A warp barrier after it.
template <typename T>
__device__ __forceinline__ void cz_box_load(const T* x, const CzGeo& g, i64 origin, const int e[3], int lane,
                                            double* buf) {
    const int nbox = e[0] * e[1] * e[2], e12 = e[1] * e[2];
    const u32 m12 = cz_magic(e12), m2 = cz_magic(e[2]);
    const i64 row = g.n[2], slab = g.n[1] * g.n[2];
    u64* slot = (u64*)buf;
    for (int i0 = lane; i0 < nbox; i0 += 128) {
        T v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int i = i0 + 32 * q;
            if (i < nbox) {
                int x0 = cz_div(i, e12, m12);
                int r = i - x0 * e12;
                int x1 = cz_div(r, e[2], m2);
                v[q] = x[origin + x0 * slab + x1 * row + (r - x1 * e[2])];
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (i0 + 32 * q < nbox) slot[i0 + 32 * q] = cz_bits<T>(v[q]);
    }
    __syncwarp();
}
template <typename T> __device__ __forceinline__ T cz_from_slot(u64 b);
template <> __device__ __forceinline__ float cz_from_slot<float>(u64 b) { return __uint_as_float((u32)b); }
template <> __device__ __forceinline__ double cz_from_slot<double>(u64 b) { return __longlong_as_double((long long)b); }

// Without HIST (cz_enc_tiles_nh_*: shapes whose chunks cz_enc_prep codes, which counts the
// symbols there in symbol order) it leaves the histogram out: fewer registers and no counters
// in shared memory, so more warps per SM; its launch bounds ask for 6 blocks of CZ_TILE_WARPS
// warps per SM (80 registers, a few spills of per-tile values outside the point loops): the
// extra warps hide more of the point loops' latency than the spills cost. The host launches
// one wave of the blocks that fit (a grid-stride loop over the tiles).
template <typename T, bool HIST>
__device__ void cz_enc_tiles(const T* x, const i64* geo, const i64* acc, const i64* ares, const double* vals,
                             double step, double eb, const u8* pattern, u32 nclass, i64* res, unsigned short* syms,
                             u8* raw, u64* hist) {
    double* sbox = (double*)cz_dyn;
    u32* shist = (u32*)(sbox + CZ_TILE_WARPS * CZ_MAXBOX);
    if (HIST) {
        for (u32 i = threadIdx.x; i < nclass * CZ_HIST_WIN; i += blockDim.x) shist[i] = 0;
        __syncthreads();
    }
    const CzGeo g = cz_geo(geo);
    const double inv = 1.0 / step;
    const i64 f1 = geo[CZ_G_FULL + 1], f2 = geo[CZ_G_FULL + 2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double* buf = sbox + warp * CZ_MAXBOX;
    __shared__ uint4 swalk[CZ_TILE_WARPS][2 * CZ_MAXWALKS];
    const int nw_all = (int)geo[CZ_G_NWALKS];
    for (i64 t = (i64)blockIdx.x * CZ_TILE_WARPS + warp; t < g.ntiles; t += (i64)gridDim.x * CZ_TILE_WARPS) {
        i64 c[3];
        i64 b = cz_tile_coords(g, t, c);
        int e[3], own[3], st[3];
        i64 base, origin;
        cz_tile_box(g, b, c, e, own, st, base, origin);
        // (the warp's box of the previous tile is read until here)
        __syncwarp();
        cz_box_load<T>(x, g, origin, e, lane, buf);
        cz_box_anchors(g, b, c, e, st, vals, lane, buf);
        int nw = cz_walks_prep(geo, nw_all, e, lane, swalk[warp]);
        const CzBox box(buf);
        auto nothing = [](int, const int*) { return 0; };
        cz_walks(swalk[warp], nw, box, e, st, lane, nothing, [&](int idx, const int xx[3], double p, int) {
            T xv = cz_from_slot<T>(box.bits(idx));
            // quant.rs ResidualQuantizer::encode
            i64 r = CZ_LOSSLESS;
            double v = zc_isfinite(p) ? p : 0.0;
            if (zc_isfinite(xv) && zc_isfinite(p)) {
                double xd = (double)xv;
                double q = (xd - p) * inv;
                if (fabs(q) < CzT<T>::QMAX) {
                    i64 qi = (i64)rint(q);
                    T rr = (T)(p + (double)qi * step);
                    double rv = (double)rr;
                    double d = fabs(xd - rv);
                    bool ok;
                    if (sizeof(T) == 4) {
                        ok = d <= eb;
                    } else {
                        double a = fabs(xd), bb = fabs(rv);
                        bool exact = rv == 0.0 || ((xd < 0.0) == (rv < 0.0) && bb * 0.5 <= a && a <= bb * 2.0);
                        ok = d < eb || (d == eb && exact);
                    }
                    if (ok) {
                        r = qi;
                        v = rv;
                    }
                }
            }
            box.set(idx, v);
            bool owned = xx[0] < own[0] && xx[1] < own[1] && xx[2] < own[2];
            u32 key = 0xFFFFFFFFu;
            if (owned) {
                i64 si = base + (u32)((xx[0] * own[1] + xx[1]) * own[2] + xx[2]);
                u32 sym = cz_symbol(r);
                syms[si] = (unsigned short)sym;
                if (sym == CZ_SYM_BIG) res[si] = r;
                if (r == CZ_LOSSLESS) {
                    u64 bits = cz_bits<T>(xv);
                    for (int q = 0; q < (int)sizeof(T); q++) raw[si * sizeof(T) + q] = (u8)(bits >> (8 * q));
                }
                if (HIST) key = (u32)pattern[(xx[0] * f1 + xx[1]) * f2 + xx[2]] * 1025u + sym;
            }
            if (HIST) {
                u32 am2 = __activemask();
                u32 peers = __match_any_sync(am2, key);
                if (owned && (__ffs(peers) - 1) == lane)
                    cz_hist_add(shist, hist, key / 1025u, key % 1025u, __popc(peers));
            }
        });
        if (lane == 0) {
            i64 r = ares[t];
            syms[base] = (unsigned short)cz_symbol(r);
            if (cz_symbol(r) == CZ_SYM_BIG) res[base] = r;
            if (r == CZ_LOSSLESS) {
                u64 bits = cz_bits<T>(x[origin]);
                for (int q = 0; q < (int)sizeof(T); q++) raw[base * sizeof(T) + q] = (u8)(bits >> (8 * q));
            }
            if (HIST) cz_hist_add(shist, hist, pattern[0], cz_symbol(r), 1u);
        }
    }
    if (!HIST) return;
    __syncthreads();
    for (u32 i = threadIdx.x; i < nclass * CZ_HIST_WIN; i += blockDim.x)
        if (shist[i]) atomicAdd(&hist[(i / CZ_HIST_WIN) * 1025u + CZ_HIST_LO + i % CZ_HIST_WIN], (u64)shist[i]);
}

// The encoders write coder 3 only (what the CPU encoder writes; coders 1 and 2 are only decoded).
//
// The final states before the `nrev` bytes emitted backwards from `end`, each big-endian, the
// last state nearest to the bytes (the decoder reads state 0 first); returns the rANS byte count.
__device__ __forceinline__ u32 cz_enc_states(const u32 (&xs)[CZ_RANS_WAYS], u8* end, u32 nrev) {
#pragma unroll
    for (int s = CZ_RANS_WAYS - 1; s >= 0; s--) {
        for (int q = 0; q < 4; q++) end[-1 - (i64)nrev - q] = (u8)(xs[s] >> (8 * q));
        nrev += 4;
    }
    return nrev;
}

// Chunk coding (rans.rs write_chunk), one thread per chunk, into its scratch region of
// CZ_SCRATCH(T) bytes: [rANS bytes, written from the end of 2 CHUNK + 16 bytes backwards]
// [lossless values, CHUNK * size] [big varints, CHUNK * 10] [classes (cz_enc_chunks) or step
// indices (cz_enc_prep, cz_enc_whole), CHUNK * 2]; every part starts at a multiple of 16 bytes.
// enc: per table and symbol x_max, rcp, rcp_shift, bias, cmpl. info[3 ci ..] = rANS bytes,
// lossless bytes, varint bytes; sizes[ci] = the chunk's size.
#define CZ_RANS_CAP (2 * CZ_CHUNK + 4 * CZ_RANS_WAYS)
// Steps whose step indices cz_enc_whole loads together, a batch ahead of their coding.
#define CZ_ENC_AHEAD 8
template <typename T> __host__ __device__ constexpr i64 cz_scratch() { return CZ_RANS_CAP + CZ_CHUNK * (sizeof(T) + 10 + 2); }
template <typename T>
__device__ void cz_enc_chunks(const i64* geo, const i64* res, const unsigned short* syms, const u8* raw,
                              const u8* pattern, const u8* map, const u32* enc, u64 nchunks, u8* scratch, u32* info,
                              u64* sizes) {
    u64 ci = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ci >= nchunks) return;
    const CzGeo g = cz_geo(geo);
    i64 i0 = (i64)ci * CZ_CHUNK;
    i64 cnt = g.batch * g.vol - i0;
    if (cnt > CZ_CHUNK) cnt = CZ_CHUNK;
    u8* sc = scratch + (i64)ci * cz_scratch<T>();
    u8* rawo = sc + CZ_RANS_CAP;
    u8* bigo = rawo + CZ_CHUNK * sizeof(T);
    u8* cls = bigo + CZ_CHUNK * 10;
    // forward: classes, lossless values, big varints (as cz_rans walks the positions)
    i64 tc[3], b, l[3], own[3];
    cz_chunk_start(g, i0, tc, b, l, own);
    const i64 f1 = geo[CZ_G_FULL + 1], f2 = geo[CZ_G_FULL + 2];
    u32 nraw = 0, nbig = 0;
    for (i64 j = 0; j < cnt; j++) {
        cls[j] = pattern[(l[0] * f1 + l[1]) * f2 + l[2]];
        i64 r = cz_res(res, syms, i0 + j);
        u32 s = cz_symbol(r);
        if (s == CZ_SYM_LOSSLESS) {
            for (int q = 0; q < (int)sizeof(T); q++) rawo[nraw++] = raw[(i0 + j) * sizeof(T) + q];
        } else if (s == CZ_SYM_BIG) {
            u64 z = ((u64)r << 1) ^ (u64)(r >> 63);
            while (z >= 0x80) {
                bigo[nbig++] = (u8)(z | 0x80);
                z >>= 7;
            }
            bigo[nbig++] = (u8)z;
        }
        cz_next_point(g, tc, b, l, own);
    }
    // backward: the rANS states (residual j takes state j mod CZ_RANS_WAYS), bytes emitted from
    // the end of the region
    u32 xs[CZ_RANS_WAYS];
    for (int q = 0; q < CZ_RANS_WAYS; q++) xs[q] = CZ_RANS_L;
    u32 nrev = 0;
    u8* end = sc + CZ_RANS_CAP;
    for (i64 j = cnt - 1; j >= 0; j--) {
        u32& x = xs[j & (CZ_RANS_WAYS - 1)];
        const u32* e = enc + ((u32)map[cls[j]] * 1025u + syms[i0 + j]) * 5;
        u32 x_max = e[0];
        while (x >= x_max) {
            end[-1 - (i64)nrev] = (u8)x;
            nrev++;
            x >>= 8;
        }
        u32 q = (u32)(((u64)x * e[1]) >> 32) >> e[2];
        x = x + e[3] + q * e[4];
    }
    u32 nb = cz_enc_states(xs, end, nrev);
    info[3 * ci] = nb;
    info[3 * ci + 1] = nraw;
    info[3 * ci + 2] = nbig;
    u64 size = 4 + (u64)nb + nraw + nbig;
    sizes[ci] = (size + 3) & ~3ull;
}

// Chunk coding of a stream whose tiles are all whole (as cz_rans_whole), writing what
// cz_enc_chunks writes, in two kernels. cz_enc_prep, one warp per chunk (coalesced), writes
// each residual's step index (u16: k * 1025 + symbol, k = `cpat` of its position in its tile:
// the class's index among the classes the tile pattern holds) to the scratch, and the lossless
// values and big residuals' varints in order (numbered by ballots and a scan of the varint
// lengths), with their byte counts in `info`; and it counts the symbols per k into `hist`
// (k * 1025 + symbol), which cz_enc_tiles_nh leaves out: the rANS tables are built from these
// counts after this kernel, and cz_enc_whole reads the steps of each k (its class's table). The
// block counts every symbol of every k in shared memory (`nk` * 1025 words, at most 115 KB) and
// adds its counts to `hist` once at the end: a symbol outside cz_enc_tiles' window of
// residuals -128..127 (a few percent of a 1-D array's at tight bounds, spread over thousands of
// symbols) would otherwise be one global atomic each, all blocks contending for the same
// counters. Blocks are large (CZ_PREP_THREADS, a chunk per warp) so that few of them zero and
// flush the counters.
template <typename T>
__device__ __forceinline__ void cz_enc_prep_chunk(const i64* res, const unsigned short* syms, const u8* raw,
                                                  const u8* cpat, u64 count, u32 ts, u64 ci, u32 lane, u8* scratch,
                                                  u32* info, u32* shist);
template <typename T>
__device__ void cz_enc_prep(const i64* res, const unsigned short* syms, const u8* raw, const u8* cpat, u64 count,
                            u32 ts, u64 nchunks, u8* scratch, u32* info, u32 nk, u64* hist) {
    u32* shist = (u32*)cz_dyn;
    for (u32 i = threadIdx.x; i < nk * 1025u; i += blockDim.x) shist[i] = 0;
    __syncthreads();
    u32 lane = threadIdx.x & 31;
    u64 ci = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (ci < nchunks) cz_enc_prep_chunk<T>(res, syms, raw, cpat, count, ts, ci, lane, scratch, info, shist);
    __syncthreads();
    for (u32 i = threadIdx.x; i < nk * 1025u; i += blockDim.x)
        if (shist[i]) atomicAdd(&hist[i], (u64)shist[i]);
}
template <typename T>
__device__ __forceinline__ void cz_enc_prep_chunk(const i64* res, const unsigned short* syms, const u8* raw,
                                                  const u8* cpat, u64 count, u32 ts, u64 ci, u32 lane, u8* scratch,
                                                  u32* info, u32* shist) {
    u64 i0 = ci * CZ_CHUNK;
    u32 cnt = (u32)(count - i0 < (u64)CZ_CHUNK ? count - i0 : (u64)CZ_CHUNK);
    u8* sc = scratch + ci * (u64)cz_scratch<T>();
    u8* rawo = sc + CZ_RANS_CAP;
    u8* bigo = rawo + CZ_CHUNK * sizeof(T);
    unsigned short* key = (unsigned short*)(bigo + CZ_CHUNK * 10);
    const i64* rc = res + i0;
    const unsigned short* sy = syms + i0;
    const u8* rawc = raw + i0 * sizeof(T);
    const u32 below = (1u << lane) - 1;
    u32 nraw = 0, nbig = 0;
    // this lane's local index in the tile, advanced by 32 positions per step
    u32 l = (u32)((i0 + lane) % ts);
    const u32 adv = 32 % ts;
    // 4 x 32 symbols a step, loaded before any is used
    for (u32 base = 0; base < cnt; base += 128) {
        u32 sv[4];
#pragma unroll
        for (int q = 0; q < 4; q++) sv[q] = base + 32 * q + lane < cnt ? sy[base + 32 * q + lane] : 0u;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            u32 j = base + 32 * q + lane;
            bool v = j < cnt;
            u32 s = sv[q];
            u32 k = v ? (u32)cpat[l] * 1025u + s : 0xFFFFFFFFu;
            if (v) key[j] = (unsigned short)k;
            l += adv;
            if (l >= ts) l -= ts;
            u32 peers = __match_any_sync(ZC_FULL, k);
            if (v && (__ffs(peers) - 1) == (int)lane) atomicAdd(&shist[k], __popc(peers));
            u32 ml = __ballot_sync(ZC_FULL, v && s == CZ_SYM_LOSSLESS);
            if (ml) {
                if (v && s == CZ_SYM_LOSSLESS) {
                    u32 k = nraw + __popc(ml & below) * (u32)sizeof(T);
                    for (int b = 0; b < (int)sizeof(T); b++) rawo[k + b] = rawc[(u64)j * sizeof(T) + b];
                }
                nraw += __popc(ml) * (u32)sizeof(T);
            }
            u32 mb = __ballot_sync(ZC_FULL, v && s == CZ_SYM_BIG);
            if (mb) {
                i64 r = v && s == CZ_SYM_BIG ? rc[j] : 0;
                u64 z = ((u64)r << 1) ^ (u64)(r >> 63);
                u32 len = 0;
                if (v && s == CZ_SYM_BIG) {
                    len = 1;
                    for (u64 t = z; t >= 0x80; t >>= 7) len++;
                }
                u32 incl = warp_incl_u32(len, (int)lane);
                if (len) {
                    u32 o = nbig + incl - len;
                    while (z >= 0x80) {
                        bigo[o++] = (u8)(z | 0x80);
                        z >>= 7;
                    }
                    bigo[o] = (u8)z;
                }
                nbig += __shfl_sync(ZC_FULL, incl, 31);
            }
        }
    }
    if (lane == 0) {
        info[3 * ci + 1] = nraw;
        info[3 * ci + 2] = nbig;
    }
}

// cz_enc_whole codes each chunk's step indices, a group of CZ_RANS_WAYS lanes per chunk (blocks
// as cz_rans_warp's), with the steps `g_enc` packed in 16 bytes per table and symbol as
// {x_max, rcp, bias, cmpl | rcp_shift << 16} (rans.rs EncSym) and staged in shared memory (when
// `smem`); then the rANS byte count and the chunk's size. Lane li holds state li (coder 3), and
// the steps run backwards, G residuals at a time: the serial encoder emits the bytes of residual
// i before those of i - 1, so a lane's bytes follow those of the lanes after it in the group,
// counted from two ballots; the final states follow, the last state first, each emitted from
// its low byte (the stream, reversed, starts with state 0 big-endian). A state is below 2^31,
// so its renormalization before a symbol of frequency f (down below x_max = f 2^17 >= 2^17)
// emits at most 2 bytes.
template <typename T>
__device__ void cz_enc_whole(const uint4* g_enc, u32 ntab, u32 smem, u64 count, u64 nchunks, u8* scratch, u32* info,
                             u64* sizes) {
    uint4* s_enc = (uint4*)cz_dyn;
    if (smem) {
        for (u32 i = threadIdx.x; i < ntab * 1025; i += blockDim.x) s_enc[i] = g_enc[i];
        __syncthreads();
    }
    const uint4* enc = smem ? s_enc : g_enc;
    const u32 lane = threadIdx.x & 31, li = lane % CZ_RANS_WAYS, first = lane - li;
    const u32 gm = cz_group_mask(first);
    const u64 ci = (u64)blockIdx.x * CZ_RANS_CHUNKS + threadIdx.x / CZ_RANS_WAYS;
    if (ci >= nchunks) return;
    const u64 i0 = ci * CZ_CHUNK;
    const u32 cnt = (u32)(count - i0 < (u64)CZ_CHUNK ? count - i0 : (u64)CZ_CHUNK);
    u8* sc = scratch + ci * (u64)cz_scratch<T>();
    const unsigned short* key = (const unsigned short*)(sc + CZ_RANS_CAP + CZ_CHUNK * (sizeof(T) + 10));
    u8* end = sc + CZ_RANS_CAP;
    // the lanes after this one in the group
    const u32 after = (CZ_RANS_WAYS == 32 ? 0xFFFFFFFFu : (1u << (CZ_RANS_WAYS & 31)) - 1u) & ~((2u << li) - 1u);
    u32 x = CZ_RANS_L, nrev = 0;
    // One step of the group, residual `i` (when `act`) with step index `kv`: the renormalization
    // bytes (lane order, counted by two ballots), then the state's update.
    auto step = [&](bool act, u32 kv) {
        uint4 e = make_uint4(0, 0, 0, 0);
        u32 k = 0;
        if (act) {
            e = enc[kv];
            k = (u32)(x >= e.x) + (u32)((x >> 8) >= e.x);
        }
        const u32 b1 = __ballot_sync(gm, k != 0) >> first;
        const u32 b2 = __ballot_sync(gm, k == 2) >> first;
        const u32 at = nrev + __popc(b1 & after) + __popc(b2 & after);
        if (k) end[-1 - (i64)at] = (u8)x;
        if (k == 2) end[-2 - (i64)at] = (u8)(x >> 8);
        nrev += __popc(b1) + __popc(b2);
        if (act) {
            x >>= 8 * k;
            const u32 q = __umulhi(x, e.y) >> (e.w >> 16);
            x = x + e.z + q * (e.w & 0xFFFF);
        }
    };
    // rANS codes backwards: a short chunk's partial last step first, then the full steps, whose
    // step indices are loaded CZ_ENC_AHEAD steps at a time one batch ahead (a load's latency is
    // far longer than a step's work)
    u32 j = cnt / CZ_RANS_WAYS;
    if (cnt % CZ_RANS_WAYS) {
        const u32 i = j * CZ_RANS_WAYS + li;
        step(i < cnt, i < cnt ? key[i] : 0u);
    }
    const unsigned short* kp = key + li;
    u32 next[CZ_ENC_AHEAD];
#pragma unroll
    for (u32 q = 0; q < CZ_ENC_AHEAD; q++) next[q] = j > q ? kp[(j - 1 - q) * CZ_RANS_WAYS] : 0u;
    while (j >= CZ_ENC_AHEAD) {
        u32 cur[CZ_ENC_AHEAD];
#pragma unroll
        for (u32 q = 0; q < CZ_ENC_AHEAD; q++) cur[q] = next[q];
        j -= CZ_ENC_AHEAD;
#pragma unroll
        for (u32 q = 0; q < CZ_ENC_AHEAD; q++) next[q] = j > q ? kp[(j - 1 - q) * CZ_RANS_WAYS] : 0u;
#pragma unroll
        for (u32 q = 0; q < CZ_ENC_AHEAD; q++) step(true, cur[q]);
    }
    // (fewer than CZ_ENC_AHEAD full steps left: loaded as `next`)
#pragma unroll
    for (u32 q = 0; q < CZ_ENC_AHEAD; q++)
        if (q < j) step(true, next[q]);
#pragma unroll
    for (u32 q = 0; q < 4; q++) end[-1 - (i64)(nrev + 4 * (CZ_RANS_WAYS - 1 - li) + q)] = (u8)(x >> (8 * q));
    if (li == 0) {
        const u32 nb = nrev + 4 * CZ_RANS_WAYS;
        info[3 * ci] = nb;
        u64 size = 4 + (u64)nb + info[3 * ci + 1] + info[3 * ci + 2];
        sizes[ci] = (size + 3) & ~3ull;
    }
}

// Exclusive prefix sum (wrapping) of `v[0..n]` in place by the whole block; returns the total
// (every thread). Every thread of the block must call it (block barriers).
__device__ u64 cz_excl_scan(u64* v, u64 n) {
    __shared__ u64 carry;
    __shared__ u64 part[32];
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (u64 base = 0; base < n; base += blockDim.x) {
        u64 i = base + threadIdx.x;
        u64 x = i < n ? v[i] : 0;
        u64 inc = warp_incl_u64(x, lane);
        if (lane == 31) part[warp] = inc;
        __syncthreads();
        u64 before = carry;
        for (int w = 0; w < warp; w++) before += part[w];
        u64 tot = 0;
        for (int w = 0; w < nwarps; w++) tot += part[w];
        if (i < n) v[i] = before + inc - x;
        __syncthreads();
        if (threadIdx.x == 0) carry += tot;
        __syncthreads();
    }
    return carry;
}

// Exclusive prefix sum of the chunk sizes in place (one block), total in sizes[n].
extern "C" __global__ void cz_scan(u64* sizes, u64 n) {
    u64 total = cz_excl_scan(sizes, n);
    if (threadIdx.x == 0) sizes[n] = total;
}

// The segment sums of cz_anchors (`nseg` per line, line after line) into exclusive prefixes
// per line, in place: one block per line.
extern "C" __global__ void cz_anchor_scan(i64* part, i64 nseg) {
    cz_excl_scan((u64*)part + (u64)blockIdx.x * (u64)nseg, (u64)nseg);
}

// The sum of every thread's `sum` over the block (wrapping), valid on thread 0; `wsum` holds
// a word per warp (shared). Every thread of the block must call it (block barrier).
__device__ __forceinline__ u32 cz_block_sum(u32 sum, u32* wsum) {
    sum = warp_sum_u32(sum);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = sum;
    __syncthreads();
    u32 s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += wsum[w];
    return s;
}

// Place chunk `blockIdx.x` in the stream (`out` + `data_at` + its offset) and write its table
// entry (size, zhash) at `out` + `table_at`.
template <typename T>
__device__ void cz_enc_write(const u8* scratch, const u32* info, const u64* offs, u8* out, u64 table_at,
                             u64 data_at) {
    __shared__ u32 wsum[32];
    u64 ci = blockIdx.x;
    const u8* sc = scratch + (i64)ci * cz_scratch<T>();
    u32 nb = info[3 * ci], nraw = info[3 * ci + 1], nbig = info[3 * ci + 2];
    u64 size = offs[ci + 1] - offs[ci];
    u8* dst = out + data_at + offs[ci];
    const u8* rans = sc + CZ_RANS_CAP - nb;
    const u8* rawo = sc + CZ_RANS_CAP;
    const u8* bigo = rawo + CZ_CHUNK * sizeof(T);
    u32 sum = 0;
    for (u64 w = threadIdx.x; w < size / 4; w += blockDim.x) {
        u32 word = 0;
        for (int q = 0; q < 4; q++) {
                u64 i = 4 * w + q;
                u32 v;
                if (i < 4) {
                    v = (nb >> (8 * i)) & 0xFF;
                } else if (i < 4 + (u64)nb) {
                    v = rans[i - 4];
                } else if (i < 4 + (u64)nb + nraw) {
                    v = rawo[i - 4 - nb];
                } else if (i < 4 + (u64)nb + nraw + nbig) {
                    v = bigo[i - 4 - nb - nraw];
                } else {
                    v = 0;
                }
                word |= v << (8 * q);
        }
        ((u32*)dst)[w] = word;
        sum += zhash_mix(word, (u32)w);
    }
    u32 s = cz_block_sum(sum, wsum);
    if (threadIdx.x == 0) {
        u32 h = zhash_final(s, (u32)(size / 4));
        u32* te = (u32*)(out + table_at + 8 * ci);
        te[0] = (u32)size;
        te[1] = h;
    }
}

// zhash of `nwords` words at `p` (one block): ws[0].
extern "C" __global__ void cz_hash(const u8* p, u64 nwords, u64* ws) {
    __shared__ u32 wsum[32];
    u32 sum = 0;
    for (u64 w = threadIdx.x; w < nwords; w += blockDim.x) sum += zhash_mix(((const u32*)p)[w], (u32)w);
    u32 s = cz_block_sum(sum, wsum);
    if (threadIdx.x == 0) {
        ws[0] = zhash_final(s, (u32)nwords);
    }
}

#define CZ_INST(T, N)                                                                                               \
    extern "C" __global__ void cz_rans_##N(const u8* stream, const i64* geo, const u64* ent, u64 nchunks,            \
                                           const u8* pattern, const u8* map, const unsigned short* sym,            \
                                           const u32* fc, const u8* rank, const u32* rfc,                          \
                                           const unsigned short* rsym, u32 ntab, u32 nclass, u32 smem, u32 ways,  \
                                           i64* res, u8* raw, u32* bigs, u64* err) {                               \
        cz_rans<T>(stream, geo, ent, nchunks, pattern, map, sym, fc, rank, rfc, rsym, ntab, nclass, smem, ways,   \
                   res, raw, bigs, err);                                                                           \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_RANS_CHUNKS / CZ_RANS_LANES * 32) cz_rans_whole_##N(           \
        const u8* stream, const u64* ent, u64 nchunks, u64 count, u32 ts, const uint2* top,                        \
        const unsigned short* sym, const u32* fc, const u8* rank, const u32* rfc, const unsigned short* rsym,      \
        u32 ntab, u32 smem, u32 ways, unsigned short* syms, u32* stat, u64* err) {                                 \
        cz_rans_whole<T>(stream, ent, nchunks, count, ts, top, sym, fc, rank, rfc, rsym, ntab, smem, ways, syms,    \
                         stat, err);                                                                               \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_RANS_CHUNKS * CZ_RANS_WAYS) cz_rans_warp_##N(                   \
        const u8* stream, const u64* ent, u64 nchunks, u64 count, u32 ts, const uint2* top,                        \
        const unsigned short* sym, const u32* fc, const u8* rank, const u32* rfc, const unsigned short* rsym,      \
        u32 ntab, u32 smem, unsigned short* syms, i64* res, u8* raw, u32* bigs, u64* err) {                        \
        cz_rans_warp<T>(stream, ent, nchunks, count, ts, top, sym, fc, rank, rfc, rsym, ntab, smem, syms, res, raw, \
                        bigs, err);                                                                                \
    }                                                                                                               \
    extern "C" __global__ void cz_rans_post_##N(const u8* stream, const u64* ent, u64 nchunks, u64 count,          \
                                                const unsigned short* syms, const u32* stat, i64* res, u8* raw,   \
                                                u32* bigs, u64* err) {                                             \
        cz_rans_post<T>(stream, ent, nchunks, count, syms, stat, res, raw, bigs, err);                            \
    }                                                                                                               \
    extern "C" __global__ void cz_anchors_##N(const i64* geo, const i64* res, const unsigned short* syms, i64* acc, \
                                              double* vals, int dim, int first, int last, double step, i64 seg,    \
                                              const i64* part_in, i64* part_out) {                                 \
        cz_anchors<T>(geo, res, syms, acc, vals, dim, first, last, step, seg, part_in, part_out);                  \
    }                                                                                                               \
    extern "C" __global__ void cz_anchor_lines_##N(const i64* geo, const i64* res, const unsigned short* syms,      \
                                                   i64* acc, double* vals, int dim, int first, int last,          \
                                                   double step) {                                                 \
        cz_anchor_lines<T>(geo, res, syms, acc, vals, dim, first, last, step);                                     \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_TILE_WARPS * 32)                                                \
        cz_tiles_##N(const i64* geo, const i64* res, const unsigned short* syms, const u8* raw, const i64* acc,    \
                     const double* vals,                                                                           \
                     double step, T* out) {                                                                        \
        cz_tiles<T>(geo, res, syms, raw, acc, vals, step, out);                                                    \
    }

CZ_INST(float, f32)
CZ_INST(double, f64)

#define CZ_ENC_INST(T, N)                                                                                           \
    extern "C" __global__ void cz_range_##N(const T* x, u64 n, u64* ws) { cz_range<T>(x, n, ws); }                 \
    extern "C" __global__ void cz_anchor_codes_##N(const T* x, const i64* geo, double step, double eb, i64* cod,    \
                                                   i64* acc, u64* flag) {                                          \
        cz_anchor_codes<T>(x, geo, step, eb, cod, acc, flag);                                                      \
    }                                                                                                               \
    extern "C" __global__ void cz_anchor_vals_##N(const i64* geo, const i64* acc, double step, double* vals) {     \
        cz_anchor_vals<T>(geo, acc, step, vals);                                                                   \
    }                                                                                                               \
    extern "C" __global__ void cz_sample_##N(const T* x, const i64* geo, i64 k, double scale, const i64* cfg,      \
                                             u64* err) {                                                           \
        cz_sample<T>(x, geo, k, scale, cfg, err);                                                                  \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_TILE_WARPS * 32)                                                \
        cz_enc_tiles_##N(const T* x, const i64* geo, const i64* acc, const i64* ares, const double* vals,         \
                         double step, double eb, const u8* pattern, u32 nclass, i64* res, unsigned short* syms,   \
                         u8* raw, u64* hist) {                                                                     \
        cz_enc_tiles<T, true>(x, geo, acc, ares, vals, step, eb, pattern, nclass, res, syms, raw, hist);          \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_TILE_WARPS * 32, 6)                                             \
        cz_enc_tiles_nh_##N(const T* x, const i64* geo, const i64* acc, const i64* ares, const double* vals,      \
                            double step, double eb, i64* res, unsigned short* syms, u8* raw) {                     \
        cz_enc_tiles<T, false>(x, geo, acc, ares, vals, step, eb, nullptr, 0, res, syms, raw, nullptr);           \
    }                                                                                                               \
    extern "C" __global__ void cz_enc_chunks_##N(const i64* geo, const i64* res, const unsigned short* syms,       \
                                                 const u8* raw, const u8* pattern, const u8* map, const u32* enc,  \
                                                 u64 nchunks, u8* scratch, u32* info, u64* sizes) {                \
        cz_enc_chunks<T>(geo, res, syms, raw, pattern, map, enc, nchunks, scratch, info, sizes);                  \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_PREP_THREADS) cz_enc_prep_##N(                                  \
        const i64* res, const unsigned short* syms, const u8* raw, const u8* cpat, u64 count, u32 ts, u64 nchunks,  \
        u8* scratch, u32* info, u32 nk, u64* hist) {                                                                \
        cz_enc_prep<T>(res, syms, raw, cpat, count, ts, nchunks, scratch, info, nk, hist);                         \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(CZ_RANS_CHUNKS * CZ_RANS_WAYS) cz_enc_whole_##N(            \
        const uint4* enc, u32 ntab, u32 smem, u64 count, u64 nchunks, u8* scratch, u32* info, u64* sizes) {        \
        cz_enc_whole<T>(enc, ntab, smem, count, nchunks, scratch, info, sizes);                                    \
    }                                                                                                               \
    extern "C" __global__ void cz_enc_write_##N(const u8* scratch, const u32* info, const u64* offs, u8* out,      \
                                                u64 table_at, u64 data_at) {                                       \
        cz_enc_write<T>(scratch, info, offs, out, table_at, data_at);                                              \
    }

CZ_ENC_INST(float, f32)
CZ_ENC_INST(double, f64)
