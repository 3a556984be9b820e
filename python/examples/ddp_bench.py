"""Step time of DDP training of a large model with and without the zcomm hook.

    python python/examples/ddp_bench.py [--world 2] [--width 4096] [--depth 6] [--steps 10]
        [--bound noa:1e-3] [--backend gloo] [--json FILE]

Each rank trains the same MLP (``depth`` layers of ``width x width``: about 100 M parameters at
the defaults) on its own synthetic batch, on GPU ``rank % device_count`` (so two ranks share one
GPU on a one-GPU machine), with DDP over ``--backend``. Gloo carries CUDA tensors through host
memory over loopback TCP: a stand-in for a slow inter-node link. Runs, each from the same initial
weights: DDP's own allreduce, then the zcomm hook with ``policy`` never, always and auto. Prints
a table (median step time after warm-up, ratio, max error, bound, violations) and the per-bucket
ratio and max error of the compressed run; ``--json`` writes the same as JSON (rank 0).

Examples::

    python python/examples/ddp_bench.py                      # 2 ranks, ~100 M parameters
    python python/examples/ddp_bench.py --depth 2 --steps 5  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model(width: int, depth: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1]).to(device)


def _run(rank: int, world: int, a: argparse.Namespace, policy: Optional[str]) -> Dict[str, Any]:
    """Train ``a.warmup + a.steps`` steps; returns step times (s) and the hook's stats."""
    import zcomm.torch as zt
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda", rank % torch.cuda.device_count())
    model = DDP(_model(a.width, a.depth, dev), device_ids=[dev.index])
    st = None
    if policy is not None:
        st = zt.HookState(error_bound=a.bound, policy=policy)
        model.register_comm_hook(st, zt.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator(device=dev).manual_seed(1 + rank)
    x = torch.randn(a.batch, a.width, device=dev, generator=g)
    y = torch.sin(x)
    times = []
    loss = float("nan")
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize(dev)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        lv = torch.nn.functional.mse_loss(out, y)
        lv.backward()
        opt.step()
        torch.cuda.synchronize(dev)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        loss = float(lv.item())
    params = sum(p.numel() for p in model.parameters())
    return {"times": times, "stats": st.stats() if st else None, "loss": loss, "params": params}


def _worker(rank: int, world: int, port: int, a: argparse.Namespace, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(a.backend, rank=rank, world_size=world)
    res = {}
    for name, policy in (("ddp", None), ("never", "never"), ("always", "always"), ("auto", "auto")):
        res[name] = _run(rank, world, a, policy)
        if rank == 0:
            print(f"  {name}: done", flush=True)
    if rank == 0:
        torch.save(res, out)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="ranks (processes)")
    ap.add_argument("--width", type=int, default=4096, help="MLP width")
    ap.add_argument("--depth", type=int, default=6, help="MLP layers")
    ap.add_argument("--batch", type=int, default=64, help="rows per rank and step")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (auto explores in them)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--bound", default="noa:1e-3", help="the hook's error bound")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--json", help="write the results as JSON to this file")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ddp_bench needs a CUDA device (see ddp_train.py for the CPU example)")
    print(f"ddp_bench: {a.world} ranks, MLP {a.depth} x {a.width}, backend {a.backend}, bound {a.bound}")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.pt")
        mp.spawn(_worker, args=(a.world, _free_port(), a, out), nprocs=a.world)
        res = torch.load(out, weights_only=False)
    med = lambda t: sorted(t)[len(t) // 2]  # noqa: E731
    base = med(res["ddp"]["times"])
    rows = []
    print(f"\nparameters: {res['ddp']['params'] / 1e6:.1f} M ({res['ddp']['params'] * 4 / 2**20:.0f} MiB of f32 gradients)")
    print("\n| run | median step ms | vs DDP | ratio | max error | bound | violations | final loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("ddp", "never", "always", "auto"):
        r = res[name]
        m = med(r["times"])
        s = r["stats"] or {}
        row = {
            "run": name,
            "median_step_ms": m * 1e3,
            "speedup_vs_ddp": base / m,
            "ratio": s.get("ratio"),
            "max_error": s.get("max_error"),
            "bound": s.get("bound"),
            "bound_violations": s.get("bound_violations"),
            "decisions": s.get("decisions"),
            "loss": r["loss"],
        }
        rows.append(row)
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        print(
            f"| {name} | {m * 1e3:.1f} | {base / m:.2f}x | {f(s.get('ratio'), '.2f')} | "
            f"{f(s.get('max_error'), '.3e')} | {f(s.get('bound'), '.3e')} | "
            f"{f(s.get('bound_violations'), 'd')} | {r['loss']:.6f} |"
        )
    buckets = res["always"]["stats"]["buckets"]
    print("\nper bucket (policy always): bucket, calls, ratio, max error")
    for k, b in buckets.items():
        print(f"  {k}: {b['calls']} calls, ratio {b['ratio'] or 0:.2f}, max error {b['max_error']:.3e}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "params": res["ddp"]["params"], "device": torch.cuda.get_device_name(0),
                       "runs": rows, "buckets_always": buckets}, fh, indent=1)


if __name__ == "__main__":
    main()
