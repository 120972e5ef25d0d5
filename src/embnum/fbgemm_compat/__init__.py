"""Run TorchRec with fbgemm_gpu absent: an opt-in stand-in for the parts of fbgemm_gpu TorchRec uses.

``install()`` registers every ``torch.ops.fbgemm`` operator embnum provides
(:func:`embnum.torch_bridge.register_fbgemm_aliases`, and fbgemm's quantized lookup operator,
:mod:`.operators`), then puts an import hook on
``sys.meta_path`` so that ``import fbgemm_gpu`` and the submodules TorchRec imports resolve to
embnum's stand-in modules (:data:`MODULES`): the configuration enums, the table-batched
embedding modules on embnum's kernels, the pooled-embedding permutes and the communication
codecs. Features embnum does not provide (SSD and key-value tables, UVM and cached placements,
prefetch, statistics reporters, zero-collision hashing) import fine and raise
``NotImplementedError`` naming the feature when used. It refuses where a real fbgemm_gpu is
importable or loaded: it never shadows one.

Setting ``EMBNUM_FBGEMM_COMPAT=1`` installs it in every Python process of an environment where
embnum is installed (a ``.pth`` start-up hook shipped in the wheel): ``torchrun`` workers, spawned
processes and pytest-xdist workers included. docs/torchrec-without-fbgemm.md has the details.
"""

from __future__ import annotations

import os
import sys

from ._hook import MODULES, active_finder, insert, real_fbgemm_gpu

__all__ = ["MODULES", "install", "status"]

ENV_VAR = "EMBNUM_FBGEMM_COMPAT"


def _register_aliases() -> list[str]:
    from ..torch_bridge import register_fbgemm_aliases
    from . import operators, unavailable

    names = register_fbgemm_aliases()
    operators.register_operators()  # fbgemm's quantized lookup operator, on embnum's
    unavailable.register_operators()  # fbgemm operators of features embnum lacks: they raise, naming the feature
    return names


def _refuse_if_real():
    where = real_fbgemm_gpu()
    if where is not None:
        raise RuntimeError(
            f"embnum.fbgemm_compat.install() refuses: a real fbgemm_gpu is importable or loaded here ({where}); "
            "the stand-in never shadows it (uninstall fbgemm_gpu, or use it without the stand-in)"
        )


def install() -> dict:
    """Register embnum's ``torch.ops.fbgemm`` operators, then serve ``fbgemm_gpu`` from the stand-in.

    Returns :func:`status`. Calling it again does nothing more. Raises ``RuntimeError`` where a real
    fbgemm_gpu is importable or already loaded.
    """
    finder = active_finder()
    if finder is None:
        _refuse_if_real()
        _register_aliases()
        insert()
    elif finder.on_first_load is not None:  # installed at start-up; register now rather than at first import
        finder.on_first_load = None
        _register_aliases()
    return status()


def install_at_startup() -> None:
    """The ``.pth`` hook's call when ``EMBNUM_FBGEMM_COMPAT`` is set: insert the import hook now (no torch
    import) and register the operators at the first ``import fbgemm_gpu``. Where a real fbgemm_gpu is
    importable it installs nothing and says so on stderr (start-up must not fail)."""
    try:
        _refuse_if_real()
    except RuntimeError as e:
        print(f"{ENV_VAR} is set but {e}", file=sys.stderr)
        return
    insert(on_first_load=_register_aliases)


def status() -> dict:
    """What is active: ``installed`` (the import hook is on ``sys.meta_path``), ``operators`` (the
    ``torch.ops.fbgemm`` names registered by embnum; empty until the first ``import fbgemm_gpu`` when
    installed at start-up), ``loaded`` (the fbgemm_gpu modules served so far), ``env`` (the value of
    ``EMBNUM_FBGEMM_COMPAT``) and ``real_fbgemm_gpu`` (where a real one is, else None)."""
    finder = active_finder()
    operators: list[str] = []
    bridge = sys.modules.get("embnum.torch_bridge.fbgemm_aliases")
    if bridge is not None and bridge.registered():
        operators = sorted(bridge.ALIASES)
    return {
        "installed": finder is not None,
        "operators": operators,
        "loaded": [] if finder is None else list(finder.loaded),
        "env": os.environ.get(ENV_VAR),
        "real_fbgemm_gpu": real_fbgemm_gpu(),
    }
