"""Run TorchRec's own unit-test modules against an installed TorchRec, and compare two runs.

TorchRec's wheels ship without their ``tests`` directories, so the tests come from a TorchRec
source checkout (``--source``: a directory holding ``torchrec/``). For each run the tool builds an
overlay outside the source: the installed ``torchrec`` package of the chosen interpreter as
symbolic links, with the checkout's ``tests`` directories copied in, and puts it first on
``PYTHONPATH``. The tests then import the installed release (not the checkout's code), and the
processes they spawn (``torch.multiprocessing``, gloo workers) find the same tree.

The modules of each directory run in one pytest process (importing TorchRec costs tens of seconds)
under a time limit (a directory that passes it is recorded as ``timeout``; the tests it finished
keep their statuses). Per-test outcomes are streamed
to a file by this module's pytest hooks (loaded with ``-p torchrec_suite``), so a killed module
loses nothing already reported.

    python tools/torchrec_suite.py run --source /work/trsrc --python /work/venv/bin/python \\
        --out with-fbgemm.json
    EMBNUM_FBGEMM_COMPAT=1 python tools/torchrec_suite.py run --source /work/trsrc \\
        --python /work/venv-nofbgemm/bin/python --out stand-in.json
    python tools/torchrec_suite.py diff with-fbgemm.json stand-in.json

``--pythonpath`` adds directories after the overlay (for example an embnum checkout's ``src``).
The environment variables of the caller pass through (``EMBNUM_FBGEMM_COMPAT`` included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The test modules run by default (paths under the source's torchrec/). The distributed ones are
# those that run on CPU with gloo or in one process; the others need GPUs (NCCL, CUDA tensors).
MODULES = [
    "sparse/tests/test_jagged_tensor.py",
    "sparse/tests/test_jagged_tensor_validator.py",
    "sparse/tests/test_keyed_jagged_tensor.py",
    "sparse/tests/test_keyed_tensor.py",
    "sparse/tests/test_tensor_dict.py",
    "modules/tests/test_activation.py",
    "modules/tests/test_crossnet.py",
    "modules/tests/test_deepfm.py",
    "modules/tests/test_embedding_modules.py",
    "modules/tests/test_feature_processor.py",
    "modules/tests/test_feature_processor_.py",
    "modules/tests/test_fp_embedding_modules.py",
    "modules/tests/test_fused_embedding_modules.py",
    "modules/tests/test_hash_mc_evictions.py",
    "modules/tests/test_hash_mc_metrics.py",
    "modules/tests/test_hash_mc_modules.py",
    "modules/tests/test_itep_embedding_modules.py",
    "modules/tests/test_keyed_jagged_tensor_pool.py",
    "modules/tests/test_kjt_pool_lookup.py",
    "modules/tests/test_lazy_extension.py",
    "modules/tests/test_mc_embedding_modules.py",
    "modules/tests/test_mc_modules.py",
    "modules/tests/test_mlp.py",
    "modules/tests/test_regroup.py",
    "modules/tests/test_tensor_pool.py",
    "quant/tests/test_embedding_modules.py",
    "quant/tests/test_quant_utils.py",
    "quant/tests/test_tensor_types.py",
    "inference/tests/test_inference.py",
]
DISTRIBUTED = [
    "distributed/tests/test_awaitable.py",
    "distributed/tests/test_lazy_awaitable.py",
    "distributed/tests/test_embedding_sharding.py",
    "distributed/tests/test_embedding_types.py",
    "distributed/tests/test_fbgemm_qcomm_codec.py",
    "distributed/tests/test_sharding_plan.py",
    "distributed/tests/test_utils.py",
    "distributed/tests/test_dist_data.py",
]
# CPU-runnable but long (DistributedModelParallel on gloo over Hypothesis-drawn sharding plans: more
# than 15 minutes with fbgemm on a 2-core machine); run it by naming it
SLOW = ["distributed/tests/test_model_parallel_gloo.py"]

_LOG_VAR = "TORCHREC_SUITE_LOG"


# ---- pytest hooks (active when pytest loads this module with -p torchrec_suite) ----


def pytest_runtest_logreport(report):
    """Append one line per finished phase that decides a test's status."""
    path = os.environ.get(_LOG_VAR)
    if not path:
        return
    status = None
    if report.when == "call":
        status = report.outcome
        if hasattr(report, "wasxfail"):
            status = "xpassed" if report.passed else "xfailed"
    elif report.failed:
        status = "error"  # setup or teardown raised
    elif report.skipped:
        status = "skipped"
    if status is None:
        return
    reason = ""
    if status == "skipped" and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
    elif status in ("failed", "error"):
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = crash.message.splitlines()[0] if crash is not None and crash.message else ""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": report.nodeid, "status": status, "reason": reason[:300]}) + "\n")


def pytest_collectreport(report):
    path = os.environ.get(_LOG_VAR)
    if path and report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": report.nodeid, "status": "collect-error", "reason": message[:300]}) + "\n")


# ---- the runner ----


def installed_torchrec(python: str, env: dict) -> Path:
    """The directory of the ``torchrec`` package that ``python`` imports (without importing it)."""
    code = "import importlib.util; print(importlib.util.find_spec('torchrec').submodule_search_locations[0])"
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def build_overlay(installed: Path, source: Path, into: Path) -> Path:
    """``into``/torchrec: the installed package as links, plus every ``tests`` directory of the source."""
    root = into / "torchrec"
    for dirpath, dirnames, filenames in os.walk(installed):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        target = root / Path(dirpath).relative_to(installed)
        target.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            (target / name).symlink_to(Path(dirpath) / name)
    for tests in sorted((source / "torchrec").rglob("tests")):
        if tests.is_dir() and "tests" not in tests.relative_to(source).parts[:-1]:
            shutil.copytree(tests, root / tests.relative_to(source / "torchrec"), dirs_exist_ok=True)
    (into / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return root


def run_group(
    python: str, overlay: Path, modules: list[str], env: dict, timeout: float
) -> tuple[list[dict], float, str]:
    """Run ``modules`` in one pytest process (TorchRec's import alone takes tens of seconds)."""
    log = overlay.parent / "results.jsonl"
    log.unlink(missing_ok=True)
    cmd = [
        python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "torchrec_suite",
        "-q",
        "--continue-on-collection-errors",
    ]
    cmd += ["-c", str(overlay.parent / "pytest.ini"), "--rootdir", str(overlay.parent)]
    cmd += [str(overlay / module) for module in modules]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, env={**env, _LOG_VAR: str(log)}, cwd=overlay.parent, capture_output=True, text=True, timeout=timeout
        )
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        state = f"exit {proc.returncode}: {tail[0][:200]}"
    except subprocess.TimeoutExpired:
        state = "timeout"
    seconds = time.monotonic() - start
    rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
    for row in rows:
        row["test"] = row["test"].removeprefix("torchrec/")
    return rows, seconds, state


def run(args) -> None:
    source = Path(args.source).resolve()
    modules = args.modules or (MODULES + DISTRIBUTED)
    installed = installed_torchrec(args.python, {**os.environ, "PYTHONPATH": os.pathsep.join(args.pythonpath)})
    results: dict = {"python": args.python, "source": str(source), "installed": str(installed), "modules": {}}
    results["env"] = {k: os.environ[k] for k in ("EMBNUM_FBGEMM_COMPAT",) if k in os.environ}
    groups: dict[str, list[str]] = {}
    for module in modules:  # one process per directory
        groups.setdefault(module.rpartition("/")[0], []).append(module)
    with tempfile.TemporaryDirectory(prefix="torchrec-suite-") as tmp:
        overlay = build_overlay(installed, source, Path(tmp))
        paths = [str(Path(tmp)), str(Path(__file__).resolve().parent), *args.pythonpath]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        for group, members in groups.items():
            rows, seconds, state = run_group(args.python, overlay, members, env, args.timeout)
            results["modules"][group] = {
                "seconds": round(seconds, 1),
                "state": state,
                "modules": members,
                "tests": rows,
            }
            counts: dict[str, int] = {}
            for row in rows:
                counts[row["status"]] = counts.get(row["status"], 0) + 1
            print(f"{group} ({len(members)} modules): {seconds:.0f} s, {state[:70]}, {counts}", flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1), encoding="utf-8")


# a test reported more than once (unittest subTest) takes its worst status
_RANK = {"skipped": 0, "xfailed": 1, "passed": 1, "xpassed": 2, "failed": 3, "error": 4, "collect-error": 5}


def statuses(path: str) -> tuple[dict, dict]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    tests: dict = {}
    for module, entry in data["modules"].items():
        for row in entry["tests"]:
            seen = tests.get(row["test"])
            if seen is None or _RANK[row["status"]] > _RANK[seen[0]]:
                tests[row["test"]] = (row["status"], row["reason"])
        if entry["state"] == "timeout":
            tests.setdefault(f"{module}/ (tests not reached)", ("timeout", ""))
    return tests, data["modules"]


def diff(args) -> None:
    """Print a Markdown table of every test whose status differs between the two runs."""
    a, a_modules = statuses(args.first)
    b, b_modules = statuses(args.second)
    print(f"| test | {args.names[0]} | {args.names[1]} | reason ({args.names[1]}) |")
    print("| --- | --- | --- | --- |")
    differing = 0
    for test in sorted(set(a) | set(b)):
        sa, sb = a.get(test, ("absent", "")), b.get(test, ("absent", ""))
        if sa[0] != sb[0]:
            differing += 1
            reason = (sb[1] or sa[1]).replace("|", "/").replace("\n", " ")[:160]
            print(f"| `{test}` | {sa[0]} | {sb[0]} | {reason} |")
    print()
    for name, tests, mods in zip(args.names, (a, b), (a_modules, b_modules)):
        total: dict[str, int] = {}
        for status, _ in tests.values():
            total[status] = total.get(status, 0) + 1
        seconds = sum(entry["seconds"] for entry in mods.values())
        print(f"{name}: {len(mods)} modules, {seconds:.0f} s, {dict(sorted(total.items()))}")
    print(f"differences: {differing}")


def merge(args) -> None:
    """One result file from several: a later file's results replace an earlier one's for each test module
    it ran (for example a module rerun after a fix)."""
    merged: dict = {"merged_from": args.inputs, "modules": {}}
    for path in args.inputs:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        for entry in data["modules"].values():
            for module in entry.get("modules", []):
                rows = [r for r in entry["tests"] if r["test"].split("::")[0] == module]
                if entry["state"] == "timeout" and not rows:
                    continue  # not reached: keep what an earlier file has
                merged["modules"][module] = {
                    "seconds": 0.0,
                    "state": "group timed out after it" if entry["state"] == "timeout" else entry["state"],
                    "modules": [module],
                    "tests": rows,
                }
    Path(args.out).write_text(json.dumps(merged, indent=1), encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the test modules, write per-test statuses as JSON")
    r.add_argument("--source", required=True, help="a TorchRec source checkout (holds torchrec/)")
    r.add_argument("--python", default=sys.executable, help="the interpreter whose torchrec is tested")
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=float, default=900, help="seconds per directory (one pytest process each)")
    r.add_argument("--pythonpath", action="append", default=[], help="a directory to add after the overlay")
    r.add_argument("modules", nargs="*", help="test modules under torchrec/ (default: MODULES + DISTRIBUTED)")
    d = sub.add_parser("diff", help="the tests whose statuses differ between two runs")
    d.add_argument("first")
    d.add_argument("second")
    d.add_argument("--names", nargs=2, default=["with fbgemm", "stand-in"])
    m = sub.add_parser("merge", help="combine result files (later ones replace earlier ones per module)")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+")
    args = parser.parse_args(argv)
    {"run": run, "diff": diff, "merge": merge}[args.command](args)


if __name__ == "__main__":
    main()
