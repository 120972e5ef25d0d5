"""Variable batch per feature (VBE) for the TBE ops (``docs/families/tbe.md``, variable batch per feature).

TorchRec's VBE gives each feature ``t`` its own batch size on each rank ``r``,
``batch_size_per_feature_per_rank[t][r] = B[t, r]``. The lookups stay feature-major:
feature ``t`` has ``B_t = sum_r B[t, r]`` bags (rank 0's samples first), so ``offsets`` has
``sum_t B_t + 1`` entries. The pooled output is flat and rank-major: for each rank ``r``, for
each feature ``t``, a ``B[t, r] x D_t`` block (fbgemm_gpu's layout).

The TBE ops run VBE on their fixed-batch kernels: the declaration pads every feature to
``B_max = max_t B_t`` bags with empty bags (:func:`pad_offsets`), the kernels pool the padded
bags into a ``[B_max, total_D]`` scratch, and each backend moves rows between the scratch and
the flat output with the map below (forward: gather; backward: scatter of the gradient; each
element moved once, no atomics). Shared by every backend; NumPy only.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ._backend import is_array, to_host
from ._cache import BoundedCache

NAME = "batch_size_per_feature_per_rank"


class VBELayout(NamedTuple):
    """The VBE map of one call (host int64 arrays; ``T`` features, ``R`` ranks).

    batch ``[T, R]``: the batch sizes; B_offsets ``[T+1]``: feature ``t``'s first bag in
    ``offsets``; rank_offsets ``[T, R+1]``: rank ``r``'s first sample within feature ``t``;
    output_offsets ``[R*T+1]``: where block ``(r, t)`` (at ``r*T + t``) starts in the flat output;
    dims ``[T]``; B_max: the most bags of any feature; output_size: the flat output's length."""

    batch: np.ndarray
    B_offsets: np.ndarray
    rank_offsets: np.ndarray
    output_offsets: np.ndarray
    dims: np.ndarray
    B_max: int
    output_size: int

    @property
    def T(self) -> int:
        return self.batch.shape[0]

    @property
    def R(self) -> int:
        return self.batch.shape[1]


def int_rows(value) -> np.ndarray:
    """``batch_size_per_feature_per_rank`` as a 2-D integer array (its shape is checked by
    :func:`vbe_layout`): a list of lists of ints, an integer array (NumPy, CuPy or anything with
    ``__array__``) or the bridge's text form ``"TxR:b00,b01,..."`` (:func:`encode`)."""
    if isinstance(value, str):
        return _decode(value)
    if isinstance(value, np.ndarray):
        a = value
    elif isinstance(value, (list, tuple)) and all(isinstance(row, (list, tuple)) for row in value):
        rows = _list_rows(value)
        a = np.array([x for row in rows for x in row], dtype=np.int64).reshape(len(rows), len(rows[0]) if rows else 0)
    elif isinstance(value, (list, tuple)) and value and all(is_array(row) for row in value):
        if len({row.shape for row in value}) > 1:
            raise ValueError(f"{NAME} must give every feature the same number of ranks, got {value!r}")
        a = np.stack([to_host(row) for row in value])
    elif isinstance(value, (list, tuple)):
        raise TypeError(f"{NAME} must be a [T][R] list of lists of ints (or an int array), got {value!r}")
    elif is_array(value):
        a = to_host(value)
    elif hasattr(value, "__array__"):
        a = np.asarray(value)
    else:
        raise TypeError(f"{NAME} must be a [T][R] list of lists of ints or an int array, got {type(value).__name__}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{NAME} must hold ints, got dtype {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{NAME} must be 2-D [T, R] (features x ranks), got shape {tuple(a.shape)}")
    return a


def _list_rows(value) -> list:
    """A list of lists of ints checked in plain Python (``torch.compile`` traces it)."""
    if any(not isinstance(row, (list, tuple)) for row in value):
        raise TypeError(f"{NAME} must be a [T][R] list of lists of ints (or an int array), got {value!r}")
    lengths = sorted({len(row) for row in value})
    if len(lengths) > 1:
        raise ValueError(f"{NAME} must give every feature the same number of ranks, got lengths {lengths}")
    for row in value:
        for x in row:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{NAME} must hold ints, got {value!r}")
            if not -(2**63) <= int(x) < 2**63:
                raise ValueError(f"{NAME} holds a value outside int64: {value!r}")
    return [[int(x) for x in row] for row in value]


def encode(value) -> str | None:
    """The text form the torch bridge's schema carries (``"TxR:b00,b01,..."``, row-major); checks
    the value as :func:`int_rows` does. None and text pass unchanged."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(row, (list, tuple)) for row in value):
        rows = _list_rows(value)
    else:
        rows = int_rows(value).tolist()
    R = len(rows[0]) if rows else 0
    return f"{len(rows)}x{R}:" + ",".join(str(x) for row in rows for x in row)


def _decode(text: str) -> np.ndarray:
    try:
        shape, _, body = text.partition(":")
        T, R = (int(x) for x in shape.split("x"))
        flat = [int(x) for x in body.split(",")] if body else []
        if len(flat) != T * R or any(not -(2**63) <= x < 2**63 for x in flat):
            raise ValueError
    except ValueError:
        raise ValueError(f"{NAME} text must be 'TxR:b00,b01,...' with T*R int64 entries, got {text!r}") from None
    return np.array(flat, dtype=np.int64).reshape(T, R)


def vbe_layout(value, T: int, n_bags: int, D_offsets: np.ndarray) -> VBELayout:
    """Validate ``batch_size_per_feature_per_rank`` (``[T][R]`` ints >= 0 summing to the
    ``n_bags = len(offsets) - 1`` bags) against the layout's ``D_offsets``; return its map.
    ``TypeError``/``ValueError`` naming the argument otherwise. Sums are exact (Python ints)."""
    a = int_rows(value)
    if a.shape[0] != T or a.shape[1] < 1:
        raise ValueError(f"{NAME} must have shape [T = {T}, R >= 1] (features x ranks), got {tuple(a.shape)}")
    key = (a.dtype, a.shape, a.tobytes(), n_bags, D_offsets.tobytes())
    found = _LAYOUTS.get(key)
    if found is not None:
        return found
    sizes = a.tolist()  # Python ints: no sum below can wrap
    for t, row in enumerate(sizes):
        for r, b in enumerate(row):
            if b < 0:
                raise ValueError(f"{NAME}[{t}][{r}] = {b} must be >= 0")
    per_feature = [sum(row) for row in sizes]
    total = sum(per_feature)
    if total != n_bags:
        raise ValueError(f"{NAME} sums to {total} bags (per feature {per_feature}), but len(offsets) - 1 = {n_bags}")
    dims = np.diff(np.asarray(D_offsets, dtype=np.int64))
    R = a.shape[1]
    out_offsets = [0]
    for r in range(R):
        for t in range(T):
            out_offsets.append(out_offsets[-1] + sizes[t][r] * int(dims[t]))
    batch = np.array(sizes, dtype=np.int64).reshape(T, R)
    rank_offsets = np.zeros((T, R + 1), np.int64)
    np.cumsum(batch, axis=1, out=rank_offsets[:, 1:])
    B_offsets = np.zeros(T + 1, np.int64)
    np.cumsum(per_feature, out=B_offsets[1:])
    found = VBELayout(
        batch,
        B_offsets,
        rank_offsets,
        np.array(out_offsets, dtype=np.int64),
        dims,
        max(per_feature),
        out_offsets[-1],
    )
    for arr in found[:5]:
        arr.flags.writeable = False
    return _LAYOUTS.put(key, found)


_LAYOUTS = BoundedCache(64)  # a training loop passes the same batch sizes every step


def pad_index(vbe: VBELayout) -> np.ndarray:
    """int64 ``[T*B_max + 1]``: entry ``t*B_max + b`` of the padded offsets is ``offsets[pad[...]]``;
    bags ``b >= B_t`` of feature ``t`` are empty (they start and end where feature ``t`` ends)."""
    b = np.arange(vbe.B_max, dtype=np.int64)
    starts = vbe.B_offsets[:-1, None] + np.minimum(b[None, :], np.diff(vbe.B_offsets)[:, None])
    return np.concatenate([starts.ravel(), vbe.B_offsets[-1:]])


def flat_positions(vbe: VBELayout, D_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's form of the map: for every element ``i`` of the flat output, its row and
    column in the padded ``[B_max, total_D]`` result (int64 ``[output_size]`` each)."""
    rows, cols = [], []
    T = vbe.T
    for r in range(vbe.R):
        for t in range(T):
            n, D = int(vbe.batch[t, r]), int(vbe.dims[t])
            b = int(vbe.rank_offsets[t, r]) + np.repeat(np.arange(n, dtype=np.int64), D)
            rows.append(b)
            cols.append(int(D_offsets[t]) + np.tile(np.arange(D, dtype=np.int64), n))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(rows), np.concatenate(cols)


def entry_points(move, xp):
    """``(forward, backward)``: decorators that give a backend's TBE entry points a ``vbe=``
    (a :class:`VBELayout`, or None for a fixed batch). The entry points run on the padded
    ``[B_max, total_D]`` form; ``move(padded, flat, vbe, D_offsets, to_flat)`` is the backend's
    row move between it and the flat rank-major output, ``xp()`` its array module.

    - forward ``(weights, output_dtype, out, vbe=None, **lookup)``: the entry point fills a padded
      scratch, then one move to ``out``;
    - backward ``(grad_output, *args, vbe=None, **kw)``: the flat gradient moved into a zeroed
      padded array first."""

    def forward(entry):
        @functools.wraps(entry)
        def run(weights, output_dtype, out, vbe=None, **lookup):
            if vbe is None:
                return entry(weights, output_dtype, out, **lookup)
            doff = lookup["D_offsets"]
            padded = xp().empty((lookup["B"], int(doff[-1])), out.dtype)
            entry(weights, output_dtype, padded, **lookup)
            move(padded, out, vbe, doff, True)
            return None

        return run

    def backward(entry):
        @functools.wraps(entry)
        def run(grad_output, *args, vbe=None, **kw):
            if vbe is not None:
                doff = kw["D_offsets"]
                padded = xp().zeros((kw["B"], int(doff[-1])), grad_output.dtype)
                move(padded, grad_output, vbe, doff, False)
                grad_output = padded
            return entry(grad_output, *args, **kw)

        return run

    return forward, backward
