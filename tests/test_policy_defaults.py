"""Settings a policy brings (``treeroll.json``'s ``defaults``): under the config file and the
command line, over treeroll's own defaults, in every command that takes a policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from treeroll.cli.commands import parse_settings
from treeroll.config import TrainConfig, with_policy_defaults
from treeroll.policies import policy_defaults, resolve_policy
from treeroll.policies.fetch import REAL_POLICIES
from treeroll.training.sft import SFTConfig


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the shipped base whose treeroll.json brings a turn cap of 96 tokens."""
    target = tmp_path / "policy"
    shutil.copytree(resolve_policy("frozenlake-tiny"), target)
    meta = json.loads((target / "treeroll.json").read_text())
    meta["defaults"] = {"rollout": {"max_turn_tokens": 96}, "strategy": {"name": "patr"}}
    (target / "treeroll.json").write_text(json.dumps(meta))
    return target


def test_the_registry_policy_brings_a_longer_turn_cap_without_converting() -> None:
    defaults = policy_defaults("smollm2-135m-instruct")
    assert defaults == REAL_POLICIES["smollm2-135m-instruct"].defaults
    assert defaults["rollout"]["max_turn_tokens"] > TrainConfig().rollout.max_turn_tokens
    assert policy_defaults("frozenlake-tiny") == {} and policy_defaults(None) == {}


def test_policy_defaults_sit_under_the_command_line(folder: Path) -> None:
    config = parse_settings(TrainConfig, ["--policy", str(folder)], "", command="train")
    assert config.rollout.max_turn_tokens == 96 and config.strategy.name == "patr"
    given = parse_settings(TrainConfig, ["--policy", str(folder),
                                         "--rollout.max-turn-tokens", "40"], "", command="train")
    assert given.rollout.max_turn_tokens == 40 and given.strategy.name == "patr"
    plain = parse_settings(TrainConfig, [], "", command="train")
    assert plain.rollout.max_turn_tokens == TrainConfig().rollout.max_turn_tokens


def test_policy_defaults_sit_under_the_config_file(folder: Path, tmp_path: Path) -> None:
    config_file = tmp_path / "run.yaml"
    config_file.write_text(f"policy:\n  init: {folder}\nrollout:\n  max_turn_tokens: 50\n")
    config = parse_settings(TrainConfig, ["--config", str(config_file)], "", command="train")
    assert config.rollout.max_turn_tokens == 50 and config.strategy.name == "patr"
    named_in_file = tmp_path / "named.yaml"
    named_in_file.write_text(f"policy:\n  init: {folder}\n")
    config = parse_settings(TrainConfig, ["--config", str(named_in_file)], "", command="train")
    assert config.rollout.max_turn_tokens == 96


def test_policy_defaults_skip_sections_a_command_does_not_have(folder: Path) -> None:
    sft = parse_settings(SFTConfig, ["--policy", str(folder)], "", command="sft")
    assert sft.rollout.max_turn_tokens == 96  # SFT has no strategy: left out, no error
    nested = with_policy_defaults(TrainConfig(), str(folder))
    assert nested.rollout.max_turn_tokens == 96


def test_an_exported_policy_keeps_the_defaults_it_was_loaded_with(folder: Path,
                                                                  tmp_path: Path) -> None:
    from treeroll.policies import load_policy, save_policy

    save_policy(load_policy(str(folder)), tmp_path / "exported")
    assert policy_defaults(str(tmp_path / "exported"))["rollout"]["max_turn_tokens"] == 96
