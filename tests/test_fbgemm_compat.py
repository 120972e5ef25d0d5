"""embnum.fbgemm_compat against the real fbgemm_gpu (the fbgemm tier: skipped where it is not importable).

* ``install()`` refuses where fbgemm_gpu is importable, before changing anything.
* The stand-in enums have fbgemm's members, values and methods' results.
* The training TBE: fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` and embnum's stand-in,
  each in its own subprocess (``tests/compat/tbe_side.py``), on drawn tables, batches and
  hyper-parameters: a forward pass and three training steps for each optimizer fbgemm's CPU build
  trains; outputs, split weights and optimizer states (names and layouts) compared; and the same
  with a variable batch per feature (VBE: ``batch_size_per_feature_per_rank``), which fbgemm's CPU
  build runs for SGD and row-wise Adagrad.

The tier without fbgemm_gpu (TorchRec on the stand-in) is ``tests/compat/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("fbgemm_gpu")
pytestmark = pytest.mark.fbgemm

import fbgemm_gpu.split_embedding_configs as real_configs  # noqa: E402
import fbgemm_gpu.split_table_batched_embeddings_ops_common as real_common  # noqa: E402
from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode as RealWeightDecayMode  # noqa: E402

import embnum.fbgemm_compat as compat  # noqa: E402
from embnum.fbgemm_compat import configs, unavailable  # noqa: E402

HERE = Path(__file__).parent / "compat"
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}


def test_install_refuses_where_fbgemm_is_importable():
    before = list(sys.meta_path)
    with pytest.raises(RuntimeError, match="real fbgemm_gpu is importable or loaded"):
        compat.install()
    assert sys.meta_path == before and not compat.status()["installed"]
    assert compat.status()["real_fbgemm_gpu"] is not None


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (configs.EmbOptimType, real_configs.EmbOptimType),
        (configs.SparseType, real_configs.SparseType),
        (configs.PoolingMode, real_common.PoolingMode),
        (configs.EmbeddingLocation, real_common.EmbeddingLocation),
        (configs.ComputeDevice, real_common.ComputeDevice),
        (configs.BoundsCheckMode, real_common.BoundsCheckMode),
        (configs.CacheAlgorithm, real_common.CacheAlgorithm),
        (configs.WeightDecayMode, RealWeightDecayMode),
        (unavailable.BackendType, real_common.BackendType),
        (unavailable.EnrichmentType, real_common.EnrichmentType),
    ],
    ids=lambda c: c.__name__,
)
def test_enums_match_fbgemm(ours, theirs):
    assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]


def test_sparse_type_methods_match_fbgemm():
    ours, theirs = configs.SparseType, real_configs.SparseType
    for m in ours:
        r = theirs(m.value)
        assert (m.as_int(), m.bit_rate(), m.align_size(), m.is_float(), m.as_dtype(), str(m)) == (
            r.as_int(),
            r.bit_rate(),
            r.align_size(),
            r.is_float(),
            r.as_dtype(),
            str(r),
        )
    for code in range(-1, 11):
        try:
            want = theirs.from_int(code).value
        except ValueError:
            with pytest.raises(ValueError, match="Unsupported sparse type"):
                ours.from_int(code)
        else:
            assert ours.from_int(code).value == want
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.quint4x2, torch.quint2x4]
    for dtype in dtypes + [torch.float8_e4m3fn]:
        for is_mx in (False, True):
            try:
                want = theirs.from_dtype(dtype, is_mx).value
            except ValueError:
                with pytest.raises(ValueError, match="Unsupported sparse dtype"):
                    ours.from_dtype(dtype, is_mx)
            else:
                assert ours.from_dtype(dtype, is_mx).value == want
    for opt in configs.EmbOptimType:
        assert opt.state_names() == real_configs.EmbOptimType(opt.value).state_names()


# -- the training TBE, side by side -------------------------------------------------------------------
OPTIMIZERS = ("EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD")  # what fbgemm's CPU build trains


# fbgemm's CPU build applies row-wise Adagrad's weight decay only on its general path: a pooled
# (SUM / MEAN) float32 table that one feature alone reads goes through fbgemm's fused SparseAdaGrad
# kernel, called with weight_decay=0 (docs/torchrec-without-fbgemm.md, known differences). embnum applies the decay to
# every table, as fbgemm's general CPU path and its GPU kernels do.
DECAY_MODES = (1, 2)  # WeightDecayMode.L2, DECOUPLE


@st.composite
def tbe_case(draw, optimizer, decay=None):
    """One configuration; ``decay``: None (no weight decay), ``"shared"`` (row-wise Adagrad with weight
    decay, every table read by two features: fbgemm's general path) or ``"alone"`` (the same, every
    table read by one feature, pooled: fbgemm's fused path, where it drops the decay)."""
    pooling = draw(st.sampled_from(["SUM", "MEAN"] if decay == "alone" else ["SUM", "MEAN", "NONE"]))
    n_tables = draw(st.integers(1, 3))
    rows = draw(st.lists(st.integers(1, 12), min_size=n_tables, max_size=n_tables))
    dims = draw(st.lists(st.sampled_from([4, 8, 12]), min_size=n_tables, max_size=n_tables))  # fbgemm: multiples of 4
    if pooling == "NONE":  # fbgemm's sequence lookups take one dim for all tables
        dims = [dims[0]] * n_tables
    if decay is None:
        shares = draw(st.lists(st.integers(1, 2), min_size=n_tables, max_size=n_tables))
    else:
        shares = [2 if decay == "shared" else 1] * n_tables
    ftm = [t for t, k in enumerate(shares) for _ in range(k)]
    hyper = {"learning_rate": draw(st.sampled_from([0.01, 0.1, 0.5])), "eps": draw(st.sampled_from([1e-8, 1e-2]))}
    if decay is not None:
        hyper["weight_decay"] = draw(st.sampled_from([0.01, 0.2]))
        hyper["weight_decay_mode"] = draw(st.sampled_from(DECAY_MODES))
    elif draw(st.booleans()):  # float16 rows; fbgemm's CPU build rounds to nearest, stochastic_rounding or not
        hyper["weights_precision"] = "FP16"
        hyper["stochastic_rounding"] = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    weights = [rng.uniform(-1, 1, (r, d)).round(3).tolist() for r, d in zip(rows, dims)]
    B = draw(st.integers(1, 4))
    weighted = pooling == "SUM" and draw(st.booleans())  # embnum refuses MEAN with weights (no fbgemm-wide meaning)
    batches = []
    for _ in range(3):
        lengths = rng.integers(0, 4, len(ftm) * B)
        indices = np.concatenate([rng.integers(0, rows[t], n) for t, n in zip(np.repeat(ftm, B), lengths)] + [[]])
        n = int(lengths.sum())
        width = sum(dims[t] for t in ftm) if pooling != "NONE" else dims[0]
        batches.append(
            {
                "indices": indices.astype(np.int64).tolist(),
                "offsets": np.concatenate([[0], np.cumsum(lengths)]).tolist(),
                "psw": rng.uniform(0.5, 2, n).round(3).tolist() if weighted else None,
                "grad_scale": rng.uniform(-1, 1, (B if pooling != "NONE" else n) * width).round(3).tolist(),
            }
        )
    return {
        "rows": rows,
        "dims": dims,
        "feature_table_map": ftm,
        "optimizer": optimizer,
        "pooling": pooling,
        "hyper": hyper,
        "weights": weights,
        "batches": batches,
    }


def _side(side, cases, tmp, script="tbe_side.py"):
    cfg, out = tmp / f"{side}.cases", tmp / f"{side}.pt"
    if script == "tbe_side.py":
        cfg.write_text(json.dumps(cases))
    else:
        torch.save(cases, cfg)
    res = subprocess.run(
        [sys.executable, str(HERE / script), side, str(cfg), str(out)],
        capture_output=True,
        text=True,
        env=_ENV,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


@st.composite
def vbe_case(draw, optimizer):
    """A :func:`tbe_case` whose batches give each feature its own batch size on each of 1-3 ranks
    (zeros included): offsets over ``sum_t B_t`` bags, the output flat and rank-major."""
    case = draw(tbe_case(optimizer))
    assume(case["pooling"] != "NONE")  # fbgemm has no VBE for sequence lookups
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    T, R = len(case["feature_table_map"]), draw(st.integers(1, 3))
    dims = [case["dims"][t] for t in case["feature_table_map"]]
    weighted = case["batches"][0]["psw"] is not None
    for batch in case["batches"]:
        sizes = rng.integers(0, 4, (T, R))
        lengths = rng.integers(0, 4, int(sizes.sum()))
        per_bag = np.repeat(np.arange(T), sizes.sum(axis=1))  # feature-major bags
        ids = [rng.integers(0, case["rows"][case["feature_table_map"][t]], n) for t, n in zip(per_bag, lengths)]
        n = int(lengths.sum())
        batch.update(
            indices=np.concatenate(ids + [np.zeros(0, np.int64)]).astype(np.int64).tolist(),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).tolist(),
            psw=rng.uniform(0.5, 2, n).round(3).tolist() if weighted else None,
            grad_scale=rng.uniform(-1, 1, int((sizes * np.array(dims)[:, None]).sum())).round(3).tolist(),
            vbe=sizes.tolist(),
        )
    return case


@settings(max_examples=2)
@given(st.tuples(*(vbe_case(o) for o in ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD") for _ in range(3))))
def test_training_tbe_with_variable_batch_matches_fbgemm(tmp_path_factory, cases):
    """VBE (``batch_size_per_feature_per_rank``) for the optimizers fbgemm's CPU build runs it with."""
    tmp = tmp_path_factory.mktemp("vbe")
    _assert_same_training(cases, _side("real", list(cases), tmp), _side("embnum", list(cases), tmp))


def _without_decay(case):
    hyper = {k: v for k, v in case["hyper"].items() if k not in ("weight_decay", "weight_decay_mode")}
    return {**case, "hyper": hyper}


_ROWWISE = "EXACT_ROWWISE_ADAGRAD"


@settings(max_examples=2)
@given(
    st.tuples(*(tbe_case(o) for o in OPTIMIZERS for _ in range(2)), tbe_case(_ROWWISE, "shared")),
    tbe_case(_ROWWISE, "alone"),
)
def test_training_tbe_matches_fbgemm(tmp_path_factory, cases, alone):
    """Every optimizer fbgemm's CPU build trains, weight decay included; where fbgemm's fused path
    drops row-wise Adagrad's decay (``alone``), fbgemm equals embnum without the decay, and embnum
    with it differs (the difference is fbgemm's, and it is still there)."""
    assume(any(b["indices"] for b in alone["batches"]))
    tmp = tmp_path_factory.mktemp("tbe")
    real = _side("real", [*cases, alone], tmp)
    ours = _side("embnum", [*cases, _without_decay(alone), alone], tmp)
    assert any(
        not torch.allclose(g, w, rtol=1e-5, atol=1e-6) for w, g in zip(real[-1]["weights"], ours[-1]["weights"])
    ), "fbgemm's CPU build now applies row-wise Adagrad's weight decay to unshared tables: update the docs"
    _assert_same_training([*cases, alone], real, ours)


HALF = {"rtol": 2**-7, "atol": 2**-10}
HALF_SUMS = {"rtol": 2**-6, "atol": 2**-7}


def _assert_same_training(cases, real, ours):
    """Outputs, split weights and optimizer states (names and values) of each case alike. float16
    rows: within 8 float16 ulps (``HALF``), as both sides compute a step in float32 in their own
    order and a last-bit float32 difference can flip the rounding to float16 at each step (measured:
    up to 5 ulps after three Adagrad steps); the outputs, sums of up to a few such rows times
    weights up to 2, within ``HALF_SUMS``. float32 tables are compared to rtol 1e-5."""
    for case, want, got in zip(cases, real, ours):
        where = f"{case['optimizer']} {case['pooling']} rows={case['rows']} dims={case['dims']}"
        half = case["hyper"].get("weights_precision") == "FP16"
        tol = HALF if half else {"rtol": 1e-5, "atol": 1e-6}
        for step, (w, g) in enumerate(zip(want["outputs"], got["outputs"])):
            out_tol = HALF_SUMS if half else tol
            torch.testing.assert_close(g, w, **out_tol, msg=lambda m: f"{where} step {step}: {m}")
        for t, (w, g) in enumerate(zip(want["weights"], got["weights"])):
            torch.testing.assert_close(g, w, **tol, msg=lambda m: f"{where} table {t} weights: {m}")
        assert [sorted(d) for d in got["states"]] == [sorted(d) for d in want["states"]], where
        for t, (w, g) in enumerate(zip(want["states"], got["states"])):
            for name in w:
                torch.testing.assert_close(
                    g[name], w[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{where} table {t} {name}: {m}"
                )


# -- the quantized inference TBE, side by side ----------------------------------------------------------
_ROW_BYTES = {"fp32": 4, "fp16": 2}


@st.composite
def nbit_case(draw):
    """Tables of every row type fbgemm and embnum share, their quantized rows drawn directly (codes
    any byte, float16 scale and bias), so both sides read the same buffer."""
    pooling = draw(st.sampled_from(["SUM", "MEAN", "NONE"]))
    n = draw(st.integers(1, 4))
    tys = draw(st.lists(st.sampled_from(["fp32", "fp16", "int8", "int4", "int2"]), min_size=n, max_size=n))
    dims = draw(st.lists(st.sampled_from([8, 16, 24]), min_size=n, max_size=n))
    if pooling == "NONE":
        dims = [dims[0]] * n
    rows = draw(st.lists(st.integers(1, 10), min_size=n, max_size=n))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    weight_lists = []
    for r, d, ty in zip(rows, dims, tys):
        if ty in _ROW_BYTES:
            floats = torch.rand(r, d, generator=g) * 2 - 1
            weight_lists.append(((floats if ty == "fp32" else floats.half()).view(torch.uint8), None))
        else:
            bits = {"int8": 8, "int4": 4, "int2": 2}[ty]
            codes = torch.randint(0, 256, (r, d * bits // 8), generator=g, dtype=torch.uint8)
            scale_bias = (torch.rand(r, 2, generator=g) * torch.tensor([0.1, 2.0]) - torch.tensor([0.0, 1.0])).half()
            weight_lists.append((codes, scale_bias.view(torch.uint8)))
    ftm = [t for t in range(n) for _ in range(draw(st.integers(1, 2)))]
    B = draw(st.integers(1, 4))
    batches = []
    for _ in range(2):
        lengths = torch.randint(0, 4, (len(ftm) * B,), generator=g)
        ids = [
            torch.randint(0, rows[t], (int(k),), generator=g)
            for t, k in zip(torch.tensor(ftm).repeat_interleave(B), lengths)
        ]
        indices = torch.cat(ids).int()
        psw = torch.rand(indices.shape[0], generator=g) if pooling == "SUM" and draw(st.booleans()) else None
        batches.append(
            {"indices": indices, "offsets": torch.cat([torch.zeros(1), lengths.cumsum(0)]).int(), "psw": psw}
        )
    return {
        "tables": list(zip(rows, dims, tys)),
        "feature_table_map": ftm,
        "pooling": pooling,
        "weight_lists": weight_lists,
        "output": draw(st.sampled_from(["fp32", "fp16"])),
        "row_alignment": draw(st.sampled_from([1, 16])),
        "batches": batches,
    }


@settings(max_examples=2)
@given(st.lists(nbit_case(), min_size=6, max_size=6))
def test_quantized_inference_tbe_matches_fbgemm(tmp_path_factory, cases):
    tmp = tmp_path_factory.mktemp("nbit")
    real = _side("real", cases, tmp, "nbit_side.py")
    ours = _side("embnum", cases, tmp, "nbit_side.py")
    for case, want, got in zip(cases, real, ours):
        where = f"{case['tables']} {case['pooling']} output {case['output']}"
        tol = 1e-3 if case["output"] == "fp16" else 1e-5  # fp16 outputs: one float16 rounding of the same sum
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=lambda m: f"{where}: {m}")
