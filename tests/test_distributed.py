"""Tree rollouts over Ray actors equal the single-process engine's, tree for tree; one local
Ray cluster (2 CPUs) is shared by the tests of this module."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from treeroll.distributed import RayRollout, RolloutWorker, same_trees, shares
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.policies import load_policy
from treeroll.strategies import TreeGRPO
from treeroll.tree_json import tree_to_dict

CONFIG = RolloutConfig(synchronous=False, max_turn_tokens=12)
TASKS = [101, 202, 303, 404, 505]


def make_env():  # type: ignore[no-untyped-def]
    """FrozenLake, rLLM's convention (a module-level function: actors unpickle it)."""
    return make_frozenlake("rllm")


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return load_policy("frozenlake-tiny")


def _local(policy, tasks, seed=0, first_group_id=0):  # type: ignore[no-untyped-def]
    from treeroll.backends.hf import HFBackend

    backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
    batch = rollout(np.asarray(tasks), make_env, backend, policy.turn_format(),
                    TreeGRPO(m=2, n=2, l=1), config=CONFIG, seed=seed,
                    first_group_id=first_group_id)
    return [tree_to_dict(t) for t in batch.trees]


def test_same_trees_tolerates_logprob_rounding_only(policy) -> None:
    trees = _local(policy, TASKS[:2])
    nudged = copy.deepcopy(trees)
    nudged[0]["nodes"][1]["action_logprobs"][0] += 1e-7
    nudged[0]["meta"]["turns"] = 999  # batch accounting is not the tree
    nudged[0]["nodes"][1]["info"]["cost"] = {"prefill": 0, "cached": 99}
    assert same_trees(trees, nudged)
    nudged[0]["nodes"][1]["action_ids"][0] += 1
    assert not same_trees(trees, nudged)


def test_shares_cover_every_task_once_in_order() -> None:
    assert shares(5, 2) == [(0, 3), (3, 5)]
    assert shares(1, 3) == [(0, 1), (1, 1), (1, 1)]
    assert shares(0, 2) == [(0, 0), (0, 0)]


def test_a_worker_grows_its_share_as_the_whole_batch_would(policy) -> None:
    worker = RolloutWorker(copy.deepcopy(policy), make_env, TreeGRPO(m=2, n=2, l=1), CONFIG)
    trees, _ = worker.rollout(TASKS[2:], seed=4, first_group_id=2)
    assert same_trees(trees, _local(policy, TASKS, seed=4)[2:])
    assert not same_trees(trees, _local(policy, TASKS, seed=5)[2:])


def test_ray_workers_give_the_single_process_trees(cluster, policy) -> None:
    pool = RayRollout(policy, make_env, TreeGRPO(m=2, n=2, l=1), CONFIG, workers=2)
    try:
        batch = pool.rollout(TASKS, seed=7, first_group_id=10)
        assert same_trees(batch.trees, _local(policy, TASKS, seed=7, first_group_id=10))
        assert [t.tree_id for t in batch.trees] == list(range(10, 15))
        with pytest.raises(ValueError, match="batch-wide allocator"):
            pool.rollout(TASKS, allocator=object())

        new = copy.deepcopy(policy)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in new.model.parameters():
                p.add_(0.02 * torch.randn_like(p))
        pool.load_weights(new.model.state_dict())
        after = pool.rollout(TASKS, seed=7)
        assert same_trees(after.trees, _local(new, TASKS, seed=7))
        assert not same_trees(after.trees, _local(policy, TASKS, seed=7))
    finally:
        pool.shutdown()


def test_the_ray_rollout_command_saves_the_one_process_trees(cluster, policy, tmp_path) -> None:
    from treeroll.cli.commands import main as treeroll_main
    from treeroll.config import TrainConfig
    from treeroll.training.evaluation import task_pools
    from treeroll.tree_json import load_tree

    out = tmp_path / "trees"
    code = treeroll_main(["ray-rollout", "--workers", "2", "--tasks", "3", "--out", str(out),
                 "--train.rollout.max-turn-tokens", "12", "--train.strategy.name", "tree_grpo"])
    assert code == 0
    from treeroll.backends.hf import HFBackend
    from treeroll.strategies import make_strategy

    config = TrainConfig()
    config.strategy.name = "tree_grpo"
    settings = dataclasses.replace(config.rollout, max_turn_tokens=12, synchronous=False)
    tasks = task_pools(config.env, config.eval)[0][:3]
    saved = [load_tree(out / f"tree-{t}.json") for t in tasks]
    local = rollout(tasks, make_env, HFBackend(policy.model, pad_token_id=0),
                    policy.turn_format(), make_strategy(config.strategy), config=settings,
                    seed=config.seed)
    assert same_trees(saved, local.trees)


@pytest.mark.parametrize("entry", ["treeroll ray-rollout", "python -m treeroll.cli.ray_run"])
def test_the_ray_rollout_command_refuses_bad_numbers_before_any_work(entry, tmp_path,
                                                                     capsys) -> None:
    from treeroll.cli.commands import main as treeroll_main
    from treeroll.cli.ray_run import main as module_main

    def main(args: list[str]) -> int:
        return (treeroll_main(["ray-rollout", *args]) if entry.startswith("treeroll")
                else module_main(args))

    out = tmp_path / "trees"
    assert main(["--workers", "0", "--out", str(out)]) == 2
    assert "--workers is 0, must be > 0" in " ".join(capsys.readouterr().err.split())
    assert not out.exists()
