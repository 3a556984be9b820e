#!/usr/bin/env python3
"""DCD trajectory (CHARMM / NAMD / LAMMPS) -> raw little-endian f32 AoS particle frames.

Writes x y z of every atom, frame after frame (what `zcomm compress --codec gpz --dims Nx3` and
the `gpz_ratio_files` report read). Used for the GPZ ratio record in BENCHMARKS.md, on the DCD
files of the `mdanalysistests` 2.11.0 package (PyPI):

    pip download --no-deps mdanalysistests==2.11.0 -d /tmp/mdat
    tar xzf /tmp/mdat/mdanalysistests-2.11.0.tar.gz -C /tmp/mdat
    python3 scripts/dcd_to_f32.py /tmp/mdat/.../adk_dims.dcd /tmp/adk_dims.f32

Prints the file name, the atom count and the frame count. Standard library only.
"""
import array
import struct
import sys


def records(b):
    """The Fortran unformatted records of `b` (4-byte length, payload, the same length)."""
    at = 0
    while at + 4 <= len(b):
        (n,) = struct.unpack_from("<i", b, at)
        rec = b[at + 4 : at + 4 + n]
        (n2,) = struct.unpack_from("<i", b, at + 4 + n)
        if n != n2:
            sys.exit(f"corrupt record at byte {at}: lengths {n} and {n2}")
        yield rec
        at += 8 + n


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: dcd_to_f32.py IN.dcd OUT.f32")
    src, dst = sys.argv[1], sys.argv[2]
    b = open(src, "rb").read()
    it = records(b)
    hdr = next(it)
    if hdr[:4] != b"CORD":
        sys.exit(f"{src}: not a little-endian DCD file")
    icntrl = struct.unpack_from("<20i", hdr, 4)
    has_cell = icntrl[10] != 0  # a unit-cell record precedes every frame
    next(it)  # title
    natom = struct.unpack("<i", next(it))[0]
    frames = 0
    with open(dst, "wb") as out:
        while True:
            try:
                if has_cell:
                    next(it)
                x = array.array("f", next(it))
                y = array.array("f", next(it))
                z = array.array("f", next(it))
            except StopIteration:
                break
            a = array.array("f", [0.0]) * (3 * natom)
            a[0::3], a[1::3], a[2::3] = x, y, z
            out.write(a.tobytes())
            frames += 1
    print(src.split("/")[-1], natom, frames)


if __name__ == "__main__":
    main()
