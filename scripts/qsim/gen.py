"""Generate test circuits as OpenQASM 2 with Qiskit.

Usage: python gen.py OUTDIR N [N ...]

Writes OUTDIR/{qft,ghz,qaoa,random}_N.qasm for every qubit count N. Every circuit is lowered to
the gate set the statevector example reads (transpile to a fixed basis, no optimisation), and is
measurement-free. Deterministic (fixed seeds), so a failure can be reproduced.
"""

import math
import os
import sys

import numpy as np
from qiskit import QuantumCircuit, qasm2, transpile
from qiskit.circuit.library import QFTGate

# gates the example reads natively (see examples/statevector/gates.rs)
BASIS = ["u", "p", "rx", "ry", "rz", "h", "x", "y", "z", "s", "sdg", "t", "tdg", "sx",
         "cx", "cz", "cp", "crz", "rzz", "swap", "ccx"]


def qft(n):
    """QFT applied to a non-trivial product state (QFT of |0...0> would be uniform)."""
    qc = QuantumCircuit(n)
    rng = np.random.default_rng(1)
    for q in range(n):
        qc.ry(float(rng.uniform(0, math.pi)), q)
        qc.rz(float(rng.uniform(0, 2 * math.pi)), q)
    qc.append(QFTGate(n), range(n))
    return qc


def ghz(n):
    qc = QuantumCircuit(n)
    qc.h(0)
    for q in range(n - 1):
        qc.cx(q, q + 1)
    return qc


def qaoa(n, layers=2):
    """MaxCut QAOA on a ring with chords (fixed angles)."""
    rng = np.random.default_rng(2)
    edges = [(i, (i + 1) % n) for i in range(n)] + [(i, (i + n // 2) % n) for i in range(0, n, 3)]
    qc = QuantumCircuit(n)
    qc.h(range(n))
    for layer in range(layers):
        gamma, beta = float(rng.uniform(0, math.pi)), float(rng.uniform(0, math.pi))
        for a, b in edges:
            qc.rzz(2 * gamma, a, b)
        for q in range(n):
            qc.rx(2 * beta, q)
    return qc


def random_layered(n, depth=8):
    rng = np.random.default_rng(3)
    qc = QuantumCircuit(n)
    for layer in range(depth):
        for q in range(n):
            kind = rng.integers(0, 5)
            if kind == 0:
                qc.u(*(float(x) for x in rng.uniform(0, 2 * math.pi, 3)), q)
            elif kind == 1:
                qc.rx(float(rng.uniform(0, 2 * math.pi)), q)
            elif kind == 2:
                qc.ry(float(rng.uniform(0, 2 * math.pi)), q)
            elif kind == 3:
                qc.h(q)
            else:
                qc.t(q)
        perm = rng.permutation(n)
        for i in range(0, n - 1, 2):
            a, b = int(perm[i]), int(perm[i + 1])
            if rng.integers(0, 2):
                qc.cx(a, b)
            else:
                qc.cz(a, b)
    return qc


CIRCUITS = {"qft": qft, "ghz": ghz, "qaoa": qaoa, "random": random_layered}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for n in map(int, sys.argv[2:]):
        for name, make in CIRCUITS.items():
            qc = transpile(make(n), basis_gates=BASIS, optimization_level=0)
            path = os.path.join(out, f"{name}_{n}.qasm")
            with open(path, "w") as f:
                f.write(qasm2.dumps(qc))
            print(f"{path}: {qc.num_qubits} qubits, {sum(qc.count_ops().values())} gates")


if __name__ == "__main__":
    main()
