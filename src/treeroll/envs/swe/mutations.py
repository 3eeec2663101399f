"""Single-line bug mutations of Python source (SWE-smith style): a swapped operator, an
off-by-one constant, a negated condition, a wrong variable, a dropped statement, a flipped
boolean, swapped arguments. :func:`mutation_sites` lists every one a file allows;
:mod:`treeroll.envs.swe.generation` keeps those that make a test fail.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Any

__all__ = ["Mutation", "mutation_sites"]


@dataclass(frozen=True)
class Mutation:
    """Replace the source span ``[line:col, line:end_col)`` (1-based line, 0-based columns,
    one line) of ``file`` holding ``original`` by ``replacement``."""

    file: str
    line: int
    col: int
    end_col: int
    original: str
    replacement: str
    kind: str

    def apply(self, source: str) -> str:
        """The mutated source (``ValueError`` if the span does not hold ``original``)."""
        return self._swap(source, self.original, self.replacement)

    def revert(self, source: str) -> str:
        """Undo :meth:`apply`."""
        return self._swap(source, self.replacement, self.original)

    def _swap(self, source: str, old: str, new: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        if text[self.col:self.col + len(old)] != old:
            raise ValueError(f"{self.file}:{self.line} does not hold {old!r}")
        lines[self.line - 1] = text[:self.col] + new + text[self.col + len(old):]
        return "".join(lines)


_BINOP_SWAPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv,
                                  ast.Div: ast.Mult, ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv,
                                  ast.Pow: ast.Mult}
_CMP_SWAPS: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
                                ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
                                ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
                                ast.IsNot: ast.Is}


def _local_names(function: ast.AST) -> list[str]:
    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return sorted(names - {"self", "cls", "_"})


def mutation_sites(source: str, file: str) -> list[Mutation]:
    """Every single-line mutation of ``source``, in a deterministic order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out: list[Mutation] = []

    def add(node: ast.AST, replacement_node: ast.AST | None, kind: str,
            replacement: str | None = None) -> None:
        line = getattr(node, "lineno", None)
        if line is None or node.end_lineno != line:  # type: ignore[attr-defined]
            return
        col, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        original = lines[line - 1].encode()[col:end].decode()  # AST offsets are in bytes
        char_col = len(lines[line - 1].encode()[:col].decode())
        text = replacement if replacement is not None else ast.unparse(replacement_node or node)
        if text != original:
            out.append(Mutation(file, line, char_col, char_col + len(original), original, text,
                                kind))

    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    owner: dict[int, list[str]] = {}
    for function in functions:
        names = _local_names(function)
        for node in ast.walk(function):
            owner[id(node)] = names
    docstrings = {id(n.body[0]) for n in ast.walk(tree)
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Module)) and n.body
                  and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            mutated: Any = copy.deepcopy(node)
            mutated.op = _BINOP_SWAPS[type(node.op)]()
            add(node, mutated, "swap_operator")
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAPS:
                    mutated = copy.deepcopy(node)
                    mutated.ops[i] = _CMP_SWAPS[type(op)]()
                    add(node, mutated, "swap_operator")
        elif isinstance(node, ast.BoolOp):
            mutated = copy.deepcopy(node)
            mutated.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            add(node, mutated, "swap_operator")
        elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
            mutated = copy.deepcopy(node)
            mutated.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
            add(node, mutated, "swap_operator")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            add(node, None, "flip_boolean", repr(not node.value))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            add(node, None, "off_by_one", repr(node.value + 1))
            if node.value > 0:
                add(node, None, "off_by_one", repr(node.value - 1))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            test = node.test
            add(test, None, "negate_condition", f"not ({ast.unparse(test)})")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) in owner:
            others = [n for n in owner[id(node)] if n != node.id]
            if node.id in owner[id(node)] and others:
                choice = others[(node.lineno + node.col_offset) % len(others)]
                add(node, None, "wrong_variable", choice)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            mutated = copy.deepcopy(node)
            mutated.args[0], mutated.args[1] = mutated.args[1], mutated.args[0]
            add(node, mutated, "swap_arguments")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)) \
                and id(node) not in docstrings and id(node) in owner:
            add(node, None, "drop_statement", "pass")
    out.sort(key=lambda m: (m.file, m.line, m.col, m.kind, m.replacement))
    valid = []
    for mutation in out:
        try:
            ast.parse(mutation.apply(source))
        except (SyntaxError, ValueError):
            continue
        valid.append(mutation)
    return valid
