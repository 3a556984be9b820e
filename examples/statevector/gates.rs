//! Complex numbers, 2×2 gate matrices and the gate set of the QASM front end.
//!
//! Every gate is lowered to [`Op`]s: a 2×2 unitary on one target qubit, applied where all of its
//! control qubits are 1 (`x`, `cx`, `ccx`, `cp`, ... are all of that form), or a qubit [`Op::Swap`]
//! (which the simulator performs by relabelling, without touching the amplitudes). Matrices follow
//! Qiskit's conventions (`rz(θ) = diag(e^{-iθ/2}, e^{iθ/2})`, `u(θ,φ,λ)` as Qiskit's `UGate`), so
//! a dumped state matches `qiskit.quantum_info.Statevector` of the same QASM up to nothing at all:
//! not even a global phase.

/// A complex number in f64 (all gate arithmetic runs in f64, whatever the storage precision:
/// see [`crate::fidelity`] for why that matters to the error budget).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct C {
    pub re: f64,
    pub im: f64,
}

impl C {
    pub const ZERO: C = C { re: 0.0, im: 0.0 };
    pub const ONE: C = C { re: 1.0, im: 0.0 };
    pub const fn new(re: f64, im: f64) -> C {
        C { re, im }
    }
    /// `e^{iφ}`.
    pub fn cis(phi: f64) -> C {
        C::new(phi.cos(), phi.sin())
    }
    pub fn conj(self) -> C {
        C::new(self.re, -self.im)
    }
    pub fn norm_sqr(self) -> f64 {
        self.re * self.re + self.im * self.im
    }
    pub fn scale(self, s: f64) -> C {
        C::new(self.re * s, self.im * s)
    }
}

impl std::ops::Add for C {
    type Output = C;
    fn add(self, o: C) -> C {
        C::new(self.re + o.re, self.im + o.im)
    }
}

impl std::ops::Sub for C {
    type Output = C;
    fn sub(self, o: C) -> C {
        C::new(self.re - o.re, self.im - o.im)
    }
}

impl std::ops::Mul for C {
    type Output = C;
    fn mul(self, o: C) -> C {
        C::new(
            self.re * o.re - self.im * o.im,
            self.re * o.im + self.im * o.re,
        )
    }
}

/// A 2×2 matrix, row major: `m[row][col]`.
pub type Mat2 = [[C; 2]; 2];

/// Whether `m` is diagonal (exactly: a diagonal gate on a global qubit needs no exchange, so
/// this decides communication and must not depend on rounding noise).
pub fn is_diagonal(m: &Mat2) -> bool {
    m[0][1] == C::ZERO && m[1][0] == C::ZERO
}

fn diag(a: C, b: C) -> Mat2 {
    [[a, C::ZERO], [C::ZERO, b]]
}

/// Qiskit's `UGate(θ, φ, λ)` (= OpenQASM's `U` and `u3`).
pub fn u3(theta: f64, phi: f64, lambda: f64) -> Mat2 {
    let (s, c) = (theta / 2.0).sin_cos();
    // exact zeros for θ = 0 keep `u(0,0,λ)` diagonal (communication-free on global qubits)
    let s = if theta == 0.0 { 0.0 } else { s };
    [
        [C::new(c, 0.0), C::cis(lambda).scale(-s)],
        [C::cis(phi).scale(s), C::cis(phi + lambda).scale(c)],
    ]
}

/// Phase gate `diag(1, e^{iλ})` (`p`, `u1`, `cp`'s target part).
pub fn phase(lambda: f64) -> Mat2 {
    diag(C::ONE, C::cis(lambda))
}

pub fn rx(t: f64) -> Mat2 {
    let (s, c) = (t / 2.0).sin_cos();
    [
        [C::new(c, 0.0), C::new(0.0, -s)],
        [C::new(0.0, -s), C::new(c, 0.0)],
    ]
}

pub fn ry(t: f64) -> Mat2 {
    let (s, c) = (t / 2.0).sin_cos();
    [
        [C::new(c, 0.0), C::new(-s, 0.0)],
        [C::new(s, 0.0), C::new(c, 0.0)],
    ]
}

pub fn rz(t: f64) -> Mat2 {
    diag(C::cis(-t / 2.0), C::cis(t / 2.0))
}

/// One elementary operation on logical qubits.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `m` on `target` where every qubit of `controls` is 1.
    U {
        target: usize,
        controls: Vec<usize>,
        m: Mat2,
    },
    /// Exchange two qubits.
    Swap(usize, usize),
}

/// Parameters and qubits of a gate, by name: `Some((params, qubits))`, `None` if unknown.
pub fn arity(name: &str) -> Option<(usize, usize)> {
    Some(match name {
        "id" | "x" | "y" | "z" | "h" | "s" | "sdg" | "t" | "tdg" | "sx" | "sxdg" => (0, 1),
        "rx" | "ry" | "rz" | "p" | "u1" => (1, 1),
        "u2" => (2, 1),
        "u" | "u3" | "U" => (3, 1),
        "cx" | "CX" | "cy" | "cz" | "ch" | "swap" => (0, 2),
        "crx" | "cry" | "crz" | "cp" | "cu1" | "rzz" => (1, 2),
        "cu3" => (3, 2),
        "cu" => (4, 2),
        "ccx" | "cswap" => (0, 3),
        _ => return None,
    })
}

/// The names [`lower`] knows (for error messages).
pub const GATE_NAMES: &str = "u, u3, u2, u1, U, p, rx, ry, rz, h, x, y, z, s, sdg, t, tdg, sx, \
    sxdg, id, cx, CX, cy, cz, ch, crx, cry, crz, cp, cu1, cu3, cu, rzz, swap, ccx, cswap";

/// Lower gate `name` with `p` (its parameters, as many as [`arity`] says) on qubits `q` (as many
/// as [`arity`] says, distinct) into elementary operations, appended to `out`. Returns false
/// (and appends nothing) for a name [`arity`] does not know.
pub fn lower(name: &str, p: &[f64], q: &[usize], out: &mut Vec<Op>) -> bool {
    use std::f64::consts::{FRAC_1_SQRT_2, FRAC_PI_2, FRAC_PI_4};
    let one = |m: Mat2| Op::U {
        target: q[0],
        controls: vec![],
        m,
    };
    // controlled-m with control q[0], target q[1]
    let ctl = |m: Mat2| Op::U {
        target: q[1],
        controls: vec![q[0]],
        m,
    };
    let (o, i) = (C::ZERO, C::ONE);
    let x = [[o, i], [i, o]];
    let y = [[o, C::new(0.0, -1.0)], [C::new(0.0, 1.0), o]];
    let h = {
        let r = C::new(FRAC_1_SQRT_2, 0.0);
        [[r, r], [r, r.scale(-1.0)]]
    };
    let op = match name {
        "id" => return true,
        "x" => one(x),
        "y" => one(y),
        "z" => one(diag(i, C::new(-1.0, 0.0))),
        "h" => one(h),
        "s" => one(diag(i, C::new(0.0, 1.0))),
        "sdg" => one(diag(i, C::new(0.0, -1.0))),
        "t" => one(phase(FRAC_PI_4)),
        "tdg" => one(phase(-FRAC_PI_4)),
        "sx" | "sxdg" => {
            let (a, b) = (C::new(0.5, 0.5), C::new(0.5, -0.5));
            one(if name == "sx" {
                [[a, b], [b, a]]
            } else {
                [[b, a], [a, b]]
            })
        }
        "rx" => one(rx(p[0])),
        "ry" => one(ry(p[0])),
        "rz" => one(rz(p[0])),
        "p" | "u1" => one(phase(p[0])),
        "u2" => one(u3(FRAC_PI_2, p[0], p[1])),
        "u" | "u3" | "U" => one(u3(p[0], p[1], p[2])),
        "cx" | "CX" => ctl(x),
        "cy" => ctl(y),
        "cz" => ctl(diag(i, C::new(-1.0, 0.0))),
        "ch" => ctl(h),
        "crx" => ctl(rx(p[0])),
        "cry" => ctl(ry(p[0])),
        "crz" => ctl(rz(p[0])),
        "cp" | "cu1" => ctl(phase(p[0])),
        "cu3" => ctl(u3(p[0], p[1], p[2])),
        // Qiskit's CUGate: controlled e^{iγ}·U(θ,φ,λ) (the phase is relative, hence physical)
        "cu" => {
            let g = C::cis(p[3]);
            let m = u3(p[0], p[1], p[2]);
            ctl([[g * m[0][0], g * m[0][1]], [g * m[1][0], g * m[1][1]]])
        }
        "swap" => Op::Swap(q[0], q[1]),
        // rzz(θ) = exp(-iθ/2 Z⊗Z): rz(θ) on q1 when q0 = 0, rz(-θ) when q0 = 1, i.e.
        // rz(θ) on q1 then crz(-2θ): both diagonal, so never an exchange
        "rzz" => {
            out.push(Op::U {
                target: q[1],
                controls: vec![],
                m: rz(p[0]),
            });
            ctl(rz(-2.0 * p[0]))
        }
        "ccx" => Op::U {
            target: q[2],
            controls: vec![q[0], q[1]],
            m: x,
        },
        // Fredkin as cx(c→b); ccx(a,b→c); cx(c→b)
        "cswap" => {
            let cx_cb = Op::U {
                target: q[1],
                controls: vec![q[2]],
                m: x,
            };
            out.push(cx_cb.clone());
            out.push(Op::U {
                target: q[2],
                controls: vec![q[0], q[1]],
                m: x,
            });
            cx_cb
        }
        _ => return false,
    };
    out.push(op);
    true
}
