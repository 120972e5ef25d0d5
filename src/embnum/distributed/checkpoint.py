"""Checkpoint files of a :class:`~embnum.distributed.ShardedEmbeddingBagCollection`: one per rank,
written without communication, read back under any plan and world size, damage detected.

A file ``rank{r}-of-{W}.pt`` holds plain containers only (dicts, lists, ints, tensors), so
``torch.load(path, weights_only=True)`` reads it::

    {"format": FORMAT, "rank": r, "world_size": W,
     "state": {key: {"shape": [...], "pieces": [{"rows": [r0, r1], "cols": [c0, c1],
                                                  "data": tensor, "crc32": int}, ...]}
               or {"value": tensor, "crc32": int}},          # the step counters
     "manifest": [[key, rank, [r0, r1], [c0, c1]], ...]}    # every rank's pieces

``crc32`` is ``zlib.crc32`` of the tensor's bytes, so a piece damaged on disk is found; the
manifest (the same in every file) says which table pieces a missing or unreadable file held,
so the error names them. :func:`load` gathers every rank's file, checks them, and loads the
pieces that intersect this rank's shards; with ``strict=False`` it returns (and warns about)
the rows that no file restored.
"""

from __future__ import annotations

import os
import re
import warnings
import zlib

import torch

from .embeddingbag import LoadReport, TableShards

FORMAT = "embnum.sharded-ebc/1"
_NAME = re.compile(r"rank(\d+)-of-(\d+)\.pt$")


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def save(model, directory) -> str:
    """Write this rank's pieces of ``model`` to ``directory/rank{r}-of-{W}.pt`` (no collective;
    the file is written under another name and renamed, so a crash never leaves half a file
    under the final name). Returns the path."""
    os.makedirs(directory, exist_ok=True)
    state = {}
    for key, v in model.state_dict(gather=False).items():
        if isinstance(v, TableShards):
            pieces = [
                {"rows": list(r), "cols": list(c), "data": t.detach().cpu(), "crc32": _crc(t)} for r, c, t in v.pieces
            ]
            state[key] = {"shape": list(v.shape), "pieces": pieces}
        else:
            state[key] = {"value": v.detach().cpu(), "crc32": _crc(v)}
    payload = {
        "format": FORMAT,
        "rank": model.rank,
        "world_size": model.world_size,
        "state": state,
        "manifest": [[k, r, list(rows), list(cols)] for k, r, rows, cols in model.manifest()],
    }
    path = os.path.join(os.fspath(directory), f"rank{model.rank}-of-{model.world_size}.pt")
    torch.save(payload, path + ".partial")
    os.replace(path + ".partial", path)
    return path


def _tables_of(manifest, rank) -> str:
    keys = sorted({k for k, r, _, _ in manifest if r == rank and not k.endswith(".step")})
    return ", ".join(keys) if keys else "no table pieces"


def _read(path, manifest_hint):
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to read is the same verdict: the file is damaged
        held = f" (it holds {manifest_hint})" if manifest_hint else ""
        raise ValueError(f"{path}: unreadable ({type(e).__name__}: {e}); truncated or damaged{held}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not an embnum sharded checkpoint (format {FORMAT!r})")
    for key, entry in payload["state"].items():
        if "value" in entry:
            if _crc(entry["value"]) != entry["crc32"]:
                raise ValueError(f"{path}: {key} does not match its checksum: the file is damaged")
            continue
        for p in entry["pieces"]:
            if _crc(p["data"]) != p["crc32"]:
                raise ValueError(
                    f"{path}: {key} rows [{p['rows'][0]}, {p['rows'][1]}) cols [{p['cols'][0]}, {p['cols'][1]}) "
                    "does not match its checksum: the file is damaged"
                )
    return payload


def load(model, directory, strict: bool = True) -> LoadReport:
    """Load the checkpoint in ``directory`` (written by :func:`save` on any number of ranks, under
    any plan) into ``model``'s shards on this rank.

    Errors (``ValueError`` / ``FileNotFoundError``) name the file and the tables: no files; files
    of several world sizes; a missing rank's file (``strict``); an unreadable (truncated) file; a
    piece whose checksum does not match. ``strict=False`` loads what the readable files hold and
    returns a :class:`LoadReport` whose ``unrestored`` maps each state to the row ranges of this
    rank that kept their previous values (also a ``UserWarning``)."""
    directory = os.fspath(directory)
    found = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        m = _NAME.match(name)
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = os.path.join(directory, name)
    if not found:
        raise FileNotFoundError(f"{directory}: no checkpoint files (rank<r>-of-<W>.pt)")
    if len(found) > 1:
        raise ValueError(
            f"{directory}: files of several world sizes {sorted(found)}; keep one checkpoint per directory"
        )
    ((world, files),) = found.items()
    payloads, manifest, problems = {}, None, []
    for r in range(world):
        path = os.path.join(directory, f"rank{r}-of-{world}.pt")
        if r not in files:
            problems.append((r, path, FileNotFoundError, "missing"))
            continue
        try:
            payloads[r] = _read(path, None if manifest is None else _tables_of(manifest, r))
            manifest = manifest or payloads[r]["manifest"]
        except ValueError as e:
            problems.append((r, path, type(e), str(e)))
    for r, path, kind, text in problems:
        held = _tables_of(manifest, r) if manifest is not None else "unknown pieces (no readable file)"
        if text == "missing":
            text = f"{path}: missing (the checkpoint was written by {world} ranks; it holds {held})"
        elif "(it holds" not in text:
            text += f" (it holds {held})"
        if strict or not payloads:
            raise kind(text)
        warnings.warn(f"strict=False: skipping {text}", stacklevel=2)
    state: dict = {}
    for payload in payloads.values():
        for key, entry in payload["state"].items():
            if "value" in entry:
                state.setdefault(key, entry["value"])
                continue
            pieces = [(tuple(p["rows"]), tuple(p["cols"]), p["data"]) for p in entry["pieces"]]
            if key in state:
                state[key].pieces.extend(pieces)
            else:
                state[key] = TableShards(tuple(entry["shape"]), pieces)
    return model.load_state_dict(state, strict=strict)


# -- torch.distributed.checkpoint ---------------------------------------------------------------
def dcp_state_dict(model) -> dict:
    """``model``'s state for :mod:`torch.distributed.checkpoint`, under the EBC's names, without
    copies: each sharded table or state a ``ShardedTensor`` over this rank's pieces (views of the
    shards; a collective: every rank calls it), each replicated one and the step counter a plain
    tensor (saved once, loaded on every rank). ``dcp.load`` writes into these views in place."""
    from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards

    from .plan import DATA_PARALLEL

    lay, out = model.layout, {}
    for ti, t in enumerate(lay.tables):
        for name in model._state_names():
            shape = model._state_shape(t, name)
            key = model._key(t.name, name)
            mine = [si for si in lay.table_shards(ti) if si in model._where]
            if model.plan[t.name].sharding_type == DATA_PARALLEL:
                out[key] = model._views(mine[0])[name].reshape(shape)
                continue
            shards = []
            for si in mine:
                sh = lay.shards[si]
                if sh.nrows == 0:
                    continue
                v = model._views(si)[name]
                if len(shape) == 1:
                    v, offsets, sizes = v.reshape(-1), [sh.rows[0]], [sh.nrows]
                else:
                    offsets, sizes = [sh.rows[0], sh.cols[0]], [sh.nrows, sh.width]
                place = f"rank:{torch.distributed.get_rank()}/{v.device}"  # the global rank
                shards.append(Shard(v, ShardMetadata(offsets, sizes, place)))
            out[key] = init_from_local_shards(shards, *shape, process_group=model.group)
    out["step"] = torch.tensor(max((tbe.step for tbe in model.tbes.values()), default=0), dtype=torch.int64)
    return out


def dcp_save(model, path) -> None:
    """``torch.distributed.checkpoint.save`` of :func:`dcp_state_dict` (every rank calls it; each
    writes only its own pieces)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(dcp_state_dict(model), checkpoint_id=os.fspath(path), process_group=model.group)


def dcp_load(model, path) -> None:
    """``torch.distributed.checkpoint.load`` into ``model``'s shards in place (written on any
    number of ranks under any plan; every rank calls it), then the step counter."""
    import torch.distributed.checkpoint as dcp

    state = dcp_state_dict(model)
    dcp.load(state, checkpoint_id=os.fspath(path), process_group=model.group)
    for tbe in model.tbes.values():
        tbe.step = int(state["step"])
