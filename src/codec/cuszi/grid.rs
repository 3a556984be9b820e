//! The tiling of a shaped array: volumes, anchor stride, tiles and the tile-ordered symbol
//! sequence (FORMAT.md, "cuszi").
//!
//! Every array is handled as `batch` volumes of up to three spatial dimensions `n[0..3]`
//! (slowest first; unused leading dimensions have extent 1). Extents of 1 are dropped from the
//! shape first; a shape with four remaining extents is a batch (its slowest extent) of 3-D
//! volumes. The anchor stride `S` depends on the number of spatial dimensions left: 512 (1-D),
//! 16 (2-D), 8 (3-D), as in cuSZ-i.
//!
//! A **tile** owns the points of its volume whose coordinates lie in `[t_d S, t_d S + S)` in
//! every dimension `d`; its **box** adds the points at `t_d S + S` (the halo, owned by the next
//! tiles). The point at the tile's origin is its **anchor**. Tiles are numbered batch-major, then
//! in raster order (slowest dimension first), and the symbol sequence holds every tile's owned
//! points in raster order within the tile, tile after tile.

use crate::format::Dims;

/// Spatial dimensions of a tile (leading unused ones have extent 1).
pub(crate) const D: usize = 3;

/// The geometry of one shaped array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    /// Number of volumes.
    pub batch: usize,
    /// Spatial extents, slowest first (1 for unused dimensions).
    pub n: [usize; D],
    /// Spatial dimensions with an extent above 1 (0 for a single value or an empty array).
    pub nd: usize,
    /// Anchor stride `S` (a power of two).
    pub stride: usize,
    /// Tiles per volume along each dimension: `ceil(n / S)`.
    pub tiles: [usize; D],
}

impl Grid {
    /// The tiling of `dims` (whose count fits in memory: the caller checked it).
    pub fn new(dims: &Dims) -> Self {
        let mut ext: Vec<usize> = dims
            .as_slice()
            .iter()
            .map(|&x| x as usize)
            .filter(|&x| x != 1)
            .collect();
        if dims.count() == 0 {
            ext = vec![0];
        }
        let batch = if ext.len() > D { ext.remove(0) } else { 1 };
        let nd = ext.iter().filter(|&&x| x > 1).count();
        let mut n = [1usize; D];
        n[D - ext.len()..].copy_from_slice(&ext);
        let stride = match nd {
            0 | 1 => 512,
            2 => 16,
            _ => 8,
        };
        let tiles = n.map(|x| x.div_ceil(stride));
        Grid {
            batch,
            n,
            nd,
            stride,
            tiles,
        }
    }

    /// Interpolation levels: `log2 S` (strides `S/2, S/4, ..., 1`).
    pub fn levels(&self) -> usize {
        self.stride.trailing_zeros() as usize
    }

    /// Values per volume.
    pub fn volume(&self) -> usize {
        self.n.iter().product()
    }

    /// Tiles per volume.
    pub fn tiles_per_volume(&self) -> usize {
        self.tiles.iter().product()
    }

    /// Tiles in all.
    pub fn n_tiles(&self) -> usize {
        self.batch * self.tiles_per_volume()
    }

    /// Tile number `t` as (volume, tile coordinates).
    pub fn tile_coords(&self, t: usize) -> (usize, [usize; D]) {
        let per = self.tiles_per_volume();
        let (b, mut r) = (t / per, t % per);
        let mut c = [0; D];
        for d in (0..D).rev() {
            c[d] = r % self.tiles[d];
            r /= self.tiles[d];
        }
        (b, c)
    }

    /// The number of the tile at coordinates `c` of volume `b`.
    pub fn tile_index(&self, b: usize, c: [usize; D]) -> usize {
        self.tiles.iter().zip(c).fold(b, |t, (&n, x)| t * n + x)
    }

    /// Extents of the points tile `c` owns: `min(S, n - c S)` per dimension.
    pub fn owned(&self, c: [usize; D]) -> [usize; D] {
        std::array::from_fn(|d| self.stride.min(self.n[d] - c[d] * self.stride))
    }

    /// Extents of the box of tile `c` (owned points plus the halo): `min(S, n - 1 - c S) + 1`.
    pub fn boxed(&self, c: [usize; D]) -> [usize; D] {
        std::array::from_fn(|d| self.stride.min(self.n[d] - 1 - c[d] * self.stride) + 1)
    }

    /// Index in the symbol sequence of the first point tile `c` of volume `b` owns: the points
    /// of the volumes before, of the slabs of tiles before along dimension 0, of the rows of
    /// tiles before in the slab, and of the tiles before in the row.
    pub fn tile_offset(&self, b: usize, c: [usize; D]) -> usize {
        let s = self.stride;
        let e = self.owned(c);
        b * self.volume()
            + c[0] * s * self.n[1] * self.n[2]
            + e[0] * c[1] * s * self.n[2]
            + e[0] * e[1] * c[2] * s
    }

    /// Index in the symbol sequence of the point at coordinates `x` of volume `b`.
    pub fn symbol_index(&self, b: usize, x: [usize; D]) -> usize {
        // (S is a power of two)
        let k = self.stride.trailing_zeros();
        let c = x.map(|v| v >> k);
        let e = self.owned(c);
        let l = x.map(|v| v & (self.stride - 1));
        self.tile_offset(b, c) + (l[0] * e[1] + l[1]) * e[2] + l[2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The symbol sequence is a permutation of the values, tile after tile.
    #[test]
    fn symbol_order_is_a_permutation() {
        for dims in [
            &[17u64][..],
            &[1, 1, 1],
            &[3, 40],
            &[1, 5, 1, 33],
            &[9, 17, 10],
            &[2, 3, 9, 17],
            &[1030],
        ] {
            let dims = Dims::new(dims).unwrap();
            let g = Grid::new(&dims);
            assert_eq!(g.batch * g.volume(), dims.count() as usize, "{dims}");
            let mut seen = vec![false; dims.count() as usize];
            let mut next = 0;
            for t in 0..g.n_tiles() {
                let (b, c) = g.tile_coords(t);
                assert_eq!(g.tile_index(b, c), t);
                assert_eq!(g.tile_offset(b, c), next, "{dims} tile {t}");
                let e = g.owned(c);
                next += e.iter().product::<usize>();
                for x0 in 0..e[0] {
                    for x1 in 0..e[1] {
                        for x2 in 0..e[2] {
                            let s = g.stride;
                            let x = [c[0] * s + x0, c[1] * s + x1, c[2] * s + x2];
                            let i = g.symbol_index(b, x);
                            assert!(!seen[i], "{dims}");
                            seen[i] = true;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "{dims}");
        }
    }

    #[test]
    fn strides_follow_the_dimensionality() {
        let g = |d: &[u64]| Grid::new(&Dims::new(d).unwrap());
        assert_eq!((g(&[100]).stride, g(&[100]).nd), (512, 1));
        assert_eq!((g(&[1, 100]).stride, g(&[1, 100]).nd), (512, 1));
        assert_eq!(g(&[4, 100]).stride, 16);
        assert_eq!(g(&[4, 5, 100]).stride, 8);
        let b = g(&[3, 4, 5, 6]);
        assert_eq!((b.batch, b.n, b.stride), (3, [4, 5, 6], 8));
        let one = g(&[1, 1, 1]);
        assert_eq!((one.n, one.nd, one.n_tiles()), ([1, 1, 1], 0, 1));
        assert_eq!(g(&[0]).n_tiles(), 0);
    }
}
