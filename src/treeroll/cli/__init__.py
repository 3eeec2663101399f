"""The command line (:mod:`treeroll.cli.commands`) and what only it uses: interactive sessions,
reporting, ``treeroll compare`` and its efficiency statistics, and the Ray commands."""

from treeroll.cli.commands import main

__all__ = ["main"]
