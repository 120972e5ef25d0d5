"""Agreement between ranks: the module's settings once at construction, each batch's verdict per step.

Both follow one pattern: every rank all-gathers a few int64 numbers (a digest of its settings,
or its batch size and whether its batch is valid); when they agree nothing else moves. When
they do not, a second exchange (``all_gather_object``, on the error path only) gathers the
details, and every rank raises the same error built from them, before any data is exchanged:

* :func:`check_settings`: ``describe(...)`` lists ``(label, text)`` entries (each table, its
  plan, the optimizer, the codecs, ...); a difference is a ``ValueError`` naming the first
  differing entry and which ranks hold which value; a rank that could not build its module
  makes every other rank raise a ``ValueError`` naming it.
* :func:`gather_batch_sizes`: the batch sizes (the forward needs them anyway) with each rank's
  verdict on its own batch; a bad batch on any rank is the same exception type and message
  on every rank (naming the rank), and the process group stays usable.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

_TYPES = {"ValueError": ValueError, "IndexError": IndexError, "TypeError": TypeError}


def _all_gather(out, mine, group):
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, mine, group=group)


def _digest(entries) -> int:
    h = hashlib.blake2b(digest_size=8)
    for label, text in entries:
        h.update(f"{label}\0{text}\0".encode())
    return int.from_bytes(h.digest(), "little", signed=True)


def describe(tables, plan, world_size, optimizer, codecs, **settings) -> list[tuple[str, str]]:
    """The entries every rank must agree on, in order: the table names, then per table its
    configuration and its plan (ranks resolved), then the optimizer, the codecs and ``settings``."""
    out = [("table names", repr([t.name for t in tables]))]
    for t in tables:
        init = t.init_range() if callable(getattr(t, "init_range", None)) else None
        pooling = getattr(getattr(t, "pooling", "sum"), "name", getattr(t, "pooling", "sum"))
        out.append(
            (
                f"table {t.name!r}",
                f"num_embeddings={int(t.num_embeddings)}, embedding_dim={int(t.embedding_dim)}, "
                f"feature_names={list(t.feature_names)}, pooling={str(pooling).lower()}, init_range={init}",
            )
        )
        ps = plan[t.name]
        out.append(
            (f"plan of table {t.name!r}", f"{ps.sharding_type} on ranks {ps.resolved_ranks(world_size, t.name)}")
        )
    out.append(("optimizer", repr(optimizer)))
    out.append(("qcomm codecs (forward, backward)", repr(tuple(codecs))))
    out.extend((name, repr(value)) for name, value in settings.items())
    return out


def _ranks(ranks) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def first_difference(per_rank) -> str | None:
    """``per_rank[r]``: rank ``r``'s entries. The first label whose text differs (or is missing
    on some rank), with each distinct value and the ranks holding it; ``None`` when all agree."""
    labels = list(dict.fromkeys(label for entries in per_rank for label, _ in entries))
    maps = [dict(entries) for entries in per_rank]
    for label in labels:
        values = [m.get(label) for m in maps]
        if len(set(values)) == 1:
            continue
        groups: dict = {}
        for r, v in enumerate(values):
            groups.setdefault(v, []).append(r)
        parts = [f"{_ranks(rs)}: {'(absent)' if v is None else v}" for v, rs in groups.items()]
        return f"{label} differs between ranks: " + "; ".join(parts)
    return None


def check_settings(entries, error: BaseException | None, group=None, device=None) -> None:
    """Compare ``entries`` (:func:`describe`) across the ranks of ``group`` in one all-gather of
    two int64 per rank. ``error``: the exception this rank met building its module (it is
    re-raised here, after the peers have been told). Raises ``ValueError`` on every other rank
    when a rank failed or the entries differ; returns ``None`` when every rank agrees."""
    world = dist.get_world_size(group)
    mine = torch.tensor([int(error is not None), 0 if error is not None else _digest(entries)], device=device)
    every = torch.empty(2 * world, dtype=torch.int64, device=device)
    _all_gather(every, mine, group)
    flags, digests = every.reshape(world, 2).T.tolist()
    if not any(flags) and len(set(digests)) == 1:
        return
    detail = f"{type(error).__name__}: {error}" if error is not None else list(entries)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, detail, group=group)
    if error is not None:
        raise error
    failed = [r for r in range(world) if flags[r]]
    if failed:
        raise ValueError(f"{_ranks(failed)} could not build ShardedEmbeddingBagCollection: {gathered[failed[0]]}")
    diff = first_difference(gathered)
    raise ValueError(f"the ranks were given different settings: {diff}")


def gather_batch_sizes(batch_size: int, error: BaseException | None, group=None, device=None):
    """``(sizes, verdict)``: every rank's batch size, in rank order, from one all-gather that also
    carries each rank's verdict on its own batch (``error``: the exception its validation raised,
    else ``None``). ``verdict`` is ``None`` when every batch is valid, else the same exception on
    every rank for the caller to raise (the type the lowest bad rank met, ``ValueError`` for any
    other type; its message names the rank, and any other bad rank is listed; its ``__cause__``:
    that rank's error's cause, the op's own message, where it had one). Nothing else has moved,
    so the group stays usable."""
    world = dist.get_world_size(group)
    mine = torch.tensor([int(batch_size), int(error is not None)], dtype=torch.int64, device=device)
    every = torch.empty(2 * world, dtype=torch.int64, device=device)
    _all_gather(every, mine, group)
    sizes, flags = every.reshape(world, 2).T.tolist()
    if not any(flags):
        return [int(b) for b in sizes], None
    detail = None if error is None else (_described(error), _described(error.__cause__))
    gathered: list = [None] * world
    dist.all_gather_object(gathered, detail, group=group)
    bad = [r for r in range(world) if flags[r]]
    (kind, text), cause = gathered[bad[0]]
    if len(bad) > 1:
        text += "; also bad: " + "; ".join(gathered[r][0][1] for r in bad[1:])
    verdict = _TYPES.get(kind, ValueError)(f"bad batch on {_ranks(bad)}: {text}")
    if cause is not None:  # the op's own error: the bad rank's own object (its traceback), the peers' a copy
        mine = error is not None and bad[0] == dist.get_rank(group)
        verdict.__cause__ = error.__cause__ if mine else _TYPES.get(cause[0], ValueError)(cause[1])
    return [int(b) for b in sizes], verdict


def _described(error):
    """``(type name, message)`` of ``error`` (``None`` stays ``None``): what crosses to the peers."""
    return None if error is None else (type(error).__name__, str(error))
