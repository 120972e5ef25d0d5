"""Stages ``pytest`` and ``report``: the clone's GPU tests and the GPU report, as child processes
with a time limit (a child that passes it is stopped; what it printed is kept)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

PER_TEST_SECONDS = 60
WORKERS = 4


def progress(out: str) -> str:
    """What pytest's progress lines (``..F.s  [ 12%]``) had reported when it was stopped."""
    marks = "".join(line.split(" [")[0] for line in out.splitlines() if re.search(r"\[\s*\d+%\]\s*$", line))
    counts = {
        name: marks.count(ch) for ch, name in ((".", "passed"), ("F", "failed"), ("E", "errors"), ("s", "skipped"))
    }
    return ", ".join(f"{n} {name}" for name, n in counts.items()) + " (progress marks)"


def _child(ctx, cmd: list, limit: float) -> tuple[int | None, str]:
    """Run ``cmd`` in the clone's root; ``(exit status or None past the limit, its output)``."""
    env = dict(os.environ)
    src = str(ctx.root / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    ctx.log("   $ " + " ".join(cmd))
    try:
        done = subprocess.run(
            cmd, cwd=ctx.root, env=env, capture_output=True, text=True, timeout=limit, start_new_session=True
        )
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out


def pytest_stage(ctx, limit) -> tuple[str, str]:
    if ctx.root is None:
        return "skipped", "tests/ not found: run from a clone"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rfE", "tests"]
    has_timeout = importlib.util.find_spec("pytest_timeout") is not None
    if has_timeout:
        cmd[4:4] = ["-p", "timeout", f"--timeout={PER_TEST_SECONDS}"]
    if not ctx.sim and importlib.util.find_spec("xdist") is not None:
        cmd[4:4] = ["-n", str(WORKERS), "--dist", "loadfile"]  # the GPU tests share the device, four at a time
    code, out = _child(ctx, cmd, limit)
    ctx.write("pytest", out[-200_000:])
    tail = [line for line in out.splitlines() if re.search(r"\b(passed|failed|skipped|deselected|error)", line)]
    last = tail[-1].strip("= ") if tail else "no summary line"
    if not has_timeout:
        last += " (no per-test timeout: pytest-timeout is not installed)"
    if code is None:
        return "FAIL", f"stopped at the {limit} s limit after {progress(out)}"
    # 5: no test collected (the simulator deselects every gpu test's GPU flavour)
    return ("ok" if code in (0, 5) else "FAIL"), last


def report_stage(ctx, limit) -> tuple[str, str]:
    if ctx.root is None:
        return "skipped", "benchmarks/ not found: run from a clone"
    out = ctx.out / "5-gpu-report.md"
    cmd = [sys.executable, str(ctx.root / "benchmarks" / "gpu_report.py"), "--out", str(out)]
    if ctx.sim:  # the TBE rows only: the whole report takes minutes in the simulator
        cmd += ["--tiny", "--repeats", "1", "--op", "tbe_forward", "--op", "tbe_backward_update"]
    else:
        cmd += ["--repeats", "5"]
    code, text = _child(ctx, cmd, limit)
    ctx.log(text[-20_000:])
    if not out.exists():
        out.write_text("# embnum GPU report\n\nnot written: the report stopped before its end.\n\n" + text[-20_000:])
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and not line.startswith("| op ")]
    errors = [r for r in rows if "ERROR" in r]
    if code is None:
        return "FAIL", f"stopped at the {limit} s limit"
    line = f"{len(rows)} rows, {len(errors)} errors"
    return ("ok" if code == 0 and not errors else "FAIL"), line
