"""The test command's progress report (tests/progress.py): a line per finished file with its
outcomes, a line for a file skipped whole, and the skips counted by reason, in one process and
under pytest-xdist; passes and skips print no dot."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FILES = {
    "test_a.py": "import pytest\ndef test_ok():\n    pass\ndef test_skip():\n    pytest.skip('no widget here')\n",
    "test_b.py": "import pytest\npytest.skip('whole file off', allow_module_level=True)\n",
    "test_c.py": (
        "import pytest\n@pytest.mark.parametrize('i', range(4))\ndef test_p(i):\n"
        "    if i:\n        pytest.skip('no widget here')\n"
        "@pytest.mark.xfail(reason='known')\ndef test_x():\n    assert False\n"
    ),
}


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadfile"]], ids=["one process", "xdist"])
def test_a_line_per_file_and_the_skips_by_reason(tmp_path, workers):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    args = [sys.executable, "-m", "pytest", "-p", "progress", "-p", "no:cacheprovider", "-p", "no:randomly", *workers]
    run = subprocess.run([*args, "."], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert re.search(r"^\[ *\d+:\d\d\] +\d/3 +test_a\.py +\d+\.\d s  1 passed, 1 skipped$", out, re.M), out
    assert re.search(r"^\[ *\d+:\d\d\] +\d/3 +test_c\.py +\d+\.\d s  1 passed, 3 skipped, 1 xfailed$", out, re.M), out
    assert re.search(r"^\[ *\d+:\d\d\] +\d/3 +test_b\.py +skipped: whole file off$", out, re.M), out
    summary = out[out.index("skipped: 5, by reason") :]
    assert re.search(r"^ +4  no widget here$", summary, re.M) and re.search(r"^ +1  whole file off$", summary, re.M)
    assert not re.search(r"^[.s]+$", out, re.M)  # no dots


def test_a_failure_keeps_its_letter_and_the_file_line_its_own_line(tmp_path):
    (tmp_path / "test_f.py").write_text("def test_ok():\n    pass\ndef test_bad():\n    assert 1 == 2\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
    args = [sys.executable, "-m", "pytest", "-p", "progress", "-p", "no:cacheprovider", "."]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert re.search(r"^F$", run.stdout, re.M), run.stdout
    assert re.search(r"^\[ *\d+:\d\d\] +1/1 +test_f\.py +\d+\.\d s  1 passed, 1 failed$", run.stdout, re.M), run.stdout
