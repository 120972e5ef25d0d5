"""TBE fused optimizers: one training step (forward + fused backward/update) per optimizer kind on
embnum's cpu backend, beside fbgemm_gpu's CPU training module for the kinds it has on the CPU.

    python benchmarks/bench_tbe_optimizers.py [--T 8] [--rows 20000] [--D 128] [--B 512] [--L 20]
                                              [--threads 1 2] [--rounds 9]

The variants run interleaved block by block in one process (``_bench.interleaved``:
``torch.utils.benchmark``, median and IQR over the rounds, Numba's and torch's thread counts set
alike), so a change in the machine's load hits every variant alike; the load average is printed
before and after. SGD, Adagrad, row-wise Adagrad and Adam run embnum's fused kernel; LAMB,
the partial row-wise kinds, LARS-SGD and any kind with ``max_norm`` run the row-rule path (sparse
gradient, then the shared rule of ``embnum._tbe_rows`` per touched row). fbgemm 1.8.0 has no CPU
kernel for Adam, LAMB, the partial row-wise kinds or LARS-SGD.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _bench  # noqa: E402
import embnum  # noqa: E402
from embnum.examples.tbe import make_batch  # noqa: E402

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


def main(argv=None):
    p = _bench.tbe_arguments(__doc__, T=8, rows=20_000, B=512)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args(argv)
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
    torch = _bench.optional_torch()
    if torch is not None:
        ti, to, tg = torch.from_numpy(idx), torch.from_numpy(offs), torch.from_numpy(grad)
        for kind, name in FBGEMM.items():
            fb = _bench.fbgemm_tbe(a.T, a.rows, a.D, optimizer=name, lr=lr)
            if fb is not None:
                variants[f"fbgemm CPU TBE: {kind}"] = lambda fb=fb: fb(ti, to).backward(tg)

    def body():
        return [row for n in a.threads for row in timed(n)], [
            "training step",
            "threads",
            "ms",
            "vs embnum rowwise_adagrad",
        ]

    def timed(n):
        rows = []
        _bench.set_threads(n)
        ms = _bench.interleaved(variants, rounds=a.rounds, block_s=0.05, threads=n)
        base = ms["embnum cpu: rowwise_adagrad"].median
        for k, m in ms.items():
            rows.append(
                {
                    "training step": k,
                    "threads": n,
                    "ms": _bench.fmt_ms_iqr(m),
                    "vs embnum rowwise_adagrad": f"{m.median / base:.2f}x",
                }
            )
        return rows

    _bench.report("bench_tbe_optimizers.py", body)


if __name__ == "__main__":
    main()
