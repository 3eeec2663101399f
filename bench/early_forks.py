"""Exact-G trees for a trainer's groups: EarlyForks against G chains, on one frozen policy.

The trainer adapters (TRL, verl, rLLM) hand a trainer exactly G rows per prompt.
:class:`treeroll.strategies.EarlyForks` grows a tree of exactly G leaves, splitting each
branch in halves within its first ``within`` turns; this measures what that saves against G
independent chains, side by side on the same tasks and the same frozen policy (the shipped
base ``frozenlake-tiny``, FrozenLake in rLLM's convention, 64 tasks of the training pool drawn
from seed 0, temperature 1), for G = 4 and 8 and ``within`` = 2, 4, 6, with each ``on_end``
rule (``fork_last``, the default, keyed ``early_forks_g{G}_within{w}``; ``repeat``, keyed with
``_repeat`` after it):

* ``tokens_ratio``: generated tokens per row, tree over chains (a shared turn is generated
  once; a chain row costs its own length);
* ``row_tokens``: a row's own model tokens (forked rows run longer: a fork starts from a
  branch still alive at its turn);
* ``reward``: the rows' mean reward (a row that is a sample of the policy's episodes is
  rewarded as often as a chain row, up to noise; ``fork_last``'s second chance is not);
* ``signal``: the share of groups whose rows' rewards differ (a group-relative gradient needs
  it): sharing more turns leaves the rows less diverse;
* ``wall_ratio``: wall time to grow the groups, tree over chains (HF backend, 2 threads; the
  forks run beside their branch; one warm-up grow first, so neither side pays for it).

Prints a table and one JSON line last. About 3 minutes here.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from treeroll.adapters.tree_groups import LeafGroup, TreeGroups
from treeroll.config import EvalConfig, TrainConfig
from treeroll.envs import EnvConfig
from treeroll.policies import load_policy
from treeroll.strategies import Chain, EarlyForks
from treeroll.training.evaluation import task_pools
from treeroll.tree import path_to

TASKS = 64
WITHIN = (2, 4, 6)


def measure(groups: TreeGroups, tasks: list[int], policy: object) -> dict[str, float]:
    """Grow one group per task; tokens, row length, signal and wall time."""
    tick = time.perf_counter()
    out: list[LeafGroup] = groups.grow(tasks, policy.model, policy.tokenizer,  # type: ignore[attr-defined]
                                       seed=3)
    seconds = time.perf_counter() - tick
    rows = sum(len(g.leaves) for g in out)
    generated = sum(len(n.action_ids) for g in out for n in g.tree.nodes)
    own = sum(len(n.action_ids) for g in out for leaf in g.leaves for n in path_to(leaf)[1:])
    return {"tokens_per_row": generated / rows, "row_tokens": own / rows,
            "reward": float(np.mean([r for g in out for r in g.rewards])),
            "signal": float(np.mean([len(set(g.rewards)) > 1 for g in out])),
            "seconds": seconds, "topped_up": sum(g.topped_up for g in out)}


def main() -> None:
    """Every (G, within) against G chains; the table, then the JSON line."""
    torch.set_num_threads(2)
    policy = load_policy("frozenlake-tiny")
    train, _ = task_pools(EnvConfig(name="frozenlake_rllm"), EvalConfig())
    tasks = [int(s) for s in train[:TASKS]]
    base = TrainConfig()
    warm = replace(base, env=replace(base.env, name="frozenlake_rllm"))
    measure(TreeGroups(warm, policy.turn_format(), group_size=2), tasks[:4], policy)  # warm-up
    out: dict[str, object] = {"tasks": TASKS, "policy": "frozenlake-tiny"}
    for g in (4, 8):
        config = replace(base, env=replace(base.env, name="frozenlake_rllm"),
                         strategy=replace(base.strategy, name="chain",
                                          chain=Chain(group_size=g)))
        chain = measure(TreeGroups(config, policy.turn_format(), group_size=g), tasks, policy)
        out[f"chain_g{g}"] = {k: round(v, 3) for k, v in chain.items()}
        for within, on_end in [(w, e) for e in EarlyForks.ON_END for w in WITHIN]:
            shape = EarlyForks(group_size=g, within=within, on_end=on_end)
            tree = measure(TreeGroups(config, policy.turn_format(), group_size=g, shape=shape),
                           tasks, policy)
            row = {"tokens_ratio": round(tree["tokens_per_row"] / chain["tokens_per_row"], 4),
                   "wall_ratio": round(tree["seconds"] / chain["seconds"], 4),
                   **{k: round(v, 3) for k, v in tree.items()}}
            out[f"early_forks_g{g}_within{within}"
                + ("" if on_end == "fork_last" else f"_{on_end}")] = row
            print(f"G={g} within={within} {on_end}: tokens/row {tree['tokens_per_row']:.1f} "
                  f"vs chain {chain['tokens_per_row']:.1f} ({row['tokens_ratio']:.2f}x), "
                  f"row tokens {tree['row_tokens']:.1f} vs {chain['row_tokens']:.1f}, reward "
                  f"{tree['reward']:.3f} vs {chain['reward']:.3f}, signal {tree['signal']:.2f} vs "
                  f"{chain['signal']:.2f}, wall {row['wall_ratio']:.2f}x", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
