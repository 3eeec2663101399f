"""Each plug-in's settings sit in its own block and are checked there; the policy loss comes
from its registry; a broken entry point is skipped, not fatal; keys of the unreleased 0.1
layout are unknown keys like any other (its migration layer is gone, issue #51)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from treeroll.checks import ConfigError
from treeroll.config import TrainConfig, load_config, merged_config
from treeroll.config_checks import check_config


def test_an_estimators_block_set_for_another_estimator_is_refused_naming_both():
    from treeroll.credit import make_estimator

    config = merged_config(TrainConfig(), {"advantage": {"name": "grpo",
                                                         "gigpo": {"omega": 0.5}}}).advantage
    with pytest.raises(ValueError, match=r"advantage\.gigpo\.omega=0\.5 is for the 'gigpo'"):
        make_estimator(config)
    config = merged_config(TrainConfig(), {"advantage": {"name": "gigpo",
                                                         "gigpo": {"omega": 0.5}}}).advantage
    assert make_estimator(config).keywords["omega"] == 0.5  # type: ignore[attr-defined]
    config = merged_config(TrainConfig(), {"advantage": {"name": "gigpo",
                                                         "gigpo": {"anchor": "env_state"}}})
    made = make_estimator(config.advantage)
    assert made.keywords["anchor"] == "env_state"  # type: ignore[attr-defined]
    bad = merged_config(TrainConfig(), {"advantage": {"name": "gigpo",
                                                      "gigpo": {"anchor": "cell"}}})
    with pytest.raises(ConfigError, match=r"advantage\.gigpo\.anchor is 'cell'; must be one "
                                          r"of 'observation', 'env_state'"):
        check_config(bad)


def test_the_policy_loss_comes_from_its_registry_and_an_unknown_one_is_refused():
    from treeroll.credit.objectives import POLICY_LOSSES, TruncatedIS, policy_loss

    config = merged_config(TrainConfig(), {"optim": {"loss": {"objective": "truncated_is"}}})
    assert isinstance(policy_loss(config.optim.loss), TruncatedIS)
    bad = merged_config(TrainConfig(), {"optim": {"loss": {"objective": "reinforce"}}})
    with pytest.raises(ConfigError, match=r"optim\.loss\.objective.*ppo_clip, truncated_is"):
        check_config(bad)
    wrong = merged_config(TrainConfig(), {"optim": {"loss": {"clip_high": 0.28,
                                                             "objective": "truncated_is"}}})
    with pytest.raises(ConfigError, match=r"clip-high.*only ppo_clip reads"):
        check_config(wrong)
    assert POLICY_LOSSES.names() == ["ppo_clip", "truncated_is"]


def test_optional_capabilities_are_declared_protocols():
    from treeroll.base import TurnLimitedEnv
    from treeroll.envs import make_frozenlake
    from treeroll.policies import VocabularyEnv
    from treeroll.views import GridEnv

    env = make_frozenlake("rllm", size_max=5)
    env.reset(0)
    assert isinstance(env, TurnLimitedEnv) and isinstance(env, VocabularyEnv)
    assert isinstance(env, GridEnv) and env.largest_side == 5


def test_a_broken_entry_point_is_skipped_with_a_warning_not_a_crash(tmp_path):
    import os
    import subprocess

    site = tmp_path / "site"
    info = site / "broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[treeroll.strategies]\nbroken = no_such_module:Nothing\nchain = also_missing:X\n")
    done = subprocess.run(
        [sys.executable, "-c", "from treeroll.config import TrainConfig; TrainConfig()"],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'broken' from entry point 'no_such_module:Nothing' skipped" in done.stderr
    assert "'chain' from entry point 'also_missing:X' skipped: the name is taken" in done.stderr


def test_a_plugin_block_reads_without_a_warning_and_a_key_of_the_old_layout_is_unknown(
        tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = merged_config(TrainConfig(), {"env": {"frozenlake": {"size_min": 3}},
                                               "scorer": {"blend": {"a": "degeneracy"}}})
    assert config.env.frozenlake.size_min == 3 and config.scorer.blend.a == "degeneracy"
    old = tmp_path / "old.yaml"
    old.write_text("env:\n  size_min: 3\n")
    with pytest.raises(ValueError, match=r"unknown config key env\.size_min; valid keys "
                                         r"there: .*frozenlake"):
        load_config(old)


def test_import_treeroll_installs_no_import_hook_and_old_paths_are_gone():
    done = subprocess.run(
        [sys.executable, "-c", "import sys; before = list(sys.meta_path); import treeroll; "
         "assert sys.meta_path == before, sys.meta_path; import treeroll.rollout"],
        capture_output=True, text=True, timeout=120)
    assert "ModuleNotFoundError: No module named 'treeroll.rollout'" in done.stderr, done.stderr


def test_the_command_module_runs_with_python_dash_m():
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "treeroll.cli",
                           "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout


def test_a_strategys_tree_state_is_its_own_dataclass_made_on_first_use():
    import numpy as np

    from treeroll.base import StrategyContext, tree_state
    from treeroll.strategies.patr import PATRState
    from treeroll.strategies.tree_grpo import TreeGRPOState

    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    state = tree_state(ctx, TreeGRPOState)
    state.round += 1
    assert tree_state(ctx, TreeGRPOState) is state and ctx.state.round == 1
    with pytest.raises(TypeError, match="TreeGRPOState, not a PATRState"):
        tree_state(ctx, PATRState)


def test_the_public_api_resolves_every_name_and_import_treeroll_loads_no_torch():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, importlib, types, treeroll; "
         "assert 'torch' not in sys.modules; "
         "homes = {n: m for m, names in treeroll._HOMES.items() for n in names}; "
         "import treeroll.assemble, treeroll.training.trainer; "  # submodules set attributes
         "values = {n: getattr(treeroll, n) for n in treeroll.__all__}; "
         "assert not [n for n, v in values.items() if isinstance(v, types.ModuleType)]; "
         "assert all(v is getattr(importlib.import_module(homes[n]), n) "
         "for n, v in values.items()); print(len(values))"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 30
