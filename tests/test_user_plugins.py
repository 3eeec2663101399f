"""User plug-ins get their own config block (``options``) from YAML and the command line;
the backend is a plug-in too."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

from treeroll.backends import BackendConfig, make_backend
from treeroll.checks import ConfigError, checked
from treeroll.cli.commands import parse_settings
from treeroll.config import TrainConfig, load_config
from treeroll.credit import AdvantageConfig, make_estimator
from treeroll.envs import make_env_factory, make_frozenlake
from treeroll.strategies import Chain, make_strategy
from treeroll.tree import RolloutTree, leaves

from .conftest import ScriptedBackend


@dataclass
class Wide(Chain):
    """A user's strategy: a chain whose group size is ``width`` times ``factor``."""

    width: int = checked(2, ge=1)
    factor: float = 1.0
    tags: tuple[str, ...] = ()

    name: ClassVar[str] = "wide"

    def start(self, tree, ctx):  # type: ignore[no-untyped-def]
        """``width * factor`` copies of the root."""
        return [tree.root] * int(self.width * self.factor)


def scaled_grpo(tree: RolloutTree, *, scale: float = 1.0) -> np.ndarray:
    """A user's estimator with one option."""
    return scale * np.array([leaf.reward for leaf in leaves(tree)])


def small_lake(*, side: int = 3):  # type: ignore[no-untyped-def]
    """A user's environment factory with one option."""
    return make_frozenlake("rllm", size_min=side, size_max=side)


def scripted_backend(policy, *, replies: list[str]):  # type: ignore[no-untyped-def]
    """A user's backend builder: receives the policy and its options."""
    backend = ScriptedBackend(replies)
    backend.policy = policy  # type: ignore[attr-defined]
    return backend


def test_a_user_strategy_receives_its_block_from_the_command_line() -> None:
    config = parse_settings(TrainConfig, ["--strategy.name", f"{__name__}:Wide",
                                          "--strategy.options", "width", "5", "factor", "0.6",
                                          "tags", "[a, b]"], "test", command="train")
    strategy = make_strategy(config.strategy)
    assert isinstance(strategy, Wide)
    assert (strategy.width, strategy.factor, strategy.tags) == (5, 0.6, ["a", "b"])


def test_a_user_strategy_receives_its_block_from_yaml(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"strategy:\n  name: {__name__}:Wide\n  options:\n    width: 3\n"
                    "    factor: 2\n")
    strategy = make_strategy(load_config(path).strategy)
    assert isinstance(strategy, Wide) and strategy.width == 3 and strategy.factor == 2.0
    assert isinstance(strategy.factor, float)


def test_a_user_plugins_bad_option_is_named() -> None:
    config = TrainConfig()
    config.strategy.name, config.strategy.options = f"{__name__}:Wide", {"depth": "3"}
    with pytest.raises(ValueError, match=r"Wide has no option depth; valid: .*width"):
        make_strategy(config.strategy)
    config.strategy.options = {"width": "0"}
    with pytest.raises(ConfigError, match=r"strategy\.options\.width.*>= 1"):
        make_strategy(config.strategy)


def test_a_user_estimator_env_and_backend_receive_their_blocks() -> None:
    estimator = make_estimator(AdvantageConfig(name=f"{__name__}:scaled_grpo",
                                               options={"scale": "3"}))
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="")
    tree.add_child(tree.root, action_ids=[2], reward=1.0, terminated=True, status="terminal")
    assert estimator(tree).tolist() == [3.0]

    env_config = TrainConfig().env
    env_config.name, env_config.options = f"{__name__}:small_lake", {"side": "3"}
    env = make_env_factory(env_config)()
    env.reset(1)
    assert env.size == 3  # type: ignore[attr-defined]

    policy = SimpleNamespace(model=None, tokenizer=None)
    backend = make_backend(BackendConfig(name=f"{__name__}:scripted_backend",
                                         options={"replies": "[Up, Down]"}), policy)
    assert backend.replies == ["Up", "Down"]  # type: ignore[attr-defined]
    assert backend.policy is policy  # type: ignore[attr-defined]


def test_the_hf_backend_is_built_from_its_config_block(tiny_model, word_tokenizer) -> None:
    config = parse_settings(TrainConfig, ["--backend.hf.max-batch-size", "3",
                                  "--backend.hf.no-keep-logits"], "test", command="train")
    policy = SimpleNamespace(model=tiny_model, tokenizer=word_tokenizer)
    backend = make_backend(config.backend, policy)
    assert backend.max_batch_size == 3 and not backend.keep_logits  # type: ignore[attr-defined]
    assert backend.model is tiny_model  # type: ignore[attr-defined]
