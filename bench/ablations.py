"""Ablations of the trees on hard FrozenLake (issue #39): what moves their result.

Each variant is one tree of ``configs/compare_hard.yaml`` with one setting changed, trained
on that comparison's first three seeds with everything else equal (budget, updates, held-out
tasks), so it sits beside that comparison's own runs of the same seeds. Chosen before any
result of the comparison was read (``docs/where_trees_pay.md``, *Ablations*):

* ``advantage``: Tree-GRPO's own credit, ``advantage.name: tree`` (intra-subtree plus
  inter-tree GRPO), for tree_grpo and patr (the comparison uses plain GRPO over a tree's
  leaves for every strategy);
* ``K``: PATR's ``top_k`` 1 and 4 (2 in the comparison): how many scored states branch;
* ``depth``: PATR's ``k_turns`` 1 and 4 (2): how often it branches (every turn, every 4th);
* ``budget split``: PATR's ``b0`` 2 and 8 (4): initial chains against what branching gets;
* the scorer is the comparison's own ablation: random_tree is PATR's shape without scores.

All runs go side by side, two at a time (one thread each, as the comparison), then each
variant's report is written by ``treeroll compare`` into ``reports/ablations/<variant>/``.
Resumable: run it again after an interrupt.

    python bench/ablations.py            # about 3 hours here (24 runs of 40 updates)
    python bench/ablations.py --only patr_k1 patr_k4
    python bench/ablations.py --copy-to docs/ablations   # as bench/reproduce.py runs it

Last line: one JSON object with, per variant, the final held-out success over seeds with its
95% t-interval, the per-seed finals, the generated tokens, leaves per 1k tokens and the share
of groups with a signal.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from treeroll.cli.compare import (
    CompareConfig,
    arm_config,  # the comparison's own run settings, so a variant differs in one thing
    run_compare,
    settings_changed,
    train_side_by_side,
)
from treeroll.config import load_config, merged_config
from treeroll.config_checks import check_config
from treeroll.training.runfolder import finished_steps

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "tree_grpo+tree_advantage": ("tree_grpo", {"advantage": {"name": "tree"}}),
    "patr+tree_advantage": ("patr", {"advantage": {"name": "tree"}}),
    "patr_k1": ("patr", {"strategy": {"patr": {"top_k": 1}}}),
    "patr_k4": ("patr", {"strategy": {"patr": {"top_k": 4}}}),
    "patr_every_turn": ("patr", {"strategy": {"patr": {"k_turns": 1}}}),
    "patr_every_4_turns": ("patr", {"strategy": {"patr": {"k_turns": 4}}}),
    "patr_b0_2": ("patr", {"strategy": {"patr": {"b0": 2}}}),
    "patr_b0_8": ("patr", {"strategy": {"patr": {"b0": 8}}}),
}
"""Variant name -> (the strategy, the settings changed, as a config file's mapping)."""


def variant_config(base: CompareConfig, name: str) -> CompareConfig:
    """The comparison of one variant: its strategy alone, the first three seeds, its own
    report folder, the one setting changed."""
    strategy, change = VARIANTS[name]
    return replace(base, strategies=(strategy,), seeds=base.seeds[:3], more_seeds=(),
                   more_seeds_for=(), report_dir=str(ROOT / "reports" / "ablations" / name),
                   base=merged_config(base.base, change))


def main() -> None:
    """Train every variant's runs side by side, write their reports, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "compare_hard.yaml"))
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--copy-to", default=None, help="copy each variant's report files "
                        "(report.md, results.json, the plot) to COPY_TO/<variant>/ after")
    args = parser.parse_args()
    base = load_config(args.config, CompareConfig)
    names = args.only or list(VARIANTS)
    configs = {name: variant_config(base, name) for name in names}
    runs = [arm_config(c, c.strategies[0], seed) for c in configs.values() for seed in c.seeds]
    for run in runs:  # every run's settings, before the first one trains
        check_config(run)
    stale = [problem for run in runs for problem in settings_changed(run)]
    if stale:
        parser.error("reports/ablations holds runs made with other settings: "
                     + "; ".join(stale[:4]) + ". Move that folder aside first")
    todo = [r for r in runs if finished_steps(Path(r.runs_dir) / r.name) is None]
    if todo:
        train_side_by_side(todo, base.jobs, None)
    out: dict[str, Any] = {"config": Path(args.config).name, "seeds": list(base.seeds[:3]),
                           "steps": base.base.optim.steps, "token_budget": base.token_budget}
    for name, config in configs.items():
        run_compare(config)  # every run finished: it reads them back and writes the report
        report = Path(config.report_dir)
        if args.copy_to:
            target = Path(args.copy_to) / name
            target.mkdir(parents=True, exist_ok=True)
            for item in report.iterdir():
                if item.is_file():
                    shutil.copy2(item, target / item.name)
        row = json.loads((report / "results.json").read_text())
        row = row[config.strategies[0]]
        out[name] = {"strategy": config.strategies[0], "change": VARIANTS[name][1],
                     "final": round(row["final_success"], 4),
                     "ci95": None if row["ci95"] is None else [round(x, 4) for x in row["ci95"]],
                     "per_seed": [round(r["final_success"], 4) for r in row["runs"]],
                     "generated_tokens": round(row["generated_tokens"]),
                     "leaves_per_1k_tokens": round(row["leaves_per_1k_tokens"], 2),
                     "signal_groups": None if row["signal_groups"] is None
                     else round(row["signal_groups"], 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
