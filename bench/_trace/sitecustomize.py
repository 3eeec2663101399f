"""Import tracer for ``bench/reproduce.py`` (loaded by Python at start-up through
``PYTHONPATH``; does nothing unless ``TREEROLL_TRACE_IMPORTS`` names a file).

At exit, the process (and every Python child, which inherits the variable) appends the file of
every module it imported to that file, one path per line, so that a stored figure knows which
code it ran and ``tests/test_results.py`` calls it stale only when that code changed.
"""

import atexit
import os
import sys


def _dump() -> None:
    target = os.environ.get("TREEROLL_TRACE_IMPORTS")
    if not target:
        return
    paths = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    with open(target, "a") as out:
        out.write("".join(f"{p}\n" for p in sorted(p for p in paths if p)))


if os.environ.get("TREEROLL_TRACE_IMPORTS"):
    atexit.register(_dump)
