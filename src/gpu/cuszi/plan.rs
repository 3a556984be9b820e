//! The launch plan of a stored `cuszi` stream: what the host reads and checks in its header,
//! chunk table and metadata before any kernel runs (every check of the CPU decoder that needs no
//! chunk bytes), and the geometry words and tile classes the kernels walk.

use super::*;

/// What the host learned from a stream's header, table and metadata, ready to launch.
pub(super) struct Plan {
    pub(super) g: Grid,
    /// Geometry and walk words.
    pub(super) geo: Vec<i64>,
    /// Class of every local position of a whole tile.
    pub(super) pattern: Vec<u8>,
    /// Class-to-table map.
    pub(super) map: Vec<u8>,
    /// Per table and symbol: `freq << 16 | cum` (0: unused); the per-slot arrays (the symbol
    /// and rank of every slot) are filled from these and `rsym` on the device (`cz_rans_slots`).
    pub(super) fc: Vec<u32>,
    /// Per table and rank: `freq << 16 | cum` of the symbol.
    pub(super) rfc: Vec<u32>,
    /// Per table and rank: the symbol.
    pub(super) rsym: Vec<u16>,
    /// Per chunk: offset, then size | checksum << 32.
    pub(super) ent: Vec<u64>,
    /// Whether every tile's classes are the pattern's from its first symbol on ([`whole_tiles`]:
    /// every tile whole, or a 1-D array); then `tabpat` holds the table of every local position
    /// of a tile (`map` applied to `pattern`).
    pub(super) whole: bool,
    /// See `whole`.
    pub(super) tabpat: Vec<u8>,
    /// Per local position of a tile (`whole`): its table's most frequent symbol as
    /// `freq << 16 | cum`, then `symbol | table << 16` (kernels/cuszi.cu cz_rans_chain).
    pub(super) top: Vec<u32>,
    /// The quantization step.
    pub(super) qstep: f64,
    /// Interleaved rANS states per chunk (1: coder 1, [`rans::WAYS_CODER_2`]: coder 2,
    /// [`rans::WAYS`]: coder 3).
    pub(super) ways: u32,
}

/// The launch plan of a compressed abs/noa `cuszi` stream of `len` bytes with header `h` and
/// chunk table plus metadata `table` (checksum verified): every check of the CPU decoder that
/// needs no chunk bytes. `None` for a stream of coder 0 (no kernels).
pub(super) fn plan(h: &Header, table: &[u8], len: usize) -> Result<Option<Plan>> {
    let dims = h
        .dims
        .ok_or_else(|| Error::corrupt("cuszi stream without a shape"))?;
    let count = h.count as usize;
    if dims.count() != h.count {
        return Err(Error::corrupt("shape does not match the value count"));
    }
    let nc = h.n_chunks as usize;
    if nc != count.div_ceil(CHUNK) {
        return Err(Error::corrupt("chunk count does not match the value count"));
    }
    let mut ent = Vec::with_capacity(2 * nc);
    let mut off = (h.header_len() + h.table_len()) as u64;
    for i in 0..nc {
        let size = u32_at(table, i * TABLE_ENTRY_LEN);
        let sum = u32_at(table, i * TABLE_ENTRY_LEN + 4);
        if size % 4 != 0 {
            return Err(Error::corrupt(format!(
                "chunk {i} size {size} not a multiple of 4"
            )));
        }
        ent.push(off);
        ent.push(size as u64 | (sum as u64) << 32);
        off += size as u64;
    }
    if off != len as u64 {
        return Err(Error::corrupt(
            "chunk sizes do not add up to the payload length",
        ));
    }
    let g = Grid::new(&dims);
    let (levels, coder) = read_meta(&table[nc * TABLE_ENTRY_LEN..], &g)?;
    let (map, freqs, ways) = match coder {
        Coder::Rans { map, freqs, ways } => (map, freqs, ways as u32),
        Coder::Huffman(_) => return Ok(None),
    };
    // per table: per symbol `freq << 16 | cum`, and the compact form of the 255 most frequent
    // symbols (kernels/cuszi.cu cz_rans); the slot arrays, 16,384 entries per table, are
    // filled on the device from these (cz_rans_slots) rather than written and uploaded here
    let nt = freqs.len();
    let mut fc = vec![0u32; nt * SYMBOLS];
    let mut rfc = vec![0u32; nt * RANKS];
    let mut rsym = vec![0u16; nt * RANKS];
    for (t, freq) in freqs.iter().enumerate() {
        let fc = &mut fc[t * SYMBOLS..(t + 1) * SYMBOLS];
        let mut cum = 0u32;
        for (s, &f) in freq.iter().enumerate() {
            if f != 0 {
                fc[s] = f << 16 | cum;
                cum += f;
            }
        }
        let mut used: Vec<usize> = (0..SYMBOLS).filter(|&s| freq[s] != 0).collect();
        used.sort_unstable_by(|&a, &b| freq[b].cmp(&freq[a]).then(a.cmp(&b)));
        for (r, &s) in used.iter().take(RANKS - 1).enumerate() {
            rfc[t * RANKS + r] = fc[s];
            rsym[t * RANKS + r] = s as u16;
        }
    }
    let (geo, pattern) = geometry(&g, &levels);
    let tabpat: Vec<u8> = pattern.iter().map(|&k| map[k as usize]).collect();
    // (rank 0: each table's most frequent symbol; every table uses at least one)
    let top = tabpat
        .iter()
        .flat_map(|&t| {
            let r = t as usize * RANKS;
            [rfc[r], rsym[r] as u32 | (t as u32) << 16]
        })
        .collect();
    Ok(Some(Plan {
        whole: whole_tiles(&g),
        tabpat,
        top,
        g,
        geo,
        pattern,
        map,
        fc,
        rfc,
        rsym,
        ent,
        qstep: h.step,
        ways,
    }))
}

/// The geometry words (kernels/cuszi.cu `CZ_G_*`: the grid, the walks of `levels`) and the
/// class of every local position of a whole tile (none unless `levels` configures every level
/// of the grid).
pub(super) fn geometry(g: &Grid, levels: &[Level]) -> (Vec<i64>, Vec<u8>) {
    let walks = interp::walks(g.stride, levels);
    let mut geo = vec![0i64; G_WALKS + WALK_WORDS * walks.len()];
    geo[G_BATCH] = g.batch as i64;
    for d in 0..3 {
        geo[G_N + d] = g.n[d] as i64;
        geo[G_TILES + d] = g.tiles[d] as i64;
    }
    geo[G_S] = g.stride as i64;
    geo[G_NTILES] = g.n_tiles() as i64;
    geo[G_VOL] = g.volume() as i64;
    geo[G_COUNT] = (g.batch * g.volume()) as i64;
    geo[G_NWALKS] = walks.len() as i64;
    let full = g.owned([0; 3]);
    for d in 0..3 {
        geo[G_FULL + d] = full[d] as i64;
    }
    for (w, (s, start, stp, walk)) in walks.iter().enumerate() {
        let at = G_WALKS + WALK_WORDS * w;
        let (multi, am, sp) = match *walk {
            Walk::Pass(a, sp) => (0, a, [sp; 3]),
            Walk::Multi(mask, sp) => (1, mask, sp),
        };
        let words = [
            *s as i64,
            start[0] as i64,
            start[1] as i64,
            start[2] as i64,
            stp[0] as i64,
            stp[1] as i64,
            stp[2] as i64,
            multi,
            am as i64,
            sp[0] as i64,
            sp[1] as i64,
            sp[2] as i64,
        ];
        geo[at..at + WALK_WORDS].copy_from_slice(&words);
    }
    let log2s = g.stride.trailing_zeros();
    let mut pattern = Vec::with_capacity(full.iter().product());
    if levels.len() != g.levels() {
        // (the anchor and sampling kernels, before the configuration is known, read no classes)
        return (geo, pattern);
    }
    for l0 in 0..full[0] {
        for l1 in 0..full[1] {
            for l2 in 0..full[2] {
                pattern.push(interp::point_class([l0, l1, l2], log2s, levels));
            }
        }
    }
    (geo, pattern)
}

/// Whether the residual at symbol index `i` lies at local index `i` mod (points of a whole tile)
/// in its tile and has that position's class in the pattern, which the `*_whole` kernels count
/// instead of walking tile coordinates. So it is when every tile is whole (each extent a
/// multiple of the anchor stride or below it), and when the tiles of one volume form a single
/// column along its slowest extent above 1 (a 1-D array; or every faster extent below the
/// stride): then only the column's last tile may be cut short, and it owns a prefix of a whole
/// tile's points in symbol order, with the prefix of the pattern as classes (mod.rs `classes`).
pub(super) fn whole_tiles(g: &Grid) -> bool {
    let whole = g.n.iter().all(|&x| x <= g.stride || x % g.stride == 0);
    let column = g.batch == 1
        && match g.n.iter().position(|&x| x > 1) {
            Some(d) => g.n[d + 1..].iter().all(|&x| x <= g.stride),
            None => true,
        };
    whole || column
}
