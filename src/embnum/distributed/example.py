"""A small DLRM-style model trained with a sharded embedding-bag collection on synthetic clicks.

    torchrun --nproc-per-node 2 -m embnum.distributed.example
    python -m embnum.distributed.example --world-size 2          # spawns 2 local gloo processes
    torchrun --nproc-per-node 2 -m embnum.distributed.example --backend nccl   # on GPUs

Model: dense features ``[B, 8]`` -> bottom MLP -> ``[B, 16]``; four sparse features looked up in
four tables (two row-wise, two table-wise; fused row-wise Adagrad) -> ``[B, 4 x 16]``; pairwise
dot products of the five vectors plus the dense vector -> top MLP -> a click logit. The dense
layers are replicated (their gradients all-reduced); the loss is the global batch's mean binary
cross-entropy, so every rank's step equals one step on the concatenated batch. Rank 0 shows a
progress bar and prints the loss of every step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import KeyedJaggedTensor, TBEOptimizer
from . import comm
from .embeddingbag import ShardedEmbeddingBagCollection
from .launch import spawn
from .plan import ROW_WISE, TABLE_WISE, ParameterSharding

DIM = 16
DENSE = 8


class Table:
    def __init__(self, name, num_embeddings, feature_names):
        self.name, self.num_embeddings, self.embedding_dim = name, num_embeddings, DIM
        self.feature_names, self.pooling = feature_names, "sum"


TABLES = [Table("user", 5000, ["user_id"]), Table("item", 3000, ["item_id"])]
TABLES += [Table("category", 50, ["category"]), Table("history", 2000, ["history"])]


def plan_for(world):
    return {
        "user": ParameterSharding(ROW_WISE),
        "item": ParameterSharding(ROW_WISE),
        "category": ParameterSharding(TABLE_WISE, (0,)),
        "history": ParameterSharding(TABLE_WISE, (world - 1,)),
    }


def synthetic_batch(step, rank, batch_size, device):
    """Clicks that depend on the ids (a hidden score per user/item/category) and the dense features."""
    g = np.random.default_rng([step, rank])
    B = batch_size
    user, item, cat = g.integers(0, 5000, B), g.integers(0, 3000, B), g.integers(0, 50, B)
    hist_len = g.integers(0, 6, B)
    hist = g.integers(0, 2000, int(hist_len.sum()))
    dense = g.standard_normal((B, DENSE)).astype(np.float32)
    score = np.sin(user * 0.37) + np.cos(item * 0.11) + (cat % 7 - 3) * 0.3 + dense[:, 0]
    label = (score + 0.3 * g.standard_normal(B) > 0).astype(np.float32)
    lengths = np.concatenate([np.ones(3 * B, np.int64), hist_len])
    values = np.concatenate([user, item, cat, hist])
    kjt = KeyedJaggedTensor(
        keys=["user_id", "item_id", "category", "history"],
        values=torch.from_numpy(values).to(device),
        lengths=torch.from_numpy(lengths).to(device),
    )
    return torch.from_numpy(dense).to(device), kjt, torch.from_numpy(label).to(device)


class DLRM(torch.nn.Module):
    def __init__(self, world, group=None, qcomm=None):
        super().__init__()
        torch.manual_seed(0)  # identical dense layers on every rank
        self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE, 32), torch.nn.ReLU(), torch.nn.Linear(32, DIM))
        n = len(TABLES) + 1
        self.top = torch.nn.Sequential(
            torch.nn.Linear(DIM + n * (n - 1) // 2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )
        self.sparse = ShardedEmbeddingBagCollection(
            TABLES, plan_for(world), group, TBEOptimizer("rowwise_adagrad", learning_rate=0.05), qcomm
        )

    def forward(self, dense, kjt):
        x = self.bottom(dense)
        emb = self.sparse(kjt).values().reshape(dense.shape[0], len(TABLES), DIM)
        vecs = torch.cat([x[:, None, :], emb], dim=1)
        dots = torch.bmm(vecs, vecs.transpose(1, 2))
        i, j = torch.triu_indices(vecs.shape[1], vecs.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def _bar(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is not a dependency: a plain counter instead
        return None
    return tqdm(total=total, desc="training", file=sys.stderr)


def train(rank, world, steps=20, batch_size=256, qcomm=None, device="cpu", log=print):
    """``steps`` steps on this rank (inside an initialised process group); returns the losses."""
    model = DLRM(world, qcomm=qcomm).to(device)
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt = torch.optim.Adagrad(dense_params, lr=0.05)
    bar = _bar(steps, rank == 0)
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        dense, kjt, label = synthetic_batch(step, rank, batch_size, device)
        logits = model(dense, kjt)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label, reduction="sum")
        (loss / (batch_size * world)).backward()  # the global batch's mean: gradients sum over ranks
        comm.all_reduce_gradients(dense_params)
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / (batch_size * world))
        if rank == 0:
            line = f"step {step + 1:4d}/{steps}  loss {losses[-1]:.4f}"
            if bar is not None:
                bar.update(1)
                bar.write(line)
            else:
                log(f"[{'#' * (20 * (step + 1) // steps):<20}] {line}")
    if bar is not None:
        bar.close()
    if rank == 0:
        log(
            f"{steps} steps on {world} ranks in {time.perf_counter() - t0:.1f}s; "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        )
    return losses


def _spawned(rank, world, steps, batch_size, qcomm):
    return train(rank, world, steps, batch_size, qcomm)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=None, help="spawn this many local processes (no torchrun)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--qcomm", default=None, help="codec of the pooled collectives: fp16, bf16, fp8 or int8")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout in seconds")
    a = p.parse_args(argv)
    qcomm = comm.QCommsConfig(a.qcomm, a.qcomm) if a.qcomm else None
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        device = "cpu"
        if a.backend == "nccl":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
            torch.cuda.set_device(device)
        import datetime

        dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=a.timeout))
        try:
            train(rank, world, a.steps, a.batch_size, qcomm, device)
        finally:
            dist.destroy_process_group()
        return 0
    if a.backend != "gloo":
        p.error("--backend nccl needs torchrun (one process per GPU)")
    world = a.world_size or 2
    spawn(_spawned, world, args=(a.steps, a.batch_size, qcomm), timeout_s=a.timeout, threads=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
