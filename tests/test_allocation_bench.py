"""``bench/allocation.py``'s arithmetic: the target, tokens to reach it, the ratio to chain."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from allocation import summarise, tokens_to_target


def _row(*curves: list[tuple[float, float]]) -> dict:
    return {"runs": [{"curve": c} for c in curves], "final_success": curves[0][-1][1],
            "generated_tokens": curves[0][-1][0]}


def test_tokens_to_target_takes_the_first_evaluation_whose_seed_mean_reaches_it() -> None:
    runs = _row([(0, 0.50), (100, 0.52), (200, 0.56)],
                [(0, 0.50), (120, 0.56), (220, 0.52)])["runs"]
    assert tokens_to_target(runs, 0.54) == 110.0  # seed means 0.50, 0.54, 0.54
    assert tokens_to_target(runs, 0.60) is None


def test_summary_states_the_target_and_divides_by_chain() -> None:
    results = {"chain": _row([(0, 0.5), (100, 0.51), (200, 0.54)]),
               "chain+vigor": _row([(0, 0.5), (80, 0.53), (160, 0.55)]),
               "patr": _row([(0, 0.5), (60, 0.5), (130, 0.52)])}
    out = summarise(results, 0.03)
    assert out["target_success"] == 0.53 and out["start_success"] == 0.5
    assert out["chain"]["tokens_to_target"] == 200 and out["chain"]["over_chain"] == 1.0
    assert out["chain+vigor"]["over_chain"] == 0.4
    assert out["patr"]["tokens_to_target"] is None and out["patr"]["over_chain"] is None
