"""``bench/compare_strategies.py``'s reach of chain's final success with a bootstrap ratio and
its per-leaf figures; ``bench/ablations.py``'s variants."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from ablations import VARIANTS, variant_config
from compare_strategies import per_leaf, reach_of
from treeroll.cli.compare import CompareConfig, arm_config
from treeroll.config import config_to_dict, load_config
from treeroll.training.runfolder import config_differences

ROOT = Path(__file__).resolve().parent.parent


def _runs(*curves: list[tuple[float, float]]) -> list[dict]:
    return [{"curve": [list(p) for p in c]} for c in curves]


def test_reach_of_chain_final_interpolates_the_mean_curves_and_divides_by_chains() -> None:
    chain = _runs([(0, 0.2), (100, 0.3), (200, 0.4)], [(0, 0.2), (100, 0.3), (200, 0.4)])
    tree = _runs([(0, 0.2), (100, 0.6), (200, 0.6)], [(0, 0.2), (100, 0.6), (200, 0.6)])
    out = reach_of(tree, chain)
    assert out["chain_final"] == 0.4
    # the tree's mean curve crosses 0.4 half way to its second evaluation: 50 tokens of 200
    assert out["ratio_to_chain"] == 0.25
    assert out["ci95"] == [0.25, 0.25]  # identical seeds: every resample says the same


def test_reach_of_a_strategy_that_never_gets_there_has_no_ratio_and_an_open_interval() -> None:
    chain = _runs([(0, 0.2), (100, 0.3), (200, 0.5)], [(0, 0.2), (100, 0.4), (200, 0.3)])
    flat = _runs([(0, 0.2), (100, 0.2), (200, 0.25)], [(0, 0.2), (100, 0.3), (200, 0.3)])
    out = reach_of(flat, chain, resamples=200)
    assert out["ratio_to_chain"] is None and out["ci95"][1] is None


def _dotted(change: dict, prefix: str = "") -> set[str]:
    return set().union(*(_dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
                         for k, v in change.items()))


def test_each_ablation_variant_differs_from_the_comparisons_run_in_its_one_setting() -> None:
    base = load_config(str(ROOT / "configs" / "compare_hard.yaml"), CompareConfig)
    for name, (strategy, change) in VARIANTS.items():
        variant = variant_config(base, name)
        assert variant.strategies == (strategy,) and variant.seeds == base.seeds[:3]
        differ = {key for key, _, _ in config_differences(
            config_to_dict(arm_config(base, strategy, 1)),
            config_to_dict(arm_config(variant, strategy, 1)), ("runs_dir",))}
        assert differ == _dotted(change), (name, differ)


def test_reach_of_has_no_ratio_when_chains_final_is_not_above_its_start() -> None:
    chain = _runs([(0, 0.3), (100, 0.3), (200, 0.3)], [(0, 0.3), (100, 0.2), (200, 0.3)])
    tree = _runs([(0, 0.3), (100, 0.4), (200, 0.5)], [(0, 0.3), (100, 0.4), (200, 0.5)])
    out = reach_of(tree, chain, resamples=200)
    assert out["ratio_to_chain"] is None
    assert out["ci95"] == [None, None]  # every resample: chain reaches its final at 0 tokens


def test_per_leaf_divides_tokens_and_leaf_endings_by_leaves_and_skips_eval_and_cut_lines(
        tmp_path):
    run = tmp_path / "runs" / "tree_grpo_seed0"
    run.mkdir(parents=True)
    steps = [{"step": 1, "leaves": 10, "tokens": {"generated": 1000, "computed": 3000},
              "rollout_seconds": 100.0, "update_seconds": 50.0,
              "status": {"expanded": 4, "terminal": 6, "budget": 4}},
             {"step": 2, "leaves": 30, "tokens": {"generated": 1000, "computed": 5000},
              "rollout_seconds": 60.0, "update_seconds": 30.0,
              "status": {"expanded": 9, "terminal": 24, "truncated": 6}}]
    lines = [json.dumps(steps[0]), json.dumps({"eval": {"success_rate": 0.5}}),
             json.dumps(steps[1]), '{"step": 3, "lea']  # an evaluation line, a cut line
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text(json.dumps(
        {"final_eval": {"success_rate": 0.25, "ci95_low": 0.1, "ci95_high": 0.45}}))
    out = per_leaf(tmp_path, "tree_grpo", [0])
    assert out["generated_per_leaf"] == 50.0          # 2000 tokens / 40 leaves
    assert out["computed_per_leaf"] == 200.0          # 8000 / 40
    assert out["wall_per_step_s"] == 120.0            # (150 + 90) / 2
    assert out["rollout_per_step_s"] == 80.0 and out["update_per_step_s"] == 40.0
    assert out["ended_share"] == 0.75                 # (6 + 24) terminal / 40 leaves
    assert out["budget_cut_share"] == 0.1             # 4 cut by the budget / 40
    assert out["final_wilson95"] == [0.25, 0.1, 0.45]


def test_a_vllm_comparison_run_arm_by_arm_refuses_more_seeds():
    import compare_strategies

    config = load_config(str(ROOT / "configs" / "smollm2_compare.yaml"), CompareConfig)
    more = replace(config, more_seeds=(1,), more_seeds_for=("chain",))
    with pytest.raises(ValueError, match="more_seeds"):
        compare_strategies.arms_apart(more, "configs/smollm2_compare.yaml")
