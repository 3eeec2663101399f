"""treeroll's TRL ``rollout_func``: TRL's real ``GRPOTrainer`` trains on tree leaves.

The end-to-end test runs TRL's trainer for a few steps on CPU with the shipped base on
FrozenLake; the others pin what a row is (the tree's exact token path, its environment mask,
the sampling distribution's logprobs) and how a group is made exactly ``num_generations``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from treeroll.adapters.tree_groups import TreeGroups, choose_leaves
from treeroll.adapters.trl import TreeRolloutFunc, env_reward, task_dataset, tree_credit
from treeroll.config import TrainConfig
from treeroll.credit.estimators import grpo
from treeroll.policies import load_policy
from treeroll.strategies import Chain
from treeroll.tree import RolloutTree, leaves, path_to

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def settings(strategy: str = "tree_grpo", **rollout: object) -> TrainConfig:
    """FrozenLake in rLLM's convention with ``strategy``."""
    config = TrainConfig()
    return replace(config, env=replace(config.env, name="frozenlake_rllm"),
                   strategy=replace(config.strategy, name=strategy),
                   rollout=replace(config.rollout, **rollout))


def fake_trainer(policy, temperature: float = 1.0, top_p: float = 1.0) -> SimpleNamespace:
    """What a rollout_func reads of a GRPOTrainer."""
    return SimpleNamespace(model=policy.model, processing_class=policy.tokenizer,
                           accelerator=SimpleNamespace(unwrap_model=lambda m: m,
                                                       process_index=0),
                           args=SimpleNamespace(temperature=temperature, top_p=top_p))


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return load_policy("frozenlake-tiny")


def repeated(rollout_func: TreeRolloutFunc, seeds: list[int], g: int) -> list[str]:
    """Prompts as TRL's RepeatSampler hands them over: each task ``g`` times in a row."""
    return [rollout_func.prompt_of(s) for s in seeds for _ in range(g)]


def test_trl_grpo_trainer_trains_on_tree_leaves_with_environment_tokens_masked(policy,
                                                                               tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    model = load_policy("frozenlake-tiny").model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rollout_func = TreeRolloutFunc(settings(), policy.turn_format(), num_generations=4)
    dataset = task_dataset(rollout_func, list(range(100, 108)))
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8,
                      num_generations=4, max_steps=3, learning_rate=1e-3, logging_steps=1,
                      report_to=[], use_cpu=True, beta=0.0, save_strategy="no",
                      max_completion_length=256, bf16=False, seed=0)
    seen: list[dict] = []

    def recording(prompts, trainer):  # type: ignore[no-untyped-def]
        out = rollout_func(prompts, trainer)
        seen.append({"out": out, "groups": list(rollout_func.last_groups)})
        return out

    rewarded: list[list[float]] = []

    def reward(completions, tree_reward, **kwargs):  # type: ignore[no-untyped-def]
        rewarded.append(list(tree_reward))
        return env_reward(completions, tree_reward, **kwargs)

    trainer = GRPOTrainer(model=model, processing_class=policy.tokenizer,
                          reward_funcs=reward, rollout_func=recording,
                          train_dataset=dataset, args=args)
    trainer.train()
    assert len(seen) == 3
    assert rewarded == [call["out"]["tree_reward"] for call in seen], (
        "TRL's reward function did not get the rows' rewards in row order")
    for call in seen:
        assert call["out"]["tree_reward"] == [r for g in call["groups"] for r in g.rewards]
    changed = [k for k in before if not torch.equal(before[k], model.state_dict()[k])]
    assert changed, "no parameter changed in three TRL steps"
    shared_rows = 0
    for call in seen:
        out, groups = call["out"], call["groups"]
        assert len(out["completion_ids"]) == 8 and len(groups) == 2
        for g, group in enumerate(groups):
            rows = range(4 * g, 4 * g + 4)
            for row, leaf in zip(rows, group.leaves, strict=True):
                path = path_to(leaf)
                assert out["prompt_ids"][row] == group.tree.root.observation_ids
                expected_ids, expected_mask = [], []
                for node in path[1:]:
                    expected_ids += node.action_ids
                    expected_mask += [1] * len(node.action_ids)
                    if node is not leaf:
                        expected_ids += node.observation_ids
                        expected_mask += [0] * len(node.observation_ids)
                assert out["completion_ids"][row] == expected_ids
                assert out["env_mask"][row] == expected_mask
                assert out["tree_node_path"][row] == [n.id for n in path]
            paths = [out["tree_node_path"][row] for row in rows]
            shared_rows += sum(len(set(a[1:]) & set(b[1:])) > 0
                               for i, a in enumerate(paths) for b in paths[i + 1:])
    assert shared_rows > 0, "no two rows of a group share a turn: these are not tree leaves"
    assert any(0 in mask for call in seen for mask in call["out"]["env_mask"])


def test_a_row_records_the_sampling_distributions_logprobs_at_trl_temperature(policy):
    rollout_func = TreeRolloutFunc(settings(), policy.turn_format(), num_generations=4)
    prompts = repeated(rollout_func, [3, 4], 4)
    out = rollout_func(prompts, fake_trainer(policy, temperature=0.7))
    model = policy.model.eval()
    for prompt, completion, logprobs, mask in zip(out["prompt_ids"], out["completion_ids"],
                                                  out["logprobs"], out["env_mask"],
                                                  strict=True):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].double() / 0.7
        reference = torch.log_softmax(logits, -1).gather(
            1, torch.tensor(completion)[:, None])[:, 0].numpy()
        model_tokens = np.asarray(mask, dtype=bool)
        np.testing.assert_allclose(np.asarray(logprobs)[model_tokens],
                                   reference[model_tokens], atol=2e-4)
        assert np.all(np.asarray(logprobs)[~model_tokens] == 0.0)


def test_a_group_short_of_num_generations_is_topped_up_with_fresh_chains(policy):
    config = replace(settings("chain"), strategy=replace(settings("chain").strategy,
                                                         chain=Chain(group_size=2)))
    rollout_func = TreeRolloutFunc(config, policy.turn_format(), num_generations=5)
    out = rollout_func(repeated(rollout_func, [11], 5), fake_trainer(policy))
    group = rollout_func.last_groups[0]
    assert len(out["completion_ids"]) == 5 and group.topped_up == 3
    assert out["tree_top_up"] == [0, 0, 1, 1, 1]
    for leaf in group.leaves[2:]:
        assert path_to(leaf)[0] is group.tree.root and leaf.info["top_up"]


def test_a_tree_with_more_leaves_keeps_one_per_first_turn_branch_before_a_second():
    tree = RolloutTree.new(0, 0, 0, [1], "p")
    a, b, c = (tree.add_child(tree.root, action_ids=[i]) for i in (2, 3, 4))
    a1, a2, a3 = (tree.add_child(a, action_ids=[i]) for i in (5, 6, 7))
    b1 = tree.add_child(b, action_ids=[8])
    chosen = choose_leaves(tree, 3)
    assert [n.id for n in chosen] == [c.id, a1.id, b1.id]
    assert [n.id for n in choose_leaves(tree, 5)] == [c.id, a1.id, a2.id, a3.id, b1.id]
    assert [n.id for n in choose_leaves(tree, 4)] == [c.id, a1.id, a2.id, b1.id]


def test_tree_credit_is_the_estimators_advantage_over_the_whole_tree(policy):
    config = settings("chain", max_leaves=6)
    config = replace(config, strategy=replace(config.strategy, chain=Chain(group_size=6)))
    groups = TreeGroups(config, policy.turn_format(), group_size=4)
    group = groups.grow([5], policy.model, policy.tokenizer, seed=1)[0]
    everyone = leaves(group.tree)
    assert len(everyone) == 6 and len(group.leaves) == 4
    whole_tree = grpo(group.tree)  # over all 6 leaves, not only the 4 handed over
    chosen = [everyone.index(leaf) for leaf in group.leaves]
    rows = {"completions": [None] * 4, "tree_reward": group.rewards,
            "tree_credit": group.scalar_credit()}
    np.testing.assert_allclose(tree_credit(**rows), whole_tree[chosen], atol=1e-12)
    assert env_reward(**rows) == [sum(n.reward for n in path_to(leaf)) for leaf in group.leaves]


def test_rollout_func_refuses_bad_input_naming_it(policy):
    rollout_func = TreeRolloutFunc(settings(), policy.turn_format(), num_generations=4)
    good = repeated(rollout_func, [1], 4)
    with pytest.raises(ValueError, match=r"not a multiple of num_generations(_eval)?=4: "
                                         r"make per_device_train_batch_size"):
        rollout_func(good[:3], fake_trainer(policy))
    with pytest.raises(ValueError, match="'an unknown prompt'"):
        rollout_func(["an unknown prompt"] * 4, fake_trainer(policy))
    with pytest.raises(ValueError, match="mixes prompts"):
        rollout_func(good[:2] + repeated(rollout_func, [2], 2), fake_trainer(policy))
    with pytest.raises(ValueError, match=r"GRPOConfig top_p=0\.9 \(use 1\.0\)"):
        rollout_func(good, fake_trainer(policy, top_p=0.9))
    one_text = SimpleNamespace(reset=lambda seed: "the same first observation")
    same = TreeRolloutFunc(settings(), policy.turn_format(), num_generations=4,
                           make_env=lambda: one_text)
    assert same.prompt_of(1) == same.prompt_of(1)
    with pytest.raises(ValueError, match="task seeds 1 and 2 give the same prompt"):
        same.prompt_of(2)
    with pytest.raises(ValueError, match="group_size is 0"):
        TreeRolloutFunc(settings(), policy.turn_format(), num_generations=0)


def test_the_trl_example_script_trains_as_documented(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "examples/trl_grpo.py", "--steps", "2"], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'step': 2" in done.stdout.splitlines()[-1]


@pytest.mark.parametrize(("group_size", "chains"), [(4, 1), (8, 1), (8, 2)])
def test_early_forks_grow_exactly_g_leaves_sharing_early_turns_and_throw_nothing_away(
        policy, group_size, chains):
    from treeroll.strategies import EarlyForks

    shape = EarlyForks(group_size=group_size, chains=chains, within=3)
    groups = TreeGroups(settings("chain"), policy.turn_format(), group_size=group_size,
                        shape=shape)
    generated = rows = 0
    grown = groups.grow([3, 11, 27, 40], policy.model, policy.tokenizer, seed=5)
    for group in grown:
        tree = group.tree
        assert group.topped_up == 0  # the tree itself grew every leaf
        assert len(leaves(tree)) == group_size == len(group.leaves)  # and nothing was cut
        first_turns = tree.root.children
        spines = first_turns[:chains]
        if len(first_turns) > chains:  # forks from the root: a chain ended at its turn 1
            assert any(s.ended and not s.children for s in spines)
        forks = [node for node in tree.nodes[1:] if len(node.children) > 1]
        levels = (group_size // chains - 1).bit_length()  # halvings: 2 for 4 leaves, 3 for 8
        assert all(node.depth <= 3 * levels for node in forks)  # each within 3 turns
        generated += sum(len(n.action_ids) for n in tree.nodes)
        rows += sum(len(n.action_ids) for leaf in group.leaves for n in path_to(leaf)[1:])
    assert any(len(n.children) > 1 for g in grown for n in g.tree.nodes[1:])  # it forked
    assert generated < rows  # shared turns are generated once


def test_early_forks_must_match_the_group_and_be_valid(policy):
    from treeroll.strategies import EarlyForks

    for bad in ({"group_size": 6, "chains": 4}, {"group_size": 0}, {"within": 0}):
        with pytest.raises(ValueError, match="group_size >= 1, chains >= 1 dividing it"):
            EarlyForks(**bad)
    with pytest.raises(ValueError, match=r"EarlyForks\(group_size=4\) for groups of 8"):
        TreeGroups(settings("chain"), policy.turn_format(), group_size=8,
                   shape=EarlyForks(group_size=4))
