"""The fused TBE optimizers' arithmetic (``docs/families/tbe.md``, fused optimizers), written once in
plain Python and compiled by both fast paths (``numba.njit`` in ``embnum.cpu``,
``numba.cuda.jit(device=True)`` in ``embnum.cuda``), as ``embnum._bucketize`` is.

Each optimizer is split where the two targets differ: a row's sums (a loop on the CPU, a lane-group
reduction on the GPU) are the caller's; everything computed from them is here:

* **element steps** ``*_step(x, g, ...)``: the new float32 weight (and element-wise state) of one
  element from its old value ``x`` and its summed gradient ``g``;
* **row scalars**: the row-wise state and the per-row factors an element step takes
  (``rowwise_adagrad_row``, ``partial_rowwise_v``, ``lamb_rate``, ``lars_rate``, ``max_norm_scale``),
  from the row's sums of squares or its norms (``norm_of``: overflow-safe).

Every quantity is float32 and every constant a float32 (so no operation widens to float64), and
both branches of every conditional have one type, as the CUDA compiler needs. The functions call
nothing but ``math.sqrt`` (each target compiles them one by one, without a shared decorator).

:func:`make_update_row` composes them into one row's update, one thread per row (the CPU's kernel
for the kinds it has no specialised loop for); ``embnum.cuda.tbe`` composes them in lane-group form.
``embnum.ref.tbe`` stays the independent oracle.
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


# -- element steps ---------------------------------------------------------------------------
def sgd_step(x, g, lr):
    """SGD: the new weight."""
    return x - lr * g


def adagrad_step(x, g, m, lr, eps):
    """Adagrad: ``(new weight, new accumulator)``."""
    m = m + g * g
    return x - lr * g / (np.float32(math.sqrt(m)) + eps), m


def rowwise_adagrad_step(x, g, corr, mult):
    """Row-wise Adagrad, with the row's ``(corr, mult)`` from :func:`rowwise_adagrad_row`."""
    return corr * x - mult * g


def adam_step(x, g, m, v, lr, eps, wd, b1, b2, bc1, bc2):
    """Adam (decoupled decay ``wd``): ``(new weight, new m, new v)``."""
    one = np.float32(1.0)
    m = b1 * m + (one - b1) * g
    v = b2 * v + (one - b2) * g * g
    return x - lr * ((m / bc1) / (np.float32(math.sqrt(v / bc2)) + eps) + wd * x), m, v


def partial_rowwise_adam_step(x, g, m, lr, wd, b1, bc1, den):
    """Partial row-wise Adam, with the row's ``den`` from :func:`partial_rowwise_den`: ``(new weight, new m)``."""
    m = b1 * m + (np.float32(1.0) - b1) * g
    return x - lr * ((m / bc1) / den + wd * x), m


def lamb_direction(x, g, m, v, eps, wd, b1, b2, bc1, bc2):
    """LAMB's update direction ``r`` of one element: ``(r, new m, new v)``."""
    one = np.float32(1.0)
    m = b1 * m + (one - b1) * g
    v = b2 * v + (one - b2) * g * g
    return (m / bc1) / (np.float32(math.sqrt(v / bc2)) + eps) + wd * x, m, v


def partial_lamb_direction(x, g, m, wd, b1, bc1, den):
    """Partial row-wise LAMB's direction, with the row's ``den``: ``(r, new m)``."""
    m = b1 * m + (np.float32(1.0) - b1) * g
    return (m / bc1) * (np.float32(1.0) / den) + wd * x, m


def lars_step(x, g, m, alr, momentum, wd, num, den):
    """LARS-SGD, with the row's ``(alr, num, den)`` from :func:`lars_rate`: ``(new weight, new
    momentum)``. Where ``alr = num / den`` is inf in float32 (a gradient norm near float32's
    smallest), each element is divided by ``den`` first: ``|g + wd * x| <= den``, so the step
    stays within ``num``."""
    u = g + wd * x
    if alr < np.float32(np.inf):
        u = alr * u
    else:
        u = num * (u / den)
    m = momentum * m + u
    return x - m, m


# -- row scalars -----------------------------------------------------------------------------
def rowwise_adagrad_row(m, ssq, D, lr, eps, wd, decay):
    """Row-wise Adagrad's row: ``(new accumulator, corr, mult)`` from the old accumulator ``m`` and
    the row's sum of squared (L2-decayed) gradients ``ssq`` over ``D`` columns."""
    one = np.float32(1.0)
    m = m + ssq / np.float32(D)
    mult = lr / (np.float32(math.sqrt(m)) + eps)
    corr = one
    if decay == DECAY_L2:
        corr = one - mult * wd
    elif decay == DECAY_DECOUPLED:
        corr = one - lr * wd
    return m, corr, mult


def partial_rowwise_v(v, ssq, D, b2):
    """The row-wise second moment of partial row-wise Adam/LAMB from the row's sum of squared gradients."""
    return b2 * v + (np.float32(1.0) - b2) * (ssq / np.float32(D))


def partial_rowwise_den(v, bc2, eps):
    """``sqrt(v_hat) + eps`` of the row (the divisor of its element steps)."""
    return np.float32(math.sqrt(v / bc2)) + eps


def lamb_rate(lr, wn, rn):
    """LAMB's step size ``lr * |w| / |r|`` from the row's norms, 0 when ``|r| == 0`` (fbgemm divides
    0 by 0 there: a NaN row); inf where the quotient leaves float32 (:func:`lamb_move` handles it)."""
    rate = np.float32(0.0)
    if rn > np.float32(0.0):
        rate = wn / rn
    return lr * rate


def lamb_move(x, r, step, lr, wn, rn):
    """The LAMB row's new element ``x - step * r``, ``step`` from :func:`lamb_rate`; where the step
    is inf in float32 (``|r|`` near float32's smallest), ``x - lr * |w| * (r / |r|)``: each
    ``|r / |r||`` is at most 1, so the move stays within ``lr * |w|``."""
    if step < np.float32(np.inf):
        return x - step * r
    return x - lr * (wn * (r / rn))


def lars_rate(lr, eta, wd, wn, gn):
    """LARS's rate from the row's norms: ``(rate, num, den)`` with ``num = lr * eta * |w|``,
    ``den = |g| + wd * |w|`` and ``rate = num / den`` (0 when ``den`` is 0; inf where the quotient
    leaves float32, which :func:`lars_step` handles)."""
    num = lr * eta * wn
    den = gn + wd * wn
    rate = np.float32(0.0)
    if den > np.float32(0.0):
        rate = num / den
    return rate, num, den


def max_norm_scale(n, max_norm):
    """``(clip, c)``: whether the row of norm ``n`` exceeds ``max_norm`` (> 0: on), and the factor
    that brings it back to it."""
    c = np.float32(1.0)
    clip = False
    if max_norm > np.float32(0.0) and n > max_norm:
        c = max_norm / n
        clip = True
    return clip, c


def norm_of(ssq, big, tsq):
    """A row's L2 norm from its float32 sum of squares ``ssq``, or, where that sum leaves float32's
    range (entries above ~1.8e19 or below ~1e-19 in magnitude), from its largest magnitude ``big``
    and the sum of squares ``tsq`` of the row divided by ``big``: a finite nonzero row has a finite
    nonzero norm, as the oracle's float64 one (LAMB's direction with ``eps = 3e38``, a row of 1e20s
    under ``max_norm``). The norms of LAMB, LARS and ``max_norm`` come from here."""
    if ssq > np.float32(1e-30) and ssq < np.float32(np.inf):
        return np.float32(math.sqrt(ssq))
    if big == np.float32(0.0) or big == np.float32(np.inf):
        return big
    return big * np.float32(math.sqrt(tsq))


def _make_norms(jit):
    """``(sum_squares, norm)`` compiled by ``jit``: the sum of squares of the row ``a[o:o+D]`` and
    its :func:`norm_of`."""
    norm_from = jit(norm_of)

    @jit
    def sum_squares(a, o, D):
        s = np.float32(0.0)
        for d in range(D):
            s += a[o + d] * a[o + d]
        return s

    @jit
    def norm(a, o, D):
        """:func:`norm_of` the row ``a[o:o+D]`` (its second pass only where the sum leaves range)."""
        s = sum_squares(a, o, D)
        big = np.float32(0.0)
        t = np.float32(0.0)
        if not (s > np.float32(1e-30) and s < np.float32(np.inf)):
            for d in range(D):
                big = max(big, abs(a[o + d]))
            if big > np.float32(0.0) and big < np.float32(np.inf):
                for d in range(D):
                    q = a[o + d] / big
                    t += q * q
        return norm_from(s, big, t)

    return sum_squares, norm


def _make_row_rules(jit, sum_squares, norm):
    """The row updates that read the whole row before writing it, compiled by ``jit`` (arguments as
    in :func:`make_update_row`): ``(rowwise_adagrad_update, lamb_update, clip_to_max_norm)``."""
    rowwise, rowwise_row = jit(rowwise_adagrad_step), jit(rowwise_adagrad_row)
    lamb, partial_lamb = jit(lamb_direction), jit(partial_lamb_direction)
    lamb_r, lamb_m = jit(lamb_rate), jit(lamb_move)
    partial_v, partial_den, max_norm_s = jit(partial_rowwise_v), jit(partial_rowwise_den), jit(max_norm_scale)

    @jit
    def rowwise_adagrad_update(decay, rows, ro, g, go, D, m1, lid, lr, eps, wd):
        """Row-wise Adagrad: the row's sum of squared (L2-decayed) gradients, its accumulator, its step."""
        s = np.float32(0.0)
        for d in range(D):
            ge = g[go + d]
            if decay == DECAY_L2:
                ge = ge + wd * rows[ro + d]
            s += ge * ge
        m1[lid], corr, mult = rowwise_row(m1[lid], s, D, lr, eps, wd, decay)
        for d in range(D):
            rows[ro + d] = rowwise(rows[ro + d], g[go + d], corr, mult)

    @jit
    def lamb_update(kind, rows, ro, g, go, D, m1, m2, e, lid, lr, eps, wd, b1, b2, bc1, bc2):
        """LAMB or partial row-wise LAMB: the direction (written over ``g``), then the step
        ``lr * |w| / |r|`` along it."""
        den = np.float32(1.0)
        if kind == PARTIAL_ROWWISE_LAMB:
            m2[lid] = partial_v(m2[lid], sum_squares(g, go, D), D, b2)
            den = partial_den(m2[lid], bc2, eps)
        wn = norm(rows, ro, D)
        for d in range(D):
            x = rows[ro + d]
            if kind == LAMB:
                r, m1[e + d], m2[e + d] = lamb(x, g[go + d], m1[e + d], m2[e + d], eps, wd, b1, b2, bc1, bc2)
            else:
                r, m1[e + d] = partial_lamb(x, g[go + d], m1[e + d], wd, b1, bc1, den)
            g[go + d] = r  # the direction replaces the gradient (fbgemm reuses its buffer too)
        rn = norm(g, go, D)
        step = lamb_r(lr, wn, rn)
        for d in range(D):
            rows[ro + d] = lamb_m(rows[ro + d], g[go + d], step, lr, wn, rn)

    @jit
    def clip_to_max_norm(rows, ro, D, max_norm):
        """The row scaled back to norm ``max_norm`` where it is longer."""
        clip, c = max_norm_s(norm(rows, ro, D), max_norm)
        if clip:
            for d in range(D):
                rows[ro + d] = rows[ro + d] * c

    return rowwise_adagrad_update, lamb_update, clip_to_max_norm


def make_update_row(jit):
    """``update_row(kind, decay, rows, ro, g, go, D, m1, m2, e, lid, hp)`` compiled by ``jit``: one
    optimizer step of the row at ``rows[ro:ro+D]`` (its float32 values: float32 weights themselves,
    or float16 rows the caller gathered and writes back once) from its summed gradient ``g[go:go+D]``
    (LAMB overwrites it with its direction: the caller's scratch, never user data), then ``max_norm``.
    ``m1``, ``m2``: the state (float32; length 1 when the kind has none), element-wise state at ``e``
    (the row's element offset in ``weights``), row-wise state at ``lid`` (its linear id); ``hp``:
    float32 ``[HP_SLOTS]`` hyper-parameters (``TBEOptimizer.hyper_array``)."""
    sgd, adagrad, adam, lars = jit(sgd_step), jit(adagrad_step), jit(adam_step), jit(lars_step)
    partial_adam, partial_v, partial_den = (
        jit(partial_rowwise_adam_step),
        jit(partial_rowwise_v),
        jit(partial_rowwise_den),
    )
    lars_r = jit(lars_rate)
    sum_squares, norm = _make_norms(jit)
    rowwise_adagrad_update, lamb_update, clip_to_max_norm = _make_row_rules(jit, sum_squares, norm)

    @jit
    def update_row(kind, decay, rows, ro, g, go, D, m1, m2, e, lid, hp):
        lr = hp[LR]
        eps = hp[EPS]
        wd = hp[WD]
        b1 = hp[BETA1]
        b2 = hp[BETA2]
        bc1 = hp[BC1]
        bc2 = hp[BC2]
        if kind == SGD:
            for d in range(D):
                rows[ro + d] = sgd(rows[ro + d], g[go + d], lr)
        elif kind == ADAGRAD:
            for d in range(D):
                rows[ro + d], m1[e + d] = adagrad(rows[ro + d], g[go + d], m1[e + d], lr, eps)
        elif kind == ROWWISE_ADAGRAD:
            rowwise_adagrad_update(decay, rows, ro, g, go, D, m1, lid, lr, eps, wd)
        elif kind == ADAM:
            for d in range(D):
                rows[ro + d], m1[e + d], m2[e + d] = adam(
                    rows[ro + d], g[go + d], m1[e + d], m2[e + d], lr, eps, wd, b1, b2, bc1, bc2
                )
        elif kind == PARTIAL_ROWWISE_ADAM:
            m2[lid] = partial_v(m2[lid], sum_squares(g, go, D), D, b2)
            den = partial_den(m2[lid], bc2, eps)
            for d in range(D):
                rows[ro + d], m1[e + d] = partial_adam(rows[ro + d], g[go + d], m1[e + d], lr, wd, b1, bc1, den)
        elif kind == LAMB or kind == PARTIAL_ROWWISE_LAMB:
            lamb_update(kind, rows, ro, g, go, D, m1, m2, e, lid, lr, eps, wd, b1, b2, bc1, bc2)
        elif kind == LARS_SGD:
            alr, num, den = lars_r(lr, hp[ETA], wd, norm(rows, ro, D), norm(g, go, D))
            for d in range(D):
                rows[ro + d], m1[e + d] = lars(rows[ro + d], g[go + d], m1[e + d], alr, hp[MOMENTUM], wd, num, den)
        if hp[MAX_NORM] > np.float32(0.0):
            clip_to_max_norm(rows, ro, D, hp[MAX_NORM])

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
