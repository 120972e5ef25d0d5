"""The KeyedTensor regroup as a torch module, on the bridge's ``permute_multi_embedding``."""

from __future__ import annotations

import torch

from ..ops.keyed_tensor import kt_regroup_arguments as _kt_regroup_numpy
from ..torch_bridge import permute_multi_embedding

_Arguments = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # permutes, in_shapes, out_shapes


class PermuteMultiEmbedding(torch.nn.Module):
    """Regroup the pooled embeddings of several KeyedTensors into new groups, differentiably.

    ``keys``, ``lengths`` and ``groups`` are given once (as for
    :func:`kt_regroup_arguments`). ``forward(values)`` takes the list of ``[B, D_i]``
    tensors (``D_i = sum(lengths[i])``) and returns one ``[B, width_j]`` tensor per group,
    through ``embnum.torch_bridge.permute_multi_embedding`` (``torch.ops.embnum.permute_multi_embedding``
    wherever torch.compile or a mode watches); the inputs are never concatenated.
    The permute arguments are built once per device and cached, so after the first call
    on a device nothing is copied from the host to it for the arguments.
    """

    def __init__(self, keys, lengths, groups, *, backend=None):
        super().__init__()
        permutes, in_shapes, out_shapes, out_lengths = _kt_regroup_numpy(None, keys, lengths, groups)
        self._host = (torch.from_numpy(permutes), torch.from_numpy(in_shapes), torch.from_numpy(out_shapes))
        self.keys = [list(k) for k in keys]
        self.lengths = [[int(n) for n in ls] for ls in lengths]
        self.groups = [list(g) for g in groups]
        self.out_lengths = out_lengths
        self.in_lengths = in_shapes.tolist()
        self.backend = backend
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {
            self._host[0].device: self._host
        }

    def arguments(self, device) -> _Arguments:
        """``(permutes, in_shapes, out_shapes)`` on ``device`` (copied there on first use only)."""
        device = torch.device(device)
        args = self._on_device.get(device)
        if args is None:
            permutes, in_shapes, out_shapes = (a.to(device) for a in self._host)
            args = self._on_device[device] = (permutes, in_shapes, out_shapes)
        return args

    def forward(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(values) != len(self.in_lengths):
            raise ValueError(
                f"values must hold {len(self.in_lengths)} tensors (one per input KeyedTensor), got {len(values)}"
            )
        permutes, in_shapes, out_shapes = self.arguments(values[0].device)
        return permute_multi_embedding(
            list(values), permutes, in_shapes, out_shapes, self.out_lengths, backend=self.backend
        )

    def extra_repr(self) -> str:
        """One line per input KeyedTensor (its keys and widths), one per output group."""
        ins = [
            f"in {i}: " + ", ".join(f"{k}:{n}" for k, n in zip(keys, ls)) + f" (width {w})"
            for i, (keys, ls, w) in enumerate(zip(self.keys, self.lengths, self.in_lengths))
        ]
        outs = [
            f"out {j}: " + ", ".join(map(str, g)) + f" (width {w})"
            for j, (g, w) in enumerate(zip(self.groups, self.out_lengths))
        ]
        return "\n".join(ins + outs)
