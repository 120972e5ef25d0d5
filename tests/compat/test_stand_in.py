"""embnum.fbgemm_compat where fbgemm_gpu is absent: the import hook, what it serves, what it refuses.

This directory is the tier CI runs in a second environment without fbgemm_gpu, with
``EMBNUM_FBGEMM_COMPAT=1`` (``.ci/run``); where a real fbgemm_gpu is importable it skips
(``tests/test_fbgemm_compat.py`` covers that side).
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from embnum import fbgemm_compat

if fbgemm_compat.status()["real_fbgemm_gpu"] is not None:
    pytest.skip("a real fbgemm_gpu is importable: the stand-in tier runs without it", allow_module_level=True)
torch = pytest.importorskip("torch")

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}


@pytest.fixture(scope="module", autouse=True)
def installed():
    return fbgemm_compat.install()


def test_install_is_idempotent_and_reports():
    first = fbgemm_compat.install()
    assert fbgemm_compat.install() == fbgemm_compat.status()
    assert first["installed"] and first["real_fbgemm_gpu"] is None
    assert {"permute_2D_sparse_data", "asynchronous_complete_cumsum"} <= set(first["operators"])
    assert [f for f in sys.meta_path if type(f).__name__ == "StandInFinder"].__len__() == 1


def test_fbgemm_gpu_is_served_from_memory():
    import fbgemm_gpu
    import fbgemm_gpu.split_table_batched_embeddings_ops_training as training

    assert getattr(fbgemm_gpu, "__file__", None) is None and fbgemm_gpu.__spec__.origin is None
    assert training.SplitTableBatchedEmbeddingBagsCodegen.__module__ == "embnum.fbgemm_compat.training"
    assert "fbgemm_gpu.split_table_batched_embeddings_ops_training" in fbgemm_compat.status()["loaded"]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fbgemm_gpu.no_such_module")


def _torchrec_imports():
    """Every ``from fbgemm_gpu... import name`` in TorchRec's own (non-test) sources."""
    torchrec = pytest.importorskip("torchrec")
    found = set()
    for path in Path(torchrec.__file__).parent.rglob("*.py"):
        if "tests" in path.parts or "test_utils" in path.parts or path.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fbgemm_gpu"):
                found.update((node.module, a.name) for a in node.names)
            elif isinstance(node, ast.Import):
                found.update((a.name, None) for a in node.names if a.name.startswith("fbgemm_gpu"))
    return sorted(found, key=str)


def test_every_name_torchrec_imports_is_served():
    pairs = _torchrec_imports()
    assert len(pairs) > 30
    missing = []
    for module, name in pairs:
        m = importlib.import_module(module)
        if name is not None and not hasattr(m, name):
            missing.append(f"{module}.{name}")
    assert not missing


def test_sparse_type_behaviour():
    from fbgemm_gpu.split_embedding_configs import SparseType

    assert [SparseType.from_int(i) for i in (0, 1, 2, 3, 4)] == [
        SparseType.FP32,
        SparseType.FP16,
        SparseType.INT8,
        SparseType.INT4,
        SparseType.INT2,
    ]
    for ty in (SparseType.FP32, SparseType.FP16, SparseType.BF16, SparseType.INT4, SparseType.INT2):
        assert SparseType.from_dtype(ty.as_dtype()) is ty
    assert [SparseType(v).bit_rate() for v in ("fp32", "fp16", "int8", "int4", "int2")] == [32, 16, 8, 4, 2]
    with pytest.raises(ValueError, match="Unsupported sparse type: 7"):
        SparseType.from_int(7)


@pytest.mark.parametrize(
    "module, name, feature",
    [
        ("fbgemm_gpu.tbe.ssd", "SSDTableBatchedEmbeddingBags", "SSD"),
        ("fbgemm_gpu.split_table_batched_embeddings_ops_common", "KVZCHParams", "KV-ZCH"),
        ("fbgemm_gpu.tbe.ssd.utils.partially_materialized_tensor", "PartiallyMaterializedTensor", "partially"),
        ("fbgemm_gpu.tbe.cache.kv_embedding_ops_inference", "KVEmbeddingInference", "key-value"),
        ("fbgemm_gpu.tbe.monitoring", "TBEStatsReporterConfig", "statistics"),
    ],
)
def test_unavailable_features_raise_when_used(module, name, feature):
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(NotImplementedError, match=feature):
        cls()


def test_operators_of_unavailable_features_raise_naming_them():
    """The ``torch.ops.fbgemm`` operators of features embnum lacks exist (TorchRec finds them) and
    raise ``NotImplementedError`` naming the feature: TorchRec's ZCH module fails when built, in
    those terms, not with an ``AttributeError`` on ``torch.ops.fbgemm``."""
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

    with pytest.raises(NotImplementedError, match=r"zero-collision hashing \(ZCH\).*create_zch_buffer"):
        torch.ops.fbgemm.create_zch_buffer(8)
    with pytest.raises(NotImplementedError, match="zero-collision hashing"):
        torch.ops.fbgemm.zero_collision_hash(torch.zeros(2, dtype=torch.int64), torch.zeros(4, 1), 4)
    with pytest.raises(NotImplementedError, match="UVM"):
        torch.ops.fbgemm.new_unified_tensor(torch.zeros(1), [2], True)
    with pytest.raises(NotImplementedError, match="zero-collision hashing"):
        HashZchManagedCollisionModule(zch_size=8, device=torch.device("cpu"), total_num_buckets=1)


def test_enrichment_names_import_from_both_homes():
    """TorchRec's tests import the enrichment names from ``tbe.ssd`` (fbgemm's newer home) or from
    ``split_table_batched_embeddings_ops_common``: both serve them; a policy is refused when built."""
    for module in ("fbgemm_gpu.tbe.ssd", "fbgemm_gpu.split_table_batched_embeddings_ops_common"):
        served = importlib.import_module(module)
        assert served.EnrichmentType.IGR_LASER_SID == 1 and served.BackendType.DRAM == 1
        with pytest.raises(NotImplementedError, match="enrichment"):
            served.EnrichmentPolicy(enrichment_type=served.EnrichmentType.IGR_LASER_SID)


def test_unsupported_tbe_options_are_refused_by_name():
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    spec = [(4, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)]
    with pytest.raises(ValueError, match="prefetch_pipeline=True"):
        SplitTableBatchedEmbeddingBagsCodegen(spec, prefetch_pipeline=True)
    with pytest.raises(TypeError, match="no_such_option"):
        SplitTableBatchedEmbeddingBagsCodegen(spec, no_such_option=1)
    with pytest.raises(NotImplementedError, match="MANAGED_CACHING"):
        SplitTableBatchedEmbeddingBagsCodegen([(4, 4, EmbeddingLocation.MANAGED_CACHING, ComputeDevice.CPU)])


def test_environment_variable_installs_at_start_up():
    """``EMBNUM_FBGEMM_COMPAT=1``: a fresh interpreter imports fbgemm_gpu with no code change
    (the ``.pth`` hook of an installed embnum; unset, nothing is installed)."""
    code = "import fbgemm_gpu.split_embedding_configs as c, embnum.fbgemm_compat as f; print(f.status()['installed'])"
    on = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**_ENV, "EMBNUM_FBGEMM_COMPAT": "1"}
    )
    assert on.returncode == 0 and on.stdout.strip() == "True", on.stderr[-2000:]
    off = subprocess.run(
        [sys.executable, "-c", "import fbgemm_gpu"],
        capture_output=True,
        text=True,
        env={k: v for k, v in _ENV.items() if k != "EMBNUM_FBGEMM_COMPAT"},
    )
    assert off.returncode != 0 and "No module named 'fbgemm_gpu'" in off.stderr


def test_the_pages_snippet_runs_in_a_fresh_interpreter():
    """docs/torchrec-without-fbgemm.md's example (a ``code-block``: the main suite's page runner,
    where fbgemm_gpu is installed, leaves it to this tier), without the start-up variable."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "torchrec-without-fbgemm.md").read_text()
    blocks = re.findall(r"^```\{code-block\} python\n(.*?)^```", page, re.M | re.S)
    assert blocks
    env = {k: v for k, v in _ENV.items() if k != "EMBNUM_FBGEMM_COMPAT"}
    for code in blocks:
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
