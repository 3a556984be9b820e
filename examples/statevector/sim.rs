//! The distributed state vector: qubit layout, the exchange plan, and the local kernels.
//!
//! # Layout
//!
//! `2^k` ranks hold `2^n` amplitudes; rank `r` holds the `2^l` amplitudes (`l = n - k`) whose
//! *physical* index has `r` in its top `k` bits. Physical bits `0..l` are *local* (inside a
//! rank's sub-vector), bits `l..n` are *global* (the rank number). Logical qubit `q` sits at
//! physical bit `pos[q]`; at the start `pos[q] = q`.
//!
//! # Which gates communicate
//!
//! A gate `m` on target `t` with controls `C` needs no communication when `t` is local (the
//! pairs it mixes live on one rank; global controls only decide *whether* a rank applies it), or
//! when `m` is diagonal (a phase per amplitude, known from the rank's bits: `p`, `rz`, `cz`,
//! `cp`, `rzz`, ... on any qubit). Only a non-diagonal gate on a global target communicates:
//! the planner first swaps the target's physical bit with a local one (an *index-bit swap*),
//! then applies the gate locally. A `swap` gate never communicates: it only exchanges two
//! entries of `pos`.
//!
//! # The index-bit swap
//!
//! Swapping global bit `g` (rank bit `j = g - l`) with local bit `b`: a rank whose bit `j` is
//! `c` keeps its amplitudes whose local bit `b` equals `c`, and exchanges the other half (local
//! bit `b` = `1 - c`: `2^(l-1)` amplitudes) with the rank `r ^ (1 << j)`, which sends the
//! amplitudes going the other way from the same positions. This is the one place where data
//! crosses ranks, and the one place where compression may change values.
//!
//! # Choosing the local bit to give up
//!
//! The evicted local qubit becomes global, and a later non-diagonal gate on it costs another
//! swap. The planner evicts the local qubit whose next non-diagonal *target* use is furthest in
//! the future (Belady's rule, exact here since the whole circuit is known), preferring qubits
//! the current gate does not use.
//!
//! Every rank computes the same plan from the same circuit, so the ranks agree on the sequence
//! of exchanges without talking.

use rayon::prelude::*;
use zcomm::comm::CommElement;

use crate::gates::{is_diagonal, Mat2, Op, C};
use crate::qasm::Circuit;

/// A complex amplitude in storage precision (c64 = `[f32; 2]`, c128 = `[f64; 2]`).
pub trait Amp: CommElement {
    /// Unit roundoff of the storage type (2^-24 for f32, 2^-53 for f64).
    const UNIT_ROUNDOFF: f64;
    fn get(self) -> C;
    fn put(c: C) -> Self;
    /// Little-endian bytes of (re, im).
    fn write_le(self, out: &mut Vec<u8>);
}

impl Amp for [f32; 2] {
    const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;
    fn get(self) -> C {
        C::new(self[0] as f64, self[1] as f64)
    }
    fn put(c: C) -> Self {
        [c.re as f32, c.im as f32]
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self[0].to_le_bytes());
        out.extend_from_slice(&self[1].to_le_bytes());
    }
}

impl Amp for [f64; 2] {
    const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;
    fn get(self) -> C {
        C::new(self[0], self[1])
    }
    fn put(c: C) -> Self {
        [c.re, c.im]
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self[0].to_le_bytes());
        out.extend_from_slice(&self[1].to_le_bytes());
    }
}

/// A gate in physical bits, as every rank applies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// Physical target bit (local unless `m` is diagonal).
    pub target: usize,
    /// Physical control bits.
    pub controls: Vec<usize>,
    pub m: Mat2,
    /// QASM line of the gate (for reports).
    pub line: usize,
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Gate(Kernel),
    /// Swap physical global bit `global` with local bit `local`, to bring logical `qubit` (now
    /// at `global`) in for the gate of QASM line `line`.
    Swap {
        global: usize,
        local: usize,
        qubit: usize,
        line: usize,
        /// Name of that gate.
        gate: String,
    },
}

/// The plan: steps and the final logical → physical map.
#[derive(Debug, Clone)]
pub struct Plan {
    pub qubits: usize,
    /// Local bits per rank.
    pub local: usize,
    pub steps: Vec<Step>,
    /// `pos[q]`: physical bit of logical qubit `q` after the last step.
    pub final_pos: Vec<usize>,
}

impl Plan {
    pub fn swaps(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Swap { .. }))
            .count()
    }
    pub fn gate_passes(&self) -> usize {
        self.steps.len() - self.swaps()
    }
    /// Physical index of logical index `i` under [`final_pos`](Self::final_pos).
    pub fn physical(&self, i: usize) -> usize {
        let mut p = 0;
        for (q, &b) in self.final_pos.iter().enumerate() {
            p |= ((i >> q) & 1) << b;
        }
        p
    }
}

/// Plan `circ` over `2^k` ranks. Errors if fewer than one local qubit would remain.
pub fn plan(circ: &Circuit, k: usize) -> Result<Plan, String> {
    let n = circ.qubits;
    if k >= n {
        return Err(format!(
            "{} ranks for {n} qubits: each rank must hold at least 2 amplitudes (use at most \
             2^{} ranks)",
            1usize << k,
            n - 1
        ));
    }
    let l = n - k;
    let ops: Vec<(&Op, &crate::qasm::Gate)> = circ.ops().collect();
    // for each qubit, the op indices where it is a non-diagonal target (sorted)
    let mut uses: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, (op, _)) in ops.iter().enumerate() {
        if let Op::U { target, m, .. } = op {
            if !is_diagonal(m) {
                uses[*target].push(i);
            }
        }
    }
    let next_use = |q: usize, after: usize| -> usize {
        let u = &uses[q];
        u.get(u.partition_point(|&x| x <= after))
            .copied()
            .unwrap_or(usize::MAX)
    };
    let mut pos: Vec<usize> = (0..n).collect();
    let mut at: Vec<usize> = (0..n).collect(); // physical bit → logical qubit
    let mut steps = Vec::new();
    for (i, (op, gate)) in ops.iter().enumerate() {
        match op {
            Op::Swap(a, b) => {
                let (pa, pb) = (pos[*a], pos[*b]);
                pos.swap(*a, *b);
                at[pa] = *b;
                at[pb] = *a;
            }
            Op::U {
                target,
                controls,
                m,
            } => {
                if pos[*target] >= l && !is_diagonal(m) {
                    // evict the local qubit needed last; on ties prefer one this gate does not
                    // use (a local control would otherwise turn global: correct, but it is
                    // needed right now), then the highest bit
                    let victim = (0..l)
                        .max_by_key(|&b| {
                            let q = at[b];
                            (next_use(q, i), !controls.contains(&q), b)
                        })
                        .unwrap_or(l - 1);
                    let g = pos[*target];
                    let vq = at[victim];
                    steps.push(Step::Swap {
                        global: g,
                        local: victim,
                        qubit: *target,
                        line: gate.line,
                        gate: gate.name.clone(),
                    });
                    pos[*target] = victim;
                    pos[vq] = g;
                    at[victim] = *target;
                    at[g] = vq;
                }
                steps.push(Step::Gate(Kernel {
                    target: pos[*target],
                    controls: controls.iter().map(|&c| pos[c]).collect(),
                    m: *m,
                    line: gate.line,
                }));
            }
        }
    }
    Ok(Plan {
        qubits: n,
        local: l,
        steps,
        final_pos: pos,
    })
}

/// Elements per rayon task of the streaming kernels (large enough to amortise scheduling).
const GRAIN: usize = 1 << 14;

/// Apply `k` to the sub-vector `v` of `rank` (`v.len() = 2^local`).
pub fn apply<E: Amp>(v: &mut [E], k: &Kernel, rank: usize, local: usize) {
    let mut cmask = 0usize;
    for &c in &k.controls {
        if c >= local {
            if (rank >> (c - local)) & 1 == 0 {
                return; // a global control is 0 on this rank: the gate is the identity here
            }
        } else {
            cmask |= 1 << c;
        }
    }
    if is_diagonal(&k.m) {
        let (d0, d1) = (k.m[0][0], k.m[1][1]);
        if k.target >= local {
            // every amplitude of this rank has the same target bit
            let d = if (rank >> (k.target - local)) & 1 == 1 {
                d1
            } else {
                d0
            };
            scale_where(v, cmask, cmask, |_| d);
        } else {
            let t = k.target;
            // skip factors of exactly 1 (p, cp, s, t, cz, ... leave bit-0 amplitudes alone)
            let (mask, want) = if d0 == C::ONE {
                (cmask | 1 << t, cmask | 1 << t)
            } else {
                (cmask, cmask)
            };
            scale_where(v, mask, want, |i| if (i >> t) & 1 == 1 { d1 } else { d0 });
        }
        return;
    }
    debug_assert!(
        k.target < local,
        "the planner brings non-diagonal targets in"
    );
    let half = 1usize << k.target;
    let m = k.m;
    let pair = |i0: usize, a: &mut E, b: &mut E| {
        if i0 & cmask == cmask {
            let (x, y) = (a.get(), b.get());
            *a = E::put(m[0][0] * x + m[0][1] * y);
            *b = E::put(m[1][0] * x + m[1][1] * y);
        }
    };
    let blocks = v.len() / (2 * half);
    if blocks >= 64 || half < GRAIN {
        // many blocks: one task per group of blocks
        let per = (GRAIN / (2 * half)).max(1);
        v.par_chunks_mut(2 * half * per)
            .enumerate()
            .for_each(|(ci, chunk)| {
                for (bi, block) in chunk.chunks_mut(2 * half).enumerate() {
                    let base = (ci * per + bi) * 2 * half;
                    let (lo, hi) = block.split_at_mut(half);
                    for (j, (a, b)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                        pair(base + j, a, b);
                    }
                }
            });
    } else {
        // few, long blocks (high target bit): split inside each block
        for (bi, block) in v.chunks_mut(2 * half).enumerate() {
            let base = bi * 2 * half;
            let (lo, hi) = block.split_at_mut(half);
            lo.par_chunks_mut(GRAIN)
                .zip(hi.par_chunks_mut(GRAIN))
                .enumerate()
                .for_each(|(ci, (l, h))| {
                    for (j, (a, b)) in l.iter_mut().zip(h.iter_mut()).enumerate() {
                        pair(base + ci * GRAIN + j, a, b);
                    }
                });
        }
    }
}

/// Multiply `v[i]` by `f(i)` where `i & mask == want`.
fn scale_where<E: Amp>(v: &mut [E], mask: usize, want: usize, f: impl Fn(usize) -> C + Sync) {
    v.par_chunks_mut(GRAIN).enumerate().for_each(|(ci, ch)| {
        for (j, a) in ch.iter_mut().enumerate() {
            let i = ci * GRAIN + j;
            if i & mask == want {
                *a = E::put(f(i) * a.get());
            }
        }
    });
}

/// The partner and the exchanged half of an index-bit swap of global bit `global` with local
/// bit `local` on `rank`: `(partner, s)` where the exchanged amplitudes are those whose local
/// bit is `s`.
pub fn swap_partner(rank: usize, global: usize, local_bits: usize) -> (usize, usize) {
    let j = global - local_bits;
    let c = (rank >> j) & 1;
    (rank ^ (1 << j), 1 - c)
}

/// Copy the amplitudes of `v` whose bit `b` is `s` into `out` (`v.len() / 2` of them), in order.
pub fn pack<E: Amp>(v: &[E], b: usize, s: usize, out: &mut [E]) {
    let half = 1usize << b;
    out.par_chunks_mut(half)
        .zip(v.par_chunks(2 * half))
        .for_each(|(o, blk)| o.copy_from_slice(&blk[s * half..(s + 1) * half]));
}

/// The inverse of [`pack`]: write `inp` back to the positions of `v` whose bit `b` is `s`.
pub fn unpack<E: Amp>(v: &mut [E], b: usize, s: usize, inp: &[E]) {
    let half = 1usize << b;
    v.par_chunks_mut(2 * half)
        .zip(inp.par_chunks(half))
        .for_each(|(blk, i)| blk[s * half..(s + 1) * half].copy_from_slice(i));
}

/// `(Σ conj(a)·b, Σ|a|², Σ|b|²)` over one rank's sub-vectors, in f64.
pub fn overlap<E: Amp>(a: &[E], b: &[E]) -> (C, f64, f64) {
    a.par_chunks(GRAIN)
        .zip(b.par_chunks(GRAIN))
        .map(|(x, y)| {
            let mut s = (C::ZERO, 0.0, 0.0);
            for (p, q) in x.iter().zip(y) {
                let (p, q) = (p.get(), q.get());
                s.0 = s.0 + p.conj() * q;
                s.1 += p.norm_sqr();
                s.2 += q.norm_sqr();
            }
            s
        })
        .reduce(
            || (C::ZERO, 0.0, 0.0),
            |x, y| (x.0 + y.0, x.1 + y.1, x.2 + y.2),
        )
}

/// `|<a|b>|² / (<a|a><b|b>)` from the sums of [`overlap`].
pub fn fidelity_of(ov: C, na: f64, nb: f64) -> f64 {
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    (ov.norm_sqr() / (na * nb)).min(1.0)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::qasm::parse;

    /// A reference simulator that shares nothing with the kernels above: every gate as a sum
    /// over basis states of the logical index, on one dense vector.
    pub fn dense(circ: &Circuit) -> Vec<C> {
        let n = 1usize << circ.qubits;
        let mut v = vec![C::ZERO; n];
        v[0] = C::ONE;
        for (op, _) in circ.ops() {
            let mut w = vec![C::ZERO; n];
            for i in 0..n {
                match op {
                    Op::Swap(a, b) => {
                        let (x, y) = ((i >> a) & 1, (i >> b) & 1);
                        let j = (i & !(1 << a) & !(1 << b)) | (y << a) | (x << b);
                        w[j] = v[i];
                    }
                    Op::U {
                        target,
                        controls,
                        m,
                    } => {
                        if controls.iter().any(|&c| (i >> c) & 1 == 0) {
                            w[i] = w[i] + v[i];
                            continue;
                        }
                        let bit = (i >> target) & 1;
                        for (out, row) in m.iter().enumerate() {
                            let j = (i & !(1 << target)) | (out << target);
                            w[j] = w[j] + row[bit] * v[i];
                        }
                    }
                }
            }
            v = w;
        }
        v
    }

    /// Run `plan` on `p` in-process ranks; `exchange(swap#, sent, received)` may alter what
    /// arrives. Returns the full vector in logical order.
    pub fn run_ranks<E: Amp>(
        plan: &Plan,
        p: usize,
        mut exchange: impl FnMut(usize, &mut [E]),
    ) -> Vec<C> {
        let l = plan.local;
        let mut vs: Vec<Vec<E>> = (0..p).map(|_| vec![E::default(); 1 << l]).collect();
        vs[0][0] = E::put(C::ONE);
        let mut nswap = 0;
        for st in &plan.steps {
            match st {
                Step::Gate(k) => {
                    for (r, v) in vs.iter_mut().enumerate() {
                        apply(v, k, r, l);
                    }
                }
                Step::Swap { global, local, .. } => {
                    let mut outs: Vec<Vec<E>> = Vec::new();
                    for (r, v) in vs.iter().enumerate() {
                        let (_, s) = swap_partner(r, *global, l);
                        let mut o = vec![E::default(); v.len() / 2];
                        pack(v, *local, s, &mut o);
                        outs.push(o);
                    }
                    for (r, v) in vs.iter_mut().enumerate() {
                        let (partner, s) = swap_partner(r, *global, l);
                        let mut got = outs[partner].clone();
                        exchange(nswap, &mut got);
                        unpack(v, *local, s, &got);
                    }
                    nswap += 1;
                }
            }
        }
        let flat: Vec<E> = vs.concat();
        (0..1usize << plan.qubits)
            .map(|i| flat[plan.physical(i)].get())
            .collect()
    }

    pub fn fid(a: &[C], b: &[C]) -> f64 {
        let mut s = (C::ZERO, 0.0, 0.0);
        for (p, q) in a.iter().zip(b) {
            s.0 = s.0 + p.conj() * *q;
            s.1 += p.norm_sqr();
            s.2 += q.norm_sqr();
        }
        fidelity_of(s.0, s.1, s.2)
    }

    /// A small circuit with every kind of gate on every kind of qubit.
    pub const MIXED: &str = "OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[4];\nqreg r[2];\n\
        h q;\nx r[1];\nu(0.3, 0.2, -0.7) q[3];\ncx q[0], r[0];\ncp(pi/8) r[1], q[1];\n\
        rzz(0.4) q[2], r[1];\nswap q[0], r[1];\nccx r[0], r[1], q[2];\nry(1.1) r[0];\n\
        crx(0.5) r[0], r[1];\nsx q[1];\ncu(0.1,0.2,0.3,0.4) q[3], r[0];\ncswap q[0], r[0], q[3];\n\
        t r[0];\nsdg r[1];\ny q[2];\nch q[1], r[1];\nrx(2.5) r[1];\nrz(0.9) q[0];\n";

    #[test]
    fn distributed_equals_dense_for_every_rank_count() {
        let circ = parse(MIXED).unwrap();
        let want = dense(&circ);
        let norm: f64 = want.iter().map(|c| c.norm_sqr()).sum();
        assert!((norm - 1.0).abs() < 1e-12);
        for k in 0..=5 {
            let pl = plan(&circ, k).unwrap();
            let got = run_ranks::<[f64; 2]>(&pl, 1 << k, |_, _| {});
            let maxd = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (*a - *b).norm_sqr().sqrt())
                .fold(0.0, f64::max);
            assert!(maxd < 1e-13, "k={k}: max deviation {maxd}");
            if k == 0 {
                assert_eq!(pl.swaps(), 0);
            }
        }
        assert!(plan(&circ, 6).is_err());
    }

    #[test]
    fn diagonal_gates_and_swaps_never_exchange() {
        let circ = parse(
            "OPENQASM 2.0;\nqreg q[4];\nh q[0];\nh q[1];\ncp(0.3) q[0], q[3];\nrz(0.1) q[3];\n\
             cz q[2], q[3];\nswap q[3], q[0];\nrzz(0.2) q[2], q[3];\ncx q[3], q[1];\n",
        )
        .unwrap();
        let pl = plan(&circ, 2).unwrap();
        assert_eq!(pl.swaps(), 0, "{:?}", pl.steps);
        // h on a global qubit: one swap, then later gates on the evicted one may need more
        let circ = parse("OPENQASM 2.0;\nqreg q[3];\nh q[2];\nh q[2];\nh q[0];\n").unwrap();
        let pl = plan(&circ, 1).unwrap();
        assert_eq!(pl.swaps(), 1);
        // Belady: q[1] is never used again, q[0] is: q[1] must be the one evicted
        assert!(matches!(
            pl.steps[0],
            Step::Swap {
                local: 1,
                qubit: 2,
                ..
            }
        ));
    }

    #[test]
    fn pack_unpack_round_trip() {
        let v: Vec<[f64; 2]> = (0..32).map(|i| [i as f64, 0.0]).collect();
        for b in 0..5 {
            for s in 0..2 {
                let mut o = vec![[0.0; 2]; 16];
                pack(&v, b, s, &mut o);
                assert!(o.iter().all(|x| ((x[0] as usize) >> b) & 1 == s));
                let mut w = vec![[0.0; 2]; 32];
                unpack(&mut w, b, s, &o);
                for (i, x) in w.iter().enumerate() {
                    let expect = if (i >> b) & 1 == s { i as f64 } else { 0.0 };
                    assert_eq!(x[0], expect);
                }
            }
        }
    }
}
