"""Shared by the multi-process tests and examples/ddp_train.py: a real model on real data.

Data: scikit-learn's bundled handwritten digits (load_digits: 1797 8x8 images, 10 classes),
shipped inside the scikit-learn wheel (no download).
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))


def digits() -> Any:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    return x, y


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def train(
    rank: int,
    world: int,
    steps: int,
    state: Optional[Any] = None,
    batch: int = 64,
    lr: float = 0.05,
    record_grads_at: Optional[int] = None,
) -> Dict[str, Any]:
    """SGD on this rank's shard of the digits; returns the loss curve (full-data loss, the
    same on every rank), step times and optionally the averaged gradients after one step."""
    import zcomm.torch as zt

    x, y = digits()
    model = DDP(make_model())
    if state is not None:
        zt.register(model, state)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234)  # same permutation on every rank
    n = x.shape[0]
    curve: List[float] = []
    times: List[float] = []
    grads = None
    for step in range(steps):
        idx = torch.randint(0, n, (batch * world,), generator=g)[rank * batch : (rank + 1) * batch]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = lossf(model(x[idx]), y[idx])
        loss.backward()
        if record_grads_at == step:
            grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        times.append(time.perf_counter() - t0)
        if step % 10 == 0 or step == steps - 1:
            with torch.no_grad():
                curve.append(float(lossf(model(x), y)))
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).float().mean())
    return {"curve": curve, "times": times, "grads": grads, "final": curve[-1], "accuracy": acc}
