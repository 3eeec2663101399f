"""The house rule: treeroll's packages import only downward, and never in a circle.

Every module's imports are read from its source (``ast``: imports inside functions and
``TYPE_CHECKING`` blocks count too, since a type-only import still couples the modules). The
layers, top to bottom, are read from the architecture page's table (docs/architecture.md).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "treeroll"

ARCHITECTURE = SRC.parent.parent / "docs" / "architecture.md"


def read_layers(page: str) -> list[set[str]]:
    """The layer table of the architecture page (*The packages and their layers*): each row's
    layer number and the units its second column names (```cli/```, ```assemble.py```), top
    layer first."""
    layers: dict[int, set[str]] = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0][:1].isdigit():
            continue
        number = int(cells[0].split()[0])
        names = re.findall(r"`([a-z_]+)(?:/|\.py)`", cells[1])
        layers.setdefault(number, set()).update(names)
    return [layers[n] for n in sorted(layers)]


LAYERS: list[set[str]] = read_layers(ARCHITECTURE.read_text())
"""Each top-level unit of ``treeroll`` (a package or a module) and its layer, as the
architecture page's table says (the one source: no copy of it here)."""


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "treeroll" and len(parts) > 1 else None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every ``treeroll`` module ``path`` imports, anywhere in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("treeroll"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.startswith("treeroll"):
                found.add(base)
    return found


def module_graph() -> dict[str, set[str]]:
    """Module -> the treeroll modules it imports (bundled test projects left out)."""
    graph = {}
    for path in SRC.rglob("*.py"):
        if "data" in path.relative_to(SRC).parts:
            continue
        graph[_module_name(path)] = imports_of(path)
    return graph


def layer_of(unit: str) -> int:
    """The index of ``unit``'s layer in :data:`LAYERS` (0 = top)."""
    for index, members in enumerate(LAYERS):
        if unit in members:
            return index
    raise AssertionError(f"treeroll.{unit} has no layer: add it to the layer table of "
                         "docs/architecture.md")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import that points to a higher layer."""
    bad = []
    for module, imported in graph.items():
        here = _unit(module)
        if here is None:
            continue
        for target in imported:
            there = _unit(target)
            if there is not None and there != here and layer_of(there) < layer_of(here):
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]], level: int) -> list[list[str]]:
    """Import circles among the names made of each module's first ``level`` dotted parts
    (``level=2``: the top-level packages; a very large level: the modules themselves)."""
    def key(name: str) -> str:
        return ".".join(name.split(".")[:level])

    edges: dict[str, set[str]] = {}
    for module, imported in graph.items():
        for target in imported:
            a, b = key(module), key(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def test_the_layer_table_is_read_from_the_architecture_page():
    assert len(LAYERS) == 6
    assert LAYERS[0] == {"cli", "adapters"} and "training" in LAYERS[1]
    assert {"base", "tree", "heads", "registry", "viz"} <= LAYERS[-1]
    assert read_layers("| 1 (top) | `cli/` | x |\n| 2 | `a.py`, `b/` | y |") == [
        {"cli"}, {"a", "b"}]


def test_every_unit_of_the_package_has_a_layer():
    units = {_unit(m) for m in module_graph()} - {None}
    for unit in sorted(units):
        layer_of(unit)


def test_no_module_imports_a_higher_layer():
    assert upward_imports(module_graph()) == []


@pytest.mark.parametrize("level", [2, 99], ids=["packages", "modules"])
def test_there_is_no_import_circle(level):
    assert cycles(module_graph(), level) == []


def test_the_checks_catch_an_upward_import_and_a_circle():
    graph = {"treeroll.tree": {"treeroll.training.loss"}, "treeroll.training.loss": set(),
             "treeroll.engine.a": {"treeroll.engine.b"}, "treeroll.engine.b": {"treeroll.engine.a"}}
    assert upward_imports(graph) == ["treeroll.tree -> treeroll.training.loss"]
    assert cycles(graph, 99) == [["treeroll.engine.a", "treeroll.engine.b", "treeroll.engine.a"]]


def _protocol_members() -> set[str]:
    """Every member name a plug-in protocol declares: ``treeroll.base`` /
    ``treeroll.environment``'s, and those a consumer asks of an environment where it lives
    (``treeroll.policies.VocabularyEnv``, ``treeroll.views.GridEnv``)."""
    import inspect
    import typing

    from treeroll import base, environment, policies, views

    names: set[str] = set()
    for module in (base, environment, policies, views):
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if getattr(obj, "_is_protocol", False) and obj.__module__ == module.__name__:
                names |= set(typing.get_type_hints(obj)) | {
                    n for n in vars(obj) if not n.startswith("_")}
    return names


def attribute_probes(members: set[str]) -> list[str]:
    """``module:line name`` for each ``getattr`` / ``hasattr`` whose attribute is a protocol
    member (a probe of a plug-in by name), outside the registries."""
    found = []
    for path in SRC.rglob("*.py"):
        if "data" in path.relative_to(SRC).parts or path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in members):
                found.append(f"{_module_name(path)}:{node.lineno} {node.args[1].value}")
    return sorted(found)


def test_plugins_are_not_probed_for_protocol_members_by_name():
    members = _protocol_members()
    assert {"observe", "vocabulary_texts", "example_reply", "turn_limit", "name",
            "largest_side"} <= members
    assert attribute_probes(members) == []


MAX_LINES = 500
"""A module that grows past this is a sign to split it (STYLE.md; issue #51's limit)."""


def test_no_module_of_the_package_is_over_the_line_limit():
    long = {str(path.relative_to(SRC)): n for path in sorted(SRC.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def private_imports(folder: Path) -> list[str]:
    """``file: module.name`` for each treeroll name a script under ``folder`` imports that
    its module does not offer: a name with a leading underscore, or one missing from the
    module's ``__all__`` (a submodule of a package is public)."""
    import importlib
    import importlib.util

    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.split(".")[0] == "treeroll"):
                continue
            module = importlib.import_module(node.module)
            offered = getattr(module, "__all__", None)
            for alias in node.names:
                name = alias.name
                submodule = hasattr(module, "__path__") and importlib.util.find_spec(
                    f"{node.module}.{name}") is not None
                if name.startswith("_") or (offered is not None and name not in offered
                                            and not submodule):
                    found.append(f"{path.name}: {node.module}.{name}")
    return found


def test_the_benchmarks_use_only_the_public_api():
    assert private_imports(SRC.parent.parent / "bench") == []


def test_the_finder_of_private_imports_finds_them(tmp_path):
    (tmp_path / "script.py").write_text(
        "from treeroll.training.trainer import RESUMABLE_CHANGES, _TrainingRun, train\n"
        "from treeroll.envs import swe\n")
    assert private_imports(tmp_path) == [
        "script.py: treeroll.training.trainer.RESUMABLE_CHANGES",
        "script.py: treeroll.training.trainer._TrainingRun"]
