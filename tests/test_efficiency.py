"""Tokens to reach a held-out success: interpolation between evaluations, runs that never
reach it, bootstrap intervals over seeds, ratios to chain, and the compare report's table."""

from __future__ import annotations

import json
import math

import pytest

from treeroll.cli.compare import CompareConfig, _write_report, run_compare, seeds_of
from treeroll.stats import crossing, ratio_to, target_section, tokens_to_target


def test_crossing_interpolates_between_the_evaluations_around_it() -> None:
    curve = [(0.0, 0.2), (100.0, 0.4), (300.0, 0.8)]
    assert crossing(curve, 0.6) == pytest.approx(200.0)  # halfway from 0.4 to 0.8
    assert crossing(curve, 0.4) == 100.0  # reached at an evaluation
    assert crossing(curve, 0.1) == 0.0  # already at the start
    assert math.isinf(crossing(curve, 0.9))
    assert crossing([(0.0, 0.2), (100.0, 0.7), (200.0, 0.3), (300.0, 0.9)], 0.6) == \
        pytest.approx(80.0)  # the first crossing, not a later one


def test_bootstrap_interval_holds_the_mean_and_widens_with_spread() -> None:
    tight = [[(0.0, 0.0), (t, 1.0)] for t in (100.0, 101.0, 99.0, 100.0)]
    loose = [[(0.0, 0.0), (t, 1.0)] for t in (50.0, 150.0, 20.0, 180.0)]
    a, b = tokens_to_target(tight, 0.5), tokens_to_target(loose, 0.5)
    assert a.tokens == pytest.approx(50.0) and b.tokens == pytest.approx(50.0)
    assert a.low <= a.tokens <= a.high and b.low <= b.tokens <= b.high
    assert (b.high - b.low) > 10 * (a.high - a.low)
    assert (a.reached, a.seeds) == (4, 4)


def test_a_seed_that_never_reaches_the_target_makes_the_mean_never() -> None:
    curves = [[(0.0, 0.0), (100.0, 1.0)]] * 3 + [[(0.0, 0.0), (100.0, 0.2)]]
    reach = tokens_to_target(curves, 0.5)
    assert math.isinf(reach.tokens) and reach.reached == 3 and math.isinf(reach.high)
    assert "never (3 of 4 seeds reached it)" in reach.text()
    assert reach.as_dict()["tokens"] is None


def test_one_seed_has_no_interval_and_no_run_is_an_error() -> None:
    one = tokens_to_target([[(0.0, 0.0), (100.0, 1.0)]], 0.5)
    assert one.as_dict()["ci95"] is None and one.text() == "50 (one seed)"
    with pytest.raises(ValueError, match="at least one run"):
        tokens_to_target([], 0.5)
    assert all(math.isnan(x) for x in ratio_to([], [[(0.0, 0.0), (1.0, 1.0)]], 0.5))


def test_ratio_to_chain_and_its_interval() -> None:
    chain = [[(0.0, 0.0), (t, 1.0)] for t in (200.0, 210.0, 190.0)]
    tree = [[(0.0, 0.0), (t, 1.0)] for t in (100.0, 105.0, 95.0)]
    ratio, low, high = ratio_to(tree, chain, 0.5)
    assert ratio == pytest.approx(0.5) and low <= ratio <= high < 1.0
    assert all(math.isnan(x) for x in ratio_to(tree, [[(0.0, 0.0), (9.0, 0.1)]], 0.5))


def _run(curve: list[tuple[float, float]]) -> dict:
    return {"final_success": curve[-1][1], "start_success": curve[0][1],
            "generated_tokens": curve[-1][0], "leaves": 10, "leaves_per_1k_tokens": 10.0,
            "signal_groups": 0.5, "scorer_seconds": 0.0, "rollout_seconds": 1.0,
            "wall_seconds": 1.0, "curve": curve}


def test_the_report_gives_tokens_to_each_target_with_intervals(tmp_path) -> None:
    config = CompareConfig(report_dir=str(tmp_path), strategies=("chain", "patr"),
                           seeds=(0, 1), targets=(0.5, 0.9))
    _write_report(config, {
        "chain": [_run([(0.0, 0.2), (400.0, 0.6)]), _run([(0.0, 0.2), (600.0, 0.6)])],
        "patr": [_run([(0.0, 0.2), (200.0, 0.6)]), _run([(0.0, 0.2), (300.0, 0.6)])]})
    text = (tmp_path / "report.md").read_text()
    assert "## Generated tokens to reach a held-out success" in text
    results = json.loads((tmp_path / "results.json").read_text())
    chain, patr = results["chain"]["tokens_to_target"], results["patr"]["tokens_to_target"]
    assert chain["0.5"]["tokens"] == pytest.approx(375.0)  # 300 and 450
    assert patr["0.5"]["ratio_to_chain"][0] == pytest.approx(187.5 / 375.0, abs=1e-3)
    assert chain["0.9"]["tokens"] is None and chain["0.9"]["reached"] == 0
    lines, found = target_section({"chain": []}, ())
    assert lines == [] and found == {}


def test_more_seeds_run_only_for_the_strategies_named_and_bad_ones_are_refused(
        tmp_path) -> None:
    config = CompareConfig(report_dir=str(tmp_path), strategies=("chain", "arpo"),
                           seeds=(0, 1), more_seeds=(2, 3), more_seeds_for=("chain",))
    assert seeds_of(config, "chain") == (0, 1, 2, 3) and seeds_of(config, "arpo") == (0, 1)
    for changes, says in (({"more_seeds_for": ("patr",)}, "--more-seeds-for"),
                          ({"more_seeds": (1, 5)}, r"--more-seeds.*repeats \[1\]"),
                          ({"more_seeds": (5, 5)}, r"--more-seeds holds \[5\] twice"),
                          ({"more_seeds_for": ()}, r"--more-seeds-for is empty while"),
                          ({"more_seeds": ()}, r"--more-seeds is empty while"),
                          ({"targets": (1.5,)}, "--targets")):
        bad = CompareConfig(**{**config.__dict__, **changes})
        with pytest.raises(ValueError, match=says):
            run_compare(bad)
    assert not any(tmp_path.iterdir())
