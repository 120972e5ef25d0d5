"""A DistributedModelParallel checkpoint on 2 gloo processes over the stand-in: an
EmbeddingBagCollection sharded row-wise or table-wise with fused EXACT_ROWWISE_ADAGRAD (weights and
a row-wise optimizer state) trains ``dmp_side.STEPS - 1`` steps, is saved, and restored into freshly
built models whose tables start from zero: one through ``torch.distributed.checkpoint`` (model and
fused-optimizer state dicts saved to and loaded from disk), one through ``load_state_dict`` of the
saved model's state dicts. All three then train the last step.

``python dmp_checkpoint_side.py SHARDING OUT_DIR PORT`` writes ``OUT_DIR/rank{r}.pt``: for each of
``saved``, ``dcp`` and ``state_dict``, its last step's output, its pieces of every table and its
optimizer state, and the restored models' outputs before any training step.
"""

import os
import sys

import dmp_side
import torch
import torch.multiprocessing as mp
from dmp_side import STEPS, WORLD

LR = 0.1


def build(sharding):
    """A fresh DMP over an EBC of ``dmp_side.tables("ebc")``, every table sharded ``sharding``, all zeros."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel

    ebc = EmbeddingBagCollection(tables=dmp_side.tables("ebc"), device=torch.device("meta"))
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR, "eps": 1e-3}
    )
    plan = dmp_side.explicit_plan(ebc, sharder, sharding)
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    with torch.no_grad():
        for value in model.state_dict().values():
            for piece, _ in dmp_side._pieces(value):
                piece.zero_()
    return model


def step(model, kjt):
    """One training step; the output's values."""
    out = model(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    flat = out.values()
    (flat * flat).sum().backward()  # a loss whose gradient reads the weights: Adagrad's state differs per row
    return flat.detach().clone()


def snapshot(model):
    """Every local piece of the model's tables and of its fused optimizer's state, by name."""
    entries = {**model.state_dict(), **{f"optim.{k}": v for k, v in _flat(model.fused_optimizer.state_dict())}}
    return {k: [(o, p.detach().clone()) for p, o in dmp_side._pieces(v)] for k, v in entries.items()}


def _flat(tree, prefix=""):
    """``(dotted name, tensor)`` for the tensors of a nested optimizer state dict."""
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif isinstance(v, torch.Tensor):
            yield f"{prefix}{k}", v


def worker(rank, sharding, out_dir, port):
    dmp_side.in_group(rank, port, train, sharding, out_dir)


def train(rank, sharding, out_dir):
    import torch.distributed.checkpoint as dcp
    from torchrec import KeyedJaggedTensor

    keys = [f"f{i}" for i in range(len(dmp_side.ROWS))]
    kjts = [
        KeyedJaggedTensor.from_lengths_sync(keys=keys, values=v, lengths=n)
        for v, n in map(dmp_side.batch, range(STEPS), [rank] * STEPS)
    ]
    saved = build(sharding)
    full = dict(zip([f"embedding_bags.t{i}.weight" for i in range(len(dmp_side.ROWS))], dmp_side.start_weights("ebc")))
    with torch.no_grad():
        for key, value in saved.state_dict().items():
            for piece, (r0, c0) in dmp_side._pieces(value):
                piece.copy_(full[key.removeprefix("module.")][r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]])
    for kjt in kjts[:-1]:
        step(saved, kjt)

    where = os.path.join(out_dir, "checkpoint")
    dcp.save({"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()}, checkpoint_id=where)
    from_disk = build(sharding)
    state = {"model": from_disk.state_dict(), "optim": from_disk.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=where)
    from_disk.load_state_dict(state["model"])
    from_disk.fused_optimizer.load_state_dict(state["optim"])

    in_memory = build(sharding)
    in_memory.load_state_dict(saved.state_dict())
    in_memory.fused_optimizer.load_state_dict(saved.fused_optimizer.state_dict())

    models = {"saved": saved, "dcp": from_disk, "state_dict": in_memory}
    record = {"restored_before": {}}
    for name in ("dcp", "state_dict"):
        with torch.no_grad():
            out = models[name](kjts[-1])
            record["restored_before"][name] = (out.wait() if hasattr(out, "wait") else out).values().clone()
    for name, model in models.items():
        record[name] = {"output": step(model, kjts[-1]), "state": snapshot(model)}
    torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    sharding, out_dir, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mp.spawn(worker, args=(sharding, out_dir, port), nprocs=WORLD)
