"""The import hook: a ``sys.meta_path`` finder that serves ``fbgemm_gpu`` and the submodules
TorchRec imports from embnum's stand-in modules. It imports neither torch nor a stand-in until
the first ``import fbgemm_gpu...``, so installing it at interpreter start-up costs nothing more.

Each fbgemm module is a fresh module object named as fbgemm's, holding the public names
(``__all__``) of the stand-in modules listed for it; nothing named ``fbgemm_gpu`` exists on disk.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_HERE = __name__.rpartition(".")[0]  # embnum.fbgemm_compat
_TBE_MODULES = ("training", "configs")

# fbgemm_gpu module -> the stand-in modules (in embnum.fbgemm_compat) whose names it holds
MODULES: dict[str, tuple[str, ...]] = {
    "fbgemm_gpu": (),
    "fbgemm_gpu.sparse_ops": (),  # importing it registers fbgemm's operators: install() did
    "fbgemm_gpu.split_embedding_configs": ("configs",),
    "fbgemm_gpu.split_table_batched_embeddings_ops_common": ("configs", "unavailable"),
    "fbgemm_gpu.split_table_batched_embeddings_ops_training": _TBE_MODULES,
    "fbgemm_gpu.split_table_batched_embeddings_ops": _TBE_MODULES,
    "fbgemm_gpu.split_table_batched_embeddings_ops_inference": ("inference", "configs"),
    "fbgemm_gpu.permute_pooled_embedding_modules": ("permute",),
    "fbgemm_gpu.permute_pooled_embedding_modules_split": ("permute",),
    "fbgemm_gpu.quantize_comm": ("quantize",),
    "fbgemm_gpu.quantize_utils": ("quantize",),
    "fbgemm_gpu.tbe": (),
    "fbgemm_gpu.tbe.config": ("configs",),
    "fbgemm_gpu.tbe.config.optimizer_config": ("configs",),
    "fbgemm_gpu.tbe.config.embedding_config": ("configs",),
    "fbgemm_gpu.tbe.cache": ("configs", "unavailable"),
    "fbgemm_gpu.tbe.cache.kv_embedding_ops_inference": ("unavailable",),
    "fbgemm_gpu.tbe.monitoring": ("unavailable",),
    "fbgemm_gpu.tbe.ssd": ("unavailable",),
    "fbgemm_gpu.tbe.ssd.training": ("unavailable",),
    "fbgemm_gpu.tbe.ssd.utils": (),
    "fbgemm_gpu.tbe.ssd.utils.partially_materialized_tensor": ("unavailable",),
}
PACKAGES = {name.rpartition(".")[0] for name in MODULES if "." in name}


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the modules of :data:`MODULES`; any other ``fbgemm_gpu`` module is not found."""

    def __init__(self, on_first_load=None):
        self.on_first_load = on_first_load  # called once, when the first stand-in module is looked up
        self.loaded: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None
        if self.on_first_load is not None:  # before the module enters sys.modules
            first, self.on_first_load = self.on_first_load, None
            first()
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in PACKAGES)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        module.__doc__ = f"embnum's stand-in for {module.__name__} (embnum.fbgemm_compat)."
        for source in MODULES[module.__name__]:
            stand_in = importlib.import_module(f"{_HERE}.{source}")
            module.__dict__.update({name: getattr(stand_in, name) for name in stand_in.__all__})
        self.loaded.append(module.__name__)


def active_finder() -> StandInFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, StandInFinder)), None)


def real_fbgemm_gpu() -> str | None:
    """Where a real fbgemm_gpu is (loaded, or importable from ``sys.path``), else None."""
    loaded = sys.modules.get("fbgemm_gpu")
    if loaded is not None and not isinstance(getattr(loaded, "__loader__", None), StandInFinder):
        return getattr(loaded, "__file__", None) or repr(loaded)
    if active_finder() is not None:
        return None
    spec = importlib.util.find_spec("fbgemm_gpu") if loaded is None else None
    return None if spec is None else (spec.origin or str(list(spec.submodule_search_locations or [])))


def insert(on_first_load=None) -> StandInFinder:
    """Put the finder first on ``sys.meta_path`` (a second call returns the one already there)."""
    finder = active_finder()
    if finder is None:
        finder = StandInFinder(on_first_load)
        sys.meta_path.insert(0, finder)
    return finder
