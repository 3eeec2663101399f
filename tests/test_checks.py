"""Every input is checked before work starts: the error names the option, the value and
what is valid, and a refused start leaves no run folder."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from treeroll.checks import ConfigError, checked, validate
from treeroll.cli.commands import main
from treeroll.config import TrainConfig
from treeroll.config_checks import check_config
from treeroll.training.sft import SFTConfig


@pytest.mark.parametrize(("option", "value", "valid"), [
    ("--optim.tasks-per-step", "0", "must be >= 1"),
    ("--optim.steps", "-3", "must be >= 1"),
    ("--eval.tasks", "0", "must be >= 1"),
    ("--rollout.temperature", "-2", "must be >= 0"),
    ("--optim.lr", "-1", "must be > 0"),
    ("--rollout.top-p", "1.5", "must be > 0 and <= 1"),
    ("--optim.loss.normalisation", "tokens", "one of 'token_mean', 'seq_mean'"),
    ("--advantage.std", "pop", "one of 'population', 'sample'"),
    ("--strategy.name", "tree-grpo",
     "valid: arpo, chain, early_forks, igrpo, patr, random_tree, rtpo"),
    ("--advantage.name", "ppo",
     "valid: arpo_hard, dr_grpo, gigpo, grpo, planpo, progress, rloo, sao, tree"),
    ("--allocator.name", "vigr", "valid: uniform, vigor"),
    ("--allocator.name", "vigor", "set --rollout.max-leaves"),
    ("--policy.view", "grid", "valid: cell_coordinates"),
    ("--policy.init", "no/such/folder", "no such folder"),
    ("--optim.tasks-per-step", "500", "more than the training pool's 200"),
])
def test_a_bad_value_is_named_before_any_run_folder_exists(tmp_path, capsys, option, value,
                                                          valid) -> None:
    code = main(["train", "--config", "configs/tiny.yaml", "--runs-dir", str(tmp_path),
                 "--name", "bad", option, value])
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert code == 2
    assert option in err and value in err and valid in err
    assert not (tmp_path / "bad").exists()


def test_every_problem_is_listed_at_once() -> None:
    config = TrainConfig()
    config.optim.lr, config.eval.tasks, config.strategy.name = -1.0, 0, "nope"
    with pytest.raises(ConfigError) as caught:
        check_config(config)
    options = [option for option, _ in caught.value.problems]
    assert options == ["--optim.lr", "--eval.tasks", "--strategy.name"]
    assert "3 invalid settings" in str(caught.value)


def test_the_defaults_and_the_shipped_configs_are_valid() -> None:
    from treeroll.config import load_config

    check_config(TrainConfig())
    check_config(SFTConfig(), SFTConfig().data.problems())
    for name in ("frozenlake_rllm", "tiny", "frozenlake_ragen", "smollm2_rl"):
        check_config(load_config(f"configs/{name}.yaml"))
    for name in ("sft_frozenlake", "smollm2_sft"):
        check_config(load_config(f"configs/{name}.yaml", SFTConfig))


@pytest.mark.parametrize("name", ["compare_frozenlake", "compare_family", "compare_hard",
                                  "compare_budget", "allocation", "smollm2_compare"])
def test_the_shipped_compare_configs_are_valid_for_every_run(name: str) -> None:
    from treeroll.cli.compare import CompareConfig, arm_config, seeds_of
    from treeroll.config import load_config

    config = load_config(f"configs/{name}.yaml", CompareConfig)
    runs = [arm_config(config, arm, seed) for arm in config.strategies
            for seed in seeds_of(config, arm)]
    for run in runs:
        check_config(run)
    assert all(run.eval.tasks_during == run.eval.tasks for run in runs)  # one task set


def test_sft_inputs_are_checked_with_their_names(tmp_path, capsys) -> None:
    code = main(["sft", "--runs-dir", str(tmp_path), "--name", "bad", "--data.skill", "1.5",
                 "--data.source", "jsonl"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--data.skill is 1.5; must be >= 0 and <= 1" in err
    assert "--data.path is not set" in err and not (tmp_path / "bad").exists()


def test_checked_fields_accept_null_only_when_their_default_is_null() -> None:
    @dataclasses.dataclass
    class Example:
        limit: int | None = checked(None, ge=1)
        size: float = checked(1.0, gt=0, le=2)

    validate(Example())
    validate(Example(limit=3, size=2.0))
    with pytest.raises(ConfigError, match="--limit is 0; must be >= 1 \\(or null\\)"):
        validate(Example(limit=0))
    with pytest.raises(ConfigError, match="--size is nan"):
        validate(Example(size=float("nan")))
    with pytest.raises(ConfigError, match="--size is null; must be > 0 and <= 2"):
        validate(Example(size=None))  # type: ignore[arg-type]


def test_help_names_each_checked_range(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "--optim.tasks-per-step INT Tasks (trees) per step. (valid: >= 1)" in text
    assert "(valid: > 0 and <= 1)" in text  # rollout.top_p
    assert "(valid: one of 'token_mean', 'seq_mean')" in text


def test_eval_options_are_checked_with_their_names(capsys) -> None:
    code = main(["eval", "--tasks", "0", "--temperature", "-1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--tasks is 0; must be >= 1" in err
    assert "--temperature is -1.0; must be >= 0" in err
    code = main(["eval", "--run", "runs/x", "--policy", "frozenlake-tiny"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "not both" in err


def test_a_yaml_file_with_several_mistakes_names_every_one(tmp_path) -> None:
    from treeroll.config import load_config

    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  stepz: 3\n  lr: fast\nrollout:\n  max_turn_tokenz: 8\n"
                   "nonsense: 1\n")
    with pytest.raises(ValueError) as caught:
        load_config(bad)
    message = str(caught.value)
    assert message.startswith("4 problems in the config")
    for named in ("optim.stepz", "optim.lr", "rollout.max_turn_tokenz", "nonsense"):
        assert named in message


def test_an_empty_yaml_file_is_refused_rather_than_running_the_defaults(tmp_path) -> None:
    from treeroll.config import load_config

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing but a comment\n")
    with pytest.raises(ValueError, match="is empty"):
        load_config(empty)


def test_check_duration_refuses_only_a_run_longer_than_a_year() -> None:
    from treeroll.checks import YEAR_SECONDS, ConfigError, check_duration
    check_duration("--optim.steps", 1000, 999, YEAR_SECONDS / 1000)  # 0.999 years: accepted
    with pytest.raises(ConfigError, match=r"--optim.steps 2,000 is absurd.*at most 1,000 steps"):
        check_duration("--optim.steps", 2000, 1999, YEAR_SECONDS / 1000)


@dataclasses.dataclass
class Modes:
    """A plug-in's settings declaring their choices as literal types."""

    mode: Literal["fast", "exact"] = "fast"
    fallback: Literal["fast", "exact"] | None = None


def test_a_literal_setting_is_checked_as_a_declared_choice_is(tmp_path) -> None:
    validate(Modes())
    validate(Modes(fallback="exact"))
    with pytest.raises(ConfigError, match="--mode is 'slow'; must be one of 'fast', 'exact'"):
        validate(Modes(mode="slow"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--fallback is 'x'; must be one of"):
        validate(Modes(fallback="x"))  # type: ignore[arg-type]
    from treeroll.config import load_config

    path = tmp_path / "run.yaml"  # a config file's value: the same rule, the same words
    path.write_text("strategy:\n  early_forks:\n    on_end: again\n")
    with pytest.raises(ValueError, match=r"config key strategy\.early_forks\.on_end: is 'again'; "
                                         r"must be one of 'fork_last', 'repeat'"):
        load_config(path)
