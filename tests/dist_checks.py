"""Multi-process checks of ``embnum.distributed`` on gloo (run by tests/test_distributed.py).

``python tests/dist_checks.py WORLD CKPT_DIR`` spawns WORLD local processes
(collective timeout 30 s). Every rank builds the same inputs from seeds, so
each can run the unsharded reference (one single-process collection on the
concatenated global batch) itself and compare its own rows. Phases:

1. collectives: all_to_all (variable splits), reduce_scatter, all_reduce
   with their gradients, and every codec within its stated error bound;
2. every sharding type and a mixed plan: 3 training steps with uneven batch
   sizes (one rank empty in one step), forward output and, at the end, the
   weights and optimizer state equal to the reference (exact for table-,
   column-wise and data-parallel, float rounding for the row-wise types);
3. checkpoints (row-wise Adagrad: a per-row state): WORLD=2 trains 2 steps and saves its shards under CKPT_DIR
   (``torch.save`` of ``state_dict(gather=False)`` and :func:`checkpoint.save`); WORLD=3 loads them
   (``torch.load(weights_only=True)``) under another plan, trains 2 more steps, compares with 4
   unsharded steps; then damages copies of the checkpoint (a truncated file, a flipped bit inside a
   table piece, a missing file): each is an error naming the file and its tables, and
   ``strict=False`` reports exactly the rows it could not restore;
4. gradient division: ``gradient_division=True`` against the unsharded run with the output
   gradient divided by WORLD, the default against the plain one (SGD, table-wise, replicated,
   row-wise).

Faults (ranks that disagree, bad batches, dead or stuck ranks) are in tests/dist_faults.py.
"""

import os
import shutil
import sys
import time
import warnings

import numpy as np
import torch

import embnum
import embnum.distributed as dist
from embnum import torch_bridge as tb
from embnum.distributed import (
    QCommsConfig,
    ShardedEmbeddingBagCollection,
    SpawnError,
    checkpoint,
    comm,
    merge_state_dicts,
    spawn,
)
from embnum.modules import EmbeddingBagCollection, EmbeddingBagConfig


def Config(name, rows, dim, features, pooling="sum"):
    return EmbeddingBagConfig(
        num_embeddings=rows, embedding_dim=dim, name=name, feature_names=features, pooling=pooling
    )


TABLES = [
    Config("t0", 40, 8, ["f0"]),
    Config("t1", 7, 6, ["f1", "f2"]),
    Config("t2", 50, 5, ["f3"], "mean"),
    Config("t3", 3, 4, ["f4"]),
    Config("t4", 30, 12, ["f5"]),
    Config("t5", 2, 3, ["f6"]),  # fewer rows than ranks at 3: an empty row block
]
SUM_TABLES = [Config(t.name, t.num_embeddings, t.embedding_dim, t.feature_names) for t in TABLES]  # weighted KJTs
FEATURES = [f for t in TABLES for f in t.feature_names]
ROWS = {f: t.num_embeddings for t in TABLES for f in t.feature_names}
SIZES = [[3, 5, 2], [0, 4, 1], [2, 1, 0], [4, 0, 3]]  # local batch per step and rank


def plans(W):
    every = tuple(range(W))
    groups = [(0, 1), (1, 2)] if W == 3 else [every]
    pick = {
        dist.TABLE_WISE: lambda i, t: dist.ParameterSharding(dist.TABLE_WISE, (i % W,)),
        dist.ROW_WISE: lambda i, t: dist.ParameterSharding(dist.ROW_WISE),
        dist.COLUMN_WISE: lambda i, t: dist.ParameterSharding(dist.COLUMN_WISE, tuple((i + k) % W for k in range(W))),
        dist.TABLE_ROW_WISE: lambda i, t: dist.ParameterSharding(dist.TABLE_ROW_WISE, groups[i % len(groups)]),
        dist.DATA_PARALLEL: lambda i, t: dist.ParameterSharding(dist.DATA_PARALLEL),
    }
    out = {kind: {t.name: f(i, t) for i, t in enumerate(TABLES)} for kind, f in pick.items()}
    kinds = [dist.ROW_WISE, dist.TABLE_WISE, dist.COLUMN_WISE, dist.DATA_PARALLEL, dist.TABLE_ROW_WISE, dist.TABLE_WISE]
    out["mixed"] = {t.name: pick[k](i, t) for i, (t, k) in enumerate(zip(TABLES, kinds))}
    return out


def batch(step, rank, W, weighted=False):
    """``(keys, lengths, values, weights)`` of ``rank``'s batch at ``step`` (keys shuffled, one extra)."""
    B = SIZES[step % len(SIZES)][rank]
    g = np.random.default_rng([step, rank, 7])
    keys = list(FEATURES) + ["unused"]
    g.shuffle(keys)
    lengths = g.integers(0, 4, (len(keys), B))
    values = [g.integers(0, ROWS.get(k, 5), int(lengths[i].sum())) for i, k in enumerate(keys)]
    vals = np.concatenate(values) if values else np.zeros(0, np.int64)
    w = g.uniform(0.5, 1.5, vals.shape[0]).astype(np.float32) if weighted else None
    return keys, lengths, vals, w


def kjt(keys, lengths, values, weights):
    return embnum.KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(values).to(torch.int64),
        lengths=torch.from_numpy(lengths.reshape(-1)).to(torch.int64),
        weights=None if weights is None else torch.from_numpy(weights),
    )


def global_batch(step, W, weighted=False):
    """The ranks' batches joined per key in rank order (features only, in FEATURES order)."""
    parts = [batch(step, r, W, weighted) for r in range(W)]
    lengths, values, weights = [], [], []
    for f in FEATURES:
        for keys, L, V, Wt in parts:
            i = keys.index(f)
            off = np.concatenate([[0], np.cumsum(L.sum(1))])
            lengths.append(L[i])
            values.append(V[off[i] : off[i + 1]])
            if Wt is not None:
                weights.append(Wt[off[i] : off[i + 1]])
    return (
        np.concatenate(lengths).reshape(len(FEATURES), -1),
        np.concatenate(values),
        np.concatenate(weights) if weighted else None,
    )


def reference(model, optimizer, tables=TABLES, weighted=False):
    """The unsharded collection, started from ``model``'s gathered state (a collective)."""
    ref = EmbeddingBagCollection(tables, is_weighted=weighted, optimizer=optimizer)
    ref.load_state_dict(model.state_dict(gather=True))
    return ref


def ref_forward(ref, step, W, weighted=False):
    L, V, Wt = global_batch(step, W, weighted)
    return ref(kjt(FEATURES, L, V, Wt)).values()


def _grad_weights(step, Bg, D):
    return torch.from_numpy(np.random.default_rng([step, 99]).standard_normal((Bg, D)).astype(np.float32))


def train(model, ref, W, rank, steps, exact, label, weighted=False, first=0, ref_divisor=1):
    """``steps`` training steps of the sharded ``model`` and (when given) the reference, compared;
    the reference's output gradient is divided by ``ref_divisor``. Weighted: the per-id weights'
    gradient too (this rank's part of the reference's, in the local KJT's order)."""
    for step in range(first, first + steps):
        keys, L, V, Wt = batch(step, rank, W, weighted)
        features = kjt(keys, L, V, Wt)
        if weighted:
            features.weights().requires_grad_()
        out = model(features).values()
        Bs = [SIZES[step % len(SIZES)][r] for r in range(W)]
        o0 = sum(Bs[:rank])
        G = _grad_weights(step, sum(Bs), out.shape[1])
        if ref is not None:
            gL, gV, gW = global_batch(step, W, weighted)
            ref_features = kjt(FEATURES, gL, gV, gW)
            if weighted:
                ref_features.weights().requires_grad_()
            want = ref(ref_features).values()
            (want * (G / ref_divisor if ref_divisor != 1 else G)).sum().backward()
            same(out, want[o0 : o0 + Bs[rank]].detach(), exact, f"{label} step {step} forward, rank {rank}")
        (out * G[o0 : o0 + Bs[rank]]).sum().backward()
        if weighted and ref is not None:
            wanted = _local_part(ref_features.weights().grad, step, W, rank, keys, L)
            same(features.weights().grad, wanted, False, f"{label} step {step} per-id weights' gradient, rank {rank}")


def _local_part(global_grad, step, W, rank, keys, L):
    """This rank's entries of a per-value tensor of the global batch (FEATURES order, ranks joined
    per key), in the order of its local KJT (``keys``, lengths ``L``); zeros for unused keys."""
    counts = [[int(batch(step, r, W)[1][batch(step, r, W)[0].index(f)].sum()) for r in range(W)] for f in FEATURES]
    start, where = 0, {}
    for f, per_rank in zip(FEATURES, counts):
        where[f] = start + sum(per_rank[:rank])
        start += sum(per_rank)
    parts = []
    for i, k in enumerate(keys):
        n = int(L[i].sum())
        parts.append(global_grad[where[k] : where[k] + n] if k in where else torch.zeros(n))
    return torch.cat(parts) if parts else torch.zeros(0)


def same(got, want, exact, what):
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    ok = torch.equal(got, want) if exact else torch.allclose(got, want, rtol=2e-5, atol=1e-6)
    if not ok:
        err = (got - want).abs().max()
        raise AssertionError(f"{what}: {'not equal' if exact else 'not close'} (max error {float(err):.3g})")


def compare_state(model, ref, exact, label):
    got = model.state_dict(gather=True)
    want = ref.state_dict()
    if set(got) != set(want):
        raise AssertionError(f"{label}: state keys {sorted(set(got) ^ set(want))} differ from the EBC's")
    for key, w in want.items():
        same(got[key].view(w.shape), w, exact or key.endswith(".step"), f"{label} {key} after training")


def check_collectives(rank, W):
    g = torch.Generator().manual_seed(rank)
    # all_to_all with variable splits and its gradient
    send = [rank + d + 1 for d in range(W)]
    recv = [s + rank + 1 for s in range(W)]
    C = 3
    x = torch.randn(sum(send), C, generator=g, requires_grad=True)
    y = comm.all_to_all(x, send, recv, [C] * W)
    if y.numel() != sum(recv) * C:
        raise AssertionError("all_to_all: wrong size")
    (y * (torch.arange(y.numel()) % 5)).sum().backward()
    # the gradient of x's row block sent to d is the weight d applied: recompute it there
    back = comm.all_to_all((torch.arange(y.numel()) % 5).float().reshape(-1, C), recv, send, [C] * W)
    same(x.grad.reshape(-1), back, True, "all_to_all backward")
    # reduce_scatter and its gradient (an all-gather)
    splits = [2 + r for r in range(W)]
    z = torch.full((sum(splits), C), float(rank + 1), requires_grad=True)
    rs = comm.reduce_scatter(z, splits)
    same(rs, torch.full((splits[rank], C), float(W * (W + 1) // 2)), True, "reduce_scatter")
    rs.sum().backward()
    same(z.grad, torch.ones_like(z), True, "reduce_scatter backward")
    # all_reduce and its gradient
    a = torch.tensor([float(rank + 1)], requires_grad=True)
    s = comm.all_reduce(a * 2)
    same(s, torch.tensor([float(W * (W + 1))]), True, "all_reduce")
    s.sum().backward()
    same(a.grad, torch.tensor([2.0 * W]), True, "all_reduce backward")
    # codecs around the pooled all-to-all, forward and backward, within their stated bounds
    scale = 10.0 ** (torch.rand(W * 4, 1, generator=g) * 4 - 3)
    rows = torch.randn(W * 4, 8, generator=g) * scale
    plain = comm.all_to_all(rows, [4] * W, [4] * W, [8] * W).reshape(-1, 8)
    for name in ("fp16", "bf16", "fp8", "int8"):
        q = QCommsConfig(forward=name, backward=name)
        fwd = comm.codec_of(name)
        r = rows.clone().requires_grad_(True)
        got = comm.all_to_all(r, [4] * W, [4] * W, [8] * W, qcomm=q).reshape(-1, 8)
        if not bool(((got.double() - plain.double()).abs() <= fwd.error_bound(plain)).all()):
            raise AssertionError(f"{name}: pooled all_to_all beyond the codec's stated error")
        got.backward(plain)  # the gradient goes back through the backward codec
        back = comm.all_to_all(plain, [4] * W, [4] * W, [8] * W).reshape(-1, 8)
        if not bool(((r.grad.double() - back.double()).abs() <= fwd.error_bound(back)).all()):
            raise AssertionError(f"{name}: backward all_to_all beyond the codec's stated error")
        z = rows.clone()
        got = comm.reduce_scatter(z, [4] * W, qcomm=q)
        exact = comm.reduce_scatter(rows, [4] * W)
        bound = sum(fwd.error_bound(p) for p in comm.exchange_blocks(list(rows.split(4)), [(4, 8)] * W))
        if not bool(((got.double() - exact.double()).abs() <= bound + 1e-6 * exact.abs().double()).all()):
            raise AssertionError(f"{name}: reduce_scatter beyond the codecs' summed error")


def check_sharded(rank, W, optimizer):
    for label, plan in plans(W).items():
        exact = label in (dist.TABLE_WISE, dist.COLUMN_WISE, dist.DATA_PARALLEL)
        weighted = label == "mixed"  # per-id weights need sum pooling
        tables = SUM_TABLES if weighted else TABLES
        model = ShardedEmbeddingBagCollection(tables, plan, optimizer=optimizer, is_weighted=weighted)
        ref = reference(model, optimizer, tables, weighted)
        train(model, ref, W, rank, 3, exact, label, weighted)
        compare_state(model, ref, exact, label)
    check_gradient_division(rank, W)
    # codecs inside the module: column-wise, every output element crosses the codec once, so the
    # codec's stated bound holds per element
    plan = plans(W)[dist.COLUMN_WISE]
    plain = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer)
    want = plain(kjt(*batch(0, rank, W))).values()
    for name in ("fp16", "bf16", "fp8", "int8"):
        q = QCommsConfig(forward=name, backward=name)
        model = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer, qcomm=q)
        got = model(kjt(*batch(0, rank, W))).values()
        codec = comm.codec_of(name)
        if name == "int8":  # one scale per row of a rank's block: bound from the block's row range
            bound = (want.max(dim=1, keepdim=True).values - want.min(dim=1, keepdim=True).values).abs() / 255 * 2
            bound = bound + 1e-7
        else:
            bound = codec.error_bound(want)
        if not bool(((got.double() - want.double()).abs() <= bound.double()).all()):
            raise AssertionError(f"qcomm {name}: forward beyond the codec's stated error")
        got.sum().backward()


def check_gradient_division(rank, W):
    """gradient_division=True (TorchRec's convention) equals the unsharded run whose output gradient
    is divided by the world size; the default equals the one with the plain gradient (the loop above).
    SGD: Adagrad's and Adam's first steps barely depend on the gradient's scale."""
    sgd = embnum.TBEOptimizer("sgd", learning_rate=0.5)
    for label in (dist.TABLE_WISE, dist.DATA_PARALLEL, dist.ROW_WISE):
        exact = label != dist.ROW_WISE
        divided = ShardedEmbeddingBagCollection(TABLES, plans(W)[label], optimizer=sgd, gradient_division=True)
        summed = ShardedEmbeddingBagCollection(TABLES, plans(W)[label], optimizer=sgd)
        ref_div, ref_sum = reference(divided, sgd), reference(summed, sgd)
        train(divided, ref_div, W, rank, 2, exact, f"{label} divided", ref_divisor=W)
        compare_state(divided, ref_div, exact, f"{label} gradient_division=True")
        train(summed, ref_sum, W, rank, 2, exact, f"{label} summed")
        compare_state(summed, ref_sum, exact, f"{label} gradient_division=False")
        a, b = divided.state_dict(gather=True), summed.state_dict(gather=True)
        if all(torch.equal(a[k], b[k]) for k in a):
            raise AssertionError(f"{label}: dividing the gradient changed nothing")


def check_checkpoint(rank, W, ckpt, optimizer):
    if W == 2:
        kinds = [
            dist.ROW_WISE,
            dist.TABLE_WISE,
            dist.DATA_PARALLEL,
            dist.TABLE_ROW_WISE,
            dist.TABLE_WISE,
            dist.ROW_WISE,
        ]
        ranks = [None, (1,), None, (0, 1), (0,), None]
        plan = {t.name: dist.ParameterSharding(k, r) for t, k, r in zip(TABLES, kinds, ranks)}
        model = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer)
        train(model, None, W, rank, 2, True, "ckpt")
        torch.save(model.state_dict(gather=False), os.path.join(ckpt, f"rank{rank}.pt"))
        checkpoint.save(model, os.path.join(ckpt, "sharded"))
        checkpoint.dcp_save(model, os.path.join(ckpt, "dcp"))
        return
    files = sorted(f for f in os.listdir(ckpt) if f.startswith("rank"))
    if len(files) != 2:
        raise AssertionError(f"expected the 2 shard files of the 2-rank run, found {files}")
    state = merge_state_dicts(torch.load(os.path.join(ckpt, f), weights_only=True) for f in files)
    plan = plans(3)[dist.TABLE_ROW_WISE]  # another plan and another world size
    model = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer, seed=123)  # other init: overwritten
    model.load_state_dict(state)
    again = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer, seed=321)
    checkpoint.load(again, os.path.join(ckpt, "sharded"))  # the checksummed files: the same state
    mine, theirs = model.state_dict(gather=False), again.state_dict(gather=False)
    for key, v in mine.items():
        w = theirs[key]
        if isinstance(v, torch.Tensor):
            ok = torch.equal(v, w)
        else:
            ok = all(torch.equal(a[2], b[2]) for a, b in zip(v.pieces, w.pieces))
        if not ok:
            raise AssertionError(f"checkpoint.load and load_state_dict differ on {key}")
    check_dcp(rank, ckpt, optimizer, again)
    start = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer)  # seed 0: the 2-rank run's start
    ref = reference(start, optimizer)
    for step in range(2):  # the unsharded run of the first two steps (the 2-rank batches)
        want = ref_forward(ref, step, 2)
        (want * _grad_weights(step, want.shape[0], want.shape[1])).sum().backward()
    compare_state(model, ref, False, "resumed checkpoint")
    train(model, ref, 3, rank, 2, False, "resumed", first=2)
    compare_state(model, ref, False, "resumed checkpoint after 2 more steps")
    return check_damage(rank, ckpt, optimizer)


def check_dcp(rank, ckpt, optimizer, loaded):
    """The 2-rank run's torch.distributed.checkpoint loads on 3 ranks under another plan and on 1 rank
    (a one-rank group per process) bit-identically to the checksummed files (``loaded``)."""
    want = loaded.state_dict(gather=True)
    plan3 = plans(3)[dist.COLUMN_WISE if optimizer.kind in ("sgd", "adagrad", "adam") else dist.ROW_WISE]
    three = ShardedEmbeddingBagCollection(TABLES, plan3, optimizer=optimizer, seed=7)
    checkpoint.dcp_load(three, os.path.join(ckpt, "dcp"))
    compare_whole(three.state_dict(gather=True), want, "dcp on 3 ranks")
    alone = [torch.distributed.new_group([r]) for r in range(3)][rank]
    one = ShardedEmbeddingBagCollection(TABLES, plans(1)[dist.TABLE_WISE], alone, optimizer=optimizer, seed=9)
    checkpoint.dcp_load(one, os.path.join(ckpt, "dcp"))
    compare_whole(one.state_dict(gather=True), want, "dcp on 1 rank")


def compare_whole(got, want, label):
    if set(got) != set(want):
        raise AssertionError(f"{label}: keys differ: {sorted(set(got) ^ set(want))}")
    for key, w in want.items():
        same(got[key], w, True, f"{label} {key}")


def check_damage(rank, ckpt, optimizer):
    """Copies of the 2-rank checkpoint, damaged: every error names the file and what it held;
    ``strict=False`` names the rows it could not restore. Each rank works in its own directory."""
    plan = plans(3)[dist.TABLE_ROW_WISE]
    model = ShardedEmbeddingBagCollection(TABLES, plan, optimizer=optimizer)
    src = os.path.join(ckpt, "sharded")
    for name in os.listdir(src):  # the format: plain containers
        torch.load(os.path.join(src, name), weights_only=True)

    def copy(tag):
        d = os.path.join(ckpt, f"damaged-{tag}-{rank}")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        return d, os.path.join(d, "rank1-of-2.pt")

    def expect(d, kind, *needles, strict=True):
        try:
            checkpoint.load(model, d, strict=strict)
        except kind as e:
            missing = [n for n in needles if n not in str(e)]
            if missing:
                raise AssertionError(f"{kind.__name__} lacks {missing}: {e}") from e
            return
        raise AssertionError(f"{d}: no {kind.__name__} (wanted {needles})")

    d, victim = copy("truncated")
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    expect(d, ValueError, victim, "unreadable", "embedding_bags.t")
    d, victim = copy("corrupted")
    piece = torch.load(victim, weights_only=True)["state"]["embedding_bags.t1.weight"]["pieces"][0]["data"]
    raw = open(victim, "rb").read()
    at = raw.find(piece.numpy().tobytes())
    if at < 0:
        raise AssertionError("the piece's bytes are not stored verbatim")
    raw = raw[: at + 5] + bytes([raw[at + 5] ^ 0x40]) + raw[at + 6 :]
    open(victim, "wb").write(raw)
    expect(d, ValueError, victim, "embedding_bags.t1.weight", "checksum")
    d, victim = copy("missing")
    os.remove(victim)
    expect(d, FileNotFoundError, victim, "missing", "embedding_bags.t")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = checkpoint.load(model, d, strict=False)
    held = torch.load(os.path.join(src, "rank0-of-2.pt"), weights_only=True)["manifest"]
    want = {}  # the rows of this rank's shards that only rank 1's file held
    for key, r, rows, _ in held:
        for k, mine, (a, b), _ in model.manifest():
            if r == 1 and k == key and mine == rank and max(a, rows[0]) < min(b, rows[1]):
                want.setdefault(key, set()).update(range(max(a, rows[0]), min(b, rows[1])))
    got = {k: {i for a, b in v for i in range(a, b)} for k, v in report.unrestored.items()}
    if got != want or (want and not any("unrestored" in str(w.message) for w in caught)):
        raise AssertionError(f"strict=False without rank 1's file: report {report}, expected rows {want}")
    return f"damage named; strict=False left {sum(map(len, want.values()))} rows unrestored"


def worker(rank, W, ckpt):
    adagrad = embnum.TBEOptimizer("adagrad", learning_rate=0.1)
    adam = embnum.TBEOptimizer("adam", learning_rate=0.05)
    check_collectives(rank, W)
    check_sharded(rank, W, adagrad if W == 2 else adam)
    return check_checkpoint(rank, W, ckpt, embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.1)) or "trained"


def warm_up():
    """Compile (or load from Numba's cache) the kernels the ranks use, once, before spawning them:
    two processes compiling the same parallel kernels at once on a small machine take minutes."""
    for name in ("adagrad", "adam", "rowwise_adagrad", "sgd"):
        opt = embnum.TBEOptimizer(name, learning_rate=0.1)
        for step in range(2):
            ref = EmbeddingBagCollection(SUM_TABLES if step else TABLES, is_weighted=step == 1, optimizer=opt)
            out = ref_forward(ref, step, 2, weighted=step == 1)
            out.sum().backward()
    check_collectives_local()


def check_collectives_local():
    x = torch.randn(4, 8)
    for name in ("fp16", "bf16", "fp8", "int8"):
        c = comm.codec_of(name)
        c.decode(
            c.encode(x, c.create_context(8) if name == "int8" else None),
            c.create_context(8) if name == "int8" else None,
        )
    lengths = torch.tensor([[1, 2], [0, 3]])
    values = torch.arange(6)
    tb.permute_2d_sparse_data(torch.tensor([1, 0]), lengths, values, values.float())
    tb.permute_1d_sparse_data(torch.tensor([1, 0]), torch.tensor([3, 3]), values, values.float())
    tb.block_bucketize_sparse_features(
        lengths.reshape(-1), values, False, False, torch.tensor([3, 3]), 2, weights=values.float()
    )


def main():
    W, ckpt = int(sys.argv[1]), sys.argv[2]
    warm_up()
    t0 = time.monotonic()
    try:
        results = spawn(worker, W, args=(ckpt,), timeout_s=30)
    except SpawnError as e:
        print(e)
        return 1
    print(f"ok: {W} ranks in {time.monotonic() - t0:.0f}s: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
