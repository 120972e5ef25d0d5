"""The row-update rule of every fused TBE optimizer (``docs/families/tbe.md``, fused optimizers), written
once in plain Python and compiled by both fast paths (``numba.njit`` in ``embnum.cpu``,
``numba.cuda.jit(device=True)`` in ``embnum.cuda``), as ``embnum._bucketize`` is.

:func:`update_row` updates one touched row from its summed gradient, in float32:

* ``rows[ro : ro + D]``: the row's old values (float32), replaced by the new ones: float32
  weights themselves (``ro`` = the row's element offset), or float16 rows the caller gathered
  as float32 and writes back once (so they are rounded once);
* ``g[go : go + D]``: the row's summed gradient (float32); LAMB overwrites it with its
  update direction (the caller's scratch copy, never user data);
* ``m1``, ``m2``: the state arrays (float32; a length-1 dummy when the kind has none);
  element-wise state of the row starts at ``e`` (its element offset in ``weights``),
  row-wise state sits at ``lid`` (its linear id);
* ``hp``: float32 ``[HP_SLOTS]`` hyper-parameters (``TBEOptimizer.hyper_array``), slots below.

Each target builds the rule with :func:`make_update_row` from its own decorator
(``njit(inline="always")``; ``cuda.jit(device=True)`` compiles it too), which compiles the
helpers first. The cuda backend's fused step does not call it: ``embnum.cuda.tbe._apply_rows``
writes the same formulas in lane-group form (a row's sums are reduced across the lanes of a
warp, which a one-thread-per-row rule cannot express); ``tests/test_tbe.py`` holds both to the
oracle.

Every quantity is float32 and every constant a float32 (so no operation widens to
float64), and both branches of every conditional have one type, as the CUDA compiler needs.
"""

import math

import numpy as np

from ._tbe import (  # the kind and decay codes (plain ints: compile-time constants for Numba)
    ADAGRAD,
    ADAM,
    DECAY_DECOUPLED,
    DECAY_L2,
    LAMB,
    LARS_SGD,
    PARTIAL_ROWWISE_ADAM,
    PARTIAL_ROWWISE_LAMB,
    ROWWISE_ADAGRAD,
    SGD,
)

# hyper-parameter slots
LR, EPS, WD, BETA1, BETA2, BC1, BC2, ETA, MOMENTUM, MAX_NORM = range(10)
HP_SLOTS = 10


def make_update_row(jit):
    """``update_row(kind, decay, rows, ro, g, go, D, m1, m2, e, lid, hp)`` compiled by ``jit``."""

    @jit
    def sum_squares(a, o, D):
        s = np.float32(0.0)
        for d in range(D):
            s += a[o + d] * a[o + d]
        return s

    @jit
    def sqrt(x):
        return np.float32(math.sqrt(x))

    @jit
    def norm(a, o, D):
        """The L2 norm of ``a[o:o+D]`` in float32 (LAMB's and LARS's trust ratios, ``max_norm``), also
        where the sum of squares leaves float32's range (entries above ~1.8e19 or below ~1e-19):
        then of the row scaled by its largest magnitude, so a finite nonzero row has a finite
        nonzero norm, as the oracle's float64 one."""
        s = sum_squares(a, o, D)
        if s > np.float32(1e-30) and s < np.float32(np.inf):
            return sqrt(s)
        big = np.float32(0.0)
        for d in range(D):
            x = abs(a[o + d])
            if x > big:
                big = x
        if big == np.float32(0.0) or big == np.float32(np.inf):
            return big
        t = np.float32(0.0)
        for d in range(D):
            q = a[o + d] / big
            t += q * q
        return big * sqrt(t)

    @jit
    def ratio(num, den):
        """``num / den``, or 0 when ``den == 0`` (fbgemm divides 0 by 0 there: a NaN row)."""
        r = np.float32(0.0)
        if den > np.float32(0.0):
            r = num / den
        return r

    @jit
    def update_row(kind, decay, rows, ro, g, go, D, m1, m2, e, lid, hp):
        """One optimizer step of the row at ``rows[ro:ro+D]`` (gradient ``g[go:go+D]``) (module docstring), then the
        ``max_norm`` clipping when ``hp[MAX_NORM] > 0``."""
        one = np.float32(1.0)
        lr = hp[LR]
        eps = hp[EPS]
        wd = hp[WD]
        b1 = hp[BETA1]
        b2 = hp[BETA2]
        bc1 = hp[BC1]
        bc2 = hp[BC2]
        if kind == SGD:
            for d in range(D):
                rows[ro + d] = rows[ro + d] - lr * g[go + d]
        elif kind == ADAGRAD:
            for d in range(D):
                m = m1[e + d] + g[go + d] * g[go + d]
                m1[e + d] = m
                rows[ro + d] = rows[ro + d] - lr * g[go + d] / (sqrt(m) + eps)
        elif kind == ROWWISE_ADAGRAD:
            s = np.float32(0.0)
            for d in range(D):
                ge = g[go + d]
                if decay == DECAY_L2:
                    ge = ge + wd * rows[ro + d]
                s += ge * ge
            m = m1[lid] + s / np.float32(D)
            m1[lid] = m
            mult = lr / (sqrt(m) + eps)
            corr = one
            if decay == DECAY_L2:
                corr = one - mult * wd
            elif decay == DECAY_DECOUPLED:
                corr = one - lr * wd
            for d in range(D):
                rows[ro + d] = corr * rows[ro + d] - mult * g[go + d]
        elif kind == ADAM:
            for d in range(D):
                gd = g[go + d]
                m = b1 * m1[e + d] + (one - b1) * gd
                v = b2 * m2[e + d] + (one - b2) * gd * gd
                m1[e + d] = m
                m2[e + d] = v
                x = rows[ro + d]
                rows[ro + d] = x - lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * x)
        elif kind == PARTIAL_ROWWISE_ADAM:
            v = b2 * m2[lid] + (one - b2) * (sum_squares(g, go, D) / np.float32(D))
            m2[lid] = v
            den = sqrt(v / bc2) + eps
            for d in range(D):
                m = b1 * m1[e + d] + (one - b1) * g[go + d]
                m1[e + d] = m
                x = rows[ro + d]
                rows[ro + d] = x - lr * ((m / bc1) / den + wd * x)
        elif kind == LAMB or kind == PARTIAL_ROWWISE_LAMB:
            inv = one  # partial: 1 / (sqrt(v_hat) + eps) of the row
            if kind == PARTIAL_ROWWISE_LAMB:
                v = b2 * m2[lid] + (one - b2) * (sum_squares(g, go, D) / np.float32(D))
                m2[lid] = v
                inv = one / (sqrt(v / bc2) + eps)
            for d in range(D):
                gd = g[go + d]
                m = b1 * m1[e + d] + (one - b1) * gd
                m1[e + d] = m
                x = rows[ro + d]
                if kind == LAMB:
                    v = b2 * m2[e + d] + (one - b2) * gd * gd
                    m2[e + d] = v
                    r = (m / bc1) / (sqrt(v / bc2) + eps) + wd * x
                else:
                    r = (m / bc1) * inv + wd * x
                g[go + d] = r  # the direction replaces the gradient (fbgemm reuses its buffer too)
            step = lr * ratio(norm(rows, ro, D), norm(g, go, D))
            for d in range(D):
                rows[ro + d] = rows[ro + d] - step * g[go + d]
        elif kind == LARS_SGD:
            wn = norm(rows, ro, D)
            gn = norm(g, go, D)
            alr = ratio(lr * hp[ETA] * wn, gn + wd * wn)
            mom = hp[MOMENTUM]
            for d in range(D):
                x = rows[ro + d]
                m = mom * m1[e + d] + alr * (g[go + d] + wd * x)
                m1[e + d] = m
                rows[ro + d] = x - m
        max_norm = hp[MAX_NORM]
        if max_norm > np.float32(0.0):
            n = norm(rows, ro, D)
            if n > max_norm:
                c = max_norm / n
                for d in range(D):
                    rows[ro + d] = rows[ro + d] * c

    return update_row


# -- host glue shared by the fast paths (``xp``: NumPy or CuPy) ------------------------
def row_elements(xp, lids, weights_offsets, D_offsets, hash_size_cumsum):
    """int64 ``[U]``: the element offset in ``weights`` of each linear row id (host int64
    layout arrays; ``lids`` on the target)."""
    T = weights_offsets.shape[0]
    first = [t for t in range(T) if t == 0 or hash_size_cumsum[t] != hash_size_cumsum[t - 1]]
    h0 = xp.asarray(hash_size_cumsum[first])
    w0 = xp.asarray(weights_offsets[first])
    dims = xp.asarray(np.diff(D_offsets)[first])
    j = xp.searchsorted(h0, lids, side="right") - 1
    return w0[j] + (lids - h0[j]) * dims[j]


def element_positions(xp, elements, value_offsets):
    """int64 ``[value_offsets[U]]``: the position in ``weights`` of every element of the
    rows starting at ``elements`` whose values lie at ``value_offsets``."""
    n = int(value_offsets[-1])
    k = xp.arange(n, dtype=np.int64)
    u = xp.searchsorted(value_offsets, k, side="right") - 1
    return elements[u] + (k - value_offsets[u])


def update_rows(xp, apply, weights, layout, sparse, optimizer, momentum1, momentum2, step):
    """The update of the touched rows of ``sparse = (linear_ids, values, value_offsets)``
    (their summed gradients) by ``apply(kind, decay, rows, row_starts, g, value_offsets,
    elements, linear_ids, m1, m2, hp)``, the target's kernel of :func:`make_update_row` (one
    row per iteration or thread). float32 weights are updated in place; float16 rows are
    gathered as float32 and written back once (rounded once). ``layout``: host
    ``(weights_offsets, D_offsets, hash_size_cumsum)``."""
    lids, values, voff = sparse
    if not lids.shape[0]:
        return
    elem = row_elements(xp, lids, *layout)
    none = xp.zeros(1, np.float32)
    args = optimizer.kernel_args(step)
    state = (none if momentum1 is None else momentum1, none if momentum2 is None else momentum2)
    hp = xp.asarray(optimizer.hyper_array(step))
    if weights.dtype == np.float32:
        apply(args.kind, args.decay, weights, elem, values, voff, elem, lids, *state, hp)
        return
    pos = element_positions(xp, elem, voff)
    rows = weights[pos].astype(np.float32)
    apply(args.kind, args.decay, rows, voff, values, voff, elem, lids, *state, hp)
    with np.errstate(over="ignore"):
        weights[pos] = rows.astype(weights.dtype)
