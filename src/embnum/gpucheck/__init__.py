"""``python -m embnum gpu-check --out DIR``: the one command to run when a GPU is lent.

Stages, in order, each with its own time limit (together under the 8 minutes budgeted for an H100
with cold caches; not yet run on a GPU), each recorded whatever the others do:

1. ``versions``: Python, embnum, NumPy, Numba, numba-cuda, CuPy, torch, setuptools, the device;
2. ``compile``: every kernel signature of ``tests/cuda_signatures.txt`` compiled once into Numba's
   disk cache, in parallel processes (the cache is safe with concurrent writers: ``embnum._jit``),
   and every CUDA C source compiled by CuPy, so the later stages load instead of compiling;
3. ``smoke``: the first launch, stream ordering with torch's and CuPy's current streams, grids wider
   than one pass, a ``FusedTBE`` training step against the oracle, kernel-only times of the headline
   TBE cases (torch.profiler, i.e. CUPTI) and host microseconds per call;
4. ``pytest``: ``pytest -m gpu`` with a per-test timeout (where pytest-timeout is installed);
5. ``report``: ``benchmarks/gpu_report.py`` at benchmark sizes.

``--sim`` runs the same stages in Numba's CUDA simulator at tiny sizes (what has no meaning there,
such as streams and kernel times, says so); CI runs it. ``DIR`` receives at most eight files,
``0-summary.md`` first. Exit status 0 when every stage passed, 1 otherwise.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

# (stage, seconds allowed on a GPU): 10 + 100 + 100 + 120 + 140 = 470 s of the 480 s budget
LIMITS = {"versions": 10, "compile": 100, "smoke": 100, "pytest": 120, "report": 140}
FILES = {
    "summary": "0-summary.md",
    "versions": "1-versions.json",
    "compile": "2-compile.json",
    "smoke": "3-smoke.json",
    "pytest": "4-pytest.txt",
    "report": "5-gpu-report.md",
    "log": "6-log.txt",
}


@dataclass
class Context:
    """What every stage gets: the output folder, simulator or GPU, the clone's root (tests and
    benchmarks live there, not in an installed package) and the log."""

    out: Path
    sim: bool
    root: Path | None
    log_lines: list = field(default_factory=list)

    def log(self, text: str) -> None:
        print(text, flush=True)
        self.log_lines.append(text)

    def write(self, key: str, data) -> None:
        path = self.out / FILES[key]
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1, default=str) + "\n")


def clone_root() -> Path | None:
    """The clone embnum runs from (``src/embnum`` under it), or ``None`` for an installed package."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "tests" / "cuda_signatures.txt").is_file() else None


def run(out: Path, sim: bool, stages=None) -> int:
    from . import _compile, _env, _smoke, _subprocs

    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=out, sim=sim, root=clone_root())
    table = {
        "versions": _env.stage,
        "compile": _compile.stage,
        "smoke": _smoke.stage,
        "pytest": _subprocs.pytest_stage,
        "report": _subprocs.report_stage,
    }
    results = {}
    start = time.perf_counter()
    for name, fn in table.items():
        if stages and name not in stages:
            continue
        ctx.log(f"== {name} (limit {LIMITS[name]} s{', simulator' if sim else ''})")
        t0 = time.perf_counter()
        try:
            status, line = fn(ctx, LIMITS[name])
        except Exception as exc:  # noqa: BLE001 - a failing stage is recorded and the next one runs
            status, line = "FAIL", f"{type(exc).__name__}: {exc}"
            ctx.log(traceback.format_exc())
        results[name] = (status, time.perf_counter() - t0, line)
        ctx.log(f"   {status} in {results[name][1]:.1f} s: {line}")
    ctx.write("summary", summary(ctx, results, time.perf_counter() - start))
    ctx.write("log", "\n".join(ctx.log_lines) + "\n")
    return 0 if all(s != "FAIL" for s, _, _ in results.values()) else 1


def summary(ctx: Context, results: dict, total: float) -> str:
    where = "Numba's CUDA simulator (tiny sizes; times mean nothing)" if ctx.sim else "GPU"
    lines = [
        "# embnum gpu-check",
        "",
        f"- where: {where}; total {total:.0f} s",
        f"- files: {', '.join(FILES[k] for k in FILES if (ctx.out / FILES[k]).exists() or k in ('summary', 'log'))}",
        "",
        "| stage | status | seconds | what |",
        "|---|---|---|---|",
    ]
    for name, (status, seconds, line) in results.items():
        lines.append(f"| {name} | {status} | {seconds:.1f} | {line.replace('|', '/')} |")
    failed = [n for n, (s, _, _) in results.items() if s == "FAIL"]
    lines += ["", f"**{'FAILED: ' + ', '.join(failed) if failed else 'every stage passed'}**", ""]
    return "\n".join(lines)
