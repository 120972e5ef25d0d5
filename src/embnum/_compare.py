"""Oracle comparisons, written once: every op's check (``@check`` in its family's
declarations) is one of these, or one of these with the op's own tolerance.

Each returns ``(max abs error, ok)``; lists and tuples of arrays are compared
pairwise, and a ``None`` slot matches only ``None``.
"""

from __future__ import annotations

import numpy as np


def _pairs(got, want):
    """``[(g, w), ...]`` of host arrays, or None when the structure differs."""
    gots = list(got) if isinstance(got, (list, tuple)) else [got]
    wants = list(want) if isinstance(want, (list, tuple)) else [want]
    if len(gots) != len(wants):
        return None
    pairs = []
    for g, w in zip(gots, wants):
        if g is None or w is None:
            if g is not None or w is not None:
                return None
            continue
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return None
        pairs.append((g, w))
    return pairs


def _max_finite(err) -> float:
    finite = err[np.isfinite(err)]
    return float(finite.max()) if finite.size else 0.0


def same_bits(got, want, args=None, *, ulps: int = 0, any_nan: bool = True, tol=None) -> tuple[float, bool]:
    """Equal bytes; with ``any_nan`` a NaN matches any NaN (payloads of computed NaNs are not
    specified); floats may differ by ``ulps`` units in the last place of ``want``, or by
    ``tol`` (absolute, an array broadcast against ``want`` or a number) where given.

    Elements whose bytes are equal match under every rule and add nothing to the error, so
    :func:`element_verdict` runs only on the others (none: nothing is converted)."""
    pairs = _pairs(got, want)
    if pairs is None:
        return float("inf"), False
    err, ok = 0.0, True
    for g, w in pairs:
        if g.size == 0:
            continue
        t = None if tol is None else np.broadcast_to(tol, w.shape)
        if g.dtype.kind in "fiub":
            differ = differing(g, w)
            if not differ.any():
                continue
            g, w, t = g[differ], w[differ], None if t is None else t[differ]
        e, o = element_verdict(g, w, ulps=ulps, any_nan=any_nan, tol=t)
        err, ok = max(err, e), ok and o
    return err, ok


def element_verdict(g, w, *, ulps: int = 0, any_nan: bool = True, tol=None) -> tuple[float, bool]:
    """:func:`same_bits`' rule on one pair of arrays of one shape and dtype, every element
    converted and compared (``tol`` already of ``w``'s shape, or None)."""
    same = ~differing(g, w) if g.dtype.kind in "fiub" else g == w
    if g.dtype.kind != "f":
        with np.errstate(over="ignore"):
            err = float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max())
        return err, bool(np.all(same))
    with np.errstate(invalid="ignore", over="ignore"):
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        diff = np.abs(g64 - w64)
    if any_nan:
        same = same | (np.isnan(g64) & np.isnan(w64))
    err = _max_finite(np.where(same, 0.0, diff))  # what differs, allowed or not
    if ulps:
        with np.errstate(invalid="ignore", over="ignore"):
            close = (diff <= ulps * np.spacing(np.abs(w)).astype(np.float64)) & np.isfinite(g64)
        same = same | close
    if tol is not None:
        with np.errstate(invalid="ignore"):
            same = same | (g64 == w64) | (diff <= tol)
    return err, bool(np.all(same))


def differing(g, w):
    """Where the bytes of two arrays of one shape and dtype differ (a bool mask of their shape):
    the only elements a tolerance can be needed for."""
    return g.view(f"u{g.itemsize}") != w.view(f"u{w.itemsize}")


def exact_match(got, want, args=None) -> tuple[float, bool]:
    """The default check: bit-identical arrays (same shape, dtype and bytes, NaN payloads too)."""
    return same_bits(got, want, args, any_nan=False)


def within(got, want, tol) -> tuple[float, bool]:
    """Every element within ``tol`` (an array broadcast against ``want``, or a number) of
    ``want``, or equal to it, or both NaN; same shape and dtype."""
    return same_bits(got, want, tol=tol)
