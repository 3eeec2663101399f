"""The README's *Where trees should pay off* part (issue #39), for ``bench/readme_results.py``.

Every number is read from a stored figure (``docs/results/compare_hard.json``,
``advantage_variance.json``, ``compare_budget.json``) or the report it copied
(``docs/compare_hard/results.json``); each hypothesis's verdict is computed from them by the
rule written in ``docs/where_trees_pay.md`` before the runs. A figure not yet made is said to
be missing, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treeroll.stats import t_interval, target_section

TREES = ("tree_grpo", "patr")
"""The trees the hypotheses name (H2, H3)."""
ARMS = ("chain", "tree_grpo", "patr", "random_tree", "igrpo")


def _interval(pair: list[float] | None) -> str:
    return "n/a" if pair is None else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _ratio(entry: dict[str, Any] | None) -> str:
    """``x0.62 [0.41, 0.95]`` from a ``reach_chain_final`` entry; ``never`` where it never
    reaches it."""
    if not entry or entry.get("ratio_to_chain") is None:
        return "never (mean curve)"
    low, high = entry["ci95"]
    top = "never" if high is None else f"{high:.2f}"
    return f"x{entry['ratio_to_chain']:.2f} [{'never' if low is None else f'{low:.2f}'}, {top}]"


def verdict_h1(hard: dict[str, Any]) -> str:
    """H1: chain's share of groups with signal <= 0.30, both trees' >= 1.5x chain's; refuted
    where the trees' share is within 1.2x of chain's."""
    shares = [hard[t]["signal_groups"] for t in TREES if t in hard]
    chain = hard["chain"]["signal_groups"]
    if chain is None or len(shares) < len(TREES) or None in shares:
        return "**not measured** (a share of groups with signal is missing)"
    if chain <= 0.30 and min(shares) >= 1.5 * chain and max(shares) > 0:
        return "**supported**"
    if max(shares) < 1.2 * chain or max(shares) == 0:
        return "**refuted**"
    missed = ([] if chain <= 0.30 else ["chain's share is above 0.30"]) + (
        [] if min(shares) >= 1.5 * chain else ["a tree's share is below 1.5x chain's"])
    return "**partly**: " + "; ".join(missed)


def verdict_h2(hard: dict[str, Any]) -> str:
    """H2: a tree ends >= 5 points above chain with separated 95% intervals; refuted where
    no tree's interval lies above chain's."""
    chain = hard["chain"]
    if chain["ci95"] is None or any(hard.get(t, {}).get("ci95") is None for t in TREES):
        return "**not measured** (an interval is missing: one seed?)"
    above = [t for t in TREES if hard[t]["ci95"][0] > chain["ci95"][1]]
    if any(hard[t]["final"] - chain["final"] >= 0.05 for t in above):
        return "**supported**"
    if not above:
        below = [t for t in TREES if hard[t]["ci95"][1] < chain["ci95"][0]]
        return ("**refuted**: " + (f"{', '.join(below)} ends below chain, intervals separated"
                                   if below else "a null result, every tree's interval "
                                   "overlaps chain's"))
    return "**partly**: above chain with separated intervals, by less than 5 points"


def verdict_h3(hard: dict[str, Any]) -> str:
    """H3: a tree reaches chain's final with <= 1/2 of chain's tokens, the ratio's bootstrap
    interval below 1; refuted where every tree's interval holds 1 or lies above it."""
    entries = [hard.get(t, {}).get("reach_chain_final") for t in TREES]
    if any(not e for e in entries):
        return "**not measured** (`reach_chain_final` is missing)"
    below = False
    for entry in entries:
        ratio, high = entry["ratio_to_chain"], entry["ci95"][1]
        if ratio is not None and ratio <= 0.5 and high is not None and high < 1:
            return "**supported**"
        below = below or (high is not None and high < 1)
    return ("**partly**: a ratio's interval lies below 1, its point ratio above 1/2" if below
            else "**refuted**: no tree's ratio has its interval below 1")


def section(results: dict[str, dict[str, Any]], quote: Callable[[str, list[str]], str],
            root: Path) -> str:
    """The markdown of the part: the hard comparison, the mechanism, the binding budget."""
    parts = ["### Where trees should pay off (issue #39, rLLM convention)\n",
             "The hypotheses, with the figure each predicts and the rule that refutes it, were "
             "written before the runs in `docs/where_trees_pay.md`; each verdict below is "
             "computed from the stored figure by that rule.\n"]
    if "compare_hard" not in results:
        parts.append(_missing("*Hard FrozenLake*", "compare_hard", "H1-H3, about 4 hours"))
    else:
        hard = results["compare_hard"]["result"]
        parts.append(_table(hard, quote, root, "compare_hard", HARD_WORDS) + "\n" + "\n".join([
            f"- H1 (signal): chain {_share(hard['chain']['signal_groups'])}, "
            + ", ".join(f"{t} {_share(hard[t]['signal_groups'])}" for t in TREES if t in hard)
            + f": {verdict_h1(hard)}.",
            "- H2 (5 points above chain, separated): "
            + ", ".join(f"{t} {100 * (hard[t]['final'] - hard['chain']['final']):+.1f}"
                        for t in TREES if t in hard) + f": {verdict_h2(hard)}.",
            "- H3 (chain's final at <= 1/2 its tokens, interval below 1): "
            + ", ".join(f"{t} {_ratio(hard[t].get('reach_chain_final'))}"
                        for t in TREES if t in hard) + f": {verdict_h3(hard)}.", ""]))
    if "advantage_variance" in results:
        parts.append(_mechanism(results["advantage_variance"]["result"], quote))
    else:
        parts.append("*H5, the mechanism* (`python bench/advantage_variance.py`): **not "
                     "measured yet**.\n")
    if "ablations_advantage" in results and "compare_hard" in results:
        parts.append(ablation_part(results["ablations_advantage"]["result"], quote,
                                   json.loads((root / "docs" / "compare_hard" / "results.json")
                                              .read_text()), root / "docs" / "ablations"))
    else:
        parts.append("*The advantage ablation* (`python bench/ablations.py --only "
                     "tree_grpo+tree_advantage patr+tree_advantage`): **not measured yet** "
                     "(about 45 minutes here).\n")
    if "compare_budget" not in results:
        parts.append(_missing("*H4, a binding budget*", "compare_budget", "about 90 minutes"))
    else:
        budget = results["compare_budget"]["result"]
        unbound = results.get("compare_strategies", {}).get("result")
        parts.append(_table(budget, quote, root, "compare_budget", BUDGET_WORDS)
                     + f"\n- H4 (the trees' lead grows when the budget binds): "
                     f"{verdict_h4(budget, unbound)}.\n")
    return "\n".join(parts)


def _missing(title: str, config: str, cost: str) -> str:
    return (f"{title} (`python bench/compare_strategies.py --config configs/{config}.yaml`): "
            f"**not measured yet** ({cost} here; resumable).\n")


HARD_WORDS = ("*Hard FrozenLake* (`configs/compare_hard.yaml`): sizes 6-9 only, from "
              "`frozenlake-tiny`")
BUDGET_WORDS = ("*H4, a binding budget* (`configs/compare_budget.yaml`): sizes 2-9 as the "
                "first comparison, from `frozenlake-tiny`")


def verdict_h4(budget: dict[str, Any], unbound: dict[str, Any] | None) -> str:
    """H4: each tree's final minus chain's is larger under the binding budget than in the
    unconstrained comparison (``compare_strategies``); refuted where it is no larger."""
    if unbound is None or any(t not in unbound or t not in budget for t in TREES):
        return "**not measured** (a comparison is missing)"
    grew = {t: (budget[t]["final"] - budget["chain"]["final"])
            - (unbound[t]["final"] - unbound["chain"]["final"]) for t in TREES}
    shown = ", ".join(f"{t} {100 * (budget[t]['final'] - budget['chain']['final']):+.1f} "
                      f"against {100 * (unbound[t]['final'] - unbound['chain']['final']):+.1f}"
                      for t in TREES)
    if all(g > 0 for g in grew.values()):
        return f"**supported** ({shown} points)"
    if not any(g > 0 for g in grew.values()):
        return f"**refuted** ({shown} points)"
    return f"**partly**: for {', '.join(t for t, g in grew.items() if g > 0)} ({shown} points)"


def _table(hard: dict[str, Any], quote: Callable[[str, list[str]], str], root: Path,
           name: str, words: str) -> str:
    """A comparison's settings, quoted line, final-success and tokens-to-target tables, and
    its curves."""
    arms = [a for a in ARMS if a in hard]
    report = json.loads((root / f"docs/{name}/results.json").read_text())
    targets = list(next(iter(report.values())).get("tokens_to_target", {}))
    rows = [f"""{words}, {hard['steps']} updates of {hard['tasks_per_step']} tasks, {hard['token_budget']} generated tokens per task per step for
every strategy (a cap), held-out success on the same {hard['eval_tasks']} tasks at every evaluation
(greedy), 95% t-intervals over seeds; chain, Tree-GRPO and PATR on more seeds than the others.
The report, with every seed, is `docs/{name}/report.md`.

{quote(name, ['steps', 'token_budget', *arms])}

| strategy | seeds | final held-out success | 95% interval | start | generated tokens | leaves per 1k tokens | groups with a signal | tokens to chain's final, over chain's |
|---|---|---|---|---|---|---|---|---|"""]
    for a in arms:
        r = hard[a]
        rows.append(f"| {a} | {r['seeds']} | {r['final']:.3f} | {_interval(r['ci95'])} | "
                    f"{r['start']:.3f} | {r['generated_tokens']:,} | "
                    f"{report[a]['leaves_per_1k_tokens']:.1f} | {_share(r['signal_groups'])} | "
                    f"{'1 (the reference)' if a == 'chain' else _ratio(r.get('reach_chain_final'))}"
                    " |")
    # the report's own tokens-to-target table, from its runs (treeroll.stats)
    lines, _ = target_section({a: report[a]["runs"] for a in arms}, [float(t) for t in targets])
    rows += ["", "Generated tokens to reach a held-out success. " + lines[3], ""] + lines[5:]
    cpu_hours = sum(report[a]["wall_seconds"] * len(report[a]["runs"]) for a in arms) / 3600
    chain_final = (hard["chain"].get("reach_chain_final") or {}).get("chain_final")
    rows += ["", f"![held-out success vs generated tokens, {name}]"
             f"(docs/{name}/success_vs_tokens.png)", "",
             f"Chain's final success: {chain_final}. The last column reads each side's "
             "seed-mean curve where it first reaches it, seeds resampled on both sides and "
             "chain's final re-estimated in each resample (bootstrap 95% interval; `never`: "
             "some resamples never reach it). Cost: "
             f"{sum(len(report[a]['runs']) for a in arms)} runs, {cpu_hours:.1f} CPU-hours (the "
             "runs' own wall times, one thread each, two at a time on the 2 cores).", "",
             *[f"- {line}" for line in [collapsed_runs(report, arms), scorer_line(hard)] if line],
             ""]
    return "\n".join(rows)


def collapsed_runs(report: dict[str, Any], arms: list[str]) -> str:
    """The runs that ended below their own start (a collapse, which a mean over seeds hides),
    each with its best evaluation; empty when none did."""
    found = []
    for a in arms:
        for i, run in enumerate(report[a]["runs"]):
            if run["final_success"] < run["start_success"]:
                best = max(s for _, s in run["curve"])
                found.append(f"{a}'s run {i + 1} of {len(report[a]['runs'])} (from "
                             f"{run['start_success']:.3f} up to {best:.3f}, then down to "
                             f"{run['final_success']:.3f})")
    if not found:
        return ""
    return ("Runs that ended below their own start: " + "; ".join(found) + ". Such a run, "
            "not its strategy's other seeds, is what widens that strategy's interval (every "
            "seed's final is in the report).")


def scorer_line(hard: dict[str, Any]) -> str:
    """PATR against random_tree (PATR's shape with random scores: the scorer's ablation),
    by their 95% intervals; empty when either is missing."""
    if "patr" not in hard or "random_tree" not in hard:
        return ""
    patr, rand = hard["patr"], hard["random_tree"]
    if patr["ci95"][0] > rand["ci95"][1]:
        said = "the process scorer adds to PATR's shape"
    elif rand["ci95"][0] > patr["ci95"][1]:
        said = "the process scorer does worse than random scores on PATR's shape"
    else:
        said = ("the intervals overlap, so the scorer adds nothing measurable here and what "
                "PATR gains over chain comes from its tree, not from where it branches")
    return (f"The scorer's ablation: random_tree (PATR's tree with random scores) "
            f"{rand['final']:.3f} {_interval(rand['ci95'])}, PATR {patr['final']:.3f} "
            f"{_interval(patr['ci95'])}: {said}.")


def _mechanism(av: dict[str, Any], quote: Callable[[str, list[str]], str]) -> str:
    rows = [f"""*H5, the mechanism: better statistics per token?* (`python bench/advantage_variance.py`).
A group-relative advantage is a leaf's reward minus the group's mean reward, an estimate of the
task's value; its noise is the same for every leaf of the group. On the frozen base, hard
FrozenLake, compare_hard's budget and shapes, {av['tasks']} training-pool tasks (never held-out
ones), {av['repeats']} groups per task and strategy: the variance of the group's leaf mean over the repeats, how
many independent chains a group is worth (`mean p(1-p)` over that variance, `p` each task's
success from {av['truth_chains']} chains without the cap) and that per 1k generated tokens, with its ratio to chain's
(bootstrap 95% interval over tasks); and the squared error against `p` and its squared bias
(which holds what the token cap cuts short and what selective branching weights).

{quote('advantage_variance', ['tasks', 'repeats', 'truth_chains', 'chain', 'tree_grpo', 'patr'])}

| strategy | leaves | cut by the cap | generated tokens | variance | worth chains | per 1k tokens | over chain's | squared error | of which bias² |
|---|---|---|---|---|---|---|---|---|---|"""]
    for a in ("chain", "tree_grpo", "patr"):
        r = av[a]
        over = "1" if a == "chain" else (
            "n/a" if r.get("ratio_to_chain") is None else f"{r['ratio_to_chain']:.2f} "
            + _interval_text(r.get("ratio_ci95")))
        worth = "n/a" if r["effective_chains"] is None else f"{r['effective_chains']:.1f}"
        per_1k = ("n/a" if r["effective_chains_per_1k_tokens"] is None
                  else f"{r['effective_chains_per_1k_tokens']:.2f}")
        cut = "n/a" if r.get("cut_by_budget") is None else f"{r['cut_by_budget']:.0%}"
        rows.append(f"| {a} | {r['leaves']:.1f} | {cut} | {r['tokens']:.0f} | {r['variance']:.4f} | "
                    f"{worth} | {per_1k} | {over} | {r['mse']:.4f} | {r['bias2']:.4f} |")
    errors = ", ".join(f"{a} {av[a]['mse']:.4f} ({av[a]['bias2'] / av[a]['mse']:.0%} of it "
                       "bias)" for a in ("chain", "tree_grpo", "patr") if av[a]["mse"] > 0)
    lower = [t for t in TREES if av[t]["mse"] < av["chain"]["mse"]]
    rows += ["", f"- H5 (better statistics per token): {verdict_h5(av)}. Only the task-level "
             "baseline is scored here, not the subtree baselines Tree-GRPO adds; a tree's "
             "leaves share prefixes, so they are not independent.",
             f"- Against each task's success without the cap, the squared error of a group's "
             f"leaf mean is {errors}: "
             + (f"lower for {', '.join(lower)} than for chain, through the bias: a chain "
                "group's mean is steady because the cap cuts many of its leaves short and "
                "they fail alike (the share cut by the cap, above), not because it estimates "
                "the task's value well." if lower else
                "no lower for the trees than for chain."), ""]
    return "\n".join(rows)


def _interval_text(pair: list[float | None] | None) -> str:
    if not pair:
        return ""
    return "[" + ", ".join("n/a" if x is None else f"{x:.2f}" for x in pair) + "]"


def verdict_h5(av: dict[str, Any]) -> str:
    """H5's statistics part: a tree's effective chains per 1k tokens over chain's, supported
    where its bootstrap interval lies above 1, refuted where every tree's lies below 1."""
    intervals = {t: av[t].get("ratio_ci95") for t in TREES if t in av}
    if any(not i or None in i for i in intervals.values()) or len(intervals) < len(TREES):
        return "**not measured** (an interval is missing)"
    above = [t for t, (low, _) in intervals.items() if low > 1]
    below = [t for t, (_, high) in intervals.items() if high < 1]
    if above:
        return f"**supported** for {', '.join(above)}"
    if len(below) == len(TREES):
        return "**refuted**: every tree's group is worth fewer chains per token than chain's"
    return "**not shown**: an interval holds 1"


def ablation_line(name: str, variant: dict[str, Any], report: dict[str, Any]) -> str:
    """One variant against its strategy's runs of the same seeds in the hard comparison's
    report (``report``: its ``results.json``; a strategy's runs are in seed order): the
    per-seed differences with their 95% t-interval, and whether that interval holds 0."""
    same = [run["final_success"] for run in report[variant["strategy"]]["runs"]]
    same = same[:len(variant["per_seed"])]
    differences = [v - c for v, c in zip(variant["per_seed"], same, strict=True)]
    mean, low, high = t_interval(differences)
    if low > 0:
        said = "higher, the interval of the paired difference above 0"
    elif high < 0:
        said = "lower, the interval of the paired difference below 0"
    else:
        said = "no measurable change (the interval of the paired difference holds 0)"
    return (f"- `{name}` ({variant['strategy']}, {json.dumps(variant['change'])}): "
            f"{variant['final']:.3f} {_interval(variant['ci95'])} against "
            f"{sum(same) / len(same):.3f} on the same seeds "
            f"({' / '.join(f'{v:.3f}' for v in variant['per_seed'])} against "
            f"{' / '.join(f'{c:.3f}' for c in same)}); paired difference "
            f"{100 * mean:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}]: {said}; groups "
            f"with a signal {_share(variant['signal_groups'])}.")


def ablation_part(ablations: dict[str, Any], quote: Callable[[str, list[str]], str],
                  report: dict[str, Any], reports: Path) -> str:
    """The advantage ablation on hard FrozenLake: each variant beside its strategy's runs of
    the same seeds in the comparison, the setting it changes named, and the variant's runs
    that ended below their start (from its report in ``reports/<variant>/results.json``)."""
    names = [k for k, v in ablations.items() if isinstance(v, dict) and "per_seed" in v]
    rows = [f"""*The advantage ablation* (`bench/ablations.py`, hard FrozenLake, seeds \
{ablations['seeds'][0]}-{ablations['seeds'][-1]}, everything as the comparison but the one \
setting named): the comparison trains every strategy with GRPO over a tree's leaves; \
Tree-GRPO's paper uses its own estimator (`advantage.name: tree`: GRPO within each of \
a task's first-level subtrees plus GRPO over all its leaves, summed). Each variant is set beside its \
strategy's runs of the same seeds in the comparison; three seeds resolve only large effects.

{quote("ablations_advantage", names)}
"""]
    for name in names:
        rows.append(ablation_line(name, ablations[name], report))
        own = reports / name / "results.json"
        if own.is_file():
            fell = collapsed_runs(json.loads(own.read_text()), [ablations[name]["strategy"]])
            if fell:
                rows.append(f"  In `{name}`: " + fell[0].lower() + fell[1:])
    return "\n".join(rows) + "\n"
