"""What does the update cost with tree packing, against one sequence per leaf?

On FrozenLake (rLLM convention) with the embedded default policy (``ModelConfig()``, after a
short *format* warm start as ``treeroll train`` does), trees are grown by the real rollout
engine with the default Tree-GRPO, Chain and PATR strategies. For each strategy's batch of
trees (one training step's worth), :func:`treeroll.training.packed.packed_backward` and
:func:`treeroll.training.loss.expanded_backward` are timed side by side in the same process,
alternating, ``--repeats`` times each (medians reported), after checking that they give the
same loss and gradients.

Peak memory: each method runs once more in a fresh subprocess that loads the same model and
items; what is reported is the growth of the process's peak resident set size
(``VmHWM`` of ``/proc/self/status``, reset through ``/proc/self/clear_refs`` just before)
during the backward, i.e. the activations,
logits and autograd buffers the method needed beyond the loaded model and data (allocator
caching included; CPU only).

Prints a few readable lines, then, as its last line, one JSON object with ``tokens_ratio``
(tokens the expanded update forwards / tokens the packed update forwards, no padding on either
side), ``speedup`` (expanded wall / packed wall, summed over the strategies' medians),
``speedup_over_ideal`` (speedup / tokens_ratio; target >= 0.8), ``peak_mb`` of both, and the
same per strategy.

    python bench/train_cost.py --quick     # 2 tasks per strategy, 3 repeats (a few minutes)
    python bench/train_cost.py             # 8 tasks per strategy (one default step), 5 repeats
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.config import PolicyConfig
from treeroll.credit.estimators import grpo
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.policies import Policy
from treeroll.policies.model import ModelConfig, build_model, build_word_tokenizer
from treeroll.strategies import PATR, Chain, TreeGRPO
from treeroll.training.loss import LossConfig, TrainItem, expanded_backward
from treeroll.training.packed import packed_backward, unique_tokens
from treeroll.training.sft_run import format_warm_start
from treeroll.tree import export_trajectories

METHODS = {"expanded": expanded_backward, "packed": packed_backward}


def make_env() -> Any:
    """The rLLM FrozenLake environment."""
    return make_frozenlake("rllm")


def train_items(trees: list[Any]) -> list[TrainItem]:
    """Every leaf with its GRPO advantage (as the trainer builds them)."""
    items = []
    for tree in trees:
        trajectories = export_trajectories(tree)
        if trajectories:
            items.extend(TrainItem(t, float(a)) for t, a in
                         zip(trajectories, grpo(tree), strict=True))
    return items


def timed(method: str, model: Any, items: list[TrainItem], config: LossConfig) -> float:
    """Wall seconds of one forward + backward (gradients zeroed first)."""
    model.zero_grad(set_to_none=True)
    tick = time.perf_counter()
    METHODS[method](model, items, config)
    return time.perf_counter() - tick


def peak_memory_mb(method: str, state_path: Path) -> float:
    """Growth of peak RSS (MB) of a fresh process during one backward of ``method``."""
    out = subprocess.run([sys.executable, __file__, "--memory-child", method, str(state_path)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _memory_child(method: str, state_path: Path) -> None:
    with state_path.open("rb") as f:
        state = pickle.load(f)
    torch.set_num_threads(state["threads"])
    model = build_model(state["vocab"], ModelConfig(), pad_token_id=state["pad"],
                        eos_token_id=state["eos"])
    model.load_state_dict(state["model"])
    model.train()
    for p in model.parameters():  # gradient buffers exist before measuring
        p.grad = torch.zeros_like(p)
    before = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    METHODS[method](model, state["items"], state["config"])
    print((_rss_kib("VmHWM") - before) / 1024)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # pragma: no cover


def main() -> None:
    """Roll out, compare, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 tasks per strategy, 3 repeats")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per strategy")
    parser.add_argument("--repeats", type=int, default=None, help="timings per method")
    parser.add_argument("--warm-start-steps", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on shared cores, OpenMP threads that wait "
                             "for a busy core make many small ops far slower than big ones)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(args.memory_child[0], Path(args.memory_child[1]))
        return
    torch.set_num_threads(args.threads)
    n_tasks = args.tasks or (2 if args.quick else 8)
    repeats = args.repeats or (3 if args.quick else 5)
    steps = args.warm_start_steps if args.warm_start_steps is not None else (
        20 if args.quick else 60)

    tokenizer = build_word_tokenizer(make_env().vocabulary_texts())
    model = build_model(len(tokenizer), ModelConfig(seed=args.seed),
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    turn_format = TurnFormat(tokenizer)
    rng = np.random.default_rng(args.seed)
    if steps:
        format_warm_start(Policy(model, tokenizer), make_env, np.arange(100_000, 110_000),
                          PolicyConfig(init=None, warm_start_steps=steps), rng)
    model.eval()
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id or 0)
    tasks = [int(s) for s in rng.integers(1_000_000, size=n_tasks)]
    config = LossConfig()
    results: dict[str, dict[str, Any]] = {}
    totals = {"expanded_s": 0.0, "packed_s": 0.0, "expanded_tokens": 0, "packed_tokens": 0,
              "expanded_mb": 0.0, "packed_mb": 0.0}
    for strategy in (TreeGRPO(), Chain(), PATR()):
        backend.reset_cache()
        tick = time.perf_counter()
        batch = rollout(tasks, make_env, backend, turn_format, strategy, config=RolloutConfig(),
                        seed=args.seed)
        rollout_s = time.perf_counter() - tick
        items = train_items(batch.trees)
        expanded_tokens = sum(len(it.trajectory.prompt_ids) + len(it.trajectory.response_ids)
                              for it in items)
        packed_tokens = unique_tokens(items)
        model.train()
        # Same loss and gradients (float32), checked with random advantages of both signs (a
        # warm-started policy often gets equal rewards in a group, hence zero advantages),
        # then the timings with the GRPO advantages, alternating.
        noisy = [TrainItem(it.trajectory, float(a))
                 for it, a in zip(items, rng.normal(size=len(items)), strict=True)]
        model.zero_grad()
        reference = expanded_backward(model, noisy, config)
        expected = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        packed = packed_backward(model, noisy, config)
        error = max(float((p.grad - g).norm() / g.norm().clamp_min(1e-30))
                    for p, g in zip(model.parameters(), expected, strict=True))
        times: dict[str, list[float]] = {"expanded": [], "packed": []}
        for _ in range(repeats):
            for method in times:
                times[method].append(timed(method, model, items, config))
        with tempfile.TemporaryDirectory() as folder:
            state_path = Path(folder) / "state.pkl"
            with state_path.open("wb") as f:
                pickle.dump({"model": model.state_dict(), "items": items, "config": config,
                             "vocab": len(tokenizer), "pad": tokenizer.pad_token_id,
                             "eos": tokenizer.eos_token_id, "threads": args.threads}, f)
            memory = {method: peak_memory_mb(method, state_path) for method in times}
        model.zero_grad(set_to_none=True)
        model.eval()
        medians = {method: statistics.median(values) for method, values in times.items()}
        ratio = expanded_tokens / max(packed_tokens, 1)
        speedup = medians["expanded"] / medians["packed"]
        results[strategy.name] = {
            "trees": len(batch.trees), "leaves": len(items),
            "expanded_tokens": expanded_tokens, "packed_tokens": packed_tokens,
            "tokens_ratio": round(ratio, 3), "expanded_s": round(medians["expanded"], 3),
            "packed_s": round(medians["packed"], 3), "speedup": round(speedup, 3),
            "speedup_over_ideal": round(speedup / ratio, 3),
            "expanded_peak_mb": round(memory["expanded"], 1),
            "packed_peak_mb": round(memory["packed"], 1),
            "loss_rel_error": abs(packed["loss"] - reference["loss"])
            / max(abs(reference["loss"]), 1e-12),
            "grad_rel_error": error, "rollout_s": round(rollout_s, 1)}
        print(f"[train_cost] {strategy.name}: {len(items)} leaves, tokens {expanded_tokens} -> "
              f"{packed_tokens} ({ratio:.2f}x), update {medians['expanded']:.2f}s -> "
              f"{medians['packed']:.2f}s ({speedup:.2f}x), peak {memory['expanded']:.0f} -> "
              f"{memory['packed']:.0f} MB, grad rel err {error:.1e}", flush=True)
        totals["expanded_s"] += medians["expanded"]
        totals["packed_s"] += medians["packed"]
        totals["expanded_tokens"] += expanded_tokens
        totals["packed_tokens"] += packed_tokens
        totals["expanded_mb"] = max(totals["expanded_mb"], memory["expanded"])
        totals["packed_mb"] = max(totals["packed_mb"], memory["packed"])
    ratio = totals["expanded_tokens"] / max(totals["packed_tokens"], 1)
    speedup = totals["expanded_s"] / totals["packed_s"]
    print(json.dumps({
        "tokens_ratio": round(ratio, 3), "speedup": round(speedup, 3),
        "speedup_over_ideal": round(speedup / ratio, 3),
        "expanded_peak_mb": round(totals["expanded_mb"], 1),
        "packed_peak_mb": round(totals["packed_mb"], 1),
        "memory_measure": "peak RSS growth during one backward, fresh process",
        "tasks_per_strategy": n_tasks, "repeats": repeats, "warm_start_steps": steps,
        "threads": args.threads, "strategies": results}))


if __name__ == "__main__":
    main()
