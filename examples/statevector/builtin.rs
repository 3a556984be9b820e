//! Built-in circuits (`--circuit NAME:N`), written as QASM and read by the same parser as a file,
//! so that they exercise the same path; deterministic.

use std::fmt::Write;

/// QASM text of `spec`: `qft:N`, `ghz:N`, `random:N[:LAYERS]` (default 8 layers of random `u`
/// on every qubit and a brick of `cx`) or `qaoa:N[:LAYERS]` (MaxCut on the ring of `N` vertices,
/// default 12 layers of `rzz` on every edge then `rx` on every qubit, with an annealing-like
/// schedule of angles).
pub fn qasm(spec: &str) -> Result<String, String> {
    let usage = "expected NAME:QUBITS[:LAYERS] (qft:20, ghz:20, random:20, random:20:12, qaoa:20)";
    let mut parts = spec.split(':');
    let name = parts.next().unwrap_or_default();
    let n: usize = parts
        .next()
        .ok_or_else(|| usage.to_string())?
        .parse()
        .ok()
        .filter(|&n| (2..=60).contains(&n))
        .ok_or_else(|| "QUBITS must be an integer in 2..=60".to_string())?;
    let layers: Option<usize> = match parts.next() {
        None => None,
        Some(l) => Some(
            l.parse()
                .ok()
                .filter(|&l| (1..=1000).contains(&l) && matches!(name, "random" | "qaoa"))
                .ok_or_else(|| {
                    format!(
                        "--circuit {spec}: LAYERS is an integer in 1..=1000, for random and qaoa"
                    )
                })?,
        ),
    };
    if parts.next().is_some() {
        return Err(usage.to_string());
    }
    let mut s = format!("OPENQASM 2.0;\ninclude \"qelib1.inc\";\nqreg q[{n}];\n");
    // xorshift64: the same circuit on every rank and every run
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let tau = std::f64::consts::TAU;
    // (writing to a String cannot fail)
    match name {
        "ghz" => {
            let _ = writeln!(s, "h q[0];");
            for q in 0..n - 1 {
                let _ = writeln!(s, "cx q[{q}], q[{}];", q + 1);
            }
        }
        "qft" => {
            // a product state first: the QFT of |0…0⟩ is the uniform state
            for q in 0..n {
                let _ = writeln!(
                    s,
                    "ry({}) q[{q}];\nrz({}) q[{q}];",
                    rnd() * 3.0,
                    rnd() * tau
                );
            }
            for j in (0..n).rev() {
                let _ = writeln!(s, "h q[{j}];");
                for k in (0..j).rev() {
                    let _ = writeln!(s, "cp(pi/{}) q[{j}], q[{k}];", 1u64 << (j - k).min(62));
                }
            }
            for q in 0..n / 2 {
                let _ = writeln!(s, "swap q[{q}], q[{}];", n - 1 - q);
            }
        }
        "random" => {
            for layer in 0..layers.unwrap_or(8) {
                for q in 0..n {
                    let _ = writeln!(
                        s,
                        "u({}, {}, {}) q[{q}];",
                        rnd() * tau,
                        rnd() * tau,
                        rnd() * tau
                    );
                }
                for q in (layer % 2..n - 1).step_by(2) {
                    let _ = writeln!(s, "cx q[{q}], q[{}];", q + 1);
                }
            }
        }
        "qaoa" => {
            let p = layers.unwrap_or(12);
            for q in 0..n {
                let _ = writeln!(s, "h q[{q}];");
            }
            for l in 0..p {
                let t = (l as f64 + 0.5) / p as f64;
                let (gamma, beta) = (0.8 * t, 0.7 * (1.0 - t));
                for q in 0..n {
                    let _ = writeln!(s, "rzz({gamma}) q[{q}], q[{}];", (q + 1) % n);
                }
                for q in 0..n {
                    let _ = writeln!(s, "rx({}) q[{q}];", 2.0 * beta);
                }
            }
        }
        _ => {
            return Err(format!(
                "--circuit {spec}: unknown circuit `{name}` (qft, ghz, random, qaoa)"
            ))
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use crate::gates::C;
    use crate::qasm::parse;
    use crate::sim::tests::{dense, fid};

    #[test]
    fn builtin_circuits_parse_and_ghz_is_ghz() {
        for c in [
            "qft:6",
            "ghz:6",
            "random:6",
            "random:6:3",
            "qaoa:6",
            "qaoa:6:2",
        ] {
            let circ = parse(&super::qasm(c).unwrap()).unwrap();
            assert_eq!(circ.qubits, 6);
        }
        let v = dense(&parse(&super::qasm("ghz:5").unwrap()).unwrap());
        let mut want = vec![C::ZERO; 32];
        want[0] = C::new(std::f64::consts::FRAC_1_SQRT_2, 0.0);
        want[31] = want[0];
        assert!(fid(&v, &want) > 1.0 - 1e-15);
        for bad in [
            "qft",
            "qft:1",
            "qft:x",
            "foo:5",
            "ghz:61",
            "qft:6:2",
            "random:6:0",
            "qaoa:6:2:1",
        ] {
            assert!(super::qasm(bad).is_err(), "{bad}");
        }
    }
}
