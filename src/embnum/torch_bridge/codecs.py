"""Communication codecs for sharded training, in TorchRec's ``QuantizedCommCodec`` shape.

A codec compresses the payload of a collective (all-to-all of pooled
embeddings, reduce-scatter of gradients): ``encode`` before it, ``decode``
after it. Every codec has

* ``encode(input, ctx=None) -> Tensor`` and ``decode(payload, ctx=None) -> Tensor``;
* ``quantized_dtype``: the dtype of the payload on the wire;
* ``calc_quantized_size(input_len, ctx=None)``: payload elements for
  ``input_len`` input elements (size the receive buffer with it);
* ``create_context()``: the optional per-call context (``None`` for the
  element-wise codecs; a :class:`RowwiseContext` for the row-wise one);
* ``error_bound(input)``: the stated error, an upper bound on
  ``|decode(encode(input)) - input|`` per element (tested);
* ``round_trip(input, ctx=None)``: ``decode(encode(input))`` with a
  **straight-through gradient**: the incoming gradient passes unchanged (cast
  to the input's dtype). quant.md gives no derivative for rounding (it is 0
  almost everywhere); straight-through is the estimator sharded training
  uses (TorchRec's quantized all-to-all treats the codec as the identity in
  backward and compresses the gradient with its own backward codec).

Codecs (elements of float32 input; float16 input is accepted where the op
takes it):

| codec | wire dtype | stated error per element |
| --- | --- | --- |
| :class:`FP16Codec` | float16 | ``|x| <= 65504``: ``max(2**-11 |x|, 2**-25)``; beyond: saturates to +-65504 |
| :class:`BF16Codec` | bfloat16 | ``max(2**-8 |x|, 2**-134)`` (finite ``|x| < 3.39e38``) |
| :class:`HFP8Codec` | uint8 | ``|x| <= max_pos``: ``max(2**-(m+1) |x|, 2**(-bias-m))``; beyond: saturates |
| :class:`Int8RowwiseCodec` | uint8 | per row: ``scale/2 + 1e-8 + 4 ulp(max|row|)``, ``scale = (max - min)/255`` |
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
import torch

from .. import _validate as v
from ..ops.quant import hfp8_format, hfp8_largest, hfp8_usual_max_pos


def _row_dim(name, d):
    if v.size(name, d) < 1:
        raise ValueError(f"{name} must be >= 1, got {d}")


def _backend_name(backend):
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {backend!r}")


def _op(name):
    return getattr(torch.ops.embnum, name).default


class _StraightThrough(torch.autograd.Function):
    """Forward: the codec's round trip. Backward: the gradient, unchanged."""

    @staticmethod
    def forward(ctx, x, codec, qctx):
        ctx.dtype = x.dtype
        return codec.decode(codec.encode(x, qctx), qctx).reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None, None


class Codec:
    """The interface (see the module docstring); subclasses give encode/decode/size/bound."""

    quantized_dtype: torch.dtype

    def create_context(self):
        return None

    def calc_quantized_size(self, input_len: int, ctx=None) -> int:
        return v.size("input_len", input_len)

    def round_trip(self, input: torch.Tensor, ctx=None) -> torch.Tensor:
        """``decode(encode(input))`` in ``input``'s shape and dtype, straight-through gradient."""
        return _StraightThrough.apply(input, self, ctx)

    def error_bound(self, input: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class FP16Codec(Codec):
    """float32 -> float16 (``float_to_fp16``, saturating by default, as TorchRec's FP16 codec)."""

    saturate: bool = True
    backend: str | None = None
    quantized_dtype = torch.float16

    def __post_init__(self):
        if not isinstance(self.saturate, (bool, np.bool_)):
            raise TypeError(f"saturate must be a bool, got {self.saturate!r}")
        _backend_name(self.backend)

    def encode(self, input, ctx=None):
        return _op("float_to_fp16")(input.float(), self.saturate, self.backend)

    def decode(self, payload, ctx=None):
        return _op("fp16_to_float")(payload, self.backend)

    def error_bound(self, input):
        a = input.double().abs()
        inside = torch.clamp(2.0**-11 * a, min=2.0**-25)
        return torch.where(a <= 65504, inside, (a - 65504) * (1 + 1e-9))


@dataclasses.dataclass(frozen=True)
class BF16Codec(Codec):
    """float32 -> bfloat16 (``float_to_bfloat16``: fbgemm's rounding, ties away from zero)."""

    backend: str | None = None
    quantized_dtype = torch.bfloat16

    def __post_init__(self):
        _backend_name(self.backend)

    def encode(self, input, ctx=None):
        return _op("float_to_bfloat16")(input.float(), self.backend)

    def decode(self, payload, ctx=None):
        return _op("bfloat16_to_float")(payload, self.backend)

    def error_bound(self, input):
        return torch.clamp(2.0**-8 * input.double().abs(), min=2.0**-134)


@dataclasses.dataclass(frozen=True)
class HFP8Codec(Codec):
    """float32 -> hybrid 8-bit float (``float_to_hfp8``). Defaults: fbgemm's comm codec format
    (4 exponent bits, bias 15, the customary ``max_pos``)."""

    ebits: int = 4
    exponent_bias: int = 15
    max_pos: float | None = None
    backend: str | None = None
    quantized_dtype = torch.uint8

    def __post_init__(self):  # the NumPy API's checks, at construction
        ebits, bias, _ = hfp8_format(self.ebits, self.exponent_bias)
        if self.max_pos is not None:
            if isinstance(self.max_pos, (bool, np.bool_)) or not isinstance(self.max_pos, numbers.Real):
                raise TypeError(f"max_pos must be a real number or None, got {self.max_pos!r}")
            if not (math.isfinite(float(self.max_pos)) and 0 < float(self.max_pos) <= hfp8_largest(ebits, bias)):
                raise ValueError(
                    f"max_pos must be finite, > 0 and at most {hfp8_largest(ebits, bias)}, got {self.max_pos!r}"
                )
        _backend_name(self.backend)

    @property
    def clamp(self) -> float:
        return self.max_pos if self.max_pos is not None else hfp8_usual_max_pos(self.ebits, self.exponent_bias)

    def encode(self, input, ctx=None):
        return _op("float_to_hfp8")(input.float(), self.ebits, self.exponent_bias, float(self.clamp), self.backend)

    def decode(self, payload, ctx=None):
        return _op("hfp8_to_float")(payload, self.ebits, self.exponent_bias, self.backend)

    def error_bound(self, input):
        m = 7 - self.ebits
        a = input.double().abs()
        top = float(self.decode(self.encode(torch.tensor([self.clamp], dtype=torch.float32)))[0])
        inside = torch.clamp(2.0 ** -(m + 1) * a, min=2.0 ** (-self.exponent_bias - m))
        return torch.where(a <= torch.tensor(self.clamp, dtype=torch.float32).double(), inside, (a - top).abs())


@dataclasses.dataclass
class RowwiseContext:
    """Per-call context of :class:`Int8RowwiseCodec`: the row width ``row_dim`` the flat
    payload is cut into (TorchRec: the embedding dim)."""

    row_dim: int


@dataclasses.dataclass(frozen=True)
class Int8RowwiseCodec(Codec):
    """Rows of ``row_dim`` elements -> fused 8-bit rows (``float_to_fused_8bit_rowwise``).

    ``encode`` takes any tensor whose size is a multiple of ``row_dim`` (the
    context's, else the codec's, else the input's last dim) and returns the flat
    uint8 payload ``[rows * (row_dim + 8)]``; ``decode`` returns the flat float32
    values ``[rows * row_dim]``.
    """

    row_dim: int | None = None
    backend: str | None = None
    quantized_dtype = torch.uint8

    def __post_init__(self):
        if self.row_dim is not None:
            _row_dim("row_dim", self.row_dim)
        _backend_name(self.backend)

    def create_context(self, row_dim: int | None = None):
        if row_dim is not None:
            _row_dim("row_dim", row_dim)
        return RowwiseContext(row_dim if row_dim is not None else (self.row_dim or -1))

    def _dim(self, ctx, fallback=None) -> int:
        if ctx is not None and not isinstance(ctx, RowwiseContext):
            raise TypeError(f"ctx must be a RowwiseContext or None, got {type(ctx).__name__}")
        if ctx is not None:
            v.integer("ctx.row_dim", ctx.row_dim)
        d = ctx.row_dim if ctx is not None and ctx.row_dim > 0 else self.row_dim
        d = d if d else fallback
        if not d or d < 1:
            raise ValueError("Int8RowwiseCodec needs a row_dim (codec, context or the input's last dim)")
        return int(d)

    def encode(self, input, ctx=None):
        D = self._dim(ctx, input.shape[-1] if input.dim() else None)
        if input.numel() % D:
            raise ValueError(f"input of {input.numel()} elements is not made of rows of row_dim = {D}")
        return _op("float_to_fused_8bit_rowwise")(input.reshape(-1, D), self.backend).reshape(-1)

    def decode(self, payload, ctx=None):
        D = self._dim(ctx)
        if payload.numel() % (D + 8):
            raise ValueError(f"payload of {payload.numel()} bytes is not made of rows of row_dim + 8 = {D + 8}")
        return _op("fused_8bit_rowwise_to_float")(payload.reshape(-1, D + 8), "float32", self.backend).reshape(-1)

    def calc_quantized_size(self, input_len: int, ctx=None) -> int:
        input_len = v.size("input_len", input_len)
        D = self._dim(ctx)
        if input_len % D:
            raise ValueError(f"input_len = {input_len} is not a multiple of row_dim = {D}")
        return input_len // D * (D + 8)

    def round_trip(self, input, ctx=None):
        ctx = ctx if ctx is not None else RowwiseContext(self._dim(None, input.shape[-1]))
        return super().round_trip(input, ctx)

    def error_bound(self, input, ctx=None):
        D = self._dim(ctx, input.shape[-1])
        rows = input.detach().double().reshape(-1, D)
        scale = (rows.max(dim=1).values - rows.min(dim=1).values) / 255
        ulp = torch.finfo(torch.float32).eps * rows.abs().max(dim=1).values
        return ((scale / 2 + 1e-8 + 4 * ulp)[:, None]).expand_as(rows).reshape(input.shape)


CODECS = {"fp16": FP16Codec, "bf16": BF16Codec, "hfp8": HFP8Codec, "int8": Int8RowwiseCodec}
