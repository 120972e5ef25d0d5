"""Generate the parts of embnum's documentation that must follow the code.

At every build (``builder-inited``) this writes ``docs/generated/``:

* ``api/<family>.md``: one section per registered op (``embnum.ops()``), its
  signature and docstring (autodoc), then what the registry knows: backends
  with an implementation, ``out=``, in-place arguments, gradients, the torch
  form and schema, the shapes and dtypes of the op's small tour input and
  output, and the errors every op shares. A new op appears without an edit.
* ``api/python.md``: the host helpers each family exports beside its ops, and
  every public module outside the kernel layers (``ref``, ``cpu``, ``cuda``,
  ``ops``), through autodoc: a new module or class appears without an edit.
* ``notebooks/*.ipynb``: copies of ``notebooks/`` (rendered from their
  committed outputs).
* ``benchmarks/*.png``: one plot per table of ``benchmarks/RESULTS.md`` with
  embnum, fbgemm_gpu, torch and copy-floor columns.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
import re
import shutil
import statistics
from pathlib import Path

import numpy as np

import embnum

LAYERS = ("ref", "cpu", "cuda")
HIDDEN = {"embnum.ref", "embnum.cpu", "embnum.cuda", "embnum.ops"}  # kernel layers: the op pages cover them


def setup(app):
    for name in ("sphinx.myst_parser.sphinx_ext.main", "sphinx.myst_nb.sphinx_ext"):
        logging.getLogger(name).addFilter(_no_config_dump)
    app.connect("builder-inited", generate)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


def _no_config_dump(record) -> bool:
    """Drop myst's and myst-nb's one-line dumps of their whole configuration (several kB per build);
    their warnings and errors pass."""
    return not (record.levelno <= logging.INFO and "ParserConfig(" in record.getMessage())


def generate(app) -> None:
    for warning in missing_dependencies():
        _warn(warning)
    docs = Path(app.srcdir)
    out = docs / "generated"
    shutil.rmtree(out, ignore_errors=True)
    (out / "api").mkdir(parents=True)
    families = list(dict.fromkeys(op.family for op in embnum.ops()))
    for family in families:
        _write(out / "api" / f"{family}.md", family_page(family))
    _write(out / "api" / "python.md", python_page())
    _write(out / "api" / "index.md", api_index(families))
    copy_notebooks(docs.parent / "notebooks", out / "notebooks")
    benchmark_plots(docs.parent / "benchmarks" / "RESULTS.md", out / "benchmarks")


def _warn(text: str) -> None:
    """A Sphinx warning (an error under ``-W``)."""
    from sphinx.util import logging

    logging.getLogger(__name__).warning(text, type="embnum", subtype="optional-dependency")


def missing_dependencies() -> list[str]:
    """What the reference would leave out here, one warning each (an error under ``-W``, as in
    CI): without torch the torch half of the API (its bridge, modules and distributed pages, and
    every op's torch form and schema) would be missing while the build succeeds."""
    found = []
    try:
        import torch  # noqa: F401
    except ImportError as err:
        found.append(
            f"torch is not importable ({err}): the API reference leaves out embnum.torch_bridge, embnum.modules, "
            "embnum.distributed and every op's torch form; install requirements/test.txt before building the docs"
        )
    return found


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- the op reference ------------------------------------------------------------------
def api_index(families: list[str]) -> str:
    rows = "\n".join(f"| [{f}]({f}.md) | {', '.join(f'`{op.name}`' for op in embnum.ops(f))} |" for f in families)
    toc = "\n".join(f"{f}" for f in families)
    return f"""# API reference

Generated from the op registry (`embnum.ops()`) and the module docstrings at every build.
Every op is `embnum.<name>(..., out=None, backend=None)` on NumPy or CuPy arrays and
`embnum.torch_bridge.<name>(...)` / `torch.ops.embnum.<name>` on torch tensors.

| family | ops |
| --- | --- |
{rows}

The classes and helpers beside the ops (TBE layout and optimizer, torch modules,
codecs, containers, ...) are in [Python API](python.md).

```{{toctree}}
:maxdepth: 1
:hidden:

{toc}
python
```
"""


def family_page(family: str) -> str:
    ops = embnum.ops(family)
    module = importlib.import_module(f"embnum.ops.{family}")
    intro = inspect.getdoc(module) or ""
    del intro  # the module docstring is for contributors; the family page is for users
    parts = [
        f"# {family}\n",
        f"The ops of the `{family}` family, generated from the registry. What they compute, their edge "
        f"cases and the differences from fbgemm_gpu: [the {family} family page](../../families/{family}.md).\n",
        SHARED_ERRORS,
    ]
    for op in ops:
        parts.append(op_section(op))
    return "\n".join(parts)


def _first_paragraph(text: str) -> str:
    return text.split("\n\n")[0].replace("\n", " ")


def op_section(op) -> str:
    rows = [
        ("backends", ", ".join(f"`{b}`" for b in implemented_backends(op)) or "none"),
        ("`out=`", _out_text(op)),
        ("gradient (torch)", ", ".join(f"`{a}`" for a in op.differentiable) if op.differentiable else "none"),
    ]
    torch_form, schema, bf16 = _torch_form(op)
    rows.append(("torch", torch_form))
    if bf16:
        rows.append(("bfloat16 (torch)", bf16))
    example = _example_shapes(op)
    if example:
        rows.append(("shapes of the tour's small input", example))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    schema_block = f"\n```text\ntorch.ops.embnum.{op.name}{schema}\n```\n" if schema else ""
    errors = declared_errors(op)
    error_block = (
        "Errors raised by this op's own checks (besides [the shared ones](#errors-shared-by-every-op)):\n\n"
        + "\n".join(f"- `{kind}`: {msg}" for kind, msg in errors)
        + "\n"
        if errors
        else "Errors: [the shared ones](#errors-shared-by-every-op).\n"
    )
    return f"""
(op-{op.name})=
## `{op.name}`

```{{eval-rst}}
.. autofunction:: embnum.{op.name}
```

| | |
| --- | --- |
{table}
{schema_block}
{error_block}"""


SHARED_ERRORS = """## Errors shared by every op

The argument checks run before any backend starts, so every backend raises the same error,
and a failed call writes nothing and leaves its inputs unchanged. Each message names the
argument and the offending value:

- an argument of an unsupported dtype, or an array where a list is expected (or the
  reverse): `TypeError`;
- a wrong shape, an inconsistent length or offset, a negative size: `ValueError`; an index
  out of its range: `IndexError`;
- NumPy arrays mixed with CuPy arrays: `TypeError`; `backend=` other than `"ref"`, `"cpu"`,
  `"cuda"`: `ValueError`; `"cuda"` on NumPy arrays outside the CUDA simulator: `TypeError`;
- `out=` of the wrong shape (`ValueError`) or dtype (`TypeError`), not C-contiguous and
  writable, or sharing memory with an input (`ValueError`).
"""


def declared_errors(op) -> list[tuple[str, str]]:
    """``(exception, message)`` of every ``raise`` in the op's declaration and in the helpers of
    its family module that it calls (transitively); f-string fields shown as ``...``."""
    import ast
    import textwrap

    module = importlib.import_module(op.declaration.__module__)
    tree = ast.parse(textwrap.dedent(inspect.getsource(module)))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    seen, todo, found = set(), [op.declaration.__name__], []
    while todo:
        fn = functions.get(todo.pop())
        if fn is None or fn.name in seen:
            continue
        seen.add(fn.name)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
                todo.append(node.func.id)
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                msg = _message(node.exc.args[0]) if node.exc.args else ""
                item = (node.exc.func.id, msg)
                if item not in found:
                    found.append(item)
    return found


def _message(node) -> str:
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    else:
        return "(a message built at run time)"
    return "“" + text.replace("`", "'").replace("|", "/").replace("*", "\\*") + "”"


def implemented_backends(op) -> list[str]:
    found = []
    for backend in LAYERS:
        try:
            module = importlib.import_module(f"embnum.{backend}.{op.family}")
        except ImportError:
            continue
        if hasattr(module, op.kernel_name):
            found.append(backend)
    return found


def _out_text(op) -> str:
    if op.mutates:
        return "no: writes " + ", ".join(f"`{a}`" for a in op.mutates) + " in place"
    return "yes" if op.takes_out else "no"


def _torch_form(op) -> tuple[str, str, str]:
    try:
        import torch  # noqa: F401

        from embnum import torch_bridge
        from embnum.torch_bridge._library import BRIDGES
    except ImportError:
        return "(torch not installed where these docs were built)", "", ""
    spec = BRIDGES.get(op.name)
    if spec is None or not hasattr(torch_bridge, op.name):
        return "none", "", ""
    sig = inspect.signature(getattr(torch_bridge, op.name))
    form = f"`embnum.torch_bridge.{op.name}{sig}`, `torch.ops.embnum.{op.name}`"
    schema = str(getattr(torch.ops.embnum, op.name).default._schema).split(op.name, 1)[1]
    bf16 = {
        "bits": "moved bit for bit",
        "float32": "computed in float32, rounded once",
        "uint16": "bfloat16 tensors are the uint16 bit patterns of the codec",
    }.get(spec.bf16, "")
    return form, schema, bf16


def _example_shapes(op) -> str:
    fn = getattr(op, "example_fn", None)
    if fn is None:
        return ""
    try:
        args = fn(np.random.default_rng(0), "small").args
        _, planned = op.declaration(**op.bind((), args))
    except Exception:  # noqa: BLE001 - an example the registry cannot plan is left out, not guessed
        return ""
    ins = [f"`{k}` {_describe(v)}" for k, v in args.items() if _describe(v)]
    outs = [planned] if op.returns == "array" else planned or []
    out_text = ", ".join("`None`" if o is None else f"{np.dtype(o[1])}{list(o[0])}" for o in outs)
    return ", ".join(ins) + (f" → {out_text}" if planned is not None else "")


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{list(v.shape)}"
    if isinstance(v, list) and v and all(isinstance(x, np.ndarray) for x in v):
        return "[" + ", ".join(f"{x.dtype}{list(x.shape)}" for x in v) + "]"
    return ""


# -- classes, helpers and modules ----------------------------------------------------
def python_page() -> str:
    declarations = importlib.import_module("embnum.ops")  # the package (embnum.ops is also a function)

    parts = [
        "# Python API\n",
        "Generated from the module docstrings: the helpers each family exports beside its ops, "
        "then every public module outside the kernel layers.\n",
        "## Helpers re-exported by `embnum`\n",
    ]
    for family in declarations.FAMILIES:
        for name in getattr(getattr(declarations, family), "HELPERS", ()):
            kind = "autoclass" if inspect.isclass(getattr(embnum, name)) else "autofunction"
            parts.append(f"```{{eval-rst}}\n.. {kind}:: embnum.{name}\n   :no-index:\n```\n")
    for name in public_modules():
        parts.append(f"## `{name}`\n\n```{{eval-rst}}\n.. automodule:: {name}\n```\n")
    return "\n".join(parts)


def public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(embnum.__path__, "embnum."):
        name = info.name
        if any(part.startswith("_") for part in name.split(".")):
            continue
        if name in HIDDEN or any(name.startswith(h + ".") for h in HIDDEN):
            continue
        try:
            importlib.import_module(name)
        except ImportError as err:  # an optional dependency missing where the docs are built: said, not hidden
            _warn(f"{name} is left out of the API reference: {err}")
            continue
        names.append(name)
    return names


# -- notebooks -----------------------------------------------------------------------
def copy_notebooks(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for nb in sorted(src.glob("*.ipynb")):
        shutil.copy2(nb, dst / nb.name)


# -- benchmark plots -----------------------------------------------------------------
SERIES = {"embnum cpu": "tab:blue", "embnum out=": "tab:cyan", "fbgemm cpu": "tab:red", "torch": "tab:gray"}
FLOOR = "copy floor"


def benchmark_tables(results: Path) -> list[dict]:
    """Every table of RESULTS.md with an embnum and an fbgemm column: its section, header, rows."""
    tables, section, lines = [], "", results.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: "):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            if header[:3] == ["measurement", "implementation", "ms"]:  # long form (tbe): one row per implementation
                header, rows = _pivot(rows)
            if any(h in SERIES for h in header) and "fbgemm cpu" in header:
                tables.append({"section": section, "header": header, "rows": rows})
            continue
        i += 1
    return tables


def _pivot(rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """``measurement | implementation | ms`` rows -> one row per measurement, one column per
    implementation, named as the wide tables name them (embnum cpu, fbgemm cpu, torch, copy floor)."""

    def column(impl: str) -> str:
        for prefix, name in (("embnum", "embnum cpu"), ("fbgemm", "fbgemm cpu"), ("torch", "torch"), ("copy", FLOOR)):
            if impl.lower().startswith(prefix):
                return name
        return impl

    header = ["case", "embnum cpu", "fbgemm cpu", "torch", FLOOR]
    table: dict[str, dict[str, str]] = {}
    for row in rows:
        table.setdefault(row[0], {})[column(row[1])] = row[2]
    return header, [[case] + [cells.get(h, "-") for h in header[1:]] for case, cells in table.items()]


def _numbers(cell: str) -> list[float]:
    cell = cell.split("(")[0].split("[")[0]  # "median [IQR]" cells (the interleaved harness): the median
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def benchmark_plots(results: Path, dst: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files, no display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    dst.mkdir(parents=True, exist_ok=True)
    written, seen = [], {}
    for table in benchmark_tables(results):
        header, rows = table["header"], table["rows"]
        label_cols = [k for k, h in enumerate(header) if h in ("family", "op", "case", "input")][:2]
        series = [h for h in header if h in SERIES or h == FLOOR]
        slug = re.sub(r"[^a-z0-9]+", "_", table["section"].lower()).strip("_")[:40] or "results"
        seen[slug] = seen.get(slug, 0) + 1
        name = f"{slug}_{seen[slug]}.png"
        fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) * max(1, len(series) / 2.5) + 1.4), layout="constrained")
        height = 0.8 / max(1, len(series))
        for s, col in enumerate(series):
            k = header.index(col)
            for r, row in enumerate(rows):
                nums = _numbers(row[k]) if k < len(row) else []
                if not nums:
                    continue
                mid = statistics.median(nums)
                y = r + (s - (len(series) - 1) / 2) * height
                color = SERIES.get(col, "black")
                if col == FLOOR:
                    ax.plot([mid, mid], [r - 0.42, r + 0.42], color="black", lw=2, label=None)
                else:
                    err = [[mid - min(nums)], [max(nums) - mid]] if len(nums) > 1 else None
                    ax.barh(y, mid, height=height, color=color, xerr=err, capsize=2)
        handles = [
            Line2D([], [], color="black", lw=2, label="copy floor (plain copy of the bytes)")
            if col == FLOOR
            else Patch(color=SERIES[col], label=col)
            for col in series
        ]
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(["\n".join(_wrap(" | ".join(row[k] for k in label_cols), 48)) for row in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("time, ms (log scale; bars: median, whiskers: range over runs)")
        ax.set_title(table["section"], fontsize=10)
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
        fig.savefig(dst / name, dpi=110)
        plt.close(fig)
        table["image"] = name
        written.append(dst / name)
    _write(dst / "index.md", _bench_page(benchmark_tables_with_images(results, written)))
    return written


def benchmark_tables_with_images(results: Path, images: list[Path]) -> list[tuple[str, str]]:
    tables = benchmark_tables(results)
    return [(t["section"], p.name) for t, p in zip(tables, images)]


def _bench_page(figures: list[tuple[str, str]]) -> str:
    blocks = "\n".join(f"## {section}\n\n![{section}]({name})\n" for section, name in figures)
    return f"""# Benchmark plots

One plot per table of `benchmarks/RESULTS.md` (generated at every build from that file):
embnum's CPU fast path beside fbgemm_gpu's CPU operator and torch's nearest built-in, and the
**copy floor**, a plain NumPy copy of the bytes the op must read and write (the black line: no
implementation can be much faster). The numbers, commands, machine and load are in
[the results](../../benchmarks.md).

{blocks}"""


def _wrap(text: str, width: int) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    return lines + ([cur] if cur else [])
