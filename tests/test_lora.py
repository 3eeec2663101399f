"""LoRA adapters (``policy.lora``): SFT trains and writes the adapter alone; loading merges it."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_sft import _tiny_config
from treeroll.checks import ConfigError
from treeroll.config import PolicyConfig, TrainConfig
from treeroll.config_checks import check_config
from treeroll.policies import load_policy, policy_defaults
from treeroll.policies.lora import LoraSettings, add_lora
from treeroll.training.sft import SFTOptimConfig
from treeroll.training.sft_run import run_sft


def _base(tmp_path: Path) -> Path:
    """A tiny full policy folder (one SFT step from scratch) to adapt."""
    run_sft(_tiny_config(tmp_path, name="base", optim=SFTOptimConfig(steps=1, warmup_steps=0)))
    return tmp_path / "runs" / "base" / "policy"


def _adapted(tmp_path: Path, base: Path, name: str, steps: int, resume: bool = False,
             export: str | None = None) -> Path:
    config = _tiny_config(tmp_path, name=name, resume=resume, export=export,
                          policy=PolicyConfig(init=str(base), lora=LoraSettings(rank=4,
                                                                                alpha=8)),
                          optim=SFTOptimConfig(steps=steps, lr=3e-2, warmup_steps=0,
                                               schedule="constant", micro_batch_tokens=256))
    run_sft(config)
    return tmp_path / "runs" / name / "policy"


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.arange(2, 12)[None]).logits[0]


def test_lora_sft_writes_the_adapter_alone_and_loading_merges_it_into_the_base(
        tmp_path: Path) -> None:
    base = _base(tmp_path)
    folder = _adapted(tmp_path, base, "adapted", steps=3)
    names = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "treeroll.json"} <= names
    assert "model.safetensors" not in names and "config.json" not in names
    meta = json.loads((folder / "treeroll.json").read_text())
    assert meta["base"] == os.path.relpath(base, folder)  # the two folders move together
    from treeroll.cli.one_tree import load_run_config
    as_training = load_run_config(folder.parent)  # `treeroll eval --run` on the SFT run
    assert as_training.policy.lora.rank == 0  # its policy loads merged: no adapter on top
    check_config(as_training)
    assert meta["params"] == load_policy(str(base)).parameters  # the merged model's count

    merged, plain = load_policy(str(folder)), load_policy(str(base))
    assert type(merged.model) is type(plain.model)  # a plain model again, no peft wrapper
    assert all(p.requires_grad for p in merged.model.parameters())  # RL trains every weight
    assert merged.view == plain.view
    # the adapter's own product, applied by hand, is what the merged weights added
    adapter = load_file(folder / "adapter_model.safetensors")
    a = next(v for k, v in adapter.items() if "q_proj.lora_A" in k)
    b = next(v for k, v in adapter.items() if "q_proj.lora_B" in k)
    assert b.abs().max() > 0  # trained (peft starts B at zero)
    delta = (merged.model.model.layers[0].self_attn.q_proj.weight
             - plain.model.model.layers[0].self_attn.q_proj.weight)
    torch.testing.assert_close(delta, (8 / 4) * b @ a, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(merged.model.get_input_embeddings().weight,
                               plain.model.get_input_embeddings().weight)  # not adapted
    assert not torch.allclose(_logits(merged.model), _logits(plain.model))
    # an adapter folder without settings of its own brings its base's
    meta = json.loads((base / "treeroll.json").read_text())
    (base / "treeroll.json").write_text(json.dumps(
        {**meta, "defaults": {"rollout": {"max_turn_tokens": 24}}}))
    adapter_meta = json.loads((folder / "treeroll.json").read_text())
    adapter_meta.pop("defaults", None)
    (folder / "treeroll.json").write_text(json.dumps(adapter_meta))
    assert policy_defaults(str(folder)) == {"rollout": {"max_turn_tokens": 24}}


def test_lora_sft_resumes_to_the_same_adapter_as_an_uninterrupted_run(tmp_path: Path) -> None:
    base = _base(tmp_path)
    straight = _adapted(tmp_path, base, "straight", steps=4)
    _adapted(tmp_path, base, "split", steps=2)
    split = _adapted(tmp_path, base, "split", steps=4, resume=True)
    from treeroll.training.runfolder import read_checkpoint
    kept = read_checkpoint(split.parent / "checkpoints" / "last.pt")["model"]
    assert kept and all("lora_" in name for name in kept)  # the adapter alone, not the base
    one, two = (load_file(f / "adapter_model.safetensors") for f in (straight, split))
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(one[key], two[key], rtol=0, atol=0)


def test_lora_is_refused_without_a_base_in_train_and_on_unknown_modules(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--policy\.lora\.rank.*--policy\.init is null"):
        run_sft(_tiny_config(tmp_path, name="scratch", policy=replace(
            _tiny_config(tmp_path).policy, lora=LoraSettings(rank=4))))
    assert not (tmp_path / "runs" / "scratch").exists()
    train = TrainConfig()
    train.policy = replace(train.policy, lora=LoraSettings(rank=4))
    with pytest.raises(ConfigError, match=r"--policy\.lora\.rank.*treeroll train"):
        check_config(train)
    model = load_policy(str(_base(tmp_path))).model
    with pytest.raises(ValueError, match=r"policy.lora.targets: \['qkv'\] match no module"):
        add_lora(model, LoraSettings(rank=2, targets=("qkv",)))


def test_an_adapter_is_refused_over_other_base_weights_and_adapters_in_a_loop(
        tmp_path: Path) -> None:
    base = _base(tmp_path)
    exported = tmp_path / "shipped" / "deeper" / "adapter"
    folder = _adapted(tmp_path, base, "adapted", steps=1, export=str(exported))
    meta = json.loads((exported / "treeroll.json").read_text())
    assert meta["base"] == os.path.relpath(base, exported)  # rebased for where it went
    load_policy(str(exported))
    moved = tmp_path / "elsewhere"  # base and adapter moved together still load
    shutil.copytree(tmp_path / "runs", moved)
    shutil.rmtree(tmp_path / "runs")
    folder, base = moved / "adapted" / "policy", moved / "base" / "policy"
    load_policy(str(folder))

    looped = tmp_path / "looped"  # two adapters naming each other as base
    shutil.copytree(folder, looped)
    for one, other in ((folder, looped), (looped, folder)):
        meta = json.loads((one / "treeroll.json").read_text())
        (one / "treeroll.json").write_text(json.dumps({**meta, "base": str(other)}))
    with pytest.raises(ValueError, match="name each other as base in a loop"):
        load_policy(str(folder))
    assert policy_defaults(str(folder)) == {}  # read without recursing forever

    meta = json.loads((looped / "treeroll.json").read_text())
    (looped / "treeroll.json").write_text(json.dumps({**meta, "base": str(base)}))
    load_policy(str(looped))
    plain = load_policy(str(base))
    with torch.no_grad():
        plain.model.model.layers[0].mlp.up_proj.weight.add_(1e-3)  # another version of it
    plain.model.save_pretrained(base)
    with pytest.raises(ValueError, match="trained over other weights"):
        load_policy(str(looped))
