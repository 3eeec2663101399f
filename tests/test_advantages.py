"""Advantage estimators on trees, against loops written from the formulas."""

from __future__ import annotations

import numpy as np
import pytest

from treeroll.credit import ADVANTAGES
from treeroll.credit import estimators as advantages
from treeroll.tree import NodeStatus, RolloutTree, leaves


def _tree(structure: list[list[float]]) -> RolloutTree:
    """A root with one subtree per entry; subtree j branches once into len(entry) leaves with
    those rewards (a single-leaf subtree is a chain)."""
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1, 2], prompt_text="p")
    for rewards in structure:
        trunk = tree.add_child(tree.root, action_ids=[3], status=NodeStatus.EXPANDED)
        for r in rewards:
            tree.add_child(trunk, action_ids=[4], reward=r, terminated=True,
                           status=NodeStatus.TERMINAL)
    return tree


def test_grpo_matches_formula() -> None:
    tree = _tree([[1.0, 0.0], [0.0], [1.0, 1.0, 0.0]])
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(advantages.grpo(tree), (r - r.mean()) / (r.std() + 1e-6))
    np.testing.assert_allclose(advantages.dr_grpo(tree), r - r.mean())
    loo = np.array([r[i] - np.delete(r, i).mean() for i in range(len(r))])
    np.testing.assert_allclose(advantages.rloo(tree), loo)


def test_tree_is_intra_plus_inter() -> None:
    tree = _tree([[1.0, 0.0], [1.0], [1.0, 1.0, 0.0]])
    r = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    inter = (r - r.mean()) / (r.std() + 1e-6)
    intra = np.zeros(6)
    for members in ([0, 1], [3, 4, 5]):
        g = r[members]
        intra[members] = (g - g.mean()) / (g.std() + 1e-6)
    np.testing.assert_allclose(advantages.tree_advantage(tree), intra + inter)
    # The singleton subtree (reward 1): intra 0 by default, its raw reward 1 under verl's
    # mean 0 / std 1; every other leaf is unchanged.
    verl = advantages.tree_advantage(tree, singleton="verl")
    assert advantages.tree_advantage(tree)[2] == pytest.approx(inter[2])
    assert verl[2] == pytest.approx(inter[2] + 1.0)
    np.testing.assert_allclose(np.delete(verl, 2), np.delete(intra + inter, 2))


def test_sample_std_option() -> None:
    """``std="sample"`` divides by the unbiased std (ddof=1, as verl's torch.std), in GRPO and
    in both parts of the tree advantage; the default stays the population std."""
    tree = _tree([[1.0, 0.0], [1.0], [1.0, 1.0, 0.0]])
    r = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])

    def sample(g: np.ndarray) -> np.ndarray:
        return (g - g.mean()) / (g.std(ddof=1) + 1e-6)

    np.testing.assert_allclose(advantages.grpo(tree, std="sample"), sample(r))
    np.testing.assert_allclose(advantages.grpo(tree), (r - r.mean()) / (r.std() + 1e-6))
    intra = np.zeros(6)
    for members in ([0, 1], [3, 4, 5]):
        intra[members] = sample(r[members])
    np.testing.assert_allclose(advantages.tree_advantage(tree, std="sample"), intra + sample(r))
    with pytest.raises(ValueError, match="'population' or 'sample'"):
        advantages.grpo(tree, std="biased")


def test_branching_factor_one_gives_chain_grpo() -> None:
    """A tree that never branches (M chains, no expansion) is exactly chain GRPO."""
    tree = _tree([[1.0], [0.0], [0.0], [1.0], [1.0]])
    np.testing.assert_array_equal(advantages.tree_advantage(tree), advantages.grpo(tree))


def test_dropped_leaves_leave_the_group() -> None:
    tree = _tree([[1.0, 0.0, 1.0]])
    leaves(tree)[0].status = NodeStatus.DROPPED
    assert len(advantages.grpo(tree)) == 2


def test_constant_group_has_zero_advantage_and_registry() -> None:
    tree = _tree([[1.0, 1.0], [1.0]])
    for name in ("grpo", "dr_grpo", "rloo", "tree"):
        np.testing.assert_allclose(ADVANTAGES.get(name)(tree), 0.0, atol=1e-9)
    assert all(abs(v) < 1e-12 for v in advantages.treerl(tree).values())
    assert all(np.allclose(turns, 0.0) for turns in advantages.gigpo(tree))
    assert all(abs(v) < 1e-12 for v in advantages.arpo_hard(tree).values())
    valid = ("valid: arpo_hard, dr_grpo, gigpo, grpo, planpo, progress, rloo, sao, tree, "
             "treepo, treerl")
    with pytest.raises(ValueError, match=valid):
        ADVANTAGES.get("nope")


def test_configured_estimator_gets_its_hyper_parameters(tmp_path) -> None:
    """make_estimator binds advantage.std/singleton/eps; an option the estimator does not
    take is an error naming it, not silently ignored; YAML reaches the same fields."""
    from treeroll.config import load_config
    from treeroll.credit import AdvantageConfig, make_estimator

    tree = _tree([[1.0, 0.0], [1.0], [1.0, 1.0, 0.0]])
    bound = make_estimator(AdvantageConfig(name="tree", std="sample", singleton="verl", eps=0.1))
    np.testing.assert_allclose(bound(tree), advantages.tree_advantage(
        tree, std="sample", singleton="verl", eps=0.1))
    np.testing.assert_allclose(make_estimator(AdvantageConfig(name="grpo", eps=0.5))(tree),
                               advantages.grpo(tree, eps=0.5))
    np.testing.assert_allclose(make_estimator(AdvantageConfig(name="rloo"))(tree),
                               advantages.rloo(tree))
    with pytest.raises(ValueError, match=r"advantage\.std.*'rloo'"):
        make_estimator(AdvantageConfig(name="rloo", std="sample"))
    with pytest.raises(ValueError, match=r"advantage\.eps.*'dr_grpo'"):
        make_estimator(AdvantageConfig(name="dr_grpo", eps=0.1))
    from treeroll.checks import validate

    with pytest.raises(ValueError, match=r"--advantage\.std is 'unbiased'; must be one of"):
        validate(AdvantageConfig(std="unbiased"), "advantage")
    with pytest.raises(ValueError, match=r"--advantage\.singleton is 'one'; must be one of"):
        validate(AdvantageConfig(singleton="one"), "advantage")
    path = tmp_path / "advantage.yaml"
    path.write_text("advantage: {name: tree, std: sample, singleton: verl, eps: 0.01}\n")
    config = load_config(path).advantage
    assert (config.name, config.std, config.singleton, config.eps) == ("tree", "sample", "verl",
                                                                       0.01)


def test_treerl_is_global_plus_local_node_value_over_sqrt_leaves() -> None:
    """TreeRL on a hand tree: V(root) = 4/6; subtree 0 trunk V = 1/2, its leaves 1 and 0;
    subtree 2 trunk V = 2/3."""
    tree = _tree([[1.0, 0.0], [1.0], [1.0, 1.0, 0.0]])
    values = advantages.treerl(tree)
    root = 4 / 6
    trunks = [n for n in tree.root.children]
    expected_trunk = [((v - root) + (v - root)) / np.sqrt(k)
                      for v, k in ((0.5, 2), (1.0, 1), (2 / 3, 3))]
    np.testing.assert_allclose([values[t.id] for t in trunks], expected_trunk)
    first_leaf = trunks[0].children[0]  # reward 1 under a trunk of value 1/2
    assert np.isclose(values[first_leaf.id], (1 - root) + (1 - 0.5))
    raw = advantages.treerl(tree, leaf_normalise=False)
    assert np.isclose(raw[trunks[2].id], 2 * (2 / 3 - root))


def test_token_credit_spreads_turn_values_over_model_tokens_only() -> None:
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="p")
    a = tree.add_child(tree.root, action_ids=[5, 6], observation_ids=[7, 8, 9],
                       status=NodeStatus.EXPANDED)
    b = tree.add_child(a, action_ids=[10], reward=1.0, terminated=True,
                       status=NodeStatus.TERMINAL)
    c = tree.add_child(a, action_ids=[11, 12], reward=0.0, terminated=True,
                       status=NodeStatus.TERMINAL)
    per_node = advantages.token_credit(tree, {a.id: 0.5, b.id: 2.0, c.id: -1.0})
    np.testing.assert_array_equal(per_node[0], [0.5, 0.5, 0, 0, 0, 2.0])
    np.testing.assert_array_equal(per_node[1], [0.5, 0.5, 0, 0, 0, -1.0, -1.0])
    per_leaf = advantages.token_credit(tree, np.array([1.0, -1.0]))
    assert per_leaf == [1.0, -1.0]
    per_turn = advantages.token_credit(tree, [np.array([1.0, 2.0]), np.array([3.0, 4.0])])
    np.testing.assert_array_equal(per_turn[1], [3, 3, 0, 0, 0, 4, 4])
    with pytest.raises(ValueError, match="no value for node"):
        advantages.token_credit(tree, {a.id: 1.0})
    with pytest.raises(ValueError, match="3 values for 2 leaves"):
        advantages.token_credit(tree, np.zeros(3))
    with pytest.raises(ValueError, match="1 values for 2 turns"):
        advantages.token_credit(tree, [np.zeros(1), np.zeros(2)])


def test_gigpo_step_groups_gather_turns_from_the_same_state_across_branches() -> None:
    """GiGPO on a tree: the step term standardises discounted returns among the turns taken
    from one observation, wherever in the tree they are; checked against hand-computed
    values."""
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="s0")
    # Two first turns from s0: a -> state "s1", b -> also "s1" (two paths reach one cell).
    a = tree.add_child(tree.root, action_ids=[3], observation_text="s1",
                       status=NodeStatus.EXPANDED)
    b = tree.add_child(tree.root, action_ids=[3], observation_text="s1",
                       status=NodeStatus.EXPANDED)
    tree.add_child(a, action_ids=[4], observation_text="goal", reward=1.0, terminated=True,
                   status=NodeStatus.TERMINAL)                                  # leaf 0
    tree.add_child(a, action_ids=[5], observation_text="hole", terminated=True,
                   status=NodeStatus.TERMINAL)                                  # leaf 1
    tree.add_child(b, action_ids=[5], observation_text="hole", terminated=True,
                   status=NodeStatus.TERMINAL)                                  # leaf 2
    credit = advantages.gigpo(tree, omega=0.5, gamma=0.9, eps=0.0)
    r = np.array([1.0, 0.0, 0.0])
    episode = (r - r.mean()) / r.std()
    # Turn 1 (from s0): returns 0.9 * R = [0.9, 0, 0]; turn 2 (from s1): R = [1, 0, 0].
    first = np.array([0.9, 0.0, 0.0])
    first = (first - first.mean()) / first.std()
    second = (r - r.mean()) / r.std()
    expected = [episode[i] + 0.5 * np.array([first[i], second[i]]) for i in range(3)]
    assert len(credit) == 3
    for got, want in zip(credit, expected, strict=True):
        np.testing.assert_allclose(got, want)
    # A state only one step was taken from gets no step term: give leaf 2's parent its own
    # observation and its last turn is alone in its group.
    b.observation_text = "s1'"
    alone = advantages.gigpo(tree, omega=0.5, gamma=0.9, eps=0.0)
    assert alone[2][1] == pytest.approx(episode[2])
    pair = np.array([1.0, 0.0])
    np.testing.assert_allclose([alone[0][1], alone[1][1]],
                               episode[:2] + 0.5 * (pair - pair.mean()) / pair.std())
    assert "gigpo" in ADVANTAGES


def test_gigpo_env_state_anchor_joins_a_cell_reached_at_different_turns() -> None:
    """Leaf 0 reaches cell X at turn 1 and wins from it; leaf 1 reaches X at turn 2 and
    falls: their observations differ (the turn counter), their reported states do not. With
    ``anchor="observation"`` each turn from X is alone in its group (no step term); with
    ``"env_state"`` the two are one group, standardised to +1 and -1."""
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="start, turn 0")
    x_early = tree.add_child(tree.root, action_ids=[3], observation_text="at X, turn 1",
                             info={"anchor_state": "X"}, status=NodeStatus.EXPANDED)
    tree.add_child(x_early, action_ids=[4], reward=1.0, terminated=True,
                   info={"anchor_state": "G"}, status=NodeStatus.TERMINAL)         # leaf 0
    y = tree.add_child(tree.root, action_ids=[3], observation_text="at Y, turn 1",
                       info={"anchor_state": "Y"}, status=NodeStatus.EXPANDED)
    x_late = tree.add_child(y, action_ids=[3], observation_text="at X, turn 2",
                            info={"anchor_state": "X"}, status=NodeStatus.EXPANDED)
    tree.add_child(x_late, action_ids=[5], terminated=True, info={"anchor_state": "O"},
                   status=NodeStatus.TERMINAL)                                    # leaf 1
    r = np.array([1.0, 0.0])
    episode = (r - r.mean()) / r.std()
    first = np.array([0.9, 0.0])  # both first turns from the root: returns 0.9 * R, 0.9^2 * 0
    first = (first - first.mean()) / first.std()
    by_text = advantages.gigpo(tree, gamma=0.9, eps=0.0)
    np.testing.assert_allclose(by_text[0], episode[0] + np.array([first[0], 0.0]))
    np.testing.assert_allclose(by_text[1], episode[1] + np.array([first[1], 0.0, 0.0]))
    by_state = advantages.gigpo(tree, gamma=0.9, eps=0.0, anchor="env_state")
    np.testing.assert_allclose(by_state[0], episode[0] + np.array([first[0], 1.0]))
    np.testing.assert_allclose(by_state[1], episode[1] + np.array([first[1], 0.0, -1.0]))
    with pytest.raises(ValueError, match="anchor='cell'; valid: observation, env_state"):
        advantages.gigpo(tree, anchor="cell")


def test_treepo_averages_prefix_subgroup_baselines_over_depths() -> None:
    """``_tree([[1, 0], [0], [1, 1, 0]])``: the root group (all six leaves) at depth 0, then
    each trunk's leaves at depth 1 (the lone leaf of trunk 1 skips it); leaf nodes are groups
    of one. Hand-computed, then divided by the std of the six values."""
    tree = _tree([[1.0, 0.0], [0.0], [1.0, 1.0, 0.0]])
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    root = r.mean()
    raw = np.array([((1 - root) + (1 - 0.5)) / 2, ((0 - root) + (0 - 0.5)) / 2, 0 - root,
                    ((1 - root) + (1 - 2 / 3)) / 2, ((1 - root) + (1 - 2 / 3)) / 2,
                    ((0 - root) + (0 - 2 / 3)) / 2])
    np.testing.assert_allclose(advantages.treepo(tree, eps=0.0), raw / raw.std())
    np.testing.assert_allclose(advantages.treepo(_tree([[1.0, 1.0], [1.0]])), 0.0)


def test_progress_conditioned_ranks_an_all_failure_group_by_states_only_it_reached() -> None:
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="s0")
    trunk = tree.add_child(tree.root, action_ids=[3], observation_text="shared",
                           status=NodeStatus.EXPANDED)
    explorer = tree.add_child(trunk, action_ids=[3], observation_text="new1",
                              status=NodeStatus.EXPANDED)
    tree.add_child(explorer, action_ids=[3], observation_text="new2", terminated=True,
                   status=NodeStatus.TERMINAL)                     # leaf 0: two own states
    tree.add_child(trunk, action_ids=[4], observation_text="hole", terminated=True,
                   status=NodeStatus.TERMINAL)                     # leaf 1: one own state
    tree.add_child(trunk, action_ids=[4], observation_text="shared", terminated=True,
                   status=NodeStatus.TERMINAL)                     # leaf 2: nothing of its own
    coverage = np.array([2.0, 1.0, 0.0])
    np.testing.assert_allclose(advantages.progress_conditioned(tree, eps=0.0),
                               (coverage - coverage.mean()) / coverage.std())
    # One success: plain GRPO on the rewards, coverage ignored.
    tree.nodes[-1].reward = 1.0
    r = np.array([0.0, 0.0, 1.0])
    np.testing.assert_allclose(advantages.progress_conditioned(tree, eps=0.0),
                               (r - r.mean()) / r.std())


def test_planpo_favours_shorter_successes_and_never_short_failures() -> None:
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="s0")
    quick = tree.add_child(tree.root, action_ids=[3], reward=1.0, terminated=True,
                           status=NodeStatus.TERMINAL)                # success in 1 turn
    slow = tree.add_child(tree.root, action_ids=[3], status=NodeStatus.EXPANDED)
    slow = tree.add_child(slow, action_ids=[3], status=NodeStatus.EXPANDED)
    tree.add_child(slow, action_ids=[3], reward=1.0, terminated=True,
                   status=NodeStatus.TERMINAL)                        # success in 3 turns
    tree.add_child(tree.root, action_ids=[4], terminated=True,
                   status=NodeStatus.TERMINAL)                        # failure in 1 turn
    shaped = np.array([1.0 * (1 + 0.5), 1.0, 0.0])  # beta 0.5: the quick one gets all of it
    got = advantages.planpo(tree, beta=0.5, eps=0.0)
    np.testing.assert_allclose(got, (shaped - shaped.mean()) / shaped.std())
    assert got[0] > got[1] > got[2]
    assert quick.depth == 1
    np.testing.assert_allclose(advantages.planpo(tree, beta=0.0), advantages.grpo(tree))


def test_arpo_hard_gives_a_shared_turn_the_mean_grpo_advantage_of_its_leaves() -> None:
    """Subtree 0's trunk is shared by a success and a failure, subtree 2's by two successes
    and a failure: each trunk gets the mean of its leaves' GRPO advantages, each leaf turn
    its own; the per-token credit puts the trunk's value on every leaf through it."""
    tree = _tree([[1.0, 0.0], [1.0], [1.0, 1.0, 0.0]])
    hard = advantages.arpo_hard(tree)
    grpo = advantages.grpo(tree)
    group = leaves(tree)
    trunks = list(tree.root.children)
    assert tree.root.id not in hard
    for trunk, members in zip(trunks, ([0, 1], [2], [3, 4, 5]), strict=True):
        assert np.isclose(hard[trunk.id], grpo[members].mean())
    for index, leaf in enumerate(group):
        assert np.isclose(hard[leaf.id], grpo[index])
    assert hard[trunks[0].id] != hard[group[0].id]  # the shared turn is not the leaf's value
    credit = advantages.token_credit(tree, hard)
    first_trunk_tokens = len(trunks[0].action_ids)
    np.testing.assert_allclose(credit[0][:first_trunk_tokens], hard[trunks[0].id])
    np.testing.assert_allclose(credit[1][:first_trunk_tokens], hard[trunks[0].id])
    assert ADVANTAGES.get("arpo_hard") is advantages.arpo_hard
