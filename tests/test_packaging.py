"""The package as a user installs it: version, license, changelog, extras, and no
shadowing of the installed package by a clone's folder."""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import embnum

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_version_is_written_once_and_installed_metadata_agrees():
    assert PYPROJECT["dynamic"] == ["version"] and "version" not in PYPROJECT
    assert importlib.metadata.version("embnum") == embnum.__version__


def test_license_file_is_the_bsd_3_clause_text_the_metadata_names():
    assert PYPROJECT["license"] == "BSD-3-Clause" and PYPROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Neither the name of the copyright holder nor the names of its" in text


def test_changelog_lists_the_current_version():
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[0] == "Unreleased" and embnum.__version__ in headings


def test_every_extra_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Extras") :]
    for extra in PYPROJECT["optional-dependencies"]:
        assert f"`[{extra}]`" in table, extra


def test_classifiers_name_the_supported_pythons():
    low = PYPROJECT["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {low}" in PYPROJECT["classifiers"]
    assert not any(c.startswith("License ::") for c in PYPROJECT["classifiers"])  # the SPDX expression says it


def test_a_clone_folder_does_not_shadow_the_installed_package(tmp_path):
    """Python run from the parent directory of a clone named ``embnum`` imports the installed
    package (with the src/ layout the clone's root holds no importable package; a flat layout
    made ``import embnum`` find the clone folder as a namespace package, with no ops)."""
    (tmp_path / "embnum").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import embnum; print(embnum.__file__); print(len(embnum.ops()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    file, n_ops = done.stdout.split()
    assert file != "None" and not file.startswith(str(tmp_path)), file
    assert Path(file).name == "__init__.py" and int(n_ops) > 0
