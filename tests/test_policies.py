"""The shipped base policy: loaded by name and by path, with its view, and it plays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from treeroll.backends.hf import HFBackend
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.policies import load_policy, resolve_policy, shipped_policies
from treeroll.strategies import Chain
from treeroll.tree import leaves, path_to

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_base_loads_by_name_and_by_path_with_its_view() -> None:
    assert "frozenlake-tiny" in shipped_policies()
    by_name = load_policy("frozenlake-tiny")
    folder = resolve_policy("frozenlake-tiny")
    by_path = load_policy(str(folder))
    assert by_name.view == by_path.view == "cell_coordinates_safe"
    assert by_name.parameters == by_path.parameters < 5_000_000
    a, b = by_name.model.state_dict(), by_path.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size < 20 * 2**20
    meta = json.loads((folder / "treeroll.json").read_text())
    assert meta["made_by"]["command"] == "treeroll sft"
    assert (folder / "README.md").read_text().count("held-out") >= 1
    # the words of its view's header and explanation are real words of its tokenizer
    for word in ("safe", "Up", "Down", "Left", "Right", "P@0,0", "G@8,8"):
        assert by_name.tokenizer.convert_tokens_to_ids(word) != by_name.tokenizer.unk_token_id


def test_shipped_base_replies_are_well_formed_and_it_solves_some_maps() -> None:
    policy = load_policy("frozenlake-tiny")
    make_env = lambda: make_frozenlake("rllm")
    batch = rollout(list(range(500_000, 500_016)), make_env, HFBackend(policy.model),
                    policy.turn_format(), Chain(group_size=1),
                    config=RolloutConfig(max_turn_tokens=12, temperature=0.0))
    final = [leaves(tree)[0] for tree in batch.trees]
    turns = [node for leaf in final for node in path_to(leaf)[1:]]
    assert all(not node.info.get("format_error") for node in turns)
    assert sum(bool(leaf.info.get("success")) for leaf in final) >= 6  # random: about 3


def test_unknown_policy_and_folder_without_model_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="frozenlake-tiny"):
        resolve_policy("no-such-policy")
    (tmp_path / "policy").mkdir()
    with pytest.raises(FileNotFoundError, match="without a model"):
        resolve_policy(str(tmp_path))


def test_eval_command_on_the_shipped_base_starts_without_a_run() -> None:
    result = subprocess.run([sys.executable, "-m", "treeroll.cli", "eval", "--policy",
                             "frozenlake-tiny", "--tasks", "8"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, check=True)
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["tasks"] == 8 and record["format_ok"] > 0.9


def _copy_of_base(tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(resolve_policy("frozenlake-tiny"), folder)
    for name in drop:
        (folder / name).unlink()
    return folder


def test_policy_folder_without_weights_is_refused_naming_the_files(tmp_path: Path) -> None:
    folder = _copy_of_base(tmp_path, drop=("model.safetensors",))
    with pytest.raises(FileNotFoundError, match=r"no weights .*model\.safetensors.*config\.json"):
        resolve_policy(str(folder))


def test_policy_folder_without_tokenizer_is_refused_naming_the_files(tmp_path: Path) -> None:
    folder = _copy_of_base(tmp_path, drop=("tokenizer.json",))
    with pytest.raises(FileNotFoundError, match=r"no tokenizer files .*tokenizer\.json"):
        resolve_policy(str(folder))


def test_eval_on_a_folder_without_weights_exits_2_before_loading(tmp_path: Path) -> None:
    folder = _copy_of_base(tmp_path, drop=("model.safetensors",))
    result = subprocess.run([sys.executable, "-m", "treeroll.cli", "eval", "--policy",
                             str(folder), "--tasks", "2"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    said = " ".join(result.stderr.split())  # the console wraps long lines (the tmp path's length)
    assert result.returncode == 2 and "no weights" in said
    assert "Traceback" not in said


def test_run_folder_resolves_to_its_exported_policy_or_says_it_has_none(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: run\n")
    (run / "policy").mkdir()
    with pytest.raises(FileNotFoundError, match="without an exported policy"):
        resolve_policy(str(run))
    (run / "policy").rmdir()
    import shutil

    shutil.copytree(resolve_policy("frozenlake-tiny"), run / "policy")
    assert resolve_policy(str(run)) == run / "policy"


def test_turn_settings_are_saved_with_a_policy_and_restored(tmp_path: Path) -> None:
    from dataclasses import replace

    from treeroll.policies import save_policy

    policy = replace(load_policy("frozenlake-tiny"), system_in_user=True)
    save_policy(policy, tmp_path / "p")
    loaded = load_policy(str(tmp_path / "p"))
    assert loaded.system_in_user and loaded.view == policy.view


def test_context_longer_than_the_model_positions_is_refused_with_the_numbers() -> None:
    from treeroll.backends.hf import HFBackend
    from treeroll.base import GenerationRequest, SamplingParams
    from treeroll.policies import check_context_length

    policy = load_policy("frozenlake-tiny")
    make_env = lambda: make_frozenlake("rllm")
    check_context_length(policy, make_env, 24, [500_000, 500_001])  # 4096 positions: fits
    policy.model.config.max_position_embeddings = 600
    with pytest.raises(ValueError, match=r"contexts can reach \d+ tokens \(task 500000: a \d+-"
                       r"token prompt \+ \d+ turns x \(24 reply.*600 positions"):
        check_context_length(policy, make_env, 24, [500_000, 500_001])
    backend = HFBackend(policy.model)
    with pytest.raises(ValueError, match="590-token context and up to 24 new tokens exceed "
                       "the model's 600 positions"):
        backend.generate([GenerationRequest(tuple(range(3, 593)))],
                         SamplingParams(max_new_tokens=24))
