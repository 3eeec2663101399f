"""No environment or backend is named in code outside its own plug-in package (issue #51):
what the rest of treeroll needs to know about an environment is a field of its
:class:`~treeroll.envs.EnvSpec` (its scorer, its actor, its run defaults, its settings block),
about a backend a field of its :class:`~treeroll.backends.BackendSpec`."""

from __future__ import annotations

import ast
from pathlib import Path

import treeroll
from treeroll.backends import BACKENDS
from treeroll.envs import ENVS, env_spec

SRC = Path(treeroll.__file__).parent
OWN = ("envs", "backends")
"""The packages that may name their own plug-ins."""


def _named(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every comparison with, membership test in, or ``startswith`` of
    one of ``names`` as a string literal."""
    found = []
    for node in ast.walk(tree):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "removeprefix", "endswith"):
            operands = list(node.args)
        for operand in operands:
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) \
                else [operand]
            found += [(node.lineno, item.value) for item in items
                      if isinstance(item, ast.Constant) and item.value in names]
    return found


def test_no_environment_or_backend_name_is_compared_outside_its_plug_in_package():
    names = set(ENVS) | set(BACKENDS)
    assert {"swe", "gym:", "hf", "vllm"} <= names
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC)
        if relative.parts[0] in OWN:
            continue
        offenders += [f"{relative}:{line}: {name!r}"
                      for line, name in _named(ast.parse(path.read_text()), names)]
    assert not offenders, "named outside their plug-in package:\n" + "\n".join(offenders)


def test_the_finder_sees_a_name_compared_so_the_check_above_can_fail():
    code = ("if config.env.name == 'swe': pass\nif name.startswith('gym:'): pass\n"
            "if backend in ('hf', 'other'): pass\nif env.name == 'mine': pass\n")
    assert [name for _, name in _named(ast.parse(code), {"swe", "gym:", "hf"})] == \
        ["swe", "gym:", "hf"]


def test_what_the_code_asked_of_the_swe_and_gym_names_is_in_their_records():
    swe, gym = env_spec("swe"), env_spec("gym:FrozenLake-v1")
    assert swe is not None and gym is not None
    assert (swe.scorer, swe.actor, swe.block) == ("swe", "swe_scripted", "swe")
    assert BACKENDS.get("swe_scripted").tokenizer is not None
    assert swe.run_defaults is not None and gym.shown_as == "gym:<env id>"
    assert env_spec("frozenlake_rllm").scorer == "frozenlake_progress"
