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
    # a float32 TBE bug once found this way: both branches are typed, and a float32 cannot index an array
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


def test_the_shared_optimizer_rules_compile_for_the_gpu_one_thread_per_row(tmp_path):
    """embnum._tbe_rows's one-row update (every optimizer, max_norm) as a CUDA device function: the
    CPU runs it and the CUDA kernels call its element steps and row scalars, so both targets
    compile the one source."""
    src = tmp_path / "rows_kernel.py"
    src.write_text(
        textwrap.dedent(
            """
            from numba import cuda

            from embnum import _tbe_rows

            update_row = _tbe_rows.make_update_row(cuda.jit(device=True))


            def kernel(kind, decay, rows, g, voff, elem, lids, m1, m2, hp):
                u = cuda.grid(1)
                if u < lids.shape[0]:
                    go = voff[u]
                    update_row(kind, decay, rows, go, g, go, voff[u + 1] - go, m1, m2, elem[u], lids[u], hp)
            """
        )
    )
    sig = "int64, int64, " + ", ".join(["float32[::1]"] * 2 + ["int64[::1]"] * 3 + ["float32[::1]"] * 3)
    (row,) = _ptx.compile_all([(f"{src}:kernel", sig)], ccs=((9, 0),))
    assert row["error"] is None, row["error"]
    assert row["registers"] > 0
