"""Sharded embedding-bag collection on local gloo processes: step time, its parts, bytes moved.

    python benchmarks/bench_distributed.py [--worlds 1 2 4] [--steps 8] [--batch 2048] [--no-torchrec]

For each world size W, W local processes (one thread each) train the same tables under the
same plan on the same global batch (split evenly over the ranks): forward phases (input
distribution, lookups, output distribution), backward (collectives plus fused SGD) and the
whole step; medians and quartiles over the timed steps, on rank 0. Bytes: what each
collective sends from rank 0 in one step, without a codec and with fp16 / int8 on the pooled
collectives. Peer: TorchRec's ``DistributedModelParallel`` (fused SGD through
``apply_optimizer_in_backward``, fbgemm_gpu's CPU TBE) on the same tables, plan, initial
weights and batches, when torchrec imports; its first forward is compared with embnum's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from _bench import machine, table  # noqa: E402

ROWS, DIM, LOOKUPS, LR = 20_000, 64, 10, 0.01
KINDS = ["row_wise", "row_wise", "table_wise", "table_wise", "table_wise", "table_wise", "column_wise", "data_parallel"]


def _tables():
    from embnum.modules import EmbeddingBagConfig

    return [EmbeddingBagConfig(ROWS, DIM, f"t{i}", feature_names=[f"f{i}"]) for i in range(len(KINDS))]


def _plan(W):
    from embnum.distributed import ParameterSharding

    out = {}
    for i, kind in enumerate(KINDS):
        ranks = None
        if kind == "table_wise":
            ranks = (i % W,)
        elif kind == "column_wise":
            ranks = tuple(range(W)) if W > 1 else (0,)
        out[f"t{i}"] = ParameterSharding(kind, ranks)
    return out


def _batch(step, rank, B):
    """Rank ``rank``'s ``B`` samples: Poisson(LOOKUPS) ids per feature, uniform over the rows."""
    g = np.random.default_rng([step, rank])
    T = len(KINDS)
    lengths = g.poisson(LOOKUPS, T * B).astype(np.int64)
    values = g.integers(0, ROWS, int(lengths.sum())).astype(np.int64)
    return [f"f{i}" for i in range(T)], torch.from_numpy(lengths), torch.from_numpy(values)


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0] * 1e3, statistics.median(xs) * 1e3, q[2] * 1e3


def _time_steps(model, forward, rank, W, B, steps, parts=True):
    from embnum.distributed import comm

    D = len(KINDS) * DIM
    G = torch.from_numpy(np.random.default_rng(9).standard_normal((B, D)).astype(np.float32))
    rec = {k: [] for k in ("step", "forward", "backward", "input_dist", "lookup", "output_dist", "bwd_comm")}
    for s in range(steps + 2):
        kjt = _batch(s, rank, B)
        if parts:
            model.timings = {}
        comm.SECONDS.clear()
        t0 = time.perf_counter()
        out = forward(kjt)
        t1 = time.perf_counter()
        (out * G).sum().backward()
        t2 = time.perf_counter()
        if s < 2:
            continue
        rec["step"].append(t2 - t0)
        rec["forward"].append(t1 - t0)
        rec["backward"].append(t2 - t1)
        if parts:
            for k in ("input_dist", "lookup", "output_dist"):
                rec[k].append(model.timings.get(k, 0.0))
            rec["bwd_comm"].append(sum(v for k, v in comm.SECONDS.items() if k.endswith("backward") or "grad" in k))
    return {k: _quartiles(v) for k, v in rec.items() if v}


def worker(rank, W, Bglob, steps, with_torchrec):
    import embnum
    from embnum.distributed import QCommsConfig, ShardedEmbeddingBagCollection, comm

    torch.manual_seed(0)
    B = Bglob // W
    tables, plan = _tables(), _plan(W)
    opt = embnum.TBEOptimizer("sgd", learning_rate=LR)
    result = {}
    model = ShardedEmbeddingBagCollection(tables, plan, optimizer=opt)
    init = model.state_dict(gather=True)

    def fwd(kjt, m=model):
        keys, lengths, values = kjt
        return m(embnum.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)).values()

    result["embnum"] = _time_steps(model, fwd, rank, W, B, steps)
    first_embnum = None
    probe = ShardedEmbeddingBagCollection(tables, plan, optimizer=opt)
    probe.load_state_dict(init)
    with torch.no_grad():
        first_embnum = fwd(_batch(0, rank, B), probe)
    result["bytes"] = {}
    for name in (None, "fp16", "int8"):
        m = ShardedEmbeddingBagCollection(tables, plan, optimizer=opt, qcomm=QCommsConfig(name, name))
        comm.BYTES.clear()
        out = fwd(_batch(0, rank, B), m)
        (out * 1.0).sum().backward()
        result["bytes"][name or "none"] = dict(comm.BYTES)
        if name:
            result[f"embnum qcomm {name}"] = _time_steps(m, lambda k, m=m: fwd(k, m), rank, W, B, steps, parts=False)
    if with_torchrec:
        try:
            result["torchrec"], diff = _torchrec(rank, W, B, steps, tables, init, first_embnum)
            result["torchrec_diff"] = diff
        except Exception as e:  # noqa: BLE001 - reported in the table
            result["torchrec_error"] = f"{type(e).__name__}: {e}"[:300]
    return result


def _copy_into_dmp(model, init):
    """Write the whole initial tables into DMP's local shards (its state dict views the TBE weights:
    the sharded module does not take the unsharded module's values)."""
    with torch.no_grad():
        for key, v in model.state_dict().items():
            if not key.endswith(".weight"):
                continue
            whole = init["embedding_bags." + key.split("embedding_bags.")[-1]]
            if hasattr(v, "local_shards"):
                for sh in v.local_shards():
                    (r0, c0), (r, c) = sh.metadata.shard_offsets, sh.metadata.shard_sizes
                    sh.tensor.copy_(whole[r0 : r0 + r, c0 : c0 + c])
            else:
                v.copy_(whole)


def _torchrec(rank, W, B, steps, tables, init, first_embnum):
    """TorchRec's DMP on the same tables, plan, initial weights and batches (fused SGD)."""
    import torch.distributed as dist
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    cfgs = [
        torchrec.EmbeddingBagConfig(name=t.name, embedding_dim=DIM, num_embeddings=ROWS, feature_names=t.feature_names)
        for t in tables
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=cfgs, device=torch.device("cpu"))
    with torch.no_grad():
        for t in tables:
            ebc.embedding_bags[t.name].weight.copy_(init[f"embedding_bags.{t.name}.weight"])
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": LR})
    per = {}
    for i, kind in enumerate(KINDS):
        if kind == "table_wise":
            per[f"t{i}"] = table_wise(rank=i % W)
        elif kind == "row_wise":
            per[f"t{i}"] = row_wise()
        elif kind == "column_wise":
            per[f"t{i}"] = column_wise(ranks=list(range(W)) if W > 1 else [0])
        else:
            per[f"t{i}"] = data_parallel()
    mplan = construct_module_sharding_plan(ebc, per_param_sharding=per, local_size=W, world_size=W, device_type="cpu")
    plan = ShardingPlan({"": mplan})
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, init_data_parallel=True)
    _copy_into_dmp(model, init)

    def fwd(kjt, ordered=False):
        keys, lengths, values = kjt
        out = model(torchrec.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
        out = out.wait() if hasattr(out, "wait") else out
        if ordered:  # DMP's KeyedTensor keys follow its sharding, not the EBC's order
            d = out.to_dict()
            return torch.cat([d[t.feature_names[0]] for t in tables], dim=1)
        return out.values()

    with torch.no_grad():
        first = fwd(_batch(0, rank, B), ordered=True)
    diff = float((first - first_embnum).abs().max()) if first.shape == first_embnum.shape else float("nan")
    dist.barrier()
    return _time_steps(None, fwd, rank, W, B, steps, parts=False), diff


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2048, help="global batch")
    ap.add_argument("--no-torchrec", action="store_true")
    a = ap.parse_args()
    from embnum.distributed import spawn

    try:
        import torchrec  # noqa: F401

        with_torchrec = not a.no_torchrec
    except Exception:  # noqa: BLE001
        with_torchrec = False
    print(machine())
    print(
        f"- {len(KINDS)} tables x {ROWS} rows x dim {DIM} ({', '.join(KINDS)}), global batch {a.batch}, "
        f"Poisson({LOOKUPS}) ids per bag, fused SGD; one thread per process; {a.steps} timed steps"
    )
    print(f"- load average before: {os.getloadavg()}")
    rows, byte_rows = [], []
    for W in a.worlds:
        res = spawn(worker, W, args=(a.batch, a.steps, with_torchrec), timeout_s=300, deadline_s=1800)[0]
        for impl in [k for k in res if k.startswith("embnum") or k == "torchrec"]:
            r = {"W": W, "implementation": impl}
            for part, (q1, med, q3) in res[impl].items():
                r[part] = f"{med:.1f} ({q1:.1f}-{q3:.1f})"
            if impl == "torchrec":
                r["implementation"] = f"torchrec DMP (max diff {res['torchrec_diff']:.1e})"
            rows.append(r)
        if "torchrec_error" in res:
            rows.append({"W": W, "implementation": f"torchrec DMP failed: {res['torchrec_error']}"})
        for codec, counts in res["bytes"].items():
            byte_rows.append({"W": W, "codec": codec, **{k: f"{v:,}" for k, v in sorted(counts.items())}})
    print(f"- load average after: {os.getloadavg()}")
    cols = ["W", "implementation", "step", "forward", "input_dist", "lookup", "output_dist", "backward", "bwd_comm"]
    print("\nms per step on rank 0, median (quartiles)\n")
    print(table(rows, cols))
    names = sorted({k for r in byte_rows for k in r} - {"W", "codec"})
    print("\nbytes sent by rank 0 in one training step, per collective\n")
    print(table(byte_rows, ["W", "codec"] + names))


if __name__ == "__main__":
    main()
