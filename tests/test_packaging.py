"""The package as a user installs it: version, license, changelog, extras, and no
shadowing of the installed package by a clone's folder."""

import importlib.metadata
import os
import re
import shutil
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


def test_license_file_is_the_bsd_3_clause_text():
    """The metadata carries LICENSE as its License-File (setuptools includes it by default; checked on
    a built package below), not PEP 639's fields, which setuptools before 77 rejects."""
    assert "license" not in PYPROJECT and "license-files" not in PYPROJECT
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
    assert not any(c.startswith("License ::") for c in PYPROJECT["classifiers"])  # deprecated by setuptools 77


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


def _pinned(name: str) -> dict:
    """``{package: version}`` pinned by ``requirements/<name>``, following its ``-r`` includes."""
    pins = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        line = line.split("#")[0].split(";")[0].strip()  # an environment marker does not change the pin
        if line.startswith("-r "):
            pins.update(_pinned(line[3:].strip()))
        elif line:
            package, version = line.split("==")
            pins[package.lower()] = version
    return pins


@pytest.mark.parametrize(
    ("extra", "requirements"), [("sim", "sim.txt"), ("test", "test.txt"), ("compile", "compile.txt")]
)
def test_each_extra_is_pinned_by_its_requirements_file(extra, requirements):
    """The README's commands install ``requirements/<file>`` with the extra: every package the extra
    names has its version pinned there (so the extra says what is needed and the file which version)."""
    pins = _pinned(requirements)
    names = {re.split(r"[<>=\[ ]", r)[0].lower() for r in PYPROJECT["optional-dependencies"][extra]}
    assert not names - set(pins), (
        f"[{extra}] names {sorted(names - set(pins))} that requirements/{requirements} does not pin"
    )


def test_the_run_requirements_are_the_runtime_dependencies_only():
    runtime = {re.split(r"[<>= ]", r)[0].lower() for r in PYPROJECT["dependencies"]}
    assert set(_pinned("run.txt")) == runtime


def test_the_test_requirements_leave_the_compile_only_wheels_to_their_own_tier():
    assert not {p for p in _pinned("test.txt") if p.startswith("nvidia-")}
    assert {"nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvrtc-cu12"} <= set(_pinned("compile.txt"))


def test_a_missing_compile_tier_skips_with_the_install_or_fails_where_required(monkeypatch):
    from harness import compile_tier_missing

    monkeypatch.delenv("EMBNUM_REQUIRE_COMPILE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="requirements/compile.txt"):
        compile_tier_missing("ptxas is not installed")
    monkeypatch.setenv("EMBNUM_REQUIRE_COMPILE", "1")
    with pytest.raises(pytest.fail.Exception, match="EMBNUM_REQUIRE_COMPILE is set but ptxas is not installed"):
        compile_tier_missing("ptxas is not installed")


def test_the_readme_describes_the_ci_that_runs():
    """The README's commands are the ones .ci/run runs, with the tiers it adds."""
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    for line in (
        "python -m pip install --quiet -r requirements/run.txt -e . && python -m embnum tour",
        "python -m pytest --nbmake -p no:cacheprovider -n 2 --dist loadfile",
    ):
        assert (
            line in ci
            and line.replace("python -m pip install --quiet", "python3 -m pip install").replace(
                "python -m", "python3 -m"
            )
            in readme
        ), line
    assert 'python3 -m pip install -r requirements/test.txt -e ".[test]"' in readme
    assert '-r requirements/test.txt -r requirements/compile.txt -e ".[test]"' in ci
    for words in (
        "requirements/compile.txt",
        "requirements/torchrec.txt",
        "EMBNUM_REQUIRE_COMPILE=1",
        "requirements/sim.txt",
        "requirements/compat.txt",
        "lint-imports",
        "check_wide_tables.py",
    ):
        assert words in ci and words in readme, words


def _project_copy(tmp_path: Path) -> Path:
    """What a build reads (no build outputs of the clone leak into it)."""
    src = tmp_path / "project"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return src


def _build_sdist(project: Path, out: Path, env=None) -> tuple[str, Path]:
    """(the setuptools module's file, sdist path): the build backend's own hook, no isolation, no network."""
    code = (
        "import sys, setuptools; from setuptools import build_meta as b; "
        "name = b.build_sdist(sys.argv[1]); print('@@', setuptools.__file__, name)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("@@ ")]  # the build logs to stdout
    _, setuptools_file, name = line.split()
    return setuptools_file, out / name


def _bundled_setuptools() -> Path | None:
    """The setuptools wheel older Pythons bundle for ensurepip (65.5 with Python 3.10 and 3.11)."""
    import ensurepip

    folder = Path(ensurepip.__file__).parent / "_bundled"
    wheels = sorted(folder.glob("setuptools-*.whl")) if folder.is_dir() else []
    return wheels[0] if wheels else None


def test_install_from_the_sdist_with_no_registry_and_no_build_isolation(tmp_path):
    """A GPU machine with no package registry installs with the setuptools it has:
    ``pip install --no-build-isolation --no-index --no-deps`` from the sdist (which builds the wheel)."""
    _, sdist = _build_sdist(_project_copy(tmp_path), tmp_path)
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index", "--no-deps"]
    done = subprocess.run(
        [*cmd, "--target", str(target), str(sdist)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (target / "embnum" / "cuda" / "kernels").is_dir() and (target / "embnum" / "py.typed").is_file()
    (meta,) = target.glob("embnum-*.dist-info/METADATA")
    text = meta.read_text()
    assert f"Version: {embnum.__version__}" in text and "License-File: LICENSE" in text
    assert list(target.glob("embnum-*.dist-info/licenses/LICENSE")) or list(target.glob("embnum-*.dist-info/LICENSE"))


def test_an_older_setuptools_builds_the_project(tmp_path):
    """The lower bound in ``[build-system]`` is true: the setuptools bundled with Python 3.11
    (65.5, below 77 where PEP 639's license fields begin) validates the metadata and builds the sdist."""
    wheel = _bundled_setuptools()
    if wheel is None:
        pytest.skip(f"this Python ({sys.version.split()[0]}) bundles no setuptools wheel to build with")
    env = dict(os.environ, PYTHONPATH=str(wheel))
    used, sdist = _build_sdist(_project_copy(tmp_path), tmp_path, env=env)
    assert used.startswith(str(wheel)), used  # the old setuptools built it, not the environment's
    version = wheel.name.split("-")[1]
    bound = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    (low,) = [r.split(">=")[1] for r in bound if r.startswith("setuptools")]
    as_tuple = lambda v: tuple(int(p) for p in v.split(".")[:2])  # noqa: E731
    assert as_tuple(low) <= as_tuple(version) < (77, 0), (low, version)
    assert sdist.is_file() and sdist.name == f"embnum-{embnum.__version__}.tar.gz"


def test_every_extra_with_numba_cuda_requires_the_launch_without_per_argument_syncs():
    """numba-cuda before 0.25 took CuPy arrays through ``__cuda_array_interface__`` and synchronised
    the exporter's stream for every array argument of every launch; 0.25 takes them through DLPack
    (docs/gpu.md)."""
    named = {e: r for e, reqs in PYPROJECT["optional-dependencies"].items() for r in reqs if r.startswith("numba-cuda")}
    assert {"cuda12", "cuda13", "sim", "test"} <= set(named)
    for extra, req in named.items():
        low = tuple(int(p) for p in req.split(">=")[1].split("."))
        assert low >= (0, 25), (extra, req)
