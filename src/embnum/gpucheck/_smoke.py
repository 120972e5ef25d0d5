"""Stage ``smoke``: the checks the simulator cannot make, each against the oracle where it computes.

* ``first_launch``: one op on device arrays (module load, argument passing, the result back);
* ``stream_torch`` / ``stream_cupy``: an op called while torch's (CuPy's) current stream is a
  non-blocking stream still busy writing the op's input must run after that write, on that stream;
* ``wide_grid``: ops with three times more work items than one pass of the largest grid covers;
* ``fused_tbe_step``: ``FusedTBE`` forward, backward and fused row-wise Adagrad on the device, two
  steps, against the same module on the oracle;
* ``kernel_times``, ``host_us``: :mod:`embnum.gpucheck._timing`.

In the simulator there are no streams (those checks say so) and every size is tiny.
"""

from __future__ import annotations

import time

import numpy as np

from .._backend import to_host


def _dev(a):
    from .._backend import BACKENDS

    return BACKENDS["cuda"].from_host(a)


def _sync():
    from .._backend import BACKENDS

    BACKENDS["cuda"].synchronize()


def first_launch(ctx) -> dict:
    import embnum

    lengths = np.random.default_rng(0).integers(0, 5, 1000)
    t0 = time.perf_counter()
    got = embnum.complete_cumsum(_dev(lengths), backend="cuda")
    _sync()
    seconds = time.perf_counter() - t0
    ok = np.array_equal(to_host(got), embnum.complete_cumsum(lengths, backend="ref"))
    return dict(ok=ok, first_call_seconds=round(seconds, 3))


_SPIN = 200_000_000  # GPU clock cycles torch.cuda._sleep spins: about 0.1 s, longer than any race window


def _regroup_case():
    """A ``regroup_keyed_tensor`` call (it reads nothing back, so nothing on the host waits for the
    stream before the launch) and its oracle result."""
    import embnum

    rng = np.random.default_rng(1)
    B = 1 << 15
    embs = [rng.standard_normal((B, 96)).astype(np.float32), rng.standard_normal((B, 32)).astype(np.float32)]
    how = dict(keys=[["a", "b"], ["c"]], lengths=[[64, 32], [32]], groups=[["c", "a"], ["b"]])
    return embs, how, embnum.regroup_keyed_tensor(embs, **how, backend="ref")


def stream_torch(ctx) -> dict:
    if ctx.sim:
        return dict(ok=None, why="the simulator has no streams")
    import torch

    import embnum.torch_bridge as tb

    embs, how, want = _regroup_case()
    src = [torch.from_numpy(e).cuda() for e in embs]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # a pool stream: non-blocking, so a launch elsewhere would race
    with torch.cuda.stream(side):
        torch.cuda._sleep(_SPIN)
        inputs = [s + 0 for s in src]  # written on `side` after the spin
        outs = tb.regroup_keyed_tensor(inputs, **how)
        got = [o.cpu() for o in outs]  # copies on `side`: they wait for it
    ok = all(np.array_equal(g.numpy(), w) for g, w in zip(got, want))
    return dict(ok=ok)


def stream_cupy(ctx) -> dict:
    if ctx.sim:
        return dict(ok=None, why="the simulator has no streams")
    import cupy
    import torch

    import embnum

    embs, how, want = _regroup_case()
    src = [cupy.asarray(e) for e in embs]
    cupy.cuda.Device().synchronize()
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        with torch.cuda.stream(torch.cuda.ExternalStream(side.ptr)):
            torch.cuda._sleep(_SPIN)
        inputs = [s + 0 for s in src]
        outs = embnum.regroup_keyed_tensor(inputs, **how, backend="cuda")
        got = [o.get(stream=side) for o in outs]
        side.synchronize()
    ok = all(np.array_equal(g, w) for g, w in zip(got, want))
    return dict(ok=ok)


def wide_grid(ctx) -> dict:
    import embnum

    from ..cuda import _common

    one_pass = _common.MAX_BLOCKS * _common.TPB
    rng = np.random.default_rng(3)
    n = 3 * one_pass + 5
    lengths = rng.integers(0, 3, n)
    got = to_host(embnum.complete_cumsum(_dev(lengths), backend="cuda"))
    ok_cumsum = np.array_equal(got, embnum.complete_cumsum(lengths, backend="ref"))
    B, L, D = 3 * one_pass // 8 + 1, 4, 2  # B * L * D outputs: three passes
    lens = rng.integers(0, L + 1, B)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    values = rng.standard_normal((int(offsets[-1]), D)).astype(np.float32)
    args = dict(values=values, offsets=[offsets], max_lengths=[L], padding_value=0.0)
    want = embnum.jagged_to_padded_dense(**args, backend="ref")
    dev_args = dict(args, values=_dev(values), offsets=[_dev(offsets)])
    got = to_host(embnum.jagged_to_padded_dense(**dev_args, backend="cuda"))
    ok_dense = np.array_equal(got, want)
    return dict(ok=ok_cumsum and ok_dense, one_pass_items=one_pass, cumsum_ok=ok_cumsum, padded_dense_ok=ok_dense)


def _lookups(rng, rows, B):
    """indices, offsets of ``B`` bags per feature, one feature per table, ids in range."""
    idx, lens = [], []
    for r in rows:
        n = rng.integers(0, 5, B)
        lens.append(n)
        idx.append(rng.integers(0, r, int(n.sum())))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lens))]).astype(np.int64)
    return np.concatenate(idx).astype(np.int64), offsets


def fused_tbe_step(ctx) -> dict:
    import torch

    import embnum
    from embnum.modules import FusedTBE

    rows, dims, B = ([20, 30], [4, 8], 3) if ctx.sim else ([2000, 3000, 500], [64, 128, 32], 256)
    opt = embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.05)
    ref = FusedTBE(rows, dims, optimizer=opt, backend="ref")
    dev = FusedTBE(rows, dims, optimizer=opt, backend="cuda")
    where = "cpu" if ctx.sim else "cuda"
    dev = dev.to(where)
    rng = np.random.default_rng(4)
    worst = 0.0
    for _ in range(2):
        idx, off = _lookups(rng, rows, B)
        out_r = ref(torch.from_numpy(idx), torch.from_numpy(off))
        out_d = dev(torch.from_numpy(idx).to(where), torch.from_numpy(off).to(where))
        worst = max(worst, float((out_d.detach().cpu() - out_r.detach()).abs().max()))
        g = torch.from_numpy(rng.standard_normal(tuple(out_r.shape)).astype(np.float32))
        out_r.backward(g)
        out_d.backward(g.to(where))
    w_err = float((dev.weights.detach().cpu() - ref.weights.detach()).abs().max())
    m_err = float((dev.momentum1.cpu() - ref.momentum1).abs().max())
    step = int(dev.iter.cpu())
    ok = worst <= 1e-4 and w_err <= 1e-5 and m_err <= 1e-4 * max(1.0, float(ref.momentum1.abs().max())) and step == 2
    return dict(ok=ok, output_err=worst, weights_err=w_err, momentum_err=m_err, steps=step)


def stage(ctx, limit) -> tuple[str, str]:
    from . import _timing

    checks = {
        "first_launch": first_launch,
        "stream_torch": stream_torch,
        "stream_cupy": stream_cupy,
        "wide_grid": wide_grid,
        "fused_tbe_step": fused_tbe_step,
        "kernel_times": _timing.kernel_times,
        "host_us": _timing.host_us,
    }
    results = {}
    start = time.perf_counter()
    for name, check in checks.items():
        if time.perf_counter() - start > limit:
            results[name] = dict(ok=False, why=f"not run: the stage passed its {limit} s limit")
            continue
        t0 = time.perf_counter()
        try:
            results[name] = check(ctx)
        except Exception as exc:  # noqa: BLE001 - each check is recorded on its own
            results[name] = dict(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        ctx.log(f"   {name}: {results[name]}")
    ctx.write("smoke", results)
    failed = [n for n, r in results.items() if r.get("ok") is False]
    skipped = [n for n, r in results.items() if r.get("ok") is None]
    line = f"{len(results) - len(failed) - len(skipped)} of {len(results)} passed"
    if skipped:
        line += f"; not applicable: {', '.join(skipped)}"
    if failed:
        line += f"; failed: {', '.join(failed)}"
    headline = results.get("kernel_times", {}).get("summary")
    if headline:
        line += f"; {headline}"
    return ("FAIL" if failed else "ok"), line
