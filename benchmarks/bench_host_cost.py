"""Host cost of a cuda-backend call: everything a TBE call does on the CPU before its launches.

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/bench_host_cost.py [--calls 300]

No GPU needed: the cuda backend runs under Numba's CUDA simulator with every kernel launch
replaced by a stub that only records it, so what is timed is the Python work of the call:
argument checks, the plan, the layout and bounds handling, the implementation's preparation,
allocations, and the launch arguments. On a GPU two costs come on top that this cannot see: the
launch itself (numba-cuda's dispatch: typing each argument, one DLPack export per array argument)
and each whole-array step the implementation takes with the array module (``cumsum``, ``argsort``,
``where``...; NumPy here, a CuPy kernel launch of its own on a GPU), which are counted instead.
Sizes are tiny so that those NumPy steps cost next to nothing here.

Rows: ``tbe_forward`` and ``tbe_backward_update`` (row-wise Adagrad) on arrays, and a
``FusedTBE`` forward and a forward + backward (fused update) on tensors through the torch bridge.
A ``FusedTBE`` forward through the op's generic path (the module before its prepared plan) is
timed beside the planned one, and the planned forward is then cut into its stages, each timed
alone, with the generic path's layers after them.
Columns: median and quartiles of wall microseconds per call, median thread CPU microseconds (the
waits for a core on a shared machine left out), Numba launches per call, their array and scalar
arguments, and the array-module calls per call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402


class _CountingModule:
    """The array module with every function call counted (a CuPy launch each on a GPU)."""

    def __init__(self, xp, counts):
        self._xp, self._counts = xp, counts

    def __getattr__(self, name):
        attr = getattr(self._xp, name)
        if callable(attr) and not isinstance(attr, type):

            def counted(*a, **k):
                self._counts["xp"] += 1
                return attr(*a, **k)

            return counted
        return attr


def _stub_launches(counts):
    """Replace every loaded cuda module's ``launch`` with a stub that counts launches, and their
    array and scalar arguments while ``counts["detail"]`` is set (the counting call of
    :func:`_measure`, outside the timed ones: in a timed call the stub costs next to nothing)."""
    import embnum.cuda.tbe  # noqa: F401 - the kernel module of every case
    from embnum.cuda import _common

    real = _common.launch  # (read once: the stub replaces _common's own too)

    def launch(kernel, n_blocks, tpb, *args):
        counts["launches"] += 1
        if counts["detail"]:
            counts["arrays"] += sum(isinstance(a, np.ndarray) for a in args)
            counts["scalars"] += sum(not isinstance(a, np.ndarray) for a in args)

    for mod in _cuda_modules():
        if getattr(mod, "launch", None) is real:
            mod.launch = launch


def _cuda_modules():
    return [m for m in list(sys.modules.values()) if (getattr(m, "__name__", "") or "").startswith("embnum.cuda")]


@contextlib.contextmanager
def _counting_xp(counts):
    """Every cuda module's ``xp()`` returns the counting module (its own overhead is not timed)."""
    from embnum.cuda import _common

    real = _common.xp
    mods = [m for m in _cuda_modules() if getattr(m, "xp", None) is real]
    for m in mods:
        m.xp = lambda: _CountingModule(real(), counts)
    try:
        yield
    finally:
        for m in mods:
            m.xp = real


def _measure(fn, calls: int, counts) -> dict:
    fn()  # warm: compiled checks, caches
    wall, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    for k in counts:
        counts[k] = 0
    counts["detail"] = 1
    with _counting_xp(counts):
        fn()
    counts["detail"] = 0
    q1, med, q3 = statistics.quantiles(wall, n=4)
    return dict(wall=med * 1e6, q1=q1 * 1e6, q3=q3 * 1e6, cpu=statistics.median(cpu) * 1e6, **counts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    a = p.parse_args(argv)
    import torch

    import embnum
    from embnum.examples.tbe import make_batch
    from embnum.modules import FusedTBE

    counts = dict(launches=0, arrays=0, scalars=0, xp=0, detail=0)
    _stub_launches(counts)
    s = dict(T=4, rows=64, D=16, B=8, L=3)
    rng = np.random.default_rng(0)
    b = make_batch(rng, **s)
    opt = embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.01)
    m1 = np.zeros(int(b["hash_size_cumsum"][-1]), np.float32)
    grad = rng.standard_normal((s["B"], s["T"] * s["D"]), dtype=np.float32)
    module = FusedTBE([s["rows"]] * s["T"], [s["D"]] * s["T"], optimizer=opt, backend="cuda")
    idx, off = torch.from_numpy(b["indices"]), torch.from_numpy(b["offsets"])
    g = torch.from_numpy(grad)

    def step():
        module(idx, off).backward(g)

    cases = {
        "tbe_forward (arrays)": lambda: embnum.tbe_forward(**b, pooling_mode="sum", backend="cuda"),
        "tbe_backward_update (arrays)": lambda: embnum.tbe_backward_update(
            grad, **b, optimizer=opt, momentum1=m1, backend="cuda"
        ),
        "FusedTBE forward (tensors)": lambda: module(idx, off),
        "FusedTBE forward + backward (tensors)": step,
    }
    generic = FusedTBE([s["rows"]] * s["T"], [s["D"]] * s["T"], optimizer=opt, backend="cuda")
    generic.forward_call = lambda weights: None  # the module as before its plan: every call through the op
    cases["FusedTBE forward, generic path (tensors)"] = lambda: generic(idx, off)
    generic_update = FusedTBE([s["rows"]] * s["T"], [s["D"]] * s["T"], optimizer=opt, backend="cuda")
    generic_update.planned_update = lambda grad, checked: False  # the backward before its plan
    cases["FusedTBE fwd + bwd, generic backward"] = lambda: generic_update(idx, off).backward(g)
    size = ", ".join(f"{k}={v}" for k, v in s.items())
    print(f"host cost per call, launches stubbed (Numba CUDA simulator, {size}, {a.calls} calls)")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    cols = f"{'launches':>8s} {'arrays':>6s} {'scalars':>7s} {'xp calls':>8s}"
    head = f"{'call':40s} {'wall us':>9s} {'quartiles':>15s} {'cpu us':>8s} {cols}"
    print(head + "\n" + "-" * len(head))
    for name, fn in cases.items():
        r = _measure(fn, a.calls, counts)
        print(
            f"{name:40s} {r['wall']:9.0f} {r['q1']:7.0f}-{r['q3']:<7.0f} {r['cpu']:8.0f} "
            f"{r['launches']:8.1f} {r['arrays']:6.1f} {r['scalars']:7.1f} {r['xp']:8.1f}"
        )
    _stages(module, idx, off, a.calls, counts)
    return 0


def _stages(module, idx, off, calls: int, counts) -> None:
    """The planned ``FusedTBE`` forward cut into its stages, each timed alone on the same inputs
    (wall median); the whole call's time beside their sum (the difference: the module's own call
    and torch's autograd Function)."""
    import torch

    from embnum.cuda import tbe as cuda_tbe
    from embnum.modules.tbe import _planned_forward
    from embnum.torch_bridge._call import _watched
    from embnum.torch_bridge._convert import on_torch_stream, to_array

    w = module.weights
    plan = module.forward_call(w)[0]
    ids_a, off_a = to_array(idx), to_array(off)
    ids_c, off_c, B = plan.lookups(ids_a, off_a, None)
    w_a = to_array(w)
    out = torch.empty(plan.shape(ids_c.shape[0], B), dtype=torch.float32)
    out_a = to_array(out)
    args = dict(
        weights=w_a,
        weights_offsets=plan.woff,
        D_offsets=plan.doff,
        hash_size_cumsum=plan.hcs,
        rows=plan.rows,
        indices=ids_c,
        offsets=off_c,
        B=B,
        pooling=plan.pooling,
        per_sample_weights=None,
    )
    lookup_args = cuda_tbe.LookupArgs(**{k: x for k, x in args.items() if k != "weights"})

    def checks():  # the planned path's tests of the tensors before it takes the call
        return (
            type(idx) is torch.Tensor
            and idx.device == w.device
            and idx.dtype in (torch.int32, torch.int64)
            and not _watched()
        )

    stages = {
        "module + autograd Function (whole call)": lambda: module(idx, off),
        "the planned path without the module": lambda: _planned_forward(module, w, idx, off, None),
        "tensor checks and _watched()": checks,
        "forward_call(): plan, weights view, dtype (one cache)": lambda: module.forward_call(w),
        "on_torch_stream (CPU: a null context)": lambda: on_torch_stream((w,)).__enter__(),
        "array views of 4 tensors (to_array)": lambda: (to_array(w), to_array(idx), to_array(off), to_array(out)),
        "plan.lookups: lookups validated + bounds checked": lambda: plan.lookups(ids_a, off_a, None),
        "output allocation (torch.empty)": lambda: torch.empty((B, plan.total_D), dtype=torch.float32),
        "plan.run: the kernel function, launch stubbed": lambda: plan.run(w_a, ids_c, off_c, B, None, out_a),
        "  of which cuda _prepare (Lookups)": lambda: cuda_tbe._prepare(lookup_args),
        "  of which the launch stub": lambda: cuda_tbe.launch(None, 1, 1, w_a, ids_c, off_c),
    }
    import embnum
    from embnum.ops import tbe as tbe_ops
    from embnum.torch_bridge import tbe_forward as bridge_forward

    bufs = module.layout()
    arrays = (w_a, *(to_array(b) for b in bufs), ids_a, off_a)
    generic = {
        "generic: the bridge op on tensors (no module)": lambda: bridge_forward(
            w.detach(), *bufs, idx, off, "sum", None, backend="cuda"
        ),
        "generic: the NumPy op on arrays (registry)": lambda: embnum.tbe_forward(*arrays, "sum", backend="cuda"),
        "generic: its declaration (layout + lookups checked)": lambda: tbe_ops.tbe_forward.declaration(*arrays, "sum"),
        "generic: the implementation, launch stubbed": lambda: cuda_tbe.tbe_forward(
            out=out_a, output_dtype=np.dtype(np.float32), **args
        ),
    }
    out_t, checked = _planned_forward(module, w, idx, off, None)
    update = module.update_plan(checked[0])
    g_a = to_array(torch.ones(tuple(out_t.shape)))
    m1 = to_array(module.momentum1)
    updates = {
        "update: the planned backward (FusedTBE.planned_update)": lambda: module.planned_update(
            torch.ones(tuple(out_t.shape)), checked
        ),
        "update: update_plan(): the plan's cache check": lambda: module.update_plan(checked[0]),
        "update: UpdatePlan.run, launch stubbed": lambda: update.run(g_a, *checked[1:], None),
        "update: cuda _update (runs + launches stubbed)": lambda: cuda_tbe._update(
            cuda_tbe._prepare(lookup_args), lookup_args, g_a, w_a, module.optimizer, m1, None, None
        ),
    }
    stages = {**stages, **updates, **generic}
    print("\nstages of the planned FusedTBE forward (each timed alone, launch stubbed), then the generic path's")
    head = f"{'stage':52s} {'wall us':>9s} {'quartiles':>15s} {'cpu us':>8s}"
    print(head + "\n" + "-" * len(head))
    for name, fn in stages.items():
        r = _measure(fn, calls, counts)
        print(f"{name:52s} {r['wall']:9.1f} {r['q1']:7.1f}-{r['q3']:<7.1f} {r['cpu']:8.1f}")
    print(
        "\nnot timed here (GPU only): numba-cuda's launch (its array and scalar arguments: the first "
        "table), which in numba-cuda 0.30 exports each array argument through DLPack twice (typeof, then "
        "_prepare_args), and the 4 tensors' DLPack exports to CuPy (to_array) in place of the NumPy views"
    )


if __name__ == "__main__":
    sys.exit(main())
