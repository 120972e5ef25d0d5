"""TorchRec's first training step on embnum's fbgemm_gpu stand-in: ``import torchrec``, the first
step (what it compiles plus the run) and the second.

    EMBNUM_FBGEMM_COMPAT=1 NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/bench_torchrec_first_step.py

Run it in an environment without fbgemm_gpu (docs/torchrec-without-fbgemm.md); a fresh
``NUMBA_CACHE_DIR`` gives the cold first step, a second run on the same directory the warm one.
The model: a ``FusedEmbeddingBagCollection`` of 4 tables of 100 x 16, row-wise Adagrad; a step is
the forward on 8 samples of 0-3 ids per feature and the backward with the fused update.
"""

from __future__ import annotations

import json
import time


def main() -> None:
    t0 = time.perf_counter()
    from embnum import fbgemm_compat

    fbgemm_compat.install()
    import torch
    import torchrec.optim as topt
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    t_import = time.perf_counter() - t0
    tables = [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=16, num_embeddings=100, feature_names=[f"f{t}"])
        for t in range(4)
    ]
    ebc = FusedEmbeddingBagCollection(
        tables=tables,
        optimizer_type=topt.RowWiseAdagrad,
        optimizer_kwargs={"lr": 0.1},
        device=torch.device("cpu"),
    )
    g = torch.Generator().manual_seed(0)

    def step() -> float:
        lengths = torch.randint(0, 4, (4 * 8,), generator=g)
        values = torch.randint(0, 100, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{t}" for t in range(4)], values=values, lengths=lengths)
        t = time.perf_counter()
        ebc(kjt).values().sum().backward()
        return time.perf_counter() - t

    first = step()
    second = step()
    times = {"import torchrec": round(t_import, 2), "first step": round(first, 2), "second step": round(second, 4)}
    print(json.dumps(times))


if __name__ == "__main__":
    main()
