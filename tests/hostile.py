"""The adversarial tier's building blocks: hostile mutations of valid inputs, and the
verdict on one mutated call.

A *case* is ``(op name, seed, mutation)``: the op's small tour example drawn with
``seed`` (a valid input), then one hostile mutation (:func:`mutations` draws them
with Hypothesis). :func:`judge` runs a case on ref, cpu and the torch bridge and
returns what happened; it runs inside ``hostile_worker.py``, a subprocess, so that
a crash is a failed case, not a dead test run. Every backend must give either a
clean error (``TypeError``/``ValueError``/``IndexError``, its message naming an
argument of the op) with every input unchanged, or a result equal to ref's.

Mutations (``(kind, target, *params)``, ``target = (parameter, list index or None)``):

* ``int``: an int parameter (or list entry) set to a hostile value: around 2**31,
  2**32, 2**48, 2**62, 2**63, 2**64, negative, NumPy int/uint scalars, bool, float,
  str, None;
* ``entry`` / ``fill``: one entry / every entry of an integer array set to such a value
  (the array widened to int64 when the value does not fit);
* ``wrapsum``: three entries changed so that the int32/int64 sum wraps back to the
  original total (``2**63 - 1, 2**63 - 1, x + 2``);
* ``decrease``: an integer array reversed (decreasing offsets), or two entries swapped;
* ``dtype`` / ``ndim``: any other dtype (object and complex included); a leading,
  a trailing axis, flattened, 0-d, empty;
* ``layout``: the same values strided, with negative strides, Fortran order,
  read-only, unaligned, as ``np.matrix`` or a masked array;
* ``alias``: an array argument replaced by a view of another argument's memory;
* ``value``: a non-array parameter replaced by a value of the wrong type or range.
"""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
from hypothesis import strategies as st

CLEAN = (TypeError, ValueError, IndexError)

HOSTILE_INTS = (
    -1,
    -(2**31),
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**32 + 1,
    2**48 + 1,
    2**61 + 1,
    2**62,
    2**63 // 3,
    2**63 - 1,
    -(2**63),
    2**63,
    2**64,
    2**64 - 1,
)
HOSTILE_SCALARS = HOSTILE_INTS + (
    "np.uint64(2**64-1)",
    "np.uint64(2**63)",
    "np.int64(2**63-1)",
    "np.int32(-1)",
    "True",
    "1.5",
    "nan",
    "'3'",
    "None",
    "[]",
    "np.array(3)",
)
WRONG_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "object",
)
NDIMS = ("lead", "trail", "flat", "zero_d", "empty")
LAYOUTS = ("strided", "negative", "fortran", "readonly", "unaligned", "matrix", "masked")


def scalar(spec):
    """A hostile scalar from its spec (ints as themselves, others as a short expression)."""
    if isinstance(spec, int):
        return spec
    return eval(spec, {"np": np, "nan": float("nan")})  # noqa: S307 - specs are the literals above


# -- the structure of an op's arguments -----------------------------------------------
def leaves(args: dict):
    """``{target: value}`` over every parameter and every list entry."""
    found = {}
    for k, a in args.items():
        found[(k, None)] = a
        if isinstance(a, (list, tuple)):
            for i, x in enumerate(a):
                found[(k, i)] = x
    return found


def array_targets(args):
    return [t for t, a in leaves(args).items() if isinstance(a, np.ndarray)]


def int_array_targets(args):
    return [t for t, a in leaves(args).items() if isinstance(a, np.ndarray) and a.dtype.kind in "iu" and a.size]


def int_targets(args):
    return [
        t
        for t, a in leaves(args).items()
        if isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) or (t[1] is None and a is None)
    ]


def value_targets(args):
    return [t for t, a in leaves(args).items() if t[1] is None and not isinstance(a, np.ndarray)]


@st.composite
def mutations(draw, args: dict):
    """One hostile mutation of ``args`` (a valid input of the op)."""
    arrays, ints, int_arrays = array_targets(args), int_targets(args), int_array_targets(args)
    kinds = ["value"]
    if ints:
        kinds += ["int"] * 3
    if int_arrays:
        kinds += ["entry"] * 3 + ["fill", "wrapsum", "wrapsum", "decrease"]
    if arrays:
        kinds += ["dtype", "ndim", "layout", "layout"]
    if len(arrays) >= 2:
        kinds += ["alias", "alias"]
    kind = draw(st.sampled_from(kinds))
    if kind == "int":
        return ("int", draw(st.sampled_from(ints)), draw(st.sampled_from(HOSTILE_SCALARS)))
    if kind == "value":
        return (
            "value",
            draw(st.sampled_from(value_targets(args) or [next(iter(leaves(args)))])),
            draw(st.sampled_from(HOSTILE_SCALARS + ("'bogus'", "-3", "1.7", "object()", "[1.5]", "(1, 2)"))),
        )
    if kind in ("entry", "fill"):
        return (kind, draw(st.sampled_from(int_arrays)), draw(st.floats(0, 1)), draw(st.sampled_from(HOSTILE_INTS)))
    if kind == "wrapsum":
        return ("wrapsum", draw(st.sampled_from(int_arrays)), draw(st.integers(0, 2**16)))
    if kind == "decrease":
        return ("decrease", draw(st.sampled_from(int_arrays)), draw(st.booleans()), draw(st.floats(0, 1)))
    if kind == "dtype":
        return ("dtype", draw(st.sampled_from(arrays)), draw(st.sampled_from(WRONG_DTYPES)))
    if kind == "ndim":
        return ("ndim", draw(st.sampled_from(arrays)), draw(st.sampled_from(NDIMS)))
    if kind == "layout":
        return ("layout", draw(st.sampled_from(arrays)), draw(st.sampled_from(LAYOUTS)))
    a = draw(st.sampled_from(arrays))
    b = draw(st.sampled_from([t for t in arrays if t != a]))
    return ("alias", a, b, draw(st.booleans()))


# -- applying a mutation ----------------------------------------------------------------
class NotApplicable(Exception):
    """The mutation does not apply to this input (e.g. ``wrapsum`` on two entries)."""


def _set(args, target, value):
    k, i = target
    if i is None:
        args[k] = value
    else:
        seq = list(args[k])
        seq[i] = value
        args[k] = seq if isinstance(args[k], list) else tuple(seq)


def _get(args, target):
    k, i = target
    return args[k] if i is None else args[k][i]


def _put_int(a, pos, value):
    """``a`` with ``a[pos] = value``, widened to int64 (or uint64) when the value does not fit."""
    for dt in (a.dtype, np.dtype(np.int64), np.dtype(np.uint64)):
        if dt.kind in "iu" and np.iinfo(dt).min <= value <= np.iinfo(dt).max:
            b = a.astype(dt)
            b.reshape(-1)[pos] = value
            return b
    raise NotApplicable(f"{value} fits no integer dtype")


def _layout(a, how):
    if how == "strided":
        big = np.zeros((a.size * 2,), a.dtype)
        big[::2] = a.reshape(-1)
        return big[::2].reshape(a.shape) if a.ndim <= 1 else _strided_nd(a)
    if how == "negative":
        return np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])[(slice(None, None, -1),) * a.ndim]
    if how == "fortran":
        return np.asfortranarray(a) if a.ndim >= 2 else _layout(a, "strided")
    if how == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b
    if how == "unaligned":
        raw = np.zeros(a.nbytes + 1, np.uint8)[1:]
        b = raw.view(a.dtype).reshape(a.shape) if a.dtype.kind != "O" else a.copy()
        b[...] = a
        return b
    if how == "matrix":
        if a.ndim != 2:
            raise NotApplicable("np.matrix is 2-D")
        return np.asmatrix(a.copy())
    if how == "masked":
        return np.ma.array(a.copy(), mask=np.zeros(a.shape, bool))
    raise AssertionError(how)


def _strided_nd(a):
    big = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _ndim(a, how):
    if how == "lead":
        return a[None]
    if how == "trail":
        return a[..., None]
    if how == "flat":
        if a.ndim < 2:
            raise NotApplicable("already flat")
        return a.reshape(-1)
    if how == "zero_d":
        if a.size == 0:
            raise NotApplicable("empty")
        return np.asarray(a.reshape(-1)[0])
    if how == "empty":
        if a.ndim == 0:
            raise NotApplicable("0-d")
        return a[:0]
    raise AssertionError(how)


def apply(args: dict, mutation) -> dict:
    """A new argument dict with ``mutation`` applied (``args`` itself is left alone)."""
    args = copy.deepcopy(args)
    kind, target = mutation[0], mutation[1]
    if kind == "none":
        return args
    if kind in ("int", "value"):
        _set(args, target, scalar(mutation[2]))
        return args
    a = _get(args, target)
    if kind in ("entry", "fill"):
        if kind == "fill":
            b = a.astype(np.int64) if np.iinfo(a.dtype).max < mutation[3] or mutation[3] < np.iinfo(a.dtype).min else a
            try:
                b = b.copy()
                b[...] = mutation[3]
            except OverflowError:
                raise NotApplicable("value fits no dtype") from None
        else:
            b = _put_int(a, min(int(mutation[2] * a.size), a.size - 1), mutation[3])
    elif kind == "wrapsum":
        if a.size < 3:
            raise NotApplicable("fewer than 3 entries")
        top = np.iinfo(np.int32 if a.dtype.itemsize <= 4 else np.int64).max
        flat = a.astype(np.int64).reshape(-1)
        i, j, k = ((mutation[2] + n) % a.size for n in range(3))  # distinct: a.size >= 3
        rest = int(flat[i]) + int(flat[j]) + int(flat[k]) + 2
        if rest > top:
            raise NotApplicable("entries too large to wrap")
        flat[i], flat[j], flat[k] = top, top, rest  # the sum grows by 2 * (top + 1): it wraps back
        b = flat.reshape(a.shape).astype(a.dtype)
    elif kind == "decrease":
        if a.ndim == 0:
            raise NotApplicable("0-d")
        if mutation[2]:
            b = a[::-1].copy()
        else:
            b = a.copy().reshape(-1)
            if b.size < 2:
                raise NotApplicable("one entry")
            p = min(int(mutation[3] * (b.size - 1)), b.size - 2)
            b[p], b[p + 1] = b[p + 1].copy(), b[p].copy()
            b = b.reshape(a.shape)
    elif kind == "dtype":
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = a.astype(mutation[2])
    elif kind == "ndim":
        b = _ndim(a, mutation[2])
    elif kind == "layout":
        b = _layout(a, mutation[2])
    elif kind == "alias":
        src = _get(args, mutation[2])
        if not isinstance(src, np.ndarray) or not src.flags.c_contiguous:
            raise NotApplicable("source not contiguous")
        if mutation[3] and src.shape == a.shape and src.dtype == a.dtype:
            b = src  # the very same array
        else:
            raw = src.reshape(-1).view(np.uint8)
            if raw.size < a.nbytes or a.dtype.kind == "O":
                raise NotApplicable("source too small")
            b = raw[: a.nbytes].view(a.dtype).reshape(a.shape)  # a view of src's memory, shaped like a
    else:
        raise AssertionError(kind)
    _set(args, target, b)
    return args


# -- the verdict ----------------------------------------------------------------------------
def names_an_argument(message: str, params) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(p)}(?![A-Za-z0-9_])", message) for p in params)


def snapshot(args):
    return {t: (a.dtype, a.shape, a.tobytes()) for t, a in leaves(args).items() if isinstance(a, np.ndarray)}


def changed(before, args, skip=()):
    now = snapshot(args)
    return [t for t, s in before.items() if t[0] not in skip and (t not in now or now[t] != s)]


# -- the parent's side: counting verdicts; one worker process, restarted after a crash or a hang --
def run_cases(worker, counts, cases) -> list[str]:
    """Run ``cases`` in ``worker`` and add up their verdicts in ``counts`` (both tiers: the ops'
    and the surfaces'); returns the failures as printable lines."""
    failures = []
    for case in cases:
        verdict = worker.run(case)
        counts["cases"] += 1
        if verdict.get("na"):
            counts["not applicable"] += 1
            continue
        for key, flag in (
            ("crashes", "crash"),
            ("hangs", "hang"),
            ("wrong results", "wrong"),
            ("judged by the model", "model"),
            ("beyond float32 (not compared)", "beyond"),
        ):
            counts[key] += bool(verdict.get(flag))
        for out in verdict["outcomes"].values():
            counts["calls"] += 1
            counts[{"ok": "results", "error": "errors", "na": "not expressible"}[out[0]]] += 1
        outs = [o for o in verdict["outcomes"].values() if o[0] != "na"]
        if verdict["problems"]:
            counts["failed"] += 1
            seed = case[1] if not isinstance(case[1], dict) else "explicit"
            failures.append(f"{case[0]} {case[2]!r} (seed {seed}):")
            failures += ["    " + p.replace("\n", "\n    ") for p in verdict["problems"]]
        elif outs and all(o[0] == "error" for o in outs):
            counts["clean errors"] += 1
            counts["of them out of memory (AllocationError)"] += any(o[1] == "AllocationError" for o in outs)
            counts["errors naming the mutated argument"] += bool(verdict.get("named_target"))
        elif outs:
            counts["equal results"] += 1
    return failures


class Worker:
    """Runs cases in ``hostile_worker.py``; a crash or a hang ends that process only."""

    def __init__(self, timeout: float = 120.0):
        self.timeout = timeout
        self.proc = None
        self._buf = b""
        self._err = None

    def _start(self):
        import os
        import subprocess
        import sys
        import tempfile

        here = os.path.dirname(os.path.abspath(__file__))
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(here, "hostile_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
        )
        self._buf = b""

    def _stderr_tail(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")[-1500:]

    def run(self, case) -> dict:
        import base64
        import os
        import pickle
        import select
        import time

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        line = base64.b64encode(pickle.dumps(case)) + b"\n"
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died(case)
        deadline = time.monotonic() + self.timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                row, self._buf = self._buf.split(b"\n", 1)
                if row.startswith(b"@@hostile@@ "):
                    return pickle.loads(base64.b64decode(row.split(b" ", 1)[1]))
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                return dict(outcomes={}, problems=[f"hang: no answer in {self.timeout:.0f} s"], na=None, hang=True)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return self._died(case)
                self._buf += chunk

    def _died(self, case) -> dict:
        rc = self.proc.wait()
        tail = self._stderr_tail()
        self.proc = None
        return dict(outcomes={}, problems=[f"crash: the worker died (exit status {rc})\n{tail}"], na=None, crash=True)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.proc.kill()
        self.proc = None
