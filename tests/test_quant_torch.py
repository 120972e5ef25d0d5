"""The quant family on torch tensors (docs/families/quant.md): torch output dtypes, the bridge's
bfloat16, the codecs and their straight-through gradient, a gloo all-to-all."""

from __future__ import annotations

import pytest

import embnum
from tables.quant import Q8

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")


@pytest.mark.parametrize("value", ["tensor", "dtype"])
def test_numpy_api_names_a_torch_output_dtype(value):
    """A torch object as the NumPy API's output_dtype: a TypeError naming it, not NumPy's ValueError."""
    bad = torch.tensor(2) if value == "tensor" else torch.float16
    for backend in ("ref", "cpu"):
        with pytest.raises(TypeError, match="output_dtype"):
            embnum.fused_8bit_rowwise_to_float(Q8, output_dtype=bad, backend=backend)


# -- torch bridge: dtypes, codecs, straight-through gradient, gloo all-to-all -------------


def test_bridge_bfloat16_is_a_torch_bfloat16():
    x = torch.tensor([1.0, 1.00390625, float("nan"), -2.5e-3])
    b = tb.float_to_bfloat16(x)
    assert b.dtype == torch.bfloat16
    assert b.view(torch.uint16).tolist() == [0x3F80, 0x3F81, 0x7FC0, 0xBB24]
    back = tb.bfloat16_to_float(b)
    assert back.dtype == torch.float32 and torch.equal(back[[0, 1, 3]], b.float()[[0, 1, 3]]) and back[2].isnan()
    assert torch.equal(tb.bfloat16_to_float(b.view(torch.uint16)).view(torch.int32), back.view(torch.int32))


def test_bridge_ops_have_no_gradient():
    """The ops themselves: integer codes have no gradient; the float16 cast refuses backward."""
    x = torch.randn(3, 4, requires_grad=True)
    assert not tb.float_to_fused_8bit_rowwise(x).requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula"):
        tb.float_to_fp16(x).float().sum().backward()


def _codecs():
    from embnum.torch_bridge.codecs import BF16Codec, FP16Codec, HFP8Codec, Int8RowwiseCodec

    return [
        FP16Codec(),
        FP16Codec(saturate=True),
        BF16Codec(),
        HFP8Codec(),
        HFP8Codec(ebits=4, exponent_bias=7, max_pos=480.0),
        Int8RowwiseCodec(),
    ]


@pytest.mark.parametrize("i", range(6))
def test_codec_interface_and_stated_error(i):
    codec = _codecs()[i]
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, 12, generator=g) * 10.0 ** (torch.rand(8, 1, generator=g) * 8 - 4)
    x[0, :3] = torch.tensor([1e5, -7e4, 0.0])
    ctx = codec.create_context()
    payload = codec.encode(x, ctx)
    assert payload.dtype == codec.quantized_dtype
    assert payload.numel() == codec.calc_quantized_size(x.numel(), ctx if ctx is None else type(ctx)(12))
    back = codec.decode(payload, ctx if ctx is None else type(ctx)(12)).reshape(x.shape)
    assert back.dtype == torch.float32
    assert bool(((back.double() - x.double()).abs() <= codec.error_bound(x)).all())


@pytest.mark.parametrize("i", range(6))
def test_codec_round_trip_gradient_is_straight_through(i):
    """Forward: decode(encode(x)); backward: the gradient passes unchanged (documented)."""
    codec = _codecs()[i]
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(i), requires_grad=True)
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(100 + i))
    y = codec.round_trip(x)
    assert torch.equal(y, codec.decode(codec.encode(x.detach(), RT_CTX(codec)), RT_CTX(codec)).reshape(x.shape))
    (y * w).sum().backward()
    assert torch.equal(x.grad, w)
    step = torch.compile(lambda v: (codec.round_trip(v) * w).sum(), backend="aot_eager", fullgraph=True)
    x.grad = None
    step(x).backward()
    assert torch.equal(x.grad, w)


def RT_CTX(codec):
    ctx = codec.create_context()
    return None if ctx is None else type(ctx)(8)


def test_codecs_around_a_gloo_all_to_all():
    """A real all-to-all in two spawned processes (gloo): encode -> all_to_all -> decode
    agrees with the uncompressed all-to-all within each codec's stated error."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run(
        [sys.executable, str(here / "gloo_all_to_all.py")], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ok:" in proc.stdout
