"""Stand-ins for fbgemm_gpu's pooled-embedding permutes (``permute_pooled_embedding_modules`` and
``..._split``), on embnum's ``permute_pooled_embs`` op (differentiable).

Both reorder the feature blocks of a pooled output ``[B, sum(embs_dims)]``: block ``i`` of the result
is input block ``permute[i]``. ``PermutePooledEmbeddings`` is a plain callable (as fbgemm's);
``PermutePooledEmbeddingsSplit`` is a module whose four int64 index tensors are buffers (fbgemm's
names, so state dicts carry over).
"""

from __future__ import annotations

from itertools import accumulate

import torch

from .._validate import MAX_SIZE, integer

__all__ = ["PermutePooledEmbeddings", "PermutePooledEmbeddingsSplit"]


def _ints(name, values, low, high):
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints, got {values!r:.80}")
    return [integer(f"{name}[{i}]", v, min=low, max=high) for i, v in enumerate(values)]


def _index_tensors(embs_dims, permute, device) -> dict[str, torch.Tensor]:
    embs_dims = _ints("embs_dims", embs_dims, 0, MAX_SIZE)
    permute = _ints("permute", permute, 0, max(len(embs_dims) - 1, 0))
    if sum(embs_dims) > MAX_SIZE:
        raise ValueError(f"embs_dims sum to {sum(embs_dims)}, more than {MAX_SIZE} columns")
    if sorted(permute) != list(range(len(embs_dims))):
        raise ValueError(
            f"permute must be a permutation of 0..{len(embs_dims) - 1} (one entry per embs_dims entry), got {permute}"
        )
    inverse = [0] * len(permute)
    for i, p in enumerate(permute):
        inverse[p] = i

    def as_tensor(values):
        return torch.tensor(values, device=device, dtype=torch.int64)

    return {
        "_offset_dim_list": as_tensor([0, *accumulate(embs_dims)]),
        "_permute": as_tensor(permute),
        "_inv_offset_dim_list": as_tensor([0, *accumulate(embs_dims[p] for p in permute)]),
        "_inv_permute": as_tensor(inverse),
    }


def _permute(pooled_embs, offsets, permute, inv_offsets, inv_permute):
    from ..torch_bridge import permute_pooled_embs

    width = int(offsets[-1])
    if not isinstance(pooled_embs, torch.Tensor) or pooled_embs.dim() != 2 or pooled_embs.shape[1] != width:
        shape = list(pooled_embs.shape) if isinstance(pooled_embs, torch.Tensor) else type(pooled_embs).__name__
        raise ValueError(f"pooled_embs must be [B, {width}] (the embs_dims summed), got {shape}")
    on = pooled_embs.device
    return permute_pooled_embs(pooled_embs, offsets.to(on), permute.to(on), inv_offsets.to(on), inv_permute.to(on))


class PermutePooledEmbeddings:
    """``PermutePooledEmbeddings(embs_dims, permute, device=None)(pooled_embs) -> Tensor``, same shape."""

    def __init__(self, embs_dims, permute, device: torch.device | None = None) -> None:
        for name, t in _index_tensors(embs_dims, permute, device).items():
            setattr(self, name, t)

    def __call__(self, pooled_embs: torch.Tensor) -> torch.Tensor:
        return _permute(pooled_embs, self._offset_dim_list, self._permute, self._inv_offset_dim_list, self._inv_permute)


class PermutePooledEmbeddingsSplit(torch.nn.Module):
    """The module form: ``forward(pooled_embs) -> Tensor``, same shape; the index tensors are buffers."""

    def __init__(self, embs_dims, permute, device: torch.device | None = None) -> None:
        super().__init__()
        for name, t in _index_tensors(embs_dims, permute, device).items():
            self.register_buffer(name, t)

    def forward(self, pooled_embs: torch.Tensor) -> torch.Tensor:
        return _permute(pooled_embs, self._offset_dim_list, self._permute, self._inv_offset_dim_list, self._inv_permute)
