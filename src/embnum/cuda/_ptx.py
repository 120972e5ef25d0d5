"""Compile every Numba-CUDA kernel for the GPU without one: NVVM to PTX, ``ptxas`` to machine code.

Numba's CUDA simulator runs kernels as Python threads and never types them,
so code the real compiler rejects passes it. This module closes that gap:

* :func:`kernels` names every kernel of ``embnum.cuda`` (``"tbe._forward_none"``,
  ``"jagged._SEGMENT_SUM[float32]"`` for kernels kept in a dict);
* :func:`signature_of` turns the arguments of a launch into a Numba signature
  string (``"float32[::1], int64"``); the test suite records every launch it
  makes under the simulator, and compiles any signature missing from
  ``tests/cuda_signatures.txt`` at the end of the session (``tests/conftest.py``);
* :func:`compile_all` compiles each ``(kernel, signature)`` to PTX for a compute
  capability with ``numba.cuda.compile_ptx`` (NVVM and libdevice from the
  ``nvidia-cuda-nvcc-cu12`` wheel; with the kernel's own launch bounds, which
  cap its registers) and assembles it with ``ptxas -v``, returning
  registers, spills, stack and shared memory per kernel.

Run ``python -m embnum.cuda._ptx tests/cuda_signatures.txt`` (exit status 1 on
any failure; ``--table`` prints the markdown table of ``benchmarks/RESULTS.md``).
It must run without the simulator: it switches it off for itself.

A ``device=True`` function that a kernel calls is compiled by Numba for
``get_current_device()``, which needs a driver; the compiling process replaces
that lookup with the compute capability being compiled for (one process per
capability, so device functions are never shared between two).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MODULES = ("_common", "_tbe_vbe", "index_select", "jagged", "keyed_tensor", "kjt", "quant", "tbe", "tbe_quantized")
CCS = ((9, 0), (8, 0))
CACHE = Path(os.environ.get("EMBNUM_PTX_CACHE", Path.home() / ".cache" / "embnum-ptx"))


# -- naming kernels -----------------------------------------------------------------
def _is_kernel(obj) -> bool:
    if not hasattr(obj, "py_func"):
        return False
    if hasattr(obj, "targetoptions"):  # numba.cuda.dispatcher.CUDADispatcher
        return not obj.targetoptions.get("device", False)
    return hasattr(obj, "_device") and not obj._device  # the simulator's FakeCUDAKernel


def kernels() -> dict[str, object]:
    """Every kernel of ``embnum.cuda``, by ``"<module>.<global>"`` (``"[key]"`` for dict entries)."""
    found = {}
    for mod in MODULES:
        m = importlib.import_module(f"embnum.cuda.{mod}")
        for name, obj in vars(m).items():
            if _is_kernel(obj) and obj.py_func.__module__ == m.__name__:
                found[f"{mod}.{name}"] = obj
            elif isinstance(obj, dict):
                for key, k in obj.items():
                    if _is_kernel(k) and k.py_func.__module__ == m.__name__:
                        found[f"{mod}.{name}[{key}]"] = k
    return found


# -- signatures -------------------------------------------------------------------------
def _type_string(t) -> str:
    from numba.core import types

    if isinstance(t, types.Array):
        dt = "boolean" if t.dtype == types.boolean else str(t.dtype)
        dims = [":"] * t.ndim
        if t.layout == "C":
            dims[-1] = "::1"
        elif t.layout == "F":
            dims[0] = "::1"
        return f"{dt}[{', '.join(dims)}]"
    if isinstance(t, types.UniTuple):
        return f"UniTuple({_type_string(t.dtype)}, {t.count})"
    if isinstance(t, types.BaseTuple):
        return f"Tuple({', '.join(_type_string(x) for x in t.types)})"
    if t == types.boolean:
        return "boolean"
    if isinstance(t, types.Number):
        return str(t)
    raise TypeError(f"no signature string for the argument type {t}")


def signature_of(args) -> str:
    """Numba argument types of a launch as a string (read-only NumPy arrays count as writable,
    as CuPy arrays are)."""
    import numba

    return ", ".join(_type_string(numba.typeof(a)) for a in args)


def parse_signature(text: str) -> tuple:
    """The argument types of a :func:`signature_of` string."""
    from numba.core import types

    ns = {str(t): t for t in types.number_domain}
    ns["float16"] = types.float16
    ns["boolean"] = types.boolean
    ns["UniTuple"] = types.UniTuple
    ns["Tuple"] = lambda *ts: types.Tuple(ts)
    return eval(f"({text},)", {"__builtins__": {}}, ns)  # noqa: S307 - our own file's grammar


def read_signatures(path) -> list[tuple[str, str]]:
    """``(kernel, signature)`` pairs of a file with lines ``kernel(signature)``."""
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, rest = line.partition("(")
            out.append((name, rest[:-1]))
    return out


def format_signatures(pairs) -> str:
    head = (
        "# Every (kernel, argument signature) the ops launch, recorded from the cuda tests under the\n"
        "# simulator (EMBNUM_RECORD_SIGNATURES=1 pytest ... adds new ones); compiled for sm_90 and sm_80\n"
        "# in CI by `python -m embnum.cuda._ptx tests/cuda_signatures.txt`.\n"
    )
    return head + "".join(f"{k}({s})\n" for k, s in sorted(set(pairs)))


# -- compiling ------------------------------------------------------------------------------------
def ptxas() -> str:
    """Path of ``ptxas`` (the ``nvidia-cuda-nvcc-cu12`` wheel's, else the one on PATH)."""
    try:
        import nvidia.cuda_nvcc

        p = Path(next(iter(nvidia.cuda_nvcc.__path__))) / "bin" / "ptxas"
        if p.exists():
            return str(p)
    except ImportError:
        pass
    found = shutil.which("ptxas")
    if found is None:
        raise RuntimeError("ptxas not found: install nvidia-cuda-nvcc-cu12 (requirements/compile.txt)")
    return found


_INFO = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def assemble(ptx: str, arch: str, name: str = "kernel") -> dict[str, dict]:
    """Assemble PTX with ``ptxas -arch=<arch> -v``; per entry function: registers, stack frame,
    spill stores/loads and static shared memory (bytes). ``-c`` (relocatable) when the PTX
    calls external functions (Numba's float16 arithmetic is a call into a C++ shim that is
    linked at load time). Raises ``RuntimeError`` with ptxas' log on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.ptx"
        src.write_text(ptx)
        cmd = [ptxas(), f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "out.cubin")]
        if re.search(r"^\.extern \.func", ptx, re.M):
            cmd.insert(1, "-c")
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"ptxas {arch} failed on {name}:\n{run.stderr.strip()}")
    found = {}
    for chunk in run.stderr.split("Compiling entry function '")[1:]:
        entry = chunk[: chunk.index("'")]
        props = chunk[chunk.find(f"Function properties for {entry}") :]
        regs, frame, smem = _INFO.search(chunk), _FRAME.search(props), _SMEM.search(chunk[chunk.find("Used ") :])
        found[entry] = dict(
            registers=int(regs.group(1)) if regs else 0,
            stack=int(frame.group(1)) if frame else 0,
            spill_stores=int(frame.group(2)) if frame else 0,
            spill_loads=int(frame.group(3)) if frame else 0,
            smem=int(smem.group(1)) if smem else 0,
        )
    if not found:
        raise RuntimeError(f"ptxas {arch} reported no entry function for {name}:\n{run.stderr.strip()}")
    return found


@functools.cache
def _source_hash(kernel_name: str) -> str:
    """Hash of the sources kernel ``kernel_name`` can depend on: its module, ``cuda/_common.py`` and
    the modules they import from (``embnum/_*.py``, sibling cuda modules): the cache key's code part."""
    import numba_cuda

    root = Path(__file__).resolve().parent.parent
    module = root / "cuda" / f"{kernel_name.split('.')[0]}.py"
    files = [module, root / "cuda" / "_common.py"]
    for src in files:  # grows as imports are found: the transitive closure
        text = src.read_text() if src.exists() else ""
        for names in re.findall(r"^from \.\. import ([\w, ]+)$", text, re.M):  # from .. import _half, _qrow
            files += [root / f"{n.strip()}.py" for n in names.split(",")]
        files += [root / f"{n}.py" for n in re.findall(r"^from \.\.(_\w+) import", text, re.M)]
        files += [root / "cuda" / f"{n}.py" for n in re.findall(r"^from \.(\w+) import", text, re.M)]
        files += [src.parent / f"{n}.py" for n in re.findall(r"^from \.(_\w+) import", text, re.M)]
        seen = set()
        files[:] = [f for f in files if not (f in seen or seen.add(f))]
    h = hashlib.sha256(getattr(numba_cuda, "__version__", "?").encode())
    for p in files:
        if p.exists():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:24]


def _compile_one(py_func, sig: str, cc, launch_bounds=None) -> dict:
    from numba import cuda

    ptx, _ = cuda.compile_ptx(py_func, parse_signature(sig), cc=cc, launch_bounds=launch_bounds)
    (stats,) = assemble(ptx, f"sm_{cc[0]}{cc[1]}", py_func.__name__).values()
    return stats


def _py_func(name: str, table: dict):
    """The Python function of kernel ``name``: an embnum kernel, or ``path/to/file.py:function``
    (a plain function in a file, as the tests' deliberately broken kernel)."""
    if name in table:
        return table[name].py_func
    if ".py:" in name:
        import importlib.util

        path, _, func = name.rpartition(":")
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return getattr(mod, func)
    raise KeyError(f"no kernel named {name} in embnum.cuda")


def _worker(pairs, cc) -> list[dict]:
    """Compile ``pairs`` for ``cc`` in this (non-simulated) process."""
    import types

    import numba.cuda.dispatcher as dispatcher

    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=tuple(cc))
    cc = tuple(cc)
    table = kernels()
    out = []
    for name, sig in pairs:
        key = hashlib.sha256(f"{_source_hash(name)} {name}({sig}) {cc}".encode()).hexdigest()[:32]
        cache = CACHE / f"{key}.json"
        if cache.exists():
            out.append(json.loads(cache.read_text()))
            continue
        row = dict(kernel=name, signature=sig, cc=list(cc))
        try:
            bounds = table[name].targetoptions.get("launch_bounds") if name in table else None
            row.update(_compile_one(_py_func(name, table), sig, cc, bounds))
            row["error"] = None
        except Exception as e:  # noqa: BLE001 - reported, and the check fails
            row["error"] = f"{type(e).__name__}: {e}"
        if row["error"] is None and name in table:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(row))
        out.append(row)
    return out


def _subprocess_main():
    pairs, cc = json.loads(sys.stdin.read())
    json.dump(_worker(pairs, cc), sys.stdout)


def compile_all(pairs, ccs=CCS) -> list[dict]:
    """Compile every ``(kernel, signature)`` for every compute capability, one fresh
    non-simulated process per capability (run side by side). One dict per pair and
    capability: ``kernel, signature, cc, registers, stack, spill_stores, spill_loads,
    smem, error`` (``None`` when it compiled and assembled)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    code = "from embnum.cuda._ptx import _subprocess_main; _subprocess_main()"
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])

    def one(cc):
        run = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps([list(pairs), cc]), capture_output=True, text=True, env=env
        )
        if run.returncode:
            raise RuntimeError(f"the compile process for cc {cc} failed:\n{run.stderr[-4000:]}")
        return json.loads(run.stdout)

    with concurrent.futures.ThreadPoolExecutor(len(ccs)) as pool:
        return [row for rows in pool.map(one, ccs) for row in rows]


def table(rows) -> str:
    """Markdown table: one line per kernel and signature (sm_90), registers / stack / spills / smem."""
    lines = [
        "| kernel | signature | registers | stack (B) | spill st/ld (B) | shared (B) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in sorted((r for r in rows if r["cc"] == [9, 0]), key=lambda r: (r["kernel"], r["signature"])):
        if r["error"]:
            lines.append(f"| {r['kernel']} | `{r['signature']}` | FAILED | | | |")
        else:
            lines.append(
                f"| {r['kernel']} | `{r['signature']}` | {r['registers']} | {r['stack']} | "
                f"{r['spill_stores']}/{r['spill_loads']} | {r['smem']} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m embnum.cuda._ptx", description=__doc__.split("\n\n")[0])
    p.add_argument("signatures", help="file of kernel(signature) lines (tests/cuda_signatures.txt)")
    p.add_argument("--table", action="store_true", help="print the markdown table of registers and spills")
    a = p.parse_args(argv)
    pairs = read_signatures(a.signatures)
    missing = sorted(set(kernels()) - {k for k, _ in pairs})
    rows = compile_all(pairs)
    failed = [r for r in rows if r["error"]]
    for r in failed:
        print(f"FAILED {r['kernel']}({r['signature']}) sm_{r['cc'][0]}{r['cc'][1]}:\n  {r['error']}\n")
    for name in missing:
        print(f"FAILED {name}: no signature declared (run the cuda tests with EMBNUM_RECORD_SIGNATURES=1)")
    if a.table:
        print(table(rows))
    ok = len(rows) - len(failed)
    print(f"{ok}/{len(rows)} kernel compilations assembled ({len(pairs)} signatures x {len(CCS)} targets)")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
