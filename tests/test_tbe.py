"""The TBE family beyond its tables (tests/tables/tbe.py, run by tests/test_ops.py): every dim and
kernel variant, the optimizers' worked steps, bounds-check modes, validation, a toy training loop,
the device bounds checks."""

import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import embnum
from embnum import TBEOptimizer, tbe_layout
from harness import FLAVORS, check_matches_ref, check_rejects
from tables import strategy
from tables.tbe import DIMS, GRAD, IND, LAY, OFF, OPTIMIZERS, W12, _uargs, state_for, tbe_args, vbe_batch


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("pooling", ["sum", "mean", "none"])
def test_forward_every_dim(D, pooling, fast_backend):
    rng = np.random.default_rng(D)
    lay = tbe_layout([7, 5], [D, D], [0, 0, 1])
    offsets = np.array([0, 4, 4, 9, 9, 10, 16, 16, 16, 20])  # empty bags, a 6-long bag of one id
    indices = np.array([1, 1, 1, 6, 0, 0, 2, 2, 0, 5, 3, 3, 3, 3, 3, 3, 4, 0, 4, 4], dtype=np.int32)
    args = tbe_args(
        lay, rng.standard_normal(lay.num_weights).astype(np.float32), indices, offsets, pooling_mode=pooling
    )
    if pooling == "sum":
        args["per_sample_weights"] = rng.standard_normal(20).astype(np.float32)
    want = check_matches_ref("tbe_forward", args, fast_backend)
    if pooling == "mean":
        assert not want[0, D : 2 * D].any()  # MEAN of an empty bag is 0
    g = rng.standard_normal(want.shape).astype(np.float32)
    for name in ("tbe_backward", "tbe_backward_sparse"):
        check_matches_ref(name, dict(args, grad_output=g), fast_backend)


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_forward_mixed_dims_specialised_and_generic(pooling, dtype, fast_backend):
    # the cpu forward compiles its own kernel for some dims (64, 32) and a generic one for the rest (3)
    rng = np.random.default_rng(1)
    lay = tbe_layout([7, 5, 4], [64, 3, 32], [0, 0, 1, 2])
    B = 5
    lengths = rng.integers(0, 12, 4 * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.repeat([7, 7, 5, 4], B)
    indices = np.concatenate([rng.integers(0, r, n) for r, n in zip(rows, lengths)]).astype(np.int64)
    args = tbe_args(lay, rng.standard_normal(lay.num_weights).astype(dtype), indices, offsets, pooling_mode=pooling)
    if pooling == "sum":
        args["per_sample_weights"] = rng.standard_normal(indices.shape[0]).astype(np.float32)
    check_matches_ref("tbe_forward", args, fast_backend)


@st.composite
def pooled_kernel_case(draw):
    """A pooled forward's kernel arguments with every float16 bit pattern possible (NaNs of several
    payloads, infinities, subnormals, -0) or float32 values that overflow when summed."""
    D = draw(st.sampled_from([32, 128]))
    half = draw(st.booleans())
    T, rows, B = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if half:
        w = rng.integers(0, 1 << 16, T * rows * D).astype(np.uint16)
        specials = np.array([0x7C00, 0xFC00, 0x7E00, 0x7D01, 0x8000, 0x0001, 0x7BFF], np.uint16)
        hit = rng.random(w.shape[0]) < draw(st.sampled_from([0.0, 0.01, 0.3]))
        w[hit] = rng.choice(specials, int(hit.sum()))
    else:
        normal = np.clip(rng.standard_normal(T * rows * D), -3.4, 3.4)  # finite float32 even at 1e38 scale
        w = (normal * draw(st.sampled_from([1.0, 1e38]))).astype(np.float32)
    lengths = rng.integers(0, 2 * draw(st.integers(0, 25)) + 1, T * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(0, rows, int(offsets[-1])).astype(np.int64)
    psw = rng.standard_normal(indices.shape[0]).astype(np.float32) * np.float32(draw(st.sampled_from([1, 1e30])))
    return dict(
        w=w,
        D=D,
        B=B,
        woff=np.arange(T, dtype=np.int64) * rows * D,
        doff=np.arange(T + 1, dtype=np.int64) * D,
        indices=indices,
        offsets=offsets,
        psw=psw,
        has_psw=draw(st.booleans()),
        mean=draw(st.booleans()),
        stream=draw(st.booleans()),
        shift=draw(st.sampled_from([0, 4, 1])),  # floats past a 64-byte boundary
    )


@given(case=pooled_kernel_case())
@settings(deadline=None)
def test_forward_vector_kernel_matches_element_kernel(case):
    # the 8-lane register kernel (_pool_bag8) against the element-by-element one it replaces on this CPU
    # (and which CPUs without F16C run): every element bit for bit, a NaN where the other has a NaN
    from embnum.cpu import tbe

    D, B = case["D"], case["B"]
    T = case["woff"].shape[0]
    lut = tbe.half_table() if case["w"].dtype == np.uint16 else tbe._NO_LUT
    outs = []
    for kernel in (tbe._FORWARD_POOLED[D], _element_kernel(D)):
        # streamed (non-temporal stores: 32-byte ones, 16-byte ones or none as the output is aligned) or not
        buf = np.full(B * T * D + 16, -1.0, np.float32)
        first = (-buf.ctypes.data // 4) % 16 + case["shift"]
        out = buf[first : first + B * T * D].reshape(B, T * D)
        psw = case["psw"] if case["has_psw"] else tbe._NO_F32
        args = (case["woff"], case["doff"], np.arange(T, dtype=np.int64), case["indices"], case["offsets"], B)
        kernel(case["w"], lut, *args, case["mean"], psw, case["has_psw"], out, case["stream"])
        assert (buf[:first] == -1).all() and (buf[first + out.size :] == -1).all()
        outs.append(out)
    got, want = outs
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


_ELEMENT_KERNELS = {}


def _element_kernel(D):
    from embnum.cpu import tbe

    if D not in _ELEMENT_KERNELS:
        _ELEMENT_KERNELS[D] = tbe._make_forward_pooled(D, vector=False)
    return _ELEMENT_KERNELS[D]


def _feature_alone(args, t, first, n):
    """Feature ``t``'s samples ``first .. first+n-1`` of a VBE call as a one-feature fixed-batch call."""
    lay = tbe_layout
    woff, doff = args["weights_offsets"].astype(np.int64), args["D_offsets"].astype(np.int64)
    hcs = args["hash_size_cumsum"].astype(np.int64)
    rows = embnum._tbe_bounds.rows_per_feature(hcs)[t]
    D = int(doff[t + 1] - doff[t])
    weights = args["weights"][int(woff[t]) : int(woff[t]) + int(rows) * D]
    sizes = np.asarray(args["batch_size_per_feature_per_rank"], dtype=np.int64)
    b0 = int(sizes[:t].sum()) + first
    o = args["offsets"].astype(np.int64)[b0 : b0 + n + 1]
    pos = np.arange(int(o[0]), int(o[-1]))
    one = tbe_args(lay([int(rows)], [D]), weights, args["indices"][pos], o - o[0], pooling_mode=args["pooling_mode"])
    if "per_sample_weights" in args:
        one["per_sample_weights"] = args["per_sample_weights"][pos]
    return one


@given(args=vbe_batch(), backend=st.sampled_from(["ref", "cpu"]))
@settings(max_examples=60, deadline=None)
def test_vbe_output_is_each_rank_and_feature_looked_up_alone(args, backend):
    """The layout of the flat VBE output, from the fixed-batch op alone: rank-major, then
    feature, then sample; block (r, t) is feature t's rank-r samples looked up as one feature."""
    got = embnum.tbe_forward(**args, bounds_check_mode="ignore", backend=backend)
    sizes = np.asarray(args["batch_size_per_feature_per_rank"], dtype=np.int64)
    T, R = sizes.shape
    at = 0
    for r in range(R):
        for t in range(T):
            n = int(sizes[t, r])
            want = embnum.tbe_forward(
                **_feature_alone(args, t, int(sizes[t, :r].sum()), n), bounds_check_mode="ignore", backend="ref"
            )
            assert want.shape[0] == n
            np.testing.assert_allclose(got[at : at + want.size], want.ravel(), rtol=1e-6, atol=1e-6)
            at += want.size
    assert at == got.size


@given(args=vbe_batch(pooling="sum"))
@settings(max_examples=40, deadline=None)
def test_vbe_backward_is_the_sum_of_each_block_alone(args):
    """The dense VBE gradient equals the sum, over blocks (r, t), of the one-feature gradient
    of that block's slice of ``grad_output`` (placed at the table's place in ``weights``)."""
    fwd = embnum.tbe_forward(**args, bounds_check_mode="ignore", backend="ref")
    g = np.linspace(-1, 1, fwd.size).astype(np.float32)
    got = embnum.tbe_backward(g, **args, bounds_check_mode="ignore", backend="cpu")
    want = np.zeros(args["weights"].shape[0], np.float64)
    sizes = np.asarray(args["batch_size_per_feature_per_rank"], dtype=np.int64)
    T, R = sizes.shape
    woff = args["weights_offsets"].astype(np.int64)
    at = 0
    for r in range(R):
        for t in range(T):
            one = _feature_alone(args, t, int(sizes[t, :r].sum()), int(sizes[t, r]))
            D = int(one["D_offsets"][-1])
            block = g[at : at + int(sizes[t, r]) * D].reshape(-1, D)
            part = embnum.tbe_backward(block, **one, bounds_check_mode="ignore", backend="ref")
            want[int(woff[t]) : int(woff[t]) + part.size] += part
            at += block.size
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batch_zero_and_one_feature(fast_backend):
    lay = tbe_layout([4], [3])
    args = tbe_args(lay, np.ones(12, np.float32), np.zeros(0, np.int64), np.zeros(1, np.int64))
    out = check_matches_ref("tbe_forward", args, fast_backend)
    assert out.shape == (0, 3)
    sparse = check_matches_ref(
        "tbe_backward_sparse", dict(args, grad_output=np.zeros((0, 3), np.float32)), fast_backend
    )
    assert sparse.linear_ids.shape == (0,) and sparse.value_offsets.tolist() == [0]


def test_layout_example():
    assert LAY.weights_offsets.tolist() == [0, 6] and LAY.D_offsets.tolist() == [0, 2, 5]
    assert LAY.hash_size_cumsum.tolist() == [0, 3, 5] and LAY.num_weights == 12
    shared = tbe_layout([3, 2], [2, 3], [0, 0, 1])
    assert shared.weights_offsets.tolist() == [0, 0, 6] and shared.hash_size_cumsum.tolist() == [0, 0, 3, 5]
    with pytest.raises(ValueError, match="non-decreasing"):
        tbe_layout([3, 2], [2, 3], [1, 0])
    with pytest.raises(ValueError, match="does not use table 1"):
        tbe_layout([3, 2], [2, 3], [0, 0])
    with pytest.raises(ValueError, match="rows\\[1\\]"):
        tbe_layout([3, 0], [2, 3])


@pytest.fixture(params=["ref", "fast"])
def backend(request, fast_backend):
    return "ref" if request.param == "ref" else fast_backend.backend


# One table of 2 rows x 2, row 0 = [3, 4] (norm 5), row 1 = [1, 1] untouched; one bag
# looking up row 0 once, so the row's gradient is grad_output itself. Step 1 from zero state:
# beta1 = 0.9 and beta2 = 0.999 as float32 make m_hat = g and v_hat = g^2 (the bias
# corrections divide out 1 - beta exactly), so every number below is worked by hand.
ROW_LAY = tbe_layout([2], [2])


def _row_step(opt, grad, momentum1=None):
    w = np.array([3, 4, 1, 1], np.float32)
    state = {k: np.zeros(n, np.float32) for k, n in opt.state_sizes(4, 2).items()}
    if momentum1 is not None:
        state["momentum1"][:] = momentum1
    return w, state, dict(optimizer=opt, step=1 if opt.uses_step else None, **state)


@pytest.mark.parametrize(
    "opt,grad,momentum1,want,want_state",
    [
        # r = g / (|g| + eps) = [1, -1], |r| = sqrt(2); w -= lr * (|w| / |r|) * r = 0.1 * 5 / sqrt(2) * r
        (
            TBEOptimizer("lamb", 0.1),
            [5, -5],
            None,
            [2.6464466, 4.3535534],
            dict(momentum2=[0.02499968, 0.02499968, 0, 0]),
        ),
        # r = [1, -1] + 0.5 * [3, 4] = [2.5, 1], |r| = sqrt(7.25); w -= 0.1 * 5 / sqrt(7.25) * r
        (
            TBEOptimizer("lamb", 0.1, weight_decay=0.5, weight_decay_mode="decoupled"),
            [2, -2],
            None,
            [2.5357617, 3.8143047],
            dict(momentum1=[0.2, -0.2, 0, 0]),
        ),
        # v = (1 - beta2) * mean(g^2) = (1 - beta2) * 12.5 at row 0, v_hat = 12.5; w -= 0.1 * g / sqrt(12.5)
        (
            TBEOptimizer("partial_rowwise_adam", 0.1),
            [3, 4],
            None,
            [2.9151472, 3.8868629],
            dict(momentum2=[0.012499839, 0]),
        ),
        # r = g / sqrt(12.5), |r| = 5 / sqrt(12.5), ratio |w| / |r| = sqrt(12.5): w -= 0.1 * g
        (
            TBEOptimizer("partial_row_wise_lamb", 0.1),
            [3, 4],
            None,
            [2.7, 3.6],
            dict(momentum1=[0.3, 0.4, 0, 0], momentum2=[0.012499839, 0]),
        ),
        # adjusted lr = 0.1 * 0.5 * |w| / |g| = 0.25 (|g| = 1); m = 0.9 * [1, -1] + 0.25 * g = [1.05, -0.7]
        (
            TBEOptimizer("lars_sgd", 0.1, eta=0.5, momentum=0.9),
            [0.6, 0.8],
            [1, -1, 7, 7],
            [1.95, 4.7],
            dict(momentum1=[1.05, -0.7, 7, 7]),
        ),
        # with L2 decay 0.1: adjusted lr = 0.25 / (1 + 0.1 * 5) = 1/6, m = (g + 0.1 * w) / 6 = [0.15, 0.2]
        (
            TBEOptimizer("lars_sgd", 0.1, eta=0.5, momentum=0.9, weight_decay=0.1, weight_decay_mode="l2"),
            [0.6, 0.8],
            None,
            [2.85, 3.8],
            dict(momentum1=[0.15, 0.2, 0, 0]),
        ),
        # a gradient of float32 subnormals, 2**-149 * [24, 32] (|g| = 40 * 2**-149): the rate 0.25 / |g|
        # is past float32's range; each element divided by |g| first gives the step of |g| = 1
        (
            TBEOptimizer("lars_sgd", 0.1, eta=0.5),
            [24 * 2.0**-149, 32 * 2.0**-149],
            None,
            [2.85, 3.8],
            dict(momentum1=[0.15, 0.2, 0, 0]),
        ),
        # sgd to [3.3, 4.4] (norm 5.5), then max_norm 5 scales it by 5 / 5.5 back to [3, 4]
        (TBEOptimizer("sgd", 0.1, max_norm=5.0), [-3, -4], None, [3, 4], {}),
        # rowwise adagrad: m = 12.5, w -= 0.1 / sqrt(12.5) * g = [2.915147, 3.886863] (norm 4.858579) <= 4.9: kept
        (TBEOptimizer("rowwise_adagrad", 0.1, max_norm=4.9), [3, 4], None, [2.9151472, 3.8868629], {}),
        # ... and with max_norm 2 scaled to norm 2: [1.2, 1.6]
        (TBEOptimizer("rowwise_adagrad", 0.1, max_norm=2.0), [3, 4], None, [1.2, 1.6], dict(momentum1=[12.5, 0])),
        # sgd to [3e20, 4e20]: its float32 sum of squares overflows, its norm 5e20 does not; scaled to [3, 4]
        (TBEOptimizer("sgd", 1e20, max_norm=5.0), [-3, -4], None, [3, 4], {}),
        # LAMB with eps 3e38: its direction ~1e-38 has a float32 sum of squares of 0, not its norm;
        # the trust ratio rescales it to the step of an ordinary eps (the example above: [2.7, 3.6])
        (TBEOptimizer("lamb", 0.1, eps=3e38), [3, 4], None, [2.7, 3.6], {}),
    ],
)
def test_new_optimizer_examples(opt, grad, momentum1, want, want_state, backend):
    w, state, kw = _row_step(opt, grad, momentum1)
    g = np.array([grad], np.float32)
    embnum.tbe_backward_update(g, w, *ROW_LAY.arrays(), np.array([0]), np.array([0, 1]), backend=backend, **kw)
    np.testing.assert_allclose(w, want + [1, 1], rtol=1e-6)
    for k, v in want_state.items():
        np.testing.assert_allclose(state[k], v, rtol=1e-5, atol=1e-7)


def test_lamb_zero_direction_leaves_the_row(backend):
    """A touched row whose LAMB direction is 0 (zero gradient, no decay) stays put: fbgemm's
    trust ratio would be ``|w| / 0`` times 0 (NaN); embnum uses a ratio of 0 there."""
    for kind in ("lamb", "partial_rowwise_lamb", "lars_sgd"):
        opt = TBEOptimizer(kind, 0.1)
        w, state, kw = _row_step(opt, [0, 0])
        embnum.tbe_backward_update(
            np.zeros((1, 2), np.float32), w, *ROW_LAY.arrays(), np.array([0]), np.array([0, 1]), backend=backend, **kw
        )
        np.testing.assert_array_equal(w, [3, 4, 1, 1])


@pytest.mark.parametrize("kind", ["lamb", "partial_rowwise_lamb"])
def test_lamb_trust_ratio_past_float32(kind, backend):
    """A row of norm 50000 and a gradient of float32 subnormals, 2**-149 * [240, 320] (whose first
    moment, 0.1 * g, is still exact): the direction is g / eps (|r| ~ 6e-35), so |w| / |r| is past
    float32's range; each element divided by |r| first moves the row by lr * |w| * r / |r| =
    0.1 * 50000 * [0.6, 0.8] (the float64 oracle's step)."""
    opt = TBEOptimizer(kind, 0.1)
    w = np.array([30000, 40000, 1, 1], np.float32)
    state = {k: np.zeros(n, np.float32) for k, n in opt.state_sizes(4, 2).items()}
    g = np.array([[240 * 2.0**-149, 320 * 2.0**-149]], np.float32)
    embnum.tbe_backward_update(
        g, w, *ROW_LAY.arrays(), np.array([0]), np.array([0, 1]), optimizer=opt, step=1, backend=backend, **state
    )
    np.testing.assert_allclose(w, [27000, 36000, 1, 1], rtol=1e-6)


def test_adam_example(backend):
    w, m1, m2 = W12.copy(), np.zeros(12, np.float32), np.zeros(12, np.float32)
    embnum.tbe_backward_update(
        GRAD,
        w,
        *LAY.arrays(),
        IND,
        OFF,
        optimizer=TBEOptimizer("adam", 0.1),
        momentum1=m1,
        momentum2=m2,
        step=1,
        backend=backend,
    )
    np.testing.assert_allclose(w, [-0.1, 0.9, 2, 3, 3.9, 4.9, 5.9, 6.9, 7.9, 8.9, 9.9, 11.1], rtol=1e-6)
    opt = TBEOptimizer("adam", 0.1, weight_decay=0.01, weight_decay_mode="decoupled")
    g2 = np.array([[-1, 1, 2, 2, 2], [0, 0, 1, -1, 0]], np.float32)
    embnum.tbe_backward_update(
        g2,
        w,
        *LAY.arrays(),
        np.array([1, 0, 1]),
        np.array([0, 1, 2, 2, 3]),
        optimizer=opt,
        momentum1=m1,
        momentum2=m2,
        step=2,
        backend=backend,
    )
    np.testing.assert_allclose(
        w, [-0.1669056, 0.8320944, 2.072413, 2.922587, 3.9, 4.9, 5.9, 6.9, 7.9, 8.794065, 9.92671, 11.15591], rtol=1e-5
    )
    np.testing.assert_allclose(m1, [0.09, 0.18, -0.1, 0.1, 0.2, 0.4, 0.1, 0.1, 0.1, 0.235, -0.055, -0.045], rtol=1e-5)
    np.testing.assert_allclose(m2[[0, 2, 9, 11]], [0.0009989871, 0.0009999871, 0.003247708, 0.0002497468], rtol=1e-5)


# -- bounds checks (spec 4) ------------------------------------------------------
BLAY = tbe_layout([3, 2], [4, 4])
BW = np.arange(20, dtype=np.float32)
BAD_IDS = np.array([2, 7, 1, 0])
BOFF = np.array([0, 2, 3, 3, 4])
REPAIRED = [[8, 10, 12, 14, 0, 0, 0, 0], [4, 5, 6, 7, 12, 13, 14, 15]]


def _bargs(indices=BAD_IDS, offsets=BOFF, **kw):
    return tbe_args(BLAY, BW, indices, offsets, **kw)


@pytest.mark.parametrize("mode", ["fatal", "none", 0, 3])
def test_fatal_names_feature_bag_and_id(mode, fast_backend):
    check_rejects(
        "tbe_forward",
        _bargs(bounds_check_mode=mode),
        IndexError,
        ("indices[1] = 7", "feature 0", "sample 0", "3 rows"),
        fast_backend,
    )
    g = np.ones((2, 8), np.float32)
    for name in ("tbe_backward", "tbe_backward_sparse", "tbe_grad_per_sample_weights"):
        check_rejects(
            name, _bargs(grad_output=g, bounds_check_mode=mode), IndexError, ("indices[1] = 7",), fast_backend
        )
    m = np.zeros(5, np.float32)
    check_rejects(
        "tbe_backward_update",
        _bargs(grad_output=g, bounds_check_mode=mode, optimizer=TBEOptimizer("rowwise_adagrad", 0.1), momentum1=m),
        IndexError,
        ("indices[1] = 7",),
        fast_backend,
    )
    check_rejects(
        "tbe_forward",
        _bargs(indices=np.array([2, 0, 1, 0]), offsets=np.array([0, 2, 3, 3, 9]), bounds_check_mode=mode),
        ValueError,
        ("offsets[-1]", "9"),
        fast_backend,
    )
    check_rejects(
        "tbe_forward",
        _bargs(indices=np.array([2, 0, 1, 0]), offsets=np.array([0, 3, 2, 3, 4]), bounds_check_mode=mode),
        ValueError,
        ("offsets[2] = 2",),
        fast_backend,
    )


@pytest.mark.parametrize("mode", ["fatal", "warning", "ignore", "none"])
def test_minus_one_is_rejected_in_every_mode(mode, fast_backend):
    check_rejects(
        "tbe_forward",
        _bargs(indices=np.array([2, -1, 1, 0]), bounds_check_mode=mode),
        IndexError,
        ("indices[1] = -1", "pruned"),
        fast_backend,
    )


@pytest.mark.parametrize("mode", ["warning", "ignore", 1, 2])
def test_repair_modes(mode, backend):
    args = _bargs(bounds_check_mode=mode)
    before = BAD_IDS.copy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = embnum.tbe_forward(**args, backend=backend)
        out2 = embnum.tbe_forward(
            **_bargs(indices=np.array([2, 0, 1, 0]), offsets=np.array([0, 2, 3, 3, 9]), bounds_check_mode=mode),
            backend=backend,
        )
    np.testing.assert_array_equal(out, REPAIRED)
    np.testing.assert_array_equal(out2, REPAIRED)
    np.testing.assert_array_equal(BAD_IDS, before)  # never mutates the caller's indices
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == (2 if mode in ("warning", 1) else 0)


def test_offsets_repair_is_fbgemms_sequential_rule():
    from embnum._tbe_bounds import check_offsets

    rng = np.random.default_rng(0)
    for _ in range(200):
        o = rng.integers(-3, 12, size=rng.integers(1, 8))
        N = int(rng.integers(0, 10))
        want = o.copy()
        want[-1] = N
        for k in range(len(o) - 1):
            s = min(max(want[k], 0), N)
            e = min(max(want[k + 1], s), N)
            want[k], want[k + 1] = s, e
        if len(o) == 1:
            want[0] = N
        got, _ = check_offsets(o, N, "ignore")
        assert got.tolist() == want.tolist()


def test_update_rejects_shared_state_and_read_only():
    buf = np.zeros(24, np.float32)
    with pytest.raises(ValueError, match="momentum1 shares memory with momentum2"):
        embnum.tbe_backward_update(**_uargs(TBEOptimizer("adam", 0.1), momentum1=buf[:12], momentum2=buf[6:18], step=1))
    w = W12.copy()
    with pytest.raises(ValueError, match="weights shares memory with momentum1"):
        embnum.tbe_backward_update(**_uargs(TBEOptimizer("adagrad", 0.1), weights=w, momentum1=w))
    g = np.zeros(24, np.float32)  # grad_output viewing weights or the state: the caller's gradient would change
    with pytest.raises(ValueError, match="grad_output shares memory with weights"):
        embnum.tbe_backward_update(
            **_uargs(TBEOptimizer("sgd", 0.1), weights=g[:12], grad_output=g[2:12].reshape(2, 5))
        )
    ro = W12.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="weights is read-only"):
        embnum.tbe_backward_update(**_uargs(TBEOptimizer("sgd", 0.1), weights=ro))


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(kind="ensemble_rowwise_adagrad"), "kind"),
        (dict(kind="lamb", weight_decay=0.1, weight_decay_mode="l2"), "decoupled"),
        (dict(kind="partial_rowwise_adam", weight_decay=0.1), "decoupled"),
        (dict(kind="lars_sgd", weight_decay=0.1, weight_decay_mode="decoupled"), "'l2'"),
        (dict(kind="lars_sgd", eta=-1.0), "eta"),
        (dict(kind="lars_sgd", momentum=float("inf")), "momentum"),
        (dict(kind="sgd", max_norm=0.0), "max_norm"),
        (dict(kind="sgd", weight_decay=0.1, weight_decay_mode="l2"), "no weight decay"),
        (dict(kind="rowwise_adagrad", weight_decay=0.1), "needs weight_decay_mode"),
        (dict(kind="adam", weight_decay=0.1, weight_decay_mode="l2"), "decoupled"),
        (dict(kind="adam", beta1=1.0), "beta1"),
        (dict(kind="sgd", learning_rate=float("nan")), "learning_rate"),
        (dict(kind="sgd", eps=-1.0), "eps"),
        (dict(kind="sgd", max_gradient=0.0), "max_gradient"),
        (dict(kind="rowwise_adagrad", weight_decay_mode="counter"), "weight_decay_mode"),
    ],
)
def test_optimizer_validation(kw, words):
    kw.setdefault("learning_rate", 0.1)
    with pytest.raises(ValueError, match=words):
        TBEOptimizer(**kw)
    opt = TBEOptimizer("exact_row_wise_adagrad", 0.1, weight_decay=0.1, weight_decay_mode="L2")
    assert opt.kind == "rowwise_adagrad" and opt.weight_decay_mode == "l2"
    assert TBEOptimizer.decode(opt.encode()) == opt
    lars = TBEOptimizer("LARS_SGD", 0.1, eta=0.2, momentum=0.5, max_norm=3.0)
    assert TBEOptimizer.decode(lars.encode()) == lars and lars.state_layout == {"momentum1": "element"}
    assert TBEOptimizer("partial_row_wise_lamb", 0.1).state_sizes(12, 5) == {"momentum1": 12, "momentum2": 5}


@pytest.mark.parametrize(
    "kw,exc,words",
    [
        (dict(kind="sgd", learning_rate=1e39), ValueError, "learning_rate"),
        (dict(kind="sgd", learning_rate=-1e39), ValueError, "learning_rate"),
        (dict(kind="lars_sgd", momentum=1e39), ValueError, "momentum"),
        (dict(kind="lars_sgd", eta=3.5e38), ValueError, "eta"),
        (dict(kind="rowwise_adagrad", weight_decay=3.5e38, weight_decay_mode="l2"), ValueError, "weight_decay"),
        (dict(kind="adam", beta1=0.99999999999), ValueError, "beta1"),
        (dict(kind="adam", beta2=0.99999999999), ValueError, "beta2"),
        (dict(kind="sgd", eps=10**400), ValueError, "eps"),
        (dict(kind="sgd", eps=3.5e38), ValueError, "eps"),
        (dict(kind="sgd", max_norm=1e-50), ValueError, "max_norm"),
        (dict(kind="sgd", max_gradient=1e-50), ValueError, "max_gradient"),
        (dict(kind="sgd", max_gradient=10**400), ValueError, "max_gradient"),
        (dict(kind=["sgd"]), TypeError, "kind"),
        (dict(kind=3), TypeError, "kind"),
        (dict(kind="rowwise_adagrad", weight_decay_mode=["l2"]), TypeError, "weight_decay_mode"),
    ],
)
def test_optimizer_checked_as_the_kernels_read_it(kw, exc, words):
    """A description valid in float64 but not once rounded to the kernels' float32 (an inf, a
    beta of 1, a positive max_norm of 0) is an error at construction naming the parameter."""
    kw.setdefault("learning_rate", 0.1)
    with pytest.raises(exc, match=words):
        TBEOptimizer(**kw)


def test_optimizer_numpy_scalars_survive_the_torch_schema():
    """NumPy scalars are stored as Python floats: the encoding the torch ops carry decodes."""
    opt = TBEOptimizer("adam", np.float32(0.5), beta1=np.float64(0.8), max_norm=np.float16(2), max_gradient=np.int64(3))
    assert TBEOptimizer.decode(opt.encode()) == opt
    assert all(type(getattr(opt, k)) is float for k in ("learning_rate", "beta1", "max_norm", "max_gradient"))


def test_optimizer_edges_that_survive_float32():
    """Just inside float32: accepted, and what the kernels read is what was checked."""
    top = float(np.finfo(np.float32).max)
    opt = TBEOptimizer("lars_sgd", top, eta=top, momentum=top, max_norm=1e-45, weight_decay=top, weight_decay_mode="l2")
    hp = opt.float32()
    assert all(np.isfinite(v) for v in hp.values() if v is not None) and hp["max_norm"] > 0
    beta = float(np.nextafter(np.float32(1), np.float32(0)))
    adam = TBEOptimizer("adam", 0.1, beta1=beta, beta2=beta, eps=1e-50)
    assert adam.float32()["beta2"] < 1 and adam.float32()["eps"] == 0
    assert np.all(np.isfinite(adam.kernel_parameters(2**62)))


# -- each row updated once; a toy training loop ----------------------------------
def test_each_row_updated_once_however_often_looked_up(backend):
    """SGD on a row looked up k times moves by lr * (sum of its k gradients) exactly once."""
    lay = tbe_layout([2], [1])
    w = np.zeros(2, np.float32)
    offsets = np.array([0, 5, 7])
    indices = np.array([1, 1, 1, 1, 1, 1, 0])
    g = np.array([[1.0], [2.0]], np.float32)
    embnum.tbe_backward_update(
        g,
        w,
        *lay.arrays(),
        indices,
        offsets,
        optimizer=TBEOptimizer("rowwise_adagrad", 1.0, eps=0.0),
        momentum1=np.zeros(2, np.float32),
        backend=backend,
    )
    # row 1: g = 5 + 2 = 7, m = 49, step = 1 * 7 / 7 = 1; row 0: g = 2, step 1
    np.testing.assert_allclose(w, [-1, -1])


@pytest.mark.parametrize(
    "E, ids", [(0, []), (5, []), (5, [4, 4, 4]), (4, [3, 0, 2, 1, 1]), (1, [0]), (6, [5, 0, 5, 0])]
)
def test_cpu_touched_rows_branch_free_edges(E, ids):
    """The cpu backward's touched-row list (written branch-free, one slot past the last
    touched row) on edges: no lookups, an empty table, only the last row, every row."""
    from embnum.cpu.tbe import _sort_rows, _touched_rows

    idx = np.array(ids, dtype=np.int64)
    order, ends = _sort_rows(idx, 0, idx.shape[0], E)
    touched, run_end, n = _touched_rows(ends, E, idx.shape[0])
    rows, counts = np.unique(idx, return_counts=True)
    assert n == rows.shape[0]
    np.testing.assert_array_equal(touched[:n], rows)
    np.testing.assert_array_equal(run_end[:n], np.cumsum(counts))
    np.testing.assert_array_equal(idx[order], np.sort(idx, kind="stable"))


def _toy_loss_curve(backend, opt, steps=50):
    rng = np.random.default_rng(7)
    lay = tbe_layout([40, 30, 20], [8, 4, 8], [0, 1, 1, 2])
    w = (rng.standard_normal(lay.num_weights) * 0.1).astype(np.float32)
    state = state_for(opt, w, lay.hash_size_cumsum)
    for k in ("momentum1", "momentum2"):
        if state[k] is not None:
            state[k][:] = 0
    target = rng.standard_normal(24).astype(np.float32)
    losses = []
    for step in range(1, steps + 1):
        B = 16
        lengths = rng.integers(0, 6, 4 * B)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        E = [40, 30, 30, 20]
        indices = np.concatenate([rng.integers(0, E[t], lengths[t * B : (t + 1) * B].sum()) for t in range(4)]).astype(
            np.int32
        )
        pooled = embnum.tbe_forward(w, *lay.arrays(), indices, offsets, "mean", backend=backend)
        diff = pooled - target
        losses.append(float((diff**2).mean()))
        grad = (2 * diff / B).astype(np.float32)
        embnum.tbe_backward_update(
            grad,
            w,
            *lay.arrays(),
            indices,
            offsets,
            "mean",
            optimizer=opt,
            momentum1=state["momentum1"],
            momentum2=state["momentum2"],
            step=step if opt.uses_step else None,
            backend=backend,
        )
    return np.array(losses)


@pytest.mark.parametrize("opt", [OPTIMIZERS[0], OPTIMIZERS[1], OPTIMIZERS[4], OPTIMIZERS[5]], ids=lambda o: o.kind)
def test_training_loop_same_loss_curve_ref_and_cpu(opt):
    opt = TBEOptimizer(**{**opt.__dict__, "learning_rate": opt.learning_rate * 5})
    ref = _toy_loss_curve("ref", opt)
    cpu = _toy_loss_curve("cpu", opt)
    assert ref[-1] < 0.8 * ref[0], "the toy model should learn"
    np.testing.assert_allclose(cpu, ref, rtol=1e-4)


@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_device_bounds_fast_path_accepts_exactly_what_the_checks_accept(data):
    """``_tbe_bounds.all_valid`` (the one-read check CuPy lookups take first) says True exactly
    when check_offsets and check_indices accept the lookups unchanged (run here on NumPy)."""
    from embnum._tbe_bounds import all_valid, check_indices, check_offsets

    T, B, rows, N, offsets, indices = _drawn_lookups(data)
    pruned_ok = data.draw(st.booleans())
    try:
        fixed_offsets, repaired_offsets = check_offsets(offsets, N, "ignore")
        _, repaired_indices = check_indices(indices, fixed_offsets, B, rows, "ignore", pruned_ok=pruned_ok)
        accepted = not repaired_offsets and not repaired_indices
    except IndexError:  # -1 in a training op
        accepted = False
    assert all_valid(indices, offsets, B, rows, pruned_ok=pruned_ok) == accepted


def _drawn_lookups(data):
    """T features, batch B, rows per feature, N ids, offsets [T*B+1] and indices [N] (int32 or
    int64), out of bounds and -1 included."""
    T = data.draw(st.integers(1, 3))
    B = data.draw(st.integers(0, 3))
    rows = np.array(data.draw(st.lists(st.integers(1, 4), min_size=T, max_size=T)), np.int64)
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    N = data.draw(st.integers(0, 8))
    offsets = np.array(data.draw(st.lists(st.integers(-1, 9), min_size=T * B + 1, max_size=T * B + 1)), dtype)
    if data.draw(st.booleans()):  # mostly valid offsets, so the index rule is exercised too
        offsets = np.sort(np.clip(offsets, 0, N))
        offsets[-1] = N
    indices = np.array(data.draw(st.lists(st.integers(-2, 5), min_size=N, max_size=N)), dtype)
    return T, B, rows, N, offsets, indices


@given(data=st.data())
@settings(max_examples=100, deadline=None)
def test_device_repair_equals_the_checks_repair(data):
    """``_tbe_bounds.repair_on_device`` (bounds modes "warning"/"ignore" on CuPy lookups, no host read)
    gives the repair of check_offsets + check_indices and counts what it changed; a ``-1`` in a
    training op (``pruned_ok=False``) is repaired to 0 instead of raising. Run on NumPy, with NumPy's
    running maximum and with the cuda one (simulated)."""
    from embnum._tbe_bounds import check_indices, check_offsets, repair_on_device
    from embnum.cuda._common import running_max

    T, B, rows, N, offsets, indices = _drawn_lookups(data)
    pruned_ok = data.draw(st.booleans())
    before = indices.copy(), offsets.copy()
    want_o, _ = check_offsets(offsets, N, "ignore")
    want_i, _ = check_indices(indices, want_o, B, rows, "ignore", pruned_ok=True)
    if not pruned_ok and B > 0:
        pos = np.arange(N)
        want_i = np.where((pos >= want_o[0]) & (pos < want_o[-1]) & (indices == -1), 0, want_i)
    n_want = int((want_o != offsets).sum() + (want_i != indices).sum())
    for rmax in (None, running_max):
        got_i, got_o, n = repair_on_device(indices, offsets, B, rows, pruned_ok=pruned_ok, running_max=rmax)
        np.testing.assert_array_equal(got_o, want_o)
        np.testing.assert_array_equal(got_i, want_i)
        assert got_i.dtype == indices.dtype and got_o.dtype == offsets.dtype
        assert int(n) == n_want
    np.testing.assert_array_equal(indices, before[0])  # inputs never mutated
    np.testing.assert_array_equal(offsets, before[1])


def _as_device_lookups(mp):
    """Make the declarations treat the (NumPy, simulated-cuda) lookups as device lookups: the
    no-read bounds paths run, and the "warning" count goes to the returned host counter."""
    import embnum._tbe_bounds as tb

    count = np.zeros(1, np.int64)
    mp.setattr(tb, "is_cupy", lambda a: True)
    mp.setattr(tb, "device_warning_count", lambda: count)
    return count


@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_device_bounds_modes_on_the_cuda_backend(data):
    """On device lookups: "warning" and "ignore" give the reference's repaired result with no
    RuntimeWarning ("warning" counts the repairs on the device); "none" checks nothing and the
    kernels still read nothing out of bounds (the simulator raises on such a read); on valid
    lookups all three equal the reference."""
    T, B, rows, N, offsets, indices = _drawn_lookups(data)
    dim = data.draw(st.sampled_from([1, 3]))
    lay = tbe_layout(rows.tolist(), [dim] * T)
    weights = np.arange(lay.num_weights, dtype=np.float32) / 8
    base = dict(weights=weights, **dict(zip(("weights_offsets", "D_offsets", "hash_size_cumsum"), lay.arrays())))
    args = dict(base, indices=indices, offsets=offsets)
    mode = data.draw(st.sampled_from(["warning", "ignore", "none"]))
    pooling = data.draw(st.sampled_from(["sum", "mean", "none"]))
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        count = _as_device_lookups(mp)
        warnings.simplefilter("error", RuntimeWarning)
        got = embnum.tbe_forward(**args, pooling_mode=pooling, bounds_check_mode=mode, backend="cuda")
        g = np.ones(got.shape, np.float32)
        grad = embnum.tbe_backward(g, **args, pooling_mode=pooling, bounds_check_mode=mode, backend="cuda")
    # "none": unspecified values on bad lookups, but no out-of-bounds access (the simulator raises on one)
    assert got.shape[0] == (N if pooling == "none" else B) and grad.shape == weights.shape
    if mode == "none":
        assume(bool(embnum._tbe_bounds.all_valid(indices, offsets, B, rows)))
    fixed_i, fixed_o, n = embnum._tbe_bounds.repair_on_device(indices, offsets, B, rows)
    fixed = dict(base, indices=fixed_i, offsets=fixed_o)
    want = embnum.tbe_forward(**fixed, pooling_mode=pooling, backend="ref")
    want_grad = embnum.tbe_backward(g, **fixed, pooling_mode=pooling, backend="ref")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-6)
    assert int(count[0]) == (2 * int(n) if mode == "warning" else 0)  # two calls counted


def test_backward_sparse_with_max_rows_reads_nothing_back(monkeypatch):
    """With ``max_rows`` the cuda backend never copies device data to the host (its one read
    without it is the output size); the padded and the cut result, by hand."""
    import embnum.cuda.tbe as ctbe

    def no_read(a):
        raise AssertionError("tbe_backward_sparse read device data back")

    monkeypatch.setattr(ctbe, "to_host", no_read)
    lay = tbe_layout(rows=[3, 2], dims=[2, 3])
    w = np.zeros(lay.num_weights, np.float32)
    indices, offsets = np.array([0, 2, 1, 1]), np.array([0, 2, 2, 3, 4])
    g = np.ones((2, 5), np.float32)
    for backend in ("ref", "cpu", "cuda"):
        got = embnum.tbe_backward_sparse(g, w, *lay.arrays(), indices, offsets, max_rows=4, backend=backend)
        np.testing.assert_array_equal(got.linear_ids, [0, 2, 4, -1])
        np.testing.assert_array_equal(got.value_offsets, [0, 2, 4, 7, 7])
        np.testing.assert_array_equal(got.values, [1, 1, 1, 1, 2, 2, 2] + [0] * 5)
        cut = embnum.tbe_backward_sparse(g, w, *lay.arrays(), indices, offsets, max_rows=2, backend=backend)
        np.testing.assert_array_equal(cut.linear_ids, [0, 2])
        np.testing.assert_array_equal(cut.value_offsets, [0, 2, 4])
        np.testing.assert_array_equal(cut.values, [1, 1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="max_rows"):
        embnum.tbe_backward_sparse(g, w, *lay.arrays(), indices, offsets, max_rows=-1)


_ROW_RULE = [
    o
    for o in OPTIMIZERS
    if o.max_norm is not None or o.kind in ("lamb", "partial_rowwise_adam", "partial_row_wise_lamb", "lars_sgd")
]


@pytest.mark.parametrize("opt", _ROW_RULE, ids=lambda o: f"{o.kind}{'-max_norm' if o.max_norm else ''}")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_rule_kinds_on_cuda_match_the_oracle(opt, dtype, monkeypatch):
    """The lane-group kernel of the row-rule kinds (cuda) against the oracle, float32 and float16
    weights, rows wider than a lane group (D=70) and repeated ids; no read back to the host."""
    import embnum.cuda.tbe as ctbe

    def no_read(a):
        raise AssertionError("the cuda update read device data back")

    monkeypatch.setattr(ctbe, "to_host", no_read)
    lay = tbe_layout(rows=[5, 3], dims=[70, 3])
    rng = np.random.default_rng(1)
    w0 = (rng.integers(-16, 17, lay.num_weights) / 8).astype(dtype)
    indices, offsets = np.array([0, 4, 4, 1, 2, 2, 0, 1]), np.array([0, 3, 4, 6, 8])
    g = (rng.integers(-8, 9, (2, 73)) / 4).astype(np.float32)
    results = {}
    for backend in ("ref", "cuda"):
        w = w0.copy()
        st_ = state_for(opt, w, lay.hash_size_cumsum)
        embnum.tbe_backward_update(g, w, *lay.arrays(), indices, offsets, optimizer=opt, **st_, backend=backend)
        results[backend] = (w.astype(np.float32), st_["momentum1"], st_["momentum2"])
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=2e-5, atol=1e-6)
    for got, want in zip(results["cuda"], results["ref"]):
        if want is not None:
            np.testing.assert_allclose(got, want, **tol)


@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_cuda_forward_vector_and_element_paths_agree_bit_for_bit(data):
    """The cuda pooled forward reads the tables with one 4-element vector load per row and lane when the
    weights' pointer and every table's offset and dim allow it (dims 4, 8, 36), one element per load
    otherwise (a dim of 6 or 3, or weights one element past a 16-byte boundary). Both sum each
    column in lookup order in float32: the same bits from an aligned and a misaligned copy of the
    same weights, and within the oracle's tolerance, float32 and float16, with and without
    per-sample weights."""
    from embnum.cuda import tbe as cuda_tbe

    dims = data.draw(st.lists(st.sampled_from([4, 8, 36, 6, 3]), min_size=1, max_size=3))
    rows = data.draw(st.lists(st.integers(1, 6), min_size=len(dims), max_size=len(dims)))
    B = data.draw(st.integers(1, 4))
    lay = tbe_layout(rows, dims)
    T = len(dims)
    lengths = data.draw(st.lists(st.integers(0, 5), min_size=T * B, max_size=T * B))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = [data.draw(st.integers(0, rows[k // B] - 1)) for k in range(T * B) for _ in range(lengths[k])]
    indices = np.array(ids, dtype=np.int64)
    dtype = data.draw(st.sampled_from([np.float32, np.float16]))
    vals = np.random.default_rng(data.draw(st.integers(0, 99))).standard_normal(lay.num_weights).astype(dtype)
    pooling = data.draw(st.sampled_from(["sum", "mean"]))
    psw = None
    if pooling == "sum" and data.draw(st.booleans()):
        psw = np.linspace(-2, 2, indices.shape[0]).astype(np.float32)
    got = []
    for shift in (0, 1):
        buf = np.zeros(lay.num_weights + 8, dtype)
        first = (-buf.ctypes.data // buf.itemsize) % 8 + shift  # 16-byte aligned, or one element past it
        weights = buf[first : first + lay.num_weights]
        weights[:] = vals
        assert cuda_tbe._aligned4(weights) == (shift == 0)
        args = tbe_args(lay, weights, indices, offsets, pooling_mode=pooling, per_sample_weights=psw)
        got.append(embnum.tbe_forward(**args, backend="cuda"))
    np.testing.assert_array_equal(got[0].view(np.uint32), got[1].view(np.uint32))
    args = tbe_args(lay, vals, indices, offsets, pooling_mode=pooling, per_sample_weights=psw)
    err, ok = embnum.tbe_forward.check_fn(got[0], embnum.tbe_forward(**args, backend="ref"), args)
    assert ok, err


@given(dims=st.lists(st.integers(1, 600), min_size=1, max_size=4))
def test_cuda_forward_sub_groups_are_the_fewest_lanes_covering_the_widest_dim(dims):
    """The pooled forward gives each bag ``G`` lanes, a power of two up to a lane group: the fewest
    whose 4 columns each cover the widest dim, in as many ``4 G``-column chunks as that dim needs."""
    from embnum.cuda import _common
    from embnum.cuda import tbe as cuda_tbe

    log_g, chunks = cuda_tbe._sub_groups(np.concatenate([[0], np.cumsum(dims)]))
    G, widest = 1 << log_g, max(dims)
    assert G <= _common.LANES and (G == _common.LANES or 4 * G >= widest)
    assert G == 1 or 2 * G < widest  # half as many lanes (4 columns each) would not cover it
    assert (chunks - 1) * 4 * G < widest <= chunks * 4 * G


@given(data=st.data())
@settings(max_examples=15, deadline=None)
def test_cuda_backward_vector_and_element_gradient_reads_agree_bit_for_bit(data):
    """The cuda backward kernels read each lookup's gradient slice with one 4-element vector load
    when the gradient's pointer, its row length and every dim allow it (dims 4, 8, 36), four scalar
    loads otherwise (a dim of 6 or 3, or the gradient one element past a 16-byte boundary); the
    lane's columns are the same either way. Dense and sparse gradients and the fused update: the
    same bits from an aligned and a misaligned copy of the same gradient, within the oracle's
    tolerance; the vector loads ran exactly when allowed."""
    from embnum.cuda import tbe as cuda_tbe

    dims = data.draw(st.lists(st.sampled_from([4, 8, 36, 6, 3]), min_size=1, max_size=3))
    rows = data.draw(st.lists(st.integers(1, 6), min_size=len(dims), max_size=len(dims)))
    B = data.draw(st.integers(1, 3))
    lay = tbe_layout(rows, dims)
    T = len(dims)
    lengths = data.draw(st.lists(st.integers(0, 4), min_size=T * B, max_size=T * B))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = np.array(
        [data.draw(st.integers(0, rows[k // B] - 1)) for k in range(T * B) for _ in range(lengths[k])], dtype=np.int64
    )
    pooling = data.draw(st.sampled_from(["sum", "mean", "none"]))
    assume(pooling != "none" or len(set(dims)) == 1)
    psw = (
        np.linspace(-2, 2, indices.shape[0]).astype(np.float32)
        if pooling == "sum" and data.draw(st.booleans())
        else None
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    shape = (indices.shape[0], dims[0]) if pooling == "none" else (B, sum(dims))
    gvals = (rng.integers(-8, 9, shape) / 4).astype(data.draw(st.sampled_from([np.float32, np.float16])))
    w0 = (rng.integers(-8, 9, lay.num_weights) / 4).astype(np.float32)
    opt = data.draw(st.sampled_from([o for o in OPTIMIZERS if o.kind in ("sgd", "adagrad", "rowwise_adagrad", "adam")]))
    assume(opt.max_norm is None and opt.max_gradient is None)  # a clipped gradient is a fresh (aligned) copy
    vector_loads = []
    real_load4 = cuda_tbe.load4

    def counting_load4(a, i):
        vector_loads.append(i)
        return real_load4(a, i)

    got = []
    for shift in (0, 1):
        buf = np.zeros(gvals.size + 8, gvals.dtype)
        first = (-buf.ctypes.data // buf.itemsize) % 8 + shift  # 16-byte aligned, or one element past it
        g = buf[first : first + gvals.size].reshape(shape)
        g[...] = gvals
        vector_loads.clear()
        args = tbe_args(lay, w0, indices, offsets, pooling_mode=pooling, per_sample_weights=psw)
        w = w0.copy()
        state = state_for(opt, w, lay.hash_size_cumsum)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cuda_tbe, "load4", counting_load4)
            dense = embnum.tbe_backward(g, **args, backend="cuda")
            sparse = embnum.tbe_backward_sparse(g, **args, backend="cuda")
            embnum.tbe_backward_update(g, **dict(args, weights=w), optimizer=opt, **state, backend="cuda")
        vectors = shift == 0 and all(d % 4 == 0 for d in dims) and g.shape[1] % 4 == 0
        assert bool(vector_loads) == (vectors and indices.shape[0] > 0)
        got.append([dense, sparse.values, w, *(x for x in state.values() if isinstance(x, np.ndarray))])
    for a, b in zip(*got):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    want = embnum.tbe_backward(gvals, **args, backend="ref")
    err, ok = embnum.tbe_backward.check_fn(got[0][0], want, dict(args, grad_output=gvals))
    assert ok, err


@given(
    n_rows=st.sampled_from([0, 1, 65535, 65536, 2**32 - 1, 2**32, 2**40]),
    picks=st.lists(st.integers(0, 2**40), max_size=40),
)
def test_cuda_backward_sort_key_is_narrow_and_keeps_row_position_order(n_rows, picks):
    """The backward sorts the lookups' linear ids (``0..n_rows``) as keys of the narrowest unsigned
    type holding ``n_rows``, with a stable sort: the same order as sorting the unique
    ``(id, position)`` pairs, in 2, 4 or 8 radix passes."""
    from embnum.cuda import _common
    from embnum.cuda import tbe as cuda_tbe

    lid = np.array([p % (n_rows + 1) for p in picks], dtype=np.int64)
    key = cuda_tbe.sort_key(lid, n_rows)
    want_type = np.uint16 if n_rows < 2**16 else np.uint32 if n_rows < 2**32 else np.int64
    assert key.dtype == want_type
    np.testing.assert_array_equal(key.astype(np.int64), lid)
    order = _common.stable_argsort(key)
    np.testing.assert_array_equal(order, np.lexsort((np.arange(lid.shape[0]), lid)))


def _large_then_small(call):
    """``call()`` with no cpu call small (the parallel kernels), then with every call small (the
    one-thread kernels): its two results as flat lists of arrays."""
    pytest.importorskip("numba")
    from embnum.cpu import _common

    saved = _common.SERIAL_BYTES, _common.SERIAL_OVERRIDE
    got = []
    try:
        for limit in (0, 1 << 62):
            _common.SERIAL_BYTES = _common.SERIAL_OVERRIDE = limit
            got.append([np.asarray(x) for x in call()])
    finally:
        _common.SERIAL_BYTES, _common.SERIAL_OVERRIDE = saved
    return got


def _same_bits(got):
    for a, b in zip(*got, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# (table of each feature, dim, bags per feature, pooling): what _shared_table_lookups builds from
_SHARED_TABLE_CASES = st.tuples(
    st.lists(st.integers(0, 2), min_size=1, max_size=5),
    st.sampled_from((1, 3, 4, 8, 24, 32)),
    st.integers(0, 5),
    st.sampled_from(("sum", "mean", "psw", "none")),
)


def _shared_table_lookups(rng, case):
    """Lookups into tables of 5 rows x ``D`` that the features ``table_of`` share (numbered as
    drawn), bags of 0-3 ids, ``pooling`` one of sum/mean/none or ``"psw"`` (sum with per-sample
    weights), ``case = (table_of, D, B, pooling)``: ``(layout, T, N, the op's lookup arguments)``."""
    table_of, D, B, pooling = case
    fmap = [sorted(set(table_of)).index(t) for t in sorted(table_of)]  # non-decreasing, every table used
    lay = tbe_layout([5] * (max(fmap) + 1), [D] * (max(fmap) + 1), fmap)
    T = len(fmap)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 4, T * B))])
    N = int(offsets[-1])
    args = dict(**lay.by_name(), indices=rng.integers(0, 5, N), offsets=offsets)
    args["pooling_mode"] = "sum" if pooling == "psw" else pooling
    if pooling == "psw":
        args["per_sample_weights"] = rng.standard_normal(N).astype(np.float32)
    return lay, T, N, args


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from((1, 3, 8, 12, 32, 64, 128, 256)), min_size=1, max_size=4),
    st.integers(0, 5),
    st.sampled_from((np.float32, np.float16)),
    st.sampled_from(("sum", "mean", "psw")),
    st.integers(0, 2**32 - 1),
)
def test_cpu_small_forward_is_the_kernels_bit_for_bit(dims, B, dtype, pooling, seed):
    """``_forward_small`` (every small call) gives the bits of the pooled kernels it stands in for
    (the per-dim vector kernels and the generic one, float32 and float16 rows, per-sample weights,
    mean over empty and full bags), NaN and infinite weights included."""
    rng = np.random.default_rng(seed)
    lay = tbe_layout([7] * len(dims), dims)
    weights = rng.standard_normal(lay.num_weights).astype(dtype)
    weights[rng.integers(0, lay.num_weights, 3)] = [np.nan, np.inf, -0.0]
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 4, len(dims) * B))])
    args = dict(weights=weights, **lay.by_name(), indices=rng.integers(0, 7, offsets[-1]), offsets=offsets)
    args["pooling_mode"] = "mean" if pooling == "mean" else "sum"
    if pooling == "psw":
        args["per_sample_weights"] = rng.standard_normal(offsets[-1]).astype(np.float32)
    _same_bits(_large_then_small(lambda: [embnum.tbe_forward(**args, backend="cpu")]))


@settings(max_examples=60, deadline=None)
@given(_SHARED_TABLE_CASES, st.sampled_from((np.float32, np.float16)), st.integers(0, 2**32 - 1))
def test_cpu_small_backward_is_the_kernel_bit_for_bit(case, gdtype, seed):
    """``_dense_grad_small`` and ``_sparse_grad_small`` (every small ``tbe_backward`` and
    ``tbe_backward_sparse``) give the bits of ``_dense_grad`` and ``_sparse_grad``: features
    sharing a table (their lookups summed across features), repeated rows, empty bags,
    per-sample weights, mean, pooling ``"none"``, float16 gradients, NaN/inf/-0.0 gradients."""
    rng = np.random.default_rng(seed)
    lay, T, N, args = _shared_table_lookups(rng, case)
    D, B, pooling = case[1:]
    grad = rng.standard_normal((N, D) if pooling == "none" else (B, T * D)).astype(gdtype)
    if grad.size:
        grad.reshape(-1)[rng.integers(0, grad.size, 3)] = [np.nan, np.inf, -0.0]
    weights = np.zeros(lay.num_weights, np.float32)

    def both():
        dense = embnum.tbe_backward(grad, weights, **args, backend="cpu")
        return [dense, *embnum.tbe_backward_sparse(grad, weights, **args, backend="cpu")]

    _same_bits(_large_then_small(both))


@settings(max_examples=60, deadline=None)
@given(
    _SHARED_TABLE_CASES,
    st.sampled_from([o for o in OPTIMIZERS if o.kind in ("sgd", "adagrad", "rowwise_adagrad", "adam")]),
    st.sampled_from((np.float32, np.float16)),
    st.integers(0, 2**32 - 1),
)
def test_cpu_small_update_is_the_fused_kernel_bit_for_bit(case, opt, wdtype, seed):
    """A small ``tbe_backward_update`` (``_update_small``: the small sparse gradient, then the
    fused kernel's row rule in a serial loop) leaves the bits the fused kernel leaves in the
    weights (float32 in place, float16 rounded once) and the optimizer state, for each kind with a
    fused kernel: shared tables, repeated rows, empty bags, psw, mean, none, clipping."""
    rng = np.random.default_rng(seed)
    lay, T, N, args = _shared_table_lookups(rng, case)
    D, B, pooling = case[1:]
    grad = rng.standard_normal((N, D) if pooling == "none" else (B, T * D)).astype(np.float32)
    weights = rng.standard_normal(lay.num_weights).astype(wdtype)
    state = state_for(opt, weights, lay.hash_size_cumsum, rng)

    def step():
        w = weights.copy()
        kept = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in state.items()}
        embnum.tbe_backward_update(grad, w, **args, optimizer=opt, **kept, backend="cpu")
        return [w] + [v for v in kept.values() if isinstance(v, np.ndarray)]

    _same_bits(_large_then_small(step))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_cpu_parallel_forward_is_ref(data):
    """The pooled forward's parallel kernels, which small calls skip for ``_forward_small`` (the
    tables' drawn inputs are small), match ref with every call on all threads."""
    pytest.importorskip("numba")
    from embnum.cpu import _common

    args = data.draw(strategy("tbe_forward"))
    saved = _common.SERIAL_BYTES, _common.SERIAL_OVERRIDE
    try:
        _common.SERIAL_BYTES = _common.SERIAL_OVERRIDE = 0  # no call is small
        check_matches_ref("tbe_forward", args, FLAVORS[0])
    finally:
        _common.SERIAL_BYTES, _common.SERIAL_OVERRIDE = saved
