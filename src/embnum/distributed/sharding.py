"""The sharding math: from tables and a plan to shards, routes and column maps (no collectives).

Every rank computes the same :class:`Layout` from ``(tables, plan, world_size)``:

* **features** in the single-process EBC's output order (tables in order, each
  table's features in order), with their output columns;
* **shards**: for each table its pieces ``(rank, rows [r0, r1), cols [c0, c1))``
  (see :mod:`embnum.distributed.plan` for each type's rule);
* **slots**: what a rank looks up, one per ``(shard, feature)``, grouped by
  the local TBE that serves them (``sum`` / ``mean`` pooling for the global
  batch, ``dp_sum`` / ``dp_mean`` for replicated tables and the local batch).
  Inside the ``sum`` group the slots of the pooled all-to-all come first,
  then those of the reduce-scatter (row-wise tables, in table order: the same
  columns on every rank, so the reduce-scatter adds matching columns);
* **bucket calls**: one ``block_bucketize_sparse_features`` per row-wise
  split (all ranks for ``row_wise``, each group for ``table_row_wise``);
* **routes**: where each slot's ids come from on the source rank (a feature of
  the local KJT, or bucket ``j`` of a bucket call);
* the **column map** that assembles a rank's output from what it receives.

Row-wise and table-row-wise tables are looked up with sum pooling on the
shards; a ``mean`` table divides by the bag length at the source, after the
partial sums are added.
"""

from __future__ import annotations

import dataclasses

from .plan import (
    COLUMN_WISE,
    DATA_PARALLEL,
    ROW_WISE,
    TABLE_ROW_WISE,
    TABLE_WISE,
    ParameterSharding,
    block_size,
    column_blocks,
    row_blocks,
)

GROUPS = ("sum", "mean", "dp_sum", "dp_mean")


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    table: int
    dim: int
    col: int  # first output column
    pooling: str


@dataclasses.dataclass(frozen=True)
class Shard:
    table: int
    rank: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    kind: str
    bucket: int = -1  # row-wise types: the shard's bucket in its bucket call

    @property
    def width(self) -> int:
        return self.cols[1] - self.cols[0]

    @property
    def nrows(self) -> int:
        return self.rows[1] - self.rows[0]


@dataclasses.dataclass(frozen=True)
class Slot:
    shard: int
    feature: int
    group: str  # "sum", "mean", "dp_sum", "dp_mean"
    route: str  # "a2a", "rs" or "dp"
    call: int = -1  # bucket call (row-wise types), else -1


@dataclasses.dataclass(frozen=True)
class BucketCall:
    features: tuple[int, ...]
    ranks: tuple[int, ...]  # bucket j -> ranks[j]
    block_sizes: tuple[int, ...]


@dataclasses.dataclass
class Layout:
    world_size: int
    tables: list
    plan: dict
    features: list[Feature]
    shards: list[Shard]
    slots: list[list[Slot]]  # per rank, grouped by GROUPS in order
    calls: list[BucketCall]
    total_dim: int

    # -- derived views ------------------------------------------------------------------
    def group_slots(self, rank: int, group: str) -> list[Slot]:
        return [s for s in self.slots[rank] if s.group == group]

    def slot_width(self, slot: Slot) -> int:
        return self.shards[slot.shard].width

    def a2a_cols(self, rank: int) -> int:
        return sum(self.slot_width(s) for s in self.slots[rank] if s.route == "a2a")

    def rs_cols(self) -> int:
        return sum(self.slot_width(s) for s in self.slots[0] if s.route == "rs") if self.slots else 0

    def dp_cols(self, rank: int) -> int:
        return sum(self.slot_width(s) for s in self.slots[rank] if s.route == "dp")

    def has(self, route: str) -> bool:
        return any(s.route == route for slots in self.slots for s in slots)

    def column_map(self, rank: int) -> list[int]:
        """Output column of every column of ``cat([received a2a blocks of ranks 0..W-1], rs, dp)``
        on ``rank`` (several entries name the same output column where partial sums are added)."""
        out = []

        def cols_of(slot):
            f, sh = self.features[slot.feature], self.shards[slot.shard]
            return range(f.col + sh.cols[0], f.col + sh.cols[1])

        for d in range(self.world_size):
            for s in self.slots[d]:
                if s.route == "a2a":
                    out.extend(cols_of(s))
        for s in self.slots[0] if self.slots else ():
            if s.route == "rs":
                out.extend(cols_of(s))
        for s in self.slots[rank]:
            if s.route == "dp":
                out.extend(cols_of(s))
        return out

    def mean_after_sum(self) -> list[int]:
        """Features whose ``mean`` is taken at the source (row-wise types)."""
        kinds = {t: self.plan[self.tables[t].name].sharding_type for t in range(len(self.tables))}
        return [
            i
            for i, f in enumerate(self.features)
            if f.pooling == "mean" and kinds[f.table] in (ROW_WISE, TABLE_ROW_WISE)
        ]

    def table_shards(self, table: int) -> list[int]:
        return [i for i, s in enumerate(self.shards) if s.table == table]


def _pooling(t) -> str:
    p = getattr(t, "pooling", "sum")
    name = getattr(p, "name", p)  # an enum (TorchRec's PoolingType) or a string
    name = str(name).lower()
    if name not in ("sum", "mean"):
        raise ValueError(f"table {t.name!r}: pooling must be 'sum' or 'mean', got {p!r}")
    return name


def check_tables(tables) -> None:
    names, feats = set(), set()
    if not tables:
        raise ValueError("tables must be a non-empty list of EmbeddingBagConfig")
    for t in tables:
        for attr in ("name", "num_embeddings", "embedding_dim", "feature_names"):
            if not hasattr(t, attr):
                raise TypeError(f"tables entries need .{attr} (an EmbeddingBagConfig), got {type(t).__name__}")
        if t.name in names:
            raise ValueError(f"table name {t.name!r} appears twice")
        names.add(t.name)
        if int(t.num_embeddings) < 1 or int(t.embedding_dim) < 1:
            raise ValueError(f"table {t.name!r}: num_embeddings and embedding_dim must be >= 1")
        if not t.feature_names:
            raise ValueError(f"table {t.name!r} has no feature_names")
        dtype = str(getattr(t, "data_type", "fp32")).lower()
        if dtype not in ("fp32", "float32", "torch.float32", "datatype.fp32"):
            raise ValueError(f"table {t.name!r}: sharded tables are fp32, got data_type {t.data_type!r}")
        for f in t.feature_names:
            if f in feats:
                raise ValueError(f"feature {f!r} is read by two tables")
            feats.add(f)


def build_layout(tables, plan, world_size: int) -> Layout:
    """The :class:`Layout` of ``tables`` under ``plan`` on ``world_size`` ranks (identical on every rank)."""
    check_tables(tables)
    missing = [t.name for t in tables if t.name not in plan]
    if missing:
        raise ValueError(f"plan has no entry for table {missing[0]!r}")
    extra = sorted(set(plan) - {t.name for t in tables})
    if extra:
        raise ValueError(f"plan names table {extra[0]!r}, which is not in tables")
    features, col = [], 0
    for ti, t in enumerate(tables):
        for f in t.feature_names:
            features.append(Feature(f, ti, int(t.embedding_dim), col, _pooling(t)))
            col += int(t.embedding_dim)
    shards: list[Shard] = []
    calls: list[BucketCall] = []
    call_of: dict[tuple, int] = {}
    table_call: dict[int, int] = {}
    for ti, t in enumerate(tables):
        ps: ParameterSharding = plan[t.name]
        if not isinstance(ps, ParameterSharding):
            raise TypeError(f"plan[{t.name!r}] must be a ParameterSharding, got {type(ps).__name__}")
        ranks = ps.resolved_ranks(world_size, t.name)
        R, D = int(t.num_embeddings), int(t.embedding_dim)
        kind = ps.sharding_type
        if kind == TABLE_WISE:
            shards.append(Shard(ti, ranks[0], (0, R), (0, D), kind))
        elif kind == COLUMN_WISE:
            for r, cols in zip(ranks, column_blocks(D, len(ranks))):
                shards.append(Shard(ti, r, (0, R), cols, kind))
        elif kind in (ROW_WISE, TABLE_ROW_WISE):
            key = (kind, ranks)
            if key not in call_of:
                call_of[key] = len(calls)
                calls.append(BucketCall((), ranks, ()))
            table_call[ti] = call_of[key]
            for j, (r, rows) in enumerate(zip(ranks, row_blocks(R, len(ranks)))):
                shards.append(Shard(ti, r, rows, (0, D), kind, bucket=j))
        elif kind == DATA_PARALLEL:
            for r in ranks:
                shards.append(Shard(ti, r, (0, R), (0, D), kind))
    for ci, call in enumerate(calls):  # features of each bucket call, in output order
        fs = tuple(i for i, f in enumerate(features) if table_call.get(f.table) == ci)
        bs = tuple(block_size(tables[features[i].table].num_embeddings, len(call.ranks)) for i in fs)
        calls[ci] = BucketCall(fs, call.ranks, bs)
    slots = []
    for rank in range(world_size):
        by_group = {g: [] for g in GROUPS}
        rs = []
        for si, sh in enumerate(shards):
            if sh.rank != rank:
                continue
            for fi, f in enumerate(features):
                if f.table != sh.table:
                    continue
                if sh.kind == DATA_PARALLEL:
                    by_group["dp_" + f.pooling].append(Slot(si, fi, "dp_" + f.pooling, "dp"))
                elif sh.kind == ROW_WISE:
                    rs.append(Slot(si, fi, "sum", "rs", table_call[sh.table]))
                elif sh.kind == TABLE_ROW_WISE:
                    by_group["sum"].append(Slot(si, fi, "sum", "a2a", table_call[sh.table]))
                else:
                    by_group[f.pooling].append(Slot(si, fi, f.pooling, "a2a"))
        by_group["sum"].extend(rs)  # shards are in table order, so rs slots are too
        slots.append([s for g in GROUPS for s in by_group[g]])
    return Layout(world_size, list(tables), dict(plan), features, shards, slots, calls, col)
