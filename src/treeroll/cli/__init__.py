"""The command line (:mod:`treeroll.cli.main`) and what only it uses: interactive sessions,
reporting, ``treeroll compare`` and its efficiency statistics, and the Ray commands."""

from treeroll.cli.main import main

__all__ = ["main"]
