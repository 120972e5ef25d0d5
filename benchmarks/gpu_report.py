"""The GPU report: every op family on the cuda backend, beside a device copy of the same bytes and
the peers, in one command.

    python benchmarks/gpu_report.py [--out benchmarks/gpu_report.md] [--repeats 7]
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu_report.py --tiny   # the simulator, tiny sizes (CI)

On a GPU it needs CuPy and numba-cuda (the ``cuda13`` extra) and, for the peer columns, torch with
CUDA and, where importable, fbgemm_gpu; nothing is installed. For every registered op it times the
op's benchmark example (``size="large"``; the TBE headline case is the issue's: T=26 tables of 100k
rows, D=128, B=2048, L~20, float32 and float16 weights, forward and a training step):

* ``ms``: device time per call, CUDA events around a burst of calls on the current stream, median
  and quartiles of ``--repeats`` bursts;
* ``host us``: wall time from call to return with the GPU busy, kernel excluded, median: this is
  what the op costs the Python thread (an op that reads data back shows its kernel time here);
* ``floor ms`` and ``% copy``: the bytes the op must move (inputs read and outputs written; for the
  TBE ops the rows gathered, not the whole table) over the bandwidth of a device-to-device copy
  measured in the same run; ``% copy`` = floor / ms;
* ``torch`` / ``fbgemm``: the nearest torch built-in (``embedding_bag`` over the tables,
  ``cumsum``, ``index_select``) and fbgemm_gpu's op, on the same data, where one exists.

Under the simulator (``--tiny``) every time is wall time of Python threads: the run checks that the
report works, its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _bench import optional_fbgemm  # noqa: E402

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


# -- timing ----------------------------------------------------------------------------------------
class Clock:
    """Device time with CUDA events on the current CuPy stream; wall time under the simulator."""

    def __init__(self, repeats: int, burst: int):
        self.repeats, self.burst = repeats, burst
        if not SIMULATED:
            import cupy

            self.cp = cupy

    def sync(self):
        if not SIMULATED:
            self.cp.cuda.get_current_stream().synchronize()

    def warm_up(self, fn):
        """One untimed call on a GPU (first-launch costs). None in the simulator: there is nothing
        to warm, its times mean nothing, and every simulated call runs the kernel in Python threads."""
        if not SIMULATED:
            fn()
            self.sync()

    def device(self, fn) -> tuple[float, float, float]:
        """Median, first and third quartile of the seconds per call (after one warm-up call)."""
        self.warm_up(fn)
        times = []
        for _ in range(self.repeats):
            if SIMULATED:
                t0 = time.perf_counter()
                for _ in range(self.burst):
                    fn()
                times.append((time.perf_counter() - t0) / self.burst)
            else:
                start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
                start.record()
                for _ in range(self.burst):
                    fn()
                stop.record()
                stop.synchronize()
                times.append(self.cp.cuda.get_elapsed_time(start, stop) * 1e-3 / self.burst)
        q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        return statistics.median(times), q[0], q[2]

    def host(self, fn) -> float:
        """Median seconds from call to return (the queue is not drained between calls)."""
        self.warm_up(fn)
        times = []
        for _ in range(self.repeats * self.burst):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        self.sync()
        return statistics.median(times)


def copy_bandwidth(clock: Clock, nbytes: int = 1 << 28) -> float:
    """Bytes moved per second (read + written) by a device-to-device copy of ``nbytes``."""
    if SIMULATED:
        src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        t, _, _ = clock.device(lambda: np.copyto(dst, src))
    else:
        cp = clock.cp
        src, dst = cp.ones(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
        t, _, _ = clock.device(lambda: cp.copyto(dst, src))
    return 2 * nbytes / t


# -- inputs ------------------------------------------------------------------------------------------
def to_device(value):
    if SIMULATED:
        return value
    import cupy

    if isinstance(value, np.ndarray):
        return cupy.asarray(value)
    if isinstance(value, list):
        return [to_device(v) for v in value]
    return value


def nbytes(value) -> int:
    if hasattr(value, "nbytes") and hasattr(value, "dtype"):
        return int(value.nbytes)
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


def tbe_bytes(args, out) -> int:
    """Bytes a TBE op must move: the rows it gathers, the lookups, and its other array arguments
    except the whole table (and momentum buffers, of which only touched rows count)."""
    w = args["weights"]
    # int() of one element works on every array type (a device array copies it back); np.asarray
    # does not (CuPy refuses implicit conversion to NumPy)
    D = int(args["D_offsets"][1]) - int(args["D_offsets"][0])  # benchmark tables share one dim
    rows = nbytes(args["indices"]) // args["indices"].itemsize * D * w.itemsize
    rest = sum(nbytes(v) for k, v in args.items() if k not in ("weights", "momentum1", "momentum2"))
    return rows + rest + nbytes(out)


def launch(fn, args):
    """One call of an embnum op on the cuda backend (the tests swap it to run the report's host code
    on an array type that is not NumPy)."""
    return fn(**args, backend="cuda")


# -- peers ---------------------------------------------------------------------------------------------
def torch_views(args):
    """The example's arrays as torch tensors on the same device (DLPack, no copy), or None."""
    try:
        import torch
    except ImportError:
        return None, None

    def conv(a):
        return torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else torch.from_dlpack(a)

    out = {}
    for k, v in args.items():
        if hasattr(v, "dtype") and hasattr(v, "shape"):
            out[k] = conv(v)
        elif isinstance(v, list) and v and hasattr(v[0], "dtype"):
            out[k] = [conv(x) for x in v]
        else:
            out[k] = v
    return torch, out


def tbe_torch_forward(torch, t):
    """``embedding_bag`` over the tables (one call per feature), concatenated."""
    woff, doff, hcs = (np.asarray(t[k].cpu()) for k in ("weights_offsets", "D_offsets", "hash_size_cumsum"))
    offs = t["offsets"]
    T = woff.shape[0]
    B = (offs.shape[0] - 1) // T
    w = t["weights"]
    host_offs = np.asarray(offs.cpu())
    tables = []
    for f in range(T):
        D = int(doff[f + 1] - doff[f])
        rows = int(hcs[f + 1] - hcs[f]) or int(hcs[-1] - hcs[f])
        table = w[int(woff[f]) : int(woff[f]) + rows * D].view(rows, D)
        lo, hi = int(host_offs[f * B]), int(host_offs[(f + 1) * B])
        tables.append((table, t["indices"][lo:hi], offs[f * B : (f + 1) * B] - lo))

    def run():
        return torch.cat([torch.nn.functional.embedding_bag(i, tb, o, mode="sum") for tb, i, o in tables], dim=1)

    run.tables = tables
    return run


def tbe_torch_step(torch, t):
    """``embedding_bag`` over the tables with sparse gradients, then ``torch.optim.Adagrad`` (the
    nearest built-in to row-wise Adagrad: element-wise)."""
    fwd = tbe_torch_forward(torch, t)
    tables = fwd.tables
    params = [torch.nn.Parameter(tb.clone()) for tb, _, _ in tables]
    opt = torch.optim.Adagrad(params, lr=0.01)
    grad = t["grad_output"]

    def run():
        out = torch.cat(
            [
                torch.nn.functional.embedding_bag(i, p, o, mode="sum", sparse=True)
                for p, (_, i, o) in zip(params, tables)
            ],
            dim=1,
        )
        out.backward(grad.to(out.dtype))
        with torch.sparse.check_sparse_tensor_invariants(enable=False):  # opted out: as fast as before, no warning
            opt.step()
        opt.zero_grad()

    return run


def peers(name, label, args):
    """``{"torch": fn, "fbgemm": fn}`` for the ops that have a counterpart."""
    torch, t = torch_views(args)
    if torch is None:
        return {}
    fb = optional_fbgemm(torch)
    found = {}
    if name == "tbe_forward":
        found["torch"] = tbe_torch_forward(torch, t)
    elif name == "tbe_backward_update" and "step" in label:
        found["torch"] = tbe_torch_step(torch, t)
    elif name in ("complete_cumsum", "inclusive_cumsum", "exclusive_cumsum"):
        found["torch"] = lambda: torch.cumsum(t["lengths"], 0)
        if fb is not None and hasattr(fb, f"asynchronous_{name}"):
            found["fbgemm"] = lambda: getattr(fb, f"asynchronous_{name}")(t["lengths"])
    elif name == "permute_1d_sparse_data" or name == "permute_2d_sparse_data":
        found["torch"] = lambda: torch.index_select(t["lengths"], 0, t["permute"].long())
        if fb is not None:
            found["fbgemm"] = lambda: getattr(fb, name)(t["permute"], t["lengths"], t["values"], t.get("weights"))
    elif name == "jagged_to_padded_dense" and fb is not None:
        found["fbgemm"] = lambda: fb.jagged_to_padded_dense(t["values"], t["offsets"], t["max_lengths"], 0.0)
    elif name == "float_to_fused_8bit_rowwise" and fb is not None:
        found["fbgemm"] = lambda: fb.FloatToFused8BitRowwiseQuantized(t["input"])
    return found


# -- the report ------------------------------------------------------------------------------------
def cases(size: str, tiny: bool):
    """(op, label, args) for every registered op, then the TBE headline cases."""
    import embnum
    from embnum.examples.tbe import make_batch

    for op in embnum.ops():
        ex = op.example_fn(np.random.default_rng(0), size)
        yield op, ex.label, ex.args
    s = dict(T=2, rows=50, D=8, B=4, L=2) if tiny else dict(T=26, rows=100_000, D=128, B=2048, L=20)
    from embnum._registry import get

    fwd, upd = get("tbe_forward"), get("tbe_backward_update")
    for dtype in (np.float32, np.float16):
        rng = np.random.default_rng(1)
        b = make_batch(rng, **s, dtype=dtype)
        b["indices"] = rng.integers(0, s["rows"], b["indices"].shape[0])  # uniform ids
        label = f"T={s['T']} {s['rows']}x{s['D']} B={s['B']} L~{s['L']} {np.dtype(dtype).name}"
        yield fwd, f"headline {label}", dict(b, pooling_mode="sum")
        m1 = np.zeros(int(b["hash_size_cumsum"][-1]), np.float32)
        grad = rng.standard_normal((s["B"], s["T"] * s["D"]), dtype=np.float32)
        opt = embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.01)
        yield upd, f"headline step {label}", dict(b, grad_output=grad, optimizer=opt, momentum1=m1)


def fmt(s):
    return "-" if s is None else f"{s * 1e3:.4g}"


def run_report(a) -> str:
    import embnum

    clock = Clock(a.repeats, 1 if a.tiny else 10)
    bw = copy_bandwidth(clock, 1 << (20 if a.tiny else 28))
    rows = []
    for op, label, host_args in cases("small" if a.tiny else "large", a.tiny):
        if a.op and op.name not in a.op:
            continue
        args = {k: to_device(v) for k, v in host_args.items()}
        call = lambda: launch(op.public, args)  # noqa: E731
        if label.startswith("headline step"):
            fwd_args = {k: v for k, v in args.items() if k not in ("grad_output", "optimizer", "momentum1")}

            def call():
                launch(embnum.tbe_forward, dict(fwd_args, pooling_mode="sum"))
                launch(op.public, args)

        try:
            out = call()
            med, q1, q3 = clock.device(call)
            host = clock.host(call)
            moved = tbe_bytes(args, out) if op.family == "tbe" else nbytes(args) + nbytes(out)
            floor = moved / bw
            row = dict(op=op.name, input=label, ms=f"{fmt(med)} [{fmt(q1)}, {fmt(q3)}]", host=f"{host * 1e6:.1f}")
            row.update(floor=fmt(floor), pct=f"{100 * floor / med:.0f}%")
            for peer, fn in peers(op.name, label, args).items():
                try:
                    row[peer] = fmt(clock.device(fn)[0])
                except Exception as exc:  # noqa: BLE001 - a peer that cannot run this input is reported
                    row[peer] = f"error: {type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001 - the report records every failure and goes on
            row = dict(op=op.name, input=label, ms=f"ERROR {type(exc).__name__}: {exc}"[:200])
        rows.append(row)
        print(f"{op.name:32s} {label:44s} {row.get('ms')}", flush=True)
    return render(rows, bw)


def device_name() -> str:
    if SIMULATED:
        return "Numba CUDA simulator (no GPU: the times are Python threads and mean nothing)"
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return f"{props['name'].decode()}, {props['multiProcessorCount']} SMs"


def render(rows, bw) -> str:
    import numba

    import embnum

    head = [
        "# embnum GPU report",
        "",
        f"- device: {device_name()}",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- embnum {embnum.__version__}, Python {platform.python_version()}, NumPy {np.__version__}, "
        f"numba {numba.__version__}",
        f"- device-to-device copy: {bw / 1e9:.1f} GB/s (bytes read + written)",
        "",
        "ms: median [quartiles] device time per call; host us: call-to-return time, kernel excluded; "
        "floor: the op's bytes at copy bandwidth; % copy = floor / ms.",
        "",
    ]
    cols = ["op", "input", "ms", "host", "floor", "pct", "torch", "fbgemm"]
    names = ["op", "input", "ms", "host us", "floor ms", "% copy", "torch ms", "fbgemm ms"]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")
    return "\n".join(head + lines) + "\n"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="small inputs (the simulator, CI)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--op", action="append", help="only this op (repeatable)")
    p.add_argument("--out", default=None, help="also write the markdown report here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    import embnum

    if not embnum._backend.BACKENDS["cuda"].available():
        print("the cuda backend is not available here (no GPU with CuPy, and the simulator is off)")
        return 2
    report = run_report(a)
    print(report)
    if a.out:
        Path(a.out).write_text(report)
    return 1 if "ERROR" in report else 0


if __name__ == "__main__":
    sys.exit(main())
