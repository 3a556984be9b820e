//! Built-in circuits (`--circuit NAME:N`), written as QASM and read by the same parser as a file,
//! so that they exercise the same path; deterministic.

use std::fmt::Write;

/// QASM text of `spec` (`qft:N`, `ghz:N` or `random:N`).
pub fn qasm(spec: &str) -> Result<String, String> {
    let (name, n) = spec
        .split_once(':')
        .ok_or_else(|| "expected NAME:QUBITS (qft:20, ghz:20, random:20)".to_string())?;
    let n: usize = n
        .parse()
        .ok()
        .filter(|&n| (2..=60).contains(&n))
        .ok_or_else(|| "QUBITS must be an integer in 2..=60".to_string())?;
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
            for layer in 0..8 {
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
        _ => {
            return Err(format!(
                "--circuit {spec}: unknown circuit `{name}` (qft, ghz, random)"
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
        for c in ["qft:6", "ghz:6", "random:6"] {
            let circ = parse(&super::qasm(c).unwrap()).unwrap();
            assert_eq!(circ.qubits, 6);
        }
        let v = dense(&parse(&super::qasm("ghz:5").unwrap()).unwrap());
        let mut want = vec![C::ZERO; 32];
        want[0] = C::new(std::f64::consts::FRAC_1_SQRT_2, 0.0);
        want[31] = want[0];
        assert!(fid(&v, &want) > 1.0 - 1e-15);
        for bad in ["qft", "qft:1", "qft:x", "foo:5", "ghz:61"] {
            assert!(super::qasm(bad).is_err(), "{bad}");
        }
    }
}
