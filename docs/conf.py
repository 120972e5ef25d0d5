"""Sphinx configuration of embnum's documentation (built in CI with -W: warnings are errors).

Pages are MyST Markdown; the notebooks are rendered by myst-nb from their committed outputs
(they are executed by the tests through nbmake, not a second time here). The API reference,
the notebook copies and the benchmark plots are generated into ``docs/generated/`` at every
build by ``_ext/embnum_docs.py`` from the op registry, the module docstrings,
``notebooks/*.ipynb`` and ``benchmarks/RESULTS.md``.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent / "src"))  # the clone's embnum, installed or not

# the cuda backend's modules import under Numba's CUDA simulator when there is no GPU
from embnum._backend import gpu_present  # noqa: E402

if not gpu_present():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import embnum  # noqa: E402

project = "embnum"
author = "the embnum authors"
copyright = "2026, the embnum authors"
release = version = embnum.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_nb",
    "embnum_docs",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_static", "_tools", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # render the committed outputs
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "furo"
html_title = f"embnum {release}"
html_static_path = ["_static"]
html_css_files = ["embnum.css"]  # wide tables wrap instead of hiding columns (docs/_tools/check_wide_tables.py)
