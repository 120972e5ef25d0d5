"""TBE family: embnum's cpu backend beside fbgemm_gpu's CPU TBE module and torch, in one run.

    python benchmarks/bench_tbe.py [--T 26] [--rows 100000] [--D 128] [--B 2048] [--L 20]

The issue's case: T=26 tables of 100,000 rows, D=128, B=2048, bag lengths
Poisson(20), float32, int64 ids (uniform). Two measurements:

* forward (SUM pooling);
* training step: forward + backward + exact row-wise Adagrad update. embnum:
  ``tbe_forward`` then ``tbe_backward_update``; fbgemm:
  ``SplitTableBatchedEmbeddingBagsCodegen`` (EXACT_ROWWISE_ADAGRAD, CPU),
  ``out = module(indices, offsets); out.backward(grad)``; torch:
  ``embedding_bag`` looped over the tables with ``sparse=True`` gradients and
  ``torch.optim.SparseAdam``-free manual row-wise Adagrad is not a built-in, so
  torch's training column uses ``torch.optim.Adagrad`` on sparse gradients
  (element-wise Adagrad: the nearest built-in).

"copy floor": a NumPy copy of the bytes of the gathered rows (N x D x 4), the
memory traffic a forward cannot avoid. Milliseconds, median of >= 7 runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embnum  # noqa: E402
from _bench import copy_floor, fmt_ms, machine, median_time, table  # noqa: E402
from embnum.examples.tbe import make_batch  # noqa: E402


def _fbgemm_module(torch, T, rows, D, lr):
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as exc:  # noqa: BLE001
        print(f"fbgemm_gpu not usable: {exc}")
        return None
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=lr,
        eps=1e-8,
        pooling_mode=PoolingMode.SUM,
        device="cpu",
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=26)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--B", type=int, default=2048)
    p.add_argument("--L", type=int, default=20)
    p.add_argument("--no-torch", action="store_true", help="skip the torch embedding_bag column")
    a = p.parse_args(argv)
    print(machine())
    rng = np.random.default_rng(0)
    batch = make_batch(rng, a.T, a.rows, a.D, a.B, a.L)
    u = rng.integers(0, a.rows, batch["indices"].shape[0])
    batch["indices"] = u  # uniform ids (make_batch skews them)
    N = batch["indices"].shape[0]
    lay = (batch["weights_offsets"], batch["D_offsets"], batch["hash_size_cumsum"])
    idx, offs = batch["indices"], batch["offsets"]
    lr = 0.01
    opt = embnum.TBEOptimizer("rowwise_adagrad", lr)
    grad = rng.standard_normal((a.B, a.T * a.D), dtype=np.float32)
    print(
        f"T={a.T} rows={a.rows} D={a.D} B={a.B} L~{a.L}: N={N} lookups, "
        f"weights {batch['weights'].nbytes / 2**30:.2f} GiB"
    )

    rows = []
    w = batch["weights"]
    m1 = np.zeros(int(lay[2][-1]), np.float32)
    fwd = lambda: embnum.tbe_forward(w, *lay, idx, offs, "sum")  # noqa: E731

    def step():
        embnum.tbe_forward(w, *lay, idx, offs, "sum")
        embnum.tbe_backward_update(grad, w, *lay, idx, offs, "sum", optimizer=opt, momentum1=m1)

    res = {"forward": {"embnum cpu": median_time(fwd)}, "training step": {"embnum cpu": median_time(step, min_runs=5)}}
    floor = copy_floor(N * a.D * 4, a.B * a.T * a.D * 4)
    res["forward"]["copy floor"] = floor

    import torch

    fb = _fbgemm_module(torch, a.T, a.rows, a.D, lr)
    if fb is not None:
        ti, to = torch.from_numpy(idx), torch.from_numpy(offs)
        tg = torch.from_numpy(grad)

        def fb_fwd():
            with torch.no_grad():
                fb(ti, to)

        def fb_step():
            fb(ti, to).backward(tg)

        res["forward"]["fbgemm CPU TBE"] = median_time(fb_fwd)
        res["training step"]["fbgemm CPU TBE"] = median_time(fb_step, min_runs=5)
        del fb
    if not a.no_torch:
        tables = [torch.nn.EmbeddingBag(a.rows, a.D, mode="sum", sparse=True) for _ in range(a.T)]
        topt = torch.optim.Adagrad([t.weight for t in tables], lr=lr)
        B = a.B
        t_idx = [torch.from_numpy(idx[offs[t * B] : offs[(t + 1) * B]]) for t in range(a.T)]
        t_off = [torch.from_numpy(offs[t * B : (t + 1) * B] - offs[t * B]) for t in range(a.T)]
        tg = torch.from_numpy(grad)

        def torch_fwd():
            with torch.no_grad():
                return torch.cat([tables[t](t_idx[t], t_off[t]) for t in range(a.T)], dim=1)

        def torch_step():
            out = torch.cat([tables[t](t_idx[t], t_off[t]) for t in range(a.T)], dim=1)
            topt.zero_grad()
            out.backward(tg)
            topt.step()

        res["forward"]["torch embedding_bag x T"] = median_time(torch_fwd)
        res["training step"]["torch embedding_bag x T (Adagrad)"] = median_time(torch_step, min_runs=5)

    for what, cols in res.items():
        for k, v in cols.items():
            rows.append(
                {
                    "measurement": what,
                    "implementation": k,
                    "ms": fmt_ms(v),
                    "vs embnum cpu": f"{v / cols['embnum cpu']:.2f}x" if k != "embnum cpu" else "",
                }
            )
    print(table(rows, ["measurement", "implementation", "ms", "vs embnum cpu"]))
    print("(vs embnum cpu > 1: embnum is faster by that factor; copy floor: NumPy copy of the gathered rows' bytes)")


if __name__ == "__main__":
    main()
