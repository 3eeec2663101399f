"""SAO as treeroll reads it: a batch baseline for single rollouts, a behaviour policy that lags,
and the truncated importance-weighted objective, through the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from treeroll.base import BatchAdvantageEstimator
from treeroll.credit import AdvantageConfig, make_estimator
from treeroll.credit.estimators import BatchBaseline
from treeroll.training.behaviour import StaleBehaviour
from treeroll.tree import NodeStatus, RolloutTree

ROOT = Path(__file__).resolve().parent.parent


def _single(task: int, reward: float) -> RolloutTree:
    tree = RolloutTree.new(task, task, task, prompt_ids=[1], prompt_text="p")
    tree.add_child(tree.root, action_ids=[3], reward=reward, terminated=True,
                   status=NodeStatus.TERMINAL)
    return tree


def test_the_batch_baseline_compares_each_task_with_the_others() -> None:
    trees = [_single(0, 1.0), _single(1, 0.0), _single(2, 0.0), _single(3, 1.0)]
    estimator = make_estimator(AdvantageConfig(name="sao"))
    assert isinstance(estimator, BatchAdvantageEstimator)
    out = estimator.over_batch(trees)
    r = np.array([1.0, 0.0, 0.0, 1.0])
    loo = np.array([(r.sum() - x) / 3 for x in r])  # the other three tasks' mean
    np.testing.assert_allclose(np.concatenate(out), (r - loo) / (r.std() + 1e-6))
    assert [len(a) for a in out] == [1, 1, 1, 1]
    np.testing.assert_allclose(np.concatenate(BatchBaseline().over_batch(trees[:1])), 0.0)
    with pytest.raises(TypeError, match="needs the whole batch"):
        estimator(trees[0])


def test_the_behaviour_policy_samples_with_the_weights_of_lag_updates_before() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    stale = StaleBehaviour(model, lag=2)
    seen = [float(stale.model.weight[0, 0])]  # before update 1: the start
    for update in range(1, 6):
        with torch.no_grad():
            model.weight.fill_(float(update))  # the weights after update `update`
        stale.after_update(model)
        seen.append(float(stale.model.weight[0, 0]))  # what the next rollout samples with
    assert seen == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]  # rollout t uses update t - 1 - lag
    resumed = StaleBehaviour(model, lag=2, history=stale.state())
    assert float(resumed.model.weight[0, 0]) == 3.0
    assert not any(p.requires_grad for p in stale.model.parameters())


def _train(runs: Path, name: str, steps: int, *extra: str) -> list[dict]:
    command = [sys.executable, "-m", "treeroll.cli", "train", "--config", "configs/tiny.yaml",
               "--runs-dir", str(runs), "--name", name, "--optim.steps", str(steps),
               "--checkpoint-every", "1", "--threads", "1", "--strategy.name", "chain",
               "--strategy.chain.group-size", "1", "--optim.tasks-per-step", "4",
               "--advantage.name", "sao", "--optim.behaviour-lag", "2",
               "--optim.loss.objective", "truncated_is", "--optim.loss.is-cap", "2.0", *extra]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=600)
    lines = (runs / name / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items()
             if k not in ("rollout_seconds", "update_seconds", "timing")} for line in lines]


def test_an_sao_run_trains_and_resumes_exactly_with_its_lagged_sampler(tmp_path) -> None:
    runs = tmp_path / "runs"
    whole = _train(runs, "whole", 4)
    assert [r["leaves"] for r in whole if "leaves" in r] == [4, 4, 4, 4]  # one per task
    assert all("loss" in r for r in whole if "leaves" in r)
    _train(runs, "split", 2)
    split = _train(runs, "split", 4, "--extend")
    assert split == whole  # the checkpoint carries the lagged weights


def test_the_lag_changes_what_the_update_sees(tmp_path) -> None:
    runs = tmp_path / "runs"  # the shipped base: some tasks succeed, so updates move weights
    base = ("--policy.init", "frozenlake-tiny", "--env.frozenlake.size-min", "2",
            "--env.frozenlake.size-max", "3")
    lagged = _train(runs, "lagged", 2, *base)
    current = _train(runs, "current", 2, *base, "--optim.behaviour-lag", "0")
    steps = [[r for r in records if "leaves" in r] for records in (lagged, current)]
    assert steps[0][0] == steps[1][0]  # step 1: both sample with the starting weights
    assert steps[0][1]["loss"] != steps[1][1]["loss"]  # step 2: w0 (lag 2) against w1


def test_settings_that_do_not_go_together_are_refused_before_work() -> None:
    from dataclasses import replace

    from treeroll.config import TrainConfig
    from treeroll.config_checks import check_config

    base = TrainConfig()
    optim, loss = base.optim, base.optim.loss
    cases = [
        (replace(base, advantage=replace(base.advantage, name="sao"),
                 optim=replace(optim, drop_zero_variance=True)), "--optim.drop-zero-variance"),
        (replace(base, optim=replace(optim, behaviour_lag=1),
                 backend=replace(base.backend, name="llamacpp")), "--optim.behaviour-lag"),
        (replace(base, optim=replace(optim, loss=replace(loss, is_cap=3.0))),
         "--optim.loss.is-cap is 3.0, which only"),
        (replace(base, optim=replace(optim, loss=replace(loss, objective="truncated_is",
                                                         clip_low=0.1))),
         "--optim.loss.clip-low is 0.1, which only ppo_clip"),
    ]
    for config, says in cases:
        with pytest.raises(ValueError, match=says):
            check_config(config)
