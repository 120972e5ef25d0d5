"""Two processes, gloo: every codec around a real ``all_to_all_single``.

Run by ``tests/test_quant_torch.py::test_codecs_around_a_gloo_all_to_all`` (as a
script, so that ``torch.multiprocessing.spawn`` can re-import it): each rank
sends half of its rows to the other rank, once uncompressed and once encoded
with each codec; the receiver decodes and checks the result against the
uncompressed exchange within the codec's stated error. Inputs are seeded per
rank, so every run is the same. Exit status 0 when every rank agrees.
"""

import datetime
import os
import socket
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD, ROWS_PER_PEER, D = 2, 6, 16


def _rows(rank):
    g = torch.Generator().manual_seed(1234 + rank)
    scale = 10.0 ** (torch.rand(WORLD * ROWS_PER_PEER, 1, generator=g) * 4 - 3)  # per-row magnitudes 1e-3 .. 10
    return torch.randn(WORLD * ROWS_PER_PEER, D, generator=g) * scale


def _exchange(t):
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t)  # equal splits: chunk i of the flat tensor goes to rank i
    return out


def _worker(rank, port):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=90),
    )  # a failed peer ends the collective instead of hanging it
    from embnum.torch_bridge.codecs import BF16Codec, FP16Codec, HFP8Codec, Int8RowwiseCodec

    x = _rows(rank)
    plain = _exchange(x.reshape(-1)).reshape(x.shape)
    codecs = [FP16Codec(), BF16Codec(), HFP8Codec(ebits=4, exponent_bias=7, max_pos=480.0), Int8RowwiseCodec(row_dim=D)]
    for codec in codecs:
        ctx = codec.create_context()
        payload = codec.encode(x, ctx)
        assert payload.dtype == codec.quantized_dtype, (codec, payload.dtype)
        assert payload.numel() == codec.calc_quantized_size(x.numel(), ctx), codec
        wire = payload.reshape(-1).view(torch.uint8)  # bytes on the wire: gloo's all-to-all lacks 16-bit floats
        received = _exchange(wire).view(payload.dtype)
        got = codec.decode(received.reshape(payload.shape), ctx).reshape(x.shape)
        err = (got.double() - plain.double()).abs()
        bound = codec.error_bound(plain)
        if not bool((err <= bound).all()):
            raise AssertionError(
                f"rank {rank} {type(codec).__name__}: error {float(err.max())} beyond the stated bound"
            )
        if not bool((err > 0).any()) and type(codec).__name__ != "FP16Codec":
            raise AssertionError(f"rank {rank} {type(codec).__name__}: lossless on random rows: not compressed?")
    dist.barrier()
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port,), nprocs=WORLD, join=True)
    print("ok: codecs agree with the uncompressed all-to-all within their stated error")


if __name__ == "__main__":
    sys.exit(main())
