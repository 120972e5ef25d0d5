"""Every per-call shortcut of a validation rule agrees with the rule: one table, one test.

A declaration checks its arguments by exact Python rules (``embnum._validate``, the family's
declaration in ``embnum/ops/<family>.py``, ``embnum._tbe_bounds``, the registry's output check, the
bridge's schema checks). On plain host data it first asks a shortcut: a compiled one-pass verdict
(the generic reductions of ``embnum._validate_numba``, the family's ``embnum/ops/_checks_<family>.py``,
``embnum._tbe_bounds_numba``), a cache, or a one-loop common case. Each row of ``RULES`` is one such
rule: the outcome through the shortcut, the outcome of the exact rule (for a compiled verdict: the
same call with ``_validate.compiled`` stubbed to None, so no compiled check runs), a Hypothesis
strategy of inputs valid and broken (an entry replaced by a negative or a value near int64's or
int32's end, an array one entry short or long, sizes at their limits), and fixed edge cases.
``test_shortcut_agrees_with_its_rule`` runs every row: the same plan or value when valid, the same
error type and message when not.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import embnum
from embnum import _registry, _tbe_bounds
from embnum import _validate as v
from embnum.ops import keyed_tensor as ops_kt
from embnum.ops import quant
from embnum.ops import tbe as ops_tbe


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule: ``fast(case)`` and ``exact(case)`` give comparable outcomes (a value, or
    ``(error type name, message)``) and must ``agree`` on every drawn case and every edge."""

    name: str
    cases: st.SearchStrategy
    fast: Callable
    exact: Callable
    examples: int | None = None  # None: the Hypothesis profile's number
    edges: tuple = ()
    agree: Callable = operator.eq
    needs: tuple = ()  # packages the row imports (skipped where absent)


def outcome(fn, *args, **kwargs):
    """``fn(...)``'s value, or ``(error type name, message)``."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError, IndexError) as e:
        return type(e).__name__, str(e)


def without_compiled(fn):
    """``fn`` run with ``_validate.compiled`` stubbed to None: the exact rules, no compiled check."""

    def run(*args, **kwargs):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(v, "compiled", lambda: None)
            return fn(*args, **kwargs)

    return run


# -- shared drawing ------------------------------------------------------------------------------
BIG = 2**63 - 1
I32 = np.iinfo(np.int32)
HOSTILE = st.one_of(
    st.integers(-3, 12),
    st.sampled_from([-(2**63), -(2**31), -1, 2**31 - 1, 2**31, 2**47, 2**48, 2**62, BIG - 1, BIG]),
)
INDEX = st.sampled_from([np.int32, np.int64])
SIZES = st.one_of(st.integers(0, 8), st.sampled_from([2**31 - 1, 2**31, 2**48, 2**48 + 1, -1]))
DECLARATION = 150  # examples of a declaration row: no kernels, ~1 ms an example


def _cast(dtype, a):
    """``a`` in ``dtype`` (one index dtype per example: few compiled signatures), or in int64
    where an entry does not fit int32."""
    a = np.asarray(a, np.int64)
    if dtype == np.int32 and (a.size == 0 or np.abs(a).max() < 2**31):
        return a.astype(np.int32)
    return a


def _ints(draw, n, top=3):
    return np.array(draw(st.lists(st.integers(0, top), min_size=n, max_size=n)), np.int64)


def _break(draw, arrays):
    """Maybe replace one entry of one of ``arrays`` (int64 arrays) by a hostile value, or
    drop/append an entry."""
    k = draw(st.integers(0, len(arrays) - 1))
    a = arrays[k]
    how = draw(st.sampled_from(["keep", "keep", "entry", "entry", "shorter", "longer"]))
    if how == "entry" and a.size:
        a = a.copy()
        a.reshape(-1)[draw(st.integers(0, a.size - 1))] = draw(HOSTILE)
    elif how == "shorter" and a.ndim == 1 and a.shape[0]:
        a = a[:-1]
    elif how == "longer" and a.ndim == 1:
        a = np.append(a, draw(HOSTILE))
    arrays[k] = a
    return arrays


def _offsets(draw, n_bags, max_len=3):
    lens = draw(st.lists(st.integers(0, max_len), min_size=n_bags, max_size=n_bags))
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def _total(draw, lengths):
    """A values count for ``lengths``: their (clipped) sum, sometimes one off."""
    return int(lengths.clip(0, 10).sum()) + draw(st.sampled_from([0, 0, 0, -1, 1]))


# -- integer lists: the one-expression common case against the rule entry by entry ----------------
INT_LIST_ITEMS = st.one_of(
    HOSTILE,
    HOSTILE.map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.booleans(),
    st.sampled_from([np.True_, 1.0, 2**48 + 0.0, None, "3"]),
)
INT_LISTS = st.one_of(st.lists(INT_LIST_ITEMS, max_size=5), st.lists(INT_LIST_ITEMS, max_size=5).map(tuple))


def int_list_exact(items):
    """The rule of ``_validate.int_list`` for a list or tuple: each entry a size, by name."""
    return outcome(lambda: [v.size(f"input_rows[{i}]", x) for i, x in enumerate(items)])


def same_ints(a, b):
    """Equal outcomes, and a list of exact Python ints where the list passed."""
    return a == b and (not isinstance(a, list) or all(type(x) is int for x in a))


# -- declarations: the plan through the compiled verdict, or with it stubbed ----------------------
def plan_outcome(decl, args, kwargs=None):
    """The declaration's plan as plain data, or ``(error type name, message)``."""
    try:
        plan = decl(*args, **(kwargs or {}))
    except (ValueError, TypeError, IndexError) as e:
        return type(e).__name__, str(e)
    plan_args, planned = plan
    outs = planned if isinstance(planned, list) or (isinstance(planned, tuple) and len(planned) != 2) else [planned]
    args = {
        k: (a.tolist(), str(a.dtype)) if isinstance(a, np.ndarray) else repr(a) for k, a in sorted(plan_args.items())
    }
    return args, [None if o is None else (o[0], str(np.dtype(o[1]))) for o in outs], type(planned).__name__


def declaration_rule(name, cases, **kw):
    """A row for ``embnum.<name>``'s declaration; a case is ``(args, kwargs)``."""
    decl = getattr(embnum, name).op.declaration
    return Rule(
        f"declaration-{name}",
        cases,
        fast=lambda c: plan_outcome(decl, *c),
        exact=without_compiled(lambda c: plan_outcome(decl, *c)),
        examples=DECLARATION,
        needs=("numba",),  # without Numba both sides are the exact rules
        **kw,
    )


@st.composite
def offsets_range_cases(draw):
    dt = draw(INDEX)
    (offsets,) = _break(draw, [_offsets(draw, draw(st.integers(0, 4)))])
    size = draw(st.one_of(st.just(int(offsets[-1]) if offsets.size else 0), SIZES))
    return (_cast(dt, offsets), size), None


@st.composite
def segment_sum_csr_cases(draw, backward):
    dt = draw(INDEX)
    (csr,) = _break(draw, [_offsets(draw, draw(st.integers(0, 4)))])
    batch = draw(st.one_of(st.integers(0, 3), SIZES))
    n = draw(st.one_of(st.integers(0, 12), SIZES))
    S = max(csr.shape[0] - 1 + draw(st.sampled_from([0, 0, 0, -1, 1])), 0)
    if backward:
        grad = np.ones(S, draw(st.sampled_from([np.float32, np.int64])))
        return (batch, _cast(dt, csr), grad, n), None
    values = np.ones(max(n, 0) if n < 100 else 7, draw(st.sampled_from([np.float16, np.int32])))
    return (batch, _cast(dt, csr), values), None


def _levels(draw, J, B):
    levels, n = [], B
    for _ in range(J):
        o = _offsets(draw, n)
        levels.append(o)
        n = int(o[-1])
    return _break(draw, levels), n


@st.composite
def to_dense_cases(draw, which):
    dt = draw(INDEX)
    J = draw(st.integers(1, 3)) if which == "padded" else 1
    levels, n = _levels(draw, J, draw(st.integers(0, 3)))
    rows = max(n + draw(st.sampled_from([0, 0, 0, -1, 1])), 0)
    ndim = 2 if which == "2d" else 1 if which == "1d" else draw(st.sampled_from([1, 2]))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.int32, np.int64]))
    values = np.zeros((rows, 2) if ndim == 2 else (rows,), dtype)
    lengths = draw(st.lists(SIZES, min_size=J, max_size=J))
    pad = draw(st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.sampled_from([2**31, 1e6, -(2**63), 0.5])))
    levels = [_cast(dt, o) for o in levels]
    if which == "padded":
        return (values, draw(st.sampled_from([levels, tuple(levels), levels[:-1]])), lengths, pad), None
    if which == "1d":
        return (values, levels[0], lengths[0], pad), None
    return (values, levels[0], lengths[0]), None


@st.composite
def dense_to_jagged_cases(draw):
    dt = draw(INDEX)
    J = draw(st.integers(1, 3))
    B = draw(st.integers(0, 3))
    levels, n = _levels(draw, J, B)
    shape = [B + draw(st.sampled_from([0, 0, 0, 1]))] + [2] * J + [3]
    if draw(st.booleans()):
        shape = shape[:-1]
    dense = np.zeros(shape, draw(st.sampled_from([np.float32, np.int64])))
    total = draw(st.one_of(st.none(), st.just(n), SIZES))
    return (dense, [_cast(dt, o) for o in levels], total), None


def _keyed_lengths(draw, max_T, min_B):
    """The index dtype, T keys, B bags per key and the T*B drawn lengths (int64)."""
    dt = draw(INDEX)
    T = draw(st.integers(0, max_T))
    B = draw(st.integers(min_B, 3))
    return dt, T, B, _ints(draw, T * B)


@st.composite
def permute_cases(draw, two_d):
    dt, T, B, lengths = _keyed_lengths(draw, 4, 1)
    lengths = lengths.reshape(T, B) if two_d else lengths
    permute = np.array(draw(st.lists(st.integers(0, max(T * (1 if two_d else B) - 1, 0)), max_size=5)), np.int64)
    if T == 0:
        permute = permute[:0]
    permute, lengths = _break(draw, [permute, lengths])
    N = _total(draw, lengths)
    values = np.arange(max(N, 0), dtype=draw(st.sampled_from([np.int64, np.float32])))
    weights = np.ones(max(N, 0), np.float32) if draw(st.booleans()) else None
    hint = draw(st.one_of(st.none(), st.integers(0, 30)))
    return (_cast(dt, permute), _cast(dt, lengths), values, weights, hint), None


@st.composite
def index_select_cases(draw):
    dt, T, B, lengths = _keyed_lengths(draw, 3, 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = np.array(draw(st.lists(st.integers(0, B - 1), max_size=4)), np.int64)
    lengths, offsets, indices = _break(draw, [lengths, offsets, indices])
    N = _total(draw, lengths)
    values = np.arange(max(N, 0), dtype=np.float64)
    weights = np.ones(max(N, 0), np.float16) if draw(st.booleans()) else None
    batch = draw(st.one_of(st.just(B), st.sampled_from([0, 1, 2, 2**48 + 1])))
    hint = draw(st.one_of(st.none(), st.integers(0, 30)))
    return (values, _cast(dt, lengths), _cast(dt, offsets), _cast(dt, indices), batch, weights, hint), None


@st.composite
def expand_permute_cases(draw):
    dt = draw(INDEX)
    T = draw(st.integers(0, 4))
    sizes = np.array(draw(st.lists(st.integers(0, 3), min_size=T, max_size=T)), np.int64)
    permute = np.array(draw(st.permutations(range(T))), np.int64)
    input_offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    output_offset = np.concatenate([[0], np.cumsum(sizes[permute])]).astype(np.int64)
    permute, input_offset, output_offset = _break(draw, [permute, input_offset, output_offset])
    output_size = int(output_offset[-1]) if output_offset.size else 0
    output_size = draw(st.sampled_from([output_size, output_size, output_size + 1, 2**48 + 1]))
    return (_cast(dt, permute), _cast(dt, input_offset), _cast(dt, output_offset), output_size), None


@st.composite
def invert_permute_cases(draw):
    dt, n = draw(INDEX), draw(st.integers(0, 6))
    (permute,) = _break(draw, [np.array(draw(st.permutations(range(n))), np.int64)])
    return (_cast(dt, permute),), None


@st.composite
def bucketize_cases(draw):
    dt, T, B, lengths = _keyed_lengths(draw, 3, 0)
    block_sizes = _ints(draw, T, 6)
    lengths, block_sizes = _break(draw, [lengths, block_sizes])
    N = _total(draw, lengths)
    indices = np.arange(max(N, 0), dtype=draw(INDEX))
    weights = np.ones(max(N, 0), np.float32) if draw(st.booleans()) else None
    my_size = draw(st.one_of(st.integers(1, 3), st.integers(1, 3), st.sampled_from([0, -1, 2**31, 2**47, True])))
    odd = draw(st.integers(0, 5)) == 0  # mostly the plain case the compiled verdict serves
    flags = [draw(st.sampled_from([np.True_, 1, False] if odd else [True, False])) for _ in range(3)]
    max_B = draw(st.sampled_from([-1, 5, 2**63, np.int64(3)] if odd else [-1, 5]))
    pos = draw(st.sampled_from([None, []]))
    args = (_cast(dt, lengths), indices, flags[0], flags[1], _cast(dt, block_sizes), my_size, weights)
    return args, dict(max_B=max_B, block_bucketize_pos=pos, keep_orig_idx=flags[2])


@st.composite
def unique_cases(draw):
    dt = draw(INDEX)
    n_tables = draw(st.integers(1, 3))
    per_table = draw(st.lists(st.integers(1, 2), min_size=n_tables, max_size=n_tables))
    T = sum(per_table)
    B = draw(st.integers(1, 2))
    sizes = draw(st.lists(st.integers(0, 5), min_size=n_tables, max_size=n_tables))
    hsc = np.concatenate([np.repeat(np.concatenate([[0], np.cumsum(sizes)])[:-1], per_table), [sum(sizes)]])
    hso = np.concatenate([[0], np.cumsum(per_table)]).astype(np.int64)
    hso = np.repeat(hso, draw(st.lists(st.integers(1, 2), min_size=hso.shape[0], max_size=hso.shape[0])))
    hso = hso[: T + 1] if hso.shape[0] >= T + 1 else hso
    lengths = draw(st.lists(st.integers(0, 3), min_size=T * B, max_size=T * B))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    feature = np.repeat(np.arange(T * B) // B, lengths)
    table = np.searchsorted(np.concatenate([[0], np.cumsum(per_table)]), feature, side="right") - 1
    top = np.array(sizes + [1])[table]
    indices = np.array([draw(st.integers(0, max(int(h) - 1, 0))) for h in top], np.int64)
    hsc, hso, offsets, indices = _break(draw, [hsc.astype(np.int64), hso.astype(np.int64), offsets, indices])
    return (_cast(dt, hsc), _cast(dt, hso), _cast(dt, offsets), _cast(dt, indices)), None


# -- the int32 prefix-sum verdict of the cumsum declarations ---------------------------------------
def int32_prefix_exact(a: np.ndarray, drop_last: bool) -> bool:
    """The rule: every running sum of a row (its last entry left out when ``drop_last``) in int32."""
    prefix = np.cumsum(np.atleast_2d(a).astype(object), axis=-1)  # Python ints: exact
    if drop_last:
        prefix = prefix[:, :-1]
    return prefix.size == 0 or (prefix.max() <= I32.max and prefix.min() >= I32.min)


def int32_prefix_fast(case):
    from embnum.ops import _checks_jagged

    return _checks_jagged.int32_prefix_fits(*case)


# entries near the limits (sums that cross int32 after a few steps) and small ones (bound passes)
_I32_ENTRIES = st.one_of(
    st.integers(-4, 4),
    st.integers(I32.max // 3, I32.max),
    st.integers(I32.min, I32.min // 3),
    st.sampled_from([I32.max, I32.min, 0, 1, -1]),
)


@st.composite
def int32_rows(draw):
    rows = draw(st.integers(0, 4))
    n = draw(st.integers(0, 9))
    a = np.array(draw(st.lists(_I32_ENTRIES, min_size=rows * n, max_size=rows * n)), dtype=np.int32).reshape(rows, n)
    if draw(st.booleans()):
        a = a[0] if rows else a.reshape(-1)  # 1-D
    if draw(st.booleans()) and a.ndim == 1:
        a = np.repeat(a, 2)[::2]  # not contiguous
    return a


_CUMSUMS = (("complete_cumsum", False, (1, 2)), ("exclusive_cumsum", True, (1,)), ("inclusive_cumsum", False, (1,)))


@st.composite
def cumsum_calls(draw):
    a = draw(int32_rows())
    name, drop_last, _ = draw(st.sampled_from([c for c in _CUMSUMS if a.ndim in c[2]]))
    return name, drop_last, a


def cumsum_call_fast(case):
    name, _, a = case
    got = outcome(getattr(embnum, name), a)
    return "ok" if isinstance(got, np.ndarray) else got


def cumsum_call_exact(case):
    _, drop_last, a = case
    return "ok" if int32_prefix_exact(a, drop_last) else ("ValueError", _CUMSUM_OVERFLOW)


_CUMSUM_OVERFLOW = "prefix sum of lengths overflows int32; use int64 lengths"


def _i32(*rows):
    return np.array(rows, np.int32)


# -- permute_pooled_embs's four lists -------------------------------------------------------------
_POOLED_ENTRY = st.one_of(st.integers(-3, 12), st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**62, 2**63 - 1]))


@st.composite
def pooled_lists(draw):
    """Valid lists (widths, a permutation, its inverse, the permuted offsets), then maybe broken:
    an entry of one list replaced by a drawn value, or one list shortened or lengthened."""
    T = draw(st.integers(1, 5))
    widths = np.array(draw(st.lists(st.integers(0, 3), min_size=T, max_size=T)), np.int64)
    perm = np.array(draw(st.permutations(range(T))), np.int64)
    lists = [
        np.concatenate([[0], np.cumsum(widths)]),
        perm,
        np.concatenate([[0], np.cumsum(widths[perm])]),
        np.argsort(perm).astype(np.int64),
    ]
    if draw(st.booleans()):
        k = draw(st.integers(0, 3))
        if draw(st.booleans()) and lists[k].size:
            lists[k][draw(st.integers(0, lists[k].size - 1))] = draw(_POOLED_ENTRY)
        else:
            extra = np.array(draw(st.lists(_POOLED_ENTRY, max_size=2)), np.int64)
            lists[k] = np.concatenate([lists[k][: draw(st.integers(0, lists[k].size))], extra])
    fits = all(np.abs(a).max(initial=0) < 2**31 for a in lists)
    lists = [a.astype(draw(INDEX)) if fits else a for a in lists]
    return np.zeros((2, int(widths.sum())), np.float32), lists


def pooled_verdict(case):
    from embnum.ops import _checks_keyed_tensor

    x, lists = case
    return bool(_checks_keyed_tensor.pooled_lists_ok(*lists, x.shape[1]))


def pooled_rules(case):
    x, lists = case
    return outcome(ops_kt._pooled_rules, x.shape[1], lists) is None


def pooled_call(case):
    """The public call's error (or "ok") with the compiled verdict, and with it stubbed."""
    x, lists = case

    def call():
        got = outcome(embnum.permute_pooled_embs, x, *lists)
        return "ok" if isinstance(got, np.ndarray) else got

    return call(), without_compiled(call)()


def pooled_call_rules(case):
    """Both calls raise the exact rules' error (they name the broken rule), or neither does."""
    x, lists = case
    got = outcome(ops_kt._pooled_rules, x.shape[1], lists)
    want = "ok" if got is None else got
    return want, want


# -- the TBE layout and lookups -------------------------------------------------------------------
_TBE_ENTRY = st.one_of(st.integers(-3, 40), st.sampled_from([-(2**63), -1, 2**31 - 1, 2**31, 2**62, BIG - 1, BIG]))


@st.composite
def layouts(draw):
    """A valid layout from ``tbe_layout`` (1-4 tables, adjacent features may share one), then
    maybe broken: one entry of one array replaced by a drawn value, weights shortened or
    lengthened, in int32 or int64."""
    n = draw(st.integers(1, 4))
    rows = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    dims = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    ftm = sorted(draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=3)) + list(range(n)))
    lay = embnum.tbe_layout(rows, dims, ftm)
    arrays = [a.copy() for a in lay.arrays()]
    W = lay.num_weights + draw(st.integers(-3, 3))
    if draw(st.booleans()):
        k = draw(st.integers(0, 2))
        arrays[k][draw(st.integers(0, arrays[k].shape[0] - 1))] = draw(_TBE_ENTRY)
    if draw(st.booleans()) and all(np.abs(a).max() < 2**31 for a in arrays):
        arrays = [a.astype(np.int32) for a in arrays]
    return np.zeros(max(W, 0), np.float32), arrays


def layout_outcome(case):
    weights, arrays = case
    got = outcome(ops_tbe.layout, weights, *arrays)
    return got if isinstance(got, tuple) and isinstance(got[0], str) else [a.tolist() for a in got]


_LOOKUP_ENTRY = st.one_of(st.integers(-3, 12), st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**62, 2**63 - 1]))


@st.composite
def lookups(draw):
    """``(indices, offsets, B, rows, mode, pruned_ok)``: lookups valid, or with an entry replaced,
    two offsets swapped, a pruned ``-1`` or the first row past a table."""
    T = draw(st.integers(1, 3))
    B = draw(st.integers(0, 3))
    rows = np.array([draw(st.integers(1, 5)) for _ in range(T)], np.int64)
    lengths = [draw(st.integers(0, 3)) for _ in range(T * B)]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    N = int(offsets[-1])
    indices = np.array([draw(st.integers(-1, 4)) for _ in range(N)], np.int64)
    how = draw(st.sampled_from(["valid", "entry", "entry", "swap", "pruned", "edge"]))
    if how == "entry":  # any entry of either array replaced by a drawn value
        a = offsets if draw(st.booleans()) else indices
        if a.size:
            a[draw(st.integers(0, a.size - 1))] = draw(_LOOKUP_ENTRY)
    elif how == "swap" and T * B > 1:  # two adjacent offsets out of order (both still in [0, N])
        k = draw(st.integers(1, T * B - 1))
        offsets[k], offsets[k + 1] = offsets[k + 1], offsets[k]
    elif how in ("pruned", "edge") and N:  # -1, or the first row past its feature's table
        p = draw(st.integers(0, N - 1))
        t = int(np.searchsorted(offsets[::B], p, side="right")) - 1 if B else 0
        indices[p] = -1 if how == "pruned" else rows[min(t, T - 1)]
    small = all(np.abs(a).max(initial=0) < 2**31 for a in (offsets, indices))
    if small and draw(st.booleans()):
        offsets = offsets.astype(np.int32)
    if small and draw(st.booleans()):
        indices = indices.astype(np.int32)
    return indices, offsets, B, rows, draw(st.sampled_from(_tbe_bounds.MODES)), draw(st.booleans())


def bounds_outcome(case, mode=None):
    """``_tbe_bounds.check``'s result (lists, dtypes, whether the inputs came back as they are) or error."""
    indices, offsets, B, rows, drawn_mode, pruned_ok = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the repair warning of mode "warning" (asserted in test_tbe)
        got = outcome(_tbe_bounds.check, indices, offsets, B, rows, mode or drawn_mode, pruned_ok=pruned_ok)
    if isinstance(got[0], str):
        return got
    i, o = got
    return i.tolist(), o.tolist(), i.dtype, o.dtype, i is indices and o is offsets


def lookups_verdict(case):
    from embnum import _tbe_bounds_numba

    indices, offsets, B, rows, _, pruned_ok = case
    return bool(_tbe_bounds_numba.tbe_lookups_ok(indices, offsets, B, rows, pruned_ok))


def lookups_accepted(case):
    """The exact rules pass the lookups unchanged in mode "fatal"."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(v, "compiled", lambda: None)
        m.setattr(v, "_fast", lambda a: None)
        got = bounds_outcome(case, "fatal")
    return len(got) == 5 and got[4]


def bounds_exact(case):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(v, "compiled", lambda: None)
        m.setattr(v, "_fast", lambda a: None)
        return bounds_outcome(case)


# -- quant's cached formats and one-line shortcuts ------------------------------------------------
_ODD = st.sampled_from([True, 4.0, np.int64(4), np.int8(3), "4", None, -(2**63), 2**64])


def hfp8_exact(case):
    def exact(e, b):
        fmt = quant.hfp8_format(e, b)
        return fmt, quant.hfp8_largest(fmt[0], fmt[1])

    want = outcome(exact, *case)
    return want, want


def hfp8_fast(case):
    return outcome(quant._hfp8, *case), outcome(quant._hfp8, *case)  # the second from the cache when valid


def bit_rate_exact(b):
    b = v.integer("bit_rate", b, what="an int (2, 4 or 8)")
    if b not in quant.BIT_RATES:
        raise ValueError(f"bit_rate must be 2, 4 or 8, got {b}")
    return b


def max_pos_fast(case):
    max_pos, fmt = case
    got = outcome(embnum.float_to_hfp8.op.declaration, np.zeros(3, np.float32), *fmt, max_pos)
    return got if isinstance(got[0], str) else got[0]["max_pos"].tobytes()


def max_pos_exact(case):
    max_pos, fmt = case

    def rule():
        v.real("max_pos", max_pos)
        with np.errstate(over="ignore"):
            mp = np.float32(max_pos)
        largest = quant.hfp8_largest(*fmt)
        if not (np.isfinite(mp) and 0 < mp <= largest):
            raise ValueError(
                f"max_pos must be finite, > 0 and at most {largest} (the largest value of this format), got {max_pos!r}"
            )
        return mp.tobytes()

    return outcome(rule)


def bfloat16_fast(a):
    got = outcome(embnum.bfloat16_to_float.op.declaration, a)
    return ("input as it is", got[0]["input"] is a) if isinstance(got[0], dict) else got[0]


def bfloat16_exact(a):
    """uint16 bits (native byte order) pass as they are; any other dtype is a TypeError."""
    return ("input as it is", True) if a.dtype == np.dtype(np.uint16) else "TypeError"


# -- in-place ops' alias check --------------------------------------------------------------------
# dtypes the compiled span takes (float16 as a uint16 view), and (sometimes) ones it leaves to the exact rule
_COMMON = [np.float32, np.int64, np.float16, np.int8, np.complex128]
_DTYPES = st.one_of(st.sampled_from(_COMMON), st.sampled_from(_COMMON + [">i4", "U2"]))


class FakeCupyArray:
    """A CuPy-like array over a NumPy one's memory (only what the span rule reads)."""

    __module__ = "cupy._core.core"
    __cuda_array_interface__ = {}

    def __init__(self, a):
        self._a = a
        self.shape, self.strides, self.itemsize, self.size = a.shape, a.strides, a.itemsize, a.size

        class _Data:
            ptr = a.__array_interface__["data"][0]

        self.data = _Data()


@st.composite
def views(draw, base):
    """A view of ``base`` (1-D): a slice with any step (empty ones too), maybe as 2-D, transposed."""
    n = base.shape[0]
    step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    if draw(st.integers(0, 7)) == 0:  # any slice, often an empty one
        a = base[draw(st.integers(-n - 1, n + 1)) : draw(st.integers(-n - 1, n + 1)) : step]
    else:  # a non-empty run [i, j)
        i = draw(st.integers(0, n - 1))
        j = draw(st.integers(i + 1, n))
        a = base[i:j:step] if step > 0 else base[j - 1 : (i - 1 if i else None) : step]
    if a.shape[0] % 2 == 0 and a.shape[0] and draw(st.booleans()):
        a = a.reshape(2, -1)
        if draw(st.booleans()):
            a = a.T
        if draw(st.booleans()):
            a = a[:, ::-1]
    return a


@st.composite
def argument_sets(draw):
    """``(arguments, written)``: 2-5 array arguments viewed from 1-2 bases (or fresh), maybe a list
    of arrays, a CuPy-like array, a scalar and None; ``written`` a drawn subset of the names."""
    bases = [np.zeros(draw(st.integers(1, 12)), dtype=draw(_DTYPES)) for _ in range(draw(st.integers(1, 2)))]
    arguments = {}
    for i in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from(["view"] * 8 + ["fresh", "same"]))
        if kind == "same" and arguments:
            a = arguments[draw(st.sampled_from(sorted(arguments)))]  # one array passed twice
        elif kind == "fresh":
            a = np.ones(draw(st.integers(0, 4)), dtype=draw(_DTYPES))
        else:
            a = draw(views(draw(st.sampled_from(bases))))
        if draw(st.integers(0, 15)) == 0 and isinstance(a, np.ndarray):
            a = FakeCupyArray(a)
        arguments[f"a{i}"] = a
    if draw(st.integers(0, 7)) == 0:
        arguments["group"] = [draw(views(bases[0])), 3]
    arguments.update(step=draw(st.sampled_from([None, 2, 1.5, "sum"])))
    written = tuple(k for k in sorted(arguments) if draw(st.booleans()))
    return arguments, written


def alias_oracle(case):
    """The first pair (in argument order, list items named ``k[i]``) with a written member that
    is one object or may share memory by bounds (``np.may_share_memory``, CuPy-like: spans)."""
    arguments, written = case
    arrays = []
    for k, x in arguments.items():
        if isinstance(x, (np.ndarray, FakeCupyArray)):
            arrays.append((k, x))
        elif isinstance(x, list):
            arrays += [(f"{k}[{i}]", y) for i, y in enumerate(x) if isinstance(y, np.ndarray)]
    for i, (k, a) in enumerate(arrays):
        for m, b in arrays[i + 1 :]:
            if k not in written and m not in written:
                continue
            shared = np.may_share_memory(a, b) if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) else None
            if a is b or (v.overlaps(a, b) if shared is None else shared):
                return "ValueError", f"{k} shares memory with {m}: an in-place op needs its arrays apart"
    return None


class HostileStride:
    """An edge case built on use: ``{"w": base, "far": a view of base[:1] with a hostile stride}``
    (``w`` written). Never kept as arrays: printing such a view (as Hypothesis does with an
    example) would read memory it does not own."""

    def __init__(self, stride):
        self.stride = stride

    def __repr__(self):
        return f"HostileStride({self.stride})"

    def build(self):
        base = np.zeros(4, np.float32)
        far = np.lib.stride_tricks.as_strided(base[:1], shape=(3,), strides=(self.stride,))
        return {"w": base, "far": far}, ("w",)


def built(fn):
    """``fn`` on the case, a :class:`HostileStride` built first."""
    return lambda case: fn(case.build() if isinstance(case, HostileStride) else case)


HOSTILE_STRIDES = tuple(HostileStride(s) for s in (2**61, 2**62, -(2**62), 2**63 - 1))


# -- the registry's output check ------------------------------------------------------------------
LIMIT = embnum.MAX_SIZE
_DIMS = st.one_of(
    st.integers(0, 5),
    st.integers(-3, -1),
    st.sampled_from([LIMIT, LIMIT // 4, LIMIT // 4 + 1, 2**24, 2**40]),
    st.integers(0, 5).map(np.int64),
    st.booleans(),
)
OUT_CASES = st.tuples(
    st.lists(_DIMS, max_size=4).flatmap(lambda s: st.sampled_from([tuple(s), list(s)])),
    st.sampled_from(
        [
            np.dtype(np.int32),
            np.dtype(np.float16),
            np.dtype(np.uint8),
            np.float64,
            "int64",
            np.dtype(">i4"),  # another byte order: the same class and size as int32
            np.dtype("M8[ns]"),
            np.dtype("U3"),  # the item size varies within the class: the exact rule
            np.dtype("S5"),
            np.dtype([("a", np.int8), ("b", np.float64)]),
        ]
    ),
)
OUT_EDGES = (((LIMIT // 4 + 1,), np.int32), ((0, LIMIT + 1), np.uint8), ((LIMIT // 4,), np.int32))


def out_exact(case):
    shape, dtype = case
    want_dtype = np.dtype(dtype)
    return outcome(lambda: (_registry._out_shape(shape, want_dtype), want_dtype))


def out_fast(case):
    def fast():
        got_shape, got_dtype = _registry.out_spec(*case)
        assert all(type(d) is int for d in got_shape) and type(got_shape) is tuple
        return got_shape, got_dtype

    return outcome(fast)


_PROBE = []


def _spec_probe():
    """A throwaway op (not registered) whose declaration returns ``op.spec`` and whose cpu
    kernel writes nothing: the public call's allocation, through ``out_spec``."""
    if not _PROBE:
        from embnum import _backend

        def spec_probe(x):
            return {"x": x}, op.spec

        op = _registry.Op(spec_probe, "jagged", differentiable=(), returns="array", same_as=None)
        embnum.complete_cumsum(np.zeros(1, np.int32))  # loads the cpu backend
        cpu = _backend.BACKENDS["cpu"]

        def write_nothing(x, out):
            pass

        op._kernels[cpu] = (write_nothing, np.empty, cpu.runner(write_nothing))
        _PROBE.append(op)
    return _PROBE[0]


def out_public(case):
    """A public call of an op whose declaration returns the drawn output spec: what it allocated."""
    fn = _spec_probe()
    fn.op.spec = case

    def call():
        try:
            got = fn(np.zeros(1, np.int8))
        except MemoryError:  # within the limit but more than this machine holds: accepted
            return out_exact(case)
        return got.shape, got.dtype

    return outcome(call)


# -- the torch bridge's plain-list recognition ----------------------------------------------------
def _bridge_values():
    """Values a bridge call may pass for a non-tensor argument: scalars of every kind (ints past
    int64, bools, NumPy scalars, subclasses, tensors, None) and (nested) lists and tuples of them."""
    import torch

    class _Str(str):
        pass

    class _Sub(torch.Tensor):
        pass

    t = torch.zeros(1)
    item = st.one_of(
        st.integers(-3, 3),
        st.sampled_from([-(2**63), 2**63 - 1, 2**63, -(2**63) - 1, 2**70]),
        st.booleans(),
        st.integers(-3, 3).map(np.int64),
        st.just(np.True_),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.text(max_size=2),
        st.text(max_size=2).map(_Str),
        st.sampled_from([t, t.as_subclass(_Sub), None]),
    )
    flat = st.one_of(st.lists(item, max_size=4), st.lists(item, max_size=4).map(tuple))
    return st.one_of(item, flat, st.lists(st.one_of(flat, item), max_size=3), st.lists(flat, max_size=3).map(tuple))


def _bridge_items():
    from embnum.torch_bridge import _values

    return st.tuples(st.sampled_from(sorted(_values.PLAIN_LISTS)), _bridge_values())


def _bridge_scalars():
    """Every non-tensor schema type a bridge declares, with :func:`_bridge_values`."""
    from embnum.torch_bridge import BRIDGES

    kinds = sorted({k for b in BRIDGES.values() for k in b.types.values()} - {"Tensor", "Tensor?"})
    return st.tuples(st.sampled_from(kinds), _bridge_values())


def unchanged_fast(case):
    """The bridge's shortcut: a value its kind's test passes is taken as it is, else the check."""
    from embnum.torch_bridge import _values

    kind, x = case
    test = _values.unchanged_test(kind)
    return ("ok", _plain(x)) if test is not None and test(x) else bridge_check("check_exact")(case)


def _plain(x):
    """A comparable form: lists as lists of (type, value or identity)."""
    if isinstance(x, list):
        return ["list", [_plain(y) for y in x]]
    import torch

    if isinstance(x, torch.Tensor):
        return ("tensor", id(x))
    return (type(x).__name__, x)


def bridge_check(check_name):
    """``_values.<check_name>("arg", kind, x)`` as ``("ok", value)`` or ``(error type name, message)``."""

    def run(case):
        from embnum.torch_bridge import _values

        kind, x = case
        try:
            return "ok", _plain(getattr(_values, check_name)("arg", kind, x))
        except (TypeError, ValueError) as e:
            return type(e).__name__, str(e)

    return run


RULES = [
    # jagged: the compiled int32 prefix verdict, the cumsum ops' error, the compiled offsets verdicts
    Rule(
        "jagged-int32-prefix-verdict",
        st.tuples(int32_rows(), st.booleans()),
        fast=int32_prefix_fast,
        exact=lambda c: int32_prefix_exact(*c),
        edges=(  # sums that wrap an int64 product of the bound (max * n), or cross int32 by one
            (_i32(I32.max, 1), False),
            (_i32(I32.max, 1), True),
            (_i32(I32.max, -5, 5), False),
            (_i32(I32.min, -1), False),
            (_i32([I32.min], [I32.min]), False),
            (np.zeros((3, 0), np.int32), False),
        ),
        needs=("numba",),
    ),
    Rule("jagged-cumsum-overflow-error", cumsum_calls(), fast=cumsum_call_fast, exact=cumsum_call_exact),
    declaration_rule("offsets_range", offsets_range_cases()),
    declaration_rule("segment_sum_csr", segment_sum_csr_cases(False)),
    declaration_rule("segment_sum_csr_backward", segment_sum_csr_cases(True)),
    declaration_rule("jagged_to_padded_dense", to_dense_cases("padded")),
    declaration_rule("jagged_1d_to_dense", to_dense_cases("1d")),
    declaration_rule("jagged_2d_to_dense", to_dense_cases("2d")),
    declaration_rule("dense_to_jagged", dense_to_jagged_cases()),
    # kjt: the compiled verdicts and the sizes they give the plan
    declaration_rule("permute_2d_sparse_data", permute_cases(True)),
    declaration_rule("permute_1d_sparse_data", permute_cases(False)),
    declaration_rule("keyed_jagged_index_select_dim1", index_select_cases()),
    declaration_rule("expand_into_jagged_permute", expand_permute_cases()),
    declaration_rule("invert_permute", invert_permute_cases()),
    declaration_rule("block_bucketize_sparse_features", bucketize_cases()),
    declaration_rule("jagged_unique_indices", unique_cases()),
    # keyed_tensor: the compiled verdict of permute_pooled_embs's lists, and the public call's error
    Rule("keyed-tensor-pooled-lists-verdict", pooled_lists(), pooled_verdict, pooled_rules, needs=("numba",)),
    Rule("keyed-tensor-pooled-lists-call", pooled_lists(), pooled_call, pooled_call_rules, needs=("numba",)),
    # tbe: the layout's compiled pass, the lookups' compiled verdict and the bounds check with and without it
    Rule("tbe-layout", layouts(), layout_outcome, without_compiled(layout_outcome), needs=("numba",)),
    Rule("tbe-lookups-verdict", lookups(), lookups_verdict, lookups_accepted, needs=("numba",)),
    Rule("tbe-bounds-check", lookups(), bounds_outcome, bounds_exact, needs=("numba",)),
    # quant: cached formats, name shortcuts
    Rule(
        "quant-hfp8-format-cache",
        st.tuples(st.one_of(st.integers(-2, 9), _ODD), st.one_of(st.integers(-140, 140), _ODD)),
        hfp8_fast,
        hfp8_exact,
        examples=DECLARATION,
    ),
    Rule(
        "quant-output-dtype",
        st.one_of(
            st.sampled_from(["float32", "float16", "FLOAT32", "f4", "bfloat16", "float64", np.float32, np.float16]),
            st.sampled_from([np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64), 3, None]),
        ),
        lambda x: outcome(quant._output_dtype, x),
        lambda x: outcome(v.output_dtype, x),
        examples=DECLARATION,
    ),
    Rule(
        "quant-bit-rate",
        st.one_of(st.sampled_from([2, 4, 8]), st.integers(-1, 9), _ODD),
        lambda b: outcome(quant._bit_rate, b),
        lambda b: outcome(bit_rate_exact, b),
        examples=DECLARATION,
    ),
    Rule(
        "quant-hfp8-max-pos",
        st.tuples(
            st.one_of(st.floats(), st.integers(-5, 500), st.sampled_from([3.3e38, 3.5e38, -3.5e38, 1e300, True])),
            st.sampled_from([(4, 7), (5, 15), (3, 3)]),
        ),
        max_pos_fast,
        max_pos_exact,
        examples=DECLARATION,
    ),
    Rule(
        "quant-bfloat16-bits",
        st.sampled_from([np.uint16, np.int16, ">u2", np.float32, np.uint8]).flatmap(
            lambda dt: st.lists(st.integers(0, 255), max_size=4).map(lambda x: np.array(x).astype(dt))
        ),
        bfloat16_fast,
        bfloat16_exact,
    ),
    # integer lists (table sizes, counts): exact non-negative ints within MAX_SIZE in one expression
    Rule(
        "validate-int-list",
        INT_LISTS,
        lambda items: outcome(v.int_list, "input_rows", items),
        int_list_exact,
        examples=DECLARATION,
        edges=([], [0, 2**48], [0, 2**48 + 1], [True, 1], [1, -1], (3, np.int64(4)), [2**48 - 1, 0, 5]),
        agree=same_ints,
    ),
    # in-place ops: no_alias against np.may_share_memory's bounds verdict, pair by pair
    Rule(
        "alias-no-alias",
        argument_sets(),
        built(lambda c: outcome(v.no_alias, *c)),
        built(alias_oracle),
        edges=HOSTILE_STRIDES,
    ),
    # the registry's output check: the one-loop common case and through a public call
    Rule("out-spec", OUT_CASES, out_fast, out_exact, edges=OUT_EDGES),
    Rule("out-spec-public-call", OUT_CASES, out_public, out_exact, edges=OUT_EDGES),
    # the torch bridge: the one-pass recognition of plain lists
    Rule(
        "bridge-plain-lists",
        st.deferred(_bridge_items),
        bridge_check("check_value"),
        bridge_check("check_exact"),
        examples=300,  # no kernels: microseconds an example
        needs=("torch",),
    ),
    # the torch bridge: scalars (and None where optional) taken as they are without the check
    Rule(
        "bridge-unchanged-scalars",
        st.deferred(_bridge_scalars),
        unchanged_fast,
        bridge_check("check_exact"),
        examples=300,
        edges=(
            ("int", 2**63 - 1),
            ("int", 2**63),
            ("SymInt", -(2**63) - 1),
            ("bool", np.True_),
            ("float", 3),
            ("int?", None),
            ("Tensor[]?", None),
            ("str?", None),
            ("int", True),
            ("float", True),
        ),
        needs=("torch",),
    ),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_shortcut_agrees_with_its_rule(rule):
    for package in rule.needs:
        pytest.importorskip(package)

    @given(case=rule.cases)
    def run(case):
        fast, exact = rule.fast(case), rule.exact(case)
        assert rule.agree(fast, exact), f"{rule.name}: through the shortcut {fast!r}, by the rule {exact!r}"

    for edge in rule.edges:
        run = example(case=edge)(run)
    if rule.examples is not None:
        run = settings(max_examples=rule.examples)(run)
    run()
