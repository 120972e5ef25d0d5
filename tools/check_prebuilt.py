"""Check that an installed embnum's prebuilt kernels cover every op's tour examples on this host.

    NUMBA_CACHE_DIR=$(mktemp -d) python tools/check_prebuilt.py

Runs each op's small and large tour examples (the TBE ops' with int32 lookups too) on the cpu
backend (``embnum._warmup.warm_op``, as ``warmup --prebuilt`` ran them) in
this process, on an empty cache directory, and lists every kernel Numba compiled meanwhile: with
a complete ``embnum/_prebuilt`` for these sources, Python and Numba, on a host with the baseline's
features, there are none. Exit status 1 when any kernel compiled or an op failed (each named).
"""

from __future__ import annotations

import os
import sys

from embnum import _prebuilt, _warmup


def main() -> int:
    where = _prebuilt.root()
    print(f"prebuilt kernels: {where} (usable on this host: {_prebuilt.usable()})")
    if not os.environ.get("NUMBA_CACHE_DIR"):
        print("set NUMBA_CACHE_DIR to an empty directory: a filled cache would hide what is missing")
        return 2
    bad = 0
    for name in _warmup.plan():
        with _warmup.compiled_kernels() as compiled:
            _, seconds, error = _warmup.warm_op(name, ("cpu",), int32_lookups=True)
        if error or compiled:
            bad += 1
            print(f"{name:34s} {seconds:6.2f} s  {error or 'compiled: ' + ', '.join(compiled)}")
    print(f"{bad} ops compiled a kernel or failed" if bad else "every op's examples ran on prebuilt kernels alone")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
