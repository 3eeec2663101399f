"""Adding a process scorer takes one file and one line of registration: ``tests/plugins/
short_paths.py`` (a :class:`~treeroll.scorers.ScorerSpec` with its settings block) and an entry
point (``[project.entry-points."treeroll.scorers"]``). A fresh interpreter then takes it by
name, its settings as ``scorer.short_paths.*`` in YAML and on the command line, and PATR
scores with it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.plugins.installed import help_and_refusal, install, run_python


def _site(tmp_path: Path) -> Path:
    return install(tmp_path / "site", "short_paths",
                   "[treeroll.scorers]\nshort_paths = short_paths:SPEC\n")


def test_a_scorer_in_one_file_and_one_entry_point_is_configured_and_scores_patrs_nodes(
        tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("strategy:\n  name: patr\nscorer:\n  name: short_paths\n"
                      "  short_paths:\n    per_turn: 0.25\nrollout:\n  max_turn_tokens: 24\n")
    done = run_python(_site(tmp_path), f"""
        import json
        from treeroll.cli.one_tree import build_one_tree
        from treeroll.config import load_config
        from treeroll.scorers import SCORERS

        config = load_config({str(config)!r})
        tree = build_one_tree(config, task_seed=3)
        reasons = sorted({{n.score_reason for n in tree.nodes
                           if n.score is not None}})
        scores = sorted({{round(n.score, 2) for n in tree.nodes
                          if n.score is not None}})
        print(json.dumps({{"registered": "short_paths" in SCORERS,
                          "per_turn": config.scorer.short_paths.per_turn,
                          "reasons": reasons, "scores": scores}}))
        """)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["registered"] and found["per_turn"] == 0.25
    assert found["reasons"] and all(r.endswith(" turns") for r in found["reasons"])
    assert set(found["scores"]) <= {1.0, 0.75, 0.5, 0.25, 0.0}


def test_the_command_line_offers_the_scorers_settings_and_checks_them(tmp_path):
    help_and_refusal(_site(tmp_path), "--scorer.short-paths.per-turn",
                     ["--strategy.name", "patr", "--scorer.name", "short_paths",
                      "--scorer.short-paths.per-turn", "0"])
