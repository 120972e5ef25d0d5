"""Tour and benchmark inputs of the jagged family (``@example``; see ``embnum.examples``)."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.jagged import (
    complete_cumsum,
    dense_to_jagged,
    exclusive_cumsum,
    inclusive_cumsum,
    jagged_1d_to_dense,
    jagged_2d_to_dense,
    jagged_to_padded_dense,
    offsets_range,
    segment_sum_csr,
    segment_sum_csr_backward,
)


def _lengths(rng, B, max_len):
    return rng.integers(0, max_len + 1, size=B)


def _offsets(lengths, dtype=np.int64):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


_SIZES = {"small": dict(B=24, L=6, D=5, N=100), "large": dict(B=4096, L=64, D=128, N=26 * 4096)}


@example(complete_cumsum)
def _(rng, size):
    N = _SIZES[size]["N"]
    return Example(dict(lengths=_lengths(rng, N, 64).astype(np.int32)), f"[{N}] int32")


@example(exclusive_cumsum)
def _(rng, size):
    N = _SIZES[size]["N"]
    return Example(dict(lengths=_lengths(rng, N, 64)), f"[{N}] int64")


@example(inclusive_cumsum)
def _(rng, size):
    N = _SIZES[size]["N"]
    return Example(dict(lengths=_lengths(rng, N, 64)), f"[{N}] int64")


@example(offsets_range)
def _(rng, size):
    s = _SIZES[size]
    offs = _offsets(_lengths(rng, s["B"] * 26, s["L"] // 2))
    return Example(dict(offsets=offs[:-1], range_size=int(offs[-1])), f"{len(offs) - 1} segments, {offs[-1]} elements")


@example(segment_sum_csr)
def _(rng, size):
    s = _SIZES[size]
    bs = s["B"]
    csr = _offsets(_lengths(rng, 26, 8))
    vals = rng.standard_normal(int(csr[-1]) * bs).astype(np.float32)
    return Example(dict(batch_size=bs, csr_seg=csr, values=vals), f"26 runs, {vals.size} float32")


@example(segment_sum_csr_backward)
def _(rng, size):
    s = _SIZES[size]
    bs = s["B"]
    csr = _offsets(_lengths(rng, 26, 8))
    grad = rng.standard_normal(26).astype(np.float32)
    return Example(
        dict(batch_size=bs, csr_seg=csr, grad_output=grad, num_values=int(csr[-1]) * bs),
        f"26 runs -> {int(csr[-1]) * bs}",
    )


def _jagged_2d(rng, size, dtype=np.float32):
    s = _SIZES[size]
    offs = _offsets(_lengths(rng, s["B"], s["L"]))
    vals = rng.standard_normal((int(offs[-1]), s["D"])).astype(dtype)
    return s, vals, offs


@example(jagged_to_padded_dense)
def _(rng, size):
    s, vals, offs = _jagged_2d(rng, size)
    return Example(
        dict(values=vals, offsets=[offs], max_lengths=[s["L"]], padding_value=0.0),
        f"B={s['B']}, L<={s['L']}, D={s['D']} float32",
    )


@example(jagged_1d_to_dense)
def _(rng, size):
    s = _SIZES[size]
    offs = _offsets(_lengths(rng, s["B"] * 8, s["L"]))
    ids = rng.integers(0, 10**6, size=int(offs[-1]))
    return Example(
        dict(values=ids, offsets=offs, max_sequence_length=s["L"] // 2, padding_value=-1), f"B={s['B'] * 8} int64 ids"
    )


@example(jagged_2d_to_dense)
def _(rng, size):
    s, vals, offs = _jagged_2d(rng, size, np.float16)
    return Example(dict(values=vals, offsets=offs, max_sequence_length=s["L"]), f"B={s['B']}, D={s['D']} float16")


@example(dense_to_jagged)
def _(rng, size):
    s = _SIZES[size]
    offs = _offsets(_lengths(rng, s["B"], s["L"]))
    dense = rng.standard_normal((s["B"], s["L"], s["D"])).astype(np.float32)
    return Example(dict(dense=dense, offsets=[offs]), f"B={s['B']}, L<={s['L']}, D={s['D']} float32")
