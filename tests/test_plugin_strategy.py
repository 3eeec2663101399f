"""Adding a strategy takes one file and one line of registration (ARCHITECTURE.md's example).

``tests/plugins/first_fork.py`` is the file; the line is an entry point, as a package of the
user's own would declare it (``[project.entry-points."treeroll.strategies"]``). A fresh
interpreter that finds the package then takes the strategy by name, its settings as
``strategy.first_fork.*`` in YAML and on the command line, and grows trees with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.plugins.installed import install, run_python


def _install(site: Path) -> None:
    install(site, "first_fork", "[treeroll.strategies]\nfirst_fork = first_fork:FirstFork\n")


_python = run_python


def test_a_strategy_in_one_file_and_one_entry_point_is_configured_and_grows_trees(tmp_path):
    _install(tmp_path / "site")
    config = tmp_path / "run.yaml"
    config.write_text("strategy:\n  name: first_fork\n  first_fork:\n    width: 3\n"
                      "rollout:\n  max_turn_tokens: 24\n")
    done = _python(tmp_path / "site", f"""
        import json
        from treeroll.cli.one_tree import build_one_tree
        from treeroll.config import load_config
        from treeroll.strategies import STRATEGIES
        from treeroll.tree import leaves

        config = load_config({str(config)!r})
        tree = build_one_tree(config, task_seed=3)
        print(json.dumps({{"registered": "first_fork" in STRATEGIES,
                          "width": config.strategy.first_fork.width,
                          "strategy": tree.meta["strategy"],
                          "first_turns": len(tree.root.children),
                          "leaves": len(leaves(tree))}}))
        """)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["registered"] and found["width"] == 3 and found["strategy"] == "first_fork"
    assert found["first_turns"] == 1  # one first turn, shared by the group
    assert 1 <= found["leaves"] <= 3


def test_the_command_line_offers_the_plugged_in_strategys_settings(tmp_path):
    _install(tmp_path / "site")
    done = _python(tmp_path / "site", """
        from treeroll.cli import main
        main(["train", "--help"])
        """)
    out = done.stdout + done.stderr
    assert "--strategy.first-fork.width" in out or "--strategy.first_fork.width" in out, out


def test_without_the_entry_point_the_strategy_is_unknown_and_the_error_lists_the_valid(tmp_path):
    (tmp_path / "site").mkdir()
    done = _python(tmp_path / "site", """
        from treeroll.config import TrainConfig
        from treeroll.config_checks import check_config
        from treeroll.strategies import StrategyConfig
        config = TrainConfig(strategy=StrategyConfig(name="first_fork"))
        check_config(config)
        """)
    assert done.returncode != 0
    assert "first_fork" in done.stderr and "tree_grpo" in done.stderr
