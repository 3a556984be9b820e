"""Two processes over gloo: a small MLP wrapped in PyTorch's FSDP1 (``FullyShardedDataParallel``)
on CPU, trained with and without zcomm's FSDP hooks, for ``NO_SHARD`` (``fsdp_allreduce_hook``),
``SHARD_GRAD_OP`` and ``FULL_SHARD`` (``fsdp_reduce_scatter_hook``).

FSDP1 runs on CPU when it is given ``device_id=torch.device("cpu")`` (without it, it refuses:
"FSDP needs a non-CPU accelerator device"). Each Linear layer is its own FSDP unit, two of them
of the same size, so the hook runs three times per step.

Checked per strategy:
* ``never``: every gradient, parameter and loss is bit-identical to plain FSDP;
* ``always`` (``register_comm_hook``): every hook call compressed; at every step each rank's
  reduced gradient is within the hook's end-to-end bound of the exact average of the two ranks'
  local gradients of that step (the uncompressed reduction), the gradients FSDP keeps are the
  hook's outputs, the first step's gradients are within the bound of plain FSDP's, the ranks
  hold bit-identical parameters, and the loss falls like plain FSDP's;
* ``always`` with error feedback through :func:`zcomm.torch.register_fsdp`: units of the same
  size keep separate residuals, training converges, the ranks agree.

FSDP2 (``fully_shard`` on a CPU mesh) has no comm hook; zcomm's ``ReduceScatter`` / ``AllGather``
are installed as its custom collectives and checked the same way (``never``: FSDP2's bits;
``always``: the bound per call; compressed parameter all-gather: training and rank agreement).
All runs share one pair of processes (one start-up), about 25 s on 2 cores.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import ddp_common as C  # noqa: E402
from test_ddp import WORLD, _run  # noqa: E402

STEPS = 30
BATCH = 64
BOUND = 1e-3  # noa:1e-3
STRATEGIES = ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _fsdp(strategy: str) -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FSDP(
        _model(),
        sharding_strategy=getattr(ShardingStrategy, strategy),
        device_id=torch.device("cpu"),  # FSDP1 on CPU (gloo); it refuses CPU without it
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
    )


def _train(
    rank: int,
    world: int,
    strategy: str,
    setup: Optional[Callable[[Any], None]] = None,
) -> Dict[str, Any]:
    """SGD on this rank's part of the digits (the same batches as ddp_common.train); returns
    the loss curve, the gradients FSDP holds after each backward, the full parameters at the end."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    x, y = C.digits()
    model = _fsdp(strategy)
    if setup is not None:
        setup(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234)  # same permutation on every rank
    n = x.shape[0]
    curve: List[float] = []
    grads: List[List[torch.Tensor]] = []
    for step in range(STEPS):
        idx = torch.randint(0, n, (BATCH * world,), generator=g)[rank * BATCH : (rank + 1) * BATCH]
        opt.zero_grad()
        lossf(model(x[idx]), y[idx]).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
        opt.step()
        if step % 10 == 0 or step == STEPS - 1:
            with torch.no_grad():
                curve.append(float(lossf(model(x), y)))
    with FSDP.summon_full_params(model):
        full = [p.detach().clone() for p in model.parameters()]
    return {"curve": curve, "grads": grads, "params": full}


def _fsdp1_runs(rank: int, world: int, strategy: str) -> Dict[str, Any]:
    """Plain FSDP1, then with the hook under ``never``, ``always`` and ``always`` + error feedback."""
    import zcomm.torch as zt

    out: Dict[str, Any] = {"base": _train(rank, world, strategy)}

    hook = zt.fsdp_allreduce_hook if strategy == "NO_SHARD" else zt.fsdp_reduce_scatter_hook
    never = zt.HookState(error_bound=f"noa:{BOUND}", policy="never")
    out["never"] = _train(rank, world, strategy, lambda m: m.register_comm_hook(never, hook))
    out["never_stats"] = never.stats()

    # every hook call: (this rank's local flat gradient, the reduced result FSDP receives)
    calls: List[Any] = []

    def recording(state: Any, grad: torch.Tensor, *rest: torch.Tensor) -> None:
        local = grad.detach().clone()
        hook(state, grad, *rest)
        calls.append((local, (rest[0] if rest else grad).detach().clone()))

    always = zt.HookState(error_bound=f"noa:{BOUND}", policy="always")
    out["always"] = _train(rank, world, strategy, lambda m: m.register_comm_hook(always, recording))
    out["always_stats"] = always.stats()
    out["calls"] = calls

    ef = zt.HookState(error_bound=f"noa:{BOUND}", policy="always", error_feedback=True)
    out["ef"] = _train(rank, world, strategy, lambda m: zt.register_fsdp(m, ef))
    out["ef_stats"] = ef.stats()
    out["ef_residuals"] = sorted(str(k) for k in ef._residual)
    return out


def _worker(rank: int, world: int, port: int, d: str) -> None:
    """Every run of this file in one pair of processes (one start-up: the test stays fast)."""
    C.init(rank, world, port)
    out = {s: _fsdp1_runs(rank, world, s) for s in STRATEGIES}
    out["fsdp2"] = _fsdp2_runs(rank, world)
    dist.barrier()
    torch.save(out, os.path.join(d, f"r{rank}.pt"))
    dist.destroy_process_group()


def _within_bound(out: torch.Tensor, exact: torch.Tensor, e: float, what: str) -> None:
    """|out - exact| <= e + ulp(out)/2 + p * 2**-52 * max|exact| (float32 results)."""
    o = out.double()
    lim = e * (1 + 1e-9) + o.abs() * 2.0**-24 + 2.0**-149 + WORLD * 2.0**-52 * float(exact.abs().max())
    err = (o - exact).abs()
    excess = float((err - lim).max())
    assert excess <= 0, f"{what}: error exceeds the bound e={e:.3e} by {excess:.3e}"


@pytest.fixture(scope="module")
def results() -> List[Dict[str, Any]]:
    """Each rank's results of one 2-rank run of everything, shared by the checks below."""
    return _run(_worker, timeout=240)


@pytest.fixture(params=STRATEGIES)
def fsdp_run(request: Any, results: List[Dict[str, Any]]) -> Any:
    """(strategy, each rank's FSDP1 results for it)."""
    return request.param, [r[request.param] for r in results]


def test_fsdp_never_is_bit_identical_to_plain_fsdp(fsdp_run: Any) -> None:
    strategy, res = fsdp_run
    for r, rr in enumerate(res):
        b, h = rr["base"], rr["never"]
        assert h["curve"] == b["curve"], f"{strategy} rank {r}: loss curves differ"
        for step, (gb, gh) in enumerate(zip(b["grads"], h["grads"])):
            assert len(gb) == len(gh) and all(torch.equal(u, v) for u, v in zip(gb, gh)), (
                f"{strategy} rank {r}: gradients differ from plain FSDP at step {step}"
            )
        assert all(torch.equal(u, v) for u, v in zip(b["params"], h["params"]))
        s = rr["never_stats"]
        assert s["calls"] == 3 * STEPS and s["raw_calls"] == 3 * STEPS and s["compressed_calls"] == 0, s


def test_fsdp_always_within_bound_of_uncompressed(fsdp_run: Any) -> None:
    strategy, res = fsdp_run
    for r, rr in enumerate(res):
        s = rr["always_stats"]
        assert s["calls"] == 3 * STEPS, f"{strategy}: the hook ran {s['calls']} times, expected {3 * STEPS}"
        assert s["compressed_calls"] == 3 * STEPS and s["raw_calls"] == 0, s
        assert s["bound_violations"] == 0 and 0 < s["max_error"] <= s["bound"], s
        assert len(rr["calls"]) == 3 * STEPS
    sharded = strategy != "NO_SHARD"
    for i in range(3 * STEPS):
        locals_ = [rr["calls"][i][0].double() for rr in res]
        assert locals_[0].numel() == locals_[1].numel()
        exact = sum(locals_) / WORLD  # the uncompressed average of this call
        lo = min(float(v.min()) for v in locals_)
        hi = max(float(v.max()) for v in locals_)
        e = BOUND * (hi - lo)  # noa: the bound times the global range of the call
        for r, rr in enumerate(res):
            out = rr["calls"][i][1]
            n = out.numel()
            want = exact[r * n : (r + 1) * n] if sharded else exact
            _within_bound(out, want, e, f"{strategy} call {i} rank {r}")
        if not sharded:
            assert torch.equal(res[0]["calls"][i][1], res[1]["calls"][i][1]), f"call {i}: ranks differ"
    # the gradients FSDP keeps after each backward are the hook's results
    for r, rr in enumerate(res):
        outs = [o for _, o in rr["calls"]]
        for step, gs in enumerate(rr["always"]["grads"]):
            mine = outs[3 * step : 3 * step + 3]
            for gr in gs:
                assert any(gr.shape == o.shape and torch.equal(gr, o) for o in mine), (
                    f"{strategy} rank {r} step {step}: a gradient FSDP holds is not a hook result"
                )
    # the first step starts from the same parameters and batch as plain FSDP: its gradients
    # are within the bound of plain FSDP's (same flat-parameter layout, same order), plus
    # half an ulp for plain FSDP's own rounding
    e_max = max(rr["always_stats"]["bound"] for rr in res)
    for r, rr in enumerate(res):
        for gb, gh in zip(rr["base"]["grads"][0], rr["always"]["grads"][0]):
            e = e_max + float(gb.abs().max()) * 2.0**-24
            _within_bound(gh, gb.double(), e, f"{strategy} rank {r} step 0 vs plain FSDP")


def test_fsdp_always_trains_and_ranks_agree(fsdp_run: Any) -> None:
    strategy, res = fsdp_run
    for run in ("always", "ef"):
        p0, p1 = res[0][run]["params"], res[1][run]["params"]
        assert all(torch.equal(u, v) for u, v in zip(p0, p1)), f"{strategy} {run}: ranks' parameters differ"
        assert res[0][run]["curve"] == res[1][run]["curve"]
    b = res[0]["base"]["curve"]
    assert b[-1] < 0.5 * b[0], f"{strategy}: plain FSDP did not learn: {b}"
    for run in ("always", "ef"):
        h = res[0][run]["curve"]
        print(f"\n[{strategy} {run}] loss {h[0]:.4f} -> {h[-1]:.4f} (plain FSDP {b[0]:.4f} -> {b[-1]:.4f})")
        assert h[-1] < 0.5 * h[0], f"{strategy} {run}: the loss did not fall: {h}"
        assert abs(h[-1] - b[-1]) <= 0.02 * b[-1], f"{strategy} {run}: {h[-1]} vs plain {b[-1]}"


def test_fsdp_register_fsdp_keys_units_apart(fsdp_run: Any) -> None:
    strategy, res = fsdp_run
    for rr in res:
        s = rr["ef_stats"]
        assert s["compressed_calls"] == 3 * STEPS and s["bound_violations"] == 0
        # three units (two of the same size): three buckets, each called once per step
        assert sorted(b["calls"] for b in s["buckets"].values()) == [STEPS] * 3, s["buckets"]
        per_unit = 1 if strategy == "NO_SHARD" else WORLD  # one residual per shard when sharded
        assert len(rr["ef_residuals"]) == 3 * per_unit, rr["ef_residuals"]


# -- FSDP2 (fully_shard): no comm hook; zcomm.torch.ReduceScatter / AllGather as custom comms --


def _train2(rank: int, world: int, setup: Optional[Callable[[Any], None]] = None) -> Dict[str, Any]:
    """:func:`_train` for FSDP2: each Linear and the root ``fully_shard``-ed on a CPU mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _model()
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if setup is not None:
        setup(model)
    x, y = C.digits()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234)
    n = x.shape[0]
    curve: List[float] = []
    grads: List[List[torch.Tensor]] = []
    for step in range(STEPS):
        idx = torch.randint(0, n, (BATCH * world,), generator=g)[rank * BATCH : (rank + 1) * BATCH]
        opt.zero_grad()
        lossf(model(x[idx]), y[idx]).backward()
        grads.append([p.grad.to_local().detach().clone() for p in model.parameters()])
        opt.step()
        if step % 10 == 0 or step == STEPS - 1:
            with torch.no_grad():
                curve.append(float(lossf(model(x), y)))
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    return {"curve": curve, "grads": grads, "params": full}


def _fsdp2_runs(rank: int, world: int) -> Dict[str, Any]:
    """Plain FSDP2, then zcomm's reduce-scatter under ``never`` and ``always`` (recorded), then
    reduce-scatter (error feedback) and parameter all-gather both compressed."""
    import zcomm.torch as zt

    out: Dict[str, Any] = {"base": _train2(rank, world)}
    never = zt.HookState(error_bound=f"noa:{BOUND}", policy="never")
    out["never"] = _train2(rank, world, lambda m: zt.register_fsdp2(m, never))
    out["never_stats"] = never.stats()

    calls: List[Any] = []

    class Recording(zt.ReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # type: ignore[no-untyped-def]
            local = input_tensor.detach().clone()
            r = super().__call__(output_tensor, input_tensor, group, op, async_op)
            calls.append((local, output_tensor.detach().clone(), str(op)))
            return r

    always = zt.HookState(error_bound=f"noa:{BOUND}", policy="always")

    def setup(m: Any) -> None:
        from torch.distributed.fsdp import FSDPModule

        for i, u in enumerate(x for x in m.modules() if isinstance(x, FSDPModule)):
            u.set_custom_reduce_scatter(Recording(always, key=("rs", i)))

    out["always"] = _train2(rank, world, setup)
    out["always_stats"] = always.stats()
    out["calls"] = calls

    # parameters' all-gather compressed too (a tight bound), gradients with error feedback
    rs = zt.HookState(error_bound=f"noa:{BOUND}", policy="always", error_feedback=True)
    ag = zt.HookState(error_bound="abs:1e-5", policy="always")
    out["ag"] = _train2(rank, world, lambda m: zt.register_fsdp2(m, rs, all_gather_state=ag))
    out["ag_stats"] = (rs.stats(), ag.stats())
    return out


def test_fsdp2_custom_reduce_scatter_and_all_gather(results: List[Dict[str, Any]]) -> None:
    res = [r["fsdp2"] for r in results]
    # policy "never": the bits of plain FSDP2
    for r, rr in enumerate(res):
        b, h = rr["base"], rr["never"]
        assert h["curve"] == b["curve"], f"FSDP2 rank {r}: loss curves differ under never"
        for step, (gb, gh) in enumerate(zip(b["grads"], h["grads"])):
            assert all(torch.equal(u, v) for u, v in zip(gb, gh)), f"FSDP2 rank {r} step {step}"
        assert all(torch.equal(u, v) for u, v in zip(b["params"], h["params"]))
        assert rr["never_stats"]["raw_calls"] == 3 * STEPS and rr["never_stats"]["compressed_calls"] == 0
    # policy "always": every reduce-scatter compressed, within the bound of the exact average
    for rr in res:
        s = rr["always_stats"]
        assert s["compressed_calls"] == 3 * STEPS and s["raw_calls"] == 0, s
        assert s["bound_violations"] == 0 and 0 < s["max_error"] <= s["bound"], s
        assert len(rr["calls"]) == 3 * STEPS
    for i in range(3 * STEPS):
        locals_ = [rr["calls"][i][0].double() for rr in res]
        assert "AVG" in res[0]["calls"][i][2], res[0]["calls"][i][2]
        exact = sum(locals_) / WORLD
        e = BOUND * (max(float(v.max()) for v in locals_) - min(float(v.min()) for v in locals_))
        for r, rr in enumerate(res):
            out = rr["calls"][i][1]
            n = out.numel()
            _within_bound(out, exact[r * n : (r + 1) * n], e, f"FSDP2 call {i} rank {r}")
    b = res[0]["base"]["curve"]
    assert b[-1] < 0.5 * b[0], f"plain FSDP2 did not learn: {b}"
    for run in ("always", "ag"):
        assert all(torch.equal(u, v) for u, v in zip(res[0][run]["params"], res[1][run]["params"])), run
        assert res[0][run]["curve"] == res[1][run]["curve"], run
        h = res[0][run]["curve"]
        print(f"\n[FSDP2 {run}] loss {h[0]:.4f} -> {h[-1]:.4f} (plain FSDP2 {b[0]:.4f} -> {b[-1]:.4f})")
        assert abs(h[-1] - b[-1]) <= 0.02 * b[-1], f"FSDP2 {run}: {h[-1]} vs plain {b[-1]}"
    for rr in res:
        rs, ag = rr["ag_stats"]
        assert rs["compressed_calls"] == 3 * STEPS and rs["bound_violations"] == 0, rs
        assert sorted(v["calls"] for v in rs["buckets"].values()) == [STEPS] * 3, rs["buckets"]
        # parameters are gathered for forward and again for backward
        assert ag["compressed_calls"] >= 3 * STEPS and ag["bound_violations"] == 0, ag
        assert 0 < ag["max_error"] <= ag["bound"] == 1e-5, ag
