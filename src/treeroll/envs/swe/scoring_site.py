"""The scoring run's launcher, copied as ``sitecustomize.py`` into the folder of one scoring
run (:func:`treeroll.envs.swe.scoring.run_scored`), which ``PYTHONPATH`` names: every Python
process the test command starts imports it while ``site`` runs, before the interpreter puts
the script's folder or the working directory (the tree) on ``sys.path``, and before pytest or
any of the project's code is imported.

It imports the scoring plugin (``TREEROLL_SCORING_PLUGIN``, a module of this folder) into
``sys.modules`` at once, so that pytest, told to load it by ``PYTEST_PLUGINS``, finds it there
and never searches a path the tree is on. It puts an import guard first in ``sys.meta_path``
(the plugin moves it back to the front once pytest's assertion-rewriting hook is in, before
any other plugin loads): a top-level module is looked for on the start-up path (the standard
library and site-packages, less anything inside the tree) before the tree, wherever pytest
later puts the tree on ``sys.path`` (``-o pythonpath=.``, the ``rootdir`` of a test module),
so a ``pdb.py`` or ``pluggy.py`` the agent added never stands in for the module pytest meant.
The modules the task's pristine tree holds (``tree_modules.json`` beside this file) are found
as before, the tree first; a name nothing else provides is found in the tree as usual.
Package metadata (``.dist-info``, ``.egg-info``) inside the tree is not seen unless the
pristine tree has it, so a ``[pytest11]`` entry point the agent declares loads nothing.

In a pytest process it has the plugin take its token, open its channel and note the
tripwire's baseline at once, before pytest imports a plugin a ``-p`` option names (from the
tree, where the task's command or its pristine ``addopts`` names one of the tree's modules),
and adds the ``pytest11`` plugins of the start-up path to
``PYTEST_PLUGINS`` (autoloading is off during scoring: ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``).
Then it runs the interpreter's own ``sitecustomize``, if any.

Imports nothing of treeroll; written for any Python 3.8+ a test command may name.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_TREE = os.environ.get("TREEROLL_SCORING_TREE", "").rstrip("/")
_PLUGIN = os.environ.get("TREEROLL_SCORING_PLUGIN", "")


def _inside_tree(path: str) -> bool:
    full = os.path.abspath(path or os.getcwd())
    return bool(_TREE) and (full == _TREE or full.startswith(_TREE + "/"))


_STARTUP = [os.path.abspath(p) for p in sys.path
            if p and os.path.abspath(p) != _HERE and not _inside_tree(p)]


def _pristine() -> tuple[dict[str, set[str]], set[str]]:
    """``(module name -> folders it lies in, metadata folders)`` of the pristine tree."""
    try:
        with open(os.path.join(_HERE, "tree_modules.json")) as handle:
            found = json.load(handle)
        return ({name: set(folders) for name, folders in found["modules"].items()},
                set(found["metadata"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, set()


_OWN, _METADATA = _pristine()


def _tree_folder(spec: Any) -> str | None:
    """The folder of the tree (relative) a spec was found in, or ``None`` outside it."""
    locations = list(spec.submodule_search_locations or ())
    where = os.path.dirname(locations[0] if locations else spec.origin or "")
    if not where or not _inside_tree(where):
        return None
    return os.path.relpath(os.path.abspath(where), _TREE)


class ScoringImportGuard:
    """Finds top-level modules on the start-up path before the tree (see the module's
    docstring); submodules are left to their packages, and names nothing else provides, or
    found where the pristine tree has them, to the usual finders."""

    treeroll_scoring_guard = True

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """The spec the guard decides for ``name``, or ``None`` to let the usual finders
        look."""
        if path is not None or "." in name:
            return None
        if name == _PLUGIN:
            return importlib.machinery.PathFinder.find_spec(name, [_HERE])
        startup = importlib.machinery.PathFinder.find_spec(name, _STARTUP)
        folders = _OWN.get(name)
        if not folders:
            return startup
        usual = importlib.machinery.PathFinder.find_spec(name, sys.path)
        if usual is None or _tree_folder(usual) in folders or (
                _tree_folder(usual) is None and startup is None):
            return None  # where the pristine tree has it: as before
        allowed = [entry for entry in sys.path if _inside_tree(entry) and os.path.relpath(
            os.path.abspath(entry or os.getcwd()), _TREE) in folders]
        return importlib.machinery.PathFinder.find_spec(name, allowed) or startup


class ScoringPathFinder(importlib.machinery.PathFinder):
    """Python's path finder, blind to package metadata inside the tree that the pristine
    tree does not hold."""

    @classmethod
    def find_distributions(cls, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """The distributions Python's path finder finds, less those the agent added."""
        for dist in super().find_distributions(*args, **kwargs):
            where = str(getattr(dist, "_path", ""))
            if where and _inside_tree(where) and \
                    os.path.relpath(os.path.abspath(where), _TREE) not in _METADATA:
                continue
            yield dist


def _site_plugins() -> list[str]:
    """Module names of the ``pytest11`` entry points on the start-up path."""
    from importlib import metadata

    names = []
    for dist in metadata.distributions(path=_STARTUP):
        for entry in dist.entry_points:
            if entry.group == "pytest11":
                module = entry.value.split(":")[0].strip()
                if module and module not in names:
                    names.append(module)
    return names


def _install() -> None:
    sys.meta_path[:] = [ScoringPathFinder if finder is importlib.machinery.PathFinder
                        else finder for finder in sys.meta_path]
    sys.meta_path.insert(0, ScoringImportGuard())
    if _PLUGIN and _PLUGIN not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(_PLUGIN, [_HERE])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[_PLUGIN] = module
            spec.loader.exec_module(module)
    argv = getattr(sys, "orig_argv", sys.argv)
    if any(os.path.basename(arg) in ("pytest", "py.test") for arg in argv):
        opener = getattr(sys.modules.get(_PLUGIN), "open_channel", None)
        if callable(opener):  # before pytest reads its arguments and imports `-p` plugins
            opener()
        listed = [p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p]
        os.environ["PYTEST_PLUGINS"] = ",".join(
            listed + [p for p in _site_plugins() if p not in listed])
    original = importlib.machinery.PathFinder.find_spec("sitecustomize", _STARTUP)
    if original is not None and original.loader is not None:
        module = importlib.util.module_from_spec(original)
        original.loader.exec_module(module)


_install()
