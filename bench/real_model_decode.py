"""Rollout decode speed of the SmolLM2 recipe: its backend against treeroll's HF backend.

``configs/smollm2_rl.yaml`` samples through the backend it names (the vLLM CPU engine, float32,
eager) from the shipped start ``smollm2-frozenlake`` read through its view
(``cell_coordinates_safe``). This builds that policy and backend as ``treeroll train`` does
and times, on the same seeded requests, one step's first turn of the recipe: its
``optim.tasks_per_step`` tasks (the first of its training pool) with Tree-GRPO's ``m``
roots each (8 x 4 = 32 requests), sampled as the rollout engine samples a turn (the
recipe's temperature, ``top_p`` and ``max_turn_tokens``, stopping where the turn format ends
a turn); then one request alone. The earlier HF figure (65.5 tokens/s) sampled 64 tokens
without stopping, 16 requests at once, on another host: ``decode_over_hf`` is the
comparison on equal terms.

Printed, the JSON object last:

* ``decode_tokens_per_s`` / ``decode_tokens_per_s_batch1``: the recipe's backend, sampled
  tokens per second, prompt processing included (median of ``--repeats``, its prefix cache
  emptied before each);
* ``decode_hf_tokens_per_s`` / ``decode_hf_tokens_per_s_batch1``: treeroll's HF backend on
  the same requests (timed first, so that the engine's start cannot change its threads;
  median of 2 after a warm-up request); ``decode_over_hf`` the ratio at the recipe's batch;
  ``decode_backend`` and its settings, ``decode_batch``, ``decode_prompt_tokens`` and
  ``decode_reply_tokens`` / ``decode_hf_reply_tokens`` (means per request);
  ``decode_prefill_over_distinct`` / ``decode_hf_prefill_over_distinct``: prompt tokens each
  backend computed over the distinct prompts' tokens (1: each task's prompt once, its 4
  roots served from the cache; 4: every root computed its prompt again).

Where the recipe samples through vLLM it runs in the engine's environment
(``bench/vllm_env.py``, built once). Usage: ``python bench/real_model_decode.py`` (a few
minutes); ``bench/real_model.py`` runs it for its decode figures. Further options are the
recipe's own, for trying a setting (``--backend.vllm.no-enforce-eager``, say).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
RECIPE = "configs/smollm2_rl.yaml"
TOKENS = 64


def recipe_config(overrides: list[str] | None = None) -> Any:
    """The recipe's training config, as ``treeroll train --config`` reads it (with
    ``overrides``: further ``treeroll train`` options)."""
    from treeroll.cli.commands import parse_settings
    from treeroll.config import TrainConfig

    return parse_settings(TrainConfig, ["--config", str(ROOT / RECIPE), *(overrides or [])],
                          "", command="train")


def first_turn(config: Any, policy: Any) -> list[Any]:
    """One recipe step's first turn: ``tasks_per_step`` held-out tasks, Tree-GRPO's ``m``
    seeded requests on each task's first prompt."""
    from treeroll.base import GenerationRequest
    from treeroll.envs import make_env_factory
    from treeroll.training.evaluation import task_pools

    if config.strategy.name != "tree_grpo":
        raise ValueError(f"{RECIPE}: strategy.name is {config.strategy.name!r}; this benchmark "
                         "times Tree-GRPO's first turn (its m roots a task): update it first")
    roots = config.strategy.tree_grpo.m
    make_env = make_env_factory(config.env)
    train_seeds, _ = task_pools(config.env, config.eval)
    turn_format = policy.turn_format()
    requests = []
    for task, seed in enumerate(train_seeds[:config.optim.tasks_per_step]):
        env = make_env()
        prompt = tuple(turn_format.prompt(env.system_prompt, env.reset(int(seed)))[0])
        requests += [GenerationRequest(prompt, seed=task * roots + root) for root in range(roots)]
    return requests


def rate(backend: Any, requests: list[Any], params: Any, repeats: int
         ) -> tuple[float, float, float]:
    """Median sampled tokens per second of ``backend`` on ``requests`` (cache emptied before
    each repeat), the mean tokens a request sampled, and the prompt tokens the backend
    computed (not served from its cache) over the requests' distinct prompt tokens."""
    rates, replies, computed = [], [], []
    distinct = sum(len(p) for p in {r.prompt_ids for r in requests})
    for _ in range(repeats):
        backend.reset_cache()
        start = time.perf_counter()
        done = backend.generate(requests, params)
        sampled = sum(len(c.token_ids) for c in done)
        rates.append(sampled / (time.perf_counter() - start))
        replies.append(sampled / len(requests))
        computed.append(sum(c.prefill_tokens for c in done) / distinct)
    return statistics.median(rates), statistics.fmean(replies), statistics.fmean(computed)


def _settings(backend: Any) -> dict[str, Any]:
    """The named backend's own block of the recipe (``backend.vllm``, say), as set."""
    from dataclasses import asdict, is_dataclass

    block = getattr(backend, backend.name, None)
    return asdict(block) if is_dataclass(block) and not isinstance(block, type) else {}


def main() -> None:
    """Measure; the JSON object is the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args, overrides = parser.parse_known_args()
    config = recipe_config(overrides)
    import vllm_env

    vllm_env.reexec_for(config.backend)  # the engine's environment, where the recipe names vllm
    import torch

    from treeroll.backends import make_backend
    from treeroll.backends.hf import HFBackend
    from treeroll.base import SamplingParams
    from treeroll.envs import make_env_factory
    from treeroll.policies import build_policy

    torch.set_num_threads(args.threads)
    policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                          make_env_factory(config.env), None,
                          system_in_user=config.policy.system_in_user)
    requests = first_turn(config, policy)
    rollout = config.rollout
    params = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p,
                            max_new_tokens=rollout.max_turn_tokens,
                            stop_token_ids=policy.turn_format().stop_token_ids)
    hf = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
    hf.generate(requests[:1], params)  # warm-up
    hf_rate, hf_reply, hf_prefill = rate(hf, requests, params, 2)
    hf_rate1, _, _ = rate(hf, requests[:1], params, 2)
    backend = make_backend(config.backend, policy)
    engine_rate, engine_reply, engine_prefill = rate(backend, requests, params, args.repeats)
    engine_rate1, _, _ = rate(backend, requests[:1], params, args.repeats)
    result: dict[str, Any] = {
        "decode_tokens_per_s": round(engine_rate, 1),
        "decode_tokens_per_s_batch1": round(engine_rate1, 1),
        "decode_hf_tokens_per_s": round(hf_rate, 1),
        "decode_hf_tokens_per_s_batch1": round(hf_rate1, 1),
        "decode_over_hf": round(engine_rate / hf_rate, 3),
        "decode_backend": config.backend.name,
        "decode_backend_settings": _settings(config.backend), "decode_batch": len(requests),
        "decode_policy": config.policy.init, "decode_view": policy.view,
        "decode_prompt_tokens": round(statistics.fmean(len(r.prompt_ids) for r in requests), 1),
        "decode_reply_tokens": round(engine_reply, 1), "decode_hf_reply_tokens": round(hf_reply, 1),
        "decode_prefill_over_distinct": round(engine_prefill, 3),
        "decode_hf_prefill_over_distinct": round(hf_prefill, 3),
        "threads": args.threads}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
