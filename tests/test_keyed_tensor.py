"""The keyed_tensor family beyond its tables (tests/tables/keyed_tensor.py, run by tests/test_ops.py):
kt_regroup_arguments' chains, float16 rounding, ``out=`` checks, the CUDA C kernels' logic run on
the host through g++, the caches and the small kernels (the one-pass verdicts:
tests/test_check_agreement.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from harness import check_matches_ref, pme_args
from strategies import float_dtypes, value_arrays
from tables.keyed_tensor import (
    EDGES,
    FAMILY,
    STRATEGIES,
    classic_regroup,
    handwritten_args,
    regroup_case,
    regroupings,
)

NEXT_WORKED = [
    (regroup_case([["a"]], [[2]], [["a"], ["a"], ["a"], ["a"]]), [1, -2, -3, -4]),
    (regroup_case([["a", "b"]], [[2, 3]], [["a", "b"], ["b", "a"], ["a", "b"]]), [3, 2, -5, -4, -6, -6]),
    (regroup_case([["a", "b"]], [[2, 3]], [["a", "a", "b"]]), [1, -3, 0]),
]


@pytest.mark.parametrize("case", range(len(NEXT_WORKED)))
def test_kt_regroup_next_chains(case, fast_backend):
    args, nxt = NEXT_WORKED[case]
    perm = check_matches_ref("kt_regroup_arguments", args, fast_backend)[0]
    assert perm[:, 5].tolist() == nxt


def test_kt_regroup_duplicate_in_one_group_offsets():
    perm = embnum.kt_regroup_arguments(None, [["a", "b"]], [[2, 3]], [["a", "a", "b"]])[0]
    assert perm[:, 3].tolist() == [0, 2, 4]


def test_kt_regroup_empty():
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, [], [], [])
    assert perm.shape == (0, 6) and ins.shape == (0,) and outs.shape == (0,) and ol == []


def test_float16_backward_rounding_is_per_addition():
    g = EDGES["backward float16 rounds after every addition"][1]
    got = embnum.permute_multi_embedding_backward(**g)
    assert got[0].tolist() == [[2048.0]]  # 2048 + 1 rounds back to 2048 twice; summed at once it would be 2050


def test_classic_case_production_widths():
    embs, keys, lengths, groups = classic_regroup(64, small=False)
    outs = embnum.regroup_keyed_tensor(embs, keys, lengths, groups)
    assert [o.shape for o in outs] == [(64, 608), (64, 256), (64, 1248), (64, 864)]
    f1 = embs[0][:, :96]
    np.testing.assert_array_equal(outs[0][:, :96], f1)
    np.testing.assert_array_equal(outs[2][:, 128:224], f1)
    np.testing.assert_array_equal(outs[3][:, :96], f1)
    perm, ins, o, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    grads = [np.ones_like(x) for x in outs]
    g = embnum.permute_multi_embedding_backward(grads, perm, ins, o, ins.tolist())
    assert (g[0][:, :96] == 3).all() and (g[0][:, 96:] == 1).all()  # f1 is used three times


def test_bad_out():
    args = dict(pooled_embs=[np.ones((2, 3))], keys=[["a"]], lengths=[[3]], groups=[["a"], ["a"]])
    with pytest.raises(ValueError, match="out must hold 2 arrays"):
        embnum.regroup_keyed_tensor(**args, out=[np.empty((2, 3))])
    with pytest.raises(TypeError, match="out\\[1\\] must have dtype float64"):
        embnum.regroup_keyed_tensor(**args, out=[np.empty((2, 3)), np.empty((2, 3), np.float32)])
    with pytest.raises(ValueError, match="shares memory with the input"):
        embnum.regroup_keyed_tensor(**args, out=[np.empty((2, 3)), args["pooled_embs"][0]])
    with pytest.raises(TypeError, match="unexpected keyword argument .out."):
        embnum.kt_regroup_arguments(None, [["a"]], [[3]], [["a"]], out=[np.empty(1)])


# -- the CUDA C kernel's logic, run on the host through g++ (no GPU here) --------------
_DRIVER = r"""
#include "keyed_tensor.cu"
extern "C" void run_copy(unsigned grid, unsigned block, const i64* segs, i64 S, i64 B, const char* const* srcs,
                         const i64* ss, char* const* dsts, const i64* ds, int itemsize) {
    EMBNUM_LAUNCH(grid, block, kt_copy(segs, S, B, srcs, ss, dsts, ds, itemsize));
}
#define RUN_ACC(NAME) \
extern "C" void run_##NAME(unsigned grid, unsigned block, const i64* slots, i64 E, const i64* srcs, i64 B, \
                           const char* const* grads, const i64* gs, char* const* dsts, const i64* ds) { \
    EMBNUM_LAUNCH(grid, block, NAME(slots, E, srcs, B, grads, gs, dsts, ds)); \
}
RUN_ACC(kt_accumulate_f16)
RUN_ACC(kt_accumulate_f32)
RUN_ACC(kt_accumulate_f64)
"""


@pytest.fixture(scope="module")
def cu_on_host(tmp_path_factory):
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("g++") is None:
        pytest.skip("no g++ to run the CUDA C logic on the host")
    kernels = Path(embnum.__file__).parent / "cuda" / "kernels"
    d = tmp_path_factory.mktemp("cu")
    (d / "driver.cpp").write_text(_DRIVER)
    lib = d / "kt.so"
    shim = Path(__file__).with_name("cu_host_shim.h")
    subprocess.run(
        [
            "g++",
            "-O1",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-include",
            str(shim),
            f"-I{kernels}",
            str(d / "driver.cpp"),
            "-o",
            str(lib),
        ],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(str(lib))


def _ptrs(arrays):
    from embnum._permute_plan import address

    return np.array([address(a) for a in arrays], np.uint64), np.array([a.strides[0] for a in arrays], np.int64)


def _c(a):
    import ctypes

    return ctypes.c_void_p(a.ctypes.data)


def _run_cu_forward(lib, embs, rows, widths, grid, block):
    import ctypes

    from embnum._permute_plan import copy_indexed

    B, dtype = embs[0].shape[0], embs[0].dtype
    outs = [np.full((B, w), 7, dtype=dtype) for w in widths]
    segs = copy_indexed(np.asarray(rows)[:, :5].tolist(), widths)
    sp, ss = _ptrs(embs)
    dp, ds = _ptrs(outs)
    lib.run_copy(
        ctypes.c_uint(grid),
        ctypes.c_uint(block),
        _c(segs),
        ctypes.c_int64(len(segs)),
        ctypes.c_int64(B),
        _c(sp),
        _c(ss),
        _c(dp),
        _c(ds),
        ctypes.c_int(dtype.itemsize),
    )
    return outs


def _run_cu_backward(lib, grads, rows, widths, grid, block):
    import ctypes

    from embnum._permute_plan import backward_indexed

    B, dtype = grads[0].shape[0], grads[0].dtype
    outs = [np.full((B, w), 7, dtype=dtype) for w in widths]
    slots, srcs = backward_indexed(np.asarray(rows, dtype=np.int64), widths)
    gp, gs = _ptrs(grads)
    dp, ds = _ptrs(outs)
    fn = getattr(
        lib, {2: "run_kt_accumulate_f16", 4: "run_kt_accumulate_f32", 8: "run_kt_accumulate_f64"}[dtype.itemsize]
    )
    fn(
        ctypes.c_uint(grid),
        ctypes.c_uint(block),
        _c(slots),
        ctypes.c_int64(len(slots)),
        _c(srcs),
        ctypes.c_int64(B),
        _c(gp),
        _c(gs),
        _c(dp),
        _c(ds),
    )
    return outs


@st.composite
def cu_cases(draw):
    """Drawn regroupings, with inputs offset by one element (unaligned rows) or not, and a
    small or large grid (grid-stride loops)."""
    keys, lengths, groups = draw(regroupings(max_width=11))
    dtype = np.dtype(draw(float_dtypes))
    B = draw(st.sampled_from([0, 1, 3]))
    shift = draw(st.sampled_from([0, 1]))
    embs = []
    for ls in lengths:
        buf = draw(value_arrays(dtype, (B * (sum(ls) + shift) + shift,), special=False))
        embs.append(buf[shift:].reshape(B, sum(ls) + shift)[:, : sum(ls)] if B else np.zeros((0, sum(ls)), dtype))
    grid, block = draw(st.sampled_from([(1, 32), (3, 64), (64, 128)]))
    return embs, keys, lengths, groups, grid, block


@settings(max_examples=25)
@given(case=cu_cases())
def test_cuda_c_kernels_on_the_host(cu_on_host, case):
    embs, keys, lengths, groups, grid, block = case
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    want = embnum.permute_multi_embedding(embs, perm, ins, outs, ol, backend="ref")
    got = _run_cu_forward(cu_on_host, embs, perm, ol, grid, block)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))
    if ol:
        grads = [np.ascontiguousarray(w) for w in want]
        want_b = embnum.permute_multi_embedding_backward(grads, perm, ins, outs, ins.tolist(), backend="ref")
        got_b = _run_cu_backward(cu_on_host, grads, perm, ins.tolist(), grid, block)
        err, ok = embnum.get_op("permute_multi_embedding_backward").check_fn(got_b, want_b, {})
        assert ok, (got_b, want_b)


def test_cuda_c_source_uses_16_byte_vectors():
    from embnum.cuda._rawkernel import nvrtc_missing

    if nvrtc_missing():
        pytest.skip(nvrtc_missing())

    # NVRTC runs in a child process: compiling inside the test process broke later torch.load calls (see
    # test_cuda_sources.py)
    code = (
        "import sys; from embnum.cuda._rawkernel import KERNELS, compile_ptx; "
        "sys.stdout.write(compile_ptx((KERNELS / 'keyed_tensor.cu').read_text(), 'keyed_tensor.cu'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ptx = run.stdout
    for entry in ("kt_copy", "kt_accumulate_f16", "kt_accumulate_f32", "kt_accumulate_f64"):
        assert f".entry {entry}" in ptx
    assert "ld.v4.u32" in ptx or "ld.global.v4.u32" in ptx
    assert "st.v4.u32" in ptx or "st.global.v4.u32" in ptx


@settings(max_examples=25)
@given(args=handwritten_args(), data=st.data())
def test_cuda_c_kernels_on_the_host_handwritten_rows(cu_on_host, args, data):
    """Partially overlapping input ranges, uncovered columns, rows in any order."""
    grid, block = data.draw(st.sampled_from([(1, 32), (5, 64)]))
    embs, perm, ol = args["pooled_embs"], args["permutes"].astype(np.int64), args["out_lengths"]
    want = embnum.permute_multi_embedding(**args, backend="ref")
    got = _run_cu_forward(cu_on_host, embs, perm, ol, grid, block)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))
    grads = [np.ascontiguousarray(w) for w in want]
    in_lengths = args["in_shapes"].tolist()
    want_b = embnum.permute_multi_embedding_backward(
        grads, args["permutes"], args["in_shapes"], args["out_shapes"], in_lengths, backend="ref"
    )
    got_b = _run_cu_backward(cu_on_host, grads, perm, in_lengths, grid, block)
    assert embnum.get_op("permute_multi_embedding_backward").check_fn(got_b, want_b, {})[1]


# -- the caches and the small kernels (the one-pass verdicts: tests/test_check_agreement.py) --
@pytest.mark.parametrize("name", FAMILY)
@given(data=st.data())
def test_small_kernels_match_the_parallel_plan(name, data):
    """The small-call kernels (the arrays themselves, the cached indexed plan, one thread) give the
    same bits as the addressed parallel kernels (``SMALL_BYTES = 0`` forces those)."""
    from embnum.cpu import keyed_tensor as cpu_kt

    args = data.draw(STRATEGIES[name])
    small = getattr(embnum, name)(**args)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu_kt, "SMALL_BYTES", 0)
        big = getattr(embnum, name)(**args)
    for a, b in zip(
        small if isinstance(small, (list, tuple)) else [small], big if isinstance(big, (list, tuple)) else [big]
    ):
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()
        else:
            assert a == b


def test_validated_permutes_changed_in_place_are_checked_again():
    args = pme_args(
        [np.ones((2, 3), np.float32)], *embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b", "a"]])[:3], [3]
    )
    embnum.permute_multi_embedding(**args)
    args["permutes"][0, 4] = 3  # the row now reaches past its input's width
    with pytest.raises(ValueError, match="exceeds the width"):
        embnum.permute_multi_embedding(**args)


@pytest.mark.parametrize("bad", [2.0, True, np.float64(2.0)])
def test_validated_key_lists_do_not_admit_equal_non_ints(bad):
    """A cached verdict on ``[[1, 2]]`` is never reused for ``[[1, 2.0]]`` or ``[[1, True]]``."""
    embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b"]])
    embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 1]], [["b"]])
    with pytest.raises(TypeError, match=r"lengths\[0\]\[1\]"):
        embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, bad]], [["b"]])


@pytest.mark.parametrize("readonly", [(0,), (1,), (0, 1)])
def test_small_kernels_take_read_only_inputs_alike_or_mixed(readonly):
    """The small kernels take a tuple of one Numba type: a mix of read-only and writable inputs
    goes to the addressed kernel, all read-only ones to the small one; the same bits either way."""
    keys, lengths, groups = [["a", "b"], ["c"]], [[1, 2], [2]], [["c", "a"], ["b"]]
    embs = [np.arange(6.0).reshape(2, 3), np.arange(4.0).reshape(2, 2) + 10]
    for i in readonly:
        embs[i].flags.writeable = False
    args = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    got = embnum.permute_multi_embedding(embs, *args)
    want = embnum.permute_multi_embedding(embs, *args, backend="ref")
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    back = embnum.permute_multi_embedding_backward([g.copy() for g in got], *args[:3], [3, 2])
    assert [b.shape for b in back] == [(2, 3), (2, 2)]


@pytest.mark.parametrize("fn", ["permute_multi_embedding", "permute_multi_embedding_backward"])
@pytest.mark.parametrize(
    "change",
    [
        ("permutes", lambda a: a.view(a.dtype.newbyteorder()), TypeError, "permutes"),
        ("permutes", lambda a: a.reshape(-1), ValueError, "permutes"),
        ("in_shapes", lambda a: a.reshape(-1, 1), ValueError, "in_shapes"),
        ("out_shapes", lambda a: a.reshape(1, -1), ValueError, "out_shapes"),
        ("out_shapes", lambda a: a.view(np.uint32 if a.dtype == np.int32 else np.uint64), TypeError, "out_shapes"),
    ],
)
def test_cached_permute_verdict_never_skips_the_array_checks(fn, change):
    """A validated (permutes, in_shapes, out_shapes) is cached by dtype, shape and bytes: arrays
    with the same bytes but another byte order, signedness or shape still fail the array checks,
    with their usual errors (a hit skips those checks, so the key must tell them apart)."""
    name, alter, error, match = change
    args = list(embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b", "a"]]))
    embs = [np.ones((2, 3), np.float32)]
    call = getattr(embnum, fn)
    lengths = [3]
    call(embs, *args[:3], lengths)  # validated and cached
    where = {"permutes": 0, "in_shapes": 1, "out_shapes": 2}[name]
    bad = alter(np.asarray(args[where]))
    assert bad.tobytes() == np.asarray(args[where]).tobytes()
    args[where] = bad
    with pytest.raises(error, match=match):
        call(embs, *args[:3], lengths)
