"""Kernel-only times of the headline TBE cases and host time per call.

``kernel_times``: the headline cases of ``benchmarks/gpu_report.py`` (T=26 tables of 100k rows,
D=128, B=2048, L~20; float32 and float16 weights), the forward and the training step, profiled
with torch.profiler (CUPTI records every kernel of the process, Numba's included): the sum of the
kernels' device times per call, per kernel name, and the bytes the case must move per kernel
microsecond. ``host_us``: median microseconds from call to return of ``tbe_forward`` on device
arrays and of a ``FusedTBE`` forward on tensors, the queue never drained (kernel time excluded).
Under the simulator both run at tiny sizes; there are no kernel times and the host times include
the simulated kernels.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .._backend import to_host

HEADLINE = dict(T=26, rows=100_000, D=128, B=2048, L=20)
TINY = dict(T=2, rows=50, D=8, B=4, L=2)


def _case(sim: bool, dtype):
    """(forward args, step args) on the device, and the bytes the forward must move."""
    from .._backend import BACKENDS
    from .._tbe import TBEOptimizer
    from ..examples.tbe import make_batch

    s = TINY if sim else HEADLINE
    rng = np.random.default_rng(1)
    b = make_batch(rng, **s, dtype=dtype)
    b["indices"] = rng.integers(0, s["rows"], b["indices"].shape[0])
    dev = {k: BACKENDS["cuda"].from_host(v) for k, v in b.items()}
    fwd = dict(dev, pooling_mode="sum")
    grad = rng.standard_normal((s["B"], s["T"] * s["D"]), dtype=np.float32)
    m1 = np.zeros(int(b["hash_size_cumsum"][-1]), np.float32)
    step = dict(dev, grad_output=BACKENDS["cuda"].from_host(grad), momentum1=BACKENDS["cuda"].from_host(m1))
    step["optimizer"] = TBEOptimizer("rowwise_adagrad", learning_rate=0.01)
    n = b["indices"].shape[0]
    moved = n * s["D"] * np.dtype(dtype).itemsize + b["indices"].nbytes + b["offsets"].nbytes
    moved += s["B"] * s["T"] * s["D"] * 4
    return fwd, step, moved, s


def _kernel_us(fn, sim: bool, reps: int) -> tuple[float | None, dict]:
    """Device microseconds per call summed over kernels, and per kernel name (None in the simulator)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .._backend import BACKENDS

    fn()
    BACKENDS["cuda"].synchronize()
    acts = [ProfilerActivity.CPU] if sim else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        BACKENDS["cuda"].synchronize()
        if not sim:
            torch.cuda.synchronize()
    if sim:
        return None, {}
    per_name = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if t:
            per_name[e.key[:80]] = round(t / reps, 2)
    return round(sum(per_name.values()), 2), per_name


def kernel_times(ctx) -> dict:
    import embnum

    reps = 2 if ctx.sim else 20
    rows, lines = {}, []
    for dtype in (np.float32, np.float16):
        fwd, step, moved, s = _case(ctx.sim, dtype)
        name = np.dtype(dtype).name
        for label, fn in (
            ("forward", lambda: embnum.tbe_forward(**fwd, backend="cuda")),
            ("step", lambda: embnum.tbe_backward_update(**step, backend="cuda")),
        ):
            total, per_name = _kernel_us(fn, ctx.sim, reps)
            row = dict(kernel_us=total, kernels=per_name)
            if total and label == "forward":
                row["GB_per_s"] = round(moved / (total * 1e-6) / 1e9, 1)
                lines.append(f"fwd {name} {total:.0f} us ({row['GB_per_s']} GB/s)")
            elif total:
                lines.append(f"step {name} {total:.0f} us")
            rows[f"{label} {name}"] = row
    size = ", ".join(f"{k}={v}" for k, v in s.items())
    seen = ctx.sim or all(r["kernel_us"] for r in rows.values())  # on a GPU every case has kernels
    out = dict(ok=seen, size=size, cases=rows)
    if not seen:
        out["why"] = "the profiler saw no kernel time for some case (CUPTI unavailable?)"
    if ctx.sim:
        out["why"] = "the profiler ran on the host only: the simulator has no kernels to time"
    else:
        out["summary"] = "; ".join(lines)
    return out


def _host_median(fn, calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def host_us(ctx) -> dict:
    import torch

    import embnum
    from embnum.modules import FusedTBE

    from .._backend import BACKENDS
    from ..ops.tbe import trust_device_layout

    calls = 5 if ctx.sim else 200
    fwd, _, _, s = _case(ctx.sim, np.float32)
    # no read back in the calls timed: the layout trusted once (else copied back per call) and bounds
    # mode "none" ("fatal" reads its verdict back: a wait for the device in every call)
    trust_device_layout(fwd["weights"], fwd["weights_offsets"], fwd["D_offsets"], fwd["hash_size_cumsum"])
    arrays = _host_median(lambda: embnum.tbe_forward(**fwd, bounds_check_mode="none", backend="cuda"), calls)
    BACKENDS["cuda"].synchronize()
    where = "cpu" if ctx.sim else "cuda"
    module = FusedTBE(
        [s["rows"]] * s["T"],
        [s["D"]] * s["T"],
        optimizer=embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.01),
        backend="cuda",
        bounds_check_mode="none",
    ).to(where)
    idx = torch.as_tensor(to_host(fwd["indices"])).to(where)
    off = torch.as_tensor(to_host(fwd["offsets"])).to(where)
    with torch.no_grad():
        bridged = _host_median(lambda: module(idx, off), calls)
    BACKENDS["cuda"].synchronize()
    out = dict(
        ok=True,
        tbe_forward_arrays_us=round(arrays, 1),
        fused_tbe_forward_tensors_us=round(bridged, 1),
        bounds_check_mode="none",
    )
    if ctx.sim:
        out["why"] = "the simulator runs the kernel inside the call: these times are not host overhead"
    return out
