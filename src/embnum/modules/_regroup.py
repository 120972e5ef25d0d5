"""The lookups of one TBE call of an :class:`~embnum.modules.EmbeddingBagCollection` from a
KeyedJaggedTensor whose key order is not the call's, computed on the tensors' device with no
device-to-host read (``docs/gpu.md``).

A TBE call takes ``indices [N]`` and ``offsets [T*B+1]`` (bag ``t*B + b`` is
``indices[offsets[t*B+b]:offsets[t*B+b+1]]``, ``offsets[-1] == N``, positions before
``offsets[0]`` in no bag). Regrouping the KeyedJaggedTensor by key (a permute) moves only the call's
keys, so its output size is the sum of their lengths: data the host would have to read. Here every
key is moved instead, the call's keys last and in the call's order and the others first, so the
moved values keep the size ``N`` of the KeyedJaggedTensor's and the call's offsets start at the
others' total (a device scalar): its bags, their order and the order of the ids in each bag are the
permute's, so the TBE gives the same bits. Every step is a torch operation on the device whose
output size follows from the shapes (``repeat_interleave`` is told its ``output_size``).

The key layout (which keys move where, as an index tensor on the device) is computed once per key
order and call, and kept.
"""

from __future__ import annotations

import torch

from .._cache import BoundedCache


class KeyOrder:
    """One call's features among ``keys`` (their positions ``perm``): how its lookups are taken."""

    def __init__(self, n_keys: int, perm: list[int], device):
        self.n_keys, self.n_call = n_keys, len(perm)
        self.identity = perm == list(range(n_keys))
        # the call's keys already the last ones, in order: its lookups are a suffix, nothing moves
        self.suffix = perm == list(range(n_keys - len(perm), n_keys))
        others = [k for k in range(n_keys) if k not in set(perm)]
        self.perm = torch.tensor(others + perm, dtype=torch.int64, device=device)
        self.call = torch.tensor(perm, dtype=torch.int64, device=device)


_ORDERS = BoundedCache(64)  # (keys, the call's positions, device) -> KeyOrder


def key_order(keys: tuple, perm: list[int], device) -> KeyOrder:
    """The :class:`KeyOrder` of the call reading ``perm`` among ``keys`` on ``device`` (kept)."""
    key = (keys, tuple(perm), device)
    found = _ORDERS.get(key)
    if found is None:
        found = KeyOrder(len(keys), perm, device)
        _ORDERS.put(key, found)
    return found


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(lengths)]`` in int64 on the lengths' device (no read; the lengths were checked
    when their KeyedJaggedTensor was built, and the TBE call checks the offsets again)."""
    out = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def call_lookups(order: KeyOrder, values, weights, lengths, stride: int):
    """``(indices, offsets, per_sample_weights)`` of the call: ``values [N]`` and ``weights [N]`` (or
    None) of a KeyedJaggedTensor with ``lengths [n_keys * stride]`` (fixed batch), as
    the call's TBE takes them (see the module docstring). Differentiable in ``weights``."""
    K, B = order.n_keys, stride
    if order.identity or order.suffix:  # nothing to move
        offsets = complete_cumsum(lengths)
        if not order.identity:
            offsets = offsets[(K - order.n_call) * B :]
        return values, offsets, weights
    N = values.shape[0]
    per_key = lengths.reshape(K, B).to(torch.int64)
    key_len = per_key.sum(1)
    key_start = torch.cumsum(key_len, 0) - key_len
    out_len = key_len[order.perm]
    out_start = torch.cumsum(out_len, 0) - out_len
    shift = torch.repeat_interleave(out_start - key_start[order.perm], out_len, output_size=N)
    src = torch.arange(N, device=values.device) - shift  # output position p reads src[p]
    call_lengths = per_key[order.call].reshape(-1)
    offsets = complete_cumsum(call_lengths)
    offsets += N - offsets[-1]  # the other keys' values come first, outside every bag
    return values[src], offsets, None if weights is None else weights[src]
