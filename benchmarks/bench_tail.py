"""Tail latency of small calls, and where one thread stops being as fast as all of them.

    python benchmarks/bench_tail.py [--calls 2000] [--compete 2] [--op NAME ...] [--peers] [--sweep [--kernel NAME ...]]

Tail: every op's small tour example through ``embnum.<op>(...)`` (NumPy), called
``--calls`` times one by one (wall clock per call), in blocks of 50 that alternate
between the registry's rule (one thread below each kernel's threshold,
``embnum.cpu._common.SERIAL_BYTES_OF``; TBE's lookup rule) and all Numba threads always
(``SERIAL_OVERRIDE = 0``), the ops taken round robin (block by block), beside five
controls (pure Python spins of 20, 50 and 100 us, which time the scheduler alone, and
fixed pure-Python work of 100 and 1000 steps, whose time also grows when the machine
runs the same work slower); prints median, p90, p99 and p99 /
median of each, the share of calls in which the calling thread was preempted
(involuntary context switch) or blocked (voluntary: e.g. waiting for a parallel
region's threads), and the p99 of the calls that were neither. The issue's target: p99
at most 3x the median with two processes competing for the two cores: ``--compete N``
starts N busy processes (a Python spin loop each) for the run and ends them after it.
With three runnable processes on two cores the scheduler preempts the calling thread
every few milliseconds of its run time for a time slice (~3-4 ms here), whatever the
call does: once a call lasts more than ~1% of that interval, over 1% of its calls are
preempted and its p99 is a time slice (the spin controls show the rate); a call that
blocks is what the serial rule is there to prevent.

``--peers``: for every timed op that fbgemm_gpu has under the same arguments (the aliases of
``embnum.torch_bridge.fbgemm_aliases`` without an adapter), two more rows in the same round
robin, on CPU tensors sharing the example's memory: ``bridge <op>``
(``embnum.torch_bridge.<op>``) and ``fbgemm.<name>`` (fbgemm_gpu's C++ operator), so the
peer's own tail under the same competitors is measured beside embnum's. The rule and
all-threads columns change only embnum's thread rule: for fbgemm they are two samples of
the same call.

``--sweep``: for every swept kernel and inputs of 4 KiB to 16 MiB (inputs + output),
single calls on one thread and on all threads, alternating: p10 and median of each.
Per kernel it prints two thresholds (below one, the call runs on one thread):
"measured", the first size from which all threads were at least 10% faster by their
p10 (what a call costs when its cores are free, which the median on a loaded machine
does not show), and "model" (:func:`threshold`): the size at which one thread's work
reaches twice the measured launch cost of a parallel region, i.e. where a free second
core pays for waking it. On the loaded machine (load 9 on 2 cores) no kernel had a
measured crossover up to 16 MiB, so the declared table is the model's. The last line
is the table for ``embnum.cpu._common.SERIAL_BYTES_OF``.
Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _bench  # noqa: E402
import embnum  # noqa: E402
from embnum.cpu import _common  # noqa: E402

SIZES = [4 << 10 << (2 * k) for k in range(7)]  # 4 KiB .. 16 MiB of inputs + output


def _percentiles(ts):
    a = np.sort(np.asarray(ts)) * 1e6
    med, p90, p99 = (float(np.percentile(a, q)) for q in (50, 90, 99))
    return med, p90, p99


def _spin(seconds):
    """A control of ``seconds`` of pure Python work (no kernel, no allocation, no thread):
    what the scheduler alone does to a call that long."""

    def spin():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return spin


def _work(steps):
    """A control of a fixed amount of pure Python work (``steps`` additions; no kernel, no
    allocation, no thread): unlike a spin to a deadline, its time grows when the machine runs
    the same work slower (a busy neighbour, a slower phase of the VM), as a kernel's would."""

    def work():
        x = 0
        for i in range(steps):
            x += i
        return x

    return work


def _timed(fn, args, n, times, switches):
    """``n`` calls of ``fn(**args)``: wall time of each, and the calling thread's voluntary
    and involuntary context switches during it (``getrusage(RUSAGE_THREAD)``, read outside
    the timed span). A voluntary switch: the call blocked (e.g. waited for a parallel
    region's other threads); an involuntary one: the scheduler preempted the thread for
    another runnable process. One untimed call first: the ops run round robin, so a block's
    first call finds the caches holding the previous op's data. The records are floats and
    ints (``switches`` gets two ints a call, not a tuple): objects the cyclic garbage
    collector tracks, kept for the whole run, would make its collections longer and more
    frequent, and a collection lands inside some timed call (it did: with a tuple a call,
    the p99 of a fixed pure-Python work control grew to 2-2.6x its median)."""
    fn(**args)
    for _ in range(n):
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        t0 = time.perf_counter()
        fn(**args)
        t1 = time.perf_counter()
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        times.append(t1 - t0)
        switches.append(r1.ru_nvcsw - r0.ru_nvcsw)
        switches.append(r1.ru_nivcsw - r0.ru_nivcsw)


def _cells(ts, sw):
    med, p90, p99 = _percentiles(ts)
    sw = np.asarray(sw).reshape(-1, 2)
    blocked, preempted = sw[:, 0] > 0, sw[:, 1] > 0
    clean = np.asarray(ts)[~(blocked | preempted)] * 1e6
    p99c = float(np.percentile(clean, 99)) if clean.size else float("nan")
    return (
        f"{med:.1f} / {p90:.1f} / {p99:.1f} ({p99 / med:.1f}x)",
        f"{preempted.mean() * 100:.1f}% / {blocked.mean() * 100:.1f}%",
        f"{p99c:.1f} ({p99c / med:.1f}x)",
    )


def peer_cases(ops: dict) -> tuple[dict, dict]:
    """``(cases, notes)``: for each ``{name: (op, args)}`` with an fbgemm operator of the same
    arguments, ``bridge <name>`` and ``fbgemm.<fbgemm name>`` on the same tensors (each called
    once here: a peer that refuses the example is a note, not a row). Empty without fbgemm_gpu."""
    torch = _bench.optional_torch()
    fb = _bench.optional_fbgemm(torch)
    if fb is None:
        return {}, {"peers": "not timed: fbgemm_gpu is not importable"}
    from embnum import torch_bridge as tb
    from embnum.torch_bridge.fbgemm_aliases import ALIASES

    fbgemm_name = {}
    for fname, (_, name, adapter) in ALIASES.items():
        if name is not None and adapter is None:
            fbgemm_name.setdefault(name, fname)
    cases, notes = {}, {}
    for name, (op, args) in ops.items():
        if name not in fbgemm_name:
            continue
        bound = op.bind((), args)
        targs = _bench.bridge_tensors(torch, tb.BRIDGES[name], bound)
        positional = [targs[n] for n in bound]
        fbop, bridged = getattr(fb, fbgemm_name[name]), getattr(tb, name)
        try:
            fbop(*positional)
        except Exception as e:  # noqa: BLE001 - the peer's own refusal of this example
            notes[f"fbgemm.{fbgemm_name[name]}"] = f"not timed: {type(e).__name__}: {e}"[:100]
            continue
        cases[f"bridge {name}"] = (lambda f=bridged, t=targs: f(**t), {})
        cases[f"fbgemm.{fbgemm_name[name]}"] = (lambda f=fbop, p=positional: f(*p), {})
    return cases, notes


def tail(calls, only=None, peers=False):
    """Every op's tiny example and five pure-Python controls (spins to a deadline, fixed
    work), round robin: each round gives every op 50 calls under the rule, then 50 on all
    threads, so a burst of load from the neighbours falls on all ops and both modes alike
    (one op's calls are spread over the whole run, not taken in one stretch)."""
    cases, notes, timed = {}, {}, {}
    for op in embnum.ops():
        if op.mutates or op.example_fn is None or (only and op.name not in only):
            continue
        args = op.example_fn(np.random.default_rng(0), "small").args
        try:
            op.public(**args)
        except Exception as e:  # noqa: BLE001
            notes[op.name] = f"not timed: {type(e).__name__}"
            continue
        cases[op.name] = (op.public, args)
        timed[op.name] = (op, args)
    if peers:
        more, more_notes = peer_cases(timed)
        cases.update(more)
        notes.update(more_notes)
    for us in (20, 50, 100):
        cases[f"control: Python spin {us} us"] = (_spin(us * 1e-6), {})
    for steps in (100, 1000):
        cases[f"control: Python work, {steps} steps"] = (_work(steps), {})
    data = {k: {m: ([], []) for m in ("rule", "all threads")} for k in cases}
    for _ in range(max(1, calls // 100)):
        for name, (fn, args) in cases.items():
            for mode in ("rule", "all threads"):
                _common.SERIAL_OVERRIDE = None if mode == "rule" else 0
                _timed(fn, args, 50, *data[name][mode])
    _common.SERIAL_OVERRIDE = None
    rows = [dict(op=k, note=v) for k, v in notes.items()]
    for name, modes in data.items():
        rule, rule_sw, rule_clean = _cells(*modes["rule"])
        every, every_sw, _ = _cells(*modes["all threads"])
        rows.append(
            {
                "op": name,
                "rule": rule,
                "rule: preempted / blocked": rule_sw,
                "rule: p99 of calls neither preempted nor blocked": rule_clean,
                "all threads": every,
                "all threads: preempted / blocked": every_sw,
            }
        )
    print(
        "\nmicroseconds per call: median / p90 / p99 (p99 / median); preempted / blocked: share of calls in"
        " which the calling thread was switched out involuntarily (another process took the core) /"
        " voluntarily (the call waited, e.g. for a parallel region's threads)\n"
    )
    print(_bench.table(rows, [c for c in rows[-1] if c != "note"] + ["note"]))
    print(_summary(data))


def _kind(name: str) -> str:
    if name.startswith("control:"):
        return "controls"
    if name.startswith("fbgemm."):
        return "fbgemm"
    return "bridge" if name.startswith("bridge ") else "embnum (NumPy)"


def _summary(data: dict) -> str:
    """Per kind of row (embnum's NumPy call, the bridge, fbgemm, the controls): how many of its
    rows keep p99 within 3x the median under the rule, and the largest ratio."""
    by_kind: dict[str, list[float]] = {}
    for name, modes in data.items():
        a = np.asarray(modes["rule"][0])
        by_kind.setdefault(_kind(name), []).append(float(np.percentile(a, 99) / np.median(a)))
    parts = [f"{k} {sum(r <= 3 for r in rs)} of {len(rs)} (largest {max(rs):.2f}x)" for k, rs in by_kind.items()]
    return "\nrows with p99 within 3x the median, rule column: " + "; ".join(parts)


def _kjt(rng, nbytes, per_id):
    """Lengths of T=8 keys x B bags (Poisson(8)) and int64 ids, about ``nbytes`` moved at ``per_id`` bytes an id."""
    B = max(1, nbytes // (8 * 8 * per_id))
    lengths = rng.poisson(8, 8 * B).astype(np.int32)
    return lengths, rng.integers(0, 1 << 20, int(lengths.sum()))


def _sweep_args(name: str, nbytes: int, rng) -> dict:
    """Arguments of kernel ``name`` whose arrays (inputs + output) hold about ``nbytes``."""
    if name.endswith("_cumsum"):
        return dict(lengths=rng.integers(0, 64, max(1, nbytes // 16)))
    if name == "offsets_range":
        n = max(1, nbytes // 72)  # 8 elements of 8 bytes out per segment
        offs = np.arange(0, 8 * n + 1, 8, dtype=np.int64)
        return dict(offsets=offs[:-1], range_size=int(offs[-1]))
    if name in ("jagged_to_padded_dense", "dense_to_jagged"):
        B = max(1, nbytes // (3 * 32 * 32 * 4))  # lengths U[0, 64], D=32: values ~1/3 of the dense
        offs = np.concatenate([[0], np.cumsum(rng.integers(0, 65, B))])
        if name == "dense_to_jagged":
            return dict(dense=rng.standard_normal((B, 64, 32)).astype(np.float32), offsets=[offs])
        return dict(
            values=rng.standard_normal((int(offs[-1]), 32)).astype(np.float32), offsets=[offs], max_lengths=[64]
        )
    if name == "segment_sum_csr":
        n = max(8, nbytes // 4)
        csr = np.array([0, n // 8], np.int64)
        return dict(batch_size=8, csr_seg=csr, values=rng.standard_normal(8 * (n // 8)).astype(np.float32))
    if name in ("permute_2d_sparse_data", "permute_1d_sparse_data"):
        lengths, ids = _kjt(rng, nbytes, 2 * 12)
        w = rng.random(ids.shape[0], dtype=np.float32)
        if name == "permute_1d_sparse_data":
            return dict(permute=rng.permutation(lengths.shape[0]), lengths=lengths, values=ids, weights=w)
        return dict(permute=rng.permutation(8), lengths=lengths.reshape(8, -1), values=ids, weights=w)
    if name == "block_bucketize_sparse_features":
        lengths, ids = _kjt(rng, nbytes, 2 * 8 + 8)
        return dict(
            lengths=lengths,
            indices=ids,
            bucketize_pos=False,
            sequence=True,
            block_sizes=np.full(8, (1 << 20) // 4, np.int64),
            my_size=4,
        )
    if "rowwise" in name:
        R = max(1, nbytes // (64 * 4 + 64 + 8))
        x = rng.standard_normal((R, 64)).astype(np.float32)
        kw = {} if "8bit" in name else {"bit_rate": 4}
        if name.startswith("float_to"):
            return dict(input=x, **kw)
        quantize = embnum.float_to_fused_8bit_rowwise if "8bit" in name else embnum.float_to_fused_nbit_rowwise
        return dict(input=quantize(x, **kw), **kw)
    if name in ("float_to_fp16", "float_to_bfloat16"):
        return dict(input=rng.standard_normal(max(1, nbytes // 6)).astype(np.float32))
    if name == "permute_multi_embedding":
        from embnum.examples.keyed_tensor import classic_case

        B = max(1, nbytes // (2 * 4 * 4032))  # the classic case: 4032 floats a sample, read and written
        embs, keys, lengths, groups = classic_case(rng, B)
        perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
        return dict(pooled_embs=embs, permutes=perm, in_shapes=ins, out_shapes=outs, out_lengths=ol)
    raise KeyError(name)


SWEPT = [
    "complete_cumsum",
    "exclusive_cumsum",
    "inclusive_cumsum",
    "offsets_range",
    "jagged_to_padded_dense",
    "dense_to_jagged",
    "segment_sum_csr",
    "permute_2d_sparse_data",
    "permute_1d_sparse_data",
    "block_bucketize_sparse_features",
    "float_to_fused_8bit_rowwise",
    "fused_8bit_rowwise_to_float",
    "float_to_fused_nbit_rowwise",
    "fused_nbit_rowwise_to_float",
    "float_to_fp16",
    "float_to_bfloat16",
    "permute_multi_embedding",
]


def _threads(limit, fn):
    """``fn`` under one serial limit for every kernel (``SERIAL_OVERRIDE``)."""

    def run():
        _common.SERIAL_OVERRIDE = limit
        try:
            fn()
        finally:
            _common.SERIAL_OVERRIDE = None

    return run


def _alternating(one, all_, min_calls=60, min_seconds=0.25):
    """Per-call wall times (seconds) of ``one`` and ``all_``, called alternately after a
    warm-up call each: ``{"1": [...], "all": [...]}``. Single calls, not blocks: the low
    quantile of single calls is what a call costs when its cores are free, which a block
    average on a loaded machine does not show."""
    one(), all_()
    times = {"1": [], "all": []}
    start = time.perf_counter()
    while len(times["1"]) < min_calls or time.perf_counter() - start < min_seconds:
        for k, fn in (("1", one), ("all", all_)):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def sweep(kernels):
    import numba

    rng = np.random.default_rng(0)
    n_all = numba.get_num_threads()
    rows, thresholds, loaded = [], {}, {}
    for name in kernels:
        points = []  # (bytes, p10 one thread, p10 all threads), seconds
        for target in SIZES:
            args = _sweep_args(name, target, rng)
            fn = getattr(embnum, name)
            out = fn(**args)
            nbytes = _common.array_bytes(args, list(out) if isinstance(out, tuple) else out, 1 << 62)
            call = lambda fn=fn, args=args: fn(**args)  # noqa: E731
            ts = _alternating(_threads(1 << 62, call), _threads(0, call))
            q = {k: np.percentile(np.asarray(v) * 1e6, [10, 50]) for k, v in ts.items()}
            points.append((nbytes, q["1"][0], q["all"][0]))
            rows.append(
                {
                    "kernel": name,
                    "bytes": nbytes,
                    "1 thread p10 / median": f"{q['1'][0]:.1f} / {q['1'][1]:.1f}",
                    f"{n_all} threads p10 / median": f"{q['all'][0]:.1f} / {q['all'][1]:.1f}",
                    "p10 1 / all": f"{q['1'][0] / q['all'][0]:.2f}",
                    "median 1 / all": f"{q['1'][1] / q['all'][1]:.2f}",
                }
            )
        thresholds[name], launch = threshold(points)
        pays = [p[2] < 0.9 * p[1] for p in points]
        first = next((i for i in range(len(pays)) if all(pays[i:])), None)
        loaded[name] = points[first][0] if first is not None else None
        print(f"  {name}: {thresholds[name]} (launch {launch:.1f} us)", file=sys.stderr, flush=True)
    print(f"\nmicroseconds per call (single calls, alternating): p10 / median, one thread vs {n_all}\n")
    print(_bench.table(rows, list(rows[0])))
    print("\nthresholds, bytes (model: where one thread's work reaches twice the launch cost; measured: first size")
    print(
        "from which all threads were >= 10% faster by p10 on this machine under this load, None: never up to 16 MiB)\n"
    )
    table = [{"kernel": k, "model": v, "measured": loaded[k]} for k, v in thresholds.items()]
    print(_bench.table(table, ["kernel", "model", "measured"]))
    print(f"\nSERIAL_BYTES_OF = {thresholds}")


def threshold(points) -> tuple[int, float]:
    """``(bytes, launch us)``: the size below which one thread is faster than all with a
    free second core. ``launch``: what all threads cost over one at the smallest size (a
    parallel region's wake-up and join; 0 where the kernel has none, and then the
    threshold is 0: switching the thread count would cost without any gain). The work of
    a call is its one-thread p10 less that at the smallest size; with a perfect second
    core the call saves half its work, so parallel pays from work = 2 x launch on
    (interpolated between the swept sizes)."""
    base, one0, all0 = points[0]
    launch = all0 - one0
    if launch < 1.0:  # microseconds: no parallel region to wake (or noise)
        return 0, max(launch, 0.0)
    prev = (base, 0.0)
    for nbytes, one, _ in points[1:]:
        work = one - one0
        if work >= 2 * launch:
            b0, w0 = prev
            frac = (2 * launch - w0) / (work - w0) if work > w0 else 1.0
            return int(b0 + frac * (nbytes - b0)) >> 10 << 10, launch
        prev = (nbytes, max(work, prev[1]))
    return points[-1][0], launch


@contextlib.contextmanager
def competing(n: int):
    """``n`` busy processes (a Python spin loop each) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--compete", type=int, default=0, help="busy processes competing for the cores during the run")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--kernel", action="append", help="kernels to sweep (default: all swept kernels)")
    p.add_argument("--op", action="append", help="ops whose tail to time (default: every op)")
    p.add_argument("--peers", action="store_true", help="also the bridge call and fbgemm_gpu's operator")
    a = p.parse_args()
    print(_bench.machine())
    print(f"- command: python benchmarks/bench_tail.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"- SERIAL_BYTES = {_common.SERIAL_BYTES}, SERIAL_BYTES_OF = {_common.SERIAL_BYTES_OF}")
    print(f"- competing busy processes: {a.compete}")
    print(f"- before: {_bench.load()}", flush=True)
    with competing(a.compete):
        time.sleep(0.5 if a.compete else 0)
        if a.sweep:
            sweep(a.kernel or SWEPT)
        else:
            tail(a.calls, a.op, a.peers)
    print(f"\n- after: {_bench.load()}")


if __name__ == "__main__":
    main()
