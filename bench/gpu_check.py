"""Does treeroll's own PyTorch path run on a CUDA GPU? The checks that need no vLLM.

``bench/gpu_engines.sh`` needs vLLM, whose wheel (with its CUDA build of torch) is far larger
than what can be carried to the lent GPU machine, which reaches no package registry. This
script checks what treeroll runs on the GPU with PyTorch alone:

* ``packed``: the tree-packed update equals the expanded update on the GPU (the tests' trees
  of ``tests/test_packed.py``, float64 and float32, the tests' tolerances); on CUDA the packed
  attention falls back from the CPU's fused two-part kernel to SDPA with an explicit mask;
* ``cpu_vs_cuda``: the packed loss on the GPU equals the CPU's (float64 weights; the losses
  take log-softmax in float32, so to float32's precision, relative 1e-6);
* ``rollout``: the HF backend with its KV-cache trie samples Tree-GRPO trees and matched
  chains from the shipped base on the GPU (``bench/rollout_cost.py``'s measurement, rLLM
  FrozenLake): ``computed_over_unique`` and tree over chain wall time per leaf;
* ``continuous``: the same with continuous batching against backend calls per round, and
  whether both give the same trees on the GPU.

Each check reports ``ok`` and, when it fails, the error's last line (the traceback goes to
stderr): what breaks on a GPU is the finding. Prints one JSON line last.

    python bench/gpu_check.py --quick
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))


def _checked(name: str, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one check; its figures with ``ok``, or ``ok: false`` and the error."""
    tick = time.perf_counter()
    try:
        result = {"ok": True, **check()}
    except Exception as error:  # a failure on the GPU is the finding
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    result["seconds"] = round(time.perf_counter() - tick, 1)
    print(name, json.dumps(result), file=sys.stderr, flush=True)
    return result


def _gradients(model: Any, run: Callable[[], dict[str, float]]) -> tuple[dict[str, float],
                                                                        dict[str, torch.Tensor]]:
    model.zero_grad()
    metrics = run()
    return metrics, {n: p.grad.detach().clone() for n, p in model.named_parameters()
                     if p.grad is not None}


def packed_on_gpu() -> dict[str, Any]:
    """Packed vs expanded on CUDA over the tests' tree shapes; the worst relative errors."""
    from test_packed import SHAPES, TOLERANCE, items_of, models, random_tree
    from treeroll.training.loss import LossConfig, expanded_backward
    from treeroll.training.packed import packed_backward

    worst: dict[str, float] = {}
    failures = []
    for dtype in (torch.float64, torch.float32):
        for shape in sorted(SHAPES):
            rng = random.Random(zlib.crc32(shape.encode()) % 1000)
            trees = [random_tree(rng, g, **SHAPES[shape]) for g in range(2)]
            items = items_of(trees)
            config = LossConfig(clip_low=0.1, clip_high=0.1)
            model, _ = models(dtype)
            model = model.to("cuda")
            expanded, want = _gradients(model, partial(expanded_backward, model, items, config))
            packed, got = _gradients(model, partial(packed_backward, model, items, config))
            error = max(float((got[n] - want[n]).norm() / want[n].norm()) for n in want)
            loss_error = abs(packed["loss"] - expanded["loss"]) / max(abs(expanded["loss"]),
                                                                       1e-12)
            key = f"{shape}_{str(dtype).removeprefix('torch.')}"
            worst[key] = round(max(error, loss_error), 9)
            if max(error, loss_error) > TOLERANCE[dtype] or got.keys() != want.keys():
                failures.append(key)
    if failures:
        raise AssertionError(f"packed != expanded on CUDA for {failures}: {worst}")
    return {"max_relative_error": worst}


def cpu_versus_cuda() -> dict[str, Any]:
    """The packed loss and gradient norm of one batch on the CPU and on the GPU (float64)."""
    from test_packed import SHAPES, items_of, models, random_tree
    from treeroll.training.loss import LossConfig
    from treeroll.training.packed import packed_backward

    rng = random.Random(7)
    items = items_of([random_tree(rng, g, **SHAPES["deep"]) for g in range(3)])
    config = LossConfig(clip_low=0.1, clip_high=0.1)
    out = {}
    for device in ("cpu", "cuda"):
        model, _ = models(torch.float64)
        model = model.to(device)
        metrics, grads = _gradients(model, partial(packed_backward, model, items, config))
        norm = sum(float((g.double() ** 2).sum()) for g in grads.values()) ** 0.5
        out[device] = (metrics["loss"], norm)
    # The losses take log-softmax of float32 logits (``.float()``), so float64 weights still
    # give float32-rounded losses: the devices agree to float32's precision, not float64's.
    difference = abs(out["cpu"][0] - out["cuda"][0]) / max(abs(out["cpu"][0]), 1e-12)
    if difference > 1e-6:
        raise AssertionError(f"loss differs: cpu {out['cpu'][0]!r}, cuda {out['cuda'][0]!r}")
    return {"loss_cpu": out["cpu"][0], "loss_cuda": out["cuda"][0],
            "grad_norm_cpu": out["cpu"][1], "grad_norm_cuda": out["cuda"][1]}


def rollout_on_gpu(quick: bool) -> dict[str, Any]:
    """Tree-GRPO and matched chains through the HF backend on the GPU."""
    from rollout_cost import compare
    from server_backend import summary
    from treeroll.backends.hf import HFBackend
    from treeroll.engine import RolloutConfig
    from treeroll.envs import make_frozenlake
    from treeroll.policies import load_policy

    policy = load_policy("frozenlake-tiny")
    model = policy.model.eval().to("cuda")
    pad = policy.tokenizer.pad_token_id or 0
    seeds = np.random.default_rng(0).choice(1_000_000, size=400, replace=False)
    per_batch, repeats = (8, 2) if quick else (32, 5)
    walls, totals, _ = compare(lambda: HFBackend(model, pad_token_id=pad),
                               policy.turn_format(), lambda: make_frozenlake("rllm"), seeds,
                               RolloutConfig(max_turn_tokens=16), repeats, per_batch)
    return {**summary(walls, totals), "tasks": per_batch * repeats}


def continuous_on_gpu(quick: bool) -> dict[str, Any]:
    """Continuous batching (``rollout.continuous``) against backend calls per round (both
    unsynchronised) on the GPU: Tree-GRPO trees and matched chains on the same tasks, the
    share of tasks whose trees hold the same root-to-leaf paths both ways (equal on the CPU,
    a test; on CUDA a different batch composition may round differently and flip a sample),
    and each mode's figures."""
    from rollout_cost import compare
    from server_backend import summary
    from treeroll.backends.hf import HFBackend
    from treeroll.engine import RolloutConfig, rollout
    from treeroll.envs import make_frozenlake
    from treeroll.policies import load_policy
    from treeroll.strategies import TreeGRPO
    from treeroll.tree import leaves, path_to

    policy = load_policy("frozenlake-tiny")
    model = policy.model.eval().to("cuda")
    pad = policy.tokenizer.pad_token_id or 0
    seeds = np.random.default_rng(0).choice(1_000_000, size=400, replace=False)
    per_batch, repeats = (8, 2) if quick else (16, 2)
    lake = lambda: make_frozenlake("rllm")
    out: dict[str, Any] = {}
    paths = {}
    for name, continuous in (("calls", False), ("continuous", True)):
        config = RolloutConfig(max_turn_tokens=16, synchronous=False, continuous=continuous)
        walls, totals, _ = compare(lambda: HFBackend(model, pad_token_id=pad),
                                   policy.turn_format(), lake, seeds, config, repeats,
                                   per_batch)
        out[name] = summary(walls, totals)
        batch = rollout(seeds[:per_batch], lake, HFBackend(model, pad_token_id=pad),
                        policy.turn_format(), TreeGRPO(m=4, n=2, l=1), config=config, seed=5)
        paths[name] = [sorted(tuple(tuple(n.action_ids) for n in path_to(leaf))
                              for leaf in leaves(tree)) for tree in batch.trees]
    same = sum(a == b for a, b in zip(paths["calls"], paths["continuous"], strict=True))
    out["same_trees_share"] = round(same / per_batch, 4)
    out["continuous_over_calls_tree_wall_per_leaf"] = round(
        out["continuous"]["tree_wall_per_leaf_ms"] / out["calls"]["tree_wall_per_leaf_ms"], 4)
    out["continuous_over_calls_chain_wall_per_leaf"] = round(
        out["continuous"]["chain_wall_per_leaf_ms"] / out["calls"]["chain_wall_per_leaf_ms"], 4)
    out["tasks"] = per_batch * repeats
    return out


def main() -> None:
    """Every check; the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 tasks a batch, two repeats")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    results = {"packed": _checked("packed", packed_on_gpu),
               "cpu_vs_cuda": _checked("cpu_vs_cuda", cpu_versus_cuda),
               "rollout": _checked("rollout", lambda: rollout_on_gpu(args.quick)),
               "continuous": _checked("continuous", lambda: continuous_on_gpu(args.quick))}
    import transformers

    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "transformers": transformers.__version__,
                      "all_ok": all(r["ok"] for r in results.values()), **results}))


if __name__ == "__main__":
    main()
