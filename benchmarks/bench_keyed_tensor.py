"""keyed_tensor family: embnum beside fbgemm_gpu's CPU permute_multi_embedding and torch, in one run.

    python benchmarks/bench_keyed_tensor.py [--batch 2048] [--batch 16384] [--backend cuda]

The classic case of the issue: keys ``[[f1,f2],[f3,f4,f5],[f6]]``, dims
``[[96,256],[512,128,768],[1024]]``, groups ``[[f1,f3],[f2],[f4,f1,f6],[f1,f5]]``
(f1 used three times), float32, forward and backward. Columns: ms per call, median [IQR]
over ``--rounds`` rounds in which every contender of a row runs in turn in this process
(``_bench.interleaved``, torch.utils.benchmark); the load is printed before and after:

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
from _bench import (  # noqa: E402
    copy_contenders,
    default_backends,
    median_time,
    optional_fbgemm,
    optional_torch,
    ordered_columns,
    ratio_cells,
    report,
    timed_row,
)
from embnum.examples.keyed_tensor import classic_case  # noqa: E402


def _device_copy_bandwidth(nbytes: int) -> float:
    """Bytes read + written per second by a CuPy device-to-device copy of ``nbytes``."""
    import cupy

    src = cupy.ones(nbytes, dtype=cupy.uint8)
    dst = cupy.empty_like(src)

    def run():
        cupy.copyto(dst, src)
        cupy.cuda.get_current_stream().synchronize()

    return 2 * nbytes / median_time(run)


def contenders(B: int, backends: list[str]) -> tuple[dict, dict, tuple]:
    """The forward and the backward contenders of batch ``B`` (name -> callable), and the
    bytes ``(forward moved, backward read, backward written)``."""
    rng = np.random.default_rng(B)
    embs, keys, lengths, groups = classic_case(rng, B)
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    in_lengths = ins.tolist()
    grads = [rng.standard_normal((B, w)).astype(np.float32) for w in ol]
    fwd_bytes = sum(g.nbytes for g in grads)
    bwd_read, bwd_written = fwd_bytes, sum(e.nbytes for e in embs)
    fwd, bwd = {}, {}
    for backend in backends:
        be = embnum._backend.BACKENDS[backend]
        x = [be.from_host(e) for e in embs]
        g = [be.from_host(a) for a in grads]
        p, i_s, o_s = (be.from_host(a) for a in (perm, ins, outs))

        def f(x=x, p=p, i_s=i_s, o_s=o_s, backend=backend, be=be, out=None):
            embnum.permute_multi_embedding(x, p, i_s, o_s, ol, backend=backend, out=out)
            be.synchronize()

        def b(g=g, p=p, i_s=i_s, o_s=o_s, backend=backend, be=be, out=None):
            embnum.permute_multi_embedding_backward(g, p, i_s, o_s, in_lengths, backend=backend, out=out)
            be.synchronize()

        fwd[f"embnum {backend}"], bwd[f"embnum {backend}"] = f, b
        if backend == "cpu":
            fo = [np.empty((B, w), np.float32) for w in ol]
            bo = [np.empty((B, w), np.float32) for w in in_lengths]
            fwd["embnum cpu out="] = lambda f=f: f(out=fo)
            bwd["embnum cpu out="] = lambda b=b: b(out=bo)
    torch = optional_torch()
    if torch is not None:
        from embnum import torch_bridge as tb

        xt = [torch.from_numpy(e).requires_grad_() for e in embs]
        gt = [torch.from_numpy(a) for a in grads]
        pt, it, ot = (torch.from_numpy(a) for a in (perm, ins, outs))

        def autograd(forward):
            y = forward()
            return lambda: torch.autograd.grad(y, xt, gt, retain_graph=True)

        peers = {"bridge": lambda: tb.permute_multi_embedding(xt, pt, it, ot, ol)}
        fb = optional_fbgemm(torch)
        if fb is not None:
            peers["fbgemm cpu"] = lambda: fb.permute_multi_embedding(xt, pt, it, ot, ol)
        # torch baseline: one gather over the concatenated inputs, then a split
        starts = np.concatenate([[0], np.cumsum(in_lengths)])
        index = torch.from_numpy(
            np.concatenate([np.arange(starts[i] + a, starts[i] + a + n) for i, _, a, _, n, _ in perm.tolist()]).astype(
                np.int64
            )
        )
        peers["torch"] = lambda: torch.cat(xt, 1).index_select(1, index).split(ol, 1)
        fwd.update(peers)
        bwd.update({k: autograd(v) for k, v in peers.items()})
    fwd.update(copy_contenders(fwd_bytes, fwd_bytes, fresh=True))
    bwd.update(copy_contenders(bwd_read, bwd_written, fresh=True))
    return fwd, bwd, (fwd_bytes, bwd_read, bwd_written)


def run(batches, backends, rounds):
    main = "embnum cpu" if "cpu" in backends else f"embnum {backends[-1]}"
    rows, columns = [], ["op", "B"]
    for B in batches:
        fwd, bwd, (moved, bwd_read, bwd_written) = contenders(B, backends)
        for op, fns, nbytes in (("forward", fwd, 2 * moved), ("backward", bwd, bwd_read + bwd_written)):
            row = {"op": op, "B": B}
            ms = timed_row(row, fns, rounds=rounds, block_s=0.02)
            ratio_cells(row, ms, main)
            if "embnum cpu out=" in ms:
                row["out= / copy"] = f"{ms['embnum cpu out='].median / ms['copy floor'].median:.2f}"
            if "embnum cuda" in ms:
                row["cuda GB/s"] = f"{nbytes / ms['embnum cuda'].median / 1e9:.0f}"
                row["cuda copy GB/s"] = f"{_device_copy_bandwidth(moved) / 1e9:.0f}"
            rows.append(row)
    return rows, ordered_columns(rows, columns)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 2048 and 16384)")
    parser.add_argument("--backend", action="append", help="embnum backends (default: cpu, and cuda on a GPU)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row")
    args = parser.parse_args(argv)
    backends = default_backends(args.backend)
    report("bench_keyed_tensor.py", lambda: run(args.batch or [2048, 16384], backends, args.rounds))


if __name__ == "__main__":
    main()
