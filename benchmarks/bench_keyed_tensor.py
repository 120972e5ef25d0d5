"""keyed_tensor family: embnum beside fbgemm_gpu's CPU permute_multi_embedding and torch, in one run.

    python benchmarks/bench_keyed_tensor.py [--batch 2048] [--batch 16384] [--backend cuda]

The classic case of the issue: keys ``[[f1,f2],[f3,f4,f5],[f6]]``, dims
``[[96,256],[512,128,768],[1024]]``, groups ``[[f1,f3],[f2],[f4,f1,f6],[f1,f5]]``
(f1 used three times), float32, forward and backward. Columns (ms, median of
>= 7 runs after 2 warm-ups):

* ``embnum cpu``: the public op, allocating its outputs; ``embnum cpu out=``:
  into reused outputs (the kernel without the first touch of fresh memory);
* ``bridge``: ``embnum.torch_bridge`` on torch tensors (forward: the custom op;
  backward: autograd through it);
* ``fbgemm cpu``: ``torch.ops.fbgemm.permute_multi_embedding`` (backward: autograd);
* ``torch``: ``cat`` + ``index_select`` + ``split`` (backward: autograd);
* ``copy floor``: a plain NumPy copy of the bytes the op must read and write
  (forward: the output bytes, read and written; backward: the output-gradient
  bytes read and the input-gradient bytes written), into a reused buffer;
  ``fresh copy``: the same copy into a newly allocated array (``ndarray.copy``),
  the floor of an op that returns new arrays (above glibc's 32 MB mmap threshold
  every call pays the first touch of fresh pages).

On a shared machine one contender can be unlucky in one stretch of time, so the
whole comparison runs ``--rounds`` times (default 3) and each cell keeps its
best median over the rounds.

``--backend cuda`` (a GPU with CuPy) adds the cuda backend on CuPy arrays and
its bandwidth (bytes read + written over time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embnum  # noqa: E402
from _bench import copy_floor, fmt_ms, machine, median_time, optional_fbgemm, optional_torch, table  # noqa: E402
from embnum.examples.keyed_tensor import classic_case  # noqa: E402


def fresh_copy_floor(nbytes_read: int, nbytes_written: int) -> float:
    """:func:`_bench.copy_floor` into a freshly allocated array each time."""
    n = max(nbytes_read, nbytes_written)
    src = np.ones(n, dtype=np.uint8)
    return median_time(src.copy) * (nbytes_read + nbytes_written) / (2 * n)


def _device_copy_bandwidth(nbytes: int) -> float:
    """Bytes read + written per second by a CuPy device-to-device copy of ``nbytes``."""
    import cupy

    src = cupy.ones(nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)

    def run():
        cupy.copyto(dst, src)
        cupy.cuda.get_current_stream().synchronize()

    return 2 * nbytes / median_time(run)


def run_case(B: int, backends: list[str]) -> list[dict]:
    rng = np.random.default_rng(B)
    embs, keys, lengths, groups = classic_case(rng, B)
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    in_lengths = ins.tolist()
    grads = [rng.standard_normal((B, w)).astype(np.float32) for w in ol]
    fwd_bytes = sum(g.nbytes for g in grads)
    bwd_read, bwd_written = fwd_bytes, sum(e.nbytes for e in embs)
    fwd = {"op": "forward", "B": B}
    bwd = {"op": "backward", "B": B}

    for backend in backends:
        be = embnum._backend.BACKENDS[backend]
        x = [be.from_host(e) for e in embs]
        g = [be.from_host(a) for a in grads]
        p, i_s, o_s = (be.from_host(a) for a in (perm, ins, outs))

        def f(x=x, p=p, i_s=i_s, o_s=o_s, backend=backend, be=be):
            embnum.permute_multi_embedding(x, p, i_s, o_s, ol, backend=backend)
            be.synchronize()

        def b(g=g, p=p, i_s=i_s, o_s=o_s, backend=backend, be=be):
            embnum.permute_multi_embedding_backward(g, p, i_s, o_s, in_lengths, backend=backend)
            be.synchronize()

        fwd[f"embnum {backend}"] = median_time(f)
        bwd[f"embnum {backend}"] = median_time(b)
        if backend == "cpu":
            fo = [np.empty((B, w), np.float32) for w in ol]
            bo = [np.empty((B, w), np.float32) for w in in_lengths]
            fwd["embnum cpu out="] = median_time(lambda: embnum.permute_multi_embedding(x, p, i_s, o_s, ol, out=fo))
            bwd["embnum cpu out="] = median_time(
                lambda: embnum.permute_multi_embedding_backward(g, p, i_s, o_s, in_lengths, out=bo)
            )
        if backend == "cuda":
            fwd["cuda GB/s"] = f"{2 * fwd_bytes / fwd['embnum cuda'] / 1e9:.0f}"
            bwd["cuda GB/s"] = f"{(bwd_read + bwd_written) / bwd['embnum cuda'] / 1e9:.0f}"
            fwd["cuda copy GB/s"] = bwd["cuda copy GB/s"] = f"{_device_copy_bandwidth(fwd_bytes) / 1e9:.0f}"

    torch = optional_torch()
    if torch is not None:
        from embnum import torch_bridge as tb

        xt = [torch.from_numpy(e).requires_grad_() for e in embs]
        gt = [torch.from_numpy(a) for a in grads]
        pt, it, ot = (torch.from_numpy(a) for a in (perm, ins, outs))

        def autograd_time(forward):
            y = forward()
            return median_time(lambda: torch.autograd.grad(y, xt, gt, retain_graph=True))

        fwd["bridge"] = median_time(lambda: tb.permute_multi_embedding(xt, pt, it, ot, ol))
        bwd["bridge"] = autograd_time(lambda: tb.permute_multi_embedding(xt, pt, it, ot, ol))
        fb = optional_fbgemm(torch)
        if fb is not None:
            fwd["fbgemm cpu"] = median_time(lambda: fb.permute_multi_embedding(xt, pt, it, ot, ol))
            bwd["fbgemm cpu"] = autograd_time(lambda: fb.permute_multi_embedding(xt, pt, it, ot, ol))
        # torch baseline: one gather over the concatenated inputs, then a split
        starts = np.concatenate([[0], np.cumsum(in_lengths)])
        index = torch.from_numpy(
            np.concatenate([np.arange(starts[i] + a, starts[i] + a + n) for i, _, a, _, n, _ in perm.tolist()]).astype(
                np.int64
            )
        )

        def torch_regroup():
            return torch.cat(xt, 1).index_select(1, index).split(ol, 1)

        fwd["torch"] = median_time(torch_regroup)
        bwd["torch"] = autograd_time(torch_regroup)

    fwd["copy floor"] = copy_floor(fwd_bytes, fwd_bytes)
    bwd["copy floor"] = copy_floor(bwd_read, bwd_written)
    fwd["fresh copy"] = fresh_copy_floor(fwd_bytes, fwd_bytes)
    bwd["fresh copy"] = fresh_copy_floor(bwd_read, bwd_written)
    return [fwd, bwd]


def _ratios(row, backends):
    main = "embnum cpu" if "cpu" in backends else f"embnum {backends[-1]}"
    if row.get("fbgemm cpu"):
        row["fbgemm / embnum"] = f"{row['fbgemm cpu'] / row[main]:.1f}x"
    row["embnum / floor"] = f"{row[main] / row['copy floor']:.2f}"
    row["embnum / fresh"] = f"{row[main] / row['fresh copy']:.2f}"
    if "embnum cpu out=" in row:
        row["out= / floor"] = f"{row['embnum cpu out='] / row['copy floor']:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 2048 and 16384)")
    parser.add_argument("--backend", action="append", help="embnum backends (default: cpu, and cuda on a GPU)")
    parser.add_argument("--rounds", type=int, default=3, help="repeat the comparison; keep each cell's best median")
    args = parser.parse_args(argv)
    gpu = embnum._backend.gpu_present() and embnum._backend.BACKENDS["cuda"].available()
    backends = args.backend or ["cpu"] + (["cuda"] if gpu else [])
    print(machine())
    print(f"- command: python benchmarks/bench_keyed_tensor.py {' '.join(sys.argv[1:])}".rstrip())
    rows = []
    for B in args.batch or [2048, 16384]:
        rounds = [run_case(B, backends) for _ in range(args.rounds)]
        for k, row in enumerate(rounds[0]):
            for key, value in row.items():
                if isinstance(value, float):
                    row[key] = min(r[k][key] for r in rounds)
            _ratios(row, backends)
            rows.append(row)
    columns = ["op", "B"] + [f"embnum {b}" for b in backends]
    columns += ["embnum cpu out="] if "cpu" in backends else []
    columns += [
        "bridge",
        "fbgemm cpu",
        "torch",
        "copy floor",
        "fresh copy",
        "fbgemm / embnum",
        "embnum / floor",
        "embnum / fresh",
    ]
    columns += ["out= / floor"] if "cpu" in backends else []
    columns += ["cuda GB/s", "cuda copy GB/s"] if "cuda" in backends else []
    for r in rows:
        for c in columns:
            if isinstance(r.get(c), float) or (r.get(c) is None and c not in ("op", "B")):
                r[c] = fmt_ms(r.get(c))
    print("\ntimes in ms\n")
    print(table(rows, columns))


if __name__ == "__main__":
    main()
