"""``python -m treeroll.envs.swe``: generate or re-validate SWE tasks (see ``tasks.main``)."""

from treeroll.envs.swe.tasks import main

raise SystemExit(main())
