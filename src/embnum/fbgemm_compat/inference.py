"""Stand-ins for fbgemm_gpu's inference TBE (``split_table_batched_embeddings_ops_inference``):
the row sizes of quantized tables and the quantized lookup module.

A quantized row holds its codes, then (int8/int4/int2) a float16 scale and a float16 bias
(``DEFAULT_SCALE_BIAS_SIZE_IN_BYTES``); fbgemm pads each row to ``row_alignment`` bytes.
"""

# no "from __future__ import annotations": TorchScript reads the lookup methods' annotations as objects

import itertools

import torch

from .._validate import flag, integer
from . import _checks
from ._checks import enum
from .configs import (
    DEFAULT_SCALE_BIAS_SIZE_IN_BYTES,
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
    SparseType,
    round_up,
)
from .training import _BOUNDS, check_defaults

__all__ = ["IntNBitTableBatchedEmbeddingBagsCodegen", "rounded_row_size_in_bytes", "unpadded_row_size_in_bytes"]


def unpadded_row_size_in_bytes(
    dim: int, weight_ty: SparseType, scale_bias_size_in_bytes: int = DEFAULT_SCALE_BIAS_SIZE_IN_BYTES
) -> int:
    """Bytes of one row of ``dim`` elements stored as ``weight_ty`` (fp32, fp16, fp8, int8, int4, int2)."""
    codes = {"fp32": dim * 4, "fp16": dim * 2, "fp8": dim, "int8": dim, "int4": dim // 2, "int2": dim // 4}
    if weight_ty.value not in codes:
        raise ValueError(f"weight_ty must be one of {', '.join(codes)}, got {weight_ty}")
    return codes[weight_ty.value] + (scale_bias_size_in_bytes if weight_ty.value.startswith("int") else 0)


def rounded_row_size_in_bytes(
    dim: int,
    weight_ty: SparseType,
    row_alignment: int,
    scale_bias_size_in_bytes: int = DEFAULT_SCALE_BIAS_SIZE_IN_BYTES,
) -> int:
    """:func:`unpadded_row_size_in_bytes` rounded up to a multiple of ``row_alignment``."""
    return round_up(unpadded_row_size_in_bytes(dim, weight_ty, scale_bias_size_in_bytes), row_alignment)


_PACKED = ("fp32", "fp16", "int8", "int4", "int2")  # the row types embnum's quantized lookup reads
_OUTPUTS = {SparseType.FP32: "float32", SparseType.FP16: "float16"}
_DEFAULT_ONLY = {
    "pruning_hash_load_factor": 0.5,
    "use_array_for_index_remapping": True,
    "record_cache_metrics": None,
    "gather_uvm_cache_stats": False,
    "fp8_exponent_bits": None,
    "fp8_exponent_bias": None,
    "reverse_qparam": False,
}
# read by fbgemm only for cached or UVM tables, which the stand-in refuses
_CACHE_ONLY = (
    "uvm_host_mapped",
    "cache_algorithm",
    "cache_load_factor",
    "cache_sets",
    "cache_reserved_memory",
    "enforce_hbm",
    "cache_assoc",
)


_BITS = {"fp32": 32, "fp16": 16, "int8": 8, "int4": 4, "int2": 2}


def _packed_specs(name, embedding_specs):
    """``embedding_specs`` checked: ``(name, rows, dim, SparseType, location)`` per table, a row type
    embnum reads, whole bytes per row, on DEVICE or HOST."""
    specs = _checks.specs(name, embedding_specs, ("name", "rows", "dim", "weight_ty", "location"), min_rows=0)
    for i, s in enumerate(specs):
        if not isinstance(s[3], SparseType):
            raise TypeError(f"{name}: embedding_specs[{i}] weight_ty must be a SparseType, got {s[3]!r}")
        if s[3].value not in _PACKED:
            raise ValueError(f"{name}: table {s[0]!r} has weight type {s[3]}, not supported by embnum ({_PACKED})")
        if s[2] * _BITS[s[3].value] % 8:
            raise ValueError(
                f"{name}: embedding_specs[{i}] dim = {s[2]} does not fill whole bytes as {s[3].value} "
                f"(a multiple of {8 // _BITS[s[3].value]})"
            )
        location = enum(f"embedding_specs[{i}] location", s[4], EmbeddingLocation)
        if location not in (EmbeddingLocation.DEVICE, EmbeddingLocation.HOST):
            raise NotImplementedError(f"{name}: location {location.name} is not available in embnum")
    return specs


def _check_feature_names(name, feature_names_per_table, T_):
    """``ValueError`` unless ``feature_names_per_table`` is None or one list of str per table."""
    if feature_names_per_table is not None and (
        len(feature_names_per_table) != T_
        or any(not all(isinstance(f, str) for f in names) for names in feature_names_per_table)
    ):
        raise ValueError(
            f"{name}: feature_names_per_table must be one list of feature names per table ({T_}), "
            f"got {feature_names_per_table!r}"
        )


class IntNBitTableBatchedEmbeddingBagsCodegen(_checks.CheckedState):
    """fbgemm's inference TBE: quantized tables (fp32, fp16, int8, int4, int2 rows) and a pooled lookup,
    ``forward(indices, offsets, per_sample_weights=None) -> [B, total_D]`` (``[N, D]`` for
    ``PoolingMode.NONE``) in ``output_dtype`` (FP16, fbgemm's default, or FP32), on embnum's
    ``tbe_forward_quantized``.

    embedding_specs: ``(name, rows, dim, SparseType, EmbeddingLocation)`` per table (``DEVICE`` or ``HOST``).
    The buffer is fbgemm's: each row padded to ``row_alignment`` bytes (1 on CPU, 16 elsewhere, by
    default), int rows led by a float16 scale and bias, each table starting on a 128-byte line
    (``cacheline_alignment``). It is allocated by ``initialize_weights()`` (or at construction when
    ``weight_lists`` is given: one ``(codes, scale_bias or None)`` per table, as
    ``split_embedding_weights()`` returns them). Pruned tables (``index_remapping``) are refused.
    """

    __jit_unused_properties__ = ["weights"]  # TorchScript: the scripted lookup names the buffer itself

    def __init__(
        self,
        embedding_specs,
        feature_table_map=None,
        index_remapping=None,
        pooling_mode=PoolingMode.SUM,
        device=None,
        bounds_check_mode=BoundsCheckMode.WARNING,
        weight_lists=None,
        *,
        output_dtype=SparseType.FP16,
        row_alignment=None,
        scale_bias_size_in_bytes=DEFAULT_SCALE_BIAS_SIZE_IN_BYTES,
        cacheline_alignment=True,
        indices_dtype=torch.int32,
        feature_names_per_table=None,
        **fbgemm_options,
    ):
        super().__init__()
        from .. import torch_bridge  # noqa: F401 - defines torch.ops.embnum, which a traced or scripted lookup calls

        name = type(self).__name__
        check_defaults(name, fbgemm_options, _DEFAULT_ONLY, ignored=_CACHE_ONLY)
        if index_remapping is not None:
            raise NotImplementedError(f"{name}: index_remapping (pruned tables) is not available in embnum's stand-in")
        self.embedding_specs = _packed_specs(name, embedding_specs)
        flag("cacheline_alignment", cacheline_alignment)
        if scale_bias_size_in_bytes != DEFAULT_SCALE_BIAS_SIZE_IN_BYTES:
            raise ValueError(f"{name}: scale_bias_size_in_bytes={scale_bias_size_in_bytes} is not supported (only 4)")
        if not isinstance(output_dtype, SparseType) or output_dtype not in _OUTPUTS:
            raise ValueError(f"{name}: output_dtype={output_dtype} is not supported by embnum (FP32 or FP16)")
        self.current_device = _checks.device("device", device if device is not None else "cpu")
        self.use_cpu = self.current_device.type == "cpu"
        T_ = len(self.embedding_specs)
        self.feature_table_map = _checks.table_map(feature_table_map, T_)
        _check_feature_names(name, feature_names_per_table, T_)
        self.feature_names_per_table = feature_names_per_table  # metadata: fbgemm only reports it
        self.pooling_mode = enum("pooling_mode", pooling_mode, PoolingMode)
        self.bounds_check_mode_int = int(enum("bounds_check_mode", bounds_check_mode, BoundsCheckMode))
        self._bounds = _BOUNDS[BoundsCheckMode(self.bounds_check_mode_int)]
        self.output_dtype = output_dtype.as_int()
        self._output_name = _OUTPUTS[output_dtype]
        self._pooling_name = ("sum", "mean", "none")[int(self.pooling_mode)]
        self.row_alignment = (
            integer("row_alignment", row_alignment, min=1, max=2**20, what="an int")
            if row_alignment is not None
            else (1 if self.use_cpu else 16)
        )
        self.scale_bias_size_in_bytes = scale_bias_size_in_bytes
        self._register_layout(cacheline_alignment)
        self.weight_initialized = False
        self.register_buffer("weights_host", torch.zeros(0, dtype=torch.uint8, device=self.current_device))
        self.register_buffer("weights_dev", torch.zeros(0, dtype=torch.uint8, device=self.current_device))
        if weight_lists is not None:
            self.initialize_weights()
            self.assign_embedding_weights(weight_lists)

    def _register_layout(self, cacheline_alignment):
        """The tables' byte layout in the packed weights (rows padded to ``row_alignment``, tables to
        128 bytes with ``cacheline_alignment``) and the per-feature buffers fbgemm names."""
        name = type(self).__name__
        T_ = len(self.embedding_specs)
        self.weights_physical_offsets, end = [], 0
        for _, rows, dim, ty, _ in self.embedding_specs:
            self.weights_physical_offsets.append(end)
            end += rows * rounded_row_size_in_bytes(dim, ty, self.row_alignment)
            end = round_up(end, 128) if cacheline_alignment else end
        self._size = end
        placement = EmbeddingLocation.HOST if self.use_cpu else EmbeddingLocation.DEVICE
        self.weights_physical_placements = [int(placement)] * T_
        self._held = "weights_host" if self.use_cpu else "weights_dev"
        ftm = self.feature_table_map
        specs = [self.embedding_specs[t] for t in ftm]

        def buffer(values, dtype):
            return torch.tensor(values, dtype=dtype, device=self.current_device)

        if sum(s[2] for s in specs) > 2**31 - 1:  # fbgemm's D_offsets are int32
            raise ValueError(
                f"{name}: embedding_specs dims sum to {sum(s[2] for s in specs)} over the features, "
                "more than the int32 D_offsets hold (2**31 - 1)"
            )
        self.register_buffer("weights_offsets", buffer([self.weights_physical_offsets[t] for t in ftm], torch.int64))
        self.register_buffer("weights_tys", buffer([s[3].as_int() for s in specs], torch.uint8))
        self.register_buffer("D_offsets", buffer([0, *itertools.accumulate(s[2] for s in specs)], torch.int32))
        self.register_buffer("rows_per_table", buffer([s[1] for s in specs], torch.int64))
        self.total_D = sum(s[2] for s in specs)  # not from D_offsets: a meta tensor has no values
        self.max_D = max(s[2] for s in self.embedding_specs)

    def get_feature_num_per_table(self) -> list[int]:
        """The number of features of each table named in ``feature_names_per_table`` (``[]`` without it)."""
        return [] if self.feature_names_per_table is None else [len(n) for n in self.feature_names_per_table]

    @property
    def weights(self) -> torch.Tensor:
        return getattr(self, self._held)

    def _state_rules(self) -> dict:
        """Packed rows (uint8, any byte) of the allocated size; the layout is the construction's."""
        rules = {n: (getattr(self, n), "layout") for n in ("weights_offsets", "weights_tys", "D_offsets")}
        rules["rows_per_table"] = (self.rows_per_table, "layout")
        rules.update({n: (getattr(self, n), "bytes") for n in ("weights_host", "weights_dev")})
        return rules

    def initialize_weights(self) -> None:
        """Allocate the weight buffer (zeros), once."""
        if not self.weight_initialized:
            n, device = self._size, self.current_device
            flat = _checks.allocate("weight bytes", lambda: torch.zeros(n, dtype=torch.uint8, device=device), n)
            setattr(self, self._held, flat)
            self.weight_initialized = True

    def split_embedding_weights_with_scale_bias(self, split_scale_bias_mode: int = 1):
        """Per table, uint8 views of its rows: mode 0 ``(padded rows, None, None)``; mode 1 ``(codes,
        scale_bias [rows, 4] or None, None)``; mode 2 ``(codes, scale float16 [rows, 1], bias float16
        [rows, 1])`` (fp32/fp16 tables: ``(row bytes, None, None)``)."""
        if not self.weight_initialized:
            raise RuntimeError("initialize_weights() (or weight_lists) must come before the weights are read")
        integer("split_scale_bias_mode", split_scale_bias_mode, min=0, max=2, what="0, 1 or 2")
        out, sb = [], self.scale_bias_size_in_bytes
        for (_, rows, dim, ty, _), start in zip(self.embedding_specs, self.weights_physical_offsets):
            width = rounded_row_size_in_bytes(dim, ty, self.row_alignment)
            block = self.weights.detach()[start : start + rows * width].view(rows, width)
            if split_scale_bias_mode == 0:
                out.append((block, None, None))
                continue
            block = block[:, : unpadded_row_size_in_bytes(dim, ty)]
            if not ty.value.startswith("int"):
                out.append((block, None, None))
            elif split_scale_bias_mode == 1:
                out.append((block[:, sb:], block[:, :sb], None))
            else:
                out.append(
                    (block[:, sb:], block[:, : sb // 2].view(torch.float16), block[:, sb // 2 : sb].view(torch.float16))
                )
        return out

    def split_embedding_weights(self, split_scale_shifts: bool = True):
        """Per table ``(codes, scale_bias)`` (``split_scale_shifts``) or ``(padded rows, None)``."""
        mode = 1 if flag("split_scale_shifts", split_scale_shifts) else 0
        return [(w, s) for w, s, _ in self.split_embedding_weights_with_scale_bias(mode)]

    def assign_embedding_weights(self, q_weight_list) -> None:
        """Copy ``(codes, scale_bias or None)`` per table into the buffer (shapes as ``split_embedding_weights``)."""
        dest = self.split_embedding_weights()
        if not isinstance(q_weight_list, (list, tuple)) or len(q_weight_list) != len(dest):
            got = f"{q_weight_list!r:.80}"
            raise ValueError(f"weight_lists must be a list of one entry per table ({len(dest)}), got {got}")
        for t, ((w, s), pair) in enumerate(zip(dest, q_weight_list)):  # every entry checked before any copy
            want = f"(uint8 {list(w.shape)}, {'None' if s is None else f'uint8 {list(s.shape)}'})"
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise TypeError(f"weight_lists[{t}] must be {want}, got {pair!r:.80}")
            for part, like in zip(pair, (w, s)):
                if (part is None) != (like is None) or (
                    part is not None
                    and (
                        not isinstance(part, torch.Tensor)
                        or part.dtype != torch.uint8
                        or tuple(part.shape) != tuple(like.shape)
                    )
                ):
                    got = [
                        None
                        if p is None
                        else f"{getattr(p, 'dtype', type(p).__name__)} {list(p.shape)}"
                        if isinstance(p, torch.Tensor)
                        else type(p).__name__
                        for p in pair
                    ]
                    raise TypeError(f"weight_lists[{t}] must be {want}, got ({got[0]}, {got[1]})")
        for (w, s), (qw, qs) in zip(dest, q_weight_list):
            w.copy_(qw)
            if s is not None:
                s.copy_(qs)

    def forward(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self._forward_impl(indices, offsets, per_sample_weights)

    def _forward_impl(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The lookup (fbgemm's name: TorchRec's lengths-taking subclass calls it from its own forward).

        Scripted (TorchScript) or traced (torch.fx: an argument is a ``Proxy``), it is one call of
        the operator ``torch.ops.embnum.tbe_forward_quantized``, as fbgemm's is one call of its
        lookup operator; in eager mode it runs the same op through embnum's bridge and puts an id
        outside its table in fbgemm's terms."""
        if not self.weight_initialized:
            raise RuntimeError("initialize_weights() (or weight_lists) must come before forward")
        if torch.jit.is_scripting():
            weights = per_sample_weights
            if weights is not None:
                weights = weights.float()
            return self._lookup(indices, offsets, weights)
        if self._symbolic(indices, offsets, per_sample_weights):
            return self._lookup(indices, offsets, per_sample_weights)
        return self._eager_lookup(indices, offsets, per_sample_weights)

    def _lookup(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        """The operator call itself (float32 ``per_sample_weights``; a traced graph passes them as given,
        as fbgemm's does)."""
        return torch.ops.embnum.tbe_forward_quantized(
            self.weights_host if self.use_cpu else self.weights_dev,
            self.weights_offsets,
            self.weights_tys,
            self.D_offsets,
            self.rows_per_table,
            indices,
            offsets,
            self._pooling_name,
            per_sample_weights,
            row_alignment=self.row_alignment,
            output_dtype=self._output_name,
            bounds_check_mode=self._bounds,
        )

    @torch.jit.unused
    def _symbolic(self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None) -> bool:
        """Whether torch.fx is tracing this call (an argument is a ``Proxy``)."""
        return any(isinstance(x, torch.fx.Proxy) for x in (indices, offsets, per_sample_weights))

    @torch.jit.unused
    def _eager_lookup(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        """The lookup through embnum's bridge (its NumPy fast path on plain CPU tensors), an id outside
        its table put in fbgemm's terms."""
        from ..torch_bridge import tbe_forward_quantized

        weights = _checks.float_weights("per_sample_weights", per_sample_weights)
        try:
            return tbe_forward_quantized(
                self.weights,
                self.weights_offsets,
                self.weights_tys,
                self.D_offsets,
                self.rows_per_table,
                indices,
                offsets,
                self._pooling_name,
                weights,
                row_alignment=self.row_alignment,
                output_dtype=self._output_name,
                bounds_check_mode=self._bounds,
            )
        except IndexError as err:
            rows = [s[1] for s in self.embedding_specs]
            tables = [s[0] for s in self.embedding_specs]
            features = _checks.feature_names(self.feature_names_per_table, self.feature_table_map)
            plain = _checks.lookup_error(
                err, indices, offsets, rows, self.feature_table_map, tables, features, pruned_ok=True
            )
            if plain is None:
                raise
            raise plain from err
