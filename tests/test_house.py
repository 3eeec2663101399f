"""The 0.2 layout: old import paths and config keys keep working for one release (with a
warning naming the new place), each plug-in's settings sit in its own block, and the policy
loss is looked up in its registry."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from treeroll.checks import ConfigError
from treeroll.config import TrainConfig, check_config, merged_config


def test_an_old_import_path_warns_and_gives_the_module_now_holding_it():
    sys.modules.pop("treeroll.rollout", None)
    with pytest.warns(DeprecationWarning, match=r"treeroll\.rollout moved to treeroll\.engine"):
        old = importlib.import_module("treeroll.rollout")
    assert old is importlib.import_module("treeroll.engine.batch")
    sys.modules.pop("treeroll.plugins", None)
    with pytest.warns(DeprecationWarning, match="treeroll.plugins moved to treeroll.assemble"):
        from treeroll.plugins import make_strategy  # the registries' old home
    from treeroll.strategies import make_strategy as now

    assert make_strategy is now


@pytest.mark.parametrize(("old", "value", "new"), [
    ({"env": {"size_min": 3}}, 3, lambda c: c.env.frozenlake.size_min),
    ({"env": {"format_penalty": 0.2}}, 0.2, lambda c: c.env.frozenlake.format_penalty),
    ({"scorer": {"blend_lambda": 0.4}}, 0.4, lambda c: c.scorer.blend.weight),
    ({"advantage": {"omega": 0.5}}, 0.5, lambda c: c.advantage.gigpo.omega),
    ({"advantage": {"beta": 0.3}}, 0.3, lambda c: c.advantage.planpo.beta),
])
def test_an_old_config_key_lands_in_its_plugins_block_with_a_warning(old, value, new):
    with pytest.warns(FutureWarning, match="config keys moved"):
        config = merged_config(TrainConfig(), old)
    assert new(config) == value


def test_an_old_command_line_option_is_rewritten_with_a_warning(tmp_path):
    from treeroll.cli.commands import _moved_flags

    with pytest.warns(FutureWarning, match="--env.frozenlake.size-min") as caught:
        args = _moved_flags(["--env.size-min", "3", "--train.env.size_max=4", "--seed", "1"])
    assert args == ["--env.frozenlake.size-min", "3", "--train.env.frozenlake.size-max=4",
                    "--seed", "1"]
    assert len(caught) == 2


def test_an_estimators_block_set_for_another_estimator_is_refused_naming_both():
    from treeroll.credit import make_estimator

    config = merged_config(TrainConfig(), {"advantage": {"name": "grpo",
                                                         "gigpo": {"omega": 0.5}}}).advantage
    with pytest.raises(ValueError, match=r"advantage\.gigpo\.omega=0\.5 is for the 'gigpo'"):
        make_estimator(config)
    config = merged_config(TrainConfig(), {"advantage": {"name": "gigpo",
                                                         "gigpo": {"omega": 0.5}}}).advantage
    assert make_estimator(config).keywords["omega"] == 0.5  # type: ignore[attr-defined]


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


def test_the_new_keys_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = merged_config(TrainConfig(), {"env": {"frozenlake": {"size_min": 3}},
                                               "scorer": {"blend": {"a": "degeneracy"}}})
    assert config.env.frozenlake.size_min == 3 and config.scorer.blend.a == "degeneracy"


def test_optional_capabilities_are_declared_protocols():
    from treeroll.base import GridEnv, TurnLimitedEnv, VocabularyEnv
    from treeroll.envs import make_frozenlake

    env = make_frozenlake("rllm", size_max=5)
    env.reset(0)
    assert isinstance(env, TurnLimitedEnv) and isinstance(env, VocabularyEnv)
    assert isinstance(env, GridEnv) and env.largest_side == 5


def _settings_of_0_1() -> dict:
    """A run folder's ``config.yaml`` as treeroll 0.1 wrote it: every key, the moved ones at
    the top of their sections, no plug-in blocks."""
    from treeroll.config import config_to_dict

    saved = config_to_dict(TrainConfig())
    for section, block in (("env", "frozenlake"), ("env", "swe"), ("scorer", "blend"),
                           ("scorer", "judge"), ("advantage", "gigpo"),
                           ("advantage", "planpo")):
        saved[section].pop(block)
    saved["env"].update(size_min=None, size_max=None, slippery=None, format_penalty=None,
                        instances=None, repos=None)
    saved["scorer"].update(blend_a="frozenlake_progress", blend_b="degeneracy",
                           blend_lambda=0.7, judge_model_path=None)
    saved["advantage"].update(omega=1.0, gamma=0.95, beta=0.2)
    return saved


def test_a_run_folder_of_0_1_resumes_without_differences_or_warnings(tmp_path):
    import yaml

    from treeroll.config import as_current, config_to_dict
    from treeroll.training.runfolder import RunFolder, config_differences

    saved = _settings_of_0_1()
    assert config_differences(saved, config_to_dict(TrainConfig()), ()) != []  # read raw
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_differences(as_current(TrainConfig, saved),
                                  config_to_dict(TrainConfig()), ()) == []
    folder = tmp_path / "runs" / "old"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.pt").write_bytes(b"")  # only its presence is checked here
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    run = RunFolder(str(tmp_path / "runs"), "old", True)
    run.check_config(config_to_dict(TrainConfig()),
                     normalise=lambda s: as_current(TrainConfig, s))  # no error: same settings
    with pytest.raises(ValueError, match="other settings"):
        run.check_config(config_to_dict(TrainConfig()))  # what 0.2 did before the fix


def test_an_old_key_beside_its_new_one_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"env\.size_min \(treeroll 0\.1\) and "
                                         r"env\.frozenlake\.size_min are both set"):
        merged_config(TrainConfig(), {"env": {"size_min": 3, "frozenlake": {"size_min": 4}}})


def test_a_0_1_config_at_its_defaults_reads_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merged_config(TrainConfig(), {"env": {"size_min": None}, "advantage": {"omega": 1.0}})


@pytest.mark.parametrize("module", ["treeroll.cli", "treeroll.cli_ray"])
def test_the_command_modules_run_with_python_dash_m_old_and_new(module):
    import subprocess

    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", module,
                           "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout


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
