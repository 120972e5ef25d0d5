"""Quant family: embnum's row-wise quantizers beside fbgemm_gpu's CPU ops, in one run.

    python benchmarks/bench_quant.py [--backend cpu] [--backend ref] [--backend cuda]
    [--rows 65536] [--dim 128] [--threads N]

Prints the machine, the load before and after, then a markdown table: milliseconds per
call, median [IQR] over ``--rounds`` rounds in which every contender runs in turn in this
process (``_bench.interleaved``, torch.utils.benchmark). The headline case is the issue's:
8-bit and 4-bit row-wise quantize and dequantize of a [65536, 128] float32 array, and
the float16 encoder (saturating, as TorchRec's FP16 codec; torch's clamp and cast beside it) and
the element-wise dequantizers (bfloat16, float16, HFP8) to a [65536, 128] float32 array.
"embnum out=" reuses an output buffer (no allocation, no first touch of fresh pages;
allocating quant calls reuse large outputs the caller no longer holds, see
``embnum.cpu._pool``);
fbgemm's ops always allocate (through torch's allocator, which does not ask for huge
pages: on this VM every 4 KiB first touch costs several microseconds). "copy floor" is a
plain NumPy copy of the bytes the op must read and write, "fresh copy" the same into a
new array. Ratios use the default (allocating) embnum call.
``--threads N`` sets Numba's thread count (on a loaded machine one thread is
steadier: a parallel loop waits for its slowest, descheduled thread).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embnum  # noqa: E402
from _bench import Case, default_backends, optional_fbgemm, optional_torch, report, run_cases  # noqa: E402


def cases(R, D, rng):
    """The headline cases (:class:`_bench.Case`), fbgemm's op beside each."""
    torch = optional_torch()
    fb = optional_fbgemm(torch)
    x = (rng.standard_normal((R, D)) * 10.0 ** rng.uniform(-3, 1, (R, 1))).astype(np.float32)
    q8 = embnum.float_to_fused_8bit_rowwise(x)
    q4 = embnum.float_to_fused_nbit_rowwise(x, 4)
    tx, tq8, tq4 = (torch.from_numpy(a) for a in (x, q8, q4)) if fb else (None,) * 3
    names = {
        8: ("FloatToFused8BitRowwiseQuantized", "Fused8BitRowwiseQuantizedToFloat"),
        4: ("FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf", "FusedNBitRowwiseQuantizedSBHalfToFloat"),
    }
    for rate, q, tq in ((8, q8, tq8), (4, q4, tq4)):
        kw, fb_kw, kind = (dict(), (), "8bit") if rate == 8 else (dict(bit_rate=rate), (rate,), "nbit")
        to_fb = fb and (lambda name=names[rate][0], kw=fb_kw: getattr(fb, name)(tx, *kw))
        from_fb = fb and (lambda name=names[rate][1], tq=tq, kw=fb_kw: getattr(fb, name)(tq, *kw))
        to_in, from_in = f"[{R}, {D}] f32, {rate}-bit", f"[{R}, {q.shape[1]}] u8, {rate}-bit"
        yield Case(f"float_to_fused_{kind}_rowwise", to_in, dict(input=x, **kw), x.nbytes, q.nbytes, to_fb, None, True)
        yield Case(
            f"fused_{kind}_rowwise_to_float", from_in, dict(input=q, **kw), q.nbytes, x.nbytes, from_fb, None, True
        )
    # the float16 encoder (TorchRec's FP16 codec: saturating); fbgemm's CPU build has no element-wise
    # float32 -> float16 op, the codec's own torch form is the peer
    tx32 = torch.from_numpy(x) if torch else None
    yield Case(
        "float_to_fp16",
        f"[{R}, {D}] f32",
        dict(input=x),
        x.nbytes,
        x.nbytes // 2,
        None,
        torch and (lambda: torch.clamp(tx32, -65504.0, 65504.0).half()),
        True,
    )
    # the element-wise dequantizers, each with a fresh [R, D] float32 output
    bf16, f16 = embnum.float_to_bfloat16(x), x.astype(np.float16)
    hfp8 = embnum.float_to_hfp8(x, 4, 7, 448.0)
    tb, th, t8 = (torch.from_numpy(a) for a in (bf16.view(np.int16), f16, hfp8)) if fb else (None,) * 3
    yield Case(
        "bfloat16_to_float",
        f"[{R}, {D}] bf16",
        dict(input=bf16),
        bf16.nbytes,
        x.nbytes,
        fb and (lambda: fb.Bfloat16QuantizedToFloat(tb.view(torch.bfloat16))),
        torch and (lambda: tb.view(torch.bfloat16).float()),
        True,
    )
    yield Case(
        "fp16_to_float",
        f"[{R}, {D}] f16",
        dict(input=f16),
        f16.nbytes,
        x.nbytes,
        None,  # fbgemm's fp16_to_fp32 is torch's .float()
        torch and (lambda: th.float()),
        True,
    )
    yield Case(
        "hfp8_to_float",
        f"[{R}, {D}] hfp8 e4 bias 7",
        dict(input=hfp8, ebits=4, exponent_bias=7),
        hfp8.nbytes,
        x.nbytes,
        fb and (lambda: fb.HFP8QuantizedToFloat(t8, 4, 7)),
        None,
        True,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", help="embnum backends to time (default: cpu, and cuda on a GPU)")
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--threads", type=int, help="Numba threads for the cpu backend (default: all)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row")
    parser.add_argument(
        "--no-pool", action="store_true", help="every embnum output a fresh np.empty (embnum.cpu._pool off: the A/B)"
    )
    args = parser.parse_args(argv)
    if args.no_pool:
        from embnum.cpu import _pool

        _pool.MAX_BYTES = 0
    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    backends = default_backends(args.backend)
    rng = np.random.default_rng(0)
    report(
        "bench_quant.py",
        lambda: run_cases(cases(args.rows, args.dim, rng), backends, fresh=True, rounds=args.rounds),
    )


if __name__ == "__main__":
    main()
