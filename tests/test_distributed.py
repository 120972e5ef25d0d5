"""embnum.distributed: planner and sharding math in one process; the sharded collection on gloo
with 2 and 3 spawned processes (tests/dist_checks.py: every sharding type, a mixed plan, codecs,
resharding checkpoints, a failing rank)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

import embnum.distributed as dist  # noqa: E402
from embnum.distributed.plan import column_blocks, row_blocks  # noqa: E402
from embnum.distributed.sharding import build_layout  # noqa: E402


class Config:
    def __init__(self, name, num_embeddings, embedding_dim, feature_names, pooling="sum"):
        self.name, self.num_embeddings, self.embedding_dim = name, num_embeddings, embedding_dim
        self.feature_names, self.pooling = feature_names, pooling


@st.composite
def tables_and_plan(draw):
    W = draw(st.integers(1, 4))
    n = draw(st.integers(1, 5))
    tables, plan = [], {}
    for i in range(n):
        D = draw(st.integers(W, 9))
        t = Config(f"t{i}", draw(st.integers(1, 30)), D, [f"t{i}f{k}" for k in range(draw(st.integers(1, 3)))])
        t.pooling = draw(st.sampled_from(["sum", "mean"]))
        kind = draw(st.sampled_from(dist.SHARDING_TYPES))
        if kind == dist.TABLE_WISE:
            ranks = (draw(st.integers(0, W - 1)),)
        elif kind == dist.COLUMN_WISE:
            ranks = tuple(draw(st.lists(st.integers(0, W - 1), min_size=1, max_size=W)))
        elif kind == dist.TABLE_ROW_WISE:
            ranks = tuple(draw(st.permutations(range(W)))[: draw(st.integers(1, W))])
        else:
            ranks = None
        tables.append(t)
        plan[t.name] = dist.ParameterSharding(kind, ranks)
    return tables, plan, W


@given(tables_and_plan())
def test_layout_covers_every_table_once(case):
    """Shards tile each table exactly (replicas: one full copy per rank); every feature of a
    sharded table is looked up on every rank that holds a shard; each output column is written
    once (row-wise: by the reduce-scatter's sum) or, table-row-wise, by one partial sum per group rank."""
    tables, plan, W = case
    lay = build_layout(tables, plan, W)
    for ti, t in enumerate(tables):
        shards = [lay.shards[i] for i in lay.table_shards(ti)]
        count = [[0] * t.embedding_dim for _ in range(t.num_embeddings)]
        for sh in shards:
            for r in range(*sh.rows):
                for c in range(*sh.cols):
                    count[r][c] += 1
        want = W if plan[t.name].sharding_type == dist.DATA_PARALLEL else 1
        assert all(c == want for row in count for c in row), (t.name, plan[t.name])
    total_cols = sum(t.embedding_dim * len(t.feature_names) for t in tables)
    for rank in range(W):
        cols = lay.column_map(rank)
        hits = [0] * total_cols
        for c in cols:
            hits[c] += 1
        for f in lay.features:
            kind = plan[tables[f.table].name].sharding_type
            n = (
                len(plan[tables[f.table].name].ranks) if kind == dist.TABLE_ROW_WISE else 1
            )  # row-wise: summed in the reduce-scatter
            assert hits[f.col : f.col + f.dim] == [n] * f.dim, (f, kind)
        groups = [s.group for s in lay.slots[rank]]
        assert groups == sorted(groups, key=["sum", "mean", "dp_sum", "dp_mean"].index)  # contiguous groups


def test_blocks():
    assert column_blocks(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert row_blocks(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert row_blocks(2, 3) == [(0, 1), (1, 2), (2, 2)]  # an empty last block, as block_bucketize routes
    with pytest.raises(ValueError, match="cannot split 2 columns into 3"):
        column_blocks(2, 3)


def test_planner_balances_and_prints():
    tables = [Config("big", 10_000, 64, ["a"])] + [Config(f"s{i}", 100 * (i + 1), 16, [f"f{i}"]) for i in range(6)]
    plan = dist.plan_tables(tables, 3)
    assert plan["big"].sharding_type == dist.ROW_WISE  # larger than a rank's share: split over every rank
    tw = [p for n, p in plan.items() if n != "big"]
    assert all(p.sharding_type == dist.TABLE_WISE for p in tw)
    per_rank = [sum(t.num_embeddings for t in tables[1:] if plan[t.name].ranks == (r,)) for r in range(3)]
    assert max(per_rank) - min(per_rank) <= 700  # the greedy keeps the small tables within one table
    text = plan.table(tables)
    assert "big" in text and "RW" in text and "TW" in text and text.count("\n") >= len(tables) + 4
    busy = dist.plan_tables(tables[1:], 2, lookups={"s0": 500.0})  # a hot table weighs by its lookups
    assert busy["s0"].ranks != busy["s5"].ranks
    assert dist.plan_tables(tables, 1)["big"].sharding_type == dist.TABLE_WISE


def test_plan_validation():
    tables = [Config("a", 10, 4, ["x"]), Config("b", 10, 4, ["y"])]
    with pytest.raises(ValueError, match="sharding_type must be one of"):
        dist.ParameterSharding("diagonal")
    with pytest.raises(ValueError, match="'a'.*rank 5 is outside"):
        build_layout(
            tables, {"a": dist.ParameterSharding(dist.TABLE_WISE, (5,)), "b": dist.ParameterSharding(dist.ROW_WISE)}, 2
        )
    with pytest.raises(ValueError, match="no entry for table 'b'"):
        build_layout(tables, {"a": dist.ParameterSharding(dist.ROW_WISE)}, 2)
    with pytest.raises(ValueError, match="table_wise takes exactly one rank"):
        build_layout(
            tables,
            {"a": dist.ParameterSharding(dist.TABLE_WISE, (0, 1)), "b": dist.ParameterSharding(dist.ROW_WISE)},
            2,
        )
    with pytest.raises(ValueError, match="row_wise uses every rank"):
        build_layout(
            tables, {"a": dist.ParameterSharding(dist.ROW_WISE, (1, 0)), "b": dist.ParameterSharding(dist.ROW_WISE)}, 2
        )
    with pytest.raises(ValueError, match="feature 'x' is read by two tables"):
        build_layout([Config("a", 10, 4, ["x"]), Config("b", 10, 4, ["x"])], {}, 2)


def _script(name, *args, timeout=480):
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run(
        [sys.executable, str(here / name), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def test_sharded_collection_on_gloo(tmp_path):
    """2 then 3 spawned gloo processes (each phase described in tests/dist_checks.py); the 3-rank
    run resumes from the 2-rank run's checkpoint under another plan."""
    for world in (2, 3):
        assert f"ok: {world} ranks" in _script("dist_checks.py", world, tmp_path)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_that_disagree_and_bad_batches_recover(world):
    """Different plans or table sizes fail at construction on every rank; a bad id or a missing
    key fails the step on every rank; the next good step trains (tests/dist_faults.py)."""
    out = _script("dist_faults.py", world, "recover")
    assert f"ok: recover on {world} ranks" in out
    assert out.count("bad batch on rank") == 2 * world


@pytest.mark.parametrize(
    "world, victim, how, where",
    [
        (2, 1, "kill", "forward"),
        (3, 2, "kill", "forward"),
        (3, 0, "kill", "forward"),  # the store's host
        (2, 0, "kill", "backward"),
        (3, 1, "stuck", "forward"),
        (3, 0, "raise", "forward"),
    ],
)
def test_a_dead_or_stuck_rank_is_named(world, victim, how, where):
    """Every survivor raises RankFailedError naming the victim in bounded time; no process is left."""
    out = _script("dist_faults.py", world, "crash", victim, how, where, timeout=200)
    assert f"ok: crash {victim} {how} {where} on {world} ranks" in out
    assert out.count(f"to name rank {victim}") == world - 1
