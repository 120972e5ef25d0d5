"""Fault injection for ``embnum.distributed`` on gloo (run by tests/test_distributed.py).

``python tests/dist_faults.py WORLD CASE`` spawns WORLD local processes and prints one line per
rank with what it saw and how long it took to see it. CASE:

* ``recover``: faults the job survives, one after the other in the same processes (so the
  group is shown usable after each): a plan that puts a table on another rank on the last
  rank; a plan that shards a table row-wise on every rank but table-wise on the last; a table
  with 90 rows on the last rank and 80 elsewhere; another learning rate on the last rank; a
  plan only the last rank rejects (it raises its error, the others name it); an id out of
  range on the last rank; a
  missing key on rank 0. Construction must fail with the same ``ValueError`` on every rank,
  naming the table or setting and the ranks; a bad batch with the same error on every rank
  naming the rank, key and value; and after each bad batch a good step must train on every
  rank exactly as the unsharded collection does on the good batch alone.
* ``crash VICTIM HOW WHERE``: after one good step, rank VICTIM fails in step 2: HOW is ``kill``
  (SIGKILL), ``stuck`` (sleeps far past the collective timeout) or ``raise`` (a local error in
  forward); WHERE is ``forward`` or ``backward``. Every other rank must raise
  ``RankFailedError`` naming VICTIM within the survivors' answer window (``launch.ANSWER_S``;
  stuck: after the collective timeout plus that window), and every process must be gone when
  the launcher returns. The stuck rank wakes up after the survivors' verdict and finds the
  group aborted.
  Collective timeout: 6 s.
"""

import multiprocessing
import os
import signal
import sys
import time

import numpy as np

import embnum
import embnum.distributed as dist
from dist_checks import FEATURES, SIZES, TABLES, Config, batch, compare_state, kjt, plans, reference, train
from embnum.distributed import ShardedEmbeddingBagCollection, SpawnError, spawn

SGD = embnum.TBEOptimizer("sgd", learning_rate=0.5)


def _expect(fn, kind, *needles, cause=None):
    """Run ``fn``; it must raise ``kind`` whose message holds every needle (and, with ``cause``, whose
    ``__cause__`` is a ``kind`` whose message starts so). Returns (message, seconds)."""
    t0 = time.monotonic()
    try:
        fn()
    except kind as e:
        text = str(e)
        missing = [n for n in needles if n not in text]
        if missing:
            raise AssertionError(f"{kind.__name__} lacks {missing}: {text}") from e
        if cause is not None and not (isinstance(e.__cause__, kind) and str(e.__cause__).startswith(cause)):
            raise AssertionError(f"{kind.__name__}'s cause is not {cause!r}...: {e.__cause__!r}") from e
        return text, time.monotonic() - t0
    raise AssertionError(f"no {kind.__name__} (wanted {needles})")


def _mismatches(rank, W):
    """Construction with settings that differ on the last rank: a ValueError on every rank."""
    last = W - 1
    seen = []
    other = dict(plans(W)["mixed"])
    other["t1"] = dist.ParameterSharding(dist.TABLE_WISE, ((other["t1"].ranks[0] + 1) % W,))
    plan = other if rank == last else plans(W)["mixed"]
    seen.append(
        _expect(
            lambda: ShardedEmbeddingBagCollection(TABLES, plan, optimizer=SGD),
            ValueError,
            "plan of table 't1' differs",
            f"rank {last}: table_wise on ranks ({(plans(W)['mixed']['t1'].ranks[0] + 1) % W},)",
        )
    )
    kinds = dict(plans(W)["mixed"])
    kinds["t0"] = dist.ParameterSharding(dist.TABLE_WISE, (0,))  # row-wise elsewhere
    plan = kinds if rank == last else plans(W)["mixed"]
    seen.append(
        _expect(
            lambda: ShardedEmbeddingBagCollection(TABLES, plan, optimizer=SGD),
            ValueError,
            "plan of table 't0' differs",
            f"rank {last}: table_wise on ranks (0,)",
            "row_wise",
        )
    )
    sizes = [Config(t.name, 90 if (t.name == "t0" and rank == last) else 80, 8, t.feature_names) for t in TABLES[:1]]
    sizes += TABLES[1:]
    seen.append(
        _expect(
            lambda: ShardedEmbeddingBagCollection(sizes, plans(W)["mixed"], optimizer=SGD),
            ValueError,
            "table 't0' differs",
            "num_embeddings=90",
            "num_embeddings=80",
            f"rank {last}:",
        )
    )
    lr = embnum.TBEOptimizer("sgd", learning_rate=0.25) if rank == last else SGD
    seen.append(
        _expect(
            lambda: ShardedEmbeddingBagCollection(TABLES, plans(W)["mixed"], optimizer=lr),
            ValueError,
            "optimizer differs",
            "learning_rate=0.25",
            f"rank {last}:",
        )
    )
    broken = dict(plans(W)["mixed"])
    broken["t1"] = dist.ParameterSharding(dist.TABLE_WISE, (W,))  # a rank outside the world, on one rank only
    plan = broken if rank == last else plans(W)["mixed"]
    needles = ["is outside the world"] + ([] if rank == last else [f"rank {last} could not build"])
    seen.append(_expect(lambda: ShardedEmbeddingBagCollection(TABLES, plan, optimizer=SGD), ValueError, *needles))
    return seen


def _bad_then_good(rank, W, who, spoil, kind, needles, cause=None):
    """Step 0: ``who``'s batch spoilt by ``spoil``: every rank raises ``kind`` (with the op's error
    ``cause`` as its cause, where given); step 1 (good) trains on every rank as the unsharded
    collection trains on step 1's global batch alone."""
    model = ShardedEmbeddingBagCollection(TABLES, plans(W)["mixed"], optimizer=SGD)
    ref = reference(model, SGD)
    keys, L, V, Wt = batch(0, rank, W)
    if rank == who:
        keys, L, V = spoil(keys, L, V)
    seen = _expect(lambda: model(kjt(keys, L, V, Wt)), kind, f"bad batch on rank {who}", *needles, cause=cause)
    train(model, ref, W, rank, 1, False, "the good step after a bad batch", first=1)
    compare_state(model, ref, False, "after a bad batch and a good step")
    return seen


def _bad_id(keys, L, V):
    """Id 10000 as the first id of key f0's last sample (one more id there if it had none)."""
    V, L = V.copy(), L.copy()
    i = keys.index("f0")
    start = int(L[:i].sum() + L[i, :-1].sum())
    if L[i, -1] == 0:  # make room for the bad id
        L[i, -1] = 1
        V = np.insert(V, start, 0)
    V[start] = 10_000
    return keys, L, V


def _drop_key(keys, L, V):
    i = keys.index("f1")
    off = np.concatenate([[0], np.cumsum(L.sum(1))])
    V = np.concatenate([V[: off[i]], V[off[i + 1] :]])
    return keys[:i] + keys[i + 1 :], np.delete(L, i, axis=0), V


def recover(rank, W):
    seen = _mismatches(rank, W) if W > 1 else []
    last = W - 1
    B = SIZES[0][last]  # the bad rank's own batch: the id is in its last sample
    keys, L, _, _ = batch(0, last, W)
    i = keys.index("f0")
    at = int(L[:i].sum() + L[i, :-1].sum())  # where _bad_id puts it in that rank's values
    needles = [f"feature 'f0' (table 't0'): id 10000 at sample {B - 1} is outside [0, 40)"]
    cause = f"indices[{at}] = 10000 in the bag of feature {i}, sample {B - 1} is out of range"
    seen.append(_bad_then_good(rank, W, last, _bad_id, IndexError, needles, cause))
    seen.append(_bad_then_good(rank, W, 0, _drop_key, ValueError, ["lacks key 'f1'"]))
    return [f"{t:.2f}s {m}" for m, t in seen]


TIMEOUT_S = 6.0


def _act(how):
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "stuck":  # past the survivors' verdict; then it finds the group aborted
        time.sleep(TIMEOUT_S + dist.launch.ANSWER_S + 5)


def crash(rank, W, victim, how, where):
    model = ShardedEmbeddingBagCollection(TABLES, plans(W)["mixed"], optimizer=SGD)
    train(model, None, W, rank, 1, True, "a good step first")
    if rank == victim and how == "raise":
        model._forward = lambda *a: (_ for _ in ()).throw(RuntimeError("injected fault"))
    keys, L, V, Wt = batch(1, rank, W)
    t0 = time.monotonic()
    try:
        if rank == victim and where == "forward":
            _act(how)
        out = model(kjt(keys, L, V, Wt)).values()
        if rank == victim and where == "backward":
            _act(how)
        out.sum().backward()
    except dist.RankFailedError as e:
        if rank == victim and how == "stuck":
            return [f"woke up to {type(e).__name__}"]
        if e.rank != victim or f"rank {victim}" not in str(e):
            raise AssertionError(f"rank {rank} blamed rank {e.rank}, not {victim}: {e}") from e
        took = time.monotonic() - t0
        bound = TIMEOUT_S * (how == "stuck") + dist.launch.ANSWER_S + 3.0
        if took > bound:
            raise AssertionError(f"rank {rank} named rank {victim} after {took:.1f}s (more than {bound:.0f}s)") from e
        return [f"{took:.2f}s to name rank {victim}: {e}"]
    except RuntimeError as e:
        if rank == victim and how == "raise" and "injected fault" in str(e):
            return ["raised the injected fault"]
        if rank == victim and how == "stuck":
            return [f"woke up to {type(e).__name__}"]
        raise
    raise AssertionError(f"rank {rank}: step 2 did not fail")


def main():
    W, case = int(sys.argv[1]), sys.argv[2]
    assert FEATURES  # the shared inputs of dist_checks.py
    t0 = time.monotonic()
    if case == "recover":
        try:
            results = spawn(recover, W, timeout_s=30)
        except SpawnError as e:
            print(e)
            return 1
    else:
        victim, how, where = int(sys.argv[3]), sys.argv[4], sys.argv[5]
        args = (victim, how, where)
        try:
            results = spawn(crash, W, args, timeout_s=TIMEOUT_S, deadline_s=TIMEOUT_S + 60)
            if how == "kill":
                print(f"rank {victim} was meant to die but every rank finished")
                return 1
        except SpawnError as e:
            if set(e.errors) != {victim} or how != "kill" or "exited with code -9" not in e.errors[victim]:
                print(e)
                return 1
            results = [e.results.get(r, [f"({e.errors[victim]})"]) for r in range(W)]
        alive = [p for p in multiprocessing.active_children()]
        if alive:
            print(f"processes left: {alive}")
            return 1
    for r, lines in enumerate(results):
        for line in lines:
            print(f"rank {r}: {line}")
    print(f"ok: {' '.join(sys.argv[2:])} on {W} ranks in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
