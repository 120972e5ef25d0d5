"""The quant family beyond its tables (tests/tables/quant.py, run by tests/test_ops.py): the
round-trip error bounds, ``out=`` checks, the bit conversions of embnum._half, the cpu backend's
output pool."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import embnum
from embnum import _half
from harness import FLAVORS
from tables.quant import F16, F32, STRATEGIES, float_rows, hfp8_params, qn_args


def test_output_dtype_float16_is_the_rounded_float32():
    q = embnum.float_to_fused_8bit_rowwise(np.random.default_rng(0).standard_normal((5, 9)).astype(F32))
    f32 = embnum.fused_8bit_rowwise_to_float(q)
    f16 = embnum.fused_8bit_rowwise_to_float(q, output_dtype="float16")
    assert f16.dtype == F16 and np.array_equal(f16, f32.astype(F16))


# -- round-trip error bounds (the codecs' stated error) --------------------------------
def _ulp(a):
    return np.spacing(np.abs(a).astype(F32)).astype(np.float64)


@settings(max_examples=60)
@given(x=float_rows(shape=(3, 8), special=False))
def test_8bit_round_trip_bound(x):
    """|x - dequantize(quantize(x))| <= scale/2 + 1e-8 + 4 ulp(max|row|) (float16 input: widened)."""
    x64 = x.astype(np.float64)
    q = embnum.float_to_fused_8bit_rowwise(x)
    back = embnum.fused_8bit_rowwise_to_float(q).astype(np.float64)
    scale = np.ascontiguousarray(q[:, 8:12]).view("<f4")[:, 0].astype(np.float64)
    bound = scale / 2 + 1e-8 + 4 * _ulp(np.abs(x64).max(axis=1))
    assert np.all(np.abs(back - x64) <= bound[:, None])


@settings(max_examples=60)
@given(args=qn_args().filter(lambda a: np.all(np.isfinite(a["input"]))), data=st.data())
def test_nbit_round_trip_bound(args, data):
    """For rows within float16 range, with the stored float16 scale s and Q = 2**bit_rate - 1:
    |x - x^| <= |s|/2 + 2**-11 |min| + Q (2**-11 |s| + 2**-25) + 2**-24 + 4 ulp(max|row|)
    (the float16 roundings of bias and scale are part of the format: the top code may clamp)."""
    x = np.ascontiguousarray(args["input"]).astype(np.float64)
    assume(x.size > 0 and np.abs(x).max() <= 6e4)
    q = embnum.float_to_fused_nbit_rowwise(**args)
    back = embnum.fused_nbit_rowwise_to_float(q, args["bit_rate"]).astype(np.float64)
    scale = np.abs(np.ascontiguousarray(q[:, -4:]).view("<f2")[:, 0].astype(np.float64))
    mn = x.min(axis=1)
    Q = 2 ** args["bit_rate"] - 1
    bound = scale / 2 + 2**-11 * np.abs(mn) + Q * (2**-11 * scale + 2**-25) + 2**-24 + 4 * _ulp(np.abs(x).max(axis=1))
    assert np.all(np.abs(back - x) <= bound[:, None])


@settings(max_examples=40)
@given(x=hnp.arrays(F32, 20, elements=st.floats(-3.0000000054977558e38, 3.0000000054977558e38, width=32)))
def test_bfloat16_round_trip_bound(x):
    """Relative error <= 2**-8 (normal range), absolute <= 2**-134 (subnormals)."""
    back = embnum.bfloat16_to_float(embnum.float_to_bfloat16(x)).astype(np.float64)
    err = np.abs(back - x)
    assert np.all((err <= 2**-8 * np.abs(x.astype(np.float64))) | (err <= 2**-134))


@settings(max_examples=40)
@given(x=hnp.arrays(F32, 20, elements=st.floats(-1e6, 1e6, width=32)))
def test_fp16_round_trip_bound(x):
    """Saturating: |x| <= 65504 -> relative 2**-11 or absolute 2**-25; beyond -> +-65504."""
    back = embnum.fp16_to_float(embnum.float_to_fp16(x)).astype(np.float64)
    x64 = x.astype(np.float64)
    inside = np.abs(x64) <= 65504
    err = np.abs(back - x64)
    assert np.all(((err <= 2**-11 * np.abs(x64)) | (err <= 2**-25))[inside])
    assert np.all(back[~inside] == np.sign(x64[~inside]) * 65504)


@settings(max_examples=40)
@given(params=hfp8_params(), x=hnp.arrays(F32, 20, elements=st.floats(-1e4, 1e4, width=32)))
def test_hfp8_round_trip_bound(params, x):
    """|x| <= max_pos: relative 2**-(m+1) in the normal range, absolute 2**(-bias-m) below it;
    beyond: +-(max_pos encoded)."""
    ebits, bias, max_pos = params
    m = 7 - ebits
    back = embnum.hfp8_to_float(embnum.float_to_hfp8(x, ebits, bias, max_pos), ebits, bias).astype(np.float64)
    x64 = x.astype(np.float64)
    mp = float(F32(max_pos))
    inside = np.abs(x64) <= mp
    err = np.abs(back - x64)
    assert np.all(((err <= 2.0 ** -(m + 1) * np.abs(x64)) | (err <= 2.0 ** (-bias - m)))[inside])
    # beyond max_pos: the code of max_pos itself (its rounding may exceed max_pos when it lies
    # in the subnormal range, e.g. ebits=1, bias=0: 1.984375 -> 2.0)
    top = float(embnum.hfp8_to_float(embnum.float_to_hfp8(np.array([mp], F32), ebits, bias, max_pos), ebits, bias)[0])
    assert np.all(back[~inside] == np.sign(x64[~inside]) * top)


def test_bad_out():
    x = np.ones((2, 4), F32)
    with pytest.raises(ValueError, match="out must have shape"):
        embnum.float_to_fused_8bit_rowwise(x, out=np.empty((2, 11), np.uint8))
    with pytest.raises(TypeError, match="out must have dtype uint8"):
        embnum.float_to_fused_8bit_rowwise(x, out=np.empty((2, 12), np.int8))
    with pytest.raises(TypeError, match="output_dtype"):
        embnum.fused_8bit_rowwise_to_float(np.zeros((1, 9), np.uint8), output_dtype="float64")
    with pytest.raises(TypeError, match="positional"):
        embnum.fused_8bit_rowwise_to_float(np.zeros((1, 9), np.uint8), "float16")  # keyword-only


def test_bfloat16_dtype_named_bfloat16_is_read_as_bits():
    """An ``ml_dtypes.bfloat16`` array (a real dtype named bfloat16) decodes like its uint16 bits,
    on every backend; other 2-byte dtypes are a TypeError naming bfloat16."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.5, -2.0, 0.0, np.inf, 3.0e38, 1e-40], dtype=ml_dtypes.bfloat16)
    assert x.dtype.name == "bfloat16" and x.dtype != np.uint16
    want = embnum.bfloat16_to_float(x.view(np.uint16), backend="ref")
    np.testing.assert_array_equal(want, x.astype(np.float32))
    for backend in embnum.available_backends():
        got = embnum.bfloat16_to_float(x, backend=backend)
        assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), backend
    with pytest.raises(TypeError, match="bfloat16"):
        embnum.bfloat16_to_float(np.ones(2, F16))


# -- embnum._half: the bit conversions every kernel uses --------------------------------
@pytest.fixture(scope="module")
def float32_samples():
    rng = np.random.default_rng(0)
    u = np.concatenate(
        [
            rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32),
            np.arange(2**16, dtype=np.uint32) << 16,  # every exponent and sign, top mantissa bits
            (np.arange(2**16, dtype=np.uint32) << 13) + np.uint32(0x38000000),  # float16 grid and its midpoints
            np.array([0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x32FFFFFF, 0x7F800000, 0xFF800000], np.uint32),
        ]
    )
    return u


def test_half_conversions_match_numpy(float32_samples):
    import numba

    @numba.njit
    def convert(u, x, a, b, c, d):
        for i in range(u.shape[0]):
            a[i] = f2h(x[i])
            b[i] = b2h(u[i])
            c[i] = t2b(x[i])
            d[i] = b2f(u[i])

    f2h, b2h = numba.njit(_half.float_to_half_bits), numba.njit(_half.float32_bits_to_half_bits)
    t2b, b2f = numba.njit(_half.float32_to_bits), numba.njit(_half.bits_to_float32)
    u = float32_samples
    x = u.view(F32)
    a, b, c = (np.empty(u.size, np.int64) for _ in range(3))
    d = np.empty(u.size)
    convert(u, x, a, b, c, d)
    nan = np.isnan(x)
    with np.errstate(over="ignore"):
        want = x.astype(F16).view(np.uint16)
    for got in (a, b):
        assert np.array_equal(got.astype(np.uint16)[~nan], want[~nan])
        assert np.isnan(got.astype(np.uint16).view(F16)[nan]).all()
    assert np.array_equal(c.astype(np.uint32)[~nan], u[~nan]) and np.all(c[nan] == 0x7FC00000)
    assert np.array_equal(d.astype(F32).view(np.uint32)[~nan], u[~nan]) and np.isnan(d[nan]).all()
    h = np.arange(2**16, dtype=np.uint16)
    back = np.array([_half.half_bits_to_float(int(v)) for v in h])
    assert np.array_equal(back, h.view(F16).astype(np.float64), equal_nan=True)
    assert np.array_equal(np.signbit(back), np.signbit(h.view(F16)))


def _f16c_quant():
    pytest.importorskip("numba")
    from embnum.cpu import _common, quant

    if not _common.F16C:
        pytest.skip("this CPU has no F16C: float_to_fp16 runs the rule kernel, which the tables test")
    return quant


def _same_half_bits(quant, u, saturate):
    """The F16C kernel and the rule kernel it replaces on such CPUs: every pattern bit for bit
    (NaN payloads included)."""
    got, want = np.empty(u.size, np.uint16), np.empty(u.size, np.uint16)
    quant._to_fp16_f16c(u.view(F32), saturate, got)
    quant._to_fp16_serial(u, saturate, want)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(hex(u[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]


@pytest.mark.parametrize("saturate", [False, True])
def test_f16c_narrowing_is_the_rule_on_samples(float32_samples, saturate):
    _same_half_bits(_f16c_quant(), float32_samples, saturate)


# float32 patterns by field (sign, exponent, mantissa): every exponent as likely as any other
_F32_PATTERNS = st.builds(
    lambda s, e, m: (s << 31) | (e << 23) | m, st.integers(0, 1), st.integers(0, 255), st.integers(0, 2**23 - 1)
)


@given(u=hnp.arrays(np.uint32, st.integers(0, 64), elements=_F32_PATTERNS, fill=st.nothing()), saturate=st.booleans())
def test_f16c_narrowing_is_the_rule_on_drawn_patterns(u, saturate):
    _same_half_bits(_f16c_quant(), u, saturate)


@pytest.mark.parametrize(
    "x,want", [(0.5, 0), (1.5, 2), (2.5, 2), (3.49, 3), (3.5, 4), (-1.5, -2), (-2.5, -2), (1e10 + 0.5, 1e10)]
)
def test_rne_ties_to_even(x, want):
    assert _half.rne(x) == want


# -- the cpu backend's reuse of large outputs (embnum.cpu._pool) ----------------------------
@pytest.fixture
def pool(monkeypatch):
    """The output pool with a small threshold (so that test-sized outputs use it), emptied."""
    pytest.importorskip("numba")
    from embnum.cpu import _pool

    monkeypatch.setattr(_pool, "MIN_BYTES", 1)
    monkeypatch.setattr(_pool, "_buffers", [])
    return _pool


def _q8_rows(seed, rows=64):
    x = np.random.default_rng(seed).standard_normal((rows, 16)).astype(F32)
    return embnum.float_to_fused_8bit_rowwise(x)


def test_pooled_outputs_never_alias_a_result_still_held(pool):
    """Whatever keeps a result alive (the array, a view of it, a memoryview, a torch tensor)
    keeps its buffer out of the pool; once everything is gone the buffer is reused."""
    q = _q8_rows(0)
    want = embnum.fused_8bit_rowwise_to_float(q, backend="ref")
    keepers = [
        lambda r: r,
        lambda r: r[1:, ::2].T,
        lambda r: memoryview(r),
        lambda r: np.asarray(r).reshape(-1),
    ]
    try:
        import torch

        keepers.append(lambda r: torch.from_numpy(r))
    except ImportError:
        pass
    for keep in keepers:
        first = embnum.fused_8bit_rowwise_to_float(q)
        held = keep(first)
        del first
        second = embnum.fused_8bit_rowwise_to_float(q)
        assert not np.shares_memory(second, np.asarray(held))
        np.testing.assert_array_equal(second, want)
        del held, second
    pool.release()  # only q's buffer (busy) stays
    third = embnum.fused_8bit_rowwise_to_float(q)
    fourth = embnum.fused_8bit_rowwise_to_float(q)
    assert not np.shares_memory(third, fourth)
    assert third.base is not None and fourth.base is not None and len(pool._buffers) == 3  # pooled
    address = third.__array_interface__["data"][0]
    del third
    assert embnum.fused_8bit_rowwise_to_float(q).__array_interface__["data"][0] == address  # dropped: reused


def test_pool_bounds_what_it_keeps(pool, monkeypatch):
    """At most MAX_BUFFERS buffers and MAX_BYTES bytes are tracked, whatever the caller holds;
    MAX_BYTES = 0 turns the pool off; release() frees the idle ones."""
    q = _q8_rows(1)
    monkeypatch.setattr(pool, "MAX_BUFFERS", 2)
    held = [embnum.fused_8bit_rowwise_to_float(q) for _ in range(5)]
    assert len(pool._buffers) == 2 and pool.held_bytes() <= pool.MAX_BYTES
    assert all(not np.shares_memory(a, b) for i, a in enumerate(held) for b in held[i + 1 :])
    del held
    assert pool.release() > 0 and pool.held_bytes() == 0
    monkeypatch.setattr(pool, "MAX_BYTES", 0)
    assert embnum.fused_8bit_rowwise_to_float(q).base is None and pool.held_bytes() == 0


def test_pool_hands_a_buffer_to_one_thread(pool):
    """Calls from several threads that keep their results get pairwise distinct memory."""
    import threading

    q = _q8_rows(2)
    results, barrier = [], threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(20):
            results.append(embnum.fused_8bit_rowwise_to_float(q))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    addresses = [r.__array_interface__["data"][0] for r in results]
    assert len(set(addresses)) == len(results)


def test_simulated_kernels_give_ieee_specials_without_numpy_warnings():
    """Under the simulator a kernel's float32 arithmetic runs as NumPy scalar operations, which
    warn on ``inf - inf`` or an overflow where a GPU gives IEEE's answer quietly; the launch keeps
    those warnings out (a green run has none) and the bytes still equal the oracle's."""
    sim = next(f for f in FLAVORS if f.name == "cuda-sim")
    if sim.unavailable():
        pytest.skip(sim.unavailable())
    x = np.array([[np.inf, 1.0, -np.inf, 2.0], [np.nan, 0.0, 1.0, 2.0], [3e38, -3e38, 0.0, 1.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = embnum.float_to_fused_8bit_rowwise(x, backend="cuda")
    assert got.tobytes() == embnum.float_to_fused_8bit_rowwise(x, backend="ref").tobytes()


ROWWISE = ["float_to_fused_8bit_rowwise", "fused_8bit_rowwise_to_float", "float_to_fused_nbit_rowwise"]
ROWWISE += ["fused_nbit_rowwise_to_float"]


@pytest.mark.parametrize("name", ROWWISE)
@settings(max_examples=40)
@given(data=st.data())
def test_cpu_rowwise_parallel_kernel_is_ref(name, data):
    """The row-wise codecs' parallel kernels (which small calls skip for their serial twins: the
    test tables' inputs are small) give ref's bytes on the tables' drawn inputs, every call on
    all threads."""
    pytest.importorskip("numba")
    from embnum.cpu import _common

    args = data.draw(STRATEGIES[name])
    want = getattr(embnum, name)(**args, backend="ref")
    before = _common.SERIAL_OVERRIDE
    try:
        _common.SERIAL_OVERRIDE = 0  # no call is small: every kernel runs its parallel loop
        got = getattr(embnum, name)(**args, backend="cpu")
    finally:
        _common.SERIAL_OVERRIDE = before
    assert want.dtype == got.dtype and want.shape == got.shape
    assert want.tobytes() == got.tobytes()
