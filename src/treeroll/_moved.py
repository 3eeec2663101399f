"""Old import paths of the modules the 0.2 layout moved, kept working for one release.

``import treeroll.rollout`` (or ``from treeroll.plugins import make_strategy``) still works:
a finder on ``sys.meta_path`` answers each old name with the module now holding it, after a
``DeprecationWarning`` naming the new path. The CHANGELOG lists every move. Written here because
nothing in the standard library or the usual dependencies aliases a moved module (a module per
old path would put the old layout back beside the new one).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "treeroll.rollout": "treeroll.engine.batch",
    "treeroll.budgets": "treeroll.engine.budgets",
    "treeroll.faults": "treeroll.engine.faults",
    "treeroll.allocators": "treeroll.engine.allocators",
    "treeroll.arpo": "treeroll.strategies.arpo",
    "treeroll.rtpo": "treeroll.strategies.rtpo",
    "treeroll.igrpo": "treeroll.strategies.igrpo",
    "treeroll.advantages": "treeroll.credit.estimators",
    "treeroll.plugins": "treeroll.assemble",
    "treeroll.fetch": "treeroll.policies.fetch",
    "treeroll.backends.local": "treeroll.policies.model",
    "treeroll.backends.hf_decode": "treeroll.backends.hf.decode",
    "treeroll.backends.hf_cache": "treeroll.backends.hf.cache",
    "treeroll.backends.kv_trie": "treeroll.backends.hf.kv_trie",
    "treeroll.backends.llamacpp_server": "treeroll.backends.llamacpp.server",
    "treeroll.backends.gguf": "treeroll.backends.llamacpp.gguf",
    "treeroll.cli_ray": "treeroll.cli.ray_run",
    "treeroll.distributed": "treeroll.cli.ray_workers",
    "treeroll.session": "treeroll.cli.session",
    "treeroll.reporting": "treeroll.cli.reporting",
    "treeroll.compare": "treeroll.cli.compare",
    "treeroll.efficiency": "treeroll.cli.efficiency",
}
"""Old module path -> where it lives now (``treeroll.engine``, ``treeroll.strategies``,
``treeroll.scorers``, ``treeroll.cli`` and ``treeroll.backends.hf`` / ``.llamacpp`` kept their
paths as packages exporting the same names)."""


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module that replaced it
    (``import``), or runs that module (``python -m``)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    @staticmethod
    def _warn(name: str) -> None:
        warnings.warn(f"{name} moved to {MOVED[name]} (treeroll 0.2); the old path goes in 0.3",
                      DeprecationWarning, stacklevel=3)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self._warn(spec.name)
        module = importlib.import_module(MOVED[spec.name])
        self._specs[spec.name] = module.__spec__  # the import system overwrites it next
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was imported under its new name); its own spec back."""
        for old, spec in list(self._specs.items()):
            if spec is not None and spec.name == module.__name__:
                module.__spec__ = spec
                del self._specs[old]

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m <old path>``: the new module's code, run as ``__main__``."""
        self._warn(fullname)
        spec = importlib.util.find_spec(MOVED[fullname])
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            raise ImportError(f"cannot run {MOVED[fullname]}")
        return loader.get_code(MOVED[fullname])

    def is_package(self, fullname: str) -> bool:
        """No old path was a package."""
        return False


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
