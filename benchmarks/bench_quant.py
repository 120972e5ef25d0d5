"""Quant family: embnum's row-wise quantizers beside fbgemm_gpu's CPU ops, in one run.

    python benchmarks/bench_quant.py [--backend cpu] [--backend ref] [--backend cuda]
    [--rows 65536] [--dim 128] [--threads N]

Prints the machine, then a markdown table (milliseconds, median of >= 7 runs
after 2 warm-ups). The headline case is the issue's: 8-bit and 4-bit row-wise
quantize and dequantize of a [65536, 128] float32 array. "embnum out=" reuses
an output buffer (no allocation, no first touch of fresh pages); fbgemm's ops
always allocate. "copy floor" is a plain NumPy copy of the bytes the op must
read and write. Ratios use the default (allocating) embnum call.
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
from _bench import (  # noqa: E402
    copy_floor,
    default_backends,
    fmt_ms,
    machine,
    median_time,
    optional_fbgemm,
    optional_torch,
    table,
)


def cases(R, D, rng):
    """(op, label, embnum args, fbgemm call or None, bytes read, bytes written)."""
    torch = optional_torch()
    fb = optional_fbgemm(torch)
    x = (rng.standard_normal((R, D)) * 10.0 ** rng.uniform(-3, 1, (R, 1))).astype(np.float32)
    q8 = embnum.float_to_fused_8bit_rowwise(x)
    q4 = embnum.float_to_fused_nbit_rowwise(x, 4)
    if fb is not None:
        tx, tq8, tq4 = (torch.from_numpy(a) for a in (x, q8, q4))
    yield (
        "float_to_fused_8bit_rowwise",
        f"[{R}, {D}] f32",
        dict(input=x),
        fb and (lambda: fb.FloatToFused8BitRowwiseQuantized(tx)),
        x.nbytes,
        q8.nbytes,
    )
    yield (
        "fused_8bit_rowwise_to_float",
        f"[{R}, {D + 8}] u8",
        dict(input=q8),
        fb and (lambda: fb.Fused8BitRowwiseQuantizedToFloat(tq8)),
        q8.nbytes,
        x.nbytes,
    )
    yield (
        "float_to_fused_nbit_rowwise",
        f"[{R}, {D}] f32, 4-bit",
        dict(input=x, bit_rate=4),
        fb and (lambda: fb.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(tx, 4)),
        x.nbytes,
        q4.nbytes,
    )
    yield (
        "fused_nbit_rowwise_to_float",
        f"[{R}, {q4.shape[1]}] u8, 4-bit",
        dict(input=q4, bit_rate=4),
        fb and (lambda: fb.FusedNBitRowwiseQuantizedSBHalfToFloat(tq4, 4)),
        q4.nbytes,
        x.nbytes,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", help="embnum backends to time (default: cpu, and cuda on a GPU)")
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--threads", type=int, help="Numba threads for the cpu backend (default: all)")
    args = parser.parse_args(argv)
    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    backends = default_backends(args.backend)
    print(machine())
    print(f"- command: python benchmarks/bench_quant.py {' '.join(sys.argv[1:])}".rstrip())
    rows = []
    main_backend = "cpu" if "cpu" in backends else backends[-1]
    for op, label, op_args, fb_call, nread, nwritten in cases(args.rows, args.dim, np.random.default_rng(0)):
        row = {"op": op, "input": label}
        fn = getattr(embnum, op)
        for backend in backends:
            be = embnum._backend.BACKENDS[backend]
            dev_args = {k: be.from_host(v) if isinstance(v, np.ndarray) else v for k, v in op_args.items()}

            def run(dev_args=dev_args, backend=backend, be=be, out=None):
                fn(**dev_args, backend=backend, out=out)
                be.synchronize()

            row[f"embnum {backend}"] = median_time(run)
            if backend == main_backend:
                buf = fn(**dev_args, backend=backend)
                row["embnum out="] = median_time(lambda: run(out=buf))
        row["fbgemm cpu"] = median_time(fb_call) if fb_call else None
        row["copy floor"] = copy_floor(nread, nwritten)
        t = row[f"embnum {main_backend}"]
        row["fbgemm / embnum"] = f"{row['fbgemm cpu'] / t:.2f}x" if row["fbgemm cpu"] else "-"
        row["fbgemm / embnum out="] = f"{row['fbgemm cpu'] / row['embnum out=']:.2f}x" if row["fbgemm cpu"] else "-"
        row["embnum / floor"] = f"{t / row['copy floor']:.2f}"
        rows.append(row)
    columns = (
        ["op", "input"]
        + [f"embnum {b}" for b in backends]
        + ["embnum out=", "fbgemm cpu", "copy floor", "fbgemm / embnum", "fbgemm / embnum out=", "embnum / floor"]
    )
    for r in rows:
        for c in columns:
            if isinstance(r.get(c), float) or (r.get(c) is None and c not in ("op", "input")):
                r[c] = fmt_ms(r.get(c))
    print("\ntimes in ms\n")
    print(table(rows, columns))


if __name__ == "__main__":
    main()
