"""The stand-in's quantized TBE where TorchRec builds it on the meta device, passes placement flags
fbgemm reads only for UVM tables, or names each table's features, and where TorchRec traces (torch.fx)
and scripts (TorchScript) a quantized model (gaps TorchRec's own quant and
inference tests found).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnum import fbgemm_compat

if fbgemm_compat.status()["real_fbgemm_gpu"] is not None:
    pytest.skip("a real fbgemm_gpu is importable: the stand-in tier runs without it", allow_module_level=True)
torch = pytest.importorskip("torch")
fbgemm_compat.install()
torchrec = pytest.importorskip("torchrec")

from fbgemm_gpu.split_embedding_configs import SparseType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (  # noqa: E402
    IntNBitTableBatchedEmbeddingBagsCodegen,
)

TYPES = [SparseType.FP32, SparseType.FP16, SparseType.INT8, SparseType.INT4, SparseType.INT2]


@st.composite
def specs(draw):
    n = draw(st.integers(1, 3))
    return [
        (
            f"t{t}",
            draw(st.integers(1, 9)),
            4 * draw(st.integers(1, 4)),
            draw(st.sampled_from(TYPES)),
            EmbeddingLocation.HOST,
        )
        for t in range(n)
    ]


@settings(max_examples=10, deadline=None)
@given(specs())
def test_built_on_meta_like_on_cpu(tables):
    """A meta-device module has the CPU module's sizes and buffer shapes (no value is read from a meta tensor)."""
    # the default row alignment is 1 on a CPU and 16 elsewhere (as fbgemm's): the same for both here
    meta = IntNBitTableBatchedEmbeddingBagsCodegen(tables, device="meta", row_alignment=16)
    cpu = IntNBitTableBatchedEmbeddingBagsCodegen(tables, device="cpu", row_alignment=16)
    assert meta.total_D == cpu.total_D == sum(dim for _, _, dim, _, _ in tables)
    meta.initialize_weights()
    cpu.initialize_weights()
    assert meta.weights.device.type == "meta" and meta.weights.shape == cpu.weights.shape
    for name in ("weights_offsets", "weights_tys", "D_offsets", "rows_per_table"):
        m, c = getattr(meta, name), getattr(cpu, name)
        assert m.device.type == "meta" and m.shape == c.shape and m.dtype == c.dtype, name


def test_quant_collection_from_a_meta_collection():
    """TorchRec's QuantEmbeddingBagCollection.from_float on a meta-device EmbeddingBagCollection."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=10, feature_names=[f"f{i}"]) for i in (1, 2)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    ebc.qconfig = torch.quantization.QConfig(
        activation=torch.quantization.PlaceholderObserver.with_args(dtype=torch.float),
        weight=torch.quantization.PlaceholderObserver.with_args(dtype=torch.qint8),
    )
    qebc = QuantEmbeddingBagCollection.from_float(ebc)
    tbes = qebc._emb_modules  # TorchRec's list of the TBEs it built (not always registered as submodules)
    assert tbes and sum(t.total_D for t in tbes) == 16


@settings(max_examples=10, deadline=None)
@given(specs(), st.data())
def test_uvm_host_mapped_is_inert_for_host_tables(tables, data):
    """fbgemm reads ``uvm_host_mapped`` only when allocating UVM tables: for host tables the lookup is
    the same either way; a UVM table is still refused, naming its location."""
    plain = IntNBitTableBatchedEmbeddingBagsCodegen(tables, output_dtype=SparseType.FP32)
    mapped = IntNBitTableBatchedEmbeddingBagsCodegen(tables, output_dtype=SparseType.FP32, uvm_host_mapped=True)
    plain.initialize_weights()
    codes = torch.randint(0, 256, plain.weights.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    plain.weights.copy_(codes)
    mapped.initialize_weights()
    for (w, s), _ in zip(plain.split_embedding_weights(), tables):
        if s is not None:  # finite float16 scale and bias
            s.copy_(torch.tensor([0.5, -1.0], dtype=torch.float16).view(torch.uint8).expand_as(s))
    mapped.weights.copy_(plain.weights)
    batch = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=batch * len(tables), max_size=batch * len(tables)))
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.tensor(
        [data.draw(st.integers(0, tables[f // batch][1] - 1)) for f, n in enumerate(lengths) for _ in range(n)],
        dtype=torch.int32,
    )
    before = (indices.clone(), offsets.clone())
    torch.testing.assert_close(mapped(indices, offsets), plain(indices, offsets), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices, before[0]) and torch.equal(offsets, before[1])
    uvm = [(tables[0][0], tables[0][1], tables[0][2], tables[0][3], EmbeddingLocation.MANAGED)]
    with pytest.raises(NotImplementedError, match="MANAGED"):
        IntNBitTableBatchedEmbeddingBagsCodegen(uvm, uvm_host_mapped=True)


@settings(max_examples=10, deadline=None)
@given(specs(), st.data())
def test_feature_names_per_table_is_reported(tables, data):
    """fbgemm keeps ``feature_names_per_table`` as metadata (``get_feature_num_per_table``); a list that
    does not name one list of features per table is refused by name."""
    names = [[f"{t}_f{i}" for i in range(data.draw(st.integers(1, 3)))] for t, *_ in tables]
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(tables, feature_names_per_table=names)
    assert tbe.get_feature_num_per_table() == [len(n) for n in names]
    assert IntNBitTableBatchedEmbeddingBagsCodegen(tables).get_feature_num_per_table() == []
    with pytest.raises(ValueError, match="feature_names_per_table"):
        IntNBitTableBatchedEmbeddingBagsCodegen(tables, feature_names_per_table=[*names, ["extra"]])
    with pytest.raises(ValueError, match="feature_names_per_table"):
        IntNBitTableBatchedEmbeddingBagsCodegen(tables, feature_names_per_table=[[0]] * len(tables))


@settings(max_examples=10, deadline=None)
@given(specs(), st.data())
def test_torchrecs_lengths_subclass_looks_up_like_offsets(tables, data):
    """TorchRec's ``IntNBitTableBatchedEmbeddingBagsCodegenWithLength`` (its forward takes lengths and
    calls fbgemm's ``_forward_impl`` with their offsets) gives the stand-in's forward on those offsets."""
    from torchrec.distributed.quant_embedding_kernel import IntNBitTableBatchedEmbeddingBagsCodegenWithLength

    with_lengths = IntNBitTableBatchedEmbeddingBagsCodegenWithLength(tables, output_dtype=SparseType.FP32)
    plain = IntNBitTableBatchedEmbeddingBagsCodegen(tables, output_dtype=SparseType.FP32)
    for tbe in (with_lengths, plain):
        tbe.initialize_weights()
        for codes, scale_bias in tbe.split_embedding_weights():
            codes.copy_(
                torch.randint(0, 256, codes.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
            )
            if scale_bias is not None:
                scale_bias.copy_(torch.tensor([0.25, 1.0], dtype=torch.float16).view(torch.uint8).expand_as(scale_bias))
    batch = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=batch * len(tables), max_size=batch * len(tables)))
    indices = torch.tensor(
        [data.draw(st.integers(0, tables[f // batch][1] - 1)) for f, n in enumerate(lengths) for _ in range(n)],
        dtype=torch.int32,
    )
    lengths_t = torch.tensor(lengths, dtype=torch.int32)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    torch.testing.assert_close(
        with_lengths(indices, lengths_t), plain(indices, offsets), rtol=0, atol=0, equal_nan=True
    )


_DATA_TYPES = {"fp32": torch.float, "fp16": torch.half, "int8": torch.qint8, "int4": torch.quint4x2}


# scripting, saving and loading is the point (TorchRec's inference path is TorchScript): torch 2.13
# deprecates torch.jit.save/load, and TorchScript notes what it ignores in TorchRec's annotations
@pytest.mark.filterwarnings("ignore:`torch.jit.(save|load)` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The TorchScript type system doesn't support instance-level annotations:UserWarning")
@pytest.mark.filterwarnings("ignore:TorchScript will treat type annotations of Tensor dtype-specific:UserWarning")
@settings(max_examples=5, deadline=None)
@given(
    st.lists(st.sampled_from([4, 8, 16]), min_size=1, max_size=3),
    st.sampled_from(sorted(_DATA_TYPES)),
    st.sampled_from([torch.float, torch.half]),
    st.data(),
)
def test_quant_collection_traces_and_scripts(dims, weight_type, output, data):
    """TorchRec's QuantEmbeddingBagCollection traced by ``torchrec.fx.symbolic_trace`` (the stand-in's
    lookup is one call of ``torch.ops.embnum.tbe_forward_quantized`` in the graph), then scripted,
    saved and loaded: the same output as the eager module, bit for bit."""
    import io

    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.fx import symbolic_trace
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=7, feature_names=[f"f{i}"])
        for i, dim in enumerate(dims)
    ]
    torch.manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    ebc = EmbeddingBagCollection(tables=configs)
    ebc.qconfig = torch.quantization.QConfig(  # one weight dtype for the collection: TorchRec's qconfig
        activation=torch.quantization.PlaceholderObserver.with_args(dtype=output),
        weight=torch.quantization.PlaceholderObserver.with_args(dtype=_DATA_TYPES[weight_type]),
    )
    qebc = QuantEmbeddingBagCollection.from_float(ebc)
    batch = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=batch * len(dims), max_size=batch * len(dims)))
    ids = [data.draw(st.integers(0, 6)) for _ in range(sum(lengths))]
    features = KeyedJaggedTensor(
        keys=[c.feature_names[0] for c in configs],
        values=torch.tensor(ids, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
    )
    want = qebc(features).values()
    traced = symbolic_trace(qebc)
    assert torch.ops.embnum.tbe_forward_quantized in [n.target for n in traced.graph.nodes]
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(traced), buffer)
    buffer.seek(0)
    scripted = torch.jit.load(buffer)
    for form in (traced, scripted):
        got = form(features).values()
        assert got.dtype == want.dtype and torch.equal(got, want), type(form).__name__


@settings(max_examples=10, deadline=None)
@given(specs(), st.data())
def test_fbgemms_lookup_operator_on_the_stand_ins_buffers(tables, data):
    """``torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function`` (defined at install) on the
    module's buffers, called as fbgemm's forward calls it, gives the module's output; cached rows,
    unified-memory placements, a wrong ``total_D`` and an id past the buffer are refused by name."""
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(tables, output_dtype=SparseType.FP32)
    tbe.initialize_weights()
    tbe.weights.copy_(torch.randint(0, 256, tbe.weights.shape, dtype=torch.uint8))
    for _, scale_bias in tbe.split_embedding_weights():
        if scale_bias is not None:
            scale_bias.copy_(torch.tensor([0.5, -1.0], dtype=torch.float16).view(torch.uint8).expand_as(scale_bias))
    batch = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=batch * len(tables), max_size=batch * len(tables)))
    indices = torch.tensor(
        [data.draw(st.integers(0, tables[f // batch][1] - 1)) for f, n in enumerate(lengths) for _ in range(n)],
        dtype=torch.int32,
    )
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    T = len(tables)
    args = dict(
        dev_weights=tbe.weights,
        uvm_weights=torch.empty(0, dtype=torch.uint8),
        weights_placements=torch.full((T,), 3, dtype=torch.int32),
        weights_offsets=tbe.weights_offsets,
        weights_tys=tbe.weights_tys,
        D_offsets=tbe.D_offsets,
        total_D=tbe.total_D,
        max_int2_D=0,
        max_int4_D=0,
        max_int8_D=0,
        max_float16_D=0,
        max_float32_D=0,
        indices=indices,
        offsets=offsets,
        pooling_mode=0,
        indice_weights=None,
        output_dtype=0,
        lxu_cache_weights=torch.empty(0, dtype=torch.uint8),
        lxu_cache_locations=torch.empty(0, dtype=torch.int32),
        row_alignment=1,
    )
    lookup = torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function
    torch.testing.assert_close(lookup(**args), tbe(indices, offsets), rtol=0, atol=0, equal_nan=True)
    with pytest.raises(NotImplementedError, match="lxu_cache_weights"):
        lookup(**dict(args, lxu_cache_weights=torch.zeros(4, 8)))
    with pytest.raises(NotImplementedError, match="weights_placements"):
        lookup(**dict(args, weights_placements=torch.full((T,), 1, dtype=torch.int32)))
    with pytest.raises(ValueError, match="total_D"):
        lookup(**dict(args, total_D=tbe.total_D + 1))
    past = torch.tensor([tbe.weights.numel()], dtype=torch.int32)  # more rows than the whole buffer holds
    one_bag = torch.tensor([0] + [1] * (T * batch), dtype=torch.int32)
    with pytest.raises(IndexError):
        lookup(**dict(args, indices=past, offsets=one_bag))
