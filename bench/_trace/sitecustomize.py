"""Dependency tracer for ``bench/reproduce.py`` (loaded by Python at start-up through
``PYTHONPATH``; does nothing unless ``TREEROLL_TRACE_IMPORTS`` names a file).

The process (and every Python child, which inherits the variable) records the file of every
module it imported and every file it opened for reading (an audit hook on ``open``: configs,
weights, data), and appends them at exit to that file, one path per line, so that a stored
figure knows which code and files it ran on and ``tests/test_results.py`` calls it stale only
when one of those changed.
"""

import atexit
import os
import sys

_opened: set = set()


def _audit(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], str):
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
        if "r" in mode and "+" not in mode:
            _opened.add(args[0])


def _dump() -> None:
    target = os.environ.get("TREEROLL_TRACE_IMPORTS")
    if not target:
        return
    paths = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    paths |= {os.path.abspath(p) for p in _opened}
    with open(target, "a") as out:
        out.write("".join(f"{p}\n" for p in sorted(p for p in paths if p)))


if os.environ.get("TREEROLL_TRACE_IMPORTS"):
    sys.addaudithook(_audit)
    atexit.register(_dump)
