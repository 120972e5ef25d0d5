"""What the verdict agreement tests share (``tests/test_verdicts_*.py``): hostile index entries, the
outcome of a declaration as plain data, and the check that the compiled one-pass verdicts
(``_validate_numba``) and the exact Python rules (``_validate.compiled`` stubbed to None) agree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from embnum import _validate

BIG = 2**63 - 1
HOSTILE = st.one_of(
    st.integers(-3, 12),
    st.sampled_from([-(2**63), -(2**31), -1, 2**31 - 1, 2**31, 2**47, 2**48, 2**62, BIG - 1, BIG]),
)
INDEX = st.sampled_from([np.int32, np.int64])


def outcome(decl, *args, **kwargs):
    """The plan as plain data, or ``(error type, message)``."""
    try:
        plan = decl(*args, **kwargs)
    except (ValueError, TypeError, IndexError) as e:
        return type(e).__name__, str(e)
    plan_args, planned = plan
    outs = planned if isinstance(planned, list) or (isinstance(planned, tuple) and len(planned) != 2) else [planned]
    args = {
        k: (a.tolist(), str(a.dtype)) if isinstance(a, np.ndarray) else repr(a) for k, a in sorted(plan_args.items())
    }
    return args, [None if o is None else (o[0], str(np.dtype(o[1]))) for o in outs], type(planned).__name__


def same_both_ways(decl, *args, **kwargs):
    fast = outcome(decl, *args, **kwargs)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_validate, "compiled", lambda: None)
        exact = outcome(decl, *args, **kwargs)
    assert fast == exact
    return fast


def cast_index(dtype, a):
    """``a`` in ``dtype`` (one index dtype per example: few compiled signatures, each a compile on
    a fresh checkout), or in int64 where an entry does not fit int32."""
    a = np.asarray(a, np.int64)
    if dtype == np.int32 and (a.size == 0 or np.abs(a).max() < 2**31):
        return a.astype(np.int32)
    return a


def maybe_break(draw, arrays):
    """Maybe replace one entry of one of ``arrays`` (a list of int64 arrays) by a hostile value,
    or drop/append an entry."""
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
