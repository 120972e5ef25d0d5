"""TBE fused optimizers: one training step (forward + fused backward/update) per optimizer kind on
embnum's cpu backend, beside fbgemm_gpu's CPU training module for the kinds it has on the CPU.

    python benchmarks/bench_tbe_optimizers.py [--T 8] [--rows 20000] [--D 128] [--B 512] [--L 20] [--rounds 9]

Rounds are interleaved (each round runs every variant once, in a rotated order), so a change in
the machine's load hits every variant alike; the table gives the median and the quartiles of the
rounds in milliseconds. SGD, Adagrad, row-wise Adagrad and Adam run embnum's fused kernel; LAMB,
the partial row-wise kinds, LARS-SGD and any kind with ``max_norm`` run the row-rule path (sparse
gradient, then the shared rule of ``embnum._tbe_rows`` per touched row). fbgemm 1.8.0 has no CPU
kernel for Adam, LAMB, the partial row-wise kinds or LARS-SGD.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embnum  # noqa: E402
from _bench import machine, optional_torch, table  # noqa: E402
from embnum.ops.tbe import make_batch  # noqa: E402

KINDS = [
    ("sgd", {}),
    ("adagrad", {}),
    ("rowwise_adagrad", {}),
    ("rowwise_adagrad", {"max_norm": 1.0}),
    ("adam", {}),
    ("lamb", {}),
    ("partial_rowwise_adam", {}),
    ("partial_rowwise_lamb", {}),
    ("lars_sgd", {}),
]
FBGEMM = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ADAGRAD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD"}


def _fbgemm(torch, T, rows, D, kind, lr):
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception:  # noqa: BLE001
        return None
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T,
        optimizer=getattr(EmbOptimType, FBGEMM[kind]),
        learning_rate=lr,
        eps=1e-8,
        pooling_mode=PoolingMode.SUM,
        device="cpu",
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=8)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--B", type=int, default=512)
    p.add_argument("--L", type=int, default=20)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args(argv)
    print(machine())
    rng = np.random.default_rng(0)
    batch = make_batch(rng, a.T, a.rows, a.D, a.B, a.L)
    lay = (batch["weights_offsets"], batch["D_offsets"], batch["hash_size_cumsum"])
    idx, offs = batch["indices"], batch["offsets"]
    grad = rng.standard_normal((a.B, a.T * a.D), dtype=np.float32) * np.float32(0.01)
    lr = 0.01
    print(f"T={a.T} rows={a.rows} D={a.D} B={a.B} L~{a.L}: N={idx.shape[0]} lookups, float32 weights")

    variants = {}
    for kind, extra in KINDS:
        opt = embnum.TBEOptimizer(kind, lr, **extra)
        w = batch["weights"].copy()
        sizes = opt.state_sizes(w.shape[0], int(lay[2][-1]))
        state = {k: np.zeros(n, np.float32) for k, n in sizes.items()}
        counter = [0]

        def step(w=w, opt=opt, state=state, counter=counter):
            counter[0] += 1
            embnum.tbe_forward(w, *lay, idx, offs, "sum")
            embnum.tbe_backward_update(
                grad, w, *lay, idx, offs, "sum", optimizer=opt, step=counter[0] if opt.uses_step else None, **state
            )

        name = kind + ("" if not extra else " " + ",".join(f"{k}={v}" for k, v in extra.items()))
        variants[f"embnum cpu: {name}"] = step
    torch = optional_torch()
    if torch is not None:
        ti, to, tg = torch.from_numpy(idx), torch.from_numpy(offs), torch.from_numpy(grad)
        for kind in FBGEMM:
            fb = _fbgemm(torch, a.T, a.rows, a.D, kind, lr)
            if fb is not None:
                variants[f"fbgemm CPU TBE: {kind}"] = lambda fb=fb: fb(ti, to).backward(tg)

    names = list(variants)
    times = {n: [] for n in names}
    for n in names:  # warm-up: compiles
        variants[n]()
    for r in range(a.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            variants[n]()
            times[n].append(time.perf_counter() - t0)
    base = statistics.median(times["embnum cpu: rowwise_adagrad"])
    rows = []
    for n in names:
        q1, med, q3 = statistics.quantiles(times[n], n=4)
        rows.append(
            {
                "training step": n,
                "median ms": f"{med * 1e3:.1f}",
                "quartiles ms": f"{q1 * 1e3:.1f} .. {q3 * 1e3:.1f}",
                "vs embnum rowwise_adagrad": f"{med / base:.2f}x",
            }
        )
    print(table(rows, ["training step", "median ms", "quartiles ms", "vs embnum rowwise_adagrad"]))


if __name__ == "__main__":
    main()
