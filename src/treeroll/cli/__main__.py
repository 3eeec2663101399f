"""``python -m treeroll.cli``: the ``treeroll`` command."""

from treeroll.cli.commands import main

raise SystemExit(main())
