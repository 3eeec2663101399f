"""Adding a backend takes one file and one line of registration: ``tests/plugins/
counted_hf.py`` (a :class:`~treeroll.backends.BackendSpec` with its settings block) and an
entry point (``[project.entry-points."treeroll.backends"]``). A fresh interpreter then takes
it by name, its settings as ``backend.counted_hf.*`` in YAML and on the command line, and the
rollout engine generates with it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.plugins.installed import help_and_refusal, install, run_python


def _site(tmp_path: Path) -> Path:
    return install(tmp_path / "site", "counted_hf",
                   "[treeroll.backends]\ncounted_hf = counted_hf:PLUGIN\n")


def test_a_backend_in_one_file_and_one_entry_point_is_configured_and_generates(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("backend:\n  name: counted_hf\n  counted_hf:\n    batch: 2\n"
                      "rollout:\n  max_turn_tokens: 24\n")
    done = run_python(_site(tmp_path), f"""
        import json
        from treeroll.backends import BACKENDS  # loads the entry point: counted_hf with it
        import counted_hf
        from treeroll.cli.one_tree import build_one_tree
        from treeroll.config import load_config
        from treeroll.tree import leaves

        config = load_config({str(config)!r})
        tree = build_one_tree(config, task_seed=3)
        print(json.dumps({{"registered": "counted_hf" in BACKENDS,
                          "batch": config.backend.counted_hf.batch,
                          "served": sum(counted_hf.SERVED), "leaves": len(leaves(tree))}}))
        """)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["registered"] and found["batch"] == 2
    assert found["served"] >= found["leaves"] >= 1  # every turn it generated went through it


def test_the_command_line_offers_the_backends_settings_and_checks_them(tmp_path):
    help_and_refusal(_site(tmp_path), "--backend.counted-hf.batch",
                     ["--backend.name", "counted_hf", "--backend.counted-hf.batch", "0"])
