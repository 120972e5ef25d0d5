"""Every Numba-CUDA kernel compiles for the GPU (sm_90 and sm_80) at every signature the ops launch it
with, without a GPU: NVVM (numba.cuda.compile_ptx) to PTX, then ptxas. The simulator that runs the
other cuda tests never types a kernel, so this is the check that catches what a real GPU would reject.

The signatures come from ``tests/cuda_signatures.txt`` (recorded from the cuda tests under the
simulator); a session that launches one missing from it compiles that one at its end
(``tests/conftest.py``). Compiled results are cached on disk
(``~/.cache/embnum-ptx``, keyed by the sources), so a second run costs seconds.
"""

import textwrap
from pathlib import Path

import pytest

from harness import compile_tier_missing, nvcc_missing

if nvcc_missing():
    compile_tier_missing(nvcc_missing())

from embnum.cuda import _ptx  # noqa: E402

SIGNATURES = Path(__file__).with_name("cuda_signatures.txt")


def test_every_kernel_compiles_and_assembles_for_sm90_and_sm80():
    pairs = _ptx.read_signatures(SIGNATURES)
    undeclared = sorted(set(_ptx.kernels()) - {k for k, _ in pairs})
    assert not undeclared, f"kernels with no declared signature: {undeclared}"
    rows = _ptx.compile_all(pairs)
    assert len(rows) == len(pairs) * len(_ptx.CCS)
    failed = [f"{r['kernel']}({r['signature']}) sm_{r['cc'][0]}{r['cc'][1]}: {r['error']}" for r in rows if r["error"]]
    assert not failed, "\n\n".join(failed)


def test_the_check_reports_a_kernel_nvvm_rejects(tmp_path):
    # the float32 TBE bug of issue 15: both branches are typed, and a float32 cannot index an array
    src = tmp_path / "bad_kernel.py"
    src.write_text(
        textwrap.dedent(
            """
            def kernel(w, lut, half, out):
                out[0] = lut[w[0]] if half else w[0]
            """
        )
    )
    good = tmp_path / "good_kernel.py"
    good.write_text("def kernel(w, out):\n    out[0] = w[0] * 2\n")
    rows = _ptx.compile_all(
        [
            (f"{src}:kernel", "float32[::1], float32[::1], boolean, float32[::1]"),
            (f"{good}:kernel", "float32[::1], float32[::1]"),
        ],
        ccs=((9, 0),),
    )
    bad, ok = rows
    assert bad["error"] and "TypingError" in bad["error"]
    assert ok["error"] is None and ok["registers"] > 0


def test_ptxas_rejects_bad_ptx_with_its_log():
    with pytest.raises(RuntimeError, match="ptxas sm_90 failed"):
        _ptx.assemble(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus; }\n", "sm_90")


def test_signature_strings_round_trip():
    import numpy as np

    args = (
        np.zeros(3, np.float16),
        np.zeros((2, 3), np.int32)[:, :2],
        5,
        True,
        np.float32(1),
        (np.zeros(2, np.uint8),) * 2,
    )
    text = _ptx.signature_of(args)
    assert text == "float16[::1], int32[:, :], int64, boolean, float32, UniTuple(uint8[::1], 2)"
    assert ", ".join(str(t) for t in _ptx.parse_signature(text)).startswith("array(float16, 1d, C)")
