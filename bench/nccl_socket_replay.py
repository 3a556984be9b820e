#!/usr/bin/env python3
"""Offline replay of the NCCL socket allreduce records (2xH200, v3 and v4) against the model.

Usage: python3 bench/nccl_socket_replay.py [--md]

The records hold the measured time, the prediction of the code that ran, and the worst rank's
own ratio. The calibrations are the `# profile:` lines of the runs' logs (below, verbatim). The
script ports `NcclLink` and both versions of `NcclProfile::predict_allreduce` (two ranks):

* old: the code of the run (v3: linear link, rank 0's own ratio; v4: link curve at the piece
  size, the critical-bytes ratio), `k * fixed` per round serially;
* new: `pipeline(g, n, k) = g + n + (k-1) max(g, n)` per round, the exchange of a step
  `p2p(minor) + one(major) - one(minor)` with the two directions' ratios, plus the calibrated
  preparation (range pass, copy; not calibrated in v3/v4: 0).

Ratios: `major` = the critical-bytes ratio, recovered by inverting v4's recorded prediction
(the same data and bounds compress identically in v3 and v4); rank 0's own ratio by inverting
v3's; `minor` from `1/major + 1/minor = 1/own0 + 1/own1` with `own1` = the worst rank's ratio
(a lower bound). v3/v4 did not calibrate a one-way curve, so `new` uses the pairwise curve for it
(then the larger message alone decides, as in v4); the column `new, shared` shows the model if a
one-way message took as long as half of it each way (`one(s) = p2p(s/2)`): a hypothesis, not a
calibration; the next device run measures the curve.
"""
import json, math, sys

P3 = json.loads(r"""{"transport":"socket","allreduce":{"bandwidth":2729943895.062506,"latency":0.00018566233333333387},"allgather":{"bandwidth":5328391163.184893,"latency":0.00009109728571428762},"p2p":{"bandwidth":2051278764.5878124,"latency":0.00007307038095237333},"codecs":[{"codec":"aatrox","dtype":1,"compress":566374861530.3958,"decompress":717621762934.8676,"ratio":8.320785279189328}],"piece_overhead":2.7567499999991973e-6,"compress_fixed":0.00006069257729941292,"decompress_fixed":0.00006765027397260273}""")
P4 = json.loads(r"""{"transport":"socket","allreduce":{"bandwidth":3963078514.337529,"latency":0.00011674833333333764,"points":[[262144.0,0.00019043200000000424],[1048576.0,0.00041148300000000415],[2097152.0,0.0007087509999999936],[4194304.0,0.0012234389999999928],[8388608.0,0.00227917900000002],[16777216.0,0.004422063000000004],[67108864.0,0.017122201999999975]]},"allgather":{"bandwidth":7281430666.752784,"latency":0.00008604700000000576,"points":[[524288.0,0.0001612490000000022],[2097152.0,0.0003868549999999915],[4194304.0,0.000681745999999997],[8388608.0,0.0013248219999999894],[16777216.0,0.00240758499999999],[33554432.0,0.004537689000000011],[134217728.0,0.01836234800000003]]},"p2p":{"bandwidth":2297053250.5502357,"latency":0.00007781966666666382,"points":[[262144.0,0.00017017999999999894],[1048576.0,0.0004472610000000043],[2097152.0,0.00084540000000001],[4194304.0,0.0016145960000000098],[8388608.0,0.0030981050000000177],[16777216.0,0.006381750999999991],[67108864.0,0.028293149000000017]]},"codecs":[{"codec":"aatrox","dtype":1,"compress":588107439830.7094,"decompress":799992737957.3116,"ratio":8.320785279189328}],"piece_overhead":1.2774999999964895e-6,"compress_fixed":0.00005565805675146771,"decompress_fixed":0.00006609815851272015}""")
MiB = 1048576.0
RES = "bench/results/2026-11-22-h200x2-nccl-socket-"


class Link:
    def __init__(s, d):
        s.bw, s.lat, s.pts = d["bandwidth"], d["latency"], [tuple(x) for x in d.get("points", [])]

    def time(s, b):
        b = max(b, 0.0)
        if not s.pts:
            return s.lat + b / s.bw
        f, l = s.pts[0], s.pts[-1]
        if b >= l[0]:
            return l[1] + (b - l[0]) / s.bw
        t0 = min(max(s.lat, 0.0), f[1])
        if b <= f[0]:
            return t0 + (f[1] - t0) * b / f[0]
        i = next(i for i in range(1, len(s.pts)) if s.pts[i][0] > b)
        (b0, t0), (b1, t1) = s.pts[i - 1], s.pts[i]
        return t0 + (t1 - t0) * (b - b0) / (b1 - b0)

    def base(s):
        return min(max(s.lat, 0.0), s.pts[0][1]) if s.pts else s.lat

    def many(s, b, c):
        return s.base() + c * (s.time(b) - s.base())


class Half:
    """one(s) = p2p(s/2): the shared-capacity hypothesis."""

    def __init__(s, w):
        s.w = w

    def many(s, b, c):
        return s.w.many(b / 2, c)


class Prof:
    def __init__(s, d):
        s.p2p = Link(d["p2p"])
        s.one = Link(d["p2p_one"]) if d.get("p2p_one") else s.p2p
        c = d["codecs"][0]
        s.tc, s.td = c["compress"], c["decompress"]
        s.ov, s.cf, s.df = d["piece_overhead"], d["compress_fixed"], d["decompress_fixed"]
        s.rr, s.cr = d.get("range_rate", 0.0), d.get("copy_rate", 0.0)
        s.linear = "points" not in d["p2p"]


def old_pred(P, b, r, k, v3):
    seg, pf = b / 2, 2.0
    lk = P.p2p
    if v3:
        net1 = net2 = k * lk.lat + seg / (r * lk.bw)
    else:
        net1, net2 = k * lk.time(seg / k / r), k * lk.many(seg / k / r, 1.0)
    pip = lambda g, n, o: max(g, n) + min(g, n) / k + k * o
    rs = pip(seg / P.tc + seg / P.td, net1, P.ov + P.cf + P.df)
    ag = pip(seg / P.tc + pf * seg / P.td, net2, P.ov + P.cf + pf * P.df)
    return rs + ag


def exchange(P, one, major, minor, peers):
    minor = min(minor, major)
    return P.p2p.many(minor, peers) + max(0.0, one.many(major, peers) - one.many(minor, peers))


def new_pred(P, b, major, minor, k, one=None):
    one = one or P.one
    pf, piece = 2.0, b / 2 / k
    comp = piece / P.tc + P.cf + P.ov
    dec = piece / P.td + P.df
    net = exchange(P, one, piece / major, piece / minor, 1.0)
    prep = (b / P.rr if P.rr > 0 else 0) + P.ov + (b / P.cr if P.cr > 0 else 0)
    pipe = lambda g, n: g + n + (k - 1) * max(g, n)
    return prep + pipe(comp + dec, net) + pipe(comp + pf * dec, net)


def invert(f, target):
    lo, hi = 0.5, 1e5
    for _ in range(200):
        m = math.sqrt(lo * hi)
        lo, hi = (m, hi) if f(m) > target else (lo, m)
    return math.sqrt(lo * hi)


def rows(name):
    return {
        (r["data"], r["bytes"], r["error_bound"]): r
        for r in json.load(open(RES + name))
        if r["op"] == "allreduce" and r["policy"] == "always" and r["transport"] == "socket"
    }


def main():
    md = "--md" in sys.argv
    p3, p4 = Prof(P3), Prof(P4)
    v3, v4 = rows("v3.json"), rows("v4-partial.json")
    head = ["run", "data", "MiB", "bound", "own", "major", "minor", "measured ms", "old ms", "old err", "new ms", "new err", "new, shared ms", "shared err"]
    print(("| " + " | ".join(head) + " |\n|" + "---|" * len(head)) if md else "  ".join(head))
    within = {"old": 0, "new": 0, "shared": 0}
    total = 0
    for run, recs, P in (("v3", v3, p3), ("v4", v4, p4)):
        for key, r in recs.items():
            b = r["bytes"]
            k = math.ceil(b / 2 / (r["piece_mib"] * MiB))
            rw = r["ratio"]
            r0 = invert(lambda x: old_pred(p3, b, x, k, True), v3[key]["predicted_compressed_ms"] / 1e3) if key in v3 else rw
            major = invert(lambda x: old_pred(p4, b, x, k, False), v4[key]["predicted_compressed_ms"] / 1e3) if key in v4 else rw
            inv_minor = 1 / r0 + 1 / rw - 1 / major
            minor = max(major, 1 / inv_minor) if inv_minor > 0 else 1e12
            meas = r["compressed_ms"]
            old = r["predicted_compressed_ms"]
            new = new_pred(P, b, major, minor, k) * 1e3
            shared = new_pred(P, b, major, minor, k, Half(P.p2p)) * 1e3
            err = lambda x: meas / x - 1
            total += 1
            for n, x in (("old", old), ("new", new), ("shared", shared)):
                within[n] += abs(err(x)) <= 0.2
            cells = [run, key[0], str(b >> 20), key[2], f"{rw:.1f}", f"{major:.1f}", f"{minor:.1f}", f"{meas:.2f}",
                     f"{old:.2f}", f"{err(old)*100:+.0f} %", f"{new:.2f}", f"{err(new)*100:+.0f} %", f"{shared:.2f}", f"{err(shared)*100:+.0f} %"]
            print(("| " + " | ".join(cells) + " |") if md else "  ".join(cells))
    print(f"\nwithin 20 % (measured / predicted - 1): old {within['old']}/{total}, new {within['new']}/{total}, "
          f"new with one(s) = p2p(s/2) {within['shared']}/{total}")


if __name__ == "__main__":
    main()
