"""Reuse of large host outputs for the cpu kernels of the families that opt in.

Why: a fresh output of many MiB costs more than the kernel that fills it. Each call
would get new pages from the OS, which the kernel zeroes at first touch: on the benchmark's
2-core VM a fresh 32 MiB float32 fill took 4.9-6.3 ms against 1.6 ms into a kept buffer
(``benchmarks/investigations/fresh_pages.py``), and under load up to ~60 ms (a VM with free page
reporting hands freed 2 MiB blocks back to its host, so touching them again faults in
the host; seen under load, not reproduced on the quiet machine). The dequantizer's own
work is ~1.2-1.6 ms (benchmarks/RESULTS.md, quant). Pages that stay mapped in
the process cost neither.

The lifetime rule (what a caller can rely on):

* Only outputs that embnum allocates itself (no ``out=``) on the cpu backend, of at
  least :data:`MIN_BYTES`, for ops of a family whose cpu module exports
  ``empty_output`` (today: quant and kjt) come from here; every other output is a plain
  ``np.empty``.
* A returned array is a view of a pooled buffer (``result.base`` is the buffer). A
  buffer is handed out again only when the pool holds the ONLY reference to it: as long
  as any array returned from it, any view of one, or anything that keeps one alive (a
  tensor from ``torch.from_numpy``, a ``memoryview``, a DLPack capsule) exists, the
  buffer is busy and the next call gets another. A new result therefore never aliases
  a result the caller still holds. (A raw address kept without the array, e.g.
  ``result.ctypes.data`` after ``del result``, is as dangling as for any freed array.)
* The pool tracks at most :data:`MAX_BUFFERS` buffers of :data:`MAX_BYTES` bytes in all,
  busy or idle; to make room it drops its least recently used idle buffer, else stops
  tracking its least recently used busy one (which is then freed with its results, as
  any array). Memory retained for reuse (idle buffers) is therefore at most
  ``MAX_BYTES`` at any time; :func:`release` frees every idle buffer,
  ``MAX_BYTES = 0`` turns the pool off.
* Hand-out is under a lock: two threads never get the same buffer.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

MIN_BYTES = 4 << 20  # NumPy's own huge-page threshold: below it a fresh array comes from the heap
MAX_BUFFERS = 4
MAX_BYTES = 256 << 20
_ROUND = 2 << 20  # buffers in whole huge pages, so that near sizes share one

_buffers: list[np.ndarray] = []
_lock = threading.Lock()


def _idle_count() -> int:
    """``sys.getrefcount(_buffers[i])`` of a buffer that nothing outside the pool holds
    (measured once: the count of a temporary differs between Python versions)."""
    probe = [np.empty(1, np.uint8)]
    return sys.getrefcount(probe[0])


_IDLE = _idle_count()


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (like ``np.empty``),
    carved from an idle pooled buffer when it is at least :data:`MIN_BYTES` (see the rule
    in the module docstring)."""
    dtype = np.dtype(dtype)
    n = dtype.itemsize
    for d in shape:
        n *= d
    if n < MIN_BYTES or n > MAX_BYTES:
        return np.empty(shape, dtype)
    size = -(-n // _ROUND) * _ROUND
    with _lock:
        held = 0
        for i in range(len(_buffers)):
            if _buffers[i].nbytes == size and sys.getrefcount(_buffers[i]) == _IDLE:
                buf = _buffers.pop(i)
                _buffers.append(buf)  # most recently used last
                return buf[:n].view(dtype).reshape(shape)
            held += _buffers[i].nbytes
        while _buffers and (len(_buffers) >= MAX_BUFFERS or held + size > MAX_BYTES):
            # make room: drop the least recently used idle buffer, else stop tracking the least
            # recently used busy one (its results keep it alive; it is freed with them)
            idle = [i for i in range(len(_buffers)) if sys.getrefcount(_buffers[i]) == _IDLE]
            held -= _buffers.pop(idle[0] if idle else 0).nbytes
        buf = np.empty(size, np.uint8)
        _buffers.append(buf)
        return buf[:n].view(dtype).reshape(shape)


def release() -> int:
    """Drop every idle buffer (busy ones stay until their results are gone and a later call
    finds them idle); returns the bytes released."""
    freed = 0
    with _lock:
        for i in reversed(range(len(_buffers))):
            if sys.getrefcount(_buffers[i]) == _IDLE:
                freed += _buffers[i].nbytes
                del _buffers[i]
    return freed


def held_bytes() -> int:
    """Bytes of every pooled buffer, idle or busy."""
    with _lock:
        return sum(b.nbytes for b in _buffers)
