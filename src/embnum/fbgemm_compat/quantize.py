"""Stand-ins for fbgemm_gpu's communication quantization (``quantize_comm``, ``quantize_utils``):
the codec TorchRec wraps to compress its collectives (``QCommsConfig``).

``QuantizedCommCodec`` provides fbgemm's FP32 (identity), FP16 and BF16 (clamped to the format's
range) and INT8 (row-wise, ``row_dim`` elements a row, embnum's fused 8-bit rows) precisions; FP8
and MX4 raise ``NotImplementedError`` naming the precision when the codec is built.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from .._validate import integer
from . import _checks
from .configs import SparseType

__all__ = ["QuantizationContext", "QuantizedCommCodec", "RoundingMode"]

ROW_DIM_DEFAULT = 32
MX_GROUP_SIZE_DEFAULT = 32


class RoundingMode(enum.IntEnum):
    nearest = 0
    floor = 1
    even = 2
    stochastic = 3
    ceil = 4


@dataclass
class QuantizationContext:
    row_dim: int = ROW_DIM_DEFAULT
    row_dim_quant: int = -1
    mx_group_size: int = MX_GROUP_SIZE_DEFAULT
    rounding_mode: RoundingMode | None = RoundingMode.even
    padded_dim_sum_per_rank: list[int] | None = None


_CLAMPED = {SparseType.FP16: torch.float16, SparseType.BF16: torch.bfloat16}
_PROVIDED = (SparseType.FP32, SparseType.FP16, SparseType.BF16, SparseType.INT8)


def _rows_of(name, t, width, what):
    """``ValueError`` unless ``t`` holds whole rows of ``width`` elements."""
    if t.numel() % width:
        raise ValueError(f"{name} must hold whole rows of {width} elements ({what}), got {t.numel()} elements")


class QuantizedCommCodec:
    """``encode(input, ctx)`` before a collective, ``decode(payload, ctx)`` after it (float32 input)."""

    def __init__(
        self,
        comm_precision: SparseType,
        loss_scale: float | None = None,
        row_dim: int | None = None,
        is_fwd: bool = True,
        rounding_mode: RoundingMode | None = None,
        output_dtype: SparseType | None = None,
    ) -> None:
        if not isinstance(comm_precision, SparseType):
            raise ValueError(f"comm_precision must be a SparseType, got {comm_precision!r}")
        if comm_precision not in _PROVIDED:
            raise NotImplementedError(
                f"comm_precision={comm_precision} is not available in embnum's fbgemm stand-in "
                f"(provided: {', '.join(str(p) for p in _PROVIDED)})"
            )
        if output_dtype not in (None, SparseType.FP32):
            raise NotImplementedError(f"output_dtype={output_dtype}: embnum's codecs decode to float32 only")
        if loss_scale is not None:
            _checks.number("loss_scale", loss_scale, minimum=0.0)
            if float(np.float32(loss_scale)) == 0:
                raise ValueError(
                    f"loss_scale must be > 0 in float32 (encode multiplies, decode divides), got {loss_scale}"
                )
        self._comm_precision = comm_precision
        self._loss_scale = loss_scale if comm_precision in _CLAMPED else None  # fbgemm ignores it elsewhere
        self._row_dim = -1 if row_dim is None else integer("row_dim", row_dim, min=1, max=2**31 - 1, what="an int")
        self._is_fwd = is_fwd
        self._rounding_mode = rounding_mode
        self._output_dtype = output_dtype

    @property
    def quantized_dtype(self) -> torch.dtype:
        return self._comm_precision.as_dtype()

    def create_context(self) -> QuantizationContext:
        return QuantizationContext()

    def encode(self, input_tensor: torch.Tensor, ctx: QuantizationContext | None = None) -> torch.Tensor:
        _checks.float_weights("input_tensor", input_tensor)
        x = input_tensor if self._loss_scale is None else input_tensor * self._loss_scale
        p = self._comm_precision
        if p in _CLAMPED:
            info = torch.finfo(_CLAMPED[p])
            return x.clamp(info.min, info.max).to(_CLAMPED[p])
        if p == SparseType.INT8:
            from ..torch_bridge import float_to_fused_8bit_rowwise

            ctx = ctx if ctx is not None else self.create_context()
            _rows_of("input_tensor", x, ctx.row_dim, "the context's row_dim")
            rows = float_to_fused_8bit_rowwise(x.reshape(-1, ctx.row_dim).float())
            ctx.row_dim_quant = rows.shape[1]
            return rows.reshape(-1)
        return x

    def decode(self, input_tensor: torch.Tensor, ctx: QuantizationContext | None = None) -> torch.Tensor:
        p = self._comm_precision
        if p == SparseType.INT8:
            from ..torch_bridge import fused_8bit_rowwise_to_float

            if ctx is None or ctx.row_dim_quant < 0:
                raise ValueError("decode of an INT8 payload needs the QuantizationContext its encode filled")
            if not isinstance(input_tensor, torch.Tensor) or input_tensor.dtype != torch.uint8:
                got = getattr(input_tensor, "dtype", type(input_tensor).__name__)
                raise TypeError(f"input_tensor must be the uint8 payload of an INT8 encode, got {got}")
            _rows_of("input_tensor", input_tensor, ctx.row_dim_quant, "the encoded row width")
            out = fused_8bit_rowwise_to_float(input_tensor.reshape(-1, ctx.row_dim_quant)).reshape(-1)
        else:
            out = _checks.float_weights("input_tensor", input_tensor)
        return out if self._loss_scale is None else out / self._loss_scale

    def calc_quantized_size(self, input_len: int, ctx: QuantizationContext | None = None) -> int:
        input_len = integer("input_len", input_len, min=0, what="an int")
        if self._comm_precision != SparseType.INT8:
            return input_len
        row_dim = (ctx if ctx is not None else self.create_context()).row_dim
        if input_len % row_dim:
            raise ValueError(f"input_len {input_len} is not a multiple of the row dim {row_dim}")
        return input_len // row_dim * ((row_dim + 3) // 4 * 4 + 8)

    def padded_size(self, input_tensor, dim_per_rank, my_rank, qcomm_ctx) -> tuple[int, int]:
        """(padded width, padding) of the payload; only MX4 pads, so: (width, 0)."""
        return (input_tensor.shape[0] if input_tensor.ndim == 1 else input_tensor.shape[1]), 0
