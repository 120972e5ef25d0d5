"""Bounds checking of TBE ``indices`` / ``offsets`` (``docs/families/tbe.md``, bounds checking).

One place for the rule, shared by every TBE op (training and quantized
lookup) and every backend. Works on NumPy and CuPy arrays alike (``xp`` is
the array's module); never modifies its inputs: a repair returns a copy.

Modes: ``fatal`` (bad offsets -> ``ValueError``, bad index -> ``IndexError``),
``warning`` (repair a copy, one ``RuntimeWarning`` per call), ``ignore``
(repair a copy silently), ``none`` (same outcome as ``fatal``).

Device (CuPy) lookups, where raising or warning needs a device-to-host read
(``docs/families/tbe.md``, bounds checking on a GPU):

* ``fatal``: one read (:func:`all_valid`); only rejected lookups take the exact
  feature-by-feature path that names the culprit.
* ``warning``: :func:`repair_on_device` repairs a copy with whole-array operations
  and adds the number of repaired offsets and indices to a per-device int64 counter
  (:func:`device_warning_count`); nothing is read back and no ``RuntimeWarning``
  is emitted.
* ``ignore``: the same repair, not counted.
* ``none``: nothing is checked and nothing is read; the cuda kernels clamp every bag
  into ``[0, N]`` and skip every id outside its table, so bad lookups never make them
  read or write out of bounds (their results are then unspecified).

In the device repair modes a ``-1`` in the training ops is repaired like any bad
index (it reads row 0 and is counted) instead of raising, which would need a read.
Repair: offsets are clamped into ``[0, N]`` and made non-decreasing with the
last one set to ``N`` (fbgemm's sequential algorithm, which equals a running
maximum of the clamped offsets); an index outside ``[0, E_t)`` other than
``-1`` reads row 0. ``-1`` (fbgemm's pruned row) is left alone by the repair;
``pruned_ok=False`` (training ops) rejects it with ``IndexError`` in every mode.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from . import _validate
from ._backend import is_cupy
from ._validate import choice, to_host, xp_of

MODES = ("fatal", "warning", "ignore", "none")


_MODE_NAMES = {m: m for m in MODES}  # the lower-case names as given: no case folding per call


def bounds_mode(value) -> str:
    """Normalise ``bounds_check_mode``: a name (any case) or fbgemm's ``BoundsCheckMode`` int 0..3."""
    if type(value) is str:
        found = _MODE_NAMES.get(value)
        if found is not None:
            return found
    return MODES[choice("bounds_check_mode", value, {m: i for i, m in enumerate(MODES)})]


def rows_per_feature(hash_size_cumsum: np.ndarray) -> np.ndarray:
    """``E_t`` of every feature (host int64 ``[T]``): next strictly larger ``hash_size_cumsum``
    entry minus this one (features sharing a table have equal entries)."""
    h = np.asarray(hash_size_cumsum, dtype=np.int64)
    T = h.shape[0] - 1
    rows = np.empty(T, dtype=np.int64)
    nxt = h[T]
    for t in range(T - 1, -1, -1):
        if h[t + 1] > h[t]:
            nxt = h[t + 1]
        rows[t] = nxt - h[t]
    return rows


@functools.cache
def _load_checks():
    from . import _tbe_bounds_numba

    return _tbe_bounds_numba


def compiled_checks():
    """The compiled checks of these rules (``_tbe_bounds_numba.py``, loaded on first use), or None
    where the shared compiled checks are not (Numba missing, or ``_validate.compiled`` stubbed).
    Their ``tbe_lookups_ok`` is :func:`check`'s verdict on host lookups, for a caller that has
    already tested what :func:`check` tests before it (array types, shapes, dtypes)."""
    return _load_checks() if _validate.compiled() is not None else None


_checks = compiled_checks


def check_offsets(offsets, n_indices: int, mode: str):
    """``(offsets, repaired)``: ``offsets`` itself when valid; a repaired copy in the repair
    modes; ``ValueError`` naming the position and value in ``fatal``/``none``."""
    N = n_indices
    fast = _validate._fast(offsets)
    if fast is not None:  # one compiled pass; valid iff offsets[0] >= 0, non-decreasing, offsets[-1] == N
        first, drop_at, last = fast.offsets_summary(offsets)
        if first >= 0 and drop_at == 0 and last == N:
            return offsets, False
    xp = xp_of(offsets)
    last = int(offsets[-1])
    bad_range = (offsets < 0) | (offsets > N)
    drop = offsets[1:] < offsets[:-1]
    if last == N and not bool(bad_range.any()) and not bool(drop.any()):
        return offsets, False
    if mode in ("fatal", "none"):
        if last != N:
            raise ValueError(f"offsets[-1] must equal len(indices) = {N}, got offsets[{offsets.shape[0] - 1}] = {last}")
        if bool(bad_range.any()):
            k = int(xp.argmax(bad_range))
            raise ValueError(f"offsets[{k}] = {int(offsets[k])} is outside [0, len(indices) = {N}]")
        k = int(xp.argmax(drop)) + 1
        raise ValueError(
            f"offsets must be non-decreasing, but offsets[{k}] = {int(offsets[k])}"
            f" < offsets[{k - 1}] = {int(offsets[k - 1])}"
        )
    fixed = xp.clip(offsets.astype(xp.int64), 0, N)
    fixed[-1] = N
    fixed = xp.maximum.accumulate(fixed) if xp is np else _running_max(xp, fixed)
    return fixed.astype(offsets.dtype), True


def _running_max(xp, a):
    import cupy  # noqa: F401 - CuPy has no ufunc.accumulate for maximum

    return xp.asarray(np.maximum.accumulate(to_host(a)))


def check_indices(indices, offsets, B: int, rows: np.ndarray, mode: str, *, pruned_ok: bool = False):
    """``(indices, repaired)`` after checking every index inside a bag against its feature's
    row count ``rows[t]``; ``offsets`` must already be valid (see :func:`check_offsets`).

    ``fatal``/``none``: ``IndexError`` naming position, feature, bag, value and row count.
    Repair modes: a copy with bad indices replaced by 0. ``-1`` is an ``IndexError`` in every
    mode unless ``pruned_ok``.
    """
    fits = indices.ndim == 1 and offsets.ndim == 1 and offsets.shape[0] > rows.shape[0] * B
    host = _validate._fast(indices) is not None and _validate._fast(offsets) is not None
    checks = _checks() if fits and host else None
    if checks is not None:  # one compiled pass over every bag
        if checks.first_bad_feature(indices, offsets, B, np.ascontiguousarray(rows, dtype=np.int64)) < 0:
            return indices, False
    xp = xp_of(indices)
    T = rows.shape[0]
    fixed = None
    for t in range(T):
        a, b = int(offsets[t * B]), int(offsets[(t + 1) * B])
        if a == b:
            continue
        seg = indices[a:b]
        E = int(rows[t])
        unsigned = seg.view(np.uint32 if seg.dtype == np.int32 else np.uint64)
        if not bool((unsigned >= E).any()):  # one pass: negatives are huge as unsigned
            continue
        bad = (seg < 0) | (seg >= E)
        if pruned_ok:
            bad &= seg != -1
        else:
            pruned = seg == -1
            if bool(pruned.any()):
                _raise(indices, offsets, B, t, a + int(xp.argmax(pruned)), E, every_mode=True)
        if not bool(bad.any()):
            continue
        if mode in ("fatal", "none"):
            _raise(indices, offsets, B, t, a + int(xp.argmax(bad)), E)
        if fixed is None:
            fixed = indices.copy()
        fixed[a:b][bad] = 0
    return (indices, False) if fixed is None else (fixed, True)


def _raise(indices, offsets, B, t, p, E, every_mode=False):
    lo = offsets[t * B : (t + 1) * B + 1]
    bag = int(np.searchsorted(to_host(lo), p, side="right")) - 1
    what = "-1 (a pruned row) is not valid in training ops in any bounds_check_mode" if every_mode else "out of range"
    raise IndexError(
        f"indices[{p}] = {int(indices[p])} in the bag of feature {t}, sample {bag} is {what}: "
        f"the feature's table has {E} rows"
    )


def _bad_ids(xp, indices, offsets, B: int, rows: np.ndarray, pruned_ok: bool):
    """bool ``[N]``: positions inside a bag of feature ``t`` (int64 ``offsets``, valid) whose id is
    outside ``[0, rows[t])`` as unsigned (so negatives are too), ``-1`` excepted when ``pruned_ok``;
    whole-array operations of ``xp``, nothing read back."""
    T = rows.shape[0]
    t = xp.searchsorted(offsets[::B], xp.arange(indices.shape[0]), side="right") - 1  # feature of each position
    inside = (t >= 0) & (t < T)
    E = xp.asarray(rows, dtype=xp.uint64)[xp.clip(t, 0, T - 1)]
    unsigned = indices.view(xp.uint32 if indices.dtype == xp.int32 else xp.uint64).astype(xp.uint64)
    bad = inside & (unsigned >= E)
    if pruned_ok:
        bad &= indices != -1
    return bad


def all_valid(indices, offsets, B: int, rows: np.ndarray, *, pruned_ok: bool = False) -> bool:
    """Whether :func:`check_offsets` and :func:`check_indices` would accept the lookups as they
    are (no error, no repair), computed with whole-array operations of the arrays' module and
    read back once: the device path of :func:`check`, one host read per call instead of one per
    feature. The rules are the checks' own: offsets in ``[0, N]``, non-decreasing, the last
    ``N``; every index inside a bag of feature ``t`` in ``[0, rows[t])`` as unsigned (so
    negatives fail), ``-1`` allowed only when ``pruned_ok``."""
    xp = xp_of(indices)
    N = int(indices.shape[0])
    o = offsets.astype(xp.int64)
    ok = (o[-1] == N) & ~((o < 0) | (o > N)).any()
    if o.shape[0] > 1:
        ok &= ~(o[1:] < o[:-1]).any()
    if B > 0 and N > 0:
        bad = _bad_ids(xp, indices, o, B, rows, pruned_ok)
        ok &= ~bad.any()
    return bool(to_host(ok))


def repair_on_device(indices, offsets, B: int, rows: np.ndarray, *, pruned_ok: bool = False, running_max=None):
    """``(indices, offsets, n_repaired)``: copies repaired by the bounds rule of ``docs/families/tbe.md`` (the result of
    :func:`check_offsets` then :func:`check_indices` in a repair mode) with whole-array operations
    of the arrays' module, and the number of offsets and indices it changed as a 0-d int64 array
    of that module; nothing is read back. ``running_max`` is the module's inclusive running
    maximum of an int64 array (NumPy's ``maximum.accumulate`` by default). Unlike the checks,
    a ``-1`` with ``pruned_ok=False`` is repaired (replaced by 0) instead of raising."""
    xp = xp_of(indices)
    if running_max is None:
        running_max = np.maximum.accumulate
    N = int(indices.shape[0])
    o = offsets.astype(xp.int64)
    c = xp.clip(o, 0, N)
    c[-1] = N
    fixed_o = running_max(c)
    n = (fixed_o != o).sum(dtype=xp.int64)
    fixed_i = indices.copy()
    if B > 0 and N > 0:  # (a mask-free where: CuPy's boolean-mask assignment may synchronise)
        bad = _bad_ids(xp, indices, fixed_o, B, rows, pruned_ok)
        fixed_i = xp.where(bad, 0, indices).astype(indices.dtype, copy=False)
        n = n + bad.sum(dtype=xp.int64)
    return fixed_i, fixed_o.astype(offsets.dtype), n


_DEVICE_WARNINGS: dict = {}


def device_warning_count():
    """The int64 ``[1]`` device array (CuPy, current device) counting the offsets and indices that
    ``bounds_check_mode="warning"`` repaired on device lookups since the process started (fbgemm's
    ``bounds_check_warning`` counter). Reading it is the caller's choice (``int(count[0])`` waits for
    the device); set it to 0 to restart the count."""
    import cupy

    dev = cupy.cuda.Device().id
    count = _DEVICE_WARNINGS.get(dev)
    if count is None:
        count = _DEVICE_WARNINGS[dev] = cupy.zeros(1, np.int64)
    return count


def check(indices, offsets, B: int, rows: np.ndarray, mode: str, *, pruned_ok: bool = False):
    """Both checks; returns the (possibly repaired) ``(indices, offsets)``. Emits one
    ``RuntimeWarning`` per call in ``warning`` mode when anything was repaired. Device (CuPy)
    lookups read nothing back in ``warning``, ``ignore`` and ``none`` (see the module docstring);
    in ``fatal`` they are first checked by :func:`all_valid` (one host read), and only lookups it
    rejects take the feature-by-feature path that names the culprit."""
    if (
        type(indices) is np.ndarray
        and type(offsets) is np.ndarray
        and indices.ndim == 1
        and offsets.ndim == 1
        and offsets.shape[0] == rows.shape[0] * B + 1
        and indices.dtype in _validate.INDEX_DTYPES
        and offsets.dtype in _validate.INDEX_DTYPES
    ):  # the per-call case: one compiled verdict of both checks; anything it rejects takes them below
        checks = _checks()
        if checks is not None and checks.tbe_lookups_ok(
            indices, offsets, B, np.ascontiguousarray(rows, dtype=np.int64), pruned_ok
        ):
            return indices, offsets
    if is_cupy(indices):
        if mode == "none":
            return indices, offsets
        if mode in ("warning", "ignore"):
            from .cuda._common import running_max

            indices, offsets, n = repair_on_device(
                indices, offsets, B, rows, pruned_ok=pruned_ok, running_max=running_max
            )
            if mode == "warning":
                count = device_warning_count()
                count += n
            return indices, offsets
        if all_valid(indices, offsets, B, rows, pruned_ok=pruned_ok):
            return indices, offsets
    offsets, fixed_offsets = check_offsets(offsets, int(indices.shape[0]), mode)
    indices, fixed_indices = check_indices(indices, offsets, B, rows, mode, pruned_ok=pruned_ok)
    warn_if_repaired(mode, fixed_offsets, fixed_indices)
    return indices, offsets


def warn_if_repaired(mode: str, offsets_repaired: bool, indices_repaired: bool) -> None:
    """The single ``RuntimeWarning`` of ``warning`` mode (for callers that run the two checks apart)."""
    if mode == "warning" and (offsets_repaired or indices_repaired):
        what = " and ".join(w for w, f in (("offsets", offsets_repaired), ("indices", indices_repaired)) if f)
        warnings.warn(
            f"TBE bounds check repaired out-of-range {what} (bad indices read row 0)", RuntimeWarning, stacklevel=3
        )
