"""Compare states dumped by the statevector example with qiskit.quantum_info.Statevector.

Usage: python compare.py MANIFEST

Each line of MANIFEST: `QASM DUMP DTYPE MIN_FIDELITY [JSON]`. For each line the exact state of
the QASM circuit is computed with Qiskit (the file is read by Qiskit's own QASM 2 loader, so the
two programs' readings of the gates are compared too) and the fidelity
|<psi_qiskit|psi_dump>|^2 / (<psi_qiskit|psi_qiskit> <psi_dump|psi_dump>) must be at least
MIN_FIDELITY. With JSON (the example's --json report), its own ok flag must be set and the
fidelity it certified must be at least MIN_FIDELITY as well. Prints one line per entry; exits 1
if any fails.
"""

import json
import sys

import numpy as np
from qiskit import qasm2
from qiskit.quantum_info import Statevector

_cache = {}


def exact(path):
    if path not in _cache:
        qc = qasm2.load(path, custom_instructions=qasm2.LEGACY_CUSTOM_INSTRUCTIONS)
        _cache[path] = Statevector(qc).data
    return _cache[path]


def main():
    failed = 0
    rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
    for row in rows:
        qasm, dump, dtype, min_f = row[:4]
        report = row[4] if len(row) > 4 else None
        want = exact(qasm)
        got = np.fromfile(dump, dtype={"c64": "<c8", "c128": "<c16"}[dtype]).astype(np.complex128)
        problems = []
        if got.size != want.size:
            problems.append(f"{got.size} amplitudes, expected {want.size}")
            fid = 0.0
        else:
            ov = np.vdot(want, got)
            fid = float(abs(ov) ** 2 / (np.vdot(want, want).real * np.vdot(got, got).real))
            if not fid >= float(min_f):
                problems.append(f"fidelity below {min_f}")
        extra = ""
        if report:
            with open(report) as f:
                rep = json.load(f)
            if not rep.get("ok"):
                problems.append("the example's report says not ok")
            cert = rep.get("certified_fidelity")
            if cert is not None and not cert >= float(min_f):
                problems.append(f"certified fidelity {cert} below {min_f}")
            extra = (f" ranks {rep['ranks']} swaps {len(rep['swaps'])}"
                     f" certified {cert:.9f}"
                     + (f" vs-raw {rep['fidelity']:.12f}" if rep.get("fidelity") is not None else ""))
        status = "FAILED: " + "; ".join(problems) if problems else "ok"
        print(f"{dump}: {dtype} fidelity vs qiskit {fid:.14f} (1-F {1 - fid:.2e}, need >= {min_f})"
              f"{extra}: {status}")
        failed += bool(problems)
    print(f"qsim compare: {len(rows) - failed}/{len(rows)} passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
