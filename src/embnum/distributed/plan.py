"""Sharding plans and the planner (no torch needed).

A plan maps every table name to a :class:`ParameterSharding`: one of the
five sharding types and the ranks that hold the table.

| type | ranks | what each rank holds |
| --- | --- | --- |
| ``table_wise`` | one rank | the whole table |
| ``column_wise`` | k ranks (repeats allowed) | a block of columns (k near-equal parts, the first ones wider) |
| ``row_wise`` | every rank, in order | a block of ``ceil(rows / world)`` rows (the last block may be short or empty) |
| ``table_row_wise`` | a group of ranks | a block of ``ceil(rows / len(group))`` rows |
| ``data_parallel`` | every rank | a replica |

:func:`plan_tables` (what ``plan=None`` uses) assigns tables by estimated
cost: memory ``rows x dim`` (plus the optimizer state) and work ``lookups
per sample x dim`` (from optional statistics, default one lookup per
feature). :meth:`ShardingPlan.table` prints a plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

TABLE_WISE = "table_wise"
ROW_WISE = "row_wise"
COLUMN_WISE = "column_wise"
TABLE_ROW_WISE = "table_row_wise"
DATA_PARALLEL = "data_parallel"
SHARDING_TYPES = (TABLE_WISE, ROW_WISE, COLUMN_WISE, TABLE_ROW_WISE, DATA_PARALLEL)
_SHORT = {TABLE_WISE: "TW", ROW_WISE: "RW", COLUMN_WISE: "CW", TABLE_ROW_WISE: "TWRW", DATA_PARALLEL: "DP"}


@dataclasses.dataclass(frozen=True)
class ParameterSharding:
    """How one table is sharded: ``sharding_type`` (one of :data:`SHARDING_TYPES`) and ``ranks``.

    ``ranks`` may be omitted for ``row_wise`` and ``data_parallel`` (every rank).
    """

    sharding_type: str
    ranks: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.sharding_type not in SHARDING_TYPES:
            raise ValueError(f"sharding_type must be one of {SHARDING_TYPES}, got {self.sharding_type!r}")
        if self.ranks is not None:
            object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))

    def resolved_ranks(self, world_size: int, table: str = "?") -> tuple[int, ...]:
        """The ranks, checked against ``world_size`` (``ValueError`` naming the table otherwise)."""
        every = tuple(range(world_size))
        ranks = self.ranks
        if ranks is None:
            if self.sharding_type in (ROW_WISE, DATA_PARALLEL):
                return every
            raise ValueError(f"table {table!r}: {self.sharding_type} needs ranks")
        if not ranks:
            raise ValueError(f"table {table!r}: ranks is empty")
        bad = [r for r in ranks if not 0 <= r < world_size]
        if bad:
            raise ValueError(f"table {table!r}: rank {bad[0]} is outside the world of {world_size} ranks")
        if self.sharding_type in (ROW_WISE, DATA_PARALLEL) and ranks != every:
            raise ValueError(f"table {table!r}: {self.sharding_type} uses every rank in order, got ranks {ranks}")
        if self.sharding_type == TABLE_WISE and len(ranks) != 1:
            raise ValueError(f"table {table!r}: table_wise takes exactly one rank, got {ranks}")
        if self.sharding_type == TABLE_ROW_WISE and len(set(ranks)) != len(ranks):
            raise ValueError(f"table {table!r}: table_row_wise ranks repeat: {ranks}")
        return ranks


def column_blocks(dim: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` near-equal column ranges of ``dim`` columns (the first ``dim % parts`` one wider)."""
    if parts > dim:
        raise ValueError(f"cannot split {dim} columns into {parts} column-wise shards")
    base, extra = divmod(dim, parts)
    out, c = [], 0
    for i in range(parts):
        w = base + (i < extra)
        out.append((c, c + w))
        c += w
    return out


def row_blocks(rows: int, parts: int) -> list[tuple[int, int]]:
    """Row ranges of ``block = ceil(rows / parts)`` rows (block_bucketize's rule); later ones may be empty."""
    block = -(-rows // parts)
    return [(min(i * block, rows), min((i + 1) * block, rows)) for i in range(parts)]


def block_size(rows: int, parts: int) -> int:
    return -(-rows // parts)


class ShardingPlan(dict):
    """``{table name: ParameterSharding}`` with a printable :meth:`table` (``str(plan)`` is the same)."""

    def __init__(self, plan: Mapping[str, ParameterSharding] = (), world_size: int | None = None, costs=None):
        super().__init__(plan)
        for name, ps in self.items():
            if not isinstance(ps, ParameterSharding):
                raise TypeError(f"plan[{name!r}] must be a ParameterSharding, got {type(ps).__name__}")
        self.world_size = world_size
        self.costs = costs or {}

    def table(self, tables=None) -> str:
        """A text table: one line per table (type, ranks, memory and work per rank), then per-rank totals."""
        world = self.world_size or 1 + max((max(p.ranks or (0,)) for p in self.values()), default=0)
        dims = {t.name: (t.num_embeddings, t.embedding_dim) for t in tables or ()}
        lines = [f"{'table':<16} {'rows':>9} {'dim':>5} {'type':<5} {'ranks':<16} {'MB/rank':>9} {'work/rank':>10}"]
        mem = [0.0] * world
        work = [0.0] * world
        for name, ps in self.items():
            rows, dim = dims.get(name, (None, None))
            ranks = ps.resolved_ranks(world, name)
            m, w = self.costs.get(name, (0.0, 0.0))
            share = 1 if ps.sharding_type == DATA_PARALLEL else len(ranks)
            for r in ranks:
                mem[r] += m / share
                work[r] += w if ps.sharding_type == DATA_PARALLEL else w / share
            lines.append(
                f"{name:<16} {rows if rows is not None else '':>9} {dim if dim is not None else '':>5} "
                f"{_SHORT[ps.sharding_type]:<5} {','.join(map(str, ranks)):<16} {m / share / 1e6:>9.3f} "
                f"{(w if ps.sharding_type == DATA_PARALLEL else w / share):>10.1f}"
            )
        lines.append("")
        lines.append(f"{'rank':<6} {'MB':>10} {'work':>10}")
        for r in range(world):
            lines.append(f"{r:<6} {mem[r] / 1e6:>10.3f} {work[r]:>10.1f}")
        return "\n".join(lines)

    def __str__(self):
        return self.table()


def _state_floats(optimizer) -> float:
    """Optimizer state elements per weight element (rowwise Adagrad: one per row, counted as 0)."""
    kind = getattr(optimizer, "kind", "sgd")
    return {"sgd": 0.0, "rowwise_adagrad": 0.0, "adagrad": 1.0, "adam": 2.0}.get(kind, 0.0)


def plan_tables(
    tables: Sequence,
    world_size: int,
    *,
    lookups: Mapping[str, float] | None = None,
    optimizer=None,
    row_wise_share: float = 0.5,
    data_parallel_bytes: int = 0,
    verbose: bool = False,
) -> ShardingPlan:
    """A plan for ``tables`` (``EmbeddingBagConfig``-like: ``name``, ``num_embeddings``,
    ``embedding_dim``, ``feature_names``) on ``world_size`` ranks.

    Cost of a table: memory ``rows * dim * 4 * (1 + state)`` bytes, work ``L * dim`` per
    sample, ``L`` = ``lookups[name]`` (mean ids per sample over the table's features; default
    one per feature). Rules, in order:

    * a table of at most ``data_parallel_bytes`` bytes is replicated (``data_parallel``;
      off by default);
    * a table whose memory exceeds ``row_wise_share`` of a rank's fair share (total / world)
      and that has at least ``world_size`` rows goes ``row_wise``;
    * every other table goes ``table_wise``, largest ``max(memory share, work share)`` first, to
      the rank with the least ``max(memory share, work share)`` after adding it (ties: the lower rank).

    ``verbose=True`` prints the plan. Returns a :class:`ShardingPlan`.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    state = _state_floats(optimizer)
    costs = {}
    for t in tables:
        L = (lookups or {}).get(t.name, float(len(t.feature_names)))
        if L < 0:
            raise ValueError(f"lookups[{t.name!r}] must be >= 0, got {L}")
        costs[t.name] = (t.num_embeddings * t.embedding_dim * 4.0 * (1 + state), L * t.embedding_dim)
    total_mem = sum(m for m, _ in costs.values()) or 1.0
    total_work = sum(w for _, w in costs.values()) or 1.0
    fair = total_mem / world_size
    mem = [0.0] * world_size
    work = [0.0] * world_size
    plan = {}
    rest = []
    for t in tables:
        m, w = costs[t.name]
        if m <= data_parallel_bytes:
            plan[t.name] = ParameterSharding(DATA_PARALLEL)
        elif world_size > 1 and m > row_wise_share * fair and t.num_embeddings >= world_size:
            plan[t.name] = ParameterSharding(ROW_WISE)
            for r in range(world_size):
                mem[r] += m / world_size
                work[r] += w / world_size
        else:
            rest.append(t)
    for t in sorted(rest, key=lambda t: (-max(costs[t.name][0] / total_mem, costs[t.name][1] / total_work), t.name)):
        m, w = costs[t.name]

        def load(r):
            return max((mem[r] + m) / total_mem, (work[r] + w) / total_work)

        r = min(range(world_size), key=lambda r: (load(r), r))
        plan[t.name] = ParameterSharding(TABLE_WISE, (r,))
        mem[r] += m
        work[r] += w
    ordered = ShardingPlan({t.name: plan[t.name] for t in tables}, world_size, costs)
    if verbose:
        print(ordered.table(tables))
    return ordered
