"""TBE pooled forward, kernel A/B in one process: the element kernel (each bag summed element by
element through a float32 block in memory, ordinary stores; what the specialised dims ran before
the 8-lane kernel) beside the 8-lane register kernel with ordinary and with non-temporal stores,
and ``bench_tbe.py``'s gather floor.

    python benchmarks/investigations/ab_tbe_forward.py [--T 26] [--rows 100000] [--B 2048] [--L 20] [--threads 1 2]
                                        [--dtypes float16 float32] [--rounds 15] [--cpu-time]

The benchmark case (``bench_tbe.py``'s batch: uniform int64 ids, D=128, SUM pooling, float32 output,
one 64-byte-aligned output shared by the kernels). The kernels are called directly (no
declaration, no checks), so the columns differ only in the kernel. Each contender runs once
untimed before each block (``_bench.interleaved(warm=True)``). Both element and 8-lane kernels
prefetch each row's last line (this session's fix), so the element column is not the previous
session's kernel exactly. ``--cpu-time``: time the 1-thread rows with ``time.thread_time`` (leaves
out time the thread waited for a core on a loaded machine). ``--align64``: the weights copied to a
64-byte boundary, as torch allocates (NumPy's large arrays start 16 bytes past one, so each row
reaches into one more cache line). Results are checked equal first (the weights here hold no NaN,
so bit for bit).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/: _bench, bench_tbe
import _bench  # noqa: E402
import bench_tbe  # noqa: E402
from embnum.cpu import tbe  # noqa: E402


def contenders(a, dtype):
    b = bench_tbe.batch(a, np.dtype(dtype))
    w, lut = tbe._weights(b["weights"])
    feats = np.arange(a.T, dtype=np.int64)
    n = a.B * a.T * a.D
    buf = np.empty(n + 16, np.float32)
    first = (-buf.ctypes.data // 4) % 16
    out = buf[first : first + n].reshape(a.B, a.T * a.D)
    args = (w, lut, b["weights_offsets"], b["D_offsets"], feats, b["indices"], b["offsets"], a.B, False)
    element = tbe._make_forward_pooled(a.D, vector=False)
    vector = tbe._FORWARD_POOLED[a.D]
    kernels = {"element": (element, False), "8-lane": (vector, False), "8-lane streamed": (vector, True)}
    fns = {
        k: (lambda k_, s_: lambda: k_(*args, tbe._NO_F32, False, out, s_))(k_, s_) for k, (k_, s_) in kernels.items()
    }
    want = None
    for f in fns.values():
        f()
        want = out.copy() if want is None else want
        assert np.array_equal(want.view(np.uint32), out.view(np.uint32))
    fns["gather floor"] = bench_tbe.gather_floor(a, b)
    return fns


def main(argv=None):
    p = _bench.tbe_arguments(__doc__, T=26, rows=100_000, B=2048)
    p.add_argument("--dtypes", nargs="+", default=["float16", "float32"], choices=["float32", "float16"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cpu-time", action="store_true")
    p.add_argument("--align64", action="store_true", help="weights on a 64-byte boundary (NumPy's: 16 past one)")
    a = p.parse_args(argv)

    def body():
        where = "64-byte aligned" if a.align64 else "as NumPy allocates them"
        print(
            f"- T={a.T} rows={a.rows} D={a.D} B={a.B} L~{a.L}, uniform int64 ids, SUM, float32 output, weights {where}"
        )
        rows = []
        for dtype in a.dtypes:
            fns = contenders(a, dtype)
            for n in a.threads:
                _bench.set_threads(n)
                timer = time.thread_time if a.cpu_time and n == 1 else time.perf_counter
                ms = _bench.interleaved(fns, rounds=a.rounds, threads=n, timer=timer, warm=True)
                row = {"weights": dtype, "threads": n}
                for k, m in ms.items():
                    row[k] = f"{_bench.fmt_ms_iqr(m)} min {min(m.times) * 1e3:.3f}"
                for k in ("8-lane", "8-lane streamed"):
                    row[f"element / {k}"] = f"{ms['element'].median / ms[k].median:.2f}x"
                row["streamed / gather"] = f"{ms['8-lane streamed'].median / ms['gather floor'].median:.2f}"
                rows.append(row)
                print(f"  {dtype} {n} thread(s): done", file=sys.stderr, flush=True)
            del fns
        return rows, _bench.ordered_columns(rows, ["weights", "threads"])

    _bench.report("ab_tbe_forward.py", body)


if __name__ == "__main__":
    main()
