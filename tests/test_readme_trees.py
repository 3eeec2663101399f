"""The verdict rules of ``bench/readme_trees.py``, as ``docs/where_trees_pay.md`` states them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from readme_trees import (
    ablation_line,
    collapsed_runs,
    scorer_line,
    verdict_h1,
    verdict_h2,
    verdict_h3,
    verdict_h4,
    verdict_h5,
)


def _arm(final: float = 0.4, ci: tuple[float, float] | None = (0.35, 0.45),
         signal: float | None = 0.2, ratio: float | None = 1.0,
         ratio_ci: tuple[float | None, float | None] = (0.8, 1.2)) -> dict:
    return {"final": final, "ci95": None if ci is None else list(ci), "signal_groups": signal,
            "reach_chain_final": {"chain_final": 0.4, "ratio_to_chain": ratio,
                                  "ci95": list(ratio_ci)}}


def test_h1_needs_both_trees_at_one_and_a_half_times_a_low_chain_share() -> None:
    assert verdict_h1({"chain": _arm(signal=0.2), "tree_grpo": _arm(signal=0.5),
                       "patr": _arm(signal=0.31)}) == "**supported**"
    assert verdict_h1({"chain": _arm(signal=0.2), "tree_grpo": _arm(signal=0.5),
                       "patr": _arm(signal=0.25)}).startswith("**partly**")
    assert verdict_h1({"chain": _arm(signal=0.4), "tree_grpo": _arm(signal=0.45),
                       "patr": _arm(signal=0.42)}) == "**refuted**"
    assert verdict_h1({"chain": _arm(signal=0.0), "tree_grpo": _arm(signal=0.0),
                       "patr": _arm(signal=0.0)}) == "**refuted**"
    assert verdict_h1({"chain": _arm(), "tree_grpo": _arm(signal=None),
                       "patr": _arm()}).startswith("**not measured**")


def test_h2_needs_five_points_and_an_interval_above_chains() -> None:
    chain = _arm(final=0.40, ci=(0.37, 0.43))
    assert verdict_h2({"chain": chain, "tree_grpo": _arm(final=0.47, ci=(0.44, 0.50)),
                       "patr": _arm()}) == "**supported**"
    assert verdict_h2({"chain": chain, "tree_grpo": _arm(final=0.445, ci=(0.435, 0.455)),
                       "patr": _arm()}).startswith("**partly**")
    assert "overlaps" in verdict_h2({"chain": chain, "tree_grpo": _arm(final=0.47,
                                                                       ci=(0.40, 0.54)),
                                     "patr": _arm()})
    below = verdict_h2({"chain": chain, "tree_grpo": _arm(final=0.30, ci=(0.28, 0.32)),
                        "patr": _arm()})
    assert below.startswith("**refuted**") and "below chain" in below
    assert verdict_h2({"chain": chain, "tree_grpo": _arm(ci=None),
                       "patr": _arm()}).startswith("**not measured**")


def test_h3_needs_half_the_tokens_with_the_interval_below_one() -> None:
    chain = _arm()
    assert verdict_h3({"chain": chain, "tree_grpo": _arm(ratio=0.45, ratio_ci=(0.3, 0.9)),
                       "patr": _arm()}) == "**supported**"
    assert verdict_h3({"chain": chain, "tree_grpo": _arm(ratio=0.7, ratio_ci=(0.5, 0.9)),
                       "patr": _arm()}).startswith("**partly**")
    assert verdict_h3({"chain": chain, "tree_grpo": _arm(ratio=0.45, ratio_ci=(0.2, None)),
                       "patr": _arm(ratio=None, ratio_ci=(0.5, None))}).startswith("**refuted**")
    assert verdict_h3({"chain": chain, "tree_grpo": {"final": 0.4},
                       "patr": _arm()}).startswith("**not measured**")


def test_h4_compares_each_trees_lead_with_the_unconstrained_comparisons() -> None:
    unbound = {"chain": {"final": 0.60}, "tree_grpo": {"final": 0.61}, "patr": {"final": 0.59}}
    grew = {"chain": {"final": 0.50}, "tree_grpo": {"final": 0.55}, "patr": {"final": 0.52}}
    same = {"chain": {"final": 0.50}, "tree_grpo": {"final": 0.50}, "patr": {"final": 0.48}}
    assert verdict_h4(grew, unbound).startswith("**supported**")
    assert verdict_h4(same, unbound).startswith("**refuted**")
    assert verdict_h4(grew, None).startswith("**not measured**")


def test_h5_reads_the_interval_of_effective_chains_per_token_against_one() -> None:
    def av(*intervals: tuple[float, float]) -> dict:
        return {t: {"ratio_ci95": list(i)} for t, i in zip(("tree_grpo", "patr"), intervals,
                                                           strict=True)}
    assert verdict_h5(av((1.1, 2.0), (0.5, 1.5))) == "**supported** for tree_grpo"
    assert verdict_h5(av((0.1, 0.5), (0.2, 0.9))).startswith("**refuted**")
    assert verdict_h5(av((0.1, 0.5), (0.5, 1.5))).startswith("**not shown**")


def _run(start: float, final: float, best: float) -> dict:
    return {"start_success": start, "final_success": final,
            "curve": [[0.0, start], [100.0, best], [200.0, final]]}


def test_collapsed_runs_names_only_the_runs_that_end_below_their_start() -> None:
    report = {"chain": {"runs": [_run(0.3, 0.4, 0.4), _run(0.3, 0.35, 0.36)]},
              "tree_grpo": {"runs": [_run(0.3, 0.5, 0.5), _run(0.32, 0.1, 0.52)]}}
    line = collapsed_runs(report, ["chain", "tree_grpo"])
    assert "tree_grpo's run 2 of 2 (from 0.320 up to 0.520, then down to 0.100)" in line
    assert "chain" not in line.split(":")[1]
    assert collapsed_runs({"chain": {"runs": [_run(0.3, 0.4, 0.4)]}}, ["chain"]) == ""


def test_scorer_line_judges_patr_against_random_tree_by_their_intervals() -> None:
    overlap = scorer_line({"patr": _arm(ci=(0.45, 0.55)), "random_tree": _arm(ci=(0.5, 0.6))})
    assert "adds nothing measurable" in overlap
    above = scorer_line({"patr": _arm(ci=(0.61, 0.7)), "random_tree": _arm(ci=(0.5, 0.6))})
    assert "the process scorer adds to PATR's shape" in above
    below = scorer_line({"patr": _arm(ci=(0.3, 0.4)), "random_tree": _arm(ci=(0.5, 0.6))})
    assert "does worse than random scores" in below
    assert scorer_line({"patr": _arm()}) == ""


def test_ablation_line_pairs_a_variant_with_its_strategys_runs_of_the_same_seeds() -> None:
    report = {"patr": {"runs": [{"final_success": x} for x in (0.40, 0.50, 0.60, 0.10)]}}
    variant = {"strategy": "patr", "change": {"advantage": {"name": "tree"}}, "final": 0.55,
               "ci95": [0.4, 0.7], "per_seed": [0.45, 0.55, 0.65], "signal_groups": 0.5}
    line = ablation_line("patr+tree_advantage", variant, report)
    assert "against 0.500 on the same seeds" in line  # seeds 0-2 only, not the 4th run
    assert "+5.0 points [+5.0, +5.0]" in line and "higher" in line
    variant["per_seed"] = [0.35, 0.45, 0.55]
    assert "lower" in ablation_line("v", variant, report)
    variant["per_seed"] = [0.30, 0.60, 0.60]
    assert "no measurable change" in ablation_line("v", variant, report)
