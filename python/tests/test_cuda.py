"""CUDA tensors through the GPU codecs: the same stream bytes and decoded values as the CPU codecs,
decoding into every supported output, errors for corrupt streams, and the DDP hook's GPU path
giving bit-identical averages to its CPU path. Skipped without a CUDA device (reported by pytest
as skipped); also runnable as a script on a machine without pytest."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, List

import pytest
import torch

import zcomm

needs_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and zcomm.cuda_available()),
    reason="no CUDA device (or no usable CUDA driver)",
)


def _field(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 40, n, dtype=torch.float64)
    x = torch.sin(t) * 3 + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)
    x[::997] = float("nan")
    x[5] = float("inf")
    return x.to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
    if a.dtype != b.dtype or a.numel() != b.numel():
        return False
    iv = {torch.float32: torch.int32, torch.float64: torch.int64, torch.uint8: torch.uint8}[a.dtype]
    return bool(torch.equal(a.view(iv), b.view(iv)))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("codec", ["aatrox", "cuszp-plain", "cuszp-outlier", "pfpl"])
@pytest.mark.parametrize("bound", ["noa:1e-3", "abs:1e-2"])
def test_gpu_stream_is_the_cpu_stream(dtype: torch.dtype, codec: str, bound: str) -> None:
    x = _field(300_001, dtype)
    cpu = zcomm.compress(x, bound, codec)
    gpu = zcomm.compress(x.cuda(), bound, codec)
    assert gpu.device.type == "cuda"
    assert _same_bits(cpu, gpu), f"{codec} {bound} {dtype}: GPU stream differs from the CPU's"
    # decoded on the GPU: the CPU's values, bit for bit
    assert _same_bits(zcomm.decompress(cpu), zcomm.decompress(gpu))
    assert zcomm.inspect(gpu) == zcomm.inspect(cpu)


@needs_gpu
def test_gpu_shape_aware_codecs_run_on_the_host() -> None:
    # cuszi and gpz have no CUDA codec here: CUDA tensors are staged through the host, with the
    # CPU's stream, decoded shape and values; results stay on the tensor's device
    x = torch.sin(torch.linspace(0, 20, 32 * 32 * 32)).reshape(32, 32, 32)
    cpu = zcomm.compress(x, "noa:1e-3", codec="cuszi")
    gpu = zcomm.compress(x.cuda(), "noa:1e-3", codec="cuszi")
    assert gpu.device.type == "cuda" and _same_bits(cpu, gpu)
    back = zcomm.decompress(gpu)
    assert back.device.type == "cuda" and back.shape == x.shape
    assert _same_bits(back, zcomm.decompress(cpu))
    out = torch.ones_like(x).cuda()
    zcomm.decompress_add(gpu, out)
    assert torch.equal(out.cpu(), torch.ones_like(x) + zcomm.decompress(cpu))
    pos = torch.rand(4096, 3) * 100
    s_cpu, p_cpu = zcomm.compress_particles(pos, "noa:1e-3", order="reorder")
    s_gpu, p_gpu = zcomm.compress_particles(pos.cuda(), "noa:1e-3", order="reorder")
    assert s_gpu.device.type == "cuda" and p_gpu.device.type == "cuda"
    assert _same_bits(s_cpu, s_gpu) and torch.equal(p_cpu, p_gpu.cpu())


@needs_gpu
def test_gpu_given_range_and_bf16() -> None:
    x = _field(100_000, torch.float32, seed=1)
    cpu = zcomm.compress(x, "noa:1e-3", value_range=(-10.0, 10.0))
    gpu = zcomm.compress(x.cuda(), "noa:1e-3", value_range=(-10.0, 10.0))
    assert _same_bits(cpu, gpu)
    b = x.nan_to_num(0.0, 0.0, 0.0).to(torch.bfloat16)
    assert _same_bits(zcomm.compress(b, "abs:1e-2"), zcomm.compress(b.cuda(), "abs:1e-2"))


@needs_gpu
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gpu_decode_into_and_add(out_dtype: torch.dtype) -> None:
    x = _field(65_537, torch.float32, seed=2).nan_to_num(0.0, 0.0, 0.0)
    s_cpu = zcomm.compress(x, "noa:1e-3")
    s_gpu = s_cpu.cuda()
    base = torch.linspace(-1, 1, x.numel(), dtype=out_dtype)
    want_into = zcomm.decompress(s_cpu, out=torch.empty_like(base))
    got_into = zcomm.decompress(s_gpu, out=torch.empty_like(base).cuda())
    assert got_into.device.type == "cuda"
    assert torch.equal(want_into, got_into.cpu())
    want_add = zcomm.decompress_add(s_cpu, base.clone())
    got_add = zcomm.decompress_add(s_gpu, base.clone().cuda())
    assert torch.equal(want_add, got_add.cpu())


@needs_gpu
def test_gpu_corrupt_stream_is_an_error() -> None:
    s = zcomm.compress(_field(50_000, torch.float32), "noa:1e-3").cuda()
    bad = s.clone()
    bad[s.numel() // 2] ^= 0x5A
    with pytest.raises(zcomm.ZcommError):
        zcomm.decompress(bad)
    with pytest.raises(zcomm.ZcommError):
        zcomm.decompress(s[:-3].clone())
    with pytest.raises(ValueError):
        zcomm.decompress(s, out=torch.empty(7, device="cuda"))


@needs_gpu
def test_gpu_decode_of_an_unaligned_slice() -> None:
    """A stream that starts at an odd offset of a larger device buffer (one stream of a
    concatenated exchange) decodes like the stream itself."""
    x = _field(10_001, torch.float32, seed=5).nan_to_num(0.0, 0.0, 0.0)
    s = zcomm.compress(x, "noa:1e-3")
    buf = torch.zeros(s.numel() + 3, dtype=torch.uint8, device="cuda")
    buf[3:] = s.cuda()
    assert _same_bits(zcomm.decompress(buf[3:]), zcomm.decompress(s))
    assert zcomm.inspect(buf[3:]) == zcomm.inspect(s)


@needs_gpu
def test_ddp_hook_gpu_path_matches_cpu_path() -> None:
    """One-rank groups (NCCL for the CUDA bucket, gloo for the host copy): the hook compresses,
    exchanges, decodes and averages on each device; the averages are bit-identical."""
    import torch.distributed as dist

    from zcomm import torch as zt

    f = tempfile.NamedTemporaryFile(delete=False)
    f.close()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", init_method=f"file://{f.name}", rank=0, world_size=1)
    try:
        gloo = dist.new_group(backend="gloo")
        x = _field(1 << 20, torch.float32, seed=3).nan_to_num(0.0, 0.0, 0.0)
        outs: List[torch.Tensor] = []
        for pg, t in ((None, x.cuda()), (gloo, x.clone())):
            st = zt.HookState(error_bound="noa:1e-3", policy="always", process_group=pg)
            outs.append(zt._average(st, "bucket0", t))
            assert st.stats()["bound_violations"] == 0
        assert outs[0].device.type == "cuda"
        assert _same_bits(outs[0], outs[1]), "GPU and CPU hook paths differ"
    finally:
        dist.destroy_process_group()
        os.unlink(f.name)


def _fsdp_gpu_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    """One of two ranks sharing GPU 0 over gloo: the FSDP helpers on CUDA tensors (GPU codecs)
    and on host tensors, on the same values; saves both results."""
    import torch.distributed as dist

    from zcomm import torch as zt

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        x = _field(world * 50_000, torch.float32, seed=10 + rank).nan_to_num(0.0, 0.0, 0.0)
        res = {}
        for dev in ("cuda", "cpu"):
            t = x.to(dev)
            st = zt.HookState(error_bound="noa:1e-3", policy="always")
            rs = torch.empty(t.numel() // world, device=dev)
            zt.compressed_reduce_scatter_tensor(rs, t, st)
            ag = torch.empty(world * rs.numel(), device=dev)
            zt.compressed_all_gather_into_tensor(ag, rs, st)
            ar = t.clone()
            zt.fsdp_allreduce_hook(st, ar)
            assert st.stats()["bound_violations"] == 0
            res[dev] = {k: (v.device.type, v.cpu()) for k, v in (("rs", rs), ("ag", ag), ("ar", ar))}
        torch.save(res, os.path.join(out_dir, f"r{rank}.pt"))
    finally:
        dist.destroy_process_group()


@needs_gpu
def test_fsdp_helpers_gpu_path_matches_cpu_path() -> None:
    """Two ranks on one GPU (gloo carries the CUDA tensors): the compressed reduce-scatter,
    all-gather and NO_SHARD hook keep CUDA tensors on the GPU and give the host path's bits."""
    import time

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        init = f"file://{os.path.join(d, 'init')}"
        ctx = mp.start_processes(
            _fsdp_gpu_worker, args=(2, init, d), nprocs=2, join=False, start_method="spawn"
        )
        t0 = time.time()
        while not ctx.join(timeout=5):
            if time.time() - t0 > 180:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError("FSDP GPU ranks did not finish within 180 s (hang)")
        res = [torch.load(os.path.join(d, f"r{r}.pt"), weights_only=False) for r in range(2)]
    for r, rr in enumerate(res):
        for k in ("rs", "ag", "ar"):
            (gdev, g), (cdev, c) = rr["cuda"][k], rr["cpu"][k]
            assert gdev == "cuda" and cdev == "cpu", (k, gdev, cdev)
            assert _same_bits(g, c), f"rank {r} {k}: GPU and CPU paths differ"
    # entries are (device, tensor): the ranks' all-gathered and all-reduced tensors agree
    assert _same_bits(res[0]["cuda"]["ag"][1], res[1]["cuda"]["ag"][1])
    assert _same_bits(res[0]["cuda"]["ar"][1], res[1]["cuda"]["ar"][1])


def _main() -> int:
    """Run every test without pytest (for machines that have torch but no pytest)."""
    import itertools

    if not (torch.cuda.is_available() and zcomm.cuda_available()):
        print("skipped: no CUDA device")
        return 0
    cases: List[Callable[[], Any]] = []
    for d, c, b in itertools.product(
        [torch.float32, torch.float64], ["aatrox", "cuszp-plain", "cuszp-outlier", "pfpl"],
        ["noa:1e-3", "abs:1e-2"],
    ):
        cases.append(lambda d=d, c=c, b=b: test_gpu_stream_is_the_cpu_stream(d, c, b))
    cases += [
        test_gpu_given_range_and_bf16,
        lambda: test_gpu_decode_into_and_add(torch.float32),
        lambda: test_gpu_decode_into_and_add(torch.bfloat16),
        test_gpu_corrupt_stream_is_an_error,
        test_gpu_decode_of_an_unaligned_slice,
        test_ddp_hook_gpu_path_matches_cpu_path,
        test_fsdp_helpers_gpu_path_matches_cpu_path,
    ]
    failed = 0
    for i, case in enumerate(cases):
        try:
            case()
            print(f"case {i}: ok")
        except Exception as e:  # noqa: BLE001 - report every failure, then fail
            failed += 1
            print(f"case {i}: FAILED: {type(e).__name__}: {e}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(_main())
