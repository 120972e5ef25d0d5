"""TBE forward and training step: embnum's cpu backend beside fbgemm_gpu's CPU TBE, torch's
``embedding_bag`` looped over the tables and a copy of the bytes that must move, in one process.

    python benchmarks/bench_tbe.py [--T 26] [--rows 100000] [--D 128] [--B 2048] [--L 20]
                                   [--threads 1 2] [--dtypes float32 float16] [--rounds 9] [--no-step]

The benchmark case: T=26 tables of 100,000 rows, D=128, B=2048, bag lengths Poisson(20),
int64 ids drawn uniformly (every lookup a cache miss, as in a large model). For each weight
dtype and thread count (Numba's and torch's set alike), the contenders run interleaved block
by block (``_bench.interleaved``: ``torch.utils.benchmark``, median and IQR over the rounds;
the forward's contenders each run once untimed before each block, so none pays for the dirty
output lines the previous one left):

* forward (SUM pooling, float32 output): ``embnum.tbe_forward``; fbgemm's
  ``SplitTableBatchedEmbeddingBagsCodegen`` under ``no_grad`` (FP16 weights for float16);
  ``torch.nn.functional.embedding_bag`` per table, concatenated; ``floor``: a copy of the
  rows the forward must read (``N x D x itemsize`` bytes read and as many written);
  ``gather floor``: the same rows read in the forward's order and nothing written or summed
  (one element of every cache line a row touches xor-folded into one per-job value, every such
  line prefetched in the forward's two stages, the same jobs on the same threads): what this
  machine's memory gives a random-row read, which a contiguous copy (served by the hardware's
  stream prefetchers) does not show.
* training step (float32 weights only): forward + exact row-wise Adagrad.
  embnum: ``tbe_forward`` then ``tbe_backward_update``; fbgemm: ``module(indices,
  offsets).backward(grad)`` (EXACT_ROWWISE_ADAGRAD, fused); torch: the per-table loop with
  sparse gradients and ``torch.optim.Adagrad`` (element-wise: torch has no row-wise Adagrad;
  shown for scale only); ``floor``: a copy moving the bytes a step must move (rows read by
  the forward, output written, gradient read, ids read, every touched row and its
  accumulator read and written), i.e. a copy of half that many bytes.

``--align64``: embnum's (and the torch loop's) weights copied to a 64-byte boundary, as torch allocates
and as fbgemm's module holds its own; NumPy's large arrays start 16 bytes past one, so each row reaches
into one more cache line than it covers (a 512-byte row spans 9 lines, a 256-byte one 5).

Ratios: ``embnum / copy`` (target <= 1.15 for the forward), ``embnum / gather`` and ``peer / embnum`` (> 1: embnum
is faster; medians, minima in parentheses). Prints the load average before and after; the table is ready for RESULTS.md.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).parent))
import _bench  # noqa: E402
import embnum  # noqa: E402
from embnum.cpu.tbe import (  # noqa: E402
    _per_line,
    _prefetch_whole_row,
    _prefetch_whole_row_far,
    forward_prefetch,
)
from embnum.examples.tbe import make_batch  # noqa: E402

LR = 0.01


def aligned_copy(x, align=64):
    """``x`` copied into a buffer that starts on an ``align``-byte boundary (as torch allocates)."""
    buf = np.empty(x.nbytes + align, np.uint8)
    first = -buf.ctypes.data % align
    out = buf[first : first + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def batch(a, dtype):
    rng = np.random.default_rng(0)
    b = make_batch(rng, a.T, a.rows, a.D, a.B, a.L, dtype=dtype)
    if getattr(a, "align64", False):
        b["weights"] = aligned_copy(b["weights"])
    b["indices"] = rng.integers(0, a.rows, b["indices"].shape[0])  # uniform ids (make_batch skews them)
    b["grad"] = rng.standard_normal((a.B, a.T * a.D), dtype=np.float32) * np.float32(0.01)
    return b


def torch_tables(torch, a, b, dtype):
    """The per-table loop: ``T`` weight tensors (views of embnum's weights for the forward)."""
    w = torch.from_numpy(b["weights"]).view(a.T, a.rows, a.D)
    idx, offs, B = b["indices"], b["offsets"], a.B
    t_idx = [torch.from_numpy(idx[offs[t * B] : offs[(t + 1) * B]]) for t in range(a.T)]
    t_off = [torch.from_numpy(offs[t * B : (t + 1) * B] - offs[t * B]) for t in range(a.T)]
    F = torch.nn.functional

    def forward(weights=None):
        ws = w if weights is None else weights
        return torch.cat([F.embedding_bag(t_idx[t], ws[t], t_off[t], mode="sum") for t in range(a.T)], dim=1)

    return forward, t_idx, t_off


@njit(parallel=True, nogil=True, cache=True)
def _read_rows(w, woff, D, idx, starts, tables, sink, far, near):
    """Job ``j`` reads the rows ``w[woff[t] + idx[p] * D :][:D]`` of table ``t = tables[j]`` for
    ``p`` in ``starts[j]:starts[j + 1]`` (prefetched as the forward does) and xor-folds one element of
    each cache line they touch into ``sink[j, 0]`` (``w``: the weights' bits as unsigned integers;
    ``sink``: ``[jobs, D]``; ``far``, ``near``: the forward's prefetch distances for ``D``): the least
    work that brings every line of every row to the core."""
    for j in prange(tables.shape[0]):
        w0 = woff[tables[j]]
        p0, p1 = starts[j], starts[j + 1]
        acc = w[0] ^ w[0]
        for q in range(p0, min(p0 + far, p1)):
            _prefetch_whole_row_far(w, w0 + np.int64(idx[q]) * D, D)
        for q in range(p0, min(p0 + near, p1)):
            _prefetch_whole_row(w, w0 + np.int64(idx[q]) * D, D)
        for p in range(p0, p1):
            if p + far < p1:
                _prefetch_whole_row_far(w, w0 + np.int64(idx[p + far]) * D, D)
            if p + near < p1:
                _prefetch_whole_row(w, w0 + np.int64(idx[p + near]) * D, D)
            base = np.uint64(w0 + np.int64(idx[p]) * D)
            for d in range(0, D, _per_line(w)):
                acc ^= w[base + np.uint64(d)]
            acc ^= w[base + np.uint64(D - 1)]  # the line the row ends in (one more when it starts inside one)
        sink[j, 0] = acc


def gather_floor(a, b):
    """The ``gather floor`` contender: the forward's rows read in its jobs (64 bags of one feature)."""
    w = b["weights"].view(np.uint32 if b["weights"].itemsize == 4 else np.uint16)
    firsts = (np.arange(a.T)[:, None] * a.B + np.arange(0, a.B, 64)[None, :]).ravel()
    starts = b["offsets"][np.append(firsts, a.T * a.B)].astype(np.int64)
    tables = (firsts // a.B).astype(np.int64)
    sink = np.empty((tables.shape[0], a.D), w.dtype)
    woff, idx = b["weights_offsets"], b["indices"]
    far, near = forward_prefetch(a.D)
    return lambda: _read_rows(w, woff, a.D, idx, starts, tables, sink, far, near)


def forward_contenders(torch, a, b, fp16):
    lay = (b["weights_offsets"], b["D_offsets"], b["hash_size_cumsum"])
    w, idx, offs = b["weights"], b["indices"], b["offsets"]
    N = idx.shape[0]
    out = np.empty((a.B, a.T * a.D), np.float32)
    fns = {"embnum cpu": lambda: embnum.tbe_forward(w, *lay, idx, offs, "sum", out=out)}
    fb = _bench.fbgemm_tbe(a.T, a.rows, a.D, fp16=fp16)
    if fb is not None:
        ti, to = torch.from_numpy(idx), torch.from_numpy(offs)

        def fbgemm():
            with torch.no_grad():
                fb(ti, to)

        fns["fbgemm cpu"] = fbgemm
    if not a.no_torch:
        fwd = torch_tables(torch, a, b, fp16)[0]

        def loop():
            with torch.no_grad():
                fwd()

        fns["torch"] = loop
    fns.update(_bench.copy_contenders(N * a.D * w.itemsize, N * a.D * w.itemsize))
    fns["gather floor"] = gather_floor(a, b)
    return fns


def step_bytes(a, b) -> int:
    """Bytes a float32 row-wise Adagrad training step must move (reads + writes)."""
    idx, offs, B = b["indices"], b["offsets"], a.B
    tables = np.repeat(np.arange(a.T), np.diff(offs[::B]))
    touched = np.unique(tables.astype(np.int64) * a.rows + idx[offs[0] : offs[-1]]).shape[0]
    N, out = idx.shape[0], a.B * a.T * a.D * 4
    return N * a.D * 4 + out + out + 2 * N * idx.itemsize + touched * (2 * a.D * 4 + 2 * 4)


def step_contenders(torch, a, b):
    lay = (b["weights_offsets"], b["D_offsets"], b["hash_size_cumsum"])
    w, idx, offs, grad = b["weights"], b["indices"], b["offsets"], b["grad"]
    opt = embnum.TBEOptimizer("rowwise_adagrad", LR)
    m1 = np.zeros(int(lay[2][-1]), np.float32)
    out = np.empty((a.B, a.T * a.D), np.float32)

    def step():
        embnum.tbe_forward(w, *lay, idx, offs, "sum", out=out)
        embnum.tbe_backward_update(grad, w, *lay, idx, offs, "sum", optimizer=opt, momentum1=m1)

    fns = {"embnum cpu": step}
    fb = _bench.fbgemm_tbe(a.T, a.rows, a.D, lr=LR)
    tg = torch.from_numpy(grad)
    if fb is not None:
        ti, to = torch.from_numpy(idx), torch.from_numpy(offs)
        fns["fbgemm cpu"] = lambda: fb(ti, to).backward(tg)
    if not a.no_torch:
        # views of embnum's weights (both steps train the same buffer: saves a copy; the timing does not care)
        params = [torch.nn.Parameter(torch.from_numpy(w).view(a.T, a.rows, a.D)[t]) for t in range(a.T)]
        _, t_idx, t_off = torch_tables(torch, a, b, False)
        topt = torch.optim.Adagrad(params, lr=LR)
        warnings.filterwarnings("ignore", message="Sparse invariant checks")  # torch's note on sparse grads
        F = torch.nn.functional

        def loop():
            o = torch.cat(
                [F.embedding_bag(t_idx[t], params[t], t_off[t], mode="sum", sparse=True) for t in range(a.T)], dim=1
            )
            topt.zero_grad()
            o.backward(tg)
            topt.step()

        fns["torch"] = loop
    nbytes = step_bytes(a, b)
    fns.update(_bench.copy_contenders(nbytes // 2, nbytes - nbytes // 2))
    return fns


def timed(what, dtype, n, fns, rounds, warm=False):
    _bench.set_threads(n)
    row = {"what": what, "weights": dtype, "threads": n}
    ms = _bench.interleaved(fns, rounds=rounds, threads=n, warm=warm)
    row.update({k: _bench.fmt_ms_iqr(m) for k, m in ms.items()})
    _bench.ratio_cells(row, ms, "embnum cpu", floors=("copy floor", "gather floor"))
    print(f"  {what} {dtype} {n} thread(s): done", file=sys.stderr, flush=True)
    return row


def main(argv=None):
    p = _bench.tbe_arguments(__doc__, T=26, rows=100_000, B=2048)
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=["float32", "float16"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--no-torch", action="store_true", help="leave out the torch embedding_bag loop")
    p.add_argument("--no-step", action="store_true", help="time the forward only")
    p.add_argument("--align64", action="store_true", help="weights on a 64-byte boundary (NumPy's: 16 past one)")
    a = p.parse_args(argv)
    torch = _bench.optional_torch()
    if torch is None:
        sys.exit("needs torch (the peers' column)")

    def body():
        where = "64-byte aligned" if a.align64 else "as NumPy allocates them (16 bytes past a line)"
        print(f"- T={a.T} rows={a.rows} D={a.D} B={a.B} L~{a.L}, uniform int64 ids, weights {where}")
        rows = []
        for dtype in a.dtypes:
            b = batch(a, np.dtype(dtype))
            fns = forward_contenders(torch, a, b, dtype == "float16")
            rows += [timed("forward", dtype, n, fns, a.rounds, warm=True) for n in a.threads]
            del fns
            if dtype == "float32" and not a.no_step:
                fns = step_contenders(torch, a, b)
                rows += [timed("training step", dtype, n, fns, a.rounds) for n in a.threads]
                del fns
        return rows, _bench.ordered_columns(rows, ["what", "weights", "threads"])

    _bench.report("bench_tbe.py", body)


if __name__ == "__main__":
    main()
