"""Train an MLP on scikit-learn's bundled digits with DDP over gloo, with and without the zcomm
hook, and print the loss curves and step times side by side.

    python python/examples/ddp_train.py [--world 2] [--steps 300] [--bound noa:1e-3] [--policy always]

Runs its ranks with torch.multiprocessing (no torchrun needed; CPU only, gloo).
"""

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import ddp_common as C  # noqa: E402


def worker(rank, world, port, out, steps, bound, policy, ef):
    import zcomm.torch as zt

    C.init(rank, world, port)
    base = C.train(rank, world, steps, None)
    st = zt.HookState(error_bound=bound, policy=policy, error_feedback=ef)
    hooked = C.train(rank, world, steps, st)
    if rank == 0:
        torch.save({"base": base, "hooked": hooked, "stats": st.stats()}, out)
        zt.report()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--bound", default="noa:1e-3")
    ap.add_argument("--policy", default="always", choices=["auto", "always", "never"])
    ap.add_argument("--error-feedback", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.pt")
        mp.spawn(worker, args=(a.world, C.free_port(), out, a.steps, a.bound, a.policy, a.error_feedback), nprocs=a.world)
        r = torch.load(out, weights_only=False)
    b, h = r["base"], r["hooked"]
    print(f"\n{'step':>6} {'loss (DDP)':>12} {'loss (zcomm)':>13}")
    for i, (x, y) in enumerate(zip(b["curve"], h["curve"])):
        step = min(i * 10, a.steps - 1)
        print(f"{step:>6} {x:>12.5f} {y:>13.5f}")
    med = lambda t: sorted(t)[len(t) // 2] * 1e3  # noqa: E731
    print(f"\nmedian step time: DDP {med(b['times']):.3f} ms, zcomm {med(h['times']):.3f} ms")
    print(f"final loss: DDP {b['final']:.5f}, zcomm {h['final']:.5f} "
          f"({100 * (h['final'] - b['final']) / b['final']:+.2f} %); accuracy {b['accuracy']:.4f} / {h['accuracy']:.4f}")
    s = r["stats"]
    print(f"zcomm: ratio {s['ratio']:.2f}, max error {s['max_error']:.3e} <= bound {s['bound']:.3e}, "
          f"violations {s['bound_violations']}")


if __name__ == "__main__":
    main()
