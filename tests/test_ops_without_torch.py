"""The driver without torch: with torch, fbgemm_gpu and torchrec unimportable (``None`` in
``sys.modules``), ``tests/test_ops.py`` collects every NumPy, cpu and simulated-cuda row that the
family tables (``tests/tables/<family>.py``) define, skips none, and its completeness checks pass.
The expected counts come from the tables, so a row that vanished without torch fails here."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

import embnum
from harness import FLAVORS
from tables import families
from tables import of as table

ROOT = Path(__file__).resolve().parents[1]
WITHOUT_TORCH = (
    "import sys\n"
    "for name in ('torch', 'fbgemm_gpu', 'torchrec'):\n"
    "    sys.modules[name] = None\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)
# the flavors that need neither a GPU nor CuPy: NumPy arrays on the cpu backend and the simulator
HOST_FLAVORS = [f.name for f in FLAVORS if not f.device_arrays]
CHECKS = [
    "test_every_op_has_a_strategy",
    "test_driver_covers_every_backend",
    "test_every_family_has_worked_examples",
    "test_every_op_has_bad_input_rows",
    "test_fbgemm_table_names_every_op",
]


def _pytest_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, "-p", "no:cacheprovider", "-rs", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _expected_rows() -> dict[tuple[str, str], int]:
    """(test, flavor) -> the number of rows the tables define for it."""
    per_flavor = {
        "test_matches_ref": len(embnum.ops()),
        "test_edges": sum(len(getattr(table(f), "EDGES", None) or {}) for f in families()),
        "test_bad_input": sum(len(getattr(table(f), "BAD", ())) for f in families()),
        "test_worked_examples": sum(len(getattr(table(f), "WORKED", ())) for f in families()),
    }
    return {(test, flavor): n for test, n in per_flavor.items() for flavor in HOST_FLAVORS}


def test_driver_collects_every_host_row_without_torch():
    run = _pytest_without_torch("--collect-only", "-q", "tests/test_ops.py")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "skipped" not in out.lower() and "could not import" not in out, out[-4000:]
    got = collections.Counter()
    plain = set()
    for m in re.finditer(r"^tests/test_ops\.py::(\w+)(?:\[([^\]]*)\])?$", run.stdout, re.M):
        test, params = m.groups()
        if params is None:
            plain.add(test)
            continue
        flavor = next((f for f in HOST_FLAVORS if params.startswith(f + "-")), None)
        if flavor is not None:
            got[test, flavor] += 1
    want = _expected_rows()
    assert all(n > 0 for n in want.values()), want
    assert dict(got) == want, f"rows collected without torch {dict(got)}, the tables define {want}"
    assert plain == set(CHECKS), plain


def test_driver_checks_pass_without_torch():
    """The checks that fail until a new op has its strategy, bad-input rows, worked example and
    fbgemm row (or reason) run, and pass, without torch."""
    run = _pytest_without_torch("-q", *(f"tests/test_ops.py::{name}" for name in CHECKS))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert re.search(rf"\b{len(CHECKS)} passed\b", out) and "skipped" not in out.lower(), out[-4000:]
