"""TorchRec's DistributedModelParallel on 2 gloo processes over the stand-in: one module
(``ebc``: EmbeddingBagCollection, ``ec``: EmbeddingCollection) and one sharding type, three
training steps (fused EXACT_SGD for sharded tables; torch SGD over DDP for data-parallel).

``python dmp_side.py ebc|ec SHARDING OUT_DIR PORT``: every rank starts its tables from ``start_weights()``,
trains on ``batch(step, rank)`` and saves ``OUT_DIR/rank{r}.pt``: its outputs and its pieces of
every table (``(row offset, column offset, values)``). ``tests/compat/test_dmp.py`` compares them
with an unsharded EmbeddingBagCollection trained on both ranks' batches.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD, LR, STEPS, B = 2, 0.1, 3, 2
ROWS, DIMS = [16, 12, 10], [8, 4, 8]
SEQUENCE_DIM = 8  # an EmbeddingCollection's tables share one dim here


def batch(step, rank):
    """``(values, lengths)`` of the KJT with keys f0, f1, f2 and batch B for this step and rank."""
    g = torch.Generator().manual_seed(100 * step + rank)
    lengths = torch.randint(0, 4, (len(ROWS) * B,), generator=g)
    values = torch.cat(
        [torch.randint(0, r, (int(n),), generator=g) for r, n in zip(torch.tensor(ROWS).repeat_interleave(B), lengths)]
    )
    return values, lengths


def dims(kind):
    return DIMS if kind == "ebc" else [SEQUENCE_DIM] * len(ROWS)


def start_weights(kind):
    g = torch.Generator().manual_seed(1)
    return [torch.rand(r, d, generator=g) * 2 - 1 for r, d in zip(ROWS, dims(kind))]


def tables(kind):
    from torchrec import EmbeddingBagConfig, EmbeddingConfig

    config = EmbeddingBagConfig if kind == "ebc" else EmbeddingConfig
    return [
        config(name=f"t{i}", embedding_dim=d, num_embeddings=r, feature_names=[f"f{i}"])
        for i, (r, d) in enumerate(zip(ROWS, dims(kind)))
    ]


def prefix(kind):
    return "embedding_bags" if kind == "ebc" else "embeddings"


def values_of(kind, out):
    """The lookup's output as one tensor: a KeyedTensor's values, or the sequences' rows key after key."""
    if kind == "ebc":
        return out.values()
    return torch.cat([out[f"f{i}"].values() for i in range(len(ROWS))])


def worker(rank, kind, sharding, out_dir, port):
    import embnum.fbgemm_compat

    embnum.fbgemm_compat.install()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    module_cls, sharder_cls = (
        (EmbeddingBagCollection, EmbeddingBagCollectionSharder)
        if kind == "ebc"
        else (EmbeddingCollection, EmbeddingCollectionSharder)
    )
    ebc = module_cls(tables=tables(kind), device=torch.device("meta"))
    sharder = sharder_cls(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    constraints = {t.name: ParameterConstraints(sharding_types=[sharding]) for t in tables(kind)}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=WORLD, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    full = dict(zip([f"{prefix(kind)}.t{i}.weight" for i in range(len(ROWS))], start_weights(kind)))
    with torch.no_grad():
        for key, value in model.state_dict().items():
            name = key.removeprefix("module.")
            for piece, (r0, c0) in _pieces(value):
                piece.copy_(full[name][r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]])
    dense = [p for n, p in model.named_parameters() if prefix(kind) in n and p.requires_grad]
    optimizer = torch.optim.SGD(dense, lr=LR) if dense else None
    outputs = []
    for step in range(STEPS):
        values, lengths = batch(step, rank)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in range(len(ROWS))], values=values, lengths=lengths
        )
        out = model(kjt)
        out = out.wait() if hasattr(out, "wait") else out
        flat = values_of(kind, out)
        outputs.append(flat.detach().clone())
        flat.sum().backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
    pieces = {
        key.removeprefix("module."): [(r0, c0, p.detach().clone()) for p, (r0, c0) in _pieces(value)]
        for key, value in model.state_dict().items()
    }
    torch.save({"outputs": outputs, "pieces": pieces}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _pieces(value):
    """``(tensor, (row offset, column offset))`` for each local piece of a state-dict entry."""
    if hasattr(value, "local_shards"):
        return [(s.tensor, tuple(s.metadata.shard_offsets)) for s in value.local_shards()]
    return [(value, (0, 0))]


if __name__ == "__main__":
    kind, sharding, out_dir, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mp.spawn(worker, args=(kind, sharding, out_dir, port), nprocs=WORLD)
