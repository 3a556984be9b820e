//! From a fidelity the user asks for to the error bound of each exchange, and back.
//!
//! # The quantity
//!
//! The fidelity of two pure states is `F(a, b) = |<a|b>|² / (<a|a><b|b>)`: `1` for the same
//! state (up to a global phase), and what `qiskit.quantum_info.state_fidelity` computes for
//! normalised vectors. `--fidelity F` asks that the state of the compressed run (`b`) has
//! `F(a, b) ≥ F` against the exact state of the circuit, and also against this program's own
//! uncompressed run (`a`), which is what the report measures.
//!
//! # Lemma 1: distance → fidelity
//!
//! If `‖b − a‖ ≤ ε < ‖a‖` then `F(a, b) ≥ 1 − ε²/‖a‖²`.
//!
//! *Proof.* Let `θ` be the (Hermitian) angle between `a` and `b`: `cos θ = |<a|b>|/(‖a‖‖b‖)`,
//! so `F = cos² θ`. The distance from `a` to the complex line `{λb}` is `‖a‖ sin θ`, and `b`
//! lies on that line, so `‖a‖ sin θ ≤ ‖a − b‖ ≤ ε`. Hence `F = 1 − sin² θ ≥ 1 − ε²/‖a‖²`. ∎
//!
//! # Lemma 2: errors of the exchanges add up
//!
//! The compressed run differs from the uncompressed one only where an exchange delivered values
//! that are not the ones sent. Write the exchange `k` of the compressed run as "exact exchange,
//! then add an error vector `e_k`"; everything that follows it (gates, exact relabelling, later
//! exchanges) is linear and norm-preserving (unitary), so by linearity the final state is
//! `b = a + Σ_k V_k e_k` with `V_k` unitary, and `‖b − a‖ ≤ Σ_k ‖e_k‖`.
//!
//! # Lemma 3: one exchange
//!
//! An index-bit swap moves half of the amplitudes: `2^(n−1)` complex numbers over all ranks,
//! `2^n` real scalars. Under `abs:δ` (zcomm compresses a complex buffer as its interleaved
//! scalars and guarantees `|x − x'| ≤ δ` for each, verified in the quantizer, including the
//! rounding of the reconstruction), `‖e_k‖² ≤ 2^n δ²`, i.e. `‖e_k‖ ≤ δ √(2^n)`. Under `rel:E`,
//! `|x − x'| ≤ E|x|` gives `‖e_k‖ ≤ E ‖sent part‖ ≤ E`. After a run, the bound each rank's
//! message actually had (`OpStats::bound`, which for `noa` is the absolute bound it resolved to)
//! certifies `‖e_k‖² ≤ Σ_ranks (scalars sent) · bound²` ([`certified_eps`]).
//!
//! # Floating-point rounding
//!
//! Both runs round: every gate computes `m·x` in f64 and stores it in the storage precision.
//! For a 2×2 complex `m` applied to a pair, each output component is a 4-term f64 dot product
//! (error ≤ `γ₄ Σ|terms|`, `γ₄ = 4u₆₄/(1−4u₆₄)`), which over the whole vector is at most
//! `2γ₄‖x‖` (`|m|` has 2-norm ≤ √2, and re/im give another √2); storing in f32 adds `u₃₂‖y‖`.
//! The matrix itself is computed in f64 from the parameters (a few ulp per entry), which
//! perturbs a gate by `‖m̃ − m‖ ≤ μ = 1e-14` (a generous bound for any libm). So each pass over
//! the state (each [`crate::sim::Step::Gate`]) moves a run away from the exact state by at
//! most `r = u_store + 2γ₄ + μ` times its norm (≤ 2 with the slack below), and `G` passes by
//! `2Gr`. Exchanges and `swap` gates only move values: no rounding.
//!
//! # The budget
//!
//! With `ε_F = √(1 − F)` and `ρ = 2·G·r` (one run's rounding, norm ≤ 2 included), we need
//! against the exact state `ε_c + ρ ≤ ε_F (1 − ρ)`, and against the uncompressed run
//! (`‖a‖ ≥ 1 − ρ`, both runs round) `ε_c + 2ρ ≤ ε_F (1 − ρ)`. [`budget`] takes the second (the
//! stronger), with a factor 1.001 on `ε_c` for the `(1 + μ)^G` growth of non-exactly-unitary
//! rounded gates: `ε_c = (ε_F (1 − ρ) − 2ρ) / 1.001`. With `S` exchanges (known from the plan
//! before anything runs), Lemmas 2 and 3 give the bound for each: `δ = ε_c / (S √(2^n))`.
//!
//! If `ε_c ≤ 0`, rounding alone could cost the requested fidelity (an `F` very close to 1 in
//! c64 on a long circuit): that is an error, not a silently weaker guarantee.

/// Unit roundoff of f64.
const U64: f64 = f64::EPSILON / 2.0;
/// Bound on `‖m̃ − m‖` of a gate matrix computed in f64 (see the module docs).
const MU: f64 = 1e-14;

/// One run's worst-case distance from the exact state due to rounding, for `passes` gate
/// passes with storage unit roundoff `u_store` (`ρ` in the module docs).
pub fn rounding(passes: usize, u_store: f64) -> f64 {
    let g4 = 4.0 * U64 / (1.0 - 4.0 * U64);
    2.0 * passes as f64 * (u_store + 2.0 * g4 + MU)
}

/// The compression budget `ε_c` (total ‖b − a‖ the exchanges may cause) for fidelity `f`.
pub fn budget(f: f64, passes: usize, u_store: f64) -> Result<f64, String> {
    if !(f > 0.0 && f < 1.0) {
        return Err(format!("--fidelity {f}: must lie strictly between 0 and 1"));
    }
    let eps_f = (1.0 - f).sqrt();
    let rho = rounding(passes, u_store);
    let eps_c = (eps_f * (1.0 - rho) - 2.0 * rho) / 1.001;
    if eps_c <= 0.0 {
        return Err(format!(
            "--fidelity {f} is out of reach at this precision: {passes} gate passes may lose \
             up to ‖Δψ‖ = {:.2e} to rounding alone (more than √(1−F) = {eps_f:.2e}); use \
             --dtype c128 or a lower fidelity",
            2.0 * rho
        ));
    }
    Ok(eps_c)
}

/// The `abs` bound per exchanged scalar for fidelity `f` on `qubits` qubits with `swaps`
/// exchanges (`None` when there are none: nothing is compressed).
pub fn abs_bound(
    f: f64,
    qubits: usize,
    swaps: usize,
    passes: usize,
    u_store: f64,
) -> Result<Option<f64>, String> {
    let eps_c = budget(f, passes, u_store)?;
    if swaps == 0 {
        return Ok(None);
    }
    // 1e-9 below the exact share, so that the fidelity certified afterwards from the bounds
    // the messages report (the same sum, rounded differently) cannot land an ulp below F
    let per = eps_c / (swaps as f64 * (2f64).powi(qubits as i32).sqrt());
    Ok(Some(per * (1.0 - 1e-9)))
}

/// `‖e_k‖` certified by one exchange: `sq` is `Σ_ranks (scalars sent) · bound²` for abs/noa,
/// or `Σ_ranks bound² · ‖sent‖²` for rel (Lemma 3).
pub fn certified_eps(sq: &[f64]) -> f64 {
    sq.iter().map(|s| s.sqrt()).sum()
}

/// The fidelity certified for total compression error `eps_c` (Lemmas 1 and 2 with the
/// rounding slack of [`budget`]), against the uncompressed run.
pub fn certified_fidelity(eps_c: f64, passes: usize, u_store: f64) -> f64 {
    let rho = rounding(passes, u_store);
    let d = (1.001 * eps_c + 2.0 * rho) / (1.0 - rho);
    if d >= 1.0 {
        0.0
    } else {
        1.0 - d * d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::C;
    use crate::qasm::parse;
    use crate::sim::tests::{dense, fid, run_ranks};
    use crate::sim::{plan, Amp};

    /// A 10-qubit circuit with many exchanges on 4 ranks.
    fn circuit() -> String {
        let mut s = String::from("OPENQASM 2.0;\nqreg q[10];\n");
        for layer in 0..6 {
            for q in 0..10 {
                s += &format!("u({}, {}, {}) q[{q}];\n", 0.3 + q as f64 * 0.1, layer, 0.7);
            }
            for q in (layer % 2..9).step_by(2) {
                s += &format!("cx q[{q}], q[{}];\n", q + 1);
            }
        }
        s
    }

    /// Inject the worst admissible error (every exchanged scalar off by ±δ, signs from a
    /// generator) and check the requested fidelity holds — and that the guarantee is not
    /// vacuous (the loss is within a few orders of magnitude of the budget).
    fn check<E: Amp>(f: f64) {
        let circ = parse(&circuit()).unwrap();
        let pl = plan(&circ, 2).unwrap();
        let s = pl.swaps();
        assert!(s >= 6, "{s} swaps");
        let u = E::UNIT_ROUNDOFF;
        let delta = abs_bound(f, 10, s, pl.gate_passes(), u).unwrap().unwrap();
        let exact = dense(&circ);
        let raw = run_ranks::<E>(&pl, 4, |_, _| {});
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let zc = run_ranks::<E>(&pl, 4, |_, got| {
            for x in E::scalars_mut(got) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let v = <E::Scalar as zcomm::Element>::to_f64(*x);
                let d = if seed & 1 == 1 { delta } else { -delta };
                // round toward the error's direction, then clamp into the bound (what a
                // verified quantizer guarantees)
                let mut y = <E::Scalar as zcomm::Element>::from_f64(v + d);
                if (<E::Scalar as zcomm::Element>::to_f64(y) - v).abs() > delta {
                    y = <E::Scalar as zcomm::Element>::from_f64(v);
                }
                *x = y;
            }
        });
        let (f_raw, f_exact) = (fid(&raw, &zc), fid(&exact, &zc));
        assert!(f_raw >= f, "vs raw: {f_raw} < {f}");
        assert!(f_exact >= f, "vs exact: {f_exact} < {f}");
        // not vacuous: the injected errors cost at least 1% of the allowed infidelity
        assert!(
            1.0 - f_raw > 0.01 * (1.0 - f),
            "1-F = {} vs {}",
            1.0 - f_raw,
            1.0 - f
        );
    }

    #[test]
    fn worst_case_errors_keep_the_requested_fidelity_c128() {
        for f in [0.9, 0.999, 0.999999] {
            check::<[f64; 2]>(f);
        }
    }

    #[test]
    fn worst_case_errors_keep_the_requested_fidelity_c64() {
        for f in [0.9, 0.999] {
            check::<[f32; 2]>(f);
        }
    }

    #[test]
    fn lemma1_holds_and_is_tight() {
        // a random unit vector, b = a + e with ‖e‖ = ε: F(a, b) ≥ 1 − ε², with equality to
        // O(ε⁴) when e ⟂ a (the bound cannot be improved)
        let n = 64;
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let a: Vec<C> = (0..n).map(|_| C::new(rnd(), rnd())).collect();
        let na: f64 = a.iter().map(|x| x.norm_sqr()).sum::<f64>().sqrt();
        let a: Vec<C> = a.iter().map(|x| x.scale(1.0 / na)).collect();
        for eps in [1e-1, 1e-2, 1e-3] {
            for _ in 0..20 {
                let e: Vec<C> = (0..n).map(|_| C::new(rnd(), rnd())).collect();
                // project out a for the orthogonal case
                let ov = a
                    .iter()
                    .zip(&e)
                    .fold(C::ZERO, |s, (x, y)| s + x.conj() * *y);
                for orth in [false, true] {
                    let e: Vec<C> = e
                        .iter()
                        .zip(&a)
                        .map(|(y, x)| if orth { *y - ov * *x } else { *y })
                        .collect();
                    let ne: f64 = e.iter().map(|x| x.norm_sqr()).sum::<f64>().sqrt();
                    let b: Vec<C> = a
                        .iter()
                        .zip(&e)
                        .map(|(x, y)| *x + y.scale(eps / ne))
                        .collect();
                    let f = fid(&a, &b);
                    assert!(f >= 1.0 - eps * eps - 1e-14, "F {f} < 1 - {eps}^2");
                    if orth {
                        assert!(
                            f - (1.0 - eps * eps) <= eps.powi(4) + 1e-14,
                            "not tight: {f}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn unreachable_fidelity_is_an_error() {
        let u32r = f32::EPSILON as f64 / 2.0;
        assert!(budget(1.0 - 1e-12, 1000, u32r).is_err());
        assert!(budget(1.0 - 1e-12, 1000, f64::EPSILON / 2.0).is_ok());
        assert!(budget(1.0, 10, u32r).is_err());
        assert!(budget(0.0, 10, u32r).is_err());
        assert_eq!(abs_bound(0.99, 10, 0, 10, u32r).unwrap(), None);
        // round trip: the certified fidelity of the whole budget is the requested one
        let e = budget(0.999, 50, u32r).unwrap();
        let back = certified_fidelity(e, 50, u32r);
        assert!((back - 0.999).abs() < 1e-12, "{back}");
        // and what S exchanges at the derived bound certify is at least the requested one
        for (f, n, s) in [(0.999, 20, 7), (0.9999, 30, 113), (0.5, 16, 1)] {
            let d = abs_bound(f, n, s, 50, u32r).unwrap().unwrap();
            let per_swap = 2f64.powi(n as i32) * d * d;
            let cert = certified_fidelity(certified_eps(&vec![per_swap; s]), 50, u32r);
            assert!(cert >= f, "{f} {n} {s}: {cert}");
        }
    }
}
