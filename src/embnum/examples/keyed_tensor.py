"""Tour and benchmark inputs of the keyed_tensor family (``@example``; see ``embnum.examples``)."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.keyed_tensor import (
    kt_regroup_arguments,
    permute_multi_embedding,
    permute_multi_embedding_backward,
    permute_pooled_embs,
    regroup_keyed_tensor,
)

CLASSIC_KEYS = [["f1", "f2"], ["f3", "f4", "f5"], ["f6"]]
CLASSIC_LENGTHS = [[96, 256], [512, 128, 768], [1024]]
CLASSIC_GROUPS = [["f1", "f3"], ["f2"], ["f4", "f1", "f6"], ["f1", "f5"]]
_SMALL_LENGTHS = [[3, 4], [5, 6, 7], [8]]


def classic_case(rng, B, *, small=False, dtype=np.float32):
    """The classic TorchRec case (``docs/families/keyed_tensor.md``): ``(pooled_embs, keys, lengths, groups)``."""
    lengths = _SMALL_LENGTHS if small else CLASSIC_LENGTHS
    embs = [rng.standard_normal((B, sum(ls))).astype(dtype) for ls in lengths]
    return embs, CLASSIC_KEYS, lengths, CLASSIC_GROUPS


def _B(size):
    return 6 if size == "small" else 2048


@example(permute_pooled_embs)
def _(rng, size):
    B = _B(size)
    dims = rng.integers(1, 9 if size == "small" else 257, size=8)
    perm = rng.permutation(8)
    offs = np.concatenate([[0], np.cumsum(dims)])
    inv_offs = np.concatenate([[0], np.cumsum(dims[perm])])
    x = rng.standard_normal((B, int(offs[-1]))).astype(np.float32)
    return Example(
        dict(
            pooled_embs=x,
            offset_dim_list=offs,
            permute_list=perm,
            inv_offset_dim_list=inv_offs,
            inv_permute_list=np.argsort(perm),
        ),
        f"B={B}, 8 groups, D={int(offs[-1])} float32",
    )


@example(kt_regroup_arguments)
def _(rng, size):
    return Example(
        dict(embs=None, keys=CLASSIC_KEYS, lengths=CLASSIC_LENGTHS, groups=CLASSIC_GROUPS), "classic case, 8 rows"
    )


def _classic_args(rng, size):
    embs, keys, lengths, groups = classic_case(rng, _B(size), small=size == "small")
    return embs, kt_regroup_arguments(None, keys, lengths, groups), (keys, lengths, groups)


@example(permute_multi_embedding)
def _(rng, size):
    embs, (perm, ins, outs, out_lengths), _ = _classic_args(rng, size)
    return Example(
        dict(pooled_embs=embs, permutes=perm, in_shapes=ins, out_shapes=outs, out_lengths=out_lengths),
        f"classic case, B={_B(size)} float32",
    )


@example(permute_multi_embedding_backward)
def _(rng, size):
    embs, (perm, ins, outs, out_lengths), _ = _classic_args(rng, size)
    grads = [rng.standard_normal((_B(size), w)).astype(np.float32) for w in out_lengths]
    return Example(
        dict(grad_outputs=grads, permutes=perm, in_shapes=ins, out_shapes=outs, in_lengths=ins.tolist()),
        f"classic case, B={_B(size)} float32",
    )


@example(regroup_keyed_tensor)
def _(rng, size):
    embs, _, (keys, lengths, groups) = _classic_args(rng, size)
    return Example(
        dict(pooled_embs=embs, keys=keys, lengths=lengths, groups=groups), f"classic case, B={_B(size)} float32"
    )
