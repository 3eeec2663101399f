"""Rollout cost through vLLM on a GPU, side by side with the transformers backend on the same
GPU (run by ``bench/gpu_engines.sh``; it needs CUDA and vLLM, neither of which this project's
CPU machines have, so it has not been run here).

The measurement of ``bench/server_backend.py`` (Tree-GRPO vs chains matched to the tree's
leaves, FrozenLake in rLLM's convention, the shipped base policy ``frozenlake-tiny``), on:

* ``hf``: the transformers backend with its KV-cache trie, on the GPU;
* ``vllm``: ``treeroll.backends.vllm.VLLMBackend`` over ``vllm.LLM`` with prefix caching and
  ``logprobs_mode="processed_logprobs"``, token ids in (``skip_tokenizer_init``); each run
  starts from an empty cache (a new salt and ``reset_prefix_cache()``).

Also ``vllm_logprob_max_error``: the largest difference between vLLM's logprob of a sampled
id and the transformers model's, recomputed from scratch in float32, over one batch (it checks
that the logprobs are those of the distribution sampled from; in bfloat16, vLLM's default
here, expect rounding of about 1e-2); ``vllm_seeded_repeat_equal``: the same seeded requests
twice give the same tokens; ``vllm_weight_update_changes_samples``: after
``load_weights`` of perturbed weights the same seeded requests sample differently, and after
loading the original weights back they sample as before (vLLM's in-process weight path).
Prints one JSON line last. Written against vLLM 0.34.0 (``bench/gpu_engines.sh`` pins it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_cost import compare
from server_backend import summary
from treeroll.backends.hf import HFBackend
from treeroll.backends.vllm import VLLMBackend, make_llm
from treeroll.base import GenerationRequest, SamplingParams
from treeroll.engine import RolloutConfig
from treeroll.envs import make_frozenlake
from treeroll.policies import load_policy


def seeded_checks(backend: VLLMBackend, model: torch.nn.Module, turns) -> dict:  # type: ignore[no-untyped-def]
    """Seeded requests repeat exactly; a weight update changes them; loading the weights back
    restores them."""
    env = make_frozenlake("rllm")
    requests = [GenerationRequest(tuple(turns.prompt(env.system_prompt, env.reset(s))[0]),
                                  seed=100 + s) for s in range(8)]
    params = SamplingParams(temperature=1.0, max_new_tokens=16,
                            stop_token_ids=turns.stop_token_ids)

    def sample() -> list[list[int]]:
        backend.reset_cache()
        return [out.token_ids for out in backend.generate(requests, params)]

    first, again = sample(), sample()
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    noisy = {k: v + 0.5 * torch.randn_like(v) if v.is_floating_point() else v
             for k, v in original.items()}
    backend.load_weights(noisy)
    changed = sample()
    backend.load_weights(original)
    restored = sample()
    return {"vllm_seeded_repeat_equal": first == again,
            "vllm_weight_update_changes_samples": changed != first,
            "vllm_weights_restored_samples_equal": restored == first}


def logprob_error(backend: VLLMBackend, model: torch.nn.Module, turns) -> float:  # type: ignore[no-untyped-def]
    """Max |vLLM logprob - recomputed logprob| over sampled ids of 16 first-turn prompts."""
    env = make_frozenlake("rllm")
    prompts = [tuple(turns.prompt(env.system_prompt, env.reset(s))[0]) for s in range(16)]
    params = SamplingParams(temperature=1.0, max_new_tokens=16,
                            stop_token_ids=turns.stop_token_ids)
    outs = backend.generate([GenerationRequest(p, seed=i) for i, p in enumerate(prompts)],
                            params)
    worst = 0.0
    device = next(model.parameters()).device
    with torch.no_grad():
        for prompt, out in zip(prompts, outs, strict=True):
            ids = torch.tensor([list(prompt) + out.token_ids], device=device)
            logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
            ref = logp[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
            worst = max(worst, float((ref.cpu() - torch.tensor(out.logprobs)).abs().max()))
    return worst


def main() -> None:
    """Both backends on the GPU; the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16",
                                                                   "float32"),
                        help="vLLM's FlashAttention / FlashInfer backends take no float32")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_engines.py needs a CUDA GPU")
    per_batch, repeats = (8, 2) if args.quick else (32, 5)
    policy = load_policy("frozenlake-tiny")
    policy.model.eval()
    folder = tempfile.mkdtemp(prefix="treeroll-vllm-")
    policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    gpu_model = policy.model.to("cuda")
    turns = policy.turn_format()
    seeds = np.random.default_rng(0).choice(1_000_000, size=400, replace=False)
    settings = RolloutConfig(max_turn_tokens=16)
    llm = make_llm(folder, skip_tokenizer_init=True, dtype=args.dtype,
                   gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=True)
    vllm = VLLMBackend(llm)

    def fresh_vllm() -> VLLMBackend:
        vllm.reset_cache()
        return vllm

    lake = lambda: make_frozenlake("rllm")
    results = {}
    for name, fresh in (("hf", lambda: HFBackend(gpu_model, pad_token_id=0)),
                        ("vllm", fresh_vllm)):
        walls, totals, _ = compare(fresh, turns, lake, seeds, settings, repeats, per_batch)
        results[name] = summary(walls, totals)
    error = logprob_error(vllm, gpu_model, turns)
    checks = seeded_checks(vllm, gpu_model, turns)
    print(json.dumps({
        "computed_over_unique": {k: r["computed_over_unique"] for k, r in results.items()},
        "tree_over_chain_wall_per_leaf": {k: r["tree_over_chain_wall_per_leaf"]
                                          for k, r in results.items()},
        "vllm_logprob_max_error": round(error, 6), **checks, "vllm_dtype": args.dtype,
        "backends": results,
        "gpu": torch.cuda.get_device_name(0), "tasks": per_batch * repeats,
        "policy": "frozenlake-tiny (shipped base); transformers backend float32",
        "convention": "frozenlake rllm (non-slippery, sizes 2-9)",
    }))


if __name__ == "__main__":
    main()
