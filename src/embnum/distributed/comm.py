"""Collectives for sharded embeddings, over ``torch.distributed``, with optional codecs.

Raw exchanges (no autograd; the sharded module calls them from its own
autograd node so that every rank runs its collectives in one fixed order):

* :func:`exchange_blocks`: all-to-all of 2-D row blocks of different
  widths (``all_to_all_single`` with variable splits, on the bytes of the
  payload, so any codec's wire dtype travels on gloo too);
* :func:`reduce_scatter_rows`: rows ``[sum(splits), C]`` summed over ranks,
  rank ``r`` keeping its ``splits[r]`` rows (``dist.reduce_scatter``; with a
  codec, an all-to-all of the encoded partial sums, decoded and added in
  float32 in rank order at the receiver: a quantized payload cannot be summed
  on the wire);
* :func:`all_gather_rows`: every rank's ``[splits[r], C]`` rows, concatenated.

Autograd functions on top of them (public API, each differentiable):
:func:`all_to_all`, :func:`reduce_scatter`, :func:`all_reduce`.

Codecs come from :mod:`embnum.torch_bridge.codecs` (:class:`QCommsConfig`
names them: ``"fp16"``, ``"bf16"``, ``"fp8"`` (HFP8, fbgemm's comm format),
``"int8"`` (row-wise, one scale/bias per row of a block)). :data:`BYTES`
counts the bytes each collective sends from this rank (for the benchmark).
"""

from __future__ import annotations

import collections
import dataclasses
import time

import torch
import torch.distributed as dist

from ..torch_bridge.codecs import BF16Codec, Codec, FP16Codec, HFP8Codec, Int8RowwiseCodec

BYTES: collections.Counter = collections.Counter()  # collective name -> bytes sent by this rank
SECONDS: collections.Counter = collections.Counter()  # collective name -> seconds spent in it (codecs included)
_NAMES = {"fp16": FP16Codec, "bf16": BF16Codec, "fp8": HFP8Codec, "hfp8": HFP8Codec, "int8": Int8RowwiseCodec}


def codec_of(spec) -> Codec | None:
    """``None``/``"none"``, a codec name (``fp16``, ``bf16``, ``fp8``, ``int8``) or a codec object."""
    if spec is None or (isinstance(spec, str) and spec.lower() in ("none", "fp32")):
        return None
    if isinstance(spec, Codec):
        return spec
    if isinstance(spec, str) and spec.lower() in _NAMES:
        return _NAMES[spec.lower()]()
    raise ValueError(f"codec must be None, one of {sorted(_NAMES)} or a codec object, got {spec!r}")


@dataclasses.dataclass(frozen=True)
class QCommsConfig:
    """Codecs of the pooled collectives: ``forward`` for the embeddings, ``backward`` for their gradients."""

    forward: object = None
    backward: object = None

    def codecs(self) -> tuple[Codec | None, Codec | None]:
        return codec_of(self.forward), codec_of(self.backward)


def _world(group):
    return dist.get_world_size(group), dist.get_rank(group)


def _encode(block: torch.Tensor, codec: Codec | None) -> torch.Tensor:
    """Bytes of one ``[rows, cols]`` float block on the wire (uint8, flat)."""
    if block.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=block.device)
    if codec is None:
        return block.contiguous().float().reshape(-1).view(torch.uint8)
    ctx = codec.create_context(block.shape[1]) if isinstance(codec, Int8RowwiseCodec) else codec.create_context()
    return codec.encode(block.contiguous().float(), ctx).reshape(-1).view(torch.uint8)


def _wire_bytes(rows: int, cols: int, codec: Codec | None) -> int:
    n = rows * cols
    if n == 0:
        return 0
    if codec is None:
        return 4 * n
    if isinstance(codec, Int8RowwiseCodec):
        return rows * (cols + 8)
    return n * torch.empty(0, dtype=codec.quantized_dtype).element_size()


def _decode(payload: torch.Tensor, rows: int, cols: int, codec: Codec | None, device) -> torch.Tensor:
    if rows * cols == 0:
        return torch.zeros(rows, cols, dtype=torch.float32, device=device)
    if codec is None:
        return payload.view(torch.float32).reshape(rows, cols)
    ctx = codec.create_context(cols) if isinstance(codec, Int8RowwiseCodec) else codec.create_context()
    return codec.decode(payload.view(codec.quantized_dtype), ctx).reshape(rows, cols).float()


def exchange_blocks(blocks, recv_shapes, group=None, codec=None, name="all_to_all") -> list[torch.Tensor]:
    """All-to-all of row blocks: ``blocks[d]`` (2-D float) goes to rank ``d``; returns the blocks
    received, ``recv_shapes[s] = (rows, cols)`` from rank ``s``, decoded to float32."""
    t0 = time.perf_counter()
    world, _ = _world(group)
    if len(blocks) != world or len(recv_shapes) != world:
        raise ValueError(f"need one block and one receive shape per rank ({world}), got {len(blocks)}")
    payloads = [_encode(b, codec) for b in blocks]
    send = torch.cat(payloads) if payloads else torch.empty(0, dtype=torch.uint8)
    recv_sizes = [_wire_bytes(r, c, codec) for r, c in recv_shapes]
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=send.device)
    dist.all_to_all_single(recv, send, recv_sizes, [p.numel() for p in payloads], group=group)
    BYTES[name] += int(send.numel())
    out, start = [], 0
    for (r, c), n in zip(recv_shapes, recv_sizes):
        out.append(_decode(recv[start : start + n], r, c, codec, send.device))
        start += n
    SECONDS[name] += time.perf_counter() - t0
    return out


def reduce_scatter_rows(x: torch.Tensor, splits, group=None, codec=None) -> torch.Tensor:
    """``x`` ``[sum(splits), C]`` float32 on every rank -> the sum over ranks of rows
    ``[off_r, off_r + splits[r])`` on rank ``r`` (``[splits[r], C]``)."""
    world, rank = _world(group)
    splits = [int(s) for s in splits]
    C = x.shape[1]
    if codec is None:
        t0 = time.perf_counter()
        out = torch.empty(splits[rank], C, dtype=torch.float32, device=x.device)
        chunks = [c.contiguous() for c in x.float().split(splits)]
        if x.numel():
            dist.reduce_scatter(out, chunks, group=group)
        else:  # nothing anywhere (C == 0 or an empty global batch): no collective needed, all ranks agree
            out.zero_()
        BYTES["reduce_scatter"] += int(x.numel()) * 4
        SECONDS["reduce_scatter"] += time.perf_counter() - t0
        return out
    parts = exchange_blocks(list(x.split(splits)), [(splits[rank], C)] * world, group, codec, "reduce_scatter")
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


def all_gather_rows(x: torch.Tensor, splits, group=None, codec=None, name="all_gather") -> torch.Tensor:
    """Rank ``r``'s ``x`` ``[splits[r], C]``, concatenated over ranks in rank order (every rank)."""
    world, _ = _world(group)
    C = x.shape[1]
    parts = exchange_blocks([x] * world, [(int(s), C) for s in splits], group, codec, name)
    return torch.cat(parts) if parts else x


def gather_sizes(n: int, group=None, device=None) -> list[int]:
    """Every rank's ``n`` (an int), in rank order."""
    world, _ = _world(group)
    mine = torch.tensor([n], dtype=torch.int64, device=device)
    out = torch.empty(world, dtype=torch.int64, device=device)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, mine, group=group)
    return [int(v) for v in out.tolist()]


# -- autograd functions ------------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_rows, recv_rows, recv_cols, group, fwd, bwd):
        ctx.meta = (list(send_rows), list(recv_rows), list(recv_cols), x.shape[1], group, bwd)
        blocks = list(x.float().split(list(send_rows)))
        got = exchange_blocks(blocks, list(zip(recv_rows, recv_cols)), group, fwd)
        return torch.cat([g.reshape(-1) for g in got])

    @staticmethod
    def backward(ctx, grad):
        send_rows, recv_rows, recv_cols, C, group, bwd = ctx.meta
        blocks, start = [], 0
        for r, c in zip(recv_rows, recv_cols):
            blocks.append(grad[start : start + r * c].reshape(r, c))
            start += r * c
        back = exchange_blocks(blocks, [(r, C) for r in send_rows], group, bwd, "all_to_all_backward")
        return torch.cat(back), None, None, None, None, None, None


def all_to_all(x, send_rows, recv_rows, recv_cols, group=None, qcomm: QCommsConfig | None = None):
    """Differentiable all-to-all: rows ``x[off_d : off_d + send_rows[d]]`` of ``x`` ``[N, C]`` go to
    rank ``d``; returns the flat concatenation of the received blocks ``[recv_rows[s], recv_cols[s]]``
    (float32). Backward sends the gradient blocks back (the ``backward`` codec)."""
    fwd, bwd = (qcomm or QCommsConfig()).codecs()
    return _AllToAll.apply(x, list(send_rows), list(recv_rows), list(recv_cols), group, fwd, bwd)


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, splits, group, fwd, bwd):
        ctx.meta = (list(splits), group, bwd)
        return reduce_scatter_rows(x, splits, group, fwd)

    @staticmethod
    def backward(ctx, grad):
        splits, group, bwd = ctx.meta
        return all_gather_rows(grad.contiguous(), splits, group, bwd, "reduce_scatter_backward"), None, None, None, None


def reduce_scatter(x, splits, group=None, qcomm: QCommsConfig | None = None):
    """Differentiable reduce-scatter of rows (see :func:`reduce_scatter_rows`); backward all-gathers."""
    fwd, bwd = (qcomm or QCommsConfig()).codecs()
    return _ReduceScatter.apply(x, [int(s) for s in splits], group, fwd, bwd)


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        y = x.detach().clone()
        dist.all_reduce(y, group=group)
        BYTES["all_reduce"] += y.numel() * y.element_size()
        return y

    @staticmethod
    def backward(ctx, grad):
        g = grad.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def all_reduce(x, group=None):
    """Differentiable sum over ranks (every rank gets the sum; backward: the sum of the gradients)."""
    return _AllReduce.apply(x, group)


def all_reduce_gradients(parameters, group=None):
    """Sum every parameter's ``.grad`` over ranks in place (replicated dense layers, DDP-style)."""
    for p in parameters:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            BYTES["all_reduce"] += p.grad.numel() * p.grad.element_size()
