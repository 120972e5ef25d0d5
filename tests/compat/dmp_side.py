"""TorchRec's DistributedModelParallel on 2 gloo processes over the stand-in: one module
(``ebc``: EmbeddingBagCollection, ``ec``: EmbeddingCollection, ``pipeline``: the
EmbeddingBagCollection trained through TorchRec's ``TrainPipelineSparseDist``, ``vbe``: the
EmbeddingBagCollection on variable-batch KJTs, ``make_kjt``) and one sharding
type, three training steps (fused EXACT_SGD for sharded tables; torch SGD over DDP for
data-parallel). Row-wise and table-row-wise come from an explicit plan (``explicit_plan``).

``python dmp_side.py ebc|ec|pipeline|vbe SHARDING OUT_DIR PORT``: every rank starts its tables from ``start_weights()``,
trains on ``make_kjt(kind, step, rank)`` and saves ``OUT_DIR/rank{r}.pt``: its outputs and its pieces of
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


def vbe_batch(step, rank):
    """``(values, lengths, strides, inverse)`` of a variable-batch KJT (keys f0, f1, f2): key i holds
    ``strides[i]`` distinct samples, and the batch's B samples map to them by ``inverse[i]``."""
    g = torch.Generator().manual_seed(1000 + 100 * step + rank)
    strides = [int(s) for s in torch.randint(1, B + 2, (len(ROWS),), generator=g)]
    lengths = torch.cat([torch.randint(0, 4, (s,), generator=g) for s in strides])
    rows = torch.tensor(ROWS).repeat_interleave(torch.tensor(strides))
    values = torch.cat([torch.randint(0, r, (int(n),), generator=g) for r, n in zip(rows, lengths)])
    inverse = torch.stack([torch.randint(0, s, (B,), generator=g) for s in strides])
    return values, lengths, strides, inverse


def make_kjt(kind, step, rank):
    """The KJT of ``step`` and ``rank``: ``batch``, or for ``vbe`` a variable batch per feature
    (``stride_per_key_per_rank`` with ``inverse_indices``, TorchRec's VBE input)."""
    from torchrec import KeyedJaggedTensor

    keys = [f"f{i}" for i in range(len(ROWS))]
    if kind != "vbe":
        values, lengths = batch(step, rank)
        return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    values, lengths, strides, inverse = vbe_batch(step, rank)
    return KeyedJaggedTensor(
        keys=keys,
        values=values,
        lengths=lengths,
        stride_per_key_per_rank=[[s] for s in strides],
        inverse_indices=(keys, inverse),
    )


def module_kind(kind):
    """The module a run kind trains: ``ec`` the EmbeddingCollection, every other kind the
    EmbeddingBagCollection (``pipeline`` and ``vbe`` differ only in how it is fed)."""
    return "ec" if kind == "ec" else "ebc"


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


class _WithLoss(torch.nn.Module):
    """The pipeline's model contract: ``forward(batch) -> (loss, output)``."""

    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc

    def forward(self, batch):
        out = self.ebc(batch.kjt).values()
        return out.sum(), out.detach()


def in_group(rank, port, body, *args):
    """Run ``body(rank, *args)`` on the stand-in, in a gloo group of WORLD ranks, and close the group
    after it. Closing also drops the intra- and cross-node groups TorchRec keeps in module globals
    for table-row-wise sharding (as TorchRec's own test runner does) and collects the modules that
    used them: left to interpreter shutdown, their destruction aborts the process in Gloo
    ("terminate called without an active exception") in about one run in ten, after the results
    were saved."""
    import gc

    import embnum.fbgemm_compat

    embnum.fbgemm_compat.install()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        body(rank, *args)
    finally:
        import torchrec.distributed.comm as comm

        dist.destroy_process_group()
        comm._INTRA_PG = comm._CROSS_PG = comm._INTRA_PG_2D = comm._CROSS_PG_2D = None
        gc.collect()


def worker(rank, kind, sharding, out_dir, port):
    in_group(rank, port, train, kind, sharding, out_dir)


def train(rank, kind, sharding, out_dir):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.streamable import Pipelineable

    class Batch(Pipelineable):
        """What TorchRec's pipeline moves between devices: one KJT."""

        def __init__(self, kjt):
            self.kjt = kjt

        def to(self, device, non_blocking=False):
            return Batch(self.kjt.to(device, non_blocking=non_blocking))

        def record_stream(self, stream):
            self.kjt.record_stream(stream)

        def pin_memory(self):
            return self

    kjts = [make_kjt(kind, step, rank) for step in range(STEPS)]
    pipelined, kind = kind == "pipeline", module_kind(kind)

    module_cls, sharder_cls = (
        (EmbeddingBagCollection, EmbeddingBagCollectionSharder)
        if kind == "ebc"
        else (EmbeddingCollection, EmbeddingCollectionSharder)
    )
    ebc = module_cls(tables=tables(kind), device=torch.device("meta"))
    sharder = sharder_cls(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    root = _WithLoss(ebc) if pipelined else ebc
    if sharding in EXPLICIT:  # TorchRec's planner offers neither for a CPU topology: an explicit plan
        plan = explicit_plan(ebc, sharder, sharding)
    else:
        constraints = {t.name: ParameterConstraints(sharding_types=[sharding]) for t in tables(kind)}
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=WORLD, compute_device="cpu"), constraints=constraints
        )
        plan = planner.collective_plan(root, [sharder], dist.GroupMember.WORLD)
    model = DistributedModelParallel(root, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    full = dict(zip([f"{prefix(kind)}.t{i}.weight" for i in range(len(ROWS))], start_weights(kind)))
    with torch.no_grad():
        for key, value in model.state_dict().items():
            name = key.removeprefix("module.").removeprefix("ebc.")
            for piece, (r0, c0) in _pieces(value):
                piece.copy_(full[name][r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]])
    dense = [p for n, p in model.named_parameters() if prefix(kind) in n and p.requires_grad]
    optimizer = torch.optim.SGD(dense, lr=LR) if dense else None
    if pipelined:  # the pipeline runs backward and the (dense) optimizer step itself
        pipeline = TrainPipelineSparseDist(
            model, optimizer or torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR), torch.device("cpu")
        )
        batches = iter([Batch(k) for k in kjts])
        outputs = [pipeline.progress(batches).clone() for _ in range(STEPS)]  # progress returns the output
        kjts = []
    else:
        outputs = []
    for kjt in kjts:
        out = model(kjt)
        out = out.wait() if hasattr(out, "wait") else out
        flat = values_of(kind, out)
        outputs.append(flat.detach().clone())
        flat.sum().backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
    pieces = {
        key.removeprefix("module.").removeprefix("ebc."): [
            (r0, c0, p.detach().clone()) for p, (r0, c0) in _pieces(value)
        ]
        for key, value in model.state_dict().items()
    }
    kinds = sorted({ps.sharding_type for module_plan in model.plan.plan.values() for ps in module_plan.values()})
    torch.save({"outputs": outputs, "pieces": pieces, "sharding_types": kinds}, os.path.join(out_dir, f"rank{rank}.pt"))


EXPLICIT = ("row_wise", "table_row_wise")


def explicit_plan(module, sharder, sharding):
    """A ShardingPlan putting every table of ``module`` (the root) ``row_wise`` or ``table_row_wise``
    (on host 0: both ranks are one host's local ranks)."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_row_wise
    from torchrec.distributed.types import ShardingPlan

    generator = row_wise() if sharding == "row_wise" else table_row_wise(host_index=0)
    per_table = {f"t{i}": generator for i in range(len(ROWS))}
    module_plan = construct_module_sharding_plan(
        module, per_table, sharder=sharder, local_size=WORLD, world_size=WORLD, device_type="cpu"
    )
    for parameter_sharding in module_plan.values():  # fused, as the planner picks for the other types
        parameter_sharding.compute_kernel = EmbeddingComputeKernel.FUSED.value
    return ShardingPlan({"": module_plan})


def _pieces(value):
    """``(tensor, (row offset, column offset))`` for each local piece of a state-dict entry."""
    if hasattr(value, "local_shards"):
        return [(s.tensor, tuple(s.metadata.shard_offsets)) for s in value.local_shards()]
    return [(value, (0, 0))]


if __name__ == "__main__":
    kind, sharding, out_dir, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mp.spawn(worker, args=(kind, sharding, out_dir, port), nprocs=WORLD)
