"""Bad input to the fbgemm stand-in's classes and to the sharded collection: a clean error naming the
argument in the user's terms (fbgemm's argument names; the collection's keys and tables), inputs and
module unchanged. The stand-in modules are imported directly (``install()`` refuses where a real
fbgemm_gpu is installed, as in this environment); the sharded collection runs on a one-process gloo group.
The drawn cases are the hostile tier's (``tests/test_hostile_surfaces.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import embnum  # noqa: E402
import embnum.torch_bridge  # noqa: E402
from embnum.fbgemm_compat import configs as C  # noqa: E402
from embnum.fbgemm_compat import inference, permute, training  # noqa: E402

HOST, CPU = C.EmbeddingLocation.HOST, C.ComputeDevice.CPU
Split = training.SplitTableBatchedEmbeddingBagsCodegen
Dense = training.DenseTableBatchedEmbeddingBagsCodegen
IntN = inference.IntNBitTableBatchedEmbeddingBagsCodegen


def _split(**kw):
    kw.setdefault("optimizer", C.EmbOptimType.EXACT_ROWWISE_ADAGRAD)
    return Split([(3, 2, HOST, CPU), (4, 2, HOST, CPU)], **kw)


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def _same_state(m, before):
    now = m.state_dict()
    return now.keys() == before.keys() and all(torch.equal(now[k], before[k]) for k in now)


# -- constructors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: Split([(2.5, 3, HOST, CPU)]), TypeError, "embedding_specs[0] rows"),
        (lambda: Split([(True, 3, HOST, CPU)]), TypeError, "embedding_specs[0] rows"),
        (lambda: Split([("3", 3, HOST, CPU)]), TypeError, "embedding_specs[0] rows"),
        (lambda: Split([(3, 2**63, HOST, CPU)]), ValueError, "embedding_specs[0] dim"),
        (lambda: Split(None), TypeError, "embedding_specs"),
        (lambda: _split(max_norm=math.nan), ValueError, "max_norm"),
        (lambda: _split(max_norm="x"), ValueError, "max_norm"),
        (lambda: _split(optimizer=C.EmbOptimType.ADAM, weight_decay=-1.0), ValueError, "weight_decay"),
        (lambda: _split(optimizer=C.EmbOptimType.ADAM, weight_decay=math.nan), ValueError, "weight_decay"),
        (lambda: _split(learning_rate=None), ValueError, "learning_rate"),
        (lambda: _split(gradient_clipping="yes"), TypeError, "gradient_clipping"),
        (lambda: _split(stochastic_rounding=1), TypeError, "stochastic_rounding"),
        (lambda: _split(weights_precision="x"), TypeError, "weights_precision"),
        (lambda: _split(table_names=["a"]), TypeError, "table_names"),
        (lambda: _split(device="no such device"), ValueError, "device"),
        (lambda: _split(feature_table_map=[0, 1.5]), TypeError, "feature_table_map[1]"),
        (lambda: Dense([(2.5, 3)], use_cpu=True), TypeError, "embedding_specs[0] rows"),
        (lambda: Dense([(2, 3)], use_cpu="no"), TypeError, "use_cpu"),
        (lambda: IntN([("a", 3, 4, "int8", HOST)]), TypeError, "embedding_specs[0] weight_ty"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, HOST)], row_alignment=0), ValueError, "row_alignment"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, HOST)], row_alignment=-4), ValueError, "row_alignment"),
        (lambda: IntN([("a", 2.5, 4, C.SparseType.INT8, HOST)]), TypeError, "embedding_specs[0] rows"),
        (lambda: IntN([("a", -1, 4, C.SparseType.INT8, HOST)]), ValueError, "embedding_specs[0] rows"),
        (lambda: IntN([("a", 3, 3, C.SparseType.INT4, HOST)]), ValueError, "embedding_specs[0] dim"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, "x")]), ValueError, "embedding_specs[0] location"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, HOST)], feature_table_map=[0.5]), TypeError, "feature_table_map"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, HOST)], pooling_mode=7), ValueError, "pooling_mode"),
        (lambda: _split(embedding_table_index_type=torch.tensor([1, 2])), ValueError, "embedding_table_index_type"),
        (lambda: _split(prefetch_pipeline=__import__("numpy").ones(2)), ValueError, "prefetch_pipeline"),
        (lambda: Split([(2**31, 2**10, HOST, CPU)]), ValueError, "embedding_specs"),  # torch's RuntimeError before
        (lambda: Dense([(2**31, 2**10)], use_cpu=True), ValueError, "embedding_specs"),
        (lambda: IntN([("a", 3, 2**31 - 8, C.SparseType.INT8, HOST)], feature_table_map=[0, 0]), ValueError, "dims"),
        (lambda: permute.PermutePooledEmbeddings([2.5, 3], [1, 0]), TypeError, "embs_dims[0]"),
        (lambda: permute.PermutePooledEmbeddings([2, 3], [True, 0]), TypeError, "permute[0]"),
        (lambda: permute.PermutePooledEmbeddings([2, "3"], [1, 0]), TypeError, "embs_dims[1]"),
        (lambda: permute.PermutePooledEmbeddingsSplit([2**63, 3], [1, 0]), ValueError, "embs_dims[0]"),
        (lambda: permute.PermutePooledEmbeddings([2**47, 2**47, 2**47], [1, 0, 2]), ValueError, "embs_dims"),
    ],
)
def test_constructors_name_the_bad_argument(make, exc, words):
    """Each was accepted (a float row count truncated, max_norm NaN or a negative weight decay silently
    off, a row alignment of -4) or failed inside Python or torch without naming the argument."""
    with pytest.raises(exc) as info:
        make()
    assert words in str(info.value)


# an enum argument is a member or a member's int value; a bool, float or array equal to a value was read
# as that member (IntEnum's equality: pooling_mode=True was MEAN), a list was "unhashable type"
@pytest.mark.parametrize(
    "make, word",
    [
        (lambda: _split(pooling_mode=True), "pooling_mode"),
        (lambda: _split(pooling_mode=1.0), "pooling_mode"),
        (lambda: _split(pooling_mode=np.float64(0)), "pooling_mode"),
        (lambda: _split(bounds_check_mode=np.True_), "bounds_check_mode"),
        (lambda: _split(weight_decay_mode=np.array(1)), "weight_decay_mode"),
        (lambda: _split(weight_decay_mode=False), "weight_decay_mode"),
        (lambda: _split(optimizer=[]), "optimizer"),
        (lambda: _split(optimizer="exact_sgd"), "optimizer"),
        (lambda: Dense([(2, 3)], use_cpu=True, pooling_mode=False), "pooling_mode"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, True)]), "embedding_specs[0] location"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, HOST)], output_dtype=[]), "output_dtype"),
        (lambda: IntN([("a", 3, 4, C.SparseType.INT8, HOST)], bounds_check_mode=1.0), "bounds_check_mode"),
    ],
)
def test_enum_arguments_are_members_or_their_int_values(make, word):
    with pytest.raises(ValueError) as info:
        make()
    assert word in str(info.value)


def test_enum_arguments_by_int_value_are_their_members():
    m = _split(pooling_mode=np.int32(1), bounds_check_mode=0, weight_decay_mode=np.uint8(0))
    assert m.pooling_mode is C.PoolingMode.MEAN and m.bounds_check_mode_int == 0


# -- the training module's setters: checked first, a rejected call changes nothing ----------------------
@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda m: m.set_optimizer_step(-1), ValueError, "step"),
        (lambda m: m.set_optimizer_step(2.5), TypeError, "step"),
        (lambda m: m.set_optimizer_step(2**70), ValueError, "step"),
        (lambda m: m.set_learning_rate(math.nan), ValueError, "lr"),
        (lambda m: m.set_learning_rate("x"), ValueError, "lr"),
        (lambda m: m.update_hyper_parameters({"lr": 0.5, "beta1": 1.0}), ValueError, "beta1"),
        (lambda m: m.update_hyper_parameters({"weight_decay": -1}), ValueError, "weight_decay"),
        (lambda m: m.update_hyper_parameters([("lr", 1.0)]), TypeError, "params_dict"),
    ],
)
def test_setters_name_the_value_and_leave_the_module(call, exc, word):
    m = _split(optimizer=C.EmbOptimType.ADAM, weight_decay=0.01, weight_decay_mode=C.WeightDecayMode.DECOUPLE)
    before, opt = _state(m), m.optimizer_args
    with pytest.raises(exc, match=word):
        call(m)
    assert _same_state(m, before) and m.optimizer_args == opt and m.get_learning_rate() == opt.learning_rate
    m.set_learning_rate(0.25)  # a later good call works (a rejected NaN used to stay in the module)
    assert m.get_learning_rate() == 0.25


# -- forward: an id outside its table by feature, table and sample (fbgemm's bag too) -----------------
def _fatal_modules(ftm=None, named=False):
    """Tables of 3 and 4 rows (``ta``, ``tb`` where ``named``), one feature each unless ``ftm``."""
    fatal = C.BoundsCheckMode.FATAL
    q = IntN(
        [("ta", 3, 4, C.SparseType.INT8, HOST), ("tb", 4, 4, C.SparseType.INT8, HOST)],
        feature_table_map=ftm,
        bounds_check_mode=fatal,
        output_dtype=C.SparseType.FP32,
        feature_names_per_table=[["a"], ["b", "c"]] if named else None,
    )
    q.initialize_weights()
    return {
        "split": _split(bounds_check_mode=fatal, feature_table_map=ftm, table_names=["ta", "tb"] if named else None),
        "dense": Dense([(3, 2), (4, 2)], feature_table_map=ftm, use_cpu=True),
        "intn": q,
    }


# batch 2: bags 0, 1 of feature 0, bags 2, 3 of feature 1, bags 4, 5 of feature 2; id 99 in bag 5
_MESSAGES = {
    ("split", False): "indices: feature 2 (table 1): id 99 at sample 1 is outside [0, 4) (bag 5)",
    ("split", True): "indices: feature 2 (table 'tb'): id 99 at sample 1 is outside [0, 4) (bag 5, table 1)",
    ("dense", False): "indices: feature 2 (table 1): id 99 at sample 1 is outside [0, 4) (bag 5)",
    ("intn", False): "indices: feature 2 (table 'tb'): id 99 at sample 1 is outside [0, 4) (bag 5, table 1)",
    ("intn", True): "indices: feature 'c' (table 'tb'): id 99 at sample 1 is outside [0, 4) "
    "(bag 5, feature 2, table 1)",
}


@pytest.mark.parametrize("kind, named", sorted(_MESSAGES))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_an_id_outside_its_table_names_feature_table_and_sample(kind, named, dtype):
    m = _fatal_modules([0, 1, 1], named)[kind]  # three features, the last two reading table 1
    indices = torch.tensor([0, 2, 1, 3, 0, 2, 99, 0], dtype=dtype)
    offsets = torch.tensor([0, 1, 3, 4, 5, 6, 8], dtype=dtype)
    before = indices.clone(), offsets.clone()
    with pytest.raises(IndexError) as info:
        m(indices, offsets)
    assert str(info.value) == _MESSAGES[kind, named]
    cause = info.value.__cause__  # the op's own error, in its own terms
    assert isinstance(cause, IndexError) and str(cause).startswith("indices[6] = 99 in the bag of feature 2, sample 1")
    assert torch.equal(indices, before[0]) and torch.equal(offsets, before[1])


@pytest.mark.parametrize("named", [None, [["a", "b"], ["c"]], [["a"], ["b"]]])
def test_feature_names_that_do_not_fit_the_map_are_not_guessed(named):
    """``feature_names_per_table`` counts that differ from ``feature_table_map``'s: positions only."""
    q = IntN(
        [("ta", 3, 4, C.SparseType.INT8, HOST), ("tb", 4, 4, C.SparseType.INT8, HOST)],
        feature_table_map=[0, 1, 1],
        bounds_check_mode=C.BoundsCheckMode.FATAL,
        feature_names_per_table=named,
    )
    q.initialize_weights()
    want = r"^indices: feature 2 \(table 'tb'\): id -2 at sample 0 .* \(bag 4, table 1\)$"
    with pytest.raises(IndexError, match=want):
        q(torch.tensor([0, 0, -2]), torch.tensor([0, 1, 1, 2, 2, 3, 3]))


def test_a_pruned_row_before_the_bad_id_is_not_named():
    """-1 is a pruned row (zeros) in the quantized lookup: the id named is the one the op refused."""
    q = IntN([("ta", 3, 4, C.SparseType.INT8, HOST)], bounds_check_mode=C.BoundsCheckMode.FATAL)
    q.initialize_weights()
    with pytest.raises(IndexError) as info:
        q(torch.tensor([-1, 99]), torch.tensor([0, 1, 2]))
    assert str(info.value) == "indices: feature 0 (table 'ta'): id 99 at sample 1 is outside [0, 3) (bag 1, table 0)"


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(per_sample_weights=torch.tensor([1, 2, 1])), TypeError, "per_sample_weights"),
        (dict(feature_requires_grad=torch.tensor([1, 1, 1])), ValueError, "feature_requires_grad"),
    ],
)
def test_forward_arguments_are_named(kw, exc, word):
    m = _split()
    with pytest.raises(exc, match=word):
        m(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2, 2, 3]), **kw)


def test_permute_names_pooled_embs_and_embs_dims():
    with pytest.raises(ValueError, match=r"pooled_embs must be \[B, 5\] \(the embs_dims summed\)"):
        permute.PermutePooledEmbeddings([2, 3], [1, 0])(torch.ones(2, 4))


def test_nbit_assign_and_split_arguments_are_checked():
    q = _fatal_modules()["intn"]
    before = q.weights.clone()
    codes = torch.zeros(3, 4, dtype=torch.uint8)
    for bad in (
        [(torch.full((3, 4), 300.5), torch.zeros(3, 4, dtype=torch.uint8)), (codes, codes)],  # cast to uint8 before
        [(codes, torch.zeros(3, 4)), (torch.zeros(4, 4, dtype=torch.uint8), torch.zeros(4, 4, dtype=torch.uint8))],
        [(codes, codes)],
    ):
        with pytest.raises((TypeError, ValueError), match="weight_lists"):
            q.assign_embedding_weights(bad)
    assert torch.equal(q.weights, before)
    with pytest.raises(TypeError, match="split_scale_bias_mode"):
        q.split_embedding_weights_with_scale_bias(True)


@pytest.mark.parametrize("stride", [-1, 0, 4, 2.0, True])
def test_permute_2d_input1d_names_stride(stride):
    """``lengths.view(-1, stride)`` raised torch's RuntimeError ("only one dimension can be inferred")."""
    from embnum.torch_bridge.fbgemm_aliases import ALIASES

    alias = ALIASES["permute_2D_sparse_data_input1D"][2]
    lengths = torch.tensor([1, 0, 2, 1, 1, 0])
    with pytest.raises(ValueError, match="stride"):
        alias(embnum.torch_bridge.permute_2d_sparse_data, torch.tensor([1, 0]), lengths, torch.arange(5), stride)


# -- checkpoints ------------------------------------------------------------------------------------------
def _bad_entries(sd, held):
    out = {
        "nan weights": (held, torch.full_like(sd[held], math.nan)),
        "changed layout": ("weights_offsets", sd["weights_offsets"] + 7),
        "wrong shape": (held, torch.ones(5)),
        "integer weights": (held, sd[held].to(torch.int32)),
    }
    if "weights_uvm" in sd:  # the empty placements: torch copied the rest before refusing one of these
        out["empty buffer with a row"] = ("weights_uvm", torch.zeros(1, 0))
        out["empty buffer as bools"] = ("weights_dev", torch.zeros(0, dtype=torch.bool))
    if "momentum1_host" in sd:
        out["negative Adagrad state"] = ("momentum1_host", -torch.ones_like(sd["momentum1_host"]))
        out["negative step"] = ("iter", torch.tensor([-5]))
        out["float step"] = ("iter", torch.tensor([1.0]))
    return out


@pytest.mark.parametrize("kind, held", [("split", "weights_host"), ("dense", "weights")])
def test_stand_in_checkpoints_are_checked_before_any_copy(kind, held):
    """torch's own load took NaN weights, a negative sum of squares, a negative step and a changed layout."""
    m = _fatal_modules()[kind]
    sd = _state(m)
    for label, (key, value) in _bad_entries(sd, held).items():
        with pytest.raises((TypeError, ValueError)) as info:
            m.load_state_dict({**sd, key: value})
        assert repr(key) in str(info.value), label
        assert _same_state(m, sd), label


@pytest.mark.parametrize("kind", ["split", "dense"])
def test_stand_in_load_with_assign_is_what_forward_reads(kind):
    """``assign=True`` copies into the module's own tensors (the lookups read them): forward sees the loaded values."""
    m = _fatal_modules()[kind]
    sd = {k: (torch.full_like(v, 0.5) if v.dtype.is_floating_point and v.numel() else v) for k, v in _state(m).items()}
    m.load_state_dict(sd, assign=True)
    out = m(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2, 2, 3]))
    assert torch.equal(out.detach(), torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]]))


def test_nbit_checkpoint_needs_its_bytes_and_layout():
    q = _fatal_modules()["intn"]
    sd = _state(q)
    before = _state(q)
    for key, value in (
        ("weights_host", sd["weights_host"].float()),
        ("weights_host", sd["weights_host"][:-1]),
        ("rows_per_table", sd["rows_per_table"] + 1),
    ):
        with pytest.raises((TypeError, ValueError), match=key):
            q.load_state_dict({**sd, key: value})
    assert _same_state(q, before)


# -- the sharded collection (one process) ------------------------------------------------------------------
@pytest.fixture
def group():
    """A one-process gloo group for one test, destroyed after it (a module-wide group outlived the
    module under pytest-xdist and met the README's own init_process_group in test_docs)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sharded(kind="rowwise_adagrad"):
    from embnum.distributed import ROW_WISE, TABLE_WISE, ParameterSharding, ShardedEmbeddingBagCollection
    from embnum.modules import EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(5, 3, "t0", feature_names=["a", "b"]),
        EmbeddingBagConfig(4, 2, "t1", feature_names=["c"], pooling="mean"),
    ]
    plan = {"t0": ParameterSharding(TABLE_WISE, (0,)), "t1": ParameterSharding(ROW_WISE, None)}
    return ShardedEmbeddingBagCollection(tables, plan, optimizer=embnum.TBEOptimizer(kind, 0.1))


@st.composite
def _bad_sharded_batches(draw):
    """The keys of ``_sharded()`` (tables t0: 5 rows, keys a, b, table-wise; t1: 4 rows, key c,
    row-wise) in a drawn order with an extra key, a batch of 1..3 samples, bags of 0..3 valid ids,
    then one id of a read key replaced by one outside its table."""
    rows = {"a": 5, "b": 5, "c": 4, "x": 3}
    keys = draw(st.permutations(["a", "b", "c", "x"]))
    B = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, 3), min_size=4 * B, max_size=4 * B))
    bags = [(keys[i // B], i % B, n) for i, n in enumerate(lengths)]
    assume(any(n and key != "x" for key, _, n in bags))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    values = np.concatenate([rng.integers(0, rows[key], n) for key, _, n in bags])
    spots = [(p, key, b) for p, (key, b) in enumerate((key, b) for key, b, n in bags for _ in range(n)) if key != "x"]
    pos, key, sample = draw(st.sampled_from(spots))
    values[pos] = draw(st.sampled_from([rows[key], rows[key] + 9, -1, -(2**40)]))
    kjt = embnum.KeyedJaggedTensor(keys, torch.from_numpy(values), lengths=torch.tensor(lengths))
    table = "t0" if key in "ab" else "t1"
    want = f"bad batch on rank 0: feature {key!r} (table {table!r}): id {values[pos]} at sample {sample} is outside "
    cause = f"indices[{pos}] = {values[pos]} in the bag of feature {keys.index(key)}, sample {sample} is "
    return kjt, f"{want}[0, {rows[key]})", cause


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_bad_sharded_batches())
def test_sharded_names_feature_table_and_sample(group, case):
    """Key, table and sample of this rank's batch; the op's own error (positions in the KJT as it
    was given) as the cause; the module unchanged."""
    kjt, want, cause = case
    m = _sharded()
    before = _state(m)
    with pytest.raises(IndexError) as info:
        m(kjt)
    assert str(info.value) == want
    assert isinstance(info.value.__cause__, IndexError) and str(info.value.__cause__).startswith(cause)
    assert _same_state(m, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8, torch.int16, torch.bool])
def test_sharded_refuses_ids_that_are_not_int32_or_int64(group, dtype):
    """Float ids were cast to int64 (1.7 read as id 1); the op's dtype rule is the cause."""
    m = _sharded("sgd")
    values = torch.tensor([0, 4, 1.7, 3, 2]).to(dtype)
    kjt = embnum.KeyedJaggedTensor(["a", "b", "c"], values, lengths=torch.tensor([1, 1, 1, 1, 1, 0]))
    with pytest.raises(TypeError, match=r"features.values\(\) must hold int32 or int64 ids") as info:
        m(kjt)
    cause = info.value.__cause__
    assert isinstance(cause, TypeError) and str(cause).startswith("indices must have dtype int32/int64, got ")


def test_sharded_checkpoint_is_checked_before_any_copy(group):
    from embnum.distributed import TableShards

    m = _sharded()
    sd = m.state_dict()
    shards = m.state_dict(gather=False)
    piece = shards["embedding_bags.t1.momentum1"].pieces[0]
    bad = {
        "embedding_bags.t0.momentum1": -torch.ones(5),  # a negative row-wise Adagrad sum of squares
        "embedding_bags.t1.weight": torch.full((4, 2), math.nan),
        "embedding_bags.t0.step": torch.tensor(-1),
        "embedding_bags.t1.step": torch.tensor(2.0),
    }
    before = {k: v.clone() for k, v in sd.items()}
    for key, value in bad.items():
        changed = {k: (v + 1 if v.dtype.is_floating_point else v + 3) for k, v in sd.items()}
        changed[key] = value
        with pytest.raises((TypeError, ValueError), match=key.replace(".", r"\.")):
            m.load_state_dict(changed)
        now = m.state_dict()
        assert all(torch.equal(now[k], before[k]) for k in before), key
    shards["embedding_bags.t1.momentum1"] = TableShards((4,), [((0, 9), (0, 1), torch.ones(9))])
    with pytest.raises(ValueError, match=r"pieces\[0\] rows stop"):
        m.load_state_dict({**sd, "embedding_bags.t1.momentum1": shards["embedding_bags.t1.momentum1"]})
    assert piece[0] == (0, 4)
    loaded = {k: (v + 1 if v.dtype.is_floating_point else v + 3) for k, v in sd.items()}
    m.load_state_dict(loaded, assign=True)  # accepted (it copies: the shards are views of the flat buffers)
    now = m.state_dict()
    assert all(torch.equal(now[k], loaded[k]) for k in loaded)


@pytest.mark.parametrize("kind", ["split", "dense"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_per_sample_weights_of_any_float_dtype_are_read_as_float32(kind, dtype):
    """The dense module passed them on as they were (float16/float64 a TypeError of the op; the
    training module cast them): both read them as float32, as fbgemm's lookups do."""
    m = _fatal_modules()[kind]
    args = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2, 2, 3])
    psw = torch.tensor([0.5, 2.0, -1.5])
    want = m(*args, psw).detach()
    assert torch.equal(m(*args, psw.to(dtype)).detach(), want)


# -- fbgemm's quantized lookup operator (the Python function behind torch.ops.fbgemm's name) ------------------
def _lookup_args():
    from embnum.fbgemm_compat import operators

    q = IntN([("a", 3, 4, C.SparseType.INT8, HOST), ("b", 2, 4, C.SparseType.FP16, HOST)])
    q.initialize_weights()
    args = dict(
        dev_weights=q.weights_host,
        uvm_weights=torch.zeros(0, dtype=torch.uint8),
        weights_placements=torch.tensor([3, 3], dtype=torch.int32),
        weights_offsets=q.weights_offsets,
        weights_tys=q.weights_tys,
        D_offsets=q.D_offsets,
        total_D=8,
        max_int2_D=0,
        max_int4_D=0,
        max_int8_D=4,
        max_float16_D=4,
        max_float32_D=0,
        indices=torch.tensor([0, 2, 1]),
        offsets=torch.tensor([0, 2, 2, 3, 3]),
        pooling_mode=0,
        indice_weights=None,
        output_dtype=0,
    )
    return operators.int_nbit_lookup, args


def test_the_lookup_operator_answers_for_its_buffers():
    lookup, args = _lookup_args()
    assert tuple(lookup(**args).shape) == (2, 8)


@pytest.mark.parametrize(
    "change, exc, words",
    [
        # was torch's own cast: int weights read as floats
        (dict(indice_weights=torch.tensor([1, 2, 3])), TypeError, "indice_weights"),
        (dict(indice_weights=torch.ones(2)), ValueError, "indice_weights"),
        # named the op's "weights", not the operator's argument
        (dict(dev_weights=torch.zeros(256, dtype=torch.int64)), TypeError, "dev_weights"),
        (dict(dev_weights=torch.zeros(1, 256, dtype=torch.uint8)), TypeError, "dev_weights"),
        # NotImplementedError ("not available") for values that are no fbgemm code at all
        (dict(weights_placements=torch.tensor([3, 2**31], dtype=torch.int64)), ValueError, "weights_placements[1]"),
        (dict(weights_tys=torch.tensor([2, 200], dtype=torch.uint8)), ValueError, "weights_tys[1]"),
        # a placement per feature (fbgemm reads one per table): three for two features were accepted
        (dict(weights_placements=torch.tensor([3, 3, 3], dtype=torch.int32)), ValueError, "weights_placements"),
        # no whole row fits: was the op's rows_per_table error, an argument the operator does not have
        (dict(row_alignment=2**40), ValueError, "weights_offsets[0]"),
    ],
)
def test_the_lookup_operator_names_its_arguments(change, exc, words):
    lookup, args = _lookup_args()
    with pytest.raises(exc) as info:
        lookup(**{**args, **change})
    assert words in str(info.value)


# -- the communication codec: its arguments checked (each was taken: a NaN loss scale gave NaN payloads,
# row_dim=2.5 was truncated, an int64 input was encoded, a payload of a partial row was torch's RuntimeError)
def _codec(precision=C.SparseType.FP16, **kw):
    from embnum.fbgemm_compat.quantize import QuantizedCommCodec

    return QuantizedCommCodec(precision, **kw)


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: _codec(loss_scale=math.nan), ValueError, "loss_scale"),
        (lambda: _codec(loss_scale=-1.0), ValueError, "loss_scale"),
        (lambda: _codec(loss_scale=1e-50), ValueError, "loss_scale"),
        (lambda: _codec(loss_scale=1e39), ValueError, "loss_scale"),
        (lambda: _codec(row_dim=2.5), TypeError, "row_dim"),
        (lambda: _codec(row_dim=0), ValueError, "row_dim"),
        (lambda: _codec([]), ValueError, "comm_precision"),
        (lambda: _codec().encode(torch.arange(4)), TypeError, "input_tensor"),
        (lambda: _codec(C.SparseType.INT8).encode(torch.ones(33)), ValueError, "input_tensor"),
        (lambda: _codec().decode(torch.arange(4)), TypeError, "input_tensor"),
        (lambda: _codec().calc_quantized_size(1.5), TypeError, "input_len"),
        (lambda: _codec(C.SparseType.INT8).calc_quantized_size(-32), ValueError, "input_len"),
    ],
)
def test_codec_arguments_are_named(call, exc, word):
    with pytest.raises(exc) as info:
        call()
    assert word in str(info.value)


def test_codec_int8_payload_of_partial_rows_is_named():
    codec = _codec(C.SparseType.INT8)
    ctx = codec.create_context()
    payload = codec.encode(torch.ones(64), ctx)
    with pytest.raises(ValueError, match="input_tensor"):
        codec.decode(payload[:-3], ctx)
