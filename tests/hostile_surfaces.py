"""The hostile tier beyond the ops: the containers, ``KeyedTensor.regroup``, the torch modules,
``TBEOptimizer`` and checkpoints (``load_state_dict``).

A *surface* is a public entry point with a small valid input (``base(seed)``, a flat dict of
NumPy arrays, ints, lists and strings that :func:`hostile.mutations` can mutate), a call on
each *kind* of array (``numpy-ref``, ``numpy-cpu``: NumPy arrays and that backend;
``torch``: tensors), and a *model*: plain Python, independent of embnum, that says what the
mutated input must give: :data:`INVALID` (a clean error on every kind), ``("ok", result)``
(that result on every kind that answers) or ``None`` (the model has no verdict: the kinds
must agree). A call that returns for an input the model calls invalid, or returns another
result, is a *wrong* result. :func:`judge` runs in ``hostile_worker.py`` (a crash is a failed
case, not a dead run).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import hostile
import hostile_containers as C
import hostile_modules as M
import hostile_sharded as D
import hostile_stand_in as F
from hostile_models import BEYOND_FLOAT32, INVALID, KINDS, NotExpressible, same

HOSTILE_FLOATS = (
    "1e39",
    "-1e39",
    "3.5e38",
    "3.4e38",
    "1e-50",
    "-1e-50",
    "1 - 1e-11",
    "1 - 1e-7",
    "-0.0",
    "0.0",
    "-1.0",
    "nan",
    "float('inf')",
    "-float('inf')",
    "10**400",
    "np.float64(1e39)",
    "np.float32(0.5)",
    "np.float16(2)",
)


# what an enum argument given by name (a str in the base) may be replaced with: a bool, a float, an
# array or a NumPy bool equal to a member's value, the values themselves, a name in the wrong case
HOSTILE_NAMES = (
    "True",
    "False",
    "np.True_",
    "1.0",
    "np.float64(0)",
    "np.array(1)",
    "np.int32(1)",
    "np.uint8(0)",
    "0",
    "1",
    "2",
    "7",
    "'sum'",
    "'fp16'",
    "'NONE'",
    "'FP32'",
    "''",
)


def _name_mutations(args):
    """A hostile value in place of a str argument or list entry (the bases give enum members by name)."""
    names = [t for t, a in hostile.leaves(args).items() if isinstance(a, str)]
    if not names:
        return None
    return st.tuples(st.just("value"), st.sampled_from(names), st.sampled_from(HOSTILE_NAMES))


def _float_mutations(args):
    """A hostile float in one float entry of an array, or as a float parameter."""
    arrays = [
        t for t, a in hostile.leaves(args).items() if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size
    ]
    scalars = [
        t
        for t, a in hostile.leaves(args).items()
        if t[1] is None and (a is None or (isinstance(a, float) and not isinstance(a, bool)))
    ]
    options = []
    if arrays:
        options.append(
            st.tuples(st.just("fentry"), st.sampled_from(arrays), st.floats(0, 1), st.sampled_from(HOSTILE_FLOATS))
        )
    if scalars:
        options.append(st.tuples(st.just("float"), st.sampled_from(scalars), st.sampled_from(HOSTILE_FLOATS)))
    return st.one_of(options) if options else None


def apply(args, mutation):
    """:func:`hostile.apply`, plus the float mutations of this tier."""
    if mutation[0] == "float":
        args = dict(args)
        args[mutation[1][0]] = hostile.scalar(mutation[2])
        return hostile.apply(args, ("none", None))
    if mutation[0] == "fentry":
        args = hostile.apply(args, ("none", None))
        a = hostile._get(args, mutation[1])
        b = a.copy()
        try:
            with np.errstate(all="ignore"):
                b.reshape(-1)[min(int(mutation[2] * b.size), b.size - 1)] = hostile.scalar(mutation[3])
        except OverflowError:
            raise hostile.NotApplicable("no float of this dtype holds it") from None
        hostile._set(args, mutation[1], b)
        return args
    return hostile.apply(args, mutation)


def mutations(args):
    """The ops tier's mutations, and (where the input has floats or names) the float and name ones."""
    extra = [m for m in (_float_mutations(args), _name_mutations(args)) if m is not None]
    return st.one_of(hostile.mutations(args), *extra)


# -- the table ---------------------------------------------------------------------------------------------------
SURFACES = {
    "KeyedJaggedTensor(lengths=)": (*C.constructor("lengths"), KINDS),
    "KeyedJaggedTensor(offsets=)": (*C.constructor("offsets"), KINDS),
    "KeyedJaggedTensor.from_lengths_sync": (*C.constructor("lengths_sync"), KINDS),
    "KeyedJaggedTensor.from_offsets_sync": (*C.constructor("offsets_sync"), KINDS),
    "JaggedTensor": (C.jt_base, C.jt_call, C.jt_model, KINDS),
    "JaggedTensor.from_dense_lengths": (C.fdl_base, C.fdl_call, C.fdl_model, KINDS),
    "KeyedJaggedTensor.permute": (C.permute_base, C.permute_call, C.permute_model, KINDS),
    "KeyedJaggedTensor.split": (C.split_base, C.split_call, C.split_model, KINDS),
    "KeyedJaggedTensor.index_select": (C.index_select_base, C.index_select_call, C.index_select_model, KINDS),
    "KeyedJaggedTensor.to_padded_dense": (C.padded_base, C.padded_call, C.padded_model, KINDS),
    "KeyedJaggedTensor.bucketize": (C.bucketize_base, C.bucketize_call, C.bucketize_model, KINDS),
    "KeyedTensor.regroup": (C.regroup_base, C.regroup_call, C.regroup_model, KINDS),
    "EmbeddingBagCollection": (M.ebc_base, M.ebc_call, M.ebc_model, ("torch",)),
    "TBE": (M.tbe_base, M.tbe_call(False), M.tbe_model(False), ("torch",)),
    "FusedTBE": (M.tbe_base, M.tbe_call(True), M.tbe_model(True), ("torch",)),
    "TBEOptimizer": (M.opt_base, M.opt_call, M.opt_model, KINDS),
    "EmbeddingBagCollection.load_state_dict": (M.ckpt_base, M.ckpt_call, M.ckpt_model, ("torch",)),
    # the sharded collection, on a one-process gloo group
    "ShardedEmbeddingBagCollection": (D.forward_base, D.forward_call, D.forward_model, ("torch",)),
    "ShardedEmbeddingBagCollection.load_state_dict": (D.ckpt_base, D.ckpt_call, D.ckpt_model, ("torch",)),
    # the fbgemm stand-in's classes (imported directly: install() refuses beside a real fbgemm_gpu)
    "SplitTableBatchedEmbeddingBagsCodegen": (F.split_base, F.split_call, F.split_model, ("torch",)),
    "SplitTableBatchedEmbeddingBagsCodegen setters": (F.setters_base, F.setters_call, F.setters_model, ("torch",)),
    "SplitTableBatchedEmbeddingBagsCodegen.load_state_dict": (
        F.split_ckpt_base,
        F.split_ckpt_call,
        F.split_ckpt_model,
        ("torch",),
    ),
    "DenseTableBatchedEmbeddingBagsCodegen": (F.dense_base, F.dense_call, F.dense_model, ("torch",)),
    "DenseTableBatchedEmbeddingBagsCodegen.load_state_dict": (
        F.dense_ckpt_base,
        F.dense_ckpt_call,
        F.dense_ckpt_model,
        ("torch",),
    ),
    "IntNBitTableBatchedEmbeddingBagsCodegen": (F.nbit_base, F.nbit_call, F.nbit_model, ("torch",)),
    "IntNBitTableBatchedEmbeddingBagsCodegen.load_state_dict": (
        F.nbit_ckpt_base,
        F.nbit_ckpt_call,
        F.nbit_ckpt_model,
        ("torch",),
    ),
    "IntNBitTableBatchedEmbeddingBagsCodegen.assign_embedding_weights": (
        F.nbit_assign_base,
        F.nbit_assign_call,
        F.nbit_assign_model,
        ("torch",),
    ),
    "PermutePooledEmbeddings": (F.ppe_base, F.ppe_call(False), F.ppe_model, ("torch",)),
    "PermutePooledEmbeddingsSplit": (F.ppe_base, F.ppe_call(True), F.ppe_model, ("torch",)),
    # the torch.ops.fbgemm aliases with no embnum op behind them, and the one whose arguments differ from its op's
    "fbgemm.merge_pooled_embeddings": (F.merge_base, F.merge_call, F.merge_model, ("torch",)),
    "fbgemm.sum_reduce_to_one": (F.reduce_base, F.reduce_call("sum_reduce_to_one"), F.reduce_model(True), ("torch",)),
    "fbgemm.all_to_one_device": (F.reduce_base, F.reduce_call("all_to_one_device"), F.reduce_model(False), ("torch",)),
    "fbgemm.is_uvm_tensor": (F.uvm_base, F.uvm_call, F.uvm_model, ("torch",)),
    "fbgemm.permute_2D_sparse_data_input1D": (F.p2d1_base, F.p2d1_call, F.p2d1_model, ("torch",)),
    "QuantizedCommCodec": (F.codec_base, F.codec_call, F.codec_model, ("torch",)),
    # the stand-in's own operator: fbgemm's quantized lookup (the inference module's buffers)
    "fbgemm.int_nbit_split_embedding_codegen_lookup_function": (
        F.lookup_base,
        F.lookup_call,
        F.lookup_model,
        ("torch",),
    ),
}
TOLERANCE = {
    "TBE": 1e-6,
    "FusedTBE": 1e-6,
    "EmbeddingBagCollection": 1e-5,
    "EmbeddingBagCollection.load_state_dict": 1e-5,
    "TBEOptimizer": 1e-5,
    "ShardedEmbeddingBagCollection": 1e-5,
    "ShardedEmbeddingBagCollection.load_state_dict": 1e-5,
    "SplitTableBatchedEmbeddingBagsCodegen": 1e-5,
    "SplitTableBatchedEmbeddingBagsCodegen setters": 1e-6,
    "SplitTableBatchedEmbeddingBagsCodegen.load_state_dict": 1e-5,
    "DenseTableBatchedEmbeddingBagsCodegen": 1e-5,
    "IntNBitTableBatchedEmbeddingBagsCodegen": 1e-6,
    "DenseTableBatchedEmbeddingBagsCodegen.load_state_dict": 1e-5,
    "IntNBitTableBatchedEmbeddingBagsCodegen.load_state_dict": 1e-6,
    "IntNBitTableBatchedEmbeddingBagsCodegen.assign_embedding_weights": 1e-6,
    "fbgemm.int_nbit_split_embedding_codegen_lookup_function": 1e-6,
    "QuantizedCommCodec": 1e-6,
}


def _update_agrees(got, want):
    """The op tier's comparison of ``tbe_backward_update`` results (weights, then each state)."""
    import embnum

    if got.keys() != want.keys():
        return False
    check = embnum.get_op("tbe_backward_update").check_fn
    return bool(check([got[k] for k in got], [want[k] for k in got], None)[1])


COMPARE = {"TBEOptimizer": _update_agrees}
PARAMS = {  # words an error may name besides the input's keys
    # an id out of its table is named by its feature, table and sample (the modules' own terms)
    "EmbeddingBagCollection": ["features", "feature", "indices", "offsets", "per_sample_weights", "weights", "lengths"],
    "TBE": ["indices", "offsets", "per_sample_weights", "feature"],
    "FusedTBE": ["indices", "offsets", "per_sample_weights", "feature"],
    "KeyedJaggedTensor.bucketize": ["block_sizes", "num_buckets", "my_size", "indices"],
    "JaggedTensor.from_dense_lengths": ["values", "lengths"],
    "KeyedTensor.regroup": ["keys", "length_per_key", "values", "groups", "lengths", "pooled_embs"],
    "KeyedJaggedTensor.to_padded_dense": ["desired_length", "max_lengths"],
    "KeyedJaggedTensor.split": ["segments"],
    "KeyedJaggedTensor.index_select": ["indices"],
    "KeyedJaggedTensor.permute": ["indices", "indices_tensor"],
    "EmbeddingBagCollection.load_state_dict": ["state_dict"],
    "ShardedEmbeddingBagCollection": ["features", "feature", "values", "lengths", "weights"],
    "ShardedEmbeddingBagCollection.load_state_dict": ["state_dict"],
    # the stand-in's errors name fbgemm's arguments
    "SplitTableBatchedEmbeddingBagsCodegen": [
        "embedding_specs",
        "feature_table_map",
        "indices",
        "offsets",
        "per_sample_weights",
        "optimizer",
        "pooling_mode",
        "weight_decay_mode",
        "batch_size_per_feature_per_rank",
    ],
    "SplitTableBatchedEmbeddingBagsCodegen setters": ["params_dict"],
    "SplitTableBatchedEmbeddingBagsCodegen.load_state_dict": ["state_dict"],
    "DenseTableBatchedEmbeddingBagsCodegen.load_state_dict": ["state_dict"],
    "IntNBitTableBatchedEmbeddingBagsCodegen.load_state_dict": ["state_dict"],
    "IntNBitTableBatchedEmbeddingBagsCodegen.assign_embedding_weights": ["weight_lists", "q_weight_list"],
    "DenseTableBatchedEmbeddingBagsCodegen": ["embedding_specs", "indices", "offsets", "per_sample_weights"],
    "IntNBitTableBatchedEmbeddingBagsCodegen": ["embedding_specs", "indices", "offsets", "per_sample_weights"],
    "fbgemm.merge_pooled_embeddings": ["pooled_embeddings", "uncat_dim_size", "cat_dim"],
    "fbgemm.sum_reduce_to_one": ["input_tensors"],
    "fbgemm.all_to_one_device": ["input_tensors"],
    "fbgemm.permute_2D_sparse_data_input1D": ["permute", "lengths", "values", "stride", "weights"],
    "fbgemm.int_nbit_split_embedding_codegen_lookup_function": ["feature"],
    "QuantizedCommCodec": ["comm_precision", "loss_scale", "row_dim", "input_tensor", "input_len"],
}


def judge(case) -> dict:
    """The verdict on ``(surface name, seed, mutation, kinds)`` (see the module docstring)."""
    import traceback
    import warnings

    name, seed, mutation, kinds = case
    base_fn, call, model, _ = SURFACES[name]
    base = base_fn(seed)
    try:
        mutated = apply(base, mutation)
    except hostile.NotApplicable as e:
        return dict(outcomes={}, problems=[], na=str(e), named_target=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expect = model(mutated)
    beyond = expect == BEYOND_FLOAT32
    if beyond:
        expect = None
    params = list(base) + PARAMS.get(name, [])
    target = mutation[1][0] if len(mutation) > 1 and mutation[1] else None
    outcomes, results, problems, named = {}, {}, [], True
    for kind in kinds:
        args = apply(base, mutation)
        before = hostile.snapshot(args)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[kind] = call(args, kind)
            outcomes[kind] = ("ok",)
        except NotExpressible as e:
            outcomes[kind] = ("na", str(e))
            continue
        except BaseException as e:  # noqa: BLE001 - every exception is judged
            msg = str(e)
            outcomes[kind] = ("error", type(e).__name__, msg[:400])
            if not isinstance(e, hostile.CLEAN):
                tb = "".join(traceback.format_exception(e)[-3:])
                problems.append(f"{kind}: unclean {type(e).__name__}: {msg[:300]}\n{tb[-800:]}")
            elif type(e).__name__ == "AllocationError":
                outcomes[kind] = ("error", "AllocationError", msg[:400])
            elif not hostile.names_an_argument(msg, params):
                problems.append(f"{kind}: {type(e).__name__} names no argument: {msg[:300]}")
            named &= target is not None and target in msg
        moved = hostile.changed(before, args)
        if moved:
            problems.append(f"{kind}: changed inputs {moved} ({outcomes[kind][0]})")
    answered = {k: o for k, o in outcomes.items() if o[0] != "na"}
    tol = TOLERANCE.get(name, 0.0)
    wrong = False
    if expect == INVALID:
        for k, o in answered.items():
            if o[0] == "ok":
                problems.append(f"WRONG {k}: returned a result for an input the model rejects")
                wrong = True
    elif expect is not None:
        for k, o in answered.items():
            if o[0] == "ok" and not same(results[k], expect[1], tol):
                problems.append(
                    f"WRONG {k}: result differs from the model's\n got {results[k]!r:.600}\n want {expect[1]!r:.600}"
                )
                wrong = True
            elif o[0] == "error" and o[1] != "AllocationError":
                problems.append(f"{k}: {o[1]} for an input the model accepts: {o[2][:200]}")
    agree = COMPARE.get(name, lambda a, b: same(a, b, tol))
    kinds_ok = [k for k, o in answered.items() if o[0] == "ok"]
    if len({o[0] for o in answered.values()}) > 1 and expect is None:
        problems.append(f"the kinds disagree: {answered}")
    for k in kinds_ok[1:] if not beyond else ():
        if not agree(results[k], results[kinds_ok[0]]):
            problems.append(f"WRONG {k} and {kinds_ok[0]} give different results")
            wrong = True
    return dict(
        outcomes=outcomes,
        problems=problems,
        na=None,
        named_target=named,
        wrong=wrong,
        model=expect is not None,
        beyond=beyond,
    )
