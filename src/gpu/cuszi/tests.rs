//! Unit tests of the CUDA cuSZ-i driver that need no GPU: constants shared with the kernels,
//! the launch plan and the geometry.
use super::*;

/// The value of `#define name` in kernels/cuszi.cu (a decimal integer, or `1ull << k`).
fn define(name: &str) -> u64 {
    let text = compile::kernel_file("cuszi.cu").expect("cuszi.cu");
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() == Some("#define") && it.next() == Some(name) {
            let v: String = it.collect::<Vec<_>>().join(" ");
            let v = v.trim_end_matches("ull").trim_end_matches("ll");
            return v.parse().unwrap_or_else(|_| panic!("{name} = {v}"));
        }
    }
    panic!("{name} not defined in cuszi.cu");
}

#[test]
fn constants_shared_with_the_kernels_agree() {
    for (name, v) in [
        ("CZ_G_BATCH", G_BATCH),
        ("CZ_G_N", G_N),
        ("CZ_G_S", G_S),
        ("CZ_G_TILES", G_TILES),
        ("CZ_G_NTILES", G_NTILES),
        ("CZ_G_VOL", G_VOL),
        ("CZ_G_COUNT", G_COUNT),
        ("CZ_G_NWALKS", G_NWALKS),
        ("CZ_G_FULL", G_FULL),
        ("CZ_G_WALKS", G_WALKS),
        ("CZ_WALK_WORDS", WALK_WORDS),
        ("CZ_MAXWALKS", MAX_WALKS),
        ("CZ_TILE_WARPS", TILE_WARPS),
        ("CZ_MAXBOX", MAX_BOX),
        ("CZ_RANS_CHUNKS", RANS_CHUNKS),
        ("CZ_RANS_LANES", RANS_LANES),
        ("CZ_RANS_WAYS", rans::WAYS),
        ("CZ_RANS_WAYS2", rans::WAYS_CODER_2),
        ("CZ_HIST_WIN", HIST_WIN),
        ("CZ_SLOT_THREADS", SLOT_THREADS),
        ("CZ_PREP_THREADS", PREP_THREADS),
        ("CZ_CHUNK", CHUNK),
        ("CZ_E_CHECKSUM", ERRORS[0].0 as usize),
        ("CZ_E_RANS", ERRORS[1].0 as usize),
        ("CZ_E_RAW", ERRORS[2].0 as usize),
        ("CZ_E_BIG", ERRORS[3].0 as usize),
        ("CZ_E_PAD", ERRORS[4].0 as usize),
    ] {
        assert_eq!(define(name), v as u64, "{name}");
    }
    assert_eq!(1 << define("CZ_PROB_BITS"), SLOTS);
    assert_eq!(SYMBOLS, rans::NSYM);
}

/// The tile kernels keep the walks that have points in a tile's box (kernels/cuszi.cu
/// `cz_walks_prep`), at most `MAX_WALKS`: the first tile's box is the largest of its grid
/// (a walk's points in a box only shrink with the box), so count them there for every level
/// configuration (multi or passes, any order) of many shapes.
#[test]
fn walks_with_points_fit_the_kernels() {
    let live = |e: [usize; 3], walks: &[(usize, [usize; 3], [usize; 3], Walk)]| {
        walks
            .iter()
            .filter(|(_, start, stp, _)| {
                (0..3).all(|d| start[d] < e[d] && (e[d] - 1 - start[d]) / stp[d] < e[d])
            })
            .count()
    };
    let mut most = 0;
    for d in [
        &[1u64][..],
        &[2],
        &[100_003],
        &[2, 3],
        &[17, 33],
        &[512, 512],
        &[2, 2, 2],
        &[9, 9, 9],
        &[40, 40, 50],
        &[512, 512, 512],
        &[2, 3, 9, 17],
    ] {
        let g = Grid::new(&Dims::new(d).unwrap());
        let e = g.boxed([0; 3]);
        for bits in 0..1u32 << g.levels() {
            for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
                let levels: Vec<Level> = (0..g.levels())
                    .map(|k| Level {
                        order,
                        spline: [interp::Spline::ALL[2]; 3],
                        multi: bits >> k & 1 == 1,
                    })
                    .collect();
                let n = live(e, &interp::walks(g.stride, &levels));
                assert!(n <= MAX_WALKS, "{d:?}: {n} walks");
                most = most.max(n);
            }
        }
    }
    assert_eq!(most, 21);
}

/// What the whole-tile kernels rely on where `whole_tiles` holds: every owned point of every
/// tile sits at symbol index `t * ts + p`, with `p` its position in the pattern of a whole
/// tile (raster over the first tile's owned extents), so its class is `pattern[i % ts]`;
/// and the shapes it must refuse break that.
#[test]
fn whole_tiles_means_the_pattern_repeats_in_symbol_order() {
    let repeats = |g: &Grid| {
        let full = g.owned([0; 3]);
        let ts: usize = full.iter().product();
        (0..g.n_tiles()).all(|t| {
            let (b, c) = g.tile_coords(t);
            let e = g.owned(c);
            (0..e[0]).all(|l0| {
                (0..e[1]).all(|l1| {
                    (0..e[2]).all(|l2| {
                        let s = g.stride;
                        let x = [c[0] * s + l0, c[1] * s + l1, c[2] * s + l2];
                        let p = (l0 * full[1] + l1) * full[2] + l2;
                        g.symbol_index(b, x) == t * ts + p
                    })
                })
            })
        })
    };
    let grid = |d: &[u64]| Grid::new(&Dims::new(d).unwrap());
    for d in [
        &[1u64][..],
        &[511],
        &[512],
        &[513],
        &[100_003],
        &[1, 1, 1030],
        &[37, 16],
        &[3, 48],
        &[1003, 5, 3],
        &[20, 8, 8],
        &[32, 48],
        &[16, 24, 40],
        &[2, 3, 8, 16],
    ] {
        let g = grid(d);
        assert!(whole_tiles(&g), "{d:?}");
        assert!(repeats(&g), "{d:?}");
    }
    // edge tiles inside a row or slab, a column with a faster extent above the stride, a
    // batch of volumes with short last tiles
    for d in [
        &[17u64, 33][..],
        &[40, 40, 50],
        &[37, 17],
        &[1000, 9, 3],
        &[2, 3, 9, 17],
    ] {
        let g = grid(d);
        assert!(!whole_tiles(&g), "{d:?}");
        assert!(!repeats(&g), "{d:?}");
    }
}

/// Streams of coders 1 (one rANS state per chunk) and 2 (four, the previous encoder's) decode
/// on the GPU exactly as on the CPU, whole-tile shapes and others, and as coder 3 streams of
/// the same data.
#[test]
#[ignore = "skipped: no CUDA device assumed (a GPU test: run it with --include-ignored on a GPU machine)"]
fn gpu_decodes_coder_1_and_2_streams() {
    use crate::codec::cuszi::tests::as_older_coder;
    use crate::{compress_nd, decompress, CodecKind, ErrorBound};
    assert!(crate::gpu::device_available(), "no CUDA device");
    let mut g = CusziGpu::new(0).unwrap();
    for dims in [
        &[64usize, 64, 64][..],
        &[40, 40, 50],
        &[100_003],
        &[70, 1000],
    ] {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|i| ((i % 97) as f32 * 0.05).sin() * 3.0 + (i / 4093) as f32 * 0.01)
            .collect();
        for bound in [ErrorBound::Noa(1e-3), ErrorBound::Abs(1e-5)] {
            let s = compress_nd(&data, dims, bound, CodecKind::Cuszi).unwrap();
            let new: Vec<f32> = g.decompress(&s).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for old in [1, 2].map(|coder| as_older_coder(coder, &s, &data, dims, bound)) {
                assert_ne!(s, old, "{dims:?} {bound}");
                let cpu: Vec<f32> = decompress(&old).unwrap();
                let gpu: Vec<f32> = g.decompress(&old).unwrap();
                assert_eq!(bits(&cpu), bits(&gpu), "{dims:?} {bound}");
                assert_eq!(bits(&cpu), bits(&new), "{dims:?} {bound}");
                let mut cut = old.clone();
                cut.truncate(old.len() - 4);
                assert!(g.decompress::<f32>(&cut).is_err(), "{dims:?} {bound}");
            }
        }
    }
}

/// The decoder tables of a plan: each table's used symbols' `freq << 16 | cum` tile its slots
/// in symbol order (what `cz_rans_slots` relies on to fill the slot arrays by a running maximum),
/// and the ranked symbols are each table's 255 most frequent (ties to the lower symbol), with
/// their steps.
#[test]
fn plan_tables_tile_the_slots_and_rank_the_symbols() {
    use crate::{compress_nd, CodecKind, ErrorBound};
    let dims = [64usize, 48, 40];
    let n: usize = dims.iter().product();
    let smooth: Vec<f32> = (0..n)
        .map(|i| ((i % 97) as f32 * 0.05).sin() * 3.0 + ((i * 7919) % 1013) as f32 * 1e-3)
        .collect();
    // (noise: residuals over hundreds of symbols, more than the ranks)
    let noise: Vec<f32> = (0..n)
        .map(|i| {
            let z = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let z = (z ^ z >> 31).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            (z >> 40) as f32 * 1e-6
        })
        .collect();
    let cases = [
        (&smooth, ErrorBound::Noa(1e-2)),
        (&smooth, ErrorBound::Noa(1e-5)),
        (&noise, ErrorBound::Noa(2e-3)),
    ];
    for (k, &(data, bound)) in cases.iter().enumerate() {
        let s = compress_nd(data, &dims, bound, CodecKind::Cuszi).unwrap();
        let h = crate::codec::inspect(&s).unwrap();
        let hl = h.header_len();
        let p = plan(&h, &s[hl..hl + h.table_len()], s.len())
            .unwrap()
            .unwrap();
        let nt = p.fc.len() / SYMBOLS;
        assert!(nt >= 1 && p.rfc.len() == nt * RANKS && p.rsym.len() == nt * RANKS);
        let mut most_used = 0;
        for t in 0..nt {
            let fc = &p.fc[t * SYMBOLS..(t + 1) * SYMBOLS];
            let mut next = 0usize;
            for (sy, &v) in fc.iter().enumerate() {
                let (f, cum) = ((v >> 16) as usize, (v & 0xFFFF) as usize);
                if f != 0 {
                    assert_eq!(cum, next, "{bound} table {t} symbol {sy}");
                    next += f;
                }
            }
            assert_eq!(next, SLOTS, "{bound} table {t}");
            let mut used: Vec<usize> = (0..SYMBOLS).filter(|&s| fc[s] >> 16 != 0).collect();
            most_used = most_used.max(used.len());
            used.sort_by(|&a, &b| (fc[b] >> 16).cmp(&(fc[a] >> 16)).then(a.cmp(&b)));
            let ranked = used.len().min(RANKS - 1);
            for r in 0..RANKS {
                let (sy, step) = (p.rsym[t * RANKS + r], p.rfc[t * RANKS + r]);
                if r < ranked {
                    assert_eq!(sy as usize, used[r], "{bound} table {t} rank {r}");
                    assert_eq!(step, fc[used[r]], "{bound} table {t} rank {r}");
                } else {
                    // (cz_rans_slots reads an unused rank as a zero frequency)
                    assert_eq!(step, 0, "{bound} table {t} rank {r}");
                }
            }
        }
        // (the noise has a table of more symbols than ranks: the selection of the ranked ones
        // is checked against the full sort)
        if k == 2 {
            assert!(
                most_used > RANKS - 1,
                "{bound}: {most_used} symbols at most"
            );
        }
    }
}
