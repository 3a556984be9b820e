"""Compressed gradient communication for PyTorch: DDP and FSDP communication hooks.

Two lines::

    state = zcomm.torch.HookState(error_bound="noa:1e-3")
    model.register_comm_hook(state, zcomm.torch.allreduce_hook)   # model: a DistributedDataParallel

What the hook does with each gradient bucket (``x_r`` on rank ``r`` of ``p``):

1. one small ``all_reduce(MAX)`` carries each rank's finite value range, its model prediction and
   its settings (bound, policy, codec, error feedback, bucket size); ranks whose settings differ
   all raise :class:`ZcommMismatchError` after this same collective (no rank hangs);
2. if the bucket is compressed (see ``policy``), every rank compresses ``x_r`` under the absolute
   bound ``e`` (``abs:E``: ``e = E``; ``noa:E``: ``e = E * (max - min)`` of the **global** range,
   so ``e`` is the same on every rank), the stream lengths are all-gathered, then the streams
   (padded to the longest) over the process group's own backend (gloo or NCCL);
3. every rank decodes all ``p`` streams and sums them in rank order in float64, divides by ``p``
   and rounds once to the bucket's dtype. Every rank decodes the same bytes in the same order, so
   the averages are bit-identical on every rank and every run.

Guarantee, for every finite averaged value: ``|avg - mean_r(x_r)| <= e + ulp(avg)/2 + d``, where
``e`` is ``stats()["bound"]``, ``ulp(avg)/2`` is the final rounding to the gradient dtype and
``d <= p * 2**-52 * max_r |x_r|`` covers the float64 accumulation (zero in practice for p = 2).
With ``error_feedback=True`` the bound holds on the compensated values ``x_r + residual_r``.

A bucket that is not compressed is averaged by the backend's plain ``all_reduce`` (as DDP's
default hook does). CUDA buckets stay on their GPU: the GPU codecs compress them (the same bytes
as the CPU codecs), the streams travel as CUDA tensors (NCCL) and are decoded and summed on the
GPU, with the same float64 additions in the same order as the CPU path, so the two paths give
bit-identical averages. Without a usable CUDA driver CUDA buckets are staged through the host.
The FSDP helpers below do the same: CUDA gradients and parameters are compressed, exchanged and
decoded on their GPU, with the host path's bits.

FSDP (tested with PyTorch 2.15, two ranks, CPU and gloo):

* FSDP1 (``FullyShardedDataParallel``) has a gradient hook: :func:`register_fsdp` (or
  ``fsdp_model.register_comm_hook(state, hook)``) with :func:`fsdp_allreduce_hook` for
  ``NO_SHARD`` and :func:`fsdp_reduce_scatter_hook` for ``FULL_SHARD`` / ``SHARD_GRAD_OP``.
  Same bound as above on every unit's flat gradient (on this rank's shard of the average);
  calls that are not compressed divide and reduce exactly as FSDP's default path (so
  ``policy="never"`` gives plain FSDP's bits). FSDP1 refuses hooks for the hybrid strategies
  (``HYBRID_SHARD``, ``_HYBRID_SHARD_ZERO2``), and it has **no hook for the parameter
  all-gather**: with FSDP1 parameters travel uncompressed. On CPU FSDP1 needs
  ``device_id=torch.device("cpu")`` (else: "FSDP needs a non-CPU accelerator device").
* FSDP2 (``fully_shard``) has no comm hook but takes custom collectives: :class:`ReduceScatter`
  (gradients) and :class:`AllGather` (parameters, lossy: use a tight bound), or
  :func:`register_fsdp2` for every ``fully_shard`` module. They are synchronous (FSDP2 then
  overlaps less); FSDP2's ``PREMUL_SUM`` (``set_gradient_divide_factor``) and byte-packed
  mixed-dtype buffers go through the plain collective.
* Elsewhere (custom sharding): :func:`compressed_reduce_scatter_tensor`,
  :func:`compressed_all_gather_into_tensor`.
"""

import math
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import zcomm as _zc

from . import ZcommError, _native, parse_bound

__all__ = [
    "HookState",
    "ZcommMismatchError",
    "allreduce_hook",
    "register",
    "fsdp_reduce_scatter_hook",
    "fsdp_allreduce_hook",
    "register_fsdp",
    "register_fsdp2",
    "ReduceScatter",
    "AllGather",
    "compressed_reduce_scatter_tensor",
    "compressed_all_gather_into_tensor",
    "report",
]


class ZcommMismatchError(ZcommError):
    """Ranks disagree on the hook's settings (bound, policy, codec, ...) or on the bucket size."""


_POLICIES = {"never": 0, "auto": 1, "always": 2}
_MODES = {"abs": 1, "noa": 2}
_STATES: "List[HookState]" = []
_EMA = 0.3


def _ema(old: Optional[float], new: float) -> float:
    if not (new > 0 and math.isfinite(new)):
        return old if old is not None else 0.0
    return new if old is None else (1 - _EMA) * old + _EMA * new


class HookState:
    """Settings and telemetry of the zcomm communication hooks.

    Args:
        error_bound: ``"abs:E"`` or ``"noa:E"`` (``E`` times the global finite range of the
            bucket over all ranks). ``rel`` bounds are refused: they do not bound an average.
        policy: ``"always"`` compress every bucket; ``"never"`` plain ``all_reduce``;
            ``"auto"`` decide per bucket with zcomm's transfer model (``zcomm::model::predict``)
            fed with this run's measured codec throughputs, compression ratio of that bucket and
            link speed (each bucket is compressed on its first call and sent raw on its second,
            to measure both paths).
        process_group: the group to reduce over (default: the world).
        error_feedback: carry each rank's compression residual (``x - x'``) into its next call on
            the same bucket.
        codec: ``"auto"`` (aatrox) or a codec name (see :func:`zcomm.codecs`).
    """

    def __init__(
        self,
        error_bound: str = "noa:1e-3",
        policy: str = "auto",
        process_group: Optional[Any] = None,
        error_feedback: bool = False,
        codec: str = "auto",
    ) -> None:
        mode, value = parse_bound(error_bound)
        if mode not in _MODES:
            raise ZcommError(
                f"error_bound {error_bound!r}: a {mode} bound does not bound an average; "
                "use abs:E or noa:E"
            )
        if policy not in _POLICIES:
            raise ZcommError(f"policy {policy!r}: expected 'auto', 'always' or 'never'")
        self.error_bound = error_bound
        self.mode = mode
        self.value = float(value)
        self.policy = policy
        self.codec = _native.codec_name(codec)
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self._codec_tag = float(_native.codecs().index(self.codec) + 1)
        self._residual: Dict[Any, torch.Tensor] = {}
        self._bucket: Dict[Any, Dict[str, Any]] = {}
        self._lock = threading.Lock()
        # measured speeds (bytes/s, s), shared by all buckets
        self._tc: Optional[float] = None
        self._td: Optional[float] = None
        self._bw: Optional[float] = None
        self._lat: Optional[float] = None
        self._s: Dict[str, Any] = {
            "calls": 0,
            "compressed_calls": 0,
            "raw_calls": 0,
            "bytes_in": 0,
            "bytes_on_wire": 0,
            "max_error": 0.0,
            "bound": 0.0,
            "bound_violations": 0,
            "decisions": {"always": 0, "never": 0, "auto:explore": 0, "auto:compress": 0, "auto:raw": 0},
            "predicted_s": 0.0,
            "measured_s": 0.0,
            "predicted_vs_measured": [],
        }
        _STATES.append(self)

    # -- agreement ---------------------------------------------------------------------------
    def _spec(self) -> List[float]:
        return [
            float(_MODES[self.mode]),
            self.value,
            float(_POLICIES[self.policy]),
            float(self.error_feedback),
            self._codec_tag,
        ]

    _SPEC_NAMES = ("bound mode", "bound value", "policy", "error_feedback", "codec")

    def check(self, device: Optional[Any] = None) -> None:
        """Collective: raise :class:`ZcommMismatchError` on every rank if ranks' settings differ.

        Every rank of the group must call it (the hooks run the same check on every call).
        """
        _meta(self, 0, (math.inf, -math.inf), (0.0, 0.0), device or _group_device(self))

    # -- telemetry -----------------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """This rank's telemetry.

        Keys: ``calls``, ``compressed_calls``, ``raw_calls``, ``bytes_in`` (bucket bytes handed
        to the hook), ``bytes_on_wire`` (bytes this rank sent: its streams, padding and metadata
        included, or the raw bucket), ``ratio`` (``bytes_in / bytes_on_wire``), ``max_error``
        (largest ``|x - x'|`` of this rank's compressed values), ``bound`` (largest absolute bound
        ``e`` used), ``bound_violations`` (values with ``|x - x'| > e``: always 0),
        ``decisions`` (per policy / model decision), ``predicted_s`` / ``measured_s`` (sums over
        model-decided calls of the predicted and measured seconds of the chosen path),
        ``predicted_vs_measured`` (the last 64 ``(bucket, path, predicted_s, measured_s)``) and
        ``buckets`` (per bucket: ``calls``, the last compressed ``ratio`` or None, ``max_error``).
        """
        with self._lock:
            s = dict(self._s)
            s["decisions"] = dict(s["decisions"])
            s["predicted_vs_measured"] = list(s["predicted_vs_measured"])
            s["buckets"] = {
                str(k): {
                    "calls": b["calls"],
                    "ratio": b.get("ratio"),
                    "max_error": b.get("max_error", 0.0),
                }
                for k, b in self._bucket.items()
            }
        s["ratio"] = s["bytes_in"] / s["bytes_on_wire"] if s["bytes_on_wire"] else 1.0
        s["error_bound"] = self.error_bound
        s["policy"] = self.policy
        return s

    def _record(self, key: str, v: Any) -> None:
        with self._lock:
            self._s[key] += v


def _group_device(state: HookState) -> torch.device:
    backend = dist.get_backend(state.process_group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _meta(
    state: HookState,
    numel: int,
    local_range: Tuple[float, float],
    pred: Tuple[float, float],
    device: Any,
) -> Tuple[Tuple[float, float], Tuple[float, float]]:
    """One all_reduce(MAX): global range, max predictions, and the agreement check."""
    spec = state._spec() + [float(numel)]
    lo, hi = local_range
    v = [hi, -lo, pred[0], pred[1]] + spec + [-x for x in spec]
    t = torch.tensor(v, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=state.process_group)
    r = t.tolist()
    k = len(spec)
    hi_s, lo_s = r[4 : 4 + k], [-x for x in r[4 + k :]]
    bad = [
        n
        for n, a, b in zip(HookState._SPEC_NAMES + ("bucket size",), hi_s, lo_s)
        if a != b
    ]
    if bad:
        detail = ", ".join(
            f"{n} ranges over [{b:g}, {a:g}]"
            for n, a, b in zip(HookState._SPEC_NAMES + ("bucket size",), hi_s, lo_s)
            if a != b
        )
        raise ZcommMismatchError(
            f"zcomm hook: ranks disagree on {', '.join(bad)} ({detail}); every rank must use the "
            f"same HookState settings (this rank: error_bound={state.error_bound!r}, "
            f"policy={state.policy!r}, codec={state.codec!r}, "
            f"error_feedback={state.error_feedback}) and the same model"
        )
    return (-r[1], r[0]), (r[2], r[3])


def _flat_compute(buf: torch.Tensor) -> Tuple[torch.Tensor, str]:
    """Host float32/float64 copy-or-view of a bucket (bf16/fp16 widened exactly to float32)."""
    if buf.dtype == torch.float64:
        dt, ct = "f64", torch.float64
    elif buf.dtype in (torch.float32, torch.bfloat16, torch.float16):
        dt, ct = "f32", torch.float32
    else:
        raise TypeError(
            f"zcomm hook: gradient dtype {buf.dtype} is not supported "
            "(float32, float64, bfloat16, float16)"
        )
    if not buf.is_contiguous():
        raise ValueError("zcomm hook: the gradient buffer must be contiguous")
    x = buf.reshape(-1)
    if x.device.type != "cpu" and not _gpu_codec(x):
        x = x.cpu()
    return x.to(ct), dt


def _gpu_codec(x: torch.Tensor) -> bool:
    """Whether ``x`` is compressed on its GPU (a CUDA tensor and usable GPU codecs)."""
    return x.device.type == "cuda" and _zc.cuda_available()


def _finite_range(x: torch.Tensor, dt: str) -> Optional[Tuple[float, float]]:
    """The finite value range of a flat float32/float64 tensor, on its device."""
    if _gpu_codec(x):
        torch.cuda.current_stream(x.device).synchronize()
        return _native.cuda_finite_range(x.data_ptr(), x.numel(), dt, x.device.index)
    return _native.finite_range(x.data_ptr(), x.numel(), dt)


def _predict(
    state: HookState,
    key: Any,
    enc_bytes: float,
    dec_bytes: float,
    v_raw: float,
    v_cmp_raw: float,
) -> Tuple[float, float]:
    """(raw, compressed) seconds from zcomm's model, or (0, 0) while speeds are unknown.

    ``enc_bytes`` / ``dec_bytes``: bytes this rank compresses / decodes; ``v_raw``: bytes it
    sends on the raw path; ``v_cmp_raw``: bytes it would send compressed, before the ratio.
    """
    b = state._bucket.get(key)
    if not b or b.get("ratio") is None or not state._tc or not state._td or not state._bw:
        return 0.0, 0.0
    if v_raw <= 0 or enc_bytes <= 0 or dec_bytes <= 0:
        return 0.0, 0.0
    v_cmp = v_cmp_raw / b["ratio"]
    lat = state._lat or 0.0
    # the model takes codec speeds relative to v_raw: time = enc_bytes / tc, dec_bytes / td
    raw, cmp = _native.predict(
        v_raw, v_raw / max(v_cmp, 1e-30), state._bw, lat, state._tc * v_raw / enc_bytes,
        state._td * v_raw / dec_bytes,
    )
    return raw, cmp + 2 * lat  # + the lengths exchange and the metadata all_reduce


def _predict_allreduce(state: HookState, key: Any, nbytes: int, p: int) -> Tuple[float, float]:
    """:func:`_predict` for the all-reduce of an ``nbytes`` bucket (ring vs. all-gathered streams)."""
    return _predict(state, key, nbytes, p * nbytes, 2.0 * (p - 1) / p * nbytes, (p - 1) * nbytes)


def _decide(
    state: HookState, b: Dict[str, Any], gpred: Tuple[float, float], nbytes: int
) -> Tuple[bool, str]:
    """Compress this call or not (``policy``; under ``auto`` the bucket's first call compresses,
    its second goes raw, later ones follow the model's prediction ``gpred``); records the call."""
    if state.policy == "always":
        compress, why = True, "always"
    elif state.policy == "never":
        compress, why = False, "never"
    elif b["calls"] == 0:
        compress, why = True, "auto:explore"
    elif b["calls"] == 1 or gpred == (0.0, 0.0):
        compress, why = False, "auto:explore"
    else:
        compress = gpred[1] < gpred[0]
        why = "auto:compress" if compress else "auto:raw"
    b["calls"] += 1
    with state._lock:
        state._s["decisions"][why] += 1
        state._s["calls"] += 1
        state._s["bytes_in"] += nbytes
    return compress, why


def _backend(pg: Any) -> str:
    """The backend name of a process group (``None``: the default group), lower case."""
    try:
        return str(dist.get_backend(pg)).lower()
    except (RuntimeError, ValueError):
        return ""


def _exchange(state: HookState, stream: torch.Tensor, device: Any, p: int) -> List[torch.Tensor]:
    """All-gather variable-length byte streams (lengths first, then padded streams)."""
    pg = state.process_group
    n = torch.tensor([stream.numel()], dtype=torch.int64, device=device)
    lens = [torch.zeros_like(n) for _ in range(p)]
    dist.all_gather(lens, n, group=pg)
    ls = [int(x.item()) for x in lens]
    m = max(ls)
    pad = torch.zeros(m, dtype=torch.uint8, device=device)
    pad[: stream.numel()] = stream.to(device)
    outs = [torch.empty(m, dtype=torch.uint8, device=device) for _ in range(p)]
    dist.all_gather(outs, pad, group=pg)
    if device.type == "cuda" and _zc.cuda_available():
        return [o[:l] for o, l in zip(outs, ls)]  # decoded on the GPU
    return [o[:l].cpu() for o, l in zip(outs, ls)]


def _compress_own(
    state: HookState,
    key: Any,
    x: torch.Tensor,
    dt: str,
    grange: Tuple[float, float],
    res_key: Optional[Any] = None,
) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """Compress this rank's values; returns (stream, decoded own values, abs bound e).

    ``key`` names the bucket in the telemetry, ``res_key`` (default ``key``) its
    error-feedback residual (one per shard for a reduce-scatter)."""
    rk = key if res_key is None else res_key
    if state.error_feedback and rk in state._residual and state._residual[rk].numel() == x.numel():
        x = x + state._residual[rk]
    else:
        x = x.contiguous()
    lo, hi = grange
    vr: Optional[Tuple[float, float]] = None
    if state.mode == "noa":
        vr = (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else (0.0, 0.0)
    # on the bucket's GPU for CUDA buckets (the same bytes as the CPU codec writes)
    stream = _zc.compress(x, state.error_bound, state.codec, value_range=vr)
    h = _zc.inspect(stream)
    e = float(h["abs_bound"]) if state.mode == "noa" else state.value
    xd = _zc.decompress(stream, out=torch.empty_like(x))
    diff = (x.double() - xd.double()).abs()
    diff = torch.nan_to_num(diff, nan=0.0, posinf=0.0)  # non-finite values are kept exactly
    err = float(diff.max().item()) if diff.numel() else 0.0
    viol = int((diff > e).sum().item()) if diff.numel() else 0
    if state.error_feedback:
        res = x - xd
        state._residual[rk] = torch.nan_to_num(res, nan=0.0, posinf=0.0, neginf=0.0)
    with state._lock:
        b = state._bucket.setdefault(key, {"calls": 0, "ratio": None})
        b["max_error"] = max(b.get("max_error", 0.0), err)
        state._s["max_error"] = max(state._s["max_error"], err)
        state._s["bound"] = max(state._s["bound"], e)
        state._s["bound_violations"] += viol
    return stream, xd, e


def _average(
    state: HookState, key: Any, buf: torch.Tensor, fsdp_divide: bool = False
) -> torch.Tensor:
    """The compressed (or raw) average of ``buf`` over the group; returns a new tensor.

    The raw path divides by ``p`` before the ``all_reduce`` (DDP's default hook), or with
    ``fsdp_divide`` by FSDP's pre- and post-division factors (FSDP's default path), so that
    ``policy="never"`` gives the same bits as the hook it replaces.
    """
    pg = state.process_group
    p = dist.get_world_size(pg)
    rank = dist.get_rank(pg)
    device = buf.device
    nbytes = buf.numel() * buf.element_size()
    t0 = time.perf_counter()
    x, dt = _flat_compute(buf)
    b = state._bucket.setdefault(key, {"calls": 0, "ratio": None})
    pred = _predict_allreduce(state, key, nbytes, p) if state.policy == "auto" else (0.0, 0.0)
    lr = _finite_range(x, dt) if state.mode == "noa" else None
    lo, hi = lr if lr is not None else (math.inf, -math.inf)
    tm = time.perf_counter()
    grange, gpred = _meta(state, buf.numel(), (lo, hi), pred, device)
    state._lat = _ema(state._lat, time.perf_counter() - tm)

    compress, why = _decide(state, b, gpred, nbytes)

    if not compress:
        out = buf.detach().clone()
        pre, post = _fsdp_factors(p) if fsdp_divide else (float(p), 1.0)
        if pre > 1:
            out.div_(pre)
        tr = time.perf_counter()
        dist.all_reduce(out, group=pg)
        if post > 1:
            out.div_(post)
        dt_raw = time.perf_counter() - tr
        state._bw = _ema(state._bw, 2.0 * (p - 1) / p * nbytes / max(dt_raw, 1e-9))
        with state._lock:
            state._s["raw_calls"] += 1
            state._s["bytes_on_wire"] += nbytes + 8 * 16
        measured = time.perf_counter() - t0
        _log(state, key, "raw", gpred[0], measured, why)
        return out

    tc0 = time.perf_counter()
    stream, xd, _e = _compress_own(state, key, x, dt, grange)
    tc = time.perf_counter() - tc0
    state._tc = _ema(state._tc, x.numel() * x.element_size() / max(tc, 1e-9))
    b["ratio"] = nbytes / max(stream.numel(), 1)
    tx0 = time.perf_counter()
    streams = _exchange(state, stream, device, p)
    tx = time.perf_counter() - tx0
    m = max(s.numel() for s in streams)
    state._bw = _ema(state._bw, (p - 1) * m / max(tx, 1e-9))
    td0 = time.perf_counter()
    acc = torch.zeros(x.numel(), dtype=torch.float64, device=x.device)
    # rank order, one f64 rounding per addition (the same sums on the CPU and the GPU path);
    # this rank's own stream was decoded already (same bytes, same values)
    for r in range(p):
        if r == rank:
            acc.add_(xd.double())
        elif acc.device.type != "cpu":
            acc.add_(_zc.decompress(streams[r]).double())
        else:
            s = streams[r]
            _native.accumulate_f64([(s.data_ptr(), s.numel())], acc.data_ptr(), x.numel())
    acc.div_(p)
    out = acc.to(buf.dtype).reshape(buf.shape)
    td = time.perf_counter() - td0
    state._td = _ema(state._td, p * x.numel() * x.element_size() / max(td, 1e-9))
    with state._lock:
        state._s["compressed_calls"] += 1
        state._s["bytes_on_wire"] += m + 8 + 8 * 16
    measured = time.perf_counter() - t0
    _log(state, key, "compressed", gpred[1], measured, why)
    return out if device.type == "cpu" else out.to(device)


def _log(state: HookState, key: Any, path: str, predicted: float, measured: float, why: str) -> None:
    with state._lock:
        if why.startswith("auto:") and why != "auto:explore":
            state._s["predicted_s"] += predicted
            state._s["measured_s"] += measured
        lst = state._s["predicted_vs_measured"]
        lst.append((key, path, predicted, measured))
        del lst[:-64]


def _done(t: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(t)
    return fut


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the error-bounded compressed average of a gradient bucket.

    Register with ``ddp_model.register_comm_hook(state, zcomm.torch.allreduce_hook)``. Returns
    a completed future holding the averaged bucket (see the module docs for the bound and the
    determinism guarantee). Raises :class:`ZcommMismatchError` on every rank when the ranks'
    settings differ, and ``TypeError`` for an unsupported gradient dtype. After such an error,
    delete the DDP model before ``dist.destroy_process_group()``: PyTorch's reducer that saw a
    failed hook can abort the process if it outlives its group.
    """
    buf = bucket.buffer()
    try:
        return _done(_average(state, ("ddp", bucket.index()), buf))
    except Exception as e:
        # handed to DDP through the future: it raises it from backward() once its reducer is
        # in a consistent state (raising inside the hook can leave a reducer that aborts the
        # process when it is destroyed)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_exception(e)
        return fut


def register(model: Any, state: HookState) -> Any:
    """Check that all ranks agree on ``state`` (collective), then
    ``model.register_comm_hook(state, allreduce_hook)``. Returns ``model``."""
    state.check()
    model.register_comm_hook(state, allreduce_hook)
    return model


# -- FSDP ---------------------------------------------------------------------------------------


def _fsdp_factors(p: int) -> Tuple[float, float]:
    """FSDP's default gradient pre- and post-division factors for ``p`` ranks (PyTorch's
    ``DefaultState._get_gradient_predivide_factor``): ``pre * post == p``."""
    f = 1
    while p % f == 0 and p / f > f:
        f *= 2
    return float(f), p / f


def fsdp_allreduce_hook(state: HookState, grad: torch.Tensor, key: Optional[Any] = None) -> None:
    """FSDP1 hook for ``ShardingStrategy.NO_SHARD``: replaces ``grad`` (a unit's flat gradient)
    in place by its compressed average over the group.

    Register with :func:`register_fsdp` (or ``fsdp_model.register_comm_hook(state, hook)``).
    Same bound and determinism as :func:`allreduce_hook`; a call that is not compressed
    (``policy="never"``, or ``"auto"`` choosing the raw path) divides and all-reduces exactly as
    FSDP's default path does (the same bits). ``key`` names the unit (telemetry, ``auto``
    decisions, error-feedback residual); by default the gradient's size.
    """
    k = ("fsdp-ar", grad.numel()) if key is None else key
    avg = _average(state, k, grad, fsdp_divide=True)
    with torch.no_grad():
        grad.copy_(avg.reshape(grad.shape))


def fsdp_reduce_scatter_hook(
    state: HookState, grad: torch.Tensor, output: torch.Tensor, key: Optional[Any] = None
) -> None:
    """FSDP1 hook for the sharded strategies (``FULL_SHARD``, ``SHARD_GRAD_OP``): ``output`` =
    this rank's shard of the compressed average of ``grad``.

    Register with :func:`register_fsdp` (or ``fsdp_model.register_comm_hook(state, hook)``).
    ``grad`` is a unit's flat unsharded (padded) gradient, ``p`` equal shards; ``output`` this
    rank's shard. See :func:`compressed_reduce_scatter_tensor` for the bound, the determinism and
    the raw path (FSDP's default bits).
    """
    compressed_reduce_scatter_tensor(output, grad, state, key=key)


class _UnitHook:
    """An FSDP1 hook bound to one FSDP unit's key (``hook(state, *tensors, key=key)``)."""

    def __init__(self, hook: Any, key: Any) -> None:
        self.hook = hook
        self.key = key

    def __call__(self, state: HookState, *tensors: torch.Tensor) -> None:
        self.hook(state, *tensors, key=self.key)


def register_fsdp(model: Any, state: HookState) -> Any:
    """Register the zcomm hook on an FSDP1 model (``FullyShardedDataParallel``, the root).

    Checks that all ranks agree on ``state`` (collective), picks :func:`fsdp_allreduce_hook`
    for ``NO_SHARD`` or :func:`fsdp_reduce_scatter_hook` for ``FULL_SHARD`` / ``SHARD_GRAD_OP``
    (per unit),
    calls ``model.register_comm_hook(state, hook)`` (before the first forward), then keys each
    FSDP unit by its position in ``FullyShardedDataParallel.fsdp_modules(model)`` (the same on
    every rank), so that units whose flat gradients have the same size keep separate
    error-feedback residuals and ``auto`` statistics (with the plain ``register_comm_hook``
    they are keyed by size). Hybrid strategies are refused by FSDP itself. Returns ``model``.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    strategy = getattr(model, "sharding_strategy", None)
    if strategy is None:
        raise TypeError(
            f"register_fsdp: expected a FullyShardedDataParallel model, got {type(model).__name__}"
        )
    state.check()

    def pick(strategy: Any) -> Any:
        return fsdp_allreduce_hook if strategy == ShardingStrategy.NO_SHARD else fsdp_reduce_scatter_hook

    hook = pick(strategy)
    model.register_comm_hook(state, hook)
    for i, unit in enumerate(FSDP.fsdp_modules(model)):
        # FSDP1 stores the hook on each unit's state (the FSDP module itself); a unit may have
        # its own strategy
        if getattr(unit, "_comm_hook", None) is hook:
            unit._comm_hook = _UnitHook(pick(unit.sharding_strategy), ("fsdp", i))
    return model


def _finish_raw(
    state: HookState,
    key: Any,
    output: torch.Tensor,
    res: torch.Tensor,
    nbytes: int,
    predicted: float,
    t0: float,
    why: str,
) -> torch.Tensor:
    """The end of an uncompressed FSDP collective: ``res`` into ``output``, the counters, the
    telemetry line."""
    with torch.no_grad():
        output.copy_(res.reshape(output.shape))
    with state._lock:
        state._s["raw_calls"] += 1
        state._s["bytes_on_wire"] += nbytes + 8 * 16
    _log(state, key, "raw", predicted, time.perf_counter() - t0, why)
    return output


def compressed_reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    state: HookState,
    key: Optional[Any] = None,
    op: Optional[Any] = None,
) -> torch.Tensor:
    """Compressed ``reduce_scatter_tensor`` with the average as reduction.

    ``input`` holds ``p`` equal shards; ``output`` receives shard ``rank`` of the average over
    ranks. When the call is compressed (``state.policy``: ``always``, or ``auto`` by zcomm's
    transfer model with the same exploration as :func:`allreduce_hook`), each rank compresses
    each shard (global ``noa`` range over all ranks and shards), the streams go through
    ``all_to_all_single`` (lengths first), and each rank sums the ``p`` streams of its shard in
    rank order in float64 and rounds once: bit-identical on every run, and for every finite
    value ``|output - mean_r(shard_r)| <= e + ulp(output)/2 + d`` as for :func:`allreduce_hook`.
    CUDA tensors stay on their GPU (GPU codecs, exchange over the group's backend, GPU decode;
    the same float64 sums as on the host). When it is not compressed it runs the plain
    ``reduce_scatter_tensor`` with FSDP's pre- and post-division (the bits of FSDP's default
    path). ``key`` names the call's tensor for telemetry and error feedback (default: its size).
    ``op``: ``None`` (the average, as above), ``ReduceOp.AVG`` or ``ReduceOp.SUM`` (the sum,
    within ``p * e`` plus the rounding): the raw path is then ``reduce_scatter_tensor`` with that
    ``op`` and no division (FSDP2's default bits).

    Use it where PyTorch has no FSDP1 hook: FSDP2 (see :class:`ReduceScatter`), custom sharding.
    """
    average = True
    if op is not None:
        if op == dist.ReduceOp.SUM:
            average = False
        elif op != dist.ReduceOp.AVG:
            raise ValueError(f"reduce_scatter: op {op} is not supported (AVG or SUM)")
    pg = state.process_group
    p = dist.get_world_size(pg)
    rank = dist.get_rank(pg)
    if input.numel() != p * output.numel():
        raise ValueError(
            f"reduce_scatter: input has {input.numel()} values, expected {p} x {output.numel()}"
        )
    key = ("rs", input.numel()) if key is None else key
    device = input.device
    nbytes = input.numel() * input.element_size()
    t0 = time.perf_counter()
    x, dt = _flat_compute(input)
    b = state._bucket.setdefault(key, {"calls": 0, "ratio": None})
    pred = (
        _predict(state, key, nbytes, nbytes, (p - 1) / p * nbytes, (p - 1) / p * nbytes)
        if state.policy == "auto"
        else (0.0, 0.0)
    )
    lr = _finite_range(x, dt) if state.mode == "noa" else None
    lo, hi = lr if lr is not None else (math.inf, -math.inf)
    tm = time.perf_counter()
    grange, gpred = _meta(state, input.numel(), (lo, hi), pred, device)
    state._lat = _ema(state._lat, time.perf_counter() - tm)
    compress, why = _decide(state, b, gpred, nbytes)
    n = output.numel()

    if not compress:
        pre, post = _fsdp_factors(p) if op is None else (1.0, 1.0)
        inp = input.detach().reshape(-1)
        inp = inp / pre if pre > 1 else inp.contiguous()  # FSDP divides its own copy in place
        res = torch.empty(n, dtype=input.dtype, device=device)
        tr = time.perf_counter()
        if op is None:
            dist.reduce_scatter_tensor(res, inp, group=pg)
        else:
            dist.reduce_scatter_tensor(res, inp, op=op, group=pg)
        if post > 1:
            res.div_(post)
        state._bw = _ema(state._bw, (p - 1) / p * nbytes / max(time.perf_counter() - tr, 1e-9))
        return _finish_raw(state, key, output, res, nbytes, gpred[0], t0, why)

    gpu = _gpu_codec(x)
    tc0 = time.perf_counter()
    streams, own = [], None
    for j in range(p):
        s, xd, _e = _compress_own(
            state, key, x[j * n : (j + 1) * n].contiguous(), dt, grange, res_key=(key, j)
        )
        streams.append(s)
        if j == rank:
            own = xd
    sent = sum(s.numel() for s in streams)
    state._tc = _ema(state._tc, nbytes / max(time.perf_counter() - tc0, 1e-9))
    b["ratio"] = nbytes / max(sent, 1)
    tx0 = time.perf_counter()
    # gloo has no all-to-all on CUDA tensors: its (compressed, small) streams go through host
    # memory; NCCL exchanges them on the device
    xdev = torch.device("cpu") if device.type == "cuda" and _backend(pg) == "gloo" else device
    send_lens = torch.tensor([s.numel() for s in streams], dtype=torch.int64, device=xdev)
    recv_lens = torch.empty_like(send_lens)
    dist.all_to_all_single(recv_lens, send_lens, group=pg)
    rl = [int(v) for v in recv_lens.tolist()]
    send = torch.cat([s.to(xdev) for s in streams])
    recv = torch.empty(sum(rl), dtype=torch.uint8, device=xdev)
    dist.all_to_all_single(recv, send, rl, [s.numel() for s in streams], group=pg)
    state._bw = _ema(state._bw, (p - 1) / p * sent / max(time.perf_counter() - tx0, 1e-9))
    td0 = time.perf_counter()
    recv = recv.to(device) if gpu else recv.cpu()
    assert own is not None
    acc = torch.zeros(n, dtype=torch.float64, device=own.device)
    off = 0
    # rank order, one f64 rounding per addition (the same sums on the host and on the GPU)
    for r in range(p):
        if r == rank:
            acc.add_(own.double())
        elif gpu:
            # (zcomm.decompress copies a stream at an unaligned offset of `recv` first)
            acc.add_(_zc.decompress(recv[off : off + rl[r]]).double())
        else:
            seg = recv[off : off + rl[r]]
            _native.accumulate_f64([(seg.data_ptr(), seg.numel())], acc.data_ptr(), n)
        off += rl[r]
    if average:
        acc.div_(p)
    with torch.no_grad():
        output.copy_(acc.to(output.dtype).reshape(output.shape))
    state._td = _ema(state._td, nbytes / max(time.perf_counter() - td0, 1e-9))
    with state._lock:
        state._s["compressed_calls"] += 1
        state._s["bytes_on_wire"] += int(send.numel()) + 8 * p + 8 * 16
    _log(state, key, "compressed", gpred[1], time.perf_counter() - t0, why)
    return output


def compressed_all_gather_into_tensor(
    output: torch.Tensor, input: torch.Tensor, state: HookState, key: Optional[Any] = None
) -> torch.Tensor:
    """Compressed ``all_gather_into_tensor``: ``output`` = the ``p`` ranks' ``input``
    concatenated, each finite value within the bound ``e`` of the original (every rank decodes
    the same streams, so ``output`` is bit-identical on every rank; this rank's own part is its
    decoded stream too). CUDA tensors stay on their GPU. Follows ``state.policy`` like the
    hooks (not compressed: the plain ``all_gather_into_tensor``, exact).

    A recipe for compressing a parameter all-gather: FSDP1 has no hook for it; FSDP2 takes a
    custom all-gather (:class:`AllGather`). Parameters are then lossy: use a tight bound.
    ``error_feedback`` is not applied to all-gathers (a parameter is not a running sum).
    """
    pg = state.process_group
    p = dist.get_world_size(pg)
    if output.numel() != p * input.numel():
        raise ValueError(
            f"all_gather: output has {output.numel()} values, expected {p} x {input.numel()}"
        )
    key = ("ag", input.numel()) if key is None else key
    device = input.device
    n = input.numel()
    nbytes = n * input.element_size()
    t0 = time.perf_counter()
    x, dt = _flat_compute(input)
    b = state._bucket.setdefault(key, {"calls": 0, "ratio": None})
    pred = (
        _predict(state, key, nbytes, p * nbytes, (p - 1) * nbytes, (p - 1) * nbytes)
        if state.policy == "auto"
        else (0.0, 0.0)
    )
    lr = _finite_range(x, dt) if state.mode == "noa" else None
    lo, hi = lr if lr is not None else (math.inf, -math.inf)
    tm = time.perf_counter()
    grange, gpred = _meta(state, n, (lo, hi), pred, device)
    state._lat = _ema(state._lat, time.perf_counter() - tm)
    compress, why = _decide(state, b, gpred, nbytes)

    if not compress:
        res = torch.empty(p * n, dtype=input.dtype, device=device)
        tr = time.perf_counter()
        dist.all_gather_into_tensor(res, input.detach().reshape(-1).contiguous(), group=pg)
        state._bw = _ema(state._bw, (p - 1) * nbytes / max(time.perf_counter() - tr, 1e-9))
        return _finish_raw(state, key, output, res, nbytes, gpred[0], t0, why)

    ef, state.error_feedback = state.error_feedback, False
    try:
        tc0 = time.perf_counter()
        stream, xd, _e = _compress_own(state, key, x, dt, grange)
    finally:
        state.error_feedback = ef
    state._tc = _ema(state._tc, nbytes / max(time.perf_counter() - tc0, 1e-9))
    b["ratio"] = nbytes / max(stream.numel(), 1)
    tx0 = time.perf_counter()
    streams = _exchange(state, stream, device, p)
    m = max(s.numel() for s in streams)
    state._bw = _ema(state._bw, (p - 1) * m / max(time.perf_counter() - tx0, 1e-9))
    td0 = time.perf_counter()
    rank = dist.get_rank(pg)
    res = torch.empty(p * n, dtype=x.dtype, device=xd.device)
    for r, s in enumerate(streams):
        part = res[r * n : (r + 1) * n]
        if r == rank:
            part.copy_(xd)  # this rank's stream, decoded already (the same bytes, the same values)
        else:
            _zc.decompress(s, out=part)  # on the GPU for CUDA streams
    with torch.no_grad():
        output.copy_(res.to(output.dtype).reshape(output.shape))
    state._td = _ema(state._td, p * nbytes / max(time.perf_counter() - td0, 1e-9))
    with state._lock:
        state._s["compressed_calls"] += 1
        state._s["bytes_on_wire"] += int(stream.numel()) + 8 + 8 * 16
    _log(state, key, "compressed", gpred[1], time.perf_counter() - t0, why)
    return output


# -- FSDP2 (fully_shard): custom collectives ---------------------------------------------------

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _over(state: HookState, group: Any, fn: Any, *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)`` with ``state.process_group`` set to ``group`` (FSDP2's own group)."""
    saved = state.process_group
    state.process_group = group
    try:
        return fn(*args, **kw)
    finally:
        state.process_group = saved


class _Fsdp2Collective:
    """What FSDP2's custom collectives share: the hook state, a telemetry key and the output
    buffer FSDP2 asks for (an ordinary tensor)."""

    def __init__(self, state: HookState, key: Optional[Any] = None) -> None:
        self.state = state
        self.key = key

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The output buffer FSDP2 asks for: an ordinary tensor."""
        return torch.empty(size, dtype=dtype, device=device)


class ReduceScatter(_Fsdp2Collective):
    """FSDP2 custom reduce-scatter of gradients. ``fully_shard`` modules have no comm hook but take
    a custom collective: ``module.set_custom_reduce_scatter(ReduceScatter(state))``, or
    :func:`register_fsdp2` for every ``fully_shard`` module of a model.

    Each call runs :func:`compressed_reduce_scatter_tensor` over FSDP2's group with FSDP2's
    ``op`` (``AVG`` for float32 / bfloat16; ``SUM`` after FSDP2's own division otherwise).
    Other ops (``PREMUL_SUM``, from ``set_gradient_divide_factor``) and non-float buffers go
    through the plain ``reduce_scatter_tensor``. Synchronous: returns ``None``, which FSDP2
    accepts. ``key`` names the module for telemetry and error feedback (default: the size).
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Optional[Any]:
        if input_tensor.dtype not in _FLOATS or not (op == dist.ReduceOp.AVG or op == dist.ReduceOp.SUM):
            return dist.reduce_scatter_tensor(
                output_tensor, input_tensor, op=op, group=group, async_op=async_op
            )
        key = ("fsdp2-rs", input_tensor.numel()) if self.key is None else self.key
        _over(self.state, group, compressed_reduce_scatter_tensor, output_tensor, input_tensor,
              self.state, key=key, op=op)
        return None


class AllGather(_Fsdp2Collective):
    """FSDP2 custom all-gather of parameters: ``module.set_custom_all_gather(AllGather(state))``
    (or ``register_fsdp2(model, state, all_gather_state=...)``). Each call runs
    :func:`compressed_all_gather_into_tensor` over FSDP2's group: the unsharded parameters used
    in forward and backward are then within the bound of the sharded ones (which stay exact, and
    identical on every rank); use a tight bound. A buffer FSDP2 packs as bytes (parameters of
    mixed dtypes) goes through the plain ``all_gather_into_tensor``. Synchronous: returns
    ``None``, which FSDP2 accepts.
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        async_op: bool = False,
    ) -> Optional[Any]:
        if input_tensor.dtype not in _FLOATS:
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        key = ("fsdp2-ag", input_tensor.numel()) if self.key is None else self.key
        _over(self.state, group, compressed_all_gather_into_tensor, output_tensor, input_tensor,
              self.state, key=key)
        return None


def register_fsdp2(
    model: Any, state: HookState, all_gather_state: Optional[HookState] = None
) -> Any:
    """Give every ``fully_shard`` module of ``model`` (``FSDPModule``) a :class:`ReduceScatter`
    over ``state`` and, with ``all_gather_state``, an :class:`AllGather` (parameters: use a
    tighter bound there). Each module gets its own key (its position in ``model.modules()``, the
    same on every rank). Checks that the ranks agree on the states first (collective). Returns
    ``model``.
    """
    from torch.distributed.fsdp import FSDPModule

    state.check()
    if all_gather_state is not None:
        all_gather_state.check()
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise TypeError("register_fsdp2: the model has no fully_shard module")
    for i, m in enumerate(units):
        m.set_custom_reduce_scatter(ReduceScatter(state, key=("fsdp2-rs", i)))
        if all_gather_state is not None:
            m.set_custom_all_gather(AllGather(all_gather_state, key=("fsdp2-ag", i)))
    return model


# -- report --------------------------------------------------------------------------------------


def report(file: Any = None) -> str:
    """Print (and return) a table of every HookState's telemetry on this rank."""
    head = (
        f"{'bound':>12} {'policy':>7} {'calls':>6} {'cmp':>5} {'raw':>5} {'MB in':>9} "
        f"{'MB wire':>9} {'ratio':>7} {'max err':>10} {'e':>10} {'viol':>5} "
        f"{'pred s':>8} {'meas s':>8}"
    )
    lines = [head, "-" * len(head)]
    for st in _STATES:
        s = st.stats()
        lines.append(
            f"{st.error_bound:>12} {st.policy:>7} {s['calls']:>6} {s['compressed_calls']:>5} "
            f"{s['raw_calls']:>5} {s['bytes_in'] / 1e6:>9.3f} {s['bytes_on_wire'] / 1e6:>9.3f} "
            f"{s['ratio']:>7.2f} {s['max_error']:>10.3e} {s['bound']:>10.3e} "
            f"{s['bound_violations']:>5} {s['predicted_s']:>8.4f} {s['measured_s']:>8.4f}"
        )
        dec = ", ".join(f"{k}={v}" for k, v in s["decisions"].items() if v)
        lines.append(f"{'':>12} decisions: {dec or '-'}")
    text = "\n".join(lines)
    print(text, file=file)
    return text
