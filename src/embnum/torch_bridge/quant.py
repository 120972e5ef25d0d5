"""Torch side of the quant family: schema types and fake shapes of the ten ops.

The encoders return integer codes (or float16/bfloat16 payloads) and the
decoders read them: none of the ten ops has a gradient of its own (calling
``backward`` through one raises). Training through a quantized round trip goes
through a codec's :meth:`~embnum.torch_bridge.codecs.Codec.round_trip`, whose
gradient is straight-through (see ``embnum.torch_bridge.codecs``).

bfloat16 is carried as uint16 bit patterns (``bf16_patterns``, the bridge's one exception):
``float_to_bfloat16`` returns a ``torch.bfloat16`` tensor and
``bfloat16_to_float`` takes one (or a uint16 tensor of bit patterns).
``output_dtype`` is a string here (``"float32"`` or ``"float16"``).
"""

from __future__ import annotations

import torch

from ._library import bridge

_OUT_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def _out_dtype(name):
    return _OUT_DTYPES.get(name, torch.float32)  # the op itself rejects other names


bridge(
    "float_to_fused_8bit_rowwise",
    fake=lambda input, backend=None: input.new_empty((*input.shape[:-1], input.shape[-1] + 8), dtype=torch.uint8),
)
bridge(
    "fused_8bit_rowwise_to_float",
    types={"output_dtype": "str"},
    fake=lambda input, output_dtype="float32", backend=None: input.new_empty(
        (*input.shape[:-1], input.shape[-1] - 8), dtype=_out_dtype(output_dtype)
    ),
)
bridge(
    "float_to_fused_nbit_rowwise",
    types={"bit_rate": "int"},
    fake=lambda input, bit_rate, backend=None: input.new_empty(
        (input.shape[0], input.shape[1] // (8 // bit_rate) + 4), dtype=torch.uint8
    ),
)
bridge(
    "fused_nbit_rowwise_to_float",
    types={"bit_rate": "int", "output_dtype": "str"},
    fake=lambda input, bit_rate, output_dtype="float32", backend=None: input.new_empty(
        (input.shape[0], (input.shape[1] - 4) * (8 // bit_rate)), dtype=_out_dtype(output_dtype)
    ),
)
bridge(
    "float_to_bfloat16",
    fake=lambda input, backend=None: input.new_empty(input.shape, dtype=torch.bfloat16),
    bf16_patterns=True,
)
bridge(
    "bfloat16_to_float",
    fake=lambda input, backend=None: input.new_empty(input.shape, dtype=torch.float32),
    bf16_patterns=True,
)
bridge(
    "float_to_fp16",
    types={"saturate": "bool"},
    fake=lambda input, saturate=True, backend=None: input.new_empty(input.shape, dtype=torch.float16),
)
bridge(
    "fp16_to_float",
    fake=lambda input, backend=None: input.new_empty(input.shape, dtype=torch.float32),
)
bridge(
    "float_to_hfp8",
    types={"ebits": "int", "exponent_bias": "int", "max_pos": "float"},
    fake=lambda input, ebits, exponent_bias, max_pos, backend=None: input.new_empty(input.shape, dtype=torch.uint8),
)
bridge(
    "hfp8_to_float",
    types={"ebits": "int", "exponent_bias": "int"},
    fake=lambda input, ebits, exponent_bias, backend=None: input.new_empty(input.shape, dtype=torch.float32),
)
